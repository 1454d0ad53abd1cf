"""Benchmark: what one generate call costs as a function of its sequence count.

The fast round's cost model: how many sequences share a call, and how many calls a round makes.
This times `HFGenerator.generate` (the fast round's and evaluation's path) on the fast round's
own prompts — the seed context with math train problems — for several batch sizes, at the CPU
default's sampling (64 new tokens, temperature 1, bf16 weights), and fits seconds = a + b x n
(scipy's linregress): `a` is what a call costs whatever it holds, `b` what each sequence adds.

`--copies G` makes each prompt G of a call's sequences, as an RL step's call holds its P problems
G times each: `--task hover_hard --copies 4 --sizes 8 24` is one RL-only step's call of the CPU
default (P = 2, G = 4) against the three steps of a cycle sampled in one call (TRL's
`steps_per_generation`, which the RL-only baseline does not do). `--dtype float32` samples as a
machine without native bf16 does.

    python bench/bench_call_cost.py [--sizes 1 4 8 12 16 24 32] [--reps 2] [--threads 1]
        [--task math] [--copies 1] [--dtype bfloat16|float32] [--out results/bench/call_cost.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import environment  # this directory: where the benchmark ran, and atomic report writes

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8, 12, 16, 24, 32])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--task", default="math")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--copies", type=int, default=1,
                        help="sequences a prompt: each size is sizes/copies distinct prompts, each copies times")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--out", type=Path, default=Path("results/bench/call_cost.json"))
    args = parser.parse_args()
    for name in ("reps", "threads", "max_new_tokens", "copies"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: must be an integer >= 1, got {getattr(args, name)}")
    bad = [n for n in args.sizes if n < 1 or n % args.copies]
    if bad:
        parser.error(f"--sizes {bad[0]}: every size must be a positive multiple of --copies {args.copies}")
    if len(set(args.sizes)) < 2:
        parser.error(f"--sizes {' '.join(map(str, args.sizes))}: need at least two different sizes to fit a line")

    import torch
    from scipy.stats import linregress

    from fastslow.config import load_config
    from fastslow.model.convert import SMOLLM2_SPEC, prepare_base_model
    from fastslow.model.generation import SamplingParams, make_generator
    from fastslow.tasks.base import build_messages
    from fastslow.tasks.data import load_problems

    torch.set_num_threads(args.threads)
    model = Path("results/models") / SMOLLM2_SPEC
    if not (model / "config.json").exists():
        prepare_base_model(SMOLLM2_SPEC, model)
    train = Path("results/data") / args.task / "train.parquet"
    if not train.exists():
        raise SystemExit(f"{train} is missing: run `snakemake {train}` first")
    problems = load_problems(train)
    prompts = max(args.sizes) // args.copies
    if len(problems) < prompts:
        raise SystemExit(f"{train} has {len(problems)} problems, fewer than the {prompts} prompts of --sizes' "
                         f"largest call ({max(args.sizes)} sequences, {args.copies} a prompt)")
    context = load_config("config/config.yaml")["seed_context"]
    gen = make_generator("hf", model, dtype=args.dtype, batch_size=max(args.sizes))
    gen.generate([build_messages(context, problems[0])], SamplingParams(4, 1.0, 1.0, 0))  # warm-up

    rows = []
    for rep in range(args.reps):
        for n in args.sizes:
            k = n // args.copies  # distinct prompts, each copies times (adjacent, as TRL's batches hold them)
            convs = [build_messages(context, p) for p in problems[rep * k % len(problems):][:k]]
            convs += [build_messages(context, p) for p in problems[:k - len(convs)]]
            convs = [c for c in convs for _ in range(args.copies)]
            start = time.perf_counter()
            out = gen.generate(convs, SamplingParams(args.max_new_tokens, 1.0, 1.0, 1000 * rep + n))
            seconds = time.perf_counter() - start
            tokens = sum(g.completion_tokens for g in out)
            rows.append({"rep": rep, "sequences": n, "seconds": seconds, "completion_tokens": tokens,
                         "decoding_steps": max(g.completion_tokens for g in out)})
            print(f"rep {rep}: {n:3d} sequences {seconds:6.2f} s ({tokens} tokens)", flush=True)

    medians = {n: statistics.median(r["seconds"] for r in rows if r["sequences"] == n) for n in args.sizes}
    fit = linregress(list(medians), list(medians.values()))
    summary = {"per_call_s": fit.intercept, "per_sequence_s": fit.slope, "r2": fit.rvalue ** 2,
               "median_seconds": {str(n): s for n, s in medians.items()}}
    print(f"seconds ≈ {fit.intercept:.2f} + {fit.slope:.3f} × sequences (r² {fit.rvalue ** 2:.3f})")
    environment.write_report(args.out, {
        "task": args.task, "threads": args.threads, "max_new_tokens": args.max_new_tokens, "dtype": args.dtype,
        "copies": args.copies, "rows": rows, "summary": summary})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
