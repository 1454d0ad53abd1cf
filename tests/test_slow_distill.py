"""FST-distill on the tiny model: the loss, that it distils, resumability, and its outputs."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import pytest
from slow_toys import LengthTask, RecordingTracker

from fastslow import records
from fastslow.records import ROLLOUT_COLUMNS, context_hash
from fastslow.slow import SlowConfig, read_state
from fastslow.slow.distill import (
    completion_logits,
    run_distill_cycle,
    token_reverse_kl,
)
from fastslow.tasks.base import Problem, build_messages

TEACHER = ("best", "You are a pirate. Answer every question in pirate speak, ending with ARRR!")
STUDENT = "Be brief."
METRIC_COLUMNS = {"reward_mean", "reward_std", "frac_zero_std_groups", "distill_kl", "entropy",
                  "loss", "grad_norm", "lr", "completion_tokens", "mean_completion_tokens",
                  "truncated_fraction", "generation_seconds", "scoring_seconds", "training_seconds", "step_seconds",
                  "generated_tokens_per_s"}




def _cfg(steps: int, **kw: Any) -> SlowConfig:
    values: dict[str, Any] = dict(lr=1e-3, warmup_steps=1, num_generations=2, problems_per_step=1,
                                  steps_per_cycle=steps, max_new_tokens=8, seed=3)
    return SlowConfig(**{**values, **kw})


def _weights(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


# ---------------------------------------------------------------- (1) the loss by hand


def test_reverse_kl_matches_hand_computation() -> None:
    import torch

    # Position 0: p = (1/2, 1/2), q = (1/4, 3/4): KL = ½ln(½/¼) + ½ln(½/¾) = ½ln(4/3).
    # Position 1: p = (e/(1+e), 1/(1+e)), q uniform: KL = Σ p ln p + ln 2.
    # Position 2: a huge KL, its own (kl[2]) and no other position's.
    student = torch.tensor([[0.0, 0.0], [1.0, 0.0], [50.0, 0.0]], requires_grad=True)
    teacher = torch.tensor([[0.0, math.log(3.0)], [7.0, 7.0], [0.0, 50.0]], requires_grad=True)
    p1 = math.e / (1 + math.e)
    kl0 = 0.5 * math.log(4 / 3)
    kl1 = p1 * math.log(p1) + (1 - p1) * math.log(1 - p1) + math.log(2)
    kl, entropy = token_reverse_kl(student, teacher)
    assert kl[:2].tolist() == pytest.approx([kl0, kl1], rel=1e-6) and float(kl[2]) > 10
    loss = kl[:2].mean()  # the step's loss: the token mean over the completion positions
    assert float(entropy[0]) == pytest.approx(math.log(2), rel=1e-6)
    # Temperature divides both logit sets: at T=2 position 0 compares (½,½) with (1/(1+√3), ...).
    q0 = 1 / (1 + math.sqrt(3))
    kl_t2 = 0.5 * math.log(0.5 / q0) + 0.5 * math.log(0.5 / (1 - q0))
    assert float(token_reverse_kl(student, teacher, 2.0)[0][0].detach()) == pytest.approx(kl_t2, rel=1e-6)
    # Differentiable in the student only; zero where the two agree.
    loss.backward()
    assert student.grad is not None and student.grad[:2].abs().sum() > 0
    assert teacher.grad is None
    same = torch.randn(3, 5)
    assert token_reverse_kl(same, same + 4.0)[0].tolist() == pytest.approx([0.0] * 3, abs=1e-6)


def test_rounding_warning_names_bf16_weights_whose_updates_round_away() -> None:
    """Paper scale: bf16 weights of typical magnitude (~0.02) at lr 1e-6 lose almost every update
    (bf16's spacing there is ~1.2e-4); fp32 weights, or an lr above half the spacing, do not."""
    import torch

    from fastslow.slow.distill import rounding_warning

    layer = torch.nn.Linear(64, 64)
    torch.nn.init.normal_(layer.weight, std=0.02)
    assert rounding_warning(layer, 1e-6) is None  # fp32
    layer = layer.to(torch.bfloat16)
    warning = rounding_warning(layer, 1e-6)
    assert warning is not None and "torch.bfloat16" in warning and "lr = 1e-06" in warning
    share = int(warning.split(" of them")[0].rsplit(" ", 1)[1].rstrip("%"))
    assert share >= 95
    # what the warning claims, on the real dtype: an update of lr leaves bf16 weights as they were
    w = layer.weight.detach()
    assert (w + torch.full_like(w, 1e-6) == w).float().mean() >= share / 100 - 0.01
    assert rounding_warning(layer, 1e-3) is None  # above half the spacing of most weights
    # fp16 keeps 10 mantissa bits: at |w| ~ 0.1 its spacing is 2^-14 ~ 6e-5, so an update of lr 1e-4
    # stays (bf16's spacing there, 2^-11 ~ 5e-4, would round it away)
    layer = torch.nn.Linear(8, 8, bias=False)
    torch.nn.init.constant_(layer.weight, 0.1)
    assert rounding_warning(layer.to(torch.bfloat16), 1e-4) is not None
    assert rounding_warning(layer.to(torch.float16), 1e-4) is None
    warning = rounding_warning(layer.to(torch.float16), 1e-6)
    assert warning is not None and "torch.float16" in warning and "for 100% of them" in warning
    # "most": warned from half of the weights on
    with torch.no_grad():
        layer.weight.view(-1)[:32] = 1e-3
    half = layer.to(torch.bfloat16)
    assert rounding_warning(half, 1e-4) is not None and "for 50% of them" in rounding_warning(half, 1e-4)
    with torch.no_grad():
        layer.weight.view(-1)[32] = 1e-3
    assert rounding_warning(layer.to(torch.bfloat16), 1e-4) is None


def test_the_optimiser_decays_matrices_only_with_the_configured_betas_after_warm_up() -> None:
    """AdamW with weight decay on the matrices (not biases or norms) and (adam_beta1, adam_beta2);
    the learning rate ramps over warmup_steps to lr, then stays."""
    import torch

    from fastslow.slow.distill import make_optimizer

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    optimizer, scheduler = make_optimizer(model, SlowConfig(lr=1e-3, weight_decay=0.1, adam_beta1=0.8,
                                                            adam_beta2=0.95, warmup_steps=2))
    decayed, plain = optimizer.param_groups
    assert [p.shape for p in decayed["params"]] == [(3, 4)] and decayed["weight_decay"] == 0.1
    assert [p.shape for p in plain["params"]] == [(3,), (3,), (3,)] and plain["weight_decay"] == 0.0
    assert all(g["betas"] == (0.8, 0.95) for g in optimizer.param_groups)
    lrs = []
    for _ in range(4):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.0, 5e-4, 1e-3, 1e-3])


def test_completion_logits_are_each_rollouts_own_next_token_log_probs(tiny_model_dir: Path) -> None:
    """Rows of `completion_logits` = log_softmax of one unpadded forward of prompt + completion,
    at the positions predicting the completion's tokens, rollout by rollout (uneven lengths, so
    a position or padding mistake shifts rows)."""
    import torch

    from fastslow.model.convert import load_model

    model = load_model(tiny_model_dir)
    prompts = [[5, 9, 13, 2, 7], [3, 8], [11, 4, 6]]
    completions = [[21, 22], [30, 31, 32, 33], [40]]
    with torch.no_grad():
        got = completion_logits(model, prompts, completions, pad_id=0)
        want = []
        for p, c in zip(prompts, completions, strict=True):
            logits = model(input_ids=torch.tensor([[*p, *c]])).logits[0].float()
            want.append(torch.log_softmax(logits, -1)[len(p) - 1: len(p) + len(c) - 1])
    want = torch.cat(want)
    assert got.shape == want.shape == (7, model.config.vocab_size)
    torch.testing.assert_close(got.float(), want, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- (2) it distils the context


def _context_kl(student: Any, teacher: Any, tokenizer: Any, problems: list[Problem],
                completions: list[list[int]]) -> float:
    """Mean token KL(student | STUDENT context ‖ teacher | TEACHER context) on fixed samples."""
    import torch

    from fastslow.model.generation import encode_prompts

    rows = [p for p in problems for _ in range(len(completions) // len(problems))]
    s_ids = encode_prompts(tokenizer, [build_messages(STUDENT, p) for p in rows])
    t_ids = encode_prompts(tokenizer, [build_messages(TEACHER[1], p) for p in rows])
    with torch.no_grad():
        s = completion_logits(student, s_ids, completions, tokenizer.pad_token_id)
        t = completion_logits(teacher, t_ids, completions, tokenizer.pad_token_id)
    return float(token_reverse_kl(s, t)[0].mean())


def test_distillation_reduces_context_kl(tiny_model_dir: Path, tokenizer: Any,
                                         tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from fastslow.model.convert import load_model
    from fastslow.model.generation import HFGenerator, SamplingParams

    task = LengthTask()
    problems = task.problems("train", 2, 0)
    base = load_model(tiny_model_dir)
    # Fixed evaluation completions: 4 samples per problem from θ0 with the student context. The
    # KL starts at ~1e-3 (random tiny model); 4 steps at lr 1e-4 bring it down ~10x, while a
    # sign-flipped loss or lr 1e-3 (overshooting) leave it above half.
    chats = [build_messages(STUDENT, p) for p in problems for _ in range(4)]
    gens = HFGenerator(base, tokenizer).generate(chats, SamplingParams(max_new_tokens=8, seed=99))
    completions = [list(g.completion_ids) for g in gens]
    before = _context_kl(base, base, tokenizer, problems, completions)

    cfg = _cfg(4, lr=1e-4, warmup_steps=0, problems_per_step=2)  # paper: 1e-6
    with caplog.at_level(logging.INFO, logger="fastslow"):
        result = run_distill_cycle(tiny_model_dir, None, [TEACHER], task, problems, cfg,
                                   tmp_path / "distilled", "toy/distill", 0, progress=False,
                                   student_context=STUDENT)
    # a line a step: its KL is to the teacher (RL's lines' "kl" is to the base), its cut share and
    # the time its cycle's steps have left, as RL's lines give it
    steps = [r.getMessage() for r in caplog.records if r.getMessage().startswith("distill toy/distill cycle 0 step")]
    assert len(steps) == 4 and all(", kl to the teacher " in line and "% cut at 8)" in line for line in steps)
    for line, m in zip(steps, result.metrics, strict=True):  # and the share answered, as its metric has it
        assert f" ({100 * m['answered_fraction']:.0f}% answered), kl to the teacher " in line, line
    assert all(re.search(r", steps ~\d+s left$", line) for line in steps[:-1]) and "left" not in steps[-1]
    after = _context_kl(load_model(result.model_dir), base, tokenizer, problems, completions)
    print(f"context KL before {before:.5f}, after {after:.5f}; per-step distill_kl "
          f"{[round(m['distill_kl'], 5) for m in result.metrics]}")
    assert before > 5e-4, "the teacher context must move the distribution, or the test is vacuous"
    assert after < 0.5 * before


class _Counting:
    """A generator passing everything to `inner`, counting the prompts it is asked to encode;
    with `strip`, its generations report no prompt ids (as a backend that gives none)."""

    def __init__(self, inner: Any, strip: bool) -> None:
        self.inner, self.strip, self.pad_id, self.encoded = inner, strip, inner.pad_id, []

    def encode_prompts(self, chats: list) -> list:
        self.encoded.append(len(chats))
        return self.inner.encode_prompts(chats)

    def generate(self, chats: list, params: Any) -> list:
        import dataclasses

        gens = self.inner.generate(chats, params)
        return [dataclasses.replace(g, prompt_ids=()) for g in gens] if self.strip else gens


def test_a_step_trains_on_the_prompt_ids_it_sampled_from(tiny_model_dir: Path, tokenizer: Any) -> None:
    """The student's prompts are not encoded again for the loss: the generations' own prompt ids
    serve it, and only the teacher's prompts are encoded. A generator that reports no prompt ids
    gets them encoded, and the step is the same to the bit (loss, norm, updated weights)."""
    import torch

    from fastslow.slow.distill import _distill_step, _prepare_local

    task = LengthTask()
    rows = [p for p in task.problems("train", 2, 0) for _ in range(2)]
    cfg = _cfg(1, warmup_steps=0, problems_per_step=2, bf16=False)
    got = {}
    for strip in (False, True):
        trainee, generator = _prepare_local(tiny_model_dir, tokenizer, cfg, "r", 0)
        counting = _Counting(generator, strip)
        metrics, _ = _distill_step(trainee, counting, task, rows, STUDENT, TEACHER[1], cfg, seed=5)
        got[strip] = (counting.encoded, metrics, trainee.student.state_dict())
    assert got[False][0] == [len(rows)]  # the teacher's prompts alone
    assert got[True][0] == [len(rows), len(rows)]
    for key in ("loss", "distill_kl", "grad_norm", "completion_tokens"):
        assert got[False][1][key] == got[True][1][key], key
    assert got[False][1]["grad_norm"] > 0
    assert all(torch.equal(v, got[True][2][k]) for k, v in got[False][2].items())


class _PerProblemTask(LengthTask):
    """Reward 1 for problem p0's rollouts, 0 for the others': every group of one problem's G
    rollouts has no spread, while runs of rollouts that straddle two problems have."""

    def reward(self, problem: Problem, completion: str) -> float:
        return float(problem.id == "p0")


def test_a_steps_metrics_and_update_are_the_token_mean_reverse_kl_at_the_sampling_temperature(
        tiny_model_dir: Path, tokenizer: Any) -> None:
    """Recomputed here from the rollouts the step sampled, with θ_c: distill_kl (= loss) and entropy
    are the means over the step's completion tokens of KL(π_θ(·|seed context) ‖ π_θc(·|teacher
    context)) and of the student's entropy, at the sampling temperature; grad_norm is the norm of
    that mean's gradient (accumulated over micro batches) before clipping, and AdamW steps on the
    gradient clipped to max_grad_norm. The teacher stays θ_c. Each rollout is truncated as its
    generation says, and frac_zero_std_groups counts the groups of one problem's G rollouts."""
    import copy

    import torch

    from fastslow.slow.distill import _distill_step, _prepare_local

    task = _PerProblemTask()
    rows = [p for p in task.problems("train", 3, 0) for _ in range(2)]  # P*G = 3*2, two micro batches of 3
    cfg = _cfg(1, warmup_steps=0, problems_per_step=3, bf16=False, temperature=0.7, max_grad_norm=1e-3,
               micro_batch_size=3)
    trainee, generator = _prepare_local(tiny_model_dir, tokenizer, cfg, "r", 0)
    initial = copy.deepcopy(trainee.student)
    sampled: list[Any] = []
    generate = generator.generate
    generator.generate = lambda chats, params: sampled.extend(generate(chats, params)) or sampled
    stepped: list[float] = []
    trainee.optimizer.register_step_pre_hook(lambda *_: stepped.append(float(torch.nn.utils.get_total_norm(
        [p.grad for p in trainee.student.parameters() if p.grad is not None]))))
    metrics, records = _distill_step(trainee, generator, task, rows, STUDENT, TEACHER[1], cfg, seed=5)

    completions = [list(g.completion_ids) for g in sampled]
    teacher_ids = generator.encode_prompts([build_messages(TEACHER[1], p) for p in rows])
    with torch.no_grad():
        teacher = completion_logits(initial, teacher_ids, completions, generator.pad_id)
    student = completion_logits(initial, [list(g.prompt_ids) for g in sampled], completions, generator.pad_id)
    kl, entropy = token_reverse_kl(student, teacher, 0.7)
    kl.mean().backward()
    norm = float(torch.nn.utils.get_total_norm([p.grad for p in initial.parameters() if p.grad is not None]))
    assert metrics["completion_tokens"] == kl.numel() == sum(len(c) for c in completions)
    assert metrics["distill_kl"] == metrics["loss"] == pytest.approx(float(kl.detach().mean()), rel=1e-4)
    assert metrics["entropy"] == pytest.approx(float(entropy.mean()), rel=1e-4)
    assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-3) and norm > 10 * cfg.max_grad_norm
    assert stepped == [pytest.approx(cfg.max_grad_norm, rel=1e-3)]
    assert trainee.teacher is not trainee.student and not any(p.requires_grad for p in trainee.teacher.parameters())
    assert all(torch.equal(p, q) for p, q in zip(trainee.teacher.parameters(), initial.parameters(), strict=True))
    assert any(not torch.equal(p, q) for p, q in zip(trainee.student.parameters(), initial.parameters(), strict=True))
    assert [r["truncated"] for r in records] == [g.finish_reason == "length" for g in sampled]
    assert [r["reward"] for r in records] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert (metrics["reward_mean"], metrics["reward_std"]) == pytest.approx((1 / 3, math.sqrt(2) / 3))  # population std
    assert [(r["prompt_tokens"], r["completion_tokens"], r["logprob_sum"]) for r in records] == [
        (g.prompt_tokens, g.completion_tokens, g.logprob_sum) for g in sampled]
    assert metrics["frac_zero_std_groups"] == 1.0  # groups of P=3 would have spread in one of two


# ---------------------------------------------------------------- (3, 4) resumability, outputs


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two 1-step cycles and one uninterrupted 2-step run (micro-batch 1), same seed and data."""
    root = tmp_path_factory.mktemp("distill")
    task = LengthTask()
    problems = task.problems("train", 3, 0)
    tracker = RecordingTracker()
    kw: dict[str, Any] = {"student_context": STUDENT}
    first = run_distill_cycle(tiny_model_dir, None, [TEACHER], task, problems, _cfg(1),
                              root / "cycle0", "toy/run", 0, tracker=tracker, **kw)
    second = run_distill_cycle(tiny_model_dir, first.out_dir, [TEACHER], task, problems, _cfg(1),
                               root / "cycle1", "toy/run", 1, tracker=tracker, **kw)
    # The uninterrupted run also accumulates gradients over micro-batches of one rollout.
    whole = run_distill_cycle(tiny_model_dir, None, [TEACHER], task, problems,
                              _cfg(2, micro_batch_size=1),
                              root / "whole", "toy/run", 0, progress=False, **kw)
    return {"root": root, "task": task, "problems": problems, "first": first, "second": second,
            "whole": whole, "tracker": tracker}


def test_distillation_reads_only_the_slow_keys_its_cycle_jobs_params_keep(runs: dict[str, Any],
                                                                          tiny_model_dir: Path,
                                                                          tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """fst_distill's cycle jobs leave CISPO's and vLLM's slow keys out of their params (a change
    of beta retrained Fig 8's distillation for nothing), and its cycle builds the SlowConfig
    without them: a cycle (resumed, as every cycle but the first) must read no other field.
    `use_vllm` is read only to warn that it is ignored; SlowConfig's own checks and its record in
    trainer_state read every field."""
    import copy
    import dataclasses
    import sys

    import fastslow.slow.config
    from fastslow.experiments import CYCLE_READS

    fields = {f.name for f in dataclasses.fields(SlowConfig)}
    # SlowConfig's checks and its to_dict (dataclasses.asdict: the config recorded in trainer_state);
    # its other methods and properties (check_pool reads baseline) count
    own = fastslow.slow.config.__file__
    whole = {dataclasses.__file__, copy.__file__}
    read: set[str] = set()
    plain = SlowConfig.__getattribute__

    def spy(self: SlowConfig, name: str) -> Any:
        caller = sys._getframe(1).f_code
        if name in fields and caller.co_filename not in whole and \
                not (caller.co_filename == own and caller.co_name in ("__post_init__", "to_dict")):
            read.add(name)
        return plain(self, name)

    monkeypatch.setattr(SlowConfig, "__getattribute__", spy)
    run_distill_cycle(tiny_model_dir, runs["first"].out_dir, [TEACHER], runs["task"], runs["problems"], _cfg(1),
                      tmp_path / "cycle1", "toy/run", 1, progress=False, student_context=STUDENT)
    monkeypatch.undo()
    kept = set(CYCLE_READS["fst_distill"]["slow"])
    assert read - kept == {"seed", "use_vllm", "chat_template_kwargs"}, read  # the last from model.*
    assert {"lr", "steps_per_cycle", "num_generations", "max_new_tokens", "temperature"} <= read
    assert not read & {"beta", "epsilon_high", "baseline", "scale_rewards", "vllm_mode",
                       "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode", "steps_per_generation"}


def test_chain_of_cycles_equals_one_run(runs: dict[str, Any], tiny_model_dir: Path) -> None:
    import polars as pl
    import torch

    assert runs["first"].rewards + runs["second"].rewards == runs["whole"].rewards
    chained = pl.concat([pl.read_parquet(runs["first"].rollouts_path),
                         pl.read_parquet(runs["second"].rollouts_path)])
    whole = pl.read_parquet(runs["whole"].rollouts_path)
    for column in ("step", "problem_id", "completion", "reward"):
        assert chained[column].to_list() == whole[column].to_list(), column
    kls = [m["distill_kl"] for m in runs["first"].metrics + runs["second"].metrics]
    assert kls == pytest.approx([m["distill_kl"] for m in runs["whole"].metrics], rel=1e-4)
    a, b = _weights(runs["second"].model_dir), _weights(runs["whole"].model_dir)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=1e-6), name
    # Warm-up 1: step 0 has lr 0, so only step 1 (in the second cycle) moves the weights; the
    # equality above therefore needs the restored scheduler and Adam moments.
    base, first = _weights(tiny_model_dir), _weights(runs["first"].model_dir)
    assert all(torch.equal(base[n], first[n]) for n in first)
    assert any(not torch.equal(base[n], a[n]) for n in a)
    state = read_state(runs["second"].out_dir)
    assert (state["global_step"], state["cursor"]) == (2, 2)


def test_cycle_outputs(runs: dict[str, Any]) -> None:
    import polars as pl

    result = runs["second"]
    assert sorted(p.name for p in result.out_dir.iterdir()) == [
        "metrics.parquet", "model", "rollouts.parquet", "trainer_state"]
    assert not [p for p in runs["root"].iterdir() if p.name.startswith(".")], "temp dirs left"
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pt", "state.json"} <= {
        p.name for p in result.state_dir.iterdir()}
    assert json.loads((result.model_dir / "config.json").read_text())["use_cache"] is True
    state = read_state(result.out_dir)
    assert state["teacher_context_id"] == "best" and state["method"] == "fst_distill"
    assert state["teacher_context_hash"] == context_hash(TEACHER[1])
    assert state["student_context_hash"] == context_hash(STUDENT)
    source = json.loads((result.model_dir / "fastslow_source.json").read_text())
    assert source == {"kind": "distill-cycle", "run": "toy/run", "cycle": 1, "global_step": 2,
                      "base": state["ref_model_dir"], "teacher_context_id": "best"}

    rollouts = pl.read_parquet(result.rollouts_path)
    assert rollouts.columns == list(ROLLOUT_COLUMNS)
    assert rollouts.height == 1 * 1 * 2  # T x P x G
    # each rollout's cut and format, as the step's shares count them
    assert rollouts["truncated"].mean() == pytest.approx(result.metrics[-1]["truncated_fraction"])
    assert rollouts["answered"].mean() == pytest.approx(result.metrics[-1]["answered_fraction"])
    assert set(rollouts["step"]) == {1} and set(rollouts["cycle"]) == {1}
    assert set(rollouts["run"]) == {"toy/run"}
    # Rollouts are the student's: seed context id and hash, student prompt (no teacher text).
    assert set(rollouts["context_id"]) == {"seed"}
    assert set(rollouts["context_hash"]) == {context_hash(STUDENT)}
    assert all(STUDENT in p and TEACHER[1] not in p for p in rollouts["prompt"])
    assert all(f.startswith("expected ") for f in rollouts["feedback"])
    assert all(1 <= n <= 8 for n in rollouts["completion_tokens"])

    metrics = pl.read_parquet(result.metrics_path)
    assert metrics.height == 1 and METRIC_COLUMNS <= set(metrics.columns)
    assert metrics.columns == list(records.METRIC_COLUMNS)  # every method's: one glob reads them all
    assert metrics["kl_to_base"].is_nan().all() and metrics["reused_rollouts"].is_null().all()  # RL's
    assert metrics["distill_kl"][0] > 0 and metrics["lr"][0] == pytest.approx(1e-3)
    calls = runs["tracker"].calls
    assert [step for _, step in calls] == [0, 1]
    assert "slow/distill_kl" in calls[0][0] and "slow/entropy" in calls[0][0]


def test_new_data_resets_cursor(runs: dict[str, Any], tiny_model_dir: Path,
                                tmp_path: Path) -> None:
    other = [Problem(f"q{i}", "length", f"Count to {i}.", str(i)) for i in range(2)]
    args = (tiny_model_dir, runs["second"].out_dir, [TEACHER], runs["task"], other, _cfg(1))
    with pytest.raises(ValueError, match="different train set"):
        run_distill_cycle(*args, tmp_path / "bad", "toy/run", 2, progress=False)
    result = run_distill_cycle(*args, tmp_path / "next", "toy/run", 2, progress=False,
                               new_data=True, student_context=STUDENT, ref_model_dir=tmp_path / "base")
    state = read_state(result.out_dir)
    assert (state["global_step"], state["cursor"]) == (3, 1)
    # the run's base weights, not the cycle's start, are its provenance
    assert state["ref_model_dir"] == str(tmp_path / "base")
    assert json.loads((result.model_dir / "fastslow_source.json").read_text())["base"] == str(tmp_path / "base")
    with pytest.raises(ValueError, match="exactly one"):
        run_distill_cycle(tiny_model_dir, None, [TEACHER, ("x", "y")], runs["task"], other,
                          _cfg(1), tmp_path / "two", "toy/run", 0)


# ---------------------------------------------------------------- what fits one GPU


def test_a_distillation_step_whose_gradient_is_not_finite_stops_before_the_optimiser(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the RL step (test_slow_cycle): a non-finite gradient norm stops the cycle before AdamW
    writes it into the weights, naming the step, and nothing is saved."""
    import fastslow.slow.distill as distill
    from fastslow.slow.loop import NonFiniteGradient

    real = distill.clip_gradients

    def poisoned(parameters: Any, *args: Any, **kwargs: Any) -> float:
        parameters = list(parameters)
        next(p for p in parameters if p.grad is not None).grad.view(-1)[0] = float("inf")
        return real(parameters, *args, **kwargs)

    monkeypatch.setattr(distill, "clip_gradients", poisoned)
    task = LengthTask()
    with pytest.raises(NonFiniteGradient,
                       match=r"^distill toy/inf cycle 0 step 1/1 \(global 0\): gradient norm inf"):
        run_distill_cycle(tiny_model_dir, None, [TEACHER], task, task.problems("train", 3, 0), _cfg(1),
                          tmp_path / "c0", "toy/inf", 0, progress=False, student_context=STUDENT)
    assert not list(tmp_path.iterdir())


def test_memory_floor_counts_the_models_own_parameters_and_cache(tiny_model_dir: Path, tmp_path: Path) -> None:
    """From the config and the weights' headers alone (meta device): the parameters load_model
    gives, in the dtype it gives them; five copies certain (weights, gradients, two AdamW moments,
    teacher); sampling at worst four and the KV cache of P*G rollouts of max_new_tokens each."""
    import json
    import shutil

    from fastslow.model.convert import load_model
    from fastslow.slow.distill import memory_floor

    model = load_model(tiny_model_dir, dtype="auto")
    params = sum(p.numel() for p in model.parameters())
    size = next(model.parameters()).element_size()
    cfg = SlowConfig(num_generations=4, problems_per_step=3, max_new_tokens=10)
    text = model.config
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    floor = memory_floor(tiny_model_dir, cfg)
    assert floor["params"] == params and floor["dtype"] == str(next(model.parameters()).dtype)[6:]
    assert floor["certain"] == 5 * params * size
    assert floor["kv_worst"] == 12 * 10 * text.num_hidden_layers * kv_heads * head_dim * 2 * size
    assert floor["sampling_worst"] == 4 * params * size + floor["kv_worst"]
    # a config that names no dtype: the weights' own (here float32), as load_model(dtype="auto")
    bare = tmp_path / "bare"
    shutil.copytree(tiny_model_dir, bare)
    config = json.loads((bare / "config.json").read_text())
    config.pop("dtype", None), config.pop("torch_dtype", None)
    (bare / "config.json").write_text(json.dumps(config))
    assert memory_floor(bare, cfg)["dtype"] == "float32"


def test_the_paper_scale_distill_cycle_is_warned_of_and_a_larger_model_refused(tmp_path: Path) -> None:
    """paper.yaml's P*G = 256 rollouts of up to 4096 tokens: Qwen3-8B in bf16 holds 76.3 GiB for
    certain (under an 80 GB H100's 79.6, before any activation), so it is not refused, but its
    sampling's worst case is far above: a warning. Qwen3-14B cannot fit at all: refused, in one
    line. SmolLM2-135M: neither."""
    from transformers import LlamaConfig, Qwen3Config

    from fastslow.config import load_config
    from fastslow.slow.distill import memory_floor, memory_verdict

    h100 = 85_520_809_984  # torch.cuda.get_device_properties(0).total_memory of an H100 80GB HBM3
    paper = SlowConfig.from_dict(load_config("config/config.yaml", "config/paper.yaml")["slow"])
    qwen = dict(vocab_size=151936, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False, dtype="bfloat16")
    Qwen3Config(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                **qwen).save_pretrained(tmp_path / "qwen3-8b")
    Qwen3Config(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                **qwen).save_pretrained(tmp_path / "qwen3-14b")
    floor = memory_floor(tmp_path / "qwen3-8b", paper)
    assert 8.1e9 < floor["params"] < 8.3e9 and floor["dtype"] == "bfloat16"
    assert memory_verdict(floor, floor["sampling_worst"]) == (None, None)  # what fits exactly is no warning
    error, warning = memory_verdict(floor, h100)
    assert error is None and warning and warning.startswith("fst_distill may run out of memory on cuda:0 (79.6 GiB) while sampling")
    assert "144.0 GiB of KV cache" in warning
    error, _ = memory_verdict(memory_floor(tmp_path / "qwen3-14b", paper), h100)
    assert error and error.startswith("fst_distill cannot fit one GPU: 14.77B parameters in bfloat16 ")
    assert "cuda:0 has 79.6 GiB" in error and "\n" not in error
    smol = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, dtype="float32")
    smol.save_pretrained(tmp_path / "smollm2")
    small = memory_floor(tmp_path / "smollm2", paper)
    assert memory_verdict(small, h100) == (None, None)
    # Launched on the paper's 8 GPUs: FSDP2 shards the fp32 student (16 bytes a parameter), every
    # rank holds the bf16 teacher whole: 30.5 GiB a GPU; each rank samples 32 rollouts (18 GiB of
    # KV cache at worst): Qwen3-8B and even 14B fit. DDP gives every rank all of it, and its
    # gradient buckets (another fp32 copy of the gradients): refused, naming FSDP2.
    sharded = memory_floor(tmp_path / "qwen3-8b", paper, processes=8, sharded=True, bf16=True)
    assert sharded["certain"] == 16 * floor["params"] // 8 + 2 * floor["params"]
    assert f"{sharded['certain'] / 2 ** 30:.1f}" == "30.5" and sharded["dtype"] == "float32"
    assert sharded["kv_worst"] == floor["kv_worst"] // 8
    assert memory_verdict(sharded, h100) == (None, None)
    big = memory_floor(tmp_path / "qwen3-14b", paper, processes=8, sharded=True, bf16=True)
    assert memory_verdict(big, h100) == (None, None)
    error, _ = memory_verdict(memory_floor(tmp_path / "qwen3-8b", paper, processes=8, sharded=False), h100)
    assert error and error.startswith("fst_distill cannot fit its 8 GPUs: 8.19B parameters as fp32 master weights ")
    assert ("moments and gradient buckets whole on every rank (DDP), and the frozen teacher whole on every rank "
            "(15.3 GiB), hold 167.8 GiB per GPU") in error
    assert error.endswith("(FASTSLOW_ACCELERATE_STRATEGY=fsdp2 shards the student)") and "\n" not in error
    # DDP without mixed precision (a CPU): fp32 teacher and KV cache; sampling frees the gradients
    # (4 bytes a parameter), not the buckets
    ddp = memory_floor(tmp_path / "qwen3-8b", paper, processes=8, sharded=False, bf16=False)
    assert ddp["teacher"] == 4 * floor["params"] and ddp["kv_worst"] == floor["kv_worst"] // 8 * 2
    assert ddp["certain"] == 20 * floor["params"] + ddp["teacher"]
    assert ddp["sampling_worst"] == 16 * floor["params"] + ddp["teacher"] + ddp["kv_worst"]


def test_a_distill_cycle_too_large_for_its_gpu_stops_before_the_fast_round(tiny_model_dir: Path, tmp_path: Path,
                                                                          monkeypatch, caplog) -> None:
    """The job used to load the model, run the whole GEPA round and only then run out of GPU
    memory, on each of SLURM's three attempts. A GPU smaller than what the cycle certainly holds
    now stops it first thing (here a pretend 1 MiB GPU); one that only its worst case exceeds
    gets a warning and goes on; a CPU has no such check."""
    import logging

    import fastslow.fast
    import fastslow.model.generation
    import fastslow.slow.distill as distill
    from fastslow.config import load_config
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.tasks.data import write_problems

    def no_round(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the fast round ran")

    def no_model(*args: Any, **kwargs: Any) -> None:  # first thing: before the round's model loads
        raise AssertionError("the fast round's model was loaded")

    monkeypatch.setattr(fastslow.fast, "run_round", no_round)
    monkeypatch.setattr(fastslow.model.generation, "make_generator", no_model)
    config = load_config("config/config.yaml", "config/smoke.yaml")
    write_problems([Problem(f"p{i}", "math", f"What is {i} + 1?", str(i + 1)) for i in range(4)],
                   tmp_path / "train.parquet")
    spec = RunSpec(experiment="e", method="fst_distill", name="r", schedule=("math",), seed=0)

    def cycle() -> None:
        run_cycle(spec, config, 0, tiny_model_dir, None, tmp_path / "train.parquet", tmp_path / "c0")

    monkeypatch.setattr(distill, "gpu_memory_bytes", lambda: 2 ** 20)
    with pytest.raises(ValueError, match=r"^fst_distill cannot fit one GPU: .* and cuda:0 has 0\.0 GiB"):
        cycle()
    config["slow"]["max_new_tokens"] = 100_000  # a KV cache larger than a copy of the tiny weights
    floor = distill.memory_floor(tiny_model_dir, SlowConfig.from_dict({**config["slow"], "seed": 0}))
    assert floor["sampling_worst"] > floor["certain"]
    monkeypatch.setattr(distill, "gpu_memory_bytes", lambda: floor["certain"])  # fits, not at worst
    with caplog.at_level(logging.WARNING, logger="fastslow.cycle"), \
            pytest.raises(AssertionError, match="the fast round's model was loaded"):
        cycle()
    assert "fst_distill may run out of memory on cuda:0" in caplog.text
    monkeypatch.setattr(distill, "gpu_memory_bytes", lambda: None)  # a CPU: no check, on to the round
    with pytest.raises(AssertionError, match="the fast round's model was loaded"):
        cycle()


def test_the_gpu_memory_is_read_without_initialising_cuda_here(monkeypatch) -> None:
    """CUDA initialised in the cycle's own process would make a vLLM generator spawn its workers;
    the total is read by a child process. Without a GPU there is nothing to read."""
    import torch

    from fastslow.slow.distill import gpu_memory_bytes

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_memory_bytes() is None
    calls: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: calls.append(i))
    assert gpu_memory_bytes() is None  # the child has no GPU: it fails, and no check is made
    assert calls == []  # ...and this process never asked CUDA


def test_a_gpu_memory_child_that_hangs_is_no_memory_check(monkeypatch, caplog) -> None:
    """The child reading the GPU's memory has a timeout; one that ran past it (a wedged driver)
    raised TimeoutExpired out of the cycle, where the docstring promises no check and a warning."""
    import logging
    import subprocess

    import torch

    from fastslow.slow import distill

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(distill, "GPU_MEMORY_TIMEOUT", 0.01, raising=False)
    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda argv, **kw: real_run(["sleep", "5"], **kw))
    with caplog.at_level(logging.WARNING, logger=distill.log.name):
        assert distill.gpu_memory_bytes() is None
    assert "GPU memory not read (Command '['sleep', '5']' timed out after 0.01 seconds); no memory check" in caplog.text


@pytest.mark.parametrize("accepted", [True, False])
def test_the_cycle_says_whether_the_teacher_is_the_student(accepted: bool, tiny_model_dir: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """An fst_distill cycle distils its round's best context into the weights; when the round
    kept only the seed context, the teacher sees what the student sees: cycle.json says so
    (`teacher_is_student`) and the log warns. When the round found a better context, the teacher
    is that context, and neither. (The round is stubbed: the 135M and tiny models accept none.)"""
    import logging

    import fastslow.fast
    from fastslow.config import load_config
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.fast import Pool
    from fastslow.tasks.data import write_problems

    config = load_config("config/config.yaml", "config/smoke.yaml")
    seed = config["seed_context"]
    found = "Add the two numbers, then answer with the sum alone."

    def round_(pool, *args, **kwargs):
        new = Pool.seed([found, seed] if accepted else [seed], pool.k)
        return new, {"best_val_mean": 0.5, "generations": 0, "metric_calls": 0, "proposed": 1,
                     "accepted": int(accepted), "seed_eval_seconds": 0.0, "search_eval_seconds": 0.0,
                     "slow_sample_seconds": 0.0}

    monkeypatch.setattr(fastslow.fast, "run_round", round_)
    train = write_problems([Problem(f"p{i}", "math", f"What is {i} + 1?", str(i + 1)) for i in range(8)],
                           tmp_path / "train.parquet")
    spec = RunSpec(experiment="e", method="fst_distill", name="r", schedule=("math",), seed=0)
    with caplog.at_level(logging.WARNING, logger="fastslow"):
        run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "c0")
    summary = json.loads((tmp_path / "c0/cycle.json").read_text())
    assert summary["teacher_is_student"] is (not accepted)
    assert ("the teacher is the student" in caplog.text) is (not accepted)
    assert read_state(tmp_path / "c0")["teacher_context_id"] == Pool.seed([found if accepted else seed], 1).entries[0].id
