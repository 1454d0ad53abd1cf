"""One FST cycle, top to bottom: a fast round on the current weights, then T slow steps.

    θ_c, Φ_c ──fast round (GEPA on θ_c, seeded with Φ_c)──► Φ_c+1
    θ_c, Φ_c+1 ──T slow steps (CISPO on prompts drawn from Φ_c+1)──► θ_c+1

Methods are data (see `fastslow.experiments`): `rl` skips the fast round and trains with the
seed context alone; `gepa` skips the slow steps (frozen θ); `fst_distill` replaces the CISPO
steps by reverse-KL distillation of the pool's best context into the weights.

Everything a cycle writes lands in its own directory `out_dir` (the previous cycle's directory is
only read): `model/` and `trainer_state/` (slow), `rollouts.parquet`, `metrics.parquet`,
`pool.json`, `fast.json` (the round's summary) and `cycle.json` (what happened, written last).
"""

from __future__ import annotations

import gc
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from fastslow.config import make_task
from fastslow.experiments import RunSpec
from fastslow.io import write_json, write_parquet
from fastslow.tasks.data import load_problems

log = logging.getLogger("fastslow.cycle")

CYCLE_FILE = "cycle.json"


def weights_of(spec: RunSpec, cycle_dir: Path | None, init_model: Path) -> Path:
    """The weights a cycle ends with: its own `model/` if the method trains, else θ0."""
    if cycle_dir is None or not spec.trains:
        return init_model
    return cycle_dir / "model"


def unique_contexts(entries: list[Any]) -> list[tuple[str, str]]:
    """(id, text) for each of the K slots; a context filling several slots gets suffixed ids."""
    seen: dict[str, int] = {}
    out = []
    for e in entries:
        n = seen.get(e.id, 0)
        seen[e.id] = n + 1
        out.append((e.id if n == 0 else f"{e.id}#{n}", e.text))
    return out


def gepa_split(train: list[Any], n_val: int) -> tuple[list[Any], list[Any]]:
    """GEPA's reflection set and Pareto validation set, both from the train split (the val split
    stays held out for evaluation): the last `n_val` problems validate, the rest reflect."""
    n_val = min(n_val, max(1, len(train) // 2))
    return train[:-n_val], train[-n_val:]


def run_cycle(spec: RunSpec, config: dict[str, Any], cycle: int, init_model: Path,
              prev_dir: Path | None, train_file: Path, out_dir: Path, tracker: Any = None) -> dict[str, Any]:
    """Run cycle `cycle` of `spec` from `prev_dir` (None for cycle 0) into `out_dir`."""
    from fastslow.fast import FastConfig, Pool, run_round
    from fastslow.model.generation import make_generator

    cfg = spec.settings(config)
    task_name = spec.schedule[cycle]
    task = make_task(cfg, task_name)
    train = load_problems(train_file)
    k = cfg["fast"]["pool_size"]
    started = time.perf_counter()
    pool = Pool.from_json(prev_dir / "pool.json") if prev_dir is not None else Pool.seed(cfg["seed_context"], k)
    weights = weights_of(spec, prev_dir, init_model)
    fast_summary: dict[str, Any] = {}
    scratch = out_dir.with_name(out_dir.name + ".fast")

    if spec.fast:
        gen = cfg["generation"]
        fast_dtype = cfg["fast"].get("dtype", "model")
        fast_cfg = FastConfig.from_dict({
            **cfg["fast"], "max_new_tokens": gen["max_new_tokens"], "temperature": gen["temperature"],
            "top_p": gen["top_p"], "seed": spec.seed, "eval_batch_size": gen["batch_size"]})
        reflect, pareto = gepa_split(train, cfg["fast"]["val_problems"])
        reuse = prev_dir / "rollouts.parquet" if (fast_cfg.reuse_rollouts and prev_dir is not None
                                                   and (prev_dir / "rollouts.parquet").exists()) else None
        log.info("cycle %d of %s: fast round on %s (%s, budget %d)", cycle, spec.key, task_name,
                 fast_cfg.proposer, fast_cfg.budget())
        generator = make_generator(gen["backend"], weights,
                                   dtype=cfg["model"]["dtype"] if fast_dtype == "model" else fast_dtype,
                                   batch_size=gen["batch_size"])
        t0 = time.perf_counter()
        # GEPA's own files go beside the cycle dir: the slow step below replaces out_dir whole.
        pool, fast_summary = run_round(pool, generator, task, reflect, pareto, fast_cfg, round_index=cycle,
                                       run_dir=scratch, reuse_rollouts=reuse,
                                       weights_id=f"{spec.key}/cycle{cycle}")
        fast_summary["seconds"] = time.perf_counter() - t0
        del generator
        gc.collect()
        if tracker is not None:
            tracker.log_metrics({"fast/best_val_mean": fast_summary["best_val_mean"],
                                 "fast/generations": fast_summary["generations"],
                                 "fast/seconds": fast_summary["seconds"]}, step=cycle)

    steps = cfg["slow"]["steps_per_cycle"]
    slow_metrics: list[dict[str, Any]] = []
    if spec.trains:
        from fastslow.slow.config import SlowConfig

        slow_cfg = SlowConfig.from_dict({**cfg["slow"], "seed": spec.seed})
        if spec.method == "fst_distill":
            from fastslow.slow.distill import run_distill_cycle as slow_cycle
        else:
            from fastslow.slow.loop import run_cycle as slow_cycle
        contexts = unique_contexts(pool.contexts(k)) if spec.method == "fst" else [("seed", cfg["seed_context"])]
        if spec.method == "fst_distill":
            contexts = [(pool.entries[0].id, pool.entries[0].text)]  # the teacher context
        extra = _continual(spec, cycle)
        if spec.method == "fst_distill":  # the student learns to act, without context, like the teacher
            extra["student_context"] = cfg["seed_context"]
        result = slow_cycle(init_model, prev_dir, contexts, task, train, slow_cfg, out_dir,
                            run_id=spec.key, cycle=cycle, tracker=tracker, **extra)
        slow_metrics = result.metrics
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        rows = [{"run": spec.key, "cycle": cycle, "step": (cycle + 1) * steps - 1,
                 "fast_seconds": fast_summary.get("seconds", 0.0)}]
        write_parquet(rows, out_dir / "metrics.parquet")
    if scratch.exists():
        shutil.rmtree(out_dir / "fast", ignore_errors=True)
        scratch.rename(out_dir / "fast")

    pool.to_json(out_dir / "pool.json")
    write_json(fast_summary, out_dir / "fast.json")
    summary = {"run": spec.key, "method": spec.method, "cycle": cycle, "task": task_name,
               "global_step": (cycle + 1) * steps, "weights": str(weights_of(spec, out_dir, init_model)),
               "pool_best": pool.entries[0].id, "seconds": time.perf_counter() - started,
               "slow_reward_mean": (sum(m["reward_mean"] for m in slow_metrics) / len(slow_metrics)
                                    if slow_metrics and "reward_mean" in slow_metrics[0] else None)}
    write_json(summary, out_dir / CYCLE_FILE)
    return summary


def _continual(spec: RunSpec, cycle: int) -> dict[str, Any]:
    """A continual run's first cycle on a new task starts a fresh data stream."""
    if cycle > 0 and spec.schedule[cycle] != spec.schedule[cycle - 1]:
        return {"new_data": True}
    return {}


def eval_context(spec: RunSpec, config: dict[str, Any], pool_file: Path | None) -> tuple[str, str]:
    """(id, text) of the context a run is evaluated with: the pool's best for `fst` and `gepa`,
    the seed context for `rl` and `fst_distill` (whose context was distilled into the weights)."""
    if spec.method in ("fst", "gepa") and pool_file is not None:
        from fastslow.fast import Pool

        best = Pool.from_json(pool_file).entries[0]
        return best.id, best.text
    return "seed", config["seed_context"]


def read_cycle(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
