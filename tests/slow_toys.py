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


def stub_slow_steps_and_write_math(monkeypatch, data_dir):
    """For running a cycle without training: the slow steps of `fastslow.slow.loop.run_cycle`
    stubbed (they write an empty output and no metrics), and the smoke config's math splits
    written under `data_dir`. Returns (the smoke config, the train split's path)."""
    import types
    from pathlib import Path

    import fastslow.slow.loop
    from fastslow.config import load_config, task_spec
    from fastslow.tasks.data import write_splits

    def slow_steps(model_dir, state_in, contexts, task, train_problems, cfg, out_dir, **kwargs):
        Path(out_dir).mkdir(parents=True)
        return types.SimpleNamespace(metrics=[])

    monkeypatch.setattr(fastslow.slow.loop, "run_cycle", slow_steps)
    root = Path(__file__).resolve().parents[1]
    config = load_config(root / "config/config.yaml", root / "config/smoke.yaml")
    registry, options = task_spec(config, "math")
    splits = write_splits(registry, data_dir, config["data"]["sizes"], config["data"]["seed"], **options)
    return config, splits["train"]
