"""Where everything lives under results/: one place for the workflow's and the library's paths."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from fastslow.experiments import RunSpec

RESULTS = "results"


def data_file(task: str, split: str, results: str = RESULTS) -> str:
    return f"{results}/data/{task}/{split}.parquet"


def run_path(spec: RunSpec, results: str = RESULTS) -> str:
    """A run's directory (a shared run's is the run it shares, `RunSpec.source`)."""
    return f"{results}/runs/{spec.source}"


def cycle_dir(spec: RunSpec, cycle: int, results: str = RESULTS) -> str:
    return f"{run_path(spec, results)}/cycle{cycle}"


def init_model(spec: RunSpec, base_model: str, results: str = RESULTS) -> str:
    """θ0 of a run: the base model, or the final weights of the run it starts from."""
    return base_model if spec.init is None else f"{results}/runs/{spec.init}/final/model"


#: Evaluation settings that change only the KL/entropy pass, not mean@k or best@k.
DIVERGENCE_ONLY = frozenset({"divergence", "divergence_tokens"})


def shares_base_eval(spec: RunSpec) -> bool:
    """Whether the run's initial point is the base model's evaluation: it starts from the base
    model and its overrides (the experiment's and its variant's) name no evaluation setting its
    rewards depend on (k, the problems, the seed, the dtype; a run that does is evaluated at its
    own initial point, so its curve starts at its own k). A key is judged by its presence, not
    its value: an override that repeats the global value costs one redundant evaluation. The KL
    switches do not count, but for `divergence: true`: the base model's evaluation follows the
    global switch, and a run asking for the KL/entropy pass where it is off globally would start
    its curve without one. Overrides reach `evaluation`, `slow`, `fast` and `cycles` only; the
    other keys are checked all the same."""
    o = spec.overrides
    evaluation = o.get("evaluation") or {}
    return (spec.init is None and not any(k in o for k in ("model", "generation", "seed_context"))
            and set(evaluation) <= DIVERGENCE_ONLY and evaluation.get("divergence") is not True)


def eval_point_file(spec: RunSpec, point: str, task: str, results: str = RESULTS) -> str:
    """Evaluation summary of a run at `point` ('init' or 'cycleN') on `task`. A run that starts
    from the base model with the global evaluation settings shares the base model's evaluation
    as its initial point (`shares_base_eval`)."""
    if point == "init" and shares_base_eval(spec):
        return f"{results}/eval/base/{task}.json"
    return f"{run_path(spec, results)}/eval/{point}/{task}.json"


def eval_points(spec: RunSpec) -> list[str]:
    """The run's evaluation points: 'init' (if asked), every `eval_every`-th cycle, the last cycle
    of each stage of a continual sequence (where forgetting is measured from, and where Fig 6
    draws the stage's end) and the last."""
    every, schedule = spec.eval_every, spec.schedule
    return ["init"] * spec.eval_init + [f"cycle{c}" for c in range(spec.cycles)
                                        if (c + 1) % every == 0 or c == spec.cycles - 1
                                        or schedule[c] != schedule[c + 1]]


def experiment_runs(runs: dict[str, RunSpec], experiment: str, tasks: Collection[str] | None = None,
                    methods: Collection[str] | None = None) -> dict[str, RunSpec]:
    """`experiment`'s runs (those evaluated on one of `tasks` only, and of `methods` only, if
    given), by key."""
    return {k: s for k, s in runs.items() if s.experiment == experiment
            and (tasks is None or not set(s.eval_tasks).isdisjoint(tasks))
            and (methods is None or s.method in methods)}


def curves_runs(runs: dict[str, RunSpec], experiment: str, tasks: Collection[str] | None = None,
                methods: Collection[str] | None = None) -> dict[str, RunSpec]:
    """The runs a curves table of `experiment` (on `tasks` only, of `methods` only, if given)
    reads; none is a one-line ValueError naming the table (a misspelt target would otherwise
    plan an empty table whose job fails in polars)."""
    found = experiment_runs(runs, experiment, tasks, methods)
    if found:
        return found
    table = curves_table(experiment, tasks, "", methods).removeprefix("/tables/")
    if methods and experiment_runs(runs, experiment, tasks):
        raise ValueError(f"{table}: no run of experiment {experiment!r} on {', '.join(tasks or ())} is of "
                         f"method {' or '.join(methods)}")
    own = experiment_runs(runs, experiment)
    if not own:
        named = sorted({s.experiment for s in runs.values()})
        raise ValueError(f"{table}: experiment {experiment!r} has no runs in the config "
                         f"(experiments with runs: {', '.join(named) or 'none'})")
    evaluated = sorted({t for s in own.values() for t in s.eval_tasks})
    raise ValueError(f"{table}: no run of experiment {experiment!r} is evaluated on {', '.join(tasks or ())} "
                     f"(its runs' tasks: {', '.join(evaluated)})")


def curves_labels(runs: dict[str, RunSpec], experiment: str, tasks: Collection[str] | None = None,
                  methods: Collection[str] | None = None) -> list[tuple[str, str, str, int, str]]:
    """What a curves table's rows say of each run beyond its files (a shared run reads another
    run's files, so renaming its variant changed no input): its key, the run it reads, variant,
    seed and init, in the table's row order. That order is the config's, and decides which
    variant (or method) a figure or claim reads first (`figures.headline_tables`): a param in
    sorted order, and the inputs Snakemake records sorted, left a reordered experiment's
    figures up to date with the old first variant."""
    return [(s.key, s.source, s.variant, s.seed, s.init or "base")
            for s in experiment_runs(runs, experiment, tasks, methods).values()]


def experiment_eval_files(runs: dict[str, RunSpec], experiment: str, results: str = RESULTS,
                          tasks: Collection[str] | None = None,
                          methods: Collection[str] | None = None) -> list[str]:
    """The evaluation files of `experiment`'s runs (on `tasks` only, of `methods` only, if given)."""
    return [eval_point_file(s, p, t, results) for s in experiment_runs(runs, experiment, tasks, methods).values()
            for t in s.eval_tasks if tasks is None or t in tasks for p in eval_points(s)]


def samples_file(eval_file: str) -> str:
    """The per-sample rewards the evaluation job of `eval_file` wrote beside its summary."""
    return eval_file.removesuffix(".json") + ".samples.parquet"


def experiment_cycle_files(runs: dict[str, RunSpec], experiment: str, results: str = RESULTS,
                           tasks: Collection[str] | None = None,
                           methods: Collection[str] | None = None) -> list[str]:
    """The cycle files of `experiment`'s runs (of those evaluated on one of `tasks`, of
    `methods`, if given)."""
    return [f"{cycle_dir(s, c, results)}/cycle.json"
            for s in experiment_runs(runs, experiment, tasks, methods).values()
            for c in range(s.cycles)]


#: Under results/tables/curves/: the tables of an experiment's runs on some tasks (or of some
#: methods) only (`curves_table`).
SUBSETS = "subsets"


def curves_table(experiment: str, tasks: Collection[str] | None = None, results: str = RESULTS,
                 methods: Collection[str] | None = None) -> str:
    """The curves table of `experiment`, or of its runs on `tasks` only (`subsets/<experiment>.<a+b>`),
    and of those of `methods` only (`subsets/<experiment>.<a+b>.<rl>`; with tasks only). The
    subsets' rows are also the whole table's, so they sit apart from it: a glob of the tables
    (`tables/curves/*.parquet`) reads each experiment's rows once."""
    if methods and tasks is None:
        raise ValueError(f"curves of {experiment!r}: a table of some methods is of some tasks too")
    name = experiment if tasks is None else f"{SUBSETS}/{experiment}.{'+'.join(sorted(tasks))}"
    name += f".{'+'.join(sorted(methods))}" if methods else ""
    return f"{results}/tables/curves/{name}.parquet"


def table_filter(wildcards: Any) -> tuple[list[str] | None, list[str] | None]:
    """The (tasks, methods) a curves table's wildcards select (`curves_table`): None for all."""
    keys = wildcards.keys()
    return (wildcards.tasks.split("+") if "tasks" in keys else None,
            wildcards.methods.split("+") if "methods" in keys else None)


def table_experiment(path: str | Path) -> str:
    """The experiment a curves table (`curves_table`) belongs to."""
    return Path(path).stem.split(".")[0]


def figure_reads(runs: dict[str, RunSpec], fig: str) -> list[tuple[str, set[str] | None, tuple[str, ...] | None]]:
    """(experiment, tasks or None for all, methods or None for all) of each curves table `fig`
    reads: its experiments that have runs, one of `FIGURE_TASKS_OF` restricted to the other
    experiment's tasks and to `FIGURE_METHODS_OF`'s methods (left out when none of its runs is
    on them)."""
    out: list[tuple[str, set[str] | None, tuple[str, ...] | None]] = []
    for experiment in FIGURE_EXPERIMENTS[fig]:
        by = FIGURE_TASKS_OF.get(fig, {}).get(experiment)
        tasks = None if by is None else {t for s in experiment_runs(runs, by).values() for t in s.eval_tasks}
        methods = FIGURE_METHODS_OF.get(fig, {}).get(experiment)
        if experiment_runs(runs, experiment, tasks, methods):
            out.append((experiment, tasks, methods))
    return out


def fig9_default_run(runs: dict[str, RunSpec]) -> RunSpec | None:
    """The run Fig 9's default bar plots: the ablations' own `default` variant when they have one,
    else efficiency's FST run on the ablations' task (its first seed), else None (no default bar)."""
    ablations = experiment_runs(runs, "ablations")
    own = [s for s in ablations.values() if s.variant == "default" and s.method == "fst"]
    tasks = {t for s in ablations.values() for t in s.eval_tasks}
    fst = own or [s for s in experiment_runs(runs, "efficiency", tasks).values() if s.method == "fst"]
    return min(fst, key=lambda s: (s.variant != "default", s.seed), default=None)


def figure_tables(runs: dict[str, RunSpec], fig: str, results: str = RESULTS) -> list[str]:
    """The curves tables `fig` reads (`figure_reads`). A figure whose required experiment (the
    first of `FIGURE_EXPERIMENTS`) has no runs is an error here, when Snakemake plans the job,
    rather than a failing figure job (which would also delete the figure built before)."""
    required = FIGURE_EXPERIMENTS[fig][0]
    if not experiment_runs(runs, required):
        defined = sorted({s.experiment for s in runs.values()})
        raise ValueError(f"{fig} plots experiment {required!r}, which the config does not define "
                         f"(experiments: {', '.join(defined) or 'none'})")
    return [curves_table(experiment, tasks, results, methods) for experiment, tasks, methods in figure_reads(runs, fig)]


def figure_runs(runs: dict[str, RunSpec], fig: str) -> list[str]:
    """The keys of the runs whose curves `fig` reads (`figure_reads`)."""
    return [k for experiment, tasks, methods in figure_reads(runs, fig)
            for k in experiment_runs(runs, experiment, tasks, methods)]


#: figure → experiments whose curves it reads (the first is required, the rest optional).
FIGURE_EXPERIMENTS: dict[str, tuple[str, ...]] = {
    "fig2": ("efficiency", "radar"),
    "fig3": ("efficiency",),
    "fig4": ("efficiency",),
    "fig5": ("plasticity",),
    "fig6": ("continual",),
    "fig7": ("stargraph",),
    "fig8": ("ceiling", "efficiency"),
    "fig9": ("ablations", "efficiency"),
    # its no_reuse run is efficiency's FST run (shared, the CPU default); efficiency's RL run
    # on the task is its reference (FIGURE_TASKS_OF, FIGURE_METHODS_OF)
    "fig10": ("reuse", "efficiency"),
    "fig11": ("efficiency",),
}
#: The figures that show each claim: `results/tables/claims/<fig>.csv` holds theirs
#: (`fastslow.claims.figure_claims`), and the claims table names them (its `figures` column).
CLAIM_FIGURES: dict[str, tuple[str, ...]] = {
    "sample_efficiency_ratio": ("fig2",),
    "asymptote_gap": ("fig3",),
    "kl_reduction_at_matched_reward": ("fig4", "fig11"),
    "plasticity_gain": ("fig5",),
    "continual_stage_recovery": ("fig6",),
    "continual_forgetting": ("fig6",),
    "zero_reward_escape": ("fig7",),
    "ceiling_exceeded": ("fig8",),
    "reuse_speedup": ("fig10",),
}
#: The figures that show a claim, in figure order.
CLAIM_FIGURE_NAMES: tuple[str, ...] = tuple(sorted({f for figs in CLAIM_FIGURES.values() for f in figs},
                                                   key=lambda f: int(f.removeprefix("fig"))))
#: figure → {experiment: the experiment whose tasks restrict it}. Fig 8 plots efficiency's runs on
#: the ceiling's task only, Fig 9 on the ablations' task, Fig 10 on the reuse experiment's: their table holds those runs alone, so
#: rebuilding either figure trains none of efficiency's runs on other tasks.
FIGURE_TASKS_OF: dict[str, dict[str, str]] = {
    "fig8": {"efficiency": "ceiling"},
    "fig9": {"efficiency": "ablations"},
    "fig10": {"efficiency": "reuse"},
}
#: figure → {experiment: the methods it reads of that experiment's runs on those tasks}: Fig 10
#: compares reuse with RL-only, so it reads efficiency's RL run alone (at paper scale its no-reuse
#: run is not efficiency's FST run, which reading it would train for nothing).
FIGURE_METHODS_OF: dict[str, dict[str, tuple[str, ...]]] = {
    "fig10": {"efficiency": ("rl",)},
}
