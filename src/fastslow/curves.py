"""Collect one experiment's evaluation points into a tidy table (one row per run × point × task)."""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

from fastslow.evaluate import tidy_summary
from fastslow.experiments import RunSpec
from fastslow.layout import (
    RESULTS,
    cycle_dir,
    eval_point_file,
    eval_points,
    experiment_runs,
    samples_file,
)

#: Columns of results/tables/curves/<experiment>.parquet.
CURVE_COLUMNS = ("experiment", "method", "run", "variant", "seed", "init", "eval_task", "train_task",
                 "cycle", "step", "mean_at_k", "mean_at_k_se", "best_at_k", "k", "problem_ids",
                 "problem_means", "kl_to_base", "entropy", "answered_fraction", "mean_completion_tokens", "truncated_fraction", "cycle_seconds", "cycle_cpu_share", "rollouts_sampled", "context_id",
                 "context_hash", "samples_file", "eval_run_id", "cycle_run_id")


def build_curves(runs: dict[str, RunSpec], experiment: str, config: dict[str, Any],
                 results: str = RESULTS, tasks: Collection[str] | None = None,
                 methods: Collection[str] | None = None) -> list[dict[str, Any]]:
    """Rows of the curves table (of the evaluations on `tasks` only, of the runs of `methods`
    only, if given); `step` is the number of RL steps behind the point ((cycle + 1) · T, 0 for
    the initial weights) so methods compare at matched steps."""
    rows = []
    for spec in experiment_runs(runs, experiment, tasks, methods).values():
        steps = spec.settings(config)["slow"]["steps_per_cycle"]
        infos = _cycle_infos(spec, results)  # each cycle.json once, for every task and point
        sampled = _rollouts_sampled(infos)
        for task in spec.eval_tasks:
            if tasks is not None and task not in tasks:
                continue
            for point in eval_points(spec):
                ev = json.loads(Path(eval_point_file(spec, point, task, results)).read_text())
                cycle = -1 if point == "init" else int(point.removeprefix("cycle"))
                info = {}
                if cycle >= 0:
                    info = infos[cycle]
                    if info is None:  # an input of the curves rule: missing only when called otherwise
                        raise FileNotFoundError(f"{Path(cycle_dir(spec, cycle, results), 'cycle.json')}: no such file")
                k, tidy = int(ev["k"]), tidy_summary(ev)
                summary_file = eval_point_file(spec, point, task, results)
                rows.append({
                    "experiment": experiment, "method": spec.method, "run": spec.source,
                    "variant": spec.variant, "seed": spec.seed, "init": spec.init or "base",
                    "eval_task": task, "train_task": spec.schedule[cycle] if cycle >= 0 else None,
                    "cycle": cycle, "step": (cycle + 1) * steps,
                    "mean_at_k": float(tidy["mean_at_k"]), "best_at_k": float(tidy["best_at_k"]), "k": k,
                    **_per_problem(ev, summary_file),
                    "kl_to_base": _number(ev.get("kl_to_base")), "entropy": _number(ev.get("entropy")),
                    # share of the samples with a readable answer (NaN: a summary before it was kept)
                    "answered_fraction": _number(ev.get("answered_fraction")),
                    "mean_completion_tokens": _number(ev.get("mean_completion_tokens")),
                    # share of the samples cut at generation.max_new_tokens (NaN: a summary before it was kept)
                    "truncated_fraction": _number(ev.get("truncated_fraction")),
                    "cycle_seconds": info.get("seconds"),
                    # of its threads' time, the CPU the cycle got (None: on a GPU, or not recorded)
                    "cycle_cpu_share": info.get("cpu_share"),
                    # sequences the run sampled up to the point, for training and its rounds
                    "rollouts_sampled": 0 if cycle < 0 else sampled[cycle],
                    "context_id": ev.get("context_id", "seed"),
                    # the context's text's hash (a pool entry's `hash`; None: a summary before it was kept)
                    "context_hash": ev.get("context_hash"),
                    # the point's samples, under the results directory: a run started from the
                    # base model shares the base model's (eval/base/<task>.samples.parquet)
                    "samples_file": os.path.relpath(samples_file(summary_file), results),
                    # the MLflow runs of the evaluation and of the cycle behind the point (None:
                    # the initial weights' cycle, or files written before they were recorded)
                    "eval_run_id": ev.get("mlflow_run_id"), "cycle_run_id": info.get("mlflow_run_id"),
                })
    return rows


def _cycle_infos(spec: RunSpec, results: str) -> list[dict[str, Any] | None]:
    """Each cycle's cycle.json of `spec` (None where it is missing)."""
    paths = [Path(cycle_dir(spec, cycle, results), "cycle.json") for cycle in range(spec.cycles)]
    return [json.loads(p.read_text()) if p.exists() else None for p in paths]


def _rollouts_sampled(infos: list[dict[str, Any] | None]) -> list[int | None]:
    """Per cycle, the sequences the run's cycles up to that one sampled, for training and the
    fast round (`rollouts_sampled` of each cycle.json, `infos`; a run started from another's
    weights counts its own); None from a cycle whose file lacks it (or is missing) on."""
    total: int | None = 0
    out: list[int | None] = []
    for info in infos:
        count = None if info is None else info.get("rollouts_sampled")
        total = None if total is None or count is None else total + int(count)
        out.append(total)
    return out


def _number(value: Any) -> float:
    """A summary's number; NaN for one it has not (absent, or null: JSON has no NaN)."""
    return float("nan") if value is None else float(value)


def _per_problem(summary: dict[str, Any], summary_file: str) -> dict[str, Any]:
    """The point's per-problem mean rewards (ids sorted; from the samples the evaluation job
    wrote beside its summary, None where there are none) and mean@k's standard error over
    problems (the summary's; computed from those means for a summary written before
    evaluations recorded it; NaN when neither exists)."""
    import numpy as np
    import polars as pl

    from fastslow.evaluate import mean_at_k_se

    k = int(summary["k"])
    ids = means = None
    samples = Path(samples_file(summary_file))
    if samples.exists():
        per = (pl.read_parquet(samples, columns=["problem_id", "reward"]).group_by("problem_id")
               .agg(pl.col("reward").mean()).sort("problem_id"))
        ids, means = per["problem_id"].to_list(), per["reward"].to_list()
    se = summary.get(f"mean@{k}_se")
    if se is None:
        se = mean_at_k_se(np.asarray(means, dtype=float).reshape(-1, 1)) if means else float("nan")
    return {"mean_at_k_se": float(se), "problem_ids": ids, "problem_means": means}
