"""The task suite: a registry of named tasks behind the `Task` protocol (see `base`).

Offline tasks (no network): codeio, math, stargraph, hover, physics. Difficulty is one
constructor option, `difficulty` in {"easy", "default", "hard"}; variants are registered on top
of it as `<task>_easy` / `<task>_hard` (e.g. `hover_hard` = HoVer-hard: 3–4 hops, more
distractors, near-miss years). A task built with options reports the canonical name
(`get_task("hover", difficulty="hard").name == "hover_hard"`), and every problem carries it, so
`get_task(problem.task)` can score a stored problem.

Real data (paper scale, `loaders`): "file" (a user's Parquet/JSONL, `path=`), "hf" (any Hugging
Face dataset, `dataset=`), and the presets in `loaders.HF_PRESETS` (polaris, hover_real, …).
Task modules (and reasoning-gym) are imported only when a task is built.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from fastslow.tasks.base import DIFFICULTIES, SPLITS, Problem, Task

__all__ = ["DIFFICULTIES", "LOADER_NAMES", "SPLITS", "TASK_MODULES", "TASK_NAMES", "Problem", "Task", "get_task",
           "task_class", "task_module"]

# family -> (module, class, difficulties it supports)
_FAMILIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "codeio": ("fastslow.tasks.codeio", "CodeIOTask", ("default",)),
    "math": ("fastslow.tasks.math_task", "MathTask", DIFFICULTIES),
    "stargraph": ("fastslow.tasks.stargraph", "StarGraphTask", DIFFICULTIES),
    "hover": ("fastslow.tasks.hover", "HoverTask", DIFFICULTIES),
    "physics": ("fastslow.tasks.physics", "PhysicsTask", DIFFICULTIES),
}
# registered name -> (family, difficulty)
_VARIANTS: dict[str, tuple[str, str]] = {
    (fam if d == "default" else f"{fam}_{d}"): (fam, d)
    for fam, (_, _, levels) in _FAMILIES.items() for d in levels
}
#: Every offline task name get_task accepts (what `data.tasks` in the config may list).
TASK_NAMES: tuple[str, ...] = tuple(_VARIANTS)
#: Names of the real-data loaders (need options: a path, a dataset id, or network access).
LOADER_NAMES: tuple[str, ...] = ("file", "hf", "polaris", "hover_real", "hover_hard_real")
#: The module of each offline task family: a job's code digest leaves them out and counts only
#: its own tasks' (`task_module`, `fastslow.provenance.task_digest`).
TASK_MODULES: tuple[str, ...] = tuple(sorted({module for module, _, _ in _FAMILIES.values()}))


def task_module(name: str) -> str:
    """The module that builds (and scores) registry task `name`: its family's, or the loaders'."""
    if name in LOADER_NAMES:
        return "fastslow.tasks.loaders"
    if name not in _VARIANTS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASK_NAMES)}")
    return _FAMILIES[_VARIANTS[name][0]][0]


def get_task(name: str, /, **options: Any) -> Task:
    """The task registered as `name`, built with `options` (e.g. difficulty=, rel_tol=, path=).

    Raises a one-line ValueError for an unknown name or a difficulty that contradicts it.
    """
    if not isinstance(name, str) or (name not in _VARIANTS and name not in LOADER_NAMES):
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASK_NAMES)} "
                         f"(real-data loaders: {', '.join(LOADER_NAMES)})")
    if name in LOADER_NAMES:
        return _loader(name, options)
    if "name" in options:
        raise ValueError(f"task {name!r}: name= is only for the real-data loaders ({', '.join(LOADER_NAMES)})")
    family, difficulty = _VARIANTS[name]
    wanted = options.pop("difficulty", difficulty)
    if name != family and wanted != difficulty:
        raise ValueError(f"task {name!r} has difficulty {difficulty!r}; got difficulty={wanted!r}")
    if wanted not in _FAMILIES[family][2]:
        raise ValueError(f"task {family!r} has no difficulty {wanted!r}; "
                         f"valid: {', '.join(_FAMILIES[family][2])}")
    canonical = family if wanted == "default" else f"{family}_{wanted}"
    return _build(task_class(family), name, options, name=canonical, difficulty=wanted)


def _build(cls: type, task: str, options: dict[str, Any], /, **own: Any) -> Task:
    """`cls(**options, **own)`, an option of the caller's it does not take a one-line ValueError
    naming the task and the options it does take (`own`: what get_task itself passes)."""
    params = inspect.signature(cls).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(options) - set(params))
        if unknown:
            takes = [k for k in params if k not in own]
            raise ValueError(f"task {task!r}: unknown option(s) {', '.join(unknown)}; it takes "
                             f"{', '.join(takes) or 'none'}")
    return cls(**options, **own)


def task_class(name: str) -> type:
    """The generator class behind offline task `name` (its constructor takes the options)."""
    if name not in _VARIANTS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {', '.join(TASK_NAMES)}")
    module, cls, _ = _FAMILIES[_VARIANTS[name][0]]
    return getattr(importlib.import_module(module), cls)


def _loader(name: str, options: dict[str, Any]) -> Task:
    from fastslow.tasks import loaders

    if name == "file":
        if "path" not in options:
            raise ValueError("task 'file' needs path=<.parquet or .jsonl file>")
        if options.get("labels") and options.get("scorer", "exact") != "label":
            raise ValueError(f"task 'file': labels= is only for scorer='label', got scorer={options.get('scorer', 'exact')!r}")
        return _build(loaders.LocalFileTask, name, options)
    if name == "hf":
        if "dataset" not in options:
            raise ValueError("task 'hf' needs dataset=<Hugging Face dataset id>")
        return _build(loaders.HFDatasetTask, name, options)
    return _build(loaders.HFDatasetTask, name, {"name": name, **loaders.HF_PRESETS[name], **options})
