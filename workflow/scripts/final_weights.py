"""Keep a run's final weights: hard links to the last cycle's model (no second copy on disk)."""

import os
import shutil
from pathlib import Path

from fastslow.io import atomic_path
from fastslow.jobs import snakemake_job

smk = snakemake  # noqa: F821 - injected by Snakemake
with snakemake_job(smk, parent=smk.wildcards.experiment) as tracker:
    src = Path(smk.input.model)
    with atomic_path(smk.output[0], is_dir=True) as tmp:
        for f in src.rglob("*"):
            dest = tmp / f.relative_to(src)
            if f.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(f, dest)
            except OSError:  # another filesystem: copy instead
                shutil.copy2(f, dest)
    tracker.log_checkpoint(smk.output[0], "final_weights")
