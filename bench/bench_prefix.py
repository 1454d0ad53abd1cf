"""Benchmark: what prefilling the prompts' shared leading tokens once saves in the fast round.

A fast round's generate calls hold one context's prompts: the seeds' validation call (the seed
context on `--seed-prompts` problems) and each child's minibatch call (its context on
`--child-prompts` problems). Their leading tokens (chat header, context, the task's opening
lines) are the same in every prompt of a call. `prefill_rows_alone` runs them once
(`prefix_tree`); this times both calls with that sharing on and off, alternated in one process,
`--reps` times, on the fast round's path (`HFGenerator`, bf16 weights, 64 new tokens,
temperature 1). The child's context is what the offline proposer writes on hover: the seed,
the format rule and three condensed worked examples (`FeedbackEditor.condensed_demo`).
The prefill (`shared_prefill`) is timed on its own: it is the part sharing changes, and it does
the same work every repetition, while the decoding after it follows the sampled lengths (the
summation order differs, so bf16 may flip a sampled token and with it a completion's length).
Tokens through the model during prefill are counted.

    python bench/bench_prefix.py [--task hover_hard] [--reps 2] [--threads 1]
        [--out results/bench/prefix.json]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from pathlib import Path
from typing import Any

import environment  # this directory: where the benchmark ran, and atomic report writes

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="hover_hard")
    parser.add_argument("--reps", type=environment.positive, default=2)
    parser.add_argument("--threads", type=environment.positive, default=1)
    parser.add_argument("--seed-prompts", type=environment.positive, default=15)
    parser.add_argument("--child-prompts", type=environment.positive, default=3)
    parser.add_argument("--max-new-tokens", type=environment.positive, default=64)
    parser.add_argument("--out", type=Path, default=Path("results/bench/prefix.json"))
    args = parser.parse_args()

    import torch

    import fastslow.model.generation as generation
    from fastslow.config import load_config
    from fastslow.fast.proposers import FORMAT_RULE_PREFIX, ContextDoc, FeedbackEditor
    from fastslow.model.convert import SMOLLM2_SPEC, prepare_base_model
    from fastslow.tasks import get_task
    from fastslow.tasks.base import build_messages
    from fastslow.tasks.data import load_problems

    try:
        task = get_task(args.task)
    except (KeyError, ValueError) as exc:
        parser.error(f"--task {args.task!r}: {exc}")
    torch.set_num_threads(args.threads)
    train = Path("results/data") / args.task / "train.parquet"
    if not train.exists():
        raise SystemExit(f"{train} is missing: run `snakemake {train}` first")
    problems = load_problems(train)
    needed = args.seed_prompts + args.child_prompts + 3
    if len(problems) < needed:
        raise SystemExit(f"{train} has {len(problems)} problems, fewer than the {needed} this needs")
    model = Path("results/models") / SMOLLM2_SPEC
    if not (model / "config.json").exists():
        prepare_base_model(SMOLLM2_SPEC, model)
    seed = load_config("config/config.yaml")["seed_context"]
    editor = FeedbackEditor({p.id: p for p in problems}, working_labels=getattr(task, "demo_working", ()))
    demos = [d for p in problems[-3:] if (d := editor.condensed_demo(p, task.feedback(p, ""))) is not None]
    child = ContextDoc(seed, [f"{FORMAT_RULE_PREFIX}."], demos).render()
    calls = {
        "seeds": [build_messages(seed, p) for p in problems[:args.seed_prompts]],
        "child": [build_messages(child, p)
                  for p in problems[args.seed_prompts:args.seed_prompts + args.child_prompts]],
    }
    gen = generation.make_generator("hf", model, dtype="bfloat16", batch_size=16)
    gen.generate(calls["child"][:1], generation.SamplingParams(4, 1.0, 1.0, 0))  # warm-up
    original = generation.prefill_rows_alone
    prefill = generation.shared_prefill
    prefilled, prefill_s = [0], [0.0]

    def timed_prefill(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return prefill(*a, **k)
        finally:
            prefill_s[0] += time.perf_counter() - start

    generation.shared_prefill = timed_prefill

    def count(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        if kwargs["input_ids"].shape[1] > 1:  # prefill forwards (decoding steps run one token)
            prefilled[0] += kwargs["input_ids"].numel()

    hook = gen.model.register_forward_pre_hook(count, with_kwargs=True)
    rows: list[dict[str, Any]] = []
    completions: dict[tuple[str, bool, int], list[list[int]]] = {}
    try:
        for rep in range(args.reps):
            for name, convs in calls.items():
                for share in (True, False) if rep % 2 == 0 else (False, True):
                    generation.prefill_rows_alone = original if share else functools.partial(
                        original, share_prefixes=False)
                    prefilled[0], prefill_s[0] = 0, 0.0
                    start = time.perf_counter()
                    out = gen.generate(convs, generation.SamplingParams(args.max_new_tokens, 1.0, 1.0, 7 + rep))
                    seconds = time.perf_counter() - start
                    completions[name, share, rep] = [g.completion_ids for g in out]
                    rows.append({"rep": rep, "call": name, "share_prefixes": share, "seconds": seconds,
                                 "prefill_seconds": prefill_s[0],
                                 "prompts": len(convs), "prompt_tokens": sum(g.prompt_tokens for g in out),
                                 "prefilled_tokens": prefilled[0],
                                 "completion_tokens": sum(g.completion_tokens for g in out)})
                    print(f"rep {rep} {name:5s} share={share!s:5s} {seconds:6.2f} s (prefill {prefill_s[0]:5.2f} s), "
                          f"prefilled {prefilled[0]} of {rows[-1]['prompt_tokens']} prompt tokens", flush=True)
    finally:
        hook.remove()
        generation.prefill_rows_alone, generation.shared_prefill = original, prefill

    summary = {}
    for name in calls:
        def median(key: str, share: bool, name: str = name) -> float:
            return statistics.median(r[key] for r in rows if r["call"] == name and r["share_prefixes"] == share)

        summary[name] = {
            "median_prefill_s_shared": median("prefill_seconds", True),
            "median_prefill_s_alone": median("prefill_seconds", False),
            "prefill_saving": 1 - median("prefill_seconds", True) / median("prefill_seconds", False),
            "median_s_shared": median("seconds", True), "median_s_alone": median("seconds", False),
            "same_completions": all(completions[name, True, r] == completions[name, False, r] for r in range(args.reps)),
        }
        x = summary[name]
        print(f"{name}: prefill {x['median_prefill_s_alone']:.2f} -> {x['median_prefill_s_shared']:.2f} s "
              f"({100 * x['prefill_saving']:.1f}% less); whole call {x['median_s_alone']:.2f} -> "
              f"{x['median_s_shared']:.2f} s; same completions: {x['same_completions']}")
    environment.write_report(args.out, {
        "task": args.task, "threads": args.threads, "max_new_tokens": args.max_new_tokens, "dtype": "bfloat16",
        "child_context_chars": len(child), "rows": rows, "summary": summary})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
