"""Kill a cycle job with SIGKILL at several points, rerun the workflow, and get the same run.

(The tests marked `workflow` run Snakemake; the others exercise one piece of resumption alone.)

The reference is one uninterrupted smoke run (tiny model, FST on math, 2 cycles of T=2). For each
kill point, a fresh copy runs until cycle 1 reaches that point, the job is SIGKILLed, and the
workflow is simply run again. The finished run must equal the reference: weights, pool and
per-step metrics; cycle 0's outputs must survive the kill; nothing may stay RUNNING in MLflow.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import psutil
import pytest
import torch
from safetensors.torch import load_file
from test_workflow import snakemake, workflow_copy

RUN = "results/runs/efficiency/fst/math-default-s0"
# The smoke task earns the tiny model no reward (zero advantages, no gradient at θ0): a weight decay
# this strong moves the weights at each optimiser step (by lr x 1000 of themselves), so a step run
# twice, or skipped, after a kill shows in them.
CONFIG = """
data: {tasks: [math]}
slow: {weight_decay: 1000.0}
experiments:
  efficiency: {tasks: [math], methods: [fst], cycles: 2}
"""
TARGET = f"{RUN}/cycle1/cycle.json"  # the cycle itself: its evaluation is not under test
# Timing columns differ between any two runs; everything else must be identical.
TIMING = ("seconds", "tokens_per_s", "step_seconds")


def _copy(dest: Path) -> Path:
    dest.mkdir()
    workflow_copy(dest)
    (dest / "overlay.yaml").write_text(CONFIG)
    return dest


def _args(target: str = TARGET) -> list[str]:
    return [target, "--cores", "1", "--notemp", "--configfile", "config/config.yaml", "config/smoke.yaml",
            "overlay.yaml"]


def _run(work: Path, target: str = TARGET) -> None:
    out = snakemake(*_args(target), cwd=work, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]


def _cycle1_job(work: Path) -> psutil.Process | None:
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(work) in cmd and "cycle.py" in cmd and ".snakemake/scripts" in cmd:
            return p
    return None


#: Put first on a job's PYTHONPATH (tests only): a process that logs a message holding
#: $FASTSLOW_TEST_STOP_AT stops itself (SIGSTOP) right after, where the test then kills it; with
#: $FASTSLOW_TEST_STOP_IN_SAVE, at the first `torch.save` after that message returns instead (the
#: weights written, the trainer state begun: optimizer.pt alone). Polling the log instead could
#: miss a short window (the final save) on a busy machine, or kill before it began.
STOP_HOOK = """
import logging, os, signal
_marker = os.environ.get("FASTSLOW_TEST_STOP_AT")
if _marker:
    _call = logging.Logger.callHandlers

    def _stop():
        os.kill(os.getpid(), signal.SIGSTOP)

    def _stop_after(self, record):
        _call(self, record)
        if _marker not in record.getMessage():
            return
        if not os.environ.get("FASTSLOW_TEST_STOP_IN_SAVE"):
            _stop()
            return
        import torch
        _save = torch.save

        def _save_then_stop(*args, **kwargs):
            _save(*args, **kwargs)
            _stop()

        torch.save = _save_then_stop

    logging.Logger.callHandlers = _stop_after
"""
def _kill_at(work: Path, marker: str | None, in_save: bool = False) -> None:
    """Run the workflow; SIGKILL cycle 1's job once it has logged `marker` (None: at start), or
    (`in_save`) once the first trainer-state file after that line is written."""
    hook = work / "stop_hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(STOP_HOOK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])),
           **({"FASTSLOW_TEST_STOP_AT": marker} if marker else {}),
           **({"FASTSLOW_TEST_STOP_IN_SAVE": "1"} if in_save else {})}
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", *_args()], cwd=work, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    log = work / "results/logs/runs/efficiency/fst/math-default-s0/cycle1.log"
    deadline = time.time() + 600
    killed, job = False, None
    try:
        while time.time() < deadline and proc.poll() is None:
            try:
                job = job if job is not None and job.is_running() else _cycle1_job(work)
                if job is not None and (marker is None or job.status() == psutil.STATUS_STOPPED):
                    job.send_signal(signal.SIGKILL)
                    killed = True
                    break
            except psutil.NoSuchProcess:  # it ended between two looks
                job = None
            time.sleep(0.05)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert killed, f"never reached kill point {marker!r}"
    assert marker is None or marker in log.read_text(errors="replace")
    assert not (work / RUN / "cycle1/cycle.json").exists()
    if in_save:  # killed in the middle of the save: the weights and one trainer-state file written
        (state,) = (work / RUN).glob(".cycle1.*/trainer_state")
        assert (state.parent / "model/model.safetensors").exists()
        assert sorted(p.name for p in state.iterdir()) == ["optimizer.pt"]


def _state(work: Path) -> dict:
    cyc = work / RUN / "cycle1"
    metrics = pl.read_parquet(cyc / "metrics.parquet")
    rollouts = pl.read_parquet(cyc / "rollouts.parquet")
    drop = [c for c in metrics.columns if c.endswith(TIMING)]
    pool = json.loads((cyc / "pool.json").read_text())
    optimizer = torch.load(cyc / "trainer_state/optimizer.pt", weights_only=False)["state"]
    return {"weights": load_file(cyc / "model/model.safetensors"), "pool": [e["text"] for e in pool["entries"]],
            "optimizer_steps": {int(v["step"]) for v in optimizer.values()},
            "scheduler": torch.load(cyc / "trainer_state/scheduler.pt", weights_only=False),
            "metrics": metrics.drop(drop), "completions": rollouts["completion"].to_list(),
            "rewards": rollouts["reward"].to_list()}


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """The run up to cycle 0 (base model, data, tracking, cycle 0 kept by --notemp), built once."""
    work = _copy(tmp_path_factory.mktemp("prefix") / "wf")
    _run(work, f"{RUN}/cycle0/cycle.json")
    return work


def _fork(prefix: Path, dest: Path) -> Path:
    """An independent copy of the prefix: files with their mtimes, its own MLflow database."""
    shutil.copytree(prefix, dest, symlinks=True)
    for info_file in (dest / "results/mlflow").rglob("*.json"):  # the experiment's and each group's
        info_file.write_text(info_file.read_text().replace(str(prefix), str(dest)))
    return dest


@pytest.fixture(scope="module")
def reference(prefix, tmp_path_factory):
    work = _fork(prefix, tmp_path_factory.mktemp("ref") / "wf")
    _run(work)
    return _state(work)


@pytest.mark.workflow
@pytest.mark.parametrize(("marker", "in_save"), [(None, False), ("step 1/2", False), ("writing the weights", True)],
                         ids=["during-startup-or-generation", "between-optimiser-steps", "while-writing"])
def test_sigkill_then_rerun_equals_uninterrupted(tmp_path, prefix, reference, marker, in_save):
    work = _fork(prefix, tmp_path / "wf")
    _kill_at(work, marker, in_save)
    cycle0 = work / RUN / "cycle0"
    assert (cycle0 / "cycle.json").exists() and (cycle0 / "model").is_dir()  # nothing earlier lost
    _run(work)
    got = _state(work)
    # killed after its fast round (in the RL steps, or saving): the rerun took that round, which
    # equals the reference's, rather than searching again
    log = (work / "results/logs/runs/efficiency/fst/math-default-s0/cycle1.log").read_text()
    assert ("not searched again" in log) == (marker is not None), log[-2000:]
    assert got["pool"] == reference["pool"]
    assert got["completions"] == reference["completions"]
    assert got["rewards"] == reference["rewards"]
    assert got["metrics"].equals(reference["metrics"])
    assert got["weights"].keys() == reference["weights"].keys()
    for name, tensor in reference["weights"].items():
        torch.testing.assert_close(got["weights"][name], tensor, rtol=0, atol=1e-6)
    # ...which the steps moved (weight decay, CONFIG): one step more or less would show above
    before = load_file(work / RUN / "cycle0/model/model.safetensors")
    assert max((got["weights"][n] - before[n]).abs().max().item() for n in before) > 1e-4
    # the optimiser and scheduler state say whether every step ran exactly once after the kill
    assert got["optimizer_steps"] == reference["optimizer_steps"] == {2 * 2}  # 2 cycles x T=2 steps
    assert got["scheduler"] == reference["scheduler"]
    # MLflow: the killed job's run was closed as KILLED by the rerun, which links to it.
    from mlflow.tracking import MlflowClient

    info = json.loads((work / "results/mlflow/experiment.json").read_text())
    runs = MlflowClient(info["tracking_uri"]).search_runs([info["experiment_id"]])
    assert not [r for r in runs if r.info.status == "RUNNING"]
    job = "cycle/cycle=1/experiment=efficiency/method=fst/run=math-default-s0"
    mine = sorted((r for r in runs if r.data.tags.get("fastslow.job") == job), key=lambda r: r.info.start_time)
    statuses = [r.info.status for r in mine]
    assert statuses[-1] == "FINISHED" and all(s == "KILLED" for s in statuses[:-1]), statuses
    if marker is not None:  # killed after its MLflow run opened: the rerun links to it
        assert len(mine) == 2
        assert mine[-1].data.tags.get("fastslow.previous_run") == mine[0].info.run_id


def _planned(work: Path, overlay: str) -> dict[str, str]:
    """The jobs `snakemake -n` would run for cycle 0 of RUN with `overlay` added: rule -> reasons."""
    (work / "change.yaml").write_text(overlay)
    out = snakemake(*_args(f"{RUN}/cycle0/cycle.json"), "change.yaml", "-n", cwd=work, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    return {m: text for m in ("rule cycle:", "rule task_data:", "rule base_model:") if m in text}


@pytest.mark.workflow
def test_a_changed_training_setting_retrains_and_nothing_else_does(tmp_path, prefix):
    """The run's settings are the cycle job's params: a new slow.lr reruns cycle 0 (reason: its
    params changed); a setting cycle 0 does not depend on (evaluation.k, a new experiment) plans
    nothing; new data sizes rebuild the splits and so the cycle."""
    work = _fork(prefix, tmp_path / "wf")
    assert _planned(work, "{}") == {}
    lr = _planned(work, "slow: {lr: 3.0e-3}")
    assert list(lr) == ["rule cycle:"] and "params" in lr["rule cycle:"].lower()
    assert _planned(work, "evaluation: {k: 3}\nexperiments: {extra: {tasks: [math], methods: [rl], cycles: 1}}") == {}
    assert set(_planned(work, "data: {sizes: {train: 12}}")) == {"rule cycle:", "rule task_data:"}


def test_an_interrupted_jobs_scratch_dir_is_not_carried_into_the_rerun(tmp_path, monkeypatch):
    """A cycle killed during its fast round leaves `cycleN.fast/` beside its directory (a finished
    one renames it into `cycleN/fast`). The rerun starts its round afresh: it removes the stale
    scratch dir rather than leaving it behind or filing it as its own `fast/` (here an rl cycle,
    which has no fast round: the slow steps are stubbed)."""
    from slow_toys import stub_slow_steps_and_write_math

    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec

    config, train = stub_slow_steps_and_write_math(monkeypatch, tmp_path / "data")
    stale = tmp_path / "cycle0.fast"
    (stale / "gepa").mkdir(parents=True)
    (stale / "pool.json").write_text("{}")
    spec = RunSpec(experiment="e", method="rl", name="math-default-s0", schedule=("math",), seed=0)
    run_cycle(spec, config, 0, tmp_path / "init", None, train, tmp_path / "cycle0")
    assert (tmp_path / "cycle0" / "cycle.json").exists()
    assert not stale.exists()
    assert not (tmp_path / "cycle0" / "fast").exists()


def _plain(round_rollouts: dict) -> list:
    """Round rollouts as JSON values: token ids and log-probs as lists."""
    from fastslow.slow.train import encode_extra

    return json.loads(json.dumps(encode_extra({"round_rollouts": round_rollouts})["round_rollouts"]))


def test_a_rerun_after_failed_slow_steps_takes_the_round_it_finished(tmp_path, monkeypatch, tiny_model_dir):
    """An FST cycle that fails in its slow steps (a kill, an OOM, a preempted node) had finished
    its fast round, and the rerun removed it and searched again: at paper scale minutes of GPU and
    paid reflection calls, and a pool the second search may not find again. Now the rerun of the
    same job (same params, same input files) takes that round (pool, summary, the rollouts it
    sampled for the first RL steps); another job's params, or changed inputs, search again."""
    from slow_toys import stub_slow_steps_and_write_math

    import fastslow.fast
    import fastslow.slow.loop
    from fastslow.cycle import ROUND_DONE, run_cycle
    from fastslow.experiments import RunSpec

    config, train = stub_slow_steps_and_write_math(monkeypatch, tmp_path / "data")
    config["fast"].update(reuse_in_slow=True, reuse_steps=1)
    stub, real_round = fastslow.slow.loop.run_cycle, fastslow.fast.run_round
    rounds: list[int] = []
    handed: list[dict] = []

    def counted_round(*args, **kwargs):
        rounds.append(kwargs["round_index"])
        return real_round(*args, **kwargs)

    def failing_steps(*args, **kwargs):
        handed.append(kwargs["round_rollouts"])
        raise RuntimeError("killed in the slow steps")

    monkeypatch.setattr(fastslow.fast, "run_round", counted_round)
    monkeypatch.setattr(fastslow.slow.loop, "run_cycle", failing_steps)
    spec = RunSpec(experiment="e", method="fst", name="math-default-s0", schedule=("math",), seed=0)
    job = {"code": "digest-a", "settings": {"slow": {"lr": 1e-3}}}
    out = tmp_path / "cycle0"
    with pytest.raises(RuntimeError, match="killed in the slow steps"):
        run_cycle(spec, config, 0, tiny_model_dir, None, train, out, job=job)
    assert rounds == [0] and (tmp_path / "cycle0.fast" / ROUND_DONE).exists()
    pool = json.loads((tmp_path / "cycle0.fast" / "pool.json").read_text())
    assert handed[0], "the round sampled the first RL step's problems (reuse_in_slow)"

    with pytest.raises(RuntimeError):  # the same job again: the round is taken, not searched
        run_cycle(spec, config, 0, tiny_model_dir, None, train, out, job=job)
    assert rounds == [0] and _plain(handed[1]) == _plain(handed[0])  # (token ids as lists, not tuples)

    def finishing_steps(*args, **kwargs):
        handed.append(kwargs["round_rollouts"])
        return stub(*args, **kwargs)

    monkeypatch.setattr(fastslow.slow.loop, "run_cycle", finishing_steps)
    summary = run_cycle(spec, config, 0, tiny_model_dir, None, train, out, job=job)
    assert rounds == [0] and _plain(handed[2]) == _plain(handed[0])
    assert json.loads((out / "pool.json").read_text())["entries"] == pool["entries"]
    assert summary["pool_best"] == pool["entries"][0]["id"]
    assert (out / "fast" / "proposals.json").exists() and not (out / "fast" / ROUND_DONE).exists()
    assert not (tmp_path / "cycle0.fast").exists()

    # another job's params (a code or settings change), or no job (outside the workflow): a new search
    monkeypatch.setattr(fastslow.slow.loop, "run_cycle", failing_steps)
    with pytest.raises(RuntimeError):
        run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "c1", job=job)
    with pytest.raises(RuntimeError):
        run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "c1", job={**job, "code": "digest-b"})
    assert rounds == [0, 0, 0]
    # ...as do changed inputs: the train split written again
    train.write_bytes(train.read_bytes())
    with pytest.raises(RuntimeError):
        run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "c1", job={**job, "code": "digest-b"})
    assert rounds == [0, 0, 0, 0]
    with pytest.raises(RuntimeError):
        run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "c1")
    assert rounds == [0, 0, 0, 0, 0]


def test_a_cycle_counts_the_sequences_both_loops_sampled(tmp_path, monkeypatch, tiny_model_dir):
    """cycle.json's `rollouts_sampled`, the curves' samples axis: every sequence the round's
    generator produced, plus the slow steps' rollouts but those the round served them (counted
    once: generated in the round)."""
    import types

    from slow_toys import stub_slow_steps_and_write_math

    import fastslow.fast.adapter
    import fastslow.slow.loop
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec

    config, train = stub_slow_steps_and_write_math(monkeypatch, tmp_path / "data")
    config["fast"].update(reuse_in_slow=True, reuse_steps=1)
    made: list[int] = []
    real = fastslow.fast.adapter.FastAdapter._generate

    def counting(self, *args, **kwargs):  # every generate call of the round, by its sequences
        original = self.generator.generate

        def generate(convs, params):
            made.append(len(convs))
            return original(convs, params)

        self.generator.generate = generate
        try:
            return real(self, *args, **kwargs)
        finally:
            self.generator.generate = original

    monkeypatch.setattr(fastslow.fast.adapter.FastAdapter, "_generate", counting)

    def slow_steps(model_dir, state_in, contexts, task, train_problems, cfg, out_dir, **kwargs):
        Path(out_dir).mkdir(parents=True)
        pl.DataFrame({"step": [0] * 8 + [1] * 8}).write_parquet(Path(out_dir) / "rollouts.parquet")
        served = len(kwargs["round_rollouts"] or {})  # (context, problem) pairs the round sampled
        return types.SimpleNamespace(metrics=[{"reused_rollouts": 3}, {"reused_rollouts": 0}]) if served \
            else types.SimpleNamespace(metrics=[])

    monkeypatch.setattr(fastslow.slow.loop, "run_cycle", slow_steps)
    spec = RunSpec(experiment="e", method="fst", name="math-default-s0", schedule=("math",), seed=0)
    summary = run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "cycle0")
    fast = json.loads((tmp_path / "cycle0" / "fast.json").read_text())
    assert sum(made) == fast["generations"] + fast["slow_rollouts"] > 0 and fast["slow_rollouts"] > 0
    assert summary["rollouts_sampled"] == sum(made) + 16 - 3
    # slow.steps_per_generation 3: the first step samples the block's 24, the later ones reuse them
    from fastslow.cycle import _rollouts_sampled

    block = [{"reused_rollouts": 8, "sampled_ahead_rollouts": 16}, {"reused_rollouts": 8, "sampled_ahead_rollouts": 0},
             {"reused_rollouts": 8, "sampled_ahead_rollouts": 8}]  # (the step metrics of test_slow_cycle's block)
    pl.DataFrame({"step": [0] * 24}).write_parquet(tmp_path / "cycle0" / "rollouts.parquet")
    assert _rollouts_sampled(tmp_path / "cycle0", block, {}) == 24


def test_a_fast_round_samples_the_weights_its_run_has_at_that_cycle(tmp_path, monkeypatch, tiny_model_dir):
    """Cycle c's round samples the weights cycle c-1 trained (FST), or the initial weights for a
    run that trains none (GEPA only): no test looked at which weights the round loaded, so a
    round of the base model on every cycle passed. The same round key covers the previous
    cycle's weights, pool, trainer state and rollouts: a previous cycle run again makes another."""
    from slow_toys import stub_slow_steps_and_write_math

    import fastslow.cycle
    import fastslow.model.generation
    from fastslow.cycle import round_inputs, run_cycle
    from fastslow.experiments import RunSpec

    config, train = stub_slow_steps_and_write_math(monkeypatch, tmp_path / "data")
    fst = RunSpec(experiment="e", method="fst", name="math-default-s0", schedule=("math", "math"), seed=0)
    gepa = RunSpec(experiment="e", method="gepa", name="math-default-s0", schedule=("math", "math"), seed=0)
    run_cycle(fst, config, 0, tiny_model_dir, None, train, tmp_path / "cycle0")
    run_cycle(gepa, config, 0, tiny_model_dir, None, train, tmp_path / "g0")
    sampled: list[Path] = []

    class Stop(Exception):
        pass

    def make_generator(backend, weights, **kwargs):
        sampled.append(Path(weights))
        raise Stop

    keyed: list[list[Path]] = []
    real_key = fastslow.cycle.round_key

    def spied_key(job, spec, cycle, inputs):
        keyed.append(list(inputs))
        return real_key(job, spec, cycle, inputs)

    monkeypatch.setattr(fastslow.model.generation, "make_generator", make_generator)
    monkeypatch.setattr(fastslow.cycle, "round_key", spied_key)
    with pytest.raises(Stop):
        run_cycle(fst, config, 1, tiny_model_dir, tmp_path / "cycle0", train, tmp_path / "cycle1", job={"code": "a"})
    with pytest.raises(Stop):
        run_cycle(gepa, config, 1, tiny_model_dir, tmp_path / "g0", train, tmp_path / "g1")
    assert sampled == [tmp_path / "cycle0" / "model", tiny_model_dir]
    prev = tmp_path / "cycle0"
    # the key the cycle computed covers its previous cycle's files (not only the first cycle's inputs)
    assert keyed == [round_inputs(tiny_model_dir, train, prev)] == [[
        tiny_model_dir, train, prev / "pool.json", prev / "model", prev / "trainer_state", prev / "rollouts.parquet"]]
    assert round_inputs(tiny_model_dir, train, None) == [tiny_model_dir, train]
    key = real_key({"code": "a"}, fst, 1, keyed[0])
    (prev / "pool.json").write_text((prev / "pool.json").read_text() + " ")  # the previous cycle's pool rewritten
    assert real_key({"code": "a"}, fst, 1, keyed[0]) != key


def test_a_round_key_changes_with_each_thing_the_round_depends_on_and_a_bad_marker_is_no_round(tmp_path):
    """`round_key`: the same job, run, cycle and input files give the same key; another job's
    params, run or cycle, or an input file written again, another one (a rerun must not take a
    round that is not its own). An input not on disk is left out. `_finished_round` takes the
    marker only with the same key: none without a key, without the file, or with a file that is
    not JSON (a hand edit, a disk error) rather than failing the rerun."""
    from fastslow.cycle import ROUND_DONE, _finished_round, round_key
    from fastslow.experiments import RunSpec

    spec = RunSpec(experiment="e", method="fst", name="r", schedule=("math", "math"), seed=0)
    other = RunSpec(experiment="e", method="fst", name="r2", schedule=("math", "math"), seed=0)
    train = tmp_path / "train.parquet"
    train.write_bytes(b"rows")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.safetensors").write_bytes(b"w")
    inputs = [tmp_path / "model", train]
    job = {"code": "a", "settings": {"slow": {"lr": 1e-3}}}
    key = round_key(job, spec, 1, inputs)
    assert round_key(dict(job), spec, 1, list(inputs)) == key
    assert round_key(job, spec, 1, [*inputs, tmp_path / "missing"]) == key  # not on disk: left out
    changed = [round_key({**job, "code": "b"}, spec, 1, inputs), round_key(job, other, 1, inputs),
               round_key(job, spec, 0, inputs), round_key(job, spec, 1, inputs[:1])]
    os.utime(train, ns=(train.stat().st_atime_ns, train.stat().st_mtime_ns + 10**9))  # written again
    changed.append(round_key(job, spec, 1, inputs))
    assert len({key, *changed}) == 1 + len(changed)

    scratch = tmp_path / "cycle1.fast"
    scratch.mkdir()
    assert _finished_round(scratch, key) is None  # no marker
    (scratch / ROUND_DONE).write_text(json.dumps({"key": key, "pool": {}, "summary": {}}))
    assert _finished_round(scratch, key) == {"key": key, "pool": {}, "summary": {}}
    assert _finished_round(scratch, None) is None and _finished_round(scratch, changed[0]) is None
    (scratch / ROUND_DONE).write_text('{"key": "' + key[:10])  # cut off
    assert _finished_round(scratch, key) is None
    (scratch / ROUND_DONE).write_text("[]")  # JSON, but no record (a hand edit): no round to take
    assert _finished_round(scratch, key) is None


def test_a_resumed_round_is_tagged_logged_and_its_pool_trains(tmp_path, monkeypatch):
    """The rerun that takes its failed run's round says so (the `fastslow.round_resumed` tag),
    logs the round's metrics as the first run did, and hands its pool's contexts to the slow
    steps. (Round, generator and slow steps stubbed: no model.)"""
    import types

    from slow_toys import stub_slow_steps_and_write_math

    import fastslow.fast
    import fastslow.model.generation
    import fastslow.slow.loop
    from fastslow.cycle import ROUND_DONE, run_cycle, unique_contexts
    from fastslow.experiments import RunSpec
    from fastslow.fast import Pool

    config, train = stub_slow_steps_and_write_math(monkeypatch, tmp_path / "data")
    k = config["fast"]["pool_size"]
    found = Pool.seed(["Add the numbers.", "Think, then answer."], k)
    rounds: list[int] = []

    def round_(pool, *args, **kwargs):
        rounds.append(kwargs["round_index"])
        return found, {"best_val_mean": 0.5, "generations": 5, "metric_calls": 9, "proposed": 2, "accepted": 1,
                       "seed_eval_seconds": 0.0, "search_eval_seconds": 0.0, "slow_sample_seconds": 0.0}

    handed: list = []

    def slow_steps(model_dir, state_in, contexts, task, train_problems, cfg, out_dir, **kwargs):
        handed.append(contexts)
        if len(handed) == 1:
            raise RuntimeError("killed in the slow steps")
        Path(out_dir).mkdir(parents=True)
        return types.SimpleNamespace(metrics=[])

    class Tracker:
        run_id = "r2"

        def __init__(self):
            self.tags, self.calls = {}, []

        def set_tags(self, tags):
            self.tags.update(tags)

        def log_metrics(self, metrics, step=None):
            self.calls.append((metrics, step))

    monkeypatch.setattr(fastslow.fast, "run_round", round_)
    monkeypatch.setattr(fastslow.model.generation, "make_generator", lambda *a, **kw: object())
    monkeypatch.setattr(fastslow.slow.loop, "run_cycle", slow_steps)
    spec = RunSpec(experiment="e", method="fst", name="r", schedule=("math",), seed=0)
    job = {"code": "a"}
    with pytest.raises(RuntimeError, match="killed in the slow steps"):
        run_cycle(spec, config, 0, tmp_path / "init", None, train, tmp_path / "c0", job=job, tracker=Tracker())
    assert rounds == [0] and (tmp_path / "c0.fast" / ROUND_DONE).exists()
    tracker = Tracker()
    summary = run_cycle(spec, config, 0, tmp_path / "init", None, train, tmp_path / "c0", job=job, tracker=tracker)
    assert rounds == [0] and tracker.tags["fastslow.round_resumed"] == "true"
    assert handed[1] == handed[0] == unique_contexts(found.contexts(k))
    assert [(m["fast/metric_calls"], m["fast/generations"], step) for m, step in tracker.calls] == [(9, 5, 0)]
    assert summary["pool_best"] == found.entries[0].id and summary["rollouts_sampled"] == 5
    assert not (tmp_path / "c0.fast").exists() and not (tmp_path / "c0" / "fast" / ROUND_DONE).exists()
