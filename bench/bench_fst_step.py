"""Benchmark: wall time per RL step of RL-only, FST and FST with rollout reuse, side by side.

Each method runs the real cycle code (`fastslow.cycle.run_cycle`, what the `cycle` rule calls) for
`--cycles` cycles of T steps on the embedded default (SmolLM2-135M-Instruct, CPU). As in the
workflow, where each cycle is one `cycle` job, each cycle runs in a fresh process continuing from
the previous cycle's directory, and its peak resident memory is its own (`ru_maxrss`);
`--process run` runs a method's cycles one after another in one process instead (how this
benchmark ran before 2026-11-24 evening: a later cycle then finds the process warm from the
earlier ones, which RL's slow steps profit from more than FST's, whose fast round runs between
them). The last cycle is reported (cycle 0 of FST with reuse has no previous rollouts to reuse),
split into

    generation / scoring / training   (the slow loop's own timers, summed over the T steps)
    fast round                        (GEPA: evaluations + proposals; 0 for RL-only)
    other                             (model loading, saving weights and state, tables: I/O)

and divided by T: seconds per RL step. Process start-up (the interpreter, importing torch,
transformers and MLflow) is left out of that; with `--process cycle` each cycle's `job_wall_s`,
and the summary's `job_s_per_step` and `job_ratio_to_rl`, include it. Runs interleave the methods
(all methods of one repetition and seed, then the next), each repetition and seed in a rotated
order (`method_order`: starting at method (seed + repetition) mod M), so a machine that drifts
during a benchmark does not count against the same method every time; over seeds 0..M-1 each
method runs once in each position. The summary's `training_ratio_same_tokens_by_seed` gauges that
drift: a method whose RL steps sampled completions of exactly RL-only's mean length on a seed
(FST whose pool kept only the seed context trains on RL-only's very rollouts) did the same
training work, so its training seconds over RL-only's are the run-to-run timing alone. `fst_reuse` reuses both ways,
as Fig 10's `reuse` variant in config.yaml does (fast.reuse_rollouts: the last cycle's RL
rollouts feed GEPA; fast.reuse_in_slow: the cycle's first fast.reuse_steps RL steps train on
rollouts the fast round sampled with the cycle's initial weights; `--set fast.reuse_steps=1`
serves the first step alone, as before the thirty-ninth session). `rl_batched` (only when named in
`--methods`) is RL-only sampling each cycle's T steps' rollouts in one generate call
(slow.steps_per_generation = T, TRL's `steps_per_generation`), the later steps training on them
as FST + reuse's do on the round's: the baseline whose steps generate as few calls as reuse's;
the summary's `ratio_to_rl_batched` compares each method with it.

    python bench/bench_fst_step.py [--task math] [--cycles 2] [--reps 1] [--seeds 0,1,2]
        [--methods rl,fst,fst_reuse[,rl_batched]] [--bf16] [--set slow.micro_batch_size=1 ...] [--process cycle|run]
        -> results/bench/fst_step.json, .png

The summary holds each method's seconds a step, the mean over seeds of each seed's fastest
repetition, and its ratio to RL-only's over the same seeds (and per seed); the mean over all runs
(repetitions x seeds); the highest peak RSS of any run.
The report names the machine and checkout it ran on (`environment`, bench/environment.py, taken
when the benchmark starts). It (and the plot) is rewritten after every finished run, so a failing
run keeps the earlier ones; `"complete": false` (and `runs_done` < `runs_planned`) marks a report of a run cut short.
`--set` values are checked before any run starts, as the workflow checks a config (`validate_config`:
the schema and the cross-field rules, e.g. slow.micro_batch_size must divide P*G), for each method;
the model (the embedded default) and the data (the task's split files) are not --set's to change.
Each run also reports its steps' mean completion length: an RL step costs in proportion to its
tokens, and 8 rollouts a step vary by +-15% in length between seeds.

`--bf16` / `--no-bf16` force slow.bf16 (bf16 autocast of the step's forward passes); without
either, the config's value applies (`auto`: on where the CPU has native bf16).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import environment  # this directory: where the benchmark ran, and atomic report writes

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "config" / "config.yaml"  # what the children load (then the method's overrides and --sets)
DATA = ROOT / "results" / "data"
METHODS = {"rl": ("rl", False), "fst": ("fst", False), "fst_reuse": ("fst", True), "rl_batched": ("rl", False)}
#: what `--methods` runs unless told: rl_batched (RL-only sampling each cycle's T steps' rollouts in
#: one call, slow.steps_per_generation = T) only when named
DEFAULT_METHODS = ("rl", "fst", "fst_reuse")
#: What a --set cannot change here: the model is the embedded default and the data the task's
#: split files (a --set of them was recorded in the report and ignored).
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
UNREAD_SECTIONS = ("data", "experiments")
UNREAD_KEYS = ("model.base", "model.name")


def parse_value(text: str) -> Any:
    """A `--set` value: YAML, except that a number YAML 1.1 leaves as text (`1e-5`, no dot) is a float
    (`fastslow.config.number_from_text`, the rule a config file's values follow)."""
    import yaml

    from fastslow.config import number_from_text

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(f"not a YAML value ({str(err).splitlines()[0]})") from None
    return number_from_text(value)


def parse_sets(items: list[str]) -> dict[str, Any]:
    """`--set slow.micro_batch_size=1` -> {"slow": {"micro_batch_size": 1}} (values: `parse_value`).

    The parent and every child parse the same strings with this function, so they agree. Raises a
    one-line ValueError naming the offending --set."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        parts = key.split(".")
        if not sep or not all(parts):
            raise ValueError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. slow.micro_batch_size=1")
        if parts[0] in UNREAD_SECTIONS or ".".join(parts[:2]) in UNREAD_KEYS:
            raise ValueError(f"--set {item!r}: the benchmark runs the embedded default "
                             f"({SMOLLM2_NAME}) on results/data/<task>/train.parquet and does not "
                             f"read {'.'.join(parts)}")
        try:
            parsed = parse_value(value)
        except ValueError as err:
            raise ValueError(f"--set {item!r}: {err}") from None
        *path, last = parts
        node = out
        for i, part in enumerate(path):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {item!r}: {'.'.join(path[:i + 1])} is already set to {node!r} "
                                 f"by an earlier --set")
        node[last] = parsed
    return out


def run_spec(method: str, task: str, cycles: int, seed: int, bf16: bool | None,
             sets: dict[str, Any]) -> Any:
    """The `RunSpec` a child runs `method` with: the method's reuse flags, --bf16 and the --sets."""
    from fastslow.config import deep_update
    from fastslow.experiments import RunSpec

    kind, reuse = METHODS[method]
    fast = {"reuse_rollouts": reuse, "reuse_in_slow": reuse}
    if reuse:  # as Fig 10's `reuse` variant runs (its RL steps served by the round: fast.reuse_steps)
        fast["reuse_steps"] = fig10_reuse_steps()
    slow: dict[str, Any] = {} if bf16 is None else {"bf16": bf16}
    if method == "rl_batched":  # the cycle's T steps sampled in one call (more than T: all T)
        slow["steps_per_generation"] = BATCHED_STEPS
    return RunSpec("bench", kind, f"{task}-{method}", (task,) * cycles, seed=seed,
                   overrides=deep_update({"fast": fast, **({"slow": slow} if slow else {})}, sets))


#: rl_batched's slow.steps_per_generation: above any T, so a block is the whole cycle (a --set may
#: still choose its own)
BATCHED_STEPS = 1000


def fig10_reuse_steps() -> int:
    """fast.reuse_steps of Fig 10's `reuse` variant in CONFIG (experiments.reuse), 1 when it sets none."""
    import yaml

    variant = (yaml.safe_load(CONFIG.read_text()).get("experiments", {}).get("reuse") or {}).get("variants", {}).get("reuse")
    return int(((variant or {}).get("fast") or {}).get("reuse_steps", 1))


def check_config(methods: list[str], task: str, cycles: int, bf16: bool | None, items: list[str]) -> None:
    """Validate the config each method's children would run with (CONFIG + the method's overrides
    + the --sets), as `validate_config` would; raise a one-line ValueError naming the offending
    --set (the one whose removal changes the error) before any child starts."""
    import copy

    from fastslow.config import ConfigError, deep_update, load_config, validate_config

    base = load_config(CONFIG)
    base["experiments"] = {}  # the bench runs none of them (a --set need not suit every variant of theirs)
    parse_sets(items)  # malformed --set: its own message

    def error(method: str, subset: list[str]) -> str | None:
        try:
            spec = run_spec(method, task, cycles, 0, bf16, parse_sets(subset))
            try:
                cfg = spec.settings(base)  # as the child runs it (RL-only: pool_size 1)
            except (TypeError, KeyError):  # e.g. `--set fast=1`: validation names it
                cfg = deep_update(copy.deepcopy(base), spec.overrides)
            validate_config(cfg)
        except ConfigError as err:
            return str(err)
        except ValueError:  # a subset that drops an earlier --set a later one builds on
            return "?"
        return None

    failing = {m: err for m in methods if (err := error(m, items))}
    if not failing:
        return
    method, err = next(iter(failing.items()))
    culprit = next((item for i, item in enumerate(items) if error(method, items[:i] + items[i + 1:]) != err), None)
    where = f" (method {method})" if len(failing) < len(methods) else ""
    raise ValueError(f"--set {culprit!r}{where}: {err}" if culprit else f"{CONFIG.relative_to(ROOT)}{where}: {err}")


def child(method: str, task: str, cycles: int, work: Path, threads: int, bf16: bool | None = None,
          sets: dict[str, Any] | None = None, seed: int = 0, only: int | None = None) -> dict[str, Any]:
    """Run `cycles` cycles of one method in this process (or, with `only`, cycle `only` alone,
    continuing from `work/cycle<only-1>` as a `cycle` job does); return each cycle's split."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import polars as pl
    import torch

    from fastslow.config import load_config
    from fastslow.cycle import run_cycle
    from fastslow.jobs import run_settings
    from fastslow.model.convert import SMOLLM2_SPEC, prepare_base_model
    from fastslow.tracking import init_tracking, job_run

    torch.set_num_threads(threads)
    config = load_config(CONFIG)
    model = ROOT / "results" / "models" / SMOLLM2_SPEC
    if not (model / "config.json").exists():
        prepare_base_model(SMOLLM2_SPEC, model)
    train = DATA / task / "train.parquet"
    if not train.exists():
        raise SystemExit(f"{train} is missing: run `snakemake {train.relative_to(ROOT)}` first")
    spec = run_spec(method, task, cycles, seed, bf16, sets or {})
    # Each cycle runs inside an MLflow job run, as a workflow `cycle` job does (fastslow.jobs): the
    # tracking client and its SQLite store stay resident through the cycle (~190 MiB of RSS on Zen
    # 4, measured 2026-12-06), so the peak RSS is a real job's. The store is the benchmark's own.
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    tracking = work / "results" / "mlflow" / "parents" / "bench.json"
    if not tracking.exists():
        init_tracking(config.get("mlflow_experiment") or "fastslow", ["bench"], tracking, results_dir=work / "results")
    settings, tags = run_settings(spec, config)
    prev, rows = None, []
    todo = range(cycles) if only is None else [only]
    if only is not None and only > 0:  # a later cycle's job starts from the previous cycle's directory
        prev = work / f"cycle{only - 1}"
    for c in todo:
        out = work / f"cycle{c}"
        wildcards = {"experiment": spec.experiment, "method": spec.method, "run": spec.name, "cycle": str(c)}
        with job_run(rule="cycle", wildcards=wildcards, config=settings, tracking_json=tracking, parent="bench",
                     extra_tags=tags) as tracker:
            start = time.perf_counter()  # the cycle alone, as before the job's run was opened around it
            summary = run_cycle(spec, config, c, model, prev, train, out, tracker=tracker)
            wall = time.perf_counter() - start
            tracker.log_artifact(out / "pool.json", "pool")  # what workflow/scripts/cycle.py logs after it
            tracker.log_table(out / "metrics.parquet", f"{spec.key}/cycle{c}/metrics")
            tracker.log_table(out / "rollouts.parquet", f"{spec.key}/cycle{c}/rollouts")
            tracker.log_checkpoint(out / "model", "weights")
        metrics = pl.read_parquet(out / "metrics.parquet")
        fast = json.loads((out / "fast.json").read_text())
        t = metrics.height
        parts = {k: float(metrics[f"{k}_seconds"].sum()) for k in ("generation", "scoring", "training")}
        parts["fast_round"] = float(fast["seconds"]) if spec.fast else 0.0  # a round's time must be there
        parts["other"] = wall - sum(parts.values())
        # The round's own split: the seeds' evaluation call, the search's evaluations, the samples
        # drawn only for the next RL step (reuse_in_slow at G/K > 1), the rest.
        seeds, search = float(fast.get("seed_eval_seconds", 0.0)), float(fast.get("search_eval_seconds", 0.0))
        slow = float(fast.get("slow_sample_seconds", 0.0))
        reused = metrics["reused_rollouts"].to_list() if "reused_rollouts" in metrics.columns else None
        fast_split = {"seeds": seeds / t, "search": search / t, "slow_samples": slow / t,
                      "rest": (parts["fast_round"] - seeds - search - slow) / t}
        rows.append({"cycle": c, "steps": t, "wall_s": wall, "per_step": {k: v / t for k, v in parts.items()},
                     "fast_round_per_step": fast_split,
                     "wall_per_step_s": wall / t, "reward_mean": summary["slow_reward_mean"],
                     # `slow.activation_checkpointing` as the cycle resolved it (`auto`: fp32 on a CPU)
                     "activation_checkpointing": summary.get("activation_checkpointing"),
                     "mean_completion_tokens": float(metrics["mean_completion_tokens"].mean())
                     if "mean_completion_tokens" in metrics.columns else None,
                     "fast_generations": fast.get("generations"), "reused_pairs": fast.get("reused_pairs"),
                     # the search's size against the slow loop's: the round's metric calls and the
                     # cycle's RL rollouts (the paper's proportion: 960 calls per 6 x 256 rollouts)
                     "fast_metric_calls": fast.get("metric_calls"),
                     "rl_rollouts": pl.scan_parquet(out / "rollouts.parquet").select(pl.len()).collect().item(),
                     "slow_rollouts_sampled_in_fast_round": fast.get("slow_rollouts"),
                     "slow_reused_rollouts": sum(reused) if reused is not None else None,
                     # step by step: rollouts a step took from the round, and their mean importance
                     # weight against their sampling log-probs (1 on the weights that sampled them;
                     # null where a step reused none)
                     "steps_reused_rollouts": reused,
                     "steps_reused_is_weight": metrics["reused_is_weight"].fill_nan(None).to_list()
                     if "reused_is_weight" in metrics.columns else None})
        prev = out
    rss_mb = environment.peak_rss_mb()
    return {"method": method, "seed": seed, "cycles": rows, "peak_rss_mb": rss_mb}


def run_child(cmd: list[str], method: str) -> dict[str, Any]:
    """Run one child process of the benchmark; its RESULT line, parsed, with `job_wall_s`: the
    process's wall time from start to exit (the interpreter, imports and config load included)."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    job_wall = time.perf_counter() - start
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        raise SystemExit(f"{method} failed:\n{proc.stderr[-3000:]}")
    return {**json.loads(line[0][7:]), "job_wall_s": job_wall}


def plot(results: list[dict[str, Any]], out: Path, partial: bool = False, label: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = ["generation", "scoring", "training", "fast round: seeds", "fast round: search",
             "fast round: slow_samples", "fast round: rest", "other"]
    methods = [r["method"] for r in results]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    bottom = [0.0] * len(results)

    def value(cycle: dict[str, Any], part: str) -> float:
        if not part.startswith("fast round: "):
            return cycle["per_step"][part]
        split = cycle.get("fast_round_per_step") or {"seeds": 0.0, "search": 0.0, "rest": cycle["per_step"]["fast_round"]}
        return split.get(part.removeprefix("fast round: "), 0.0)  # slow_samples: not in files before s20

    for i, part in enumerate(parts):
        vals = [value(r["cycles"][-1], part) for r in results]
        ax.bar(methods, vals, bottom=bottom, label=part, color=plt.cm.Set2(i))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    rl = next((total for r, total in zip(results, bottom, strict=True) if r["method"] == "rl"), None)
    for x, total in enumerate(bottom):
        ax.text(x, total, f"{total:.1f}s" + (f" ({total / rl:.2f}x)" if rl else ""), ha="center", va="bottom",
                fontsize=9)
    if rl:  # the targets: FST + reuse <= 1.0x, FST <= 1.3x RL-only's seconds a step
        for ratio, style in ((1.0, ":"), (1.3, "--")):
            ax.axhline(rl * ratio, color="0.3", linestyle=style, linewidth=0.8, label=f"target {ratio:.1f}x RL")
    ax.set(ylabel="seconds per RL step (last cycle)",
           title="Wall time per RL step, SmolLM2-135M on CPU" + (f"\n{label}" if label else "")
           + (" (partial)" if partial else ""))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.margins(y=0.12)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[str], list[int]]:
    """The methods and seeds; a bad value exits through `ap.error` (one line naming it)."""
    for name in ("cycles", "reps", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} {getattr(args, name)}: expected an integer >= 1")
    methods = args.methods.split(",")
    if unknown := [m for m in methods if m not in METHODS]:
        ap.error(f"--methods {args.methods!r}: unknown {', '.join(map(repr, unknown))}; "
                 f"choose from {', '.join(METHODS)}")
    if len(set(methods)) < len(methods):
        ap.error(f"--methods {args.methods!r}: a method is listed twice")
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        ap.error(f"--seeds {args.seeds!r}: expected comma-separated integers, e.g. 0,1,2")
    if any(s < 0 for s in seeds):
        ap.error(f"--seeds {args.seeds!r}: expected integers >= 0")
    return methods, seeds


def search_seconds(run: dict[str, Any]) -> float | None:
    """The last cycle's search evaluations a step (the children's rollouts, which no other part
    of a cycle generates and no reuse can serve); None for RL-only or a run without the split."""
    split = run["cycles"][-1].get("fast_round_per_step")
    return None if METHODS[run["method"]][0] == "rl" or not split else split["search"]


def job_per_step(run: dict[str, Any]) -> float | None:
    """The last cycle's job wall time a step (None where not measured: --process run, old reports)."""
    last = run["cycles"][-1]
    return last["job_wall_s"] / last["steps"] if last.get("job_wall_s") is not None else None


PAPER_CALLS_PER_ROLLOUT = 960 / (6 * 32 * 8)  # the paper (unverified readings): ~960 metric calls a round, T = 6 steps of 256 rollouts


def calls_per_rollout(run: dict[str, Any]) -> float | None:
    """The last cycle's fast-round metric calls per RL rollout of the cycle: how large the search
    is against the slow loop's work (the paper: 960 / 1536 = 0.625; a ratio to RL-only's step time
    can only be compared with the paper's at the same proportion). None for RL-only or a report
    from before the count."""
    last = run["cycles"][-1]
    calls, rollouts = last.get("fast_metric_calls"), last.get("rl_rollouts")
    if run["method"] == "rl" or calls is None or not rollouts:
        return None
    return calls / rollouts


def plot_label(settings: dict[str, Any], calls: float | None = None) -> str:
    """The plot's title lines after the first: the task and the `--set` overrides, e.g.
    "hover_hard, slow.steps_per_cycle=6", and with `calls` (a fast method's
    `calls_per_rl_rollout`) a line naming it against the paper's."""
    from fastslow.tracking import flatten

    overrides = [f"{k}={v}" for k, v in flatten(settings.get("overrides") or {}).items()]
    label = ", ".join([str(settings.get("task", "")), *overrides]).strip(", ")
    if calls is not None:
        label += f"\n{calls:.2f} GEPA metric calls per RL rollout (paper {PAPER_CALLS_PER_ROLLOUT:.3f})"
    return label


def seed_runs(runs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each seed's fastest repetition (repetitions of a seed sample the same rollouts, so their
    spread is timing noise; other seeds also sample other completions)."""
    best: dict[int, dict[str, Any]] = {}
    for r in runs:
        if r["seed"] not in best or r["cycles"][-1]["wall_per_step_s"] < best[r["seed"]]["cycles"][-1]["wall_per_step_s"]:
            best[r["seed"]] = r
    return best


def mean_run(method: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A run whose last cycle's parts are the means of `runs`' (the plot's bar for several seeds)."""
    lasts = [r["cycles"][-1] for r in runs]

    def mean(key: str) -> dict[str, float] | None:
        if any(c.get(key) is None for c in lasts):
            return None
        return {k: sum(c[key].get(k, 0.0) for c in lasts) / len(lasts) for k in lasts[0][key]}

    cycle = {"per_step": mean("per_step"), "fast_round_per_step": mean("fast_round_per_step"),
             "wall_per_step_s": sum(c["wall_per_step_s"] for c in lasts) / len(lasts)}
    return {"method": method, "seeds": [r["seed"] for r in runs], "cycles": [cycle]}


def method_order(methods: list[str], seed: int, rep: int) -> list[str]:
    """The order one repetition of one seed runs the methods in: `methods` rotated to start at
    index (seed + rep) mod len(methods)."""
    k = (seed + rep) % len(methods)
    return methods[k:] + methods[:k]


def training_same_tokens(run: dict[str, Any], rl: dict[str, Any]) -> float | None:
    """`run`'s training seconds a step over RL-only's `rl` (same seed, last cycle) when its RL
    steps sampled completions of exactly RL-only's mean length (the same rollouts: identical
    training work), else None."""
    mine, theirs = run["cycles"][-1], rl["cycles"][-1]
    tokens = (mine.get("mean_completion_tokens"), theirs.get("mean_completion_tokens"))
    if None in tokens or abs(tokens[0] - tokens[1]) > 1e-9 or not theirs["per_step"].get("training"):
        return None
    return mine["per_step"]["training"] / theirs["per_step"]["training"]


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each method's seconds a step: the mean over seeds of each seed's fastest repetition, over
    the seeds RL-only ran too (every seed of a finished report), so a ratio to RL-only pairs the
    same seeds' rollouts; `ratio_by_seed` gives each seed's own ratio. `peak_rss_mb` is the
    highest of all runs; `mean_*` are over every repetition and seed."""
    by_seed = {m: seed_runs(runs) for m, runs in results.items() if runs}
    rl = by_seed.get("rl", {})
    batched = by_seed.get("rl_batched", {})  # RL-only sampling a cycle's steps in one call
    means = {m: sum(r["cycles"][-1]["wall_per_step_s"] for r in runs) / len(runs)
             for m, runs in results.items() if runs}
    summary = {}
    for method, runs in by_seed.items():
        seeds = sorted(s for s in runs if s in rl) or sorted(runs)
        paired = bool(rl) and all(s in rl for s in seeds)

        def mean(values: list[float]) -> float:
            return sum(values) / len(values)

        s_per_step = mean([runs[s]["cycles"][-1]["wall_per_step_s"] for s in seeds])
        rl_s = mean([rl[s]["cycles"][-1]["wall_per_step_s"] for s in seeds]) if paired else None
        searches = [search_seconds(runs[s]) for s in seeds]
        jobs = [job_per_step(runs[s]) for s in seeds]
        rl_jobs = [job_per_step(rl[s]) for s in seeds] if paired else [None]
        calls = [calls_per_rollout(runs[s]) for s in seeds]
        summary[method] = {
            "seeds": seeds,
            "s_per_step": s_per_step,
            "ratio_to_rl": s_per_step / rl_s if rl_s else None,
            "ratio_by_seed": {str(s): runs[s]["cycles"][-1]["wall_per_step_s"] / rl[s]["cycles"][-1]["wall_per_step_s"]
                              for s in seeds if paired},
            # against the RL-only baseline that samples its cycle in one call (when it ran, same seeds)
            "ratio_to_rl_batched": s_per_step / mean([batched[s]["cycles"][-1]["wall_per_step_s"] for s in seeds])
            if batched and all(s in batched for s in seeds) else None,
            "peak_rss_mb": max(r["peak_rss_mb"] for r in results[method]),
            "mean_s_per_step": means[method],
            "mean_ratio_to_rl": means[method] / means["rl"] if "rl" in means else None,
            # the Targets' measure: each seed's ratio, averaged over the seeds (ratio_to_rl above is
            # the ratio of the seeds' mean seconds, which weighs the slower seeds more)
            "mean_ratio_by_seed": mean([runs[s]["cycles"][-1]["wall_per_step_s"] / rl[s]["cycles"][-1]["wall_per_step_s"]
                                        for s in seeds]) if paired else None,
            # the ratio the method would reach if its round cost only the search's evaluations and
            # its slow steps cost RL-only's: a lower bound for any rollout reuse at this budget and T
            "search_floor_ratio": 1 + mean(searches) / rl_s if rl_s and None not in searches else None,
            "calls_per_rl_rollout": mean(calls) if None not in calls else None,
            # identical training work on another run (training_same_tokens): the timing noise and
            # drift between this method's run and RL-only's, which the ratios above carry too
            "training_ratio_same_tokens_by_seed": {
                str(s): r for s in seeds if paired and method != "rl"
                and (r := training_same_tokens(runs[s], rl[s])) is not None},
            # the last cycle's whole job a step (--process cycle): what the workflow's `cycle` job
            # costs, process start-up (interpreter, imports) included, which s_per_step leaves out
            "job_s_per_step": mean(jobs) if None not in jobs else None,
            "job_ratio_to_rl": mean(jobs) / mean(rl_jobs) if None not in jobs + rl_jobs else None,
        }
    return summary


def write_report(out: Path, settings: dict[str, Any], results: dict[str, list[dict[str, Any]]],
                 planned: int, machine: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the report of the runs finished so far to `out` (JSON) and its plot (`.png`), each
    atomically; `complete` is false until all `planned` runs are in. Returns the report. The
    report's `environment` is `machine` (the one the benchmark started on; `environment.describe()`
    if not given). The plot's bars are each method's summary runs (a seed's fastest repetition;
    with several seeds, the mean of their parts)."""
    from fastslow.io import atomic_path

    done = sum(map(len, results.values()))
    summary = summarize(results)
    report = environment.write_report(out, {**settings, "complete": done >= planned, "runs_done": done,
                                            "runs_planned": planned, "runs": results, "summary": summary},
                                      machine)
    if summary:
        bars = [mean_run(m, [seed_runs(results[m])[s] for s in v["seeds"]]) for m, v in summary.items()]
        seeds = sorted({s for v in summary.values() for s in v["seeds"]})
        with atomic_path(out.with_suffix(".png")) as tmp:
            calls = next((v["calls_per_rl_rollout"] for v in summary.values()
                          if v["calls_per_rl_rollout"] is not None), None)
            label = plot_label(settings, calls)
            if len(seeds) > 1:
                label += f"\nmean of seeds {', '.join(map(str, seeds))}"
            plot(bars, tmp, partial=done < planned, label=label)
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", default="math")
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--seeds", default="0",
                    help="comma-separated run seeds (data order and sampling); every repetition runs each "
                         "seed. Repetitions of one seed sample the same rollouts, so they measure timing "
                         "noise only; other seeds also vary completion lengths, which the step time follows")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                    help="comma-separated subset of " + ",".join(METHODS) + " (default: " + ",".join(DEFAULT_METHODS) + ")")
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                    help="slow.bf16 on/off (default: the config's, `auto` on the CPU default)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="config override for every method, e.g. slow.micro_batch_size=1 (repeatable)")
    ap.add_argument("--out", type=Path, default=Path("results/bench/fst_step.json"))
    ap.add_argument("--process", choices=("cycle", "run"), default="cycle",
                    help="cycle: each cycle in a fresh process, as the workflow's `cycle` rule runs it (default); "
                         "run: a method's cycles one after another in one process (benchmarks before 2026-11-24 "
                         "evening), where later cycles find the process warm from earlier ones")
    ap.add_argument("--child", nargs=2, metavar=("METHOD", "WORKDIR"), help=argparse.SUPPRESS)
    ap.add_argument("--only-cycle", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        res = child(args.child[0], args.task, args.cycles, Path(args.child[1]), args.threads, args.bf16,
                    parse_sets(args.sets), int(args.seeds), args.only_cycle)
        print("RESULT " + json.dumps(res), flush=True)
        return
    methods, seeds = check_args(ap, args)
    try:
        check_config(methods, args.task, args.cycles, args.bf16, args.sets)
    except ValueError as err:  # one line, e.g. --set 'slow.lr=x': config error: slow.lr: expected a number, ...
        print(f"{ap.prog}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    train = DATA / args.task / "train.parquet"
    if not train.exists():
        from fastslow.tasks import TASK_NAMES

        ap.error(f"--task {args.task!r}: {train} is missing: run `snakemake {train.relative_to(ROOT)}` first"
                 if args.task in TASK_NAMES else
                 f"--task {args.task!r}: unknown task; expected one of {', '.join(TASK_NAMES)}")
    settings = {"task": args.task, "cycles": args.cycles, "process": args.process, "reps": args.reps,
                "seeds": seeds, "threads": args.threads, "bf16": args.bf16, "overrides": parse_sets(args.sets)}
    machine = environment.describe()  # at the start: a load average taken between runs would read ours
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    planned = args.reps * len(seeds) * len(methods)
    report: dict[str, Any] = {}
    for rep, seed in ((r, s) for r in range(args.reps) for s in seeds):
        for method in method_order(methods, seed, rep):
            with tempfile.TemporaryDirectory(prefix=f"bench-{method}-") as work:
                print(f"rep {rep}, seed {seed}: {method} ...", file=sys.stderr, flush=True)
                cmd = [sys.executable, __file__, "--child", method, work, "--task", args.task,
                       "--cycles", str(args.cycles), "--threads", str(args.threads), "--seeds", str(seed),
                       *({True: ["--bf16"], False: ["--no-bf16"]}.get(args.bf16, [])),
                       *(f"--set={x}" for x in args.sets)]
                jobs = [[*cmd, "--only-cycle", str(c)] for c in range(args.cycles)] \
                    if args.process == "cycle" else [cmd]
                res = {"method": method, "seed": seed, "process": args.process, "cycles": [], "peak_rss_mb": 0.0}
                for job in jobs:
                    try:
                        part = run_child(job, method)
                    except SystemExit:
                        done = sum(map(len, results.values()))
                        if done:
                            print(f"{args.out}: partial report of the {done} of {planned} runs finished",
                                  file=sys.stderr, flush=True)
                        raise
                    if args.process == "cycle":  # each cycle job's own peak and wall time
                        part["cycles"][0]["peak_rss_mb"] = part["peak_rss_mb"]
                        part["cycles"][0]["job_wall_s"] = part["job_wall_s"]
                    res["cycles"] += part["cycles"]
                    res["peak_rss_mb"] = max(res["peak_rss_mb"], part["peak_rss_mb"])
                results[method].append(res)
                report = write_report(args.out, settings, results, planned, machine)  # after every run: a failure keeps them
                last = res["cycles"][-1]
                split = last.get("fast_round_per_step") or {}
                print(f"  {method}: {last['wall_per_step_s']:.1f} s/step "
                      f"({', '.join(f'{k} {v:.1f}' for k, v in last['per_step'].items())}"
                      + (f"; the round: seeds {split['seeds']:.1f}, search {split['search']:.1f}, "
                         f"samples for the RL step {split['slow_samples']:.1f}, rest {split['rest']:.1f}"
                         if method != "rl" and split else "") + "), "
                      + (f"{last['fast_metric_calls']} metric calls for {last['rl_rollouts']} RL rollouts, "
                         if method != "rl" else "") +
                      f"peak RSS {res['peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
    print(json.dumps(report["summary"], indent=2))


if __name__ == "__main__":
    main()
