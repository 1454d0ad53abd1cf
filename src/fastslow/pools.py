"""How the fast weights evolved: the best context of each cycle of each run, with diffs (HTML)."""

from __future__ import annotations

import difflib
import html
import json
from pathlib import Path

from fastslow.experiments import RunSpec
from fastslow.layout import RESULTS, cycle_dir


def best_contexts(spec: RunSpec, results: str = RESULTS) -> list[dict]:
    """Per cycle: the pool's best entry (text, id, val mean) and the pool size."""
    out = []
    for c in range(spec.cycles):
        pool = json.loads(Path(cycle_dir(spec, c, results), "pool.json").read_text())
        best = pool["entries"][0]
        scores = list((best.get("val_scores") or {}).values())
        out.append({"cycle": c, "id": best.get("id", ""), "text": best["text"], "pool_size": len(pool["entries"]),
                    "val_mean": sum(scores) / len(scores) if scores else None})
    return out


def pool_evolution_html(runs: dict[str, RunSpec], experiment: str, results: str = RESULTS) -> str:
    """One section per run with a fast loop: best context per cycle, and its diff to the previous."""
    parts = [f"<h2>Context pool evolution — {html.escape(experiment)}</h2>"]
    differ = difflib.HtmlDiff(wrapcolumn=90)
    for spec in runs.values():
        if spec.experiment != experiment or not spec.fast:
            continue
        shared = "" if spec.shared is None else f" (the same run as {html.escape(spec.shared)})"
        parts.append(f"<h3>{html.escape(spec.key)}{shared}</h3>")
        prev = None
        for entry in best_contexts(spec, results):
            score = "n/a" if entry["val_mean"] is None else f"{entry['val_mean']:.3f}"
            parts.append(f"<h4>cycle {entry['cycle']}: best context {html.escape(entry['id'])} "
                         f"(Pareto val mean {score}, {entry['pool_size']} in pool)</h4>")
            if prev is None or prev == entry["text"]:
                note = "" if prev is None else "<p><i>unchanged</i></p>"
                parts.append(f"{note}<pre>{html.escape(entry['text'])}</pre>")
            else:
                parts.append(differ.make_table(prev.splitlines(), entry["text"].splitlines(),
                                               f"cycle {entry['cycle'] - 1}", f"cycle {entry['cycle']}",
                                               context=False))
            prev = entry["text"]
    style = ("<style>body{font-family:sans-serif} pre{white-space:pre-wrap;background:#f6f6f6;padding:6px}"
             "table.diff{font-family:monospace;font-size:12px} .diff_add{background:#aaffaa}"
             ".diff_chg{background:#ffff77} .diff_sub{background:#ffaaaa}</style>")
    return f"<html><head><meta charset='utf-8'>{style}</head><body>{''.join(parts)}</body></html>"
