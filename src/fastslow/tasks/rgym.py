"""Adapter from reasoning-gym procedural datasets to our split-disjoint `GeneratedTask`.

reasoning-gym seeds item `i` of a dataset with `Random(seed + i)`, so datasets with nearby seeds
share items. We never rely on seeds for disjointness: every split draws from its own hashed seed
stream, in chunks, and `GeneratedTask` assigns each item to one split by a content hash.
reasoning-gym is imported lazily (importing it loads all ~100 generators, a few seconds).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastslow.tasks.base import ANSWER_FORMAT, Problem, TaskDataError
from fastslow.tasks.generated import Candidate, GeneratedTask, stable_int


@dataclass(frozen=True)
class Source:
    """One reasoning-gym dataset in a task's mixture."""

    dataset: str
    config: Mapping[str, Any] = field(default_factory=dict)
    weight: float = 1.0


def as_source(value: Source | Mapping[str, Any], task: str = "task") -> Source:
    """A `Source` from itself or from a mapping as a config writes it:
    `{dataset: basic_arithmetic, config: {max_terms: 2}, weight: 1.0}` (config and weight optional)."""
    if isinstance(value, Source):
        return value
    if not isinstance(value, Mapping) or "dataset" not in value:
        raise ValueError(f"{task}: a source must be a mapping with a 'dataset' key "
                         f"(and optional 'config', 'weight'), got {value!r}")
    unknown = sorted(set(value) - {"dataset", "config", "weight"})
    if unknown:
        raise ValueError(f"{task}: source {value.get('dataset')!r} has unknown key(s) {unknown}; "
                         "expected dataset, config, weight")
    config, weight = value.get("config") or {}, value.get("weight", 1.0)
    if not isinstance(config, Mapping):
        raise ValueError(f"{task}: source {value['dataset']!r}: config: expected a mapping of the "
                         f"dataset's options, got {type(config).__name__} {config!r}")
    try:
        number = math.nan if isinstance(weight, bool) else float(weight)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{task}: source {value['dataset']!r}: weight: expected a positive number, "
                         f"got {type(weight).__name__} {weight!r}")
    return Source(str(value["dataset"]), dict(config), number)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence stdout/stderr: some generators print on every failed sample."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def jsonable(value: Any) -> Any:
    """`value` made JSON-safe (tuples to lists, unknown objects to str), for metadata."""
    return json.loads(json.dumps(value, default=str))


_SCORERS: dict[str, Any] = {}


def rg_score(dataset: str, answer: str | None, entry: Mapping[str, Any]) -> float:
    """reasoning-gym's own `score_answer` for `dataset` (a default-config instance, cached)."""
    if dataset not in _SCORERS:
        import reasoning_gym

        with quiet():
            _SCORERS[dataset] = reasoning_gym.get_score_answer_fn(dataset)
    return float(_SCORERS[dataset](answer, dict(entry)))


class ReasoningGymTask(GeneratedTask):
    """A mixture of reasoning-gym datasets behind the `Task` protocol.

    Subclasses set `sources_by_difficulty`, `instruction` (appended to each question, before the
    answer format) and implement `judge`.
    """

    sources_by_difficulty: Mapping[str, Sequence[Source]] = {}
    instruction: str = ""
    chunk_size = 512  # items per reasoning-gym dataset instance (one seed per chunk)

    def __init__(self, name: str | None = None, difficulty: str = "default",
                 sources: Sequence[Source | Mapping[str, Any]] | None = None) -> None:
        super().__init__(name, difficulty)
        if sources is not None and (isinstance(sources, (str, bytes, Mapping)) or not isinstance(sources, Sequence)):
            raise ValueError(f"{self.name}: sources: expected a list of {{dataset, config, weight}} mappings, "
                             f"got {type(sources).__name__} {sources!r}")
        self.sources = ([as_source(s, self.name) for s in sources] if sources is not None
                        else list(self.sources_by_difficulty[difficulty]))
        if not self.sources or any(s.weight <= 0 for s in self.sources):
            raise ValueError(f"{self.name}: sources: expected at least one source, all with positive weight, "
                             f"got {sources!r}")
        self._datasets: OrderedDict[tuple[str, int], Any] = OrderedDict()

    def dataset(self, source: Source, seed: int) -> Any:
        """A reasoning-gym dataset instance for `source` with `seed` (a few kept in memory); a
        dataset reasoning-gym cannot create (unknown name, bad config) is a TaskDataError."""
        key = (json.dumps([source.dataset, dict(source.config)], sort_keys=True, default=str), seed)
        if key not in self._datasets:
            import reasoning_gym

            try:
                with quiet():
                    made = reasoning_gym.create_dataset(source.dataset, seed=seed, size=self.chunk_size,
                                                        **dict(source.config))
            except Exception as exc:
                reason = " ".join(str(exc).split()) or "no message"
                raise TaskDataError(f"{self.name}: source {source.dataset!r}: reasoning-gym cannot create "
                                    f"this dataset ({type(exc).__name__}: {reason})") from None
            self._datasets[key] = made
            while len(self._datasets) > 8:
                self._datasets.popitem(last=False)
        return self._datasets[key]

    def dataset_seed(self, source: Source, split: str, seed: int, chunk: int) -> int:
        """The seed of chunk `chunk` of `source`'s item stream for (split, seed)."""
        return stable_int("rg", self.family, self.difficulty, source.dataset, seed, split, chunk, bits=31)

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        # Every source's first dataset before any item is drawn (the ones the first items use,
        # kept): a source reasoning-gym rejects stops the split naming it, instead of being
        # skipped item by item as if its generator had failed.
        for source in self.sources:
            self.dataset(source, self.dataset_seed(source, split, seed, 0))
        return super().problems(split, n, seed)

    def entry(self, source: Source, split: str, seed: int, attempt: int) -> dict[str, Any] | None:
        """Item `attempt` of `source`'s stream for (split, seed); None if the generator failed."""
        chunk, idx = divmod(attempt, self.chunk_size)
        ds = self.dataset(source, self.dataset_seed(source, split, seed, chunk))
        try:
            with quiet():
                return ds[idx]
        except Exception:  # a generator bug on one item must not stop the split
            return None

    def candidate(self, rng: random.Random, index: int, split: str, seed: int,
                  attempt: int) -> Candidate | None:
        source = rng.choices(self.sources, weights=[s.weight for s in self.sources])[0]
        item = self.entry(source, split, seed, attempt)
        if item is None or not str(item.get("question", "")).strip():
            return None
        return self.convert(item, source)

    def convert(self, item: Mapping[str, Any], source: Source) -> Candidate | None:
        """Our problem from a reasoning-gym item: question + instruction + answer format."""
        tail = f"{self.instruction} {ANSWER_FORMAT}".strip()
        prompt = f"{str(item['question']).strip()}\n\n{tail}"
        meta = {"source": source.dataset, "rg_metadata": jsonable(item.get("metadata", {}))}
        return Candidate(prompt=prompt, answer=str(item["answer"]), metadata=meta)
