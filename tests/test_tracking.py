"""MLflow tracking: child runs with tags and config, FAILED on error, KILLED after SIGKILL/SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from fastslow.tracking import init_tracking, job_run


@pytest.fixture()
def tracking(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = tmp_path / "results"
    info = init_tracking("exp", ["foundation", "efficiency"], results / "mlflow/tracking.json", results)
    return results / "mlflow/tracking.json", info


def _runs(info, job=None):
    client = MlflowClient(info["tracking_uri"])
    flt = f"tags.`fastslow.job` = '{job}'" if job else ""
    return client.search_runs([info["experiment_id"]], filter_string=flt, order_by=["attributes.start_time ASC"])


def test_init_is_idempotent_and_parents_are_finished(tmp_path, tracking):
    path, info = tracking
    again = init_tracking("exp", ["foundation", "efficiency"], path, tmp_path / "results")
    assert again["parents"] == info["parents"]
    client = MlflowClient(info["tracking_uri"])
    for run_id in info["parents"].values():
        assert client.get_run(run_id).info.status == "FINISHED"
    assert info["tracking_uri"].startswith("sqlite:///")


def test_job_run_logs_tags_config_metrics_tables_and_checkpoint_refs(tmp_path, tracking):
    path, info = tracking
    table = tmp_path / "t.parquet"
    pl.DataFrame({"a": [1, 2], "b": ["x", "y"]}).write_parquet(table)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"0" * 1000)
    cfg = {"slow": {"lr": 1e-5}, "data": {"tasks": ["math"]}}
    with job_run(rule="cycle", wildcards={"run": "r1", "cycle": "0"}, config=cfg,
                 tracking_json=path, parent="efficiency") as tr:
        tr.log_metrics({"reward": 0.5, "nan": float("nan")}, step=3)
        tr.log_table(table, "rollouts")
        tr.log_checkpoint(ckpt, "weights")
    (run,) = _runs(info, "cycle/cycle=0/run=r1")
    assert run.info.status == "FINISHED"
    assert run.data.tags["mlflow.parentRunId"] == info["parents"]["efficiency"]
    assert run.data.tags["wildcard.run"] == "r1"
    assert run.data.params["slow.lr"] == "1e-05"
    assert run.data.metrics == {"reward": 0.5}
    assert len(run.inputs.dataset_inputs) == 1
    assert run.inputs.dataset_inputs[0].dataset.name == "rollouts"
    assert run.data.tags["fastslow.weights"] == str(ckpt.resolve())
    client = MlflowClient(info["tracking_uri"])
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.resolved.json", "weights.json", "tables"} <= names
    # The checkpoint is logged by reference: the artifact store holds no copy of the weights.
    ref = json.loads(open(client.download_artifacts(run.info.run_id, "weights.json", str(tmp_path))).read())
    assert ref["bytes"] == 1000 and ref["files"] == ["model.safetensors"]


def test_exception_marks_run_failed(tracking):
    path, info = tracking
    with pytest.raises(RuntimeError), job_run(rule="r", wildcards={}, config={}, tracking_json=path):
        raise RuntimeError("boom")
    (run,) = _runs(info, "r")
    assert run.info.status == "FAILED"
    assert "boom" in run.data.tags["fastslow.error"]


SCRIPT = textwrap.dedent("""
    import sys, time
    from fastslow.tracking import job_run
    with job_run(rule="long", wildcards={"x": "1"}, config={}, tracking_json=sys.argv[1]):
        print("started", flush=True)
        time.sleep(60)
""")


def _start_and_wait(path):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout.readline().strip() == "started"
    return proc


def test_sigterm_marks_run_killed(tracking):
    path, info = tracking
    proc = _start_and_wait(path)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    (run,) = _runs(info, "long/x=1")
    assert run.info.status == "KILLED"


def test_sigkilled_run_is_closed_and_linked_by_the_rerun(tracking):
    path, info = tracking
    proc = _start_and_wait(path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    (stale,) = _runs(info, "long/x=1")
    assert stale.info.status == "RUNNING"  # nothing can run on SIGKILL ...
    time.sleep(0.01)
    with job_run(rule="long", wildcards={"x": "1"}, config={}, tracking_json=path):
        pass
    old, new = _runs(info, "long/x=1")
    assert old.info.status == "KILLED"  # ... so the rerun closes it
    assert new.info.status == "FINISHED"
    assert new.data.tags["fastslow.previous_run"] == old.info.run_id


def test_tracking_leaves_the_environment_alone(tmp_path, tracking):
    """Pointing our client at a store must not export MLFLOW_TRACKING_URI to later subprocesses
    (mlflow.set_tracking_uri does): a snakemake run started afterwards would log to that store."""
    path, _ = tracking
    with job_run(rule="r", wildcards={}, config={}, tracking_json=path, parent="foundation"):
        pass
    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_the_workflow_rules_files_one_group_each(tmp_path, monkeypatch):
    """What rules init_mlflow and init_tracking write (`log_init`): the experiment once, then one
    file per parent group holding only that group's run, the same run on a second call; a job
    given another group's file fails in one line naming both."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from fastslow.tracking import log_init

    exp = log_init("logs/init_mlflow.log", experiment="exp", out_json="results/mlflow/experiment.json")
    first = log_init("logs/foundation.log", experiment_json="results/mlflow/experiment.json",
                     group="foundation", out_json="results/mlflow/parents/foundation.json")
    other = log_init("logs/figures.log", experiment_json="results/mlflow/experiment.json",
                     group="figures", out_json="results/mlflow/parents/figures.json")
    again = log_init("logs/foundation.log", experiment_json="results/mlflow/experiment.json",
                     group="foundation", out_json="results/mlflow/parents/foundation2.json")
    assert first["experiment_id"] == other["experiment_id"] == exp["experiment_id"]
    assert list(first["parents"]) == ["foundation"] and list(other["parents"]) == ["figures"]
    assert again["parents"] == first["parents"] != other["parents"]
    assert "parent run of 'foundation'" in (tmp_path / "logs/foundation.log").read_text()
    with job_run(rule="r", wildcards={}, config={}, tracking_json="results/mlflow/parents/foundation.json",
                 parent="foundation"):
        pass
    with pytest.raises(ValueError, match="holds the parent runs of \\['figures'\\], not of 'foundation'"), \
            job_run(rule="r", wildcards={}, config={}, tracking_json="results/mlflow/parents/figures.json",
                    parent="foundation"):
        pass
