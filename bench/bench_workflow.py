"""Benchmark: wall time of building workflow targets, and where it goes, per rule and per job.

Runs `snakemake <targets> --cores N` (the real workflow, the same command a user types) and
times it; every rule has a `benchmark:` file (results/benchmarks/...tsv, Snakemake's own: wall
seconds, peak RSS, CPU time per job), so the jobs this build ran are then summed per rule.

    python bench/bench_workflow.py results/figures/fig6.pdf [--cores 2] [--configfile ...]
        [--name fig6] [--out results/bench/workflow_fig6.json] [--prioritize TARGET ...]

Jobs already built are not re-run (and not counted): to time a target from scratch, remove its
outputs first (or pass --forceall, which rebuilds the base model and the task data too).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import environment  # this directory: where the benchmark ran, and atomic report writes
import polars as pl

BENCH_DIR = Path("results/benchmarks")


def rule_totals(jobs: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """Per rule: jobs, seconds, the longest job's and the peak RSS (None where Snakemake sampled
    no job of the rule: not 0 MB)."""
    return {r.pop("rule"): r for r in jobs.group_by("rule").agg(
        pl.len().alias("jobs"), pl.col("seconds").sum(), pl.col("seconds").max().alias("max_seconds"),
        pl.col("max_rss_mb").max()).to_dicts()}


def job_benchmarks(since: float) -> pl.DataFrame:
    """Benchmark rows of the jobs that finished after `since` (epoch seconds): job (its file's
    path), rule (Snakemake's own `rule_name`, written under --benchmark-extended), seconds, peak
    RSS and CPU seconds (null where Snakemake could not sample them)."""
    frames = []
    for path in sorted(BENCH_DIR.rglob("*.tsv")):
        if path.stat().st_mtime < since:
            continue
        df = pl.read_csv(path, separator="\t", quote_char=None, null_values=["-", "NA", ""],
                         infer_schema_length=None)
        if "rule_name" not in df.columns:  # written without --benchmark-extended
            raise SystemExit(f"{path}: no rule_name column (not written by this benchmark's snakemake call)")
        frames.append(df.select(pl.lit(str(path.relative_to(BENCH_DIR).with_suffix(""))).alias("job"),
                                pl.col("rule_name").cast(pl.String).alias("rule"),
                                pl.col("s").cast(pl.Float64).alias("seconds"),
                                pl.col("max_rss").cast(pl.Float64).alias("max_rss_mb"),
                                pl.col("cpu_time").cast(pl.Float64).alias("cpu_seconds")))
    schema = {"job": pl.String, "rule": pl.String, "seconds": pl.Float64, "max_rss_mb": pl.Float64,
              "cpu_seconds": pl.Float64}
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="+")
    parser.add_argument("--cores", default="2")
    parser.add_argument("--configfile", nargs="*", default=[])
    parser.add_argument("--forceall", action="store_true")
    parser.add_argument("--prioritize", nargs="*", default=[],
                        help="targets whose jobs snakemake runs first (its --prioritize)")
    parser.add_argument("--name", default=None, help="report name (default: first target's stem)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    name = args.name or Path(args.targets[0]).stem
    out = args.out or Path(f"results/bench/workflow_{name}.json")

    command = [sys.executable, "-m", "snakemake", *args.targets, "--cores", str(args.cores), "--benchmark-extended"]
    if args.configfile:
        command += ["--configfile", *args.configfile]
    if args.forceall:
        command.append("--forceall")
    if args.prioritize:
        command += ["--prioritize", *args.prioritize]
    machine = environment.describe()  # before the build: its load average is the machine's, not ours
    start_epoch, start = time.time(), time.perf_counter()
    rc = subprocess.call(command)
    wall = time.perf_counter() - start
    jobs = job_benchmarks(start_epoch - 1).sort("seconds", descending=True)
    per_rule = rule_totals(jobs)
    report = {"targets": args.targets, "configfiles": args.configfile, "cores": args.cores,
              "exit_code": rc, "wall_seconds": wall, "jobs_run": jobs.height,
              "job_seconds_total": jobs["seconds"].sum(),
              "load_avg_1m_end": os.getloadavg()[0], "per_rule": per_rule, "jobs": jobs.to_dicts()}
    environment.write_report(out, report, machine)
    print(f"{' '.join(args.targets)}: exit {rc}, {wall / 60:.1f} min wall on {args.cores} cores, "
          f"{jobs.height} jobs ({report['job_seconds_total'] / 60:.1f} job-min)")
    for rule, r in sorted(per_rule.items(), key=lambda kv: -kv[1]["seconds"]):
        print(f"  {rule:16s} {r['jobs']:3d} jobs  {r['seconds'] / 60:6.1f} min  "
              f"(longest {r['max_seconds']:.0f} s, peak RSS "
              f"{'not sampled' if r['max_rss_mb'] is None else format(r['max_rss_mb'], '.0f') + ' MB'})")
    print(f"wrote {out}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
