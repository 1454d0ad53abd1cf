"""One slow-loop cycle: T CISPO steps from the previous cycle's state to the next.

`run_cycle` reads weights from `model_dir` (cycle 0) or from the previous cycle's output
(`state_in`), restores the optimiser, lr scheduler, RNG and data position, runs T steps and
writes, atomically (temp sibling, then rename), into `out_dir`:

    model/             the HF model directory after the cycle (weights + tokenizer)
    trainer_state/     optimizer.pt, scheduler.pt, rng_state.pt, state.json (step, data cursor)
    rollouts.parquet   one row per rollout, columns `fastslow.records.ROLLOUT_COLUMNS`
    metrics.parquet    one row per RL step

A chain of cycles gives the same rewards and weights as one uninterrupted run
(tests/test_slow_resume.py): the data order is a pure function of (seed, cursor), the RNG state
is saved and restored after the trainer is built, and the optimiser and scheduler state dicts are
saved exactly. `step` in every table is the 0-based global RL step = the number of optimiser
updates the sampling weights had received.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fastslow.records import ROLLOUT_COLUMNS, context_hash
from fastslow.slow.config import SlowConfig
from fastslow.slow.trainer import TaskReward, build_trainer, expand_rows
from fastslow.tasks.base import Problem, Task, build_messages

log = logging.getLogger("fastslow.slow")

STATE_FILE = "state.json"


class Tracker(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...


@dataclass
class CycleResult:
    """What a cycle wrote and how it went."""

    out_dir: Path
    global_step: int  # optimiser steps done after this cycle
    metrics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def model_dir(self) -> Path:
        return self.out_dir / "model"

    @property
    def state_dir(self) -> Path:
        return self.out_dir / "trainer_state"

    @property
    def rollouts_path(self) -> Path:
        return self.out_dir / "rollouts.parquet"

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / "metrics.parquet"

    @property
    def rewards(self) -> list[float]:
        """Mean reward of each step of the cycle."""
        return [m["reward_mean"] for m in self.metrics]


# ---------------------------------------------------------------- checks and data order


def check_device(cfg: SlowConfig) -> None:
    """Fail in one line, before any work, when the config asks for a GPU this machine lacks."""
    import torch

    wants = [name for name in ("use_vllm", "bf16") if getattr(cfg, name)]
    if wants and not torch.cuda.is_available():
        raise RuntimeError(f"slow loop: {' and '.join(wants)} need a CUDA GPU, and none is visible "
                           "here; set slow.use_vllm=false and slow.bf16=false to run on CPU")
    if cfg.use_vllm:
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise RuntimeError("slow loop: use_vllm=true but vllm is not installed; "
                               "install the GPU extra (`pip install -e .[gpu]`)") from None


def problems_fingerprint(problems: Sequence[Problem]) -> str:
    """Identifies the training set and its order (the data cursor is only meaningful for it)."""
    return hashlib.sha256("\n".join(p.id for p in problems).encode()).hexdigest()[:16]


def take_problems(n: int, seed: int, cursor: int, count: int) -> list[int]:
    """Indices of problems at stream positions cursor..cursor+count-1.

    The stream is one seeded permutation of range(n) per epoch, a pure function of
    (seed, epoch), so the data position is a single integer.
    """
    out = []
    for pos in range(cursor, cursor + count):
        epoch, offset = divmod(pos, n)
        order = np.random.default_rng([seed, epoch]).permutation(n)
        out.append(int(order[offset]))
    return out


# ---------------------------------------------------------------- state


def _rng_state() -> dict[str, Any]:
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _save_state(trainer: Any, state_dir: Path, info: dict[str, Any]) -> None:
    import torch

    state_dir.mkdir(parents=True)
    torch.save(trainer.optimizer.state_dict(), state_dir / "optimizer.pt")
    torch.save(trainer.lr_scheduler.state_dict(), state_dir / "scheduler.pt")
    torch.save(_rng_state(), state_dir / "rng_state.pt")
    (state_dir / STATE_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def read_state(state_in: str | Path) -> dict[str, Any]:
    """The `state.json` of a cycle directory (global_step, cursor, run, cycle, ...)."""
    path = Path(state_in) / "trainer_state" / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{state_in} is not a slow-cycle output: {path} is missing")
    return json.loads(path.read_text())


def resume_point(model_dir: Path, state_in: str | Path | None, problems: Sequence[Problem],
                 new_data: bool) -> tuple[Path, int, int, str]:
    """Where a cycle starts: (weights dir, global step, data cursor, train-set fingerprint).

    Checks the train set (non-empty, unique ids) and that a resumed data position refers to the
    same train set and order, unless `new_data` (a continual run switched task) restarts it at 0.
    """
    if not problems:
        raise ValueError("train_problems is empty")
    if len({p.id for p in problems}) != len(problems):
        raise ValueError("train_problems have duplicate ids")
    fingerprint = problems_fingerprint(problems)
    if state_in is None:
        return Path(model_dir), 0, 0, fingerprint
    prev = read_state(state_in)
    if prev["problems_fingerprint"] != fingerprint and not new_data:
        raise ValueError(f"state_in {state_in} was trained on a different train set (or order); "
                         "the data position would be meaningless (pass new_data=True for a "
                         "new task)")
    return Path(state_in) / "model", prev["global_step"], 0 if new_data else prev["cursor"], fingerprint


# ---------------------------------------------------------------- one RL step


def _rl_step(trainer: Any, reward: TaskReward, rows: list[dict[str, Any]], cfg: SlowConfig,
             prompt_texts: dict[tuple[str, str], str]) -> tuple[dict[str, Any], list[dict]]:
    """Generate, score, one optimiser step. Returns (metrics, rollout records)."""
    import torch
    from trl.trainer.utils import split_tensor_dict

    trainer.reset_step_stats()
    model = trainer.model
    start = time.perf_counter()
    model.train()
    lr = float(trainer.lr_scheduler.get_last_lr()[0])
    batch = trainer._generate_and_score_completions(rows)
    loss_total = 0.0
    for micro in split_tensor_dict(batch, trainer.current_gradient_accumulation_steps):
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(model, micro)
        trainer.accelerator.backward(loss)
        loss_total += float(loss.detach())
    if cfg.max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.state.global_step += 1  # TRL syncs vLLM weights when this changes
    seconds = time.perf_counter() - start

    mask = batch["completion_mask"].float()
    logps = torch.cat([lp for lp, _ in trainer.stash]).float()
    entropies = torch.cat([ent for _, ent in trainer.stash]).float()
    n_tokens = mask.sum().clamp(min=1.0)
    # vLLM reports its own sampling log-probs; on the HF path the loss forward (same weights,
    # same temperature, before the update) gives them exactly.
    sampling = batch.get("sampling_per_token_logps")
    sampled = sampling.float() if sampling is not None else logps
    logprob_sums = (torch.nan_to_num(sampled) * mask).sum(1).tolist()
    if "ref_per_token_logps" in batch:
        delta = batch["ref_per_token_logps"].float() - logps
        kl = float(((torch.exp(delta) - delta - 1) * mask).sum() / n_tokens)
    else:  # beta = 0: no reference model in the trainer
        kl = math.nan
    trl_metrics = trainer._metrics["train"]
    clip = trl_metrics.get("cispo_clip_ratio") or [math.nan]
    trl_metrics.clear()

    rewards = np.asarray(reward.last_rewards, dtype=float)
    group = trainer.num_generations
    grouped = rewards.reshape(-1, group)
    completion_tokens = batch["completion_mask"].sum(1).tolist()
    prompt_tokens = batch["prompt_mask"].sum(1).tolist()
    gen_s, score_s = trainer.timings["generation"], trainer.timings["scoring"]
    metrics = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "frac_zero_std_groups": float(np.mean(np.isclose(grouped.std(axis=1), 0.0))),
        "entropy": float((entropies * mask).sum() / n_tokens),
        "kl_to_base": kl,
        "clip_fraction": float(np.mean(clip)),
        "loss": loss_total,
        "lr": lr,
        "completion_tokens": int(sum(completion_tokens)),
        "mean_completion_tokens": float(np.mean(completion_tokens)),
        "generation_seconds": gen_s,
        "scoring_seconds": score_s,
        "training_seconds": seconds - gen_s - score_s,
        "step_seconds": seconds,
        "generated_tokens_per_s": float(sum(completion_tokens) / max(gen_s, 1e-9)),
    }
    records = [{
        "problem_id": row["problem_id"],
        "context_id": row["context_id"],
        "prompt": prompt_texts[(row["problem_id"], row["context_id"])],
        "completion": reward.last_texts[i],
        "reward": float(rewards[i]),
        "feedback": reward.last_feedback[i],
        "prompt_tokens": int(prompt_tokens[i]),
        "completion_tokens": int(completion_tokens[i]),
        "logprob_sum": float(logprob_sums[i]),
    } for i, row in enumerate(rows)]
    return metrics, records


# ---------------------------------------------------------------- the cycle


def run_cycle(
    model_dir: str | Path,
    state_in: str | Path | None,
    contexts: Sequence[tuple[str, str]],
    task: Task,
    train_problems: Sequence[Problem],
    cfg: SlowConfig,
    out_dir: str | Path,
    run_id: str,
    cycle: int,
    tracker: Tracker | None = None,
    progress: bool = True,
    ref_model_dir: str | Path | None = None,
    new_data: bool = False,
) -> CycleResult:
    """Run T = cfg.steps_per_cycle RL steps and write the cycle's outputs to `out_dir`.

    Args:
        model_dir: the run's initial weights θ0 (HF directory): the starting point when
            `state_in` is None, and the KL reference unless `ref_model_dir` is given.
        state_in: the previous cycle's `out_dir` (weights, optimiser, scheduler, RNG, data
            position), or None to start fresh.
        contexts: the pool, as (context_id, text) pairs; K = len(contexts) must divide G.
            The RL-only baseline is one fixed seed context.
        task: scores rollouts (`reward`) and explains them (`feedback`, stored per rollout).
        train_problems: the training set; its order must be the same in every cycle of a run.
        run_id, cycle: written into every rollout row and into the state.
        tracker: anything with `log_metrics(dict, step)`, called once per step.
        progress: log one line per step (step, reward, tokens/s, seconds) to stderr.
        ref_model_dir: the KL reference, if not `model_dir`.
        new_data: `train_problems` is a new training set (a continual run switching task):
            start its data stream at position 0; weights, optimiser, scheduler and RNG carry on.
    """
    import torch

    from fastslow.model.convert import PROVENANCE_FILE, atomic_dir, load_model, load_tokenizer
    from fastslow.model.generation import render_prompts

    check_device(cfg)
    cfg.check_pool(len(contexts))
    ids = [c for c, _ in contexts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"context ids must be unique, got {ids}")
    problems = list(train_problems)
    model_dir = Path(model_dir)
    policy_dir, global_step, cursor, fingerprint = resume_point(model_dir, state_in, problems, new_data)
    if progress:
        _ensure_progress_handler()
    ref_dir = Path(ref_model_dir) if ref_model_dir is not None else model_dir

    with atomic_dir(out_dir) as tmp:
        tokenizer = load_tokenizer(policy_dir)
        model = load_model(policy_dir, dtype="auto")
        # TRL builds the KL reference from config._name_or_path: the initial weights, not ours.
        model.config._name_or_path = str(ref_dir)
        use_cache = model.config.use_cache  # the HF Trainer turns it off; the saved model keeps it
        reward = TaskReward(task, {p.id: p for p in problems})
        trainer = build_trainer(model, tokenizer, cfg, len(contexts), reward, tmp / "_work")
        if state_in is not None:
            state_dir = Path(state_in) / "trainer_state"
            trainer.optimizer.load_state_dict(torch.load(state_dir / "optimizer.pt"))
            trainer.lr_scheduler.load_state_dict(torch.load(state_dir / "scheduler.pt"))
            # After build_trainer: TRL's constructor reseeds the global RNG.
            _set_rng_state(torch.load(state_dir / "rng_state.pt", weights_only=False))
        trainer.state.global_step = global_step

        chats = {(p.id, cid): (p, text) for p in problems for cid, text in contexts}
        prompt_texts: dict[tuple[str, str], str] = {}
        metrics_rows: list[dict[str, Any]] = []
        rollout_rows: list[dict[str, Any]] = []
        hashes = {cid: context_hash(text) for cid, text in contexts}
        for t in range(cfg.steps_per_cycle):
            picked = [problems[i] for i in take_problems(len(problems), cfg.seed, cursor,
                                                         cfg.problems_per_step)]
            cursor += cfg.problems_per_step
            rows = expand_rows(picked, contexts, cfg.num_generations)
            for key in {(r["problem_id"], r["context_id"]) for r in rows} - prompt_texts.keys():
                problem, text = chats[key]
                prompt_texts[key] = render_prompts(tokenizer, [build_messages(text, problem)])[0]
            metrics, records = _rl_step(trainer, reward, rows, cfg, prompt_texts)
            for rec in records:
                rec.update(run=run_id, cycle=cycle, step=global_step,
                           context_hash=hashes[rec["context_id"]])
            rollout_rows.extend(records)
            metrics_row = {"run": run_id, "cycle": cycle, "step": global_step,
                           "step_in_cycle": t, "num_contexts": len(contexts), **metrics}
            metrics_rows.append(metrics_row)
            if tracker is not None:
                tracker.log_metrics({f"slow/{k}": v for k, v in metrics.items()}, step=global_step)
            log.info("slow %s cycle %d step %d/%d (global %d): reward %.3f±%.3f, kl %.4f, "
                     "%d tok at %.1f tok/s, %.1fs (gen %.1fs, train %.1fs)", run_id, cycle, t + 1,
                     cfg.steps_per_cycle, global_step, metrics["reward_mean"],
                     metrics["reward_std"], metrics["kl_to_base"], metrics["completion_tokens"],
                     metrics["generated_tokens_per_s"], metrics["step_seconds"],
                     metrics["generation_seconds"], metrics["training_seconds"])
            global_step += 1

        trainer.model.config.use_cache = use_cache
        trainer.model.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "model")
        (tmp / "model" / PROVENANCE_FILE).write_text(json.dumps(
            {"kind": "slow-cycle", "run": run_id, "cycle": cycle, "global_step": global_step,
             "base": str(ref_dir)}, indent=2, sort_keys=True) + "\n")
        _save_state(trainer, tmp / "trainer_state", {
            "run": run_id, "cycle": cycle, "global_step": global_step, "cursor": cursor,
            "problems_fingerprint": fingerprint, "num_problems": len(problems),
            "ref_model_dir": str(ref_dir), "config": cfg.to_dict(),
        })
        _write_table(rollout_rows, tmp / "rollouts.parquet", ROLLOUT_COLUMNS)
        _write_table(metrics_rows, tmp / "metrics.parquet", None)
        shutil.rmtree(tmp / "_work", ignore_errors=True)
        del trainer, model
    return CycleResult(out_dir=Path(out_dir), global_step=global_step, metrics=metrics_rows)


_POLARS_TYPES = {"str": "String", "int64": "Int64", "float64": "Float64"}


def _write_table(rows: list[dict[str, Any]], path: Path, columns: dict[str, str] | None) -> None:
    import polars as pl

    if columns is None:
        pl.DataFrame(rows, infer_schema_length=None).write_parquet(path)
        return
    schema = {name: getattr(pl, _POLARS_TYPES[kind]) for name, kind in columns.items()}
    pl.DataFrame([{k: r[k] for k in columns} for r in rows], schema=schema).write_parquet(path)


def _ensure_progress_handler() -> None:
    """Make the INFO progress lines visible, also when nobody configured logging."""
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    if not log.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
