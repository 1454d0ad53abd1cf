"""Where the artifacts live: run, cycle, evaluation and table paths, from small hand-made runs."""

from __future__ import annotations

import pytest

from fastslow.experiments import RunSpec
from fastslow.layout import (
    curves_runs,
    curves_table,
    eval_point_file,
    eval_points,
    experiment_cycle_files,
    experiment_eval_files,
    fig9_default_run,
    figure_tables,
    init_model,
    samples_file,
    shares_base_eval,
    table_experiment,
    table_filter,
)


def _run(name: str = "math-s0", experiment: str = "e", method: str = "fst", **kw) -> RunSpec:
    kw.setdefault("schedule", ("math",) * 2)
    kw.setdefault("seed", 0)
    kw.setdefault("eval_tasks", ("math",))
    return RunSpec(experiment=experiment, method=method, name=name, **kw)


def test_a_shared_runs_cycles_and_evaluations_are_the_runs_it_shares():
    spec = _run(shared="other/fst/math-s0", overrides={"evaluation": {"k": 2}})
    assert experiment_cycle_files({spec.key: spec}, "e", results="r") == [
        "r/runs/other/fst/math-s0/cycle0/cycle.json", "r/runs/other/fst/math-s0/cycle1/cycle.json"]
    assert eval_point_file(spec, "cycle1", "math", "r") == "r/runs/other/fst/math-s0/eval/cycle1/math.json"


def test_a_run_started_from_another_starts_from_its_final_weights():
    assert init_model(_run(), "base/model", "r") == "base/model"
    assert init_model(_run(init="e/rl/math-s0"), "base/model", "r") == "r/runs/e/rl/math-s0/final/model"


@pytest.mark.parametrize(("overrides", "init", "shared"), [
    ({}, None, True),
    ({"evaluation": {"divergence": False, "divergence_tokens": 64}, "slow": {"lr": 1e-5}}, None, True),
    ({"evaluation": {"divergence": True}}, None, False),  # a KL pass the base model's evaluation may lack
    ({"evaluation": {"k": 4}}, None, False),
    ({"seed_context": 1}, None, False),
    ({"model": {"dtype": "float32"}}, None, False),
    ({"generation": {"max_new_tokens": 8}}, None, False),
    ({}, "e/rl/math-s0", False),  # starts from another run's weights, not the base model
])
def test_a_run_shares_the_base_models_evaluation_only_with_its_settings(overrides, init, shared):
    spec = _run(overrides=overrides, init=init)
    assert shares_base_eval(spec) is shared
    expected = "r/eval/base/math.json" if shared else "r/runs/e/fst/math-s0/eval/init/math.json"
    assert eval_point_file(spec, "init", "math", "r") == expected


def test_a_run_is_evaluated_at_every_nth_cycle_at_each_stage_end_and_at_its_last():
    spec = _run(schedule=("a", "a", "a", "b", "b", "b", "b"), eval_every=3, eval_init=False)
    assert eval_points(spec) == ["cycle2", "cycle5", "cycle6"]
    spec = _run(schedule=("a", "a", "b", "b", "b"), eval_every=4)
    assert eval_points(spec) == ["init", "cycle1", "cycle3", "cycle4"]


def test_an_experiments_evaluation_files_are_those_of_its_runs_on_the_tasks_and_methods_asked():
    runs = {s.key: s for s in [_run(schedule=("math",), eval_tasks=("math", "code"), eval_init=False),
                               _run(method="rl", schedule=("math",), eval_tasks=("code",), eval_init=False),
                               _run(experiment="other", schedule=("math",), eval_init=False)]}
    assert experiment_eval_files(runs, "e", "r", tasks=["math"]) == ["r/runs/e/fst/math-s0/eval/cycle0/math.json"]
    assert experiment_eval_files(runs, "e", "r", tasks=["code"], methods=["rl"]) == [
        "r/runs/e/rl/math-s0/eval/cycle0/code.json"]
    assert len(experiment_eval_files(runs, "e", "r")) == 3
    assert experiment_cycle_files(runs, "e", "r", tasks=["math"]) == ["r/runs/e/fst/math-s0/cycle0/cycle.json"]


def test_fig9s_default_bar_is_the_ablations_default_fst_run_else_efficiencys_on_their_task():
    ablations = [_run(experiment="ablations", name=f"math-{v}-s{seed}", variant=v, seed=seed)
                 for v, seed in [("k4", 0), ("default", 1), ("default", 0)]]
    efficiency = [_run(experiment="efficiency", name=n, variant=v, seed=seed, eval_tasks=tasks)
                  for n, v, seed, tasks in [("a", "default", 0, ("code",)), ("b", "other", 0, ("math",)),
                                            ("c", "default", 2, ("math",)), ("d", "default", 1, ("math",))]]
    runs = {s.key: s for s in ablations + efficiency}
    assert fig9_default_run(runs).key == "ablations/fst/math-default-s0"
    runs = {s.key: s for s in ablations[:1] + efficiency}
    assert fig9_default_run(runs).key == "efficiency/fst/d"
    assert fig9_default_run({s.key: s for s in efficiency}) is None


def test_an_evaluations_samples_sit_beside_its_summary():
    assert samples_file("r/eval/base/math.json") == "r/eval/base/math.samples.parquet"


def test_a_subset_tables_name_sorts_its_tasks_and_methods_and_reads_back_its_experiment():
    assert curves_table("e", ["b", "a"], "r", ["rl", "fst"]) == "r/tables/curves/subsets/e.a+b.fst+rl.parquet"
    assert table_experiment(curves_table("e", ["b", "a"], "r", ["rl", "fst"])) == "e"
    assert table_experiment(curves_table("e")) == "e"
    with pytest.raises(ValueError, match=r"^curves of 'e': a table of some methods is of some tasks too$"):
        curves_table("e", None, "r", ["rl"])


class _Wildcards(dict):
    def __getattr__(self, name: str) -> str:
        return self[name]


def test_a_curves_tables_wildcards_select_its_tasks_and_methods():
    assert table_filter(_Wildcards(experiment="e")) == (None, None)
    assert table_filter(_Wildcards(experiment="e", tasks="a+b")) == (["a", "b"], None)
    assert table_filter(_Wildcards(experiment="e", tasks="a", methods="fst+rl")) == (["a"], ["fst", "rl"])


def test_a_curves_table_of_no_runs_names_why_in_one_line():
    runs = {s.key: s for s in [_run(), _run(experiment="other")]}
    with pytest.raises(ValueError, match=r"^curves/x\.parquet: experiment 'x' has no runs in the config "
                                         r"\(experiments with runs: e, other\)$"):
        curves_runs(runs, "x")
    with pytest.raises(ValueError, match=r"^curves/subsets/e\.code\.parquet: no run of experiment 'e' is evaluated "
                                         r"on code \(its runs' tasks: math\)$"):
        curves_runs(runs, "e", ["code"])
    with pytest.raises(ValueError, match=r"^curves/subsets/e\.code\.rl\.parquet: no run of experiment 'e' is "
                                         r"evaluated on code"):
        curves_runs(runs, "e", ["code"], ["rl"])  # no run on the task at all: said so, not the method


def test_a_figure_whose_experiment_has_no_runs_is_a_planning_error_naming_it():
    runs = {s.key: s for s in [_run(experiment="efficiency")]}
    with pytest.raises(ValueError, match=r"^fig6 plots experiment 'continual', which the config does not define "
                                         r"\(experiments: efficiency\)$"):
        figure_tables(runs, "fig6")
    assert figure_tables(runs, "fig3", "r") == ["r/tables/curves/efficiency.parquet"]
