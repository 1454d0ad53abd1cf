"""Paper scale, before spending it: jobs and estimated GPU-hours per figure target.

Jobs come from `snakemake -n` on each figure target with `config/paper.yaml` (what would really
be submitted, counting shared upstream jobs once per figure). GPU-hours come from the runs behind
each figure (`fastslow.experiments.expand`) and the paper's per-step costs on 8xH100, which are
third-party readings of the paper, unverified: RL 60 s/step, FST 100 s/step, FST with rollout reuse
47 s/step. Assumptions of ours, stated in the output: a GEPA-only cycle costs FST's fast round
(100 - 60 = 40 s/step x T on 8 GPUs), FST-distill costs FST, one evaluation point is 15 minutes of
one GPU (256 problems x 4 samples with vLLM), and a figure's upstream runs (e.g. Fig 5's math and
physics checkpoints) are counted in every figure that needs them.

The `all` target is planned `--repeat` times (default 3): `dry_run_all_s` is their median, the
README's "`snakemake -n` for all figures" target, and `dry_run_all_runs_s` lists each run. The
first run also compiles the library's edited modules; it is counted like the rest.

    python bench/paper_cost.py [--config config/paper.yaml] [--repeat 3] [--out results/bench/paper_cost.json]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import environment  # this directory: where the benchmark ran, and atomic report writes
import yaml

ROOT = Path(__file__).resolve().parents[1]
SECONDS_PER_STEP = {"rl": 60.0, "fst": 100.0, "fst_reuse": 47.0}
TRAIN_GPUS = 8
EVAL_GPU_HOURS = 0.25


def dry_run_jobs(target: str, config: str, workdir: Path) -> tuple[int, float]:
    start = time.perf_counter()
    # plain `snakemake -n`, as the README's target names it: every job's lines printed (to a pipe),
    # the job stats' `total N` read from them (`--quiet rules` printed less: 1.1-1.3 s less)
    out = subprocess.run([sys.executable, "-m", "snakemake", target, "-n",
                          "--configfile", config, "--directory", str(workdir),
                          "--snakefile", str(ROOT / "Snakefile")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"snakemake -n {target} failed: {out.stderr[-2000:]}")
    match = re.search(r"^total\s+(\d+)", out.stdout + out.stderr, re.M)
    if match is None and "Nothing to be done" not in out.stdout + out.stderr:  # not 0 jobs: unread
        raise SystemExit(f"snakemake -n {target}: no job count ('total N') in its output: "
                         f"{(out.stdout + out.stderr)[-500:]}")
    return (int(match.group(1)) if match else 0), seconds


def run_gpu_hours(spec, config: dict) -> float:
    cfg = spec.settings(config)
    steps = spec.cycles * cfg["slow"]["steps_per_cycle"]
    if spec.method == "gepa":
        per_step = SECONDS_PER_STEP["fst"] - SECONDS_PER_STEP["rl"]
    elif spec.method == "rl":
        per_step = SECONDS_PER_STEP["rl"]
    else:
        per_step = SECONDS_PER_STEP["fst_reuse" if cfg["fast"]["reuse_rollouts"] else "fst"]
    return steps * per_step * TRAIN_GPUS / 3600


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="config/paper.yaml")
    ap.add_argument("--repeat", type=environment.positive, default=3,
                    help="how many times to plan the `all` target (its time is their median)")
    ap.add_argument("--out", default="results/bench/paper_cost.json")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from fastslow.config import load_config
    from fastslow.experiments import expand
    from fastslow.figures import FIGURE_EXPERIMENTS
    from fastslow.layout import eval_points, figure_runs

    config = load_config(ROOT / "config" / "config.yaml", ROOT / args.config)
    runs = expand(config)

    def upstream(keys: set[str]) -> set[str]:  # runs whose final weights start these runs
        todo, seen = list(keys), set(keys)
        while todo:
            init = runs[todo.pop()].init
            if init and init not in seen:
                seen.add(init)
                todo.append(init)
        return seen

    workdir = Path("/tmp/fastslow-paper-cost")
    workdir.mkdir(exist_ok=True)
    planned = [dry_run_jobs("all", args.config, workdir) for _ in range(args.repeat)]
    total_jobs, runs_all = planned[0][0], [seconds for _, seconds in planned]
    if any(jobs != total_jobs for jobs, _ in planned):
        raise SystemExit(f"snakemake -n all planned {[jobs for jobs, _ in planned]} jobs in its {args.repeat} runs")
    seconds_all = statistics.median(runs_all)
    rows = []
    for fig, experiments in FIGURE_EXPERIMENTS.items():
        keys = upstream(set(figure_runs(runs, fig)))  # Fig 8 / 9: efficiency's runs on their task only
        train = sum(run_gpu_hours(runs[k], config) for k in keys)
        evals = sum(len(eval_points(runs[k])) * len(runs[k].eval_tasks) for k in keys)
        jobs, seconds = dry_run_jobs(f"results/figures/{fig}.pdf", args.config, workdir)
        rows.append({"figure": fig, "experiments": ",".join(experiments), "runs": len(keys),
                     "jobs": jobs, "dry_run_s": round(seconds, 1), "train_gpu_h": round(train),
                     "eval_gpu_h": round(evals * EVAL_GPU_HOURS), "gpu_h": round(train + evals * EVAL_GPU_HOURS)})
    distinct = sum(run_gpu_hours(s, config) for s in runs.values())
    result = {"config": args.config, "all_jobs": total_jobs, "dry_run_all_s": round(seconds_all, 2),
              "dry_run_all_runs_s": [round(s, 2) for s in runs_all],
              "distinct_train_gpu_h": round(distinct), "figures": rows,
              "assumptions": {"seconds_per_step_8xH100": SECONDS_PER_STEP, "eval_point_gpu_h": EVAL_GPU_HOURS}}
    environment.write_report(Path(args.out), result)
    print("| figure | experiments | runs | jobs | GPU-h train | GPU-h eval | GPU-h |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['figure']} | {r['experiments']} | {r['runs']} | {r['jobs']} | {r['train_gpu_h']} | "
              f"{r['eval_gpu_h']} | {r['gpu_h']} |")
    print(f"\nall targets: {total_jobs} jobs (dry-run median {seconds_all:.2f} s of "
          f"{', '.join(f'{s:.2f}' for s in runs_all)}); every distinct run once: "
          f"{round(distinct)} training GPU-h -> {args.out}")
    print(yaml.safe_dump(result["assumptions"], sort_keys=False).strip())


if __name__ == "__main__":
    main()
