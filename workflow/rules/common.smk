# Paths, config validation and input functions shared by all rule files.
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

from fastslow.config import ConfigError, job_params, model_name, validate_config
from fastslow import layout
from fastslow.experiments import expand as expand_runs
from fastslow.layout import FIGURE_EXPERIMENTS

# Validate and fill defaults before any rule is defined: a bad key stops here, in one line.
try:
    validate_config(config)
except ConfigError as err:
    sys.exit(str(err))

RESULTS = layout.RESULTS
# Every job reads the MLflow ids from here. It is an ancient() input everywhere: adding an
# experiment re-runs init_tracking (idempotent) but must not make finished jobs look outdated.
TRACKING = f"{RESULTS}/mlflow/tracking.json"
MODEL = model_name(config)
BASE_MODEL = f"{RESULTS}/models/{MODEL}"
TASKS = config["data"]["tasks"]
SPLITS = ("train", "val", "test")

# One parent MLflow run per experiment group; jobs attach to their group's parent.
PARENTS = ["foundation", "figures", *config["experiments"].keys()]
RUNS = expand_runs(config)
# A run's directory; its wildcards identify it: experiment, method, run (= tasks-variant-seed).
RUN = f"{RESULTS}/runs/{{experiment}}/{{method}}/{{run}}"

wildcard_constraints:
    task="[A-Za-z0-9_]+",
    split="train|val|test",
    experiment="[A-Za-z0-9_]+",
    method="rl|fst|gepa|fst_distill",
    run="[A-Za-z0-9_.+-]+",
    cycle="[0-9]+",


data_file = layout.data_file


def run_of(wc):
    key = f"{wc.experiment}/{wc.method}/{wc.run}"
    if key not in RUNS:
        raise ValueError(f"no run {key!r} in the config's experiments (known: {len(RUNS)} runs)")
    return RUNS[key]


# Settings a job's outputs depend on, as its params: Snakemake reruns a job whose params changed
# (a new slow.lr retrains the run's cycles and re-evaluates them), and only such jobs (adding an
# experiment or changing another run's variant retrains nothing). The data splits a job reads
# are inputs, so task_data's own params cover data.*.
TRAINING_SETTINGS = ("model", "generation", "seed_context", "slow", "fast")
EVALUATION_SETTINGS = ("model", "generation", "seed_context", "evaluation")


def heavy_threads():
    """Threads of a model job (cycle, evaluation): a quarter of the cores Snakemake was given,
    at least 1. On 2 cores two jobs run side by side on a thread each; on 32, four jobs on 8
    threads each rather than 32 one-thread jobs' worth of memory (a cycle job holds ~4.5 GB) or
    two jobs on one thread each. The SLURM profile sets its own (set-threads)."""
    try:
        cores = workflow.cores
    except WorkflowError:  # no --cores (e.g. snakemake --report): nothing runs, any value does
        return 1
    return max(1, cores // 4) if isinstance(cores, int) else 1


def run_settings(keys):
    def settings(wc):
        return job_params(run_of(wc).settings(config), keys)

    return settings


def init_model(spec):
    return layout.init_model(spec, BASE_MODEL)


def cycle_inputs(wc):
    spec, c = run_of(wc), int(wc.cycle)
    if c >= spec.cycles:
        raise ValueError(f"run {spec.key} has {spec.cycles} cycles; cycle{c} does not exist")
    inputs = {"tracking": ancient(TRACKING), "base": BASE_MODEL, "init": init_model(spec),
              "train": data_file(spec.schedule[c], "train")}
    if c > 0:
        prev = layout.cycle_dir(spec, c - 1)
        inputs.update(pool=f"{prev}/pool.json", summary=f"{prev}/cycle.json",
                      metrics=f"{prev}/metrics.parquet")
        if spec.trains:
            inputs.update(model=f"{prev}/model", state=f"{prev}/trainer_state",
                          rollouts=f"{prev}/rollouts.parquet")
    return inputs


def eval_inputs(wc):
    """Weights and pool of one evaluation point: cycle N of a run, or its initial weights."""
    spec = run_of(wc)
    inputs = {"tracking": ancient(TRACKING), "base": BASE_MODEL, "val": data_file(wc.task, "val")}
    if wc.point == "init":
        inputs["model"] = init_model(spec)
    else:
        c = int(wc.point.removeprefix("cycle"))
        inputs["pool"] = f"{layout.cycle_dir(spec, c)}/pool.json"
        inputs["model"] = f"{layout.cycle_dir(spec, c)}/model" if spec.trains else init_model(spec)
    return inputs


# Figures whose main experiment is configured; the claims table reads what exists of these.
FIGURE_TARGETS = [f for f, exps in FIGURE_EXPERIMENTS.items() if exps[0] in config["experiments"]]
CLAIM_EXPERIMENTS = [e for e in ("efficiency", "plasticity", "continual") if e in config["experiments"]]
POOL_EXPERIMENTS = sorted({s.experiment for s in RUNS.values() if s.fast})


def default_targets():
    targets = [f"{RESULTS}/tables/base_eval.parquet"]
    targets += [f"{RESULTS}/figures/{f}.pdf" for f in FIGURE_TARGETS]
    if CLAIM_EXPERIMENTS:
        targets.append(f"{RESULTS}/tables/claims.csv")
    targets += [f"{RESULTS}/reports/pools/{e}.html" for e in POOL_EXPERIMENTS]
    if any(s.method == "fst" for s in layout.experiment_runs(RUNS, "efficiency").values()):
        targets.append(f"{RESULTS}/tables/channels.csv")
    return targets


localrules:
    init_tracking,


rule init_tracking:
    output:
        TRACKING,
    log:
        f"{RESULTS}/logs/init_tracking.log",
    benchmark:
        f"{RESULTS}/benchmarks/init_tracking.tsv",
    params:
        parents=PARENTS,
    script:
        "../scripts/init_tracking.py"
