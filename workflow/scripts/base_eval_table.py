"""Collect the base model's per-task summaries into one table (and print it to the log)."""

import json
import logging

from fastslow.evaluate import summaries_frame, summary_table, tidy_summary
from fastslow.io import write_parquet
from fastslow.jobs import snakemake_job

smk = snakemake  # noqa: F821 - injected by Snakemake
with snakemake_job(smk, parent="foundation") as tracker:
    summaries = [json.loads(open(p, encoding="utf-8").read()) for p in smk.input.summaries]
    rows = [tidy_summary(s) for s in summaries]
    write_parquet(summaries_frame(summaries), smk.output[0])
    tracker.log_table(smk.output[0], "base_eval")
    logging.getLogger("base_eval").info("base model, seed context:\n%s", summary_table(rows))
