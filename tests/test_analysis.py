"""Curve analysis against hand-computed numbers."""

import numpy as np
import pytest

from fastslow.analysis import (
    fit_sigmoid,
    kl_at_matched_reward,
    kl_to_reach,
    no_reward,
    paired_noise_bound,
    reward_onset_note,
    rolling_mean,
    running_max,
    sigmoid,
    steps_to_peak_note,
    steps_to_peak_ratio,
)


def test_running_max():
    assert running_max(np.array([0.1, 0.3, 0.2, 0.5, 0.4])).tolist() == [0.1, 0.3, 0.3, 0.5, 0.5]


def test_steps_to_peak_ratio_hand_computed():
    steps = np.array([0, 10, 20, 30, 40, 50, 60])
    rl = np.array([0.0, 0.1, 0.2, 0.3, 0.35, 0.4, 0.4])  # peak 0.4 first at step 50
    fst = np.array([0.0, 0.3, 0.45, 0.5, 0.5, 0.5, 0.5])  # first >= 0.4 at step 20
    assert steps_to_peak_ratio(steps, rl, steps, fst) == pytest.approx(2.5)
    never = np.array([0.0, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    assert np.isnan(steps_to_peak_ratio(steps, rl, steps, never))
    zeros = np.zeros_like(steps, dtype=float)  # no reward at all: no peak to reach, not "inf x"
    assert np.isnan(steps_to_peak_ratio(steps, zeros, steps, zeros))
    # RL's best is its step-0 value (the base evaluation both share): no steps to compare, not inf
    flat = np.array([0.3, 0.2, 0.25, 0.1, 0.1, 0.1, 0.1])
    assert np.isnan(steps_to_peak_ratio(steps, flat, steps, flat))
    assert steps_to_peak_note(steps, flat, steps, flat) == (
        "RL's best (0.300) is its step-0 evaluation: it never improved, no steps to compare", False)
    assert steps_to_peak_note(steps, rl, steps, never) == (
        "FST never reaches RL's peak (0.400, step 50) by step 60", True)
    assert steps_to_peak_note(steps, rl, steps, fst) == ("", False)
    assert steps_to_peak_note(steps, zeros, steps, zeros) == ("", False)


def test_reward_onset_note_only_when_rl_has_none_and_fst_has_some():
    steps = np.array([0, 3, 6, 9])
    zero, some = np.zeros(4), np.array([0.0, 0.0, 0.5, 0.4])
    assert reward_onset_note(steps, zero, steps, some) == (
        "RL earned no reward in any evaluation up to step 9; FST did from step 6")
    assert reward_onset_note(steps, zero, steps, zero) is None  # neither: "no reward" instead
    assert reward_onset_note(steps, some, steps, zero) is None  # RL has a peak: the ratio applies
    assert reward_onset_note(steps, some, steps, some) is None


def test_sigmoid_formula_by_hand():
    # R0=0.1, A=0.9, C_mid=100, B=2 at C=100: 0.1 + 0.8/2 = 0.5; at C=200: 0.1 + 0.8/(1+0.25) = 0.74
    assert sigmoid(np.array([100.0, 200.0]), 0.1, 0.9, 100.0, 2.0) == pytest.approx([0.5, 0.74])


def test_fit_sigmoid_recovers_known_parameters():
    c = np.linspace(5, 400, 40)
    r = sigmoid(c, 0.05, 0.7, 120.0, 2.5)
    fit = fit_sigmoid(c, r + np.random.default_rng(0).normal(0, 0.005, c.size))
    assert fit.ok
    assert fit.a == pytest.approx(0.7, abs=0.02)
    assert fit.c_mid == pytest.approx(120.0, rel=0.1)
    fixed = fit_sigmoid(c, r, r0=0.05)
    assert fixed.r0 == 0.05 and fixed.a == pytest.approx(0.7, abs=0.01)
    assert fit.identified and fixed.identified


def test_a_curve_still_rising_or_a_failed_fit_has_no_identified_asymptote(monkeypatch):
    c = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    rising = fit_sigmoid(c, c / 100, r0=0.0)  # linear: A runs to its bound, 1.5x the max
    assert rising.ok and not rising.identified and rising.a >= 0.99 * 1.5 * 0.5
    import scipy.optimize

    def fail(*args, **kwargs):
        raise RuntimeError("Optimal parameters not found")

    monkeypatch.setattr(scipy.optimize, "curve_fit", fail)
    failed = fit_sigmoid(c, np.array([0.1, 0.3, 0.4, 0.4, 0.4]), r0=0.0)
    assert not failed.ok and not failed.identified


def test_no_asymptote_above_the_largest_reward():
    """mean@k is a mean of rewards in [0, 1]: a curve still rising past 0.8 had A fitted up to
    1.5x its max, 1.2 and more, above any reward. A now stops at 1, and a fit that ends there
    has not found the curve's level (not identified); a curve that levels below 1 keeps its A."""
    c = np.array([10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    rising = fit_sigmoid(c, 0.3 + c / 100, r0=0.3)  # 0.4 .. 0.9, still rising
    assert rising.ok and rising.a <= 1.0 and not rising.identified
    level = fit_sigmoid(c, sigmoid(c, 0.3, 0.92, 20.0, 3.0), r0=0.3)
    assert level.identified and level.a == pytest.approx(0.92, abs=0.01)
    # a curve levelling off near 1 has found its level, though A is within 1% of the cap: only a
    # cap that binds (the fit without it would go past 1) leaves A unidentified
    steps = np.array([25.0, 50.0, 100.0, 150.0, 200.0, 300.0, 400.0])
    for a in (0.995, 1.0):
        near_one = fit_sigmoid(steps, sigmoid(steps, 0.1, a, 100.0, 3.0), r0=0.1)
        assert near_one.identified and near_one.a == pytest.approx(a, abs=0.002), a
    # ...but noise must not pass for a level: a curve toward 0.97 still rising at its end
    # (N(0, 0.02) draws) whose fit without the cap lands at 0.999, within noise of the cap; and a
    # curve whose max (0.668) leaves A_BOUND x max no room above 1 to tell the two apart
    six = np.array([50.0, 100.0, 150.0, 200.0, 250.0, 300.0])
    noisy = fit_sigmoid(six, np.array([0.098, 0.192, 0.358, 0.529, 0.701, 0.791]), r0=0.1)
    assert noisy.a >= 0.99 and not noisy.identified  # at (within 1% of) the cap
    short = fit_sigmoid(c[:5], np.array([0.2, 0.35, 0.48, 0.58, 0.668]), r0=0.1)
    assert short.a == pytest.approx(1.0) and not short.identified



def test_a_curve_still_rising_slowly_runs_c_mid_to_its_bound_and_is_unidentified():
    """A power law rising slowly from a high start (0.5 + 0.01 C^0.25): the best sigmoid
    through it pushes C_mid to its bound (100x the last C) while A stays well inside its own
    (1.5x the max). Its A is then where the bound put C_mid, not a level the data show. Only the
    A bound was tested; dropping the C_mid clause of `identified` went unnoticed."""
    from fastslow.analysis import A_BOUND, C_MID_BOUND

    c = np.arange(10.0, 110.0, 10.0)
    r = 0.5 + 0.01 * c ** 0.25
    fit = fit_sigmoid(c, r, r0=0.5)
    assert fit.ok and fit.c_mid >= 0.99 * C_MID_BOUND * c.max()
    assert fit.a < 0.9 * A_BOUND * r.max()  # not the A bound: only C_mid's says it is unidentified
    assert not fit.identified


def test_a_curve_without_a_step_0_evaluation_fits_its_start():
    """Fig 3 and the asymptote claim held R0 at the curve's first evaluation, which with
    evaluation.eval_init off is a cycle's end, not the start: A came out low (0.592 for a true
    0.60 below). R0 is held at the step-0 evaluation only; a later first point leaves it fitted."""
    from fastslow.analysis import sigmoid, start_reward

    c = np.array([0.0, 10, 20, 40, 80, 160, 320])
    r = sigmoid(c, 0.05, 0.6, 40.0, 2.0)
    assert start_reward(c, r) == pytest.approx(0.05)
    later = slice(1, None)  # the curve as a run without its step-0 evaluation gives it
    assert start_reward(c[later], r[later]) is None
    free = fit_sigmoid(c[later], r[later], r0=start_reward(c[later], r[later]))
    pinned = fit_sigmoid(c[later], r[later], r0=float(r[1]))
    assert abs(free.a - 0.6) < 1e-3 and abs(pinned.a - 0.6) > 5e-3  # 0.592 pinned


def test_fit_sigmoid_needs_three_points():
    with pytest.raises(ValueError, match="at least 3 points"):
        fit_sigmoid(np.array([0.0, 1.0, 2.0]), np.array([0.0, 0.1, 0.2]))


def test_rolling_mean_by_hand():
    assert rolling_mean(np.array([1.0, 2.0, 3.0, 4.0]), 2).tolist() == [1.0, 1.5, 2.5, 3.5]
    # a missing value shortens only the windows that hold it (it used to make every later one NaN)
    got = rolling_mean(np.array([1.0, 2.0, np.nan, 4.0, 5.0, 6.0, 7.0]), 3)
    assert got.tolist() == [1.0, 1.5, 1.5, 3.0, 4.5, 5.0, 6.0]
    assert np.isnan(rolling_mean(np.array([np.nan, 1.0]), 1)[0])
    with pytest.raises(ValueError):
        rolling_mean(np.array([1.0]), 0)


def test_kl_at_matched_reward_by_hand():
    # Both reach 0.5; FST at KL 0.03, RL at KL 0.10 → 70% less.
    fst_kl, fst_r = np.array([0.0, 0.01, 0.03, 0.05]), np.array([0.1, 0.3, 0.5, 0.6])
    rl_kl, rl_r = np.array([0.0, 0.05, 0.10, 0.2]), np.array([0.1, 0.3, 0.5, 0.5])
    assert kl_at_matched_reward(fst_kl, fst_r, rl_kl, rl_r) == pytest.approx(0.7)
    # an evaluation without a reward (NaN) is skipped: it raised IndexError
    nan_r = np.array([0.1, np.nan, 0.5, 0.6])
    assert kl_at_matched_reward(fst_kl, nan_r, rl_kl, rl_r) == pytest.approx(0.7)
    assert kl_to_reach(fst_kl, nan_r, 0.55) == (0.05, 3)
    assert kl_to_reach(fst_kl, nan_r, 0.7) == (pytest.approx(float("nan"), nan_ok=True), -1)
    assert np.isnan(kl_at_matched_reward(fst_kl, np.full(4, np.nan), rl_kl, rl_r))


def test_mean_at_k_standard_error_is_over_problems_and_curves_read_the_per_problem_means(tmp_path):
    """Per-problem means 0.5, 0, 1: std (ddof 1) 0.5 over sqrt(3) problems. The curves table reads
    the summary's value, or, for a summary from before it was recorded, the samples beside it."""
    import json

    import polars as pl

    from fastslow.curves import _per_problem
    from fastslow.evaluate import summarize

    rewards = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    rows = [{"problem_id": f"p{i}", "reward": r, "completion_tokens": 3}
            for i, pair in enumerate(rewards) for r in pair]
    summary = summarize(rows, k=2)
    assert summary["mean@2"] == pytest.approx(0.5)
    assert summary["mean@2_se"] == pytest.approx(0.5 / np.sqrt(3))
    assert np.isnan(summarize(rows[:2], k=2)["mean@2_se"])  # one problem: unknown
    old = {k: v for k, v in summary.items() if k != "mean@2_se"}
    (tmp_path / "math.json").write_text(json.dumps(old))
    none = _per_problem(old, str(tmp_path / "math.json"))
    assert np.isnan(none["mean_at_k_se"]) and none["problem_ids"] is None
    pl.DataFrame(rows).write_parquet(tmp_path / "math.samples.parquet")
    got = _per_problem(old, str(tmp_path / "math.json"))
    assert got["mean_at_k_se"] == pytest.approx(0.5 / np.sqrt(3))
    assert got["problem_ids"] == ["p0", "p1", "p2"] and got["problem_means"] == [0.5, 0.0, 1.0]
    assert _per_problem(summary, str(tmp_path / "math.json"))["mean_at_k_se"] == summary["mean@2_se"]


def test_the_paired_noise_bound_is_over_common_problems():
    a = {"p0": 0.0, "p1": 0.5, "p2": 1.0, "p3": 0.25}
    b = {"p0": 0.25, "p1": 0.5, "p2": 1.0, "p9": 1.0}  # p3 / p9 unpaired: left out
    d = np.array([0.25, 0.0, 0.0])
    assert paired_noise_bound(a, b) == pytest.approx(2 * d.std(ddof=1) / np.sqrt(3))
    assert paired_noise_bound({k: v + 0.1 for k, v in a.items()}, {k: v + 0.3 for k, v in a.items()}) == pytest.approx(0.0)
    # one problem in common: no standard error, so no difference stands out of noise
    assert paired_noise_bound({"p0": 0.0}, {"p0": 1.0}) == np.inf
    assert np.isnan(paired_noise_bound({}, {"p0": 1.0}))  # no per-problem means (an older table): the rule lapses


def test_an_evaluation_logs_one_line_saying_what_it_measured():
    """A four-line table a job (24 in the main job), its KL and entropy columns NaN when
    evaluation.divergence is off, with no word why; now one line."""
    from fastslow.evaluate import summary_line

    summary = {"run": "base", "point": "init", "task": "physics", "context_id": "seed", "k": 4, "mean@4": 0.03125,
               "mean@4_se": 0.03125, "best@4": 0.125, "problems": 8, "answered_fraction": 0.03125,
               "truncated_fraction": 0.6875, "mean_completion_tokens": 51.53, "kl_to_base": 0.0, "entropy": 2.2884}
    assert summary_line(summary) == (
        "eval physics (seed context): mean@4 0.031 ± 0.031, best@4 0.125 over 8 problems; 3% answered, 69% cut at "
        "the length limit, 51.5 tokens on average; KL to base 0.0000, entropy 2.288")
    off = {**summary, "kl_to_base": None, "entropy": float("nan")}  # (JSON: null; in memory: NaN)
    assert summary_line(off).endswith("51.5 tokens on average; no KL or entropy (evaluation.divergence: false)")
    empty = {**off, "mean_completion_tokens": 0.0}  # every completion an immediate EOS: nothing to measure
    assert summary_line(empty).endswith("; no KL or entropy: no completion tokens to measure them on")


def test_a_tidy_summary_reads_task_first_then_its_scores():
    """A summary read back from its JSON file has its keys sorted by name, and the base model's
    table and its printout came out so: best_at_k, context_id, entropy, k, ... task last."""
    import json

    from fastslow.evaluate import SUMMARY_ORDER, format_table, tidy_summary

    saved = json.loads(json.dumps({"run": "base", "point": "init", "task": "math", "context_id": "seed",
                                   "context_hash": "0123456789ab", "mean@4": 0.25, "mean@4_se": 0.1, "best@4": 0.5, "problems": 8, "k": 4,
                                   "answered_fraction": 0.75, "mean_completion_tokens": 40.0, "truncated_fraction": 0.5, "kl_to_base": 0.0, "entropy": 2.5,
                                   "extra": 1}, sort_keys=True))
    tidy = tidy_summary(saved)
    assert list(tidy) == [*SUMMARY_ORDER, "extra"]
    assert tidy["mean_at_k"] == 0.25 and tidy["best_at_k"] == 0.5
    assert format_table([tidy], list(tidy)).startswith("task  point  context_id  context_hash  mean_at_k  ")


def test_a_table_of_summaries_has_nan_for_what_was_not_measured():
    """The base model's table: JSON has no NaN, so a summary read back says null for KL and
    entropy not measured (`evaluation.divergence` off) and for an untracked run's id. Inferred,
    those columns were polars' Null type and the curves tables' NaN was null here; now each has
    its type, NaN for a number not measured, as in the curves tables."""
    import polars as pl

    from fastslow.evaluate import summaries_frame

    summaries = [{"task": task, "point": "init", "context_id": "seed", "context_hash": "0123456789ab", "k": 2,
                  "mean@2": 0.5, "mean@2_se": 0.1, "best@2": 1.0, "problems": 4, "kl_to_base": None,
                  "entropy": None, "mlflow_run_id": None, "run": "base"} for task in ("math", "hover")]
    table = summaries_frame(summaries)
    assert table.schema["kl_to_base"] == table.schema["entropy"] == pl.Float64
    assert table.schema["mlflow_run_id"] == pl.String and table.schema["problems"] == pl.Int64
    assert table["kl_to_base"].is_nan().all() and table["mlflow_run_id"].is_null().all()
    assert table.columns[:5] == ["task", "point", "context_id", "context_hash", "mean_at_k"]
    # a summary from before context_hash and answered_fraction were kept: the columns are there
    old = summaries_frame([{k: v for k, v in summaries[0].items() if k not in ("context_hash", "answered_fraction")}])
    assert old.columns == table.columns and old["context_hash"].dtype == pl.String
    assert old["answered_fraction"].is_nan().all()


def test_kl_to_reach_orders_evaluations_by_kl_not_by_step():
    """The smallest KL at which the reward reaches a level: evaluations in step order whose KL is
    not monotone (KL can fall between cycles) must be sorted by KL first. The old tests only had
    KL rising with the step, so dropping the sort went unnoticed."""
    kl = np.array([0.0, 0.08, 0.03, 0.05])
    r = np.array([0.1, 0.6, 0.5, 0.2])
    # by KL: 0.0 (0.1), 0.03 (0.5), 0.05 (0.2), 0.08 (0.6): 0.5 is reached at KL 0.03 (index 2)
    assert kl_to_reach(kl, r, 0.5) == (0.03, 2)
    assert kl_to_reach(kl, r, 0.55) == (0.08, 1)
    # the running max is along KL: 0.2 is reached at KL 0.03 (0.5 >= 0.2), not at index 3
    assert kl_to_reach(kl, r, 0.2) == (0.03, 2)


def test_best_at_k_is_the_mean_over_problems_of_each_problems_best_sample():
    """best@k takes each problem's best of its k samples (axis 1 of problems x samples), then
    the mean over problems; nothing checked best@k's number, so a max over problems passed."""
    from fastslow.evaluate import best_at_k, summarize

    rewards = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    assert best_at_k(np.array(rewards)) == pytest.approx(2 / 3)
    rows = [{"problem_id": f"p{i}", "reward": r, "completion_tokens": 3}
            for i, pair in enumerate(rewards) for r in pair]
    assert summarize(rows, k=2)["best@2"] == pytest.approx(2 / 3)
    assert best_at_k(np.array([[0.0, 0.5, 0.25]])) == pytest.approx(0.5)


def test_evaluation_counts_the_samples_cut_at_the_length_limit():
    """Each sample says whether it hit max_new_tokens before an EOS (its generator's
    finish_reason); the summary gives their share, and a summary of rows that do not say
    (a samples table written before) has no share rather than a 0."""
    from slow_toys import LengthTask

    from fastslow.evaluate import sample_and_score, summarize
    from fastslow.model.generation import Generation, SamplingParams

    class Generator:  # one sample in 4 cut at the limit; one in 3 with an answer (of 12: 4)
        def generate(self, conversations, params):
            return [Generation(text="<answer>5</answer>" if i % 3 == 0 else "x", prompt_tokens=5,
                               completion_tokens=params.max_new_tokens,
                               finish_reason="length" if i % 4 == 0 else "stop")
                    for i, _ in enumerate(conversations)]

    task = LengthTask()
    rows = sample_and_score(Generator(), task, task.problems("val", 3, 0), "Be brief.", 4,
                            SamplingParams(7, 1.0, 1.0, 0))
    assert [r["truncated"] for r in rows[:4]] == [True, False, False, False]
    assert summarize(rows, k=4)["truncated_fraction"] == pytest.approx(0.25)
    older = [{key: v for key, v in r.items() if key != "truncated"} for r in rows]
    assert "truncated_fraction" not in summarize(older, k=4)
    # a readable answer, scored wrong or right: told apart from a format failure
    assert [r["answered"] for r in rows[:4]] == [True, False, False, True]
    assert summarize(rows, k=4)["answered_fraction"] == pytest.approx(4 / 12)
    assert "answered_fraction" not in summarize([{key: v for key, v in r.items() if key != "answered"}
                                                 for r in rows], k=4)


def test_each_chunk_of_an_evaluation_samples_with_its_own_seed():
    """Samples stay independent across chunks: each generate call gets a seed of its own
    (evaluation.seed + the chunk's first sample), so a problem's copies in two chunks are not
    drawn from one random stream; the same evaluation seed gives the same seeds again."""
    from slow_toys import LengthTask

    from fastslow.evaluate import sample_and_score
    from fastslow.model.generation import Generation, SamplingParams

    seeds: list[int] = []

    class Generator:
        def generate(self, conversations, params):
            seeds.append(params.seed)
            return [Generation(text="x", prompt_tokens=5, completion_tokens=1) for _ in conversations]

    task = LengthTask()
    sample_and_score(Generator(), task, task.problems("val", 5, 0), "Be brief.", 2, SamplingParams(7, 1.0, 1.0, 100),
                     chunk=4)
    assert seeds == [100, 104, 108]


@pytest.mark.parametrize(("k", "n", "expected"), [
    (0, 2, "evaluate_weights: k: expected an integer >= 1, got 0"),
    (2.0, 2, "evaluate_weights: k: expected an integer >= 1, got 2.0"),
    (2, 0, "evaluate_weights: problems: expected at least one problem, got []"),
    (True, 2, "evaluate_weights: k: expected an integer >= 1, got True"),  # (YAML's `yes`: no count)
])
def test_evaluate_weights_refuses_no_samples_before_loading_a_model(monkeypatch, k, n, expected):
    """k = 0 or no problems returned NaN scores (divergence off), k = 2.0 stopped in range(),
    after the model was loaded."""
    from fastslow import evaluate
    from fastslow.model import convert, generation
    from fastslow.model.generation import SamplingParams
    from fastslow.tasks import get_task

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    for module, name in ((generation, "make_generator"), (convert, "load_model"), (convert, "load_tokenizer")):
        monkeypatch.setattr(module, name, no_model)  # building the generator loads it
    task = get_task("math")
    with pytest.raises(ValueError) as info:
        evaluate.evaluate_weights("no/model", task, task.problems("val", n, 0) if n else [], "ctx", k,
                                  SamplingParams(4), divergence=False)
    assert str(info.value) == expected


class _FakeSampler:
    """An HF generator as `evaluate_weights` sees it (`model`, `tokenizer`, prompt ids reported),
    recording the size of each generate call; no model is loaded."""

    def __init__(self) -> None:
        import torch

        self.model = torch.nn.Linear(1, 1)
        self.tokenizer = object()
        self.sizes: list[int] = []

    def generate(self, conversations, params):
        from fastslow.model.generation import Generation

        self.sizes.append(len(conversations))
        return [Generation(text="xx", prompt_tokens=2, completion_tokens=1, prompt_ids=(1, 2), completion_ids=(3,))
                for _ in conversations]


def _fake_evaluation(monkeypatch, **kwargs):
    """`evaluate_weights` of a `_FakeSampler`, with the KL pass and model loading recorded: the
    summary, the sampler, the (policy, base) pairs the KL pass got and the paths loaded."""
    from slow_toys import LengthTask

    from fastslow import evaluate
    from fastslow.model import convert, generation
    from fastslow.model.generation import SamplingParams
    from fastslow.slow import divergence

    sampler, pairs, loaded = _FakeSampler(), [], []
    monkeypatch.setattr(generation, "make_generator", lambda *args, **kw: sampler)
    monkeypatch.setattr(convert, "load_model", lambda path, **kw: loaded.append(str(path)) or object())
    monkeypatch.setattr(divergence, "kl_and_entropy",
                        lambda model, base, *args, **kw: pairs.append((model, base)) or (0.25, 1.5))
    task = LengthTask()
    model_dir = kwargs.pop("model_dir")
    summary, _ = evaluate.evaluate_weights(model_dir, task, task.problems("val", kwargs.pop("n", 3), 0), "ctx",
                                           kwargs.pop("k", 2), SamplingParams(4, 1.0, 1.0, 0), **kwargs)
    return summary, sampler, pairs, loaded


def test_an_evaluation_against_its_own_weights_loads_no_base_and_reports_no_kl(monkeypatch, tmp_path):
    """`base_dir` naming the evaluated weights (however spelled) is the base model's evaluation:
    its policy is its base, no second copy is loaded (an 8B model twice on the GPU), and its KL is
    0; another base directory is loaded and its KL reported."""
    model_dir = tmp_path / "model"
    summary, _, pairs, loaded = _fake_evaluation(monkeypatch, model_dir=model_dir,
                                                 base_dir=tmp_path / "x" / ".." / "model")
    assert loaded == [] and [model is base for model, base in pairs] == [True]
    assert (summary["kl_to_base"], summary["entropy"]) == (0.0, 1.5)
    summary, _, pairs, loaded = _fake_evaluation(monkeypatch, model_dir=model_dir, base_dir=tmp_path / "base")
    assert loaded == [str(tmp_path / "base")] and [model is base for model, base in pairs] == [False]
    assert (summary["kl_to_base"], summary["entropy"]) == (0.25, 1.5)


def test_an_hf_evaluation_samples_32_prompts_a_generate_call_whatever_its_batch_size(monkeypatch, tmp_path):
    """The HF generator batches within a call (`batch_size` rows a forward pass), so an
    evaluation hands it 32 prompts a call, as the chunk seeds (`params.seed + lo`) assume; vLLM
    gets `batch_size` prompts a call (test_evaluate_gpu)."""
    _, sampler, _, _ = _fake_evaluation(monkeypatch, model_dir=tmp_path / "model", n=20, k=2, batch_size=2,
                                        divergence=False)
    assert sampler.sizes == [32, 8]


def test_progress_inside_a_later_chunk_counts_the_samples_of_the_chunks_before(caplog):
    """A generator that reports its batches gets a line per batch inside a chunk; in the second
    chunk the count goes on from the first chunk's samples (it restarted at the chunk's own)."""
    import logging

    from slow_toys import LengthTask

    from fastslow.evaluate import sample_and_score
    from fastslow.model.generation import Generation, SamplingParams

    class Batched:  # two batches a call, each reported
        on_batch = None

        def generate(self, conversations, params):
            half = len(conversations) // 2
            self.on_batch(half, len(conversations))
            self.on_batch(len(conversations), len(conversations))
            return [Generation(text="x", prompt_tokens=1, completion_tokens=1) for _ in conversations]

    task = LengthTask()
    with caplog.at_level(logging.INFO, logger="fastslow.evaluate"):
        sample_and_score(Batched(), task, task.problems("val", 4, 0), "Be brief.", 2, SamplingParams(3, 1.0, 1.0, 0),
                         chunk=4)
    lines = [r.getMessage() for r in caplog.records if r.name == "fastslow.evaluate"]
    assert [line.split(", ")[0] for line in lines] == [f"eval length: {n}/8 samples" for n in (2, 4, 6, 8)]


def test_curves_put_each_point_at_the_rl_steps_behind_it(tmp_path):
    """`build_curves`: the initial weights are step 0 (cycle -1, no training task) and the
    evaluation after cycle c is at (c + 1) * T, with T = slow.steps_per_cycle of the run's own
    settings, so methods compare at matched steps. No unit test built the table, so cycle * T
    (the last cycle one T short, cycle 0 on top of the initial point) passed."""
    import json

    from fastslow.curves import build_curves
    from fastslow.experiments import RunSpec
    from fastslow.layout import cycle_dir, eval_point_file

    results = str(tmp_path)
    spec = RunSpec("efficiency", "rl", "math-s0", ("math", "math", "hover"), seed=0, eval_tasks=("math",),
                   overrides={"slow": {"steps_per_cycle": 5}}, eval_every=2)
    points = {"init": 0.1, "cycle1": 0.3, "cycle2": 0.4}  # eval_every 2: cycle 0 is not evaluated
    for point, mean in points.items():
        path = tmp_path / eval_point_file(spec, point, "math", results).removeprefix(results + "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"k": 2, "mean@2": mean, "mean@2_se": 0.01, "best@2": mean + 0.1}))
    for c in (0, 1, 2):  # (cycle 0's sequences count in the later points' samples)
        d = tmp_path / cycle_dir(spec, c, results).removeprefix(results + "/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "cycle.json").write_text(json.dumps({"seconds": 10.0 * c, "rollouts_sampled": 30 + c}))
    rows = build_curves({spec.key: spec}, "efficiency", {"slow": {"steps_per_cycle": 100}, "fast": {}}, results)
    got = [(r["cycle"], r["step"], r["train_task"], r["mean_at_k"], r["cycle_seconds"], r["rollouts_sampled"])
           for r in rows]
    assert got == [(-1, 0, None, 0.1, None, 0), (1, 10, "math", 0.3, 10.0, 30 + 31), (2, 15, "hover", 0.4, 20.0, 93)]
    # each point's samples, under the results directory: the initial weights' are the base model's
    assert [r["samples_file"] for r in rows] == ["eval/base/math.samples.parquet",
                                                 "runs/efficiency/rl/math-s0/eval/cycle1/math.samples.parquet",
                                                 "runs/efficiency/rl/math-s0/eval/cycle2/math.samples.parquet"]
    assert [r["context_hash"] for r in rows] == [None, None, None]  # summaries from before it was kept
    # a cycle file from before the count was kept: no count from that cycle on
    (tmp_path / cycle_dir(spec, 1, results).removeprefix(results + "/") / "cycle.json").write_text("{}")
    rows = build_curves({spec.key: spec}, "efficiency", {"slow": {"steps_per_cycle": 100}, "fast": {}}, results)
    assert [r["rollouts_sampled"] for r in rows] == [0, None, None]


def _curve_files(tmp_path, spec, summaries, cycles):
    """Write `spec`'s evaluation summaries ({(point, task): summary}) and cycle.json files
    ({cycle: info}) under `tmp_path`, as the workflow lays them out."""
    import json

    from fastslow.layout import cycle_dir, eval_point_file

    results = str(tmp_path)
    for (point, task), summary in summaries.items():
        path = tmp_path / eval_point_file(spec, point, task, results).removeprefix(results + "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary))
    for c, info in cycles.items():
        d = tmp_path / cycle_dir(spec, c, results).removeprefix(results + "/")
        d.mkdir(parents=True, exist_ok=True)
        (d / "cycle.json").write_text(json.dumps(info))


def test_a_curve_row_carries_each_summary_and_cycle_value_in_its_own_column(tmp_path):
    """`build_curves` names the run by the directory it read (a shared run's: `source`), its
    method, variant, seed and initial weights, and copies each summary's and cycle.json's values
    into their own columns: best@k apart from mean@k, KL apart from entropy, the answered share
    apart from the truncated one. A summary from before a value was kept has NaN (a number),
    None (a hash, a run id) or the seed context; cycle 0's own cycle.json is read too. Only the
    point-1 test built the table, so swapped columns and the fallbacks went unseen."""
    from fastslow.curves import build_curves
    from fastslow.experiments import RunSpec

    spec = RunSpec("plasticity", "fst", "hover-s3", ("hover", "hover"), seed=3, variant="k1",
                   init="efficiency/rl/math-s0", eval_tasks=("hover",), shared="plasticity/fst/hover-first-s3")
    full = {"k": 4, "mean@4": 0.25, "mean@4_se": 0.05, "best@4": 0.5, "kl_to_base": 0.02, "entropy": 1.5,
            "answered_fraction": 0.9, "mean_completion_tokens": 120.0, "truncated_fraction": 0.1,
            "context_id": "r0-abcdef12", "context_hash": "abcdef123456", "mlflow_run_id": "eval-0"}
    old = {"k": 4, "mean@4": 0.0, "mean@4_se": 0.0, "best@4": 0.0}
    _curve_files(tmp_path, spec, {("init", "hover"): old, ("cycle0", "hover"): full, ("cycle1", "hover"): full},
                 {0: {"seconds": 30.0, "cpu_share": 0.75, "rollouts_sampled": 8, "mlflow_run_id": "cycle-0"},
                  1: {"seconds": 40.0}})
    config = {"slow": {"steps_per_cycle": 10}, "fast": {"pool_size": 2}}
    init, cycle0, cycle1 = build_curves({spec.key: spec}, "plasticity", config, str(tmp_path))
    assert {k: cycle0[k] for k in ("experiment", "method", "run", "variant", "seed", "init", "eval_task")} == {
        "experiment": "plasticity", "method": "fst", "run": "plasticity/fst/hover-first-s3", "variant": "k1",
        "seed": 3, "init": "efficiency/rl/math-s0", "eval_task": "hover"}
    assert {k: cycle0[k] for k in ("mean_at_k", "mean_at_k_se", "best_at_k", "k", "kl_to_base", "entropy",
                                   "answered_fraction", "mean_completion_tokens", "truncated_fraction",
                                   "context_id", "context_hash", "eval_run_id")} == {
        "mean_at_k": 0.25, "mean_at_k_se": 0.05, "best_at_k": 0.5, "k": 4, "kl_to_base": 0.02, "entropy": 1.5,
        "answered_fraction": 0.9, "mean_completion_tokens": 120.0, "truncated_fraction": 0.1,
        "context_id": "r0-abcdef12", "context_hash": "abcdef123456", "eval_run_id": "eval-0"}
    assert (cycle0["cycle_seconds"], cycle0["cycle_cpu_share"], cycle0["cycle_run_id"]) == (30.0, 0.75, "cycle-0")
    # a cycle.json from before the CPU share, the count and the run id were kept
    assert (cycle1["cycle_seconds"], cycle1["cycle_cpu_share"], cycle1["cycle_run_id"]) == (40.0, None, None)
    assert (cycle1["rollouts_sampled"], init["rollouts_sampled"]) == (None, 0)
    assert all(np.isnan(init[k]) for k in ("kl_to_base", "entropy", "answered_fraction",
                                           "mean_completion_tokens", "truncated_fraction"))
    assert (init["context_id"], init["context_hash"], init["eval_run_id"]) == ("seed", None, None)
    assert (init["cycle_seconds"], init["cycle_cpu_share"], init["cycle_run_id"]) == (None, None, None)
    base = RunSpec("plasticity", "rl", "hover-s0", ("hover",), seed=0, eval_tasks=("hover",), eval_init=False)
    _curve_files(tmp_path, base, {("cycle0", "hover"): old}, {0: {"seconds": 1.0}})
    (row,) = build_curves({base.key: base}, "plasticity", config, str(tmp_path))
    assert (row["init"], row["run"]) == ("base", "plasticity/rl/hover-s0")


def test_curves_of_some_tasks_or_methods_read_only_those_evaluations(tmp_path):
    """`tasks` keeps a run's evaluations on those tasks only (the run's others are not read),
    `methods` the runs of those methods only; a missing cycle.json behind an evaluated point is
    a one-line FileNotFoundError naming it."""
    from fastslow.curves import build_curves
    from fastslow.experiments import RunSpec

    spec = RunSpec("efficiency", "fst", "math-s0", ("math",), seed=0, eval_tasks=("math", "hover"), eval_init=False)
    summary = {"k": 2, "mean@2": 0.5, "mean@2_se": 0.1, "best@2": 1.0}
    _curve_files(tmp_path, spec, {("cycle0", "math"): summary, ("cycle0", "hover"): summary}, {0: {"seconds": 1.0}})
    config, runs, results = {"slow": {"steps_per_cycle": 10}, "fast": {"pool_size": 2}}, {spec.key: spec}, str(tmp_path)
    assert [r["eval_task"] for r in build_curves(runs, "efficiency", config, results)] == ["math", "hover"]
    assert [r["eval_task"] for r in build_curves(runs, "efficiency", config, results, tasks=("hover",))] == ["hover"]
    (tmp_path / "runs/efficiency/fst/math-s0/eval/cycle0/math.json").unlink()  # not read for hover alone
    assert [r["eval_task"] for r in build_curves(runs, "efficiency", config, results, tasks=("hover",))] == ["hover"]
    assert build_curves(runs, "efficiency", config, results, tasks=("hover",), methods=("rl",)) == []
    assert len(build_curves(runs, "efficiency", config, results, tasks=("hover",), methods=("fst",))) == 1
    (tmp_path / "runs/efficiency/fst/math-s0/cycle0/cycle.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"^\S+/runs/efficiency/fst/math-s0/cycle0/cycle.json: no such file$"):
        build_curves(runs, "efficiency", config, results, tasks=("hover",))


def test_a_points_standard_error_is_its_summarys_when_recorded_and_its_problem_means_are_sorted_by_id(tmp_path):
    """The summary's mean@k standard error is kept even where the samples beside it would give
    another (it is the one the evaluation measured), also without samples; the per-problem
    means follow their ids, sorted."""
    import polars as pl

    from fastslow.curves import _per_problem

    summary = {"k": 2, "mean@2": 0.5, "mean@2_se": 0.125, "best@2": 1.0}
    assert _per_problem(summary, str(tmp_path / "math.json")) == {
        "mean_at_k_se": 0.125, "problem_ids": None, "problem_means": None}
    ids = ["p9", "p3", "p7", "p1", "p5", "p0", "p8", "p2", "p6", "p4"]
    rewards = {pid: int(pid[1]) / 10 for pid in ids}
    pl.DataFrame({"problem_id": [p for p in ids for _ in range(2)],
                  "reward": [rewards[p] for p in ids for _ in range(2)]}).write_parquet(tmp_path / "math.samples.parquet")
    got = _per_problem(summary, str(tmp_path / "math.json"))
    assert got["mean_at_k_se"] == 0.125
    assert got["problem_ids"] == sorted(ids) and got["problem_means"] == [i / 10 for i in range(10)]


def test_a_centred_rolling_mean_runs_from_the_first_point_to_the_last():
    """Fig 4/11's line: a centred mean of 3 inside, the end points as they are."""
    assert rolling_mean(np.array([0.0, 0.03, 0.06, 0.12]), 3, center=True).tolist() == pytest.approx(
        [0.0, 0.03, 0.07, 0.12])
    assert rolling_mean(np.array([0.1, 0.3]), 3, center=True).tolist() == [0.1, 0.3]
    assert rolling_mean(np.array([0.5]), 3, center=True).tolist() == [0.5]


def test_no_reward_skips_missing_evaluations():
    """A missing (NaN) mean@k is no reward: zeros with a gap are still "no reward", and all-missing is too."""
    assert no_reward(np.array([0.0, np.nan, 0.0]), np.array([0.0]))
    assert no_reward(np.array([np.nan]))
    assert not no_reward(np.array([0.0, np.nan, 0.25]))


def test_steps_to_peak_ratio_of_a_curve_starting_after_step_0_without_reward():
    """A reference that never earns reward has no peak to reach, even when its first evaluation is after step 0 (eval_init off)."""
    steps = np.array([10, 20, 30])
    assert np.isnan(steps_to_peak_ratio(steps, np.zeros(3), steps, np.zeros(3)))
    assert np.isnan(steps_to_peak_ratio(steps, np.zeros(3), steps, np.array([0.0, 0.5, 0.5])))


def test_a_centred_rolling_mean_of_an_even_window_keeps_window_half_points_at_each_end():
    """`center=True` keeps the first and last `window // 2` points as they are, for even windows too."""
    assert rolling_mean(np.array([0.0, 1.0, 2.0, 4.0]), 2, center=True).tolist() == [0.0, 0.5, 1.5, 4.0]
    assert rolling_mean(np.array([0.0, 1.0, 2.0, 4.0, 8.0]), 4, center=True).tolist() == [0.0, 1.0, 1.75, 4.0, 8.0]


def test_mean_and_best_at_k_of_a_skewed_matrix_and_of_no_problems():
    """mean@k is the mean of every sample (not their median, which equals it on the symmetric
    matrices above); no problems give NaN, not a score of 0."""
    from fastslow.evaluate import best_at_k, mean_at_k

    rewards = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert mean_at_k(rewards) == pytest.approx(1 / 6) and best_at_k(rewards) == pytest.approx(0.5)
    assert np.isnan(mean_at_k(np.zeros((0, 4)))) and np.isnan(best_at_k(np.zeros((0, 4))))


def test_a_summary_counts_tokens_by_their_mean_and_drops_a_share_some_rows_lack():
    """mean_completion_tokens is the mean (1, 1, 10 tokens: 4, the median would say 1); rows
    mixing old samples (no `truncated` / `answered`) with new ones give no share rather than a
    KeyError; more samples than k is the same one-line error as fewer."""
    from fastslow.evaluate import summarize

    rows = [{"problem_id": "p0", "reward": 1.0, "completion_tokens": 1, "truncated": False, "answered": True},
            {"problem_id": "p1", "reward": 0.0, "completion_tokens": 1},
            {"problem_id": "p2", "reward": 0.0, "completion_tokens": 10}]
    summary = summarize(rows, k=1)
    assert summary["mean_completion_tokens"] == pytest.approx(4.0)
    assert "truncated_fraction" not in summary and "answered_fraction" not in summary
    with pytest.raises(ValueError, match=r"^expected 1 samples per problem, got \[1, 2\] \(problem 'p0' has 2\)$"):
        summarize([*rows, rows[0]], k=1)


def test_summary_tables_format_their_numbers_and_leave_out_the_run_ids():
    """A log table: left-aligned columns as wide as their longest cell, floats to 3 places, and
    (`summary_table`) no MLflow run id columns."""
    from fastslow.evaluate import format_table, summary_table

    summaries = [{"task": "hover_hard", "k": 4, "mean_at_k": 0.123456, "mlflow_run_id": "abc", "cycle_run_id": None}]
    assert format_table(summaries, ["task", "k", "mean_at_k"]) == (
        "task        k  mean_at_k\n----------  -  ---------\nhover_hard  4  0.123    ")
    assert summary_table(summaries) == format_table(summaries, ["task", "k", "mean_at_k"])


def test_run_ids_read_the_cycle_job_beside_the_pool(tmp_path):
    """`cycle_run_id` is the `mlflow_run_id` of the cycle.json beside the evaluated pool (None
    without one); a point without a pool (the base model) has no such key."""
    import json
    from types import SimpleNamespace

    from fastslow.evaluate import run_ids

    tracker = SimpleNamespace(run_id="eval-run")
    (tmp_path / "c0").mkdir()
    (tmp_path / "c0" / "cycle.json").write_text(json.dumps({"mlflow_run_id": "cycle-run", "run_id": "other"}))
    assert run_ids(tracker, tmp_path / "c0" / "pool.json") == {"mlflow_run_id": "eval-run", "cycle_run_id": "cycle-run"}
    assert run_ids(tracker, str(tmp_path / "pool.json")) == {"mlflow_run_id": "eval-run", "cycle_run_id": None}
    assert run_ids(None) == {"mlflow_run_id": None}


def test_sample_and_score_rows_keep_the_tasks_reward_and_give_the_generator_back():
    """Each row carries the task's reward as it is (a fractional one too), rows run problem by
    problem, and the generator's own `on_batch` hook is restored after the evaluation."""
    from slow_toys import LengthTask

    from fastslow.evaluate import sample_and_score
    from fastslow.model.generation import Generation, SamplingParams

    def hook(done, total):
        pass

    class Generator:
        on_batch = None

        def generate(self, conversations, params):
            return [Generation(text="xx", prompt_tokens=5, completion_tokens=2) for _ in conversations]

    gen = Generator()
    gen.on_batch = hook
    task = LengthTask()  # reward: (characters % 5) / 4, so "xx" scores 0.5
    rows = sample_and_score(gen, task, task.problems("val", 2, 0), "Be brief.", 2, SamplingParams(7, 1.0, 1.0, 0))
    assert [r["reward"] for r in rows] == [0.5] * 4
    assert [(r["problem_id"], r["sample"]) for r in rows] == [("p0", 0), ("p0", 1), ("p1", 0), ("p1", 1)]
    assert gen.on_batch is hook


def test_the_onset_note_names_rls_last_step_and_fsts_own_first_rewarded_step():
    """The note reads RL's steps for "up to step" and FST's for "from step"; every test gave
    both curves one step array, so reading either for both went unnoticed."""
    rl_steps, fst_steps = np.array([0, 5, 10, 15, 20]), np.array([0, 4, 8])
    assert reward_onset_note(rl_steps, np.zeros(5), fst_steps, np.array([0.0, 0.25, 0.5])) == (
        "RL earned no reward in any evaluation up to step 20; FST did from step 4")
    assert steps_to_peak_note(rl_steps, np.array([0.0, 0.1, 0.4, 0.4, 0.4]), fst_steps,
                              np.array([0.0, 0.1, 0.3])) == ("FST never reaches RL's peak (0.400, step 10) by step 8",
                                                             True)


def test_a_curve_reaching_the_peak_at_step_0_while_the_reference_needs_steps_is_infinitely_faster():
    steps = np.array([0, 10, 20])
    assert steps_to_peak_ratio(steps, np.array([0.0, 0.2, 0.4]), steps, np.array([0.5, 0.5, 0.5])) == np.inf
    assert steps_to_peak_note(steps, np.array([0.0, 0.2, 0.4]), steps, np.array([0.5, 0.5, 0.5])) == ("", False)


def test_the_escape_step_is_the_first_mean_above_two_standard_errors_or_above_0_without_one():
    from fastslow.analysis import escape_step

    steps = np.array([0, 10, 20, 30])
    # step 10: 0.1 is 2 x 0.05 exactly (not above); step 20: 0.15 > 2 x 0.05 (1 SE would pass step 10)
    assert escape_step(steps, np.array([0.0, 0.1, 0.15, 0.3]), np.array([0.0, 0.05, 0.05, 0.05])) == 20.0
    # no standard error kept: above 0 is enough, and 0 itself is not above it
    assert escape_step(steps, np.array([0.0, 0.0, 0.01, 0.3])) == 20.0
    assert escape_step(steps, np.array([0.0, 0.02, 0.5, 0.5]), np.array([np.nan, np.nan, 0.1, 0.1])) == 10.0
    assert np.isnan(escape_step(steps, np.zeros(4), np.full(4, 0.1)))


def test_the_answered_share_is_the_mean_over_the_rows_that_record_it():
    """A NaN or null share (a row from before it was kept) and a frame without the column count
    for nothing: the mean is over the rows that say it."""
    import polars as pl

    from fastslow.analysis import answered_share

    recorded = pl.DataFrame({"answered_fraction": [0.5, None, 1.0]})
    nan = pl.DataFrame({"answered_fraction": [float("nan"), 0.0, 0.3]})
    old = pl.DataFrame({"mean_at_k": [0.0, 0.0]})
    assert answered_share(recorded, nan, old) == pytest.approx(0.45)  # (0.5 + 1.0 + 0.0 + 0.3) / 4
    assert answered_share(old) is None and answered_share() is None


def test_b_reaching_the_matched_reward_at_kl_0_gives_no_reduction():
    """1 - KL_A / KL_B has no value when B reaches the level at KL 0 (its step-0 evaluation): NaN,
    not a ZeroDivisionError."""
    kl = np.array([0.0, 0.02, 0.04])
    assert np.isnan(kl_at_matched_reward(kl, np.array([0.1, 0.3, 0.5]), kl, np.array([0.5, 0.5, 0.5])))


def test_a_fit_with_too_little_room_above_1_to_tell_keeps_a_capped_asymptote_unidentified():
    """A clean curve toward 1 seen only up to 0.69: A_BOUND x its max (1.036) leaves less than
    A_CAP_ROOM above 1, so the fit without the cap cannot tell a level at 1 from a curve still
    rising: A stays at the cap, unidentified (a check of any room above 1 called it identified)."""
    c = np.array([25.0, 50.0, 75.0, 100.0, 124.0])
    fit = fit_sigmoid(c, sigmoid(c, 0.1, 1.0, 100.0, 3.0), r0=0.1)
    assert fit.ok and fit.a == pytest.approx(1.0, abs=1e-3) and not fit.identified


def test_no_matched_reward_when_either_curve_has_no_evaluation_whichever_comes_first():
    """The highest reward both reach is NaN when either curve has no finite evaluation: Python's
    min() kept a NaN only in first place, so (all-NaN, curve) gave NaN but (curve, all-NaN) the
    curve's own max, a level the other never reached."""
    from fastslow.analysis import matched_reward

    curve, missing = np.array([0.1, 0.5, np.nan]), np.full(3, np.nan)
    assert matched_reward(curve, np.array([0.2, 0.4])) == pytest.approx(0.4)
    assert np.isnan(matched_reward(missing, curve)) and np.isnan(matched_reward(curve, missing))


def test_a_curve_with_its_start_fitted_is_judged_at_the_cap_by_its_asymptote():
    """Without a step-0 evaluation R0 is fitted too (A second among the parameters): the fit
    without the cap must lift A's bound and read A's value. A curve toward 1.1 still rising at
    0.87 stays unidentified; one levelling at 1 is identified."""
    c = np.array([50.0, 100.0, 150.0, 200.0, 250.0, 300.0])
    rising = fit_sigmoid(c, sigmoid(c, 0.1, 1.1, 200.0, 3.0))
    assert rising.ok and rising.a == pytest.approx(1.0) and not rising.identified
    steps = np.array([25.0, 50.0, 100.0, 150.0, 200.0, 300.0, 400.0])
    level = fit_sigmoid(steps, sigmoid(steps, 0.1, 1.0, 100.0, 3.0))
    assert level.identified and level.a == pytest.approx(1.0, abs=0.002)


def test_an_infinite_value_is_missing_in_a_rolling_mean():
    """A non-finite value is null like NaN: only the windows holding it are short of it."""
    assert rolling_mean(np.array([1.0, np.inf, 3.0, -np.inf, 5.0]), 2).tolist() == [1.0, 1.0, 3.0, 3.0, 5.0]
    assert rolling_mean(np.array([1.0, np.inf, 3.0, 4.0, 5.0]), 3, center=True).tolist() == [1.0, 2.0, 3.5, 4.0, 5.0]
