"""Shared record shapes: context hashes, the rollout table both loops read and write, and the
metrics table every method writes."""

from __future__ import annotations

import hashlib
import math
from typing import Any

#: Columns of every rollouts.parquet (slow-loop rollouts; the fast loop may reuse them).
ROLLOUT_COLUMNS: dict[str, str] = {
    "run": "str",  # run id (experiment/task/method/variant/seed)
    "cycle": "int64",
    "step": "int64",  # global RL step
    "problem_id": "str",
    "context_id": "str",  # stable id of the context in the pool
    "context_hash": "str",  # context_hash(text)
    "prompt": "str",  # the full rendered prompt (chat template applied)
    "completion": "str",
    "reward": "float64",
    "feedback": "str",
    "prompt_tokens": "int64",
    "completion_tokens": "int64",
    "logprob_sum": "float64",  # sum of sampling log-probs of the completion tokens
    "truncated": "bool",  # cut at slow.max_new_tokens before an EOS
    "answered": "bool",  # a non-empty <answer> block (`fastslow.tasks.base.answered`): else a format failure
    # not sampled by its step's own generation: by the fast round (fast.reuse_in_slow) or by an
    # earlier step of its block (slow.steps_per_generation), maybe with the same weights
    "reused": "bool",
    # optimiser steps between the weights that sampled it and those its step trained (0: on-policy)
    "policy_lag": "int64",
}

#: Columns of every metrics.parquet: one row per RL or distillation step, and a GEPA-only cycle's
#: one row (at its cycle's last step). Every method's file has them all, so one glob over a
#: ceiling experiment's methods reads as one table; a value a method does not measure is NaN in a
#: float column and null in a count (`complete_metrics`).
METRIC_COLUMNS: dict[str, str] = {
    "run": "str",
    "cycle": "int64",
    "step": "int64",  # global RL step
    "step_in_cycle": "int64",
    "num_contexts": "int64",
    "reward_mean": "float64",
    "reward_std": "float64",
    "frac_zero_std_groups": "float64",
    "answered_fraction": "float64",
    "entropy": "float64",
    "kl_to_base": "float64",  # to the run's KL reference (rl, fst)
    "distill_kl": "float64",  # to the teacher (fst_distill)
    "clip_fraction": "float64",
    "loss": "float64",
    "grad_norm": "float64",
    "lr": "float64",
    "completion_tokens": "int64",
    "mean_completion_tokens": "float64",
    "truncated_fraction": "float64",
    "generation_seconds": "float64",
    "scoring_seconds": "float64",
    "training_seconds": "float64",
    "step_seconds": "float64",
    "generated_tokens_per_s": "float64",
    "reused_rollouts": "int64",
    "sampled_ahead_rollouts": "int64",
    "reused_is_weight": "float64",
    "fast_seconds": "float64",  # a GEPA-only cycle's round (its fast.json `seconds`)
}

_POLARS_TYPES = {"str": "String", "int64": "Int64", "float64": "Float64", "bool": "Boolean"}


def polars_schema(columns: dict[str, str]) -> dict[str, Any]:
    """`columns` (ROLLOUT_COLUMNS, METRIC_COLUMNS) as a polars schema."""
    import polars as pl

    return {name: getattr(pl, _POLARS_TYPES[kind]) for name, kind in columns.items()}


def check_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """`row`, if every key of it is a METRIC_COLUMNS column: a new metric is added there, not
    dropped. Checked as each step's row is made, not when the cycle's table is written at its end."""
    extra = set(row) - METRIC_COLUMNS.keys()
    if extra:
        raise KeyError(f"metrics {sorted(extra)} are not in fastslow.records.METRIC_COLUMNS")
    return row


def complete_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """`row` (`check_metrics`) with every METRIC_COLUMNS column: NaN for a float it lacks, None
    for a count or a name."""
    check_metrics(row)
    return {k: row.get(k, math.nan if kind == "float64" else None) for k, kind in METRIC_COLUMNS.items()}


def metrics_frame(rows: list[dict[str, Any]]) -> Any:
    """A metrics.parquet's table: `rows` completed (`complete_metrics`), in METRIC_COLUMNS' types."""
    import polars as pl

    return pl.DataFrame([complete_metrics(r) for r in rows], schema=polars_schema(METRIC_COLUMNS))


def context_hash(text: str) -> str:
    """A short, stable content hash of a context's text."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
