"""Benchmark: the test suite's wall time, CPU time and outcome, as a report kept like the others.

The README's "How long" table quotes the suite's minutes and CPU-seconds per machine kind; before
this script they were read off `time` by hand and kept nowhere. This runs the suite as CI does
(`pytest` with pyproject's options: two xdist workers) from this checkout and writes

    results/bench/suite.json   the environment block (CPU kind, libraries, commit), the exit code,
                               wall and CPU seconds, the largest single process's peak RSS, the
                               counts of passed / failed / skipped / errors and the slowest tests

CPU seconds are the suite's processes' user + system time (`getrusage` of the children, which
counts every process pytest and its workers waited for: the local workflow DAGs' jobs included,
not the SLURM test's jobs, which slurmd starts).
Run it with nothing else on the machine: the suite is bound by the CPU, and a shared machine's
minutes are the other load's too (the load average at the start is in the report).

    python bench/bench_suite.py [--out results/bench/suite.json] [-- PYTEST ARGS...]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import environment  # this directory: where the benchmark ran, and atomic report writes

ROOT = environment.ROOT
#: Tests listed by duration in the report.
SLOWEST = 25


def junit_outcome(xml_text: str, slowest: int = SLOWEST) -> dict[str, Any]:
    """Counts and the slowest tests from pytest's JUnit XML: `passed`, `failed` (failures),
    `errors`, `skipped`, `xfailed` (an expected failure, which JUnit writes as a skip of type
    pytest.xfail), `tests` (all of them) and `slowest` [(test id, seconds)], longest first."""
    root = ET.fromstring(xml_text)
    cases = [(case, case.find("failure"), case.find("error"), case.find("skipped"))
             for case in root.iter("testcase")]
    # a test may carry a failure and a teardown error both: it counts under each, and is not passed
    counts = {"tests": len(cases),
              "failed": sum(failure is not None for _, failure, _, _ in cases),
              "errors": sum(error is not None for _, _, error, _ in cases),
              "skipped": sum(skipped is not None and skipped.get("type") != "pytest.xfail" for *_, skipped in cases),
              "xfailed": sum(skipped is not None and skipped.get("type") == "pytest.xfail" for *_, skipped in cases),
              "passed": sum(all(x is None for x in marks) for _, *marks in cases)}
    timed = sorted(((f"{c.get('classname', '')}::{c.get('name', '')}", float(c.get("time") or 0.0))
                    for c, *_ in cases), key=lambda item: -item[1])
    return {**counts, "slowest": [[name, round(seconds, 2)] for name, seconds in timed[:slowest]]}


def minutes_seconds(seconds: float) -> str:
    """`887.4` -> "14 min 47 s" (whole seconds, rounded once)."""
    whole = round(seconds)
    return f"{whole // 60} min {whole % 60} s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench" / "suite.json")
    parser.add_argument("pytest_args", nargs="*", help="after `--`: extra pytest arguments (a subset, -n 0, ...)")
    args = parser.parse_args(argv)
    machine = environment.describe()  # before the run: its load average is the machine's, not ours
    with tempfile.TemporaryDirectory(prefix="fastslow-suite-") as tmp:
        xml = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", f"--junitxml={xml}", *args.pytest_args]
        print("running:", " ".join(command), flush=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        code = subprocess.call(command, cwd=ROOT)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        outcome = junit_outcome(xml.read_text()) if xml.is_file() else {}
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    report = {"command": command[1:], "exit_code": code, "wall_seconds": round(wall, 1),
              "cpu_seconds": round(cpu, 1), "peak_rss_mb_one_process": round(environment.peak_rss_mb(after.ru_maxrss), 1),
              "load_avg_1m_end": os.getloadavg()[0], **outcome}
    environment.write_report(args.out, report, machine)
    counts = ", ".join(f"{report[k]} {k}" for k in ("passed", "failed", "errors", "skipped", "xfailed") if report.get(k))
    print(f"suite: exit {code}, {minutes_seconds(wall)} wall, {cpu:.0f} CPU-seconds; "
          f"{counts or 'no JUnit report'}; wrote {args.out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
