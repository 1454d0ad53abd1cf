"""The paper's headline claims, measured on our curves, side by side with the paper's numbers.

A verdict needs the difference to stand out of evaluation noise: the asymptote gap and the
plasticity gain are "undetermined" (with a note giving both numbers) when the two methods'
final evaluations differ by at most two standard errors of their paired difference: per val
problem, the difference of the two mean rewards (each averaged over seeds: every run is scored
on the same problems), its spread over the square root of the number of problems
(`fastslow.analysis.paired_noise_bound`). The same rule judges a continual stage's recovery (the
two methods' best evaluations in the stage, seeds averaged per step), the forgetting of an
earlier stage's task (the two methods' drops from the stage's end), Fig 8's ceiling (FST's final
evaluation against GEPA-only's), and "FST never reaches RL's peak" (RL's peak against FST's best)
before it refutes the step ratio. Fig 7's escape from zero
reward is an evaluation's mean@k above 2 of its own standard errors, and the method that escapes
first must stand out of the paired noise against the other's best by then; a tie (both reaching
RL's peak, or leaving zero reward, at one evaluation) is no verdict. A toy run where one sample
of 32 is right is not a reproduction. The rule needs the curves' per-problem means
(`problem_ids`, `problem_means`); without them it is not applied (and the step ratio is not
refuted). The step ratio is judged at the step where the first method reaches RL's peak: that
evaluation against the other method's best by then. The KL reduction must keep its sign when
the other side is credited with noise: the matched reward lowered, for it, by 2 standard errors
of the paired difference of the two matched evaluations. (Before, two runs of one method gave
"reproduced" for the step ratio in 30% and for the KL reduction in 50% of simulated pairs, now in
2.2% and 1.8%: bench/claims_noise.py.)
Fig 10's wall-time ratio is judged on its cycles' spread (Welch's t; its note gives the reward
difference). Every rule
is over evaluation noise only: with one training seed (the paper config's), run-to-run variance
is not in it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from fastslow.analysis import (
    answered_share,
    escape_step,
    first_step_reaching,
    fit_sigmoid,
    kl_at_matched_reward,
    kl_to_reach,
    matched_reward,
    no_reward,
    paired_noise_bound,
    reward_onset_note,
    running_max,
    start_reward,
    steps_to_peak_note,
    steps_to_peak_ratio,
)
from fastslow.experiments import run_tasks
from fastslow.figures import (
    cpu_shares,
    cycle_seconds_per_step,
    headline_tables,
    normalised_continual,
    rows_where,
    seed_curve,
    stage_ends,
    unequal_cpu,
)
from fastslow.layout import CLAIM_FIGURE_NAMES, CLAIM_FIGURES

#: The paper's values (arXiv 2605.12484) for each claim and task, as stated in its figures.
PAPER = {
    ("sample_efficiency_ratio", "codeio"): 3.0,
    ("sample_efficiency_ratio", "math"): 1.4,
    ("sample_efficiency_ratio", "hover_hard"): 3.0,
    ("kl_reduction_at_matched_reward", "*"): 0.70,  # "up to 70% less KL"
    ("zero_reward_escape", "*"): 6.0,  # Fig 7: FST leaves zero reward by about step 50, RL by about 300
    ("reuse_speedup", "*"): 100 / 47,  # Fig 10 / cost: FST ~100 s per RL step, with reuse ~47 (8xH100)
}
CLAIM_TEXT = {
    "sample_efficiency_ratio": "FST reaches RL's peak in fewer steps (RL steps to peak / FST steps); > 1 reproduces",
    "asymptote_gap": "FST's fitted asymptote A exceeds RL's (A_FST − A_RL); > 0 reproduces",
    "kl_reduction_at_matched_reward": "FST needs less KL to the base at matched reward (1 − KL_FST/KL_RL); > 0 reproduces",
    "plasticity_gain": "fresh RL from FST weights ends higher than from RL weights (final mean@k gap); > 0 reproduces",
    "continual_stage_recovery": "FST's best normalised accuracy in a stage minus RL's; ≥ 0 reproduces",
    "zero_reward_escape": ("FST leaves zero reward in fewer steps (RL's first step with mean@k above 2 "
                           "standard errors / FST's); > 1 reproduces"),
    "continual_forgetting": ("RL's drop on an earlier stage's task, from the stage's end to the last "
                             "evaluation, minus FST's (seeds averaged; FST's with its pool's best context of "
                             "the time, so weights and context together; the abstract's claim, which Fig 6 "
                             "does not draw); > 0 reproduces"),
    "ceiling_exceeded": ("FST's final val mean@k minus the prompt-only ceiling's (GEPA on frozen weights, "
                         "Fig 8); > 0 reproduces"),
    "reuse_speedup": ("rollout reuse makes FST's RL steps cheaper (wall seconds per RL step without reuse / "
                      "with it, fast rounds included); > 1 reproduces"),
}

#: The curves tables each claim reads (`build_claims`): a row whose table was cut to its headline
#: variant (`headline_tables`) says in its note which variants were left out.
CLAIM_TABLES: dict[str, tuple[str, ...]] = {
    "sample_efficiency_ratio": ("efficiency",), "asymptote_gap": ("efficiency",),
    "kl_reduction_at_matched_reward": ("efficiency",), "plasticity_gain": ("plasticity",),
    "continual_stage_recovery": ("continual",), "continual_forgetting": ("continual",),
    "zero_reward_escape": ("stargraph",), "ceiling_exceeded": ("ceiling", "efficiency"),
    "reuse_speedup": ("reuse",),
}

#: The claims table's columns, in order.
CLAIM_COLUMNS: dict[str, Any] = {"claim": pl.String, "figures": pl.String, "task": pl.String,
                                 "measured": pl.Float64, "paper": pl.Float64, "verdict": pl.String,
                                 "meaning": pl.String, "runs": pl.String, "note": pl.String}


def claims_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Claim rows (`build_claims`) as the claims table, its columns in `CLAIM_COLUMNS`' order and
    types (an empty table has them too)."""
    return pl.DataFrame(rows, schema=CLAIM_COLUMNS)


def figure_claims(tables: Mapping[str, pl.DataFrame], fig: str) -> list[dict[str, Any]]:
    """The claims `fig` shows (`CLAIM_FIGURES`), measured on the curves tables it reads alone: a
    reviewer who rebuilds one figure gets its verdicts without every other experiment."""
    if fig not in CLAIM_FIGURE_NAMES:
        raise ValueError(f"{fig} shows no claim of the paper's; figures with claims: {', '.join(CLAIM_FIGURE_NAMES)}")
    return [row for row in build_claims(tables) if fig in CLAIM_FIGURES[row["claim"]]]


def _final_problems(df: pl.DataFrame, step: int | None = None, **where: Any) -> dict[str, float]:
    """Problem id -> mean reward at each matching run's last evaluation (or at `step`), averaged
    over the runs (seeds); {} when a run has no per-problem means (curve tables from before they
    were kept)."""
    df = rows_where(df, **where)
    if "problem_ids" not in df.columns or not df.height:
        return {}
    last = df.filter(pl.col("step") == (pl.col("step").max().over("run") if step is None else step))
    if not last.height or last["problem_ids"].null_count():
        return {}
    per = (last.select("problem_ids", "problem_means").explode(["problem_ids", "problem_means"])
           .group_by("problem_ids").agg(pl.col("problem_means").mean()))
    return dict(zip(per["problem_ids"].to_list(), per["problem_means"].to_list(), strict=True))


def _best_step(norm: pl.DataFrame) -> tuple[float, float, int | None]:
    """(normalised, mean@k, step) of the best evaluation in `norm` (one method's seed-averaged
    evaluations in a continual stage, `normalised_continual`); NaNs and None when none has a
    normalised accuracy (no reward in the stage). A NaN (an evaluation without a mean@k) is
    skipped like a null: polars sorts NaN above every number, so it would be read as the best."""
    norm = norm.drop_nulls("normalised").filter(pl.col("normalised").is_not_nan())
    if not norm.height:
        return float("nan"), float("nan"), None
    top = norm.sort(["normalised", "step"], descending=[True, False]).row(0, named=True)
    return float(top["normalised"]), float(top["mean_at_k"]), int(top["step"])


def _noise_note(observed: float, bound: float, which: str = "final evaluations") -> str:
    """The note of two measurements (`which`) too close to judge, or "". An infinite `bound`
    (`paired_noise_bound` of one problem) judges nothing: one problem has no standard error."""
    if math.isnan(observed) or math.isnan(bound) or abs(observed) > bound:
        return ""
    if math.isinf(bound):
        return _one_problem_note(f"the {which} differ by {observed:+.3f}")
    return (f"within evaluation noise: the {which} differ by {observed:+.3f}, at most 2 standard "
            f"errors of their paired difference ({bound:.3f})")


def _one_problem(table: pl.DataFrame | None, task: str) -> bool:
    """Whether `table`'s evaluations on `task` kept per-problem means of one problem each."""
    if table is None or "problem_ids" not in table.columns:
        return False
    sizes = table.filter(pl.col("eval_task") == task)["problem_ids"].drop_nulls().list.len()
    return bool(sizes.len()) and int(sizes.max()) < 2


def _one_problem_note(what: str) -> str:
    """Why `what` has no verdict when the evaluations share one problem (`paired_noise_bound` inf)."""
    return (f"{what}, with no evaluation noise to judge that by: fewer than two problems in common give no "
            f"standard error (evaluation.max_problems and data.sizes.val of 2 or more give one)")


def _sign_note(gap: float, final: float) -> str:
    """The note of fitted asymptotes whose order the final evaluations contradict (FST's fit
    levels off above RL's while its last evaluation is below RL's, or the other way), or "":
    the fit's extrapolation alone would then carry the verdict."""
    if math.isnan(gap) or math.isnan(final) or gap * final >= 0:
        return ""
    return (f"the fitted asymptotes ({gap:+.3f}) and the final evaluations ({final:+.3f}) "
            f"disagree in sign")


def _runs(df: pl.DataFrame, **where: Any) -> str:
    df = rows_where(df, **where)
    return ";".join(sorted(df["run"].unique().to_list()))


#: Why a claim has no verdict when no compared run earned any reward.
_NO_REWARD = "no reward for any compared run (every val mean@k is 0{}): nothing to compare"
NO_REWARD = _NO_REWARD.format("")


def no_reward_note(*frames: pl.DataFrame) -> str:
    """NO_REWARD, with the share of the compared evaluations' samples that gave an answer in
    <answer> tags (`answered_share`, where recorded): near 0, the model never wrote the format;
    near 1, it answered and was wrong."""
    share = answered_share(*frames)
    return _NO_REWARD.format("" if share is None else f"; {100 * share:.0f}% of their samples gave an answer in "
                                                      "<answer> tags")


def _row(claim: str, task: str, measured: float, runs: str, threshold: float = 0.0,
         strict: bool = True, note: str = "", noise: str = "", refuted: bool = False,
         bound: bool = False) -> dict[str, Any]:
    """One claim's row; a `noise` note (`_noise_note`) withholds the verdict; `refuted` (with a
    `note` saying why) is "not reproduced" without a value (FST never reaches RL's peak, or
    never leaves zero reward); `bound`
    marks `measured` as a lower bound that already reproduces (RL never left zero reward)."""
    paper = PAPER.get((claim, task), PAPER.get((claim, "*")))
    note = "; ".join(n for n in (note, noise) if n)
    if refuted:
        verdict = "not reproduced"
    elif bound:
        verdict = "reproduced"
    elif math.isnan(measured) or noise:
        verdict = "undetermined"
    else:
        ok = measured > threshold if strict else measured >= threshold
        verdict = "reproduced" if ok else "not reproduced"
    return {"claim": claim, "figures": " ".join(CLAIM_FIGURES[claim]), "task": task, "measured": measured,
            "paper": paper, "verdict": verdict, "meaning": CLAIM_TEXT[claim], "runs": runs, "note": note}


def _escape_row(task: str, rl: pl.DataFrame, fst: pl.DataFrame, runs: str,
                table: pl.DataFrame | None = None) -> dict[str, Any]:
    """Fig 7's claim: how many times fewer steps FST takes to leave zero reward than RL. Each
    method's escape is its own first evaluation above 2 of its standard errors; that one method
    escaped first is also judged against the other (`_lead_noise`, on `table`'s per-problem
    means): at its escape step it must stand out of noise against the other's best by then,
    else no verdict (two runs of one method escape in either order by luck)."""
    curves = {"rl": rl, "fst": fst}

    def lead_noise(lead: str, at: float) -> str:
        return "" if table is None else _lead_noise(table, task, curves, lead, at, "where it leaves zero reward")

    first = {m: escape_step(c["step"].to_numpy(), c["mean_at_k"].to_numpy(), c["mean_at_k_se"].to_numpy())
             for m, c in (("rl", rl), ("fst", fst))}
    last = {m: int(c["step"].max()) for m, c in (("rl", rl), ("fst", fst))}
    plain = "" if np.isfinite(np.concatenate([rl["mean_at_k_se"].to_numpy(), fst["mean_at_k_se"].to_numpy()])).any() \
        else "; no standard errors in this table (built before they were kept): any reward counts"
    if plain and _one_problem(table, task):
        plain = "; one problem evaluated, so no standard errors: any reward counts"
    if math.isnan(first["fst"]):
        if math.isnan(first["rl"]):
            return _row("zero_reward_escape", task, float("nan"), runs, note=(
                f"neither method left zero reward (mean@k above 2 standard errors) by step "
                f"{max(last.values())}" + plain))
        noise = lead_noise("rl", first["rl"])
        refuted = last["fst"] >= first["rl"] and not noise  # else FST's run ended before RL left zero
        return _row("zero_reward_escape", task, float("nan"), runs, refuted=refuted, noise=noise, note=(
            f"FST never left zero reward by step {last['fst']}; RL did at step {int(first['rl'])}" + plain))
    if first["fst"] == 0:
        return _row("zero_reward_escape", task, float("nan"), runs, note=(
            "FST's step-0 evaluation is already above zero: there was no zero reward to leave"))
    if math.isnan(first["rl"]):
        # RL leaves zero after its last step: if that step is at or after FST's escape, FST was
        # first (the mirror of FST's run reaching RL's escape above, which refutes); if before
        # it, either may have been
        if last["rl"] < first["fst"]:
            return _row("zero_reward_escape", task, float("nan"), runs, note=(
                f"RL's run ends at step {last['rl']}, before FST left zero reward (step {int(first['fst'])})"
                + plain))
        tie = (f": RL's escape comes after step {last['rl']}, so the ratio is above 1"
               if last["rl"] == first["fst"] else "")
        noise = lead_noise("fst", first["fst"])
        return _row("zero_reward_escape", task, last["rl"] / first["fst"], runs, bound=not noise, noise=noise, note=(
            f"a lower bound: RL never left zero reward by step {last['rl']}; FST did at step "
            f"{int(first['fst'])}" + tie + plain))
    if first["rl"] == first["fst"]:
        noise = (f"a tie: both left zero reward at step {int(first['fst'])}, and evaluations that far apart "
                 "cannot tell which came first")
    else:
        noise = lead_noise("fst" if first["fst"] < first["rl"] else "rl", min(first.values()))
    return _row("zero_reward_escape", task, first["rl"] / first["fst"], runs, threshold=1.0, noise=noise,
                note=f"RL left zero reward at step {int(first['rl'])}, FST at step {int(first['fst'])}" + plain)


def _ceiling_row(task: str, fst: pl.DataFrame, gepa: pl.DataFrame) -> dict[str, Any]:
    """Fig 8: FST above the prompt-only ceiling (GEPA's fast loop on frozen weights), at each
    method's last evaluation (the ceiling is GEPA-only's final level, not its best point), seeds
    averaged, under the paired noise rule."""
    runs = ";".join(sorted(set(fst["run"].to_list()) | set(gepa["run"].to_list())))
    if no_reward(fst["mean_at_k"], gepa["mean_at_k"]):
        return _row("ceiling_exceeded", task, float("nan"), runs, note=no_reward_note(fst, gepa))
    final = {m: float(seed_curve(df)["mean_at_k"][-1]) for m, df in (("fst", fst), ("gepa", gepa))}
    gap = final["fst"] - final["gepa"]
    bound = paired_noise_bound(_final_problems(gepa), _final_problems(fst))
    return _row("ceiling_exceeded", task, gap, runs,
                note=(f"FST {final['fst']:.3f} at step {int(fst['step'].max())}, GEPA only {final['gepa']:.3f} "
                      f"at step {int(gepa['step'].max())}"),
                noise=_noise_note(gap, bound))


def welch_half_width(a: list[float], b: list[float], level: float = 0.95) -> float:
    """Half the `level` confidence interval of mean(a) - mean(b) (scipy's Welch t-test: unequal
    variances, Welch-Satterthwaite degrees of freedom); 0 when neither varies (any difference is
    real; scipy would warn of its precision there)."""
    from scipy import stats

    if np.var(a) == 0 and np.var(b) == 0:
        return 0.0
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(level)
    return float(ci.high - ci.low) / 2


def _reuse_row(df: pl.DataFrame, task: str) -> dict[str, Any]:
    """Fig 10's cost on `task`: seconds per RL step of the no-reuse runs over the reuse runs'.
    Wall time is one measurement per evaluated cycle on whatever machine ran it: the verdict
    needs the difference of the variants' means outside its 95% interval (Welch's t, from the
    cycles' spread: with two cycles each the t quantile is 4.3 to 12.7, not 2), else it is
    undetermined, as with fewer than two cycles for a variant, or when the variants' cycles had the
    CPU unequally (`unequal_cpu`: a busy machine while one ran; both cycles of a run share its load,
    so their spread does not show it). The note gives the final evaluations'
    difference, which reuse should leave within noise (and says so when there is no reward)."""
    df = df.filter(pl.col("eval_task") == task)
    cycles = cycle_seconds_per_step(df)
    per_step = {v: float(np.mean(cycles[v])) if cycles.get(v) else float("nan") for v in ("reuse", "no_reuse")}
    speedup = per_step["no_reuse"] / per_step["reuse"] if per_step["reuse"] > 0 else float("nan")
    final = {v: float(seed_curve(df, variant=v)["mean_at_k"][-1]) for v in ("reuse", "no_reuse")}
    bound = paired_noise_bound(_final_problems(df, variant="no_reuse"), _final_problems(df, variant="reuse"))
    note = (f"{per_step['no_reuse']:.2f} against {per_step['reuse']:.2f} s a step (means of "
            f"{len(cycles.get('no_reuse', []))} and {len(cycles.get('reuse', []))} cycles); "
            + ("no reward for either: whether reuse keeps the reward is untested" if no_reward(df["mean_at_k"]) else
               f"final mean@k with reuse {final['reuse'] - final['no_reuse']:+.3f} against without"
               + (f" (2 standard errors of the paired difference: {bound:.3f})" if math.isfinite(bound) else "")))
    noise, counts = "", {v: len(cycles.get(v, [])) for v in ("no_reuse", "reuse")}
    unequal = unequal_cpu({v: s for v, s in cpu_shares(df).items() if v in ("reuse", "no_reuse")}, label=str)
    if unequal:  # a busy machine while one variant ran: the cycles' spread cannot tell that from reuse
        noise = unequal
    elif min(counts.values()) < 2:
        noise = (f"fewer than two cycles' wall times for a variant (no_reuse {counts['no_reuse']}, reuse "
                 f"{counts['reuse']}): no spread to tell a difference from noise")
    else:
        half = welch_half_width(cycles["no_reuse"], cycles["reuse"])
        if abs(per_step["no_reuse"] - per_step["reuse"]) <= half:
            noise = (f"within timing noise: the variants' seconds a step differ by "
                     f"{per_step['no_reuse'] - per_step['reuse']:+.2f}, inside the 95% interval of the "
                     f"difference from the cycles' spread (±{half:.2f}, Welch)")
    return _row("reuse_speedup", task, speedup, _runs(df), threshold=1.0, note=note, noise=noise)


def _above(difference: float, bound: float) -> bool:
    """Whether `difference` is above a `paired_noise_bound` (above 0 when the bound is NaN: no
    per-problem means, so no noise rule)."""
    return difference > (0.0 if math.isnan(bound) else bound)


def _forgetting_rows(con: pl.DataFrame) -> list[dict[str, Any]]:
    """"Less catastrophic forgetting": for each stage but the last, how much each method's
    accuracy on that stage's task drops from the stage's end (its last cycle, always evaluated)
    to the run's last evaluation, RL's drop minus FST's; paired per problem for the noise rule."""
    rows = []
    runs = _runs(con)
    for task, end in stage_ends(con).items():
        on_task = con.filter(pl.col("eval_task") == task)
        last = int(on_task["step"].max())
        if end >= last:  # the last stage: nothing after it to forget in
            continue
        if no_reward(on_task["mean_at_k"]):
            rows.append(_row("continual_forgetting", task, float("nan"), runs, note=no_reward_note(on_task)))
            continue
        level, drop, at_end, after, per_problem = {}, {}, {}, {}, {}
        for m in ("rl", "fst"):
            curve = seed_curve(on_task, method=m)
            at = dict(zip(curve["step"].to_list(), curve["mean_at_k"].to_list(), strict=True))
            level[m] = at.get(end, float("nan"))
            drop[m] = level[m] - at.get(last, float("nan"))
            at_end[m], after[m] = (_final_problems(on_task, step=s, method=m) for s in (end, last))
            per_problem[m] = {p: at_end[m][p] - after[m][p] for p in at_end[m].keys() & after[m].keys()}
        measured = drop["rl"] - drop["fst"]
        note = f"drop from step {end} to {last}: RL {drop['rl']:+.3f}, FST {drop['fst']:+.3f}"
        learned_less = _above(level["rl"] - level["fst"], paired_noise_bound(at_end["fst"], at_end["rl"]))
        withheld = False
        if learned_less and measured > 0:
            # Less learned is less to forget, up to the gap in level: a smaller drop is evidence of
            # retention only when it is more than that gap, that is when FST ends higher than RL
            # (measured − gap is the final evaluations' difference), beyond their paired noise.
            final = {m: level[m] - drop[m] for m in level}
            ends_higher = _above(final["fst"] - final["rl"], paired_noise_bound(after["fst"], after["rl"]))
            withheld = not ends_higher
            note += (f"; FST had learned less by the stage's end ({level['fst']:.3f} against RL's "
                     f"{level['rl']:.3f}), " + (
                         f"but ends higher ({final['fst']:.3f} against {final['rl']:.3f}): its smaller drop "
                         "is more than that gap" if ends_higher else "so its smaller drop says nothing"))
        rows.append(_row("continual_forgetting", task, float("nan") if withheld else measured,
                         runs, note=note,
                         noise=_noise_note(measured, paired_noise_bound(per_problem["fst"], per_problem["rl"]),
                                           "two methods' drops")))
    return rows


def _never_reaches(eff: pl.DataFrame, task: str, rl: pl.DataFrame, fst: pl.DataFrame,
                   why: str) -> tuple[str, bool]:
    """(note, refuted) when FST never reaches RL's peak: a refutation only if FST's run covers
    RL's peak step and its best evaluation is below that peak by more than 2 standard errors of
    their paired difference (one lucky RL sample is no peak to miss)."""
    peak_at = int(rl["step"][int(np.argmax(rl["mean_at_k"].to_numpy()))])
    if int(fst["step"].max()) < peak_at:
        return f"{why}; FST's run ends before RL's peak step", False
    best_at = int(fst["step"][int(np.argmax(fst["mean_at_k"].to_numpy()))])
    diff = float(rl["mean_at_k"].max() - fst["mean_at_k"].max())
    bound = paired_noise_bound(_final_problems(eff, step=best_at, eval_task=task, method="fst"),
                               _final_problems(eff, step=peak_at, eval_task=task, method="rl"))
    if math.isnan(bound):
        return f"{why}; no per-problem means to judge that against evaluation noise", False
    noise = _noise_note(diff, bound, "RL's peak and FST's best")
    return (f"{why}; {noise}", False) if noise else (why, True)


def _ratio_noise(eff: pl.DataFrame, task: str, rl: pl.DataFrame, fst: pl.DataFrame, ratio: float) -> str:
    """The noise note of the steps-to-peak ratio, or "": the method that reaches RL's peak first
    (FST when the ratio is above 1) must, at that step, stand out of noise against the other's
    best evaluation by then; two runs of one method differ in who gets there first by luck. A
    tie (both at the same evaluation) is no verdict: the evaluations cannot tell who was first."""
    if math.isnan(ratio):
        return ""
    peak = float(rl["mean_at_k"].max())
    curves = {"rl": rl, "fst": fst}
    hit = {m: first_step_reaching(c["step"].to_numpy(), running_max(c["mean_at_k"].to_numpy()), peak)
           for m, c in curves.items()}
    if ratio == 1:
        return (f"a tie: both reach RL's peak at step {int(hit['fst'])}, and evaluations that far apart "
                "cannot tell which came first")
    lead = "fst" if hit["fst"] < hit["rl"] else "rl"
    return _lead_noise(eff, task, curves, lead, hit[lead], "where it reaches RL's peak")


def _lead_noise(table: pl.DataFrame, task: str, curves: Mapping[str, pl.DataFrame], lead: str, at: float,
                where: str) -> str:
    """The noise note, or "", of `lead` getting somewhere first (RL's peak, out of zero reward):
    at its step `at` it must stand out of noise against the other method's best evaluation by
    then, under the paired rule; without per-problem means, "" (the sign decides)."""
    other = "rl" if lead == "fst" else "fst"
    upto = curves[other].filter(pl.col("step") <= at)
    if math.isnan(at) or not upto.height:
        return ""
    best = upto.sort(["mean_at_k", "step"], descending=[True, False]).row(0, named=True)
    value = float(curves[lead].filter(pl.col("step") == at)["mean_at_k"][0])
    bound = paired_noise_bound(_final_problems(table, step=int(best["step"]), eval_task=task, method=other),
                               _final_problems(table, step=int(at), eval_task=task, method=lead))
    return _noise_note(value - float(best["mean_at_k"]), bound,
                       f"evaluations of {lead.upper()} at step {int(at)}, {where}, and "
                       f"of {other.upper()} at its best by then (step {int(best['step'])})")


def _kl_noise(eff: pl.DataFrame, task: str, rl: pl.DataFrame, fst: pl.DataFrame, measured: float) -> str:
    """The noise note of the KL reduction at matched reward, or "": the verdict must survive
    crediting the other side with evaluation noise. The matched reward is lowered by 2 standard
    errors of the paired difference of the two matched evaluations for RL when FST needs less KL
    (for FST when it needs more); if the reduction's sign then flips, it is noise (matching at a
    noisy peak picks a checkpoint by luck)."""
    if math.isnan(measured):
        return ""
    r = {"rl": rl["mean_at_k"].to_numpy(), "fst": fst["mean_at_k"].to_numpy()}
    kl = {"rl": rl["kl_to_base"].to_numpy(), "fst": fst["kl_to_base"].to_numpy()}
    level = matched_reward(r["fst"], r["rl"])
    at = {m: kl_to_reach(kl[m], r[m], level) for m in r}
    steps = {"rl": rl["step"].to_numpy(), "fst": fst["step"].to_numpy()}
    bound = paired_noise_bound(*(_final_problems(eff, step=int(steps[m][at[m][1]]), eval_task=task, method=m)
                                 for m in ("rl", "fst")))
    if math.isnan(bound):
        return ""
    if math.isinf(bound):  # one problem: no standard error to lower the matched reward by
        return _one_problem_note("FST and RL are matched at a reward")
    credited = "rl" if measured > 0 else "fst"
    lenient = {**{m: at[m][0] for m in at}, credited: kl_to_reach(kl[credited], r[credited], level - bound)[0]}
    if math.isnan(lenient[credited]):
        return ""
    if lenient["rl"] > 0:
        alt = 1.0 - lenient["fst"] / lenient["rl"]
    else:  # RL reaches the lowered level at KL 0 (its step-0 evaluation): nothing is less than that
        alt = 0.0 if lenient["fst"] <= 0 else -math.inf
    if (alt > 0) == (measured > 0):
        return ""
    reduction = f"{alt:+.2f}" if math.isfinite(alt) else "below any (RL needs no KL)"
    return (f"within evaluation noise: with the matched reward ({level:.3f}) lowered by 2 standard errors of "
            f"the matched evaluations' paired difference ({bound:.3f}) for {credited.upper()}, it reaches it at "
            f"KL {lenient[credited]:.4g} and the reduction is {reduction}")


def build_claims(tables: Mapping[str, pl.DataFrame]) -> list[dict[str, Any]]:
    """Every claim the curves `tables` ({experiment: table}) measure, each experiment at its
    headline variant (`headline_tables`; the reuse claim compares reuse's variants): a row whose
    tables were cut says so in its note."""
    tables, cut = headline_tables(tables, ("reuse",))
    rows = _claim_rows(tables)
    for row in rows:
        row["note"] = "; ".join(n for n in (row["note"], *(cut[t] for t in CLAIM_TABLES[row["claim"]] if t in cut))
                                if n)
    return rows


def _claim_rows(tables: Mapping[str, pl.DataFrame]) -> list[dict[str, Any]]:
    """`build_claims`' rows from tables already cut to their headline variants."""
    rows: list[dict[str, Any]] = []
    eff = tables.get("efficiency")
    if eff is not None:
        for task in sorted(eff["eval_task"].unique().to_list()):
            rl, fst = seed_curve(eff, eval_task=task, method="rl"), seed_curve(eff, eval_task=task, method="fst")
            if not (rl.height and fst.height):
                continue
            runs = _runs(eff, eval_task=task)
            if no_reward(rl["mean_at_k"], fst["mean_at_k"]):
                for claim in ("sample_efficiency_ratio", "asymptote_gap", "kl_reduction_at_matched_reward"):
                    rows.append(_row(claim, task, float("nan"), runs, note=no_reward_note(
                        eff.filter((pl.col("eval_task") == task) & pl.col("method").is_in(["rl", "fst"])))))
                continue
            ratio = steps_to_peak_ratio(rl["step"].to_numpy(), running_max(rl["mean_at_k"].to_numpy()),
                                        fst["step"].to_numpy(), running_max(fst["mean_at_k"].to_numpy()))
            onset = reward_onset_note(rl["step"].to_numpy(), rl["mean_at_k"].to_numpy(),
                                      fst["step"].to_numpy(), fst["mean_at_k"].to_numpy()) or ""
            why, refuted = ("", False) if onset else steps_to_peak_note(
                rl["step"].to_numpy(), running_max(rl["mean_at_k"].to_numpy()),
                fst["step"].to_numpy(), running_max(fst["mean_at_k"].to_numpy()))
            if refuted:
                why, refuted = _never_reaches(eff, task, rl, fst, why)
            rows.append(_row("sample_efficiency_ratio", task, ratio, runs, threshold=1.0, note=onset or why,
                             refuted=refuted, noise="" if refuted else _ratio_noise(eff, task, rl, fst, ratio)))
            gap, why = float("nan"), ""
            flat = [m.upper() for m, c in (("rl", rl), ("fst", fst)) if no_reward(c["mean_at_k"])]
            if flat:  # a flat 0 has no level to fit (it may still rise, as Fig 7's RL does); Fig 3 fits none
                why = f"{onset or ' and '.join(flat) + ' earned no reward in any evaluation'}: " \
                      f"no asymptote to fit for {' and '.join(flat)}"
            else:
                try:
                    fits = {m: fit_sigmoid(c["step"].to_numpy().astype(float), c["mean_at_k"].to_numpy(),
                                           r0=start_reward(c["step"].to_numpy(), c["mean_at_k"].to_numpy()))
                            for m, c in (("rl", rl), ("fst", fst))}
                    loose = [m.upper() for m, f in fits.items() if not f.identified]
                    if loose:  # a curve still rising: its A would be the fit's bound, not the data's
                        why = (f"asymptote not identified for {' and '.join(loose)}: the fit did not converge "
                               f"or ran to its bound (the curve has not levelled off)")
                    else:
                        gap = fits["fst"].a - fits["rl"].a
                except ValueError as err:
                    why = f"no fit: {err}"
            final = float(fst["mean_at_k"][-1] - rl["mean_at_k"][-1])
            bound = paired_noise_bound(_final_problems(eff, eval_task=task, method="rl"),
                                       _final_problems(eff, eval_task=task, method="fst"))
            rows.append(_row("asymptote_gap", task, gap, runs, note=why,
                             noise=_noise_note(final, bound) or _sign_note(gap, final)))
            # trained points (step 0 may be the base model's evaluation, with KL on) without a KL,
            # as Fig 4 and 11 tell them; a curve of its step-0 point alone is not one
            unmeasured = [m.upper() for m, c in (("rl", rl), ("fst", fst))
                          if (kls := c.filter(pl.col("step") > 0)["kl_to_base"]).len()
                          and not kls.fill_nan(None).drop_nulls().len()]
            kl = float("nan") if onset or unmeasured else kl_at_matched_reward(  # RL earned none: no reward to match
                fst["kl_to_base"].to_numpy(), fst["mean_at_k"].to_numpy(),
                rl["kl_to_base"].to_numpy(), rl["mean_at_k"].to_numpy())
            why = onset or (f"KL not measured for {' or '.join(unmeasured)} (evaluation.divergence: false)"
                            if unmeasured else "")
            rows.append(_row("kl_reduction_at_matched_reward", task, kl, runs, note=why,
                             noise=_kl_noise(eff, task, rl, fst, kl)))
    plasticity = tables.get("plasticity")
    for target in [] if plasticity is None else sorted(plasticity["eval_task"].unique().to_list()):
        pla = plasticity.filter(pl.col("eval_task") == target)  # each target task its own row, as in Fig 5
        final = pla.filter(pl.col("step") == pl.col("step").max().over("run"))
        by_init = {i: float(final.filter(pl.col("init") == i)["mean_at_k"].mean())
                   for i in sorted(final["init"].unique().to_list())}  # not hash order: the means' sums
        tasks = {i: ".".join(run_tasks(i)) for i in by_init if i != "base"}  # each source run's
        for src in sorted(set(tasks.values())):
            inits = [i for i, of in tasks.items() if of == src]
            by_method: dict[str, list[str]] = {}  # several of efficiency's seeds: all of them
            for i in inits:
                by_method.setdefault(i.split("/")[1], []).append(i)
            get = {m: float(np.mean([by_init[i] for i in found])) for m, found in by_method.items()}
            if {"rl", "fst"} <= get.keys():
                runs = ";".join(sorted(pla["run"].unique().to_list()))
                task = f"{src}→{target}"
                if no_reward(pla.filter(pl.col("init").is_in(inits))["mean_at_k"]):
                    rows.append(_row("plasticity_gain", task, float("nan"), runs,
                                     note=no_reward_note(pla.filter(pl.col("init").is_in(inits)))))
                else:
                    probs = {m: _final_problems(pla.filter(pl.col("init").is_in(found)))
                             for m, found in by_method.items()}
                    gain = get["fst"] - get["rl"]
                    rows.append(_row("plasticity_gain", task, gain, runs,
                                     noise=_noise_note(gain, paired_noise_bound(probs["rl"], probs["fst"]))))
    star = tables.get("stargraph")
    if star is not None:
        for task in sorted(star["eval_task"].unique().to_list()):
            curves = {m: seed_curve(star, eval_task=task, method=m) for m in ("rl", "fst")}
            if all(c.height for c in curves.values()):
                rows.append(_escape_row(task, curves["rl"], curves["fst"], _runs(star, eval_task=task), star))
    ceiling = tables.get("ceiling")
    if ceiling is not None and eff is not None:
        for task in sorted(ceiling.filter(pl.col("method") == "gepa")["eval_task"].unique().to_list()):
            fst = rows_where(eff, eval_task=task, method="fst")
            gepa = rows_where(ceiling, eval_task=task, method="gepa")
            if fst.height:
                rows.append(_ceiling_row(task, fst, gepa))
            else:  # said, not left out: the ceiling's runs were trained for this row
                rows.append(_row("ceiling_exceeded", task, float("nan"), _runs(gepa),
                                 note=f"no FST run of the efficiency experiment on {task} to compare with"))
    reuse = tables.get("reuse")
    if reuse is not None:
        for task in sorted(reuse["eval_task"].unique().to_list()):
            if {"reuse", "no_reuse"} <= set(reuse.filter(pl.col("eval_task") == task)["variant"].to_list()):
                rows.append(_reuse_row(reuse, task))
    con = tables.get("continual")
    if con is not None:
        norm = normalised_continual(con)
        for task in dict.fromkeys(con.filter(pl.col("cycle") >= 0).sort("cycle")["train_task"].to_list()):
            best = {m: _best_step(rows_where(norm, method=m, train_task=task)) for m in ("rl", "fst")}
            problems = {m: _final_problems(con, step=b[2], method=m, train_task=task, eval_task=task)
                        if b[2] is not None else {} for m, b in best.items()}
            gap = best["fst"][0] - best["rl"][0]
            stage = con.filter((pl.col("train_task") == task) & (pl.col("eval_task") == task))
            rows.append(_row("continual_stage_recovery", task, gap, _runs(con), strict=False,
                             note=no_reward_note(stage) if math.isnan(gap) and no_reward(stage["mean_at_k"]) else "",
                             noise=_noise_note(best["fst"][1] - best["rl"][1],
                                               paired_noise_bound(problems["rl"], problems["fst"]),
                                               "best evaluations")))
        rows += _forgetting_rows(con)
    return rows
