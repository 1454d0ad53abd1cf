"""Benchmark: `HFGenerator` against a bare `model.generate` call on SmolLM2-135M-Instruct.

Same 8 prompts, at most 64 new tokens, sampling at temperature 1 with the same seed; ours also
renders the chat template, tokenises, decodes, and records the sampled tokens' log-probabilities.
The two sides draw from the same distribution through different samplers (HFGenerator's
inverse-CDF draw, generate()'s multinomial), so their completions differ: each side's tokens/s
counts its own completion tokens (the prompts ask for long paragraphs, so most rows run to the
limit; the report lists each repetition's counts). Runs alternate in ABBA order (ours, bare, bare,
ours, ...) so that load drifting on a shared machine hits both sides alike; medians are reported.

    python bench/bench_generate.py [--reps 4] [--threads 1] [--out results/bench/generate.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import environment  # this directory: where the benchmark ran, and atomic report writes

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from fastslow.model.convert import SMOLLM2_SPEC, load_model, load_tokenizer, prepare_base_model  # noqa: E402
from fastslow.model.generation import (  # noqa: E402
    HFGenerator,
    SamplingParams,
    derive_seed,
    encode_prompts,
)

MODEL_DIR = Path("results/models") / SMOLLM2_SPEC
TOPICS = ["a lighthouse keeper", "the water cycle", "a chess opening", "prime numbers",
          "a rainy market day", "how bridges carry load", "an old violin", "photosynthesis"]
PROMPTS = [[{"role": "user", "content": f"Write a long, detailed paragraph about {t}."}]
           for t in TOPICS]


def bare_generate(model: Any, tokenizer: Any, params: SamplingParams) -> int:
    """The baseline: pre-tokenised, left-padded batch straight into `model.generate`."""
    ids = encode_prompts(tokenizer, PROMPTS)
    batch = tokenizer.pad({"input_ids": ids}, return_tensors="pt")
    torch.manual_seed(derive_seed(params.seed, 0))  # the seed HFGenerator uses for batch 0
    with torch.inference_mode():
        out = model.generate(**batch, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=params.max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id)
    new = out[:, batch["input_ids"].shape[1]:]
    # completion tokens up to and including the first EOS, as HFGenerator counts them
    is_eos = new == tokenizer.eos_token_id
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, new.shape[1])
    return int(first.sum())


def ours_generate(gen: HFGenerator, params: SamplingParams) -> int:
    return sum(g.completion_tokens for g in gen.generate(PROMPTS, params))


def bench(dtype: str, reps: int, params: SamplingParams) -> dict[str, Any]:
    model = load_model(MODEL_DIR, dtype=dtype)
    tokenizer = load_tokenizer(MODEL_DIR)
    gen = HFGenerator(model, tokenizer, batch_size=len(PROMPTS))
    runs: dict[str, list[float]] = {"ours": [], "bare": []}
    tokens: dict[str, list[int]] = {"ours": [], "bare": []}
    sides = {"ours": lambda: ours_generate(gen, params),
             "bare": lambda: bare_generate(model, tokenizer, params)}
    for fn in sides.values():
        fn()  # warm-up (allocator, kernels)
    for rep in range(reps):
        # ABBA order: with load drifting over time, a fixed order would favour one side
        order = ("ours", "bare") if rep % 2 == 0 else ("bare", "ours")
        for name in order:
            fn = sides[name]
            start = time.perf_counter()
            tokens[name].append(fn())
            runs[name].append(time.perf_counter() - start)
            print(f"  {dtype} {name}: {tokens[name][-1]} tokens in {runs[name][-1]:.2f} s", flush=True)
    row: dict[str, Any] = {"dtype": dtype}
    for name in runs:
        row[f"{name}_tokens"] = tokens[name]  # each repetition's completion tokens
        row[f"{name}_seconds"] = round(statistics.median(runs[name]), 3)
        row[f"{name}_tok_per_s"] = round(statistics.median(t / s for t, s in zip(tokens[name], runs[name],
                                                                                  strict=True)), 1)
    row["ratio"] = round(row["ours_tok_per_s"] / row["bare_tok_per_s"], 3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=environment.positive, default=4)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                        choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--out", type=Path, default=Path("results/bench/generate.json"))
    # One thread by default: on a CPU shared with other jobs, two OpenMP threads spin-waiting
    # on each other made decoding ~10x slower than one thread in our measurements.
    parser.add_argument("--threads", type=environment.positive, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not (MODEL_DIR / "config.json").is_file():
        start = time.perf_counter()
        prepare_base_model(SMOLLM2_SPEC, MODEL_DIR)
        print(f"converted {SMOLLM2_SPEC} in {time.perf_counter() - start:.1f} s -> {MODEL_DIR}")
    params = SamplingParams(max_new_tokens=64, temperature=1.0, seed=0)
    rows = [bench(dtype, args.reps, params) for dtype in args.dtypes]
    result = {
        "model": SMOLLM2_SPEC, "batch": len(PROMPTS), "max_new_tokens": params.max_new_tokens,
        "reps": args.reps, "torch_threads": torch.get_num_threads(), "rows": rows,
    }
    environment.write_report(args.out, result)
    print(f"{'dtype':<9} {'ours tok/s':>10} {'bare tok/s':>10} {'ratio':>6} {'tokens':>7}")
    for r in rows:
        print(f"{r['dtype']:<9} {r['ours_tok_per_s']:>10} {r['bare_tok_per_s']:>10} "
              f"{r['ratio']:>6} {statistics.median(r['ours_tokens']):>7.0f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
