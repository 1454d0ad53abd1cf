"""How the fast weights evolved (HTML): per cycle of each run, the pool, the best context's diff
to its parent, and what the round proposed (`fast/proposals.json`: accepted or not, scores)."""

from __future__ import annotations

import difflib
import html
import json
from pathlib import Path
from typing import Any

from fastslow.experiments import RunSpec
from fastslow.fast.pool import Pool
from fastslow.fast.round import PROPOSALS_FILE
from fastslow.layout import RESULTS, cycle_dir


def cycle_pools(spec: RunSpec, results: str = RESULTS) -> list[dict[str, Any]]:
    """Per cycle: the pool's entries (best first, each with its search score `val_mean`) and
    the round's proposals (`fast/proposals.json`; [] when the cycle has none, e.g. built before
    the file existed)."""
    out = []
    for c in range(spec.cycles):
        directory = Path(cycle_dir(spec, c, results))
        pool = Pool.from_json(directory / "pool.json")
        proposals = directory / "fast" / PROPOSALS_FILE
        out.append({"cycle": c, "entries": [e.to_dict() for e in pool.entries], "k": pool.k,
                    "proposals": json.loads(proposals.read_text()) if proposals.exists() else []})
    return out


def _score(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _pool_table(entries: list[dict[str, Any]], ids: dict[str, str]) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(e.get('id', ''))}</td><td>{e.get('born_round', '')}</td>"
        f"<td>{html.escape(ids.get(e.get('parent') or '', e.get('parent') or '—'))}</td>"
        f"<td>{_score(e['val_mean'])}</td><td>{len(e.get('text', ''))}</td></tr>" for e in entries)
    return ("<table class='pool'><tr><th>context</th><th>born in round</th><th>parent</th>"
            f"<th>search score</th><th>characters</th></tr>{rows}</table>")


def _mean(scores: list[float] | None) -> str:
    return "n/a" if not scores else f"{sum(scores) / len(scores):.2f}"


def _proposals_table(proposals: list[dict[str, Any]], ids: dict[str, str]) -> str:
    """The round's proposals, one row each; an accepted one with its text and the feedback it
    was made from (only those: at paper scale a round makes a hundred proposals)."""
    rows = []
    for p in proposals:
        verdict = ("no proposal" + (f" ({html.escape(p['note'])})" if p.get("note") else "") if p.get("text") is None
                   else "accepted, in the pool" if p.get("in_pool") else "accepted" if p.get("accepted")
                   else "rejected")
        shown = ""
        if p.get("accepted"):
            feedback = "".join(f"<li><b>{html.escape(f['problem_id'])}</b> (reward {f['score']:g}): "
                               f"{html.escape(str(f.get('feedback') or ''))}</li>" for f in p.get("feedback", []))
            shown = (f"<details><summary>context and feedback</summary><pre>{html.escape(p['text'])}</pre>"
                     f"<ul>{feedback}</ul></details>")
        rows.append(f"<tr><td>{p.get('call', '')}</td><td>{html.escape(str(p.get('how') or '—'))}</td>"
                    f"<td>{html.escape(ids.get(p.get('parent_hash') or '', p.get('parent_hash') or ''))}</td>"
                    f"<td>{_mean(p.get('parent_scores'))} → {_mean(p.get('child_scores'))} "
                    f"({len(p.get('minibatch') or [])})</td><td>{verdict}</td><td>{shown}</td></tr>")
    return ("<table class='pool'><tr><th>call</th><th>edit</th><th>parent</th><th>minibatch search score, "
            f"parent → child (problems)</th><th>GEPA</th><th></th></tr>{''.join(rows)}</table>")


LEGEND = ("<p class='note'>Scores are the fast round's search scores: the reward, with "
          "<code>fast.format_credit</code> for a tagged wrong answer, on GEPA's validation problems, "
          "which <code>fast.val_problems</code> draws from the train split (the validation split is "
          "for evaluations). A minibatch score is the mean over the proposal's minibatch; GEPA "
          "accepts a child that scores strictly more than its parent there. Diffs: green added, red deleted, yellow "
          "changed; the f, n and t links jump to the first change, the next one and the top.</p>")


def pool_evolution_html(runs: dict[str, RunSpec], experiment: str, results: str = RESULTS) -> str:
    """One section per run with a fast loop: per cycle, the pool, the best context (its diff to
    its parent when that text is known, else to the last cycle's best) and the proposals."""
    parts = [f"<h2>Context pool evolution — {html.escape(experiment)}</h2>", LEGEND]
    differ = difflib.HtmlDiff(wrapcolumn=90)
    for spec in runs.values():
        if spec.experiment != experiment or not spec.fast:
            continue
        shared = "" if spec.shared is None else f" (the same run as {html.escape(spec.shared)})"
        parts.append(f"<h3>{html.escape(spec.key)}{shared}</h3>")
        texts: dict[str, str] = {}  # hash -> text of every context seen so far, pools and proposals
        ids: dict[str, str] = {}  # hash -> its id as a pool entry would have it (`PoolEntry.id`)
        prev_best = None
        for cycle in cycle_pools(spec, results):
            for p in cycle["proposals"]:
                parent, child = p.get("parent_hash"), p.get("hash")
                if parent and p.get("parent_text"):
                    texts.setdefault(parent, p["parent_text"])
                if parent and parent not in ids:  # in round 0 a parent no earlier call made is a seed
                    ids[parent] = f"{'seed' if cycle['cycle'] == 0 else 'carried'}-{parent[:8]}"
                if child:
                    texts.setdefault(child, p["text"])
                    ids.setdefault(child, f"r{p.get('round', cycle['cycle'])}-{child[:8]}")
            for e in cycle["entries"]:
                texts[e["hash"]] = e["text"]
                ids[e["hash"]] = e["id"]
            best = cycle["entries"][0]
            accepted = sum(bool(p.get("accepted")) for p in cycle["proposals"])
            tried = sum(p.get("text") is not None for p in cycle["proposals"])
            parts.append(f"<h4>cycle {cycle['cycle']}: best context {html.escape(best.get('id', ''))} "
                         f"(search score {_score(best['val_mean'])}; {len(cycle['entries'])} distinct in "
                         f"{cycle['k']} slots; {tried} proposed, {accepted} accepted)</h4>")
            parts.append(_pool_table(cycle["entries"], ids))
            parent = best.get("parent")
            if parent and parent in texts and texts[parent] != best["text"] and best.get("born_round") == cycle["cycle"]:
                base, label = texts[parent], f"parent {ids.get(parent, parent[:8])}"
            else:
                base, label = prev_best, f"cycle {cycle['cycle'] - 1}'s best"
            if base is None or base == best["text"]:
                note = "" if base is None else "<p><i>unchanged</i></p>"
                parts.append(f"{note}<pre>{html.escape(best['text'])}</pre>")
            else:
                parts.append(differ.make_table(base.splitlines(), best["text"].splitlines(), label,
                                               best.get("id", "best"), context=False))
            if cycle["proposals"]:
                parts.append(_proposals_table(cycle["proposals"], ids))
            prev_best = best["text"]
    style = ("<style>body{font-family:sans-serif} pre{white-space:pre-wrap;background:#f6f6f6;padding:6px}"
             "table.diff{font-family:monospace;font-size:12px} .diff_add{background:#aaffaa}"
             ".diff_chg{background:#ffff77} .diff_sub{background:#ffaaaa} table.pool{border-collapse:collapse;"
             "font-size:13px;margin:6px 0} table.pool td,table.pool th{border:1px solid #ccc;padding:2px 6px;"
             "vertical-align:top} .note{color:#444;font-size:13px}</style>")
    title = f"<title>Context pools — {html.escape(experiment)}</title>"
    return f"<html><head><meta charset='utf-8'>{title}{style}</head><body>{''.join(parts)}</body></html>"
