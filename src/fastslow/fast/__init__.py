"""The fast loop: GEPA over a Pareto pool of K contexts (the fast weights Φ).

- `FastAdapter`: gepa adapter evaluating a context with the current weights on a task.
- `Pool`, `PoolEntry`, `select_pareto_pool`: the pool, pool.json, and its Pareto selection.
- `FeedbackEditor` (offline) and `ReflectiveProposer` (LLM reflection) proposers.
- `run_round`: one budgeted round seeded with the pool; `run_gepa_only`: rounds on frozen weights outside
  the workflow (bench/gepa_probe.py; the workflow's GEPA-only baseline is `fastslow.cycle`'s, rule
  `cycle_frozen`).
"""

from fastslow.fast.adapter import FastAdapter, RolloutCache, read_rollouts
from fastslow.fast.config import FastConfig
from fastslow.fast.pool import Pool, PoolEntry, select_pareto_pool
from fastslow.fast.proposers import (
    ContextDoc,
    Demo,
    FeedbackEditor,
    ReflectiveProposer,
    build_reflection_lm,
    junk_reason,
)
from fastslow.fast.round import BudgetGuard, build_seeded_state, run_gepa_only, run_round

__all__ = [
    "BudgetGuard",
    "ContextDoc",
    "Demo",
    "FastAdapter",
    "FastConfig",
    "FeedbackEditor",
    "Pool",
    "PoolEntry",
    "ReflectiveProposer",
    "RolloutCache",
    "build_reflection_lm",
    "build_seeded_state",
    "junk_reason",
    "read_rollouts",
    "run_gepa_only",
    "run_round",
    "select_pareto_pool",
]
