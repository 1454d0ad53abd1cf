"""Where everything lives under results/: one place for the workflow's and the library's paths."""

from __future__ import annotations

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


def eval_point_file(spec: RunSpec, point: str, task: str, results: str = RESULTS) -> str:
    """Evaluation summary of a run at `point` ('init' or 'cycleN') on `task`. A run that starts
    from the base model shares the base model's evaluation as its initial point."""
    if point == "init" and spec.init is None:
        return f"{results}/eval/base/{task}.json"
    return f"{run_path(spec, results)}/eval/{point}/{task}.json"


def eval_points(spec: RunSpec) -> list[str]:
    """The run's evaluation points: 'init' (if asked), every `eval_every`-th cycle and the last."""
    every = spec.eval_every
    return ["init"] * spec.eval_init + [f"cycle{c}" for c in range(spec.cycles)
                                        if (c + 1) % every == 0 or c == spec.cycles - 1]


def experiment_eval_files(runs: dict[str, RunSpec], experiment: str, results: str = RESULTS) -> list[str]:
    return [eval_point_file(s, p, t, results) for s in runs.values() if s.experiment == experiment
            for t in s.eval_tasks for p in eval_points(s)]


def experiment_cycle_files(runs: dict[str, RunSpec], experiment: str, results: str = RESULTS) -> list[str]:
    return [f"{cycle_dir(s, c, results)}/cycle.json" for s in runs.values() if s.experiment == experiment
            for c in range(s.cycles)]


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
    "fig10": ("reuse",),  # its no_reuse run is shared with efficiency's: read through the run, not the table
    "fig11": ("efficiency",),
}
