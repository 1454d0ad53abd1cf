"""Base model, seed context: mean@k, best@k and entropy on a task's val split."""

import logging

import torch

from fastslow.config import make_task, sample_dtype
from fastslow.evaluate import evaluate_weights, format_table
from fastslow.io import write_json, write_parquet
from fastslow.jobs import snakemake_job
from fastslow.model.generation import SamplingParams
from fastslow.tasks.data import load_problems

smk = snakemake  # noqa: F821 - injected by Snakemake
cfg, task_name = smk.config, smk.wildcards.task
with snakemake_job(smk, parent="foundation") as tracker:
    torch.set_num_threads(smk.threads)
    gen, ev = cfg["generation"], cfg["evaluation"]
    problems = load_problems(smk.input.problems)[: ev["max_problems"]]
    params = SamplingParams(gen["max_new_tokens"], gen["temperature"], gen["top_p"], ev["seed"])
    summary, rows = evaluate_weights(smk.input.model, make_task(cfg, task_name), problems, cfg["seed_context"],
                                     ev["k"], params, backend=gen["backend"], dtype=cfg["model"]["dtype"],
                                     batch_size=gen["batch_size"],
                                     sample_dtype=sample_dtype(cfg), divergence=ev["divergence"],
                                     gpu_memory_utilization=gen["gpu_memory_utilization"])
    summary = {"run": "base", "point": "init", "task": task_name, "context_id": "seed", **summary}
    write_parquet([{"task": task_name, **r} for r in rows], smk.output.samples)
    write_json(summary, smk.output.summary)
    tracker.log_metrics({k: v for k, v in summary.items() if isinstance(v, float)})
    tracker.log_table(smk.output.samples, f"eval/base/{task_name}")
    logging.getLogger("evaluate_base").info("\n%s", format_table([summary], list(summary)))
