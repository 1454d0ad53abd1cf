"""Convert / fetch the base model into a plain, trainable Hugging Face directory."""

import logging

from fastslow.jobs import snakemake_job
from fastslow.model.convert import prepare_base_model

smk = snakemake  # noqa: F821 - injected by Snakemake
with snakemake_job(smk, parent="foundation") as tracker:
    try:
        path = prepare_base_model(smk.params.spec, smk.output[0])
    except (ValueError, RuntimeError, OSError) as exc:
        # prepare_base_model's own errors say in one line what is wrong with the model named (no
        # such directory or hub id, the hub unreachable, no chat template, a config this
        # transformers cannot read): that line, not the traceback of the code that found it
        message = " ".join(str(exc).split())
        logging.getLogger("base_model").error("%s: %s", type(exc).__name__, message)
        raise SystemExit(f"base model error: {message}") from None
    tracker.log_checkpoint(path, "base_model")
