"""The claims table: our measured value beside the paper's, with the runs behind each."""

import logging
from pathlib import Path

import polars as pl

from fastslow.claims import build_claims
from fastslow.evaluate import format_table
from fastslow.io import atomic_path
from fastslow.jobs import snakemake_job

smk = snakemake  # noqa: F821 - injected by Snakemake
with snakemake_job(smk, parent="figures") as tracker:
    tables = {Path(p).stem: pl.read_parquet(p) for p in smk.input.tables}
    rows = build_claims(tables)
    df = pl.DataFrame(rows, schema={"claim": pl.String, "task": pl.String, "measured": pl.Float64,
                                    "paper": pl.Float64, "verdict": pl.String, "meaning": pl.String,
                                    "runs": pl.String, "note": pl.String})
    with atomic_path(smk.output[0]) as tmp:
        df.write_csv(tmp)
    tracker.log_artifact(smk.output[0], "tables")
    logging.getLogger("claims").info("\n%s", format_table(rows, ["claim", "task", "measured", "paper", "verdict", "note"]))
