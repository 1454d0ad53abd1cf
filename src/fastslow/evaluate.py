"""Evaluation: mean@k and best@k of a (weights, context) pair on a task split.

mean@k = mean over problems of the mean reward of k samples (the paper's validation metric with
k=4); best@k = mean over problems of the best of k samples (the radars use k=8); mean@k_se =
mean@k's standard error over problems (the claims table's noise rule, `fastslow.claims`).
"""

from __future__ import annotations

import gc
import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastslow.model.generation import Generator, SamplingParams
from fastslow.tasks.base import Problem, Task, answered, build_messages

log = logging.getLogger(__name__)


def mean_at_k(rewards: np.ndarray) -> float:
    """`rewards` has shape (problems, k)."""
    return float(np.mean(rewards)) if rewards.size else float("nan")


def best_at_k(rewards: np.ndarray) -> float:
    return float(np.mean(np.max(rewards, axis=1))) if rewards.size else float("nan")


def mean_at_k_se(rewards: np.ndarray) -> float:
    """Standard error of mean@k: the standard deviation of the per-problem mean rewards (ddof 1)
    over the square root of the number of problems. Problems are the unit: a problem's k samples
    are not independent of each other. NaN for fewer than two problems."""
    n = rewards.shape[0] if rewards.ndim == 2 else 0
    return float(np.std(rewards.mean(axis=1), ddof=1) / np.sqrt(n)) if n >= 2 else float("nan")


def sample_and_score(generator: Generator, task: Task, problems: Sequence[Problem], context: str,
                     k: int, params: SamplingParams, chunk: int = 32) -> list[dict[str, Any]]:
    """k samples per problem, scored; one row per sample. Logs progress per chunk, and per batch
    inside a chunk where the generator reports its batches (`HFGenerator.on_batch`: the CPU
    default's 8 problems x 4 samples are one chunk, whose line came only once it was sampled).

    Each row carries the token ids it was sampled from and sampled (`prompt_ids`, empty when the
    backend reports none, and `completion_ids`), for a pass over the samples without encoding
    them again; `evaluate_weights` drops both before its rows are written."""
    convs = [(p, i, build_messages(context, p)) for p in problems for i in range(k)]
    rows: list[dict[str, Any]] = []
    start, tokens = time.perf_counter(), 0
    at = [0]  # the current chunk's first sample

    def batch_done(done: int, total: int) -> None:  # the chunk's last batch: the chunk's own line
        if done < total:
            so_far = at[0] + done
            left = (time.perf_counter() - start) / so_far * (len(convs) - so_far)
            log.info("eval %s: %d/%d samples, sampling ~%.0fs left", task.name, so_far, len(convs), left)

    reports = hasattr(generator, "on_batch")
    previous = getattr(generator, "on_batch", None)
    if reports:
        generator.on_batch = batch_done
    try:
        for lo in range(0, len(convs), chunk):
            at[0] = lo
            part = convs[lo:lo + chunk]
            # A distinct seed per chunk keeps samples independent across chunks yet reproducible.
            gens = generator.generate([c for _, _, c in part],
                                      SamplingParams(params.max_new_tokens, params.temperature,
                                                     params.top_p, params.seed + lo))
            for (p, i, _), g in zip(part, gens, strict=True):
                rows.append({"problem_id": p.id, "sample": i, "completion": g.text,
                             "reward": float(task.reward(p, g.text)),
                             "prompt_tokens": g.prompt_tokens, "completion_tokens": g.completion_tokens,
                             "truncated": g.finish_reason == "length",  # hit max_new_tokens before an EOS
                             "answered": answered(g.text),  # a non-empty <answer> block: wrong, not unread
                             "completion_ids": list(g.completion_ids), "prompt_ids": list(g.prompt_ids)})
                tokens += g.completion_tokens
            done = min(lo + chunk, len(convs))
            elapsed = max(time.perf_counter() - start, 1e-9)
            rate, left = tokens / elapsed, elapsed / done * (len(convs) - done)  # samples to go at the rate so far
            mean, share = np.mean([r["reward"] for r in rows]), np.mean([r["answered"] for r in rows])
            log.info("eval %s: %d/%d samples, reward %s%.3f (%.0f%% answered), %.0f tok/s%s", task.name, done,
                     len(convs), "so far " if done < len(convs) else "", mean, 100 * share, rate,
                     f", sampling ~{left:.0f}s left" if done < len(convs) else "")
    finally:
        if reports:
            generator.on_batch = previous
    return rows


#: The order of a tidy summary's keys (`tidy_summary`): the base model's table and its printout
#: read task first, then its scores, as the README lists them; keys not named here follow.
SUMMARY_ORDER = ("task", "point", "context_id", "context_hash", "mean_at_k", "mean_at_k_se", "best_at_k", "k", "problems",
                 "answered_fraction", "mean_completion_tokens", "truncated_fraction", "kl_to_base", "entropy", "run")
#: An evaluation summary's MLflow run ids (`run_ids`): in its JSON and tables, not in its log table.
RUN_IDS = ("mlflow_run_id", "cycle_run_id")


def summary_table(summaries: Sequence[dict[str, Any]]) -> str:
    """Evaluation summaries as a log's text table (`format_table`): the first one's keys, less
    its MLflow run ids."""
    return format_table(summaries, [k for k in summaries[0] if k not in RUN_IDS])


def summary_line(summary: Mapping[str, Any]) -> str:
    """An evaluation summary as one log line (a table's four lines of repeated names, with NaN for
    a KL and entropy not measured, were most of an evaluation job's console output)."""
    k = int(summary["k"])

    def num(key: str) -> float:
        value = summary.get(key)
        return float("nan") if value is None else float(value)

    line = (f"eval {summary.get('task', '?')} ({summary.get('context_id', 'seed')} context): mean@{k} "
            f"{num(f'mean@{k}'):.3f} ± {num(f'mean@{k}_se'):.3f}, best@{k} {num(f'best@{k}'):.3f} over "
            f"{summary.get('problems', '?')} problems; {100 * num('answered_fraction'):.0f}% answered, "
            f"{100 * num('truncated_fraction'):.0f}% cut at the length limit, {num('mean_completion_tokens'):.1f} "
            f"tokens on average")
    if math.isnan(num("kl_to_base")) and math.isnan(num("entropy")):
        return line + ("; no KL or entropy: no completion tokens to measure them on" if num("mean_completion_tokens") == 0
                       else "; no KL or entropy (evaluation.divergence: false)")
    return line + f"; KL to base {num('kl_to_base'):.4f}, entropy {num('entropy'):.3f}"


def run_ids(tracker: Any, pool: str | Path | None = None) -> dict[str, str | None]:
    """The MLflow runs behind an evaluation: the job's own (`mlflow_run_id`) and, for a point
    after a cycle (`pool` is that cycle's pool.json), the cycle job's that wrote those weights and
    that pool (`cycle_run_id`, from the cycle.json beside the pool). A rerun job gets a new run,
    so these say which run of each job a curves table's row, and a figure's point, came from."""
    out = {"mlflow_run_id": getattr(tracker, "run_id", None)}
    if pool is not None:
        cycle = Path(pool).with_name("cycle.json")  # fastslow.cycle.CYCLE_FILE
        out["cycle_run_id"] = json.loads(cycle.read_text()).get("mlflow_run_id") if cycle.exists() else None
    return out


def tidy_summary(summary: dict) -> dict:
    """An evaluation summary (`summarize`: `mean@4`, `mean@4_se`, `best@4`) with
    the curves tables' names for its metrics (`mean_at_k`, `mean_at_k_se`, `best_at_k`, beside
    `k`), so the base model's table and the runs' tables share their columns; keys in
    SUMMARY_ORDER (a summary read back from its JSON file has them sorted by name)."""
    k = int(summary["k"])
    names = {f"mean@{k}": "mean_at_k", f"mean@{k}_se": "mean_at_k_se", f"best@{k}": "best_at_k"}
    tidy = {names.get(key, key): value for key, value in summary.items()}
    rank = {key: i for i, key in enumerate(SUMMARY_ORDER)}
    return dict(sorted(tidy.items(), key=lambda item: rank.get(item[0], len(rank))))


#: The number columns of a table of summaries (`summaries_frame`), and its string columns that
#: may be None in every summary (no MLflow run, a summary from before a key was kept).
SUMMARY_FLOATS = ("mean_at_k", "mean_at_k_se", "best_at_k", "answered_fraction", "mean_completion_tokens",
                  "truncated_fraction", "kl_to_base", "entropy")
SUMMARY_STRINGS = ("context_id", "context_hash", "mlflow_run_id", "cycle_run_id")


def summaries_frame(summaries: Sequence[dict[str, Any]]) -> Any:
    """Evaluation summaries read back from their JSON files as one polars table (the base
    model's, results/tables/base_eval.parquet): `tidy_summary`'s names, NaN for a number not
    measured (JSON's null: KL and entropy with `evaluation.divergence` off), as in the curves
    tables, and the same dtypes whatever the values (a column all null had polars' Null type)."""
    import polars as pl

    tidy = [tidy_summary(s) for s in summaries]
    extra = list(dict.fromkeys(key for row in tidy for key in row if key not in SUMMARY_ORDER))
    keys = [*SUMMARY_ORDER, *extra]  # a summary from before a key was kept: its column still there
    rows = [{key: math.nan if row.get(key) is None and key in SUMMARY_FLOATS else row.get(key) for key in keys}
            for row in tidy]
    types = {**dict.fromkeys(SUMMARY_FLOATS, pl.Float64), **dict.fromkeys(SUMMARY_STRINGS, pl.String)}
    return pl.DataFrame(rows, infer_schema_length=None,
                        schema_overrides={key: kind for key, kind in types.items() if key in keys})


def summarize(rows: Sequence[dict[str, Any]], k: int) -> dict[str, float]:
    """mean@k, best@k and sizes from per-sample rows (as written by `sample_and_score`)."""
    by_problem: dict[str, list[float]] = {}
    for r in rows:
        by_problem.setdefault(r["problem_id"], []).append(r["reward"])
    if any(len(v) != k for v in by_problem.values()):
        short = next(pid for pid, v in by_problem.items() if len(v) != k)
        raise ValueError(f"expected {k} samples per problem, got {sorted({len(v) for v in by_problem.values()})} "
                         f"(problem {short!r} has {len(by_problem[short])})")
    mat = np.array(list(by_problem.values()), dtype=float).reshape(len(by_problem), k)
    summary = {f"mean@{k}": mean_at_k(mat), f"mean@{k}_se": mean_at_k_se(mat), f"best@{k}": best_at_k(mat),
               "problems": len(by_problem),
               "k": k, "mean_completion_tokens": float(np.mean([r["completion_tokens"] for r in rows]))}
    if all("truncated" in r for r in rows):  # rows of `sample_and_score` (older samples tables have none)
        summary["truncated_fraction"] = float(np.mean([bool(r["truncated"]) for r in rows]))
    if all("answered" in r for r in rows):
        summary["answered_fraction"] = float(np.mean([bool(r["answered"]) for r in rows]))
    return summary


def format_table(summaries: Sequence[dict[str, Any]], keys: Sequence[str]) -> str:
    """A small fixed-width text table for logs and the README."""
    widths = [max(len(k), *(len(_fmt(s.get(k))) for s in summaries)) for k in keys]
    line = "  ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True))
    body = ["  ".join(_fmt(s.get(k)).ljust(w) for k, w in zip(keys, widths, strict=True)) for s in summaries]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def evaluate_weights(model_dir: str | Path, task: Task, problems: Sequence[Problem], context: str,
                     k: int, params: SamplingParams, *, base_dir: str | Path | None = None,
                     backend: str = "hf", dtype: str = "float32", batch_size: int = 8,
                     sample_dtype: str | None = None, divergence: bool = True,
                     gpu_memory_utilization: float | None = None, divergence_tokens: int | None = None,
                     chat_template_kwargs: dict[str, Any] | None = None,
                     ) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """mean@k, best@k, token-level KL(π_θ ‖ π_base) and mean entropy of one (weights, context).

    KL and entropy are measured on the evaluated completions themselves (samples of π_θ) with
    full-vocabulary forward passes of both models (`fastslow.slow.divergence`), in `dtype`;
    the samples are drawn in `sample_dtype` (default `dtype`; bf16 sampling is about 2x faster on
    a CPU with native bf16, but bf16 log-probs are too coarse for the KL of nearby checkpoints). Without
    `base_dir` (or with base_dir == model_dir) the KL is 0 and only the entropy is computed.
    With `divergence=False` neither is computed (both NaN): the forward passes over every prompt
    cost about as much as sampling, and only the KL and entropy figures read them. Each of those
    passes holds at most `divergence_tokens` positions (config `evaluation.divergence_tokens`;
    None: `batch_size` rows whatever their length).

    The vLLM backend gets `gpu_memory_utilization` (config `generation.gpu_memory_utilization`;
    None: `VLLMGenerator`'s default) and a context of the longest prompt plus
    `params.max_new_tokens`; before the KL/entropy pass it is shut down and its GPU memory
    returned, and that pass runs on the GPU when there is one.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"evaluate_weights: k: expected an integer >= 1, got {k!r}")
    if not problems:
        raise ValueError(f"evaluate_weights: problems: expected at least one problem, got {problems!r}")
    import torch

    from fastslow.memory import release_gpu_memory
    from fastslow.model.convert import load_model, load_tokenizer
    from fastslow.model.generation import encode_prompts, longest_prompt, make_generator
    from fastslow.slow.divergence import kl_and_entropy

    sample_dtype = sample_dtype or dtype
    tokenizer = None
    max_model_len = None
    if backend == "vllm":  # vLLM would otherwise reserve the model's whole context (40960 for Qwen3-8B)
        tokenizer = load_tokenizer(model_dir)
        max_model_len = longest_prompt(tokenizer, [build_messages(context, p) for p in problems],
                                       chat_template_kwargs=chat_template_kwargs) + params.max_new_tokens
    log.info("eval %s: %d problems x %d samples, sampled in %s", task.name, len(problems), k, sample_dtype)
    generator = make_generator(backend, model_dir, dtype=sample_dtype, batch_size=batch_size,
                               gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                               chat_template_kwargs=chat_template_kwargs)
    # vLLM schedules a call's prompts itself and each call waits for its longest sample, so it gets
    # `batch_size` prompts a call (paper.yaml: 256); the HF generator batches within a call.
    chunk = batch_size if backend == "vllm" else 32
    rows = sample_and_score(generator, task, problems, context, k, params, chunk=chunk)
    summary = summarize(rows, k)
    if not divergence:
        for r in rows:
            del r["completion_ids"], r["prompt_ids"]
        summary.update({"kl_to_base": float("nan"), "entropy": float("nan")})
        return summary, rows
    # the tokenizer the samples were encoded with (vLLM's was loaded above): loading it again cost
    # ~1 s an evaluation job on a 2-core CPU
    tokenizer = tokenizer or getattr(generator, "tokenizer", None) or load_tokenizer(model_dir)
    model = getattr(generator, "model", None) if sample_dtype == dtype else None
    if model is None:
        # vLLM holds the GPU; a bf16 sampler is replaced by the model.dtype copy. The engine goes
        # with its last reference (gc: it may sit in a cycle), its cached blocks back to CUDA.
        del generator
        gc.collect()
        release_gpu_memory()
        model = load_model(model_dir, dtype=dtype, device="cuda" if torch.cuda.is_available() else "cpu")
    else:
        del generator  # the model lives on, as the policy of the KL pass
    device = str(next(model.parameters()).device)
    same = base_dir is None or Path(base_dir).resolve() == Path(model_dir).resolve()
    base = model if same else load_model(base_dir, dtype=dtype, device=device)
    # the prompts as the sampler encoded them (both backends report them): encoding them again
    # cost ~1 ms a prompt; a backend that reports none has its prompts encoded here
    prompt_ids = [r.pop("prompt_ids") for r in rows]
    if not all(prompt_ids):
        by_id = {p.id: p for p in problems}
        prompt_ids = encode_prompts(tokenizer, [build_messages(context, by_id[r["problem_id"]]) for r in rows],
                                    chat_template_kwargs)
    t0 = time.perf_counter()
    log.info("%s of %d completions follows (a forward pass over each)", "entropy (the base model: KL 0)" if same
             else "KL to base and entropy", len(rows))
    # at temperature 1, the models' own distributions (Fig 4's KL(pi_train || pi_base), Fig 8's
    # entropy), on completions sampled at generation.temperature: their own samples when that is 1
    # (config.yaml, paper.yaml), a tempered policy's otherwise (README, Fig 4's row)
    kl, entropy = kl_and_entropy(model, base, tokenizer, prompt_ids, [r.pop("completion_ids") for r in rows],
                                 batch_size=batch_size, temperature=1.0, max_tokens=divergence_tokens)
    log.info("KL to base %.4f, entropy %.3f (%.1fs)", kl, entropy, time.perf_counter() - t0)
    summary.update({"kl_to_base": 0.0 if same else kl, "entropy": entropy})
    return summary, rows
