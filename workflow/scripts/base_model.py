"""Convert / fetch the base model into a plain, trainable Hugging Face directory."""

from fastslow.jobs import snakemake_job
from fastslow.model.convert import prepare_base_model

smk = snakemake  # noqa: F821 - injected by Snakemake
with snakemake_job(smk, parent="foundation") as tracker:
    path = prepare_base_model(smk.params.spec, smk.output[0])
    tracker.log_checkpoint(path, "base_model")
