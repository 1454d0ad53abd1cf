"""Slow-loop cycles on the tiny model: outputs, and a chain of cycles == one uninterrupted run."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from slow_toys import LengthTask, RecordingTracker

from fastslow import records
from fastslow.records import ROLLOUT_COLUMNS, context_hash
from fastslow.slow import SlowConfig, read_state, run_cycle
from fastslow.tasks.base import answered

CONTEXTS = [("c0", "Be brief."), ("c1", "Think step by step.")]
METRIC_COLUMNS = {"reward_mean", "reward_std", "frac_zero_std_groups", "entropy", "kl_to_base",
                  "clip_fraction", "generated_tokens_per_s", "step_seconds", "generation_seconds",
                  "scoring_seconds", "training_seconds", "lr", "loss", "grad_norm", "truncated_fraction",
                  "answered_fraction"}




def _cfg(steps: int) -> SlowConfig:
    return SlowConfig(lr=1e-3, warmup_steps=1, beta=0.001, num_generations=4, problems_per_step=2,
                      steps_per_cycle=steps, max_new_tokens=8, micro_batch_size=4, seed=7)


def _weights(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


@pytest.fixture(scope="module")
def runs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two cycles of T=2 and one uninterrupted run of 4 steps, same seed and data."""
    root = tmp_path_factory.mktemp("slow")
    task = LengthTask()
    problems = task.problems("train", 3, 0)  # 3 problems, 2 per step: steps cross epochs
    tracker = RecordingTracker()
    first = run_cycle(tiny_model_dir, None, CONTEXTS, task, problems, _cfg(2), root / "cycle0",
                      "toy/run", 0, tracker=tracker)
    second = run_cycle(tiny_model_dir, first.out_dir, CONTEXTS, task, problems, _cfg(2),
                       root / "cycle1", "toy/run", 1, tracker=tracker)
    whole = run_cycle(tiny_model_dir, None, CONTEXTS, task, problems, _cfg(4), root / "whole",
                      "toy/run", 0, progress=False)
    return {"root": root, "first": first, "second": second, "whole": whole, "tracker": tracker}


def test_chain_of_cycles_equals_one_run(runs: dict[str, Any]) -> None:
    import polars as pl
    import torch

    chain = runs["first"].rewards + runs["second"].rewards
    assert chain == runs["whole"].rewards
    chained = pl.concat([pl.read_parquet(runs["first"].rollouts_path),
                         pl.read_parquet(runs["second"].rollouts_path)])
    whole = pl.read_parquet(runs["whole"].rollouts_path)
    for column in ("step", "problem_id", "context_id", "completion", "reward"):
        assert chained[column].to_list() == whole[column].to_list(), column
    assert chained["logprob_sum"].to_list() == pytest.approx(whole["logprob_sum"].to_list(),
                                                             rel=1e-5)
    a, b = _weights(runs["second"].model_dir), _weights(runs["whole"].model_dir)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=1e-6), name
    # Training really moved the weights, so the equality above is not vacuous.
    base = _weights(runs["first"].model_dir)
    assert any(not torch.equal(base[n], a[n]) for n in a)
    assert read_state(runs["second"].out_dir)["global_step"] == 4
    assert read_state(runs["second"].out_dir)["cursor"] == 8


def test_cycle_outputs(runs: dict[str, Any]) -> None:
    import polars as pl

    result = runs["second"]
    assert sorted(p.name for p in result.out_dir.iterdir()) == [
        "metrics.parquet", "model", "rollouts.parquet", "trainer_state"]
    assert not [p for p in runs["root"].iterdir() if p.name.startswith(".")], "temp dirs left"
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pt", "state.json"} <= {
        p.name for p in result.state_dir.iterdir()}

    config = json.loads((result.model_dir / "config.json").read_text())
    assert config["use_cache"] is True, "the saved model must generate with its KV cache"

    rollouts = pl.read_parquet(result.rollouts_path)
    assert rollouts.columns == list(ROLLOUT_COLUMNS)
    assert rollouts.height == 2 * 2 * 4  # T steps x P problems x G rollouts
    # each rollout's cut and format, as its step's shares count them
    by_step = rollouts.group_by("step").agg(pl.col("truncated").mean(), pl.col("answered").mean()).sort("step")
    assert by_step["truncated"].to_list() == pytest.approx([m["truncated_fraction"] for m in result.metrics])
    assert by_step["answered"].to_list() == pytest.approx([m["answered_fraction"] for m in result.metrics])
    assert rollouts["answered"].to_list() == [answered(c) for c in rollouts["completion"]]
    assert set(rollouts["step"]) == {2, 3} and set(rollouts["cycle"]) == {1}
    assert set(rollouts["run"]) == {"toy/run"}
    # G/K = 2 rollouts per context per problem, with the context's hash.
    per = rollouts.group_by(["step", "problem_id", "context_id"]).len()
    assert set(per["len"]) == {2}
    for cid, text in CONTEXTS:
        sub = rollouts.filter(pl.col("context_id") == cid)
        assert set(sub["context_hash"]) == {context_hash(text)}
        assert all(text in p and p.rstrip().endswith("assistant") for p in sub["prompt"])
    assert all(f.startswith("expected ") for f in rollouts["feedback"])
    assert (rollouts["completion_tokens"] <= 8).all() and (rollouts["completion_tokens"] > 0).all()
    assert (rollouts["logprob_sum"] < 0).all()

    metrics = pl.read_parquet(result.metrics_path)
    assert METRIC_COLUMNS <= set(metrics.columns) and metrics.columns == list(records.METRIC_COLUMNS)
    assert metrics["distill_kl"].is_nan().all() and metrics["fast_seconds"].is_nan().all()  # not RL's
    assert metrics["step"].to_list() == [2, 3]
    assert metrics["reward_mean"].to_list() == pytest.approx(
        rollouts.group_by("step", maintain_order=True).agg(pl.col("reward").mean())["reward"].to_list())
    assert (metrics["kl_to_base"] > 0).all()  # weights moved away from θ0 in cycle 0
    assert metrics["lr"].to_list() == [1e-3, 1e-3]  # constant after the 1-step warm-up
    # The step-time split: generation and scoring are timed inside the step, training is the
    # step's remainder, so it is positive only if those timers measured a part of the step.
    assert (metrics["generation_seconds"] > 0).all() and (metrics["scoring_seconds"] > 0).all()
    assert (metrics["training_seconds"] > 0).all()
    assert metrics["reused_rollouts"].to_list() == [0, 0]
    # a completion shorter than max_new_tokens stopped at an EOS; one at the limit was cut unless
    # its last token was the EOS
    at_limit = rollouts.group_by("step", maintain_order=True).agg((pl.col("completion_tokens") == 8).mean())
    assert all(0 < f <= share for f, share in zip(metrics["truncated_fraction"], at_limit["completion_tokens"],
                                                  strict=True)), (metrics["truncated_fraction"], at_limit)


def test_each_steps_metrics_row_is_its_rollouts_summed(runs: dict[str, Any]) -> None:
    """The metrics row of a step reads off that step's rollout rows: its place in the cycle, the
    pool size K, the reward's (population) spread and the completion lengths; and the step's time
    splits into generation, scoring and the rest (training)."""
    import numpy as np
    import polars as pl

    for name, steps in (("first", [0, 1]), ("second", [2, 3]), ("whole", [0, 1, 2, 3])):
        result = runs[name]
        metrics = pl.read_parquet(result.metrics_path).sort("step")
        rollouts = pl.read_parquet(result.rollouts_path)
        assert metrics["step"].to_list() == steps
        assert metrics["step_in_cycle"].to_list() == list(range(len(steps))), name
        assert set(metrics["num_contexts"]) == {len(CONTEXTS)}
        for row in metrics.iter_rows(named=True):
            step = rollouts.filter(pl.col("step") == row["step"])
            rewards, tokens = step["reward"].to_numpy(), step["completion_tokens"].to_list()
            assert row["reward_std"] == pytest.approx(float(np.std(rewards)))
            assert row["completion_tokens"] == sum(tokens)
            assert row["mean_completion_tokens"] == pytest.approx(sum(tokens) / len(tokens))
            assert row["training_seconds"] == pytest.approx(
                row["step_seconds"] - row["generation_seconds"] - row["scoring_seconds"])
        # the rewards spread within a step, so the population and the sample std differ
        assert any(pl.read_parquet(result.rollouts_path).group_by("step").agg(pl.col("reward").std())["reward"] > 0)


def _tied_shares(rollouts: Any, group: list[str], size: int) -> Any:
    """Per step, the share of `group`'s reward groups (each of `size` rollouts) whose rewards all
    tie: frac_zero_std_groups as it should read off the rollouts table."""
    import numpy as np
    import polars as pl

    spread = (rollouts.group_by(["step", *group])
              .agg(pl.col("reward").std(ddof=0).alias("std"), pl.len().alias("n")))
    assert set(spread["n"]) == {size}, spread
    return (spread.group_by("step").agg((pl.col("std").map_elements(
        lambda x: bool(np.isclose(x, 0.0)), return_dtype=pl.Boolean)).mean().alias("frac")).sort("step"))


def test_frac_zero_std_groups_is_over_each_problems_g_rollouts(runs: dict[str, Any]) -> None:
    """frac_zero_std_groups is the share of advantage groups (baseline "problem": a problem's G
    rollouts across contexts) whose rewards all tie, i.e. that carry no gradient. Only the
    column's presence was checked, so a spread over the wrong axis (copy g across problems)
    passed."""
    import polars as pl

    for name in ("first", "second", "whole"):
        result = runs[name]
        want = _tied_shares(pl.read_parquet(result.rollouts_path), ["problem_id"], 4)  # G per problem
        metrics = pl.read_parquet(result.metrics_path).sort("step")
        assert metrics["step"].to_list() == want["step"].to_list()
        assert metrics["frac_zero_std_groups"].to_list() == pytest.approx(want["frac"].to_list()), name


def test_frac_zero_std_groups_under_the_prompt_baseline_is_over_each_contexts_rollouts(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """Under slow.baseline "prompt" an advantage group is one (problem, context) prompt's G/K
    rollouts, and so is the share of tied groups: a mutant that grouped by G (the problem) there
    survived, since no cycle ran with that baseline."""
    import polars as pl

    cfg = dataclasses.replace(_cfg(3), baseline="prompt")
    result = run_cycle(tiny_model_dir, None, CONTEXTS, LengthTask(), LengthTask().problems("train", 6, 0), cfg,
                       tmp_path / "cycle0", "toy/prompt", 0, progress=False)
    rollouts = pl.read_parquet(result.rollouts_path)
    want = _tied_shares(rollouts, ["problem_id", "context_id"], 2)  # G/K = 4/2 per prompt
    metrics = pl.read_parquet(result.metrics_path).sort("step")
    assert metrics["frac_zero_std_groups"].to_list() == pytest.approx(want["frac"].to_list())
    # ...which these rollouts tell apart from the share over each problem's G
    by_problem = _tied_shares(rollouts, ["problem_id"], 4)
    assert want["frac"].to_list() != pytest.approx(by_problem["frac"].to_list()), (want, by_problem)


def test_tracker_gets_one_call_per_step(runs: dict[str, Any]) -> None:
    calls = runs["tracker"].calls
    assert [step for _, step in calls] == [0, 1, 2, 3]
    assert calls[0][0]["slow/lr"] == 0.0  # warm-up: step 0 has lr 0 (HF constant_with_warmup)
    assert {f"slow/{k}" for k in METRIC_COLUMNS} <= set(calls[0][0])


def test_max_grad_norm_clips_the_step_and_grad_norm_is_logged_before_it(tiny_model_dir: Path,
                                                                         tmp_path: Path) -> None:
    """slow.max_grad_norm clips the RL step's gradient, and `grad_norm` logs the norm before the
    clip, so the same first step logs the same norm either way. AdamW's first update is about
    lr * g / (|g| + eps): a gradient clipped to a total norm of 1e-9 sits far under eps = 1e-8, so no
    weight moves by more than a tenth of lr, where unclipped the weights with a gradient move by
    about lr. Fails if the clip is skipped or the norm is taken after it."""
    task = LengthTask()
    problems = task.problems("train", 2, 0)
    base = _weights(tiny_model_dir)
    norms, moved = {}, {}
    for name, clip in (("free", None), ("clipped", 1e-9)):
        cfg = dataclasses.replace(_cfg(1), warmup_steps=0, max_grad_norm=clip, bf16=False)
        result = run_cycle(tiny_model_dir, None, CONTEXTS, task, problems, cfg, tmp_path / name, "toy/run", 0,
                           progress=False)
        norms[name] = result.metrics[0]["grad_norm"]
        after = _weights(result.model_dir)
        moved[name] = max(float((after[k].float() - base[k].float()).abs().max()) for k in base)
    assert norms["free"] > 1e-6 and norms["clipped"] == pytest.approx(norms["free"], rel=1e-4), norms
    assert moved["free"] > 0.5e-3 and moved["clipped"] < 0.1e-3, moved


def test_clip_gradients_measures_and_scales_the_global_norm() -> None:
    from fastslow.slow.loop import clip_gradients

    a, b, frozen = (torch.nn.Parameter(torch.zeros(2)) for _ in range(3))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])  # frozen has no gradient
    assert clip_gradients([a, b, frozen], None) == pytest.approx(5.0)
    assert a.grad.tolist() == [3.0, 0.0] and b.grad.tolist() == [0.0, 4.0]  # measured, not touched
    assert clip_gradients([a, b, frozen], 1.0) == pytest.approx(5.0)  # the norm before the clip
    assert a.grad.tolist() == pytest.approx([0.6, 0.0]) and b.grad.tolist() == pytest.approx([0.0, 0.8])
    assert frozen.grad is None


def test_bad_pool_rejected_before_any_work(tiny_model_dir: Path, tmp_path: Path) -> None:
    three = [*CONTEXTS, ("c2", "Answer.")]
    with pytest.raises(ValueError, match="K=3 does not divide num_generations G=4"):
        run_cycle(tiny_model_dir, None, three, LengthTask(), LengthTask().problems("train", 3, 0),
                  _cfg(1), tmp_path / "out", "r", 0)
    assert not (tmp_path / "out").exists()


def test_a_cycle_whose_prompts_do_not_fit_the_models_positions_stops_in_one_line(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """A GPT-2-style model of 64 learned positions: the RL steps' rollouts (TRL's generate) raised
    `IndexError: index out of range in self` from its position table once prompt plus
    slow.max_new_tokens passed 64. The cycle now says so in one line before any work; lengths that
    fit train as before."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from fastslow.model.convert import load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir)
    torch.manual_seed(0)
    gpt2 = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=16, n_layer=1, n_head=2,
                               bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
                    ).save_pretrained(gpt2)
    tokenizer.save_pretrained(gpt2)
    task, contexts = LengthTask(), [("seed", "Answer.")]
    problems = task.problems("train", 2, 0)
    cfg = dataclasses.replace(_cfg(1), num_generations=2, problems_per_step=1, micro_batch_size=2, max_new_tokens=60)
    with pytest.raises(ValueError, match=r"^a prompt of \d+ tokens plus slow\.max_new_tokens 60 exceeds the "
                                         r"model's 64 positions \(config n_positions\)"):
        run_cycle(gpt2, None, contexts, task, problems, cfg, tmp_path / "long", "r", 0, progress=False)
    assert not (tmp_path / "long").exists()
    result = run_cycle(gpt2, None, contexts, task, problems, dataclasses.replace(cfg, max_new_tokens=4),
                       tmp_path / "short", "r", 0, progress=False)
    assert len(result.metrics) == 1


def test_resume_rejects_another_train_set(runs: dict[str, Any], tiny_model_dir: Path,
                                          tmp_path: Path) -> None:
    from fastslow.slow.loop import problems_fingerprint

    other = LengthTask().problems("train", 4, 0)
    stored = read_state(runs["first"].out_dir)["problems_fingerprint"]
    with pytest.raises(ValueError, match=rf"different train set \(or order\): fingerprint {stored}, these 4 "
                                         rf"problems' {problems_fingerprint(other)}; the data position"):
        run_cycle(tiny_model_dir, runs["first"].out_dir, CONTEXTS, LengthTask(), other, _cfg(1),
                  tmp_path / "out", "r", 1)
    with pytest.raises(ValueError, match=r"^train_problems have duplicate ids: '.+'$"):
        run_cycle(tiny_model_dir, None, CONTEXTS, LengthTask(), [*other, other[0]], _cfg(1), tmp_path / "dup", "r", 0)
    # A continual run switching task says so: the new stream starts at 0, the step count goes on.
    result = run_cycle(tiny_model_dir, runs["first"].out_dir, CONTEXTS, LengthTask(), other,
                       _cfg(1), tmp_path / "out", "r", 1, progress=False, new_data=True)
    assert result.metrics[0]["step"] == 2
    assert read_state(result.out_dir)["cursor"] == 2


def test_progress_lines(tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
                        ) -> None:
    """A line per step: reward, speed, and the time the cycle's steps have left (the mean step so
    far times the steps to go), which the last step has none of."""
    task = LengthTask()
    with caplog.at_level(logging.INFO, logger="fastslow.slow"):
        result = run_cycle(tiny_model_dir, None, CONTEXTS[:1], task, task.problems("train", 4, 0),
                           _cfg(4), tmp_path / "out", "r", 0)
    lines = [r.getMessage() for r in caplog.records if r.name == "fastslow.slow"]
    steps = [m for m in lines if " step " in m][-4:]
    assert lines[-1] == "slow r cycle 0: writing the weights and the trainer state"  # then the save
    # before the weights load and the trainer is built (minutes at 8B), which had been silent
    assert lines[0] == ("slow r cycle 0: loading the weights and building the trainer (4 steps of 2 problems "
                        "x 4 rollouts follow)")
    seconds = [m["step_seconds"] for m in result.metrics]
    for t, line in enumerate(steps[:-1]):
        assert f"step {t + 1}/4" in line and "reward" in line and "tok/s" in line
        # the share of the step's completions cut at max_new_tokens, as its metric has it
        assert f" tok ({100 * result.metrics[t]['truncated_fraction']:.0f}% cut at 8) at " in line, line
        # the mean step so far times the 3, 2, 1 steps to go, as printed (not the time so far,
        # not the mean times all 4): after step 1 those read 1x and 4x the step, not 3x
        left = re.search(r", steps ~(\d+)s left$", line).group(1)
        assert left == f"{sum(seconds[:t + 1]) / (t + 1) * (3 - t):.0f}", (line, seconds)
    assert "step 4/4" in steps[-1] and "left" not in steps[-1]
    for t, line in enumerate(steps):  # the problems whose G rollouts tied, and the gradient's norm
        m = result.metrics[t]
        assert f"({100 * m['answered_fraction']:.0f}% answered, {100 * m['frac_zero_std_groups']:.0f}% of groups tied)" in line, line
        assert f"grad norm {m['grad_norm']:.3g}," in line, line
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "scored alike" in r.getMessage()]


def test_a_cycle_whose_rollouts_all_tie_says_so(tiny_model_dir: Path, tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """Every problem's G rollouts scoring alike (a task the model never solves) leaves the policy
    gradient 0: the step lines' reward std (over the batch) did not say it. One warning a cycle."""

    class NeverSolved(LengthTask):
        def reward(self, problem: Any, completion: str) -> float:
            return 0.0

    task = NeverSolved()
    with caplog.at_level(logging.INFO, logger="fastslow.slow"):
        run_cycle(tiny_model_dir, None, CONTEXTS, task, task.problems("train", 2, 0), _cfg(2), tmp_path / "out",
                  "toy/flat", 0, progress=True)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "scored alike" in r.getMessage()]
    assert warned == ["slow toy/flat cycle 0: little learning signal: in 100% of its advantage groups every rollout "
                      "scored alike (mean reward 0.000); 100% of its completions gave no readable <answer> block, so "
                      "mostly the KL penalty and weight decay moved the weights (expected at the CPU default's scale: "
                      "README \"Base SmolLM2-135M-Instruct\")"]  # the tiny model's: the format, not wrong answers


def test_cycle_json_gives_the_steps_mean_reward_and_answered_share() -> None:
    from fastslow.cycle import _steps_mean

    steps = [{"reward_mean": 0.2, "answered_fraction": 0.5}, {"reward_mean": 0.4, "answered_fraction": 0.0}]
    assert _steps_mean(steps, "answered_fraction") == pytest.approx(0.25)
    assert _steps_mean(steps, "reward_mean") == pytest.approx(0.3)
    assert _steps_mean([], "reward_mean") is None and _steps_mean([{"loss": 1.0}], "answered_fraction") is None


def test_a_steps_answered_fraction_counts_readable_answers() -> None:
    """Reward 0 with an answer is a wrong answer, without one a format failure: a step's
    `answered_fraction` is the share of its completions with a non-empty <answer> block."""
    from fastslow.slow.loop import answered_fraction

    completions = ["<answer>7</answer>", "so it is <answer> 12 </answer>.", "<answer></answer>", "12",
                   "<answer>3", "<answer>4</answer> then <answer>"]
    assert answered_fraction([{"answered": answered(c)} for c in completions]) == pytest.approx(3 / 6)
    assert math.isnan(answered_fraction([]))


def test_micro_batch_size_changes_memory_not_the_update(tiny_model_dir: Path, tmp_path: Path) -> None:
    """One RL step over the same P*G rollouts, all at once vs in micro-batches of 2 (< G): the
    same rollouts and rewards and, up to float summation order, the same updated weights."""
    import dataclasses

    import torch

    task = LengthTask()
    problems = task.problems("train", 2, 0)
    out = {}
    for micro in (8, 2):
        cfg = dataclasses.replace(_cfg(1), micro_batch_size=micro, warmup_steps=0)  # warm-up starts at lr 0
        out[micro] = run_cycle(tiny_model_dir, None, CONTEXTS, task, problems, cfg, tmp_path / f"m{micro}",
                               "toy/micro", 0, progress=False)
    import polars as pl

    a, b = (pl.read_parquet(out[m].rollouts_path) for m in (8, 2))
    assert a["completion"].to_list() == b["completion"].to_list()
    assert a["reward"].to_list() == b["reward"].to_list() and len(set(a["reward"].to_list())) > 1
    wa, wb, w0 = _weights(out[8].model_dir), _weights(out[2].model_dir), _weights(tiny_model_dir)
    moved = max(float((wa[k] - w0[k]).abs().max()) for k in wa)
    assert moved > 1e-4  # the step did change the weights
    for name in wa:
        torch.testing.assert_close(wb[name], wa[name], rtol=0, atol=1e-5 * max(1.0, moved))


def test_kl_and_entropy_are_means_over_the_steps_completion_tokens(tiny_model_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's kl_to_base and entropy average the per-token terms over its completion tokens
    (the mask), not over the padded batch: completions shorter than the longest would otherwise
    dilute both."""
    from fastslow.slow import loop

    seen: list[dict[str, Any]] = []
    real_step, real_kl = loop._rl_step, loop.base_kl_terms

    def kl_spy(batch: Any, logps: Any, mask: Any) -> Any:
        terms = real_kl(batch, logps, mask)
        seen.append({"kl": terms.detach().clone(), "mask": mask.detach().clone()})
        return terms

    def step_spy(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        metrics, records = real_step(trainer, *args, **kwargs)
        seen[-1]["entropies"] = torch.cat([ent for _, ent in trainer.stash]).float()
        seen[-1]["metrics"] = metrics
        return metrics, records

    # the tiny model rarely stops before max_new_tokens: the round's rollouts, a pair's cut to 3
    # tokens, give both steps completions of unequal length (step 1's weights moved: a nonzero KL)
    cfg = dataclasses.replace(_cfg(2), bf16=False, warmup_steps=0)
    task, cfg, problems, step, keys, gens, given = _first_step_sampled(tiny_model_dir, steps=2, shift=0.0, cfg=cfg)
    for key in (keys[0], keys[-1]):
        given[key] = [{**r, "completion_ids": r["completion_ids"][:3], "logprobs": r["logprobs"][:3]}
                      for r in given[key]]
    monkeypatch.setattr(loop, "base_kl_terms", kl_spy)
    monkeypatch.setattr(loop, "_rl_step", step_spy)
    result = run_cycle(tiny_model_dir, None, CONTEXTS, task, problems, cfg, tmp_path / "out", "toy/kl", 0,
                       progress=False, round_rollouts=given)
    assert len(seen) == 2
    assert all(float(s["mask"].sum()) < s["mask"].numel() for s in seen), "no padding: the test could not fail"
    for s in seen:
        tokens = float(s["mask"].sum())
        assert s["metrics"]["kl_to_base"] == pytest.approx(float(s["kl"].sum()) / tokens, rel=1e-5)
        assert s["metrics"]["entropy"] == pytest.approx(float((s["entropies"] * s["mask"]).sum()) / tokens, rel=1e-5)
    assert seen[1]["metrics"]["kl_to_base"] > 0
    # and the mean completion length is the rollouts' mean, not a middle value
    import polars as pl

    rollouts = pl.read_parquet(result.rollouts_path)
    means = rollouts.group_by("step", maintain_order=True).agg(pl.col("completion_tokens").mean())
    assert [m["mean_completion_tokens"] for m in result.metrics] == pytest.approx(means["completion_tokens"].to_list())


def test_steps_at_the_reference_skip_its_forward_and_train_alike(tiny_model_dir: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """While the weights are still the KL reference's (a run's first cycle until an optimiser step
    with lr > 0: steps 0 and 1 under a 2-step warm-up, lr 0 at step 0) a step skips the reference
    forward and takes the loss forward's log-probs as the reference's: KL exactly 0, and the same
    rollouts and updated weights as with the forward. Step 2 (weights moved) runs it again, and so
    does a later cycle's first step."""
    import dataclasses

    import polars as pl

    from fastslow.slow import loop

    task = LengthTask()
    problems = task.problems("train", 2, 0)
    cfg = dataclasses.replace(_cfg(3), warmup_steps=2, micro_batch_size=2)
    forwards: list[int] = []
    real_step, real_starts = loop._rl_step, loop.starts_at_reference

    def counting_step(trainer: Any, *args: Any, **kwargs: Any) -> Any:
        calls = [0]
        hook = trainer.ref_model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            return real_step(trainer, *args, **kwargs)
        finally:
            hook.remove()
            forwards.append(calls[0])

    monkeypatch.setattr(loop, "_rl_step", counting_step)
    out = {}
    for name, skip in (("skip", True), ("forward", False)):
        if not skip:
            monkeypatch.setattr(loop, "starts_at_reference", lambda *_: False)
        out[name] = run_cycle(tiny_model_dir, None, CONTEXTS, task, problems, cfg, tmp_path / name,
                              "toy/ref", 0, progress=False)
    skipped, ran = forwards[:3], forwards[3:]
    assert skipped[:2] == [0, 0] and skipped[2] > 0 and all(n > 0 for n in ran), forwards
    a, b = (pl.read_parquet(out[k].metrics_path) for k in ("skip", "forward"))
    assert a["lr"].to_list() == [0.0, 5e-4, 1e-3]
    assert a["kl_to_base"].to_list()[:2] == [0.0, 0.0] and a["kl_to_base"][2] > 0
    assert b["kl_to_base"].to_list()[:2] == pytest.approx([0.0, 0.0], abs=1e-6)
    ra, rb = (pl.read_parquet(out[k].rollouts_path) for k in ("skip", "forward"))
    assert ra["completion"].to_list() == rb["completion"].to_list()
    wa, wb, w0 = _weights(out["skip"].model_dir), _weights(out["forward"].model_dir), _weights(tiny_model_dir)
    moved = max(float((wa[k] - w0[k]).abs().max()) for k in wa)
    assert moved > 1e-4  # the steps did change the weights
    for name in wa:
        torch.testing.assert_close(wa[name], wb[name], rtol=0, atol=1e-5 * max(1.0, moved))

    forwards.clear()
    monkeypatch.setattr(loop, "starts_at_reference", real_starts)
    run_cycle(tiny_model_dir, out["skip"].out_dir, CONTEXTS, task, problems, dataclasses.replace(cfg, steps_per_cycle=1),
              tmp_path / "next", "toy/ref", 1, progress=False)
    assert forwards[0] > 0  # the next cycle's weights were saved by this one: never the reference's


def test_a_step_whose_gradient_is_not_finite_stops_the_cycle_before_the_optimiser(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN in the step's gradient (a bf16 overflow, a KL blow-up) went into AdamW, which wrote NaN
    weights and moments even at lr 0, and the cycle saved them for every later cycle and
    evaluation to sample from. The cycle now stops before the optimiser step, in one line naming
    the run, cycle and step, and writes nothing."""
    from fastslow.slow import loop

    real = loop.clip_gradients
    calls = []

    def poisoned(parameters: Any, *args: Any, **kwargs: Any) -> float:
        parameters = list(parameters)
        calls.append(1)
        if len(calls) == 2:  # the second step's gradient: one entry NaN
            next(p for p in parameters if p.grad is not None).grad.view(-1)[0] = float("nan")
        return real(parameters, *args, **kwargs)

    monkeypatch.setattr(loop, "clip_gradients", poisoned)
    task = LengthTask()
    with pytest.raises(loop.NonFiniteGradient,
                       match=r"^slow toy/nan cycle 0 step 2/3 \(global 1\): gradient norm nan \(loss .*\); the weights "
                             r"were not updated and nothing was saved"):
        run_cycle(tiny_model_dir, None, CONTEXTS, task, task.problems("train", 2, 0), _cfg(3), tmp_path / "c0",
                  "toy/nan", 0, progress=False)
    assert not (tmp_path / "c0").exists() and not list(tmp_path.iterdir())  # no output, no temp dir left
    assert len(calls) == 2  # stopped at that step


def test_bf16_step_autocasts_on_cpu(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """slow.bf16 on a CPU: the step's forward passes run in bf16 (a Linear layer's outputs are
    bf16), the saved weights stay fp32 and take an update close to the fp32 step's."""
    import dataclasses

    import torch

    from fastslow import hardware

    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)  # emulated where missing: slow, correct
    seen: set[torch.dtype] = set()
    real_linear = torch.nn.Linear.forward

    def spy(self, x):
        out = real_linear(self, x)
        if torch.is_grad_enabled():
            seen.add(out.dtype)
        return out

    task = LengthTask()
    problems = task.problems("train", 2, 0)
    out = {}
    for bf16 in (False, True):
        cfg = dataclasses.replace(_cfg(1), warmup_steps=0, bf16=bf16)
        seen.clear()
        with monkeypatch.context() as m:
            m.setattr(torch.nn.Linear, "forward", spy)
            out[bf16] = run_cycle(tiny_model_dir, None, CONTEXTS, task, problems, cfg, tmp_path / f"bf16_{bf16}",
                                  "toy/bf16", 0, progress=False)
        assert seen == ({torch.bfloat16} if bf16 else {torch.float32})
    w32, w16, w0 = _weights(out[False].model_dir), _weights(out[True].model_dir), _weights(tiny_model_dir)
    assert all(t.dtype == torch.float32 for t in w16.values())
    delta32 = torch.cat([(w32[k] - w0[k]).flatten() for k in w0])
    delta16 = torch.cat([(w16[k] - w0[k]).flatten() for k in w0])
    assert float(delta16.abs().max()) > 1e-4  # the bf16 step did train
    # same rollouts only up to sampling noise in bf16, so compare update directions loosely
    assert float(torch.nn.functional.cosine_similarity(delta32, delta16, dim=0)) > 0.5


def _first_step_sampled(model_dir: Path, steps: int = 1, shift: float = 2.0,
                        cfg: SlowConfig | None = None) -> tuple[Any, ...]:
    """What a fast round with fast.reuse_in_slow hands the first `steps` RL steps: for each of
    their (context, problem) rows, 2 samples of an fp32 HFGenerator with the cycle's initial
    weights, their per-token log-probs lowered by `shift` (2: as if another sampler found the
    tokens less likely). Returns the task, config (G = 4: 2 contexts × 2 samples), problems, the
    steps' problems, the rows' (context hash, problem id) keys, the generations and the rollouts
    as given."""
    from fastslow.model.convert import load_model, load_tokenizer
    from fastslow.model.generation import HFGenerator, SamplingParams
    from fastslow.slow.loop import cycle_step_problems
    from fastslow.tasks.base import build_messages

    task = LengthTask()
    cfg = cfg or dataclasses.replace(_cfg(2), bf16=False)  # fp32 sampler and step
    problems = task.problems("train", 3 * steps, 0)
    step = cycle_step_problems(None, problems, cfg, steps=steps)
    assert len(step) == cfg.problems_per_step * steps
    gen = HFGenerator(load_model(model_dir, dtype="float32"), load_tokenizer(model_dir))
    keys = [(context_hash(text), p.id) for p in step for _, text in CONTEXTS for _ in range(2)]
    convs = [build_messages(text, p) for p in step for _, text in CONTEXTS for _ in range(2)]
    gens = gen.generate(convs, SamplingParams(max_new_tokens=8, temperature=1.0, seed=3))
    given: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for key, g in zip(keys, gens, strict=True):
        given.setdefault(key, []).append({"prompt_ids": g.prompt_ids, "completion_ids": g.completion_ids,
                                          "logprobs": [lp - shift for lp in g.token_logprobs]})
    return task, cfg, problems, step, keys, gens, given


def test_first_step_trains_on_rollouts_sampled_with_its_weights(tiny_model_dir: Path, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """fast.reuse_in_slow, slow side: rollouts an HFGenerator sampled with the same weights for
    the first step's (problem, context) rows are trained on as given, not generated; the next
    step generates; rows whose prompt tokens differ from TRL's are generated (and reported).
    The given per-token sampling log-probs are the behaviour policy's: here shifted by -2 (as
    if another sampler found the tokens less likely), so pi_theta / pi_behaviour on every reused
    token is e^2 (`reused_is_weight`), above CISPO's cap tau = 4: the loss caps every reused
    token's weight (`clip_fraction`, their share of the step's tokens), and no token's of the
    next, on-policy step.
    The rollout records carry the sampler's log-prob sums."""
    import polars as pl

    task, cfg, problems, step, keys, gens, given = _first_step_sampled(tiny_model_dir)
    bad = (context_hash(CONTEXTS[1][1]), step[1].id)  # other prompt tokens: must be generated
    given[bad] = [{**r, "prompt_ids": (*r["prompt_ids"], 0)} for r in given[bad]]
    with caplog.at_level(logging.INFO, logger="fastslow.slow"):
        result = run_cycle(tiny_model_dir, None, CONTEXTS, task, problems, cfg, tmp_path / "c0",
                           "toy/run", 0, progress=False, round_rollouts=given)
    assert [m["reused_rollouts"] for m in result.metrics] == [6, 0]
    # and each rollout says whether it was: the rows of other prompt tokens were generated
    rollouts = pl.read_parquet(result.rollouts_path)
    assert rollouts.group_by("step").agg(pl.col("reused").sum()).sort("step")["reused"].to_list() == [6, 0]
    assert not rollouts.filter((pl.col("context_hash") == bad[0]) & (pl.col("problem_id") == bad[1]))["reused"].any()
    # the step's line says so (its tok/s counts the 2 generated rows alone: it read like a stall)
    lines = [r.getMessage() for r in caplog.records if " step " in r.getMessage() and "reward" in r.getMessage()]
    assert "(6 rollouts sampled before this step, not generated in it)" in lines[0]
    assert "sampled before" not in lines[1]
    assert result.metrics[0]["reused_is_weight"] == pytest.approx(math.exp(2.0), rel=1e-3)
    assert math.isnan(result.metrics[1]["reused_is_weight"])
    assert result.metrics[1]["clip_fraction"] == 0
    assert all(m["generation_seconds"] > 0 for m in result.metrics)  # 2 rows, then all 8
    assert "2 reused rollouts had other prompt tokens" in caplog.text
    first = pl.read_parquet(result.rollouts_path).filter(pl.col("step") == 0)
    assert first["problem_id"].to_list() == [pid for _, pid in keys]
    for i, (key, g) in enumerate(zip(keys, gens, strict=True)):
        if key != bad:
            assert first["completion"][i] == g.text
            assert first["completion_tokens"][i] == g.completion_tokens
            assert first["logprob_sum"][i] == pytest.approx(g.logprob_sum - 2.0 * g.completion_tokens,
                                                            rel=1e-4, abs=1e-4)
    # every reused token's weight, e^2, passed the cap, whatever its advantage; no generated one's
    reused = sum(n for (key, n) in zip(keys, first["completion_tokens"], strict=True) if key != bad)
    assert result.metrics[0]["clip_fraction"] == pytest.approx(reused / first["completion_tokens"].sum())


def _loss_spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Record each TRL loss call that had sampling log-probs: (behaviour_logps, the old log-probs
    TRL's loss read), both as they stood when the loss returned."""
    from trl import GRPOTrainer

    calls: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    real = GRPOTrainer._compute_loss

    def spy(self, model, inputs):
        out = real(self, model, inputs)
        if "behaviour_logps" in inputs:
            old = inputs.get("old_per_token_logps")
            calls.append((inputs["behaviour_logps"].clone(), None if old is None else old.detach().clone()))
        return out

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", spy)
    return calls


def _assert_loss_took_the_samplers_logps(calls: list[tuple[torch.Tensor, torch.Tensor | None]]) -> None:
    """CISPO's weight pi_theta / pi_old used the sampler's log-probs as pi_old on every reused token
    (the logged `reused_is_weight` alone is computed beside the loss, not by it)."""
    assert calls
    for behaviour, old in calls:
        known = ~torch.isnan(behaviour)
        assert known.any() and old is not None
        assert torch.equal(old[known].float(), behaviour[known])


def test_later_steps_train_on_the_rounds_older_samples_with_their_importance_weight(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fast.reuse_steps = 2 of T = 3: the round sampled the first two steps' rows with the cycle's
    initial weights and their own log-probs. Both steps train on them, each rollout once (the
    second step does not take the first's again), and the third generates. The first step's
    weights are the sampler's: pi_theta / pi_behaviour is 1 on every reused token. The second
    step's weights moved (one update at lr 1e-3, no warm-up): its weight on the same kind of
    rollouts is not 1, and CISPO's loss uses it (no clipping needed to tell)."""
    losses = _loss_spy(monkeypatch)
    cfg = dataclasses.replace(_cfg(3), bf16=False, warmup_steps=0)
    task, cfg, problems, step, keys, gens, given = _first_step_sampled(tiny_model_dir, steps=2, shift=0.0, cfg=cfg)
    result = run_cycle(tiny_model_dir, None, CONTEXTS, task, problems, cfg, tmp_path / "c0",
                       "toy/run", 0, progress=False, round_rollouts=given)
    assert [m["reused_rollouts"] for m in result.metrics] == [8, 8, 0]
    assert result.metrics[0]["reused_is_weight"] == pytest.approx(1.0, abs=1e-3)
    assert abs(result.metrics[1]["reused_is_weight"] - 1.0) > 1e-3, result.metrics[1]["reused_is_weight"]
    # weights near 1, not 1: CISPO's cap tau (slow.epsilon_high) binds on none of them (a
    # threshold of 1 instead of tau counted about half; the other tests' weights were 1 or e^2)
    assert result.metrics[1]["clip_fraction"] == 0
    assert math.isnan(result.metrics[2]["reused_is_weight"])
    _assert_loss_took_the_samplers_logps(losses)
    import polars as pl

    rollouts = pl.read_parquet(result.rollouts_path)
    served = rollouts.filter(pl.col("step") < 2)
    assert served["problem_id"].to_list() == [pid for _, pid in keys]  # the round's, in step order
    assert served["completion"].to_list() == [g.text for g in gens]  # each rollout once
    assert rollouts.filter(pl.col("step") == 2).height == 8
    # each row says how many updates old its sampler was: the second step's are one
    per_step = rollouts.group_by("step").agg(pl.col("reused").sum(), pl.col("policy_lag").unique()).sort("step")
    assert per_step["reused"].to_list() == [8, 8, 0] and per_step["policy_lag"].to_list() == [[0], [1], [0]]


def test_a_resumed_cycles_reused_rollouts_are_as_old_as_the_updates_since_their_sampler(
        runs: dict[str, Any], tiny_model_dir: Path, tmp_path: Path) -> None:
    """The round of a later cycle samples with that cycle's initial weights (global step 2 here):
    its rollouts' policy_lag counts the updates since then (0 in the cycle's first step, 1 in its
    second), not since the run's start. A row whose given rollout was generated instead (other
    prompt tokens) is on-policy: lag 0, whatever the rollout it replaced would have had."""
    import polars as pl

    from fastslow.model.convert import load_model, load_tokenizer
    from fastslow.model.generation import HFGenerator, SamplingParams
    from fastslow.slow.loop import cycle_step_problems
    from fastslow.tasks.base import build_messages

    task, first = LengthTask(), runs["first"]
    problems = task.problems("train", 3, 0)  # the fixture's train set
    cfg = _cfg(2)
    step = cycle_step_problems(first.out_dir, problems, cfg, steps=2)
    keys = [(context_hash(text), p.id) for p in step for _, text in CONTEXTS for _ in range(2)]
    gen = HFGenerator(load_model(first.model_dir, dtype="float32"), load_tokenizer(first.model_dir))
    gens = gen.generate([build_messages(text, p) for p in step for _, text in CONTEXTS for _ in range(2)],
                        SamplingParams(max_new_tokens=8, temperature=1.0, seed=3))
    given: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for key, g in zip(keys, gens, strict=True):
        given.setdefault(key, []).append({"prompt_ids": g.prompt_ids, "completion_ids": g.completion_ids,
                                          "logprobs": list(g.token_logprobs)})
    # a pair of the second step whose rollouts dealt there (each pair's queue is dealt in order)
    # have other prompt tokens: generated in that step
    bad = (context_hash(CONTEXTS[0][1]), step[2].id)
    assert len(given[bad]) == 4, step  # both steps draw it (seed 7): the first gets the first two
    given[bad][2:] = [{**r, "prompt_ids": (*r["prompt_ids"], 0)} for r in given[bad][2:]]
    result = run_cycle(tiny_model_dir, first.out_dir, CONTEXTS, task, problems, cfg, tmp_path / "c1", "toy/run", 1,
                       progress=False, round_rollouts=given)
    assert result.global_step == 4
    rollouts = pl.read_parquet(result.rollouts_path)
    assert rollouts["step"].unique().sort().to_list() == [2, 3]
    is_bad = (pl.col("context_hash") == bad[0]) & (pl.col("problem_id") == bad[1]) & (pl.col("step") == 3)
    assert not rollouts.filter(is_bad)["reused"].any()
    assert set(rollouts.filter(is_bad)["policy_lag"]) == {0}
    served = rollouts.filter(~is_bad)
    assert served["reused"].all()
    lags = served.group_by("step").agg(pl.col("policy_lag").unique()).sort("step")["policy_lag"].to_list()
    assert lags == [[0], [1]]


def test_a_step_that_generated_nothing_reports_no_rate(tiny_model_dir: Path, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Every row of the first step given by the fast round: the step generated no token, so its
    tok/s is NaN (not measured), not 0 (which read like a stall), and its log line says so; the
    next step generates and has a rate."""
    task, cfg, problems, *_, given = _first_step_sampled(tiny_model_dir)
    with caplog.at_level(logging.INFO, logger="fastslow.slow"):
        result = run_cycle(tiny_model_dir, None, CONTEXTS, task, problems, cfg, tmp_path / "c0",
                           "toy/run", 0, progress=False, round_rollouts=given)
    assert [m["reused_rollouts"] for m in result.metrics] == [8, 0]
    assert math.isnan(result.metrics[0]["generated_tokens_per_s"])
    assert result.metrics[1]["generated_tokens_per_s"] > 0
    lines = [r.getMessage() for r in caplog.records if " step " in r.getMessage() and "reward" in r.getMessage()]
    assert re.search(r" tok \(\d+% cut at 8\) none generated here \(8 rollouts sampled before this step", lines[0])
    assert "tok/s" in lines[1] and "none generated" not in lines[1]


def _sampling_spy(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record every `sample_ahead` call of the slow loop: its seed, the rollouts it appended (in
    order) and what it returned."""
    from fastslow.slow import loop

    calls: list[dict[str, Any]] = []
    real = loop.sample_ahead

    def spy(model, tokenizer, block, left, hashes, chats, cfg, seed, *, sampled_at):
        before = {key: len(queue) for key, queue in left.items()}
        out = real(model, tokenizer, block, left, hashes, chats, cfg, seed, sampled_at=sampled_at)
        added = {key: queue[before.get(key, 0):] for key, queue in left.items() if len(queue) > before.get(key, 0)}
        calls.append({"seed": seed, "steps": len(block), "added": added, "returned": out})
        return out

    monkeypatch.setattr(loop, "sample_ahead", spy)
    return calls


def test_steps_per_generation_samples_a_blocks_rollouts_once_and_the_later_steps_train_on_them(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """slow.steps_per_generation = 2 of T = 3: the first step samples the rollouts of steps 1-2 in
    one call with its own weights, the second trains on the rest of them (generating nothing), and
    the third starts a block of its own (one step: the cycle's end). Each sampled rollout is
    trained on once, in step order; the sampling call's time and tokens are the first step's
    generation. Step 1 trains on its sampler's weights (importance weight 1), step 2 on weights
    one update newer (not 1)."""
    import polars as pl

    calls = _sampling_spy(monkeypatch)
    losses = _loss_spy(monkeypatch)
    task = LengthTask()
    problems = task.problems("train", 6, 0)
    cfg = dataclasses.replace(_cfg(3), bf16=False, warmup_steps=0, steps_per_generation=2)
    result = run_cycle(tiny_model_dir, None, CONTEXTS, task, problems, cfg, tmp_path / "c0",
                       "toy/run", 0, progress=False)
    assert [(c["steps"], c["returned"][2]) for c in calls] == [(2, 16), (1, 8)]
    assert calls[0]["seed"] != calls[1]["seed"]
    assert [m["sampled_ahead_rollouts"] for m in result.metrics] == [16, 0, 8]
    assert [m["reused_rollouts"] for m in result.metrics] == [8, 8, 8]  # no step generated its own
    rollouts = pl.read_parquet(result.rollouts_path)
    assert rollouts["reused"].all()  # none generated in its own step...
    # ...but only the block's second step trains on an older sampler's rows
    assert rollouts.group_by("step").agg(pl.col("policy_lag").unique()).sort("step")["policy_lag"].to_list() == \
        [[0], [1], [0]]
    from fastslow.cycle import _rollouts_sampled

    # the samples axis counts what the sampler returned
    assert _rollouts_sampled(tmp_path / "c0", result.metrics, {}) == sum(c["returned"][2] for c in calls) == 24
    assert result.metrics[0]["generation_seconds"] >= calls[0]["returned"][0] > 0
    assert result.metrics[0]["generated_tokens_per_s"] > 0 and math.isnan(result.metrics[1]["generated_tokens_per_s"])
    assert result.metrics[0]["reused_is_weight"] == pytest.approx(1.0, abs=1e-3)
    assert abs(result.metrics[1]["reused_is_weight"] - 1.0) > 1e-3, result.metrics[1]["reused_is_weight"]
    _assert_loss_took_the_samplers_logps(losses)
    rollouts = pl.read_parquet(result.rollouts_path)
    by_step = {s: rollouts.filter(pl.col("step") == s) for s in range(3)}
    for first, call in ((0, calls[0]), (2, calls[1])):
        steps = [by_step[s] for s in range(first, first + call["steps"])]
        served: dict[tuple[str, str], list[int]] = {}
        for step in steps:
            for row in step.iter_rows(named=True):
                served.setdefault((row["context_hash"], row["problem_id"]), []).append(row["completion_tokens"])
        sampled = {key: [len(r["completion_ids"]) for r in queue] for key, queue in call["added"].items()}
        assert served == sampled  # every sampled rollout once, in the order sampled
    from fastslow.slow.loop import take_problems

    stream = [problems[i].id for i in take_problems(len(problems), cfg.seed, 0, 6)]
    assert rollouts.unique(subset=["step", "problem_id"], maintain_order=True)["problem_id"].to_list() == stream


def test_steps_per_generation_is_deterministic_and_takes_the_rounds_rollouts_first(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the round's rollouts for step 1 (fast.reuse_in_slow) and steps_per_generation = 2, the
    block samples only step 2's rows; step 1 trains on the round's. Two runs of the same cycle
    write the same rollouts."""
    import polars as pl

    calls = _sampling_spy(monkeypatch)
    cfg = dataclasses.replace(_cfg(2), bf16=False, steps_per_generation=2)
    task, cfg, problems, step, keys, gens, given = _first_step_sampled(tiny_model_dir, steps=1, shift=0.0, cfg=cfg)
    tables = []
    for name in ("a", "b"):
        result = run_cycle(tiny_model_dir, None, CONTEXTS, task, problems, cfg, tmp_path / name,
                           "toy/run", 0, progress=False, round_rollouts=given)
        tables.append(pl.read_parquet(result.rollouts_path))
    assert [c["returned"][2] for c in calls] == [8, 8]  # step 2's 8 rows, not step 1's
    assert [m["reused_rollouts"] for m in result.metrics] == [8, 8]
    assert tables[0].filter(pl.col("step") == 0)["completion"].to_list() == [g.text for g in gens]
    columns = ["step", "problem_id", "context_id", "completion", "reward"]
    assert tables[0].select(columns).equals(tables[1].select(columns))


def test_steps_per_generation_refuses_vllm_and_several_processes_and_distillation_ignores_it(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One line naming the value where sampling ahead cannot run: with vLLM (SlowConfig and the
    config check) and under several processes (before any work). An fst_distill run ignores it, as
    it ignores CISPO's keys: set globally or in the overrides of an experiment that has
    fst_distill runs (which apply to its rl and fst runs too), the config passes and the
    distillation cycles' params leave it out (they were refused, whatever their rl runs asked)."""
    import copy

    from fastslow.config import ConfigError, load_config, validate_config
    from fastslow.experiments import expand
    from fastslow.slow import loop

    with pytest.raises(ValueError, match=r"^SlowConfig.steps_per_generation: 3 .*set it to 1$"):
        SlowConfig(use_vllm=True, steps_per_generation=3)
    with pytest.raises(ValueError, match=r"SlowConfig.steps_per_generation: expected a positive integer, got 0"):
        SlowConfig(steps_per_generation=0)
    config = load_config(Path(__file__).resolve().parents[1] / "config" / "config.yaml")
    bad = copy.deepcopy(config)
    bad["slow"].update(steps_per_generation=2, use_vllm=True)
    with pytest.raises(ConfigError, match=r"^config error: slow.steps_per_generation: 2 .*set it to 1$"):
        validate_config(bad)
    globally, in_ceiling = copy.deepcopy(config), copy.deepcopy(config)
    globally["slow"]["steps_per_generation"] = 3
    in_ceiling["experiments"]["ceiling"].setdefault("overrides", {})["slow"] = {"steps_per_generation": 3}
    for batched in (globally, in_ceiling):
        validate_config(batched)  # (the experiments' checks included)
        runs = [r for r in expand(batched).values() if r.experiment == "ceiling"]
        assert {r.method for r in runs} >= {"fst_distill"}
        for run in runs:
            read = run.cycle_params(batched, ("slow",))["slow"]
            assert ("steps_per_generation" in read) == (run.method in ("rl", "fst")), run.key
            assert run.settings(batched)["slow"]["steps_per_generation"] == 3
    monkeypatch.setattr(loop, "world_size", lambda: 2)
    monkeypatch.setattr(loop, "per_rank_batches", lambda cfg, n: (1, 1))
    # a cycle of several processes refuses it before its fast round, not in its ranks after it
    import fastslow.fast
    from fastslow.cycle import run_cycle as cycle_job
    from fastslow.experiments import RunSpec
    from fastslow.tasks.base import Problem
    from fastslow.tasks.data import write_problems

    monkeypatch.setattr(fastslow.fast, "run_round", lambda *a, **k: pytest.fail("the fast round ran"))
    monkeypatch.setenv("FASTSLOW_TRAIN_PROCESSES", "2")
    train = write_problems([Problem(f"p{i}", "math", f"What is {i} + 1?", str(i + 1)) for i in range(8)],
                           tmp_path / "train.parquet")
    smoke = load_config("config/config.yaml", "config/smoke.yaml")
    smoke["slow"]["steps_per_generation"] = 2
    spec = RunSpec(experiment="e", method="fst", name="math-default-s0", schedule=("math",), seed=0)
    with pytest.raises(ValueError, match=r"^slow.steps_per_generation: 2 samples ahead in one process; this "
                                         r"cycle runs on 2: set it to 1$"):
        cycle_job(spec, smoke, 0, tiny_model_dir, None, train, tmp_path / "job")
    task = LengthTask()
    with pytest.raises(ValueError, match=r"^slow.steps_per_generation: 2 samples ahead in one process; this "
                                         r"cycle runs on 2: set it to 1$"):
        run_cycle(tiny_model_dir, None, CONTEXTS, task, task.problems("train", 4, 0),
                  dataclasses.replace(_cfg(2), steps_per_generation=2), tmp_path / "c0", "toy/run", 0)
    assert not (tmp_path / "c0").exists()


def test_fst_trains_on_its_rounds_pool_and_is_evaluated_with_its_best_context(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-off at the heart of FST: the RL steps sample from the pool the round returned
    (every context of it, G/K rollouts each), and an fst or gepa run is evaluated with the pool's
    best context, rl and fst_distill with the seed context. Every other test's round keeps the
    seed context alone (the tiny model accepts no edit), so training or evaluating with the seed
    context would have passed them all. The round is stubbed to return two contexts of its own."""
    import json

    import polars as pl

    import fastslow.fast
    from fastslow.config import load_config
    from fastslow.cycle import eval_context, run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.fast import Pool
    from fastslow.tasks.base import Problem
    from fastslow.tasks.data import write_problems

    config = load_config("config/config.yaml", "config/smoke.yaml")  # K = 2, G = 4, T = 2
    found = ["Add the numbers. Answer with the sum alone.", "Think, then give <answer>N</answer>."]

    def round_(pool, *args, **kwargs):
        return Pool.seed(found, pool.k), {"best_val_mean": 0.5, "generations": 0, "metric_calls": 0, "proposed": 2,
                                          "accepted": 2, "seed_eval_seconds": 0.0, "search_eval_seconds": 0.0,
                                          "slow_sample_seconds": 0.0}

    monkeypatch.setattr(fastslow.fast, "run_round", round_)
    train = write_problems([Problem(f"p{i}", "math", f"What is {i} + 1?", str(i + 1)) for i in range(8)],
                           tmp_path / "train.parquet")
    spec = RunSpec(experiment="e", method="fst", name="math-default-s0", schedule=("math",), seed=0)
    run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "c0")
    pool = Pool.from_json(tmp_path / "c0" / "pool.json")
    assert [e.text for e in pool.entries] == found
    rollouts = pl.read_parquet(tmp_path / "c0" / "rollouts.parquet")
    steps, g, k = config["slow"]["steps_per_cycle"], config["slow"]["num_generations"], 2
    by_context = rollouts.group_by("context_id").len().sort("context_id")
    assert by_context["context_id"].to_list() == sorted(e.id for e in pool.entries)
    assert by_context["len"].to_list() == [steps * g // k] * k  # G/K of every step's G, each context
    for e in pool.entries:  # each prompt is its context's text, then the problem
        prompts = rollouts.filter(pl.col("context_id") == e.id)["prompt"].to_list()
        assert all(e.text in p and config["seed_context"] not in p for p in prompts)
    # evaluated with: the pool's best for fst and gepa, the seed context for rl and fst_distill
    for method, expected in (("fst", (pool.entries[0].id, found[0])), ("gepa", (pool.entries[0].id, found[0])),
                             ("rl", ("seed", config["seed_context"])),
                             ("fst_distill", ("seed", config["seed_context"]))):
        run = RunSpec(experiment="e", method=method, name="math-default-s0", schedule=("math",), seed=0)
        assert eval_context(run, config, tmp_path / "c0" / "pool.json") == expected, method
    assert eval_context(spec, config, None) == ("seed", config["seed_context"])  # the initial weights
    assert json.loads((tmp_path / "c0" / "cycle.json").read_text())["pool_best"] == pool.entries[0].id


def test_a_context_filling_several_pool_slots_gets_an_id_per_slot() -> None:
    """A pool holding fewer than K distinct contexts repeats them to fill its K slots (the seed
    context alone, at first): each slot is a context of its own to the RL step (G/K rollouts),
    with a suffixed id, so the per-context rows never merge."""
    from fastslow.cycle import unique_contexts
    from fastslow.fast import Pool

    pool = Pool.seed(["A.", "B."], 4)
    a, b = (e.id for e in pool.entries[:2])
    assert unique_contexts(pool.contexts(4)) == [(a, "A."), (b, "B."), (f"{a}#1", "A."), (f"{b}#1", "B.")]
    assert unique_contexts(Pool.seed(["A."], 2).contexts(2)) == [(a, "A."), (f"{a}#1", "A.")]


@pytest.mark.parametrize("schedule", [("math", "math"), ("math", "math_hard")], ids=["same-task", "task-switch"])
def test_rollout_reuse_does_not_cross_a_continual_task_switch(schedule: tuple[str, str], tiny_model_dir: Path,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fast.reuse_rollouts` hands the round the last cycle's RL rollouts, keyed by problem id; a
    continual run's first cycle on a new task must not take them (two tasks' ids can coincide: a
    file task keeps its rows' ids, Hub datasets number theirs). Within a task it does."""
    import shutil

    import polars as pl
    from slow_toys import stub_slow_steps_and_write_math

    import fastslow.fast
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.fast import Pool

    config, train = stub_slow_steps_and_write_math(monkeypatch, tmp_path / "data")
    config["fast"]["reuse_rollouts"] = True
    prev = tmp_path / "c0"
    shutil.copytree(tiny_model_dir, prev / "model")
    Pool.seed([config["seed_context"]], 2).to_json(prev / "pool.json")
    pl.DataFrame({"problem_id": ["p0"], "completion": ["<answer>1</answer>"]}).write_parquet(prev / "rollouts.parquet")
    handed: list = []

    def round_(pool, *args, **kwargs):
        handed.append(kwargs["reuse_rollouts"])
        return pool, {"best_val_mean": 0.0, "generations": 0, "metric_calls": 0, "proposed": 0, "accepted": 0,
                      "seed_eval_seconds": 0.0, "search_eval_seconds": 0.0, "slow_sample_seconds": 0.0}

    monkeypatch.setattr(fastslow.fast, "run_round", round_)
    spec = RunSpec(experiment="e", method="fst", name="r", schedule=schedule, seed=0)
    run_cycle(spec, config, 1, tiny_model_dir, prev, train, tmp_path / "c1")
    assert handed == [prev / "rollouts.parquet" if schedule[1] == schedule[0] else None]


def _fst_cycle_with_template(tiny_model_dir: Path, tmp_path: Path, template: str,
                             chat_template_kwargs: dict[str, Any]) -> tuple[Path, Any, dict[str, Any], dict[str, Path]]:
    """The tiny model under `template`, and one FST cycle (cycle 0 of an FST run on math, its
    first RL step served by the round's rollouts) rendered with `chat_template_kwargs`, written to
    tmp_path/c0. Returns the model's directory, its tokenizer, the config and the math splits."""
    import shutil

    from fastslow.config import load_config, task_spec
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.model.convert import load_tokenizer
    from fastslow.tasks.data import write_splits

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    tokenizer = load_tokenizer(model)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(model)
    config = load_config("config/config.yaml", "config/smoke.yaml", overrides={
        "model": {"chat_template_kwargs": chat_template_kwargs},
        "fast": {"reuse_in_slow": True, "reuse_steps": 1}})
    registry, options = task_spec(config, "math")
    splits = write_splits(registry, tmp_path / "data", config["data"]["sizes"], config["data"]["seed"], **options)
    spec = RunSpec(experiment="e", method="fst", name="math-default-s0", schedule=("math",), seed=0)
    run_cycle(spec, config, 0, model, None, splits["train"], tmp_path / "c0")
    return model, tokenizer, config, splits


NO_THINK_TEMPLATE = (
    "{%- if enable_thinking is defined and not enable_thinking %}[no-think]{% endif -%}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")


def test_chat_template_kwargs_reach_every_prompt_the_run_renders(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`model.chat_template_kwargs` ({enable_thinking: false}: Qwen3's non-thinking mode) reached
    no prompt: the round, TRL's RL steps and evaluation all rendered the template's defaults (Qwen3
    thinks), with no way to change it. Now every renderer gets them alike: the RL steps' prompts
    (TRL's tokens, our texts) and the round's, whose rollouts the RL step reuses only when their
    prompt ids equal TRL's, and the evaluation's. The template here marks the non-thinking mode."""
    import polars as pl

    from fastslow.config import evaluation_options, make_task
    from fastslow.evaluate import evaluate_weights
    from fastslow.fast import Pool
    from fastslow.model.generation import SamplingParams, encode_prompts
    from fastslow.tasks.base import build_messages
    from fastslow.tasks.data import load_problems

    kwargs = {"enable_thinking": False}
    model, tokenizer, config, splits = _fst_cycle_with_template(tiny_model_dir, tmp_path, NO_THINK_TEMPLATE, kwargs)
    rollouts = pl.read_parquet(tmp_path / "c0" / "rollouts.parquet")
    assert all(p.startswith("[no-think]<|im_start|>system\n") for p in rollouts["prompt"].to_list())
    problems = {p.id: p for p in load_problems(splits["train"])}
    pool = {e.id: e.text for e in Pool.from_json(tmp_path / "c0" / "pool.json").entries}
    first = rollouts.row(0, named=True)
    context = pool[first["context_id"].split("#")[0]]
    ids = encode_prompts(tokenizer, [build_messages(context, problems[first["problem_id"]])], kwargs)[0]
    assert first["prompt_tokens"] == len(ids)  # TRL's own count: it rendered with them too
    metrics = pl.read_parquet(tmp_path / "c0" / "metrics.parquet")
    assert metrics["reused_rollouts"][0] == config["slow"]["num_generations"]  # the round's ids are TRL's
    summary, rows = evaluate_weights(model, make_task(config, "math"), load_problems(splits["val"])[:2],
                                     config["seed_context"], 1, SamplingParams(4, 1.0, 1.0, 0),
                                     **{**evaluation_options(config), "divergence": False})
    plain = encode_prompts(tokenizer, [build_messages(config["seed_context"], load_problems(splits["val"])[0])])[0]
    marked = encode_prompts(tokenizer, [build_messages(config["seed_context"], load_problems(splits["val"])[0])],
                            kwargs)[0]
    assert len(marked) > len(plain) and rows[0]["prompt_tokens"] == len(marked)


#: DeepSeek-R1's distilled models' way: the generation prompt opens the reasoning trace
OPEN_THINK_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is not defined or enable_thinking %}<think>\n{% endif %}{% endif -%}")


@pytest.mark.parametrize("thinking", [True, False])
def test_a_trace_the_template_opens_is_in_front_of_every_completion_a_run_scores(
        thinking: bool, tiny_model_dir: Path, tmp_path: Path) -> None:
    """A template that ends the generation prompt with "<think>" leaves the completion only the
    trace's "</think>": a trace cut off at the token budget read as an answer, a draft
    "<answer>" in it included. The RL steps' completions (TRL's, scored by `TaskReward`), the
    round's and the evaluation's (our generators') now all carry the opener, and the round's
    rollouts still serve the first step (their prompt ids are TRL's). With the template's
    thinking off nothing is added."""
    import polars as pl

    from fastslow.config import evaluation_options, make_task
    from fastslow.evaluate import evaluate_weights
    from fastslow.model.generation import SamplingParams
    from fastslow.tasks.data import load_problems

    model, _, config, splits = _fst_cycle_with_template(tiny_model_dir, tmp_path, OPEN_THINK_TEMPLATE,
                                                        {"enable_thinking": thinking})
    rollouts = pl.read_parquet(tmp_path / "c0" / "rollouts.parquet")
    metrics = pl.read_parquet(tmp_path / "c0" / "metrics.parquet")
    assert metrics["reused_rollouts"][0] == config["slow"]["num_generations"]  # the round's served step 1
    assert rollouts["reused"].any() and not rollouts["reused"].all()  # round's and TRL's completions both
    assert all(c.startswith("<think>") == thinking for c in rollouts["completion"].to_list())
    assert all(p.rstrip().endswith("<think>") == thinking for p in rollouts["prompt"].to_list())
    _, rows = evaluate_weights(model, make_task(config, "math"), load_problems(splits["val"])[:2],
                               config["seed_context"], 1, SamplingParams(4, 1.0, 1.0, 0),
                               **{**evaluation_options(config), "divergence": False})
    assert all(r["completion"].startswith("<think>") == thinking for r in rows)


def test_the_readmes_library_example_runs(tmp_path: Path) -> None:
    """README's "Use as a library" block, run as written (in a scratch directory holding the
    checkout's config/): two FST cycles of the tiny model, an evaluation, the metrics table; and
    the one-line errors it promises for a bad method, a cycle past the schedule and a bad option."""
    import subprocess
    import sys

    from fastslow.cycle import run_cycle as full_cycle
    from fastslow.experiments import RunSpec
    from fastslow.tasks import get_task

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    section = readme.split("\n## Use as a library\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    (tmp_path / "config").symlink_to(root / "config")
    (tmp_path / "example.py").write_text(code)
    out = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'mean_at_k': " in out.stdout and "kl_to_base" in out.stdout
    for cycle in (0, 1):
        assert (tmp_path / f"notebook/runs/cycle{cycle}/pool.json").exists()
        assert (tmp_path / f"notebook/runs/cycle{cycle}/model/config.json").exists()
    import polars as pl

    metrics = pl.read_parquet(tmp_path / "notebook/runs/cycle*/metrics.parquet")
    assert metrics["step"].to_list() == [0, 1, 2, 3] and set(metrics["run"]) == {"nb/fst/math-s0"}

    with pytest.raises(ValueError, match=r"^RunSpec.method: expected one of rl, fst, gepa, fst_distill, got 'FST'$"):
        RunSpec(experiment="nb", method="FST", name="x", schedule=("math",), seed=0)
    spec = RunSpec(experiment="nb", method="fst", name="x", schedule=("math",), seed=0)
    with pytest.raises(ValueError, match=r"^cycle 1 of nb/fst/x: its schedule has 1 cycle\(s\) \(math\)"):
        full_cycle(spec, {}, 1, "base", "prev", "train.parquet", tmp_path / "c1")
    with pytest.raises(ValueError, match=r"^task 'math': unknown option\(s\) rel_tol; it takes sources$"):
        get_task("math", rel_tol=0.1)
    with pytest.raises(ValueError, match=r"^task 'file': unknown option\(s\) difficulty; it takes path, name, scorer, labels$"):
        get_task("file", path="x.jsonl", difficulty="hard")
    with pytest.raises(ValueError, match=r"^task 'file': labels= is only for scorer='label'"):
        get_task("file", path="x.jsonl", labels=["A", "B"])


def test_cycle_json_and_a_gepa_cycles_metrics_row_give_its_step_task_weights_and_cpu_share(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a cycle records of itself, which the curves and the report read: cycle.json's run,
    method, cycle, task (the schedule's, per cycle), global step (the steps done by its end),
    weights (its own for a trained method, θ0 for gepa) and CPU share (of all its threads); a
    gepa cycle's one metrics row sits at its last step with the round's time, and the round's
    metrics are logged at the slow step it precedes. (Slow steps, generator and round stubbed.)"""
    import json

    import polars as pl
    from slow_toys import stub_slow_steps_and_write_math

    import fastslow.cycle
    import fastslow.fast
    import fastslow.model.generation
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec

    config, train = stub_slow_steps_and_write_math(monkeypatch, tmp_path / "data")
    steps = config["slow"]["steps_per_cycle"]
    monkeypatch.setattr(fastslow.cycle, "_torch_threads", lambda: 4)
    init = tmp_path / "init"
    rl = RunSpec(experiment="e", method="rl", name="r", schedule=("math", "math_hard"), seed=0)
    for c in (0, 1):
        out = tmp_path / f"rl{c}"
        summary = run_cycle(rl, config, c, init, tmp_path / "rl0" if c else None, train, out)
        assert summary == json.loads((out / "cycle.json").read_text())
        assert (summary["run"], summary["method"], summary["cycle"], summary["task"], summary["global_step"],
                summary["weights"]) == ("e/rl/r", "rl", c, rl.schedule[c], (c + 1) * steps, str(out / "model"))
        assert summary["torch_threads"] == 4 and summary["device"] == "cpu"
        assert summary["cpu_share"] == pytest.approx(summary["cpu_seconds"] / (summary["seconds"] * 4))

    def round_(pool, *args, **kwargs):
        kwargs["run_dir"].mkdir(parents=True)
        (kwargs["run_dir"] / "proposals.json").write_text(json.dumps([kwargs["round_index"]]))
        return pool, {"best_val_mean": 0.25, "generations": 7, "metric_calls": 3, "proposed": 1, "accepted": 0,
                      "seed_eval_seconds": 0.0, "search_eval_seconds": 0.0, "slow_sample_seconds": 0.0}

    class Tracker(RecordingTracker):
        def set_tags(self, tags: dict) -> None:
            pass

    monkeypatch.setattr(fastslow.fast, "run_round", round_)
    monkeypatch.setattr(fastslow.model.generation, "make_generator", lambda *a, **k: object())
    gepa = RunSpec(experiment="e", method="gepa", name="r", schedule=("math", "math"), seed=0)
    for _ in range(2):  # run again over its own directory: the new round's files replace the old ones
        run_cycle(gepa, config, 0, init, None, train, tmp_path / "g0")
        assert json.loads((tmp_path / "g0" / "fast" / "proposals.json").read_text()) == [0]
        assert not (tmp_path / "g0.fast").exists()
    tracker = Tracker()
    summary = run_cycle(gepa, config, 1, init, tmp_path / "g0", train, tmp_path / "g1", tracker=tracker)
    assert (summary["global_step"], summary["weights"], summary["rollouts_sampled"]) == (2 * steps, str(init), 7)
    fast = json.loads((tmp_path / "g1" / "fast.json").read_text())
    assert pl.read_parquet(tmp_path / "g1" / "metrics.parquet").select("run", "cycle", "step", "fast_seconds").rows() \
        == [("e/gepa/r", 1, 2 * steps - 1, fast["seconds"])]
    assert [(m["fast/metric_calls"], m["fast/seconds"], step) for m, step in tracker.calls] == [
        (3, fast["seconds"], steps)]
    assert json.loads((tmp_path / "g1" / "fast" / "proposals.json").read_text()) == [1]


def test_the_round_samples_the_first_steps_problems_but_never_more_than_the_cycles_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fast.reuse_in_slow`: the round samples, G/K a context, the problems of the first
    `fast.reuse_steps` RL steps (the data stream's next P a step), capped at the cycle's T (a
    larger value serves all T: nothing sampled for steps the cycle does not run). (Round,
    generator and slow steps stubbed.)"""
    from slow_toys import stub_slow_steps_and_write_math

    import fastslow.fast
    import fastslow.model.generation
    from fastslow.cycle import run_cycle as cycle_job
    from fastslow.experiments import RunSpec
    from fastslow.slow.loop import take_problems
    from fastslow.tasks.data import load_problems

    config, train = stub_slow_steps_and_write_math(monkeypatch, tmp_path / "data")
    config["fast"].update(reuse_in_slow=True, reuse_steps=5)
    steps, per_step = config["slow"]["steps_per_cycle"], config["slow"]["problems_per_step"]
    seen: list[tuple[list[str], int]] = []

    def round_(pool, *args, **kwargs):
        seen.append(([p.id for p in kwargs["slow_problems"]], kwargs["slow_samples"]))
        return pool, {"best_val_mean": 0.0, "generations": 0, "metric_calls": 0, "proposed": 0, "accepted": 0,
                      "seed_eval_seconds": 0.0, "search_eval_seconds": 0.0, "slow_sample_seconds": 0.0}

    monkeypatch.setattr(fastslow.fast, "run_round", round_)
    monkeypatch.setattr(fastslow.model.generation, "make_generator", lambda *a, **k: object())
    spec = RunSpec(experiment="e", method="fst", name="r", schedule=("math",), seed=3)
    cycle_job(spec, config, 0, tmp_path / "init", None, train, tmp_path / "c0")
    problems = load_problems(train)
    stream = [problems[i].id for i in take_problems(len(problems), 3, 0, per_step * steps)]
    assert steps < 5 and seen == [(stream, config["slow"]["num_generations"] // config["fast"]["pool_size"])]
    # a later cycle: where the previous one left the stream, or its start on a continual run's new task
    import json

    from fastslow.fast import Pool
    from fastslow.slow.loop import STATE_FILE

    prev = tmp_path / "prev"
    (prev / "trainer_state").mkdir(parents=True)
    (prev / "trainer_state" / STATE_FILE).write_text(json.dumps({"cursor": 5, "global_step": steps}))
    Pool.seed([config["seed_context"]], config["fast"]["pool_size"]).to_json(prev / "pool.json")
    for schedule, cursor in ((("math", "math"), 5), (("math", "math_hard"), 0)):
        seen.clear()
        run = RunSpec(experiment="e", method="fst", name="r", schedule=schedule, seed=3)
        cycle_job(run, config, 1, tmp_path / "init", prev, train, tmp_path / f"c1-{schedule[1]}")
        assert seen[0][0] == [problems[i].id for i in take_problems(len(problems), 3, cursor, per_step * steps)]
