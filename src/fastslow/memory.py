"""Keep a CPU training job's resident memory close to what its tensors need.

glibc's malloc serves allocations above its mmap threshold with mmap (returned to the system on
free) and the rest from its heap. The threshold starts at 128 KiB but *grows* each time an
mmapped block is freed, up to 32 MiB, so after the first RL step most activation and gradient
buffers come from the heap, where freed blocks fragment and resident memory only grows. A fixed
threshold (`mallopt(M_MMAP_THRESHOLD)`, which also turns the growth off) sends every large
tensor back to the system when it is freed.

Measured on the CPU default (SmolLM2-135M, bench/bench_fst_step.py; bench/HISTORY.md, memory fragmentation): a
codeio RL cycle at micro-batch 2 peaks at 8516 MB with glibc's default and 7359 MB with a 1 MiB
threshold, but every large tensor then costs fresh pages (the kernel zeroes them): an RL step on
math took 17.6 s instead of 15.8 s at micro-batch 2, and 19.6 s instead of 15.9 s at micro-batch
1. So it is off by default, a knob for a machine short of memory: `FASTSLOW_MMAP_THRESHOLD`
(bytes, e.g. 1048576) sets it for every cycle job; unset or 0 leaves glibc's default alone.
Elsewhere than glibc (macOS, musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

log = logging.getLogger(__name__)

ENV_MMAP_THRESHOLD = "FASTSLOW_MMAP_THRESHOLD"
DEFAULT_MMAP_THRESHOLD = 0  # off: see the module docstring for what 1 MiB saves and costs
_M_MMAP_THRESHOLD = -3  # from <malloc.h>

_applied: int | None = None


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library (loaded once), or None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def mmap_threshold() -> int:
    """The threshold to set: $FASTSLOW_MMAP_THRESHOLD if set, else the default (0 = leave glibc alone)."""
    raw = os.environ.get(ENV_MMAP_THRESHOLD)
    if raw is None or raw.strip() == "":
        return DEFAULT_MMAP_THRESHOLD
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{ENV_MMAP_THRESHOLD}={raw!r}: expected a number of bytes (0 to disable)") from None
    if value < 0:
        raise ValueError(f"{ENV_MMAP_THRESHOLD}={raw!r}: expected a number of bytes >= 0 (0 to disable)")
    return value


def limit_heap_fragmentation() -> int | None:
    """Fix glibc's mmap threshold (see the module docstring) once per process. Returns the
    threshold set, or None when nothing was set (disabled, or not glibc)."""
    global _applied
    threshold = mmap_threshold()
    if threshold == 0:
        return None
    if _applied == threshold:
        return threshold
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return None  # not glibc: nothing to tune
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, min(threshold, 2**31 - 1)) != 1:
        log.warning("mallopt(M_MMAP_THRESHOLD, %d) was refused; glibc's default stays", threshold)
        return None
    _applied = threshold
    return threshold


def release_gpu_memory() -> None:
    """Give the CUDA caching allocator's free blocks back to the driver (a freed vLLM engine's,
    before the next model loads); nothing without a GPU."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def release_free_memory() -> bool:
    """Give the heap's free pages back to the system (glibc `malloc_trim(0)`). A cycle calls it
    once the fast round's generator is gone, so training's peak does not stack on the
    generator's fragments: an FST cycle on hover_hard peaked at 6233 MiB instead of 6431 MiB.
    (After every RL step it did not lower the peak: 6195 vs 6211 MiB.) Returns False where
    there is no glibc."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)
    return True
