"""Figures and claims from hand-made curves tables (the DAG test builds them from real runs)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from fastslow.claims import build_claims
from fastslow.curves import CURVE_COLUMNS
from fastslow.figures import FIGURES, fig2, fig6, fig9, normalised_continual


def _rows(experiment, method, task, values, *, variant="default", init="base", train_task=None, kl=None,
          steps_per_cycle=10, eval_task=None):
    rows = []
    for i, v in enumerate(values):
        rows.append({"experiment": experiment, "method": method, "run": f"{experiment}/{method}/{task}-{variant}-s0",
                     "variant": variant, "seed": 0, "init": init, "eval_task": eval_task or task,
                     "train_task": None if i == 0 else (train_task[i - 1] if train_task else task),
                     "cycle": i - 1, "step": i * steps_per_cycle, "mean_at_k": v, "best_at_k": min(1.0, v + 0.2),
                     "k": 4, "kl_to_base": (kl[i] if kl else 0.01 * i), "entropy": 0.5, "cycle_seconds": 10.0,
                     "context_id": "seed"})
    return rows


@pytest.fixture()
def efficiency():
    rows = []
    rows += _rows("efficiency", "rl", "math", [0.1, 0.2, 0.3, 0.4, 0.4, 0.4], kl=[0, .02, .04, .06, .08, .1])
    rows += _rows("efficiency", "fst", "math", [0.1, 0.4, 0.5, 0.55, 0.6, 0.6], kl=[0, .01, .02, .03, .04, .05])
    return pl.DataFrame(rows).select(CURVE_COLUMNS)


def test_fig2_ratio_and_files(tmp_path, efficiency):
    out = tmp_path / "fig2.pdf"
    ratios = fig2({"efficiency": efficiency}, out)
    # RL peaks (0.4) at step 30; FST first reaches 0.4 at step 10 -> 3.0x
    assert ratios == {"math": pytest.approx(3.0)}
    assert out.stat().st_size > 1000 and out.with_suffix(".png").stat().st_size > 1000


def test_claims_on_hand_made_curves(efficiency):
    rows = {(r["claim"], r["task"]): r for r in build_claims({"efficiency": efficiency})}
    ratio = rows[("sample_efficiency_ratio", "math")]
    assert ratio["measured"] == pytest.approx(3.0) and ratio["paper"] == 1.4
    assert ratio["verdict"] == "reproduced"
    assert rows[("asymptote_gap", "math")]["measured"] > 0
    # matched reward 0.4: FST at KL 0.01, RL at KL 0.06 -> 1 - 1/6
    assert rows[("kl_reduction_at_matched_reward", "math")]["measured"] == pytest.approx(1 - 0.01 / 0.06)
    assert "efficiency/rl/math-default-s0" in ratio["runs"]


def test_claims_without_any_reward_are_undetermined(tmp_path):
    """Both methods at 0 everywhere (the CPU default): no verdict, and the note says why."""
    rows = []
    for method in ("rl", "fst"):
        rows += _rows("efficiency", method, "math", [0.0] * 4, kl=[0, .01, .02, .03])
    eff = pl.DataFrame(rows).select(CURVE_COLUMNS)
    claims = build_claims({"efficiency": eff})
    assert {r["claim"] for r in claims} == {"sample_efficiency_ratio", "asymptote_gap",
                                            "kl_reduction_at_matched_reward"}
    for r in claims:
        assert r["verdict"] == "undetermined" and np.isnan(r["measured"]) and "no reward" in r["note"]
    assert fig2({"efficiency": eff}, tmp_path / "fig2.pdf") == {"math": pytest.approx(float("nan"), nan_ok=True)}
    pla = []
    for init in ("base", "efficiency/rl/math-default-s0", "efficiency/fst/math-default-s0"):
        rows = _rows("plasticity", "rl", "hover_hard", [0.0] * 3, init=init)
        pla += [{**r, "run": f"{r['run']}@{init}"} for r in rows]
    (gain,) = build_claims({"plasticity": pl.DataFrame(pla).select(CURVE_COLUMNS)})
    assert gain["task"] == "math→hover_hard" and gain["verdict"] == "undetermined" and gain["note"]
    pla = [{**r, "mean_at_k": 0.25} if "fst" in r["init"] and r["step"] > 0 else r for r in pla]
    (gain,) = build_claims({"plasticity": pl.DataFrame(pla).select(CURVE_COLUMNS)})
    assert gain["measured"] == pytest.approx(0.25) and gain["verdict"] == "reproduced" and not gain["note"]


def test_continual_normalisation_and_stage_recovery(tmp_path):
    seq = ["hover", "hover", "codeio", "codeio"]
    rows = []
    for method, hov, cod in (("rl", [0.2, 0.5, 0.6, 0.4, 0.4], [0.0, 0.0, 0.0, 0.1, 0.1]),
                             ("fst", [0.2, 0.4, 0.5, 0.5, 0.5], [0.0, 0.0, 0.1, 0.4, 0.5])):
        rows += _rows("continual", method, "hover.codeio", hov, train_task=seq, eval_task="hover")
        rows += _rows("continual", method, "hover.codeio", cod, train_task=seq, eval_task="codeio")
    df = pl.DataFrame(rows).select(CURVE_COLUMNS)
    norm = normalised_continual(df)
    # hover stage peak across methods is RL's 0.6 (step 20); FST's best there is 0.5/0.6
    hover_fst = norm.filter((pl.col("method") == "fst") & (pl.col("train_task") == "hover"))
    assert hover_fst["normalised"].max() == pytest.approx(0.5 / 0.6)
    claims = {r["task"]: r for r in build_claims({"continual": df}) if r["claim"] == "continual_stage_recovery"}
    assert claims["codeio"]["measured"] == pytest.approx(1.0 - 0.1 / 0.5)
    assert claims["hover"]["verdict"] == "not reproduced"
    fig6({"continual": df}, tmp_path / "fig6.pdf")
    assert (tmp_path / "fig6.png").exists()


def test_continual_stage_without_reward_is_undetermined(tmp_path):
    """Every method at 0 on a stage: nothing to normalise by, so null (not 0%) and no verdict."""
    seq = ["hover", "hover", "codeio", "codeio"]
    rows = []
    for method, hov in (("rl", [0.0, 0.2, 0.3, 0.1, 0.1]), ("fst", [0.0, 0.3, 0.4, 0.2, 0.2])):
        rows += _rows("continual", method, "hover.codeio", hov, train_task=seq, eval_task="hover")
        rows += _rows("continual", method, "hover.codeio", [0.0] * 5, train_task=seq, eval_task="codeio")
    df = pl.DataFrame(rows).select(CURVE_COLUMNS)
    norm = normalised_continual(df)
    assert norm.filter(pl.col("train_task") == "codeio")["normalised"].null_count() == 4
    assert norm.filter(pl.col("train_task") == "hover")["normalised"].max() == pytest.approx(1.0)
    claims = {r["task"]: r for r in build_claims({"continual": df}) if r["claim"] == "continual_stage_recovery"}
    assert claims["codeio"]["verdict"] == "undetermined"
    assert claims["hover"]["verdict"] == "reproduced"
    fig6({"continual": df}, tmp_path / "fig6.pdf")
    assert (tmp_path / "fig6.png").exists()


def test_fig9_compares_at_the_common_step(tmp_path, efficiency):
    abl = pl.DataFrame(_rows("ablations", "fst", "math", [0.1, 0.3, 0.35], variant="k1")).select(CURVE_COLUMNS)
    values = fig9({"ablations": abl, "efficiency": efficiency}, tmp_path / "fig9.pdf")
    assert values["k1"] == pytest.approx(0.35)
    assert values["default"] == pytest.approx(0.5)  # efficiency FST at step 20
    assert values["rl"] == pytest.approx(0.3)


def test_every_figure_is_registered():
    assert sorted(FIGURES, key=lambda f: int(f[3:])) == [f"fig{i}" for i in range(2, 12)]
    assert all(callable(f) for f in FIGURES.values())
