"""FST-distill (paper Fig 8): distil the pool's best context into the weights by reverse KL.

On-policy self-distillation (arXiv 2601.20802). The *student* is π_θ(· | x) with the run's seed
context; the *teacher* is the same weights frozen at the start of the cycle, θ_c, conditioned on
the teacher context φ* (the pool's best) as system prompt. Each step draws P problems, samples G
completions per problem from the student, and takes one AdamW step on

    L(θ) = 1/N Σ_{rollouts} Σ_t KL( π_θ(· | x, y<t) ‖ π_θc(· | φ*, x, y<t) )

where the KL is exact over the vocabulary, N is the step's number of completion tokens, and
gradients flow only through the student. Both distributions are taken at the sampling
temperature (as TRL does for its losses). Our own loop, not a TRL trainer: TRL's GKD and
DistillationTrainer feed teacher and student the same input, and its experimental SDFT/SDPO
trainers put the teacher's extra text (a demonstration, feedback) into the user turn beside the
student's system prompt, whereas here the teacher's system prompt is φ* in place of the seed
context. The distributed pieces are TRL's and accelerate's (below).

`run_distill_cycle` has `fastslow.slow.loop.run_cycle`'s signature and output contract: it writes
`model/`, `trainer_state/`, `rollouts.parquet` (the student's rollouts, labelled with the student
context) and `metrics.parquet` atomically into `out_dir`, and a chain of cycles equals one
uninterrupted run with the same process count (same data stream, sampling seeds derived from
(seed, global step) and, launched, the rank; optimiser, scheduler and RNG state restored).
CISPO-only knobs of `SlowConfig` (beta, epsilon_high, baseline, scale_rewards) are not used;
`use_vllm` is ignored (sampling uses HF generate).

In one process it trains the checkpoint's dtype in place (`_prepare_local`). Under `accelerate
launch` with N processes (`python -m fastslow.slow.train`, as the RL loop; `fastslow.launch`)
every rank samples its contiguous 1/N of each step's P*G rollouts from its own seed stream, and
the strategy's accelerator (DDP or FSDP2) prepares fp32 master weights and their AdamW state,
and places the frozen teacher whole on every rank (`_prepare_distributed`); the student's
forward runs inside the wrapper's (TRL's `_ForwardRedirection`, `_student_logits`), each rank's
loss is N x its KL sum over all ranks' tokens (the wrappers average gradients), and the main
process writes the cycle through the RL loop's save (`save_trained`: full weights, index-keyed
optimiser state, every rank's RNG state), so a cycle may resume with another process count.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastslow.records import check_metrics, context_hash, metrics_frame
from fastslow.slow.config import SlowConfig
from fastslow.slow.divergence import _hidden_at, _log_probs
from fastslow.slow.loop import (
    CycleResult,
    Tracker,
    _accumulation_context,
    _ensure_progress_handler,
    _main_process_dir,
    _write_table,
    answered_fraction,
    check_device,
    check_gradient,
    clip_gradients,
    restore_trained,
    resume_point,
    save_trained,
    steps_left,
    take_problems,
)
from fastslow.slow.trainer import (
    enable_activation_checkpointing,
    per_rank_batches,
    process_rank,
    rank_slice,
    world_size,
)
from fastslow.tasks.base import Problem, Task, answered, build_messages

log = logging.getLogger("fastslow.slow.distill")


# ---------------------------------------------------------------- the loss


def token_reverse_kl(student_logits: Any, teacher_logits: Any,
                     temperature: float = 1.0) -> tuple[Any, Any]:
    """Per-position KL(π_s ‖ π_t) and entropy H(π_s), exact over the last (vocabulary) axis.

    `student_logits` and `teacher_logits` have the same shape (..., V); any additive constant per
    position is irrelevant (log-probabilities work as well). The teacher is detached, so the KL
    is differentiable in the student only. Returns two tensors of shape (...), float32.
    """
    import torch

    logp = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    logq = torch.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    prob = logp.exp()
    kl = (prob * (logp - logq)).sum(-1)
    entropy = -(prob.detach() * logp.detach()).sum(-1)
    return kl, entropy


def completion_logits(model: Any, prompts: Sequence[Sequence[int]],
                      completions: Sequence[Sequence[int]], pad_id: int) -> Any:
    """The model's (log-normalised) logits predicting each completion token, shape (N, V).

    Rows are right-padded; only the N = Σ len(completion) positions that predict a completion
    token go through the LM head, ordered rollout by rollout, token by token, so two models fed
    different prompts but the same completions give row-aligned outputs. Differentiable.
    """
    import torch

    width = max(len(p) + len(c) for p, c in zip(prompts, completions, strict=True))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    where = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[row, : len(p) + len(c)] = torch.tensor([*p, *c], dtype=torch.long)
        attention[row, : len(p) + len(c)] = 1
        where[row, len(p) - 1: len(p) + len(c) - 1] = True  # position t predicts token t+1
    device = next(model.parameters()).device
    hidden = _hidden_at(model, ids.to(device), attention.to(device), where.to(device))
    return _log_probs(model, hidden, 1.0)


# ---------------------------------------------------------------- one distillation step


@dataclass
class _Trainee:
    """What one distillation step trains with. `model` is what the training forward runs
    through (accelerate's DDP wrapper, or the FSDP2-sharded model; the model itself in one
    process), `student` the model inside it (generation, saving), `teacher` the frozen θ_c
    (prepared by accelerate for evaluation when distributed). `accelerator` is None in one
    process. The attribute names are those of a trainer that `fastslow.slow.loop`'s distributed
    save and restore read (`model_wrapped`, `optimizer`, `lr_scheduler`)."""

    model: Any
    student: Any
    teacher: Any
    optimizer: Any
    lr_scheduler: Any
    #: the forwards autocast to bf16: `slow.bf16` in one process, the launch config's mixed
    #: precision under `accelerate launch` (as the RL loop's prepared model does)
    bf16: bool
    accelerator: Any = None

    @property
    def model_wrapped(self) -> Any:
        return self.model


def _student_logits(trainee: _Trainee, prompts: Sequence[Sequence[int]],
                    completions: Sequence[Sequence[int]], pad_id: int) -> Any:
    """The student's `completion_logits`. Distributed, they run inside the wrapper's forward
    (TRL's `_ForwardRedirection`, as TRL's DistillationTrainer does): DDP then prepares the
    gradients' all-reduce, and FSDP2 gathers the root's sharded weights (embeddings, final norm,
    LM head) that the decoder and head calls below the root would otherwise see as shards."""
    if trainee.accelerator is None:
        return completion_logits(trainee.student, prompts, completions, pad_id)
    from trl.models.utils import _ForwardRedirection

    return _ForwardRedirection()(trainee.model, trainee.student, completion_logits, trainee.student,
                                 prompts, completions, pad_id)


def _distill_step(trainee: _Trainee, generator: Any, task: Task, problems: list[Problem],
                  student_context: str, teacher_context: str, cfg: SlowConfig,
                  seed: int, where: str = "distill step") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Sample from the student, score, one AdamW step on the reverse KL (stopped before it when the
    gradient is not finite, naming `where`: `check_gradient`). (metrics, records).

    `problems`: one entry per rollout this process samples, all of the step's P*G in one
    process, its contiguous 1/N under `accelerate launch`. The loss is the token mean over the
    whole step's completion tokens (every rank's), as one process would take it; the metrics and
    records are the whole step's, on every rank."""
    import torch

    from fastslow.model.generation import SamplingParams

    accelerator = trainee.accelerator
    start = time.perf_counter()
    lr = float(trainee.lr_scheduler.get_last_lr()[0])
    student_chats = [build_messages(student_context, p) for p in problems]
    teacher_chats = [build_messages(teacher_context, p) for p in problems]

    trainee.model.eval()
    gens = generator.generate(student_chats, SamplingParams(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, seed=seed))
    gen_s = time.perf_counter() - start
    rewards = [float(task.reward(p, g.text)) for p, g in zip(problems, gens, strict=True)]
    feedback = [task.feedback(p, g.text) for p, g in zip(problems, gens, strict=True)]
    score_s = time.perf_counter() - start - gen_s

    # the ids the student sampled from, as our generators report them; encoded again only for a
    # generator that reports none
    student_ids = ([list(g.prompt_ids) for g in gens] if all(g.prompt_ids for g in gens)
                   else generator.encode_prompts(student_chats))
    teacher_ids = generator.encode_prompts(teacher_chats)
    completions = [list(g.completion_ids) for g in gens]
    n_tokens = sum(len(c) for c in completions)
    scale = 1.0
    if accelerator is not None:
        # every rank's tokens; DDP and FSDP2 average the ranks' gradients, so N x this rank's sum
        n_tokens = int(accelerator.reduce(torch.tensor(float(n_tokens), device=accelerator.device),
                                          reduction="sum"))
        scale = float(accelerator.num_processes)
    n_tokens = max(1, n_tokens)
    micro = cfg.micro_batch_size or len(problems)
    starts = list(range(0, len(problems), micro))
    autocast = torch.autocast(device_type=next(trainee.student.parameters()).device.type,
                              dtype=torch.bfloat16, enabled=trainee.bf16)
    trainee.model.train()
    kl_sum, entropy_sum = 0.0, 0.0
    for i, lo in enumerate(starts):
        rows = slice(lo, lo + micro)
        sync = (nullcontext() if accelerator is None
                else _accumulation_context(accelerator, trainee.model, last=i == len(starts) - 1))
        with sync:
            with autocast:
                with torch.no_grad():  # the teacher is never wrapped (see _prepare_distributed)
                    teacher_logits = completion_logits(trainee.teacher, teacher_ids[rows], completions[rows],
                                                       generator.pad_id)
                student_logits = _student_logits(trainee, student_ids[rows], completions[rows],
                                                 generator.pad_id)
            kl, entropy = token_reverse_kl(student_logits, teacher_logits, cfg.temperature)
            loss = kl.sum() * scale / n_tokens  # token mean over the whole step, as one batch would be
            if accelerator is not None:
                accelerator.backward(loss)
            else:
                loss.backward()
        kl_sum += float(kl.detach().sum())
        entropy_sum += float(entropy.sum())
    grad_norm = clip_gradients(trainee.model.parameters(), cfg.max_grad_norm, accelerator)
    check_gradient(grad_norm, kl_sum * scale / n_tokens, where)
    trainee.optimizer.step()
    trainee.lr_scheduler.step()
    trainee.optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - start

    records = [{
        "problem_id": p.id,
        "completion": g.text,
        "reward": r,
        "feedback": fb,
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.completion_tokens,
        "logprob_sum": float(g.logprob_sum) if g.logprob_sum is not None else float("nan"),
        "truncated": g.finish_reason == "length",
        "answered": answered(g.text),
        "reused": False,  # every step samples its own
        "policy_lag": 0,
    } for p, g, r, fb in zip(problems, gens, rewards, feedback, strict=True)]
    if accelerator is not None:  # the whole step: every rank's rows (rank order = row order)
        from accelerate.utils import gather_object

        sums = accelerator.reduce(torch.tensor([kl_sum, entropy_sum], dtype=torch.float64,
                                               device=accelerator.device), reduction="sum")
        kl_sum, entropy_sum = float(sums[0]), float(sums[1])
        parts = gather_object([(records, gen_s, score_s, seconds)])
        records = [rec for part in parts for rec in part[0]]
        gen_s, score_s, seconds = (max(part[k] for part in parts) for k in (1, 2, 3))

    rewards_all = np.asarray([rec["reward"] for rec in records], dtype=float)
    lengths = [rec["completion_tokens"] for rec in records]
    grouped = rewards_all.reshape(-1, cfg.num_generations)
    metrics = {
        "reward_mean": float(rewards_all.mean()),
        "reward_std": float(rewards_all.std()),
        "frac_zero_std_groups": float(np.mean(np.isclose(grouped.std(axis=1), 0.0))),
        "answered_fraction": answered_fraction(records),
        "distill_kl": kl_sum / n_tokens,
        "entropy": entropy_sum / n_tokens,
        "loss": kl_sum / n_tokens,
        "grad_norm": grad_norm,
        "lr": lr,
        "completion_tokens": int(sum(lengths)),
        "mean_completion_tokens": float(np.mean(lengths)),
        "truncated_fraction": float(np.mean([rec["truncated"] for rec in records])),
        "generation_seconds": gen_s,
        "scoring_seconds": score_s,
        "training_seconds": seconds - gen_s - score_s,
        "step_seconds": seconds,
        "generated_tokens_per_s": float(sum(lengths) / max(gen_s, 1e-9)),
    }
    return metrics, records


# ---------------------------------------------------------------- optimiser and state


def make_optimizer(model: Any, cfg: SlowConfig) -> tuple[Any, Any]:
    """AdamW (decay on matrices only, nanoGPT-style) and HF's constant schedule with warm-up."""
    import torch
    from transformers import get_constant_schedule_with_warmup

    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2))
    return optimizer, get_constant_schedule_with_warmup(optimizer, cfg.warmup_steps)


def rounding_warning(model: Any, lr: float) -> str | None:
    """Why `model`'s updates at learning rate `lr` mostly round away, or None: trained in place
    in bf16/fp16 (no fp32 master copy, see run_distill_cycle), an AdamW step moves a weight by
    about `lr`, and the update is lost where that is below half the dtype's spacing at the
    weight, 2^(floor(log2|w|) - mantissa bits), i.e. where |w| >= 2^(floor(log2 lr) + bits + 2).
    Reports the share of weights for which it is."""
    import torch

    total = lost = 0
    dtype = None
    for p in model.parameters():
        if p.dtype not in (torch.bfloat16, torch.float16):
            continue
        dtype = p.dtype
        bits = 7 if p.dtype == torch.bfloat16 else 10
        threshold = 2.0 ** (math.floor(math.log2(lr)) + bits + 2)
        lost += int((p.detach().abs() >= threshold).sum())  # one comparison in the weights' own dtype
        total += p.numel()
    if not total or lost * 2 < total:
        return None
    return (f"{dtype} weights trained in place: an AdamW step (~lr = {lr:g}) is below half the "
            f"dtype's spacing for {lost / total:.0%} of them, so those updates round away "
            f"(README: 'FST-distill at paper scale')")


def memory_floor(model_dir: str | Path, cfg: SlowConfig, processes: int = 1,
                 sharded: bool = False, bf16: bool = True) -> dict[str, Any]:
    """What one distillation cycle of the model in `model_dir` holds on each of its devices, from
    the model's config and the weights files' headers (no weights are read; the parameters are
    counted on the meta device), in bytes.

    In one process `run_distill_cycle` trains the weights in place, in their own dtype, so at the
    first optimiser step the weights, their gradients, both AdamW moments and the frozen
    teacher's copy are all held: five copies, `certain` (activations, logits and the CUDA
    context come on top). Sampling a step holds the weights, the moments and the teacher (the
    gradients are freed) and the KV cache of the P*G rollouts, which at worst all run to
    `max_new_tokens` (`sampling_worst`; their prompts on top, rows that stop early leave the cache).

    Over `processes` > 1 ranks (`accelerate launch`) the student is fp32 master weights,
    gradients and two moments (16 bytes a parameter), which FSDP2 (`sharded`) splits over the
    ranks and DDP gives every rank whole, plus DDP's gradient buckets (another fp32 copy of the
    gradients, 4 bytes; torch's default `gradient_as_bucket_view=False`), and every rank holds
    the whole teacher, in bf16 under the launch config's mixed precision (`bf16`, else fp32).
    Each rank samples P*G / N rollouts, its KV cache in bf16 (fp32 without mixed precision)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    dtype = _weights_dtype(config, Path(model_dir))
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    text = config.get_text_config()
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    per_token = text.num_hidden_layers * heads * head_dim * 2  # keys and values, every layer
    if processes <= 1:
        size = torch.empty((), dtype=dtype).element_size()
        copy_bytes = params * size
        kv = cfg.rollouts_per_step * cfg.max_new_tokens * per_token * size
        return {"params": params, "dtype": str(dtype).removeprefix("torch."), "processes": 1,
                "sharded": False, "certain": 5 * copy_bytes, "kv_worst": kv,
                "sampling_worst": 4 * copy_bytes + kv, "teacher": copy_bytes}
    low = 2 if bf16 else 4
    teacher = low * params
    if sharded:  # fp32 weights, gradients and two moments, a share each; sampling frees the gradients
        student, sampling = 16 * params // processes, 12 * params // processes
    else:  # the same whole, and the gradient buckets (the DDP reducer keeps them while sampling)
        student, sampling = 20 * params, 16 * params
    kv = cfg.rollouts_per_step // processes * cfg.max_new_tokens * per_token * low
    return {"params": params, "dtype": "float32", "processes": processes, "sharded": sharded,
            "certain": student + teacher, "kv_worst": kv, "sampling_worst": sampling + teacher + kv,
            "teacher": teacher}


def _weights_dtype(config: Any, model_dir: Path) -> Any:
    """The dtype `load_model(dtype="auto")` gives: the config's, else the first safetensors
    file's (its header), else float32."""
    import torch

    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if isinstance(dtype, torch.dtype):
        return dtype
    from safetensors import safe_open

    names = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
    for path in sorted(model_dir.glob("*.safetensors"))[:1]:
        with safe_open(str(path), "pt") as f:  # the header only
            for key in f.keys():
                stored = f.get_slice(key).get_dtype()
                if stored in names:
                    return names[stored]
    return torch.float32


def memory_verdict(floor: dict[str, Any], device_bytes: int, device: str = "cuda:0") -> tuple[str | None, str | None]:
    """(refusal, warning) of a cycle whose needs are `floor` (`memory_floor`) on devices of
    `device_bytes` each: a one-line refusal when what it certainly holds does not fit, a warning
    when its sampling's worst case does not; None for each that does."""
    gib = 1024 ** 3
    refusal = warning = None
    n = floor.get("processes", 1)
    if n <= 1:
        where, holds = "one GPU", (f"{floor['params'] / 1e9:.2f}B parameters in {floor['dtype']} with their "
                                   "gradients, two AdamW moments and the frozen teacher hold")
        fix = "several GPUs shard it: README 'FST-distill at paper scale'"
    else:
        where = f"its {n} GPUs"
        holds = (f"{floor['params'] / 1e9:.2f}B parameters as fp32 master weights with their gradients and two "
                 + (f"AdamW moments sharded over the {n} ranks (FSDP2)" if floor.get("sharded")
                    else "AdamW moments and gradient buckets whole on every rank (DDP)")
                 + f", and the frozen teacher whole on every rank ({floor['teacher'] / gib:.1f} GiB), hold")
        fix = ("more GPUs shrink the student's share, not the teacher's copy" if floor.get("sharded")
               else "FASTSLOW_ACCELERATE_STRATEGY=fsdp2 shards the student")
    if floor["certain"] > device_bytes:
        refusal = (f"fst_distill cannot fit {where}: {holds} {floor['certain'] / gib:.1f} GiB "
                   f"{'per GPU ' if n > 1 else ''}before any activation, and {device} has "
                   f"{device_bytes / gib:.1f} GiB ({fix})")
    if floor["sampling_worst"] > device_bytes:
        warning = (f"fst_distill may run out of memory on {device} ({device_bytes / gib:.1f} GiB) while "
                   f"sampling: {'P*G' if n <= 1 else f'its P*G/{n}'} rollouts of up to max_new_tokens hold up to "
                   f"{floor['kv_worst'] / gib:.1f} GiB of KV cache beside "
                   f"{(floor['sampling_worst'] - floor['kv_worst']) / gib:.1f} GiB of weights, "
                   "AdamW moments and teacher (fewer or shorter rollouts: slow.problems_per_step, "
                   "num_generations, max_new_tokens)")
    return refusal, warning


#: Seconds the child reading the GPU's memory may take (`gpu_memory_bytes`).
GPU_MEMORY_TIMEOUT = 300.0


def gpu_memory_bytes() -> int | None:
    """Total memory of this job's first GPU, None without one. Read in a child process: CUDA
    initialised in the job's own process would make a vLLM generator start its workers by
    spawning, which re-runs the job's script."""
    import subprocess
    import sys

    import torch

    if not torch.cuda.is_available():
        return None
    try:  # a child that hangs (a wedged driver) or cannot start is no memory check, as one that fails
        out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_properties(0).total_memory)"],
                             capture_output=True, text=True, timeout=GPU_MEMORY_TIMEOUT)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, OSError) as exc:
        why = " ".join(str(exc).split())
    except (IndexError, ValueError):
        why = out.stderr.strip() or "?"
    log.warning("FST-distill: GPU memory not read (%s); no memory check", why[-200:])
    return None


def device_memory_check(model_dir: str | Path, cfg: SlowConfig, processes: int = 1,
                        sharded: bool = False, bf16: bool = True) -> tuple[str | None, str | None]:
    """`memory_verdict` on this job's (first) GPU; (None, None) on a CPU. `processes`, `sharded`
    and `bf16`: the ranks the cycle trains in, whether their strategy shards (FSDP2) and whether
    it runs in bf16 mixed precision (`memory_floor`)."""
    device_bytes = gpu_memory_bytes()
    if device_bytes is None:
        return None, None
    return memory_verdict(memory_floor(model_dir, cfg, processes, sharded, bf16), device_bytes)


def _prepare_local(policy_dir: Path, tokenizer: Any, cfg: SlowConfig, run_id: str,
                   cycle: int) -> tuple[_Trainee, Any]:
    """One process: the checkpoint's dtype for weights and AdamW state (an 8B policy with fp32
    weights and AdamW state, ~96 GB, and its teacher would not fit one GPU); bf16 weights round
    very small updates away (`rounding_warning`)."""
    import torch
    from trl.trainer.utils import disable_dropout_in_model

    from fastslow.model.convert import load_model
    from fastslow.model.generation import HFGenerator

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(policy_dir, dtype="auto", device=device)
    warning = rounding_warning(model, cfg.lr)
    if warning:
        log.warning("FST-distill %s cycle %d: %s", run_id, cycle, warning)
    disable_dropout_in_model(model)  # TRL's, as its trainers do
    teacher = copy.deepcopy(model).eval().requires_grad_(False)  # θ_c, frozen for the cycle
    if cfg.activation_checkpointing:
        enable_activation_checkpointing(model)
    optimizer, scheduler = make_optimizer(model, cfg)
    # One generation batch per step (as TRL's), so the samples do not depend on micro_batch_size.
    generator = HFGenerator(model, tokenizer, batch_size=cfg.rollouts_per_step,
                            chat_template_kwargs=cfg.chat_template_kwargs)
    return _Trainee(model, model, teacher, optimizer, scheduler, cfg.bf16), generator


def _prepare_distributed(policy_dir: Path, tokenizer: Any, cfg: SlowConfig,
                         num_processes: int) -> tuple[_Trainee, Any]:
    """Under `accelerate launch`: the strategy's accelerator (DDP or FSDP2, from the launch
    config) prepares the student and its optimiser, and places the frozen teacher whole on every
    rank (`prepare_model(..., evaluation_mode=True)`, as TRL's DistillationTrainer does: accelerate
    shards no evaluation model). fp32 master weights and AdamW state, as the RL loop keeps (bf16
    would round lr-1e-6 updates away); under the launch config's bf16 mixed precision
    (fsdp2.yaml, ddp.yaml; off on a CPU) the forwards autocast to bf16 and the teacher is held in
    bf16 (what its forward computes in). Each rank samples its P*G/N rollouts in one batch;
    sharded, with plain `generate` over the sharded model under `no_grad` (the ranks decode in
    step: transformers syncs them), not with the prefill sharing and row compaction that would
    run a different number of forwards on each rank, nor under inference mode (FSDP2's gather
    buffers, made at the first forward, serve the training forward after it)."""
    import os

    import torch
    from accelerate import Accelerator
    from trl.trainer.utils import disable_dropout_in_model

    from fastslow.model.convert import load_model
    from fastslow.model.generation import HFGenerator

    # Both models load before the process group exists, on every rank: once it does, under FSDP's
    # CPU-RAM-efficient loading transformers < 5.18 gives ranks > 0 zeros for accelerate to fill,
    # which it does for the student it shards but not for a teacher (fsdp2.yaml keeps that loading
    # off anyway). The launch's mixed precision (in its environment) picks the teacher's dtype.
    bf16 = os.environ.get("ACCELERATE_MIXED_PRECISION", "no") == "bf16"
    model = load_model(policy_dir, dtype="float32")
    teacher = load_model(policy_dir, dtype="bfloat16" if bf16 else "float32").requires_grad_(False)
    # cpu: without a GPU, gloo ranks (MULTI_CPU), as TRL's trainer arguments set them up
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    if accelerator.num_processes != num_processes:
        raise RuntimeError(f"fst_distill: WORLD_SIZE={num_processes} but accelerate set up "
                           f"{accelerator.num_processes} process(es) ({accelerator.distributed_type})")
    bf16 = accelerator.mixed_precision == "bf16"
    teacher.to(torch.bfloat16 if bf16 else torch.float32)
    disable_dropout_in_model(model)
    if cfg.activation_checkpointing:
        enable_activation_checkpointing(model)
    optimizer, scheduler = make_optimizer(model, cfg)
    # the scheduler stays unprepared: accelerate's wrapper would step it once per process. The
    # student is prepared first: accelerator.clip_grad_norm_ finds the model of the parameters it
    # is given by comparing them with each prepared model's, in order
    model, optimizer = accelerator.prepare(model, optimizer)
    # placed explicitly: under FSDP accelerate places no model itself (it leaves placement to
    # sharding), and this one it does not shard
    teacher = accelerator.prepare_model(teacher, device_placement=True, evaluation_mode=True)
    student = accelerator.unwrap_model(model)
    rows = cfg.rollouts_per_step // num_processes
    if accelerator.is_fsdp2:
        generator = HFGenerator(model, tokenizer, batch_size=rows, share_prefill=False,
                                chat_template_kwargs=cfg.chat_template_kwargs)
        generator.compact = False
        generator.inference_mode = False
    else:
        generator = HFGenerator(student, tokenizer, batch_size=rows, chat_template_kwargs=cfg.chat_template_kwargs)
    return _Trainee(model, student, teacher, optimizer, scheduler, bf16, accelerator), generator


# ---------------------------------------------------------------- the cycle


def run_distill_cycle(
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
    student_context: str = "",
    student_context_id: str = "seed",
) -> CycleResult:
    """Run T = cfg.steps_per_cycle distillation steps and write the cycle's outputs to `out_dir`.

    Args:
        model_dir: the run's initial weights θ0 (start when `state_in` is None).
        state_in: the previous cycle's `out_dir`, or None to start fresh.
        contexts: exactly one (context_id, text): the teacher context (the pool's best).
        task, train_problems: rewards and feedback of the student's rollouts (logged, not
            trained on); the training set, in the same order in every cycle of a run.
        cfg: P, G, max_new_tokens, temperature, top_p, lr, warm-up, AdamW, micro-batch, seed.
        run_id, cycle: written into every row and into the state.
        tracker: `log_metrics(dict, step)` once per step, keys prefixed "slow/".
        progress: make the per-step INFO line visible on stderr when no logging is
            configured; the line is logged either way.
        ref_model_dir: the run's base weights, recorded as provenance (default `model_dir`).
        new_data: restart the data stream at cursor 0 on `train_problems` (a continual run
            switched task); weights, optimiser, scheduler and step carry over.
        student_context, student_context_id: the context the student is sampled and trained
            with (the run's seed context; "" = no system prompt), and its id in rollouts.
    """
    from fastslow.io import atomic_path
    from fastslow.model.convert import PROVENANCE_FILE, load_tokenizer
    from fastslow.model.generation import derive_seed, render_prompts

    check_device(cfg)
    num_processes = world_size()
    distributed = num_processes > 1
    if distributed:  # P*G must split over the ranks: fail before any work
        per_rank_batches(cfg, num_processes)
    if len(contexts) != 1:
        raise ValueError(f"run_distill_cycle takes exactly one (teacher) context, got {len(contexts)}")
    (teacher_id, teacher_context), = contexts
    problems = list(train_problems)
    model_dir = Path(model_dir)
    policy_dir, global_step, cursor, fingerprint = resume_point(model_dir, state_in, problems, new_data)
    if progress:
        _ensure_progress_handler()
    if cfg.use_vllm:
        log.warning("FST-distill samples with HF generate; use_vllm is ignored")
    ref_dir = Path(ref_model_dir) if ref_model_dir is not None else model_dir
    rank = process_rank()
    is_main = rank == 0
    out_dir = Path(out_dir)

    with (atomic_path(out_dir, is_dir=True) if not distributed else _main_process_dir(out_dir, is_main)) as tmp:
        tokenizer = load_tokenizer(policy_dir)
        trainee, generator = (_prepare_distributed(policy_dir, tokenizer, cfg, num_processes) if distributed
                              else _prepare_local(policy_dir, tokenizer, cfg, run_id, cycle))
        if state_in is not None:
            restore_trained(trainee, Path(state_in) / "trainer_state", cfg, global_step, num_processes)
        generator.length_key = "slow.max_new_tokens"

        student_hash = context_hash(student_context)
        prompt_texts: dict[str, str] = {}
        metrics_rows: list[dict[str, Any]] = []
        rollout_rows: list[dict[str, Any]] = []
        for t in range(cfg.steps_per_cycle):
            picked = [problems[i] for i in take_problems(len(problems), cfg.seed, cursor,
                                                         cfg.problems_per_step)]
            cursor += cfg.problems_per_step
            step_rows = [p for p in picked for _ in range(cfg.num_generations)]
            seed = derive_seed(cfg.seed, global_step)
            if distributed:  # this rank's contiguous share of the rows, sampled from its own stream
                step_rows = step_rows[rank_slice(len(step_rows), rank, num_processes)]
                seed = derive_seed(seed, rank)
            step_name = f"distill {run_id} cycle {cycle} step {t + 1}/{cfg.steps_per_cycle} (global {global_step})"
            metrics, records = _distill_step(trainee, generator, task, step_rows, student_context,
                                             teacher_context, cfg, seed, where=step_name)
            for p in picked:
                if p.id not in prompt_texts:
                    chat = build_messages(student_context, p)
                    prompt_texts[p.id] = render_prompts(tokenizer, [chat], cfg.chat_template_kwargs)[0]
            for rec in records:
                rec.update(run=run_id, cycle=cycle, step=global_step, context_id=student_context_id,
                           context_hash=student_hash, prompt=prompt_texts[rec["problem_id"]])
            rollout_rows.extend(records)
            metrics_rows.append(check_metrics({"run": run_id, "cycle": cycle, "step": global_step,
                                               "step_in_cycle": t, "num_contexts": 1, **metrics}))
            if tracker is not None and is_main:
                tracker.log_metrics({f"slow/{k}": v for k, v in metrics.items()}, step=global_step)
            if is_main:
                left = steps_left(metrics_rows, cfg.steps_per_cycle)  # as the RL steps' line gives it
                log.info("%s: reward %.3f±%.3f (%.0f%% answered), kl to the teacher %.4f, "
                         "entropy %.3f, %d tok (%.0f%% cut at %d) at %.1f tok/s, %.1fs (gen %.1fs, train %.1fs)%s",
                         step_name, metrics["reward_mean"], metrics["reward_std"],
                         100 * metrics["answered_fraction"], metrics["distill_kl"], metrics["entropy"],
                         metrics["completion_tokens"], 100 * metrics["truncated_fraction"], cfg.max_new_tokens,
                         metrics["generated_tokens_per_s"], metrics["step_seconds"], metrics["generation_seconds"],
                         metrics["training_seconds"], f", steps ~{left:.0f}s left" if left else "")
            global_step += 1

        trainee.student.eval()
        log.info("distill %s cycle %d: writing the weights and the trainer state", run_id, cycle)
        info = {
            "run": run_id, "cycle": cycle, "global_step": global_step, "cursor": cursor,
            "problems_fingerprint": fingerprint, "num_problems": len(problems),
            "ref_model_dir": str(ref_dir), "method": "fst_distill",
            "teacher_context_id": teacher_id, "teacher_context_hash": context_hash(teacher_context),
            "student_context_hash": student_hash, "config": cfg.to_dict(),
        }
        # several processes: collective (the weights gathered under FSDP2, every rank's RNG state)
        save_trained(trainee, tokenizer, tmp, info, num_processes)
        if tmp is not None:
            (tmp / "model" / PROVENANCE_FILE).write_text(json.dumps(
                {"kind": "distill-cycle", "run": run_id, "cycle": cycle, "global_step": global_step,
                 "base": str(ref_dir), "teacher_context_id": teacher_id}, indent=2, sort_keys=True) + "\n")
            _write_table(rollout_rows, tmp / "rollouts.parquet")
            metrics_frame(metrics_rows).write_parquet(tmp / "metrics.parquet")
        if distributed:
            trainee.accelerator.wait_for_everyone()
        del generator, trainee
    return CycleResult(out_dir=out_dir, global_step=global_step, metrics=metrics_rows)
