"""profiles/slurm: its rendering everywhere, and the smoke DAG on a real one-node SLURM cluster.

The cluster test starts slurmctld + slurmd on 127.0.0.1 with ci/slurm/start_slurm.sh (installing
Debian's slurm-wlm and munge if missing), runs the foundation smoke DAG through
`snakemake --profile profiles/slurm`, checks that every job went through sbatch and COMPLETED, and
that every output table equals a plain local run's. It stops the daemons it started.

It is skipped, with the reason, where SLURM cannot run (not root, no apt-get, daemons fail); set
FASTSLOW_REQUIRE_SLURM=1 to make those a failure instead (.ci/run, the README's test command, does
not: a fresh machine without root still passes; pytest's -ra summary names the skip).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from test_workflow import workflow_copy

from fastslow.launch import stop_process_group

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "slurm" / "profile.yaml"
START = ROOT / "ci" / "slurm" / "start_slurm.sh"
STOP = ROOT / "ci" / "slurm" / "stop_slurm.sh"
# The foundation smoke DAG of tests/test_workflow.py plus one whole figure (Fig 7: an RL and an
# FST cycle, their evaluations, the curves table and the plot), as explicit targets: every kind of
# job (training, evaluation, tables, figures) goes through sbatch; the whole smoke DAG (114 jobs)
# runs locally in tests/test_workflow_figures.py.
TARGET = "results/tables/base_eval.parquet"
FIGURE = "results/figures/fig7.pdf"
SMOKE = [TARGET, FIGURE, "--configfile", "config/config.yaml", "config/smoke.yaml", "--config",
         "data={tasks: [math, hover, stargraph]}"]


def _timing(column: str) -> bool:
    """Columns that time a job (seconds, tokens/s, the CPU share it got) differ between any two runs;
    nothing else may."""
    return column.endswith(("seconds", "_per_s", "cpu_share"))
PARTITION = "fastslow"
# Every variable the profile reads: cleared so the developer's own settings never leak in.
PROFILE_ENV = ("FASTSLOW_SLURM_", "FASTSLOW_TRAIN_GPUS", "FASTSLOW_EVAL_GPUS", "SBATCH_ACCOUNT",
               "SBATCH_PARTITION")
# The smoke DAG's SLURM jobs (init_mlflow and init_tracking are localrules; `all` has nothing to run).
EXPECTED_JOBS = {("base_model", ""), ("task_data", "math"), ("task_data", "hover"),
                 ("task_data", "stargraph"), ("evaluate_base", "math"), ("evaluate_base", "hover"),
                 ("evaluate_base", "stargraph"), ("base_eval_table", "")}
# Fig 7's own jobs, by rule (their wildcards are run paths): RL and FST cycle 0, each evaluated.
EXPECTED_FIGURE_JOBS = {"cycle": 2, "evaluate_point": 2, "curves": 1, "figure": 1}


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(PROFILE_ENV) and k not in ("MLFLOW_TRACKING_URI", "SNAKEMAKE_PROFILE")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    return env


# --- the profile, rendered as snakemake reads it (no SLURM needed) ----------------------------------

def render_profile(monkeypatch: pytest.MonkeyPatch, **env: str) -> dict:
    from snakemake.profiles import ProfileConfigFileParser

    for key in list(os.environ):
        if key.startswith(PROFILE_ENV):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with PROFILE.open() as stream:
        return dict(ProfileConfigFileParser().parse(stream))


def resources(args: list[str]) -> dict[str, str]:
    """['a:mem_mb=1', 'runtime=2'] -> {'a:mem_mb': '1', 'runtime': '2'}"""
    return dict(item.split("=", 1) for item in args)


def test_profile_hard_codes_no_site(monkeypatch):
    prof = render_profile(monkeypatch)
    assert prof["executor"] == "slurm"
    assert prof["rerun-incomplete"] == "True" and int(prof["retries"]) >= 1
    assert prof["slurm-logdir"] == "results/logs/slurm"
    everything = json.dumps(prof)
    assert "slurm_account" not in everything and "slurm_partition" not in everything
    res = resources(prof["set-resources"])
    # GPUs for training and evaluation, none for the CPU rules
    assert res["cycle:gpu"] == "8"
    for rule in ("evaluate_base", "evaluate_point", "channel_eval", "cycle_frozen", "cycle_distill"):
        assert res[f"{rule}:gpu"] == "1", rule  # cycle_distill: FST-distill trains in one process
    assert not any(k.startswith(("base_model:gpu", "task_data:gpu")) for k in res)


def test_the_local_workflow_profile_overrides_nothing_of_the_clusters_but_cores(monkeypatch):
    """Snakemake always loads profiles/default as the workflow profile, and its keys win over
    `--profile profiles/slurm`'s: its `keep-going: false` and `latency-wait: 5` silently undid the
    cluster's keep-going and 60 s wait. It may set only what the cluster profile sets alike, and
    `cores` (the local default; profiles/slurm/README says to add `--workflow-profile none`)."""
    from snakemake.profiles import ProfileConfigFileParser

    cluster = render_profile(monkeypatch)
    with (ROOT / "profiles" / "default" / "config.yaml").open() as stream:
        local = dict(ProfileConfigFileParser().parse(stream))
    assert local.get("cores") == "all"
    # the local rules' run: blocks in Snakemake's own process, not each in a new Snakemake process
    assert local.get("force-use-threads") == cluster.get("force-use-threads") == "True"
    clash = {k: (v, cluster[k]) for k, v in local.items() if k in cluster and v != cluster[k] and k != "cores"}
    assert not clash, clash
    assert not set(local) - set(cluster) - {"cores"}, "a local key the cluster profile leaves to Snakemake"


def test_profile_takes_account_and_partitions_from_the_environment(monkeypatch):
    prof = render_profile(monkeypatch, FASTSLOW_SLURM_ACCOUNT="123456", FASTSLOW_SLURM_PARTITION="cpu",
                          FASTSLOW_SLURM_GPU_PARTITION="gpu", FASTSLOW_SLURM_GPU_MODEL="h100",
                          FASTSLOW_TRAIN_GPUS="4", FASTSLOW_SLURM_QOS="high")
    default = resources(prof["default-resources"])
    # quoted: a numeric account stays a string, a partition named e.g. `all` is not Python's all()
    assert default["slurm_account"] == "'123456'" and default["slurm_partition"] == "'cpu'"
    res = resources(prof["set-resources"])
    for rule in ("cycle", "cycle_frozen", "cycle_distill", "evaluate_base", "evaluate_point", "channel_eval"):
        assert res[f"{rule}:slurm_partition"] == "'gpu'" and res[f"{rule}:gpu_model"] == "'h100'"
    assert res["cycle:gpu"] == "4"
    assert prof["slurm-qos"] == "high"


def test_profile_falls_back_to_sbatch_variables(monkeypatch):
    prof = render_profile(monkeypatch, SBATCH_ACCOUNT="proj", SBATCH_PARTITION="batch")
    default = resources(prof["default-resources"])
    assert default["slurm_account"] == "'proj'" and default["slurm_partition"] == "'batch'"
    assert resources(prof["set-resources"])["cycle:slurm_partition"] == "'batch'"


def test_profile_requests_are_capped_to_the_node(monkeypatch):
    prof = render_profile(monkeypatch, FASTSLOW_SLURM_MAX_CPUS="2", FASTSLOW_SLURM_MAX_MEM_MB="3000",
                          FASTSLOW_SLURM_MAX_GPUS="0")
    assert all(int(v) <= 2 for v in resources(prof["set-threads"]).values())
    res = {**resources(prof["default-resources"]), **resources(prof["set-resources"])}
    assert not any(k.endswith(":gpu") for k in res)
    for key, expr in res.items():
        if key.endswith("mem_mb"):
            assert all(eval(expr, {"attempt": a}) <= 3000 for a in (1, 2, 3)), key  # noqa: S307


def test_profile_runtime_grows_with_attempt(monkeypatch):
    prof = render_profile(monkeypatch)
    res = {**resources(prof["default-resources"]), **resources(prof["set-resources"])}
    runtimes = {k: v for k, v in res.items() if k.endswith("runtime")}
    assert {"runtime", "cycle:runtime", "evaluate_base:runtime"} <= set(runtimes)
    for key, expr in runtimes.items():
        minutes = [eval(expr, {"attempt": a}) for a in (1, 2, 3)]  # noqa: S307 - as snakemake does
        assert minutes[0] > 0 and minutes == sorted(set(minutes)), (key, minutes)


def test_profile_passes_node_constraints_as_the_plugins_resource(monkeypatch):
    """sbatch -C goes through the plugin's `constraint` resource: the plugin refuses it (and every
    flag it sets itself) in `slurm_extra`, so the documented FASTSLOW_SLURM_EXTRA examples must be
    flags it leaves alone."""
    validation = pytest.importorskip("snakemake_executor_plugin_slurm.validation")
    from snakemake_interface_common.exceptions import WorkflowError

    prof = render_profile(monkeypatch, FASTSLOW_SLURM_CONSTRAINT="ib", FASTSLOW_SLURM_EXTRA="--exclusive")
    default = resources(prof["default-resources"])
    assert default["constraint"] == "'ib'" and default["slurm_extra"] == "'--exclusive'"

    def check(extra: str) -> None:
        validation.validate_slurm_extra(SimpleNamespace(resources=SimpleNamespace(slurm_extra=extra)))

    docs = {"profile.yaml": PROFILE.read_text(), "README.md": (PROFILE.parent / "README.md").read_text()}
    examples = {}
    for name, text in docs.items():
        line = next(ln for ln in text.splitlines() if "FASTSLOW_SLURM_EXTRA" in ln and "e.g." in ln)
        following = text[text.index(line):].split("\n", 2)[:2]  # an example may wrap to the next line
        examples[name] = re.findall(r"[\"`](--[^\"`]+)[\"`]", " ".join(following))
        assert examples[name], (name, line)
        for extra in examples[name]:
            check(extra)
    with pytest.raises(WorkflowError, match="node constraints"):
        check("--constraint=ib")  # what the docs used to suggest


def test_fsdp2_config_points_at_a_config_key_that_exists():
    """The FSDP2 config leaves activation checkpointing to the trainer: the key it names is one
    the config schema takes."""
    from fastslow.config import load_schema

    text = (PROFILE.parent / "accelerate" / "fsdp2.yaml").read_text()
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("fsdp_activation_checkpointing"))
    key = re.search(r"slow\.(\w+)", line).group(1)
    assert key == "activation_checkpointing"
    assert key in load_schema()["properties"]["slow"]["properties"]


@pytest.mark.workflow
def test_dry_run_with_slurm_profile_on_paper_config(tmp_path):
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="pip install snakemake-executor-plugin-slurm")
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--profile", str(PROFILE.parent),
                          "--configfile", "config/paper.yaml",
                          "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=_clean_env())
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    evaluate = text[text.index("rule evaluate_base:"):]
    assert re.search(r"resources: .*runtime=60, gpu=1", evaluate.split("\n\n")[0])
    assert re.search(r"^total\s+\d+", text, re.M), "no job count"
    print(f"dry-run with profiles/slurm: {time.monotonic() - t0:.1f} s")


# --- a real cluster ------------------------------------------------------------------------------------

def _unavailable(reason: str):
    if os.environ.get("FASTSLOW_REQUIRE_SLURM") == "1":
        pytest.fail(f"SLURM required (FASTSLOW_REQUIRE_SLURM=1) but unavailable: {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm_cluster():
    """A one-node cluster on 127.0.0.1, stopped (by pid file) after the module's tests."""
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        _unavailable("snakemake-executor-plugin-slurm is not installed")
    if os.geteuid() != 0:
        _unavailable("starting slurmctld/slurmd (and installing SLURM) needs root")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        _unavailable("SLURM is not installed and there is no apt-get to install it")
    # short path: slurmd puts step sockets under its spool dir (unix socket paths are <= 107 bytes)
    state = Path(tempfile.mkdtemp(prefix="fss-", dir="/tmp"))
    env = _clean_env(FASTSLOW_SLURM_DIR=str(state), FASTSLOW_SLURM_PARTITION=PARTITION,
                     FASTSLOW_SLURMCTLD_PORT=str(_free_port()), FASTSLOW_SLURMD_PORT=str(_free_port()))
    stop = lambda: subprocess.run(["bash", str(STOP)], env=env, capture_output=True, text=True,  # noqa: E731
                                  timeout=120)
    try:
        out = subprocess.run(["bash", str(START)], env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        stop()
        _unavailable("start_slurm.sh did not finish in 900 s")
    if out.returncode != 0:
        stop()
        _unavailable(f"cannot start SLURM here (start_slurm.sh exit {out.returncode}): "
                     f"{out.stderr.strip()[-1500:]}")
    print(out.stderr.strip())
    try:
        yield SimpleNamespace(state=state, conf=state / "slurm.conf", env=env)
    finally:
        print(stop().stderr.strip())
        shutil.rmtree(state, ignore_errors=True)


def _run(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (snakemake then scancels its SLURM jobs), SIGKILL after 30 s."""
    stop_process_group(proc)


def _tables(results: Path) -> dict[str, pl.DataFrame]:
    tables = {}
    for p in sorted(results.rglob("*.parquet")):
        if "mlartifacts" not in p.parts:
            df = pl.read_parquet(p)
            tables[str(p.relative_to(results))] = df.drop([c for c in df.columns if _timing(c)])
    return tables


@pytest.mark.workflow
@pytest.mark.slow
def test_smoke_dag_through_slurm_matches_local_run(slurm_cluster, tmp_path):
    local, remote = workflow_copy(tmp_path / "local"), workflow_copy(tmp_path / "slurm")
    snakemake = [sys.executable, "-m", "snakemake"]  # the repo's venv: sbatch jobs reuse this python
    # One CPU per SLURM job, so two jobs share the two-core test node; the local reference run
    # uses two threads: outputs must not depend on where or on how many threads a job ran. Nor on
    # Python's string hashing (set iteration order): the builds hash strings differently (sbatch
    # passes the environment on, --export=ALL).
    slurm_env = _clean_env(SLURM_CONF=str(slurm_cluster.conf), FASTSLOW_SLURM_PARTITION=PARTITION,
                           FASTSLOW_SLURM_MAX_CPUS="1", FASTSLOW_SLURM_MAX_MEM_MB="2000",
                           FASTSLOW_SLURM_MAX_GPUS="0", PYTHONHASHSEED="1")
    # This cluster has no accounting database: job states come from squeue (MinJobAge = 1 h),
    # and no account is set (the plugin would validate it with sacctmgr).
    t0 = time.monotonic()
    remote_proc = _run([*snakemake, "--profile", "profiles/slurm", *SMOKE, "--slurm-status-command", "squeue",
                        "--slurm-init-seconds-before-status-checks", "2"], remote, slurm_env,
                       tmp_path / "slurm.log")
    local_proc = _run([*snakemake, "--cores", "2", *SMOKE], local, _clean_env(PYTHONHASHSEED="2"),
                      tmp_path / "local.log")
    try:
        rc_local = local_proc.wait(timeout=900)
        rc_remote = remote_proc.wait(timeout=max(60.0, 900 - (time.monotonic() - t0)))
    finally:  # a timeout or an interrupt leaves no snakemake (or SLURM job) behind
        _stop(local_proc)
        _stop(remote_proc)
    elapsed = time.monotonic() - t0
    slurm_log = (tmp_path / "slurm.log").read_text()
    assert rc_local == 0, (tmp_path / "local.log").read_text()[-4000:]
    assert rc_remote == 0, slurm_log[-6000:]

    # every job went through sbatch: one submission per job, and SLURM says COMPLETED
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+) \(log: (\S+)\)\.", slurm_log)
    jobs = {}
    for jobid, logfile in submitted:
        parts = Path(logfile).relative_to(remote / "results/logs/slurm").parts  # rule_<r>/[<wc>/]<id>.log
        rule = parts[0].removeprefix("rule_")
        wildcards = "/".join(parts[1:-1])
        jobs[jobid] = (rule, re.sub(r"^task=", "", wildcards) if wildcards else "")
        assert Path(logfile).is_file(), logfile
        assert sys.executable.rsplit("/bin/", 1)[0] in Path(logfile).read_text()  # ran the repo's venv
    figure_jobs = {j for j in jobs.values() if j[0] in EXPECTED_FIGURE_JOBS}
    assert sorted(set(jobs.values()) - figure_jobs) == sorted(EXPECTED_JOBS), slurm_log[-4000:]
    assert Counter(rule for rule, _ in figure_jobs) == EXPECTED_FIGURE_JOBS, sorted(figure_jobs)
    comp = (slurm_cluster.state / "jobcomp.log").read_text()  # jobcomp/filetxt: one line per finished job
    records = {}
    for line in comp.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobId" in fields:
            records[fields["JobId"]] = fields
    squeue = subprocess.run(["squeue", "--states=all", "-h", "-o", "%i|%T"], env=slurm_env,
                            capture_output=True, text=True, timeout=30).stdout
    for jobid in jobs:
        assert records.get(jobid, {}).get("JobState") == "COMPLETED", (jobid, jobs[jobid], comp)
        assert records[jobid]["Partition"] == PARTITION
        assert f"{jobid}|COMPLETED" in squeue
    print(f"SLURM run {elapsed:.0f} s (local reference run alongside)")
    for jobid, (rule, wc) in sorted(jobs.items(), key=lambda kv: int(kv[0])):
        r = records[jobid]
        print(f"  sbatch job {jobid:>4}  {rule + ('[' + wc + ']' if wc else ''):22s} {r['JobState']:9s} "
              f"partition={r['Partition']} {r['Tres']} {r['StartTime']} -> {r['EndTime'][11:]} "
              f"exit={r['ExitCode']}")

    # identical outputs: every Parquet table by content, every summary, the model's files; less
    # the MLflow run ids the tables and summaries name (each job's own run, a new one each build)
    local_tables, remote_tables = _tables(local / "results"), _tables(remote / "results")
    run_ids = ("mlflow_run_id", "eval_run_id", "cycle_run_id")
    assert sorted(local_tables) == sorted(remote_tables)
    assert {"tables/base_eval.parquet", "eval/base/math.samples.parquet", "data/hover/val.parquet"} \
        <= set(local_tables)
    for name, table in local_tables.items():
        ids = [c for c in run_ids if c in table.columns]
        assert_frame_equal(table.drop(ids), remote_tables[name].drop(ids), check_exact=True)
    assert (remote / FIGURE).read_bytes()[:5] == b"%PDF-"
    assert {"tables/curves/stargraph.parquet"} <= set(local_tables)
    assert any(name.endswith("cycle0/rollouts.parquet") for name in local_tables)
    for task in ("math", "hover", "stargraph"):
        summary = f"results/eval/base/{task}.json"
        here, there = (json.loads((d / summary).read_text()) for d in (local, remote))
        assert here.pop("mlflow_run_id") != there.pop("mlflow_run_id") and here == there
    model = Path("results/models/tiny-random")
    files = sorted(p.name for p in (local / model).iterdir() if not p.name.startswith("."))
    assert files and files == sorted(p.name for p in (remote / model).iterdir() if not p.name.startswith("."))
    for name in files:
        assert (local / model / name).read_bytes() == (remote / model / name).read_bytes(), name

    # and every job's MLflow run closed FINISHED
    from mlflow.tracking import MlflowClient

    info = json.loads((remote / "results/mlflow/experiment.json").read_text())
    runs = MlflowClient(info["tracking_uri"]).search_runs([info["experiment_id"]])
    job_runs = [r for r in runs if "fastslow.job" in r.data.tags]
    assert len(job_runs) == len(EXPECTED_JOBS) + sum(EXPECTED_FIGURE_JOBS.values())
    assert {r.info.status for r in job_runs} == {"FINISHED"}


def test_a_bad_or_misspelt_profile_variable_stops_snakemake_naming_it(monkeypatch):
    """A count that is no number stopped the profile with int()'s message, naming no variable;
    a misspelt FASTSLOW_SLURM_* name was ignored (FASTSLOW_SLURM_GPU_PARTITON: every GPU job in
    the CPU partition). Both now stop snakemake in a message naming the variable."""
    from snakemake.profiles import ConfigFileParserException

    for env, says in (({"FASTSLOW_TRAIN_GPUS": "abc"}, "FASTSLOW_TRAIN_GPUS must be a whole number >= 0"),
                      ({"FASTSLOW_SLURM_MAX_MEM_MB": "400G"}, "FASTSLOW_SLURM_MAX_MEM_MB must be a whole number"),
                      ({"FASTSLOW_SLURM_GPU_PARTITON": "gpu"}, "unknown variable(s) FASTSLOW_SLURM_GPU_PARTITON;")):
        with pytest.raises(ConfigFileParserException) as err:
            render_profile(monkeypatch, **env)
        assert says in str(err.value), str(err.value)
        for key in env:
            monkeypatch.delenv(key)
    # the test cluster's own variables (ci/slurm) are no profile variables, and no misspelling
    prof = render_profile(monkeypatch, FASTSLOW_SLURM_DIR="/tmp/x", FASTSLOW_SLURM_MAX_GPUS="4")
    assert "cycle:gpu=4" in prof["set-resources"]
