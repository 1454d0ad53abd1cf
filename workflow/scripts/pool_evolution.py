"""Write the context-pool evolution page of one experiment (for `snakemake --report`)."""

from fastslow.experiments import expand
from fastslow.io import atomic_path
from fastslow.jobs import snakemake_job
from fastslow.pools import pool_evolution_html

smk = snakemake  # noqa: F821 - injected by Snakemake
with snakemake_job(smk, parent=smk.wildcards.experiment) as tracker:
    with atomic_path(smk.output[0]) as tmp:
        tmp.write_text(pool_evolution_html(expand(smk.config), smk.wildcards.experiment), encoding="utf-8")
    tracker.log_artifact(smk.output[0], "reports")
