"""profiles/slurm: its rendering everywhere; and the real one-node SLURM cluster its test runs on.

That test is `test_smoke_dag_through_slurm_matches_local_run` in tests/test_workflow_figures.py: it
starts slurmctld + slurmd on 127.0.0.1 with ci/slurm/start_slurm.sh (installing Debian's slurm-wlm
and munge if missing), runs the foundation smoke DAG and Fig 7 through
`snakemake --profile profiles/slurm` while the every-figure DAG builds the same files locally beside
it, checks that every job went through sbatch and COMPLETED, and that every table it wrote equals the
local build's. It stops the daemons it started.

It is skipped, with the reason, where SLURM cannot run (not root, no apt-get, daemons fail); set
FASTSLOW_REQUIRE_SLURM=1 to make those a failure instead (.ci/run, the README's test command, does
not: a fresh machine without root still passes; pytest's -ra summary names the skip).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
from ports import free_port

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "slurm" / "profile.yaml"
START = ROOT / "ci" / "slurm" / "start_slurm.sh"
STOP = ROOT / "ci" / "slurm" / "stop_slurm.sh"
# The foundation smoke DAG on stargraph (base model, its task data and base evaluation, the table)
# plus one whole figure (Fig 7: an RL and an
# FST cycle, their evaluations, the curves table and the plot), as explicit targets: every kind of
# job (training, evaluation, tables, figures) goes through sbatch. The whole smoke DAG (115 jobs),
# built locally beside it, is its reference (tests/test_workflow_figures.py).
TARGET = "results/tables/base_eval.parquet"
FIGURE = "results/figures/fig7.pdf"
SLURM_TASKS = ("stargraph",)  # Fig 7's task: each SLURM job is a Snakemake process and a script (~10 CPU-s)
SLURM_SMOKE = [TARGET, FIGURE, "--configfile", "config/config.yaml", "config/smoke.yaml", "--config",
               f"data={{tasks: [{', '.join(SLURM_TASKS)}]}}"]


def _timing(column: str) -> bool:
    """Columns that time a job (seconds, tokens/s, the CPU share it got) differ between any two runs;
    nothing else may."""
    return column.endswith(("seconds", "_per_s", "cpu_share"))


PARTITION = "fastslow"
# Every variable the profile reads: cleared so the developer's own settings never leak in.
PROFILE_ENV = ("FASTSLOW_SLURM_", "FASTSLOW_TRAIN_GPUS", "FASTSLOW_EVAL_GPUS", "SBATCH_ACCOUNT",
               "SBATCH_PARTITION")
# The smoke DAG's SLURM jobs (init_mlflow and init_tracking are localrules, as final_weights; `all` has nothing to run).
EXPECTED_JOBS = {("base_model", ""), ("task_data", "stargraph"), ("evaluate_base", "stargraph"),
                 ("base_eval_table", "")}
# Fig 7's own jobs, by rule (their wildcards are run paths): RL and FST cycle 0, each evaluated.
EXPECTED_FIGURE_JOBS = {"cycle": 2, "evaluate_point": 2, "curves": 1, "figure": 1}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(PROFILE_ENV) and k not in ("MLFLOW_TRACKING_URI", "SNAKEMAKE_PROFILE",
                                                          "FASTSLOW_SQLITE_ON_CLUSTER")}
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
    assert res["cycle:gpu"] == res["cycle_distill:gpu"] == "8"  # FST-distill shards as the RL steps do
    for rule in ("evaluate_base", "evaluate_point", "channel_eval", "cycle_frozen"):
        assert res[f"{rule}:gpu"] == "1", rule
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
    assert res["cycle:gpu"] == res["cycle_distill:gpu"] == "4"
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
    pytest.importorskip("snakemake_executor_plugin_slurm")  # the plugin absent: a skip; a module of it renamed: a failure
    from snakemake_executor_plugin_slurm import validation
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


def test_a_gpu_job_is_one_task_holding_all_its_gpus(monkeypatch):
    """An 8-GPU cycle is one SLURM task (accelerate starts the ranks inside it) with the cycle's
    threads as its CPUs. The GPU set pins plugin 2.6.x, which adds --ntasks-per-gpu=1 to a GPU job
    unless `tasks_per_gpu` (or `tasks`) is set, and skips it for 0: 8 tasks of 64 CPUs, 512 CPUs no
    node has. So every GPU rule sets `tasks_per_gpu: 0`; the installed plugin (2.7+, which adds the
    flag only when asked) builds the submit command from it as below."""
    pytest.importorskip("snakemake_executor_plugin_slurm")
    from snakemake_executor_plugin_slurm import submit_string as submit
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    prof = render_profile(monkeypatch, FASTSLOW_TRAIN_GPUS="8", FASTSLOW_EVAL_GPUS="2",
                          FASTSLOW_SLURM_GPU_MODEL="h100")
    res = resources(prof["set-resources"])
    threads = resources(prof["set-threads"])
    gpu_rules = sorted(k.split(":")[0] for k in res if k.endswith(":gpu"))
    assert gpu_rules == ["channel_eval", "cycle", "cycle_distill", "cycle_frozen", "evaluate_base", "evaluate_point"]
    assert {rule: res.get(f"{rule}:tasks_per_gpu") for rule in gpu_rules} == dict.fromkeys(gpu_rules, "0")

    class Resources(dict):
        __getattr__ = dict.__getitem__

    rule = "cycle"
    values = {k.split(":", 1)[1]: v for k, v in res.items() if k.startswith(f"{rule}:")}
    job = SimpleNamespace(
        resources=Resources(gpu=int(values["gpu"]), gpu_model=eval(values["gpu_model"]),  # noqa: S307
                            tasks_per_gpu=int(values["tasks_per_gpu"]), runtime=120, mem_mb=64000),
        threads=int(threads[rule]), is_group=lambda: False, name=rule)
    params = {"run_uuid": "u", "slurm_logfile": "l", "comment_str": "c", "account": "", "partition": "",
              "workdir": ""}
    call = submit.get_submit_command(job, params) + set_gres_string(job)
    assert "--ntasks" not in call and "--cpus-per-task=64" in call and "--gpus=h100:8" in call, call


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
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=clean_env())
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout + out.stderr
    def resources_of(rule: str) -> str:  # the first job's resources line
        return re.search(rf"^rule {rule}:\n(?:    .*\n)*?    resources: (.*)$", text, re.M).group(1)

    assert resources_of("evaluate_base").endswith("runtime=60, gpu=1, tasks_per_gpu=0")  # one task, all its GPUs
    assert resources_of("cycle").endswith("runtime=120, gpu=8, tasks_per_gpu=0")
    assert resources_of("cycle_distill").endswith("runtime=120, gpu=8, tasks_per_gpu=0")  # Fig 8's: sharded as RL's
    assert re.search(r"^total\s+\d+", text, re.M), "no job count"
    print(f"dry-run with profiles/slurm: {time.monotonic() - t0:.1f} s")


@pytest.mark.workflow
def test_a_cluster_run_on_the_embedded_sqlite_store_stops_before_any_job(tmp_path):
    """Jobs on a cluster's nodes must not share results/mlflow.db (SQLite's locks do not hold over
    a network file system): the README said so, nothing stopped it, and jobs failed at their
    runs' creation hours in. The run stops before any job, in one line; a dry run is not stopped,
    nor is a server's URI or FASTSLOW_SQLITE_ON_CLUSTER=1 (one node)."""
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="pip install snakemake-executor-plugin-slurm")
    from fastslow.tracking import cluster_store_error

    out = subprocess.run([sys.executable, "-m", "snakemake", "results/tables/base_eval.parquet", "--profile",
                          str(PROFILE.parent), "--workflow-profile", "none", "--configfile", "config/config.yaml",
                          "config/smoke.yaml", "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=clean_env())
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == cluster_store_error("slurm", f"sqlite:///{tmp_path}/results/mlflow.db")
    assert "the slurm executor runs jobs on the cluster's nodes, which must not share the SQLite store" in out.stderr
    assert not (tmp_path / "results" / "mlflow").exists()  # not even the local MLflow jobs ran
    assert cluster_store_error("slurm", "http://login01:5000") is None


def test_a_cluster_run_with_the_local_profiles_cores_stops_before_any_job(tmp_path):
    """Without `--workflow-profile none`, profiles/default's `cores: all` wins over the SLURM
    profile's and caps every job's threads (and --cpus-per-task) at the submit host's cores: a dry
    run showed an 8-GPU cycle with 2 threads. The run stops before any job, naming the flag."""
    pytest.importorskip("snakemake_executor_plugin_slurm", reason="pip install snakemake-executor-plugin-slurm")
    from snakemake.utils import available_cpu_count

    from fastslow.hardware import cluster_cores_error
    from fastslow.tracking import cluster_store_error

    out = subprocess.run([sys.executable, "-m", "snakemake", "results/tables/base_eval.parquet", "--profile",
                          str(PROFILE.parent), "--configfile", "config/config.yaml", "config/smoke.yaml",
                          "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=clean_env())
    assert out.returncode == 1, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == cluster_cores_error("slurm", available_cpu_count(),
                                                                        available_cpu_count())
    assert "add --workflow-profile none" in out.stderr
    assert not (tmp_path / "results" / "mlflow").exists()
    # not stopped for cores: a cluster run given no cores number (Snakemake leaves it unset, and
    # reading it raised), nor one naming a workflow profile with --cores this host's; each goes on
    # to the next check, the SQLite store's
    for flags in (["--executor", "slurm", "--jobs", "2", "--workflow-profile", "none"],
                  ["--profile", str(PROFILE.parent), "--workflow-profile", "none", "--cores", str(available_cpu_count())]):
        out = subprocess.run([sys.executable, "-m", "snakemake", "results/tables/base_eval.parquet", *flags,
                              "--configfile", "config/config.yaml", "config/smoke.yaml", "--directory", str(tmp_path),
                              "--snakefile", str(ROOT / "Snakefile")],
                             cwd=ROOT, capture_output=True, text=True, timeout=300, env=clean_env())
        assert out.returncode == 1, out.stderr[-2000:]
        assert out.stderr.strip().splitlines()[-1] == cluster_store_error(
            "slurm", f"sqlite:///{tmp_path}/results/mlflow.db"), (flags, out.stderr[-2000:])
    assert cluster_cores_error("slurm", 512, 2) is None and cluster_cores_error("slurm", None, 2) is None
    assert cluster_cores_error("slurm", 2, 2, ["--workflow-profile=mine"]) is None


def test_one_node_may_share_the_sqlite_store(monkeypatch):
    from fastslow.tracking import cluster_store_error

    assert cluster_store_error("slurm", "sqlite:////shared/results/mlflow.db").startswith("the slurm executor")
    monkeypatch.setenv("FASTSLOW_SQLITE_ON_CLUSTER", "1")
    assert cluster_store_error("slurm", "sqlite:////shared/results/mlflow.db") is None


# --- a real cluster (its test is in test_workflow_figures.py: the every-figure DAG is its reference) ---

class SlurmUnavailable(Exception):
    """Why SLURM cannot run here."""


def unavailable(reason: str):
    """Skip with `reason`; fail instead under FASTSLOW_REQUIRE_SLURM=1."""
    if os.environ.get("FASTSLOW_REQUIRE_SLURM") == "1":
        pytest.fail(f"SLURM required (FASTSLOW_REQUIRE_SLURM=1) but unavailable: {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def slurm_cluster() -> Iterator[SimpleNamespace]:
    """A one-node cluster on 127.0.0.1, stopped (by pid file) on leaving; SlurmUnavailable says
    why there is none."""
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        raise SlurmUnavailable("snakemake-executor-plugin-slurm is not installed") from None
    if os.geteuid() != 0:
        raise SlurmUnavailable("starting slurmctld/slurmd (and installing SLURM) needs root")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        raise SlurmUnavailable("SLURM is not installed and there is no apt-get to install it")
    # short path: slurmd puts step sockets under its spool dir (unix socket paths are <= 107 bytes)
    state = Path(tempfile.mkdtemp(prefix="fss-", dir="/tmp"))
    env = clean_env(FASTSLOW_SLURM_DIR=str(state), FASTSLOW_SLURM_PARTITION=PARTITION,
                    FASTSLOW_SLURMCTLD_PORT=str(free_port()), FASTSLOW_SLURMD_PORT=str(free_port()))

    def stop() -> None:
        out = subprocess.run(["bash", str(STOP)], env=env, capture_output=True, text=True, timeout=120)
        print(out.stderr.strip())
        shutil.rmtree(state, ignore_errors=True)

    try:
        out = subprocess.run(["bash", str(START)], env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        stop()
        raise SlurmUnavailable("start_slurm.sh did not finish in 900 s") from None
    if out.returncode != 0:
        stop()
        raise SlurmUnavailable(f"cannot start SLURM here (start_slurm.sh exit {out.returncode}): "
                               f"{out.stderr.strip()[-1500:]}")
    print(out.stderr.strip())
    try:
        yield SimpleNamespace(state=state, conf=state / "slurm.conf", env=env)
    finally:
        stop()


def start_logged(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """`cmd` in its own process group (stop_process_group stops it and its children), output to `log`."""
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def tables(results: Path, names: list[str] | None = None) -> dict[str, pl.DataFrame]:
    """The Parquet tables under `results` (or those `names`), less the columns that time a job."""
    paths = [results / n for n in names] if names is not None else sorted(results.rglob("*.parquet"))
    out = {}
    for p in paths:
        if "mlartifacts" not in p.parts:
            df = pl.read_parquet(p)
            out[str(p.relative_to(results))] = df.drop([c for c in df.columns if _timing(c)])
    return out


def test_a_bad_or_misspelt_profile_variable_stops_snakemake_naming_it(monkeypatch):
    """A count that is no number stopped the profile with int()'s message, naming no variable;
    a misspelt FASTSLOW_SLURM_* name was ignored (FASTSLOW_SLURM_GPU_PARTITON: every GPU job in
    the CPU partition), and so was a misspelt GPU count (FASTSLOW_TRAIN_GPU: 8 GPUs a cycle). All
    now stop snakemake in a message naming the variable."""
    from snakemake.profiles import ConfigFileParserException

    for env, says in (({"FASTSLOW_TRAIN_GPUS": "abc"}, "FASTSLOW_TRAIN_GPUS must be a whole number >= 0"),
                      ({"FASTSLOW_SLURM_MAX_MEM_MB": "400G"}, "FASTSLOW_SLURM_MAX_MEM_MB must be a whole number"),
                      # no node has 0 CPUs or 0 MB (sbatch --mem=0 is a whole node's memory)
                      ({"FASTSLOW_SLURM_MAX_MEM_MB": "0"}, "FASTSLOW_SLURM_MAX_MEM_MB must be a whole number >= 1"),
                      ({"FASTSLOW_SLURM_MAX_CPUS": "0"}, "FASTSLOW_SLURM_MAX_CPUS must be a whole number >= 1"),
                      ({"FASTSLOW_SLURM_GPU_PARTITON": "gpu"}, "unknown variable(s) FASTSLOW_SLURM_GPU_PARTITON;"),
                      ({"FASTSLOW_TRAIN_GPU": "2"}, "unknown variable(s) FASTSLOW_TRAIN_GPU;")):
        with pytest.raises(ConfigFileParserException) as err:
            render_profile(monkeypatch, **env)
        assert says in str(err.value), str(err.value)
        for key in env:
            monkeypatch.delenv(key)
    # the test cluster's own variables (ci/slurm) are no profile variables, and no misspelling
    prof = render_profile(monkeypatch, FASTSLOW_SLURM_DIR="/tmp/x", FASTSLOW_SLURM_MAX_GPUS="4")
    assert "cycle:gpu=4" in prof["set-resources"]
    # 0 GPUs is a CPU-only cluster: no job asks for one
    assert not [r for r in render_profile(monkeypatch, FASTSLOW_SLURM_MAX_GPUS="0")["set-resources"] if ":gpu=" in r]
