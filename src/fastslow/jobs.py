"""Glue between a Snakemake `script:` and the library: logging to the rule's log, an MLflow run.

Scripts stay thin::

    from fastslow.jobs import snakemake_job
    with snakemake_job(snakemake) as tracker:
        ...  # call the library, write snakemake.output, tracker.log_*(...)

A job of one run passes its `RunSpec` (`snakemake_job(snakemake, run=spec)`) and logs that run's own
settings as its MLflow params (`run_settings`), not the global config every job receives.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastslow.io import LockedError, exception_chain, exclusive_lock
from fastslow.tracking import JobTracker, job_run

RUN_WILDCARDS = ("experiment", "method", "run")

#: The libraries whose versions decide a job's numbers, tagged on its MLflow run (`fastslow.versions`),
#: fastslow's own first (its code digests say which code ran; its version names the release).
VERSIONED_LIBRARIES = ("fastslow", "torch", "transformers", "trl", "gepa", "vllm", "reasoning-gym")


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _run_key(wildcards: dict[str, str]) -> str | None:
    """The key of the run a job belongs to (`RunSpec.key`), None for a job of no run."""
    return "/".join(wildcards[k] for k in RUN_WILDCARDS) if all(k in wildcards for k in RUN_WILDCARDS) else None


def job_label(rule: str, wildcards: dict[str, str]) -> str:
    """The job a console line comes from: its rule, its run's key and its other wildcards, e.g.
    `evaluate_point efficiency/fst/math-default-s0 point=cycle1 task=math`."""
    run = _run_key(wildcards) or ""
    rest = " ".join(f"{k}={v}" for k, v in wildcards.items() if not (run and k in RUN_WILDCARDS))
    return " ".join(part for part in (rule, run, rest) if part)


#: `log.info(..., extra=FILE_ONLY)`: a line for the job's log file, not the console (a long dump,
#: an id nobody watching needs).
FILE_ONLY = {"file_only": True}


class _Labelled(logging.Formatter):
    """The console's lines: the time of day and the job's label, on every line of a message (a
    table spans several, each told apart from another job's lines), the level from WARNING up.
    The job's log file keeps LOG_FORMAT (date, level, logger): a console line is short enough to
    read beside another job's."""

    def __init__(self, label: str) -> None:
        super().__init__(f"%(asctime)s [{label}] %(message)s", datefmt="%H:%M:%S")
        self.label = label

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.WARNING:
            text = text.replace(f" [{self.label}] ", f" {record.levelname} [{self.label}] ", 1)
        return text.replace("\n", f"\n[{self.label}] ")


def setup_logging(log_path: str | Path | None, label: str | None = None) -> None:
    """Send logging and stderr to the rule's log file, and keep progress visible on the console.
    Console lines carry the job's `label` (`job_label`): Snakemake runs jobs side by side, and
    their lines interleave there; the log file is the job's own and goes without."""
    console = logging.StreamHandler(sys.__stderr__)
    if label:
        console.setFormatter(_Labelled(label))
    console.addFilter(lambda record: not getattr(record, "file_only", False))
    handlers: list[logging.Handler] = [console]
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        fh = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives for the job
        sys.stderr = fh  # warnings and tracebacks of libraries land in the log too
        handlers.append(logging.StreamHandler(fh))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True, format=LOG_FORMAT)
    # MLflow's dataset-source and schema hints are not actionable for our Parquet tables.
    warnings.filterwarnings("ignore", module=r"mlflow\..*")
    # TRL's generation unwrap reads transformers' deprecated `is_gradient_checkpointing` at every
    # RL step; the FutureWarning is theirs to act on, not a user's.
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated",
                            category=FutureWarning)
    for noisy in ("urllib3", "httpx", "alembic", "mlflow", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run_settings(run: Any, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """What the MLflow run of a job of `run` (a `fastslow.experiments.RunSpec`) logs as its config,
    and its tags: the run's effective settings (`RunSpec.settings`: an ablation's k4 cycle logs
    fast.pool_size 4, a reuse run fast.reuse_rollouts true), its own definition under `run.*` in
    place of every experiment's, and tags naming the run. (Not imported here: a module this
    imports is part of every job's code, fastslow.provenance.)"""
    settings = run.settings(config)
    settings.pop("experiments", None)
    settings["run"] = {"key": run.key, "method": run.method, "variant": run.variant, "seed": run.seed,
                       "schedule": list(run.schedule), "init": run.init, "overrides": run.overrides}
    return settings, {"fastslow.variant": run.variant}


def library_versions() -> str:
    """The installed versions of `VERSIONED_LIBRARIES` (those installed), e.g. `torch==2.13.0
    transformers==5.23.0 ...`: two machines run the same params and code digests, so nothing
    reruns, yet a library's version can change what they compute."""
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for name in VERSIONED_LIBRARIES:
        with contextlib.suppress(PackageNotFoundError):
            found.append(f"{name}=={version(name)}")
    return " ".join(found)


@contextlib.contextmanager
def snakemake_job(smk: Any, parent: str | None = None, run: Any = None) -> Iterator[JobTracker]:
    """Logging + an MLflow child run for the job described by the `snakemake` object. A job of one
    run (wildcards experiment, method and run) is tagged with it (`fastslow.run`, `fastslow.method`);
    given that run's `RunSpec` as `run` (every such job's script does), it logs the run's settings
    (`run_settings`), else the global config. Every job is tagged with its libraries'
    versions (`library_versions`) and its threads."""
    wildcards = {k: str(v) for k, v in smk.wildcards.items()}
    log_path = smk.log[0] if len(smk.log) else None
    label = job_label(smk.rule, wildcards)
    with contextlib.ExitStack() as locked:
        try:  # before the log is set up: a second copy must not write into the running one's log
            locked.enter_context(job_lock(log_path, label))
        except LockedError as err:  # to the console, in one line
            raise SystemExit(f"job error: {err}") from None
        setup_logging(log_path, label)
        yield from _job(smk, wildcards, parent, run)


def _job(smk: Any, wildcards: dict[str, str], parent: str | None, run: Any) -> Iterator[JobTracker]:
    """The job's MLflow run (`_tracked_job`), and a full disk said in one line (`disk_full`)."""
    try:
        with _tracked_job(smk, wildcards, parent, run) as tracker:
            yield tracker
    except Exception as err:
        where = Path(smk.output[0]).parent if len(getattr(smk, "output", ())) else Path.cwd()
        problem = disk_full(err, where)
        if problem:  # to the console first: the log is likely on the disk that is full
            logging.getLogger("fastslow.jobs").error("%s", problem)
        raise


#: How a write that ran out of space reads: the OS's errors, and torch.save's own when its stream
#: fails (`inline_container.cc`: "unexpected pos", "basic_ios::clear"), which name nothing.
_DISK_FULL = ("No space left on device", "Disk quota exceeded", "unexpected pos ", "basic_ios::clear")


def disk_full(err: BaseException, where: str | Path) -> str | None:
    """One line if `err` (or an error it was raised from) is a write that found the disk full or a
    quota reached, naming `where` (the job's output directory) and the space free there now; None
    otherwise. The traceback says "No space left on device (os error 28)" in safetensors' or
    polars' words, or torch's "unexpected pos 704 vs 598", and no path."""
    import errno
    import re
    import shutil

    if re.search(r"\bfree (some )?space\b", str(err)):  # our own one line already says where (convert, cycle)
        return None
    for seen in exception_chain(err):
        if (isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT)) or \
                any(marker in str(seen) for marker in _DISK_FULL):
            probe = Path(where)  # the directory may not exist yet (or no more): its file system's
            while not probe.exists() and probe != probe.parent:
                probe = probe.parent
            try:
                free = f"{shutil.disk_usage(probe).free / 1024 ** 3:.2f} GiB free there now"
            except OSError:
                free = "its free space unknown"
            detail = " ".join(str(err).split())[:200]
            return (f"the disk is full (or a quota reached) under {where} ({free}): free some space or move "
                    f"results/ to a larger file system, then rerun; the write failed with {type(err).__name__}: "
                    f"{detail}")
    return None


def job_lock(log_path: str | Path | None, label: str) -> contextlib.AbstractContextManager[None]:
    """One process at a time per job: an exclusive lock beside its log (`<log>.lock`, removed when
    the job ends). A job left running by a killed Snakemake, beside its own rerun after
    `--unlock`, would write the same outputs: each `atomic_path` removes the other's temporaries
    as stale, and a directory output (the base model) could end as one copy's weights with the
    other's tokenizer, recorded as done. The second stops in one line naming the first (a cycle
    also locks its directory, `fastslow.cycle.run_cycle`). A job without a log (none of the
    workflow's) is not locked."""
    if not log_path:
        return contextlib.nullcontext()
    return exclusive_lock(Path(f"{log_path}.lock"), f"job {label}")


@contextlib.contextmanager
def _tracked_job(smk: Any, wildcards: dict[str, str], parent: str | None, run: Any) -> Iterator[JobTracker]:
    config, tags = dict(smk.config), {}
    run_key = _run_key(wildcards)
    if run_key:
        tags = {"fastslow.run": run_key, "fastslow.method": wildcards["method"]}
    if run is not None:
        if tags and tags["fastslow.run"] != run.key:
            raise ValueError(f"snakemake_job of run {tags['fastslow.run']!r} was given run {run.key!r}")
        config, run_tags = run_settings(run, smk.config)
        tags.update(run_tags)
    tags["fastslow.versions"] = library_versions()
    if len(smk.log):  # where a FAILED run's traceback is: its fastslow.error tag holds the error alone
        tags["fastslow.log"] = str(Path(smk.log[0]).absolute())
    if getattr(smk, "threads", None) is not None:
        tags["fastslow.threads"] = str(smk.threads)
    params = dict(smk.params.items())
    for name in ("code", "task_code"):  # the library's digest and its task's (fastslow.provenance)
        if params.get(name):
            tags[f"fastslow.{name}"] = params[name]
    with job_run(rule=smk.rule, wildcards=wildcards, config=config, tracking_json=smk.input.tracking,
                 parent=parent, extra_tags=tags or None) as tracker:
        yield tracker
