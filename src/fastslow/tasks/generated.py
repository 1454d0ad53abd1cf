"""Deterministic, split-disjoint problem generation shared by every procedural task.

Splits are kept apart by *content*, not only by seed: each candidate problem has a partition key
whose hash decides the one split it may ever belong to. The key is the problem's canonical
identity when its generator provides one — physics: the generator and its givens in SI; math:
the arithmetic expression, the equation, or a word problem's template and numbers — so the same problem worded differently ("1.7 kΩ" /
"1700 Ω", "Calculate 7 - 5." / "7 - 5 =") still has one key; otherwise it is the prompt (CodeIO
keys by its program). Problems with the same key therefore never land in two splits — for any
seeds, any sizes, and across the difficulties of a task family — and a split can be regenerated
alone. A key other than the prompt is kept in `metadata["split_key"]`. Each split also draws
from its own seed stream, and a split never repeats a problem: the same key, where it names one
problem (`key_names_one_problem`: "1.5 kΩ" and "1500 Ω" are one), else the same prompt up to
whitespace (`prompt_digest`; CodeIO's key, a program, is shared by that program's inputs). The
first `m` problems of `problems(split, n, seed)` do not depend on `n` (growing a split only
appends).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fastslow.tasks.base import DIFFICULTIES, SPLITS, Problem, TaskBase, TaskDataError

log = logging.getLogger(__name__)

#: Seconds between a long generation's progress lines (a split that takes less logs none).
PROGRESS_SECONDS = 30.0

#: Share of the hash space of partition keys owned by each split.
SPLIT_FRACTIONS: Mapping[str, float] = {"train": 0.8, "val": 0.1, "test": 0.1}


def stable_int(*parts: Any, bits: int = 63) -> int:
    """A platform-independent integer hash of `parts` (Python's hash() is salted per process)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - bits)


def split_of(key: str, fractions: Mapping[str, float] = SPLIT_FRACTIONS) -> str:
    """The split that owns partition key `key`."""
    u = stable_int("split-partition", key, bits=52) / 2.0**52
    edge = 0.0
    for split in SPLITS:
        edge += fractions[split]
        if u < edge:
            return split
    return SPLITS[-1]


def content_digest(prompt: str, answer: str) -> str:
    """Hex digest identifying a problem's content (used in ids)."""
    blob = f"{prompt}\x1e{answer}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(blob).hexdigest()


def prompt_digest(prompt: str) -> str:
    """Hex digest of a prompt with its runs of whitespace as one space: what tells one problem
    from another where nothing names it better (generation, a Hub dataset's repeats, and
    `write_splits`' check that no prompt is there twice, in one split or two)."""
    return content_digest(" ".join(prompt.split()), "")


@dataclass
class Candidate:
    """One generated problem before split assignment and id."""

    prompt: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict)
    key: str | None = None  # partition key: the problem's canonical identity; None means the prompt


def _check_candidate(task: str, cand: Any) -> None:
    """A generator's candidate is a `Candidate` of text: an int answer (`Candidate(p, a + b)`)
    was written to the splits as a number, scored below 1 on its own answer, and read back as
    text; a tuple failed later on `.key`."""
    if not isinstance(cand, Candidate):
        raise TaskDataError(f"{task}: candidate() returned a {type(cand).__name__} ({cand!r:.80}); expected "
                            "a fastslow.tasks.generated.Candidate(prompt, answer, ...) or None")
    for part in ("prompt", "answer"):
        value = getattr(cand, part)
        if not isinstance(value, str):
            raise TaskDataError(f"{task}: candidate() returned a Candidate whose {part} is a "
                                f"{type(value).__name__} ({value!r:.80}); it must be text: str({part})")


#: The `skip` reason of a draw that belongs to another split (not a setting's doing).
OTHER_SPLIT = "another split's problem"


class GeneratedTask(TaskBase):
    """Base of the procedural tasks: subclasses implement `candidate` and `judge`.

    `family` names the generator (the seed stream); `name` is the registered name, written into
    every problem so `get_task(problem.task)` can score it later.
    """

    family: str = "generated"
    #: Candidates tried per requested problem before giving up (val/test keep ~1 in 10).
    attempts_per_problem: int = 60
    #: Does a candidate's `key` name one problem (physics, math: its canonical identity, checked to
    #: give one answer), so that a split holds one candidate per key? Else (the default; CodeIO's
    #: key, a program with many inputs, names a group) a split repeats no prompt (`prompt_digest`).
    key_names_one_problem: bool = False

    def __init__(self, name: str | None = None, difficulty: str = "default") -> None:
        if difficulty not in DIFFICULTIES:
            raise ValueError(
                f"{self.family}: unknown difficulty {difficulty!r}; expected one of {', '.join(DIFFICULTIES)}")
        self.difficulty = difficulty
        self.name = name or (self.family if difficulty == "default" else f"{self.family}_{difficulty}")

    def candidate(self, rng: random.Random, index: int, split: str, seed: int,
                  attempt: int) -> Candidate | None:
        """A fresh candidate from `rng`; `index` is how many problems the split already holds
        (tasks balance labels on it). Return None to skip. Subclasses that wrap another
        generator may use (split, seed, attempt) instead of `rng`."""
        raise NotImplementedError

    def skip(self, reason: str) -> None:
        """Count a candidate rejected for `reason`, a setting (`data.options.codeio.max_prompt_chars=1`),
        which the error of a split that cannot be filled names when it rejected most tries.
        Returns None, for `return self.skip(...)` in `candidate`."""
        skipped = self.__dict__.setdefault("_skipped", collections.Counter())
        skipped[reason] += 1

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split`, deterministic in (`seed`, task options), disjoint across splits."""
        if split not in SPLITS:
            raise ValueError(f"{self.name}: unknown split {split!r}; expected one of {', '.join(SPLITS)}")
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"{self.name}: n must be a non-negative int, got {n!r}")
        out: list[Problem] = []
        seen: set[str] = set()
        limit = self.attempts_per_problem * n + 200
        attempt = 0
        self._skipped: collections.Counter[str] = collections.Counter()
        start = time.monotonic()
        next_line = start + PROGRESS_SECONDS
        while len(out) < n:
            if time.monotonic() >= next_line:  # codeio runs a program per attempt: 50000 take minutes
                next_line = time.monotonic() + PROGRESS_SECONDS
                done = len(out)
                left = (time.monotonic() - start) / done * (n - done) if done else float("nan")
                log.info("%s %s: %d/%d problems after %d tries%s", self.name, split, done, n, attempt,
                         f", ~{left:.0f}s left" if done else "")
            if attempt >= limit:
                other = self._skipped.pop(OTHER_SPLIT, 0)
                reason, count = (self._skipped.most_common(1) or [("", 0)])[0]
                if count and 2 * count >= limit - other:  # a setting rejected most of the split's own draws
                    raise TaskDataError(f"{self.name}: only {len(out)} distinct {split} problems after {limit} "
                                        f"tries (asked for {n}; {other} drew other splits' problems): {count} of "
                                        f"the {limit - other} left were rejected by {reason}")
                raise TaskDataError(
                    f"{self.name}: only {len(out)} distinct {split} problems after {limit} tries "
                    f"(asked for {n}); the generator's problem space is too small at difficulty "
                    f"{self.difficulty!r}: ask for fewer (data.sizes) or widen the generator")
            rng = random.Random(stable_int(self.family, self.difficulty, seed, split, attempt))
            cand = self.candidate(rng, len(out), split, seed, attempt)
            attempt += 1
            if cand is None:
                continue
            _check_candidate(self.name, cand)
            if split_of(cand.key if cand.key is not None else cand.prompt) != split:
                self.skip(OTHER_SPLIT)
                continue
            digest = content_digest(cand.prompt, cand.answer)
            same = cand.key if cand.key is not None and self.key_names_one_problem else prompt_digest(cand.prompt)
            if same in seen:  # the problem again, maybe worded otherwise: counted twice in a mean
                continue
            seen.add(same)
            meta = {**cand.metadata, "difficulty": self.difficulty}
            if cand.key is not None:
                meta["split_key"] = cand.key
            out.append(Problem(id=f"{self.name}-{split}-{len(out):05d}-{digest[:8]}", task=self.name,
                               prompt=cand.prompt, answer=cand.answer, metadata=meta))
        return out
