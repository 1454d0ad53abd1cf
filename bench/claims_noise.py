"""How often the claims table says "reproduced" for the steps-to-peak ratio and the KL reduction
at matched reward, with and without their noise rules (`fastslow.claims`), on simulated curves:

- `identical`: two runs of one method (the same expected curve and KL), so every "reproduced"
  is a false positive;
- `effect`: FST truly faster (time constant 15 against 40 steps, both levelling off at 0.4) and
  at half the KL, so "reproduced" is what should come out.

Each evaluation samples k = 4 completions on each of 32 problems of fixed difficulty at 11
points (every 30 steps; step 0 is the shared base evaluation). CPU only, about 50 ms a pair.

    python bench/claims_noise.py [--pairs 300] [--out results/bench/claims_noise.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import environment  # this directory: where the benchmark ran, and atomic report writes
import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_figures import _rows  # noqa: E402 - the tests' curves-table builder

from fastslow.claims import build_claims  # noqa: E402
from fastslow.curves import CURVE_COLUMNS  # noqa: E402

CLAIMS = {"sample_efficiency_ratio": 1.0, "kl_reduction_at_matched_reward": 0.0}


def simulate(scenario: str, pairs: int, seed: int = 0) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(seed)
    steps = np.arange(11) * 30
    curve = {"rl": 0.1 + 0.3 * (1 - np.exp(-steps / 40)),
             "fst": 0.1 + 0.3 * (1 - np.exp(-steps / (15 if scenario == "effect" else 40)))}
    kl_scale = {"rl": 1.0, "fst": 0.5 if scenario == "effect" else 1.0}
    difficulty = rng.normal(0, 1.0, 32)

    def evaluate(level: np.ndarray) -> np.ndarray:  # points x problems: mean of 4 samples
        logit = np.log(level[:, None] / (1 - level[:, None])) + difficulty[None, :]
        return rng.binomial(4, 1 / (1 + np.exp(-logit))) / 4

    base = evaluate(curve["rl"][:1])[0]
    counts = {"without": dict.fromkeys(CLAIMS, 0), "with": dict.fromkeys(CLAIMS, 0)}
    for _ in range(pairs):
        rows = []
        for method in ("rl", "fst"):
            evals = evaluate(curve[method])
            evals[0] = base
            kl = [0.0] + [0.01 * i * kl_scale[method] + rng.normal(0, 0.001) for i in range(1, 11)]
            rows += _rows("efficiency", method, "math", evals.mean(axis=1).tolist(), kl=kl, steps_per_cycle=30,
                          problems=[{f"q{j}": float(v) for j, v in enumerate(e)} for e in evals])
        for row in build_claims({"efficiency": pl.DataFrame(rows).select(CURVE_COLUMNS)}):
            if row["claim"] in CLAIMS:
                counts["without"][row["claim"]] += bool(row["measured"] > CLAIMS[row["claim"]]) and \
                    not row["note"].startswith("FST never")
                counts["with"][row["claim"]] += row["verdict"] == "reproduced"
    return {rule: {c: n / pairs for c, n in by_claim.items()} for rule, by_claim in counts.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=environment.positive, default=300)
    ap.add_argument("--out", default="results/bench/claims_noise.json")
    args = ap.parse_args(argv)
    result = {"pairs": args.pairs, **{s: simulate(s, args.pairs) for s in ("identical", "effect")}}
    for scenario in ("identical", "effect"):
        for rule in ("without", "with"):
            shares = ", ".join(f"{c} {v:.1%}" for c, v in result[scenario][rule].items())
            print(f"{scenario:9s} {rule:7s} noise rules: reproduced in {shares}")
    environment.write_report(Path(args.out), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
