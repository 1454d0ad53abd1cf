"""Tidy table of every evaluation point of one experiment."""

from pathlib import Path

import polars as pl

from fastslow.curves import CURVE_COLUMNS, build_curves
from fastslow.experiments import expand
from fastslow.io import write_parquet
from fastslow.jobs import snakemake_job
from fastslow.layout import table_filter

smk = snakemake  # noqa: F821 - injected by Snakemake
wc = smk.wildcards
tasks, methods = table_filter(wc)  # rules curves_on_tasks, curves_on_tasks_of_methods
with snakemake_job(smk, parent=wc.experiment) as tracker:
    rows = build_curves(expand(smk.config), wc.experiment, smk.config, tasks=tasks, methods=methods)
    # their types even where every value is None (init only; cycles on a GPU, or older cycle.json)
    ids = {"eval_run_id": pl.String, "cycle_run_id": pl.String, "cycle_cpu_share": pl.Float64,
           "rollouts_sampled": pl.Int64, "context_hash": pl.String}
    df = pl.DataFrame(rows, infer_schema_length=None, schema_overrides=ids).select(CURVE_COLUMNS)
    write_parquet(df, smk.output[0])
    tracker.log_table(smk.output[0], f"curves/{Path(smk.output[0]).stem}")
    tracker.set_tags({"fastslow.input_runs": ",".join(sorted(set(df["run"].to_list())))})
