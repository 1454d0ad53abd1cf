"""One FST cycle, top to bottom: a fast round on the current weights, then T slow steps.

    θ_c, Φ_c ──fast round (GEPA on θ_c, seeded with Φ_c)──► Φ_c+1
    θ_c, Φ_c+1 ──T slow steps (CISPO on prompts drawn from Φ_c+1)──► θ_c+1

Methods are data (see `fastslow.experiments`): `rl` skips the fast round and trains with the
seed context alone; `gepa` skips the slow steps (frozen θ); `fst_distill` replaces the CISPO
steps by reverse-KL distillation of the pool's best context into the weights.

Everything a cycle writes lands in its own directory `out_dir` (the previous cycle's directory is
only read). Every method writes `metrics.parquet`, `pool.json`, `fast.json` (the round's summary)
and `cycle.json` (what happened, written last); a trained one (rl, fst, fst_distill) also
`model/`, `trainer_state/` and `rollouts.parquet`; `gepa` also `fast_cache.json` (the round's new
evaluations of the frozen weights, which later cycles' rounds on the same task serve free); a
method with a fast round also `fast/` (gepa's run directory and `proposals.json`).

Where the slow steps run: in this process when the job has at most one GPU; with more
(`gpus`, from `fastslow.launch.gpus_requested(snakemake.resources)`) in N ranks started by
`accelerate launch` (`fastslow.launch`, strategy from FASTSLOW_ACCELERATE_STRATEGY, default
fsdp2) running `python -m fastslow.slow.train` on a job spec written beside `out_dir`; this
process then reads the ranks' result back and logs the metrics (the ranks never track; when
they fail or are stopped, it logs the steps they finished, from `<out_dir>.steps.jsonl`).
FASTSLOW_TRAIN_PROCESSES=N overrides the process count (N > 1 forces the launched path, 1 keeps
it in process); without a visible GPU the ranks train on CPU (gloo) with mixed precision off,
which is how tests/test_slow_distributed.py exercises the launched path on a CPU-only machine.
fst_distill launches the same way (its steps shard as the RL loop's do).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fastslow.config import FAST_MIN_TRAIN, chat_template_kwargs, make_task, resolve_sample_dtype
from fastslow.experiments import REFLECTIVE, RunSpec, cycle_section
from fastslow.io import (
    exclusive_lock,
    free_space_error,
    json_text,
    remove_stale_temporaries,
    tree_bytes,
    tree_fingerprint,
    write_json,
    write_parquet,
)
from fastslow.records import metrics_frame
from fastslow.tasks.data import load_problems

log = logging.getLogger("fastslow.cycle")

CYCLE_FILE = "cycle.json"
#: In a cycle's scratch directory: its finished fast round (pool, summary, the rollouts sampled for
#: the first RL steps), for a rerun after the slow steps failed (`run_cycle`'s `job`).
ROUND_DONE = "round_done.json"
FROZEN_CACHE = "fast_cache.json"  # gepa: the round's new evaluations, served free to later cycles' rounds
ENV_TRAIN_PROCESSES = "FASTSLOW_TRAIN_PROCESSES"


def slow_processes(gpus: int) -> int:
    """Processes the slow steps run in: $FASTSLOW_TRAIN_PROCESSES if set, else the job's GPUs."""
    from fastslow.launch import env_int

    return env_int(ENV_TRAIN_PROCESSES, gpus)


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
              prev_dir: Path | None, train_file: Path, out_dir: Path, tracker: Any = None,
              gpus: int = 0, job: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run cycle `cycle` of `spec` from `prev_dir` (None for cycle 0) into `out_dir`; the slow
    steps run in `slow_processes(gpus)` processes (see the module docstring). One process at a
    time: a second one (a job a killed Snakemake left running, and its rerun) stops in one line
    (`fastslow.io.exclusive_lock` on `<out_dir>.lock`).

    `config` is the validated config (`fastslow.config.load_config`), which `spec.settings` applies
    the run's overrides to; `init_model` the run's starting weights (an HF directory, e.g. from
    `prepare_base_model`); `train_file` the cycle's training task's train split (`write_splits`).
    Every method writes its pool, `fast.json` and `metrics.parquet` to `out_dir`, a trained one
    (rl, fst, fst_distill) also its weights, trainer state and rollouts (module docstring);
    `cycle.json` is the summary it returns. (`fastslow.slow.run_cycle` is the slow steps alone.)

    `job` (the Snakemake job's params: code, settings) lets a rerun of an FST cycle that failed
    or was killed during its slow steps take the fast round it finished (`round_key`) instead of
    searching again; None (a call outside the workflow) always runs the round."""
    if not 0 <= cycle < spec.cycles:
        raise ValueError(f"cycle {cycle} of {spec.key}: its schedule has {spec.cycles} cycle(s) "
                         f"({', '.join(spec.schedule)}); it lists each cycle's training task")
    if cycle > 0 and prev_dir is None:
        raise ValueError(f"cycle {cycle} of {spec.key}: prev_dir is None; give cycle {cycle - 1}'s out_dir")
    init_model, train_file, out_dir = Path(init_model), Path(train_file), Path(out_dir)
    prev_dir = None if prev_dir is None else Path(prev_dir)
    with exclusive_lock(out_dir.with_name(out_dir.name + ".lock"), f"cycle {cycle} of {spec.key} ({out_dir})"):
        return _run_cycle(spec, config, cycle, init_model, prev_dir, train_file, out_dir, tracker, gpus, job)


def round_key(job: Mapping[str, Any], spec: RunSpec, cycle: int, inputs: Sequence[Path]) -> str:
    """What a finished fast round depends on: the job's params (library code, settings), the run
    and cycle, and its input files as found on disk (`tree_fingerprint`: names, sizes,
    modification times; a previous cycle run again, or base weights rebuilt, gives another key)."""
    import hashlib

    files = [[str(p.resolve()), tree_fingerprint(p)] for p in inputs if p.exists()]
    payload = json_text({"job": job, "run": spec.key, "cycle": cycle, "files": files}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def round_inputs(init_model: Path, train_file: Path, prev_dir: Path | None) -> list[Path]:
    """The files a cycle's fast round depends on, for its `round_key`: the initial weights, the
    train split and the previous cycle's pool, weights, trainer state and rollouts."""
    return [init_model, train_file, *([prev_dir / n for n in ("pool.json", "model", "trainer_state", "rollouts.parquet")]
                                      if prev_dir is not None else [])]


def _finished_round(scratch: Path, key: str | None) -> dict[str, Any] | None:
    """The round a failed or killed run of the same job finished (`ROUND_DONE` in its scratch
    directory, with the same `round_key`), else None."""
    import json

    marker = scratch / ROUND_DONE
    if key is None or not marker.exists():
        return None
    try:
        done = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return done if isinstance(done, dict) and done.get("key") == key else None


def first_cycle_bytes(init_model: Path) -> int:
    """About what a training cycle saves, from its initial weights: the weights in float32 and
    AdamW's two float32 moments, 12 bytes a parameter (the parameters counted from the
    safetensors headers; a bf16 checkpoint's own size is a sixth of this). A sharded checkpoint's
    shards are those its index names, as transformers loads them: a consolidated copy shipped
    beside them (Mistral's) is not counted twice. Without safetensors, the directory's size (a
    lower bound)."""
    import json

    from safetensors import safe_open

    index = init_model / "model.safetensors.index.json"
    try:
        files = sorted({init_model / name for name in json.loads(index.read_text())["weight_map"].values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # no index (one file), or unreadable
        files = sorted(init_model.glob("*.safetensors"))
    params = 0
    for path in files:
        with safe_open(str(path), "np") as f:  # the header only
            for key in f.keys():
                n = 1
                for dim in f.get_slice(key).get_shape():
                    n *= dim
                params += n
    return 12 * params if params else tree_bytes(init_model)


def _torch_threads() -> int | None:
    """torch's intra-op threads in this process (None where torch was never imported)."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else None


def _cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children it has waited for (the
    ranks of a multi-GPU cycle, codeio's scoring subprocesses)."""
    import resource

    own, ranks = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + ranks.ru_utime + ranks.ru_stime


def _device() -> str:
    """Where this process computed: "cuda" when torch sees a GPU, else "cpu"."""
    torch = sys.modules.get("torch")
    return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"


def _run_cycle(spec: RunSpec, config: dict[str, Any], cycle: int, init_model: Path,
               prev_dir: Path | None, train_file: Path, out_dir: Path, tracker: Any, gpus: int,
               job: Mapping[str, Any] | None = None) -> dict[str, Any]:
    from fastslow.fast import FastConfig, Pool, RolloutCache, run_round
    from fastslow.memory import limit_heap_fragmentation, release_free_memory, release_gpu_memory
    from fastslow.model.generation import make_generator

    limit_heap_fragmentation()  # FASTSLOW_MMAP_THRESHOLD (off by default): trade time for peak memory
    cfg = spec.settings(config)
    processes = slow_processes(gpus)
    slow_cfg = None
    if spec.trains:
        from fastslow.slow.config import SlowConfig
        from fastslow.slow.loop import check_device

        # fst_distill's: the keys its steps read, the rest (CISPO's, vLLM's) at SlowConfig's defaults
        slow_cfg = SlowConfig.from_dict({**cycle_section(spec.method, "slow", cfg["slow"]), "seed": spec.seed,
                                         "chat_template_kwargs": chat_template_kwargs(cfg)})
        check_device(slow_cfg)  # use_vllm without CUDA, bf16 this CPU lacks: refused now, not after the fast round
        if tracker is not None:  # `slow.bf16: auto` as this machine resolved it (the params say "auto")
            tracker.set_tags({"fastslow.bf16_training": str(slow_cfg.bf16).lower(),  # and checkpointing's
                              "fastslow.activation_checkpointing": str(slow_cfg.activation_checkpointing).lower()})
        strategy: dict[str, Any] = {}
        if processes > 1:  # P*G must split over the ranks, and a strategy the loops run: refused
            from fastslow.launch import check_training_strategy, strategy_settings
            from fastslow.slow.loop import check_ranks

            check_ranks(slow_cfg, processes)  # now, not after the fast round
            strategy = strategy_settings(check_training_strategy())
        if spec.method == "fst_distill":  # a model too large for its GPUs is refused now, too
            from fastslow.slow.distill import device_memory_check

            problem, risk = device_memory_check(init_model, slow_cfg, processes, **strategy)
            if problem:
                raise ValueError(problem)
            if risk:
                log.warning("%s", risk)
    if spec.fast and cfg["fast"]["proposer"] == REFLECTIVE:  # before loading anything: seconds, not a round
        from fastslow.fast.proposers import reflection_environment_error

        problem = reflection_environment_error(cfg["fast"]["reflection"])
        if problem:
            raise ValueError(problem)
    if spec.trains:  # now, not when the trained weights are saved at the cycle's end
        saved = [prev_dir / d for d in ("model", "trainer_state")] if prev_dir is not None else []
        needed = sum(tree_bytes(d) for d in saved if d.exists()) or first_cycle_bytes(init_model)
        # the previous cycle's weights and optimiser state (the first cycle's: estimated from its
        # initial weights): what this one saves
        remove_stale_temporaries(out_dir)  # a killed save's: the space it holds is this save's
        problem = free_space_error(out_dir.parent, needed, f"cycle {cycle} of {spec.key}")
        if problem:
            raise OSError(problem)
    task_name = spec.schedule[cycle]
    task = make_task(cfg, task_name)
    train = load_problems(train_file)
    k = cfg["fast"]["pool_size"]
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    pool = Pool.from_json(prev_dir / "pool.json") if prev_dir is not None else Pool.seed(cfg["seed_context"], k)
    weights = weights_of(spec, prev_dir, init_model)
    fast_summary: dict[str, Any] = {}
    scratch = out_dir.with_name(out_dir.name + ".fast")
    # A scratch dir found here is an interrupted job's (a finished one renames it into out_dir).
    # Its round, if it finished (ROUND_DONE) with the same key, is this run's: an FST cycle that
    # failed in its slow steps does not search again. Otherwise it goes: no round restarts from
    # a part (`run_round`), and left in place it would be renamed into this cycle's out_dir/fast
    # below even when this run has no fast round.
    key = None
    if job is not None and spec.fast and spec.trains:
        key = round_key(job, spec, cycle, round_inputs(init_model, train_file, prev_dir))
    resumed = _finished_round(scratch, key)
    if resumed is None:
        shutil.rmtree(scratch, ignore_errors=True)
    round_rollouts = None  # reuse_in_slow: the round's samples for the first RL steps
    frozen = spec.fast and not spec.trains  # gepa: every round samples the same weights
    weights_id = f"{spec.key}/frozen" if frozen else f"{spec.key}/cycle{cycle}"
    slow_problems: list[Any] = []  # the first RL steps', sampled by the fast round (reuse_in_slow)
    cache = None
    carried: set[tuple[str, str, str]] = set()  # gepa: the evaluations read from earlier cycles' files,
    cache_files: list[Path] = []  # and those files
    fast_dtype = None  # no fast round (rl)

    if spec.fast:
        gen = cfg["generation"]
        # the round's sampling dtype on this machine (the params may say "bfloat16_if_native")
        fast_dtype = resolve_sample_dtype(cfg["fast"].get("dtype", "model"), cfg["model"]["dtype"])
        # what its params hold: no reflection model for the offline proposer, the preset's budget alone
        fast_cfg = FastConfig.from_dict({
            **cycle_section(spec.method, "fast", cfg["fast"]), "max_new_tokens": gen["max_new_tokens"], "temperature": gen["temperature"],
            "top_p": gen["top_p"], "seed": spec.seed, "eval_batch_size": gen["batch_size"]})
        if len(train) < FAST_MIN_TRAIN:  # a file task with fewer rows than data.sizes.train asks for
            own = cfg["data"].get("files", {}).get(task_name)
            fix = (f"add train rows to {own['path']}" if own else "raise data.sizes.train")
            raise ValueError(f"task {task_name!r}: its train split {train_file} has {len(train)} problem(s), and a "
                             f"fast round needs at least {FAST_MIN_TRAIN} (one to validate on, one to reflect on): {fix}")
        reflect, pareto = gepa_split(train, cfg["fast"]["val_problems"])
        # the previous cycle's rollouts and evaluations are of its task's problems, keyed by problem
        # id: a continual run's first cycle on a new task takes none (two tasks' ids may coincide)
        same_task = prev_dir is not None and not _continual(spec, cycle)
        reuse = prev_dir / "rollouts.parquet" if (fast_cfg.reuse_rollouts and same_task
                                                   and (prev_dir / "rollouts.parquet").exists()) else None
        if fast_cfg.reuse_in_slow and spec.method == "fst" and spec.trains:
            from fastslow.slow.loop import cycle_step_problems

            served = min(fast_cfg.reuse_steps, slow_cfg.steps_per_cycle)  # more than T: all T
            slow_problems = cycle_step_problems(prev_dir, train, slow_cfg, steps=served,
                                                new_data=bool(_continual(spec, cycle)))
            cache = RolloutCache()
        if frozen:  # the earlier rounds' evaluations are this one's too: not re-generated, not charged
            cache = RolloutCache()
            if same_task:  # each earlier cycle's file holds its own round's and names the ones before it
                cache, cache_files = RolloutCache.from_chain(prev_dir / FROZEN_CACHE)
                log.info("cycle %d of %s: %d evaluations of the frozen weights carried from %d earlier cycle(s)",
                         cycle, spec.key, len(cache), len(cache_files))
            carried = set(cache.entries)
        log.info("cycle %d of %s: fast round on %s (%s, budget %d)", cycle, spec.key, task_name,
                 fast_cfg.proposer, fast_cfg.budget())
        if tracker is not None:
            tracker.set_tags({"fastslow.fast_dtype": fast_dtype})
        if resumed is not None:
            from fastslow.slow.train import decode_extra

            pool, fast_summary = Pool.from_dict(resumed["pool"]), resumed["summary"]
            round_rollouts = decode_extra(resumed.get("extra")).get("round_rollouts")
            log.warning("cycle %d of %s: the fast round a failed run of this job finished is taken from %s "
                        "(%d metric calls, not searched again)", cycle, spec.key, scratch / ROUND_DONE,
                        fast_summary.get("metric_calls", 0))
            if tracker is not None:
                tracker.set_tags({"fastslow.round_resumed": "true"})
        else:
            t0 = time.perf_counter()  # the round's time includes loading its sampler (else counted as I/O)
            generator = make_generator(gen["backend"], weights, dtype=fast_dtype,
                                       batch_size=gen["batch_size"],
                                       gpu_memory_utilization=gen.get("gpu_memory_utilization"),
                                       chat_template_kwargs=chat_template_kwargs(cfg))
            # GEPA's own files go beside the cycle dir: the slow step below replaces out_dir whole.
            pool, fast_summary = run_round(pool, generator, task, reflect, pareto, fast_cfg, round_index=cycle,
                                           run_dir=scratch, reuse_rollouts=reuse, weights_id=weights_id,
                                           cache=cache, slow_problems=slow_problems,
                                           slow_samples=cfg["slow"]["num_generations"] // k)
            fast_summary["seconds"] = time.perf_counter() - t0
            del generator
            gc.collect()
            release_free_memory()  # the generator's pages, before training allocates its own
            release_gpu_memory()  # and its GPU memory (vLLM), before the slow steps' vLLM and weights
            if cache is not None and spec.method == "fst" and spec.trains:  # reuse_in_slow
                round_rollouts = cache.sampled([text for _, text in unique_contexts(pool.contexts(k))],
                                               slow_problems, weights_id)
            if key is not None:  # kept until the cycle succeeds: a rerun after a failed slow step takes it
                from fastslow.slow.train import encode_extra

                write_json({"key": key, "pool": pool.to_dict(), "summary": fast_summary,
                            "extra": encode_extra({"round_rollouts": round_rollouts})}, scratch / ROUND_DONE)
        if tracker is not None:
            tracker.log_metrics({"fast/best_val_mean": fast_summary["best_val_mean"],
                                 "fast/generations": fast_summary["generations"],
                                 "fast/metric_calls": fast_summary["metric_calls"],
                                 "fast/proposed": fast_summary["proposed"],
                                 "fast/accepted": fast_summary["accepted"],
                                 "fast/seconds": fast_summary["seconds"],
                                 "fast/seed_eval_seconds": fast_summary["seed_eval_seconds"],
                                 "fast/search_eval_seconds": fast_summary["search_eval_seconds"],
                                 "fast/slow_sample_seconds": fast_summary["slow_sample_seconds"],
                                 **{f"fast/{key}": fast_summary[key] for key in
                                    ("reflection_calls", "reflection_failed_calls") if key in fast_summary}},
                                step=cycle * cfg["slow"]["steps_per_cycle"])  # the slow step it precedes

    steps = cfg["slow"]["steps_per_cycle"]
    slow_metrics: list[dict[str, Any]] = []
    if spec.trains:
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
            if pool.entries[0].text == cfg["seed_context"]:  # no context of the round's beats the seed
                log.warning("fst_distill %s cycle %d: the pool's best context is the seed context the "
                            "student already has: the teacher is the student, nothing is distilled this "
                            "cycle (its steps move the weights by weight decay alone)", spec.key, cycle)
        if round_rollouts is not None:  # reuse_in_slow: the round sampled the first steps' problems
            extra["round_rollouts"] = round_rollouts
        if processes > 1:
            slow_metrics = launch_slow(spec, cfg, task_name, cycle, init_model, prev_dir, contexts,
                                       train_file, slow_cfg, out_dir, extra, processes, tracker)
        else:
            result = slow_cycle(init_model, prev_dir, contexts, task, train, slow_cfg, out_dir,
                                run_id=spec.key, cycle=cycle, tracker=tracker, **extra)
            slow_metrics = result.metrics
    else:
        out_dir.mkdir(parents=True, exist_ok=True)
        rows = [{"run": spec.key, "cycle": cycle, "step": (cycle + 1) * steps - 1,
                 "fast_seconds": fast_summary.get("seconds", 0.0)}]
        write_parquet(metrics_frame(rows), out_dir / "metrics.parquet")
        if frozen and cache is not None:
            # this round's new evaluations only: a file holding every earlier round's too grew by a
            # round every cycle, and every cycle's was kept (quadratic in a run's cycles)
            fast_summary["cached_evaluations"] = cache.to_json(out_dir / FROZEN_CACHE, weights_id, skip=carried,
                                                                earlier=cache_files)
            fast_summary["carried_evaluations"] = len(carried)
    if scratch.exists():
        (scratch / ROUND_DONE).unlink(missing_ok=True)  # the cycle succeeded: nothing to resume
        shutil.rmtree(out_dir / "fast", ignore_errors=True)
        scratch.rename(out_dir / "fast")

    pool.to_json(out_dir / "pool.json")
    write_json(fast_summary, out_dir / "fast.json")
    seconds, cpu_seconds = time.perf_counter() - started, _cpu_seconds() - cpu_started
    device, threads = _device(), _torch_threads()
    summary = {"run": spec.key, "method": spec.method, "cycle": cycle, "task": task_name,
               "global_step": (cycle + 1) * steps, "weights": str(weights_of(spec, out_dir, init_model)),
               "pool_best": pool.entries[0].id, "seconds": seconds,
               # the CPU time it got (its ranks' too): wall `seconds` on a shared CPU are also the other
               # jobs' doing; `cpu_share`, of its threads' time, says how much (1: the machine to itself)
               "cpu_seconds": cpu_seconds, "device": device,
               "cpu_share": cpu_seconds / (seconds * threads) if device == "cpu" and threads and seconds > 0 else None,
               "mlflow_run_id": getattr(tracker, "run_id", None),  # the cycle job's run (None untracked)
               # how this machine computed it: `slow.bf16: auto` resolved (None: no training), threads
               "bf16_training": slow_cfg.bf16 if slow_cfg is not None else None,
               "activation_checkpointing": slow_cfg.activation_checkpointing if slow_cfg is not None else None,
               # and the fast round's sampling dtype (`fast.dtype: bfloat16_if_native` resolved)
               "fast_dtype": fast_dtype,
               "torch_threads": threads,
               # fst_distill: whether the teacher's context was the student's own (nothing distilled)
               **({"teacher_is_student": pool.entries[0].text == cfg["seed_context"]}
                  if spec.method == "fst_distill" else {}),
               "slow_reward_mean": _steps_mean(slow_metrics, "reward_mean"),
               # of its RL steps' completions, the share with an answer (reward 0 without: the format)
               "slow_answered_fraction": _steps_mean(slow_metrics, "answered_fraction"),
               # sequences sampled for training and the round (evaluation's not): a samples axis
               "rollouts_sampled": _rollouts_sampled(out_dir, slow_metrics, fast_summary)}
    write_json(summary, out_dir / CYCLE_FILE)
    return summary


def _rollouts_sampled(out_dir: Path, metrics: list[dict[str, Any]], fast: Mapping[str, Any]) -> int:
    """The sequences the cycle sampled, evaluation's not: its slow steps' rollouts
    (`rollouts.parquet`) but those the round sampled for them (`reused_rollouts`, less the rows an
    earlier step sampled ahead under `slow.steps_per_generation`, which it counts too), and the
    round's own, its search's (`generations`; reused RL rollouts are not generated) and those it
    drew for the slow steps (`slow_rollouts`). FST's steps count RL steps (README "What a step
    counts"); this counts what both loops sampled."""
    rows = 0
    if (out_dir / "rollouts.parquet").exists():
        import polars as pl

        rows = pl.scan_parquet(out_dir / "rollouts.parquet").select(pl.len()).collect().item()
    served = sum(int(m.get("reused_rollouts") or 0) - int(m.get("sampled_ahead_rollouts") or 0) for m in metrics)
    return rows - served + int(fast.get("generations", 0)) + int(fast.get("slow_rollouts", 0))


def _steps_mean(metrics: list[dict[str, Any]], key: str) -> float | None:
    """The mean of the slow steps' metric `key` (None: no steps, or a metric they do not record)."""
    return sum(m[key] for m in metrics) / len(metrics) if metrics and key in metrics[0] else None


def launch_slow(spec: RunSpec, cfg: dict[str, Any], task_name: str, cycle: int, init_model: Path,
                prev_dir: Path | None, contexts: list[tuple[str, str]], train_file: Path,
                slow_cfg: Any, out_dir: Path, extra: dict[str, Any], processes: int,
                tracker: Any = None) -> list[dict[str, Any]]:
    """The slow steps of a cycle in `processes` ranks (`accelerate launch` of
    `fastslow.slow.train`); returns the per-step metrics and logs them to `tracker`.

    The job spec and the result JSON live beside `out_dir` (the cycle replaces `out_dir` whole)
    and are removed after a success; after a failure they stay for a rerun by hand.
    """
    import torch

    from fastslow.launch import build_command, run
    from fastslow.slow.loop import check_device
    from fastslow.slow.train import (
        clear_errors,
        default_result_path,
        default_steps_path,
        log_result,
        read_errors,
        read_result,
        read_steps,
        write_spec,
    )

    check_device(slow_cfg)  # the GPU-less case fails here, in one line, not in N ranks
    # (the fast round's generator gave its GPU memory back in run_cycle, release_gpu_memory)
    spec_path = out_dir.with_name(out_dir.name + ".job.json")
    result_path = default_result_path(out_dir)
    result_path.unlink(missing_ok=True)
    clear_errors(result_path)  # an earlier attempt's
    write_spec(spec_path, method=spec.method, init_model=init_model, prev_dir=prev_dir,
               contexts=contexts, task={"name": task_name, "config": {"data": cfg["data"]}},
               train_file=train_file, slow=slow_cfg.to_dict(), out_dir=out_dir, run_id=spec.key,
               cycle=cycle, extra=extra, result=result_path)
    # No GPU (tests, FASTSLOW_TRAIN_PROCESSES on a CPU machine): the ranks train on CPU (TRL's
    # use_cpu: gloo); the strategy configs ask for bf16, which CPU training does not use here.
    cpu = not torch.cuda.is_available()
    command = build_command("fastslow.slow.train", ["--spec", str(spec_path)], gpus=processes,
                            accelerate_args=["--mixed_precision", "no"] if cpu else [])
    log.info("cycle %d of %s: slow steps in %d processes: %s", cycle, spec.key, processes,
             " ".join(command))
    steps_path = default_steps_path(out_dir)
    steps_path.unlink(missing_ok=True)  # an earlier attempt's
    logged: list[bool] = []

    def log_finished_steps() -> None:
        """The ranks failed or were stopped: the steps they finished, to the job's MLflow run."""
        if logged or tracker is None:
            return
        logged.append(True)
        rows = read_steps(steps_path)
        for row in rows:
            tracker.log_metrics(row["metrics"], step=row["step"])
        log.warning("cycle %d of %s: the ranks stopped after %d of %d steps; the metrics of those are logged",
                    cycle, spec.key, len(rows), slow_cfg.steps_per_cycle)

    try:
        with _Relay(sys.stderr) as relay:
            run(command, stderr=relay.stderr, before_stop=lambda: (relay.drain(), log_finished_steps()))
    except subprocess.CalledProcessError as err:
        log_finished_steps()
        raise RuntimeError(ranks_failed(cycle, spec.key, processes, err.returncode, read_errors(result_path))) from err
    except FileNotFoundError:  # `run`'s "no such command" (accelerate missing): no rank started, none stopped
        raise
    except Exception:
        log_finished_steps()
        raise
    result = read_result(result_path)
    log_result(result, tracker)
    for path in (spec_path, result_path, steps_path):
        path.unlink(missing_ok=True)
    return result["metrics"]


def ranks_failed(cycle: int, run: str, processes: int, returncode: int, errors: list[tuple[int, str]]) -> str:
    """The one line a cycle whose ranks failed ends on: the error the first failing rank recorded
    (`fastslow.slow.train.record_error`), which the log holds among every rank's output and the
    launcher's report, or, when none did, how the launcher ended (a rank killed outright: out of
    memory, a crash)."""
    head = f"cycle {cycle} of {run}: the slow steps failed in their {processes} processes"
    if errors:
        rank, line = errors[0]
        parts = [f"rank {rank} was the first to record an error: {line}"]
        if len(errors) > 1:
            parts.append(f"{len(errors) - 1} other rank{'s' * (len(errors) > 2)} recorded one after it")
        if len(errors) < processes:  # a rank killed outright (the others then fail on its broken collective)
            silent = processes - len(errors)
            parts.append(f"{silent} recorded none (killed outright, out of memory?, or failed before it started)")
        return f"{head}: {'; '.join(parts)}; every rank's traceback is in this job's log"
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
    return (f"{head} ({how}) and no rank recorded an error: one was killed outright (out of memory?) "
            "or crashed; the ranks' output is in this job's log")


#: A line of a rank's own logging (`python -m fastslow.slow.train`'s format): rank, level, logger, message.
_RANK_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ rank(\d+) (INFO|WARNING|ERROR|CRITICAL) "
                        r"(fastslow[\w.]*): (.*)$")


class _Relay:
    """What the ranks write to stderr, for `launch.run` (`stderr`): all of it to `stream` (the
    rule's log file) as written, and the lines of our own loggers (a step's line, the loop's
    warnings) also to the console, labelled with the job as its own lines are
    (`fastslow.jobs.setup_logging`): at 8B a step takes minutes, and the console showed nothing
    of the slow steps of a multi-GPU cycle. Without a console handler (not a workflow job) or a
    file to write to, the ranks inherit `stream` (None: this process's stderr). `drain` waits
    until everything the ranks wrote is written (once they have stopped; a stop signal's handler
    ends the process without leaving the block)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.stderr, self._write_fd, self._thread = stream, stream, None, None

    def __enter__(self) -> _Relay:
        try:
            self.stream.fileno()
        except (AttributeError, OSError, ValueError):
            self.stderr = None
            return self
        console = [h for h in logging.getLogger().handlers if getattr(h, "stream", None) is sys.__stderr__]
        if console:
            read_fd, self._write_fd = os.pipe()
            self.stderr = self._write_fd
            self._thread = threading.Thread(target=self._relay, args=(read_fd, console), name="ranks-stderr",
                                            daemon=True)
            self._thread.start()
        return self

    def _relay(self, read_fd: int, console: list[logging.Handler]) -> None:
        # newline="": each line written as the ranks wrote it (a progress bar's \r kept)
        with os.fdopen(read_fd, encoding="utf-8", errors="replace", newline="") as lines:
            for line in lines:  # read to the end whatever fails: a full pipe would block the ranks
                with contextlib.suppress(Exception):
                    self.stream.write(line)
                    self.stream.flush()
                with contextlib.suppress(Exception):
                    if m := _RANK_LINE.match(line.rstrip("\r\n")):
                        rank, level, name, message = m.groups()
                        record = logging.makeLogRecord({"name": name, "levelname": level,
                                                        "levelno": getattr(logging, level), "msg": f"rank{rank} {message}"})
                        for handler in console:
                            if record.levelno >= handler.level:
                                handler.handle(record)

    def drain(self) -> None:
        """The ranks have ended: close our end of the pipe and wait for the relay to reach its end."""
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
        if self._thread is not None:
            self._thread.join(timeout=30)

    def __exit__(self, *exc: object) -> None:
        self.drain()


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
