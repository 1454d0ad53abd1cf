"""What this machine computes natively: bf16 where it pays off (training under autocast, sampling).

Kept apart from `fastslow.slow` so that `fastslow.config` reads it without reaching the trainer
(a job's code digest covers what its script can import, `fastslow.provenance`)."""

from __future__ import annotations

from pathlib import Path


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
