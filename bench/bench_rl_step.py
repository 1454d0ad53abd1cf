"""Benchmark: one slow-loop RL step on SmolLM2-135M-Instruct, and the rollout path's tokens/s.

Part 1 runs `run_cycle` (the real code path) for a few steps on `math` with K=2 contexts and
reports each step's time split into generation (TRL's `_generate`: chat template, tokenise,
`model.generate`, decode), scoring (`task.reward` + `task.feedback` via TRL's reward call) and
training (reference-model forward, policy forward/backward, optimiser step), as the workflow's
steps run: under bf16 autocast where `slow.bf16: auto` (config.yaml) resolves to on.

Part 2 compares generation throughput on one step's batch (P*G prompts): our rollout path
(`PoolGRPOTrainer._generate`, as called inside the step) against a bare `model.generate` on the
same pre-tokenised, left-padded batch with the same sampling settings and seed. Runs alternate
(ours, bare, bare, ours, ...) so load from other processes hits both alike; medians are reported.
Both sides run as the step generates: the fp32 model, under bf16 autocast where `slow.bf16`
resolves to on (`--autocast/--no-autocast` overrides; the report says which). Our side drops
rows that stopped (`generate_compacting`), so generate()'s multinomial draws for fewer rows after
the first stop: the two sides sample different completions from the same distribution, and each
side's tokens/s counts its own completion tokens (`same_token_counts` says whether they match).

    python bench/bench_rl_step.py [--steps 4] [--reps 3] [--no-autocast] [--out results/bench/rl_step.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import environment  # this directory: where the benchmark ran, and atomic report writes

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# On a shared CPU, OpenMP threads that spin-wait for each other are starved by other processes
# (measured here: 2 spinning threads were 12x slower than 1 thread); passive waiting avoids it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from fastslow.model.convert import SMOLLM2_SPEC, load_model, load_tokenizer, prepare_base_model  # noqa: E402
from fastslow.model.generation import trace_opener  # noqa: E402
from fastslow.slow import SlowConfig, expand_rows, run_cycle  # noqa: E402
from fastslow.slow.trainer import TaskReward, build_trainer  # noqa: E402
from fastslow.tasks import get_task  # noqa: E402

MODEL_DIR = Path("results/models") / SMOLLM2_SPEC
CONTEXTS = [
    ("seed", "You are a careful math assistant. Solve the problem, then give the final number "
             "inside <answer></answer> tags."),
    ("alt", "Think step by step, briefly. End with <answer>NUMBER</answer>."),
]


def bare_generate(model: Any, tokenizer: Any, conversations: list, cfg: SlowConfig,
                  eos_ids: list[int], seed: int) -> int:
    """Pre-tokenised, left-padded batch straight into `model.generate`; completion tokens."""
    ids = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]
    batch = tokenizer.pad({"input_ids": ids}, return_tensors="pt", padding_side="left")
    torch.manual_seed(seed)
    with torch.no_grad():  # generate()'s own mode (TRL's too): autocast caches its weight casts
        out = model.generate(**batch, do_sample=True, temperature=cfg.temperature, top_k=0,
                             top_p=1.0, max_new_tokens=cfg.max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=eos_ids)
    new = out[:, batch["input_ids"].shape[1]:]
    is_eos = torch.isin(new, torch.tensor(eos_ids))
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, new.shape[1])
    return int(first.sum())


def ours_generate(trainer: Any, conversations: list, seed: int) -> int:
    trainer.model.train()  # as inside an RL step
    torch.manual_seed(seed)
    _, completion_ids, *_ = trainer._generate(conversations)
    return sum(len(c) for c in completion_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="RL steps in part 1 (first is warm-up)")
    parser.add_argument("--reps", type=environment.positive, default=3, help="alternating generation runs per side")
    parser.add_argument("--problems", type=environment.positive, default=4, help="P")
    parser.add_argument("--generations", type=environment.at_least(2), default=4, help="G")
    parser.add_argument("--max-new-tokens", type=environment.positive, default=64)
    parser.add_argument("--threads", type=environment.positive, default=1, help="torch threads (1 on a busy CPU)")
    parser.add_argument("--autocast", action=argparse.BooleanOptionalAction, default=None,
                        help="part 2 under bf16 autocast (default: as the step, slow.bf16 'auto')")
    parser.add_argument("--out", type=Path, default=Path("results/bench/rl_step.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not (MODEL_DIR / "config.json").exists():
        prepare_base_model(SMOLLM2_SPEC, MODEL_DIR)

    task = get_task("math")
    problems = task.problems("train", 32, seed=0)
    cfg = SlowConfig(lr=1e-5, warmup_steps=0, num_generations=args.generations,
                     problems_per_step=args.problems, steps_per_cycle=max(args.steps, 1),
                     max_new_tokens=args.max_new_tokens, micro_batch_size=4,
                     bf16="auto")  # as config.yaml's slow.bf16 (SlowConfig's own default is off)

    # Part 1: the real cycle, per-step split (--steps 0 keeps the previous report's part 1).
    keys = ("step_seconds", "generation_seconds", "scoring_seconds", "training_seconds",
            "completion_tokens", "generated_tokens_per_s", "reward_mean")
    if args.steps > 0:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_cycle(MODEL_DIR, None, CONTEXTS, task, problems, cfg,
                               Path(tmp) / "cycle", "bench", 0)
        steps = [{k: m[k] for k in keys} for m in result.metrics]
        step_load = os.getloadavg()[0]
    else:
        previous = json.loads(args.out.read_text())
        steps, step_load = previous["steps"], previous.get("step_load_avg_1m")
    timed = steps[1:] or steps  # step 0 pays one-off costs (allocator, kernels)
    # the median step, whole: its parts add up to its total (medians taken part by part need not)
    split = sorted(timed, key=lambda s: s["step_seconds"])[(len(timed) - 1) // 2]

    # Part 2: rollout path vs bare generate, same batch, same seed.
    tokenizer = load_tokenizer(MODEL_DIR)
    model = load_model(MODEL_DIR, dtype="float32")
    # the reward as the cycle builds it (slow/loop.py): reads the completion's tokens, trace included
    reward = TaskReward(task, {p.id: p for p in problems},
                        opener=trace_opener(tokenizer, cfg.chat_template_kwargs), tokenizer=tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(model, tokenizer, cfg.__class__(**{**cfg.to_dict(), "beta": 0.0}),
                                len(CONTEXTS), reward, tmp)
        conversations = [r["prompt"] for r in expand_rows(problems[: args.problems], CONTEXTS,
                                                          args.generations)]
        autocast = cfg.bf16 if args.autocast is None else args.autocast
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):  # warm-up both paths once
            ours_generate(trainer, conversations[:2], 0)
            bare_generate(model, tokenizer, conversations[:2], cfg, trainer.eos_token_ids, 0)
        runs: dict[str, list[tuple[int, float]]] = {"ours": [], "bare": []}
        for rep in range(args.reps):
            for side in ("ours", "bare") if rep % 2 == 0 else ("bare", "ours"):
                start = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    if side == "ours":
                        tokens = ours_generate(trainer, conversations, 1000 + rep)
                    else:
                        model.eval()
                        tokens = bare_generate(model, tokenizer, conversations, cfg,
                                               trainer.eos_token_ids, 1000 + rep)
                runs[side].append((tokens, time.perf_counter() - start))
    rate = {side: statistics.median(t / s for t, s in v) for side, v in runs.items()}
    same_tokens = [a[0] == b[0] for a, b in zip(runs["ours"], runs["bare"], strict=True)]

    report = {
        "model": SMOLLM2_SPEC, "task": "math", "K": len(CONTEXTS), "P": args.problems,
        "G": args.generations, "max_new_tokens": args.max_new_tokens, "autocast_bf16": autocast,
        "torch_threads": torch.get_num_threads(),
        "step_load_avg_1m": step_load,
        "bf16": cfg.bf16, "steps": steps, "median_step_split": split,
        "generation": {"ours_tokens_per_s": rate["ours"], "bare_tokens_per_s": rate["bare"],
                       "ratio": rate["ours"] / rate["bare"], "runs": runs,
                       "same_token_counts": same_tokens},
    }
    environment.write_report(args.out, report)
    s = split
    print(f"RL step (the median of {len(timed)}{', bf16 autocast' if cfg.bf16 else ''}, P={args.problems} G={args.generations} K=2, "
          f"{args.max_new_tokens} new tokens, SmolLM2-135M, CPU):")
    print(f"  total {s['step_seconds']:.1f}s = generation {s['generation_seconds']:.1f}s "
          f"+ scoring {s['scoring_seconds']:.3f}s + training {s['training_seconds']:.1f}s; "
          f"{s['completion_tokens']:.0f} tokens at {s['generated_tokens_per_s']:.1f} tok/s")
    print(f"generation tokens/s{' (bf16 autocast)' if autocast else ''}: ours {rate['ours']:.1f}, "
          f"bare generate {rate['bare']:.1f}, "
          f"ratio {rate['ours'] / rate['bare']:.2f} (same tokens: {same_tokens})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
