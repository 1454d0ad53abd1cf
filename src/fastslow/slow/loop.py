"""One slow-loop cycle: T CISPO steps from the previous cycle's state to the next.

`run_cycle` reads weights from `model_dir` (cycle 0) or from the previous cycle's output
(`state_in`), restores the optimiser, lr scheduler, RNG and data position, runs T steps and
writes, atomically (temp sibling, then rename), into `out_dir`:

    model/             the HF model directory after the cycle (weights + tokenizer)
    trainer_state/     optimizer.pt, scheduler.pt, rng_state.pt, state.json (step, data cursor)
    rollouts.parquet   one row per rollout, columns `fastslow.records.ROLLOUT_COLUMNS`
    metrics.parquet    one row per RL step

A chain of cycles gives the same rewards and weights as one uninterrupted run
(tests/test_slow_cycle.py): the data order is a pure function of (seed, cursor), the RNG state
is saved and restored after the trainer is built, and the optimiser and scheduler state dicts are
saved exactly. `step` in every table is the 0-based global RL step = the number of optimiser
updates before it: the updates the sampling weights had received, for a rollout generated in
the step (one the fast round sampled, or an earlier step of a `slow.steps_per_generation` block,
is older by up to that many).

Under `accelerate launch` with N processes (`python -m fastslow.slow.train`, see
`fastslow.launch`) every rank runs this same function on a contiguous 1/N of each step's rows
(`fastslow.slow.trainer.rank_slice`); the model and optimiser are prepared by the trainer's
accelerator (DDP or FSDP2). Only the main process writes files: the full weights (gathered for
FSDP), the optimiser state in the same index-keyed layout as one process writes (so a cycle may
resume with another process count), every rank's RNG state (`rng_state.pt` for rank 0,
`rng_state.rank<r>.pt` for the others: resume stays exact with the same N) and the rollouts of
all ranks, in row order. The metrics are those of the whole step. With
FASTSLOW_DEBUG_RANK_DIGESTS=1 each rank also hashes the weights it holds at the end and the
main process writes them to `rank_weights.json` (data-parallel ranks must agree).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fastslow.hardware import native_bf16_available
from fastslow.model.generation import derive_seed
from fastslow.records import (
    ROLLOUT_COLUMNS,
    check_metrics,
    context_hash,
    metrics_frame,
    polars_schema,
)
from fastslow.slow.config import SlowConfig
from fastslow.slow.trainer import (
    PromptGradients,
    TaskReward,
    build_trainer,
    expand_rows,
    per_rank_batches,
    process_rank,
    rank_slice,
    world_size,
)
from fastslow.tasks.base import Problem, Task, answered, build_messages, duplicate_ids

log = logging.getLogger("fastslow.slow")

STATE_FILE = "state.json"
RANK_DIGESTS_FILE = "rank_weights.json"
ENV_DEBUG_DIGESTS = "FASTSLOW_DEBUG_RANK_DIGESTS"


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

    if cfg.use_vllm and not torch.cuda.is_available():
        raise RuntimeError("slow loop: use_vllm needs a CUDA GPU, and none is visible here; set "
                           "slow.use_vllm=false to run on CPU")
    if cfg.bf16 and not native_bf16_available():
        raise RuntimeError("slow loop: bf16=true needs a CUDA GPU with native bf16 (Ampere or later) or a CPU "
                           "with native bf16 (AVX512-BF16 or AMX), and this machine has neither; set slow.bf16=false")
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


def cycle_step_problems(state_in: str | Path | None, problems: Sequence[Problem], cfg: SlowConfig,
                        steps: int = 1, new_data: bool = False) -> list[Problem]:
    """The problems the first `steps` steps of the cycle resuming from `state_in` will train on,
    in order, P a step (the same data stream `run_cycle` reads), so they can be sampled before
    the cycle starts. A problem the stream draws twice is listed twice."""
    cursor = 0 if state_in is None or new_data else int(read_state(state_in)["cursor"])
    return [problems[i] for i in take_problems(len(problems), cfg.seed, cursor, cfg.problems_per_step * steps)]


def cycle_prompt_tokens(tokenizer: Any, problems: Sequence[Problem], contexts: Sequence[tuple[str, str]],
                        cfg: SlowConfig, cursor: int) -> int:
    """Tokens of the longest prompt of the cycle starting at data position `cursor`: its T*P
    problems (the same stream `run_cycle` reads) under each of the contexts. Sizes the vLLM
    engine, which lives for one cycle (`fastslow.slow.trainer.grpo_args`)."""
    from fastslow.slow.trainer import longest_prompt_tokens

    picked = take_problems(len(problems), cfg.seed, cursor, cfg.problems_per_step * cfg.steps_per_cycle)
    return longest_prompt_tokens(tokenizer, [problems[i] for i in sorted(set(picked))], contexts,
                                 cfg.chat_template_kwargs)


def check_ranks(cfg: SlowConfig, num_processes: int) -> None:
    """What steps in `num_processes` ranks refuse: P*G that does not split over them
    (`per_rank_batches`), and sampling ahead (`slow.steps_per_generation`), which one process
    does. A cycle checks it before its fast round, and the ranks again."""
    per_rank_batches(cfg, num_processes)
    if num_processes > 1 and cfg.steps_per_generation > 1:
        raise ValueError(f"slow.steps_per_generation: {cfg.steps_per_generation} samples ahead in one process; "
                         f"this cycle runs on {num_processes}: set it to 1")


def reuse_plan(rows: Sequence[Mapping[str, Any]], left: dict[tuple[str, str], list[Mapping[str, Any]]],
               hashes: Mapping[str, str], part: slice = slice(None), sampled_at: dict[int, int] | None = None,
               ) -> dict[int, tuple[Sequence[int], Sequence[int], Sequence[float] | None]]:
    """Row index within `rows[part]` -> (prompt ids, completion ids, per-token sampling log-probs
    or None) for those of the step's rows that a rollout of their (context, problem) pair in
    `left` can fill, in row order. Each rollout dealt is taken out of `left` (the rollouts no
    step has had yet), so later steps drawing the same pair get other ones.

    `rows` is the whole step (every rank's rows) and `part` one rank's share: the rollouts are
    dealt over all rows first, so a pair whose rows straddle two ranks gives each rank other
    rollouts, never the same one twice (every rank deals from its own copy of the same `left`).
    `sampled_at`, if given, gets each dealt row's rollout's `sampled_at` (the global step of the
    weights that sampled it), by the same index.
    """
    start, stop, _ = part.indices(len(rows))
    plan = {}
    for i, row in enumerate(rows):
        queue = left.get((hashes[row["context_id"]], row["problem_id"]))
        if queue:
            r = queue.pop(0)
            if start <= i < stop:
                plan[i - start] = (r["prompt_ids"], r["completion_ids"], r.get("logprobs") or None)
                if sampled_at is not None and "sampled_at" in r:
                    sampled_at[i - start] = r["sampled_at"]
    return plan


def sample_ahead(model: Any, tokenizer: Any, block: Sequence[Sequence[Mapping[str, Any]]],
                 left: dict[tuple[str, str], list[Mapping[str, Any]]], hashes: Mapping[str, str],
                 chats: Mapping[tuple[str, str], tuple[Problem, str]], cfg: SlowConfig, seed: int,
                 *, sampled_at: int) -> tuple[float, int, int]:
    """Sample, in one generate call with `model`'s current weights, every rollout the steps of
    `block` (each step's rows, `expand_rows`) will need beyond those `left` already holds (the
    fast round's), and append them to `left`'s queues: `reuse_plan` then deals them to the block's
    steps, which train on them as on the round's (`slow.steps_per_generation`). Sampled as the
    step's own rollouts are (the slow loop's length, temperature and top-p; bf16 autocast under
    `cfg.bf16`), with each token's sampling log-prob for CISPO's importance weight in the later
    steps. Each rollout carries `sampled_at`, the global step of `model`'s weights (its
    `policy_lag` where a step trains on it). Returns (seconds, completion tokens, rollouts sampled)."""
    import torch

    from fastslow.model.generation import HFGenerator, SamplingParams

    need: dict[tuple[str, str], int] = {}
    key_of: dict[tuple[str, str], tuple[str, str]] = {}
    for rows in block:
        for row in rows:
            key = (hashes[row["context_id"]], row["problem_id"])
            need[key] = need.get(key, 0) + 1
            key_of.setdefault(key, (row["problem_id"], row["context_id"]))
    todo = [(key, n - len(left.get(key, ()))) for key, n in need.items() if n > len(left.get(key, ()))]
    if not todo:
        return 0.0, 0, 0
    owners = [key for key, n in todo for _ in range(n)]
    conversations = [build_messages(chats[key_of[key]][1], chats[key_of[key]][0]) for key in owners]
    start = time.perf_counter()
    generator = HFGenerator(model, tokenizer, batch_size=len(conversations),  # one call, as TRL's
                            chat_template_kwargs=cfg.chat_template_kwargs)
    generator.length_key = "slow.max_new_tokens"
    training, use_cache = model.training, model.config.use_cache
    model.eval()
    model.config.use_cache = True  # the HF Trainer turns it off for training
    autocast = torch.autocast(device_type=next(model.parameters()).device.type, dtype=torch.bfloat16,
                              enabled=cfg.bf16)
    try:
        with autocast:
            out = generator.generate(conversations, SamplingParams(cfg.max_new_tokens, cfg.temperature,
                                                                   cfg.top_p, seed))
    finally:
        model.train(training)
        model.config.use_cache = use_cache
    for key, g in zip(owners, out, strict=True):
        left.setdefault(key, []).append({"prompt_ids": list(g.prompt_ids), "completion_ids": list(g.completion_ids),
                                         "logprobs": list(g.token_logprobs), "sampled_at": sampled_at})
    return time.perf_counter() - start, sum(g.completion_tokens for g in out), len(out)


# ---------------------------------------------------------------- state


def _rng_state() -> dict[str, Any]:
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _load_rng_state(path: Path) -> dict[str, Any]:
    """An `rng_state*.pt` as `_rng_state` wrote it, unpickling tensors, numpy's arrays and plain
    Python only (`weights_only`, with transformers' allowlist of numpy's): a file in a shared or
    copied results/ tree could otherwise run any code when a cycle resumes from it."""
    import torch
    from transformers.trainer_pt_utils import safe_globals

    with safe_globals():
        return torch.load(path, weights_only=True)


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


def _rng_file(rank: int) -> str:
    return "rng_state.pt" if rank == 0 else f"rng_state.rank{rank}.pt"


def _inner_optimizer(optimizer: Any) -> Any:
    """The torch optimiser inside accelerate's `AcceleratedOptimizer` wrapper(s)."""
    while hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer


def _optimizer_param_fqns(trainer: Any) -> list[str]:
    """Fully qualified parameter names in the optimiser's index order (torch numbers parameters
    through its param_groups in order; torch.distributed.checkpoint keys them by name)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    local = get_optimizer_state_dict(trainer.model_wrapped, _inner_optimizer(trainer.optimizer),
                                     options=StateDictOptions(full_state_dict=False))
    return [fqn for group in local["param_groups"] for fqn in group["params"]]


def _distributed_optimizer_state(trainer: Any) -> dict[str, Any] | None:
    """The optimiser state of a prepared trainer as one process would write it (index-keyed,
    full tensors), on the main process; None elsewhere. Collective: call on every rank.

    DDP replicates the AdamW state (every rank applies the same averaged gradient), so the main
    process's own state dict is the whole state. FSDP2 shards it: torch.distributed.checkpoint
    gathers the full, name-keyed state, renumbered here in param_groups order.
    """
    accelerator = trainer.accelerator
    inner = _inner_optimizer(trainer.optimizer)
    if not accelerator.is_fsdp2:
        return inner.state_dict() if accelerator.is_main_process else None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    full = get_optimizer_state_dict(trainer.model_wrapped, inner, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    if not accelerator.is_main_process:
        return None
    index = {fqn: i for i, fqn in enumerate(fqn for g in full["param_groups"] for fqn in g["params"])}
    return {"state": {index[fqn]: value for fqn, value in full["state"].items()},
            "param_groups": [{**g, "params": [index[f] for f in g["params"]]}
                             for g in full["param_groups"]]}


def _load_distributed_optimizer_state(trainer: Any, path: Path) -> None:
    """Load an index-keyed optimiser state (`_distributed_optimizer_state`, or one process's)
    into a prepared trainer. DDP: every rank loads the whole file. FSDP2: the main process reads
    it, renames it by parameter name and torch.distributed.checkpoint scatters the shards."""
    import torch

    accelerator = trainer.accelerator
    inner = _inner_optimizer(trainer.optimizer)
    if not accelerator.is_fsdp2:
        inner.load_state_dict(torch.load(path))
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    fqns = _optimizer_param_fqns(trainer)
    full: dict[str, Any] = {}
    if accelerator.is_main_process:
        saved = torch.load(path)
        full = {"state": {fqns[i]: value for i, value in saved["state"].items()},
                "param_groups": [{**g, "params": [fqns[i] for i in g["params"]]}
                                 for g in saved["param_groups"]]}
    set_optimizer_state_dict(trainer.model_wrapped, inner, full, options=StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True))
    for group in inner.param_groups:  # DCP's flattening turns tuples (AdamW betas) into lists
        for key, value in group.items():
            if key != "params" and isinstance(value, list):
                group[key] = tuple(value)


def _save_distributed(trainer: Any, tokenizer: Any, tmp: Path | None, info: dict[str, Any]) -> None:
    """Write model/ and trainer_state/ of a prepared (multi-process) trainer from the main
    process. Collective: every rank must call it (weights and optimiser state are gathered)."""
    import torch
    from accelerate.utils import gather_object

    accelerator = trainer.accelerator
    state_dict = accelerator.get_state_dict(trainer.model_wrapped)  # full weights, FSDP gathered
    optimizer_state = _distributed_optimizer_state(trainer)
    rng_states = gather_object([_rng_state()])
    if not accelerator.is_main_process:
        return
    assert tmp is not None
    accelerator.unwrap_model(trainer.model_wrapped).save_pretrained(tmp / "model", state_dict=state_dict)
    tokenizer.save_pretrained(tmp / "model")
    state_dir = tmp / "trainer_state"
    state_dir.mkdir(parents=True)
    torch.save(optimizer_state, state_dir / "optimizer.pt")
    torch.save(trainer.lr_scheduler.state_dict(), state_dir / "scheduler.pt")
    for rank, rng in enumerate(rng_states):
        torch.save(rng, state_dir / _rng_file(rank))
    (state_dir / STATE_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def _restore_distributed(trainer: Any, state_dir: Path, cfg: SlowConfig, global_step: int) -> None:
    """Optimiser, scheduler and this rank's RNG state from a cycle directory. A rank without its
    own RNG file (the previous cycle had fewer processes) is reseeded from (seed, step, rank):
    the run goes on, but is no longer bit-identical to an uninterrupted one."""
    import torch
    from accelerate.utils import set_seed

    _load_distributed_optimizer_state(trainer, state_dir / "optimizer.pt")
    trainer.lr_scheduler.load_state_dict(torch.load(state_dir / "scheduler.pt"))
    rank = trainer.accelerator.process_index
    rng_path = state_dir / _rng_file(rank)
    if rng_path.is_file():
        _set_rng_state(_load_rng_state(rng_path))
    else:
        log.warning("slow loop: %s has no RNG state for rank %d; reseeding it", state_dir, rank)
        set_seed((cfg.seed + 1_000_003 * global_step + rank) % 2**32)  # set_seed's range


def weights_digest(model: Any) -> str:
    """sha256 of a model's state dict (names and raw bytes, sorted): equal iff the weights are.
    FSDP2 shards (DTensors) are gathered first, so every rank must call it."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        digest.update(name.encode() + b"\0" + str(tensor.dtype).encode() + b"\0")
        digest.update(data.numpy().tobytes())
    return digest.hexdigest()


@contextmanager
def _main_process_dir(out_dir: str | Path, is_main: bool) -> Iterator[Path | None]:
    """`atomic_path(out_dir, is_dir=True)` on the main process; None on the other ranks (they
    write nothing)."""
    from fastslow.io import atomic_path

    if not is_main:
        yield None
        return
    with atomic_path(out_dir, is_dir=True) as tmp:
        yield tmp


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
        raise ValueError(f"train_problems have duplicate ids: {duplicate_ids(problems)}")
    fingerprint = problems_fingerprint(problems)
    if state_in is None:
        return Path(model_dir), 0, 0, fingerprint
    prev = read_state(state_in)
    if prev["problems_fingerprint"] != fingerprint and not new_data:
        raise ValueError(f"state_in {state_in} was trained on a different train set (or order): fingerprint "
                         f"{prev['problems_fingerprint']}, these {len(problems)} problems' {fingerprint}; the "
                         "data position would be meaningless (pass new_data=True for a new task)")
    return Path(state_in) / "model", prev["global_step"], 0 if new_data else prev["cursor"], fingerprint


def starts_at_reference(state_in: str | Path | None, policy_dir: Path, ref_dir: Path) -> bool:
    """Whether a cycle starts with the KL reference's weights: a run's first cycle, whose weights
    are loaded from the reference's directory. They stay the reference's until an optimiser step
    with lr > 0 (under the warm-up, lr is 0 at step 0: a run's first two steps), and those steps
    skip the reference forward (`PoolGRPOTrainer.policy_is_reference`). A later cycle's weights
    were saved by the previous one: never taken as the reference's, even if no step moved them."""
    return state_in is None and Path(policy_dir).resolve() == Path(ref_dir).resolve()


# ---------------------------------------------------------------- one RL step


def _rl_step(trainer: Any, reward: TaskReward, rows: list[dict[str, Any]], cfg: SlowConfig,
             prompt_texts: dict[tuple[str, str], str],
             ahead: tuple[float, int, int] = (0.0, 0, 0), where: str = "slow step",
             lags: Mapping[int, int] | None = None) -> tuple[dict[str, Any], list[dict]]:
    """Generate, score, one optimiser step. Returns (metrics, rollout records).

    `ahead`: (seconds, completion tokens, rollouts) of the block's sampling this step did before
    it (`sample_ahead`), counted as this step's generation. `where`: the step, as a non-finite
    gradient's error names it (`check_gradient`). `lags`: row index -> the optimiser steps between
    the weights that sampled the rollout `reuse_rows` holds for it and this step's (a row it
    generates, or one reused without a record of its sampler, is 0)."""
    import torch
    from trl.trainer.utils import split_tensor_dict

    ahead_s, ahead_tokens, ahead_rollouts = ahead
    trainer.reset_step_stats()
    accelerator = trainer.accelerator
    distributed = accelerator.num_processes > 1
    # The forward/backward must run through the DDP/FSDP wrapper for the gradients to be reduced.
    model = trainer.model_wrapped if distributed else trainer.model
    # bf16 mixed precision: under accelerate launch the prepared model autocasts its forward;
    # in one process nothing is prepared, so the step's forward passes autocast here (weights,
    # gradients and the optimiser stay fp32).
    autocast = torch.autocast(device_type=next(trainer.model.parameters()).device.type,
                              dtype=torch.bfloat16, enabled=cfg.bf16 and not distributed)
    start = time.perf_counter()
    model.train()
    lr = float(trainer.lr_scheduler.get_last_lr()[0])
    with autocast:
        batch = trainer._generate_and_score_completions(rows)
    loss_total = 0.0
    micros = split_tensor_dict(batch, trainer.current_gradient_accumulation_steps)
    prompts = None
    if trainer.share_prefill and not distributed and len(micros) > 1:
        # A prompt whose copies span several micro batches: its forward and backward run once.
        prompts = PromptGradients(PromptGradients.counts(micros))
    trainer.prompt_grads = prompts
    try:
        for i, micro in enumerate(micros):
            with _accumulation_context(accelerator, model, last=i == len(micros) - 1):
                with autocast, trainer.compute_loss_context_manager():
                    loss = trainer.compute_loss(model, micro)
                accelerator.backward(loss)
                if prompts is not None:
                    prompts.backward_done()
            loss_total += float(loss.detach())
    finally:
        trainer.prompt_grads = None
    if prompts is not None and prompts.kv:
        raise RuntimeError(f"slow loop: {len(prompts.kv)} prompt forwards never sent their gradients to the "
                           f"weights (their micro batches were counted wrong)")
    grad_norm = clip_gradients(model.parameters(), cfg.max_grad_norm, accelerator if distributed else None)
    check_gradient(grad_norm, loss_total, where)
    trainer.optimizer.step()
    trainer.lr_scheduler.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.state.global_step += 1  # TRL syncs vLLM weights when this changes
    seconds = time.perf_counter() - start + ahead_s

    mask = batch["completion_mask"].float()
    logps = torch.cat([lp for lp, _ in trainer.stash]).float()
    entropies = torch.cat([ent for _, ent in trainer.stash]).float()
    n_tokens = mask.sum().clamp(min=1.0)
    # vLLM reports its own sampling log-probs; on the HF path the loss forward (same weights,
    # same temperature, before the update) gives them exactly.
    sampling = batch.get("sampling_per_token_logps")
    sampled = sampling.float() if sampling is not None else logps
    # Rows the fast round sampled (HF path): their sampler's own log-probs, and the importance
    # weight pi_theta / pi_behaviour CISPO gave their tokens (before its cap; `behaviour_logps`).
    behaviour = batch.get("behaviour_logps")
    reused_tokens = mask.new_zeros(())
    weight_sum = mask.new_zeros(())
    if behaviour is not None:
        known = ~torch.isnan(behaviour) & (mask > 0)
        sampled = torch.where(torch.isnan(behaviour), sampled, behaviour.float())
        reused_tokens = known.sum().float()
        weight_sum = torch.exp(logps - torch.nan_to_num(behaviour.float()))[known].sum()
    logprob_sums = (torch.nan_to_num(sampled) * mask).sum(1).tolist()
    # CISPO's cap at work: tokens whose weight pi_theta / pi_sampler passed tau, whatever their
    # advantage's sign (TRL's cispo_clip_ratio counts positive advantages only, and on the vLLM
    # path compares with a no-grad forward of the same weights, where the cap never binds)
    clipped = ((torch.exp(logps - torch.nan_to_num(sampled)) > cfg.epsilon_high) & (mask > 0)).sum().float()
    clip_fraction = float(clipped / n_tokens)
    if trainer.reference_skipped:  # the weights were the reference's: so are its log-probs
        batch["ref_per_token_logps"] = logps
    kl_terms = base_kl_terms(batch, logps, mask)
    kl = float(kl_terms.sum() / n_tokens) if kl_terms is not None else math.nan
    entropy = float((entropies * mask).sum() / n_tokens)
    trainer._metrics["train"].clear()  # TRL's own, per micro batch: ours are the step's

    local_rewards = np.asarray(reward.last_rewards, dtype=float)
    completion_tokens = batch["completion_mask"].sum(1).tolist()
    prompt_tokens = batch["prompt_mask"].sum(1).tolist()
    truncated = truncated_rows(batch["completion_ids"], batch["completion_mask"], trainer.eos_token_ids)
    gen_s, score_s = trainer.timings["generation"], trainer.timings["scoring"]
    records = [{
        "problem_id": row["problem_id"],
        "context_id": row["context_id"],
        "prompt": prompt_texts[(row["problem_id"], row["context_id"])],
        "completion": reward.last_texts[i],
        "reward": float(local_rewards[i]),
        "feedback": reward.last_feedback[i],
        "prompt_tokens": int(prompt_tokens[i]),
        "completion_tokens": int(completion_tokens[i]),
        "logprob_sum": float(logprob_sums[i]),
        "truncated": truncated[i],
        "answered": answered(reward.last_texts[i]),
        "reused": i in trainer.reused,
        "policy_lag": (lags or {}).get(i, 0) if i in trainer.reused else 0,
    } for i, row in enumerate(rows)]
    # rows sampled before this step's generation (the fast round's, fast.reuse_in_slow, or an
    # earlier step's `sample_ahead`), not generated here
    reused = len(trainer.reused)
    generated_tokens = sum(n for i, n in enumerate(completion_tokens) if i not in trainer.reused)
    gen_s, generated_tokens = gen_s + ahead_s, generated_tokens + ahead_tokens
    if distributed:  # the whole step: every rank's rows (rank order = row order) and token sums
        from accelerate.utils import gather_object

        sums = torch.stack([mask.sum(), (entropies * mask).sum(),
                            kl_terms.sum() if kl_terms is not None else mask.new_zeros(()),
                            weight_sum, reused_tokens, clipped])
        sums = accelerator.reduce(sums, reduction="sum")
        weight_sum, reused_tokens = sums[3], sums[4]
        tokens = float(sums[0].clamp(min=1.0))
        clip_fraction = float(sums[5]) / tokens
        entropy = float(sums[1]) / tokens
        kl = float(sums[2]) / tokens if kl_terms is not None else math.nan
        loss_total = float(accelerator.reduce(torch.tensor(loss_total, device=mask.device),
                                              reduction="mean"))
        parts = gather_object([(records, gen_s, score_s, time.perf_counter() - start + ahead_s, reused,
                                 generated_tokens)])
        records = [rec for part in parts for rec in part[0]]
        gen_s, score_s, seconds = (max(part[k] for part in parts) for k in (1, 2, 3))
        reused, generated_tokens = (sum(part[k] for part in parts) for k in (4, 5))

    rewards = np.asarray([rec["reward"] for rec in records], dtype=float)
    completion_tokens = [rec["completion_tokens"] for rec in records]
    grouped = rewards.reshape(-1, trainer.num_generations)
    metrics = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "frac_zero_std_groups": float(np.mean(np.isclose(grouped.std(axis=1), 0.0))),
        "answered_fraction": answered_fraction(records),
        "entropy": entropy,
        "kl_to_base": kl,
        "clip_fraction": clip_fraction,
        "loss": loss_total,
        "lr": lr,
        "completion_tokens": int(sum(completion_tokens)),
        "mean_completion_tokens": float(np.mean(completion_tokens)),
        "truncated_fraction": float(np.mean([rec["truncated"] for rec in records])),
        "generation_seconds": gen_s,
        "scoring_seconds": score_s,
        "training_seconds": seconds - gen_s - score_s,
        "step_seconds": seconds,
        # NaN, not 0, for a step that generated nothing (every row reused): no rate was measured
        "generated_tokens_per_s": float(generated_tokens / max(gen_s, 1e-9)) if generated_tokens else math.nan,
        "reused_rollouts": reused,
        "sampled_ahead_rollouts": ahead_rollouts,  # this step's `sample_ahead`: the block's later steps' too
        "reused_is_weight": float(weight_sum / reused_tokens) if float(reused_tokens) > 0 else math.nan,
        "grad_norm": grad_norm,
    }
    return metrics, records


def steps_left(metrics_rows: Sequence[Mapping[str, Any]], steps: int) -> float:
    """Seconds a cycle's steps have left after those in `metrics_rows`: the steps so far, on
    average, times the `steps` of the cycle still to go (0 after its last)."""
    done = len(metrics_rows)
    return sum(r["step_seconds"] for r in metrics_rows) / done * (steps - done)


def base_kl_terms(batch: Mapping[str, Any], logps: Any, mask: Any) -> Any:
    """A step's per-token terms of KL(π_θ ‖ π_base) (`k3_terms`): TRL's reference log-probs in its
    `batch` (`ref_per_token_logps`) against the policy's `logps`; None when the trainer has no
    reference model (beta = 0)."""
    ref = batch.get("ref_per_token_logps")
    return None if ref is None else k3_terms(ref.float(), logps, mask)


def k3_terms(ref_logps: Any, logps: Any, mask: Any) -> Any:
    """Per-token terms of the KL(π_θ ‖ π_ref) estimate on tokens sampled from π_θ (Schulman's k3,
    TRL's): exp(r) − r − 1 with r = log π_ref − log π_θ, zero off the mask. Unbiased and never
    negative; the other direction (r = log π_θ − log π_ref) estimates no KL of these samples."""
    import torch

    delta = ref_logps - logps
    return (torch.exp(delta) - delta - 1) * mask


def truncated_rows(completion_ids: Any, completion_mask: Any, eos_ids: Sequence[int]) -> list[bool]:
    """Which completions of a batch stopped at the length limit: the last token of a row (its
    `completion_mask`, which runs to the first EOS inclusive) is no EOS id. TRL's own
    `completions/clipped_ratio` is the same test, once a generation call; a step's share is this
    per row, so a step served by an earlier call or by the fast round has one too."""
    import torch

    lengths = completion_mask.sum(1).long()
    last = completion_ids.gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    eos = torch.tensor(list(eos_ids), dtype=completion_ids.dtype, device=completion_ids.device)
    return ((lengths > 0) & ~torch.isin(last, eos)).tolist()


#: A cycle whose steps' advantage groups tied this often (mean `frac_zero_std_groups`) is warned about
TIED_WARNING = 0.9


def answered_fraction(records: Sequence[Mapping[str, Any]]) -> float:
    """The share of a step's rollouts whose completion gives a readable answer (their `answered`,
    `fastslow.tasks.base.answered`): beside the reward, it tells a wrong answer from a format the
    model does not write."""
    return float(np.mean([rec["answered"] for rec in records])) if records else math.nan


def warn_tied_groups(metrics_rows: Sequence[Mapping[str, Any]], where: str) -> None:
    """One warning when most of a cycle's advantage groups (a problem's G rollouts, or a prompt's
    G/K under `slow.baseline: prompt`) scored alike, so that almost no policy gradient reached the
    weights (only the KL term and weight decay moved them): a task too hard or too easy for the
    model at this budget, which the step lines' batch reward std does not show (it spreads over
    problems)."""
    tied = [r["frac_zero_std_groups"] for r in metrics_rows if math.isfinite(r.get("frac_zero_std_groups", math.nan))]
    share = float(np.mean(tied)) if tied else 0.0
    if share >= TIED_WARNING:
        reward = float(np.mean([r["reward_mean"] for r in metrics_rows]))
        shares = [r["answered_fraction"] for r in metrics_rows if "answered_fraction" in r]
        # reward 0 with answers is a task too hard; without, a format the model does not write
        unread = (f"; {100 * (1 - float(np.mean(shares))):.0f}% of its completions gave no readable <answer> block"
                  if shares else "")
        log.warning("%s: little learning signal: in %.0f%% of its advantage groups every rollout scored alike "
                    "(mean reward %.3f)%s, so mostly the KL penalty and weight decay moved the weights (expected "
                    "at the CPU default's scale: README \"Base SmolLM2-135M-Instruct\")", where,
                    100 * share, reward, unread)


class NonFiniteGradient(RuntimeError):
    """A step's gradient norm was NaN or inf: the step stopped before the optimiser wrote it into
    the weights and AdamW's moments (at any lr, even 0: 0 x NaN is NaN), so nothing was saved."""


def check_gradient(grad_norm: float, loss: float, where: str) -> None:
    """Stop the cycle, in one line naming `where` (run, cycle, step), before an optimiser step with a
    non-finite gradient norm: it would save NaN weights that every later cycle and evaluation
    samples from (a corrupt run, hours of GPU later). Under several processes the norm is the
    global one (`clip_gradients`), so every rank stops at the same step."""
    if not math.isfinite(grad_norm):
        raise NonFiniteGradient(f"{where}: gradient norm {grad_norm} (loss {loss:.6g} on this process); the "
                                "weights were not updated and nothing was saved. A rerun (a SLURM retry too) repeats "
                                "this step, on a CPU exactly: the step's loss, KL and rewards are in the job's log")


def clip_gradients(parameters: Any, max_norm: float | None, accelerator: Any = None) -> float:
    """The gradients' global L2 norm before clipping (what TRL logs as grad_norm), having scaled
    them to at most `max_norm` (None: measured only, left as they are). With several processes pass
    the accelerator: its `clip_grad_norm_` takes the norm over all ranks' DTensor shards under FSDP2
    (DDP's gradients are already reduced), and finds the prepared model by its parameters."""
    import torch

    if accelerator is not None:
        return float(accelerator.clip_grad_norm_(parameters, math.inf if max_norm is None else max_norm))
    parameters = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return float(norm)


def _accumulation_context(accelerator: Any, model: Any, last: bool) -> Any:
    """The context a micro batch's forward and backward run in. Under DDP the gradients are
    reduced across ranks once per step, on the last micro batch (`no_sync` before it). Not under
    FSDP2: its `no_sync` (`set_requires_gradient_sync(False)`) keeps every parameter's full,
    unsharded gradient until the last micro batch, the whole model's gradient on every GPU (8B
    parameters: 16 GB in bf16, 32 GB in fp32) instead of a 1/N shard; so each micro batch's
    gradient is reduce-scattered. One process: nothing to synchronise."""
    if last or accelerator.num_processes == 1 or accelerator.is_fsdp2:
        return nullcontext()
    return accelerator.no_sync(model)


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
    round_rollouts: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]] | None = None,
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
        progress: make the per-step INFO line (step, reward, tokens/s, seconds) visible on
            stderr when no logging is configured; the line is logged either way.
        ref_model_dir: the KL reference, if not `model_dir`.
        new_data: `train_problems` is a new training set (a continual run switching task):
            start its data stream at position 0; weights, optimiser, scheduler and RNG carry on.
        round_rollouts: (context hash, problem id) -> rollouts ({"prompt_ids",
            "completion_ids", "logprobs"}) sampled with this cycle's initial weights (the fast round,
            `fast.reuse_in_slow`, `RolloutCache.sampled`): each step trains on them for its rows
            of those pairs instead of generating, each rollout once, until none is left
            (`cycle_step_problems` names the first `fast.reuse_steps` steps' problems in advance).
            The first step's weights are the sampler's; a later step's have moved on, and CISPO's
            truncated importance weight against the rollouts' sampling log-probs corrects for it.

    Under `accelerate launch` (WORLD_SIZE > 1) every rank calls this with the same arguments;
    only the main process writes `out_dir` and calls `tracker`.
    """
    from fastslow.io import atomic_path
    from fastslow.model.convert import PROVENANCE_FILE, load_model, load_tokenizer
    from fastslow.model.generation import check_context, render_prompts, trace_opener

    check_device(cfg)
    cfg.check_pool(len(contexts))
    num_processes = world_size()
    check_ranks(cfg, num_processes)  # before any work
    distributed = num_processes > 1
    ids = [c for c, _ in contexts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"context ids must be unique, got {ids}")
    problems = list(train_problems)
    model_dir = Path(model_dir)
    policy_dir, global_step, cursor, fingerprint = resume_point(model_dir, state_in, problems, new_data)
    if progress:
        _ensure_progress_handler()
    ref_dir = Path(ref_model_dir) if ref_model_dir is not None else model_dir

    is_main = process_rank() == 0  # before the trainer exists: from the environment accelerate sets
    out_dir = Path(out_dir)
    # All ranks need the same (unused) TRL output_dir; only the main process has the temp dir.
    shared_work = out_dir.parent / f".{out_dir.name}.work" if distributed else None
    with (atomic_path(out_dir, is_dir=True) if not distributed else _main_process_dir(out_dir, is_main)) as tmp:
        work_dir = shared_work if shared_work is not None else tmp / "_work"
        if is_main:  # minutes at 8B (weights, the trainer, the optimiser state) before step 1's line
            log.info("slow %s cycle %d: loading the weights%s and building the trainer (%d steps of %d problems x "
                     "%d rollouts follow)", run_id, cycle, " and the optimiser state" if state_in is not None else "",
                     cfg.steps_per_cycle, cfg.problems_per_step, cfg.num_generations)
        tokenizer = load_tokenizer(policy_dir)
        # fp32 master weights (and so fp32 AdamW state), whatever dtype the checkpoint is stored
        # in: bf16 ones (Qwen3) would round lr-1e-6 updates away. bf16 mixed precision autocasts
        # the forwards only (`_rl_step`); the cycle saves the fp32 weights, so the next cycle
        # resumes from them unrounded.
        model = load_model(policy_dir, dtype="float32")
        # The cycle's longest prompt plus its completion must fit the model's positions: one line
        # naming both before any work (TRL's generate raised `IndexError: index out of range in
        # self` from a learned position table); it also sizes the vLLM engine.
        prompt_tokens = cycle_prompt_tokens(tokenizer, problems, contexts, cfg, cursor)
        check_context(model, prompt_tokens, cfg.max_new_tokens, "slow.max_new_tokens")
        # TRL builds the KL reference from config._name_or_path: the initial weights, not ours.
        model.config._name_or_path = str(ref_dir)
        use_cache = model.config.use_cache  # the HF Trainer turns it off; the saved model keeps it
        reward = TaskReward(task, {p.id: p for p in problems},
                            opener=trace_opener(tokenizer, cfg.chat_template_kwargs), tokenizer=tokenizer)
        trainer = build_trainer(model, tokenizer, cfg, len(contexts), reward, work_dir,
                                num_processes=num_processes,
                                max_prompt_tokens=prompt_tokens if cfg.use_vllm else None)
        rank = trainer.accelerator.process_index
        if state_in is not None:  # after build_trainer: TRL's constructor reseeds the global RNG
            restore_trained(trainer, Path(state_in) / "trainer_state", cfg, global_step, num_processes)
        trainer.state.global_step = global_step

        chats = {(p.id, cid): (p, text) for p in problems for cid, text in contexts}
        prompt_texts: dict[tuple[str, str], str] = {}
        metrics_rows: list[dict[str, Any]] = []
        rollout_rows: list[dict[str, Any]] = []
        hashes = {cid: context_hash(text) for cid, text in contexts}
        # the round's rollouts not yet trained on, dealt step by step (reuse_plan); the round
        # sampled them with the weights the cycle starts from
        unserved = {key: [{**r, "sampled_at": global_step} for r in value]
                    for key, value in (round_rollouts or {}).items()}
        block = cfg.steps_per_generation
        # until an optimiser step with lr > 0 (`starts_at_reference`)
        at_reference = starts_at_reference(state_in, policy_dir, ref_dir)
        for t in range(cfg.steps_per_cycle):
            ahead = (0.0, 0, 0)
            if block > 1 and t % block == 0:
                # slow.steps_per_generation: this step samples the rollouts of its block (this step
                # and the next ones, within the cycle) in one call, with its own weights
                steps = min(block, cfg.steps_per_cycle - t)
                rows_ahead = [expand_rows([problems[i] for i in take_problems(
                    len(problems), cfg.seed, cursor + j * cfg.problems_per_step, cfg.problems_per_step)],
                    contexts, cfg.num_generations) for j in range(steps)]  # step t + j's rows, as below
                ahead = sample_ahead(trainer.model, tokenizer, rows_ahead, unserved, hashes, chats, cfg,
                                     seed=derive_seed(cfg.seed, global_step), sampled_at=global_step)
                if is_main and ahead[2]:
                    log.info("slow %s cycle %d step %d/%d: sampled %d rollouts for %d steps in one call, %.1fs",
                             run_id, cycle, t + 1, cfg.steps_per_cycle, ahead[2], steps, ahead[0])
            picked = [problems[i] for i in take_problems(len(problems), cfg.seed, cursor,
                                                         cfg.problems_per_step)]
            cursor += cfg.problems_per_step
            step_rows = expand_rows(picked, contexts, cfg.num_generations)
            # this rank's contiguous share; TRL gathers the rewards of all
            share = rank_slice(len(step_rows), rank, num_processes) if distributed else slice(None)
            rows = step_rows[share]
            for key in {(r["problem_id"], r["context_id"]) for r in rows} - prompt_texts.keys():
                problem, text = chats[key]
                prompt_texts[key] = render_prompts(tokenizer, [build_messages(text, problem)],
                                                   cfg.chat_template_kwargs)[0]
            sampled_at: dict[int, int] = {}
            if any(unserved.values()):
                trainer.reuse_rows = reuse_plan(step_rows, unserved, hashes, share, sampled_at)
            trainer.policy_is_reference = at_reference
            step_name = f"slow {run_id} cycle {cycle} step {t + 1}/{cfg.steps_per_cycle} (global {global_step})"
            metrics, records = _rl_step(trainer, reward, rows, cfg, prompt_texts, ahead, where=step_name,
                                        lags={i: global_step - s for i, s in sampled_at.items()})
            at_reference = at_reference and metrics["lr"] == 0
            if trainer.reuse_mismatches:
                log.warning("slow %s cycle %d: %d reused rollouts had other prompt tokens than TRL's; "
                            "generated instead", run_id, cycle, trainer.reuse_mismatches)
                trainer.reuse_mismatches = 0
            if trainer.reuse_without_logprobs:
                log.warning("slow %s cycle %d: %d reused rollouts came without the per-token sampling log-probs "
                            "vLLM's importance correction needs; generated instead", run_id, cycle,
                            trainer.reuse_without_logprobs)
                trainer.reuse_without_logprobs = 0
            if trainer.reuse_unweighted:
                log.warning("slow %s cycle %d: %d reused rollouts came without their sampling log-probs; "
                            "trained as on-policy", run_id, cycle, trainer.reuse_unweighted)
                trainer.reuse_unweighted = 0
            for rec in records:
                rec.update(run=run_id, cycle=cycle, step=global_step,
                           context_hash=hashes[rec["context_id"]])
            rollout_rows.extend(records)
            metrics_row = {"run": run_id, "cycle": cycle, "step": global_step,
                           "step_in_cycle": t, "num_contexts": len(contexts), **metrics}
            metrics_rows.append(check_metrics(metrics_row))
            if tracker is not None and is_main:
                tracker.log_metrics({f"slow/{k}": v for k, v in metrics.items()}, step=global_step)
            if is_main:
                left = steps_left(metrics_rows, cfg.steps_per_cycle)
                # rows the fast round or an earlier step's sample_ahead sampled: no tok/s of this step's
                reused = int(metrics.get("reused_rollouts") or 0)
                rate = metrics["generated_tokens_per_s"]
                log.info("%s: reward %.3f±%.3f (%.0f%% answered, %.0f%% of groups tied), "
                         "kl %.4f, grad norm %.3g, %d tok (%.0f%% cut at %d) %s%s, %.1fs (gen %.1fs, train %.1fs)%s",
                         step_name, metrics["reward_mean"], metrics["reward_std"],
                         100 * metrics["answered_fraction"], 100 * metrics["frac_zero_std_groups"], metrics["kl_to_base"],
                         metrics["grad_norm"], metrics["completion_tokens"],
                         100 * metrics["truncated_fraction"], cfg.max_new_tokens,
                         "none generated here" if math.isnan(rate) else f"at {rate:.1f} tok/s",
                         f" ({reused} rollouts sampled before this step, not generated in it)" if reused else "",
                         metrics["step_seconds"], metrics["generation_seconds"], metrics["training_seconds"],
                         f", steps ~{left:.0f}s left" if left else "")
            global_step += 1

        trainer.model.config.use_cache = use_cache
        if is_main:
            warn_tied_groups(metrics_rows, f"slow {run_id} cycle {cycle}")
        log.info("slow %s cycle %d: writing the weights and the trainer state", run_id, cycle)
        info = {
            "run": run_id, "cycle": cycle, "global_step": global_step, "cursor": cursor,
            "problems_fingerprint": fingerprint, "num_problems": len(problems),
            "ref_model_dir": str(ref_dir), "config": cfg.to_dict(),
        }
        save_trained(trainer, tokenizer, tmp, info, num_processes)
        if tmp is not None:
            (tmp / "model" / PROVENANCE_FILE).write_text(json.dumps(
                {"kind": "slow-cycle", "run": run_id, "cycle": cycle, "global_step": global_step,
                 "base": str(ref_dir)}, indent=2, sort_keys=True) + "\n")
            _write_table(rollout_rows, tmp / "rollouts.parquet")
            metrics_frame(metrics_rows).write_parquet(tmp / "metrics.parquet")
            shutil.rmtree(tmp / "_work", ignore_errors=True)
        if distributed:
            trainer.accelerator.wait_for_everyone()
            if is_main:
                shutil.rmtree(shared_work, ignore_errors=True)
        del trainer, model
    return CycleResult(out_dir=out_dir, global_step=global_step, metrics=metrics_rows)


def save_trained(trainer: Any, tokenizer: Any, tmp: Path | None, info: dict[str, Any],
                 num_processes: int) -> None:
    """Write `model/` and `trainer_state/` (`info` as state.json) into the cycle's temp dir `tmp`
    (None on the ranks that write nothing). Several processes: collective (`_save_distributed`;
    with FASTSLOW_DEBUG_RANK_DIGESTS=1 also every rank's weights digest). `trainer` is TRL's, or
    anything with its `model`, `model_wrapped`, `optimizer`, `lr_scheduler` and `accelerator`."""
    if num_processes > 1:
        info["num_processes"] = num_processes
        _save_distributed(trainer, tokenizer, tmp, info)
        digests = _rank_digests(trainer) if os.environ.get(ENV_DEBUG_DIGESTS) == "1" else None
        if tmp is not None and digests is not None:
            (tmp / RANK_DIGESTS_FILE).write_text(json.dumps({"digests": digests}) + "\n")
    else:
        assert tmp is not None
        trainer.model.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "model")
        _save_state(trainer, tmp / "trainer_state", info)


def restore_trained(trainer: Any, state_dir: Path, cfg: SlowConfig, global_step: int,
                    num_processes: int) -> None:
    """Load what `save_trained` wrote into `state_dir` (trainer_state/): the optimiser, the
    scheduler and the RNG state, into a trainer built for this cycle (`save_trained`'s kinds).
    Several processes: `_restore_distributed` (collective under FSDP2)."""
    import torch

    if num_processes > 1:
        _restore_distributed(trainer, state_dir, cfg, global_step)
        return
    trainer.optimizer.load_state_dict(torch.load(state_dir / "optimizer.pt"))
    trainer.lr_scheduler.load_state_dict(torch.load(state_dir / "scheduler.pt"))
    _set_rng_state(_load_rng_state(state_dir / "rng_state.pt"))


def _rank_digests(trainer: Any) -> list[str]:
    """Every rank's `weights_digest` of the weights it trains (debug: DDP ranks must agree)."""
    from accelerate.utils import gather_object

    unwrapped = trainer.accelerator.unwrap_model(trainer.model_wrapped)
    return gather_object([weights_digest(unwrapped)])


def _write_table(rows: list[dict[str, Any]], path: Path) -> None:
    """Rollout `rows` as Parquet with exactly ROLLOUT_COLUMNS."""
    import polars as pl

    pl.DataFrame([{k: r[k] for k in ROLLOUT_COLUMNS} for r in rows],
                 schema=polars_schema(ROLLOUT_COLUMNS)).write_parquet(path)


def _ensure_progress_handler() -> None:
    """Make the INFO progress lines visible, also when nobody configured logging."""
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    if not log.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        log.addHandler(handler)
