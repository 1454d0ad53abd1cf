"""glibc's mmap threshold: fixed by fastslow.memory so freed large tensors leave the process."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys

import pytest

from fastslow.memory import (
    DEFAULT_MMAP_THRESHOLD,
    ENV_MMAP_THRESHOLD,
    limit_heap_fragmentation,
    mmap_threshold,
)

# After an 8 MiB mmapped block is freed, glibc raises its threshold to 8 MiB, so a 2 MiB
# allocation then comes from the heap; with the threshold fixed at 1 MiB it is mmapped again.
# mallinfo2().hblkhd is the bytes held in mmapped blocks.
PROBE = r"""
import ctypes, ctypes.util, sys
from fastslow.memory import limit_heap_fragmentation
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "fixed":
    assert limit_heap_fragmentation() == 1 << 20
libc.free(libc.malloc(8 << 20))
before = libc.mallinfo2().hblkhd
block = libc.malloc(2 << 20)
print("mmapped" if libc.mallinfo2().hblkhd - before >= 2 << 20 else "heap")
libc.free(block)
"""


def _glibc_with_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc >= 2.33 (mallinfo2)")
def test_fixed_threshold_returns_large_blocks_to_the_system() -> None:
    env = {k: v for k, v in os.environ.items() if k != ENV_MMAP_THRESHOLD}
    run = {mode: subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                                env={**env, ENV_MMAP_THRESHOLD: str(1 << 20)} if mode == "fixed" else env,
                                ).stdout.strip() for mode in ("default", "fixed")}
    assert run == {"default": "heap", "fixed": "mmapped"}


def test_threshold_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_MMAP_THRESHOLD, raising=False)
    assert mmap_threshold() == DEFAULT_MMAP_THRESHOLD == 0  # off unless asked for (it costs time)
    assert limit_heap_fragmentation() is None
    monkeypatch.setenv(ENV_MMAP_THRESHOLD, "1048576")
    assert mmap_threshold() == 1 << 20
    monkeypatch.setenv(ENV_MMAP_THRESHOLD, "0")
    assert mmap_threshold() == 0 and limit_heap_fragmentation() is None
    monkeypatch.setenv(ENV_MMAP_THRESHOLD, "lots")
    with pytest.raises(ValueError, match="FASTSLOW_MMAP_THRESHOLD='lots'"):
        mmap_threshold()
    monkeypatch.setenv(ENV_MMAP_THRESHOLD, "-5")
    with pytest.raises(ValueError, match="'-5'"):
        mmap_threshold()


# 200 MB of 64 KiB heap blocks, touched, then freed except one block above them (so free() cannot
# shrink the heap from the top): the pages stay resident until malloc_trim gives them back.
TRIM_PROBE = r"""
import ctypes, ctypes.util, os
from fastslow.memory import release_free_memory
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
blocks = [libc.malloc(64 << 10) for _ in range(3200)]
for b in blocks:
    ctypes.memset(b, 1, 64 << 10)
guard = libc.malloc(64 << 10)
for b in blocks:
    libc.free(b)
before = rss()
assert release_free_memory()
print((before - rss()) >> 20)
"""


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="needs glibc")
def test_release_free_memory_returns_freed_heap_pages() -> None:
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, check=True)
    assert int(out.stdout.strip()) >= 150  # MiB given back of the ~200 freed


def test_a_blank_threshold_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """`FASTSLOW_MMAP_THRESHOLD=` (set but empty, as a shell or a profile leaves it) is unset, not
    a bad number; spaces around a number are read."""
    for blank in ("", "  "):
        monkeypatch.setenv(ENV_MMAP_THRESHOLD, blank)
        assert mmap_threshold() == DEFAULT_MMAP_THRESHOLD
    monkeypatch.setenv(ENV_MMAP_THRESHOLD, " 65536 ")
    assert mmap_threshold() == 65536


def _fake_libc(monkeypatch: pytest.MonkeyPatch, answers: list[int] | None) -> list[tuple[int, int]]:
    """Stand a C library in for glibc whose mallopt answers `answers` in turn (None: no mallopt,
    not glibc); the calls it got."""
    from types import SimpleNamespace

    import fastslow.memory as memory

    calls: list[tuple[int, int]] = []

    def mallopt(param: int, value: int) -> int:
        calls.append((param, value))
        return answers.pop(0)

    monkeypatch.setattr(memory, "_libc", lambda: SimpleNamespace() if answers is None else SimpleNamespace(
        mallopt=mallopt))
    monkeypatch.setattr(memory, "_applied", None)
    return calls


def test_the_threshold_is_set_once_capped_at_an_int_and_a_refusal_is_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    calls = _fake_libc(monkeypatch, [0, 1])
    monkeypatch.setenv(ENV_MMAP_THRESHOLD, str(1 << 20))
    with caplog.at_level(logging.WARNING, logger="fastslow.memory"):
        assert limit_heap_fragmentation() is None  # refused: nothing set, and said
    assert [r.getMessage() for r in caplog.records] == [
        "mallopt(M_MMAP_THRESHOLD, 1048576) was refused; glibc's default stays"]
    assert limit_heap_fragmentation() == 1 << 20  # asked again, accepted
    assert limit_heap_fragmentation() == 1 << 20  # ...and not again: once per process
    assert calls == [(-3, 1 << 20), (-3, 1 << 20)]
    # mallopt takes a C int: a threshold above it is set at the largest int
    calls = _fake_libc(monkeypatch, [1])
    monkeypatch.setenv(ENV_MMAP_THRESHOLD, str(1 << 32))
    assert limit_heap_fragmentation() == 1 << 32 and calls == [(-3, 2**31 - 1)]


def test_without_glibc_nothing_is_set_or_trimmed(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastslow.memory import release_free_memory

    calls = _fake_libc(monkeypatch, None)
    monkeypatch.setenv(ENV_MMAP_THRESHOLD, str(1 << 20))
    assert limit_heap_fragmentation() is None and calls == []
    assert release_free_memory() is False
