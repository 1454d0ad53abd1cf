"""Benchmark: an RL step with one context (RL-only) against the same step with K distinct contexts
(FST's slow step with a real pool).

`bench_fst_step.py` cannot show the second: the CPU default's 135M model earns no reward, so no
GEPA child beats the seed and FST's pool keeps only the seed context; its slow steps are then
RL-only's exactly. With K distinct contexts a step holds P x K distinct prompts of G/K copies
instead of P prompts of G copies, so its generation prefills and training forwards cover K times
the prompt tokens. This runs the slow loop alone (`fastslow.slow.loop.run_cycle`, what a `cycle`
job runs after its fast round) for T steps on the CPU default's settings, once with the seed
context and once with K contexts (the seed context, then variants of it with a GEPA-style rule
appended), each in a fresh process, and reports seconds per step split into generation and
training, and each run's peak resident memory.

    python bench/bench_pool_step.py [--task hover_hard] [--k 2] [--steps 3] [--seed 0]
        -> results/bench/pool_step.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import environment  # this directory: where the benchmark ran, and atomic report writes
from bench_fst_step import run_child  # this directory: its RESULT-line protocol

ROOT = Path(__file__).resolve().parents[1]
RULES = ["Read every document before you decide, and quote the sentence your answer rests on.",
         "Check each step against the question before you write the final answer.",
         "State the answer in the exact format the task asks for, on the last line."]


def contexts(seed_context: str, k: int) -> list[tuple[str, str]]:
    """The seed context, then k - 1 distinct variants of it (a rule appended, as GEPA's edits do)."""
    if not 1 <= k <= len(RULES) + 1:
        raise SystemExit(f"--k {k}: choose 1 to {len(RULES) + 1}")
    return [("seed", seed_context)] + [(f"v{i}", f"{seed_context}\n\nRule: {RULES[i]}") for i in range(k - 1)]


def child(task_name: str, k: int, steps: int, seed: int, threads: int) -> dict[str, Any]:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from fastslow.config import load_config, make_task
    from fastslow.model.convert import SMOLLM2_SPEC
    from fastslow.slow.config import SlowConfig
    from fastslow.slow.loop import run_cycle
    from fastslow.tasks.data import load_problems

    torch.set_num_threads(threads)
    config = load_config(ROOT / "config" / "config.yaml")
    model = ROOT / "results" / "models" / SMOLLM2_SPEC
    train_file = ROOT / "results" / "data" / task_name / "train.parquet"
    if not train_file.exists() or not (model / "config.json").exists():
        raise SystemExit(f"run `snakemake {train_file.relative_to(ROOT)}` first (it also prepares the model)")
    cfg = SlowConfig.from_dict({**config["slow"], "steps_per_cycle": steps, "seed": seed})
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp:
        result = run_cycle(model, None, contexts(config["seed_context"], k), make_task(config, task_name),
                           load_problems(train_file), cfg, Path(tmp) / "cycle", "bench", 0, progress=False)
    metrics = result.metrics[1:] or result.metrics  # step 0 pays one-off costs
    mean = {key: sum(m[key] for m in metrics) / len(metrics)
            for key in ("step_seconds", "generation_seconds", "training_seconds", "mean_completion_tokens")}
    return {"k": k, "steps": len(result.metrics), "timed_steps": len(metrics), **mean,
            "peak_rss_mb": environment.peak_rss_mb()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", type=environment.task_name, default="hover_hard")
    ap.add_argument("--k", type=environment.positive, default=2, help="distinct contexts of the pool run")
    ap.add_argument("--steps", type=environment.at_least(2), default=3, help="RL steps per run (the first is not timed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=environment.positive, default=1)
    ap.add_argument("--out", type=Path, default=Path("results/bench/pool_step.json"))
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print("RESULT " + json.dumps(child(args.task, args.child, args.steps, args.seed, args.threads)), flush=True)
        return
    runs = []
    for k in (1, args.k):
        print(f"K = {k} ...", file=sys.stderr, flush=True)
        r = run_child([sys.executable, __file__, "--child", str(k), "--task", args.task, "--steps",
                       str(args.steps), "--seed", str(args.seed), "--threads", str(args.threads)], f"K = {k}")
        runs.append(r)
        print(f"  K = {k}: {r['step_seconds']:.1f} s/step (generation {r['generation_seconds']:.1f}, training "
              f"{r['training_seconds']:.1f}), {r['mean_completion_tokens']:.1f} tokens, peak RSS "
              f"{r['peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
    report = {"task": args.task, "seed": args.seed, "threads": args.threads, "runs": runs,
              "ratio": runs[1]["step_seconds"] / runs[0]["step_seconds"]}
    environment.write_report(args.out, report)
    print(f"K = {args.k} against K = 1: {report['ratio']:.2f}x per step; wrote {args.out}")


if __name__ == "__main__":
    main()
