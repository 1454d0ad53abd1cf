"""One fast round: GEPA on the current weights, seeded with the pool of K contexts.

Multi-seed mechanism. gepa 0.1.4's `optimize` takes one seed candidate, but its engine
resumes from the `GEPAState` it finds in `run_dir/gepa_state.bin`. A round therefore

1. evaluates each distinct pool context on the validation set with the current weights
   (through the adapter, so these rollouts are cached and counted);
2. builds the initial `GEPAState` with gepa's own API: `GEPAState(seed_0, eval_0)` for the
   first context, then `update_state_with_new_program` for the others (roots, parent None),
   which maintains the per-instance Pareto front exactly as GEPA does; the state's
   `total_num_evals` is set to the metric calls those evaluations charged (the rollouts they
   generated, and first uses of reused ones);
3. saves that state into the round's gepa directory and calls `gepa.optimize` with the same
   directory and seed_0. The engine re-scores seed_0 on the validation set before loading the
   state; the adapter's cache serves it, so nothing is generated. From there the search,
   candidate selection, minibatch acceptance and Pareto bookkeeping are gepa's.

Budget accounting. The budget (`FastConfig.budget()`) bounds the round's metric calls: rollouts
generated in the round, seed evaluations included, plus the slow loop's rollouts served instead
of generating them when rollout reuse is on (each counted once; so reuse keeps the search the
same and generates fewer rollouts). gepa checks its stoppers only between iterations, and one
iteration can cost up to 2 x minibatch (parent and child on the minibatch) + |val| (the accepted
child on the validation set). `BudgetGuard` stops the engine when the calls so far plus that
worst case would pass the budget, so the total never exceeds it; the adapter also refuses to
generate rollouts on request past the budget, and the round checks the final count. A budget too
small for the seed evaluations plus one iteration is a configuration error. gepa's own counter
is reported next to the real count, but nothing stops on it: it also charges the adapter's cache
hits on the validation set (an accepted child whose text a seed, or an earlier round on frozen
weights, already evaluated), which cost nothing, and a round that stopped on it left that much
of its budget unspent.

Minibatch prefetch. Each iteration scores the parent on a fresh minibatch before the proposer
can run, and at toy scale a generate call is latency-bound (a decoding step of 3 sequences
costs about what one of 15 does). With `prefetch_minibatches`, the round's minibatches are
drawn from a random subset of the train problems just large enough for the iterations the
budget allows (`iterations x minibatch`; drawn uniformly, so each minibatch is still uniform
over distinct train problems), and the seeds' rollouts on that subset are generated in the
seeds' validation call. A seed chosen as parent is then scored from cache. Prefetched rollouts
count as metric calls when gepa first uses them; those never used are reported
(`prefetched` − `prefetch_used`), costing compute but no extra generate call.

Several proposals per iteration. With `proposals_per_iteration` n > 1, gepa's own multi-proposal
path runs: each iteration samples n (parent, minibatch) tasks (`BudgetedSampling`: each parent
drawn by the Pareto selector, as gepa's `IndependentSampling` does, and each minibatch the
sampler's next one, so an iteration never takes the previous one's minibatches again within an
epoch of the train problems), evaluates the parents in one batched call and the n children in
another, and accepts the best improving child (`BestImprovement`), which alone is scored on the
validation set. `BudgetedSampling` lowers n when the budget left cannot pay for n children, so
a round makes the same number of metric calls in fewer, fuller generate calls.

Rollout reuse. With `reuse_rollouts`, the problems the last cycle's RL steps rolled out with
every pool context become the round's Pareto validation set and minibatch pool, so the seeds'
validation scores and the parents' minibatch scores come from those rollouts. The other
direction (`reuse_in_slow`, driven by the cycle through `slow_problems`): the next RL step's
problems lead the validation set and each candidate's validation call samples it G/K times on
them, so GEPA's validation rollouts of the pool's contexts are that step's samples: the step,
whose weights are these, trains on them instead of generating them. With `reuse_steps` n > 1
the first n steps' problems lead it (n x P of them), and steps after the first train on
samples older than their weights (the slow loop's CISPO weight against the samples' log-probs
corrects for it). A problem the steps draw twice (they cross an epoch boundary of the data
stream) is one validation problem, sampled twice as often.
"""

from __future__ import annotations

import logging
import math
import random
import re
import shutil
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from fastslow.config import FAST_MIN_TRAIN, round_minimum
from fastslow.fast.adapter import (
    COMPONENT,
    FastAdapter,
    RolloutCache,
    problems_by_id,
    read_rollouts,
)
from fastslow.fast.config import FastConfig
from fastslow.fast.pool import Pool, PoolEntry, select_pareto_pool
from fastslow.fast.proposers import FeedbackEditor, ReflectiveProposer, build_reflection_lm
from fastslow.io import write_json
from fastslow.model.generation import Generator, derive_seed
from fastslow.records import context_hash
from fastslow.tasks.base import Problem, Task, duplicate_ids

logger = logging.getLogger(__name__)
Log = Callable[[str], None]


class BudgetGuard:
    """gepa stopper: stop before an iteration that could push the metric calls past the
    budget, or after `patience` iterations in a row that charged no metric call (every
    evaluation was a free cache hit and the proposer had nothing new to offer; the count this
    guard reads, `generated`, would never reach the budget then)."""

    def __init__(self, budget: int, worst_iteration: int, generated: Callable[[], int],
                 patience: int = 12, log: Log | None = None) -> None:
        self.budget = budget
        self.worst_iteration = worst_iteration
        self.generated = generated
        self.patience = patience
        self.log = log or logger.info
        self.reason: str | None = None
        self._last = -1
        self._stalled = 0
        self._start: tuple[float, int] | None = None  # (time, metric calls) when the search began
        self.iterations = 0

    def __call__(self, gepa_state: Any) -> bool:
        now = self.generated()
        self._stalled = self._stalled + 1 if now == self._last else 0
        self._last = now
        if now + self.worst_iteration > self.budget:
            self._stop(f"budget: {now} used, next iteration may need {self.worst_iteration} of {self.budget}")
        elif self._stalled >= self.patience:
            self._stop(f"stalled: {self._stalled} iterations generated nothing")
        else:
            self._progress(now)
        return self.reason is not None

    def _progress(self, now: int) -> None:
        """A line before each search iteration: the budget used, and at most how long the rest
        takes at the search's rate so far (the round may stop sooner: a stall, or an iteration
        that no longer fits)."""
        clock = time.perf_counter()
        if self._start is None:
            self._start = (clock, now)
        self.iterations += 1
        spent, calls = clock - self._start[0], now - self._start[1]
        left = f", at most ~{spent / calls * (self.budget - now):.0f}s left" if calls > 0 else ""
        self.log(f"fast round: search iteration {self.iterations}, {now}/{self.budget} metric calls{left}")

    def _stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.log(f"fast round stops ({reason})")


class _AtChunk:
    """gepa's state as a batch sampler sees it, with `i` (the iteration, which gepa's
    EpochShuffledBatchSampler turns into the minibatch position) replaced by a chunk index."""

    def __init__(self, state: Any, i: int) -> None:
        self._state, self.i = state, i

    def __getattr__(self, name: str) -> Any:
        return getattr(self._state, name)


class BudgetedSampling:
    """gepa SamplingStrategy: up to `n` independent (parent, minibatch) tasks per iteration, as
    many as the budget left pays for (`2 x minibatch` a task, plus `n_val` for the accepted
    child). The guard starts an iteration only if one task fits, so there is always one.

    Each parent is drawn by the candidate selector, as in gepa's `IndependentSampling`, but each
    task takes the sampler's next minibatch: gepa's sampler positions an iteration's first
    minibatch at the iteration number, so with n tasks per iteration iteration i would take
    chunks i..i+n-1 and iteration i+1 chunks i+1..i+n, n-1 of them again. Here the tasks of a
    round take chunks one after the other (the first iteration's first one is gepa's own), so
    minibatches repeat only when an epoch of the train problems is used up."""

    def __init__(self, n: int, minibatch: int, n_val: int, budget: int, used: Callable[[], int]) -> None:
        self.n, self.minibatch, self.n_val, self.budget, self.used = n, minibatch, n_val, budget, used
        self.sizes: list[int] = []
        self._chunk: int | None = None

    def sample_tasks(self, state: Any, candidate_selector: Any, batch_sampler: Any, trainset: Any) -> list[Any]:
        from gepa.strategies.proposal_sampling import ProposalTask

        left = self.budget - self.used() - self.n_val
        n = max(1, min(self.n, left // (2 * self.minibatch)))
        self.sizes.append(n)
        if self._chunk is None:
            self._chunk = int(state.i)
        tasks = []
        for _ in range(n):
            parent = candidate_selector.select_candidate_idx(state)
            ids = batch_sampler.next_minibatch_ids(trainset, _AtChunk(state, self._chunk))
            self._chunk += 1
            tasks.append(ProposalTask(parent, state.program_candidates[parent], ids, trainset.fetch(ids)))
        return tasks


#: C0 and C1 control characters but newline and tab.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


#: gepa's line with a proposal's whole text (gepa 0.1.4's reflective_mutation.py).
_PROPOSED = re.compile(r"(Iteration \d+: )?Proposed new text for (\S+): ")


class _GepaLog:
    """gepa's LoggerProtocol onto our log function (gepa's messages at debug detail). A
    proposal's whole text, tens of lines a proposal, goes to the job's log file alone (it is in
    the round's proposals.json too); `log` gets one line for it."""

    def __init__(self, log: Log) -> None:
        self._log = log

    def log(self, message: str) -> None:
        if message == "Loading gepa state from run dir":  # the state the round wrote for its seeds,
            return  # not an earlier run's: read on a fresh run, it said a run was resumed
        # gepa logs a proposal's whole text, a reflection model's output: its control characters
        # (a terminal's escape sequences) are shown escaped, not run by the terminal showing the log
        text = f"gepa: {_CONTROL.sub(lambda m: repr(m.group(0))[1:-1], message)}"
        proposed = _PROPOSED.match(message)
        if proposed is None:
            self._log(text)
            return
        logging.getLogger(__name__).info(text, extra={"file_only": True})  # jobs.FILE_ONLY
        self._log(f"gepa: {proposed.group(1) or ''}proposed a new {proposed.group(2)} of "
                  f"{len(message) - proposed.end()} characters (its text: the job's log file, fast/proposals.json)")


class ProblemLoader:
    """gepa DataLoader over problems, with ids "<split>:<problem id>".

    gepa's default list loader ids train and val examples alike by position, and its
    evaluation cache keys on (candidate, id) only, so a candidate's train minibatch result
    for position 2 would be served as its score on validation problem 2. Distinct, stable ids
    keep the cache sound and make gepa's state readable.
    """

    def __init__(self, problems: Sequence[Problem], split: str) -> None:
        self.by_id = {f"{split}:{p.id}": p for p in problems}
        if len(self.by_id) != len(problems):
            raise ValueError(f"duplicate problem ids in the {split} problems: {duplicate_ids(problems)}")
        self.ids = list(self.by_id)

    def all_ids(self) -> list[str]:
        return list(self.ids)

    def fetch(self, ids: Sequence[str]) -> list[Problem]:
        return [self.by_id[i] for i in ids]

    def __len__(self) -> int:
        return len(self.ids)


def build_seeded_state(contexts: Sequence[str], evaluations: Sequence[Any],
                       val_ids: Sequence[Any] | None = None) -> Any:
    """A GEPAState holding every context as an evaluated root candidate (see module doc).
    `val_ids` are the valset loader's ids, in the order the evaluations scored them."""
    from gepa.core.state import GEPAState, ValsetEvaluation

    def val_eval(eb: Any) -> Any:
        ids = list(val_ids) if val_ids is not None else list(range(len(eb.scores)))
        return ValsetEvaluation(outputs_by_val_id=dict(zip(ids, eb.outputs, strict=True)),
                                scores_by_val_id=dict(zip(ids, eb.scores, strict=True)))

    state = GEPAState({COMPONENT: contexts[0]}, val_eval(evaluations[0]), track_best_outputs=False,
                      frontier_type="instance")
    for text, eb in zip(contexts[1:], evaluations[1:], strict=True):
        idx = state.update_state_with_new_program(
            parent_program_idx=[], new_program={COMPONENT: text}, valset_evaluation=val_eval(eb),
            run_dir=None, num_metric_calls_by_discovery_of_new_program=0)
        state.parent_program_for_candidate[idx] = [None]  # a root, like gepa's own seed
    state.num_full_ds_evals = len(contexts)
    return state


def make_proposer(cfg: FastConfig, train: Sequence[Problem], log: Log,
                  task: Task | None = None, private: Collection[str] = (),
                  seed: int | None = None) -> FeedbackEditor | ReflectiveProposer:
    """The proposer named by `cfg.proposer`, ready for gepa's custom_candidate_proposer hook;
    `private`: ids of problems whose answers the feedback editor must not write into a context;
    `seed`: its draws' (the round's, so that rounds do not replay one another's; default cfg.seed)."""
    seed = cfg.seed if seed is None else seed
    if cfg.proposer == "feedback_editor":
        return FeedbackEditor(problems_by_id(train), seed=seed, max_demos=cfg.max_demos,
                              max_rules=cfg.max_rules, max_demo_chars=cfg.max_demo_chars, logger=log,
                              working_labels=getattr(task, "demo_working", ()),
                              gist=getattr(task, "demo_gist", None), private=private)
    if cfg.proposer == "reflective":
        lm = build_reflection_lm(cfg.reflection, seed=seed)
        return ReflectiveProposer(lm, cfg.reflection.get("prompt_template"), logger=log, max_chars=cfg.context_chars)
    # a name FastConfig takes (fastslow.fast.config.PROPOSERS) that has no proposer here
    raise ValueError(f"fast.proposer: {cfg.proposer!r} has no proposer in fastslow.fast.round.make_proposer")


def run_round(pool: Pool, generator: Generator, task: Task, train_problems: Sequence[Problem],
              val_problems: Sequence[Problem], cfg: FastConfig, round_index: int,
              run_dir: str | Path, reuse_rollouts: str | Path | None = None,
              log: Log | None = None, weights_id: str = "base", cache: RolloutCache | None = None,
              proposer: Callable[..., dict[str, str]] | None = None,
              slow_problems: Sequence[Problem] = (), slow_samples: int = 0) -> tuple[Pool, dict[str, Any]]:
    """Run one budgeted GEPA round seeded with `pool`; return the new pool and a summary.

    `generator` holds the current weights (`weights_id` names them in the rollout cache; pass
    one `cache` to several rounds with frozen weights). `reuse_rollouts` is the slow loop's
    last rollouts.parquet, used when `cfg.reuse_rollouts` is on: its rollouts of (pool
    context, train problem) pairs are used instead of generating them. The problems they cover
    become the Pareto validation set (the seeds' val scores), and those left over feed the
    minibatches (scores and reflective dataset) when they fill one. Minibatches come from
    outside the validation set, with reuse or without, so a round with reuse makes the same
    search (metric calls) as one without, with fewer generations; only when fewer than a
    minibatch of train problems lie outside it do they draw from all of them.
    `slow_problems` (the next RL steps' problems, with `slow_samples` = G/K > 0) lead the
    validation set (its size unchanged), and every validation evaluation of a candidate samples
    it `slow_samples` times (times the slots it fills, for a seed) on each of them
    (`FastAdapter.feed_slow`; its score there is their mean): the step trains on the pool
    contexts' samples, read from `cache` with `RolloutCache.sampled`.
    Writes `run_dir/pool.json` and `run_dir/proposals.json` (`RecordedProposer.rows`); gepa's
    own files go to `run_dir/gepa` (a round restarts from
    scratch: the cycle, not the round, is the unit of resumption).
    """
    from gepa import optimize

    log = log or logger.info
    cfg.validate()
    if not val_problems or not train_problems:
        raise ValueError(f"a fast round needs train and validation problems, got {len(train_problems)} train "
                         f"and {len(val_problems)} validation problems (the cycle cuts both from the "
                         f"task's train split, which needs {FAST_MIN_TRAIN} problems at least: data.sizes.train)")
    run_dir = Path(run_dir)
    gepa_dir = run_dir / "gepa"
    shutil.rmtree(gepa_dir, ignore_errors=True)
    gepa_dir.mkdir(parents=True)

    budget = cfg.budget()
    seeds = _distinct(pool.entries)
    mb = min(cfg.minibatch_size, len(train_problems))
    needed = round_minimum(len(seeds), len(val_problems), mb)  # what the config check requires too
    worst_iteration = needed - len(seeds) * len(val_problems)  # a parent and child on mb, the child on val
    if budget < needed:
        raise ValueError(
            f"fast budget {budget} metric calls is below one round's minimum {needed} "
            f"({len(seeds)} seed contexts x {len(val_problems)} val problems + one iteration of "
            f"2 x {mb} minibatch + {len(val_problems)} val): raise fast.max_metric_calls or "
            f"lower fast.pool_size / fast.val_problems / fast.minibatch_size")

    adapter = FastAdapter(generator, task, cfg.sampling(derive_seed(cfg.seed, round_index)),
                          weights_id=weights_id, cache=cache, max_metric_calls=budget,
                          batch_size=cfg.eval_batch_size, format_credit=cfg.format_credit,
                          progress=lambda line: log(f"fast round {round_index}: {line}"),
                          record_chars=cfg.record_chars)
    val_problems = list(val_problems)
    known = {p.id: p for p in [*train_problems, *val_problems]}
    reused_pairs = 0
    covered: list[Problem] = []
    covered_by: dict[str, set[str]] = {}
    reusing = reuse_rollouts is not None and cfg.reuse_rollouts
    if reuse_rollouts is not None and not reusing:
        log(f"fast round {round_index}: fast.reuse_rollouts is off; ignoring {reuse_rollouts}")
    elif reusing:
        reused_pairs = adapter.preload(read_rollouts(reuse_rollouts), known)
        seed_hashes = {e.hash for e in seeds}
        for (h, pid, w) in adapter.cache.entries:
            if w == weights_id and h in seed_hashes:
                covered_by.setdefault(pid, set()).add(h)
        # Problems every seed context was rolled out on in the last cycle (the slow loop spreads
        # each problem's G rollouts over all K contexts): seed scores on them cost nothing new.
        covered = [p for p in known.values() if covered_by.get(p.id) == seed_hashes]
        if covered:
            # The Pareto validation set becomes those problems (topped up from the configured
            # ones): the K seeds' val scores then come from the slow loop's rollouts (with
            # weights up to T steps stale, the price of reuse) instead of K x |val| new rollouts.
            n_val, ids = len(val_problems), {p.id for p in covered}
            val_problems = covered[:n_val] + [p for p in val_problems if p.id not in ids][:max(0, n_val - len(covered))]
    if slow_problems and slow_samples > 0:
        # The next RL steps' problems lead the Pareto validation set (same size): each pool
        # candidate's validation rollouts on them are then that step's samples as well. A seed
        # filling m pool slots may keep its samples on them: m x G/K. A problem the step draws
        # twice is validated once and sampled twice as often (`feed_slow` counts the draws).
        step = list({p.id: p for p in slow_problems}.values())
        ids = {p.id for p in step}
        rest = [p for p in val_problems if p.id not in ids]
        val_problems = [*step, *rest][:max(len(val_problems), 1)]
        adapter.feed_slow(slow_problems, slow_samples, [p.id for p in val_problems],
                          {e.hash: slow_samples * sum(x.hash == e.hash for x in pool.contexts()) for e in seeds})

    # Minibatches come from problems outside the Pareto validation set, as GEPA's two sets are
    # without reuse (the cycle splits them): otherwise a seed's minibatch scores would be its
    # validation scores, free, and the metric calls left would buy a longer search than the
    # same round's without reuse. Covered problems left over from validation serve them when
    # they fill a minibatch (reused: no generation; one metric call each, when first used).
    val_ids = {p.id for p in val_problems}
    spare = [p for p in covered if p.id not in val_ids]
    outside = [p for p in train_problems if p.id not in val_ids]
    reused_minibatches = len(spare) >= mb
    trainset = spare if reused_minibatches else outside if len(outside) >= mb else list(train_problems)
    if reusing:
        log(f"fast round {round_index}: reusing {reused_pairs} (context, problem) rollout groups; "
            f"{sum(p.id in covered_by for p in val_problems)} of {len(val_problems)} val problems reused, "
            f"minibatches drawn from {len(trainset)} " + ("reused problems" if reused_minibatches
                                                          else "train problems outside them"))

    ahead: list[tuple[dict[str, str], list[Problem]]] = []
    if cfg.prefetch_minibatches:
        if not reused_minibatches:  # (reused ones: the seeds' minibatch scores are cached already)
            # the most iterations the guard lets run: what the seeds' validation evaluations leave
            # (none that an earlier round on these weights paid for: a GEPA-only run's carried
            # cache), each iteration a parent and a child on a minibatch, one child on val
            hits = [adapter.cache.get(e.hash, p.id, weights_id) for e in seeds for p in val_problems]
            seed_calls = sum(hit is None or not hit.paid for hit in hits)
            iterations = max(1, (budget - seed_calls - len(val_problems)) // (2 * mb))
            n_train = min(len(trainset), iterations * mb)
            trainset = random.Random(derive_seed(cfg.seed, round_index)).sample(trainset, n_train)
        ahead = [({COMPONENT: e.text}, trainset) for e in seeds]

    # 1-2. Evaluate the K seeds on val (in shared generate calls, with the prefetched minibatch
    # rollouts and the next RL step's) and build gepa's initial state.
    val_loader, train_loader = ProblemLoader(val_problems, "val"), ProblemLoader(trainset, "train")
    val = val_loader.fetch(val_loader.all_ids())
    evaluations = adapter.evaluate_many([({COMPONENT: e.text}, val) for e in seeds], ahead=ahead)
    seed_generations = adapter.generations - adapter.prefetched  # the seeds' val rollouts
    seed_seconds = adapter.generate_seconds  # that call's wall time (with what it generated ahead)
    seed_slow_seconds = adapter.slow_seconds  # of which, the share of the samples only the slow loop uses
    state = build_seeded_state([e.text for e in seeds], evaluations, val_loader.all_ids())
    state.total_num_evals = adapter.metric_calls
    state.save(str(gepa_dir))
    for e, eb in zip(seeds, evaluations, strict=True):
        log(f"fast round {round_index}: seed {e.id} val mean {sum(eb.scores) / len(eb.scores):.3f}")

    # 3. gepa's search from that state.
    # No edit may write the answer of a validation problem (its Pareto score) or of a problem the
    # next RL steps train on into a context: with reuse both can be train problems.
    private = {p.id for p in val_problems} | {p.id for p in slow_problems}
    proposer_fn = proposer or make_proposer(cfg, list(known.values()), log, task, private,
                                            seed=derive_seed(cfg.seed, round_index))
    recorded = RecordedProposer(proposer_fn)
    guard = BudgetGuard(budget, worst_iteration, lambda: adapter.metric_calls,
                        patience=cfg.max_stalled_iterations, log=log)
    sampling = BudgetedSampling(cfg.proposals_per_iteration, mb, len(val_problems), budget,
                                lambda: adapter.metric_calls)
    multi = {}
    if cfg.proposals_per_iteration > 1:
        from gepa.strategies.proposal_selection import BestImprovement

        multi = {"sampling_strategy": sampling, "selection_strategy": BestImprovement()}
    result = optimize(
        seed_candidate={COMPONENT: seeds[0].text}, trainset=train_loader, valset=val_loader, adapter=adapter,
        custom_candidate_proposer=recorded, callbacks=[recorded], reflection_minibatch_size=mb,
        candidate_selection_strategy="pareto", frontier_type="instance", skip_perfect_score=True,
        perfect_score=1.0, acceptance_criterion="strict_improvement", use_merge=False,
        max_metric_calls=None, stop_callbacks=[guard], logger=_GepaLog(log),  # the guard counts, not gepa
        run_dir=str(gepa_dir), cache_evaluation=True, seed=derive_seed(cfg.seed, round_index) % 2**31,
        raise_on_exception=True, track_best_outputs=False, display_progress_bar=False, **multi,
    )
    if adapter.metric_calls > budget:  # unreachable by construction; never ship a silent overrun
        raise RuntimeError(f"fast round used {adapter.metric_calls} metric calls, budget {budget}")

    new_pool = _pool_from_result(result, seeds, val_loader, cfg.pool_size, round_index)
    proposals = recorded.rows(round_index, adapter.cache, weights_id, result, {e.hash for e in new_pool.entries})
    write_json(proposals, run_dir / PROPOSALS_FILE)
    summary = {
        "round": round_index,
        "budget": budget,
        "generations": adapter.generations,
        "metric_calls": adapter.metric_calls,
        "reused_calls": adapter.reused_calls,
        "prefetched": adapter.prefetched,
        "prefetch_used": adapter.prefetch_used,
        "slow_pairs": adapter.slow_pairs,  # (candidate, next RL step problem) pairs sampled for the slow loop
        "slow_rollouts": adapter.slow_rollouts,
        "slow_used": adapter.slow_used,  # of those pairs, used by the search too (metric calls)
        "train_problems": len(trainset),
        "proposals": sampling.sizes,  # children proposed in each iteration ([] when n = 1: gepa's default)
        "seed_generations": seed_generations,
        # Where the round's time went: the seeds' evaluation call (validation, prefetched
        # minibatches), the search's evaluations (parents not prefetched, children, accepted
        # children on validation), the samples drawn for the next RL step beyond the search's
        # own (reuse_in_slow with G/K > 1, in either; apportioned by sequence count within each
        # generate pass), and the rest (proposals, gepa's state) is `seconds` (set by the
        # cycle) minus the three.
        "seed_eval_seconds": seed_seconds - seed_slow_seconds,
        "search_eval_seconds": adapter.generate_seconds - seed_seconds - (adapter.slow_seconds - seed_slow_seconds),
        "slow_sample_seconds": adapter.slow_seconds,
        "val_problems": [p.id for p in val_problems],
        "gepa_metric_calls": result.total_metric_calls,
        "cache_hits": adapter.cache_hits,
        "reused_pairs": reused_pairs,
        "reused_hits": adapter.reused_hits,
        "num_candidates": result.num_candidates,
        "proposed": sum(p["text"] is not None for p in proposals),  # each in PROPOSALS_FILE
        "accepted": sum(p["accepted"] for p in proposals),
        "stop_reason": guard.reason or "gepa",
        "seed_val_means": {e.id: sum(eb.scores) / len(eb.scores) for e, eb in zip(seeds, evaluations, strict=True)},
        "best_val_mean": max(result.val_aggregate_scores),
        "pool": [{"id": e.id, "hash": e.hash, "val_mean": e.val_mean, "born_round": e.born_round}
                 for e in new_pool.entries],
        "proposer": cfg.proposer,
    }
    if isinstance(proposer_fn, ReflectiveProposer):
        summary["reflection_failures"] = list(proposer_fn.failures)
        summary["reflection_proposed"] = proposer_fn.proposed  # not accepted: GEPA judges them
        summary["reflection_calls"] = proposer_fn.calls
        summary["reflection_failed_calls"] = proposer_fn.failed_calls
        if proposer_fn.calls >= 2 and proposer_fn.raised_calls == proposer_fn.calls:
            # Not one call got a reply (wrong model name or key, server gone, every call timed
            # out): going on would train this cycle as RL. The job fails (proposals.json is
            # written), and a rerun starts from this cycle. Junk replies are not counted here.
            last = " ".join(proposer_fn.failures[-1].split())
            raise RuntimeError(f"fast round {round_index}: all {proposer_fn.calls} reflection calls raised, "
                               f"nothing was proposed (last error: {last}); check fast.reflection")
        if proposer_fn.calls and proposer_fn.failed_calls == proposer_fn.calls:
            # The round goes on (the pool stays as it was), but a reflection setup that never
            # works must not pass for a search that found nothing better.
            logger.error("fast round %d: all %d reflection calls failed, nothing was proposed (last error: %s); "
                         "check fast.reflection", round_index, proposer_fn.calls, proposer_fn.failures[-1])
    if isinstance(proposer_fn, FeedbackEditor):
        summary["edits"] = list(proposer_fn.edits)
    new_pool.meta = {"summary": summary}
    new_pool.to_json(run_dir / "pool.json")
    # The four parts in brackets add up to the metric calls (`FastAdapter.metric_calls`); the
    # rollouts generated ahead or for the slow loop and never used by the search cost no call.
    # (a part that is 0 of 0, a way the round did not take, left out)
    parts = [f"{adapter.generations - adapter.prefetched} generated when asked"]
    if adapter.prefetched:
        parts.append(f"{adapter.prefetch_used} of {adapter.prefetched} generated ahead")
    if adapter.reused_calls:
        parts.append(f"{adapter.reused_calls} reused")
    if adapter.slow_pairs:
        parts.append(f"{adapter.slow_used} of {adapter.slow_pairs} pairs sampled for the slow loop")
    slow = f"; {adapter.slow_rollouts} sequences for the slow loop in all" if adapter.slow_rollouts else ""
    log(f"fast round {round_index}: {adapter.metric_calls}/{budget} metric calls ({', '.join(parts)}{slow}), "
        f"{summary['accepted']} of {summary['proposed']} proposals accepted, {result.num_candidates} "
        f"candidate{'' if result.num_candidates == 1 else 's'}, best val mean {summary['best_val_mean']:.3f}")
    return new_pool, summary


#: The round's proposals, one record each (`RecordedProposer.rows`), beside the round's pool.json
#: (a cycle's `fast/`).
PROPOSALS_FILE = "proposals.json"


class RecordedProposer:
    """The round's proposer as GEPA calls it, keeping each call: the parent context, what it
    proposed (None: nothing, e.g. a failed reflection call), how (the offline editor's edit,
    "reflection" or the proposer's name), and the minibatch records it read (score, feedback).
    GEPA's own files keep neither the rejected texts nor the feedback behind a proposal."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[dict[str, Any]] = []
        self.iteration = 0  # GEPA's, from its callbacks (this object is one of them)
        # (iteration, candidate index, parents, the child's minibatch score sum GEPA accepted)
        self.accepted: list[tuple[int, int, list[int], float]] = []

    def on_iteration_start(self, event: Mapping[str, Any]) -> None:
        self.iteration = event["iteration"]

    def on_candidate_accepted(self, event: Mapping[str, Any]) -> None:
        self.accepted.append((event["iteration"], event["new_candidate_idx"], list(event["parent_ids"]),
                              float(event["new_score"])))

    def __call__(self, candidate: dict[str, str], reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
                 components_to_update: list[str]) -> dict[str, str]:
        edits, failures = len(getattr(self.inner, "edits", ())), len(getattr(self.inner, "failures", ()))
        out = self.inner(candidate, reflective_dataset, components_to_update)
        how = (self.inner.edits[-1] if len(getattr(self.inner, "edits", ())) > edits else
               "reflection" if isinstance(self.inner, ReflectiveProposer) else type(self.inner).__name__)
        note = self.inner.failures[-1] if len(getattr(self.inner, "failures", ())) > failures else None
        self.calls.append({"iteration": self.iteration, "parent": candidate.get(COMPONENT, ""), "text": out.get(COMPONENT),
                           "how": how if COMPONENT in out else None, "note": note,
                           "records": list(reflective_dataset.get(COMPONENT) or [])})
        return out

    def accepted_calls(self, result: Any, child_sums: Sequence[float | None] = ()) -> dict[int, int]:
        """Which calls' children GEPA accepted: {call index: candidate index}. GEPA says which
        candidate it accepted in which iteration, with its minibatch score sum
        (`on_candidate_accepted`); the call is one of that iteration with the candidate's text and
        its parent's. Several calls of one iteration (proposals_per_iteration > 1) can propose
        the same child from the same parent, each on its own minibatch, and GEPA takes the best:
        then it is the call whose child scored that sum (`child_sums`, per call), else the first."""
        texts = [c[COMPONENT] for c in result.candidates]
        out: dict[int, int] = {}
        for iteration, idx, parents, score in self.accepted:
            parent = next((texts[p] for p in parents if p is not None), None)
            calls = [j for j, call in enumerate(self.calls)
                     if j not in out and call["iteration"] == iteration and call["text"] == texts[idx]
                     and call["parent"] == parent]
            scored = [j for j in calls if j < len(child_sums) and child_sums[j] is not None
                      and math.isclose(child_sums[j], score, abs_tol=1e-9)]
            if calls:
                out[(scored or calls)[0]] = idx
        return out

    def rows(self, round_index: int, cache: RolloutCache, weights_id: str, result: Any,
             pool: set[str]) -> list[dict[str, Any]]:
        """One record per call: parent and child (hash, text; the parent's text only the first
        time a parent appears that no earlier call of the round made), the minibatch's distinct problems with the
        parent's and the child's search scores on them as GEPA compared them (reward with format
        credit, a mean over samples; the child's None where it was not evaluated), whether GEPA
        accepted the child (`accepted_calls`) and whether it is in the new pool, and the feedback
        records the proposer read."""
        def scores(h: str | None, ids: list[str]) -> list[float] | None:
            scored = [cache.get(h, pid, weights_id) for pid in ids] if h else [None]
            return None if None in scored else [s.score for s in scored]

        minibatches = [list(dict.fromkeys(str(r.get("problem_id")) for r in call["records"])) for call in self.calls]
        children = [None if call["text"] is None else context_hash(call["text"]) for call in self.calls]
        child_scores = [scores(h, ids) for h, ids in zip(children, minibatches, strict=True)]
        accepted = self.accepted_calls(result, [None if s is None else sum(s) for s in child_scores])
        known: set[str] = set()  # texts the records hold already: accepted children, parents shown
        out = []
        for i, call in enumerate(self.calls):
            parent, child, ids = context_hash(call["parent"]), children[i], minibatches[i]
            out.append({
                "round": round_index, "call": i, "how": call["how"], "note": call["note"],
                "parent_hash": parent, "parent_text": None if parent in known else call["parent"],
                "hash": child, "text": call["text"], "minibatch": ids,
                "parent_scores": scores(parent, ids), "child_scores": child_scores[i],
                "accepted": i in accepted, "in_pool": i in accepted and child in pool,
                "feedback": [{"problem_id": str(r.get("problem_id")), "score": float(r.get("Score", 0.0)),
                              "parsed_answer": r.get("parsed_answer"), "feedback": r.get("Feedback"),
                              "output": r.get("Generated Outputs")} for r in call["records"]],
            })
            known.add(parent)
            if child is not None and i in accepted:
                known.add(child)
        return out


def run_gepa_only(pool: Pool, generator: Generator, task: Task, train_problems: Sequence[Problem],
                  val_problems: Sequence[Problem], cfg: FastConfig, rounds: int, run_dir: str | Path,
                  log: Log | None = None, weights_id: str = "frozen-base") -> tuple[Pool, list[dict[str, Any]]]:
    """The GEPA-only baseline: `rounds` fast rounds with frozen weights, each seeded with the
    previous round's pool. One rollout cache serves all rounds (same weights), so a context
    carried over is not re-generated on the validation set."""
    cache = RolloutCache()
    summaries = []
    for r in range(rounds):
        pool, summary = run_round(pool, generator, task, train_problems, val_problems, cfg, r,
                                  Path(run_dir) / f"round{r}", log=log, weights_id=weights_id, cache=cache)
        summaries.append(summary)
        cache = cache.carried(weights_id)  # as a GEPA-only run's next cycle takes it (`to_json`)
    return pool, summaries


def _distinct(entries: Sequence[PoolEntry]) -> list[PoolEntry]:
    seen: dict[str, PoolEntry] = {}
    for e in entries:
        seen.setdefault(e.hash, e)
    return list(seen.values())


def _pool_from_result(result: Any, seeds: Sequence[PoolEntry], val: ProblemLoader,
                      k: int, round_index: int) -> Pool:
    texts = [c[COMPONENT] for c in result.candidates]
    chosen = select_pareto_pool(result.val_subscores, k, texts)
    by_hash = {e.hash: e for e in seeds}
    entries = []
    for i in chosen:
        scores = {val.by_id[j].id: float(s) for j, s in result.val_subscores[i].items()}
        entry = PoolEntry(text=texts[i], val_scores=scores)
        if entry.hash in by_hash:  # a carried-over context keeps its lineage
            entry.parent, entry.born_round = by_hash[entry.hash].parent, by_hash[entry.hash].born_round
        else:
            parents = [p for p in result.parents[i] if p is not None]
            entry.parent = PoolEntry(text=texts[parents[0]]).hash if parents else None
            entry.born_round = round_index
        entries.append(entry)
    return Pool(entries=entries, k=k, round=round_index)
