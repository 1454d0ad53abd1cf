"""What this machine computes natively: bf16 where it pays off (training under autocast, sampling).

Kept apart from `fastslow.slow` so that `fastslow.config` reads it without reaching the trainer
(a job's code digest covers what its script can import, `fastslow.provenance`)."""

from __future__ import annotations

import sys
from pathlib import Path


def unsupported_platform(platform: str = sys.platform) -> str | None:
    """Why the workflow cannot run on `platform`, in one line, or None: jobs lock files with
    `fcntl` and stop process groups with `os.killpg`, which Windows has neither of."""
    if platform == "win32":
        return "fastslow runs on Linux or macOS, not on Windows itself: run it in WSL2 (README Quick start)"
    return None


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
