"""The slow loop under `accelerate launch`: N ranks share each RL step, one writes the cycle.

No GPU here: two ranks on CPU (torch.distributed with gloo, accelerate's MULTI_CPU = DDP) run
`python -m fastslow.slow.train` on the tiny random model with the command `fastslow.cycle` builds
for a job with several processes (`fastslow.launch.build_command`, ddp.yaml, mixed precision
off). Checked: both ranks' rollouts of every step are in the table in row order, the weights
moved, both ranks hold exactly the saved weights (DDP invariant, FASTSLOW_DEBUG_RANK_DIGESTS),
and a second cycle resumes from the first (optimiser, scheduler, per-rank RNG, data cursor).
FST-distill's launched cycles are checked alike (rollouts, replicas, resumed optimiser and cursor;
the scheduler and every rank's RNG file saved), and one distillation step over two ranks against
one process on the same rollouts. FSDP2 sharding and its gathered save/optimiser state need GPUs
(on a CPU accelerate runs an FSDP config as DDP): the launched RL and distill cycles also run
under fsdp2.yaml with bf16 where two CUDA GPUs are visible (`-k fsdp2`), and are skipped here.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
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
    with pytest.raises(ValueError, match="cannot be split over 3 processes"):
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
    # a later cycle's ranks start from the previous cycle's weights and state, with its extras
    cycle_mod.launch_slow(spec, {"data": {"source": "offline"}}, "math_hard", 1, tmp_path / "init", out_dir,
                          [("seed", "Be brief.")], tmp_path / "train.parquet", SlowConfig(**SLOW),
                          tmp_path / "cycle1", {"new_data": True}, 2, None)
    job = seen["spec"]
    assert (job["prev_dir"], job["cycle"], job["init_model"], job["train_file"], job["extra"]) == (
        str(out_dir), 1, str(tmp_path / "init"), str(tmp_path / "train.parquet"), {"new_data": True})
    assert job["task"]["name"] == "math_hard" and job["out_dir"] == str(tmp_path / "cycle1")


@pytest.mark.parametrize("how", ["failed", "stopped", "stopped-then-failed"])
def test_ranks_that_fail_or_are_stopped_leave_their_finished_steps_logged(how: str, tmp_path, monkeypatch) -> None:
    """A multi-GPU cycle's ranks never track; the job logged their metrics from the result they
    write at the end. Ranks that crashed at step T-1 (an OOM, NCCL) or were stopped (scancel,
    SLURM's time limit) left the job's MLflow run with no slow/* metric at all. Now rank 0 appends
    each finished step to <out_dir>.steps.jsonl (`StepLog`, as the loop's tracker), and the job
    logs those steps before it fails, or before the stop's handler ends its run KILLED. (Here a
    fake rank 0 writes two of three steps, then fails or is stopped.)"""
    import subprocess

    from fastslow import cycle as cycle_mod
    from fastslow.experiments import RunSpec
    from fastslow.slow.train import StepLog, default_steps_path

    for key in (launch.ENV_STRATEGY, launch.ENV_CONFIG_DIR):
        monkeypatch.delenv(key, raising=False)
    out_dir = tmp_path / "cycle0"
    stale = default_steps_path(out_dir)
    StepLog(stale).log_metrics({"slow/reward_mean": 9.0}, step=99)  # an earlier attempt's: not logged
    order: list[str] = []

    def fake_run(command: list[str], before_stop: Any = None, **kwargs: Any) -> None:
        steps = StepLog(default_steps_path(out_dir))
        for s in (0, 1):
            steps.log_metrics({"slow/reward_mean": 0.25 * s, "slow/kl_to_base": float("nan")}, step=s)
        with default_steps_path(out_dir).open("a") as f:
            f.write('{"step": 2, "metr')  # step 2 killed while writing its line
        if how.startswith("stopped"):  # launch.run: the ranks stopped, then the callback, then the handler
            before_stop()
            order.append("handler")
            if how == "stopped":
                raise KeyboardInterrupt
        # (a replaced handler that returns: launch.run goes on to report the ranks' exit status)
        raise subprocess.CalledProcessError(1, command)

    monkeypatch.setattr(launch, "run", fake_run)
    spec = RunSpec(experiment="e", method="rl", name="r", schedule=("math",), seed=3)

    class Tracker(RecordingTracker):
        def log_metrics(self, metrics: dict, step: int | None = None) -> None:
            order.append("logged")
            super().log_metrics(metrics, step)

    tracker = Tracker()
    with pytest.raises(KeyboardInterrupt if how == "stopped" else RuntimeError):
        cycle_mod.launch_slow(spec, {"data": {"source": "offline"}}, "math", 0, tmp_path / "init", None,
                              [("seed", "Be brief.")], tmp_path / "train.parquet",
                              SlowConfig(**{**SLOW, "steps_per_cycle": 3}), out_dir, {}, 2, tracker)
    assert [step for _, step in tracker.calls] == [0, 1]  # once each, the stale file's step 99 not
    assert tracker.calls[1][0]["slow/reward_mean"] == 0.25 and math.isnan(tracker.calls[1][0]["slow/kl_to_base"])
    assert order == ["logged", "logged"] + (["handler"] if how.startswith("stopped") else [])


def test_a_launcher_that_is_not_there_says_so_and_no_step_stopped(tmp_path, monkeypatch, caplog) -> None:
    """Without accelerate on PATH no rank starts: the job ends on `run`'s one line naming the
    command, not after a warning that "the ranks stopped after 0 of 2 steps"."""
    import errno
    import logging

    from fastslow import cycle as cycle_mod
    from fastslow.experiments import RunSpec

    for key in (launch.ENV_STRATEGY, launch.ENV_CONFIG_DIR):
        monkeypatch.delenv(key, raising=False)

    def fake_run(command: list[str], **kwargs: Any) -> None:
        raise FileNotFoundError(errno.ENOENT, "no such command", command[0])

    monkeypatch.setattr(launch, "run", fake_run)
    spec = RunSpec(experiment="e", method="rl", name="r", schedule=("math",), seed=3)
    tracker = RecordingTracker()
    with caplog.at_level(logging.WARNING, logger="fastslow.cycle"), pytest.raises(FileNotFoundError):
        cycle_mod.launch_slow(spec, {"data": {"source": "offline"}}, "math", 0, tmp_path / "init", None,
                              [("seed", "Be brief.")], tmp_path / "train.parquet", SlowConfig(**SLOW),
                              tmp_path / "cycle0", {}, 2, tracker)
    assert "ranks stopped" not in caplog.text and tracker.calls == []


def test_ranks_that_fail_are_named_with_the_first_ones_error_in_one_line(tmp_path, monkeypatch) -> None:
    """Every rank's traceback and the launcher's report are in the job's log; the job ends on
    one line naming the rank that failed first and its error (`record_error` by
    `python -m fastslow.slow.train`), not on the launcher's CalledProcessError. A stale record of
    an earlier attempt is not read; with none recorded (a rank killed outright), the line says so."""
    import os
    import subprocess
    import time

    from fastslow import cycle as cycle_mod
    from fastslow.experiments import RunSpec
    from fastslow.slow import train as train_mod

    for key in (launch.ENV_STRATEGY, launch.ENV_CONFIG_DIR):
        monkeypatch.delenv(key, raising=False)
    out_dir = tmp_path / "cycle0"
    result = train_mod.default_result_path(out_dir)
    train_mod.record_error(result, 0, OSError("an earlier attempt's"))
    errors: list[tuple[int, BaseException]] = []

    def fake_run(command: list[str], **kwargs: Any) -> None:
        spec = json.loads(Path(command[command.index("--spec") + 1]).read_text())
        for rank, err in errors:  # in the order the ranks failed
            train_mod.record_error(spec["result"], rank, err)
            os.utime(train_mod.error_path(spec["result"], rank), ns=(time.time_ns(), time.time_ns()))
            time.sleep(0.01)
        raise subprocess.CalledProcessError(1, command)

    monkeypatch.setattr(launch, "run", fake_run)
    spec = RunSpec(experiment="e", method="rl", name="r", schedule=("math",), seed=3)

    def launched() -> str:
        with pytest.raises(RuntimeError) as info:
            cycle_mod.launch_slow(spec, {"data": {"source": "offline"}}, "math", 1, tmp_path / "init", None,
                                  [("seed", "Be brief.")], tmp_path / "train.parquet", SlowConfig(**SLOW),
                                  out_dir, {}, 2, None)
        assert isinstance(info.value.__cause__, subprocess.CalledProcessError)
        return str(info.value)

    errors[:] = [(1, ValueError("shapes (3,)\nand (4,) do not match")), (0, RuntimeError("Connection closed by peer"))]
    assert launched() == ("cycle 1 of e/rl/r: the slow steps failed in their 2 processes: rank 1 was the first to "
                          "record an error: ValueError: shapes (3,) and (4,) do not match; 1 other rank recorded one "
                          "after it; every rank's traceback is in this job's log")
    # one rank killed outright records nothing: the survivor's error (its peer gone) is named, and so is the silence
    errors[:] = [(0, RuntimeError("Connection closed by peer"))]
    assert launched().endswith("rank 0 was the first to record an error: RuntimeError: Connection closed by peer; "
                               "1 recorded none (killed outright, out of memory?, or failed before it started); "
                               "every rank's traceback is in this job's log")
    errors[:] = []
    assert "exit status 1) and no rank recorded an error: one was killed outright (out of memory?)" in launched()


def test_the_line_for_failed_ranks_counts_them_and_names_a_killing_signal() -> None:
    """`ranks_failed`: how many other ranks recorded an error (plural past one) and how many
    recorded none; with none recorded, a rank killed by a signal (a negative return code) is
    named by the signal's number, an exit by its status."""
    from fastslow.cycle import ranks_failed

    head = "cycle 2 of e/fst/r: the slow steps failed in their 4 processes"
    assert ranks_failed(2, "e/fst/r", 4, 1, [(3, "OSError: disk full"), (0, "E: peer"), (1, "E: peer")]) == (
        f"{head}: rank 3 was the first to record an error: OSError: disk full; 2 other ranks recorded one after it; "
        "1 recorded none (killed outright, out of memory?, or failed before it started); every rank's traceback "
        "is in this job's log")
    assert ranks_failed(2, "e/fst/r", 4, 1, [(2, "E: x")] * 4).endswith(
        "3 other ranks recorded one after it; every rank's traceback is in this job's log")
    assert ranks_failed(2, "e/fst/r", 4, -9, []) == (
        f"{head} (killed by signal 9) and no rank recorded an error: one was killed outright (out of memory?) or "
        "crashed; the ranks' output is in this job's log")
    assert ranks_failed(2, "e/fst/r", 4, 137, []).startswith(f"{head} (exit status 137) and no rank recorded")


def test_the_ranks_own_log_lines_reach_the_console_and_all_their_output_the_log(tmp_path, monkeypatch, capfd) -> None:
    """A multi-GPU cycle's ranks write to the rule's log file; the lines of our loggers (a step's
    line, a warning) also reach the console, labelled with the job, as a one-process cycle's do.
    A library's warning and a traceback stay in the log. (Fake ranks: a process printing as
    `python -m fastslow.slow.train`'s ranks do.)"""
    import logging
    import sys

    from fastslow import cycle as cycle_mod
    from fastslow.experiments import RunSpec
    from fastslow.jobs import setup_logging

    for key in (launch.ENV_STRATEGY, launch.ENV_CONFIG_DIR):
        monkeypatch.delenv(key, raising=False)
    ranks = (
        "import json, sys\n"
        "spec = json.load(open(sys.argv[sys.argv.index('--spec') + 1]))\n"
        "for line in ('2026-12-04 17:00:01,250 rank0 INFO fastslow.slow.loop: step 1/2 reward 0.500',\n"
        "             '/site-packages/torch/x.py:3: UserWarning: a library warning',\n"
        "             '2026-12-04 17:00:02,500 rank1 WARNING fastslow.slow.trainer: rank 1 is slow',\n"
        "             '2026-12-04 17:00:02,750 rank0 WARNING accelerate.utils.other: a library logger'):\n"
        "    print(line, file=sys.stderr, flush=True)\n"
        "print('Loading weights:  50%|#####     \\rLoading weights: 100%|##########', file=sys.stderr)\n"
        "json.dump({'global_step': 2, 'metrics': []}, open(spec['result'], 'w'))\n")
    (tmp_path / "ranks.py").write_text(ranks)
    monkeypatch.setattr(launch, "build_command", lambda module, args, **kw: [sys.executable, str(tmp_path / "ranks.py"),
                                                                              *args])
    monkeypatch.setattr(sys, "stderr", sys.stderr)  # setup_logging points it at the log file
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    log_file = tmp_path / "cycle1.log"
    setup_logging(log_file, "cycle e/rl/r cycle=1")
    spec = RunSpec(experiment="e", method="rl", name="r", schedule=("math",), seed=3)
    cycle_mod.launch_slow(spec, {"data": {"source": "offline"}}, "math", 1, tmp_path / "init", None,
                          [("seed", "Be brief.")], tmp_path / "train.parquet", SlowConfig(**SLOW),
                          tmp_path / "cycle1", {}, 2, None)
    sys.stderr.flush()
    console = capfd.readouterr().err
    assert " [cycle e/rl/r cycle=1] rank0 step 1/2 reward 0.500" in console
    assert " WARNING [cycle e/rl/r cycle=1] rank1 rank 1 is slow" in console
    assert "a library warning" not in console and "a library logger" not in console  # ours alone
    log = log_file.read_bytes().decode()  # as written: a progress bar's carriage returns kept
    assert all(x in log for x in ("rank0 INFO fastslow.slow.loop: step 1/2", "UserWarning: a library warning",
                                  "rank1 WARNING fastslow.slow.trainer: rank 1 is slow", "a library logger",
                                  "Loading weights:  50%|#####     \rLoading weights: 100%|##########\n"))


def test_a_rank_records_the_error_it_stops_on(tmp_path, monkeypatch) -> None:
    """`python -m fastslow.slow.train` writes its error beside the result, then fails as before."""
    from fastslow.slow import train as train_mod

    spec_path = tmp_path / "job.json"
    train_mod.write_spec(spec_path, method="rl", init_model=tmp_path / "init", prev_dir=None, contexts=[("seed", "x")],
                         task={"name": "math"}, train_file=tmp_path / "t.parquet", slow=SLOW,
                         out_dir=tmp_path / "cycle0", run_id="e/rl/r", cycle=0, extra={}, result=tmp_path / "r.json")

    def boom(spec: Any) -> None:
        raise ValueError("no such column 'answer'")

    monkeypatch.setattr(train_mod, "run_job", boom)
    with pytest.raises(ValueError, match="no such column"):
        train_mod.main(["--spec", str(spec_path)])
    assert train_mod.read_errors(tmp_path / "r.json") == [(0, "ValueError: no such column 'answer'")]


def test_a_rank_leaves_its_process_group_and_waits_at_the_barrier_only_after_a_success(tmp_path, monkeypatch) -> None:
    """`python -m fastslow.slow.train` destroys the process group it ran in, after a barrier when
    its cycle succeeded; after a failure no barrier (the other ranks may never reach it: a hang
    until the collective's timeout), and the error is still the rank's."""
    import torch.distributed as dist

    from fastslow.slow import train as train_mod

    calls: list[str] = []
    monkeypatch.setattr(dist, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append("destroy"))
    spec_path = train_mod.write_spec(tmp_path / "job.json", method="rl", init_model=tmp_path / "init", prev_dir=None,
                                     contexts=[("seed", "x")], task={"name": "math"}, train_file=tmp_path / "t.parquet",
                                     slow=SLOW, out_dir=tmp_path / "cycle0", run_id="e/rl/r", cycle=0)
    monkeypatch.setattr(train_mod, "run_job", lambda spec: calls.append("run"))
    assert train_mod.main(["--spec", str(spec_path)]) == 0
    assert calls == ["run", "barrier", "destroy"]

    def boom(spec: Any) -> None:
        calls.append("run")
        raise RuntimeError("CUDA out of memory")

    calls.clear()
    monkeypatch.setattr(train_mod, "run_job", boom)
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        train_mod.main(["--spec", str(spec_path)])
    assert calls == ["run", "destroy"]


def test_the_ranks_main_process_records_each_step_as_it_ends(tmp_path, monkeypatch) -> None:
    """`python -m fastslow.slow.train`'s rank 0 hands the loop a `StepLog` beside the cycle
    directory; other ranks none (the loop logs on the main process only)."""
    import types

    import fastslow.slow.loop
    from fastslow.slow import train as train_mod
    from fastslow.slow.train import default_steps_path, read_steps

    handed: list[Any] = []

    def loop(*args: Any, tracker: Any = None, **kwargs: Any) -> Any:
        handed.append(tracker)
        if tracker is not None:
            tracker.log_metrics({"slow/reward_mean": 0.5}, step=4)
        return types.SimpleNamespace(out_dir=args[6], global_step=5, metrics=[])

    monkeypatch.setattr(fastslow.slow.loop, "run_cycle", loop)
    monkeypatch.setattr(train_mod, "build_task", lambda task: None)
    monkeypatch.setattr("fastslow.tasks.data.load_problems", lambda path: [])
    spec = {"method": "rl", "init_model": str(tmp_path / "init"), "prev_dir": None, "contexts": [["seed", "x"]],
            "task": {"name": "math"}, "train_file": str(tmp_path / "t.parquet"), "slow": SLOW,
            "out_dir": str(tmp_path / "cycle0"), "run_id": "e/rl/r", "cycle": 0, "result": str(tmp_path / "r.json")}
    train_mod.run_job(spec)
    assert read_steps(default_steps_path(tmp_path / "cycle0")) == [{"step": 4, "metrics": {"slow/reward_mean": 0.5}}]
    monkeypatch.setattr(train_mod, "process_rank", lambda: 1)
    train_mod.run_job(spec)
    assert handed[1] is None


def test_a_job_spec_keeps_its_arguments_and_puts_its_files_beside_the_cycle(tmp_path) -> None:
    """`write_spec` / `read_spec`: the result defaults to <out_dir>.result.json, beside the cycle
    directory as the step log and the ranks' error records; the round's rollouts, keyed by
    (context hash, problem id), come back with those keys through the JSON; an unknown method is
    refused in one line naming it, and no spec is written."""
    from fastslow.slow import train as train_mod

    out_dir = tmp_path / "cycle3"
    assert train_mod.default_result_path(out_dir) == tmp_path / "cycle3.result.json"
    assert train_mod.default_steps_path(out_dir) == tmp_path / "cycle3.steps.jsonl"
    assert train_mod.error_path(tmp_path / "cycle3.result.json", 2) == tmp_path / "cycle3.result.json.rank2.error"
    rollouts = {("h1", "p0"): [{"text": "a", "reward": 1.0}], ("h2", "p1"): [{"text": "b"}, {"text": "c"}]}
    kw: dict[str, Any] = dict(init_model=tmp_path / "init", contexts=[("best", "Be brief.")], task={"name": "math"},
                              train_file=tmp_path / "t.parquet", slow=SLOW, out_dir=out_dir, run_id="e/fst/r", cycle=3)
    path = train_mod.write_spec(tmp_path / "job.json", method="fst", prev_dir=tmp_path / "cycle2",
                                extra={"round_rollouts": rollouts, "student_context": "x"}, **kw)
    spec = train_mod.read_spec(path)
    assert spec["result"] == str(tmp_path / "cycle3.result.json") and spec["out_dir"] == str(out_dir)
    assert spec["prev_dir"] == str(tmp_path / "cycle2") and spec["contexts"] == [["best", "Be brief."]]
    assert (spec["method"], spec["cycle"], spec["slow"]) == ("fst", 3, SLOW)
    assert train_mod.decode_extra(spec["extra"]) == {"round_rollouts": rollouts, "student_context": "x"}
    spec = train_mod.read_spec(train_mod.write_spec(tmp_path / "job0.json", method="rl", prev_dir=None, **kw))
    assert spec["prev_dir"] is None and spec["extra"] == {}
    with pytest.raises(ValueError, match=r"^unknown method 'grpo': expected one of rl, fst, fst_distill$"):
        train_mod.write_spec(tmp_path / "bad.json", method="grpo", prev_dir=None, **kw)
    assert not (tmp_path / "bad.json").exists()


def test_a_missing_step_log_reads_as_no_steps_and_a_long_error_is_recorded_cut(tmp_path) -> None:
    """Ranks that failed before their first step leave no step log: no steps, not an error. A
    rank's error record is its first 1000 characters (a tensor's repr can run to megabytes)."""
    from fastslow.slow import train as train_mod

    assert train_mod.read_steps(tmp_path / "cycle0.steps.jsonl") == []
    result = tmp_path / "cycle0.result.json"
    train_mod.record_error(result, 3, RuntimeError("x" * 5000))
    [(rank, line)] = train_mod.read_errors(result)
    assert rank == 3 and len(line) == 1000 and line.startswith("RuntimeError: xxx")
    # a result name with glob characters finds its own records only
    train_mod.record_error(tmp_path / "c[1].result.json", 0, ValueError("bad"))
    train_mod.record_error(tmp_path / "c1.result.json", 0, ValueError("other"))
    assert train_mod.read_errors(tmp_path / "c[1].result.json") == [(0, "ValueError: bad")]
    # best effort: where it cannot be written (its directory is a file) the rank fails on its own error
    (tmp_path / "a-file").write_text("")
    train_mod.record_error(tmp_path / "a-file" / "r.json", 0, ValueError("bad"))


def test_an_error_naming_a_path_with_undecodable_bytes_is_recorded(tmp_path) -> None:
    """A message naming a path whose bytes are not UTF-8 (a surrogate in the str, as os.fsdecode
    gives it) made `record_error` itself fail with a UnicodeEncodeError: the rank's traceback ended
    on that, and the job's line said the rank recorded nothing (killed outright?). It is recorded,
    the byte escaped."""
    from fastslow.slow import train as train_mod

    result = tmp_path / "cycle0.result.json"
    train_mod.record_error(result, 1, ValueError("/data/\udcfftrain.parquet: no such column 'answer'"))
    assert train_mod.read_errors(result) == [(1, "ValueError: /data/\\udcfftrain.parquet: no such column 'answer'")]


def test_a_job_specs_task_is_rebuilt_from_its_name_or_its_class(monkeypatch) -> None:
    """{"class": "module:Name", "options"} imports the class (tests' toy tasks); {"name", "config"}
    goes through `make_task` (offline data when the spec has no config); anything else, or a class
    not written module:Name, is refused in one line naming it."""
    from slow_toys import LengthTask

    import fastslow.config
    from fastslow.slow import train as train_mod

    assert isinstance(train_mod.build_task({"class": "slow_toys:LengthTask", "options": {}}), LengthTask)
    with pytest.raises(ValueError, match=r"^task class must be 'package.module:Name', got 'slow_toys.LengthTask'$"):
        train_mod.build_task({"class": "slow_toys.LengthTask"})
    with pytest.raises(ValueError, match=r"^job spec task needs 'name' \(\+ 'config'\) or 'class', got keys "
                                         r"\['config', 'options'\]$"):
        train_mod.build_task({"options": {}, "config": {}})
    made: list[tuple[Any, str]] = []
    monkeypatch.setattr(fastslow.config, "make_task", lambda config, name: made.append((config, name)) or name)
    assert train_mod.build_task({"name": "math"}) == "math"
    assert train_mod.build_task({"name": "hover", "config": {"data": {"source": "hf"}}}) == "hover"
    assert made == [({"data": {"source": "offline"}}, "math"), ({"data": {"source": "hf"}}, "hover")]


def test_a_job_runs_its_methods_cycle_with_its_extra_arguments_and_rank_0_alone_writes_the_result(
        tmp_path, monkeypatch) -> None:
    """`run_job`: rl and fst run the CISPO loop, fst_distill the distillation cycle, each given the
    spec's extra arguments as the caller passed them (the round's rollouts keyed by tuples again);
    the main process writes the result, the other ranks do not (N ranks would race on one file)."""
    import types

    import fastslow.slow.distill
    import fastslow.slow.loop
    from fastslow.slow import train as train_mod

    calls: list[tuple[str, dict[str, Any]]] = []

    def cycle(name: str) -> Any:
        def run(*args: Any, tracker: Any = None, **kwargs: Any) -> Any:
            calls.append((name, kwargs))
            return types.SimpleNamespace(out_dir=args[6], global_step=7, metrics=[{"step": 6, "reward_mean": 0.5}])
        return run

    monkeypatch.setattr(fastslow.slow.loop, "run_cycle", cycle("loop"))
    monkeypatch.setattr(fastslow.slow.distill, "run_distill_cycle", cycle("distill"))
    monkeypatch.setattr(train_mod, "build_task", lambda task: None)
    monkeypatch.setattr("fastslow.tasks.data.load_problems", lambda path: [])
    rollouts = {("h1", "p0"): [{"text": "a"}]}
    extras = {"rl": {}, "fst": {"round_rollouts": rollouts}, "fst_distill": {"student_context": "Be brief."}}
    for method, extra in extras.items():
        job = train_mod.write_spec(tmp_path / f"{method}.job.json", method=method, init_model=tmp_path / "init",
                                   prev_dir=None, contexts=[("seed", "x")], task={"name": "math"},
                                   train_file=tmp_path / "t.parquet", slow=SLOW, out_dir=tmp_path / method,
                                   run_id=f"e/{method}/r", cycle=0, extra=extra)
        train_mod.run_job(train_mod.read_spec(job))
    assert calls == [("loop", {"run_id": "e/rl/r", "cycle": 0}),
                     ("loop", {"run_id": "e/fst/r", "cycle": 0, "round_rollouts": rollouts}),
                     ("distill", {"run_id": "e/fst_distill/r", "cycle": 0, "student_context": "Be brief."})]
    result = train_mod.default_result_path(tmp_path / "fst_distill")
    assert train_mod.read_result(result) == {"out_dir": str(tmp_path / "fst_distill"), "global_step": 7,
                                             "metrics": [{"step": 6, "reward_mean": 0.5}], "num_processes": 1}
    result.unlink()
    monkeypatch.setattr(train_mod, "process_rank", lambda: 1)
    train_mod.run_job(train_mod.read_spec(tmp_path / "fst_distill.job.json"))
    assert len(calls) == 4 and not result.exists()


def test_a_results_ids_nulls_and_names_are_not_sent_to_the_tracker(tmp_path) -> None:
    """`log_result` sends each step's numbers as "slow/<name>" at its global step: not the columns
    that identify the step, not a NaN metric (kl_to_base at beta=0, null in the result's standard
    JSON), not a name; no tracker, nothing to do."""
    from fastslow.io import write_json
    from fastslow.slow import train as train_mod

    row = {"run": "e/rl/r", "cycle": 1, "step": 4, "step_in_cycle": 0, "num_contexts": 2, "reward_mean": 0.5,
           "kl_to_base": float("nan"), "completion_tokens": 12, "note": "x"}
    result = train_mod.read_result(write_json({"metrics": [row, {**row, "step": 5}]}, tmp_path / "r.json"))
    assert result["metrics"][0]["kl_to_base"] is None
    train_mod.log_result(result, None)
    tracker = RecordingTracker()
    train_mod.log_result(result, tracker)
    assert tracker.calls == [({"slow/reward_mean": 0.5, "slow/completion_tokens": 12}, 4),
                             ({"slow/reward_mean": 0.5, "slow/completion_tokens": 12}, 5)]


def test_a_launched_fst_distill_cycle_is_sized_for_its_strategy_before_the_round(tiny_model_dir: Path, monkeypatch,
                                                                                 tmp_path) -> None:
    """fst_distill on two GPUs is not refused (it was: it trained in one process only); its
    memory check, first thing, counts what each rank holds under the launch's strategy: the whole
    student on every DDP rank, a share of it under FSDP2 (here on a pretend 1 MiB GPU)."""
    import fastslow.slow.distill as distill
    from fastslow.config import load_config
    from fastslow.cycle import ENV_TRAIN_PROCESSES, run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.launch import ENV_STRATEGY

    monkeypatch.setenv(ENV_TRAIN_PROCESSES, "2")
    monkeypatch.setattr(distill, "gpu_memory_bytes", lambda: 2 ** 20)
    seen = []
    floor = distill.memory_floor
    monkeypatch.setattr(distill, "memory_floor", lambda *a, **k: seen.append(a[2:]) or floor(*a, **k))
    config = load_config("config/config.yaml", "config/smoke.yaml")  # P*G = 1 x 4
    spec = RunSpec(experiment="e", method="fst_distill", name="r", schedule=("math",), seed=0)
    for strategy, says in (("ddp", "gradient buckets whole on every rank (DDP)"),
                           ("fsdp2", "sharded over the 2 ranks (FSDP2)")):
        monkeypatch.setenv(ENV_STRATEGY, strategy)
        with pytest.raises(ValueError) as err:
            run_cycle(spec, config, 0, tiny_model_dir, None, tmp_path / "train.parquet", tmp_path / "c0")
        assert str(err.value).startswith("fst_distill cannot fit its 2 GPUs: ") and says in str(err.value), err.value
        assert "\n" not in str(err.value)
        if strategy == "fsdp2":  # the whole teacher on a 1 MiB GPU: more GPUs would not help
            assert str(err.value).endswith("(more GPUs shrink the student's share, not the teacher's copy)")
    assert seen == [(2, False, True), (2, True, True)]  # both configs ask for bf16 mixed precision


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
    with pytest.raises(FileNotFoundError, match="train.parquet"):
        run_cycle(spec, config, 0, tmp_path / "init", None, tmp_path / "train.parquet", tmp_path / "c0")


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
    with pytest.raises(FileNotFoundError, match="train.parquet"):
        run_cycle(spec, config, 0, tmp_path / "init", None, tmp_path / "train.parquet", tmp_path / "c0")


def test_a_cycle_launches_its_slow_steps_only_on_several_processes_and_records_the_ranks_metrics(
        monkeypatch, tmp_path) -> None:
    """One process (FASTSLOW_TRAIN_PROCESSES=1, or a job of at most one GPU) trains in the cycle's
    own process; two launch ranks (`launch_slow`), handed the run's contexts, the cycle's task
    and a continual run's new-data flag, and the cycle records the metrics the ranks returned.
    (The in-process slow steps and the launch are stubbed.)"""
    from slow_toys import stub_slow_steps_and_write_math

    from fastslow import cycle as cycle_mod
    from fastslow.cycle import ENV_TRAIN_PROCESSES, run_cycle
    from fastslow.experiments import RunSpec

    config, train = stub_slow_steps_and_write_math(monkeypatch, tmp_path / "data")
    launched: list[tuple] = []

    def fake_launch(spec, cfg, task_name, cycle, init_model, prev_dir, contexts, train_file, slow_cfg, out_dir,
                    extra, processes, tracker=None):
        launched.append((task_name, cycle, prev_dir, contexts, extra, processes))
        out_dir.mkdir(parents=True)
        return [{"reward_mean": 0.5, "answered_fraction": 1.0}, {"reward_mean": 0.25, "answered_fraction": 0.5}]

    monkeypatch.setattr(cycle_mod, "launch_slow", fake_launch)
    for key in (launch.ENV_STRATEGY, launch.ENV_CONFIG_DIR):
        monkeypatch.delenv(key, raising=False)
    spec = RunSpec(experiment="e", method="rl", name="r", schedule=("math", "math_hard"), seed=0)
    monkeypatch.setenv(ENV_TRAIN_PROCESSES, "1")
    summary = run_cycle(spec, config, 0, tmp_path / "init", None, train, tmp_path / "c0", gpus=4)
    assert launched == [] and summary["slow_reward_mean"] is None  # in this process (the stub: no steps)
    monkeypatch.delenv(ENV_TRAIN_PROCESSES)
    run_cycle(spec, config, 0, tmp_path / "init", None, train, tmp_path / "one", gpus=1)
    assert launched == []
    run_cycle(spec, config, 0, tmp_path / "init", None, train, tmp_path / "two", gpus=2)
    summary = run_cycle(spec, config, 1, tmp_path / "init", tmp_path / "c0", train, tmp_path / "c1", gpus=2)
    seed = [("seed", config["seed_context"])]
    assert launched == [("math", 0, None, seed, {}, 2), ("math_hard", 1, tmp_path / "c0", seed, {"new_data": True}, 2)]
    assert summary["slow_reward_mean"] == pytest.approx(0.375) and summary["slow_answered_fraction"] == 0.75


# ---------------------------------------------------------------- two real ranks


#: The launched cycles' strategies: DDP everywhere (gloo ranks on a CPU), FSDP2 on two GPUs.
STRATEGIES = [
    pytest.param("ddp", id="ddp", marks=pytest.mark.skipif(
        torch.cuda.device_count() == 1, reason="two ranks need two GPUs, or none (gloo on the CPU)")),
    pytest.param("fsdp2", id="fsdp2", marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="FSDP2 needs two CUDA GPUs (on a CPU accelerate runs it as DDP)")),
]


def _launch(job: Path, cwd: Path, strategy: str = "ddp") -> subprocess.CompletedProcess:
    # The command fastslow.cycle.launch_slow builds: mixed precision off on a GPU-less machine,
    # the strategy config's own (bf16) on GPUs.
    cpu = not torch.cuda.is_available()
    cmd = launch.build_command("fastslow.slow.train", ["--spec", str(job)], gpus=2, strategy=strategy,
                               accelerate_args=["--mixed_precision", "no"] if cpu else [])
    # The ranks import the toy task by name (slow_toys:LengthTask) from this directory.
    path = f"{Path(__file__).parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "PYTHONPATH": path,
           "OMP_NUM_THREADS": "1", "FASTSLOW_DEBUG_RANK_DIGESTS": "1", "HF_HUB_OFFLINE": "1"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT", "FASTSLOW_TRAIN_PROCESSES"):
        env.pop(key, None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


@pytest.mark.slow
def test_launched_ranks_that_fail_record_their_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two real ranks whose train file is missing: each records its error beside the result, for
    the job's one line (`fastslow.cycle.ranks_failed`), and the launch fails."""
    from fastslow.slow.train import read_errors, write_spec

    job, result = tmp_path / "cycle0.job.json", tmp_path / "cycle0.result.json"
    write_spec(job, method="rl", init_model=tiny_model_dir, prev_dir=None, contexts=list(CONTEXTS),
               task={"name": "math"}, train_file=tmp_path / "missing.parquet", slow=SLOW, out_dir=tmp_path / "cycle0",
               run_id="e/rl/r", cycle=0, extra={}, result=result)
    out = _launch(job, tmp_path)
    assert out.returncode != 0
    errors = read_errors(result)
    assert sorted(rank for rank, _ in errors) == [0, 1], out.stderr[-3000:]
    assert all(line.startswith("FileNotFoundError: ") and "missing.parquet" in line for _, line in errors), errors


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
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_ranks_train_a_cycle_and_resume(tiny_model_dir: Path, tmp_path: Path, strategy: str) -> None:
    import polars as pl

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
        proc = _launch(tmp_path / f"job{c}.json", tmp_path, strategy)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        result = read_result(out.with_name(out.name + ".result.json"))
        assert result["num_processes"] == 2 and result["global_step"] == 2 * (c + 1)
        assert [m["step"] for m in result["metrics"]] == [2 * c, 2 * c + 1]
        # The whole step's gradient norm, taken after the ranks reduced their gradients.
        assert all(math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0 for m in result["metrics"])
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

        # Both ranks ended with the weights the main process saved (DDP keeps replicas equal;
        # FSDP2's shards gather to them).
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


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_ranks_distill_a_cycle_and_resume(tiny_model_dir: Path, tmp_path: Path, strategy: str) -> None:
    """FST-distill under `accelerate launch` (ddp.yaml on two CPU ranks; fsdp2.yaml on two GPUs):
    each rank samples its half of a step's P*G rollouts from its own stream, both train the same
    fp32 weights, the main process writes the cycle, and a second cycle resumes from it. P = 1:
    the two ranks hold two copies each of one problem."""
    import polars as pl

    from fastslow.model.convert import load_model
    from fastslow.slow.loop import RANK_DIGESTS_FILE, take_problems, weights_digest
    from fastslow.slow.train import read_result, write_spec
    from fastslow.tasks.base import Problem
    from fastslow.tasks.data import write_problems

    problems = [Problem(f"p{i}", "length", f"Say the number {i}.", str(i)) for i in range(3)]
    train = write_problems(problems, tmp_path / "train.parquet")
    cycles = [tmp_path / "run" / "cycle0", tmp_path / "run" / "cycle1"]
    teacher = [("best", "Answer with one short word.")]
    slow = {**SLOW, "problems_per_step": 1}  # P*G = 4: two rollouts of the step's problem per rank
    for c, out in enumerate(cycles):
        write_spec(tmp_path / f"job{c}.json", method="fst_distill", init_model=tiny_model_dir,
                   prev_dir=cycles[0] if c else None, contexts=teacher,
                   task={"class": "slow_toys:LengthTask"}, train_file=train, slow=slow, out_dir=out,
                   run_id="toy/distill", cycle=c, extra={"student_context": "Be brief.",
                                                         "student_context_id": "seed"})
        proc = _launch(tmp_path / f"job{c}.json", tmp_path, strategy)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        result = read_result(out.with_name(out.name + ".result.json"))
        assert result["num_processes"] == 2 and result["global_step"] == 2 * (c + 1)
        metrics = result["metrics"]
        assert [m["step"] for m in metrics] == [2 * c, 2 * c + 1]
        for m in metrics:  # the whole step's: both ranks' tokens
            assert m["distill_kl"] > 0 and m["loss"] == m["distill_kl"] and m["grad_norm"] > 0

        # Every step's P*G = 4 rollouts, rank 0's two then rank 1's, and the step's tokens are
        # both ranks' (the metrics count them all). The ranks sampled the same prompt from their
        # own streams, not the same two completions twice.
        rollouts = pl.read_parquet(out / "rollouts.parquet")
        assert rollouts.height == 2 * 4
        for t, m in enumerate(metrics):
            picked = [problems[i] for i in take_problems(3, SLOW["seed"], 2 * c + t, 1)]
            step = rollouts.filter(pl.col("step") == 2 * c + t)
            assert step["problem_id"].to_list() == [picked[0].id] * 4
            assert set(step["context_id"]) == {"seed"}
            assert int(step["completion_tokens"].sum()) == m["completion_tokens"]
            texts = step["completion"].to_list()
            assert sorted(texts[:2]) != sorted(texts[2:])
        assert rollouts["completion"].str.len_chars().min() > 0

        # Both ranks ended with the weights the main process saved (DDP keeps replicas equal;
        # FSDP2's shards gather to them), saved as fp32 master weights.
        digests = json.loads((out / RANK_DIGESTS_FILE).read_text())["digests"]
        saved_model = load_model(out / "model", dtype="auto")
        assert next(saved_model.parameters()).dtype == torch.float32
        saved = weights_digest(saved_model)
        assert digests == [saved, saved]

        state_dir = out / "trainer_state"
        assert {p.name for p in state_dir.iterdir()} >= {"optimizer.pt", "scheduler.pt", "state.json",
                                                        "rng_state.pt", "rng_state.rank1.pt"}
        state = json.loads((state_dir / "state.json").read_text())
        assert state["num_processes"] == 2 and state["method"] == "fst_distill"
        assert state["cursor"] == 2 * (c + 1) and state["teacher_context_id"] == "best"
        # The optimiser state is the whole model's, and the second cycle continued it.
        optimizer = torch.load(state_dir / "optimizer.pt")
        assert {float(s["step"]) for s in optimizer["state"].values()} == {2.0 * (c + 1)}

    init, first, second = (_state(tiny_model_dir), _state(cycles[0] / "model"), _state(cycles[1] / "model"))
    assert any(not torch.equal(init[k], first[k].to(init[k].dtype)) for k in init)
    assert any(not torch.equal(first[k], second[k]) for k in first)


class _FixedCompletions:
    """A generator whose completions are fixed token ids (cycled), whatever it is asked: the
    same rollouts in one process and over two ranks, so their distillation steps can be compared."""

    IDS = ((28, 29, 30, 31, 2), (40, 41, 2), (50, 51, 52, 53, 54, 55, 2), (60, 2))

    def __init__(self, generator: Any, offset: int) -> None:
        self.inner, self.offset, self.pad_id = generator, offset, generator.pad_id

    def encode_prompts(self, chats: list) -> list:
        return self.inner.encode_prompts(chats)

    def generate(self, chats: list, params: Any) -> list:
        from fastslow.model.generation import Generation

        tok = self.inner.tokenizer
        out = []
        for i, prompt in enumerate(self.encode_prompts(chats)):
            ids = self.IDS[(self.offset + i) % len(self.IDS)]
            out.append(Generation(text=tok.decode(ids), prompt_tokens=len(prompt), completion_tokens=len(ids),
                                  logprob_sum=0.0, completion_ids=ids))
        return out


def _distill_rank(rank: int, world: int, port: int, model_dir: str, queue: Any) -> None:
    """One rank of a gloo group (rank 0 alone: the one-process path): one distillation step on
    its share of the fixed rollouts; puts (rank, metrics, records, weights) on `queue`."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)
    from slow_toys import LengthTask

    from fastslow.model.convert import load_tokenizer
    from fastslow.slow.distill import _distill_step, _prepare_distributed, _prepare_local
    from fastslow.tasks.base import Problem

    cfg = SlowConfig(**{**SLOW, "bf16": False, "micro_batch_size": 1, "max_grad_norm": 1e-3, "warmup_steps": 0})
    tokenizer = load_tokenizer(model_dir)
    if world > 1:
        trainee, generator = _prepare_distributed(Path(model_dir), tokenizer, cfg, world)
    else:
        trainee, generator = _prepare_local(Path(model_dir), tokenizer, cfg, "r", 0)
    rows = [p for p in (Problem("p0", "length", "Say 0.", "0"), Problem("p1", "length", "Say one.", "1"))
            for _ in range(cfg.num_generations)]
    share = rank_slice(len(rows), rank, world)
    fixed = _FixedCompletions(generator, share.start)
    metrics, records = _distill_step(trainee, fixed, LengthTask(), rows[share], "", "Be brief.", cfg, seed=1)
    # as numpy arrays: torch tensors would cross the queue through shared memory this process frees
    weights = {k: v.detach().numpy().copy() for k, v in trainee.student.state_dict().items()}
    queue.put((rank, metrics, records, weights))
    if world > 1:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_a_distillation_step_over_two_ranks_is_the_one_process_step(tiny_model_dir: Path) -> None:
    """The same eight rollouts, distilled in one process and over two gloo ranks (four each, in
    micro batches of one): the same step-wide token-mean KL and entropy, the same gradient norm
    (the ranks' gradients averaged, so each rank's loss is N x its token sum over the step's
    tokens: without the N the norm halves), and the same updated weights (Adam's first step is
    about lr x sign(g), so these check the routing and the replicas, not the scale)."""
    import multiprocessing

    import numpy as np
    from ports import free_port

    from fastslow.model.convert import load_model

    ctx = multiprocessing.get_context("spawn")
    results = {}
    for world in (1, 2):
        port = free_port()
        queue = ctx.Queue()
        procs = [ctx.Process(target=_distill_rank, args=(r, world, port, str(tiny_model_dir), queue))
                 for r in range(world)]
        for proc in procs:
            proc.start()
        got = sorted((queue.get(timeout=300) for _ in procs), key=lambda x: x[0])
        for proc in procs:
            proc.join(timeout=60)
            assert proc.exitcode == 0
        results[world] = got
    (_, one, one_records, _), = results[1]
    two = [metrics for _, metrics, _, _ in results[2]]
    assert two[0] == two[1]  # every rank reports the whole step
    for key in ("distill_kl", "entropy", "loss", "grad_norm", "reward_mean", "frac_zero_std_groups"):
        assert two[0][key] == pytest.approx(one[key], rel=1e-5), key
    assert two[0]["completion_tokens"] == one["completion_tokens"] == 2 * sum(map(len, _FixedCompletions.IDS))
    assert results[2][0][2] == one_records  # both ranks' rows, in row order
    # one process trains in the checkpoint's dtype, two ranks in fp32: the tiny model is fp32
    init = {k: v.numpy() for k, v in load_model(tiny_model_dir, dtype="auto").state_dict().items()}
    assert next(iter(init.values())).dtype == np.float32
    (_, _, _, alone), = results[1]
    for name, value in alone.items():
        assert np.array_equal(results[2][0][3][name], results[2][1][3][name]), name  # the replicas agree
        np.testing.assert_allclose(results[2][0][3][name], value, rtol=0, atol=1e-7, err_msg=name)
    assert any(not np.array_equal(alone[k], init[k]) for k in init)
