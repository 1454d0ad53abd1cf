"""Task splits on disk: train/val/test Parquet files, written deterministically and atomically.

Schema (all strings): id, task, prompt, answer, metadata (a JSON object, keys sorted). The same
task, options and seed give byte-identical files: rows are in generation order, the schema is
fixed, and nothing time- or host-dependent is written.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fastslow.tasks.base import SPLITS, Problem, TaskDataError
from fastslow.tasks.generated import content_digest

COLUMNS = ("id", "task", "prompt", "answer", "metadata")


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([(c, pa.string()) for c in COLUMNS])


def write_problems(problems: Sequence[Problem], path: str | Path) -> Path:
    """Write `problems` to a Parquet file atomically (temp file in the same dir, then rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [p.to_row() for p in problems]
    table = pa.Table.from_pydict({c: [r[c] for r in rows] for c in COLUMNS}, schema=_schema())
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; split files are ordinary shared outputs
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_splits(task_name: str, out_dir: str | Path, sizes: Mapping[str, int], seed: int,
                 **task_options: Any) -> dict[str, Path]:
    """Generate `sizes[split]` problems per split of `task_name` and write `<out_dir>/<split>.parquet`.

    Splits are checked to share no id and no (prompt, answer) before anything is written.
    """
    from fastslow.tasks import get_task

    unknown = [s for s in sizes if s not in SPLITS]
    if unknown:
        raise ValueError(f"unknown split(s) {', '.join(map(repr, unknown))}; expected {', '.join(SPLITS)}")
    task = get_task(task_name, **task_options)
    many = getattr(task, "problems_for_splits", None)
    result = many(dict(sizes), seed) if many else {s: task.problems(s, n, seed) for s, n in sizes.items()}
    name = getattr(task, "name", task_name)
    for split, n in sizes.items():
        if n > 0 and not result[split]:
            raise TaskDataError(f"{name}: the {split} split is empty (its source gives "
                                f"it no rows: a file's 'split' column or a dataset's split map leaves it out, "
                                f"or too few rows for the id-hash partition)")
    seen_ids: dict[str, str] = {}
    seen_content: dict[str, tuple[str, str]] = {}
    for split, problems in result.items():
        for p in problems:
            digest = content_digest(p.prompt, p.answer)
            if p.id in seen_ids:
                raise RuntimeError(f"{name}: problem {p.id} appears in {seen_ids[p.id]} and {split}")
            if digest in seen_content:
                first, where = seen_content[digest]
                raise TaskDataError(f"{name}: problems {first} ({where}) and {p.id} ({split}) have the same "
                                    f"prompt and answer: drop one (a duplicate would be trained and evaluated on twice)")
            seen_ids[p.id], seen_content[digest] = split, (p.id, split)
    out = Path(out_dir)
    return {split: write_problems(result[split], out / f"{split}.parquet") for split in sizes}


def load_problems(path: str | Path) -> list[Problem]:
    """The problems of a split file written by `write_problems` (metadata JSON decoded)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
    return [Problem.from_row(row, source=path) for row in table.to_pylist()]
