"""The paper's headline claims, measured on our curves, side by side with the paper's numbers.

A verdict needs the difference to stand out of evaluation noise: the asymptote gap and the
plasticity gain are "undetermined" (with a note giving both numbers) when their magnitude is
at most two standard errors of the difference of the two final evaluations (each one's mean@k
standard error over problems, `fastslow.evaluate.mean_at_k_se`, added in quadrature; seeds
averaged). A toy run where one sample of 32 is right is not a reproduction. The step ratio and
the KL reduction have no such rule: they are read off the curves' shapes, not one difference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

from fastslow.analysis import (
    fit_sigmoid,
    kl_at_matched_reward,
    no_reward,
    noise_bound,
    reward_onset_note,
    running_max,
    steps_to_peak_ratio,
)

#: The paper's values (arXiv 2605.12484) for each claim and task, as stated in its figures.
PAPER = {
    ("sample_efficiency_ratio", "codeio"): 3.0,
    ("sample_efficiency_ratio", "math"): 1.4,
    ("sample_efficiency_ratio", "hover_hard"): 3.0,
    ("kl_reduction_at_matched_reward", "*"): 0.70,  # "up to 70% less KL"
}
CLAIM_TEXT = {
    "sample_efficiency_ratio": "FST reaches RL's peak in fewer steps (RL steps to peak / FST steps); > 1 reproduces",
    "asymptote_gap": "FST's fitted asymptote A exceeds RL's (A_FST − A_RL); > 0 reproduces",
    "kl_reduction_at_matched_reward": "FST needs less KL to the base at matched reward (1 − KL_FST/KL_RL); > 0 reproduces",
    "plasticity_gain": "fresh RL from FST weights ends higher than from RL weights (final mean@k gap); > 0 reproduces",
    "continual_stage_recovery": "FST's best normalised accuracy in a stage minus RL's; ≥ 0 reproduces",
}


def _curve(df: pl.DataFrame, **where: Any) -> pl.DataFrame:
    """Mean@k, its standard error and KL by step, averaged over the matching runs (seeds)."""
    for k, v in where.items():
        df = df.filter(pl.col(k) == v)
    return df.group_by("step").agg(pl.col("mean_at_k").mean(), _mean_se(df),
                                   pl.col("kl_to_base").mean()).sort("step")


def _mean_se(df: pl.DataFrame) -> pl.Expr:
    """The standard error of a mean of independent evaluations: sqrt(sum se²) / n (NaN when any
    is unknown, or for curve tables without the column)."""
    if "mean_at_k_se" not in df.columns:
        return pl.lit(float("nan")).alias("mean_at_k_se")
    se = pl.col("mean_at_k_se").cast(pl.Float64).fill_null(float("nan"))
    return ((se ** 2).sum().sqrt() / pl.len()).alias("mean_at_k_se")


def _within_noise(measured: float, noise: float) -> str:
    """The note of a difference too small to judge, or ""."""
    if math.isnan(measured) or math.isnan(noise) or abs(measured) > noise:
        return ""
    return (f"within evaluation noise: |{measured:+.3f}| is at most 2 standard errors of the final "
            f"evaluations' difference ({noise:.3f})")


def _runs(df: pl.DataFrame, **where: Any) -> str:
    for k, v in where.items():
        df = df.filter(pl.col(k) == v)
    return ";".join(sorted(df["run"].unique().to_list()))


#: Why a claim has no verdict when no compared run earned any reward.
NO_REWARD = "no reward for any compared run (every val mean@k is 0): nothing to compare"


def _row(claim: str, task: str, measured: float, runs: str, threshold: float = 0.0,
         strict: bool = True, note: str = "", noise: float = float("nan")) -> dict[str, Any]:
    paper = PAPER.get((claim, task), PAPER.get((claim, "*")))
    quiet = _within_noise(measured, noise)
    note = "; ".join(n for n in (note, quiet) if n)
    if math.isnan(measured) or quiet:
        verdict = "undetermined"
    else:
        ok = measured > threshold if strict else measured >= threshold
        verdict = "reproduced" if ok else "not reproduced"
    return {"claim": claim, "task": task, "measured": measured, "paper": paper, "verdict": verdict,
            "meaning": CLAIM_TEXT[claim], "runs": runs, "note": note}


def build_claims(tables: Mapping[str, pl.DataFrame]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    eff = tables.get("efficiency")
    if eff is not None:
        for task in sorted(eff["eval_task"].unique().to_list()):
            rl, fst = _curve(eff, eval_task=task, method="rl"), _curve(eff, eval_task=task, method="fst")
            if not (rl.height and fst.height):
                continue
            runs = _runs(eff, eval_task=task)
            if no_reward(rl["mean_at_k"], fst["mean_at_k"]):
                for claim in ("sample_efficiency_ratio", "asymptote_gap", "kl_reduction_at_matched_reward"):
                    rows.append(_row(claim, task, float("nan"), runs, note=NO_REWARD))
                continue
            ratio = steps_to_peak_ratio(rl["step"].to_numpy(), running_max(rl["mean_at_k"].to_numpy()),
                                        fst["step"].to_numpy(), running_max(fst["mean_at_k"].to_numpy()))
            onset = reward_onset_note(rl["step"].to_numpy(), rl["mean_at_k"].to_numpy(),
                                      fst["step"].to_numpy(), fst["mean_at_k"].to_numpy()) or ""
            rows.append(_row("sample_efficiency_ratio", task, ratio, runs, threshold=1.0, note=onset))
            gap = float("nan")
            try:
                a = {m: fit_sigmoid(c["step"].to_numpy().astype(float), c["mean_at_k"].to_numpy(),
                                    r0=float(c["mean_at_k"][0])).a for m, c in (("rl", rl), ("fst", fst))}
                gap = a["fst"] - a["rl"]
            except ValueError:
                pass
            rows.append(_row("asymptote_gap", task, gap, runs,
                             noise=noise_bound(rl["mean_at_k_se"][-1], fst["mean_at_k_se"][-1])))
            kl = float("nan") if onset else kl_at_matched_reward(  # RL earned none: no reward to match
                fst["kl_to_base"].to_numpy(), fst["mean_at_k"].to_numpy(),
                rl["kl_to_base"].to_numpy(), rl["mean_at_k"].to_numpy())
            rows.append(_row("kl_reduction_at_matched_reward", task, kl, runs, note=onset))
    pla = tables.get("plasticity")
    if pla is not None:
        final = pla.filter(pl.col("step") == pl.col("step").max().over("run"))
        by_init = {i: float(final.filter(pl.col("init") == i)["mean_at_k"].mean())
                   for i in final["init"].unique().to_list()}
        se_init = {i: float(final.filter(pl.col("init") == i).select(_mean_se(final)).item())
                   for i in by_init}
        sources = {i.split("/")[2].split("-")[0] for i in by_init if i != "base"}
        for src in sorted(sources):
            inits = [i for i in by_init if i != "base" and i.split("/")[2].startswith(src + "-")]
            get = {i.split("/")[1]: by_init[i] for i in inits}
            if {"rl", "fst"} <= get.keys():
                runs = ";".join(sorted(pla["run"].unique().to_list()))
                task = f"{src}→{pla['eval_task'][0]}"
                if no_reward(pla.filter(pl.col("init").is_in(inits))["mean_at_k"]):
                    rows.append(_row("plasticity_gain", task, float("nan"), runs, note=NO_REWARD))
                else:
                    se = {i.split("/")[1]: se_init[i] for i in inits}
                    rows.append(_row("plasticity_gain", task, get["fst"] - get["rl"], runs,
                                     noise=noise_bound(se["fst"], se["rl"])))
    con = tables.get("continual")
    if con is not None:
        from fastslow.figures import normalised_continual

        norm = normalised_continual(con)
        for task in dict.fromkeys(con.filter(pl.col("cycle") >= 0).sort("cycle")["train_task"].to_list()):
            best = {m: float(norm.filter((pl.col("method") == m) & (pl.col("train_task") == task))["normalised"].max() or np.nan)
                    for m in ("rl", "fst")}
            gap = best["fst"] - best["rl"]
            rows.append(_row("continual_stage_recovery", task, gap,
                             ";".join(sorted(con["run"].unique().to_list())), strict=False,
                             note=NO_REWARD if math.isnan(gap) and no_reward(
                                 con.filter((pl.col("train_task") == task) & (pl.col("eval_task") == task))["mean_at_k"])
                             else ""))
    return rows
