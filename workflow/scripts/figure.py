"""Draw one paper figure from its experiments' curves tables."""

import logging

import polars as pl

from fastslow.figures import draw, figure_metrics
from fastslow.io import json_text
from fastslow.jobs import FILE_ONLY, snakemake_job
from fastslow.layout import table_experiment

smk = snakemake  # noqa: F821 - injected by Snakemake
with snakemake_job(smk, parent="figures") as tracker:
    tables = {table_experiment(p): pl.read_parquet(p) for p in smk.input.tables}
    # each experiment at one variant, but the variants a figure compares (Fig 9's, Fig 10's)
    result, tables = draw(smk.wildcards.fig, tables, smk.output.pdf, **smk.params.options)
    runs = sorted({r for df in tables.values() for r in df["run"].unique().to_list()})  # the runs drawn
    # The figure's MLflow run names every run it plotted by its key; each job of such a run carries
    # it as tag fastslow.run (fastslow.jobs.run_settings), so `tags.`fastslow.run` = '<key>'` finds them.
    tracker.set_tags({"fastslow.figure": smk.wildcards.fig, "fastslow.input_runs": ",".join(runs)})
    for p in smk.input.tables:  # what it drew from: each row names its evaluation's and cycle's MLflow runs
        tracker.log_table(p, f"curves/{table_experiment(p)}", context="input")
    tracker.log_metrics(figure_metrics(smk.wildcards.fig, result))  # what it plotted, e.g. Fig 9's bars
    tracker.log_artifact(smk.output.pdf, "figures")
    tracker.log_artifact(smk.output.png, "figures")
    if result is not None:  # what it plotted: for the job's log file (a line of ~1000 characters)
        logging.getLogger("figure").info("%s: %s", smk.wildcards.fig, json_text(  # NaN (no fit) as null
            result if not isinstance(result, pl.DataFrame) else result.to_dicts()), extra=FILE_ONLY)  # Fig 6's, whole
    logging.getLogger("figure").info("%s: wrote %s and %s", smk.wildcards.fig, smk.output.pdf, smk.output.png)
