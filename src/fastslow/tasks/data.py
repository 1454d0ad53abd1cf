"""Task splits on disk: train/val/test Parquet files, written deterministically and atomically.

Schema (all strings): id, task, prompt, answer, metadata (a JSON object, keys sorted). The same
task, options and seed give byte-identical files: rows are in generation order, the schema is
fixed, and nothing time- or host-dependent is written.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fastslow.tasks.base import SPLITS, Problem, TaskBase, TaskDataError, coerce_text
from fastslow.tasks.generated import prompt_digest

COLUMNS = ("id", "task", "prompt", "answer", "metadata")
log = logging.getLogger(__name__)


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([(c, pa.string()) for c in COLUMNS])


def write_problems(problems: Sequence[Problem], path: str | Path) -> Path:
    """Write `problems` to a Parquet file atomically (`fastslow.io.atomic_path`: whole or absent
    after a crash, with the umask's modes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fastslow.io import atomic_path

    path = Path(path)
    rows = [p.to_row() for p in problems]
    table = pa.Table.from_pydict({c: [r[c] for r in rows] for c in COLUMNS}, schema=_schema())
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


def write_splits(task_name: str, out_dir: str | Path, sizes: Mapping[str, int], seed: int,
                 **task_options: Any) -> dict[str, Path]:
    """Generate `sizes[split]` problems per split of `task_name` and write `<out_dir>/<split>.parquet`
    (`write_checked_splits`, without its count of gold answers scoring below 1)."""
    return write_checked_splits(task_name, out_dir, sizes, seed, **task_options)[0]


def write_checked_splits(task_name: str, out_dir: str | Path, sizes: Mapping[str, int], seed: int,
                         **task_options: Any) -> tuple[dict[str, Path], int]:
    """Generate `sizes[split]` problems per split of `task_name` and write `<out_dir>/<split>.parquet`;
    with the paths, how many problems score below 1 on their own answer (the task_data job's
    MLflow metric `gold_below_one`, beside the log's warning).

    Splits are checked to share no id and no prompt (compared with runs of whitespace as one
    space: a file's "What is 7 + 7?  Answer" in val beside its one-space twin in train was
    written; so was "16.0" against "16" as the answer) before anything is written, and each
    problem's own answer is scored (`check_gold_answers`).
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
            digest = prompt_digest(p.prompt)
            if p.id in seen_ids:
                raise RuntimeError(f"{name}: problem {p.id} appears in {seen_ids[p.id]} and {split}")
            if digest in seen_content:
                first, where = seen_content[digest]
                raise TaskDataError(f"{name}: problems {first} ({where}) and {p.id} ({split}) have the same "
                                    f"prompt (up to whitespace): drop one (a duplicate would be trained and "
                                    f"evaluated on twice, or evaluated on what was trained on)")
            seen_ids[p.id], seen_content[digest] = split, (p.id, split)
    below = check_gold_answers(task, result, name)
    out = Path(out_dir)
    return {split: write_problems(result[split], out / f"{split}.parquet") for split in sizes}, below


def gold_completion(problem: Problem) -> str:
    """The completion a perfect model writes for `problem`: its own answer in the requested tags."""
    return f"<answer>{problem.answer}</answer>"


def check_gold_answers(task: Any, splits: Mapping[str, Sequence[Problem]], name: str | None = None) -> int:
    """Score every problem's own answer, written as the task asks (`gold_completion`).

    A scorer that raises on a gold answer is a bug in the task (rewards never raise, so it would
    only show as reward 0 on every completion): TaskDataError naming the task, problem and
    exception. Gold answers scoring below 1 without raising are logged as one WARNING (count and
    first example); every shipped task scores 1.0 on all of its own. Returns that count.
    """
    name = name or getattr(task, "name", "task")
    judge = task.judge if isinstance(task, TaskBase) else None
    below: list[tuple[Problem, float]] = []
    total = 0
    for split in SPLITS:
        for p in splits.get(split, ()):
            total += 1
            completion = gold_completion(p)
            if judge is None:  # a bare `Task`: its reward never raises, so only the value is checked
                value = float(task.reward(p, completion))
            else:
                try:
                    value = float(judge(p, coerce_text(completion)).reward)
                except Exception as exc:
                    detail = " ".join(str(exc).split())[:200]
                    raise TaskDataError(
                        f"{name}: scoring problem {p.id}'s own answer {p.answer[:60]!r} raised "
                        f"{type(exc).__name__}{f': {detail}' if detail else ''} (a bug in the task's "
                        "scorer: every completion would score 0)") from None
            if not value >= 1.0:  # NaN too
                below.append((p, value))
    if below:
        p, value = below[0]
        feedback = " | ".join(line.strip() for line in str(task.feedback(p, gold_completion(p))).splitlines()
                              if line.strip())
        log.warning("%s: %d of %d problems score below 1 on their own answer written as the task asks "
                    "(<answer>…</answer>); first: %s (reward %.2f): %s", name, len(below), total, p.id,
                    value, feedback[:400])
    return len(below)


def load_problems(path: str | Path) -> list[Problem]:
    """The problems of a split file written by `write_problems` (metadata JSON decoded)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}")
    return [Problem.from_row(row, source=path) for row in table.to_pylist()]
