"""Evaluate a run at one point (its initial weights, or after cycle N) on one task's val split."""

import logging
from pathlib import Path

import torch

from fastslow.config import evaluation_options, make_task
from fastslow.cycle import eval_context
from fastslow.evaluate import evaluate_weights, run_ids, summary_line
from fastslow.experiments import expand
from fastslow.io import write_json, write_parquet
from fastslow.jobs import snakemake_job
from fastslow.model.generation import SamplingParams
from fastslow.records import context_hash
from fastslow.tasks.data import load_problems

smk = snakemake  # noqa: F821 - injected by Snakemake
wc = smk.wildcards
spec = expand(smk.config)[f"{wc.experiment}/{wc.method}/{wc.run}"]
with snakemake_job(smk, parent=wc.experiment, run=spec) as tracker:
    torch.set_num_threads(smk.threads)
    cfg = spec.settings(smk.config)  # the run's effective config (variant overrides applied)
    gen, ev = cfg["generation"], cfg["evaluation"]
    pool = Path(smk.input.pool) if "pool" in smk.input.keys() else None
    context_id, context = eval_context(spec, cfg, pool)
    problems = load_problems(smk.input.val)[: ev["max_problems"]]
    params = SamplingParams(gen["max_new_tokens"], gen["temperature"], gen["top_p"], ev["seed"])
    options = evaluation_options(cfg)
    summary, rows = evaluate_weights(smk.input.model, make_task(cfg, wc.task), problems, context, ev["k"], params,
                                     base_dir=smk.input.base, **options)
    tracker.set_tags({"fastslow.eval_dtype": options["sample_dtype"]})  # bfloat16_if_native: the machine's choice
    summary = {"run": spec.key, "point": wc.point, "task": wc.task, "context_id": context_id,
               "context_hash": context_hash(context), **summary,
               **run_ids(tracker, pool)}
    write_parquet([{"run": spec.key, "point": wc.point, "task": wc.task, **r} for r in rows], smk.output.samples)
    write_json(summary, smk.output.summary)
    step = 0 if wc.point == "init" else (int(wc.point[5:]) + 1) * cfg["slow"]["steps_per_cycle"]
    tracker.log_metrics({f"eval/{wc.task}/{k}": v for k, v in summary.items() if isinstance(v, float)}, step=step)
    tracker.log_table(smk.output.samples, f"eval/{spec.key}/{wc.point}/{wc.task}")
    if summary.get("cycle_run_id"):  # the cycle run whose weights and pool this evaluated
        tracker.set_tags({"fastslow.cycle_run": summary["cycle_run_id"]})
    logging.getLogger("evaluate").info("%s", summary_line(summary))
