"""Benchmark: Snakemake's own process over the every-figure smoke DAG, with and without the
Snakefile's scheduler fix (`fastslow.scheduling.one_pending_wakeup`).

Each variant builds the DAG of tests/test_workflow_figures.py (`--cores 2`, the smoke overlay) from
nothing in a fresh copy of the workflow; `without` replaces the Snakefile's call with `pass`.
Snakemake runs in a wrapper that counts its scheduler's job selections (a pass of its loop with
jobs ready) and, at exit, writes its own process's CPU seconds (`RUSAGE_SELF`: the scheduler, the
local `run:` rules, the benchmark threads) and its jobs' (`RUSAGE_CHILDREN`).

    python bench/bench_scheduler.py [--variants with,without] [--out results/bench/scheduler.json]

Run it with nothing else on the machine: the DAG takes 8-9 minutes a variant on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import environment  # this directory: where the benchmark ran, and atomic report writes

ROOT = Path(__file__).resolve().parents[1]
CALL = "one_pending_wakeup()"

#: run in the child: Snakemake's CLI, counting job selections, reporting rusage at exit
WRAPPER = """
import atexit, json, resource, sys, time
from snakemake.scheduling import job_scheduler
out = sys.argv[1]
selections = [0]
select = job_scheduler.JobScheduler.job_selector
def counted(self, jobs):
    selections[0] += 1
    return select(self, jobs)
job_scheduler.JobScheduler.job_selector = counted
start = time.monotonic()
def report():
    own, jobs = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "w") as f:
        json.dump({"wall_s": time.monotonic() - start, "job_selections": selections[0],
                   "snakemake_user_s": own.ru_utime, "snakemake_system_s": own.ru_stime,
                   "jobs_user_s": jobs.ru_utime, "jobs_system_s": jobs.ru_stime}, f)
atexit.register(report)
from snakemake.cli import main
sys.argv = ["snakemake", *sys.argv[2:]]
main()
"""


def run(variant: str, work: Path) -> dict:
    for item in ("Snakefile", "workflow", "config", "profiles"):
        (shutil.copytree if (ROOT / item).is_dir() else shutil.copy)(ROOT / item, work / item)
    snakefile = work / "Snakefile"
    text = snakefile.read_text()
    if text.count(f"\n{CALL}\n") != 1:
        raise SystemExit(f"the Snakefile does not call {CALL} once at top level: nothing to compare")
    if variant == "without":
        snakefile.write_text(text.replace(f"\n{CALL}\n", "\npass\n"))
    report = work / "report.json"
    env = {**os.environ, "PYTHONHASHSEED": "2", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-c", WRAPPER, str(report), "--cores", "2", "--configfile", "config/config.yaml",
           "config/smoke.yaml"]
    print(f"[{time.strftime('%H:%M:%S')}] {variant}: building the every-figure smoke DAG in {work}", flush=True)
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{variant}: snakemake exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    result = {"variant": variant, **json.loads(report.read_text())}
    result["jobs_finished"] = proc.stderr.count("Finished jobid")
    print(f"[{time.strftime('%H:%M:%S')}] {variant}: {result['wall_s']:.0f} s, {result['job_selections']} job "
          f"selections, Snakemake's own CPU {result['snakemake_user_s'] + result['snakemake_system_s']:.1f} s",
          flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="with,without")
    ap.add_argument("--out", type=Path, default=ROOT / "results/bench/scheduler.json")
    args = ap.parse_args()
    variants = args.variants.split(",")
    if not set(variants) <= {"with", "without"}:
        ap.error(f"argument --variants: must be a comma-separated list of with and without, got {args.variants!r}")
    report = {"command": " ".join(["python", *sys.argv]), "runs": [], "complete": False}
    env = environment.describe()  # taken when the benchmark starts
    for variant in variants:
        with tempfile.TemporaryDirectory(prefix=f"fastslow-sched-{variant}-") as tmp:
            report["runs"].append(run(variant, Path(tmp)))
        report["complete"] = len(report["runs"]) == len(variants)
        environment.write_report(args.out, report, env)  # kept after each run
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
