"""What this machine computes natively: bf16 where it pays off (training under autocast, sampling).

Kept apart from `fastslow.slow` so that `fastslow.config` reads it without reaching the trainer
(a job's code digest covers what its script can import, `fastslow.provenance`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def unsupported_platform(platform: str = sys.platform) -> str | None:
    """Why the workflow cannot run on `platform`, in one line, or None: jobs lock files with
    `fcntl` and stop process groups with `os.killpg`, which Windows has neither of."""
    if platform == "win32":
        return "fastslow runs on Linux or macOS, not on Windows itself: run it in WSL2 (README Quick start)"
    return None


def cluster_cores_error(executor: str, cores: int | None, host_cores: int, argv: Sequence[str] = ()) -> str | None:
    """One line if a run on a cluster's executor has `cores` equal to this host's and its command
    line (`argv`) names no workflow profile: Snakemake loads profiles/default as the workflow
    profile, over `--profile profiles/slurm`, and its `cores: all` then caps every job's threads
    (so `--cpus-per-task`) at the submit host's cores (a dry run showed an 8-GPU cycle with 2
    threads). None otherwise: no cores number (a cluster run without one), other cores, or a
    `--workflow-profile` given (`none`, or one of the user's own)."""
    if cores is None or cores != host_cores or any(a.startswith("--workflow-profile") for a in argv):
        return None
    return (f"the {executor} executor with --cores {cores}, this host's cores (profiles/default's `cores: all`, "
            f"which wins over --profile's): every job's threads and --cpus-per-task would be capped at {cores}; "
            f"add --workflow-profile none (profiles/slurm/README.md)")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (else bf16 autocast is emulated, slow)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def native_bf16_available() -> bool:
    """bf16 pays off here: a CUDA GPU that computes it natively (Ampere or later: not a V100 or
    T4, where torch emulates it), or a CPU with native bf16 (`slow.bf16: auto`, and the samplers'
    `bfloat16_if_native`, `fastslow.config.resolve_sample_dtype`)."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported(including_emulation=False)
    return cpu_has_native_bf16()
