"""Glue between a Snakemake `script:` and the library: logging to the rule's log, an MLflow run.

Scripts stay thin::

    from fastslow.jobs import snakemake_job
    with snakemake_job(snakemake) as tracker:
        ...  # call the library, write snakemake.output, tracker.log_*(...)
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastslow.tracking import JobTracker, job_run


def setup_logging(log_path: str | Path | None) -> None:
    """Send logging and stderr to the rule's log file, and keep progress visible on the console."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.__stderr__)]
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        fh = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives for the job
        sys.stderr = fh  # warnings and tracebacks of libraries land in the log too
        handlers.append(logging.StreamHandler(fh))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # MLflow's dataset-source and schema hints are not actionable for our Parquet tables.
    warnings.filterwarnings("ignore", module=r"mlflow\..*")
    for noisy in ("urllib3", "httpx", "alembic", "mlflow", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@contextlib.contextmanager
def snakemake_job(smk: Any, parent: str | None = None) -> Iterator[JobTracker]:
    """Logging + an MLflow child run for the job described by the `snakemake` object."""
    setup_logging(smk.log[0] if len(smk.log) else None)
    wildcards = {k: str(v) for k, v in smk.wildcards.items()}
    code = dict(smk.params.items()).get("code")  # the library's digest (fastslow.provenance)
    with job_run(rule=smk.rule, wildcards=wildcards, config=smk.config, tracking_json=smk.input.tracking,
                 parent=parent, extra_tags={"fastslow.code": code} if code else None) as tracker:
        yield tracker
