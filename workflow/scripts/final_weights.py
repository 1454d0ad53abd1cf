"""Keep a run's final weights: hard links to the last cycle's model (no second copy on disk)."""

import os
import shutil
from pathlib import Path

from fastslow.io import atomic_path
from fastslow.jobs import snakemake_job

smk = snakemake  # noqa: F821 - injected by Snakemake
with snakemake_job(smk, parent=smk.wildcards.experiment) as tracker:
    src = Path(smk.input.model)

    def link_or_copy(f: str, dest: str) -> None:
        try:
            os.link(f, dest)
        except OSError:  # another filesystem: copy instead
            shutil.copy2(f, dest)

    with atomic_path(smk.output[0], is_dir=True) as tmp:
        shutil.copytree(src, tmp, copy_function=link_or_copy, dirs_exist_ok=True)
    tracker.log_checkpoint(smk.output[0], "final_weights")
