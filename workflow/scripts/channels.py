"""Channel decomposition table from the four evaluations of each efficiency FST run."""

import json
import logging

import polars as pl

from fastslow.evaluate import format_table
from fastslow.io import atomic_path
from fastslow.jobs import snakemake_job

smk = snakemake  # noqa: F821 - injected by Snakemake
CELLS = ("base weights + seed context", "FST weights + FST context",
         "base weights + FST context", "FST weights + seed context")
with snakemake_job(smk, parent="figures") as tracker:
    files = list(smk.input.evals)
    rows = []
    for i in range(0, len(files), 4):
        evs = [json.loads(open(f, encoding="utf-8").read()) for f in files[i:i + 4]]
        k = int(evs[0]["k"])
        row = {"task": evs[1]["task"], "run": evs[1]["run"]}
        row.update({cell: float(ev[f"mean@{k}"]) for cell, ev in zip(CELLS, evs, strict=True)})
        rows.append(row)
    with atomic_path(smk.output[0]) as tmp:
        pl.DataFrame(rows).write_csv(tmp)
    tracker.log_artifact(smk.output[0], "tables")
    if rows:
        logging.getLogger("channels").info("\n%s", format_table(rows, ["task", *CELLS]))
