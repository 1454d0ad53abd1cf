"""The GEPA adapter: a candidate context evaluated with the current weights on a task.

A GEPA candidate is `{"context": text}`; evaluating it on a batch of `Problem`s renders each
problem with the context as system prompt (`build_messages`), samples one completion per
problem from the current weights (any `Generator`), and scores it with the task's reward.
Trajectories keep the full prompt, the completion, the reward and the task's textual
feedback; `make_reflective_dataset` turns them into GEPA's reflective records.

Every generated rollout is cached under (context hash, problem id, weights id): GEPA asks for
the same pair more than once (parents on a minibatch they were scored on, the engine's own
re-evaluation of the seed), and a pair is never generated twice with the same weights. The
same cache takes the slow loop's rollouts when rollout reuse is on, and rollouts generated
ahead of use (`evaluate_many(..., ahead=...)`): both count as metric calls when first served.
The other direction: with `feed_slow`, every validation evaluation also samples the next RL
step's problems with the candidate, and the slow loop trains on those rollouts
(`RolloutCache.sampled`) instead of generating them again.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gepa.core.adapter import EvaluationBatch

from fastslow.model.generation import Generation, Generator, SamplingParams, derive_seed
from fastslow.records import ROLLOUT_COLUMNS, context_hash
from fastslow.tasks.base import Problem, Task, build_messages, extract_answer

log = logging.getLogger(__name__)

#: The single text component GEPA evolves.
COMPONENT = "context"
#: Completions longer than this many characters are shown in reflective records by their head
#: and their tail (`clip_middle`): reflection prompts stay bounded for a small reflection model,
#: while the start of the reasoning and its end, with the final tagged answer, are always seen.
#: `fast.reflection.max_record_chars` sets it for the reflective proposer (null: whole completions,
#: as paper.yaml's hosted model reads them: a minibatch of 8 traces of 4096 tokens, ~130k characters).
MAX_RECORD_COMPLETION_CHARS = 4000
#: Share of that budget kept from the head of a long completion (the rest is its tail).
RECORD_HEAD_SHARE = 0.4
#: An opening answer tag, in any case (as `fastslow.tasks.base.extract_answer` reads them).
_ANSWER_OPEN = re.compile("<answer>", re.IGNORECASE)
#: Columns a rollouts.parquet must have to be reused.
REUSE_COLUMNS = ("problem_id", "context_hash", "prompt", "completion", "reward", "feedback")


def clip_middle(text: str, max_chars: int | None = MAX_RECORD_COMPLETION_CHARS,
                head_share: float = RECORD_HEAD_SHARE) -> str:
    """`text` if it has at most `max_chars` characters (None: no limit), else its head and its
    tail (at most `max_chars` together) around a marker naming how many characters were left out, so the end
    of a long completion (its conclusion and final `<answer>`) is never lost. The tail reaches
    back to the last `<answer>` tag when that fits in the budget (a long answer block)."""
    if max_chars is None or len(text) <= max_chars:
        return text
    head = int(max_chars * head_share)
    start = len(text) - (max_chars - head)
    # the last tag's position in `text` itself: `text.lower()` is longer than `text` after an "İ"
    tag = max((m.start() for m in _ANSWER_OPEN.finditer(text)), default=-1)
    if head <= tag < start and len(text) - tag <= max_chars - head // 2:
        head, start = min(head, max_chars - (len(text) - tag)), tag
    return f"{text[:head]}\n[… {start - head} characters omitted …]\n{text[start:]}"


class BudgetExceeded(RuntimeError):
    """The adapter was asked to generate, on request, rollouts past its cap (a budgeting bug, never
    expected)."""


@dataclass
class Scored:
    """One (context, problem) evaluation: the score and the trajectory behind it."""

    score: float
    trajectory: dict[str, Any]

    @property
    def paid(self) -> bool:
        """Whether a round charged its metric call already (so it serves free): not when it was
        reused, generated ahead or for the slow loop and never yet served to the search.
        Entries carried in files written before the mark (no "charged" key) were charged."""
        return bool(self.trajectory.get("charged", True))


@dataclass
class RolloutCache:
    """(context hash, problem id, weights id) -> Scored. Share one across rounds with frozen
    weights (GEPA-only: in one process, or from job to job through `to_json`/`from_chain`); a new
    weights id makes every entry stale without clearing anything."""

    entries: dict[tuple[str, str, str], Scored] = field(default_factory=dict)

    def get(self, ctx_hash: str, problem_id: str, weights_id: str) -> Scored | None:
        return self.entries.get((ctx_hash, problem_id, weights_id))

    def put(self, ctx_hash: str, problem_id: str, weights_id: str, value: Scored) -> None:
        self.entries[(ctx_hash, problem_id, weights_id)] = value

    def __len__(self) -> int:
        return len(self.entries)

    def to_json(self, path: str | Path, weights_id: str, skip: Collection[tuple[str, str, str]] = (),
                earlier: Sequence[str | Path] = ()) -> int:
        """Write the entries of `weights_id` to `path` as plain evaluations (score and trajectory;
        no token ids, the reuse/prefetch/slow-loop flags cleared), so that the next round on the same frozen
        weights, in another job (a GEPA-only run's next cycle), serves them as free cache hits
        (`from_chain`) instead of re-generating its carried-over contexts. `skip`: keys not to
        write, those read from the `earlier` files, which the file names (relative to its own
        directory) for the next round to read too. Returns the count written."""
        import os

        from fastslow.io import write_json

        rows = [{"context_hash": h, "problem_id": pid, "score": v.score, "trajectory": v.trajectory}
                for (h, pid, wid), v in self.carried(weights_id).entries.items() if (h, pid, wid) not in skip]
        before = [os.path.relpath(e, Path(path).parent) for e in earlier]
        write_json({"weights_id": weights_id, "earlier": before, "entries": rows}, path)
        return len(rows)

    def carried(self, weights_id: str) -> RolloutCache:
        """The entries of `weights_id` as the next round on the same frozen weights takes them:
        plain evaluations (no token ids, the reuse/prefetch/slow-loop flags cleared), free cache hits.
        A flag left on charged a metric call again when the next round first served the entry.
        Entries no round has charged (generated ahead, or for the slow loop, and never served to
        the search) are left out: carried free, the next round's search would get evaluations
        no budget paid for."""
        plain = {"reused": False, "prefetched": False, "for_slow": False}
        return RolloutCache({key: Scored(v.score, {**{k: x for k, x in v.trajectory.items() if k != "rollouts"},
                                                   **plain})
                             for key, v in self.entries.items()
                             if key[2] == weights_id and v.paid})

    @classmethod
    def from_json(cls, path: str | Path) -> RolloutCache:
        """A cache holding what `to_json` wrote to `path` (under the weights id it was written
        with), without the earlier files it names (`from_chain` reads those too)."""
        return cls(cls._read(Path(path))[0])

    @classmethod
    def from_chain(cls, path: str | Path) -> tuple[RolloutCache, list[Path]]:
        """What `to_json` wrote to `path` and to the earlier files it names (a GEPA-only run's
        earlier cycles on its task, each holding its own round's new evaluations), and those
        files, oldest first, `path` last. One file holding every earlier round's evaluations again
        grew by a round every cycle, and every cycle's was kept: quadratic in a run's cycles."""
        import os

        path = Path(path)
        entries, earlier = cls._read(path)
        files = [Path(os.path.normpath(path.parent / e)) for e in earlier]
        cache = cls()
        for f in files:
            if not f.exists():  # else a bare FileNotFoundError, the file that named it unsaid
                raise FileNotFoundError(f"{path} names the earlier evaluations {f}, which are missing: "
                                        f"run again the cycle that wrote them, and the cycles after it")
            cache.entries.update(cls._read(f)[0])
        cache.entries.update(entries)
        return cache, [*files, path]

    @staticmethod
    def _read(path: Path) -> tuple[dict[tuple[str, str, str], Scored], list[str]]:
        import json

        data = json.loads(path.read_text())
        return ({(e["context_hash"], e["problem_id"], data["weights_id"]): Scored(float(e["score"]), e["trajectory"])
                 for e in data["entries"]}, data.get("earlier", []))

    def sampled(self, contexts: Sequence[str], problems: Sequence[Problem],
                weights_id: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """(context hash, problem id) -> every rollout sampled with `weights_id` for that pair
        (prompt and completion token ids, per-token sampling log-probs, reward), for the pairs of
        `contexts` x `problems` that have them: pairs sampled for the slow loop (`feed_slow`)
        keep their tokens; other evaluations, and rollouts reused from it, do not."""
        out: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for text in dict.fromkeys(contexts):
            h = context_hash(text)
            for p in problems:
                hit = self.get(h, p.id, weights_id)
                rollouts = hit.trajectory.get("rollouts") if hit is not None else None
                if rollouts and all(r["completion_ids"] and r["prompt_ids"] for r in rollouts):
                    out[(h, p.id)] = [dict(r) for r in rollouts]
        return out


class FastAdapter:
    """`gepa.GEPAAdapter` over a task and the current weights.

    `generations` counts (context, problem) rollouts actually generated for the search,
    `prefetched` those of them generated ahead of use; `slow_pairs` (`slow_rollouts`
    sequences) are pairs sampled for the slow loop's next step (`feed_slow`). `metric_calls`
    is what the round's budget bounds: rollouts generated on request, plus rollouts served for
    the first time from the slow loop (rollout reuse), from the ones generated ahead or from
    those sampled for the slow loop. `max_metric_calls` caps the rollouts generated on request
    (BudgetExceeded past it), a second line of defence behind the round's stopper; the first
    uses of reused, prefetched or slow-loop rollouts are charged without this check (the
    round's `BudgetGuard` and its final count bound those).
    """

    propose_new_texts = None  # proposals come through gepa's custom_candidate_proposer hook

    def __init__(self, generator: Generator, task: Task, sampling: SamplingParams,
                 weights_id: str = "base", cache: RolloutCache | None = None,
                 max_metric_calls: int | None = None, batch_size: int = 16,
                 format_credit: float = 0.0, progress: Callable[[str], None] | None = None,
                 record_chars: int | None = MAX_RECORD_COMPLETION_CHARS) -> None:
        self.generator = generator
        #: the most characters of a completion a reflective record shows (`clip_middle`); None: all
        self.record_chars = record_chars
        self.task = task
        self.sampling = sampling
        self.weights_id = weights_id
        self.cache = cache if cache is not None else RolloutCache()
        self.max_metric_calls = max_metric_calls
        self.batch_size = batch_size
        self.progress = progress  # one line before a sampling pass and after each of its calls
        self.format_credit = format_credit
        self.generations = 0
        self.prefetched = 0
        self.generate_seconds = 0.0  # wall time of `_generate` (sampling and scoring) so far
        # of that, the share of the sequences sampled only for the slow loop (`feed_slow`'s samples
        # beyond the search's one per pair), apportioned by sequence count within each pass
        self.slow_seconds = 0.0
        self.slow_pairs = 0
        self.slow_rollouts = 0
        self._slow: tuple[list[Problem], int, frozenset[str], dict[str, int], dict[str, int]] | None = None
        self.cache_hits = 0
        self.reused_hits = 0
        # (context hash, problem id) -> "reused" | "prefetched", for rollouts first served
        self._deferred_served: dict[tuple[str, str], str] = {}
        self._calls = 0

    # -- evaluation -------------------------------------------------------------------------

    def _render(self, conversations: list[list[dict[str, str]]]) -> list[str]:
        render = getattr(self.generator, "render_prompts", None)
        if render is not None:
            try:
                return list(render(conversations))
            except Exception:  # rendering is for the record only; never fail an evaluation on it
                log.debug("render_prompts failed; storing plain messages", exc_info=True)
        return ["\n".join(f"<{m['role']}>\n{m['content']}" for m in conv) for conv in conversations]

    def _score(self, reward: float, parsed: str | None) -> float:
        """The search score: the reward, or with format credit c, (1 - c) * reward +
        c * [an answer could be read], a gradient for a base model that scores 0. An empty
        <answer></answer> block (the prompt's format sentence echoed) is no answer, as in
        `fastslow.tasks.base.answered` and the evaluations' `answered_fraction`."""
        return (1 - self.format_credit) * reward + self.format_credit * float(bool(parsed))

    def _generate(self, pairs: list[tuple[str, str, Problem]],
                  ahead: frozenset[tuple[str, str]] = frozenset(),
                  for_slow: Mapping[tuple[str, str], int] | None = None,
                  slow_only: frozenset[tuple[str, str]] = frozenset()) -> None:
        """Generate, score and cache rollouts of (context hash, context, problem) triples (all
        cache misses): one per pair, or `for_slow[pair]` samples for pairs the slow loop's next
        step trains on (the score is then the samples' mean). Pairs whose (hash, problem id) is
        in `ahead` (the search may use them later) or `slow_only` (only the slow loop asked)
        are uncounted until first served.

        All sequences share generate() calls of at most `batch_size` sequences, as few calls as
        that allows, of even sizes: on a CPU a batch of 12 costs little more per step than a
        batch of 6 (the weights are read once per decoding step either way), so evaluating the
        K seed contexts together is nearly K times cheaper than one call per context, and a
        tail call of 2 sequences would cost almost a full call. A pair's samples are adjacent,
        so they share a batch and its prompt prefill, except where a call's end falls between
        them (the calls are cut by size, not at pairs).
        """
        for_slow = for_slow or {}
        now = sum((h, p.id) not in ahead and (h, p.id) not in slow_only for h, _, p in pairs)
        if self.max_metric_calls is not None and self.metric_calls + now > self.max_metric_calls:
            raise BudgetExceeded(
                f"{self.metric_calls} metric calls used, {now} more rollouts would pass "
                f"the cap of {self.max_metric_calls}")
        seqs = [pair for pair in pairs for _ in range(for_slow.get((pair[0], pair[2].id), 1))]
        n_calls = -(-len(seqs) // self.batch_size)
        size = -(-len(seqs) // max(n_calls, 1))
        samples: dict[tuple[str, str], list[tuple[Generation, str]]] = {}
        started, slow_before = time.perf_counter(), self.slow_rollouts
        if self.progress is not None:
            self.progress(f"sampling {len(seqs)} sequences ({len(pairs)} (context, problem) pairs) "
                          f"in {n_calls} generate call{'s' * (n_calls != 1)}")
        for lo in range(0, len(seqs), size):
            chunk = seqs[lo:lo + size]
            convs = [build_messages(context, p) for _, context, p in chunk]
            # A fresh seed per call: the same (context, problem) is never sampled twice anyway
            # (cache), and distinct calls must not share one random stream.
            params = SamplingParams(self.sampling.max_new_tokens, self.sampling.temperature,
                                    self.sampling.top_p, derive_seed(self.sampling.seed, self._calls))
            self._calls += 1
            gens = self.generator.generate(convs, params)
            if len(gens) != len(chunk):
                raise RuntimeError(f"generator returned {len(gens)} completions for {len(chunk)} prompts")
            if self.progress is not None:
                self.progress(f"sampled {lo + len(chunk)}/{len(seqs)} sequences "
                              f"({time.perf_counter() - started:.0f} s)")
            for (h, _, p), g, prompt in zip(chunk, gens, self._render(convs), strict=True):
                samples.setdefault((h, p.id), []).append((g, prompt))
        for h, _, p in pairs:
            key = (h, p.id)
            got = samples[key]
            if key in slow_only:
                self.slow_pairs += 1
                self.slow_rollouts += len(got)
            else:  # the search's pair; samples beyond its one are the slow loop's
                self.generations += 1
                self.prefetched += key in ahead
                self.slow_rollouts += len(got) - 1
            rollouts = []
            for g, prompt in got:
                reward = float(self.task.reward(p, g.text))
                parsed = extract_answer(g.text)
                rollouts.append((self._score(reward, parsed), reward, parsed, g, prompt))
            _, reward, parsed, g, prompt = min(rollouts, key=lambda r: r[1])  # the worst, for reflection
            traj = {
                "problem_id": p.id, "context_hash": h, "problem": p.prompt, "prompt": prompt,
                "completion": g.text, "reward": reward,
                "feedback": str(self.task.feedback(p, g.text)),
                "parsed_answer": parsed, "reused": False, "prefetched": key in ahead,
                "for_slow": key in slow_only, "samples": len(rollouts),
                "charged": key not in ahead and key not in slow_only,  # else at its first use
            }
            if key in for_slow:  # the slow loop trains on these: keep every sample's tokens
                traj["rollouts"] = [{"prompt_ids": r[3].prompt_ids, "completion_ids": r[3].completion_ids,
                                     "logprobs": r[3].token_logprobs, "reward": r[1]} for r in rollouts]
            self.cache.put(h, p.id, self.weights_id,
                           Scored(sum(r[0] for r in rollouts) / len(rollouts), traj))
        elapsed = time.perf_counter() - started
        self.generate_seconds += elapsed
        if seqs:  # sequences only the slow loop asked for: all of a slow-only pair's, the extras of others
            self.slow_seconds += elapsed * (self.slow_rollouts - slow_before) / len(seqs)

    def feed_slow(self, problems: Sequence[Problem], samples: int, val_ids: Iterable[str],
                  per_context: Mapping[str, int] | None = None) -> None:
        """Sample `samples` rollouts of (candidate, problem) for each of `problems` (the next
        RL step's) whenever a candidate is evaluated on the validation set (`val_ids`): the
        candidates that can enter the pool. `per_context` (context hash -> n) overrides the
        count, for a context that fills several pool slots. A problem listed m times (a step
        crossing an epoch boundary of the data stream draws it twice) gets m times the count:
        the step has m groups of rows for it, each filled by samples of its own. They join the
        evaluation's generate calls (more sequences, no more calls), are uncounted unless the
        search uses them, and the slow loop trains on them instead of generating
        (`RolloutCache.sampled`)."""
        draws: dict[str, int] = {}
        distinct: dict[str, Problem] = {}
        for p in problems:
            draws[p.id] = draws.get(p.id, 0) + 1
            distinct.setdefault(p.id, p)
        self._slow = (list(distinct.values()), int(samples), frozenset(val_ids), dict(per_context or {}), draws)

    def evaluate(self, batch: list[Problem], candidate: dict[str, str],
                 capture_traces: bool = False) -> EvaluationBatch:
        """Score `candidate` on `batch` (GEPAAdapter.evaluate).

        `num_metric_calls` counts the evaluations this call paid for: rollouts generated now,
        plus rollouts served for the first time from the slow loop (rollout reuse) or from
        those generated ahead. Other cache hits are free, as in gepa's own evaluation cache.
        """
        return self.evaluate_many([(candidate, batch)], capture_traces=capture_traces)[0]

    def evaluate_many(self, items: Sequence[tuple[dict[str, str], list[Problem]]],
                      capture_traces: bool = False,
                      ahead: Sequence[tuple[dict[str, str], list[Problem]]] = ()) -> list[EvaluationBatch]:
        """Score several candidates, each on its batch, generating every missing
        (context, problem) pair of all of them together (see `_generate`). The missing pairs of
        `ahead` (candidates on problems the search may ask for later) are generated in the same
        calls and cached, uncounted until first served; they add sequences, not calls."""
        todo: dict[tuple[str, str], tuple[str, str, Problem]] = {}

        def add_missing(pairs: Sequence[tuple[dict[str, str], list[Problem]]]) -> None:
            for candidate, batch in pairs:
                context = candidate[COMPONENT]
                h = context_hash(context)
                for p in batch:  # GEPA pads minibatches with repeats: generate each pair once
                    if self.cache.get(h, p.id, self.weights_id) is None:
                        todo.setdefault((h, p.id), (h, context, p))

        add_missing(items)
        requested = set(todo)
        add_missing(ahead)
        prefetch = set(todo) - requested
        for_slow: dict[tuple[str, str], int] = {}
        if self._slow is not None:  # candidates scored on val: also sampled on the next RL step
            problems, samples, val_ids, per_context, draws = self._slow
            slow_items = [(c, problems) for c, batch in items if {p.id for p in batch} == val_ids]
            add_missing(slow_items)
            wanted = {(context_hash(c[COMPONENT]), p.id) for c, _ in slow_items for p in problems}
            for_slow = {key: per_context.get(key[0], samples) * draws[key[1]] for key in todo if key in wanted}
        if todo:
            self._generate(list(todo.values()), frozenset(prefetch), for_slow,
                           frozenset(set(todo) - requested - prefetch))
        results = []
        for candidate, batch in items:
            h = context_hash(candidate[COMPONENT])
            calls, outputs, scores, trajs = 0, [], [], []
            for p in batch:
                hit = self.cache.get(h, p.id, self.weights_id)
                assert hit is not None
                key = (h, p.id)
                if todo.pop(key, None) is not None:
                    calls += 1  # generated by this call (popped: repeats are cache hits)
                else:
                    self.cache_hits += 1
                    kind = "reused" if hit.trajectory.get("reused") else \
                        "prefetched" if hit.trajectory.get("prefetched") else \
                        "for_slow" if hit.trajectory.get("for_slow") else None
                    self.reused_hits += kind == "reused"
                    if kind is not None and key not in self._deferred_served:  # first use
                        self._deferred_served[key] = kind
                        hit.trajectory["charged"] = True
                        calls += 1
                scores.append(hit.score)
                outputs.append({"completion": hit.trajectory["completion"], "reward": hit.score})
                trajs.append(hit.trajectory)
            results.append(EvaluationBatch(outputs=outputs, scores=scores,
                                           trajectories=trajs if capture_traces else None,
                                           num_metric_calls=calls))
        return results

    def batch_evaluate(self, items: list[tuple[dict[str, str], list[Problem]]]) -> list[EvaluationBatch]:
        """GEPA's batched entry point (always with trajectories)."""
        return self.evaluate_many(items, capture_traces=True)

    @property
    def reused_calls(self) -> int:
        """Evaluations served from the slow loop's rollouts (each reused pair counted once)."""
        return sum(kind == "reused" for kind in self._deferred_served.values())

    @property
    def prefetch_used(self) -> int:
        """Rollouts generated ahead that the search has used (each counted once)."""
        return sum(kind == "prefetched" for kind in self._deferred_served.values())

    @property
    def slow_used(self) -> int:
        """Rollouts sampled for the slow loop that the search has also used (each counted once)."""
        return sum(kind == "for_slow" for kind in self._deferred_served.values())

    @property
    def metric_calls(self) -> int:
        """Evaluations paid for: rollouts generated on request plus first uses of reused and
        prefetched ones. The round's budget bounds this, so with reuse the same search
        generates fewer rollouts, and with prefetching it generates them in fewer calls."""
        return self.generations - self.prefetched + len(self._deferred_served)

    # -- reflection -------------------------------------------------------------------------

    def make_reflective_dataset(self, candidate: dict[str, str], eval_batch: EvaluationBatch,
                                components_to_update: list[str]) -> dict[str, list[dict[str, Any]]]:
        """One record per distinct problem: inputs, output, feedback (GEPA's schema), plus the
        score and problem id that the offline proposer reads. Failures come first, since they
        carry what the context should fix.

        A completion longer than `record_chars` is shown by its head and tail (`clip_middle`), so
        its final answer is always there, and so is a problem longer than that (a long document's
        start and its question at the end); `parsed_answer` is the answer read from the full
        completion (None or empty: a parse failure), which the offline proposer's format checks use."""
        trajs = eval_batch.trajectories or []
        seen: set[str] = set()
        records = []
        for t in trajs:
            if t["problem_id"] in seen:
                continue
            seen.add(t["problem_id"])
            records.append({
                "Inputs": clip_middle(t["problem"], self.record_chars),
                "Generated Outputs": clip_middle(t["completion"], self.record_chars),
                "Feedback": t["feedback"],
                "Score": t["reward"],
                "problem_id": t["problem_id"],
                "parsed_answer": t["parsed_answer"] if "parsed_answer" in t else extract_answer(t["completion"]),
            })
        records.sort(key=lambda r: r["Score"])  # stable: failures first, original order kept
        return {name: records for name in components_to_update}

    # -- rollout reuse ----------------------------------------------------------------------

    def preload(self, rows: Iterable[Mapping[str, Any]], problems: Mapping[str, Problem]) -> int:
        """Put the slow loop's rollouts in the cache as if generated with the current weights.

        Rows are grouped by (context hash, problem id); the score is the group's mean score
        (the slow loop draws G/K rollouts per context and problem) and the trajectory is its
        lowest-reward rollout, the most informative for reflection. Rows for problems not in
        `problems` are ignored. Returns the number of (context, problem) pairs loaded.
        """
        groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
        for r in rows:
            pid = str(r["problem_id"])
            if pid in problems:
                groups.setdefault((str(r["context_hash"]), pid), []).append(r)
        for (h, pid), rs in groups.items():
            rewards = [self._score(float(r["reward"]), extract_answer(str(r["completion"]))) for r in rs]
            worst = min(rs, key=lambda r: float(r["reward"]))
            traj = {
                "problem_id": pid, "context_hash": h, "problem": problems[pid].prompt,
                "prompt": str(worst["prompt"]), "completion": str(worst["completion"]),
                "reward": float(worst["reward"]), "feedback": str(worst["feedback"]),
                "parsed_answer": extract_answer(str(worst["completion"])), "reused": True,
                "samples": len(rs), "charged": False,
            }
            self.cache.put(h, pid, self.weights_id, Scored(sum(rewards) / len(rewards), traj))
        return len(groups)


def read_rollouts(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a rollouts.parquet (the slow loop's ROLLOUT_COLUMNS schema)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    missing = [c for c in REUSE_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: rollouts.parquet lacks column(s) {missing} "
                         f"(expected the schema fastslow.records.ROLLOUT_COLUMNS: {list(ROLLOUT_COLUMNS)})")
    return table.select(list(REUSE_COLUMNS)).to_pylist()


def problems_by_id(problems: Sequence[Problem]) -> dict[str, Problem]:
    out: dict[str, Problem] = {}
    for p in problems:
        if p.id in out:
            raise ValueError(f"duplicate problem id {p.id!r}")
        out[p.id] = p
    return out
