"""The whole smoke DAG: every figure, table and report from a tiny random model; and, beside it,
the foundation smoke DAG and Fig 7 through a real one-node SLURM cluster, checked against it.

In its own file so that, under `pytest -n 2 --dist loadfile`, these ~8 minutes run on one worker;
xdist starts the file among the last, when the rest is nearly done (tests/conftest.py). The SLURM
build runs while the every-figure DAG builds locally: its jobs mostly wait for the plugin's status
checks, and the local DAG, which builds the same files, is its reference (a separate local build of
its jobs, ~10 s of start-up each, is gone).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from test_slurm import (
    EXPECTED_FIGURE_JOBS,
    EXPECTED_JOBS,
    FIGURE,
    PARTITION,
    SLURM_SMOKE,
    SLURM_TASKS,
    SlurmUnavailable,
    clean_env,
    slurm_cluster,
    start_logged,
    tables,
    unavailable,
)
from test_workflow import ROOT, SMOKE, snakemake, workflow_copy

from fastslow.launch import stop_process_group
from fastslow.records import METRIC_COLUMNS

FIGURES = [f"results/figures/fig{n}.pdf" for n in (2, 3, 4, 5, 6, 7, 8, 9, 10, 11)]


@pytest.fixture(scope="module")
def slurm_build(tmp_path_factory):
    """The SLURM build, started before the every-figure DAG and stopped (with its SLURM jobs) after
    the module; or, as `unavailable`, why SLURM cannot run here, or, as `error`, what broke its
    start (it fails the SLURM test, not the every-figure DAG beside it)."""
    with contextlib.ExitStack() as stack:
        try:
            cluster = stack.enter_context(slurm_cluster())
            remote = workflow_copy(tmp_path_factory.mktemp("slurm") / "wf")
            # One CPU per SLURM job, so two jobs share the two-core test node; the local reference
            # build uses two threads: outputs must not depend on where or on how many threads a
            # job ran. Nor on Python's string hashing (set iteration order): the builds hash
            # strings differently (sbatch passes the environment on, --export=ALL).
            # The cluster is this one node: its jobs may share the embedded SQLite store.
            env = clean_env(SLURM_CONF=str(cluster.conf), FASTSLOW_SLURM_PARTITION=PARTITION,
                            FASTSLOW_SLURM_MAX_CPUS="1", FASTSLOW_SLURM_MAX_MEM_MB="2000",
                            FASTSLOW_SLURM_MAX_GPUS="0", PYTHONHASHSEED="1", FASTSLOW_SQLITE_ON_CLUSTER="1")
            # This cluster has no accounting database: job states come from squeue (MinJobAge =
            # 1 h), and no account is set (the plugin would validate it with sacctmgr). The repo's
            # venv: sbatch jobs reuse this python.
            log = remote.parent / "slurm.log"
            # --workflow-profile none, as profiles/slurm/README says: without it profiles/default's
            # `cores: all` caps every job's threads at this host's (the run stops, in one line)
            proc = start_logged([sys.executable, "-m", "snakemake", "--profile", "profiles/slurm",
                                 "--workflow-profile", "none", *SLURM_SMOKE,
                                 "--slurm-status-command", "squeue", "--slurm-init-seconds-before-status-checks",
                                 "2"], remote, env, log)
            # SIGTERM (snakemake then scancels its SLURM jobs), SIGKILL after 30 s: a timeout or
            # an interrupt leaves no snakemake or SLURM job behind; then the daemons stop
            stack.callback(stop_process_group, proc)
        except SlurmUnavailable as err:
            yield SimpleNamespace(unavailable=str(err), error=None)
            return
        except Exception as err:  # noqa: BLE001 - reported by the SLURM test
            yield SimpleNamespace(unavailable=None, error=f"starting the SLURM build: {type(err).__name__}: {err}")
            return
        yield SimpleNamespace(unavailable=None, error=None, cluster=cluster, env=env, proc=proc, remote=remote,
                              log=log, started=time.monotonic())


@pytest.fixture(scope="module")
def every_figure(tmp_path_factory, request):
    """The default target (`all`) of the smoke config, built from nothing in a fresh copy of the
    workflow, base model and task data included: the directory, snakemake's result and the
    environment it ran in (for the test's later commands). When the SLURM test is to run, its
    build starts first and runs beside this one."""
    if any(item.name == test_smoke_dag_through_slurm_matches_local_run.__name__ for item in request.session.items):
        request.getfixturevalue("slurm_build")
    work = workflow_copy(tmp_path_factory.mktemp("every") / "wf")
    env = clean_env(PYTHONHASHSEED="2")
    # 976 s in the suite on a slow day with nothing beside it (2026-12-07); past the old timeout,
    # 1500 s, with two other test runs beside it. The timeout only catches a hung run (it says how
    # far the run got): CI's budget is 90 minutes.
    return work, snakemake("--cores", "2", *SMOKE, cwd=work, timeout=2400, env=env), env


@pytest.mark.workflow
@pytest.mark.slow
def test_smoke_builds_every_figure_and_table(every_figure, tmp_path):
    """Every figure, the claims and channel tables and the pool reports, from a tiny random model:
    the whole DAG (about 110 jobs) really runs, and the figure jobs record what they plotted."""
    work, out, env = every_figure
    assert out.returncode == 0, out.stderr[-6000:]
    for fig in FIGURES:
        pdf, png = work / fig, work / fig.replace(".pdf", ".png")
        assert pdf.read_bytes()[:5] == b"%PDF-" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", fig
    claims = pl.read_csv(work / "results/tables/claims.csv")
    assert claims.height >= 5 and {"claim", "measured", "paper", "runs"} <= set(claims.columns)
    # Fig 7's, Fig 10's and forgetting's rows come from their own experiments' tables
    assert {"zero_reward_escape", "reuse_speedup", "continual_forgetting"} <= set(claims["claim"])
    # one figure's claims, from its own tables: one job on what `all` built, the table's Fig 7 rows
    out = snakemake("--cores", "1", "results/tables/claims/fig7.csv", *SMOKE, cwd=work, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "rule figure_claims:" in out.stderr and "rule cycle:" not in out.stderr
    fig7 = pl.read_csv(work / "results/tables/claims/fig7.csv")
    assert fig7["claim"].to_list() == ["zero_reward_escape"]
    assert fig7.equals(claims.filter(pl.col("figures") == "fig7"), null_equal=True)
    assert pl.read_csv(work / "results/tables/channels.csv").height >= 1
    assert sorted(p.name for p in (work / "results/reports/pools").glob("*.html"))
    # Fig 10's no-reuse run is efficiency's FST math run: trained once, read under its own labels
    reuse = pl.read_parquet(work / "results/tables/curves/reuse.parquet")
    no_reuse = reuse.filter(pl.col("variant") == "no_reuse")
    assert set(no_reuse["run"]) == {"efficiency/fst/math-default-s0"} and set(no_reuse["experiment"]) == {"reuse"}
    assert no_reuse.filter(pl.col("cycle") >= 0)["cycle_seconds"].min() > 0
    assert 0 < reuse.filter(pl.col("cycle") >= 0)["cycle_cpu_share"].min()  # the CPU its cycles got
    # a samples axis: each run's count grows with its points, and FST's round samples beyond RL's steps
    eff = pl.read_parquet(work / "results/tables/curves/efficiency.parquet").filter(pl.col("eval_task") == "math")
    for run in eff["run"].unique():
        counts = eff.filter(pl.col("run") == run).sort("step")["rollouts_sampled"].to_list()
        assert counts[0] == 0 and all(a < b for a, b in itertools.pairwise(counts)), (run, counts)
    last = eff.filter(pl.col("step") == eff["step"].max())
    assert last.filter(pl.col("method") == "fst")["rollouts_sampled"].min() > \
        last.filter(pl.col("method") == "rl")["rollouts_sampled"].max(), last
    # the tiny model's rounds accept no context, so FST-distill's teacher is its student: it says so
    distill = work / "results/runs/ceiling/fst_distill/hover-default-s0"
    assert json.loads((distill / "cycle0/cycle.json").read_text())["teacher_is_student"] is True
    assert "the teacher is the student, nothing is distilled" in \
        (work / "results/logs/runs/ceiling/fst_distill/hover-default-s0/cycle0.log").read_text()
    # every method's steps as one table, as the README reads them: one glob, one schema
    steps = pl.read_parquet(work / "results/runs/*/*/*/cycle*/metrics.parquet")
    assert steps.columns == list(METRIC_COLUMNS)
    assert sorted(steps["run"].str.split("/").list.get(1).unique()) == ["fst", "fst_distill", "gepa", "rl"]
    gepa = steps.filter(pl.col("run").str.contains("/gepa/"))
    assert (gepa["fast_seconds"] > 0).all() and gepa["reward_mean"].is_nan().all()
    assert gepa["completion_tokens"].is_null().all()
    assert not (work / "results/runs/reuse/fst/math-no_reuse-s0").exists()
    assert "the same run as efficiency/fst/math-default-s0" in (work / "results/reports/pools/reuse.html").read_text()
    # ...and its reuse run trains each cycle's RL steps (fast.reuse_steps 2 = T) on rollouts its
    # fast round sampled, the second step on samples one update older than its weights
    steps = pl.concat([pl.read_parquet(f) for f in
                       sorted((work / "results/runs/reuse/fst/math-reuse-s0").glob("cycle*/metrics.parquet"))])
    assert steps.height == 4 and steps["reused_rollouts"].min() > 0
    assert steps.filter(pl.col("step_in_cycle") == 0)["reused_is_weight"].is_finite().all()
    no_reuse_steps = pl.read_parquet(work / "results/runs/efficiency/fst/math-default-s0/cycle1/metrics.parquet")
    assert no_reuse_steps["reused_rollouts"].max() == 0
    info = json.loads((work / "results/mlflow/experiment.json").read_text())
    from mlflow.tracking import MlflowClient

    runs = MlflowClient(info["tracking_uri"]).search_runs([info["experiment_id"]], max_results=1000)
    figure_runs = [r for r in runs if r.data.tags.get("fastslow.rule") == "figure"]
    assert len(figure_runs) == len(FIGURES)
    assert all(r.data.tags.get("fastslow.input_runs") for r in figure_runs)
    # each carries the numbers it plotted (Fig 6's normalised table goes to its log; at zero reward
    # Fig 2's ratios and Fig 3's asymptotes are NaN, which a run's metrics leave out)
    measured = {r.data.tags["fastslow.figure"] for r in figure_runs if r.data.metrics}
    assert {"fig4", "fig5", "fig7", "fig8", "fig9", "fig10", "fig11"} <= measured, measured
    # Fig 8 reads efficiency's runs on hover only: the smoke config has none, so it plotted none
    fig8 = next(r for r in figure_runs if r.data.tags["fastslow.figure"] == "fig8")
    assert not [r for r in fig8.data.tags["fastslow.input_runs"].split(",") if r.startswith("efficiency/")]
    # Fig 10 reads efficiency's RL run on the reuse experiment's task, its reference
    fig10 = next(r for r in figure_runs if r.data.tags["fastslow.figure"] == "fig10")
    assert "efficiency/rl/math-default-s0" in fig10.data.tags["fastslow.input_runs"].split(",")
    assert fig10.data.metrics["fig10/seconds_per_step/rl"] > 0
    # ...and Fig 9 its runs on the ablations' task: here that is all of them
    on_math = pl.read_parquet(work / "results/tables/curves/subsets/efficiency.math.parquet")
    assert on_math.sort(["run", "step"]).equals(
        pl.read_parquet(work / "results/tables/curves/efficiency.parquet").sort(["run", "step"]))
    assert not [r for r in runs if r.info.status == "RUNNING"]
    # logging never fails a job (tracking._best_effort), so a broken log call shows only as this tag
    failed = {r.data.tags.get("fastslow.job"): r.data.tags["fastslow.logging_failures"] for r in runs
              if "fastslow.logging_failures" in r.data.tags}
    assert not failed, failed
    # a run's jobs log that run's own settings (its variant's), not the global config they are given
    def of_run(key: str, rule: str) -> list:
        return [r for r in runs if r.data.tags.get("fastslow.run") == key and r.data.tags.get("fastslow.rule") == rule]

    k4, reused = of_run("ablations/fst/math-k4-s0", "cycle"), of_run("reuse/fst/math-reuse-s0", "cycle")
    assert k4 and {r.data.params["fast.pool_size"] for r in k4} == {"4"}
    assert reused and {r.data.params["fast.reuse_rollouts"] for r in reused} == {"true"}
    radar = of_run("radar/gepa/from_efficiency_fst_math-default-s0-hover-default-s0", "evaluate_point")
    assert radar and {r.data.params["evaluation.k"] for r in radar} == {"8"}
    # (final_weights too, though it only links files: a filter on the run or its variant finds it)
    final = of_run("efficiency/fst/math-default-s0", "final_weights")
    assert final and {(r.data.tags["fastslow.variant"], r.data.params["run.key"]) for r in final} == \
        {("default", "efficiency/fst/math-default-s0")}
    # every evaluation's run says the dtype it sampled in (evaluation.dtype bfloat16_if_native is the
    # machine's choice; the smoke config's model.dtype is float32)
    from fastslow.config import load_config, sample_dtype

    evals = [r for r in runs if r.data.tags.get("fastslow.rule") in ("evaluate_point", "evaluate_base", "channel_eval")]
    assert {r.data.tags["fastslow.rule"] for r in evals} == {"evaluate_point", "evaluate_base", "channel_eval"}
    assert {r.data.tags.get("fastslow.eval_dtype") for r in evals} == {sample_dtype(load_config(work / "config/config.yaml", work / "config/smoke.yaml"))}
    # ...so the runs a figure names are found by that tag: every plotted run's jobs carry it
    plotted = {r for f in figure_runs for r in f.data.tags["fastslow.input_runs"].split(",") if "/" in r}
    assert plotted and plotted <= {r.data.tags.get("fastslow.run") for r in runs}, plotted
    # ...and each row of a figure's tables the very runs behind its point: a rerun job is a new
    # run under the same key, so the key alone cannot say which run of a job a figure drew
    by_id = {r.info.run_id: r for r in runs}
    curves = pl.read_parquet(work / "results/tables/curves/continual.parquet")
    for row in curves.iter_rows(named=True):
        ev = by_id[row["eval_run_id"]]
        assert ev.data.tags["fastslow.rule"] in ("evaluate_point", "evaluate_base"), row
        if row["cycle"] >= 0:
            assert ev.data.tags["fastslow.run"] == row["run"]
            cyc = by_id[row["cycle_run_id"]]
            assert cyc.data.tags["fastslow.run"] == row["run"] and cyc.data.tags["wildcard.cycle"] == str(row["cycle"])
            assert ev.data.tags["fastslow.cycle_run"] == row["cycle_run_id"]
        else:
            assert row["cycle_run_id"] is None
    # ...and the figure runs log those tables as their input datasets
    fig6 = next(r for r in figure_runs if r.data.tags["fastslow.figure"] == "fig6")
    assert [(i.dataset.name, {t.key: t.value for t in i.tags}["mlflow.data.context"])
            for i in fig6.inputs.dataset_inputs] == [("curves/continual", "input")]
    # ...and every evaluation its samples table, as an MLflow dataset
    assert all(len(r.inputs.dataset_inputs) == 1 for r in runs if r.data.tags.get("fastslow.rule") == "evaluate_point")
    # every fast round's cycle job logged where the round's sampling time went
    rounds = [r for r in runs if "fast/seconds" in r.data.metrics]
    split = [(r.data.metrics["fast/seed_eval_seconds"], r.data.metrics["fast/search_eval_seconds"],
              r.data.metrics["fast/slow_sample_seconds"], r.data.metrics["fast/seconds"]) for r in rounds]
    assert split and all(0 <= seeds and 0 <= search and 0 <= slow and seeds + search + slow <= total
                         for seeds, search, slow, total in split)
    assert max(seeds for seeds, _, _, _ in split) > 0
    # the README's query without a browser, as printed there, lists the continual experiment's runs
    snippet = re.search(r"Without a browser.*?```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert snippet
    listed = subprocess.run(["bash", "-c", snippet[1].replace(".venv/bin/python", shlex.quote(sys.executable))],
                            cwd=work, capture_output=True, text=True, timeout=120, env=env)
    assert listed.returncode == 0, listed.stderr[-3000:]
    continual = [r for r in runs if r.data.tags.get("wildcard.experiment") == "continual"]
    assert continual and all(r.info.run_id in listed.stdout for r in continual)
    assert sum(len(line.split()) > 1 and line.split()[1] in by_id for line in listed.stdout.splitlines()) == len(continual)

    # snakemake --report: one self-contained HTML page with the figures, claims and pool pages
    out = snakemake("--report", "report.html", *SMOKE, cwd=work, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    html = (work / "report.html").read_text(errors="replace")
    for name in ("fig6.png", "claims.csv", "channels.csv", "continual.html"):
        assert name in html, name

    # the accelerate configs are part of the cycles' code (a multi-GPU cycle trains under one):
    # the same files elsewhere change nothing, an edited one makes the cycles out of date
    accelerate = tmp_path / "accelerate"
    shutil.copytree(ROOT / "profiles/slurm/accelerate", accelerate)
    env = {**env, "FASTSLOW_ACCELERATE_CONFIG_DIR": str(accelerate)}
    out = snakemake("-n", *SMOKE, cwd=work, env=env)
    assert out.returncode == 0 and "Nothing to be done" in out.stdout, out.stdout[-3000:]
    (accelerate / "fsdp2.yaml").write_text((accelerate / "fsdp2.yaml").read_text().replace("bf16", "fp16"))
    out = snakemake("-n", *SMOKE, cwd=work, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rule cycle:" in out.stdout and "Params have changed" in out.stdout
    assert "rule evaluate_base:" not in out.stdout


@pytest.mark.workflow
@pytest.mark.slow
def test_smoke_dag_through_slurm_matches_local_run(slurm_build, request):
    if slurm_build.unavailable:  # skipped (failed under FASTSLOW_REQUIRE_SLURM=1) before any build
        unavailable(slurm_build.unavailable)
    assert not slurm_build.error, slurm_build.error
    local, built, _ = request.getfixturevalue("every_figure")  # the reference, built beside it
    remote, cluster = slurm_build.remote, slurm_build.cluster
    rc_remote = slurm_build.proc.wait(timeout=max(60.0, 1500 - (time.monotonic() - slurm_build.started)))
    slurm_log = slurm_build.log.read_text()
    assert rc_remote == 0, slurm_log[-6000:]
    assert built.returncode == 0, f"the local reference build failed: {built.stderr[-4000:]}"

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
    comp = (cluster.state / "jobcomp.log").read_text()  # jobcomp/filetxt: one line per finished job
    records = {}
    for line in comp.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobId" in fields:
            records[fields["JobId"]] = fields
    squeue = subprocess.run(["squeue", "--states=all", "-h", "-o", "%i|%T"], env=slurm_build.env,
                            capture_output=True, text=True, timeout=30).stdout
    for jobid in jobs:
        assert records.get(jobid, {}).get("JobState") == "COMPLETED", (jobid, jobs[jobid], comp)
        assert records[jobid]["Partition"] == PARTITION
        assert f"{jobid}|COMPLETED" in squeue
    # (the build ended before this test waited on it: its span is its jobs', from SLURM's records)
    span = [datetime.fromisoformat(records[j][key]) for j in jobs for key in ("StartTime", "EndTime")]
    print(f"SLURM jobs ran for {(max(span) - min(span)).total_seconds():.0f} s, beside the every-figure DAG")
    for jobid, (rule, wc) in sorted(jobs.items(), key=lambda kv: int(kv[0])):
        r = records[jobid]
        print(f"  sbatch job {jobid:>4}  {rule + ('[' + wc + ']' if wc else ''):22s} {r['JobState']:9s} "
              f"partition={r['Partition']} {r['Tres']} {r['StartTime']} -> {r['EndTime'][11:]} "
              f"exit={r['ExitCode']}")

    # identical outputs: every Parquet table by content, every summary, the model's files; less
    # the MLflow run ids the tables and summaries name (each job's own run, a new one each build).
    # The local build evaluated the base model on all five smoke tasks: its base_eval table is
    # compared on the SLURM build's (SLURM_TASKS).
    remote_tables = tables(remote / "results")
    local_tables = tables(local / "results", list(remote_tables))
    run_ids = ("mlflow_run_id", "eval_run_id", "cycle_run_id")
    stargraph = [f"runs/stargraph/{method}/stargraph-default-s0/{name}" for method in ("rl", "fst") for name in
                 ("cycle0/metrics.parquet", "cycle0/rollouts.parquet", "eval/cycle0/stargraph.samples.parquet")]
    assert sorted(remote_tables) == sorted([f"data/{task}/{split}.parquet" for task in SLURM_TASKS
                                            for split in ("train", "val", "test")]
                                           + [f"eval/base/{task}.samples.parquet" for task in SLURM_TASKS] + stargraph
                                           + ["tables/base_eval.parquet", "tables/curves/stargraph.parquet"])
    for name, table in remote_tables.items():
        ids = [c for c in run_ids if c in table.columns]
        reference = local_tables[name]
        if name == "tables/base_eval.parquet":
            assert set(reference["task"]) == {"math", "math_hard", "stargraph", "hover", "hover_hard"}
            reference = reference.filter(pl.col("task").is_in(SLURM_TASKS))
            reference, table = reference.sort("task"), table.sort("task")
        assert_frame_equal(reference.drop(ids), table.drop(ids), check_exact=True)
    assert (remote / FIGURE).read_bytes()[:5] == b"%PDF-"
    for task in SLURM_TASKS:
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
