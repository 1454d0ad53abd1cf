"""Where a benchmark ran: every report in `results/bench/` carries it as `"environment"`.

The numbers in bench/measured/ come from several kinds of 2-core machine (Intel with and without
AVX512-BF16 and AMX; AMD EPYCs without AVX-512, and with AVX512-BF16 but no AMX) whose ratios
differ by a third: a report that does not name its CPU, its libraries and its commit can only be
placed by the prose around it.
`describe()` reads them at the time of the run; `write_report` adds them to a report and writes it
atomically (a benchmark stopped mid-write leaves the previous report, not half of one).

    from environment import write_report   # bench/ is the script's directory, so on sys.path
    write_report(out, report)
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: The CPU flags that decide how fast a step runs here: bf16 autocast pays off only with
#: avx512_bf16 or amx_bf16 (`fastslow.hardware.cpu_has_native_bf16`, `slow.bf16: auto`).
#: avx512_vp2intersect tells the AMD EPYCs with AVX512-BF16 apart: Zen 5 has it, Zen 4 does not (an
#: RL-only step takes 26-29 s on the one and 32-37 s on the other).
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "avx512_vp2intersect")
#: Environment variables that change what a benchmark measures: fastslow's knobs
#: (`FASTSLOW_MMAP_THRESHOLD` trades step time for peak memory), the thread pools' and the
#: allocator's. A report records those set (`variables`); without it, two runs of one command
#: under different settings read as the same measurement.
VARIABLE_PREFIXES = ("FASTSLOW_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "MALLOC_", "GLIBC_TUNABLES",
                     "TORCH_", "PYTORCH_", "ONEDNN_", "DNNL_", "LD_PRELOAD")


def peak_rss_mb(maxrss: int | None = None, system: str | None = None) -> float:
    """This process's peak resident memory in MiB: `getrusage`'s `ru_maxrss`, which Linux gives in
    KiB and macOS in bytes (read as KiB, a Mac's report was 1024 times too large)."""
    import resource

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss if maxrss is None else maxrss
    return maxrss / (2**20 if (system or platform.system()) == "Darwin" else 2**10)


def at_least(low: int):
    """An argparse type: an integer >= `low` (a bad one is argparse's one error line naming it)."""
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


positive = at_least(1)


def task_name(text: str) -> str:
    """An argparse type: one of the offline tasks (the ones whose splits the workflow builds here)."""
    import argparse

    from fastslow.tasks import TASK_NAMES

    if text not in TASK_NAMES:
        raise argparse.ArgumentTypeError(f"unknown task {text!r} (tasks: {', '.join(TASK_NAMES)})")
    return text


def cpu(cpuinfo: str) -> dict[str, Any]:
    """The CPU's model name and which of `CPU_FLAGS` it has, from the text of /proc/cpuinfo
    (Linux; elsewhere the platform's processor string and no flags)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:  # the first processor's fields
            fields[key.strip()] = value.strip()
    flags = set(fields.get("flags", "").split())
    model = fields.get("model name") or platform.processor() or platform.machine()
    return {"model": model, "flags": [f for f in CPU_FLAGS if f in flags],
            "native_bf16": bool(flags & {"avx512_bf16", "amx_bf16"})}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def describe() -> dict[str, Any]:
    """This machine and checkout, now: CPU (model, flags), cores the process may use, memory, the
    load average, Python and the libraries that change what a step computes
    (`fastslow.jobs.VERSIONED_LIBRARIES`), the git commit and whether tracked files differ from
    it, the UTC time, and the environment variables that change a measurement (`variables`)."""
    from fastslow.jobs import library_versions
    from fastslow.tracking import git_commit, git_modified

    mem_kib = next((int(line.split()[1]) for line in _read("/proc/meminfo").splitlines()
                    if line.startswith("MemTotal:")), None)
    commit, modified = git_commit(ROOT), git_modified(ROOT)  # the jobs' own provenance tags read the same
    return {
        "cpu": cpu(_read("/proc/cpuinfo")),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1) if mem_kib else None,
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "libraries": dict(item.split("==", 1) for item in library_versions().split()),
        "commit": None if commit == "unknown" else commit,
        "tracked_files_modified": None if modified is None else bool(modified),
        "utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "variables": variables(),
    }


def variables(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The set environment variables of `VARIABLE_PREFIXES`, by name."""
    environ = dict(os.environ) if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if k.startswith(VARIABLE_PREFIXES)}


def write_report(out: Path, report: dict[str, Any], environment: dict[str, Any] | None = None) -> dict[str, Any]:
    """`report` with `"environment"` (`describe()`, or the one given: a report rewritten after
    every run keeps the environment it started with) as indented JSON at `out`, atomically.
    Returns what was written."""
    from fastslow.io import atomic_path

    full = {**report, "environment": environment or describe()}
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        tmp.write_text(json.dumps(full, indent=2) + "\n")
    return full
