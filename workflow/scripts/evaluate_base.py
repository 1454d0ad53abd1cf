"""Base model, seed context: mean@k, best@k and entropy on a task's val split."""

import logging

import torch

from fastslow.config import evaluation_options, make_task
from fastslow.evaluate import evaluate_weights, run_ids, summary_line
from fastslow.io import write_json, write_parquet
from fastslow.jobs import snakemake_job
from fastslow.model.generation import SamplingParams
from fastslow.records import context_hash
from fastslow.tasks.data import load_problems

smk = snakemake  # noqa: F821 - injected by Snakemake
cfg, task_name = smk.config, smk.wildcards.task
with snakemake_job(smk, parent="foundation") as tracker:
    torch.set_num_threads(smk.threads)
    gen, ev = cfg["generation"], cfg["evaluation"]
    problems = load_problems(smk.input.problems)[: ev["max_problems"]]
    params = SamplingParams(gen["max_new_tokens"], gen["temperature"], gen["top_p"], ev["seed"])
    options = evaluation_options(cfg)
    summary, rows = evaluate_weights(smk.input.model, make_task(cfg, task_name), problems, cfg["seed_context"],
                                     ev["k"], params, **options)
    tracker.set_tags({"fastslow.eval_dtype": options["sample_dtype"]})  # bfloat16_if_native: the machine's choice
    summary = {"run": "base", "point": "init", "task": task_name, "context_id": "seed",
               "context_hash": context_hash(cfg["seed_context"]), **summary,
               **run_ids(tracker)}
    # the samples table of a run's evaluation (evaluate_point), its run and point the summary's
    write_parquet([{"run": "base", "point": "init", "task": task_name, **r} for r in rows], smk.output.samples)
    write_json(summary, smk.output.summary)
    # the names a run's evaluation logs (evaluate_point), at step 0: the initial weights
    tracker.log_metrics({f"eval/{task_name}/{k}": v for k, v in summary.items() if isinstance(v, float)}, step=0)
    tracker.log_table(smk.output.samples, f"eval/base/{task_name}")
    logging.getLogger("evaluate_base").info("%s", summary_line(summary))
