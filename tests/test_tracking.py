"""MLflow tracking: child runs with tags and config, FAILED on error, KILLED after
SIGKILL/SIGTERM/SIGHUP, and FINISHED for good once the job's work is done."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import polars as pl
import pytest
from mlflow.tracking import MlflowClient

from fastslow.tracking import STOP_SIGNALS, init_tracking, job_run


@pytest.fixture()
def tracking(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = tmp_path / "results"
    info = init_tracking("exp", ["foundation", "efficiency"], results / "mlflow/tracking.json", results)
    return results / "mlflow/tracking.json", info


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """A finished `job_run` leaves the stop signals ignored (it ends a job's script); in this
    process, later tests and their subprocesses need them back."""
    saved = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


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


def test_an_experiment_deleted_in_the_store_stops_init_and_jobs_in_one_line(tmp_path, tracking):
    """Deleted in the MLflow UI, the experiment kept its name: init found and reused it, and every
    job then failed with MLflow's "must be in the 'active' state", naming neither the config key
    nor a way out."""
    from fastslow.tracking import init_experiment

    path, info = tracking
    MlflowClient(info["tracking_uri"]).delete_experiment(info["experiment_id"])
    expected = (f"mlflow_experiment 'exp': experiment {info['experiment_id']} is deleted in "
                f"{info['tracking_uri']}; restore it (`MLFLOW_TRACKING_URI={info['tracking_uri']} mlflow "
                f"experiments restore --experiment-id {info['experiment_id']}`) or set another mlflow_experiment")
    with pytest.raises(RuntimeError) as err:
        init_experiment("exp", tmp_path / "again.json", tmp_path / "results")
    assert str(err.value) == expected
    assert not (tmp_path / "again.json").exists()
    with pytest.raises(RuntimeError) as err, job_run(rule="r", wildcards={}, config={}, tracking_json=path):
        pass
    assert str(err.value) == expected
    MlflowClient(info["tracking_uri"]).restore_experiment(info["experiment_id"])  # what it advises
    assert init_experiment("exp", None, tmp_path / "results")["experiment_id"] == info["experiment_id"]


def test_a_reset_database_stops_jobs_in_one_line_naming_the_remake(tmp_path, monkeypatch):
    """A store reset (or its database deleted) under tracking files that Snakemake keeps (ancient
    inputs): each job failed with MLflow's "No Experiment with id=1 exists"; now one line says what
    is missing, and the command it names remakes the files so the job runs."""
    from fastslow.tracking import log_init, main

    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    log_init("logs/e.log", experiment="exp", out_json="results/mlflow/experiment.json")
    log_init("logs/g.log", experiment_json="results/mlflow/experiment.json", group="efficiency",
             out_json="results/mlflow/parents/efficiency.json")
    path = Path("results/mlflow/parents/efficiency.json")
    info = json.loads(path.read_text())
    # the same address, a fresh database (this process caches its connection to the old file)
    store = f"sqlite:///{tmp_path / 'fresh' / 'store.db'}"
    (tmp_path / "fresh").mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    info = {**info, "tracking_uri": store}
    for name in ("experiment.json", "parents/efficiency.json"):
        made = json.loads((path.parents[1] / name).read_text())
        (path.parents[1] / name).write_text(json.dumps({**made, "tracking_uri": store}))
    with pytest.raises(RuntimeError) as err, job_run(rule="r", wildcards={}, config={}, tracking_json=path,
                                                     parent="efficiency"):
        pass
    assert str(err.value) == (f"{path} names experiment {info['experiment_id']} ('exp'), which MLflow store "
                              f"{info['tracking_uri']} does not hold (its database deleted or reset?): "
                              f"`{sys.executable} -m fastslow.tracking {path.parents[1]}` remakes the files there "
                              f"(finished jobs stay up to date)")
    assert main([str(path.parents[1])]) == 0
    with job_run(rule="r", wildcards={}, config={}, tracking_json=path, parent="efficiency"):
        pass
    assert [r.info.status for r in _runs(json.loads(path.read_text()), "r")] == ["FINISHED"]


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


def _start_and_wait(path, script=SCRIPT, line="started", stdin=None):
    proc = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True,
                            stdin=stdin, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout.readline().strip() == line
    return proc


# A job started from a terminal: the stop signals' default dispositions (whatever this process has).
TERMINAL = textwrap.dedent("""
    import signal
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
""")


def test_sighup_marks_run_killed_unless_the_job_ignores_it(tracking):
    """Closing the terminal (SIGHUP) stops a job like SIGTERM: its run KILLED, not left RUNNING,
    the process ended by the signal. Under `nohup` (SIGHUP ignored from the start) the job goes on,
    and SIGTERM (Snakemake's, SLURM's) stops it the same way."""
    path, info = tracking
    proc = _start_and_wait(path, TERMINAL + SCRIPT)
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=30) == -signal.SIGHUP
    (run,) = _runs(info, "long/x=1")
    assert run.info.status == "KILLED"
    nohup = TERMINAL + "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n" + SCRIPT
    proc = _start_and_wait(path, nohup)
    proc.send_signal(signal.SIGHUP)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # closed KILLED, then dead by the signal itself
    assert [r.info.status for r in _runs(info, "long/x=1")] == ["KILLED", "KILLED"]


# The job's work done, the process exits: after a torch job the interpreter's teardown takes 1-2 s.
# Here it lasts until the test closes the job's stdin (a fixed sleep ended it early on a busy machine).
FINISHING = TERMINAL + textwrap.dedent("""
    import sys
    from fastslow.tracking import job_run
    with job_run(rule="short", wildcards={"x": "1"}, config={}, tracking_json=sys.argv[1]):
        pass
    print("finished", flush=True)
    sys.stdin.read()
""")


def test_a_stop_signal_after_the_run_finished_does_not_fail_the_job(tracking):
    """Ctrl-C as a job finishes: its outputs are written and its run FINISHED, so it must exit 0.
    Killed by the signal instead, Snakemake would delete the outputs of a run MLflow says finished.
    Each stop signal in turn, to one finishing job (any of them alone killed it)."""
    path, info = tracking
    proc = _start_and_wait(path, FINISHING, "finished", stdin=subprocess.PIPE)
    (run,) = _runs(info, "short/x=1")
    assert run.info.status == "FINISHED"
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        proc.send_signal(signum)
        time.sleep(0.2)
        assert proc.poll() is None, signum.name
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    (run,) = _runs(info, "short/x=1")
    assert run.info.status == "FINISHED"


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
    # the replaced run says so: a search by tag tells it from the current one
    assert old.data.tags["fastslow.superseded_by"] == new.info.run_id
    assert "fastslow.superseded_by" not in new.data.tags
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    query = re.search(r'search_runs\(filter_string=\s*"([^"]*)"\)', readme).group(1)  # the README's, as printed
    current = MlflowClient(info["tracking_uri"]).search_runs([info["experiment_id"]], filter_string=query)
    assert [r.info.run_id for r in current if r.data.tags.get("fastslow.job") == "long/x=1"] == [new.info.run_id]


def test_two_projects_on_one_store_and_experiment_keep_their_own_parents_and_jobs(tmp_path, monkeypatch):
    """Two clones (results directories) logging to one server's experiment of one name, the
    default `fastslow`: a job of one had closed the other's live run of the same job KILLED and
    linked to it as its previous run, and the second project's jobs nested under the first's
    parent runs. Each project's runs now carry its id (`fastslow.project`), and its parents and
    jobs are found among its own."""
    from fastslow.tracking import TAG_PROJECT

    store = f"sqlite:///{tmp_path / 'server.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    paths, infos = [], []
    for name in ("a", "b"):
        results = tmp_path / name / "results"
        paths.append(results / "mlflow/parents/foundation.json")
        infos.append(init_tracking("fastslow", ["foundation"], paths[-1], results))
    (a, b), client = infos, MlflowClient(store)
    assert a["experiment_id"] == b["experiment_id"] and a["project"] != b["project"]
    assert a["parents"]["foundation"] != b["parents"]["foundation"]
    # a's job is running (SIGKILLed, say) when b runs the same job: a's run is not b's to close
    stale = client.create_run(a["experiment_id"], tags={"fastslow.job": "long/x=1", TAG_PROJECT: a["project"]})
    with job_run(rule="long", wildcards={"x": "1"}, config={}, tracking_json=paths[1], parent="foundation"):
        pass
    (mine,) = [r for r in _runs(b, "long/x=1") if r.data.tags.get(TAG_PROJECT) == b["project"]]
    assert client.get_run(stale.info.run_id).info.status == "RUNNING"
    assert "fastslow.previous_run" not in mine.data.tags
    assert mine.data.tags["mlflow.parentRunId"] == b["parents"]["foundation"]
    # the files made again (retarget, init_tracking) keep their project and find its parents
    again = init_tracking("fastslow", ["foundation"], paths[1], tmp_path / "b" / "results")
    assert (again["project"], again["parents"]) == (b["project"], b["parents"])
    # and a's own rerun of the job does close its stale run and link to it
    with job_run(rule="long", wildcards={"x": "1"}, config={}, tracking_json=paths[0], parent="foundation"):
        pass
    assert client.get_run(stale.info.run_id).info.status == "KILLED"
    # The id is kept in the results directory, beside the tracking files: remade after they were
    # deleted (as the README offers), they keep it. A copy elsewhere is another project.
    import shutil

    shutil.rmtree(tmp_path / "b" / "results" / "mlflow")
    assert init_tracking("fastslow", ["foundation"], paths[1], tmp_path / "b" / "results")["project"] == b["project"]
    shutil.copytree(tmp_path / "a" / "results", tmp_path / "c" / "results")
    copy = init_tracking("fastslow", ["foundation"], tmp_path / "c" / "results/mlflow/parents/foundation.json",
                         tmp_path / "c" / "results")
    assert copy["project"] not in (a["project"], b["project"]) and copy["parents"] != a["parents"]
    # A new project on a store holding untagged runs (another project's, from before runs were
    # tagged) adopts none of them: not its parent, not a live run of the same job.
    old = client.create_run(a["experiment_id"], tags={"fastslow.job": "long/x=2"}).info.run_id
    with job_run(rule="long", wildcards={"x": "2"}, config={}, tracking_json=paths[1], parent="foundation"):
        pass
    assert client.get_run(old).info.status == "RUNNING"


def test_tracking_files_made_before_projects_keep_their_runs(tmp_path, monkeypatch):
    """Files that name no project (made before runs were tagged with one) find their untagged
    parent runs and earlier runs of a job, and leave tagged projects' runs alone; remade, they
    get an id and still find their untagged parents and runs."""
    from fastslow.tracking import TAG_PROJECT, retarget

    folder, client, exp_id, parent = _legacy_files(tmp_path, monkeypatch)
    stale = client.create_run(exp_id, tags={"fastslow.job": "long/x=1"}).info.run_id  # the old project's, SIGKILLed
    other = client.create_run(exp_id, tags={"fastslow.job": "long/x=1", TAG_PROJECT: "another"}).info.run_id
    with job_run(rule="long", wildcards={"x": "1"}, config={}, tracking_json=folder / "parents/foundation.json",
                 parent="foundation"):
        pass
    assert client.get_run(stale).info.status == "KILLED" and client.get_run(other).info.status == "RUNNING"
    info = retarget(folder)
    remade = json.loads((folder / "parents/foundation.json").read_text())
    assert info["project"] and remade["project"] == info["project"] and remade["parents"] == {"foundation": parent}
    with job_run(rule="long", wildcards={"x": "1"}, config={}, tracking_json=folder / "parents/foundation.json",
                 parent="foundation"):
        pass
    runs = sorted(_runs({"tracking_uri": client.tracking_uri, "experiment_id": exp_id}, "long/x=1"), key=lambda r: r.info.start_time)
    first, newest = [r for r in runs if r.info.run_id not in (stale, other)]
    assert newest.data.tags[TAG_PROJECT] == info["project"] and TAG_PROJECT not in first.data.tags
    assert newest.data.tags["fastslow.previous_run"] == first.info.run_id  # its own untagged run, adopted
    assert client.get_run(other).info.status == "RUNNING"


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


# A job from a terminal (`TERMINAL`): under `nohup pytest` SIGHUP came ignored, and stayed so.
LAUNCHED = TERMINAL + textwrap.dedent("""
    import sys
    from fastslow.launch import run
    from fastslow.tracking import job_run
    ranks = "import os, time; open(sys.argv[1], 'w').write(str(os.getpid())); print('started', flush=True); time.sleep(60)"
    with job_run(rule="multi_gpu", wildcards={}, config={}, tracking_json=sys.argv[1]) as tracker:
        # what the cycle logs of the ranks' finished steps, once they have stopped
        run([sys.executable, "-c", "import sys; " + ranks, sys.argv[2]],
            before_stop=lambda: tracker.log_metrics({"slow/reward_mean": 0.5}, step=1))
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_while_ranks_run_marks_run_killed_and_stops_them(tmp_path, tracking, signum):
    """A multi-GPU cycle's slow steps run under `launch.run`, which forwards SIGTERM (and SIGHUP,
    the terminal closing) to the ranks. The job then stops as the signal's own handler says: its
    MLflow run KILLED (it was FAILED, the ranks' exit raised as CalledProcessError), the job itself
    ended by the signal, no rank left (SIGHUP killed the job and left the ranks running)."""
    path, info = tracking
    pid_file = tmp_path / "rank.pid"
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHED, str(path), str(pid_file)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signum)
    assert proc.wait(timeout=60) == -signum, proc.stderr.read()[-2000:]
    (run,) = _runs(info, "multi_gpu")
    assert run.info.status == "KILLED"
    assert "fastslow.error" not in run.data.tags
    assert run.data.metrics == {"slow/reward_mean": 0.5}  # logged after the ranks stopped, before the close
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_a_killed_jobs_ranks_stop_with_it(tmp_path, tracking):
    """SIGKILL (or the OOM killer) gives the job no chance to forward anything: its ranks, in
    their own session, kept running and renamed a cycle into place after Snakemake had recorded
    the job as failed. The kernel now stops them with their parent (PR_SET_PDEATHSIG)."""
    path, _ = tracking
    pid_file = tmp_path / "rank.pid"
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHED, str(path), str(pid_file)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout.readline().strip() == "started"
    rank = int(pid_file.read_text())
    proc.kill()
    proc.wait(timeout=30)
    import psutil

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:  # dead, or a zombie that init has not reaped (pytest as a container's PID 1 reaps none)
            if psutil.Process(rank).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        os.kill(rank, signal.SIGKILL)
        pytest.fail("the rank outlived its killed job")


def test_a_stop_signal_while_the_store_is_busy_stops_the_job_within_seconds(tracking):
    """SIGTERM while another writer holds the SQLite store: the job waited for the store to take
    its KILLED status (30 s and more; a server that is down, minutes), past SLURM's KillWait.
    It waits STOP_CLOSE_SECONDS now, says so in its log, and stops; the run stays RUNNING for
    the job's next run to close."""
    import sqlite3

    from fastslow.tracking import STOP_CLOSE_SECONDS

    path, info = tracking
    proc = _start_and_wait(path, TERMINAL + SCRIPT)
    db = sqlite3.connect(info["tracking_uri"].removeprefix("sqlite:///"), timeout=1, isolation_level=None)
    db.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_CLOSE_SECONDS + 10) == -signal.SIGTERM
        assert time.monotonic() - started < STOP_CLOSE_SECONDS + 10
    finally:
        db.execute("ROLLBACK")
        db.close()
        if proc.poll() is None:
            proc.kill()
    (run,) = _runs(info, "long/x=1")
    assert run.info.status == "RUNNING"


def test_tracking_files_of_another_store_or_experiment_stop_the_job(tracking, monkeypatch):
    """The tracking files pin the store and experiment they were made for: a job asked for another
    stops before it logs anything, in one line naming both and the command that remakes them, with
    this interpreter (a bare `python` is none on Debian, or not the venv's)."""
    path, info = tracking
    made = info["tracking_uri"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.cluster:5000")
    with pytest.raises(RuntimeError, match=f"made for MLflow store {made}, experiment 'exp', but this run asks "
                                           f"for MLFLOW_TRACKING_URI=http://mlflow.cluster:5000: `{re.escape(sys.executable)} "
                                           "-m fastslow.tracking .*/results/mlflow --experiment exp` remakes them"), \
            job_run(rule="r", wildcards={}, config={}, tracking_json=path):
        pass
    monkeypatch.setenv("MLFLOW_TRACKING_URI", made)  # the same store, named by the variable
    with job_run(rule="r", wildcards={}, config={"mlflow_experiment": "exp"}, tracking_json=path):
        pass
    # ... or by the README's relative address (`made` is absolute): the same file, no mismatch
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///" + os.path.relpath(made.removeprefix("sqlite:///")))
    with job_run(rule="r", wildcards={}, config={"mlflow_experiment": "exp"}, tracking_json=path):
        pass
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with pytest.raises(RuntimeError, match="asks for mlflow_experiment 'fastslow-paper'"), \
            job_run(rule="r", wildcards={}, config={"mlflow_experiment": "fastslow-paper"}, tracking_json=path):
        pass
    server = dict(info, tracking_uri="http://mlflow.cluster:5000")
    from fastslow.tracking import check_store

    with pytest.raises(RuntimeError, match="asks for the embedded store of results "):
        check_store(server, {}, "results/mlflow/parents/fig.json")
    # a copied project: its files name the original's database, which its jobs must not log to
    copy = path.parents[2] / "copy" / "results" / "mlflow" / "tracking.json"
    with pytest.raises(RuntimeError, match=f"made for MLflow store {made}, .* asks for the embedded store of "
                                           f"{re.escape(str(copy.parents[1]))} "):
        check_store(info, {}, copy)
    check_store(info, {}, path)  # the project's own files: no mismatch
    assert [r.info.status for r in _runs(info)] == ["FINISHED"] * 4  # two parents and the two jobs


def test_retarget_remakes_the_tracking_files_for_the_current_store(tmp_path, monkeypatch, capsys):
    """`python -m fastslow.tracking FOLDER` (what the mismatch error says to run): the same files,
    now naming the experiment and each group's parent run in the store this process logs to."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from fastslow.tracking import log_init, main

    log_init("logs/e.log", experiment="exp", out_json="results/mlflow/experiment.json")
    for group in ("foundation", "efficiency"):
        log_init("logs/g.log", experiment_json="results/mlflow/experiment.json", group=group,
                 out_json=f"results/mlflow/parents/{group}.json")
    store = f"sqlite:///{tmp_path / 'cluster.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    with pytest.raises(RuntimeError, match="remakes them"), \
            job_run(rule="r", wildcards={}, config={}, tracking_json="results/mlflow/parents/efficiency.json",
                    parent="efficiency"):
        pass
    assert main(["results/mlflow", "--experiment", "exp-paper"]) == 0
    for group in ("foundation", "efficiency"):
        info = json.loads((tmp_path / f"results/mlflow/parents/{group}.json").read_text())
        assert info["tracking_uri"] == store and info["experiment"] == "exp-paper"
    with job_run(rule="r", wildcards={}, config={"mlflow_experiment": "exp-paper"},
                 tracking_json="results/mlflow/parents/efficiency.json", parent="efficiency"):
        pass
    (run,) = _runs(info, "r")
    assert run.data.tags["mlflow.parentRunId"] == info["parents"]["efficiency"]
    assert MlflowClient(store).get_experiment(info["experiment_id"]).name == "exp-paper"
    # a mistyped folder, or the file for its folder: said so, not "the workflow makes it"
    for argv, expected in ((["results/mlfow"], "results/mlfow: no such folder (the tracking files are in "
                                                "<results>/mlflow)"),
                           (["results/mlflow/experiment.json"], "results/mlflow/experiment.json is a file: give "
                                                                 "the folder that holds experiment.json (results/mlflow)")):
        with pytest.raises(SystemExit):
            main(argv)
        assert capsys.readouterr().err.strip().splitlines()[-1] == f"python -m fastslow.tracking: error: {expected}"
    (tmp_path / "elsewhere/mlflow").mkdir(parents=True)
    with pytest.raises(SystemExit):
        main(["elsewhere/mlflow"])
    assert "elsewhere/mlflow/experiment.json does not exist" in capsys.readouterr().err


def test_a_runs_jobs_log_its_own_settings(tracking, monkeypatch):
    """A job of one run logs the run's effective settings (the variant's overrides applied), not
    the global config every job is given, and is tagged with the run; other jobs log the global
    config. fastslow.jobs does not import fastslow.experiments (every job's code would reach every
    task module, fastslow.provenance): the script passes its RunSpec (final_weights' too)."""
    from types import SimpleNamespace

    from fastslow.config import load_config
    from fastslow.experiments import expand
    from fastslow.jobs import run_settings, snakemake_job
    from fastslow.provenance import library_modules

    path, info = tracking
    config = load_config("config/config.yaml", "config/smoke.yaml")
    config["mlflow_experiment"] = info["experiment"]
    runs = expand(config)
    settings, tags = run_settings(runs["ablations/fst/math-k4-s0"], config)
    assert config["fast"]["pool_size"] == 2 and settings["fast"]["pool_size"] == 4
    assert "experiments" not in settings and settings["mlflow_experiment"] == config["mlflow_experiment"]
    assert settings["run"]["variant"] == "k4" and settings["run"]["overrides"]["fast"] == {"pool_size": 4}
    assert tags == {"fastslow.variant": "k4"}
    reuse, _ = run_settings(runs["reuse/fst/math-reuse-s0"], config)
    assert reuse["fast"]["reuse_rollouts"] is True and config["fast"]["reuse_rollouts"] is False
    assert run_settings(runs["efficiency/rl/math-default-s0"], config)[0]["fast"]["pool_size"] == 1

    def job(wildcards):
        return SimpleNamespace(log=[], wildcards=wildcards, params={}, threads=2,
                               config=config, input=SimpleNamespace(tracking=str(path)), rule="cycle")

    monkeypatch.setattr("fastslow.jobs.setup_logging", lambda log_path, label=None: None)  # the test's own logging stays
    wildcards = {"experiment": "ablations", "method": "fst", "run": "math-k4-s0", "cycle": "0"}
    with snakemake_job(job(wildcards), run=runs["ablations/fst/math-k4-s0"]):
        pass
    (run,) = _runs(info, "cycle/cycle=0/experiment=ablations/method=fst/run=math-k4-s0")
    assert run.data.params["fast.pool_size"] == "4" and run.data.params["run.variant"] == "k4"
    assert not [k for k in run.data.params if k.startswith("experiments.")]
    assert (run.data.tags["fastslow.run"], run.data.tags["fastslow.variant"]) == ("ablations/fst/math-k4-s0", "k4")
    assert run.data.tags["fastslow.versions"].startswith("fastslow==")  # every job: its libraries' versions
    # ...and whether its checkout was its commit (this one's: the test's working tree, clean or not)
    from fastslow.tracking import git_modified

    modified = git_modified()
    assert run.data.tags["fastslow.git_dirty"] == ("unknown" if modified is None else str(bool(modified)).lower())
    assert run.data.tags["fastslow.threads"] == "2"  # ...and its threads
    with pytest.raises(ValueError, match="snakemake_job of run 'ablations/fst/math-k4-s0' was given run "
                                         "'ablations/fst/math-k1-s0'"), \
            snakemake_job(job(wildcards), run=runs["ablations/fst/math-k1-s0"]):
        pass
    with snakemake_job(job({"task": "math"})):
        pass
    (other,) = _runs(info, "cycle/task=math")
    assert other.data.params["fast.pool_size"] == "2" and "fastslow.run" not in other.data.tags
    # final_weights, which only links files, logs its run's settings too (it expands the config):
    # the modules that reaches are all its cycle's, so no edit reruns it without its cycle
    assert "fastslow.experiments" in library_modules("workflow/scripts/final_weights.py")
    assert set(library_modules("workflow/scripts/final_weights.py")) <= set(library_modules("workflow/scripts/cycle.py"))


def test_a_second_copy_of_a_running_job_stops_in_one_line_and_opens_no_run(tmp_path, tracking, monkeypatch):
    """A job a killed Snakemake left running, and its rerun after `--unlock`: the two wrote the
    same outputs, each removing the other's live temporaries as stale (a base model could end as
    one copy's weights with the other's tokenizer). The second copy stops before its MLflow run
    opens, naming the first (which its run would have marked KILLED); alone, the job runs and
    leaves no lock file."""
    import signal
    import subprocess
    import sys
    from types import SimpleNamespace

    from test_errors import HOLD_LOCK

    from fastslow.jobs import snakemake_job

    path, info = tracking
    log = tmp_path / "logs" / "base_model.log"
    job = SimpleNamespace(log=[str(log)], wildcards={}, params={}, threads=1, rule="base_model",
                          config={"mlflow_experiment": info["experiment"]}, input=SimpleNamespace(tracking=str(path)))
    logged: list[str] = []
    monkeypatch.setattr("fastslow.jobs.setup_logging", lambda log_path, label=None: logged.append(log_path))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, f"{log}.lock"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit) as err, snakemake_job(job):
            pass
        assert str(err.value).startswith(f"job error: job base_model is being written by another process "
                                         f"(pid {holder.pid} on ")
        assert not _runs(info, "base_model")
        assert not logged  # the running copy's log is not the second one's to write (its traceback had gone there)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with snakemake_job(job):
        assert Path(f"{log}.lock").exists()
    assert [r.info.status for r in _runs(info, "base_model")] == ["FINISHED"] and not Path(f"{log}.lock").exists()
    # the run names its log, where a failed job's traceback is (its fastslow.error tag has the error alone)
    assert _runs(info, "base_model")[0].data.tags["fastslow.log"] == str(log.absolute())


def test_a_job_that_finds_the_disk_full_says_so_in_one_line_naming_where(tmp_path, tracking, monkeypatch, caplog):
    """A full disk mid-save was a traceback in the library's words, naming no path (torch:
    "unexpected pos 704 vs 598"; safetensors, polars: "No space left on device (os error 28)"),
    in a log on the disk that is full. The job now says, on the console first, that the disk is
    full under its output directory and how much is free there; other errors are left alone."""
    import errno
    from types import SimpleNamespace

    from fastslow.jobs import disk_full, snakemake_job

    path, info = tracking
    out = tmp_path / "runs" / "cycle1" / "cycle.json"
    job = SimpleNamespace(log=[], wildcards={}, params={}, threads=1, rule="cycle", output=[str(out)],
                          config={"mlflow_experiment": info["experiment"]}, input=SimpleNamespace(tracking=str(path)))
    monkeypatch.setattr("fastslow.jobs.setup_logging", lambda log_path, label=None: None)
    torch_full = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    with pytest.raises(RuntimeError), snakemake_job(job):
        raise torch_full
    (line,) = [r.getMessage() for r in caplog.records if r.name == "fastslow.jobs"]
    assert line.startswith(f"the disk is full (or a quota reached) under {out.parent} (")
    assert " GiB free there now): free some space or move results/ to a larger file system, then rerun; the write " \
           "failed with RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598" in line
    wrapped = ValueError("saving the weights")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert disk_full(wrapped, tmp_path).endswith("the write failed with ValueError: saving the weights")
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"), tmp_path)
    assert disk_full(ValueError("no column 'answer'"), tmp_path) is None
    # an error of ours that already names the disk and what to do is not said twice
    assert disk_full(RuntimeError("cannot fetch base model 'x': no space left on the device of the Hugging Face "
                                  "cache (...); free space there or point HF_HUB_CACHE at a larger disk"), tmp_path) is None


def test_a_store_that_stops_answering_costs_log_lines_not_the_job(tmp_path, tracking, monkeypatch, caplog):
    """Once a job's run is open its outputs are the result: a logging call the store refuses (here
    every artifact upload) was raised, failing the job after its work, and Snakemake deleted the
    finished outputs. Now it is logged as an error, named in a tag, and the job ends normally."""
    path, info = tracking
    table = tmp_path / "t.parquet"
    pl.DataFrame({"a": [1]}).write_parquet(table)

    def refused(*args, **kwargs):
        raise ConnectionError("mlflow.cluster:5000 refused the connection")

    with job_run(rule="cycle", wildcards={"cycle": "0"}, config={}, tracking_json=path) as tr:
        monkeypatch.setattr(tr.client, "log_artifact", refused)
        tr.log_metrics({"reward": 0.5})
        tr.log_table(table, "rollouts")  # its dataset input is logged, its artifact upload refused
        tr.log_artifact(table)
    (run,) = _runs(info, "cycle/cycle=0")
    assert run.info.status == "FINISHED" and run.data.metrics == {"reward": 0.5}
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == ["rollouts"]
    assert run.data.tags["fastslow.logging_failures"].count("log_artifact: ConnectionError: mlflow.cluster") == 2
    assert "log_artifact failed, not logged (the job goes on)" in caplog.text
    # a store gone altogether: the job still ends normally, the run stays RUNNING, and says so in the log
    with job_run(rule="cycle", wildcards={"cycle": "1"}, config={}, tracking_json=path) as tr:
        monkeypatch.setattr(tr.client, "log_batch", refused)
        monkeypatch.setattr(tr.client, "set_terminated", refused)
        tr.log_metrics({"reward": 0.7})
    (run,) = _runs(info, "cycle/cycle=1")
    assert run.info.status == "RUNNING" and "could not be closed, it stays RUNNING" in caplog.text
    # an error of the job's own is still raised, and its run still FAILED
    with pytest.raises(ValueError, match="bad"), job_run(rule="cycle", wildcards={"cycle": "2"}, config={},
                                                           tracking_json=path) as tr:
        monkeypatch.setattr(tr.client, "log_artifact", refused)
        tr.log_artifact(table)
        raise ValueError("bad")
    (run,) = _runs(info, "cycle/cycle=2")
    assert run.info.status == "FAILED" and run.data.tags["fastslow.error"] == "ValueError: bad"


def test_a_store_that_waited_out_its_retries_is_not_asked_again_by_the_job(tmp_path, tracking, monkeypatch, caplog):
    """A server that is down makes each call wait out MLflow's HTTP retries (minutes) before it
    fails: every later call of the job (one an RL step) waited again. A call that failed that
    slowly now ends the job's logging; a quick refusal (above) does not."""
    from fastslow import tracking as tracking_module

    path, info = tracking
    asked: list[str] = []

    def down(*args, **kwargs):
        asked.append("call")
        raise ConnectionError("Max retries exceeded with url: /api/2.0/mlflow/runs/log-batch")

    monkeypatch.setattr(tracking_module, "STORE_DOWN_SECONDS", 0.0)  # every failure took "long enough"
    with job_run(rule="cycle", wildcards={"cycle": "3"}, config={}, tracking_json=path) as tr:
        for name in ("log_batch", "log_artifact", "set_tag", "set_terminated"):
            monkeypatch.setattr(tr.client, name, down)
        tr.log_metrics({"reward": 0.1})
        assert tr.down and len(asked) == 1
        tr.log_metrics({"reward": 0.2})
        tr.set_tags({"x": "y"})
    assert len(asked) == 1  # neither the later calls nor the close asked the store again
    assert tr.failures[1:] == ["log_metrics: skipped, the store had stopped answering",
                               "set_tags: skipped, the store had stopped answering",
                               "set_tags: skipped, the store had stopped answering"]  # the failures tag too
    assert "this job logs nothing more to it" in caplog.text and "stays RUNNING" in caplog.text


def test_a_store_refusing_the_jobs_config_at_its_start_costs_a_log_line_not_the_job(tracking, monkeypatch, caplog):
    """The config artifact and params were logged after the run opened but outside the block that
    closes it: a store refusing them failed the job before its work and left the run RUNNING."""
    from mlflow.tracking import MlflowClient

    path, info = tracking

    def refused(*args, **kwargs):
        raise ConnectionError("mlflow.cluster:5000 refused the connection")

    monkeypatch.setattr(MlflowClient, "log_dict", refused)
    with job_run(rule="evaluate", wildcards={"task": "math"}, config={"slow": {"lr": 1e-6}}, tracking_json=path) as tr:
        tr.log_metrics({"mean_at_k": 0.25})
    (run,) = _runs(info, "evaluate/task=math")
    assert run.info.status == "FINISHED" and run.data.metrics == {"mean_at_k": 0.25}
    assert run.data.tags["fastslow.logging_failures"].startswith("log_config: ConnectionError")
    assert "log_config failed, not logged (the job goes on)" in caplog.text


def test_console_lines_name_their_job_and_the_log_file_does_not(tmp_path, capfd):
    """Jobs side by side interleave their lines on the console: each line there names its job
    (rule, run key, other wildcards). The job's log file is its own: its lines go without."""
    import logging
    import sys

    from fastslow.jobs import job_label, setup_logging

    assert job_label("evaluate_point", {"experiment": "efficiency", "method": "fst", "run": "math-default-s0",
                                        "point": "cycle1", "task": "math"}) == \
        "evaluate_point efficiency/fst/math-default-s0 point=cycle1 task=math"
    assert job_label("task_data", {"task": "hover"}) == "task_data task=hover"
    assert job_label("base_model", {}) == "base_model"
    root, stderr = logging.getLogger(), sys.stderr
    handlers, level = root.handlers[:], root.level
    try:
        setup_logging(tmp_path / "job.log", job_label("cycle", {"experiment": "e", "method": "fst", "run": "r",
                                                                "cycle": "1"}))
        logging.getLogger("fastslow.slow").info("step 1/3")
        logging.getLogger("fastslow.fast").info("proposed:\nline two")
        logging.getLogger("fastslow.fast").warning("a warning")
        logging.getLogger("fastslow.tracking").info("MLflow run 0123abc finished", extra={"file_only": True})
    finally:
        for handler in root.handlers:
            handler.flush()
            if handler not in handlers:
                handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        sys.stderr = stderr
    console = capfd.readouterr().err
    # short enough to read beside another job's: the time of day, the level from WARNING up, no logger
    assert re.search(r"^\d\d:\d\d:\d\d \[cycle e/fst/r cycle=1\] step 1/3$", console, re.M), console
    assert " [cycle e/fst/r cycle=1] proposed:\n[cycle e/fst/r cycle=1] line two\n" in console  # every line of it
    assert re.search(r"^\d\d:\d\d:\d\d WARNING \[cycle e/fst/r cycle=1\] a warning$", console, re.M), console
    assert "0123abc" not in console  # a line for the log file alone
    logged = (tmp_path / "job.log").read_text()
    assert "INFO fastslow.slow: step 1/3" in logged and "[cycle" not in logged
    assert "INFO fastslow.tracking: MLflow run 0123abc finished" in logged


def test_a_job_log_holds_library_warnings_but_not_trls_deprecated_attribute(tmp_path, tiny_model_dir):
    """Every cycle log carried transformers' FutureWarning about `is_gradient_checkpointing`,
    which TRL reads at each RL step: nothing a user can act on. Other warnings still land.
    (A process of its own, as a job is: pytest records the warnings of its own.)"""
    import subprocess
    import sys

    script = (
        "import sys, warnings\n"
        "from fastslow.jobs import setup_logging\n"
        "from fastslow.model.convert import load_model\n"
        "setup_logging(sys.argv[1])\n"
        "model = load_model(sys.argv[2])\n"
        "assert model.is_gradient_checkpointing is False  # what trl.models.utils reads\n"
        "warnings.warn(\"a library's own warning\", UserWarning, stacklevel=1)\n")
    log = tmp_path / "job.log"
    subprocess.run([sys.executable, "-c", script, str(log), str(tiny_model_dir)], check=True, timeout=300)
    logged = log.read_text()
    assert "a library's own warning" in logged
    assert "is_gradient_checkpointing" not in logged


def test_a_cycle_records_how_this_machine_computed_it(tmp_path, monkeypatch):
    """`slow.bf16: auto` is resolved per machine (bf16 autocast where native, else fp32), but the
    params and MLflow say "auto": two machines ran the same params, nothing reran, and no record
    said which trained in bf16. The cycle now tags its MLflow run with the resolved value and
    writes it, with torch's threads, into cycle.json."""
    from slow_toys import stub_slow_steps_and_write_math

    from fastslow import hardware
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec

    class Tags:
        run_id = "r1"

        def __init__(self) -> None:
            self.tags: dict[str, str] = {}

        def set_tags(self, tags):
            self.tags.update(tags)

        def log_metrics(self, metrics, step=None):
            pass

    config, train = stub_slow_steps_and_write_math(monkeypatch, tmp_path / "data")
    spec = RunSpec(experiment="e", method="rl", name="math-default-s0", schedule=("math",) * 3, seed=0)
    # "auto" on a CPU with native bf16 and on one without (this machine's), and off on the first
    for cycle, (bf16, native, expected) in enumerate((("auto", True, True), ("auto", False, False),
                                                      (False, True, False))):
        monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda native=native: native)
        config["slow"]["bf16"] = bf16
        tracker = Tags()
        run_cycle(spec, config, cycle, tmp_path / "init", tmp_path / f"cycle{cycle - 1}" if cycle else None,
                  train, tmp_path / f"cycle{cycle}", tracker=tracker)
        summary = json.loads((tmp_path / f"cycle{cycle}" / "cycle.json").read_text())
        assert summary["bf16_training"] is expected
        assert tracker.tags["fastslow.bf16_training"] == str(expected).lower()
        # checkpointing, `auto` in config.yaml: on where the weights train in fp32 on the CPU
        assert summary["activation_checkpointing"] is (not expected)
        assert tracker.tags["fastslow.activation_checkpointing"] == str(not expected).lower()
        assert summary["slow_reward_mean"] is None and summary["slow_answered_fraction"] is None  # no steps ran
        import torch

        assert summary["torch_threads"] == torch.get_num_threads() >= 1
        # and the CPU time it got: wall time on a shared CPU is the other jobs' doing too
        assert summary["device"] == "cpu" and 0 < summary["cpu_seconds"]
        # the cycle's own CPU time, not the process's since it started (timer slack: 50 ms)
        assert summary["cpu_seconds"] <= summary["seconds"] * summary["torch_threads"] + 0.05
        assert summary["cpu_share"] == pytest.approx(summary["cpu_seconds"] / (summary["seconds"] * summary["torch_threads"]))


def test_the_libraries_versions_a_job_is_tagged_with():
    """The versions of the libraries that decide a job's numbers (code digests cover fastslow only;
    every job's MLflow run is tagged with them, test_a_runs_jobs_log_its_own_settings)."""
    from importlib.metadata import version

    from fastslow.jobs import library_versions

    tagged = dict(item.split("==") for item in library_versions().split())
    assert tagged["torch"] == version("torch") and tagged["trl"] == version("trl")
    assert {"transformers", "gepa", "reasoning-gym"} <= set(tagged)
    assert "vllm" not in tagged or tagged["vllm"] == version("vllm")  # only what is installed


def test_a_jobs_source_tags_say_whether_its_checkout_was_its_commit(tmp_path, monkeypatch):
    """`mlflow.source.git.commit` alone cannot give back a job run from an edited checkout: the
    job is also tagged `fastslow.git_dirty` and, when dirty, the files that differ (tracked ones:
    results/ and other untracked files do not count); outside a checkout, unknown."""
    import subprocess

    from fastslow.tracking import GIT_MODIFIED_SHOWN, git_tags

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # tmp_path is in no other checkout
    assert git_tags(tmp_path) == {"mlflow.source.git.commit": "unknown", "fastslow.git_dirty": "unknown"}
    git("init", "-q")
    names = [f"f{i:02d}.py" for i in range(GIT_MODIFIED_SHOWN + 2)]
    for name in names:
        (tmp_path / name).write_text("x = 1\n")
    git("add", *names)
    git("commit", "-q", "-m", "one")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "new.json").write_text("{}")  # untracked: still the commit's code
    assert git_tags(tmp_path) == {"mlflow.source.git.commit": commit, "fastslow.git_dirty": "false"}
    (tmp_path / "f00.py").write_text("x = 2\n")
    git("rm", "-q", "f01.py")  # staged changes count too
    assert git_tags(tmp_path) == {"mlflow.source.git.commit": commit, "fastslow.git_dirty": "true",
                                  "fastslow.git_modified": "f00.py, f01.py"}
    for name in names[2:]:
        (tmp_path / name).write_text("x = 3\n")
    shown = git_tags(tmp_path)["fastslow.git_modified"]
    assert shown.startswith("f00.py, f01.py, f02.py") and shown.endswith(f"{names[GIT_MODIFIED_SHOWN - 1]} and 2 more")
    git("commit", "-q", "-am", "two")
    (tmp_path / "a b.py").write_text("y = 1\n")
    git("add", "a b.py")
    git("commit", "-q", "-m", "three")
    assert git_tags(tmp_path)["fastslow.git_dirty"] == "false"
    (tmp_path / "a b.py").write_text("y = 2\n")  # unquoted, as written (porcelain quoted it)
    git("mv", "f02.py", "g 02.py")  # a rename: its new path
    assert git_tags(tmp_path)["fastslow.git_modified"] == "a b.py, g 02.py"


def test_a_lock_is_known_by_sqlites_error_in_the_chain_not_only_by_the_wrappers_text(monkeypatch):
    """MLflow 3.17 raises MlflowException over SQLAlchemy's OperationalError over sqlite3's, each
    quoting 'database is locked' (seen with a real lock, which MLflow waits 20 s on); a wrapper
    that stops quoting it is still retried, as long as sqlite3's error is in the chain."""
    import sqlite3

    from mlflow.exceptions import MlflowException

    import fastslow.tracking as tracking

    monkeypatch.setattr(tracking.time, "sleep", lambda s: None)
    calls: list[int] = []

    def reworded() -> str:
        calls.append(1)
        if len(calls) == 1:
            try:
                raise sqlite3.OperationalError("database is locked")
            except sqlite3.OperationalError as exc:
                raise MlflowException("the tracking store could not write the run") from exc
        return "ok"

    assert tracking._retry(reworded) == "ok" and len(calls) == 2
    other = MlflowException("the tracking store could not write the run")
    other.__cause__ = sqlite3.OperationalError("no such table: runs")
    assert not tracking._locked(other)


def test_a_locked_database_is_retried_with_backoff_and_other_errors_are_not(monkeypatch):
    """Local jobs on several cores share one SQLite file, which takes one writer at a time:
    'database is locked' is waited out (0.2 s, doubling) up to 8 attempts; any other error, or
    the eighth lock, is raised at once."""
    import fastslow.tracking as tracking

    slept: list[float] = []
    monkeypatch.setattr(tracking.time, "sleep", slept.append)
    calls: list[int] = []

    def locked_twice(x):
        calls.append(x)
        if len(calls) <= 2:
            raise RuntimeError("(sqlite3.OperationalError) database is locked")
        return x * 2

    assert tracking._retry(locked_twice, 21) == 42 and calls == [21, 21, 21]
    assert slept == [0.2, 0.4]
    slept.clear()

    def other(x):
        raise ValueError("no such table: runs")

    with pytest.raises(ValueError, match="no such table"):
        tracking._retry(other, 1)
    assert slept == []

    def always_locked():
        raise RuntimeError("database is locked")

    with pytest.raises(RuntimeError, match="locked"):
        tracking._retry(always_locked)
    assert slept == [0.2 * 2 ** i for i in range(7)]  # 8 attempts, 7 waits (25.4 s in all)


def test_the_embedded_store_keeps_artifacts_in_the_results_directory(tmp_path, monkeypatch):
    """The embedded store's experiment puts its artifacts under `<results>/mlartifacts`, beside
    its database: MLflow's default (`./mlartifacts` of whatever directory the job ran in) would
    scatter them."""
    from fastslow.tracking import init_experiment

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    info = init_experiment("exp", None, tmp_path / "results")
    exp = MlflowClient(info["tracking_uri"]).get_experiment(info["experiment_id"])
    assert exp.artifact_location == (tmp_path / "results" / "mlartifacts").resolve().as_uri()


def test_an_experiment_another_project_creates_meanwhile_is_found_not_an_error(tmp_path, monkeypatch):
    """Two projects' first jobs on one server: the other creates the experiment between this
    one's lookup and its create, which MLflow refuses (RESOURCE_ALREADY_EXISTS): it is found."""
    import fastslow.tracking as tracking

    store = f"sqlite:///{tmp_path / 'server.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.chdir(tmp_path)
    made = MlflowClient(store).create_experiment("shared")

    class LateLookup(MlflowClient):
        looked = 0

        def get_experiment_by_name(self, name):
            LateLookup.looked += 1
            return None if LateLookup.looked == 1 else super().get_experiment_by_name(name)

    monkeypatch.setattr(tracking, "_client", LateLookup)
    info = tracking.init_experiment("shared", tmp_path / "results/mlflow/experiment.json", tmp_path / "results")
    assert info["experiment_id"] == made and LateLookup.looked == 2


def _legacy_files(tmp_path, monkeypatch):
    """Tracking files made before runs were tagged with a project, on a shared store: their
    folder, the store's client, the experiment id and their (untagged) parent run."""
    store = f"sqlite:///{tmp_path / 'server.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.chdir(tmp_path)  # the experiment made here keeps its artifacts in ./mlruns, not the checkout's
    client = MlflowClient(store)
    exp_id = client.create_experiment("fastslow")
    folder = tmp_path / "old" / "results" / "mlflow"
    parent = client.create_run(exp_id, tags={"fastslow.parent": "foundation"}).info.run_id
    legacy = {"tracking_uri": store, "experiment": "fastslow", "experiment_id": exp_id}
    (folder / "parents").mkdir(parents=True)
    (folder / "experiment.json").write_text(json.dumps(legacy))
    (folder / "parents" / "foundation.json").write_text(json.dumps({**legacy, "parents": {"foundation": parent}}))
    return folder, client, exp_id, parent


def test_old_tracking_files_remade_twice_still_adopt_their_untagged_runs(tmp_path, monkeypatch):
    """Retargeted once, the files name a project and say they adopt untagged runs: a second
    retarget (another store, another experiment name, or the same) must keep saying so, or
    the project's jobs lose their earlier runs and parents."""
    from fastslow.tracking import retarget

    folder, client, exp_id, parent = _legacy_files(tmp_path, monkeypatch)
    old = client.create_run(exp_id, tags={"fastslow.job": "long/x=1"})
    client.set_terminated(old.info.run_id, "FINISHED")
    first = retarget(folder)
    again = retarget(folder)
    assert again["project"] == first["project"] and again.get("adopt_untagged") is True
    remade = json.loads((folder / "parents/foundation.json").read_text())
    assert remade["adopt_untagged"] is True and remade["parents"] == {"foundation": parent}
    time.sleep(0.01)
    with job_run(rule="long", wildcards={"x": "1"}, config={}, tracking_json=folder / "parents/foundation.json",
                 parent="foundation"):
        pass
    (new,) = [r for r in _runs({"tracking_uri": client.tracking_uri, "experiment_id": exp_id}, "long/x=1")
              if r.info.run_id != old.info.run_id]
    assert new.data.tags["fastslow.previous_run"] == old.info.run_id


def test_old_tracking_files_find_their_parent_under_newer_parents_of_other_projects(tmp_path, monkeypatch):
    """A shared server where another (tagged) project made its own parent of the same group after
    this project's untagged one: remade, this project's files still name their own parent (the
    search for untagged runs must look past the other project's newer ones), not a new one."""
    from fastslow.tracking import TAG_PROJECT, retarget

    folder, client, exp_id, parent = _legacy_files(tmp_path, monkeypatch)
    time.sleep(0.01)
    others = [client.create_run(exp_id, tags={"fastslow.parent": "foundation", TAG_PROJECT: f"other{i}"})
              for i in range(3)]
    retarget(folder)
    remade = json.loads((folder / "parents/foundation.json").read_text())
    assert remade["parents"] == {"foundation": parent}
    assert parent not in [r.info.run_id for r in others]


def test_the_modified_files_tag_counts_only_the_files_past_those_shown(monkeypatch):
    """`fastslow.git_modified` names up to GIT_MODIFIED_SHOWN files and then how many more:
    exactly that many are named with no 'and 0 more'."""
    import fastslow.tracking as tracking

    monkeypatch.setattr(tracking, "git_commit", lambda cwd=None: "abc")
    for count, tail in ((tracking.GIT_MODIFIED_SHOWN, f"f{tracking.GIT_MODIFIED_SHOWN - 1}.py"),
                        (tracking.GIT_MODIFIED_SHOWN + 1, f"f{tracking.GIT_MODIFIED_SHOWN - 1}.py and 1 more")):
        monkeypatch.setattr(tracking, "git_modified", lambda cwd=None, count=count: [f"f{i}.py" for i in range(count)])
        tags = tracking.git_tags()
        assert tags["fastslow.git_dirty"] == "true" and tags["fastslow.git_modified"].endswith(", " + tail)
    monkeypatch.setattr(tracking, "git_modified", lambda cwd=None: [])
    assert tracking.git_tags() == {"mlflow.source.git.commit": "abc", "fastslow.git_dirty": "false"}


def test_a_modified_file_with_a_one_letter_name_is_named(tmp_path, monkeypatch):
    """Porcelain's 'XY path' entry is 4 characters for a one-letter path: still a path."""
    from fastslow.tracking import git_modified

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    git("init", "-q")
    (tmp_path / "x").write_text("1\n")
    git("add", "x")
    git("commit", "-q", "-m", "one")
    (tmp_path / "x").write_text("2\n")
    assert git_modified(tmp_path) == ["x"]


def test_a_job_interrupted_in_process_is_killed_and_gives_back_the_signal_handlers(tracking):
    """A KeyboardInterrupt out of the job's block closes its run KILLED (it was stopped, not
    broken); any failure hands the process its own stop handlers back (a notebook or a test that
    catches the error and goes on must not keep a dead run's handler)."""
    path, info = tracking

    def mine(signum, frame):  # noqa: ARG001
        pass

    before = {s: signal.signal(s, mine) for s in STOP_SIGNALS}
    try:
        with pytest.raises(KeyboardInterrupt), job_run(rule="r", wildcards={"x": "1"}, config={}, tracking_json=path):
            assert signal.getsignal(signal.SIGTERM) is not mine  # the job's own, while it runs
            raise KeyboardInterrupt
        assert all(signal.getsignal(s) is mine for s in STOP_SIGNALS)
        with pytest.raises(ValueError), job_run(rule="r", wildcards={"x": "2"}, config={}, tracking_json=path):
            raise ValueError("bad")
        assert all(signal.getsignal(s) is mine for s in STOP_SIGNALS)
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    assert [r.info.status for r in _runs(info, "r/x=1")] == ["KILLED"]
    assert [r.info.status for r in _runs(info, "r/x=2")] == ["FAILED"]


def test_metrics_keep_their_step_and_tables_their_context(tmp_path, tracking):
    """A metric logged at a step is in the run's history at that step (no step: 0), under a name
    MLflow accepts ('mean@4' as 'mean_at_4'); a table is a dataset input of the context given
    (task data logs its splits, figures their input curves)."""
    path, info = tracking
    table = tmp_path / "t.parquet"
    pl.DataFrame({"a": [1]}).write_parquet(table)
    with job_run(rule="r", wildcards={}, config={}, tracking_json=path) as tr:
        tr.log_metrics({"mean@4": 0.5}, step=3)
        tr.log_metrics({"mean@4": 0.75}, step=4)
        tr.log_metrics({"other": 1.0})
        tr.log_table(table, "curves", context="input")
    (run,) = _runs(info, "r")
    client = MlflowClient(info["tracking_uri"])
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "mean_at_4")] == [(3, 0.5), (4, 0.75)]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "other")] == [0]
    (inp,) = run.inputs.dataset_inputs
    assert {t.key: t.value for t in inp.tags}["mlflow.data.context"] == "input"


def test_the_workflow_rules_append_their_line_and_need_their_arguments(tmp_path, monkeypatch):
    """`log_init` appends to the rule's log (a rerun keeps the earlier line) and, given neither
    an experiment nor a group's experiment file, says what it needs."""
    from fastslow.tracking import log_init

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for _ in range(2):
        log_init("logs/init.log", experiment="exp", out_json="results/mlflow/experiment.json")
    assert len((tmp_path / "logs/init.log").read_text().splitlines()) == 2
    with pytest.raises(ValueError, match="^log_init needs experiment, or experiment_json and group$"):
        log_init("logs/g.log", experiment_json="results/mlflow/experiment.json", out_json="x.json")


def test_the_remake_command_an_error_names_runs_as_printed_for_spaces_in_folder_or_experiment(tmp_path):
    """The command a mismatch or a reset store names is meant to be pasted: a results folder or
    an experiment name with a space ('My Drive', 'fst paper') was printed bare, and the shell
    split it into other arguments."""
    import shlex

    from fastslow.tracking import check_store, missing_experiment

    path = tmp_path / "My Drive" / "results" / "mlflow" / "parents" / "g.json"
    folder = str(path.parents[1])
    info = {"tracking_uri": f"sqlite:///{path.parents[2] / 'mlflow.db'}", "experiment": "exp", "experiment_id": "1"}
    with pytest.raises(RuntimeError) as err:
        check_store(info, {"mlflow_experiment": "fst paper"}, path)
    command = re.search(r"`([^`]*)` remakes them", str(err.value)).group(1)
    assert shlex.split(command) == [sys.executable, "-m", "fastslow.tracking", folder, "--experiment", "fst paper"]
    command = re.search(r"`([^`]*)` remakes the files", missing_experiment(info, path)).group(1)
    assert shlex.split(command) == [sys.executable, "-m", "fastslow.tracking", folder]


def test_a_failing_job_does_not_wait_out_a_store_that_is_down_to_close_its_run(tmp_path, tracking, monkeypatch):
    """The success path skipped closing the run once the store had stopped answering; the failure
    path asked again, so a job failing beside a server that is down waited out MLflow's HTTP
    retries (minutes) once more before Snakemake heard of its error."""
    from fastslow import tracking as tracking_module

    path, info = tracking
    asked: list[str] = []

    def down(*args, **kwargs):
        asked.append("call")
        raise ConnectionError("Max retries exceeded with url: /api/2.0/mlflow/runs/update")

    monkeypatch.setattr(tracking_module, "STORE_DOWN_SECONDS", 0.0)
    with pytest.raises(ValueError, match="the job's own"), \
            job_run(rule="cycle", wildcards={"cycle": "4"}, config={}, tracking_json=path) as tr:
        for name in ("log_batch", "set_tag", "set_terminated"):
            monkeypatch.setattr(tr.client, name, down)
        tr.log_metrics({"reward": 0.1})
        assert tr.down and len(asked) == 1
        raise ValueError("the job's own error")
    assert len(asked) == 1  # neither the error tag nor the close asked the store again
