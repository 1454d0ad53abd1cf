"""The slow loop under `accelerate launch`: N ranks share each RL step, one writes the cycle.

No GPU here: two ranks on CPU (torch.distributed with gloo, accelerate's MULTI_CPU = DDP) run
`python -m fastslow.slow.train` on the tiny random model with the command `fastslow.cycle` builds
for a job with several processes (`fastslow.launch.build_command`, ddp.yaml, mixed precision
off). Checked: both ranks' rollouts of every step are in the table in row order, the weights
moved, both ranks hold exactly the saved weights (DDP invariant, FASTSLOW_DEBUG_RANK_DIGESTS),
and a second cycle resumes from the first (optimiser, scheduler, per-rank RNG, data cursor).
FSDP2 sharding and its gathered save/optimiser state need GPUs and are not exercised.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from slow_toys import RecordingTracker

from fastslow import launch
from fastslow.slow import SlowConfig
from fastslow.slow.trainer import per_rank_batches, rank_slice

ROOT = Path(__file__).resolve().parents[1]
CONTEXTS = [("c0", "Be brief."), ("c1", "Think step by step.")]
SLOW = dict(lr=1e-3, warmup_steps=1, beta=0.001, num_generations=4, problems_per_step=2,
            steps_per_cycle=2, max_new_tokens=8, micro_batch_size=2, seed=7)



# ---------------------------------------------------------------- splitting a step over ranks


def test_rows_split_over_ranks_or_a_one_line_error() -> None:
    cfg = SlowConfig(num_generations=4, problems_per_step=2, micro_batch_size=2)  # P*G = 8
    assert per_rank_batches(cfg, 1) == (2, 4)
    assert per_rank_batches(cfg, 2) == (2, 2)
    assert per_rank_batches(cfg, 4) == (2, 1)
    assert per_rank_batches(SlowConfig(num_generations=4, problems_per_step=2), 2) == (4, 1)
    with pytest.raises(ValueError, match=r"P\*G = 2\*4 = 8 rollouts per step cannot be split over 3 processes"):
        per_rank_batches(cfg, 3)
    with pytest.raises(ValueError, match=r"= 8 rollouts per step must be divisible by processes x "
                                         r"micro_batch_size = 2 x 8 = 16"):
        per_rank_batches(SlowConfig(num_generations=4, problems_per_step=2, micro_batch_size=8), 2)
    assert [rank_slice(8, r, 2) for r in range(2)] == [slice(0, 4), slice(4, 8)]



def test_reused_rollouts_are_dealt_once_over_all_ranks() -> None:
    """A (problem, context) pair whose rows straddle two ranks (P*G/N not a multiple of G/K):
    each rank gets other given rollouts of it, none is trained twice, none is dropped."""
    from fastslow.slow.loop import reuse_plan
    from fastslow.slow.trainer import expand_rows
    from fastslow.tasks.base import Problem

    problems = [Problem(f"p{i}", "length", f"Say {i}.", str(i)) for i in range(3)]
    contexts = [("c0", "Be brief.")]
    rows = expand_rows(problems, contexts, 4)  # P*G = 12 rows, 6 a rank: p1's 4 rows straddle
    hashes = {"c0": "h0"}
    given = {("h0", p.id): [{"prompt_ids": [0], "completion_ids": [100 * i + j]} for j in range(4)]
             for i, p in enumerate(problems)}
    used = []
    for rank in range(2):
        share = rank_slice(len(rows), rank, 2)
        plan = reuse_plan(rows, {key: list(v) for key, v in given.items()}, hashes, share)  # each rank's own copy
        assert sorted(plan) == list(range(6))  # indices within the rank's share, all filled
        used += [(rows[share][i]["problem_id"], plan[i][1][0]) for i in plan]
    assert sorted(used) == sorted((p.id, 100 * i + j) for i, p in enumerate(problems) for j in range(4))
    # one process: the whole step, the same dealing
    left = {key: list(v) for key, v in given.items()}
    assert reuse_plan(rows, left, hashes) == {i: ([0], [100 * (i // 4) + i % 4], None) for i in range(12)}
    assert not any(left.values())  # every rollout dealt: a later step gets none of them again

def test_cycle_refuses_a_world_size_that_does_not_split_the_step(tmp_path, monkeypatch) -> None:
    from fastslow.slow import run_cycle
    from fastslow.slow.distill import run_distill_cycle
    from fastslow.tasks.base import Problem

    problems = [Problem("p0", "length", "Say 0.", "0")]
    monkeypatch.setenv("WORLD_SIZE", "3")
    # Before the model is loaded: the model dir does not even exist.
    with pytest.raises(ValueError, match="cannot be split over 3 processes"):
        run_cycle(tmp_path / "none", None, CONTEXTS, None, problems, SlowConfig(**SLOW),
                  tmp_path / "out", "r", 0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="fst_distill runs in one process only, got WORLD_SIZE=2"):
        run_distill_cycle(tmp_path / "none", None, CONTEXTS[:1], None, problems, SlowConfig(**SLOW),
                          tmp_path / "out", "r", 0)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the caller's side



def test_processes_from_gpus_or_environment(monkeypatch) -> None:
    from fastslow.cycle import ENV_TRAIN_PROCESSES, slow_processes

    monkeypatch.delenv(ENV_TRAIN_PROCESSES, raising=False)
    assert slow_processes(0) == 0 and slow_processes(8) == 8
    monkeypatch.setenv(ENV_TRAIN_PROCESSES, "2")
    assert slow_processes(0) == 2
    monkeypatch.setenv(ENV_TRAIN_PROCESSES, "two")
    with pytest.raises(ValueError, match="FASTSLOW_TRAIN_PROCESSES must be an integer >= 1, got 'two'"):
        slow_processes(0)


def test_launched_slow_part_writes_a_spec_and_logs_the_result(tmp_path, monkeypatch) -> None:
    """fastslow.cycle's launched path, with the launcher replaced by a fake rank 0."""
    from fastslow import cycle as cycle_mod
    from fastslow.experiments import RunSpec

    for key in (launch.ENV_STRATEGY, launch.ENV_CONFIG_DIR):
        monkeypatch.delenv(key, raising=False)
    seen: dict[str, Any] = {}

    def fake_run(command: list[str], **kwargs: Any) -> None:
        seen["command"] = command
        seen["spec"] = json.loads(Path(command[command.index("--spec") + 1]).read_text())
        Path(seen["spec"]["result"]).write_text(json.dumps({"global_step": 2, "metrics": [
            {"run": "e/rl/r", "cycle": 0, "step": s, "step_in_cycle": s, "num_contexts": 1,
             "reward_mean": 0.5, "kl_to_base": float("nan")} for s in (0, 1)]}))

    monkeypatch.setattr(launch, "run", fake_run)
    spec = RunSpec(experiment="e", method="rl", name="r", schedule=("math",), seed=3)
    tracker = RecordingTracker()
    out_dir = tmp_path / "cycle0"
    metrics = cycle_mod.launch_slow(spec, {"data": {"source": "offline"}}, "math", 0, tmp_path / "init",
                                    None, [("seed", "Be brief.")], tmp_path / "train.parquet",
                                    SlowConfig(**SLOW), out_dir, {}, 2, tracker)
    cmd = seen["command"]
    assert cmd[cmd.index("--num_processes") + 1] == "2"
    assert cmd[cmd.index("--config_file") + 1].endswith("fsdp2.yaml")
    # No GPU here: the ranks train on CPU, without the configs' bf16 autocast.
    assert cmd[-6:-2] == ["--mixed_precision", "no", "-m", "fastslow.slow.train"]
    job = seen["spec"]
    assert job["method"] == "rl" and job["prev_dir"] is None and job["run_id"] == "e/rl/r"
    assert job["task"] == {"name": "math", "config": {"data": {"source": "offline"}}}
    assert job["contexts"] == [["seed", "Be brief."]] and job["slow"]["seed"] == 7
    assert job["out_dir"] == str(out_dir)
    assert [m["step"] for m in metrics] == [0, 1]
    assert [step for _, step in tracker.calls] == [0, 1]
    assert set(tracker.calls[0][0]) == {"slow/reward_mean", "slow/kl_to_base"}
    assert not list(tmp_path.glob("cycle0.*"))  # spec and result removed after a success


def test_launched_fst_distill_is_refused(monkeypatch, tmp_path) -> None:
    from fastslow.cycle import ENV_TRAIN_PROCESSES, run_cycle
    from fastslow.experiments import RunSpec

    monkeypatch.setenv(ENV_TRAIN_PROCESSES, "2")
    spec = RunSpec(experiment="e", method="fst_distill", name="r", schedule=("math",), seed=0)
    # Refused first thing, before the (long) fast round: nothing else of the config is read.
    with pytest.raises(ValueError, match="fst_distill trains in one process only, got 2 processes"):
        run_cycle(spec, {}, 0, tmp_path / "init", None, tmp_path / "train.parquet", tmp_path / "c0")


def test_a_deepspeed_strategy_is_refused_before_the_round(monkeypatch, tmp_path) -> None:
    """FASTSLOW_ACCELERATE_STRATEGY=zero3 (a config the profile ships): every rank refused it in
    the slow loop, after the cycle's fast round had run. The cycle refuses it first thing."""
    from fastslow.config import load_config
    from fastslow.cycle import ENV_TRAIN_PROCESSES, run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.launch import ENV_STRATEGY

    monkeypatch.setenv(ENV_TRAIN_PROCESSES, "2")
    monkeypatch.setenv(ENV_STRATEGY, "zero3")
    config = load_config("config/config.yaml", "config/smoke.yaml")
    spec = RunSpec(experiment="e", method="fst", name="r", schedule=("math",), seed=0)
    with pytest.raises(ValueError) as err:
        run_cycle(spec, config, 0, tmp_path / "init", None, tmp_path / "train.parquet", tmp_path / "c0")
    assert str(err.value).startswith("accelerate config ") and str(err.value).endswith(
        "zero3.yaml is DeepSpeed (distributed_type: DEEPSPEED), which the slow loop does not support: "
        "set FASTSLOW_ACCELERATE_STRATEGY=fsdp2 or ddp")
    monkeypatch.setenv(ENV_STRATEGY, "ddp")  # on to the (missing) files
    with pytest.raises(Exception) as err:
        run_cycle(spec, config, 0, tmp_path / "init", None, tmp_path / "train.parquet", tmp_path / "c0")
    assert "DeepSpeed" not in str(err.value)


def test_rollouts_that_do_not_split_over_the_ranks_are_refused_before_the_round(monkeypatch, tmp_path) -> None:
    """FASTSLOW_TRAIN_GPUS=3 on the paper config (P*G = 256 rollouts a step): the training ranks
    refused it only after the cycle's fast round, on each of SLURM's three attempts. The cycle now
    refuses it first thing, in the trainer's own one line."""
    from fastslow.config import load_config
    from fastslow.cycle import ENV_TRAIN_PROCESSES, run_cycle
    from fastslow.experiments import RunSpec

    monkeypatch.setenv(ENV_TRAIN_PROCESSES, "3")
    config = load_config("config/config.yaml", "config/smoke.yaml")  # P*G = 1 x 4
    spec = RunSpec(experiment="e", method="fst", name="r", schedule=("math",), seed=0)
    with pytest.raises(ValueError, match=r"^slow loop: P\*G = 1\*4 = 4 rollouts per step cannot be split over 3 "):
        run_cycle(spec, config, 0, tmp_path / "init", None, tmp_path / "train.parquet", tmp_path / "c0")
    monkeypatch.setenv(ENV_TRAIN_PROCESSES, "2")  # 4 over 2 ranks splits: on to the (missing) files
    with pytest.raises(Exception) as err:
        run_cycle(spec, config, 0, tmp_path / "init", None, tmp_path / "train.parquet", tmp_path / "c0")
    assert "cannot be split" not in str(err.value)


# ---------------------------------------------------------------- two real ranks


def _launch(job: Path, cwd: Path) -> subprocess.CompletedProcess:
    # The command fastslow.cycle.launch_slow builds on a GPU-less machine, with ddp.yaml.
    cmd = launch.build_command("fastslow.slow.train", ["--spec", str(job)], gpus=2, strategy="ddp",
                               accelerate_args=["--mixed_precision", "no"])
    # The ranks import the toy task by name (slow_toys:LengthTask) from this directory.
    path = f"{Path(__file__).parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "PYTHONPATH": path,
           "OMP_NUM_THREADS": "1", "FASTSLOW_DEBUG_RANK_DIGESTS": "1", "HF_HUB_OFFLINE": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT", "FASTSLOW_TRAIN_PROCESSES"):
        env.pop(key, None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def _state(model_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def _sampled_first_step(state_in: Path, problems: list) -> dict:
    """(context hash, problem id) -> G/K = 2 rollouts of the next cycle's first step, sampled
    with the weights it starts from (as a fast round does for fast.reuse_in_slow)."""
    from fastslow.model.convert import load_model, load_tokenizer
    from fastslow.model.generation import HFGenerator, SamplingParams
    from fastslow.records import context_hash
    from fastslow.slow.loop import cycle_step_problems
    from fastslow.tasks.base import build_messages

    step = cycle_step_problems(state_in, problems, SlowConfig(**SLOW))
    gen = HFGenerator(load_model(state_in / "model", dtype="float32"), load_tokenizer(state_in / "model"))
    pairs = [(text, p) for p in step for _, text in CONTEXTS for _ in range(2)]
    outs = gen.generate([build_messages(t, p) for t, p in pairs], SamplingParams(8, 1.0, 1.0, 5))
    given: dict = {}
    for (text, p), g in zip(pairs, outs, strict=True):
        given.setdefault((context_hash(text), p.id), []).append(
            {"prompt_ids": g.prompt_ids, "completion_ids": g.completion_ids, "logprobs": g.token_logprobs,
             "text": g.text})
    return given


@pytest.mark.slow
def test_two_ranks_train_a_cycle_and_resume(tiny_model_dir: Path, tmp_path: Path) -> None:
    import polars as pl
    import torch

    from fastslow.model.convert import load_model
    from fastslow.slow.loop import RANK_DIGESTS_FILE, take_problems, weights_digest
    from fastslow.slow.train import read_result, write_spec
    from fastslow.slow.trainer import expand_rows
    from fastslow.tasks.base import Problem
    from fastslow.tasks.data import write_problems

    problems = [Problem(f"p{i}", "length", f"Say the number {i}.", str(i)) for i in range(3)]
    train = write_problems(problems, tmp_path / "train.parquet")
    cycles = [tmp_path / "run" / "cycle0", tmp_path / "run" / "cycle1"]
    given: dict = {}
    for c, out in enumerate(cycles):
        if c == 1:  # fast.reuse_in_slow: the first step of cycle 1 trains on rollouts given here
            given = _sampled_first_step(cycles[0], problems)
        write_spec(tmp_path / f"job{c}.json", method="fst", init_model=tiny_model_dir,
                   prev_dir=cycles[0] if c else None, contexts=CONTEXTS,
                   task={"class": "slow_toys:LengthTask"}, train_file=train, slow=SLOW, out_dir=out,
                   run_id="toy/run", cycle=c, extra={"round_rollouts": given} if given else None)
        proc = _launch(tmp_path / f"job{c}.json", tmp_path)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        result = read_result(out.with_name(out.name + ".result.json"))
        assert result["num_processes"] == 2 and result["global_step"] == 2 * (c + 1)
        assert [m["step"] for m in result["metrics"]] == [2 * c, 2 * c + 1]
        # Both ranks took their half of the given rows: 8 reused in all, and only at step 0.
        assert [m["reused_rollouts"] for m in result["metrics"]] == ([8, 0] if c else [0, 0])

        # Every step's P*G = 8 rows, rank 0's half then rank 1's, in expand_rows order.
        rollouts = pl.read_parquet(out / "rollouts.parquet")
        assert rollouts.height == 2 * 8
        for t in range(2):
            picked = [problems[i] for i in take_problems(3, SLOW["seed"], 2 * (2 * c + t), 2)]
            rows = expand_rows(picked, CONTEXTS, SLOW["num_generations"])
            step = rollouts.filter(pl.col("step") == 2 * c + t)
            assert step["problem_id"].to_list() == [r["problem_id"] for r in rows]
            assert step["context_id"].to_list() == [r["context_id"] for r in rows]
        assert rollouts["completion"].str.len_chars().min() > 0
        if c == 1:
            texts = [r["text"] for (h, pid), rs in given.items() for r in rs]
            assert sorted(rollouts.filter(pl.col("step") == 2)["completion"].to_list()) == sorted(texts)

        # Both ranks ended with the weights the main process saved (DDP keeps replicas equal).
        digests = json.loads((out / RANK_DIGESTS_FILE).read_text())["digests"]
        saved = weights_digest(load_model(out / "model", dtype="auto"))
        assert digests == [saved, saved]

        state_dir = out / "trainer_state"
        assert {p.name for p in state_dir.iterdir()} >= {"optimizer.pt", "scheduler.pt", "state.json",
                                                        "rng_state.pt", "rng_state.rank1.pt"}
        state = json.loads((state_dir / "state.json").read_text())
        assert state["num_processes"] == 2 and state["cursor"] == 4 * (c + 1)
        # The optimiser state is the whole model's, and the second cycle continued it.
        optimizer = torch.load(state_dir / "optimizer.pt")
        assert {float(s["step"]) for s in optimizer["state"].values()} == {2.0 * (c + 1)}
        assert not (out.parent / f".{out.name}.work").exists()

    init, first, second = (_state(tiny_model_dir), _state(cycles[0] / "model"), _state(cycles[1] / "model"))
    assert any(not torch.equal(init[k], first[k]) for k in init)
    assert any(not torch.equal(first[k], second[k]) for k in first)


def test_fsdp2_optimizer_state_round_trips_through_the_one_process_layout(tmp_path) -> None:
    """The FSDP2 branch (torch.distributed.checkpoint, name-keyed) in one gloo process on a plain
    model: it must write exactly `optimizer.state_dict()` and load it back. Sharding itself
    needs GPUs; this checks the renumbering and the DCP calls."""
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from fastslow.slow.loop import _distributed_optimizer_state, _load_distributed_optimizer_state

    def trained(steps: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
        decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
        rest = [p for n, p in model.named_parameters() if not n.endswith("weight")]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": rest, "weight_decay": 0.0}], lr=1e-2)
        for _ in range(steps):
            model(torch.randn(5, 3)).square().sum().backward()
            opt.step()
            opt.zero_grad()
        return model, opt

    def fake(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Any:
        accelerator = SimpleNamespace(is_fsdp2=True, is_main_process=True)
        return SimpleNamespace(accelerator=accelerator, model_wrapped=model,
                               optimizer=SimpleNamespace(optimizer=opt))

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model, opt = trained(2)
        saved = _distributed_optimizer_state(fake(model, opt))
        expected = opt.state_dict()
        assert saved["param_groups"] == expected["param_groups"]
        assert saved["state"].keys() == expected["state"].keys()
        for i, state in expected["state"].items():
            assert all(torch.equal(torch.as_tensor(state[k]), torch.as_tensor(saved["state"][i][k]))
                       for k in state)
        torch.save(saved, tmp_path / "optimizer.pt")
        fresh_model, fresh_opt = trained(0)
        fresh_model.load_state_dict(model.state_dict())
        _load_distributed_optimizer_state(fake(fresh_model, fresh_opt), tmp_path / "optimizer.pt")
        loaded = fresh_opt.state_dict()
        assert loaded["param_groups"] == expected["param_groups"]
        for i, state in expected["state"].items():
            assert all(torch.equal(torch.as_tensor(state[k]), torch.as_tensor(loaded["state"][i][k]))
                       for k in state)
    finally:
        dist.destroy_process_group()
