"""Write a task's train/val/test splits to Parquet, deterministically from the config's seed."""

import logging
from pathlib import Path

from fastslow.config import task_spec
from fastslow.jobs import snakemake_job
from fastslow.tasks.base import TaskDataError
from fastslow.tasks.data import write_checked_splits

smk = snakemake  # noqa: F821 - injected by Snakemake
data, task = smk.config["data"], smk.wildcards.task
with snakemake_job(smk, parent="foundation") as tracker:
    registry, options = task_spec(smk.config, task)
    try:
        paths, below = write_checked_splits(registry, Path(smk.output.train).parent, data["sizes"], data["seed"],
                                            **options)
    except TaskDataError as exc:  # the data is wrong, not the code: one line, no traceback
        logging.getLogger("task_data").error("%s", exc)
        raise SystemExit(f"task data error: {exc}") from None
    for split, path in paths.items():
        tracker.log_table(path, f"{task}/{split}", context=split)
    # problems whose own answer, in <answer> tags, scores below 1 (a user's file or scorer at odds
    # with itself: the log's warning names the first), where the MLflow UI shows it
    tracker.log_metrics({"gold_below_one": below})
