"""Must-show probe: does GEPA-only (frozen base weights, offline `feedback_editor` proposer)
find a context that raises the base model's val mean@4 above the seed context?

Setup: SmolLM2-135M-Instruct on CPU (the embedded default). GEPA searches on train problems:
minibatches from one part, its Pareto validation set from a disjoint held-out part, so the
task's val split is never seen during the search. Then the seed context and GEPA's best
context are each scored on the val split with k samples per problem (mean@k), same sampling
seed for both.

    nice python bench/gepa_probe.py --task math_easy
      -> results/bench/gepa_probe.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import environment  # this directory: where the benchmark ran, and atomic report writes

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

from fastslow.evaluate import sample_and_score, summarize  # noqa: E402
from fastslow.fast import FastConfig, Pool, run_gepa_only  # noqa: E402
from fastslow.model.convert import SMOLLM2_SPEC, prepare_base_model  # noqa: E402
from fastslow.model.generation import SamplingParams, make_generator  # noqa: E402
from fastslow.tasks import get_task  # noqa: E402
from fastslow.tasks.rgym import Source  # noqa: E402

MODEL_DIR = Path("results/models") / SMOLLM2_SPEC
SEED_CONTEXT = "You are a helpful assistant. Solve the problem."
log = logging.getLogger("gepa_probe")


def evaluate(generator: Any, task: Any, problems: list, context: str, k: int, params: SamplingParams) -> dict:
    start = time.perf_counter()
    rows = sample_and_score(generator, task, problems, context, k, params)
    out = summarize(rows, k)
    out["tagged"] = sum("<answer>" in r["completion"] for r in rows) / len(rows)
    out["seconds"] = time.perf_counter() - start
    out["examples"] = [r["completion"][:200] for r in rows[:: max(1, len(rows) // 4)]][:4]
    out["per_problem"] = {}
    for r in rows:
        out["per_problem"].setdefault(r["problem_id"], []).append(r["reward"])
    return out


def paired_test(seed_evals: list[dict], best_evals: list[dict]) -> dict:
    """Is the evolved context better than the seed on the same val problems? Per problem, the
    mean reward over all samples of all eval seeds; a one-sided paired permutation test (sign
    flips of the per-problem differences) and the count of rewarded samples of each context."""
    from scipy.stats import permutation_test

    ids = sorted(seed_evals[0]["per_problem"])
    def per_problem(evals: list[dict]) -> np.ndarray:
        return np.array([np.mean([x for e in evals for x in e["per_problem"][i]]) for i in ids])

    a, b = per_problem(best_evals), per_problem(seed_evals)
    res = permutation_test((a, b), lambda x, y: np.mean(x - y), permutation_type="samples",
                           alternative="greater", n_resamples=20000, random_state=0)
    samples = sum(len(v) for v in seed_evals[0]["per_problem"].values()) * len(seed_evals)
    return {"problems": len(ids), "samples_per_context": samples,
            "rewarded_samples": {"seed_context": float(sum(sum(v) for e in seed_evals for v in e["per_problem"].values())),
                                 "evolved": float(sum(sum(v) for e in best_evals for v in e["per_problem"].values()))},
            "mean_difference": float(np.mean(a - b)), "p_value_one_sided": float(res.pvalue),
            "test": "paired permutation test over val problems (sign flips), evolved > seed"}


def parse_sources(text: str) -> list[Source]:
    """`--sources` JSON, [[dataset, config], ...], as `Source`s; a one-line ValueError if malformed
    or if reasoning-gym rejects a dataset name or its config."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON ({err})") from None
    if not isinstance(value, list) or not value:
        raise ValueError("expected a non-empty JSON list [[dataset, config], ...]")
    sources = []
    for item in value:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict)):
            raise ValueError(f"expected [dataset, config] pairs (a name and a JSON object), got {json.dumps(item)}")
        sources.append(Source(item[0], item[1]))
    import reasoning_gym

    from fastslow.tasks.rgym import quiet

    for source in sources:  # a one-item dataset checks the name and the config's keys and values
        try:
            with quiet():
                reasoning_gym.create_dataset(source.dataset, seed=0, size=1, **source.config)
        except Exception as err:  # reasoning-gym raises KeyError, TypeError, AssertionError, ...
            detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"dataset {source.dataset!r} with config {json.dumps(source.config)}: {detail}") from None
    return sources


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """Validate the arguments right after parsing (a bad one exits through `ap.error`, one line
    naming it); return the task."""
    options: dict[str, Any] = {}
    if args.sources is not None:
        try:
            options["sources"] = parse_sources(args.sources)
        except ValueError as err:
            ap.error(f"--sources {args.sources!r}: {err}")
    try:
        task = get_task(args.task, **options)
    except TypeError:  # an offline generator without reasoning-gym sources
        ap.error(f"--task {args.task!r}: not a reasoning-gym task, so it takes no --sources")
    except ValueError as err:
        ap.error(f"--task {args.task!r}: {err}")
    for name in ("n_train", "n_dev", "n_val", "k", "pool_size", "budget", "rounds", "minibatch",
                 "max_new_tokens", "batch_size", "eval_seeds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected an integer >= 1")
    if not 0.0 <= args.format_credit <= 1.0:
        ap.error(f"--format-credit {args.format_credit}: expected a number in [0, 1]")
    if args.temperature < 0:
        ap.error(f"--temperature {args.temperature}: expected a number >= 0")
    if args.reeval and not args.out.exists():
        ap.error(f"--reeval: {args.out} (--out) does not exist: run the search first")
    return task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="math_easy")
    ap.add_argument("--seed-context", default=SEED_CONTEXT)
    ap.add_argument("--sources", default=None,
                    help='reasoning-gym mixture instead of the task\'s own, as JSON [[dataset, config], ...], '
                         'e.g. \'[["basic_arithmetic", {"min_terms": 2, "max_terms": 2, "operators": ["+"]}]]\'')
    ap.add_argument("--n-train", type=int, default=40, help="train problems for GEPA minibatches")
    ap.add_argument("--n-dev", type=int, default=12, help="held-out train problems: GEPA's Pareto valset")
    ap.add_argument("--n-val", type=int, default=32, help="val problems for the final mean@k")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--pool-size", type=int, default=2)
    ap.add_argument("--budget", type=int, default=100, help="metric calls per GEPA round")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--minibatch", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", help="bfloat16 generates ~2x faster than float32 on CPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--format-credit", type=float, default=0.0,
                    help="GEPA search score = (1-c)*reward + c*[answer parsed] (final mean@k is reward only)")
    ap.add_argument("--eval-seeds", type=int, default=1,
                    help="repeat the final val evaluation with this many sampling seeds (mean@k each)")
    ap.add_argument("--reeval", action="store_true",
                    help="skip the search: re-evaluate the seed and evolved contexts of --out")
    ap.add_argument("--out", type=Path, default=Path("results/bench/gepa_probe.json"))
    args = ap.parse_args()
    task = check_args(ap, args)  # before the model loads: a bad argument fails in a second
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("fastslow.fast.round").setLevel(logging.WARNING)

    if not (MODEL_DIR / "config.json").exists():
        prepare_base_model(SMOLLM2_SPEC, MODEL_DIR)
    generator = make_generator("hf", MODEL_DIR, batch_size=args.batch_size, dtype=args.dtype)
    pool_problems = task.problems("train", args.n_train + args.n_dev, args.seed)
    train, dev = pool_problems[:args.n_train], pool_problems[args.n_train:]
    val = task.problems("val", args.n_val, args.seed)
    cfg = FastConfig(pool_size=args.pool_size, max_metric_calls=args.budget, minibatch_size=args.minibatch,
                     max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                     format_credit=args.format_credit)

    def gepa_log(msg: str) -> None:
        if msg.startswith("fast round") or msg.startswith("feedback_editor") or "Found a better" in msg:
            log.info(msg)

    if args.reeval:  # the search's result from a previous run of this script
        previous = json.loads(args.out.read_text())
        evolved_text, gepa_seconds, summaries = (previous["evolved_context"], previous["gepa_seconds"],
                                                 previous["rounds"])
        pool_rows = previous["pool"]
    else:
        t0 = time.perf_counter()
        pool, summaries = run_gepa_only(Pool.seed(args.seed_context, args.pool_size), generator, task, train,
                                        dev, cfg, args.rounds, args.out.parent / "gepa_probe_run", log=gepa_log)
        gepa_seconds = time.perf_counter() - t0
        evolved_text = pool.entries[0].text
        pool_rows = [{"id": e.id, "dev_mean": e.val_mean, "text": e.text} for e in pool.entries]
        log.info("GEPA done in %.0fs; best dev mean %.3f; evolved context:\n%s", gepa_seconds,
                 pool.entries[0].val_mean, evolved_text)

    # The same sampling seeds for both contexts; several seeds show whether a gap is noise.
    key = f"mean@{args.k}"
    seed_evals, best_evals = [], []
    for r in range(args.eval_seeds):
        params = SamplingParams(args.max_new_tokens, args.temperature, 1.0, 1000 + args.seed + r)
        seed_evals.append(evaluate(generator, task, val, args.seed_context, args.k, params))
        best_evals.append(evaluate(generator, task, val, evolved_text, args.k, params))
        log.info("eval seed %d: seed context %s %.3f, evolved %.3f", r, key, seed_evals[-1][key],
                 best_evals[-1][key])
    seed_eval, best_eval = seed_evals[0], best_evals[0]

    result = {
        "task": args.task, "model": SMOLLM2_SPEC, "method": "GEPA-only (frozen base weights)",
        "proposer": cfg.proposer, "settings": vars(args) | {"out": str(args.out)},
        "protocol": "GEPA minibatches from n_train train problems, Pareto valset = n_dev held-out train "
                    "problems; mean@k on the task's val split, same sampling seed for both contexts",
        "seed_context": args.seed_context, "evolved_context": evolved_text,
        "seed": seed_eval, "evolved": best_eval,
        "delta_mean_at_k": best_eval[key] - seed_eval[key],
        "per_eval_seed": [{"seed_context": a[key], "evolved": b[key], "evolved_tagged": b["tagged"]}
                          for a, b in zip(seed_evals, best_evals, strict=True)],
        "mean_over_eval_seeds": {"seed_context": sum(a[key] for a in seed_evals) / len(seed_evals),
                                 "evolved": sum(b[key] for b in best_evals) / len(best_evals)},
        "significance": paired_test(seed_evals, best_evals),
        "gepa_seconds": gepa_seconds, "rounds": summaries, "pool": pool_rows,
    }
    environment.write_report(args.out, result)
    means = result["mean_over_eval_seeds"]
    sig = result["significance"]
    log.info("wrote %s: seed %.3f -> evolved %.3f (%s over %d eval seeds); rewarded samples %g vs %g of %d, "
             "one-sided paired permutation p = %.4f", args.out, means["seed_context"], means["evolved"], key,
             args.eval_seeds, sig["rewarded_samples"]["seed_context"], sig["rewarded_samples"]["evolved"],
             sig["samples_per_context"], sig["p_value_one_sided"])


if __name__ == "__main__":
    main()
