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
import csv
import json
import os
import platform
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

BENCH_DIR = Path("results/benchmarks")


def job_benchmarks(since: float) -> list[dict]:
    """Benchmark rows of the jobs that finished after `since` (epoch seconds)."""
    rows = []
    for path in BENCH_DIR.rglob("*.tsv"):
        if path.stat().st_mtime < since:
            continue
        with path.open() as f:
            for row in csv.DictReader(f, delimiter="\t"):
                rel = path.relative_to(BENCH_DIR)
                rows.append({"job": str(rel.with_suffix("")), "rule": rule_of(rel),
                             "seconds": float(row["s"]), "max_rss_mb": _num(row.get("max_rss")),
                             "cpu_seconds": _num(row.get("cpu_time"))})
    return sorted(rows, key=lambda r: -r["seconds"])


def rule_of(rel: Path) -> str:
    """The rule a benchmark file belongs to, from its path (mirrors the rules' log paths)."""
    parts = rel.with_suffix("").parts
    if parts[0] == "runs":
        name = parts[-1]
        for prefix in ("cycle", "eval_", "channel_", "final"):
            if name.startswith(prefix):
                return {"cycle": "cycle", "eval_": "evaluate_point", "channel_": "channel_eval",
                        "final": "final_weights"}[prefix]
    return parts[0] if len(parts) > 1 else parts[0]


def _num(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "", "-", "NA") else None
    except ValueError:
        return None


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

    command = [sys.executable, "-m", "snakemake", *args.targets, "--cores", str(args.cores)]
    if args.configfile:
        command += ["--configfile", *args.configfile]
    if args.forceall:
        command.append("--forceall")
    if args.prioritize:
        command += ["--prioritize", *args.prioritize]
    start_epoch, start = time.time(), time.perf_counter()
    rc = subprocess.call(command)
    wall = time.perf_counter() - start
    jobs = job_benchmarks(start_epoch - 1)
    per_rule: dict[str, dict] = defaultdict(lambda: {"jobs": 0, "seconds": 0.0, "max_seconds": 0.0,
                                                     "max_rss_mb": 0.0})
    for j in jobs:
        r = per_rule[j["rule"]]
        r["jobs"] += 1
        r["seconds"] += j["seconds"]
        r["max_seconds"] = max(r["max_seconds"], j["seconds"])
        r["max_rss_mb"] = max(r["max_rss_mb"], j["max_rss_mb"] or 0.0)
    report = {"targets": args.targets, "configfiles": args.configfile, "cores": args.cores,
              "exit_code": rc, "wall_seconds": wall, "jobs_run": len(jobs),
              "job_seconds_total": sum(j["seconds"] for j in jobs),
              "machine": platform.machine(), "cpu_count": os.cpu_count(),
              "load_avg_1m_end": os.getloadavg()[0], "per_rule": dict(per_rule), "jobs": jobs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{' '.join(args.targets)}: exit {rc}, {wall / 60:.1f} min wall on {args.cores} cores, "
          f"{len(jobs)} jobs ({report['job_seconds_total'] / 60:.1f} job-min)")
    for rule, r in sorted(per_rule.items(), key=lambda kv: -kv[1]["seconds"]):
        print(f"  {rule:16s} {r['jobs']:3d} jobs  {r['seconds'] / 60:6.1f} min  "
              f"(longest {r['max_seconds']:.0f} s, peak RSS {r['max_rss_mb']:.0f} MB)")
    print(f"wrote {out}")
    sys.exit(rc)


if __name__ == "__main__":
    main()
