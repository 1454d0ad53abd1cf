"""Probe: what skipping the KL reference forward saves while the weights are still the reference's.

A run's first cycle at the CPU default's slow settings (T = 3, 2 warm-up steps: lr 0 at step 0, so
steps 0 and 1 train at θ0) on codeio's shorter programs (`max_prompt_chars` 2500, as config.yaml),
SmolLM2-135M-Instruct in fp32 on one thread: run as the loop runs it (the reference forward skipped
at steps 0 and 1, `fastslow.slow.loop.starts_at_reference`) and with the forward forced
(`starts_at_reference` patched to False), alternating skip, forward, forward, skip. The same seed
samples the same rollouts either way, so the steps' `training_seconds` differ by the forward alone.

    python bench/ref_skip_probe.py [--out results/bench/ref_skip.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

import environment  # this directory: where the benchmark ran, and atomic report writes

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the other benchmarks (a shared CPU)

import polars as pl  # noqa: E402
import torch  # noqa: E402

from fastslow.model.convert import SMOLLM2_SPEC, prepare_base_model  # noqa: E402
from fastslow.slow import SlowConfig, loop, run_cycle  # noqa: E402
from fastslow.tasks import get_task  # noqa: E402

MODEL_DIR = Path("results/models") / SMOLLM2_SPEC
CONTEXTS = [("seed", "You are a helpful assistant. Think step by step, then give the final answer in the "
                     "requested format."),
            ("alt", "Predict the output carefully. Give the final answer in the requested format.")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/bench/ref_skip.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not (MODEL_DIR / "config.json").exists():
        prepare_base_model(SMOLLM2_SPEC, MODEL_DIR)
    task = get_task("codeio")
    problems = [p for p in task.problems("train", 16, seed=0) if len(p.prompt) <= 2500][:8]
    cfg = SlowConfig(lr=1e-5, warmup_steps=2, beta=0.001, num_generations=4, problems_per_step=2,
                     steps_per_cycle=3, max_new_tokens=64, micro_batch_size=2, seed=0, bf16=False)
    real = loop.starts_at_reference
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep, mode in enumerate(["skip", "forward", "forward", "skip"]):
            loop.starts_at_reference = real if mode == "skip" else (lambda *_: False)
            result = run_cycle(MODEL_DIR, None, CONTEXTS, task, problems, cfg, Path(tmp) / str(rep), "bench/ref", 0,
                               progress=False)
            metrics = pl.read_parquet(result.metrics_path)
            runs.append({"mode": mode, **{k: metrics[k].to_list() for k in (
                "training_seconds", "step_seconds", "generation_seconds", "kl_to_base", "lr", "completion_tokens")},
                "prompt_tokens_mean": float(pl.read_parquet(result.rollouts_path)["prompt_tokens"].mean())})
            print(runs[-1], flush=True)
            shutil.rmtree(Path(tmp) / str(rep))
    loop.starts_at_reference = real
    by = {m: [r["training_seconds"] for r in runs if r["mode"] == m] for m in ("skip", "forward")}
    saved = [min(f[t] for f in by["forward"]) - min(s[t] for s in by["skip"]) for t in range(2)]
    environment.write_report(args.out, {"runs": runs, "saved_seconds_steps_0_1_fastest_each": saved})
    print(f"saved at steps 0 and 1 (each mode's fastest): {saved[0]:.1f} s, {saved[1]:.1f} s -> {args.out}")


if __name__ == "__main__":
    main()
