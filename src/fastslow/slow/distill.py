"""FST-distill (paper Fig 8): distil the pool's best context into the weights by reverse KL.

On-policy self-distillation (arXiv 2601.20802). The *student* is π_θ(· | x) with the run's seed
context; the *teacher* is the same weights frozen at the start of the cycle, θ_c, conditioned on
the teacher context φ* (the pool's best) as system prompt. Each step draws P problems, samples G
completions per problem from the student, and takes one AdamW step on

    L(θ) = 1/N Σ_{rollouts} Σ_t KL( π_θ(· | x, y<t) ‖ π_θc(· | φ*, x, y<t) )

where the KL is exact over the vocabulary, N is the step's number of completion tokens, and
gradients flow only through the student. Both distributions are taken at the sampling
temperature (as TRL does for its losses). Our own loop, not TRL's GKD trainer, because GKD feeds
teacher and student the same input, whereas here their prompts differ.

`run_distill_cycle` has `fastslow.slow.loop.run_cycle`'s signature and output contract: it writes
`model/`, `trainer_state/`, `rollouts.parquet` (the student's rollouts, labelled with the student
context) and `metrics.parquet` atomically into `out_dir`, and a chain of cycles equals one
uninterrupted run (same data stream, sampling seeds derived from (seed, global step), optimiser,
scheduler and RNG state restored). CISPO-only knobs of `SlowConfig` (beta, epsilon_high, baseline,
scale_rewards) are not used; `use_vllm` is ignored (sampling uses HF generate). It runs in one
process: under `accelerate launch` with several processes it refuses to start (the RL loop is the
one that shards a step over ranks).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastslow.records import ROLLOUT_COLUMNS, context_hash
from fastslow.slow.config import SlowConfig
from fastslow.slow.divergence import _hidden_at, _log_probs
from fastslow.slow.loop import (
    STATE_FILE,
    CycleResult,
    Tracker,
    _ensure_progress_handler,
    _rng_state,
    _set_rng_state,
    _write_table,
    check_device,
    resume_point,
    take_problems,
)
from fastslow.slow.trainer import enable_activation_checkpointing, world_size
from fastslow.tasks.base import Problem, Task, build_messages

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


def reverse_kl_loss(student_logits: Any, teacher_logits: Any, mask: Any | None = None,
                    temperature: float = 1.0) -> Any:
    """Mean over the (masked) positions of `token_reverse_kl`: the distillation loss."""
    kl, _ = token_reverse_kl(student_logits, teacher_logits, temperature)
    if mask is None:
        return kl.mean()
    mask = mask.to(kl.dtype)
    return (kl * mask).sum() / mask.sum().clamp(min=1.0)


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


def _distill_step(model: Any, teacher: Any, optimizer: Any, scheduler: Any, generator: Any,
                  task: Task, picked: list[Problem], student_context: str, teacher_context: str,
                  cfg: SlowConfig, seed: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Sample from the student, score, one AdamW step on the reverse KL. (metrics, records)."""
    import torch

    from fastslow.model.generation import SamplingParams

    start = time.perf_counter()
    lr = float(scheduler.get_last_lr()[0])
    problems = [p for p in picked for _ in range(cfg.num_generations)]
    student_chats = [build_messages(student_context, p) for p in problems]
    teacher_chats = [build_messages(teacher_context, p) for p in problems]

    model.eval()
    gens = generator.generate(student_chats, SamplingParams(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p, seed=seed))
    gen_s = time.perf_counter() - start
    rewards = np.asarray([float(task.reward(p, g.text)) for p, g in zip(problems, gens, strict=True)])
    feedback = [task.feedback(p, g.text) for p, g in zip(problems, gens, strict=True)]
    score_s = time.perf_counter() - start - gen_s

    student_ids = generator.encode_prompts(student_chats)
    teacher_ids = generator.encode_prompts(teacher_chats)
    completions = [list(g.completion_ids) for g in gens]
    n_tokens = max(1, sum(len(c) for c in completions))
    micro = cfg.micro_batch_size or len(problems)
    autocast = torch.autocast(device_type=next(model.parameters()).device.type,
                              dtype=torch.bfloat16, enabled=cfg.bf16)
    model.train()
    kl_sum, entropy_sum = 0.0, 0.0
    for lo in range(0, len(problems), micro):
        rows = slice(lo, lo + micro)
        with autocast:
            with torch.no_grad():
                teacher_logits = completion_logits(teacher, teacher_ids[rows], completions[rows],
                                                   generator.pad_id)
            student_logits = completion_logits(model, student_ids[rows], completions[rows],
                                               generator.pad_id)
        kl, entropy = token_reverse_kl(student_logits, teacher_logits, cfg.temperature)
        (kl.sum() / n_tokens).backward()  # token mean over the whole step, as one batch would be
        kl_sum += float(kl.detach().sum())
        entropy_sum += float(entropy.sum())
    clip = cfg.max_grad_norm if cfg.max_grad_norm is not None else float("inf")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - start

    lengths = [len(c) for c in completions]
    grouped = rewards.reshape(-1, cfg.num_generations)
    metrics = {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "frac_zero_std_groups": float(np.mean(np.isclose(grouped.std(axis=1), 0.0))),
        "distill_kl": kl_sum / n_tokens,
        "entropy": entropy_sum / n_tokens,
        "loss": kl_sum / n_tokens,
        "grad_norm": grad_norm,
        "lr": lr,
        "completion_tokens": int(sum(lengths)),
        "mean_completion_tokens": float(np.mean(lengths)),
        "generation_seconds": gen_s,
        "scoring_seconds": score_s,
        "training_seconds": seconds - gen_s - score_s,
        "step_seconds": seconds,
        "generated_tokens_per_s": float(sum(lengths) / max(gen_s, 1e-9)),
    }
    records = [{
        "problem_id": p.id,
        "completion": g.text,
        "reward": float(r),
        "feedback": fb,
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.completion_tokens,
        "logprob_sum": float(g.logprob_sum) if g.logprob_sum is not None else float("nan"),
    } for p, g, r, fb in zip(problems, gens, rewards, feedback, strict=True)]
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
            f"(README: 'Known gap at paper scale')")


def memory_floor(model_dir: str | Path, cfg: SlowConfig) -> dict[str, Any]:
    """What one distillation cycle of the model in `model_dir` holds on its one device, from the
    model's config and the weights files' headers (no weights are read; the parameters are
    counted on the meta device), in bytes. `run_distill_cycle` trains the weights in place, in
    their own dtype, so at the first optimiser step the weights, their gradients, both AdamW
    moments and the frozen teacher's copy are all held: five copies, `certain` (activations,
    logits and the CUDA context come on top). Sampling a step holds the weights, the moments
    and the teacher (the gradients are freed) and the KV cache of the P*G rollouts, which at
    worst all run to `max_new_tokens` (`sampling_worst`; their prompts on top, rows that stop
    early leave the cache)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    dtype = _weights_dtype(config, Path(model_dir))
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    size = torch.empty((), dtype=dtype).element_size()
    copy_bytes = params * size
    text = config.get_text_config()
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv = cfg.rollouts_per_step * cfg.max_new_tokens * text.num_hidden_layers * heads * head_dim * 2 * size
    return {"params": params, "dtype": str(dtype).removeprefix("torch."),
            "certain": 5 * copy_bytes, "kv_worst": kv, "sampling_worst": 4 * copy_bytes + kv}


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
    """(refusal, warning) of a cycle whose needs are `floor` on a device of `device_bytes`: a
    one-line refusal when what it certainly holds does not fit, a warning when its sampling's
    worst case does not; None for each that does."""
    gib = 1024 ** 3
    refusal = warning = None
    if floor["certain"] > device_bytes:
        refusal = (f"fst_distill cannot fit one GPU: {floor['params'] / 1e9:.2f}B parameters in {floor['dtype']} "
                   f"with their gradients, two AdamW moments and the frozen teacher hold "
                   f"{floor['certain'] / gib:.1f} GiB before any activation, and {device} has "
                   f"{device_bytes / gib:.1f} GiB (README: 'Known gap at paper scale')")
    if floor["sampling_worst"] > device_bytes:
        warning = (f"fst_distill may run out of memory on {device} ({device_bytes / gib:.1f} GiB) while "
                   f"sampling: P*G rollouts of up to max_new_tokens hold up to {floor['kv_worst'] / gib:.1f} GiB "
                   f"of KV cache beside {(floor['sampling_worst'] - floor['kv_worst']) / gib:.1f} GiB of weights, "
                   "AdamW moments and teacher (fewer or shorter rollouts: slow.problems_per_step, "
                   "num_generations, max_new_tokens)")
    return refusal, warning


def gpu_memory_bytes() -> int | None:
    """Total memory of this job's first GPU, None without one. Read in a child process: CUDA
    initialised in the job's own process would make a vLLM generator start its workers by
    spawning, which re-runs the job's script."""
    import subprocess
    import sys

    import torch

    if not torch.cuda.is_available():
        return None
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.get_device_properties(0).total_memory)"],
                         capture_output=True, text=True, timeout=300)
    try:
        return int(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        log.warning("FST-distill: GPU memory not read (%s); no memory check", (out.stderr.strip() or "?")[-200:])
        return None


def device_memory_check(model_dir: str | Path, cfg: SlowConfig) -> tuple[str | None, str | None]:
    """`memory_verdict` on this job's GPU; (None, None) on a CPU."""
    device_bytes = gpu_memory_bytes()
    if device_bytes is None:
        return None, None
    return memory_verdict(memory_floor(model_dir, cfg), device_bytes)


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
        progress: log one line per step to stderr.
        ref_model_dir: the run's base weights, recorded as provenance (default `model_dir`).
        new_data: restart the data stream at cursor 0 on `train_problems` (a continual run
            switched task); weights, optimiser, scheduler and step carry over.
        student_context, student_context_id: the context the student is sampled and trained
            with (the run's seed context; "" = no system prompt), and its id in rollouts.
    """
    import torch

    from fastslow.io import atomic_path
    from fastslow.model.convert import PROVENANCE_FILE, load_model, load_tokenizer
    from fastslow.model.generation import HFGenerator, derive_seed, render_prompts

    check_device(cfg)
    if world_size() > 1:
        raise RuntimeError(f"fst_distill runs in one process only, got WORLD_SIZE={world_size()}; "
                           "give the job one GPU (or unset FASTSLOW_TRAIN_PROCESSES)")
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
    device = "cuda" if torch.cuda.is_available() else "cpu"

    with atomic_path(out_dir, is_dir=True) as tmp:
        tokenizer = load_tokenizer(policy_dir)
        # The checkpoint's dtype, unlike the RL cycle's fp32 master weights (slow.loop): distillation
        # runs in one process, where an 8B policy with fp32 weights and AdamW state (~96 GB) and
        # its teacher would not fit one GPU. bf16 weights round very small updates away.
        model = load_model(policy_dir, dtype="auto", device=device)
        warning = rounding_warning(model, cfg.lr)
        if warning:
            log.warning("FST-distill %s cycle %d: %s", run_id, cycle, warning)
        from trl.trainer.utils import disable_dropout_in_model

        disable_dropout_in_model(model)  # TRL's, as its trainers do
        teacher = copy.deepcopy(model).eval().requires_grad_(False)  # θ_c, frozen for the cycle
        if cfg.activation_checkpointing:
            enable_activation_checkpointing(model)
        optimizer, scheduler = make_optimizer(model, cfg)
        if state_in is not None:
            state_dir = Path(state_in) / "trainer_state"
            optimizer.load_state_dict(torch.load(state_dir / "optimizer.pt"))
            scheduler.load_state_dict(torch.load(state_dir / "scheduler.pt"))
            _set_rng_state(torch.load(state_dir / "rng_state.pt", weights_only=False))
        # One generation batch per step (as TRL's), so the samples do not depend on micro_batch_size.
        generator = HFGenerator(model, tokenizer, batch_size=cfg.rollouts_per_step)
        generator.length_key = "slow.max_new_tokens"

        student_hash = context_hash(student_context)
        prompt_texts: dict[str, str] = {}
        metrics_rows: list[dict[str, Any]] = []
        rollout_rows: list[dict[str, Any]] = []
        for t in range(cfg.steps_per_cycle):
            picked = [problems[i] for i in take_problems(len(problems), cfg.seed, cursor,
                                                         cfg.problems_per_step)]
            cursor += cfg.problems_per_step
            metrics, records = _distill_step(model, teacher, optimizer, scheduler, generator, task,
                                             picked, student_context, teacher_context, cfg,
                                             derive_seed(cfg.seed, global_step))
            for p in picked:
                if p.id not in prompt_texts:
                    chat = build_messages(student_context, p)
                    prompt_texts[p.id] = render_prompts(tokenizer, [chat])[0]
            for rec in records:
                rec.update(run=run_id, cycle=cycle, step=global_step, context_id=student_context_id,
                           context_hash=student_hash, prompt=prompt_texts[rec["problem_id"]])
            rollout_rows.extend(records)
            metrics_rows.append({"run": run_id, "cycle": cycle, "step": global_step,
                                 "step_in_cycle": t, "num_contexts": 1, **metrics})
            if tracker is not None:
                tracker.log_metrics({f"slow/{k}": v for k, v in metrics.items()}, step=global_step)
            log.info("distill %s cycle %d step %d/%d (global %d): reward %.3f±%.3f, kl %.4f, "
                     "entropy %.3f, %d tok at %.1f tok/s, %.1fs (gen %.1fs, train %.1fs)", run_id,
                     cycle, t + 1, cfg.steps_per_cycle, global_step, metrics["reward_mean"],
                     metrics["reward_std"], metrics["distill_kl"], metrics["entropy"],
                     metrics["completion_tokens"], metrics["generated_tokens_per_s"],
                     metrics["step_seconds"], metrics["generation_seconds"],
                     metrics["training_seconds"])
            global_step += 1

        model.eval()
        log.info("distill %s cycle %d: writing the weights and the trainer state", run_id, cycle)
        model.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "model")
        (tmp / "model" / PROVENANCE_FILE).write_text(json.dumps(
            {"kind": "distill-cycle", "run": run_id, "cycle": cycle, "global_step": global_step,
             "base": str(ref_dir), "teacher_context_id": teacher_id}, indent=2, sort_keys=True) + "\n")
        state_dir = tmp / "trainer_state"
        state_dir.mkdir()
        torch.save(optimizer.state_dict(), state_dir / "optimizer.pt")
        torch.save(scheduler.state_dict(), state_dir / "scheduler.pt")
        torch.save(_rng_state(), state_dir / "rng_state.pt")
        (state_dir / STATE_FILE).write_text(json.dumps({
            "run": run_id, "cycle": cycle, "global_step": global_step, "cursor": cursor,
            "problems_fingerprint": fingerprint, "num_problems": len(problems),
            "ref_model_dir": str(ref_dir), "method": "fst_distill",
            "teacher_context_id": teacher_id, "teacher_context_hash": context_hash(teacher_context),
            "student_context_hash": student_hash, "config": cfg.to_dict(),
        }, indent=2, sort_keys=True) + "\n")
        _write_table(rollout_rows, tmp / "rollouts.parquet", ROLLOUT_COLUMNS)
        _write_table(metrics_rows, tmp / "metrics.parquet", None)
        del generator, teacher, model
    return CycleResult(out_dir=Path(out_dir), global_step=global_step, metrics=metrics_rows)
