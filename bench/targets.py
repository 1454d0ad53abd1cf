"""Issue #8's step-time targets at the CPU default, per machine kind, from the kept raw JSON.

Reads the `bench_fst_step.py` reports in bench/measured/ that ran the CPU default (hover_hard,
T = 3, no `--set`) and plots each seed's ratio of seconds per RL step to RL-only's on the same
seed and in the same report, for FST and for FST with rollout reuse serving every RL step of the
cycle (`fast.reuse_steps` = T, Fig 10's reuse since the thirty-ninth session), against the
targets (FST at most 1.3x, FST + reuse at most 1.0x). Machine kinds differ by a third in these
ratios: what runs in bf16 (training under autocast, sampling) decides how much of an RL step
generation is, and the fast round is all generation.

Reports written from 2026-12-02 on name their machine (`environment`, bench/environment.py); for
the earlier ones `SOURCES` says which kind each ran on, as the README and bench/HISTORY.md do.

    python bench/targets.py [--measured bench/measured] [--out bench/measured/targets.png]
        -> the plot, and beside it its numbers (.json)
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import environment  # this directory: where the benchmark ran, and atomic report writes

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"fst": 1.3, "fst_reuse": 1.0}
LABELS = {"fst": "FST", "fst_reuse": "FST + reuse (every RL step)"}
#: The machine kinds, in the plot's order, and how a report's environment names each.
KINDS = {
    "amx": "AVX512-BF16 with AMX\n(bf16 training and sampling)",
    "bf16_no_amx": "AVX512-BF16 without AMX\n(bf16; an AMD EPYC so far)",
    "intel_fp32": "Intel without AVX512-BF16\n(fp32)",
    "amd_fp32": "AMD EPYC without AVX-512\n(fp32)",
    # The CPU default's `slow.activation_checkpointing: auto` (dbca0fa on) checkpoints where
    # training is fp32: about 7.5% more to RL-only's step and less to FST's (its round is
    # untouched), so those reports are a group of their own beside their kind's earlier ones.
    "intel_fp32_ckpt": "Intel without AVX512-BF16\n(fp32, checkpointed:\nthe default from dbca0fa)",
    "amd_fp32_ckpt": "AMD EPYC without AVX-512\n(fp32, checkpointed:\nthe default from dbca0fa)",
}
#: The suffix of a kind whose reports trained under activation checkpointing (`checkpointed`).
CHECKPOINTED = "_ckpt"
#: The CPU-default reports kept before reports named their machine: file -> (kind, methods whose
#: runs count). The rule: every complete one-thread CPU-default report (`as_read`) from the
#: thirty-sixth session on, the first to tell the machine kinds apart. The earlier ones (s13-s20)
#: ran on machines whose kind was not recorded, and on a fast round since rewritten; they are in
#: bench/HISTORY.md only. FST + reuse counts only where it served every RL step (the s38 and s36
#: reports' served the first step alone).
SOURCES = {
    "fst_step_hover_hard_s38.json": ("amx", ("fst",)),
    "fst_step_hover_hard_s38_seeds12.json": ("amx", ("fst",)),
    "fst_step_hover_hard_reuse3_s39.json": ("amx", ("fst_reuse",)),
    "fst_step_hover_hard_reuse3_s39_seeds12.json": ("amx", ("fst_reuse",)),
    "fst_step_hover_hard_reuse3_s39_seed3.json": ("amx", ("fst_reuse",)),
    "fst_step_hover_hard_s36.json": ("intel_fp32", ("fst",)),
    "fst_step_hover_hard_s40.json": ("amd_fp32", ("fst", "fst_reuse")),
    "fst_step_hover_hard_s40_seed1.json": ("amd_fp32", ("fst_reuse",)),
    "fst_step_hover_hard_batched_s43.json": ("amd_fp32", ("fst_reuse",)),
    "fst_step_hover_hard_batched_s43_seed1.json": ("amd_fp32", ("fst_reuse",)),
}


def kind_of(machine: dict[str, Any]) -> str:
    """A report's machine kind from its `environment`: native bf16 with AMX tiles (amx_bf16), with
    AVX512-BF16 alone (AMD Zen 4 and 5, Intel Cooper Lake: bf16 dot products, no tiles), or
    neither (fp32, by vendor)."""
    cpu = machine["cpu"]
    if cpu["native_bf16"]:
        return "amx" if "amx_bf16" in cpu["flags"] else "bf16_no_amx"
    return "amd_fp32" if "AMD" in cpu["model"] else "intel_fp32"


def cpu_default(report: dict[str, Any]) -> bool:
    """A report of the CPU default: hover_hard, T = 3 (no --set), slow.bf16 and
    slow.activation_checkpointing as `auto` decides, run as the targets are read (`as_read`).
    `points` groups one that trained checkpointed apart from its kind's others (`checkpointed`)."""
    return report["task"] == "hover_hard" and not report["overrides"] and report["bf16"] is None and as_read(report)


def checkpointed(report: dict[str, Any]) -> bool:
    """Whether a cycle of the report trained under activation checkpointing. The CPU default's
    `slow.activation_checkpointing: auto` turns it on where training is fp32 (dbca0fa on), about
    7.5% more a step for RL-only and less for FST: such runs would shift their kind's ratios
    against the earlier ones, so they form a group of their own (the kind's name + CHECKPOINTED).
    Reports from before the cycles recorded it trained without."""
    return any(cycle.get("activation_checkpointing") for runs in report.get("runs", {}).values()
               for run in runs for cycle in run.get("cycles", []))


def as_read(report: dict[str, Any]) -> bool:
    """Run as the Targets table reads a step: to the end (`complete`), one torch thread, each
    cycle in its own process, and at least two cycles (the last one's steps are reported)."""
    return (report.get("complete") is True and report.get("threads") == 1 and report.get("process") == "cycle"
            and report.get("cycles", 0) >= 2)


def points(measured: Path) -> list[dict[str, Any]]:
    """One row per (report, method, seed): its kind, and the ratio to RL-only on that seed."""
    rows = []
    for path in sorted(measured.glob("fst_step_*.json")):
        report = json.loads(path.read_text())
        if path.name in SOURCES:
            if not as_read(report):  # a listed file must be one the table can read
                raise SystemExit(f"{path}: listed in targets.SOURCES but not a complete one-thread run of "
                                 f"2 or more cycles, each in its own process")
            kind, methods = SOURCES[path.name]
        elif "environment" in report and cpu_default(report):
            kind = kind_of(report["environment"]) + (CHECKPOINTED if checkpointed(report) else "")
            if kind not in KINDS:  # (the bf16 kinds' `auto` does not checkpoint: a --set would have)
                print(f"left out: {path.name} (a CPU-default run of kind {kind}, which the table has no column for)")
                continue
            methods = tuple(TARGETS)
        else:
            continue
        for method in methods:
            summary = report["summary"].get(method)
            for seed, ratio in (summary or {}).get("ratio_by_seed", {}).items():
                rows.append({"file": path.name, "kind": kind, "method": method, "seed": int(seed),
                             "ratio": ratio})
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind and method: the runs' ratios, each seed's mean over its runs, the mean over seeds
    (each seed weighs once, however often it was run), and whether that mean meets the target."""
    out: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        for method, target in TARGETS.items():
            mine = [r for r in rows if r["kind"] == kind and r["method"] == method]
            if not mine:
                continue
            by_seed: dict[int, list[float]] = {}
            for r in mine:
                by_seed.setdefault(r["seed"], []).append(r["ratio"])
            seed_means = {str(seed): statistics.mean(v) for seed, v in sorted(by_seed.items())}
            mean = statistics.mean(seed_means.values())
            out[f"{kind}/{method}"] = {"runs": len(mine), "ratios": [r["ratio"] for r in mine],
                                       "run_mean": statistics.mean(r["ratio"] for r in mine),
                                       "seeds": len(seed_means), "seed_means": seed_means, "mean": mean,
                                       "target": target, "met": mean <= target}
    return out


def plot(rows: list[dict[str, Any]], summary: dict[str, dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"fst": "tab:orange", "fst_reuse": "tab:green"}
    fig, ax = plt.subplots(figsize=(11.5, 5.0))
    for i, kind in enumerate(KINDS):
        for j, method in enumerate(TARGETS):
            x = i + (j - 0.5) * 0.34
            mine = [r for r in rows if r["kind"] == kind and r["method"] == method]
            if not mine:
                ax.text(x, 0.82, "not\nmeasured", ha="center", va="bottom", fontsize=7, color="grey")
                continue
            spread = [(k - (len(mine) - 1) / 2) * 0.035 for k in range(len(mine))]
            ax.scatter([x + s for s in spread], [r["ratio"] for r in mine], color=colors[method], s=18,
                       alpha=0.75, zorder=3)
            mean = summary[f"{kind}/{method}"]["mean"]
            ax.hlines(mean, x - 0.13, x + 0.13, color=colors[method], linewidth=2.5, zorder=4)
            n_seeds = summary[f"{kind}/{method}"]["seeds"]
            ax.annotate(f"{mean:.2f}x\n({len(mine)} run{'s' * (len(mine) > 1)},\n{n_seeds} seed{'s' * (n_seeds > 1)})",
                        (x + 0.14, mean),
                        fontsize=7, va="center")
    for method, target in TARGETS.items():
        ax.axhline(target, color=colors[method], linestyle="--", linewidth=1,
                   label=f"{LABELS[method]}: target {target:g}x")
    ax.set_xticks(range(len(KINDS)), list(KINDS.values()), fontsize=8)
    ax.set_xlim(-0.6, len(KINDS) - 0.2)
    ax.set_ylim(0.7, max([1.75, *(r["ratio"] + 0.05 for r in rows)]))
    ax.set_ylabel("seconds per RL step / RL-only's (same seed)")
    ax.set_title("Issue #8 at the CPU default (hover_hard, T = 3): each dot one run of a seed, bar the mean of the seeds' means",
                 fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", type=Path, default=ROOT / "bench" / "measured")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "measured" / "targets.png")
    args = ap.parse_args(argv)
    if not args.measured.is_dir():
        ap.error(f"--measured {args.measured}: not a directory")
    missing = sorted(name for name in SOURCES if not (args.measured / name).exists())
    if missing:
        ap.error(f"--measured {args.measured}: lacks {missing[0]} (one of the reports SOURCES names)")
    rows = points(args.measured)
    summary = summarize(rows)
    from fastslow.io import atomic_path

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(args.out) as tmp:
        plot(rows, summary, tmp)
    report = environment.write_report(args.out.with_suffix(".json"), {"targets": TARGETS, "summary": summary,
                                                                      "points": rows})
    for key, s in summary.items():
        print(f"{key:22s} {s['mean']:.3f}x over {s['seeds']} seed(s), {s['runs']} run(s); runs' mean "
              f"{s['run_mean']:.3f}x (target {s['target']:g}x: "
              f"{'met' if s['met'] else 'not met'})")
    return report


if __name__ == "__main__":
    main()
