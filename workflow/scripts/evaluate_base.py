"""Base model, seed context: mean@k and best@k on a task's val split."""

import logging

import torch

from fastslow.config import make_task
from fastslow.evaluate import format_table, sample_and_score, summarize
from fastslow.io import write_json, write_parquet
from fastslow.jobs import snakemake_job
from fastslow.model.generation import SamplingParams, make_generator
from fastslow.tasks.data import load_problems

smk = snakemake  # noqa: F821 - injected by Snakemake
cfg, task_name = smk.config, smk.wildcards.task
with snakemake_job(smk, parent="foundation") as tracker:
    torch.set_num_threads(smk.threads)
    gen_cfg, ev = cfg["generation"], cfg["evaluation"]
    problems = load_problems(smk.input.problems)[: ev["max_problems"]]
    generator = make_generator(gen_cfg["backend"], smk.input.model, dtype=cfg["model"]["dtype"],
                               batch_size=gen_cfg["batch_size"])
    params = SamplingParams(gen_cfg["max_new_tokens"], gen_cfg["temperature"], gen_cfg["top_p"], ev["seed"])
    rows = sample_and_score(generator, make_task(cfg, task_name), problems, cfg["seed_context"], ev["k"], params)
    summary = {"task": task_name, **summarize(rows, ev["k"])}
    write_parquet([{"task": task_name, **r} for r in rows], smk.output.samples)
    write_json(summary, smk.output.summary)
    tracker.log_metrics({k: v for k, v in summary.items() if isinstance(v, float)})
    tracker.log_table(smk.output.samples, f"eval/base/{task_name}")
    logging.getLogger("evaluate_base").info("\n%s", format_table([summary], list(summary)))
