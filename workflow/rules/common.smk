# Paths, config validation and input functions shared by all rule files.
import sys
from pathlib import Path

from fastslow.config import ConfigError, model_name, validate_config

# Validate and fill defaults before any rule is defined: a bad key stops here, in one line.
try:
    validate_config(config)
except ConfigError as err:
    sys.exit(str(err))

RESULTS = "results"
TRACKING = f"{RESULTS}/mlflow/tracking.json"
MODEL = model_name(config)
BASE_MODEL = f"{RESULTS}/models/{MODEL}"
TASKS = config["data"]["tasks"]
SPLITS = ("train", "val", "test")

# One parent MLflow run per experiment group; jobs attach to their group's parent.
PARENTS = ["foundation", *config["experiments"].keys()]

wildcard_constraints:
    task="[A-Za-z0-9_]+",
    split="train|val|test",


def data_file(task, split):
    return f"{RESULTS}/data/{task}/{split}.parquet"


def default_targets():
    return [f"{RESULTS}/tables/base_eval.parquet"]


localrules:
    init_tracking,


rule init_tracking:
    output:
        TRACKING,
    log:
        f"{RESULTS}/logs/init_tracking.log",
    params:
        parents=PARENTS,
    script:
        "../scripts/init_tracking.py"
