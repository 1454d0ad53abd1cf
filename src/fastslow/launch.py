"""Run a training entry point on the GPUs a job was given: in one process for at most one GPU,
through `accelerate launch` with a configured strategy for more.

Multi-GPU training is configured, not hand-rolled: the distributed set-up (process spawning, ranks,
rendezvous, FSDP2 / DeepSpeed ZeRO-3 / DDP) is accelerate's, read from a config file in
`profiles/slurm/accelerate/` (based on TRL's own accelerate configs); TRL's `GRPOTrainer` picks the
distributed state up from the environment accelerate sets. This module only builds the command:

    python -m accelerate.commands.launch --config_file profiles/slurm/accelerate/fsdp2.yaml \
        --num_processes 8 --num_machines 1 --machine_rank 0 --main_process_port 41234 \
        -m fastslow.slow.train --spec job.json

The training entry point is `fastslow.slow.train` (one slow cycle from a JSON job spec). The rule
`cycle` (workflow/scripts/cycle.py -> `fastslow.cycle.run_cycle(..., gpus=gpus_requested(
snakemake.resources))`) writes the spec, runs this command with `run` when the job has more than
one GPU (or FASTSLOW_TRAIN_PROCESSES > 1), reads the ranks' result back and logs it to MLflow;
with at most one GPU the slow cycle stays in the job's process. From a shell rule::

    shell: "python -m fastslow.launch --gpus {resources.gpu} -- fastslow.slow.train --spec {params.spec}"

`python` is the interpreter running this module, so SLURM jobs use the same virtual environment as
the workflow. Environment: FASTSLOW_ACCELERATE_CONFIG_DIR (a directory of such configs),
FASTSLOW_ACCELERATE_STRATEGY (fsdp2 | zero3 | ddp, default fsdp2). The RL loop and FST-distill
train with fsdp2 and ddp; they refuse zero3 (DeepSpeed steps the optimiser inside backward, our
loops step it themselves).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fastslow.tracking import STOP_SIGNALS

log = logging.getLogger("fastslow.launch")

STRATEGIES = {"fsdp2": "fsdp2.yaml", "zero3": "zero3.yaml", "ddp": "ddp.yaml"}
DEFAULT_STRATEGY = "fsdp2"
ENV_CONFIG_DIR = "FASTSLOW_ACCELERATE_CONFIG_DIR"
ENV_STRATEGY = "FASTSLOW_ACCELERATE_STRATEGY"
_REL_CONFIG_DIR = Path("profiles") / "slurm" / "accelerate"


def env_int(name: str, default: int | None = None, minimum: int = 1) -> int | None:
    """An integer environment variable (>= `minimum`), `default` when unset or empty; a bad value
    is a one-line error naming the variable and the value."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}") from None
    if n < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {n}")
    return n


def gpus_requested(resources: Mapping[str, Any] | Any) -> int:
    """GPUs a Snakemake job asked for: resource `gpu` (an int), else `gres` like 'gpu:4' or 'gpu:h100:4'."""
    get = resources.get if hasattr(resources, "get") else lambda k, d=None: getattr(resources, k, d)
    gpu = get("gpu", None)
    if gpu not in (None, ""):
        try:
            n = int(gpu)
        except (TypeError, ValueError):
            raise ValueError(f"resource gpu must be an integer, got {gpu!r}") from None
        if n < 0:
            raise ValueError(f"resource gpu must be >= 0, got {n}")
        return n
    for item in str(get("gres", "") or "").split(","):
        parts = item.strip().split(":")  # gpu | gpu:N | gpu:type | gpu:type:N
        if parts[0] == "gpu":
            return int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return 0


def visible_gpus(env: Mapping[str, str] | None = None) -> int | None:
    """GPUs this process may use according to CUDA_VISIBLE_DEVICES (set by SLURM), None if unset."""
    env = os.environ if env is None else env
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return len([d for d in value.split(",") if d.strip() and d.strip() != "-1"])


def config_dir(root: str | Path | None = None) -> Path:
    """Where the accelerate configs are: $FASTSLOW_ACCELERATE_CONFIG_DIR, else <root or cwd or the
    source checkout>/profiles/slurm/accelerate (Snakemake jobs run in the workflow directory)."""
    if os.environ.get(ENV_CONFIG_DIR):
        return Path(os.environ[ENV_CONFIG_DIR])
    candidates = [Path(root)] if root is not None else [Path.cwd(), Path(__file__).resolve().parents[2]]
    for base in candidates:
        if (base / _REL_CONFIG_DIR).is_dir():
            return base / _REL_CONFIG_DIR
    raise FileNotFoundError(f"no {_REL_CONFIG_DIR} under {', '.join(map(str, candidates))}; "
                            f"set {ENV_CONFIG_DIR}")


def accelerate_config(strategy: str | None = None, root: str | Path | None = None) -> Path:
    """The config file of a strategy (fsdp2 | zero3 | ddp; default $FASTSLOW_ACCELERATE_STRATEGY or fsdp2)."""
    source = "" if strategy else (f" (from ${ENV_STRATEGY})" if os.environ.get(ENV_STRATEGY) else "")
    strategy = strategy or os.environ.get(ENV_STRATEGY) or DEFAULT_STRATEGY
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown accelerate strategy {strategy!r}{source}: expected one of {sorted(STRATEGIES)}")
    folder = config_dir(root)
    path = folder / STRATEGIES[strategy]
    if not path.is_file():
        raise FileNotFoundError(f"no accelerate config {STRATEGIES[strategy]} for strategy {strategy!r} in {folder} "
                                f"(${ENV_CONFIG_DIR} chooses the folder)")
    return path


def check_training_strategy(strategy: str | None = None, root: str | Path | None = None) -> Path:
    """The accelerate config the slow loop's ranks will launch with, refused now if it is DeepSpeed
    (its engine steps the optimiser inside backward(); our loop steps it itself), so a cycle job
    stops before its fast round rather than in every rank after it."""
    from fastslow.io import read_yaml

    path = accelerate_config(strategy, root)
    kind = (read_yaml(path) or {}).get("distributed_type")
    if str(kind).upper() == "DEEPSPEED":
        raise ValueError(f"accelerate config {path} is DeepSpeed (distributed_type: {kind}), which the slow loop "
                         f"does not support: set {ENV_STRATEGY}=fsdp2 or ddp")
    return path


def strategy_settings(path: str | Path) -> dict[str, bool]:
    """What an accelerate config means for a cycle's memory: `sharded` (FSDP: weights, gradients
    and optimiser state split over the ranks) and `bf16` (mixed precision bf16; a launch on a
    machine without GPUs turns it off, and `fastslow.slow.distill.device_memory_check` then makes
    no check)."""
    from fastslow.io import read_yaml

    settings = read_yaml(path) or {}
    return {"sharded": str(settings.get("distributed_type")).upper() == "FSDP",
            "bf16": str(settings.get("mixed_precision")).lower() == "bf16"}


def build_command(module: str, args: Sequence[str] = (), *, gpus: int, strategy: str | None = None,
                  config_file: str | Path | None = None, port: int | None = None,
                  python: str | None = None, accelerate_args: Sequence[str] = ()) -> list[str]:
    """The argv that runs `python -m <module> <args>` on `gpus` GPUs of this node.

    gpus <= 1: the module directly. gpus > 1: `accelerate launch` with the strategy's config file
    (or `config_file`), one process per GPU, one machine, and a rendezvous port (`port`, else 0:
    accelerate picks a free one as it launches, where its default 29500 would collide between jobs
    sharing a node). `accelerate_args` go to `accelerate launch` before the module (e.g. ['--mixed_precision', 'no']).
    """
    if not re.fullmatch(r"[A-Za-z_][\w.]*", module):
        raise ValueError(f"not a module name: {module!r}")
    if gpus < 0:
        raise ValueError(f"gpus must be >= 0, got {gpus}")
    python = python or sys.executable
    args = [str(a) for a in args]
    if gpus <= 1:
        return [python, "-m", module, *args]
    config = Path(config_file) if config_file is not None else accelerate_config(strategy)
    return [python, "-m", "accelerate.commands.launch",
            "--config_file", str(config),
            "--num_processes", str(gpus),
            "--num_machines", "1",
            "--machine_rank", "0",
            "--main_process_port", str(port if port is not None else 0),
            *map(str, accelerate_args),
            "-m", module, *args]


#: Run first in `run`'s child: on Linux its parent's death (SIGKILL, the OOM killer) sends it
#: SIGTERM (PR_SET_PDEATHSIG, kept across exec), which accelerate's launcher passes on to its
#: ranks; a parent already gone by then ends it at once. Then it becomes the command.
_WITH_PARENT = ("import ctypes, os, signal, sys\n"
                "if sys.platform.startswith('linux'):\n"
                "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
                "    if os.getppid() != int(sys.argv[1]):\n"
                "        sys.exit(1)\n"
                "os.execvp(sys.argv[2], sys.argv[2:])\n")


def run(command: Sequence[str], *, env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None, stdout: Any = None, stderr: Any = None,
        before_stop: Callable[[], None] | None = None) -> None:
    """Run `command`, forwarding SIGTERM/SIGINT/SIGHUP (SLURM's time limit, scancel, Ctrl-C, the
    terminal closing) to its whole process group so no rank outlives the job; raise
    CalledProcessError on a non-zero exit. `stdout` and `stderr` are Popen's (e.g. the rule's log
    file; default: inherited). A forwarded signal is then passed on to the handler this replaced
    (the MLflow run's, which ends it KILLED), not reported as the ranks' non-zero exit. A signal
    the job ignores (SIGHUP under nohup) stays ignored. A job killed outright (SIGKILL, out of
    memory) cannot forward anything: its ranks get SIGTERM from the kernel (`_WITH_PARENT`).
    `before_stop` runs once the ranks have stopped on a forwarded signal, before that handler
    (the cycle logs the steps its ranks finished: `fastslow.cycle.launch_slow`)."""
    if stdout is not None or stderr is not None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # our own lines before the ranks'
    if shutil.which(command[0], path=(env or os.environ).get("PATH")) is None:  # as Popen would say
        raise FileNotFoundError(errno.ENOENT, "no such command", command[0])
    proc = subprocess.Popen([sys.executable, "-c", _WITH_PARENT, str(os.getpid()), *command],
                            env=None if env is None else dict(env), cwd=cwd,
                            start_new_session=True, stdout=stdout, stderr=stderr)

    received: list[int] = []

    def forward(signum, frame):  # noqa: ARG001
        received.append(signum)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in STOP_SIGNALS if signal.getsignal(s) != signal.SIG_IGN}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        stop_process_group(proc)  # interrupted while waiting: do not leave the ranks behind
    if received:  # the job was told to stop: stop it as the replaced handler would have
        signum = received[0]
        if before_stop is not None:
            try:
                before_stop()
            except Exception:  # noqa: BLE001 - the stop goes on whatever the callback does
                log.exception("stopping the ranks: the callback before the stop failed")
        handler = old[signum]
        if callable(handler):
            handler(signum, None)  # job_run's: KILLED, then the default action; SIGINT's: KeyboardInterrupt
        elif handler == signal.SIG_DFL:
            signal.raise_signal(signum)
    if rc != 0:
        raise subprocess.CalledProcessError(rc, list(command))


def stop_process_group(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM the process group of `proc` (started with start_new_session=True), SIGKILL it
    after `grace` seconds; nothing if it has already exited."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def launch(module: str, args: Sequence[str] = (), *, gpus: int, strategy: str | None = None,
           config_file: str | Path | None = None, env: Mapping[str, str] | None = None,
           cwd: str | Path | None = None, accelerate_args: Sequence[str] = ()) -> list[str]:
    """Build the command for `gpus` GPUs and run it (see `build_command`, `run`); return the argv."""
    visible = visible_gpus(env if env is not None else os.environ)
    if gpus > 1 and visible is not None and visible < gpus:
        raise RuntimeError(f"{gpus} GPUs requested but CUDA_VISIBLE_DEVICES shows {visible}")
    command = build_command(module, args, gpus=gpus, strategy=strategy, config_file=config_file,
                            accelerate_args=accelerate_args)
    print("fastslow.launch:", shlex.join(command), file=sys.stderr, flush=True)
    run(command, env=env, cwd=cwd)
    return command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fastslow.launch",
        description="Run `python -m MODULE ARGS` on N GPUs: directly for N <= 1, through "
                    "`accelerate launch` (profiles/slurm/accelerate/<strategy>.yaml) for N > 1.")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs of this job (default: CUDA_VISIBLE_DEVICES count, else 0)")
    parser.add_argument("--strategy", choices=sorted(STRATEGIES), default=None,
                        help=f"accelerate config (default ${ENV_STRATEGY} or {DEFAULT_STRATEGY})")
    parser.add_argument("--config-file", default=None, help="an accelerate config file instead")
    parser.add_argument("--print", dest="dry", action="store_true", help="print the command, do not run it")
    parser.add_argument("module", help="module to run, e.g. fastslow.slow.train")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    ns = parser.parse_args(argv)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    if ns.config_file is not None and not Path(ns.config_file).is_file():
        parser.error(f"--config-file: no such file {ns.config_file!r}")
    try:  # a bad value is one line naming it (argparse's usage line and exit status 2), no traceback
        gpus = ns.gpus if ns.gpus is not None else (visible_gpus() or 0)
        if ns.dry:
            print(shlex.join(build_command(ns.module, args, gpus=gpus, strategy=ns.strategy,
                                           config_file=ns.config_file)))
            return 0
        launch(ns.module, args, gpus=gpus, strategy=ns.strategy, config_file=ns.config_file)
    except subprocess.CalledProcessError as err:
        return err.returncode if err.returncode > 0 else 128 - err.returncode
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        parser.error(str(err))
    return 0


if __name__ == "__main__":
    sys.exit(main())
