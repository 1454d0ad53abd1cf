"""Keep a run's final weights: hard links to the last cycle's model (no second copy on disk)."""

from pathlib import Path

from fastslow.experiments import expand
from fastslow.io import atomic_path, link_tree
from fastslow.jobs import snakemake_job

smk = snakemake  # noqa: F821 - injected by Snakemake
wc = smk.wildcards
spec = expand(smk.config)[f"{wc.experiment}/{wc.method}/{wc.run}"]
with snakemake_job(smk, parent=wc.experiment, run=spec) as tracker:  # the run's own settings and variant tag
    src = Path(smk.input.model)
    with atomic_path(smk.output[0], is_dir=True) as tmp:
        link_tree(src, tmp)
    tracker.log_checkpoint(smk.output[0], "final_weights")
