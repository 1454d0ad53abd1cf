"""The claims table: our measured value beside the paper's, with the runs behind each. As rule
`claims`, every claim from every claims experiment's curves; as rule `figure_claims`, the claims
one figure shows, from the curves tables that figure reads."""

import logging

import polars as pl

from fastslow.claims import build_claims, claims_frame, figure_claims
from fastslow.evaluate import format_table
from fastslow.io import atomic_path
from fastslow.jobs import snakemake_job
from fastslow.layout import table_experiment

smk = snakemake  # noqa: F821 - injected by Snakemake
with snakemake_job(smk, parent="figures") as tracker:
    tables = {table_experiment(p): pl.read_parquet(p) for p in smk.input.tables}
    fig = smk.wildcards.get("fig")
    rows = figure_claims(tables, fig) if fig else build_claims(tables)
    with atomic_path(smk.output[0]) as tmp:
        claims_frame(rows).write_csv(tmp)
    tracker.log_artifact(smk.output[0], "tables")
    logging.getLogger("claims").info("\n%s", format_table(rows, ["claim", "figures", "task", "measured", "paper",
                                                                  "verdict", "note"]))
