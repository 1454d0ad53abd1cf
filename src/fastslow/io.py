"""Atomic file writes: a crash never leaves a half-written output that looks finished."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


def umask() -> int:
    """The process's file-creation mask (read without changing it where Linux allows)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; on success rename it to `path` (replacing it).

    With `is_dir` the yielded directory becomes `path` itself: it gets the mode a plain
    `mkdir` would give (mkdtemp makes it 0700, which would hide a model or a run's outputs
    from the other users of a shared cluster file system)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    if is_dir:
        os.chmod(tmp, 0o777 & ~umask())
    target = tmp if is_dir else tmp / path.name
    try:
        yield target
        if is_dir:
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
        else:
            os.replace(target, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_parquet(rows: Sequence[Mapping[str, Any]] | Any, path: str | Path,
                  schema: Mapping[str, Any] | None = None) -> Path:
    """Rows (list of dicts) or a polars DataFrame → Parquet, atomically."""
    import polars as pl

    df = rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(list(rows), schema=schema,
                                                                    infer_schema_length=None)
    with atomic_path(path) as tmp:
        df.write_parquet(tmp)
    return Path(path)


def write_json(obj: Any, path: str | Path) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    return Path(path)
