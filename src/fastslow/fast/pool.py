"""The fast weights Φ: a pool of K contexts, persisted as pool.json, and its Pareto selection."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastslow.config import is_number
from fastslow.records import context_hash

POOL_FORMAT = "fastslow.pool/1"


@dataclass
class PoolEntry:
    """One context of the pool.

    `parent` is the hash of the context it was evolved from (None for a seed prompt);
    `val_scores` maps validation problem id to the score measured in the round that last
    evaluated it (with that round's weights, or, under `reuse_rollouts`, the last cycle's RL
    rollouts' weights, 1 to T steps older); `born_round` is the round that created it
    (-1 for the seed prompt given by the user).
    """

    text: str
    parent: str | None = None
    born_round: int = -1
    val_scores: dict[str, float] = field(default_factory=dict)
    hash: str = ""

    def __post_init__(self) -> None:
        # The hash is always recomputed: a hand-edited pool.json cannot carry a stale one.
        self.hash = context_hash(self.text)

    @property
    def id(self) -> str:
        """Stable id of the context (the `context_id` of rollouts.parquet): the round that
        created it and its hash ("seed-…" for a user-given seed context)."""
        born = "seed" if self.born_round < 0 else f"r{self.born_round}"
        return f"{born}-{self.hash[:8]}"

    @property
    def val_mean(self) -> float | None:
        return sum(self.val_scores.values()) / len(self.val_scores) if self.val_scores else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["id"] = self.id
        d["val_mean"] = self.val_mean
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PoolEntry:
        if not isinstance(d, Mapping):
            raise ValueError(f"pool entry must be a JSON object, got {type(d).__name__}")
        if not isinstance(d.get("text"), str):
            raise ValueError("pool entry needs a string 'text'")
        parent = d.get("parent")
        if parent is not None and not isinstance(parent, str):
            raise ValueError(f"pool entry 'parent' must be a string or null, got {parent!r}")
        scores = d.get("val_scores") or {}
        if not isinstance(scores, Mapping) or not all(is_number(v) for v in scores.values()):
            raise ValueError(f"pool entry 'val_scores' must map problem ids to numbers, got {scores!r:.200}")
        return cls(text=d["text"], parent=parent, born_round=_as_int(d, "born_round", -1),
                   val_scores={str(k): float(v) for k, v in scores.items()})


def _as_int(d: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """`d[key]` as an int (a missing key gives `default`, or an error when there is none)."""
    if key not in d and default is not None:
        return default
    if key not in d:
        raise ValueError(f"missing key {key!r}")
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{key!r} must be an integer, got {value!r}")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{key!r} must be an integer, got {value!r}") from None


@dataclass
class Pool:
    """K contexts: the best by mean score first, then those covering the validation problems it
    misses (Pareto cover), then by mean score. `round` is the fast round that produced it (-1:
    the seed pool)."""

    entries: list[PoolEntry]
    k: int
    round: int = -1
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def seed(cls, texts: str | Sequence[str], k: int) -> Pool:
        """The initial pool: the given seed context(s), deduplicated."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"Pool.seed: k: expected an integer >= 1, got {k!r}")
        texts = [texts] if isinstance(texts, str) else list(texts)
        seen: dict[str, PoolEntry] = {}
        for t in texts:
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"Pool.seed: texts: expected non-empty contexts, got {t!r}")
            e = PoolEntry(text=t)
            seen.setdefault(e.hash, e)
        if not seen:
            raise ValueError("a pool needs at least one seed context")
        return cls(entries=list(seen.values())[:k], k=k)

    @property
    def texts(self) -> list[str]:
        return [e.text for e in self.entries]

    def contexts(self, n: int | None = None) -> list[PoolEntry]:
        """`n` (default K) entries, cycling through the pool when it holds fewer distinct
        contexts than asked for (early rounds may not have found K distinct ones yet)."""
        n = self.k if n is None else n
        return [self.entries[i % len(self.entries)] for i in range(n)]

    def to_dict(self) -> dict[str, Any]:
        return {"format": POOL_FORMAT, "round": self.round, "k": self.k,
                "entries": [e.to_dict() for e in self.entries], "meta": self.meta}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Pool:
        """A pool from `to_dict`'s layout; one-line ValueError naming the bad key otherwise."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a pool must be a JSON object, got {type(d).__name__}")
        if d.get("format", POOL_FORMAT) != POOL_FORMAT:
            raise ValueError(f"unknown pool format {d.get('format')!r} (expected {POOL_FORMAT})")
        raw = d.get("entries", [])
        if not isinstance(raw, list):
            raise ValueError(f"'entries' must be a list, got {type(raw).__name__}")
        entries = []
        for i, e in enumerate(raw):
            try:
                entries.append(PoolEntry.from_dict(e))
            except ValueError as err:
                raise ValueError(f"entries[{i}]: {err}") from None
        if not entries:
            raise ValueError("pool has no entries")
        k = _as_int(d, "k")
        if k < 1:
            raise ValueError(f"'k' must be a positive integer, got {k}")
        meta = d.get("meta") or {}
        if not isinstance(meta, Mapping):
            raise ValueError(f"'meta' must be a JSON object, got {type(meta).__name__}")
        return cls(entries=entries, k=k, round=_as_int(d, "round", -1), meta=dict(meta))

    def to_json(self, path: str | Path) -> Path:
        """Write atomically (temp file, then rename): a killed job leaves no half-written pool."""
        from fastslow.io import atomic_path

        path = Path(path)
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=False)
            f.write("\n")
        return path

    @classmethod
    def from_json(cls, path: str | Path) -> Pool:
        """Read `to_json`'s file; a corrupt or malformed one is a one-line ValueError naming it."""
        text = Path(path).read_text(encoding="utf-8")
        try:
            d = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: invalid JSON in pool file ({err})") from None
        try:
            return cls.from_dict(d)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None


def select_pareto_pool(scores: Sequence[Mapping[Any, float]], k: int,
                       texts: Sequence[str] | None = None) -> list[int]:
    """Indices of at most `k` candidates that cover the per-instance Pareto front.

    `scores[i]` maps instance id to candidate i's score. A candidate *covers* an instance
    when it attains the best score any candidate reached there (missing scores count as
    -inf). The first pick is the best candidate by aggregate (mean) score, so the pool always
    holds GEPA's best; then a greedy set cover adds the candidate covering the most
    still-uncovered instances, ties broken by aggregate score, then by lower index. When the
    front is covered with fewer than `k` picks, the best remaining candidates by aggregate
    fill the pool. Candidates with identical `texts` are considered once (the first).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k!r}")
    n = len(scores)
    if n == 0:
        return []
    keep = list(range(n))
    if texts is not None:
        first: dict[str, int] = {}
        for i, t in enumerate(texts):
            first.setdefault(t, i)
        keep = sorted(first.values())
    instances = sorted({iid for i in keep for iid in scores[i]}, key=str)

    def agg(i: int) -> float:
        # fsum: the exact sum, whatever the order, so candidates scoring the same values on different
        # instances tie (a plain sum of 0.3, 0.2, 0.1 and of 0.1, 0.2, 0.3 differ in the last bit)
        vals = [scores[i].get(iid, float("-inf")) for iid in instances]
        return math.fsum(vals) / len(vals) if vals else float("-inf")

    aggregate = {i: agg(i) for i in keep}
    best_at = {iid: max(scores[i].get(iid, float("-inf")) for i in keep) for iid in instances}
    covers = {i: {iid for iid in instances if scores[i].get(iid, float("-inf")) >= best_at[iid]}
              for i in keep}

    def rank(i: int) -> tuple[float, int]:
        return (aggregate[i], -i)

    chosen = [max(keep, key=rank)]
    uncovered = set(instances) - covers[chosen[0]]
    while uncovered and len(chosen) < k:
        rest = [i for i in keep if i not in chosen]
        gain = {i: len(covers[i] & uncovered) for i in rest}
        pick = max(rest, key=lambda i: (gain[i], *rank(i)))
        if gain[pick] == 0:
            break
        chosen.append(pick)
        uncovered -= covers[pick]
    for i in sorted((i for i in keep if i not in chosen), key=rank, reverse=True):
        if len(chosen) >= k:
            break
        chosen.append(i)
    return chosen
