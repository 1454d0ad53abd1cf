"""Experiments → runs: the config's `experiments:` section expanded into concrete run specs.

A run is identified by its path `results/runs/<experiment>/<method>/<run>/` where
`<run> = <tasks>-<variant>-s<seed>` (tasks joined by '.' for a continual sequence, and
`<init>` prefixed for a run that starts from another run's final weights). A method is data:

| method        | fast round (GEPA) | slow steps (CISPO) | context at train/eval time          |
|---------------|-------------------|--------------------|-------------------------------------|
| `rl`          | no                | yes                | the seed context (K = 1)            |
| `fst`         | yes               | yes                | the pool (K contexts)               |
| `gepa`        | yes               | no (frozen θ)      | the pool                            |
| `fst_distill` | yes               | yes, distilled     | trained with the pool's best context|
|               |                   |                    | distilled away (seed context)       |
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

METHODS = ("rl", "fst", "gepa", "fst_distill")
TRAINS = {"rl": True, "fst": True, "gepa": False, "fst_distill": True}
FAST = {"rl": False, "fst": True, "gepa": True, "fst_distill": True}
_SAFE = re.compile(r"^[A-Za-z0-9_]+$")


@dataclass(frozen=True)
class RunSpec:
    experiment: str
    method: str
    name: str
    schedule: tuple[str, ...]  # the training task of each cycle
    seed: int
    variant: str = "default"
    overrides: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    init: str | None = None  # "<experiment>/<method>/<run>" whose final weights start this run
    eval_tasks: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.experiment}/{self.method}/{self.name}"

    @property
    def cycles(self) -> int:
        return len(self.schedule)

    @property
    def trains(self) -> bool:
        return TRAINS[self.method]

    @property
    def fast(self) -> bool:
        return FAST[self.method]

    def settings(self, config: dict[str, Any]) -> dict[str, Any]:
        """The run's effective config: global config with the variant's overrides applied."""
        from fastslow.config import deep_update

        cfg = copy.deepcopy(config)
        deep_update(cfg, self.overrides)
        if self.method == "rl":
            cfg["fast"]["pool_size"] = 1  # RL-only: the seed context alone
        return cfg


def _err(msg: str) -> Exception:
    from fastslow.config import ConfigError

    return ConfigError(f"config error: {msg}")


def expand(config: dict[str, Any]) -> dict[str, RunSpec]:
    """All runs of all experiments, keyed by `RunSpec.key`. Validates as it goes."""
    runs: dict[str, RunSpec] = {}
    for exp_name, exp in config.get("experiments", {}).items():
        where = f"experiments.{exp_name}"
        if not _SAFE.match(exp_name):
            raise _err(f"{where}: experiment names use letters, digits and '_' only")
        seq = exp.get("sequence")
        if seq is not None:
            if not seq:
                raise _err(f"{where}.sequence: expected a non-empty list of tasks, got []")
            schedules = [tuple(t for t in seq for _ in range(exp["cycles_per_stage"]))]
            eval_tasks = tuple(dict.fromkeys(seq))
        else:
            tasks = exp.get("tasks") or []
            if not tasks:
                raise _err(f"{where}.tasks: expected a non-empty list of tasks (or a 'sequence'), got {tasks!r}")
            schedules = [(t,) * exp["cycles"] for t in tasks]
            eval_tasks = ()
        inits: list[str | None] = [None]
        if "init" in exp:
            src = exp["init"]
            inits = [None] if src.get("include_base", True) else []
            src_runs = [r for r in runs.values() if r.experiment == src["experiment"]
                        and r.method in src.get("methods", METHODS)
                        and r.schedule[-1] in src.get("tasks", [r.schedule[-1]])
                        and r.variant == "default"]
            if not src_runs:
                raise _err(f"{where}.init.experiment: no default-variant runs of {src['experiment']!r} "
                           f"match (define it before {exp_name!r})")
            inits += [r.key for r in src_runs]
        variants = exp.get("variants") or {"default": {}}
        for method in exp["methods"]:
            for variant, overrides in variants.items():
                if not _SAFE.match(variant):
                    raise _err(f"{where}.variants.{variant}: variant names use letters, digits and '_' only")
                for seed in exp.get("seeds", [0]):
                    for schedule in schedules:
                        for init in inits:
                            stem = ".".join(dict.fromkeys(schedule))
                            prefix = "" if init is None else "from_" + init.replace("/", "_") + "-"
                            name = f"{prefix}{stem}-{variant}-s{seed}"
                            spec = RunSpec(exp_name, method, name, schedule, seed, variant,
                                           overrides, init, eval_tasks or (schedule[0],))
                            runs[spec.key] = spec
    return runs


def check_experiments(config: dict[str, Any]) -> None:
    """Cross-field checks of the experiments (called by config validation)."""
    from fastslow.config import validate_config

    known = set(config["data"]["tasks"])
    for key, run in expand(config).items():
        for task in (*run.schedule, *run.eval_tasks):
            if task not in known:
                raise _err(f"experiments.{run.experiment}: task {task!r} of run {key} is not in data.tasks "
                           f"({', '.join(sorted(known))})")
        if run.variant != "default":  # a variant's overrides must make a valid config too
            cfg = run.settings(config)
            cfg["experiments"] = {}
            try:
                validate_config(cfg)
            except ValueError as exc:
                detail = str(exc).removeprefix("config error: ")
                raise _err(f"experiments.{run.experiment}.variants.{run.variant}: {detail}") from None
