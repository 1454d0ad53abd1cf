"""Star-graph path search (reasoning-gym `path_star`, after arXiv 2403.06963 / 2510.03971).

Several arms of equal length leave a centre node; the model must output the path from the centre
to a goal at the end of one arm. Left-to-right next-token prediction has to guess the first step
(the "Clever Hans" trap), so a small base model scores about 0. The answer is the node sequence;
it is scored by reasoning-gym's exact match after reading the nodes leniently (spaces, commas or
arrows between labels). Feedback names the right arm and the first wrong step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from fastslow.tasks.base import Judgement, Problem, extract_answer
from fastslow.tasks.generated import Candidate
from fastslow.tasks.rgym import ReasoningGymTask, Source, rg_score

_EDGE_RE = re.compile(r"\|(\d+) (\d+)")


class StarGraphTask(ReasoningGymTask):
    """Find the centre-to-goal path in a path-star graph."""

    family = "stargraph"
    instruction = "Write the node labels of the path separated by single spaces."
    sources_by_difficulty = {
        "easy": (Source("path_star", {"degree": 2, "min_path_length": 2, "max_path_length": 3,
                                      "node_range": 100}),),
        "default": (Source("path_star", {}),),  # degree 3, arms of 3–5 nodes, labels < 100000
        "hard": (Source("path_star", {"degree": 5, "min_path_length": 6, "max_path_length": 7,
                                      "node_range": 200_000}),),
    }

    def convert(self, item: Mapping[str, Any], source: Source) -> Candidate | None:
        cand = super().convert(item, source)
        task_line = str(item["question"]).rsplit("Solve the following task:", 1)[-1]
        meta = item.get("metadata", {}) or {}
        cand.metadata = {"source": source.dataset, "center": int(meta["center"]), "goal": int(meta["goal"]),
                         "edges": [[int(u), int(v)] for u, v in _EDGE_RE.findall(task_line)],
                         "path_length": int(meta.get("path_length", 0))}
        return cand

    def judge(self, problem: Problem, completion: str) -> Judgement:
        raw = extract_answer(completion)
        expected = [int(x) for x in problem.answer.split()]
        notes = _analysis(problem.metadata, expected, None)
        if raw is None:
            return Judgement(0.0, problem.answer, None, notes)
        # Node labels only: separators (spaces, commas, "->") are a matter of form, not of search.
        # A run of more than 18 digits names no node: -1 (no label), not int()'s ValueError past
        # 4300 digits, and not dropped (the rest could then read as the right path).
        # All of it: `extract_answer` bounds it, and a label past a cut would be left unread.
        got = [int(x) if len(x) <= 18 else -1 for x in re.findall(r"\d+", raw)]
        if not got:
            return Judgement(0.0, problem.answer, raw, ["No node labels could be read.", *notes])
        reward = rg_score("path_star", " ".join(map(str, got)), {"answer": problem.answer})
        if reward < 1.0:
            notes = _analysis(problem.metadata, expected, got)
        return Judgement(reward, problem.answer, raw, notes)


def _analysis(meta: Mapping[str, Any], expected: list[int], got: list[int] | None) -> list[str]:
    """Where the given path goes wrong, and how to find the right arm (trace back from the goal)."""
    center, goal = meta.get("center", expected[0]), meta.get("goal", expected[-1])
    edges = {frozenset(e) for e in meta.get("edges", []) if len(e) == 2}
    arms = sorted(v for e in edges if center in e for v in e if v != center)
    notes = []
    if got is not None:
        if got[0] != center:
            notes.append(f"The path must start at the start node {center}, not {got[0]}.")
        elif got[-1] != goal:
            notes.append(f"The path must end at the goal {goal}, not {got[-1]}.")
        bad = next(((a, b) for a, b in zip(got, got[1:], strict=False) if frozenset((a, b)) not in edges), None)
        if edges and bad:
            notes.append(f"{bad[0]}–{bad[1]} is not an edge of the graph.")
        if len(got) > 1 and len(expected) > 1 and got[0] == center and got[1] != expected[1]:
            notes.append(f"The first step went to {got[1]}, but the goal lies on the arm that starts "
                         f"at {expected[1]}.")
    if arms:
        notes.append(f"From {center}, {len(arms)} arms start ({', '.join(map(str, arms))}); the goal "
                     f"{goal} is on the arm through {expected[1] if len(expected) > 1 else goal}. "
                     "Trace the edges backwards from the goal to the centre, then reverse.")
    return notes
