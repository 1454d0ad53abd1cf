"""Benchmark: what decoding costs on this CPU, and what the three decoding fixes save.

Part 1, one decoding step (SmolLM2-135M, one query token a row after `--context` prompt tokens,
all rows copies of one prompt, so the batch has no padding): transformers then drops the
attention mask and SDPA decodes grouped-query attention through `enable_gqa`; with one
masked-out padding column (`masked_decoding`) it takes the masked path; with room in the
cache's buffers (`KVLayer.spare`) a step writes its keys and values in place instead of
concatenating the whole cache. Median of 10 steps, for 1, 2, 4 and 8 rows, in the bf16 model
(the fast round, evaluation) and in the fp32 model under bf16 autocast (the RL rollouts).

Part 2, whole `HFGenerator.generate` calls on real prompts (the fast round's path: bf16 model,
64 new tokens, temperature 1): none of the fixes, then `pad_column`, `compact` (decode only the
rows that have not stopped) and room added in turn, the four settings alternated in one
process, `--reps` times. Each setting gives the same tokens every repetition; `pad_column`
changes the attention's summation order, hence the sampled tokens, so compare `compact` and
room at equal `pad_column` (they keep the tokens).

    python bench/bench_decode.py [--task hover_hard] [--prompts 15] [--copies 1] [--reps 2]
        -> results/bench/decode.json
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
from fastslow.model.generation import HFGenerator, SamplingParams, _kv_layer, plain_dynamic_cache  # noqa: E402

MODEL_DIR = Path("results/models") / SMOLLM2_SPEC
CONTEXT = "You are a helpful assistant. Think step by step, then give the final answer in the requested format."


def decode_steps(model: Any, rows: int, context: int, column: bool, autocast: bool, room: bool = False) -> float:
    """Median milliseconds of one decoding step of `rows` copies of a random prompt; `room`:
    the cache's layers write each step into room at the end of their buffers (`KVLayer.spare`),
    else they concatenate the whole cache every step (`DynamicLayer`'s way)."""
    ids = torch.randint(0, 1000, (1, context))
    _kv_layer().spare = 64 if room else 0
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        cache = plain_dynamic_cache(model)
        model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(rows)
        # (under autocast the cache holds bf16 keys and values already: KVLayer.round_to_autocast)
        for layer in cache.layers:
            keys, values = layer.keys, layer.values
            if column:  # the masked-out padding column's key and value
                zero = torch.zeros_like(keys[:, :, :1])
                keys, values = torch.cat([zero, keys], 2), torch.cat([zero, values], 2)
            layer.keys, layer.values = keys, values
        token = torch.randint(0, 1000, (rows, 1))
        times = []
        for step in range(10):
            mask = torch.ones(rows, context + 1 + step, dtype=torch.long)
            if column:
                mask = torch.cat([torch.zeros(rows, 1, dtype=torch.long), mask], 1)
            start = time.perf_counter()
            model(input_ids=token, attention_mask=mask, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", type=environment.task_name, default="hover_hard")
    parser.add_argument("--prompts", type=environment.positive, default=15, help="problems (the fast round's seed call: 15)")
    parser.add_argument("--copies", type=environment.positive, default=1, help="copies of each problem (RL: G/K)")
    parser.add_argument("--reps", type=environment.positive, default=2)
    parser.add_argument("--context", type=environment.positive, default=750, help="prompt tokens in part 1")
    parser.add_argument("--threads", type=environment.positive, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/bench/decode.json"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not (MODEL_DIR / "config.json").exists():
        prepare_base_model(SMOLLM2_SPEC, MODEL_DIR)
    train = Path("results/data") / args.task / "train.parquet"
    if not train.exists():
        raise SystemExit(f"{train} is missing: run `snakemake {train}` first")

    steps: list[dict[str, Any]] = []
    for dtype, autocast in (("bfloat16", False), ("float32", True)):
        model = load_model(MODEL_DIR, dtype=dtype).eval()
        for rows in (1, 2, 4, 8):
            row = {"dtype": dtype, "autocast": autocast, "rows": rows, "context": args.context,
                   "no_mask_ms": decode_steps(model, rows, args.context, False, autocast),
                   "pad_column_ms": decode_steps(model, rows, args.context, True, autocast),
                   "room_ms": decode_steps(model, rows, args.context, True, autocast, room=True)}
            steps.append(row)
            print(f"decoding step, {dtype}{' + autocast' if autocast else ''}, {rows} rows: "
                  f"no mask {row['no_mask_ms']:.1f} ms, pad column {row['pad_column_ms']:.1f} ms, "
                  f"pad column + room {row['room_ms']:.1f} ms", flush=True)
        del model

    import polars as pl

    prompts = pl.read_parquet(train).head(args.prompts)["prompt"].to_list()
    conversations = [[{"role": "system", "content": CONTEXT}, {"role": "user", "content": p}]
                     for p in prompts for _ in range(args.copies)]
    generator = HFGenerator(load_model(MODEL_DIR, dtype="bfloat16"), load_tokenizer(MODEL_DIR), batch_size=16)
    params = SamplingParams(max_new_tokens=64, temperature=1.0, seed=3)
    generator.generate(conversations[:2], params)  # warm-up
    # (pad_column, compact, room): each fix added in turn; only pad_column changes the tokens
    settings = [(False, False, False), (True, False, False), (True, True, False), (True, True, True)]
    calls: dict[str, list[dict[str, Any]]] = {}
    for rep in range(args.reps):
        for pad_column, compact, room in settings if rep % 2 == 0 else settings[::-1]:
            generator.pad_column, generator.compact = pad_column, compact
            _kv_layer().spare = 64 if room else 0
            start = time.perf_counter()
            out = generator.generate(conversations, params)
            seconds = time.perf_counter() - start
            key = f"pad_column={pad_column} compact={compact} room={room}"
            calls.setdefault(key, []).append({"seconds": seconds, "lengths": [g.completion_tokens for g in out]})
            print(f"generate, {key}: {seconds:.1f} s, completion lengths {sorted(g.completion_tokens for g in out)}",
                  flush=True)
    summary = {key: statistics.mean(c["seconds"] for c in v) for key, v in calls.items()}
    for key, value in summary.items():
        print(f"mean {key}: {value:.1f} s")
    report = {"model": SMOLLM2_SPEC, "task": args.task, "prompts": args.prompts, "copies": args.copies,
              "threads": torch.get_num_threads(),
              "decoding_steps": steps, "generate_calls": calls, "generate_mean_seconds": summary}
    environment.write_report(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
