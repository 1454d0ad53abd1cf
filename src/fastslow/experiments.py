"""Experiments → runs: the config's `experiments:` section expanded into concrete run specs.

A run is identified by its path `results/runs/<experiment>/<method>/<run>/` where
`<run> = <tasks>-<variant>-s<seed>` (tasks joined by '.' for a continual sequence, and
`<init>` prefixed for a run that starts from another run's final weights). A run that would
train exactly like an earlier run (of an earlier experiment, or an earlier variant of its own:
same method, tasks, seed, initial weights, the settings its method reads, and evaluation
points) is not trained twice: it is *shared*, its files are the earlier
run's (`RunSpec.shared`), and the later experiment's curves read them under its own
experiment/variant labels, with the earlier run's id. A method is data:

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
import logging
import re
from dataclasses import dataclass, field, replace
from typing import Any

log = logging.getLogger(__name__)
METHODS = ("rl", "fst", "gepa", "fst_distill")
TRAINS = {"rl": True, "fst": True, "gepa": False, "fst_distill": True}
FAST = {"rl": False, "fst": True, "gepa": True, "fst_distill": True}
#: The Snakemake rule that runs a method's cycles (workflow/rules/train.smk): CISPO RL steps after
#: the round (or none), distillation steps, or the round alone on frozen weights.
CYCLE_RULE = {"rl": "cycle", "fst": "cycle", "gepa": "cycle_frozen", "fst_distill": "cycle_distill"}


def methods_of_rule(rule: str) -> str:
    """The `method` wildcard's pattern of a cycle rule: the methods `CYCLE_RULE` gives it."""
    return "|".join(m for m in METHODS if CYCLE_RULE[m] == rule)
_SAFE = re.compile(r"^[A-Za-z0-9_]+$")
#: Cycles of a `tasks` experiment's runs and per task of a `sequence` experiment's run, when left
#: out. Not schema defaults: filled into every experiment, each would be the other kind's key,
#: which `expand` refuses (the kind of experiment that does not read it ignored it).
CYCLES, CYCLES_PER_STAGE = 4, 2
#: What a method's cycle reads of a section it has no use for (`fastslow.cycle.run_cycle`): its
#: cycle job's params keep only these keys of it (`RunSpec.cycle_params`), so a setting the cycle
#: never reads retrains nothing. rl has no fast round: of `fast` it reads pool_size alone (always 1,
#: `RunSpec.settings`, which also sets its slow.baseline: with one context either is one group of
#: G). gepa trains nothing: of `slow` it reads steps_per_cycle alone (the step
#: its metrics and cycle.json are filed at; slow.num_generations // K is handed to the round,
#: which uses it only for the RL step's problems fst's reuse_in_slow gives it).
#: fst_distill's slow steps distil by reverse KL (`fastslow.slow.distill`): of `slow` they read
#: neither CISPO's knobs (beta, epsilon_high, baseline, scale_rewards) nor the vLLM settings (they
#: sample with transformers' generate) nor steps_per_generation; its cycle builds its SlowConfig
#: from these keys alone, the others at their defaults.
#: tests/test_workflow.py runs each cycle with the other keys poisoned.
CYCLE_READS: dict[str, dict[str, tuple[str, ...]]] = {
    # nor any `generation` key (the round's sampling) or model.dtype (the round's sampling dtype):
    # its RL steps sample with `slow`'s settings and train fp32 master weights (through the
    # model's chat template, with model.chat_template_kwargs)
    "rl": {"fast": ("pool_size",), "generation": (), "model": ("base", "chat_template_kwargs")},
    "gepa": {"slow": ("steps_per_cycle",)},
    "fst_distill": {"slow": ("lr", "warmup_steps", "num_generations", "problems_per_step", "steps_per_cycle",
                             "max_new_tokens", "temperature", "top_p", "micro_batch_size", "max_grad_norm",
                             "weight_decay", "adam_beta1", "adam_beta2", "activation_checkpointing", "bf16")},
}
#: What a method's cycle never reads of a section it otherwise reads whole: its params leave these
#: out, and its cycle builds its FastConfig without them. The RL steps' rollout reuse is FST's
#: (`fastslow.cycle`: a GEPA-only cycle writes no rollouts to reuse, and only an fst cycle's
#: round samples for its RL steps).
CYCLE_SKIPS: dict[str, dict[str, tuple[str, ...]]] = {
    "gepa": {"fast": ("reuse_rollouts", "reuse_in_slow", "reuse_steps")},
    "fst_distill": {"fast": ("reuse_in_slow", "reuse_steps")},
}
#: The reflection model (`fast.reflection`) is read by the `reflective` proposer alone: with the
#: offline `feedback_editor` a cycle's params leave it out too (`cycle_section`), and with the
#: reflective proposer the feedback editor's limits.
REFLECTIVE, FEEDBACK_EDITOR = "reflective", "feedback_editor"
FEEDBACK_EDITOR_KEYS = ("max_demos", "max_rules", "max_demo_chars")
#: Keys a cycle reads only while a switch of their section is on: its params (and its reading)
#: leave them out otherwise, so changing one retrains nothing it cannot change (vLLM's sleep mode
#: without vLLM; how many RL steps train on the round's rollouts without `reuse_in_slow`).
READ_ONLY_WITH = {"slow": {"vllm_enable_sleep_mode": "use_vllm"}, "fast": {"reuse_steps": "reuse_in_slow"}}
#: Reflection settings an `hf` reflection model never reads (it generates in the cycle's process)
HF_REFLECTION_SKIPS = ("timeout_s",)


@dataclass(frozen=True)
class RunSpec:
    """One run: a method trained (or, for gepa, searched) for `len(schedule)` cycles.

    `expand(config)` makes every run of the config's experiments, keyed `experiment/method/name`
    (the workflow's names, e.g. `expand(cfg)["efficiency/fst/math-default-s0"]`). From a script,
    `RunSpec(experiment="nb", method="fst", name="math-s0", schedule=("math",) * 2, seed=0)` is a
    two-cycle FST run on math; `fastslow.cycle.run_cycle` runs its cycles one by one.
    """

    experiment: str
    method: str
    name: str
    schedule: tuple[str, ...]  # the training task of each cycle
    seed: int
    variant: str = "default"
    overrides: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    init: str | None = None  # "<experiment>/<method>/<run>" whose final weights start this run
    eval_tasks: tuple[str, ...] = ()
    eval_init: bool = True  # evaluate the initial weights too (the curve's step-0 point)
    eval_every: int = 1  # evaluate after every N-th cycle (and always after the last)
    shared: str | None = None  # key of the earlier, identical run whose files this run reads

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"RunSpec.method: expected one of {', '.join(METHODS)}, got {self.method!r}")
        if isinstance(self.schedule, str) or not self.schedule:
            raise ValueError(f"RunSpec.schedule: expected a tuple of each cycle's training task, e.g. "
                             f"('math',) * 2, got {self.schedule!r}")

    @property
    def key(self) -> str:
        return f"{self.experiment}/{self.method}/{self.name}"

    @property
    def source(self) -> str:
        """The key of the run whose directory holds this run's files (its own, unless shared)."""
        return self.shared or self.key

    @property
    def cycles(self) -> int:
        return len(self.schedule)

    def same_task_before(self, cycle: int) -> range:
        """The cycles right before `cycle` that train on its task, none of another task between
        (a continual run's cycles on the task it is on now). A GEPA-only cycle reads their
        evaluations (`fastslow.cycle.FROZEN_CACHE`, each file naming the earlier ones), and its
        job lists those files as inputs."""
        start = cycle
        while start > 0 and self.schedule[start - 1] == self.schedule[cycle]:
            start -= 1
        return range(start, cycle)

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
        if cfg["fast"]["pool_size"] == 1:
            # one context: a problem's G rollouts are one group whichever baseline is asked for
            # (per problem across K = 1 context, or per prompt: G // 1): one setting, one run
            cfg["slow"]["baseline"] = "problem"
        return cfg

    def cycle_params(self, config: dict[str, Any], sections: tuple[str, ...] | list[str]) -> dict[str, Any]:
        """The params of this run's cycle jobs: the `sections` of its effective settings
        (`job_params`), less the keys its method's cycle never reads (`CYCLE_READS`), and less
        model.dtype where its round samples in an explicit fast.dtype (`reads_model_dtype`)."""
        from fastslow.config import job_params, reads_model_dtype

        settings = self.settings(config)
        params = _read_by(self.method, job_params(settings, sections))
        model = params.get("model")
        if self.fast and isinstance(model, dict) and not reads_model_dtype(settings["fast"].get("dtype", "model")):
            params["model"] = {k: v for k, v in model.items() if k != "dtype"}
        return params


def _drop_global_divergence(overrides: dict[str, Any], config: dict[str, Any]) -> None:
    """Drop an override of `evaluation.divergence` that repeats the global switch: the run's
    settings are the same, and its initial point stays the base model's evaluation
    (`layout.shares_base_eval`, which gives a run asking for the pass where the global switch is
    off an evaluation of its own; a repeated `true` did too, in the directory of whatever run it
    shared)."""
    evaluation = overrides.get("evaluation")
    if isinstance(evaluation, dict) and "divergence" in evaluation and \
            evaluation["divergence"] == config.get("evaluation", {}).get("divergence"):
        del evaluation["divergence"]
        if not evaluation:
            del overrides["evaluation"]


def _read_by(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """`params` (sections of settings) as `method`'s cycle reads them (`cycle_section`; its
    evaluations read no `fast` or `slow` setting)."""
    for name in params:  # (values replaced in place: the sections keep their order)
        if name in ("fast", "slow") or name in CYCLE_READS.get(method, {}) or name in CYCLE_SKIPS.get(method, {}):
            params[name] = cycle_section(method, name, params[name])
    return params


def round_budget(fast: dict[str, Any]) -> dict[str, Any]:
    """`fast.max_metric_calls` as a round reads it: its preset's budget alone (a new `full` budget
    retrained every `light` run)."""
    preset = fast["preset"]
    return {preset: fast["max_metric_calls"][preset]}


def cycle_section(method: str, name: str, section: dict[str, Any]) -> dict[str, Any]:
    """Config section `name` as `method`'s cycle reads it, for its job's params and for the cycle
    itself: the keys `CYCLE_READS` keeps (each read alone, so a left-out key is never touched), or
    the whole section less `CYCLE_SKIPS`; of `fast`, the reflection model only for the reflective
    proposer and the feedback editor's limits only for it, and of `max_metric_calls` only the
    preset's budget (`round_budget`); no key of `READ_ONLY_WITH` whose switch is off, and no
    `HF_REFLECTION_SKIPS` of an `hf` reflection model."""
    keep = CYCLE_READS.get(method, {}).get(name)
    if keep is not None:  # in sorted order, as `job_params` gives the sections
        missing = object()
        return {k: v for k in sorted(keep) if (v := section.get(k, missing)) is not missing}
    skipped = CYCLE_SKIPS.get(method, {}).get(name, ())
    if name == "fast":  # each proposer's own settings only where it proposes
        proposer = section.get("proposer", FEEDBACK_EDITOR)  # (the schema's default)
        skipped = (*skipped, *(FEEDBACK_EDITOR_KEYS if proposer != FEEDBACK_EDITOR else ()),
                   *(("reflection",) if proposer != REFLECTIVE else ()))
    # (a switch the method never reads is off for it, and is not read here either)
    skipped = (*skipped, *(k for k, switch in READ_ONLY_WITH.get(name, {}).items()
                           if switch in skipped or not section.get(switch)))
    read = {k: v for k, v in section.items() if k not in skipped}
    if name == "fast" and isinstance(read.get("max_metric_calls"), dict) and "preset" in read:
        read["max_metric_calls"] = round_budget(read)
    reflection = read.get("reflection") if name == "fast" else None
    if isinstance(reflection, dict) and reflection.get("kind") == "hf":
        read["reflection"] = {k: v for k, v in reflection.items() if k not in HF_REFLECTION_SKIPS}
    return read


def run_tasks(key: str) -> tuple[str, ...]:
    """The tasks a run trains on, in schedule order, read from its key as `expand` names it:
    "<experiment>/<method>/[from_<init key>-]<tasks joined by '.'>-<variant>-s<seed>" (variant
    names have no '-'; neither may the tasks, for this to read them back)."""
    stem = key.split("/")[2].rsplit("-", 2)[0]  # less "-<variant>-s<seed>"
    return tuple(stem.rsplit("-", 1)[-1].split("."))  # less a "from_<init key>-" prefix


def case_twin(names: Any) -> tuple[str, str] | None:
    """Two of `names` that differ only in case (the earlier first), or None. Each is a directory
    under results/, and macOS's default file system does not tell `Ceiling` from `ceiling`: their
    runs would write one directory."""
    seen: dict[str, str] = {}
    for name in names:
        if name.casefold() in seen and seen[name.casefold()] != name:
            return seen[name.casefold()], name
        seen.setdefault(name.casefold(), name)
    return None


def _err(msg: str) -> Exception:
    from fastslow.config import ConfigError

    return ConfigError(f"config error: {msg}")


def _eval_point_names(spec: RunSpec) -> set[str]:
    from fastslow.layout import eval_points

    return set(eval_points(spec))


def _same_training(spec: RunSpec, other: RunSpec, config: dict[str, Any]) -> bool:
    """Whether `spec` can read `other`'s files: the same training and a superset of its evaluations.
    Only `evaluation.divergence` may differ, and only where `other` computes what `spec` skips;
    memory bounds (`MEMORY_BOUNDS`) may differ freely."""
    if (spec.method, spec.schedule, spec.seed, spec.init, spec.eval_tasks) != \
            (other.method, other.schedule, other.seed, other.init, other.eval_tasks):
        return False
    if not _eval_point_names(spec) <= _eval_point_names(other):
        return False
    from fastslow.config import job_params

    # what the method's jobs read: an rl run's fast settings (but K = 1) change none of its jobs
    # (its evaluations sample with `generation` and `model`, which CYCLE_READS leaves out of its
    # cycles, but those sections are global: no experiment or variant overrides them)
    mine, theirs = spec.settings(config), other.settings(config)
    mine, theirs = (_read_by(spec.method, job_params(s, list(s))) for s in (mine, theirs))
    mine_div = mine.get("evaluation", {}).pop("divergence", True)
    their_div = theirs.get("evaluation", {}).pop("divergence", True)
    return mine == theirs and (their_div or not mine_div)


def _share(spec: RunSpec, runs: dict[str, RunSpec], config: dict[str, Any]) -> RunSpec:
    """`spec`, marked shared with the first earlier run that trains identically: an earlier
    experiment's, or an earlier variant's of its own (an RL run of variants that change only fast
    settings)."""
    for other in runs.values():
        if other.shared is None and _same_training(spec, other, config):
            return replace(spec, shared=other.key)
    return spec


def _no_init_runs(where: str, exp_name: str, src: dict[str, Any], experiments: dict[str, Any],
                  runs: dict[str, RunSpec]) -> str:
    """Why an experiment's `init` names no run to start from: an unknown experiment, one defined
    after it, or none of its default-variant runs of the methods and final tasks asked for."""
    name = src["experiment"]
    if name not in experiments:
        return (f"{where}.init.experiment: unknown experiment {name!r} "
                f"(experiments: {', '.join(e for e in experiments if e != exp_name) or 'none'})")
    if name == exp_name:
        return f"{where}.init.experiment: {name!r} is this experiment; name the one whose runs it starts from"
    order = list(experiments)
    if order.index(name) > order.index(exp_name):
        return (f"{where}.init.experiment: {name!r} is defined after {exp_name!r}; define it before "
                f"(the runs of {exp_name!r} start from its runs' final weights)")
    own = [r for r in runs.values() if r.experiment == name and r.variant == "default"]
    if not own:
        named = sorted({r.variant for r in runs.values() if r.experiment == name})
        return (f"{where}.init.experiment: {name!r} has no default-variant run to start from "
                f"({'its variants: ' + ', '.join(named) if named else 'it has no runs'})")
    if not any(r.trains for r in own):
        return (f"{where}.init.experiment: {name!r} has only GEPA-only runs, which train no weights "
                f"to start from")
    own = [r for r in own if r.trains]
    tasks = sorted({r.schedule[-1] for r in own})
    methods = sorted({r.method for r in own}, key=METHODS.index)
    # left out, every method that trains is asked for (a GEPA-only run is never a source)
    asked = src.get("methods", [m for m in METHODS if TRAINS[m]])
    return (f"{where}.init: {name!r} has no default-variant run of methods {asked} "
            f"ending on tasks {src.get('tasks', tasks)} (it has methods {methods}, final tasks {tasks}); "
            f"set {where}.init.tasks, or drop the experiment with `{where.split('.')[-1]}: null` in an overlay")


#: MLflow parent groups of jobs outside any experiment (workflow/rules: `tracking(...)`).
RESERVED_GROUPS = ("foundation", "figures")


def expand(config: dict[str, Any]) -> dict[str, RunSpec]:
    """All runs of all experiments, keyed by `RunSpec.key`. Validates as it goes. A run identical
    to an earlier run is marked `shared` with it (see the module docstring)."""
    from fastslow.config import deep_update

    runs: dict[str, RunSpec] = {}
    twin = case_twin(config.get("experiments", {}))
    if twin:
        raise _err(f"experiments.{twin[1]}: differs from experiment {twin[0]!r} only in case, and both would "
                   f"write results/runs/{twin[0]}/ on a case-insensitive file system (macOS's); rename one")
    for exp_name, exp in config.get("experiments", {}).items():
        where = f"experiments.{exp_name}"
        if not _SAFE.match(exp_name):
            raise _err(f"{where}: experiment names use letters, digits and '_' only")
        if exp_name in RESERVED_GROUPS:
            raise _err(f"{where}: {exp_name!r} is the MLflow parent group of the workflow's own "
                       f"{'base model, data and base evaluation' if exp_name == 'foundation' else 'figure and table'} "
                       f"jobs; name the experiment differently")
        seq = exp.get("sequence")
        if seq is not None and not seq:
            raise _err(f"{where}.sequence: expected a non-empty list of tasks, got []")
        if seq is not None and len(set(seq)) < len(seq):
            twice = next(t for t in seq if seq.count(t) > 1)
            raise _err(f"{where}.sequence: task {twice!r} appears twice in {seq}; stages are told apart "
                       f"by their task, so list each task once")
        if seq is None and not exp.get("tasks"):
            raise _err(f"{where}.tasks: expected a non-empty list of tasks (or a 'sequence'), got {exp.get('tasks')!r}")
        # keys the other kind of experiment reads: left there, they were silently ignored
        if seq is not None and exp.get("tasks"):
            raise _err(f"{where}.tasks: {exp['tasks']} beside sequence {seq}; an experiment is one run per "
                       f"task (tasks) or one continual run (sequence): keep one")
        if seq is None and "cycles_per_stage" in exp:
            raise _err(f"{where}.cycles_per_stage: {exp['cycles_per_stage']!r} without a 'sequence' (cycles per "
                       f"task of a continual run); a 'tasks' experiment's runs take 'cycles'")
        if seq is not None and "cycles" in exp:
            raise _err(f"{where}.cycles: {exp['cycles']!r} with a 'sequence', whose run takes "
                       f"'cycles_per_stage' cycles per task; set that instead")

        # a variant's `cycles` (in a sequence experiment, `cycles_per_stage`) replaces it
        own_cycles = exp.get("cycles", CYCLES) if seq is None else exp.get("cycles_per_stage", CYCLES_PER_STAGE)

        def schedules(cycles: int | None) -> list[tuple[str, ...]]:
            if seq is not None:  # noqa: B023 - evaluated within this iteration
                return [tuple(t for t in seq for _ in range(cycles or own_cycles))]  # noqa: B023
            return [(t,) * (cycles or own_cycles) for t in exp["tasks"]]  # noqa: B023

        eval_tasks = tuple(dict.fromkeys(seq)) if seq is not None else ()
        seeds = exp.get("seeds", [0])
        # (source run, its seed): None is the base model, which every seed starts from
        inits: list[tuple[str, int] | None] = [None]
        pair_seeds = True
        if "init" in exp:
            src = exp["init"]
            pair_seeds = src.get("pair_seeds", True)
            inits = [None] if src.get("include_base", True) else []
            # a GEPA-only run trains no weights: no final weights to start from (`final_weights`)
            src_runs = [r for r in runs.values() if r.experiment == src["experiment"]
                        and r.method in src.get("methods", METHODS) and r.trains
                        and r.schedule[-1] in src.get("tasks", [r.schedule[-1]])
                        and r.variant == "default"]
            if not src_runs:
                raise _err(_no_init_runs(where, exp_name, src, config.get("experiments", {}), runs))
            if pair_seeds:  # seed s starts from the source runs of seed s: independent repeats
                missing = sorted(set(seeds) - {r.seed for r in src_runs})
                if missing:
                    raise _err(f"{where}.seeds: {missing} have no run of {src['experiment']!r} to start from "
                               f"(its runs' seeds: {sorted({r.seed for r in src_runs})}); add the seeds there, "
                               f"or set {where}.init.pair_seeds: false to start every seed from every source run")
            inits += [(r.source, r.seed) for r in src_runs]
        # null drops a variant: an overlay (paper.yaml over config.yaml) can only merge into the map.
        variants = {k: v for k, v in (exp.get("variants") or {}).items() if v is not None} or {"default": {}}
        twin = case_twin(variants)
        if twin:
            raise _err(f"{where}.variants.{twin[1]}: differs from variant {twin[0]!r} only in case, and both "
                       f"would write one run directory on a case-insensitive file system (macOS's); rename one")
        for method in exp["methods"]:
            for variant, overrides in variants.items():
                if not _SAFE.match(variant):
                    raise _err(f"{where}.variants.{variant}: variant names use letters, digits and '_' only")
                # the variant's cycle count, under the experiment's own key for it (checked above)
                count = "cycles" if seq is None else "cycles_per_stage"
                wrong = "cycles_per_stage" if seq is None else "cycles"
                if wrong in overrides:
                    raise _err(f"{where}.variants.{variant}.{wrong}: {overrides[wrong]!r} in a "
                               + ("'tasks' experiment, whose runs take 'cycles'; set that instead" if seq is None
                                  else "'sequence' experiment, whose run takes 'cycles_per_stage' cycles per task; "
                                       "set that instead"))
                overrides = deep_update(copy.deepcopy(exp.get("overrides", {})), overrides)
                cycles = overrides.pop(count, None)
                _drop_global_divergence(overrides, config)
                for seed in seeds:
                    for schedule in schedules(cycles):
                        for source in inits:
                            if source is not None and pair_seeds and source[1] != seed:
                                continue
                            init = None if source is None else source[0]
                            stem = ".".join(dict.fromkeys(schedule))
                            prefix = "" if init is None else "from_" + init.replace("/", "_") + "-"
                            name = f"{prefix}{stem}-{variant}-s{seed}"
                            spec = RunSpec(exp_name, method, name, schedule, seed, variant,
                                           overrides, init, eval_tasks or (schedule[0],),
                                           exp.get("eval_init", True), exp.get("eval_every", 1))
                            if spec.key in runs:  # the schema's uniqueItems should have caught it
                                raise _err(f"{where}: run {spec.key} is defined twice; list each task, "
                                           f"method and seed once")
                            runs[spec.key] = _share(spec, runs, config)
    return runs


def check_experiments(config: dict[str, Any]) -> None:
    """Cross-field checks of the experiments (called by config validation): known tasks, and every
    run's effective settings (the config with its experiment's `overrides` and its variant's) a
    valid config, with the same one-line errors, whether the experiment has variants or not."""
    from fastslow.config import known_tasks, unknown_task

    known = known_tasks(config["data"])  # what task_spec builds under this data source
    # Before expand, which would blame a typo on a later experiment's init finding no run. A run's
    # schedule and evaluation tasks are its experiment's tasks or sequence: nothing else to check.
    for name, exp in config.get("experiments", {}).items():
        for key in ("sequence", "tasks"):
            for i, task in enumerate(exp.get(key) or []):
                if task not in known:
                    raise _err(f"experiments.{name}.{key}[{i}]: {unknown_task(config['data'], task)}")
    checked: set[tuple[str, str, str]] = set()
    runs = expand(config)
    for run in runs.values():
        # the settings depend on the experiment, variant and method only (rl: K = 1)
        if not run.overrides or (run.experiment, run.variant, run.method) in checked:
            continue
        checked.add((run.experiment, run.variant, run.method))
        detail = _invalid(run.settings(config))
        if detail is None:
            continue
        exp = config["experiments"][run.experiment]
        where = "overrides"
        if (exp.get("variants") or {}).get(run.variant):  # the variant overrides something itself
            alone = _invalid(_experiment_own(run, config).settings(config))
            where, detail = ("overrides", alone) if alone else (f"variants.{run.variant}", detail)
        raise _err(f"experiments.{run.experiment}.{where}: {detail}")
    _check_fast_budgets(runs, config)
    _warn_short_warmup(runs, config)
    _warn_unread(config)


def _warn_unread(config: dict[str, Any]) -> None:
    """A config warning for an experiment no figure or claim reads and no other experiment starts
    from (`init`): its runs are built only when named as targets, which is what a misspelt name
    (`efficency:` in an overlay) would silently leave the user with, the built-in one running
    instead. Not an error: an experiment of one's own may be meant to be built by its targets."""
    import difflib

    from fastslow.layout import FIGURE_EXPERIMENTS

    experiments = config.get("experiments", {})
    read = {e for names in FIGURE_EXPERIMENTS.values() for e in names}
    starts = {(exp.get("init") or {}).get("experiment") for exp in experiments.values()}
    for name in experiments:
        if name in read or name in starts:
            continue
        close = difflib.get_close_matches(name, sorted(read), n=1, cutoff=0.75)
        log.warning("config warning: experiments.%s: no figure or claim reads an experiment of this name%s, "
                    "and no experiment starts from it: its runs are built only as targets of their own "
                    "(results/runs/%s/...)", name, f" (did you mean {close[0]!r}?)" if close else "", name)


def _warn_short_warmup(runs: dict[str, RunSpec], config: dict[str, Any]) -> None:
    """A config warning (not an error: a short test run may mean it) for the training runs whose
    slow.warmup_steps W exceed their RL steps, cycles x slow.steps_per_cycle: the lr scheduler
    (HF `constant_with_warmup`, carried over a run's cycles) trains step s < W at lr x s/W, so
    their learning rate never reaches slow.lr. One line per experiment and step count, naming its
    variants (the default too, unless it is alone); a shared run's warning is the earlier run's. A
    run of one RL step with W >= 1 is an error: its only step trains at lr 0, so its weights never
    change."""
    short: dict[tuple[Any, ...], list[str]] = {}
    seen: set[tuple[str, str]] = set()
    for run in runs.values():
        if not run.trains or run.shared or (run.experiment, run.variant) in seen:
            continue
        seen.add((run.experiment, run.variant))  # the cycle count and slow section are the variant's
        slow = run.settings(config)["slow"]
        if slow["warmup_steps"] >= 1 and run.cycles * slow["steps_per_cycle"] == 1:
            where = f"experiments.{run.experiment}" + ("" if run.variant == "default" else f" (variant {run.variant})")
            raise _err(f"{where}: slow.warmup_steps {slow['warmup_steps']} with runs of 1 RL step (1 cycle x 1 "
                       f"slow.steps_per_cycle): that step trains at lr 0 (step s < W trains at lr x s/W), so the "
                       f"weights never change; set slow.warmup_steps: 0 there, or run more steps")
        if slow["warmup_steps"] > run.cycles * slow["steps_per_cycle"]:
            key = (run.experiment, slow["warmup_steps"], run.cycles, slow["steps_per_cycle"], slow["lr"])
            short.setdefault(key, []).append(run.variant)
    for (experiment, warmup, cycles, steps, lr), variants in short.items():
        # the default beside other variants is named too: left out, the line read as if the
        # default's runs reached slow.lr (alone, the experiment's name stands for it)
        named = variants if any(v != "default" for v in variants) else []
        where = f"experiments.{experiment}" + (f" (variant{'s' if len(named) > 1 else ''} {', '.join(named)})"
                                               if named else "")
        log.warning("config warning: %s: slow.warmup_steps %d > its runs' %d RL steps (%d cycle%s x %d "
                    "slow.steps_per_cycle): their learning rate never reaches slow.lr %s (step s < %d trains "
                    "at lr x s/%d)", where, warmup, cycles * steps, cycles, "s" if cycles > 1 else "", steps,
                    lr, warmup, warmup)


def _check_fast_budgets(runs: dict[str, RunSpec], config: dict[str, Any]) -> None:
    """Each fast round's budget covers a round's minimum (`fastslow.config.fast_budget_error`),
    checked per run (rl has no round; a one-cycle run's round has the seed context alone), before
    any job: the round itself would stop with a traceback, from a later cycle on once its pool
    holds more distinct contexts. Named at the global key, else at the overrides or variant that
    sets the budget too low."""
    from fastslow.config import fast_budget_error

    checked: set[tuple[str, str, str, int]] = set()
    for run in runs.values():
        if not run.fast or (run.experiment, run.variant, run.method, run.cycles) in checked:
            continue
        checked.add((run.experiment, run.variant, run.method, run.cycles))
        detail = fast_budget_error(run.settings(config), run.cycles)
        if detail is None:
            continue
        if fast_budget_error(replace(run, overrides={}).settings(config), run.cycles):
            raise _err(detail)  # the config's own fast settings
        alone = _experiment_own(run, config)
        where = "overrides" if fast_budget_error(alone.settings(config), run.cycles) else f"variants.{run.variant}"
        raise _err(f"experiments.{run.experiment}.{where}: {detail}")


def _experiment_own(run: RunSpec, config: dict[str, Any]) -> RunSpec:
    """`run` with its experiment's `overrides` alone, no variant's (the cycle count is no setting)."""
    overrides = copy.deepcopy(config.get("experiments", {}).get(run.experiment, {}).get("overrides", {}))
    overrides.pop("cycles", None)
    return replace(run, overrides=overrides)


def _invalid(settings: dict[str, Any]) -> str | None:
    """What is wrong with a run's effective settings as a config (None: nothing)."""
    from fastslow.config import validate_config

    settings["experiments"] = {}
    try:
        validate_config(settings)
    except ValueError as exc:
        return str(exc).removeprefix("config error: ")
    return None


#: The sections of a run's settings a variant may change that `variant_settings` compares.
VARIANT_SECTIONS = ("model", "generation", "seed_context", "slow", "fast")


def _variant_leaves(settings: dict[str, Any]) -> dict[str, Any]:
    """A run's settings that a variant may change (VARIANT_SECTIONS), as dotted keys, a key without
    a schema default at the value it takes left out (`implied_defaults`): a variant spelling that
    default out changes nothing, and one changing it is compared with it, not with None."""
    from fastslow.config import implied_defaults
    from fastslow.io import dotted

    implied = implied_defaults()
    return dotted({s: {**implied[s], **settings[s]} if s in implied else settings[s]
                   for s in VARIANT_SECTIONS if s in settings})


def variant_settings(runs: dict[str, RunSpec], config: dict[str, Any], experiment: str,
                     reference: RunSpec | None = None) -> dict[str, Any]:
    """What each variant of `experiment` changes: its effective settings (VARIANT_SECTIONS, as
    dotted keys) that differ from the experiment's own (its `overrides`, no variant), or from
    `reference`'s when given (Fig 9's default bar is efficiency's FST run, not the ablations'
    own settings), e.g. `{"variants": {"k4": {"fast.pool_size": 4}}, "reference":
    {"fast.pool_size": 2}}`. The reference holds every key some variant changes; a variant that
    changes none maps to {}. Fig 9 groups its bars by these keys (one panel per ablated setting)."""
    variants: dict[str, dict[str, Any]] = {}
    reference_values: dict[str, Any] = {}
    fixed = None if reference is None else _variant_leaves(reference.settings(config))
    for spec in sorted(runs.values(), key=lambda s: s.method == "rl"):  # an RL run has K=1 whatever it says
        if spec.experiment != experiment or spec.variant in variants:
            continue
        base = fixed if fixed is not None else _variant_leaves(_experiment_own(spec, config).settings(config))
        own = _variant_leaves(spec.settings(config))
        variants[spec.variant] = {k: v for k, v in own.items() if base.get(k) != v}
        reference_values.update({k: base.get(k) for k in variants[spec.variant]})
    return {"variants": variants, "reference": reference_values}
