"""Must-show probe: does RL-only (K=1, fixed seed context) raise val mean@4 above the base model?

For each training seed: evaluate the base model (SmolLM2-135M-Instruct) on N val problems with
k samples each, run RL-only for S steps as a chain of cycles (`run_cycle`, so the resume path is
exercised too), evaluate the trained weights with the same sampling seed, and measure token KL to
the base and entropy on the trained model's evaluation completions. The verdict compares the
gain with the seed-to-seed spread (max - min over seeds of the trained mean@k, and of the base
mean@k under the same sampling seeds).

    nice python bench/rl_math_probe.py --task math_easy --steps 30 --seeds 0 1
    # or one process per seed, then: python bench/rl_math_probe.py --merge a.json b.json --out c.json
      -> results/bench/rl_probe.json, results/bench/rl_probe.png
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path
from typing import Any

import environment  # this directory: where the benchmark ran, and atomic report writes

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# On a shared CPU, OpenMP threads that spin-wait for each other are starved by other processes
# (measured here: 2 spinning threads were 12x slower than 1 thread); passive waiting avoids it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

from fastslow.model.convert import SMOLLM2_SPEC, load_model, prepare_base_model  # noqa: E402
from fastslow.model.generation import HFGenerator, SamplingParams  # noqa: E402
from fastslow.slow import SlowConfig, kl_and_entropy, run_cycle  # noqa: E402
from fastslow.tasks import get_task  # noqa: E402
from fastslow.tasks.base import Problem, Task, build_messages  # noqa: E402

MODEL_DIR = Path("results/models") / SMOLLM2_SPEC
#: The fixed context of the RL-only run. The config's generic seed context gets no tagged answer
#: from SmolLM2-135M on math_easy (0/64 tagged, reward 0 at T=1.0 and 0.5: no learning signal);
#: this one-shot context gets 14% tagged and 6% correct at T=0.5 (measured on 16 val problems).
SEED_CONTEXT = ("You are a calculator. Example:\nUser: Calculate 3 + 4.\nAssistant: 3 + 4 = 7. "
                "<answer>7</answer>\nAlways end with <answer>NUMBER</answer>.")
log = logging.getLogger("probe")


def evaluate(model_dir: Path, task: Task, problems: list[Problem], k: int, max_new_tokens: int,
             temperature: float, seed: int, base_model: Any = None) -> dict[str, Any]:
    """mean@k, best@k (and KL to `base_model`, entropy) of `model_dir` with the seed context."""
    gen = HFGenerator(load_model(model_dir, dtype="float32"), _tokenizer(model_dir), batch_size=16)
    convs = [build_messages(SEED_CONTEXT, p) for p in problems for _ in range(k)]
    start = time.perf_counter()
    outs = gen.generate(convs, SamplingParams(max_new_tokens, temperature, 1.0, seed))
    seconds = time.perf_counter() - start
    rewards = np.array([task.reward(p, o.text) for p, o in
                        zip([p for p in problems for _ in range(k)], outs, strict=True)])
    mat = rewards.reshape(len(problems), k)
    result = {"mean@k": float(mat.mean()), "best@k": float(mat.max(1).mean()), "k": k,
              "problems": len(problems), "tagged": float(np.mean(["<answer>" in o.text for o in outs])),
              "mean_completion_tokens": float(np.mean([o.completion_tokens for o in outs])),
              "eval_seconds": seconds, "example": outs[0].text[:400]}
    if base_model is not None:
        kl, ent = kl_and_entropy(gen.model, base_model, gen.tokenizer, gen.encode_prompts(convs),
                                 [list(o.completion_ids) for o in outs], temperature=temperature)
        result.update(kl_to_base=kl, entropy=ent)
    return result


def _tokenizer(model_dir: Path) -> Any:
    from fastslow.model.convert import load_tokenizer

    return load_tokenizer(model_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="math_easy")
    parser.add_argument("--steps", type=environment.at_least(1), default=30)
    parser.add_argument("--cycle-steps", type=environment.at_least(1), default=10, help="T; steps are run as cycles")
    parser.add_argument("--seeds", type=environment.at_least(0), nargs="+", default=[0, 1])
    parser.add_argument("--val", type=environment.at_least(1), default=32)
    parser.add_argument("--train", type=environment.at_least(1), default=256)
    parser.add_argument("--k", type=environment.at_least(1), default=4)
    parser.add_argument("--problems-per-step", type=environment.at_least(1), default=4)
    parser.add_argument("--generations", type=environment.at_least(1), default=4)
    parser.add_argument("--max-new-tokens", type=environment.at_least(1), default=48)
    parser.add_argument("--temperature", type=float, default=0.5, help="rollouts and evaluation")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--beta", type=float, default=0.001)
    parser.add_argument("--threads", type=environment.at_least(1), default=1, help="torch threads (1 on a busy CPU)")
    parser.add_argument("--out", type=Path, default=Path("results/bench/rl_probe.json"))
    parser.add_argument("--work", type=Path, default=Path("results/bench/rl_probe"))
    parser.add_argument("--merge", type=Path, nargs="+", help="combine these reports (seeds run in "
                        "parallel processes) into --out, and stop")
    args = parser.parse_args()
    if args.steps % args.cycle_steps:  # before the model is prepared, not after
        parser.error(f"--steps must be a multiple of --cycle-steps, got {args.steps} and {args.cycle_steps}")
    if args.merge:
        merge(args.merge, args.out)
        return
    import torch

    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        datefmt="%H:%M:%S")
    if not (MODEL_DIR / "config.json").exists():
        prepare_base_model(SMOLLM2_SPEC, MODEL_DIR)

    task = get_task(args.task)
    train = task.problems("train", args.train, seed=1234)
    val = task.problems("val", args.val, seed=1234)
    base_model = load_model(MODEL_DIR, dtype="float32")
    report: dict[str, Any] = {"task": args.task, "args": {k: str(v) for k, v in vars(args).items()},
                              "seed_context": SEED_CONTEXT, "runs": []}
    for seed in args.seeds:
        eval_seed = 10_000 + seed
        base = evaluate(MODEL_DIR, task, val, args.k, args.max_new_tokens, args.temperature,
                        eval_seed)
        log.info("seed %d base: %s", seed, {k: base[k] for k in ("mean@k", "best@k", "tagged")})
        cfg = SlowConfig(lr=args.lr, warmup_steps=2, beta=args.beta,
                         num_generations=args.generations,
                         problems_per_step=args.problems_per_step, steps_per_cycle=args.cycle_steps,
                         max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                         micro_batch_size=4, seed=seed)
        state, rewards, start = None, [], time.perf_counter()
        for cycle in range(args.steps // args.cycle_steps):
            out = args.work / f"seed{seed}" / f"cycle{cycle}"
            result = run_cycle(MODEL_DIR, state, [("seed", SEED_CONTEXT)], task, train, cfg, out,
                               f"probe/{args.task}/rl/seed{seed}", cycle)
            rewards += result.rewards
            state = out
        train_seconds = time.perf_counter() - start
        trained = evaluate(state / "model", task, val, args.k, args.max_new_tokens,
                           args.temperature, eval_seed, base_model=base_model)
        log.info("seed %d trained: %s", seed, {k: trained[k] for k in ("mean@k", "best@k", "tagged",
                                                                        "kl_to_base")})
        report["runs"].append({"seed": seed, "base": base, "trained": trained,
                               "train_rewards": rewards, "train_seconds": train_seconds})
        environment.write_report(args.out, report)  # partial results survive

    _finish(report, args.out)


def _finish(report: dict[str, Any], out: Path) -> None:
    """The verdict: the gain over the base vs the seed-to-seed spread; JSON and plot."""
    base_means = [r["base"]["mean@k"] for r in report["runs"]]
    trained_means = [r["trained"]["mean@k"] for r in report["runs"]]
    gains = [t - b for t, b in zip(trained_means, base_means, strict=True)]
    spread = max(trained_means) - min(trained_means) if len(trained_means) > 1 else float("nan")
    base_spread = max(base_means) - min(base_means) if len(base_means) > 1 else float("nan")
    report["summary"] = {
        "base_mean@k": statistics.mean(base_means), "trained_mean@k": statistics.mean(trained_means),
        "gain_per_seed": gains, "mean_gain": statistics.mean(gains),
        "trained_seed_spread": spread, "base_sampling_spread": base_spread,
        "gain_exceeds_spread": bool(min(gains) > max(spread, base_spread))
        if len(gains) > 1 else None,
    }
    environment.write_report(out, report)
    _plot(report, out.with_suffix(".png"))
    print(json.dumps(report["summary"], indent=2))


def merge(paths: list[Path], out: Path) -> None:
    """Combine reports of seeds run as separate processes (same task and settings) into one."""
    reports = [json.loads(p.read_text()) for p in paths]
    keep = ("steps", "task", "k", "max_new_tokens", "temperature", "lr", "problems_per_step")
    for r in reports[1:]:
        if any(r["args"].get(k) != reports[0]["args"].get(k) for k in keep):
            raise SystemExit(f"cannot merge: settings differ ({[k for k in keep if r['args'].get(k) != reports[0]['args'].get(k)]})")
    merged = {**reports[0], "runs": sorted((run for r in reports for run in r["runs"]), key=lambda run: run["seed"]),
              "merged_from": [str(p) for p in paths]}
    _finish(merged, out)


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, run in enumerate(report["runs"]):
        r = np.array(run["train_rewards"])
        smooth = np.convolve(r, np.ones(5) / 5, mode="valid") if len(r) >= 5 else r
        color = f"C{i}"
        ax.plot(np.arange(len(r)), r, color=color, alpha=0.25)
        ax.plot(np.arange(len(smooth)) + (len(r) - len(smooth)), smooth, color=color,
                label=f"seed {run['seed']}: train reward (5-step mean)")
        ax.axhline(run["base"]["mean@k"], color=color, ls=":", label=f"seed {run['seed']}: base val mean@{run['base']['k']}")
        ax.plot([len(r) - 1], [run["trained"]["mean@k"]], marker="*", ms=14, color=color,
                ls="none", label=f"seed {run['seed']}: trained val mean@{run['trained']['k']}")
    ax.set_xlabel("RL step")
    ax.set_ylabel("reward")
    ax.set_title(f"RL-only (K=1) on {report['task']}, SmolLM2-135M-Instruct, CPU")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
