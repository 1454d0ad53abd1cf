"""Benchmark: what one generate call costs as a function of its sequence count.

The fast round's cost model: how many sequences share a call, and how many calls a round makes.
This times `HFGenerator.generate` (the fast round's and evaluation's path) on the fast round's
own prompts — the seed context with math train problems — for several batch sizes, at the CPU
default's sampling (64 new tokens, temperature 1, bf16 weights), and fits seconds = a + b x n
(scipy's linregress): `a` is what a call costs whatever it holds, `b` what each sequence adds.

    python bench/bench_call_cost.py [--sizes 1 4 8 12 16 24 32] [--reps 2] [--threads 1]
        [--out results/bench/call_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8, 12, 16, 24, 32])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--task", default="math")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("results/bench/call_cost.json"))
    args = parser.parse_args()

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
    if len(problems) < max(args.sizes):
        raise SystemExit(f"{train} has {len(problems)} problems, fewer than --sizes' largest {max(args.sizes)}")
    context = load_config("config/config.yaml")["seed_context"]
    gen = make_generator("hf", model, dtype="bfloat16", batch_size=max(args.sizes))
    gen.generate([build_messages(context, problems[0])], SamplingParams(4, 1.0, 1.0, 0))  # warm-up

    rows = []
    for rep in range(args.reps):
        for n in args.sizes:
            convs = [build_messages(context, p) for p in problems[rep * n % len(problems):][:n]]
            convs += [build_messages(context, p) for p in problems[:n - len(convs)]]
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "task": args.task, "threads": args.threads, "max_new_tokens": args.max_new_tokens, "dtype": "bfloat16",
        "machine": platform.processor() or platform.machine(), "rows": rows, "summary": summary}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
