"""The slow cycle as its own program: ``python -m fastslow.slow.train --spec job.json``.

A training job with several GPUs runs the slow part of a cycle in processes started by
`accelerate launch` (`fastslow.launch`), not in the Snakemake job's own process. Those ranks get
everything they need from one JSON job spec written by the caller (`write_spec`; `fastslow.cycle`
does it): the weights to start from, the previous cycle's directory, the pool's contexts, how to
rebuild the task, the training-set file, the `SlowConfig`, where to write, the run id and cycle,
the method (rl / fst: CISPO `fastslow.slow.loop.run_cycle`; fst_distill:
`fastslow.slow.distill.run_distill_cycle`) and its extra arguments
(`new_data`, `student_context`). Every rank runs the same cycle on its share of the rows; the main
process writes the cycle directory and a result JSON (global step, the per-step metrics) that the
caller reads back with `read_result`.

Tracking stays with the caller: these processes never open an MLflow run (one run per Snakemake
job, and N ranks must not log N copies); the caller logs the returned metrics. The main process
also appends each step's metrics to `<out_dir>.steps.jsonl` as the step ends (`StepLog`): ranks
that fail or are stopped before their result leave the steps they finished there, for the caller
to log.

The task is rebuilt either from the experiment config (``{"name": ..., "config": {"data": ...}}``,
through `fastslow.config.make_task`, as the in-process path does) or, for tasks outside the
registry (tests), from an importable class (``{"class": "package.module:Name", "options": {}}``).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fastslow.slow.trainer import process_rank, world_size

SPEC_VERSION = 1
METHODS = ("rl", "fst", "fst_distill")
#: metrics-table columns that identify a step rather than measure it (not sent to the tracker)
ID_COLUMNS = ("run", "cycle", "step", "step_in_cycle", "num_contexts")

log = logging.getLogger("fastslow.slow.train")


def write_spec(path: str | Path, *, method: str, init_model: str | Path, prev_dir: str | Path | None,
               contexts: Sequence[tuple[str, str]], task: Mapping[str, Any], train_file: str | Path,
               slow: Mapping[str, Any], out_dir: str | Path, run_id: str, cycle: int,
               extra: Mapping[str, Any] | None = None, result: str | Path | None = None) -> Path:
    """Write a job spec for `main` (atomically); `result` defaults to <out_dir>.result.json."""
    from fastslow.io import write_json

    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: expected one of {', '.join(METHODS)}")
    out_dir = Path(out_dir)
    spec = {
        "version": SPEC_VERSION, "method": method, "init_model": str(init_model),
        "prev_dir": None if prev_dir is None else str(prev_dir),
        "contexts": [[cid, text] for cid, text in contexts], "task": dict(task),
        "train_file": str(train_file), "slow": dict(slow), "out_dir": str(out_dir),
        "run_id": run_id, "cycle": int(cycle), "extra": encode_extra(extra),
        "result": str(result) if result is not None else str(default_result_path(out_dir)),
    }
    return write_json(spec, path)


def encode_extra(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """The extra arguments as JSON: `round_rollouts` (keyed by (context hash, problem id)
    tuples) becomes a list of {"context_hash", "problem_id", "rollouts"}."""
    out = dict(extra or {})
    if out.get("round_rollouts"):
        out["round_rollouts"] = [{"context_hash": h, "problem_id": pid, "rollouts": [dict(r) for r in rs]}
                                 for (h, pid), rs in out["round_rollouts"].items()]
    return out


def decode_extra(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """`encode_extra` undone."""
    out = dict(extra or {})
    if out.get("round_rollouts"):
        out["round_rollouts"] = {(e["context_hash"], e["problem_id"]): e["rollouts"]
                                 for e in out["round_rollouts"]}
    return out


class StepLog:
    """Rank 0's tracker under `accelerate launch`: each step's metrics (the loop's
    `log_metrics(dict, step)`) appended to a JSON-lines file as the step ends, so that the job's
    parent logs the steps that finished when the ranks fail or are stopped before their result
    (`read_steps`; `fastslow.cycle.launch_slow`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": int(step), "metrics": dict(metrics)}) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_steps(path: str | Path) -> list[dict[str, Any]]:
    """What `StepLog` wrote ({"step", "metrics"} per finished step; none without the file). A
    line the ranks were killed while writing is left out."""
    rows = []
    with contextlib.suppress(FileNotFoundError):
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    return rows


def default_steps_path(out_dir: str | Path) -> Path:
    """Beside the cycle directory, as the result (`default_result_path`)."""
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + ".steps.jsonl")


def default_result_path(out_dir: str | Path) -> Path:
    """Beside the cycle directory (which is replaced whole by the cycle)."""
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + ".result.json")


def error_path(result_path: str | Path, rank: int) -> Path:
    """Where rank `rank` records the error it stopped on, beside the result (`record_error`)."""
    result_path = Path(result_path)
    return result_path.with_name(f"{result_path.name}.rank{rank}.error")


def record_error(result_path: str | Path, rank: int, err: BaseException) -> None:
    """Rank `rank`'s error in one line (`Type: message`), for the job that launched the ranks to
    name it (`read_errors`): its traceback is in the job's log, among every rank's output and the
    launcher's report. Best effort: a rank that cannot write it (a full disk) fails as it would."""
    line = " ".join(f"{type(err).__name__}: {err}".split())
    with contextlib.suppress(OSError):
        from fastslow.io import atomic_path

        with atomic_path(error_path(result_path, rank)) as tmp:
            # a path's undecodable bytes (surrogates, in a message naming it) as \udcxx, not an encode error
            tmp.write_text(line[:1000] + "\n", encoding="utf-8", errors="backslashreplace")


def _error_files(result_path: str | Path) -> list[Path]:
    """The files `record_error` wrote beside `result_path` (`error_path`'s, of any rank)."""
    return list(Path(result_path).parent.glob(f"{glob.escape(Path(result_path).name)}.rank*.error"))


def clear_errors(result_path: str | Path) -> None:
    """Remove the ranks' error records of an earlier attempt (`record_error`)."""
    for path in _error_files(result_path):
        path.unlink(missing_ok=True)


def read_errors(result_path: str | Path) -> list[tuple[int, str]]:
    """(rank, error line) of the ranks that recorded one (`record_error`), the first written
    first: a rank's own failure comes before the others' failing on its broken collective."""
    found = []
    for path in _error_files(result_path):
        with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
            rank = int(path.name.rsplit(".rank", 1)[1].removesuffix(".error"))
            found.append((path.stat().st_mtime_ns, rank, path.read_text(encoding="utf-8").strip()))
    return [(rank, line) for _, rank, line in sorted(found)]


def read_spec(path: str | Path) -> dict[str, Any]:
    """A job spec, checked for the keys `run_job` needs (one-line error naming the file)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read job spec ({getattr(err, 'strerror', None) or err})") from err
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON in job spec ({err})") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: job spec must be a JSON object, got {type(spec).__name__}")
    if spec.get("version") != SPEC_VERSION:
        raise ValueError(f"{path}: job spec version {spec.get('version')!r}, expected {SPEC_VERSION}")
    missing = [k for k in ("method", "init_model", "prev_dir", "contexts", "task", "train_file", "slow",
                           "out_dir", "run_id", "cycle", "result") if k not in spec]
    if missing:
        raise ValueError(f"{path}: job spec lacks {', '.join(missing)}")
    if spec["method"] not in METHODS:
        raise ValueError(f"{path}: unknown method {spec['method']!r}: expected one of {', '.join(METHODS)}")
    return spec


def build_task(task: Mapping[str, Any]) -> Any:
    """The `Task` of a job spec: {"name", "config"} via `make_task`, or {"class", "options"}."""
    if "class" in task:
        module, _, name = str(task["class"]).partition(":")
        if not module or not name:
            raise ValueError(f"task class must be 'package.module:Name', got {task['class']!r}")
        return getattr(importlib.import_module(module), name)(**task.get("options", {}))
    if "name" in task:
        from fastslow.config import make_task

        return make_task(task.get("config", {"data": {"source": "offline"}}), task["name"])
    raise ValueError(f"job spec task needs 'name' (+ 'config') or 'class', got keys {sorted(task)}")


def run_job(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Run the slow cycle of `spec` in this process (one rank of N); the main process writes the
    result JSON. Returns the result (on every rank)."""
    from fastslow.slow.config import SlowConfig
    from fastslow.tasks.data import load_problems

    cfg = SlowConfig.from_dict(dict(spec["slow"]))
    if spec["method"] == "fst_distill":
        from fastslow.slow.distill import run_distill_cycle as slow_cycle
    else:
        from fastslow.slow.loop import run_cycle as slow_cycle
    contexts = [(str(cid), str(text)) for cid, text in spec["contexts"]]
    result = slow_cycle(Path(spec["init_model"]), None if spec["prev_dir"] is None else Path(spec["prev_dir"]),
                        contexts, build_task(spec["task"]), load_problems(spec["train_file"]), cfg,
                        Path(spec["out_dir"]), run_id=spec["run_id"], cycle=int(spec["cycle"]),
                        tracker=StepLog(default_steps_path(spec["out_dir"])) if process_rank() == 0 else None,
                        **decode_extra(spec.get("extra")))
    out = {"out_dir": str(result.out_dir), "global_step": result.global_step,
           "metrics": result.metrics, "num_processes": world_size()}
    if process_rank() == 0:
        from fastslow.io import write_json

        write_json(out, spec["result"])
    return out


def read_result(path: str | Path) -> dict[str, Any]:
    """The result JSON a finished job wrote (a NaN metric, e.g. kl_to_base at beta=0, is null here:
    `write_json` writes standard JSON, and `log_result` leaves nulls out)."""
    return json.loads(Path(path).read_text())


def log_result(result: Mapping[str, Any], tracker: Any) -> None:
    """Send a job's per-step metrics to `tracker` as the in-process loop does ("slow/<name>")."""
    if tracker is None:
        return
    for row in result["metrics"]:
        tracker.log_metrics({f"slow/{k}": v for k, v in row.items()
                             if k not in ID_COLUMNS and isinstance(v, (int, float))},
                            step=int(row["step"]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastslow.slow.train",
                                     description="Run one slow cycle from a JSON job spec (one rank "
                                                 "of `accelerate launch`, or alone).")
    parser.add_argument("--spec", required=True, help="the job spec (fastslow.slow.train.write_spec)")
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if process_rank() == 0 else logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s rank{process_rank()} %(levelname)s %(name)s: %(message)s")
    try:
        spec = read_spec(ns.spec)
    except ValueError as err:  # the promised one-line error naming the file, no traceback
        print(f"error: {err}", file=sys.stderr)
        return 2
    ok = False
    try:
        run_job(spec)
        ok = True
    except Exception as err:  # a stop signal is no error of the rank's: the job was stopped
        record_error(spec["result"], process_rank(), err)
        raise
    finally:
        _destroy_process_group(barrier=ok)
    return 0


def _destroy_process_group(barrier: bool) -> None:
    """Leave torch.distributed cleanly (an un-destroyed gloo/NCCL group can abort at exit); no
    barrier after a failure, where the other ranks may never arrive (the launcher stops them)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if barrier:
            dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
