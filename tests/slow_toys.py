"""Test doubles shared by the slow-loop tests (a plain module: the ranks of the distributed test
import `slow_toys:LengthTask` by name, with this directory on PYTHONPATH)."""

from __future__ import annotations

from fastslow.tasks.base import Problem


class LengthTask:
    """A toy task whose reward depends on the completion text (so groups have variance)."""

    name = "length"

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        return [Problem(f"p{i}", self.name, f"Say the number {i}.", str(i)) for i in range(n)]

    def reward(self, problem: Problem, completion: str) -> float:
        return (len(completion) % 5) / 4

    def feedback(self, problem: Problem, completion: str) -> str:
        return f"expected {problem.answer}, got {len(completion)} characters"


class RecordingTracker:
    """Collects `log_metrics` calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, float], int | None]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls.append((dict(metrics), step))
