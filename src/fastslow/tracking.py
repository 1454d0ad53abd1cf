"""MLflow tracking: one child run per workflow job, nothing left RUNNING.

- Tracking URI: `MLFLOW_TRACKING_URI` if set (a server for clusters), else the embedded default
  `sqlite:///<results>/mlflow.db`. Artifacts of the embedded default go to `<results>/mlartifacts`.
- The workflow's local rules create the database and the experiment (`init_experiment`, rule
  `init_mlflow`) and one parent run per experiment group (`init_parents`, rule `init_tracking`,
  one file per group), before any fan-out; jobs attach to those parents by id, so concurrent
  jobs never race to create them. Those files pin the store and experiment: a job asked for another
  (`MLFLOW_TRACKING_URI`, `mlflow_experiment`) stops in one line (`check_store`) naming the command
  that remakes them for it (`python -m fastslow.tracking`, `retarget`).
- `job_run` opens a child run tagged with rule, wildcards and git commit, logs the resolved config,
  and ends the run FINISHED, FAILED (exception) or KILLED (SIGTERM/SIGINT/SIGHUP: the run is closed,
  then the process dies by the signal). A SIGKILL cannot be caught: the next run of the same job
  finds the stale RUNNING run, marks it KILLED and links to it. Every rerun links to the job's
  previous run (`fastslow.previous_run`) and tags that one `fastslow.superseded_by`. Once the block has succeeded, those
  signals are ignored for the rest of the process (the block ends every job's script): a Ctrl-C
  during the exit cannot fail a job whose outputs are written and whose run is FINISHED.
- Once the run is open, logging never fails the job (`_best_effort`): the outputs are the result.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fastslow.io import dotted, exception_chain, write_json

log = logging.getLogger(__name__)

TAG_JOB = "fastslow.job"  # rule + sorted wildcards: identifies "the same job" across reruns
TAG_PREVIOUS = "fastslow.previous_run"
TAG_SUPERSEDED = "fastslow.superseded_by"  # on that previous run: the job's run that replaced it
#: The project (results directory) a run belongs to: two projects (clones, results directories)
#: may log to one server's experiment of one name (the default `fastslow`), and each job's run
#: is "the same job" as another only within its project (`project_id`).
TAG_PROJECT = "fastslow.project"
#: Signals that stop a job: scancel / SLURM's time limit, Ctrl-C, and the terminal closing (SIGHUP).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name))
#: Seconds a stopped job waits for the tracking store to mark its run KILLED before it stops
#: anyway (a busy SQLite file or a server that is down would hold it past SLURM's KillWait, and
#: it is SIGKILLed): the run is then left RUNNING, and the job's next run closes it KILLED.
STOP_CLOSE_SECONDS = 5.0


def tracking_uri(results_dir: str | Path = "results") -> str:
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path(results_dir).resolve() / 'mlflow.db'}"


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    # Never mlflow.set_tracking_uri(): it exports MLFLOW_TRACKING_URI into os.environ, so every
    # process started afterwards (a snakemake run from a notebook or a test) would log there.
    return MlflowClient(uri)


def _locked(exc: BaseException) -> bool:
    """SQLite's 'database is locked', however MLflow wraps it: MLflow 3.17 raises an
    MlflowException over SQLAlchemy's OperationalError over sqlite3's, each repeating the text;
    the chain's sqlite3 error still says so if a wrapper's message stops quoting it."""
    import sqlite3

    return "locked" in str(exc).lower() or any(
        isinstance(e, sqlite3.OperationalError) and "locked" in str(e).lower() for e in exception_chain(exc))


def _retry(fn, *args, attempts: int = 8, **kwargs):
    """SQLite allows one writer: concurrent local jobs may briefly see 'database is locked'."""
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - mlflow wraps sqlite errors in several types
            if not _locked(exc) or i == attempts - 1:
                raise
            time.sleep(0.2 * 2**i)
    return None


def git_commit(cwd: str | Path | None = None) -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


#: The modified paths a job's `fastslow.git_modified` tag names; past these, how many more.
GIT_MODIFIED_SHOWN = 20


def git_modified(cwd: str | Path | None = None) -> list[str] | None:
    """The checkout's tracked files that differ from its commit (staged or not), or None outside
    a git checkout (an installed package, a copied tree). Untracked files (results/) are not read,
    and git takes no lock (`--no-optional-locks`: many jobs may ask at once)."""
    try:
        out = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "-z", "--untracked-files=no"],
                             cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    # -z: paths unquoted ("a b.py", not '"a b.py"'); a rename is "R  new" then its old path alone
    entries, paths = iter(out.stdout.split("\0")), []
    for entry in entries:
        if len(entry) > 3:
            paths.append(entry[3:])
            if "R" in entry[:2] or "C" in entry[:2]:
                next(entries, None)  # the old path of a rename or copy
    return paths


def git_tags(cwd: str | Path | None = None) -> dict[str, str]:
    """A job's source tags: its commit (`mlflow.source.git.commit`) and whether the checkout
    differed from it (`fastslow.git_dirty`: true, false or unknown; when true,
    `fastslow.git_modified` names the files). The code digests (`fastslow.code`) say which
    library code a job ran; these say whether the commit alone can give it back."""
    tags = {"mlflow.source.git.commit": git_commit(cwd)}
    modified = git_modified(cwd)
    tags["fastslow.git_dirty"] = "unknown" if modified is None else str(bool(modified)).lower()
    if modified:
        shown = ", ".join(modified[:GIT_MODIFIED_SHOWN])
        more = len(modified) - GIT_MODIFIED_SHOWN
        tags["fastslow.git_modified"] = shown + (f" and {more} more" if more > 0 else "")
    return tags


def init_experiment(experiment: str, out_json: str | Path | None = None,
                    results_dir: str | Path = "results") -> dict[str, Any]:
    """Create (or find) the database and the experiment; write its URI and id to `out_json`, with
    the project's id (`project_id`) and whether its jobs adopt untagged runs (`out_json` was
    made before runs were tagged with a project)."""
    uri = tracking_uri(results_dir)
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is not None and exp.lifecycle_stage == "deleted":  # MLflow finds it, and refuses runs in it
        raise RuntimeError(deleted_experiment(experiment, exp.experiment_id, uri))
    if exp is None:
        artifacts = None
        if uri.startswith("sqlite:"):
            artifacts = (Path(results_dir).resolve() / "mlartifacts").as_uri()
        try:
            exp_id = client.create_experiment(experiment, artifact_location=artifacts)
        except Exception as exc:  # noqa: BLE001 - another project's first job made it just now
            if getattr(exc, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                raise
            exp_id = client.get_experiment_by_name(experiment).experiment_id
    else:
        exp_id = exp.experiment_id
    info = {"tracking_uri": uri, "experiment": experiment, "experiment_id": exp_id,
            "project": project_id(results_dir), "results": str(Path(results_dir).resolve())}
    if _made_without_project(out_json):
        info["adopt_untagged"] = True
    if out_json is not None:
        write_json(info, out_json)  # atomically: every job reads it
    return info


#: In the results directory: its project's id (`project_id`), beside (not in) the tracking files,
#: so that remaking those (deleting results/mlflow/) keeps it.
PROJECT_FILE = ".fastslow-project.json"


def project_id(results_dir: str | Path) -> str:
    """The id of the project whose results directory is `results_dir`, in a store its runs may
    share with other projects' (`TAG_PROJECT`): random, made once and kept in the directory's
    `PROJECT_FILE` with the directory's absolute path. Not the path itself: clones in containers,
    or on machines laid out alike, share one. A results directory copied or moved elsewhere gets
    a new id (two copies logging to one server are two projects)."""
    import uuid

    results = Path(results_dir).resolve()
    with contextlib.suppress(OSError, ValueError, AttributeError):
        made = json.loads((results / PROJECT_FILE).read_text())
        if made.get("results") == str(results) and made.get("id"):
            return str(made["id"])
    project = uuid.uuid4().hex[:16]
    write_json({"id": project, "results": str(results)}, results / PROJECT_FILE)
    return project


def _made_without_project(tracking_json: str | Path | None) -> bool:
    """Were the tracking files `tracking_json` made before runs were tagged with a project (or
    remade from such)? Their project's earlier runs are untagged, and its jobs adopt those."""
    if tracking_json is None:
        return False
    with contextlib.suppress(OSError, ValueError, AttributeError):
        made = json.loads(Path(tracking_json).read_text())
        return bool(made.get("adopt_untagged") or not made.get("project"))
    return False


def _search_mine(client: Any, exp_id: str, info: Mapping[str, Any], filter_string: str,
                 max_results: int) -> list[Any]:
    """The runs matching `filter_string` of the project of the tracking files `info`, newest
    first: tagged with its id, plus the untagged ones (made before runs were tagged) when its
    files were made before then (`adopt_untagged`), or only those when they name no project.
    The untagged are told apart here, not by the store: `IS NULL` on a tag needs a recent server."""
    project = info.get("project")
    found = []
    if project:
        found += _retry(client.search_runs, [exp_id], filter_string=f"{filter_string} and tags.`{TAG_PROJECT}` = "
                        f"'{project}'", order_by=["attributes.start_time DESC"], max_results=max_results) or []
    if not project or info.get("adopt_untagged"):
        found += [run for run in _retry(client.search_runs, [exp_id], filter_string=filter_string,
                                        order_by=["attributes.start_time DESC"], max_results=max(max_results, 200))
                  or [] if TAG_PROJECT not in run.data.tags]
    return sorted(found, key=lambda r: -r.info.start_time)[:max_results]


def deleted_experiment(experiment: str, exp_id: str, uri: str) -> str:
    """The one line for an experiment deleted in the store (in its UI, say): MLflow keeps its name,
    and each run created in it fails with "must be in the 'active' state"."""
    return (f"mlflow_experiment {experiment!r}: experiment {exp_id} is deleted in {uri}; restore it "
            f"(`MLFLOW_TRACKING_URI={uri} mlflow experiments restore --experiment-id {exp_id}`) "
            "or set another mlflow_experiment")


def _tracking_folder(tracking_json: str | Path) -> Path:
    """`<results>/mlflow`, the folder of the tracking files: `tracking_json`'s own, or its parent
    for a group's `<results>/mlflow/parents/<group>.json`."""
    folder = Path(tracking_json).parent
    return folder.parent if folder.name == "parents" else folder


def _remake_command(folder: Path, experiment: str | None = None) -> str:
    """The shell command that remakes the tracking files in `folder` (`main`), quoted to paste."""
    words = [sys.executable, "-m", "fastslow.tracking", str(folder)]
    return shlex.join(words + (["--experiment", experiment] if experiment is not None else []))


def missing_experiment(info: Mapping[str, Any], tracking_json: str | Path) -> str:
    """The one line for tracking files whose experiment the store no longer holds (its database
    deleted or reset): the command that remakes them there."""
    folder = _tracking_folder(tracking_json)
    return (f"{tracking_json} names experiment {info['experiment_id']} ({info['experiment']!r}), which MLflow store "
            f"{info['tracking_uri']} does not hold (its database deleted or reset?): "
            f"`{_remake_command(folder)}` remakes the files there "
            f"(finished jobs stay up to date)")


def init_parents(experiment_info: Mapping[str, Any], parents: list[str],
                 out_json: str | Path) -> dict[str, Any]:
    """One FINISHED parent run per name in the experiment of `experiment_info` (an existing one is
    found by its tag, so this is idempotent); write the experiment's and their ids to `out_json`,
    the file `job_run` reads."""
    client = _client(experiment_info["tracking_uri"])
    exp_id = experiment_info["experiment_id"]
    ids: dict[str, str] = {}
    project = {TAG_PROJECT: experiment_info["project"]} if experiment_info.get("project") else {}
    for name in parents:
        found = _search_mine(client, exp_id, experiment_info, f"tags.`fastslow.parent` = '{name}'", 1)
        if found:
            ids[name] = found[0].info.run_id
            continue
        run = _retry(client.create_run, exp_id, run_name=name, tags={"fastslow.parent": name, **project})
        _retry(client.set_terminated, run.info.run_id, "FINISHED")
        ids[name] = run.info.run_id
    info = {key: experiment_info[key] for key in ("tracking_uri", "experiment", "experiment_id", "project", "results",
                                                  "adopt_untagged") if key in experiment_info}
    info["parents"] = ids
    write_json(info, out_json)  # atomically: every job reads it
    return info


def log_init(log_path: str | Path, *, out_json: str | Path, experiment: str | None = None,
             experiment_json: str | Path | None = None, group: str | None = None) -> dict[str, Any]:
    """The workflow's two local rules (their `run:` blocks call only this): with `experiment`,
    `init_experiment`; with `experiment_json` (its output) and `group`, that group's parent run
    (`init_parents`). One line to the rule's log either way."""
    if experiment is not None:
        info = init_experiment(experiment, out_json)
        line = f"MLflow: {info['tracking_uri']} experiment {experiment!r} ({info['experiment_id']})"
    elif experiment_json is not None and group is not None:
        info = init_parents(json.loads(Path(experiment_json).read_text()), [group], out_json)
        line = (f"MLflow: parent run of {group!r}: {info['parents'][group]} "
                f"(experiment {info['experiment']!r}, {info['experiment_id']})")
    else:
        raise ValueError("log_init needs experiment, or experiment_json and group")
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")
    return info


def init_tracking(experiment: str, parents: list[str], out_json: str | Path,
                  results_dir: str | Path = "results") -> dict[str, Any]:
    """Create the experiment and one FINISHED parent run per name; write their ids to `out_json`."""
    return init_parents(init_experiment(experiment, results_dir=results_dir), parents, out_json)


def flatten(d: Mapping[str, Any]) -> dict[str, str]:
    """Nested config → {'slow.lr': '1e-05', ...} (MLflow params are flat strings, ≤ 6000 chars)."""
    return {key: (v if isinstance(v, str) else json.dumps(v, default=str))[:6000] for key, v in dotted(d).items()}


def metric_key(name: str) -> str:
    """MLflow metric names allow [A-Za-z0-9_-. :/]: 'mean@4' is logged as 'mean_at_4'."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", name.replace("@", "_at_"))


def _best_effort(method):
    """A JobTracker method that never fails the job: once the run is open, the job's outputs are the
    result and MLflow their index, so a store that stops answering (after MLflow's own HTTP retries
    and our 'database is locked' ones) costs log lines, not the outputs Snakemake deletes when a job
    fails. The failure is logged as an error and counted in `failures`."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.down:  # each call would wait out MLflow's retries again
            self.failures.append(f"{method.__name__}: skipped, the store had stopped answering")
            return None
        start = time.monotonic()
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - whatever the store raised
            self.failures.append(f"{method.__name__}: {type(exc).__name__}: {exc}"[:500])
            log.error("MLflow run %s: %s failed, not logged (the job goes on): %s: %s",
                      self.run_id, method.__name__, type(exc).__name__, str(exc)[:300])
            waited = time.monotonic() - start
            if waited >= STORE_DOWN_SECONDS:
                self.down = True
                log.error("MLflow run %s: that call waited %.0fs for the store: this job logs nothing more to "
                          "it (its outputs are written as usual; rebuild it to log them)", self.run_id, waited)
            return None

    return wrapper


#: A logging call that fails after this long waited out MLflow's HTTP retries (minutes for a
#: server that is down): the job's later calls are skipped (`JobTracker.down`), not each waited out.
STORE_DOWN_SECONDS = 60.0


class JobTracker:
    """What a job logs to its MLflow run: thin wrappers over mlflow that log a failure instead of
    raising it (`_best_effort`)."""

    def __init__(self, client, run_id: str):
        self.client, self.run_id = client, run_id
        self.failures: list[str] = []
        #: a call waited out the store's retries and failed: the job's later calls are skipped
        self.down = False

    @_best_effort
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        import math

        ts = int(time.time() * 1000)
        from mlflow.entities import Metric

        items = [Metric(metric_key(k), float(v), ts, step or 0) for k, v in metrics.items()
                 if isinstance(v, (int, float)) and math.isfinite(float(v))]
        if items:
            _retry(self.client.log_batch, self.run_id, metrics=items)

    @_best_effort
    def log_config(self, config: Mapping[str, Any]) -> None:
        """The job's resolved config, as an artifact and (flattened) as the run's params."""
        from mlflow.entities import Param

        _retry(self.client.log_dict, self.run_id, dict(config), "config.resolved.json")
        params = flatten(config)
        _retry(self.client.log_batch, self.run_id, params=[Param(k, v) for k, v in params.items()])  # 100 a call

    @_best_effort
    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        _retry(self.client.log_batch, self.run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])

    @_best_effort
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        _retry(self.client.log_artifact, self.run_id, str(path), artifact_path)

    @_best_effort
    def log_table(self, path: str | Path, name: str, context: str = "output") -> None:
        """A Parquet table: as an MLflow dataset input (schema, digest, source) and an artifact."""
        import mlflow
        import polars as pl
        from mlflow.entities import DatasetInput, InputTag

        path = Path(path)
        ds = mlflow.data.from_polars(pl.read_parquet(path), source=str(path.resolve()), name=name)
        inp = DatasetInput(ds._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", context)])
        _retry(self.client.log_inputs, self.run_id, [inp])
        self.log_artifact(path, "tables")

    @_best_effort
    def log_checkpoint(self, path: str | Path, name: str = "checkpoint") -> None:
        """A model directory by reference (its path, size and files), never copied: no doubled disk use."""
        path = Path(path).resolve()
        files = sorted(p for p in path.rglob("*") if p.is_file())
        info = {"path": str(path), "bytes": sum(p.stat().st_size for p in files),
                "files": [str(p.relative_to(path)) for p in files]}
        self.set_tags({f"fastslow.{name}": str(path)})
        _retry(self.client.log_dict, self.run_id, info, f"{name}.json")


def _store(uri: str) -> str:
    """A tracking URI as a store: a sqlite file by its absolute path (`sqlite:///results/mlflow.db`,
    relative to the working directory, is the store `tracking_uri` names `sqlite:////<abs>/results/mlflow.db`)."""
    if uri.startswith("sqlite:///"):
        return f"sqlite:///{Path(uri.removeprefix('sqlite:///')).resolve()}"
    return uri


#: Set to 1 where a cluster's jobs may share the embedded SQLite store: they all run on one node.
ENV_SQLITE_ON_CLUSTER = "FASTSLOW_SQLITE_ON_CLUSTER"


def cluster_store_error(executor: str, uri: str) -> str | None:
    """One line if jobs that Snakemake's `executor` (not the local one) runs on a cluster's nodes
    would all write the SQLite store `uri`: SQLite's locks do not hold over a network file
    system, and concurrent jobs failed ("database is locked", "disk I/O error") or corrupted
    every run's records. None for a server's URI, or with FASTSLOW_SQLITE_ON_CLUSTER=1."""
    if not uri.startswith("sqlite:") or os.environ.get(ENV_SQLITE_ON_CLUSTER, "") == "1":
        return None
    return (f"the {executor} executor runs jobs on the cluster's nodes, which must not share the SQLite store "
            f"{uri} (its locks do not hold over a network file system): start an MLflow server and export "
            "MLFLOW_TRACKING_URI (profiles/slurm/README.md, 'MLflow server for the cluster'), or set "
            f"{ENV_SQLITE_ON_CLUSTER}=1 if every job runs on one node")


def check_store(info: Mapping[str, Any], config: Mapping[str, Any], tracking_json: str | Path) -> None:
    """The tracking files pin the store and experiment they were made for (rules init_mlflow and
    init_tracking have no params: see workflow/rules/common.smk). A job asked to log elsewhere, by
    `MLFLOW_TRACKING_URI` or the config's `mlflow_experiment`, stops here in one line rather than
    log silently to the old store."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    made, exp = info["tracking_uri"], info["experiment"]
    want = config.get("mlflow_experiment") or exp
    folder = _tracking_folder(tracking_json)
    if env and _store(env) != _store(made):
        asked = f"MLFLOW_TRACKING_URI={env}"
    elif not env and _store(made) != _store(f"sqlite:///{folder.parent.resolve() / 'mlflow.db'}"):
        # a copied or moved project's files still name the old project's database
        asked = f"the embedded store of {folder.parent} (MLFLOW_TRACKING_URI is unset)"
    elif want != exp:
        asked = f"mlflow_experiment {want!r}"
    else:
        return
    raise RuntimeError(f"{tracking_json} was made for MLflow store {made}, experiment {exp!r}, but this run "
                       f"asks for {asked}: `{_remake_command(folder, want)}` "
                       f"remakes them for it (finished jobs stay up to date)")


def retarget(folder: str | Path, experiment: str | None = None) -> dict[str, Any]:
    """Remake the tracking files in `folder` (`<results>/mlflow`, made by rules init_mlflow and
    init_tracking) for the store this process would log to (`MLFLOW_TRACKING_URI`, else the
    embedded default of `<results>`) and `experiment` (default: theirs): the experiment and each
    group's parent run there, found or created. The files stay where they are, and jobs read them
    as ancient inputs, so nothing finished re-runs; deleting them instead re-runs every job."""
    folder = Path(folder)
    made = json.loads((folder / "experiment.json").read_text())
    info = init_experiment(experiment or made["experiment"], folder / "experiment.json", folder.parent)
    for group_file in sorted((folder / "parents").glob("*.json")):
        init_parents(info, [group_file.stem], group_file)
    return info


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m fastslow.tracking", description=retarget.__doc__)
    ap.add_argument("folder", nargs="?", default="results/mlflow", help="the tracking files' folder")
    ap.add_argument("--experiment", help="MLflow experiment (default: the files' own)")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    if folder.is_file():
        ap.error(f"{args.folder} is a file: give the folder that holds experiment.json "
                 f"({folder.parent if folder.name == 'experiment.json' else '<results>/mlflow'})")
    if not folder.is_dir():
        ap.error(f"{args.folder}: no such folder (the tracking files are in <results>/mlflow)")
    if not (folder / "experiment.json").exists():
        ap.error(f"{args.folder}/experiment.json does not exist: the workflow makes it on its next run")
    info = retarget(folder, args.experiment)
    groups = sorted(p.stem for p in (folder / "parents").glob("*.json"))
    print(f"{args.folder}: MLflow store {info['tracking_uri']}, experiment {info['experiment']!r} "
          f"({info['experiment_id']}), parent runs of {', '.join(groups) or 'no group yet'}")
    return 0


@contextlib.contextmanager
def job_run(*, rule: str, wildcards: Mapping[str, str], config: Mapping[str, Any],
            tracking_json: str | Path, parent: str | None = None,
            extra_tags: Mapping[str, str] | None = None) -> Iterator[JobTracker]:
    """A child MLflow run for one workflow job; see the module docstring for its lifecycle."""
    info = json.loads(Path(tracking_json).read_text())
    check_store(info, config, tracking_json)
    client = _client(info["tracking_uri"])
    exp_id = info["experiment_id"]
    job_key = rule + "".join(f"/{k}={v}" for k, v in sorted(wildcards.items()))
    tags = {TAG_JOB: job_key, "fastslow.rule": rule, **git_tags(),
            **{f"wildcard.{k}": str(v) for k, v in wildcards.items()}, **(extra_tags or {})}
    if info.get("project"):
        tags[TAG_PROJECT] = info["project"]
    if parent and parent not in info["parents"]:
        raise ValueError(f"{tracking_json} holds the parent runs of {sorted(info['parents'])}, "
                         f"not of {parent!r}: the rule's tracking input is another group's")
    parent_id = info["parents"][parent] if parent else None
    if parent_id:
        tags["mlflow.parentRunId"] = parent_id
    previous = _search_mine(client, exp_id, info, f"tags.`{TAG_JOB}` = '{job_key}'", 50)
    for old in previous:  # a SIGKILLed job left its run RUNNING: close it as KILLED
        if old.info.status == "RUNNING":
            _retry(client.set_terminated, old.info.run_id, "KILLED")
    if previous:
        tags[TAG_PREVIOUS] = previous[0].info.run_id
    try:
        run = _retry(client.create_run, exp_id, run_name=job_key, tags=tags)
    except Exception as exc:  # noqa: BLE001 - MlflowException; the store's own error otherwise
        if "'active' state" in str(exc):
            raise RuntimeError(deleted_experiment(info["experiment"], exp_id, info["tracking_uri"])) from None
        if getattr(exc, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":  # the database reset or deleted
            raise RuntimeError(missing_experiment(info, tracking_json)) from None
        raise
    run_id = run.info.run_id
    tracker = JobTracker(client, run_id)
    if previous:  # a search for FINISHED runs must tell the replaced one from the current one
        with contextlib.suppress(Exception):  # best effort: the job's own run is what counts
            _retry(client.set_tag, previous[0].info.run_id, TAG_SUPERSEDED, run_id)

    def _on_signal(signum, frame):  # noqa: ARG001
        def close() -> None:
            with contextlib.suppress(Exception):
                _retry(client.set_terminated, run_id, "KILLED")
                closed.append(True)

        closed: list[bool] = []
        closer = threading.Thread(target=close, daemon=True)
        closer.start()
        closer.join(STOP_CLOSE_SECONDS)
        log.warning("stopped by %s: MLflow run %s %s", signal.Signals(signum).name, run_id,
                    "marked KILLED" if closed else f"left RUNNING (the store did not answer within "
                    f"{STOP_CLOSE_SECONDS:g} s; the job's next run closes it)")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    # A signal the job was started ignoring stays ignored: `nohup snakemake ...` (SIGHUP) must
    # survive the terminal closing, as a background job of a script survives Ctrl-C (SIGINT).
    old_handlers = {s: signal.signal(s, _on_signal) for s in STOP_SIGNALS
                    if signal.getsignal(s) != signal.SIG_IGN}
    try:
        # best effort, as all logging once the run is open, and under the stop handlers: a store
        # failing (or a stop signal) here failed the job and left its run RUNNING
        tracker.log_config(config)
        yield tracker
    except BaseException as exc:
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        tracker.set_tags({"fastslow.error": f"{type(exc).__name__}: {exc}"[:4000]})
        if not tracker.down:  # as at success: a store that is down would make the failing job wait it out again
            with contextlib.suppress(Exception):  # the job's own error is the one to raise
                _retry(client.set_terminated, run_id, status)
        raise
    else:
        # The job's work succeeded (its outputs are written): from here on a stop signal must not
        # turn it into a failure. Restoring the old handlers would let a Ctrl-C during the close
        # below or the interpreter's teardown (1-2 s after a torch job; CPython resets Python-level
        # handlers to SIG_DFL while it finalizes, so only SIG_IGN holds to the end) kill the
        # process by the signal, and Snakemake would delete the outputs of a run MLflow records
        # FINISHED. Every workflow script ends with its job's `with` block, so nothing is left to
        # interrupt but the exit itself.
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        old_handlers = {}
        if tracker.failures:
            tracker.set_tags({"fastslow.logging_failures": "; ".join(tracker.failures)})
        try:  # the outputs are written: a store that does not answer must not fail the job
            if tracker.down:
                raise ConnectionError("not asked: the store had stopped answering")
            _retry(client.set_terminated, run_id, "FINISHED")
        except Exception as exc:  # noqa: BLE001
            log.error("MLflow run %s (%s) could not be closed, it stays RUNNING in the store: %s: %s",
                      run_id, job_key, type(exc).__name__, str(exc)[:300])
        else:
            log.info("MLflow run %s finished (%s)%s", run_id, job_key,
                     f", {len(tracker.failures)} logging calls failed" if tracker.failures else "",
                     extra={"file_only": not tracker.failures})  # (jobs.FILE_ONLY: one a job, ids)
    finally:
        for s, h in old_handlers.items():
            signal.signal(s, h)


if __name__ == "__main__":
    raise SystemExit(main())
