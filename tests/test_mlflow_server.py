"""Tracking through an MLflow server: 16 concurrent jobs, nothing lost.

Starts `mlflow server` (SQLite backend and artifact store in a temp dir, 127.0.0.1, a free port),
points MLFLOW_TRACKING_URI at it, creates the experiment with `init_tracking` as the workflow's
local rule does, then runs 16 job processes at once (forked by one launcher, released together by a
barrier), each inside
`fastslow.tracking.job_run` logging params, metric histories, a Parquet table and a checkpoint
reference. Every run must exist, be FINISHED and hold everything its job logged. The server is
stopped by the fixture that started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from ports import free_port

from fastslow.launch import stop_process_group

JOBS = 16
STEPS = 5
METRICS = ("reward", "kl", "entropy")

# One launcher imports the libraries once and forks the 16 jobs (separate processes, each its own
# HTTP client: nothing is sent before the fork); each child's output goes to out-<i>.txt, its exit
# status to exit-<i>. Sixteen interpreters each importing MLflow cost ~35 CPU-s more.
WORKER = textwrap.dedent("""
    import os, sys, time, traceback
    from pathlib import Path
    import pandas as pd
    import mlflow, mlflow.data  # noqa: F401 - imported before the barrier: time the logging only
    from fastslow.tracking import job_run

    tracking_json, jobs, work = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])

    def job(i):
        config = {"slow": {"lr": 1e-6, "num_generations": 8}, "fast": {"pool_size": 4},
                  "data": {"tasks": ["math", "hover"]}, "job": i}
        table = work / f"rollouts-{i}.parquet"
        pd.DataFrame({"problem": [f"p{j}" for j in range(8)], "reward": [j / 8 for j in range(8)]}).to_parquet(table)
        ckpt = work / f"ckpt-{i}"
        ckpt.mkdir()
        (ckpt / "model.safetensors").write_bytes(b"0" * 1024)
        (work / f"ready-{i}").touch()
        deadline = time.monotonic() + 120             # barrier: start together (bounded)
        while not (work / "go").exists():
            if time.monotonic() > deadline:
                sys.exit("no go signal")
            time.sleep(0.05)
        with job_run(rule="probe", wildcards={"job": str(i)}, config=config, tracking_json=tracking_json,
                     parent="foundation") as tracker:
            for step in range(STEPS):
                tracker.log_metrics({"reward": i + step / 10, "kl": step * 0.01, "entropy": 1.0 + i}, step=step)
            tracker.log_table(table, f"rollouts/{i}")
            tracker.log_checkpoint(ckpt, "checkpoint")
            tracker.set_tags({"probe.index": i})
        print("done", i)

    for i in range(jobs):
        if os.fork() == 0:  # the job: its output to its own file, its status for the test, never back here
            out = os.open(work / f"out-{i}.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1), os.dup2(out, 2)
            code = 0
            try:
                job(i)
            except SystemExit as exc:
                print(exc, file=sys.stderr)
                code = 1
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush(), sys.stderr.flush()
            (work / f"exit-{i}").write_text(str(code))
            os._exit(code)
    failed = 0
    for _ in range(jobs):
        _, status = os.wait()
        failed += os.waitstatus_to_exitcode(status) != 0
    sys.exit(failed)
""").replace("STEPS", str(STEPS))


@pytest.fixture
def mlflow_server(tmp_path):
    """`mlflow server` on 127.0.0.1 with a SQLite backend; yields its URI; stopped afterwards."""
    t0 = time.monotonic()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "2", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
         "--artifacts-destination", str(tmp_path / "server-artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("mlflow server did not come up:\n" + (tmp_path / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        print(f"mlflow server up in {time.monotonic() - t0:.1f} s")
        yield uri
    finally:
        stop_process_group(proc)
        log.close()


@pytest.mark.slow
def test_16_concurrent_jobs_log_to_a_server_without_loss(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from mlflow.tracking import MlflowClient

    from fastslow.tracking import TAG_JOB, flatten, init_tracking

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    t_start = time.monotonic()
    info = init_tracking("server-probe", ["foundation"], tmp_path / "tracking.json", results_dir=tmp_path)
    assert info["tracking_uri"] == mlflow_server
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    proc = subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), str(tmp_path / "tracking.json"),
                             str(JOBS), str(work)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        while len(list(work.glob("ready-*"))) < JOBS and time.monotonic() < deadline:
            if proc.poll() is not None or len(list(work.glob("exit-*"))):  # a job ended before the barrier
                break
            time.sleep(0.2)
        (work / "go").touch()
        t0 = time.monotonic()
        startup_s = t0 - t_start
        launcher = proc.communicate(timeout=180)[0]
    finally:
        stop_process_group(proc)  # the launcher, if it is still running
        with contextlib.suppress(ProcessLookupError):  # and any job it left behind (its session)
            os.killpg(proc.pid, signal.SIGKILL)
    logging_s = time.monotonic() - t0
    status = {i: (work / f"exit-{i}").read_text() if (work / f"exit-{i}").exists() else None for i in range(JOBS)}
    failed = [(i, code, (work / f"out-{i}.txt").read_text()[-2000:] if (work / f"out-{i}.txt").exists() else "")
              for i, code in status.items() if code != "0"]
    assert proc.returncode == 0 and not failed, (proc.returncode, launcher[-2000:], failed)
    assert all((work / f"out-{i}.txt").read_text().strip().endswith(f"done {i}") for i in range(JOBS))

    client = MlflowClient(mlflow_server)
    runs = client.search_runs([info["experiment_id"]], filter_string="tags.`fastslow.rule` = 'probe'",
                              max_results=1000)
    by_job = {r.data.tags[TAG_JOB]: r for r in runs}
    assert len(runs) == JOBS and sorted(by_job) == sorted(f"probe/job={i}" for i in range(JOBS))
    parent = info["parents"]["foundation"]
    expected_params = None
    for i in range(JOBS):
        run = by_job[f"probe/job={i}"]
        rid = run.info.run_id
        assert run.info.status == "FINISHED", (i, run.info.status)
        assert run.data.tags["mlflow.parentRunId"] == parent and run.data.tags["probe.index"] == str(i)
        expected_params = flatten({"slow": {"lr": 1e-6, "num_generations": 8}, "fast": {"pool_size": 4},
                                   "data": {"tasks": ["math", "hover"]}, "job": i})
        assert run.data.params == expected_params
        for name in METRICS:
            history = client.get_metric_history(rid, name)
            assert sorted(m.step for m in history) == list(range(STEPS)), (i, name, history)
        assert run.data.metrics["reward"] == pytest.approx(i + (STEPS - 1) / 10)
        assert [d.dataset.name for d in run.inputs.dataset_inputs] == [f"rollouts/{i}"]
        artifacts = {a.path for a in client.list_artifacts(rid)}
        assert {"config.resolved.json", "checkpoint.json", "tables"} <= artifacts, artifacts
        assert [a.path for a in client.list_artifacts(rid, "tables")] == [f"tables/rollouts-{i}.parquet"]
        ckpt = json.loads(Path(client.download_artifacts(rid, "checkpoint.json", str(tmp_path))).read_text())
        assert ckpt["bytes"] == 1024 and ckpt["files"] == ["model.safetensors"]
    print(f"{JOBS} concurrent jobs logged {JOBS * STEPS * len(METRICS)} metric points, "
          f"{JOBS} tables and {JOBS} checkpoints through {mlflow_server} in {logging_s:.1f} s "
          f"(job processes started in {startup_s:.1f} s, all checked in {time.monotonic() - t0 - logging_s:.1f} s)")
