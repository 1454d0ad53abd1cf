"""Curve analysis behind the figures: running max, steps-to-peak ratio, sigmoid asymptote, smoothing.

All functions are pure (NumPy in, numbers out) and unit-tested against hand-computed values.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


def running_max(values: np.ndarray) -> np.ndarray:
    """Running maximum along a curve (Fig 2 plots the running max of val mean@4)."""
    return np.maximum.accumulate(np.asarray(values, dtype=float))


def first_step_reaching(steps: np.ndarray, values: np.ndarray, target: float) -> float:
    """First step whose value reaches `target` (NaN if never)."""
    steps, values = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    hit = np.nonzero(values >= target - 1e-12)[0]
    return float(steps[hit[0]]) if hit.size else float("nan")


def no_reward(*series: Any) -> bool:
    """True when every value of every series is 0 (or missing): no run earned any reward, so a
    comparison between them says nothing."""
    flat = np.concatenate([np.asarray(v, dtype=float).ravel() for v in series]) if series else np.array([])
    flat = flat[~np.isnan(flat)]
    return flat.size == 0 or bool(np.all(flat <= 0))


def answered_share(*frames: Any) -> float | None:
    """The mean `answered_fraction` of the frames' evaluation rows (the share of their samples that
    gave an answer in <answer> tags): where every reward is 0, near 0 says the model never wrote the
    format and near 1 that it answered wrong. None where no row records it (older tables)."""
    shares = [v for df in frames if "answered_fraction" in df.columns
              for v in df["answered_fraction"].cast(float).to_list() if v is not None and v == v]
    return sum(shares) / len(shares) if shares else None


def paired_noise_bound(a: Mapping[str, float], b: Mapping[str, float], z: float = 2.0) -> float:
    """z standard errors of the difference of two evaluations on the same problems: `a` and `b`
    map problem id -> mean reward; the standard error is the spread (ddof 1) of the per-problem
    differences over the square root of their number (problems are the unit, and pairing removes
    what the two share: which problems are hard). NaN when either has no per-problem means (a
    table from before they were kept: the noise rule lapses); inf when both have them but fewer
    than two problems in common (one problem evaluated: no standard error, so no difference
    stands out of noise)."""
    common = sorted(a.keys() & b.keys())
    if len(common) < 2:
        return math.inf if a and b else float("nan")
    d = np.array([b[i] - a[i] for i in common], dtype=float)
    return float(z * np.std(d, ddof=1) / np.sqrt(len(d)))


def reward_onset_note(steps_rl: np.ndarray, rl: np.ndarray, steps_fst: np.ndarray,
                      fst: np.ndarray) -> str | None:
    """The star-graph situation (Fig 7): RL earned no reward in any evaluation while FST did.
    RL then has no peak to reach, so the steps-to-peak ratio and the KL at matched reward are
    undefined; this says what the curves do show instead (FST's first rewarded step, RL's last
    step without any). None in every other case."""
    if not no_reward(rl) or no_reward(fst):
        return None
    steps_fst, fst = np.asarray(steps_fst, dtype=float), np.asarray(fst, dtype=float)
    first = steps_fst[np.nonzero(fst > 0)[0][0]]
    return (f"RL earned no reward in any evaluation up to step {int(np.nanmax(steps_rl))}; "
            f"FST did from step {int(first)}")


def escape_step(steps: np.ndarray, means: np.ndarray, ses: np.ndarray | None = None) -> float:
    """The first step at which a curve leaves zero reward: its mean@k above 2 standard errors
    over problems (one right sample among 32 on 8 problems is not), or above 0 where no standard
    error was kept. NaN if it never does."""
    steps, means = np.asarray(steps, dtype=float), np.asarray(means, dtype=float)
    ses = np.full(means.shape, np.nan) if ses is None else np.asarray(ses, dtype=float)
    bar = np.where(np.isfinite(ses), 2 * ses, 0.0)
    hit = np.nonzero(means > bar)[0]
    return float(steps[hit[0]]) if hit.size else float("nan")


def steps_to_peak_ratio(steps_ref: np.ndarray, ref: np.ndarray, steps_new: np.ndarray,
                        new: np.ndarray) -> float:
    """How many times fewer steps `new` needs to reach `ref`'s peak (the paper's 3.0× on CodeIO).

    ratio = (first step at which ref reaches its own peak) / (first step at which new reaches it).
    NaN if `new` never reaches ref's peak, if ref never earns reward (peak <= 0: there is no
    peak to reach, and "both at 0 from step 0" is no evidence of efficiency), or if ref's peak is
    its step-0 value (ref never improved: no steps to be faster at; `steps_to_peak_note` says
    which); inf if `new` reaches the peak at step 0 while ref needs steps.
    """
    peak = float(np.max(ref))
    if peak <= 0:
        return float("nan")
    s_ref = first_step_reaching(steps_ref, ref, peak)
    s_new = first_step_reaching(steps_new, new, peak)
    if np.isnan(s_new) or s_ref == 0:
        return float("nan")
    return float("inf") if s_new == 0 else s_ref / s_new


def steps_to_peak_note(steps_ref: np.ndarray, ref: np.ndarray, steps_new: np.ndarray,
                       new: np.ndarray) -> tuple[str, bool]:
    """Why `steps_to_peak_ratio` has no value although ref earned reward, and whether that
    refutes "new is faster": ("", False) when it has a value or ref has no peak. new never
    reaching ref's peak within its steps refutes it; ref's peak at step 0 says nothing."""
    peak = float(np.max(ref)) if np.size(ref) else 0.0
    if not peak > 0:
        return "", False
    s_ref = first_step_reaching(steps_ref, ref, peak)
    if s_ref == 0:
        return f"RL's best ({peak:.3f}) is its step-0 evaluation: it never improved, no steps to compare", False
    if np.isnan(first_step_reaching(steps_new, new, peak)):
        return (f"FST never reaches RL's peak ({peak:.3f}, step {int(s_ref)}) by step "
                f"{int(np.max(steps_new))}", True)
    return "", False


def sigmoid(c: np.ndarray, r0: float, a: float, c_mid: float, b: float) -> np.ndarray:
    """R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B), the paper's 4-parameter saturation curve."""
    c = np.maximum(np.asarray(c, dtype=float), 1e-12)
    return r0 + (a - r0) / (1.0 + (c_mid / c) ** b)


#: Bounds of the sigmoid fit: A at most A_BOUND x the curve's max, and never above REWARD_MAX
#: (mean@k is a mean of rewards in [0, 1]: no curve levels off above it), C_mid at most
#: C_MID_BOUND x its last C. A fit that ends at one of them has not found the curve's level,
#: except at REWARD_MAX when a fit without that cap clearly levels under it (`fit_sigmoid`).
A_BOUND, C_MID_BOUND, REWARD_MAX = 1.5, 100.0, 1.0
#: How far above REWARD_MAX A_BOUND x the max must reach for the fit without the cap to tell a
#: curve levelling at 1 from one still rising (max above ~0.7).
A_CAP_ROOM = 0.05
#: The fewest evaluations after step 0 a fit takes.
FIT_POINTS = 3


@dataclass(frozen=True)
class SigmoidFit:
    r0: float
    a: float  # the upper asymptote A
    c_mid: float
    b: float
    ok: bool  # the optimiser converged
    #: converged with A and C_mid inside their bounds: the curve levelled off within reach of the
    #: data. A curve still rising pins A to its bound (A_BOUND x the curve's max, or REWARD_MAX
    #: unless the fit without it levels clearly under 1) or C_mid to its own (C_MID_BOUND x the
    #: last step): its A is then the bound's, not the data's.
    identified: bool = True

    def __call__(self, c: np.ndarray) -> np.ndarray:
        return sigmoid(c, self.r0, self.a, self.c_mid, self.b)


def start_reward(c: np.ndarray, r: np.ndarray) -> float | None:
    """The R0 a curve's fit holds fixed: its evaluation at step 0 (the weights before any
    training), or None (fitted) when the curve starts later (`experiments.<name>.eval_init` off: its first
    point is a cycle's end, not the start)."""
    c = np.asarray(c, dtype=float)
    return float(np.asarray(r, dtype=float)[0]) if c.size and c[0] == 0 else None


def fit_sigmoid(c: np.ndarray, r: np.ndarray, r0: float | None = None) -> SigmoidFit:
    """Least-squares fit (scipy) of `sigmoid` to a validation curve; C > 0 (steps or samples).

    `r0` fixes the starting reward (e.g. the base model's) when known; otherwise it is fitted.
    Bounds keep A within [0, min(1.5·max, 1)] and B positive so short, noisy toy curves stay sane.
    """
    from scipy.optimize import curve_fit

    c, r = np.asarray(c, dtype=float), np.asarray(r, dtype=float)
    keep = c > 0
    c, r = c[keep], r[keep]
    if c.size < FIT_POINTS:
        raise ValueError(f"a sigmoid fit needs at least {FIT_POINTS} points with C > 0, got {c.size}")
    hi = max(float(np.max(r)), 1e-3)
    p0 = [float(r[0]) if r0 is None else r0, hi, float(np.median(c)), 2.0]
    lo_b = [-1.0, 0.0, float(np.min(c)) * 1e-3, 0.1]
    a_hi = min(A_BOUND * hi + 1e-3, REWARD_MAX)
    hi_b = [1.5, a_hi, float(np.max(c)) * C_MID_BOUND, 20.0]
    if r0 is not None:
        def f(x, a, c_mid, b):
            return sigmoid(x, r0, a, c_mid, b)
        p0, lo_b, hi_b = p0[1:], lo_b[1:], hi_b[1:]
    else:
        f = sigmoid
    a_at = 1 if r0 is None else 0  # A's place in the fitted parameters

    def fitted(upper: list[float]) -> tuple[np.ndarray, float, bool]:
        """The fit under bounds `upper`: its parameters, A's standard error and whether it converged."""
        start = list(np.clip(p0, lo_b, upper))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                params, cov = curve_fit(f, c, r, p0=start, bounds=(lo_b, upper), maxfev=20000)
            except RuntimeError:
                return np.array(start), math.inf, False
        se = float(np.sqrt(cov[a_at, a_at])) if np.isfinite(cov[a_at, a_at]) else math.inf
        return params, se, True

    params, _, ok = fitted(hi_b)
    values = [r0, *map(float, params)] if r0 is not None else list(map(float, params))
    # at (within 1% of) the bounds of A and C_mid, the fit says the curve has not levelled off.
    # At REWARD_MAX, unless the cap clearly does not bind: a curve levelling off near reward 1 has
    # found its level there, one still rising past 0.9 has not. The fit without the cap (up to
    # A_BOUND x the max, with room above 1 to tell) must put A two standard errors under the cap,
    # or noise lets a rising curve pass; with less room than that, A stays pinned.
    a_pinned = values[1] >= 0.99 * a_hi
    free_hi = A_BOUND * hi + 1e-3
    if ok and a_pinned and a_hi == REWARD_MAX and free_hi > REWARD_MAX + A_CAP_ROOM:
        uncapped = list(hi_b)
        uncapped[a_at] = free_hi
        free, se, free_ok = fitted(uncapped)
        a_free = float(free[a_at])
        a_pinned = not free_ok or a_free >= 0.99 * free_hi or a_free + 2 * se > REWARD_MAX + 0.005
    identified = ok and not a_pinned and values[2] < 0.99 * C_MID_BOUND * float(np.max(c))
    return SigmoidFit(*values, ok=ok, identified=identified)


def rolling_mean(values: np.ndarray, window: int, center: bool = False) -> np.ndarray:
    """Rolling mean, same length as input: trailing (shorter windows at the start), or with
    `center` centred on each point, the first and last `window // 2` points kept as they are (a
    smoothed line that still runs from the first point to the last; a trailing one ended short of
    the last checkpoint, at about half its KL with three)."""
    import polars as pl

    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    v = np.asarray(values, dtype=float)
    # a missing (non-finite) value is null, so only the windows holding it are short of it
    s = pl.Series(np.where(np.isfinite(v), v, np.nan)).fill_nan(None)
    if not center:
        return s.rolling_mean(window, min_samples=1).fill_null(float("nan")).to_numpy()
    out = s.rolling_mean(window, min_samples=1, center=True).fill_null(float("nan")).to_numpy().copy()
    edge = min(window // 2, len(v))
    if edge:
        out[:edge], out[len(v) - edge:] = v[:edge], v[len(v) - edge:]
    return out


def kl_to_reach(kl: np.ndarray, r: np.ndarray, level: float) -> tuple[float, int]:
    """The smallest KL at which a curve's reward reaches `level` (running max along increasing
    KL) and the index of that evaluation (whose own reward reaches it); (NaN, -1) if it never
    does. Evaluations with a NaN reward or KL are skipped."""
    kl, r = np.asarray(kl, dtype=float), np.asarray(r, dtype=float)
    idx = np.nonzero(np.isfinite(kl) & np.isfinite(r))[0]
    order = idx[np.argsort(kl[idx], kind="stable")]
    hit = np.nonzero(running_max(r[order]) >= level - 1e-12)[0] if order.size else order
    if not hit.size:
        return float("nan"), -1
    i = int(order[hit[0]])
    return float(kl[i]), i


def matched_reward(r_a: np.ndarray, r_b: np.ndarray) -> float:
    """The highest reward both curves reach (NaN evaluations skipped; NaN when either has none)."""
    tops = [np.asarray(r, dtype=float) for r in (r_a, r_b)]
    if not all(np.isfinite(r).any() for r in tops):  # (min() keeps a NaN only in first place)
        return float("nan")
    return min(float(np.nanmax(r)) for r in tops)


def kl_at_matched_reward(kl_a: np.ndarray, r_a: np.ndarray, kl_b: np.ndarray, r_b: np.ndarray) -> float:
    """Relative KL reduction of A vs B at the highest reward both reach: 1 − KL_A / KL_B.

    For each curve take the smallest KL at which its (running-max) reward reaches the matched
    level (`kl_to_reach`); the paper reports FST up to 70% below RL. NaN when a curve has no
    finite evaluation or B reaches the level at KL 0.
    """
    level = matched_reward(r_a, r_b)
    (ka, _), (kb, _) = kl_to_reach(kl_a, r_a, level), kl_to_reach(kl_b, r_b, level)
    return float("nan") if math.isnan(ka) or math.isnan(kb) or kb <= 0 else 1.0 - ka / kb
