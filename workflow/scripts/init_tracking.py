"""Create the MLflow database, experiment and parent runs before any job fans out."""

from fastslow.jobs import setup_logging
from fastslow.tracking import init_tracking

setup_logging(snakemake.log[0])  # noqa: F821 - injected by Snakemake
info = init_tracking(snakemake.config["mlflow_experiment"], list(snakemake.params.parents),  # noqa: F821
                     snakemake.output[0])  # noqa: F821
print(f"MLflow: {info['tracking_uri']} experiment {info['experiment']!r} ({info['experiment_id']})")
