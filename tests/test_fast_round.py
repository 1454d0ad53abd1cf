"""Fast rounds end to end: multi-seed state, budget never exceeded, GEPA-only, rollout reuse."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from fastslow.fast import FastConfig, Pool, build_seeded_state, run_gepa_only, run_round
from fastslow.fast.testing import ScriptedGenerator, ToyTask
from fastslow.model.generation import Generation
from fastslow.records import context_hash

TASK = ToyTask()
TRAIN = TASK.problems("train", 16, 0)
VAL = TASK.problems("val", 6, 1)
SEEDS = ["You are a helpful assistant. Solve the problem.", "Answer the question.", "Think, then answer."]


def quiet(_: str) -> None:
    pass


def test_seeded_state_holds_every_seed_as_a_root() -> None:
    from gepa.core.adapter import EvaluationBatch

    evals = [EvaluationBatch(outputs=[None] * 3, scores=s) for s in ([1, 0, 0], [0, 1, 0], [0, 1, 1])]
    state = build_seeded_state(["a", "b", "c"], evals)
    assert [c["context"] for c in state.program_candidates] == ["a", "b", "c"]
    assert state.parent_program_for_candidate == [[None], [None], [None]]
    assert state.program_at_pareto_front_valset == {0: {0}, 1: {1, 2}, 2: {2}}
    assert state.is_consistent()


@pytest.mark.parametrize(("k", "budget", "mb", "n_val", "n"),
                         [(1, 20, 2, 4, 1), (2, 45, 3, 6, 1), (3, 70, 4, 6, 1), (2, 200, 4, 6, 1),
                          (1, 20, 2, 4, 3), (2, 45, 3, 6, 2), (2, 200, 4, 6, 3)])
def test_budget_is_never_exceeded(tmp_path: Path, k: int, budget: int, mb: int, n_val: int, n: int) -> None:
    gen = ScriptedGenerator()
    cfg = FastConfig(pool_size=k, max_metric_calls=budget, minibatch_size=mb, proposals_per_iteration=n)
    pool = Pool.seed(SEEDS[:k], k=k)
    new, summary = run_round(pool, gen, TASK, TRAIN, VAL[:n_val], cfg, 0, tmp_path, log=quiet)
    # The real count: prompts the generator was asked to complete; those generated ahead of
    # use count once used (the rest are reported), so the budget bounds what the search used.
    assert gen.prompts == summary["generations"]
    assert summary["metric_calls"] == summary["generations"] - summary["prefetched"] + summary["prefetch_used"]
    assert summary["metric_calls"] <= budget
    assert summary["prefetch_used"] <= summary["prefetched"] <= k * summary["train_problems"]
    assert all(1 <= m <= n for m in summary["proposals"]) and (n == 1) == (not summary["proposals"])
    assert summary["seed_generations"] == k * n_val  # each seed scored once on val, counted
    assert 1 <= len(new.entries) <= k
    # Every seed entered gepa's state as an evaluated candidate.
    cands = json.loads((tmp_path / "gepa" / "candidates.json").read_text())
    assert [c["context"] for c in cands[:k]] == SEEDS[:k]


class NeverRight(ScriptedGenerator):
    """Zero reward whatever the context (the toy-scale default): every child is rejected, so
    every iteration's parent is the seed."""

    def generate(self, conversations: list[Any], params: Any) -> list[Generation]:
        self.calls += 1
        self.prompts += len(conversations)
        return [Generation(text="no idea", prompt_tokens=1, completion_tokens=2, prompt_ids=(1,),
                           completion_ids=(5, 6)) for _ in conversations]


def test_prefetch_scores_seed_parents_from_cache_in_fewer_calls(tmp_path: Path) -> None:
    """The seeds' minibatch rollouts come with their val call: no parent call for a seed, the
    same accounting, and a train subset just large enough for the iterations the budget allows."""
    runs = {}
    for prefetch in (False, True):
        gen = NeverRight()
        cfg = FastConfig(pool_size=1, max_metric_calls=30, minibatch_size=3, prefetch_minibatches=prefetch)
        _, summary = run_round(Pool.seed(SEEDS[1], 1), gen, TASK, TRAIN, VAL, cfg, 0,
                               tmp_path / str(prefetch), log=quiet)
        runs[prefetch] = gen, summary
    (plain, s0), (ahead, s1) = runs[False], runs[True]
    assert s0["prefetched"] == 0 and s0["train_problems"] == len(TRAIN)
    # 6 val + iterations of 2 x 3 while the next worst case (12) fits in 30: 3 iterations
    assert plain.calls == 1 + 3 * 2 and s0["metric_calls"] == 6 + 3 * 6
    assert s1["train_problems"] == 9 and s1["prefetched"] == s1["prefetch_used"] == 9
    assert ahead.calls == 1 + 3 and s1["metric_calls"] == s0["metric_calls"]  # same search, 3 calls fewer
    assert s1["seed_generations"] == s0["seed_generations"] == len(VAL)


def test_several_proposals_per_iteration_share_generate_calls(tmp_path: Path) -> None:
    """gepa's multi-proposal path: the 3 children of an iteration are scored in one call, the
    parents (seeds) come from the prefetch, and the round makes the same 24 metric calls as the
    sequential search above in 2 generate calls instead of 7."""
    gen = NeverRight()
    cfg = FastConfig(pool_size=1, max_metric_calls=30, minibatch_size=3, proposals_per_iteration=3)
    _, summary = run_round(Pool.seed(SEEDS[1], 1), gen, TASK, TRAIN, VAL, cfg, 0, tmp_path, log=quiet)
    assert summary["proposals"] == [3]  # 30 - 6 val - 6 for the best child's val: 3 tasks of 2 x 3
    assert gen.calls == 2 and summary["metric_calls"] == 6 + 3 * 6
    assert summary["prefetch_used"] == summary["prefetched"] == 9


def test_next_rl_step_is_sampled_in_the_validation_calls(tmp_path: Path) -> None:
    """fast.reuse_in_slow: the next RL step's problems lead the validation set, and every
    candidate scored on it is sampled G/K = 2 times on them, in the same generate calls. So
    the cache holds 2 rollouts with tokens of each (pool context, step problem), all of them
    GEPA's own validation rollouts (the pair's score is their mean)."""
    from fastslow.fast import RolloutCache

    step = TASK.problems("train", 18, 0)[16:]  # the RL step's 2 problems, outside the search's
    runs = {}
    for feed in (False, True):
        gen, cache = ScriptedGenerator(), RolloutCache()
        cfg = FastConfig(pool_size=2, max_metric_calls=45, minibatch_size=3)
        new, summary = run_round(Pool.seed(SEEDS[:2], 2), gen, TASK, TRAIN, VAL, cfg, 0, tmp_path / str(feed),
                                 log=quiet, cache=cache, slow_problems=step if feed else (),
                                 slow_samples=2 if feed else 0)
        runs[feed] = gen, cache, new, summary
    (gen0, _, _, s0), (gen1, cache, new1, s1) = runs[False], runs[True]
    assert s1["val_problems"] == [p.id for p in step] + [p.id for p in VAL[:4]]
    assert gen1.calls == gen0.calls and s1["metric_calls"] <= 45
    assert s0["slow_rollouts"] == 0 and s1["slow_pairs"] == 0  # every step pair was a val pair
    # every candidate scored on val (gepa's candidates: the 2 seeds, the accepted children) got a
    # second sample on each step problem
    val_evals = len(json.loads((tmp_path / "True" / "gepa" / "candidates.json").read_text()))
    assert val_evals > 2 and s1["slow_rollouts"] == 2 * val_evals
    assert gen1.prompts == s1["generations"] + s1["slow_rollouts"]
    sampled = cache.sampled([e.text for e in new1.entries], step, "base")
    assert set(sampled) == {(context_hash(e.text), p.id) for e in new1.entries for p in step}
    for rollouts in sampled.values():
        assert len(rollouts) == 2 and all(r["completion_ids"] and r["prompt_ids"] for r in rollouts)


def test_samples_for_the_rl_step_count_once_if_the_search_uses_them(tmp_path: Path) -> None:
    """More step problems than validation problems: the first 6 are the validation set,
    the other 2 are sampled for the step only, uncounted until the search uses them."""
    from fastslow.fast import RolloutCache

    step = TASK.problems("step", 8, 3)
    gen, cache = NeverRight(), RolloutCache()
    cfg = FastConfig(pool_size=1, max_metric_calls=30, minibatch_size=2, prefetch_minibatches=False)
    _, s = run_round(Pool.seed(SEEDS[1], 1), gen, TASK, step[6:], VAL, cfg, 0, tmp_path, log=quiet,
                     cache=cache, slow_problems=step, slow_samples=2)
    assert s["val_problems"] == [p.id for p in step[:6]]
    # The only minibatch is the 2 step-only problems, sampled twice each with the seed's val call.
    assert s["slow_pairs"] == 2 and s["slow_used"] == 2 and s["slow_rollouts"] == 6 + 2 * 2
    assert s["metric_calls"] == s["generations"] - s["prefetched"] + s["prefetch_used"] + s["slow_used"]
    assert s["metric_calls"] <= 30
    assert [len(r) for r in cache.sampled([SEEDS[1]], step, "base").values()] == [2] * 8


def _final_line_parts(lines: list[str]) -> tuple[int, list[int]]:
    """The round's last line: its metric calls and the four parts it says they are made of (a
    part the round did not take, 0 of 0, is left out of the line: 0 here)."""
    import re

    m = re.match(r"fast round \d+: (\d+)/\d+ metric calls \((\d+) generated when asked[,;)]", lines[-1])
    assert m, lines[-1]
    parts = [int(m.group(2))]
    for pattern in (r", (\d+) of [1-9]\d* generated ahead[,;)]", r", (\d+) reused[,;)]",
                    r", (\d+) of [1-9]\d* pairs sampled for the slow loop[,;)]"):
        found = re.search(pattern, lines[-1])
        parts.append(int(found.group(1)) if found else 0)
    assert " 0 of 0 " not in lines[-1] and " 0 reused" not in lines[-1], lines[-1]
    return int(m.group(1)), parts


def test_the_rounds_last_line_names_parts_that_add_up_to_its_metric_calls(tmp_path: Path) -> None:
    """Rollouts generated ahead and for the slow loop are counted when the search first uses
    them, so the line gives those used of those sampled; its parts add up (they had not: it
    counted the generated ahead twice and the slow loop's sequences, not its pairs used)."""
    step = TASK.problems("step", 8, 3)
    lines: list[str] = []
    cfg = FastConfig(pool_size=1, max_metric_calls=30, minibatch_size=2, prefetch_minibatches=False)
    _, s = run_round(Pool.seed(SEEDS[1], 1), NeverRight(), TASK, step[6:], VAL, cfg, 0, tmp_path / "a",
                     log=lines.append, slow_problems=step, slow_samples=2)
    calls, parts = _final_line_parts(lines)
    assert calls == s["metric_calls"] == sum(parts) and parts[3] == s["slow_used"] > 0
    # and how many of the round's proposals were accepted (a pool that never changes shows here)
    assert f"), {s['accepted']} of {s['proposed']} proposals accepted, " in lines[-1], lines[-1]
    lines.clear()
    cfg = FastConfig(pool_size=1, max_metric_calls=30, minibatch_size=2)
    _, s = run_round(Pool.seed(SEEDS[1], 1), NeverRight(), TASK, TRAIN, VAL, cfg, 0, tmp_path / "p", log=lines.append)
    calls, parts = _final_line_parts(lines)
    assert calls == s["metric_calls"] == sum(parts) and parts[1] == s["prefetch_used"] > 0
    parquet = _rollouts(tmp_path / "rollouts.parquet", SEEDS[0], TRAIN[:12])
    lines.clear()
    cfg = FastConfig(pool_size=1, max_metric_calls=40, minibatch_size=4, reuse_rollouts=True)
    _, s = run_round(Pool.seed(SEEDS[0], 1), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path / "b",
                     reuse_rollouts=parquet, log=lines.append)
    calls, parts = _final_line_parts(lines)
    assert calls == s["metric_calls"] == sum(parts) and parts[2] == s["reused_calls"] > 0


def test_a_seed_filling_two_slots_is_sampled_for_both(tmp_path: Path) -> None:
    from fastslow.fast import RolloutCache

    cache = RolloutCache()
    cfg = FastConfig(pool_size=2, max_metric_calls=30, minibatch_size=3)
    pool = Pool.seed(SEEDS[1], 2)  # one context, K = 2 slots (cycle 0)
    new, s = run_round(pool, NeverRight(), TASK, TRAIN, VAL, cfg, 0, tmp_path, log=quiet, cache=cache,
                       slow_problems=TRAIN[-2:], slow_samples=2)
    assert [e.text for e in new.contexts()] == [SEEDS[1]] * 2  # nothing beats it: it keeps both slots
    sampled = cache.sampled([SEEDS[1]], TRAIN[-2:], "base")
    assert [len(r) for r in sampled.values()] == [4, 4]  # G/K = 2 for each of its 2 slots


def test_proposals_shrink_to_the_budget_left(tmp_path: Path) -> None:
    gen = ScriptedGenerator()  # children improve: accepted ones are scored on val too
    cfg = FastConfig(pool_size=2, max_metric_calls=45, minibatch_size=3, proposals_per_iteration=4)
    new, summary = run_round(Pool.seed(SEEDS[:2], 2), gen, TASK, TRAIN, VAL, cfg, 0, tmp_path, log=quiet)
    # 45 - 12 seed val - 6 val = 27 pays for 4 tasks of 6 first; then never more than what is left
    assert summary["proposals"][0] == 4 and summary["metric_calls"] <= 45
    assert summary["best_val_mean"] > max(summary["seed_val_means"].values())


def test_budget_below_one_iteration_is_a_config_error(tmp_path: Path) -> None:
    cfg = FastConfig(pool_size=2, max_metric_calls=20, minibatch_size=3)
    with pytest.raises(ValueError, match="fast budget 20 .* minimum 24"):
        run_round(Pool.seed(SEEDS[:2], 2), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path, log=quiet)


def test_round_improves_and_tracks_lineage(tmp_path: Path) -> None:
    gen = ScriptedGenerator()
    cfg = FastConfig(pool_size=2, max_metric_calls=90, minibatch_size=4)
    pool = Pool.seed(SEEDS[:1], k=2)
    new, summary = run_round(pool, gen, TASK, TRAIN, VAL, cfg, 3, tmp_path, log=quiet)
    assert summary["best_val_mean"] > max(summary["seed_val_means"].values())
    best = new.entries[0]
    assert best.born_round == 3 and best.parent is not None and best.val_mean == summary["best_val_mean"]
    assert set(best.val_scores) == {p.id for p in VAL}
    on_disk = Pool.from_json(tmp_path / "pool.json")
    assert on_disk.texts == new.texts and on_disk.round == 3
    assert on_disk.meta["summary"]["edits"]


def test_a_round_records_every_proposal_with_its_scores_and_feedback(tmp_path: Path) -> None:
    """What GEPA tried was only in the log (accepted texts in gepa's candidates.json, rejected
    ones nowhere, the feedback behind either nowhere): proposals.json holds each call's parent,
    child, edit, minibatch scores as GEPA compared them, acceptance, and the feedback it read."""
    cfg = FastConfig(pool_size=2, max_metric_calls=90, minibatch_size=4, format_credit=0.5)
    new, summary = run_round(Pool.seed(SEEDS[:1], k=2), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 3, tmp_path,
                             log=quiet)
    rows = json.loads((tmp_path / "proposals.json").read_text())
    made = [r for r in rows if r["text"] is not None]
    assert made and summary["proposed"] == len(made)
    assert 0 < summary["accepted"] == summary["num_candidates"] - 1 < len(made)  # one seed; some rejected
    for entry in new.entries:
        if entry.born_round == 3:
            (row,) = [r for r in rows if r["hash"] == entry.hash]
            assert row["accepted"] and row["in_pool"] and row["parent_hash"] == entry.parent
    assert [r["how"] for r in made] == summary["edits"]  # the offline editor's edit, in call order
    for r in made:
        assert r["hash"] == context_hash(r["text"]) and len(r["minibatch"]) == cfg.minibatch_size
        assert [f["problem_id"] for f in r["feedback"]] == r["minibatch"]
        assert all(isinstance(f["feedback"], str) and f["feedback"] for f in r["feedback"])
        # each record's score: the parent's reward there as the proposer read it (no format credit;
        # one sample a problem, so right exactly where the search score is 1)
        assert [f["score"] for f in r["feedback"]] == [float(x == 1.0) for x in r["parent_scores"]]
        # the scores GEPA compared (with format credit): it accepts a strictly better child
        assert len(r["parent_scores"]) == len(r["child_scores"]) == len(r["minibatch"])
        assert r["accepted"] == (sum(r["child_scores"]) > sum(r["parent_scores"])), r
    assert any(0 < x < 1 for r in made for x in r["parent_scores"] + r["child_scores"])  # credit shows
    # a parent's text is there the first time it appears, unless an accepted child of the round
    assert rows[0]["parent_text"] == SEEDS[0]
    accepted = {r["hash"]: r["text"] for r in made if r["accepted"]}
    for r in rows[1:]:
        assert r["parent_text"] is None or r["parent_hash"] not in accepted
    # ... and only then: a parent an earlier call read, or an earlier call's accepted child, has none
    known: set[str] = set()
    for r in rows:
        assert (r["parent_text"] is None) == (r["parent_hash"] in known), r["call"]
        known |= {r["parent_hash"]} | ({r["hash"]} if r["accepted"] else set())
    assert len({r["parent_hash"] for r in rows}) < len(rows)  # some parent was read twice
    # in the pool: accepted, and kept by the new pool (an accepted child it dropped is not)
    pool = {e.hash for e in new.entries}
    assert [r["in_pool"] for r in rows] == [r["accepted"] and r["hash"] in pool for r in rows]
    assert any(r["accepted"] and not r["in_pool"] for r in rows)


def test_a_proposal_repeating_a_candidates_text_is_no_acceptance(tmp_path: Path) -> None:
    """A child whose text is already a candidate's (the other seed; the parent itself) was
    counted accepted and in the pool: acceptance was 'its text is among the candidates'."""
    calls = []

    def proposer(candidate: dict[str, str], dataset: Any, components: list[str]) -> dict[str, str]:
        calls.append(candidate["context"])
        if len(calls) % 2:  # every other call proposes the other seed, word for word
            return {"context": SEEDS[1] if candidate["context"] != SEEDS[1] else SEEDS[0]}
        return {"context": candidate["context"] + f"\nAnswer in <answer></answer>. ({len(calls)})"}

    cfg = FastConfig(pool_size=2, max_metric_calls=90, minibatch_size=3)
    _, summary = run_round(Pool.seed(SEEDS[:2], k=2), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path,
                           log=quiet, proposer=proposer)
    rows = json.loads((tmp_path / "proposals.json").read_text())
    assert summary["accepted"] == sum(r["accepted"] for r in rows) == summary["num_candidates"] - 2
    repeats = [r for r in rows if r["text"] in SEEDS]
    assert repeats and not any(r["in_pool"] and not r["accepted"] for r in rows)


class SeedAWins(ScriptedGenerator):
    """Under SEEDS[0] right on the train problems but every third (never a perfect score on
    every minibatch, which gepa would skip), under any other context on none; on the validation
    set each seed is right on half the problems (the other half): both stay on the Pareto front."""

    def generate(self, conversations: list[Any], params: Any) -> list[Generation]:
        self.calls += 1
        self.prompts += len(conversations)
        val, train = ({p.prompt: i for i, p in enumerate(split)} for split in (VAL, TRAIN))
        answers = {p.prompt: p.answer for p in TRAIN + VAL}
        out = []
        for conv in conversations:
            system, user = conv[0]["content"], conv[-1]["content"]
            right = (val[user] % 2 == 0) == (system == SEEDS[0]) if user in val else \
                system == SEEDS[0] and train[user] % 3 > 0
            text = f"<answer>{answers[user] if right else 'none'}</answer>"
            out.append(Generation(text=text, prompt_tokens=1, completion_tokens=1, prompt_ids=(1,), completion_ids=(2,)))
        return out


def test_a_child_the_seeds_already_scored_costs_nothing_and_the_round_spends_its_budget(tmp_path: Path) -> None:
    """The first child of SEEDS[1] is SEEDS[0]'s text (better on the minibatch: accepted). Its
    validation scores are the seed's, served by the adapter's cache for nothing; gepa's own
    counter charges them anyway (|val| = 6), and the round used to stop on that larger count,
    an iteration early, with its budget unspent. It stops on the real count now."""
    children = iter(range(1000))

    def proposer(candidate: dict[str, str], dataset: Any, components: list[str]) -> dict[str, str]:
        if candidate["context"] == SEEDS[1]:
            return {"context": SEEDS[0]}
        return {"context": f"Another context ({next(children)})."}

    cfg = FastConfig(pool_size=2, max_metric_calls=60, minibatch_size=3, proposals_per_iteration=1)
    _, summary = run_round(Pool.seed(SEEDS[:2], k=2), SeedAWins(), TASK, TRAIN, VAL, cfg, 0, tmp_path,
                           log=quiet, proposer=proposer)
    worst = 2 * 3 + len(VAL)
    assert summary["gepa_metric_calls"] == summary["metric_calls"] + len(VAL)  # the free hits gepa charged
    assert summary["stop_reason"] == f"budget: {summary['metric_calls']} used, next iteration may need {worst} of 60"
    assert summary["metric_calls"] + worst > 60 >= summary["metric_calls"]  # no iteration it could afford was left


def test_a_child_proposed_twice_is_accepted_in_the_iteration_gepa_accepted_it() -> None:
    """The same child from the same parent, rejected in iteration 1 and accepted in iteration 2:
    matching calls by text alone marked the first, rejected call accepted."""
    from types import SimpleNamespace

    from fastslow.fast.round import RecordedProposer

    parent, child = SEEDS[0], SEEDS[0] + "\nShow your work."
    recorded = RecordedProposer(lambda candidate, dataset, components: {"context": child})
    for iteration in (1, 2):
        recorded.on_iteration_start({"iteration": iteration})
        recorded({"context": parent}, {"context": []}, ["context"])
    recorded.on_candidate_accepted({"iteration": 2, "new_candidate_idx": 1, "new_score": 1.0, "parent_ids": [0]})
    result = SimpleNamespace(candidates=[{"context": parent}, {"context": child}], parents=[[None], [0]])
    assert recorded.accepted_calls(result) == {1: 1}


def test_the_same_child_proposed_on_several_minibatches_is_accepted_where_it_scored(tmp_path: Path) -> None:
    """n = 3 proposals an iteration, each the same child of the same parent on its own minibatch:
    GEPA accepts the best-scoring one, and the record marked the first call, whose child may not
    even have beaten its parent."""
    def proposer(candidate: dict[str, str], dataset: Any, components: list[str]) -> dict[str, str]:
        return {"context": SEEDS[0] + "\nAnswer in <answer></answer>."}

    cfg = FastConfig(pool_size=1, max_metric_calls=45, minibatch_size=3, proposals_per_iteration=3)
    _, summary = run_round(Pool.seed(SEEDS[:1], k=1), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path,
                           log=quiet, proposer=proposer)
    rows = json.loads((tmp_path / "proposals.json").read_text())
    assert summary["accepted"] == 1 and len(rows) == 5  # 3 calls, then 2 on the budget left
    assert [r["parent_text"] for r in rows[:3]] == [SEEDS[0], None, None]  # the seed's text once
    sums = [sum(r["child_scores"]) for r in rows]
    assert len(set(sums)) > 1  # the minibatches told the calls apart
    (accepted,) = [r for r in rows if r["accepted"]]
    assert sum(accepted["child_scores"]) == max(sums) > sum(accepted["parent_scores"])


def test_gepa_only_rounds_with_frozen_weights(tmp_path: Path) -> None:
    gen = ScriptedGenerator()
    cfg = FastConfig(pool_size=2, max_metric_calls=60, minibatch_size=3)
    pool, summaries = run_gepa_only(Pool.seed(SEEDS[0], 2), gen, TASK, TRAIN, VAL, cfg, 2, tmp_path, log=quiet)
    assert summaries[1]["seed_generations"] == 0  # carried-over contexts: cached, same weights
    # and free: round 0's prefetched minibatch rollouts were charged again when round 1 first
    # served them (a cycle's next round, from fast_cache.json, never was)
    for s in summaries:
        assert s["prefetch_used"] <= s["prefetched"]  # round 1 had used 4 of its 2
        assert s["metric_calls"] == s["generations"] - s["prefetched"] + s["prefetch_used"]
    assert all(s["generations"] <= 60 for s in summaries)
    assert gen.prompts == sum(s["generations"] for s in summaries)
    assert summaries[1]["best_val_mean"] >= summaries[0]["best_val_mean"]
    assert pool.entries[0].val_mean > summaries[0]["seed_val_means"][f"seed-{context_hash(SEEDS[0])[:8]}"]



def test_frozen_rounds_pay_once_for_every_evaluation_their_searches_use(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Over a GEPA-only run's rounds (one frozen-weights cache, carried from round to round), every
    (context, problem) evaluation the searches were served cost one metric call, once. A rollout
    generated ahead (prefetch) and never used had been carried as a plain, free entry, so a later
    round's search used it with no call charged; such rollouts are now left behind."""
    from fastslow.fast import adapter as adapter_module

    served: set[tuple[str, str]] = set()
    real = adapter_module.FastAdapter.evaluate_many

    def recording(self, items, capture_traces=False, ahead=()):
        served.update((context_hash(c["context"]), p.id) for c, batch in items for p in batch)
        return real(self, items, capture_traces, ahead)

    monkeypatch.setattr(adapter_module.FastAdapter, "evaluate_many", recording)
    free = []
    for seed in range(6):
        served.clear()
        cfg = FastConfig(pool_size=2, max_metric_calls=30, minibatch_size=2, seed=seed)
        _, summaries = run_gepa_only(Pool.seed(SEEDS[:2], 2), ScriptedGenerator(), TASK, TRAIN[:12], VAL[:4], cfg,
                                     4, tmp_path / str(seed), log=quiet)
        free.append(len(served) - sum(s["metric_calls"] for s in summaries))
        assert all(s["prefetched"] > s["prefetch_used"] for s in summaries[:1])  # some go unused
    assert free == [0] * 6, free


def test_a_frozen_rounds_prefetch_spans_the_iterations_its_free_seed_evaluations_leave(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With prefetch, a round's minibatches come from a subset sized to the iterations its budget
    can pay for. That counted the seeds' validation evaluations as paid, though a GEPA-only run's
    later rounds get them free from the carried cache: their searches ran twice the iterations
    over the first round's 8 problems. Now the subset counts what the seeds really cost."""
    import fastslow.fast.round as round_module

    sizes = []
    real = round_module.ProblemLoader
    monkeypatch.setattr(round_module, "ProblemLoader",
                        lambda problems, split: sizes.append((split, len(problems))) or real(problems, split))
    cfg = FastConfig(pool_size=2, max_metric_calls=30, minibatch_size=2)  # prefetch on, the default
    _, summaries = run_gepa_only(Pool.seed(SEEDS[:2], 2), ScriptedGenerator(), TASK, TRAIN, VAL[:4], cfg, 2,
                                 tmp_path, log=quiet)
    assert summaries[1]["seed_generations"] == 0  # the seeds' validation scores: carried, free
    # 30 calls: round 0 pays 2 x 4 for its seeds and keeps 4 for a child's validation, 4 iterations
    # of 2 x 2; round 1 pays nothing for its seeds: 6 iterations
    assert [n for split, n in sizes if split == "train"] == [8, 12]


def test_a_context_carried_into_the_next_round_keeps_its_lineage(tmp_path: Path) -> None:
    """Round 1 seeded with round 0's pool (same weights, one cache): each context carried over
    keeps the born_round and parent it had (a seed stays a seed, -1 and no parent; round 0's
    child keeps round 0 and its parent); only the contexts round 1 found are born in round 1.
    Nothing checked a carried entry's lineage: rebuilt as one of round 1's candidates, it was
    stamped born in round 1 without a parent."""
    from fastslow.fast import RolloutCache

    seeds = ["Reply with the sum as <answer>N</answer>.", SEEDS[1]]
    cache, gen = RolloutCache(), ScriptedGenerator()
    first, _ = run_round(Pool.seed(seeds, 4), gen, TASK, TRAIN, VAL,
                         FastConfig(pool_size=4, max_metric_calls=30, minibatch_size=3), 0, tmp_path / "r0",
                         log=quiet, cache=cache)
    second, _ = run_round(first, gen, TASK, TRAIN, VAL,
                          FastConfig(pool_size=4, max_metric_calls=60, minibatch_size=3), 1, tmp_path / "r1",
                          log=quiet, cache=cache)
    before = {e.hash: e for e in first.entries}
    carried = [e for e in second.entries if e.hash in before]
    assert sorted(e.born_round for e in carried) == [-1, 0]  # a seed and round 0's child
    for e in carried:
        assert (e.born_round, e.parent) == (before[e.hash].born_round, before[e.hash].parent)
    assert [e.parent for e in carried if e.born_round == -1] == [None]
    assert all(e.parent is not None for e in carried if e.born_round == 0)
    found = [e for e in second.entries if e.hash not in before]
    assert found and all(e.born_round == 1 and e.parent is not None for e in found)
    assert [e.born_round for e in Pool.from_json(tmp_path / "r1" / "pool.json").entries] == \
        [e.born_round for e in second.entries]

def _rollouts(path: Path, context: str, problems: list[Any], context_id: str = "c0") -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fastslow.records import ROLLOUT_COLUMNS

    rows = []
    for p in problems:
        for g in range(2):
            completion = f"I think it is {p.answer}." if g else "no idea"
            rows.append({"run": "x", "cycle": 0, "step": 1, "problem_id": p.id, "context_id": context_id,
                         "context_hash": context_hash(context), "prompt": p.prompt, "completion": completion,
                         "reward": 0.0, "feedback": TASK.feedback(p, completion), "prompt_tokens": 1,
                         "completion_tokens": 1, "logprob_sum": -1.0, "truncated": False, "answered": False})
    types = {"str": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}
    schema = pa.schema([(c, types[t]) for c, t in ROLLOUT_COLUMNS.items()])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


class CountingProposer:
    """A new context on every call, and the problems of every reflective dataset it was shown."""

    def __init__(self) -> None:
        self.calls = 0
        self.problems: set[str] = set()

    def __call__(self, candidate: dict[str, str], dataset: Any, components: list[str]) -> dict[str, str]:
        self.calls += 1
        self.problems |= {str(r["problem_id"]) for name in components for r in dataset.get(name, [])}
        return {name: f"{candidate[name]} (edit {self.calls})" for name in components}


def test_rollout_reuse_feeds_validation_then_minibatches(tmp_path: Path) -> None:
    """The reused problems become the Pareto validation set; those left over (6 here) are the
    minibatch pool. Minibatches never come from the validation set."""
    cfg = FastConfig(pool_size=1, max_metric_calls=40, minibatch_size=4, reuse_rollouts=True)
    covered = TRAIN[:12]
    parquet = _rollouts(tmp_path / "rollouts.parquet", SEEDS[0], covered)
    gen, proposer = ScriptedGenerator(), CountingProposer()
    new, summary = run_round(Pool.seed(SEEDS[0], 1), gen, TASK, TRAIN, VAL, cfg, 0, tmp_path / "r",
                             reuse_rollouts=parquet, log=quiet, proposer=proposer)
    assert summary["reused_pairs"] == 12 and summary["reused_hits"] >= 4
    assert gen.prompts == summary["generations"]
    assert summary["metric_calls"] == summary["generations"] + summary["reused_calls"] <= 40
    # The seed's val scores cost no generation; nor do its minibatch scores.
    assert summary["val_problems"] == [p.id for p in covered[:len(VAL)]]
    assert summary["seed_generations"] == 0 and summary["reused_calls"] >= len(VAL) + 4
    assert summary["train_problems"] == 6 and summary["prefetched"] == 0
    assert proposer.calls >= 1 and proposer.problems <= {p.id for p in covered[len(VAL):]}


def test_reuse_validates_on_the_problems_every_seed_was_rolled_out_on(tmp_path: Path) -> None:
    """With two seed contexts, a problem only one of them was rolled out on (here the first six)
    is no free validation problem: the other seed would need new rollouts. The validation set is
    the six both covered, every seed's scores there are reused, and minibatches come from the
    train problems outside it (a mutant taking any covered problem survived the suite)."""
    import polars as pl

    one = _rollouts(tmp_path / "one.parquet", SEEDS[0], TRAIN[:12], "c0")
    other = _rollouts(tmp_path / "other.parquet", SEEDS[1], TRAIN[6:12], "c1")
    both = tmp_path / "both.parquet"
    pl.concat([pl.read_parquet(one), pl.read_parquet(other)]).write_parquet(both)
    cfg = FastConfig(pool_size=2, max_metric_calls=40, minibatch_size=3, reuse_rollouts=True,
                     prefetch_minibatches=False)  # (a prefetch would sample the minibatch problems)
    _, summary = run_round(Pool.seed(SEEDS[:2], 2), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path / "r",
                           reuse_rollouts=both, log=quiet, proposer=CountingProposer())
    assert summary["reused_pairs"] == 12 + 6
    assert summary["val_problems"] == [p.id for p in TRAIN[6:12]]
    assert summary["seed_generations"] == 0 and summary["reused_calls"] >= 2 * len(VAL)
    assert summary["train_problems"] == len(TRAIN) - len(VAL)


def test_reuse_makes_the_same_search_with_fewer_generations(tmp_path: Path) -> None:
    """Reused problems exactly fill the validation set: the seed's val scores are reused, and
    its minibatches are drawn (and prefetched) from the train problems outside that set, as
    without reuse. The search is the same (iterations, metric calls); 6 rollouts fewer are
    generated. Were minibatches drawn from the validation set, the seed's minibatch scores would
    be free and the budget they leave would buy more iterations."""
    runs = {}
    for reuse in (False, True):
        parquet = _rollouts(tmp_path / f"rollouts{reuse}.parquet", SEEDS[1], TRAIN[:len(VAL)]) if reuse else None
        gen, proposer = NeverRight(), CountingProposer()
        cfg = FastConfig(pool_size=1, max_metric_calls=30, minibatch_size=3, reuse_rollouts=reuse)
        _, summary = run_round(Pool.seed(SEEDS[1], 1), gen, TASK, TRAIN, VAL, cfg, 0, tmp_path / str(reuse),
                               reuse_rollouts=parquet, log=quiet, proposer=proposer)
        runs[reuse] = gen, proposer, summary
    (g0, p0, s0), (g1, p1, s1) = runs[False], runs[True]
    assert p0.calls == p1.calls == 3 and s0["metric_calls"] == s1["metric_calls"] == 6 + 3 * 6
    assert s1["reused_calls"] == len(VAL) and g1.prompts == g0.prompts - len(VAL)
    assert s1["val_problems"] == [p.id for p in TRAIN[:len(VAL)]]
    assert not p1.problems & set(s1["val_problems"]) and not p0.problems & set(s0["val_problems"])


def test_reuse_generates_less_for_the_same_budget(tmp_path: Path) -> None:
    cfg = FastConfig(pool_size=1, max_metric_calls=40, minibatch_size=4, reuse_rollouts=True,
                     prefetch_minibatches=False)  # (prefetching would add unused rollouts to plain's)
    parquet = _rollouts(tmp_path / "rollouts.parquet", SEEDS[0], TRAIN[:8])
    plain, reuse = ScriptedGenerator(), ScriptedGenerator()
    _, s0 = run_round(Pool.seed(SEEDS[0], 1), plain, TASK, TRAIN, VAL, cfg, 0, tmp_path / "a", log=quiet)
    _, s1 = run_round(Pool.seed(SEEDS[0], 1), reuse, TASK, TRAIN, VAL, cfg, 0, tmp_path / "b",
                      reuse_rollouts=parquet, log=quiet)
    assert s0["reused_calls"] == 0 and s0["metric_calls"] == s0["generations"] == plain.prompts
    assert reuse.prompts < plain.prompts


def test_round_on_the_tiny_model(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The real generation backend in a round (random weights: only plumbing is checked)."""
    from fastslow.model.generation import make_generator

    gen = make_generator("hf", tiny_model_dir, batch_size=4)
    cfg = FastConfig(pool_size=1, max_metric_calls=16, minibatch_size=2, max_new_tokens=8)
    new, summary = run_round(Pool.seed("Solve.", 1), gen, TASK, TRAIN[:4], VAL[:4], cfg, 0, tmp_path, log=quiet)
    assert summary["generations"] <= 16 and new.entries and (tmp_path / "pool.json").exists()


def test_rollout_reuse_needs_the_flag(tmp_path: Path) -> None:
    parquet = _rollouts(tmp_path / "rollouts.parquet", SEEDS[0], TRAIN[:8])
    cfg = FastConfig(pool_size=1, max_metric_calls=40, minibatch_size=4, reuse_rollouts=False)
    lines: list[str] = []
    _, summary = run_round(Pool.seed(SEEDS[0], 1), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path / "r",
                           reuse_rollouts=parquet, log=lines.append)
    assert summary["reused_pairs"] == 0 and any("ignoring" in x for x in lines)


def test_round_reports_progress_of_every_sampling_pass(tmp_path: Path) -> None:
    """Each generate pass of the round is announced with its size and each of its calls
    reported when done, so a long round (paper scale: minutes per call) is never silent; the
    reported counts add up to what the generator sampled."""
    import re

    lines: list[str] = []
    gen = ScriptedGenerator()
    cfg = FastConfig(pool_size=2, max_metric_calls=45, minibatch_size=3, eval_batch_size=8)
    _, summary = run_round(Pool.seed(SEEDS[:2], 2), gen, TASK, TRAIN, VAL, cfg, 4, tmp_path, log=lines.append)
    starts = [int(m.group(1)) for x in lines if (m := re.match(r"fast round 4: sampling (\d+) sequences", x))]
    dones = [(int(m.group(1)), int(m.group(2))) for x in lines
             if (m := re.match(r"fast round 4: sampled (\d+)/(\d+) sequences \(\d+ s\)", x))]
    assert starts and sum(starts) == gen.prompts == summary["generations"]
    assert [total for done, total in dones if done == total] == starts  # every pass reported to its end
    assert len(dones) > len(starts)  # the seeds' pass (18 sequences) took several calls of <= 8


def test_round_reports_where_its_evaluation_time_went(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary splits the round's sampling time into the seeds' evaluation call (validation
    and the prefetched minibatches) and the search's (the children). A clock that advances one
    second per prompt the generator completes makes the split the prompts of each."""
    import types

    import fastslow.fast.adapter as adapter_module

    clock = [0.0]

    class Clocked(NeverRight):
        def generate(self, conversations: list[Any], params: Any) -> list[Generation]:
            clock[0] += len(conversations)
            return super().generate(conversations, params)

    monkeypatch.setattr(adapter_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    cfg = FastConfig(pool_size=1, max_metric_calls=30, minibatch_size=3, proposals_per_iteration=3)
    _, summary = run_round(Pool.seed(SEEDS[1], 1), Clocked(), TASK, TRAIN, VAL, cfg, 0, tmp_path, log=quiet)
    assert summary["seed_eval_seconds"] == len(VAL) + 9  # the seeds' call: 6 val + 9 prefetched
    assert summary["search_eval_seconds"] == 3 * 3  # one iteration: 3 children on 3 problems


def test_a_problem_the_rl_step_draws_twice_is_sampled_for_both_draws(tmp_path: Path) -> None:
    """A step crossing an epoch boundary of the data stream draws a problem twice: it is one
    validation problem (gepa's loader needs distinct ids), sampled 2 x G/K times per pool
    context, since the step has two groups of G/K rows per context for it."""
    from fastslow.fast import RolloutCache

    p, q = TASK.problems("step", 2, 5)
    cache = RolloutCache()
    cfg = FastConfig(pool_size=2, max_metric_calls=45, minibatch_size=3)
    new, s = run_round(Pool.seed(SEEDS[:2], 2), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path,
                       log=quiet, cache=cache, slow_problems=[p, q, p], slow_samples=2)
    assert s["val_problems"] == [p.id, q.id] + [x.id for x in VAL[:4]]
    sampled = cache.sampled(SEEDS[:2], [p, q], "base")
    assert {key: len(r) for key, r in sampled.items()} == {
        (context_hash(text), x.id): 4 if x is p else 2 for text in SEEDS[:2] for x in (p, q)}
    again = run_round(Pool.seed(SEEDS[:2], 2), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path / "pp",
                      log=quiet, cache=RolloutCache(), slow_problems=[p, p], slow_samples=2)[1]
    assert again["val_problems"][0] == p.id and again["val_problems"].count(p.id) == 1


def test_search_time_excludes_the_samples_for_the_rl_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """reuse_in_slow with G/K = 2: every candidate scored on validation also gets a second
    sample of each step problem, for the slow loop. Their time is booked apart
    (`slow_sample_seconds`), not as the search's or the seeds' evaluation time. A clock that
    advances one second per prompt makes each part the prompts of each."""
    import types

    import fastslow.fast.adapter as adapter_module

    clock = [0.0]

    class Clocked(ScriptedGenerator):
        def generate(self, conversations: list[Any], params: Any) -> list[Generation]:
            clock[0] += len(conversations)
            return super().generate(conversations, params)

    monkeypatch.setattr(adapter_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    step = TASK.problems("train", 18, 0)[16:]
    gen = Clocked()
    cfg = FastConfig(pool_size=2, max_metric_calls=45, minibatch_size=3)
    _, s = run_round(Pool.seed(SEEDS[:2], 2), gen, TASK, TRAIN, VAL, cfg, 0, tmp_path, log=quiet,
                     slow_problems=step, slow_samples=2)
    assert s["slow_rollouts"] > 2 * len(step)  # accepted children were sampled for the step too
    assert s["slow_sample_seconds"] == s["slow_rollouts"]
    assert s["seed_eval_seconds"] == s["seed_generations"] + s["prefetched"]
    assert s["search_eval_seconds"] == s["generations"] - s["seed_generations"] - s["prefetched"]
    assert s["seed_eval_seconds"] + s["search_eval_seconds"] + s["slow_sample_seconds"] == gen.prompts


def test_several_proposals_take_fresh_minibatches_each_iteration(tmp_path: Path) -> None:
    """n = 2 proposals per iteration over 2 iterations: the 4 tasks take 4 distinct minibatches
    (gepa's sampler alone would give the second iteration the first one's second minibatch
    again), so the prefetched train subset, sized for 4 tasks, is used whole."""
    seen: list[list[str]] = []

    def proposer(candidate: dict[str, str], dataset: Any, components: list[str]) -> dict[str, str]:
        seen.append(sorted(r["problem_id"] for r in dataset["context"]))
        return {"context": candidate["context"] + f" Attempt {len(seen)}."}

    cfg = FastConfig(pool_size=1, max_metric_calls=28, minibatch_size=2, proposals_per_iteration=2)
    _, s = run_round(Pool.seed(SEEDS[1], 1), NeverRight(), TASK, TRAIN, VAL, cfg, 0, tmp_path, log=quiet,
                     proposer=proposer)
    assert s["proposals"] == [2, 2] and s["train_problems"] == 8 and len(seen) == 4
    assert len({tuple(mb) for mb in seen}) == 4 and len({pid for mb in seen for pid in mb}) == 8
    assert s["prefetch_used"] == s["prefetched"] == 8


def test_a_round_whose_reflection_calls_all_raise_fails(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every reflection call raised (a wrong model name or key, a server gone): the round went on,
    logged one ERROR, and the cycle trained as RL would, exit code 0. Now the round raises, in one
    line with the last error, after writing what it tried (proposals.json). A round of a single
    call (one error may be a blip) still only logs."""
    import logging

    from fastslow.fast import ReflectiveProposer

    def broken(prompt: Any) -> str:
        raise ConnectionError("reflection server\nunreachable")

    cfg = FastConfig(pool_size=2, max_metric_calls=45, minibatch_size=3)
    proposer = ReflectiveProposer(broken, logger=quiet)
    with pytest.raises(RuntimeError, match=r"^fast round 0: all \d+ reflection calls raised, nothing was proposed "
                       r"\(last error: ConnectionError: reflection server unreachable\); check fast\.reflection$"):
        run_round(Pool.seed(SEEDS[:2], 2), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path, log=quiet,
                  proposer=proposer)
    assert proposer.calls >= 2 and proposer.raised_calls == proposer.calls
    assert (tmp_path / "proposals.json").exists() and not (tmp_path / "pool.json").exists()

    one = FastConfig(pool_size=1, max_metric_calls=18, minibatch_size=3)  # room for one iteration
    with caplog.at_level(logging.ERROR, logger="fastslow.fast.round"):
        new, s = run_round(Pool.seed(SEEDS[0], 1), ScriptedGenerator(), TASK, TRAIN, VAL, one, 0, tmp_path / "one",
                           log=quiet, proposer=ReflectiveProposer(broken, logger=quiet))
    assert s["reflection_calls"] == s["reflection_failed_calls"] == 1 and new.texts == [SEEDS[0]]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "all 1 reflection calls failed" in errors[0].getMessage()


def test_a_round_whose_reflection_calls_all_fail_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A reflection model that answers, with nothing usable every time (a small local model's
    junk): the pool stays as it was (the round goes on), the failure is logged once at ERROR
    level with the last reason, and the summary counts the calls and the failed ones."""
    import logging

    from fastslow.fast import ReflectiveProposer

    def junk(prompt: Any) -> str:
        return "```\n#### !!!! ???? ....\n```"

    pool = Pool.seed(SEEDS[:2], 2)
    cfg = FastConfig(pool_size=2, max_metric_calls=45, minibatch_size=3)
    with caplog.at_level(logging.ERROR, logger="fastslow.fast.round"):
        new, s = run_round(pool, ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path, log=quiet,
                           proposer=ReflectiveProposer(junk, logger=quiet))
    assert sorted(new.texts) == sorted(pool.texts)
    assert s["reflection_calls"] >= 2 and s["reflection_failed_calls"] == s["reflection_calls"]
    assert s["proposed"] == s["accepted"] == 0  # calls that proposed nothing are no proposals
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "mostly non-letters" in errors[0].getMessage()

    def fine(prompt: Any) -> str:
        return "```\nSolve the problem. Give the final answer as <answer>N</answer>.\n```"

    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="fastslow.fast.round"):
        _, s = run_round(pool, ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path / "ok", log=quiet,
                         proposer=ReflectiveProposer(fine, logger=quiet))
    assert s["reflection_calls"] >= 1 and s["reflection_failed_calls"] < s["reflection_calls"]
    assert not [r for r in caplog.records if r.levelno == logging.ERROR]


def test_a_gepa_runs_later_cycles_serve_its_carried_contexts_from_the_earlier_ones_evaluations(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """A GEPA-only run trains nothing, so its weights are the same in every cycle; each cycle is a
    job of its own. Each cycle's round re-generated the pool it was seeded with on the validation
    set (a weights id per cycle, a fresh cache per job) and charged it to its budget: 12 of 32 calls
    at toy scale, about half the paper's. Now the round's new evaluations go to `fast_cache.json`,
    and later cycles' rounds serve them free: no seed generations, the whole budget for search.
    Not across a continual run's change of task."""
    from fastslow.config import load_config, task_spec
    from fastslow.cycle import FROZEN_CACHE, run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.fast import RolloutCache
    from fastslow.tasks.data import write_splits

    config = load_config("config/config.yaml", "config/smoke.yaml")
    registry, options = task_spec(config, "math")
    train = write_splits(registry, tmp_path / "data", config["data"]["sizes"], config["data"]["seed"], **options)["train"]
    spec = RunSpec(experiment="e", method="gepa", name="math-default-s0", schedule=("math",) * 3, seed=0)
    first = run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "cycle0")
    carried = RolloutCache.from_json(tmp_path / "cycle0" / FROZEN_CACHE)
    pool0 = json.loads((tmp_path / "cycle0" / "pool.json").read_text())
    val_ids = set(pool0["entries"][0]["val_scores"])
    # every pool context's validation evaluations are carried, with the scores the pool holds
    for entry in pool0["entries"]:
        for pid, score in entry["val_scores"].items():
            assert carried.get(context_hash(entry["text"]), pid, "e/gepa/math-default-s0/frozen").score == score
    second = run_cycle(spec, config, 1, tiny_model_dir, tmp_path / "cycle0", train, tmp_path / "cycle1")
    fast0, fast1 = (json.loads((tmp_path / f"cycle{c}" / "fast.json").read_text()) for c in (0, 1))
    assert fast0["seed_generations"] == len(val_ids) and fast1["seed_generations"] == 0
    assert fast0["cached_evaluations"] > 0 and fast1["carried_evaluations"] == fast0["cached_evaluations"]
    # Each cycle's file holds its own round's new evaluations and names the earlier ones, which a
    # cycle reads too: one file holding all earlier rounds' again grew by a round every cycle, and
    # every cycle's was kept (quadratic in a run's cycles).
    files = [tmp_path / f"cycle{c}" / FROZEN_CACHE for c in (0, 1)]
    cached = [set(RolloutCache.from_json(f).entries) for f in files]
    assert len(cached[1]) == fast1["cached_evaluations"] and not cached[0] & cached[1]
    run_cycle(spec, config, 2, tiny_model_dir, tmp_path / "cycle1", train, tmp_path / "cycle2")
    fast2 = json.loads((tmp_path / "cycle2" / "fast.json").read_text())
    assert fast2["seed_generations"] == 0
    chain, read = RolloutCache.from_chain(files[1])
    assert read == files and fast2["carried_evaluations"] == len(cached[0] | cached[1]) == len(chain)
    # each file names the earlier ones relative to itself: a results tree moved whole still reads
    assert json.loads((tmp_path / "cycle2" / FROZEN_CACHE).read_text())["earlier"] == [
        "../cycle0/fast_cache.json", "../cycle1/fast_cache.json"]
    assert first["weights"] == second["weights"] == str(tiny_model_dir)
    # A continual run's cycle on a new task carries nothing: the cache is keyed by problem id, and
    # two tasks' ids may coincide (here the very same rows, under another task's name).
    switched = RunSpec(experiment="e", method="gepa", name="math-default-s0", schedule=("math", "math_hard"), seed=0)
    run_cycle(switched, config, 1, tiny_model_dir, tmp_path / "cycle0", train, tmp_path / "switched1")
    fast_switched = json.loads((tmp_path / "switched1" / "fast.json").read_text())
    assert fast_switched["seed_generations"] == len(val_ids)
    assert json.loads((tmp_path / "switched1" / FROZEN_CACHE).read_text())["earlier"] == []  # a chain of its own


def test_a_gepa_cycle_reads_the_chain_of_its_tasks_earlier_cycles_and_names_a_missing_link(tmp_path: Path) -> None:
    """The cycles a GEPA-only cycle's job lists as inputs (`same_task_before`, common.smk) are
    the chain its file names: back to the last task switch of a continual run. A missing link is
    one line naming it and the file that names it."""
    from fastslow.experiments import RunSpec
    from fastslow.fast import RolloutCache
    from fastslow.fast.adapter import Scored

    spec = RunSpec(experiment="e", method="gepa", name="r", schedule=("a", "a", "b", "b", "a"), seed=0)
    assert [list(spec.same_task_before(c)) for c in range(5)] == [[], [0], [], [2], []]
    files = [tmp_path / f"c{i}" / "fast_cache.json" for i in range(3)]
    for i, f in enumerate(files):
        f.parent.mkdir()
        RolloutCache({(f"h{i}", "p", "w"): Scored(0.5, {"completion": str(i)})}).to_json(f, "w", earlier=files[:i])
    cache, read = RolloutCache.from_chain(files[2])
    assert read == files and sorted(cache.entries) == [("h0", "p", "w"), ("h1", "p", "w"), ("h2", "p", "w")]
    files[0].unlink()
    with pytest.raises(FileNotFoundError, match=r"c2/fast_cache.json names the earlier evaluations .*c0/fast_cache.json, "
                                                r"which are missing: run again the cycle that wrote them"):
        RolloutCache.from_chain(files[2])


def test_a_rounds_time_includes_loading_its_sampler(tiny_model_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The round's generator was loaded before its clock started, so the load landed in a step's
    'other' time (bench_fst_step's I/O) rather than in the fast round's."""
    import fastslow.model.generation as generation
    from fastslow.config import load_config, task_spec
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.tasks.data import write_splits

    real = generation.make_generator

    def slow_load(*args, **kwargs):
        time.sleep(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "make_generator", slow_load)
    config = load_config("config/config.yaml", "config/smoke.yaml")
    registry, options = task_spec(config, "math")
    train = write_splits(registry, tmp_path / "data", config["data"]["sizes"], config["data"]["seed"], **options)["train"]
    spec = RunSpec(experiment="e", method="gepa", name="math-default-s0", schedule=("math",), seed=0)
    run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "cycle0")
    fast = json.loads((tmp_path / "cycle0" / "fast.json").read_text())
    assert fast["seconds"] >= 1.0 + fast["seed_eval_seconds"] + fast["search_eval_seconds"] - 1e-6, fast


def test_the_pool_report_shows_each_pool_its_proposals_and_the_best_contexts_parent(tmp_path: Path) -> None:
    """The report showed each cycle's best context alone, diffed against the last cycle's best
    (not its parent), with no word on what the round tried. Now: every context of the pool,
    the proposals (accepted or rejected, scores, the feedback read), and the diff to the parent."""
    from fastslow.experiments import RunSpec
    from fastslow.layout import cycle_dir
    from fastslow.pools import pool_evolution_html

    spec = RunSpec("toys", "fst", "toy-default-s0", ("toy", "toy"), 0)
    cfg = FastConfig(pool_size=2, max_metric_calls=90, minibatch_size=4)
    pool, pools = Pool.seed(SEEDS[:1], k=2), []
    for c in range(2):
        out = Path(cycle_dir(spec, c, str(tmp_path)))
        pool, _ = run_round(pool, ScriptedGenerator(), TASK, TRAIN, VAL, cfg, c, out / "fast", log=quiet)
        pool.to_json(out / "pool.json")
        pools.append(pool)
    page = pool_evolution_html({spec.key: spec}, "toys", str(tmp_path))
    assert "<title>Context pools — toys</title>" in page and "fast.format_credit" in page
    for p in pools:
        assert all(e.id in page for e in p.entries)  # every context, not the best alone
    rows = json.loads((Path(cycle_dir(spec, 0, str(tmp_path))) / "fast/proposals.json").read_text())
    every = [r for c in range(2)
             for r in json.loads((Path(cycle_dir(spec, c, str(tmp_path))) / "fast/proposals.json").read_text())]
    assert page.count("<details>") == sum(r["accepted"] for r in every) > 0  # text and feedback: accepted ones
    assert "rejected" in page and "accepted, in the pool" in page
    taken = next(r for r in rows if r["accepted"])
    assert taken["feedback"][0]["feedback"].splitlines()[0] in page  # the feedback behind an accepted one
    # cycle 0's best is diffed against the context it came from: the seed, or an accepted child
    # the pool dropped (which was nowhere to be found before)
    best, seed = pools[0].entries[0], Pool.seed(SEEDS[:1], k=2).entries[0]
    assert best.born_round == 0 and best.parent is not None
    parent = seed.id if best.parent == seed.hash else f"r0-{best.parent[:8]}"
    assert f"parent {parent}" in page
    assert best.parent == seed.hash or any(r["hash"] == best.parent and r["accepted"] for r in rows)


def _report_run(tmp_path: Path) -> tuple[Any, dict[str, str]]:
    """A four-cycle FST run's pools and proposals, written by hand (`pool_evolution_html`'s
    inputs): cycle 0 improves the seed S into A (a second accepted child, B, is not kept; a
    third call's child is rejected; a fourth proposes nothing), cycle 1 improves a context Z
    no earlier file names into F, cycle 2 keeps F best without proposing anything new, and
    cycle 3, from before proposals.json was written, holds E and its parent G."""
    from fastslow.experiments import RunSpec
    from fastslow.fast.pool import PoolEntry
    from fastslow.layout import cycle_dir

    texts = {"S": "Solve it.", "A": "Solve it.\nPut the result in <answer> tags.", "B": "Solve it, briefly.",
             "C": "Guess.", "Z": "Think first.", "F": "Think first.\nPut the result in <answer> tags.",
             "G": "Think twice.", "E": "Think twice.\nThen answer."}
    h = {name: context_hash(text) for name, text in texts.items()}

    def call(i: int, parent: str, child: str | None, mb: list[str], before: list[float], after: list[float] | None,
             accepted: bool = False, in_pool: bool = False, round_index: int = 0, first: bool = False,
             note: str | None = None) -> dict[str, Any]:
        return {"round": round_index, "call": i, "how": None if child is None else "reflection", "note": note,
                "parent_hash": h[parent], "parent_text": texts[parent] if first else None,
                "hash": None if child is None else h[child], "text": None if child is None else texts[child],
                "minibatch": mb, "parent_scores": before, "child_scores": after, "accepted": accepted,
                "in_pool": in_pool, "feedback": [{"problem_id": "p1", "score": 0.5, "parsed_answer": "2",
                                                  "feedback": "wrong <b>", "output": "2"}]}

    a = PoolEntry(texts["A"], parent=h["S"], born_round=0, val_scores={"p1": 1.0, "p2": 0.5})
    f = PoolEntry(texts["F"], parent=h["Z"], born_round=1, val_scores={"p1": 1.0})
    g = PoolEntry(texts["G"], parent=h["F"], born_round=3, val_scores={})
    e = PoolEntry(texts["E"], parent=h["G"], born_round=3, val_scores={"p1": 1.0})
    pools = [Pool([a], k=2, round=0), Pool([f, a], k=2, round=1), Pool([f, a], k=2, round=2),
             Pool([e, g], k=2, round=3)]
    proposals = [
        [call(0, "S", "A", ["p1", "p2"], [0.0, 0.5], [1.0, 1.0], accepted=True, in_pool=True, first=True),
         call(1, "S", "B", ["p3"], [0.25], [0.75], accepted=True),
         call(2, "A", "C", ["p1", "p2"], [1.0, 0.0], [0.0, 0.0]),
         call(3, "S", None, [], [], None, note="no JSON <edit>")],
        [call(0, "Z", "F", ["p1"], [0.0], [1.0], accepted=True, in_pool=True, round_index=1, first=True)],
        [],
    ]
    spec = RunSpec("toys", "fst", "toy-s0", ("toy",) * 4, 0, shared="toys/fst/first-s0")
    for c, pool in enumerate(pools):
        out = Path(cycle_dir(spec, c, str(tmp_path)))
        pool.to_json(out / "pool.json")
        if c < len(proposals):
            (out / "fast").mkdir()
            (out / "fast" / "proposals.json").write_text(json.dumps(proposals[c]))
    return spec, h


def test_the_pool_report_names_each_context_by_its_id_and_each_score_as_gepa_compared_them(tmp_path: Path) -> None:
    """`pool_evolution_html` on hand-made pools and proposals: a parent by its pool id (a seed's
    `seed-`, a context from before the round's files `carried-`, not its bare hash), the
    search score to three places, a proposal's minibatch means (parent → child) over its
    problems, its verdict (a note on why nothing was proposed), text and feedback for each
    accepted child (kept in the pool or not), each cycle's counts of proposals and acceptances,
    and texts escaped (a context names its <answer> tags). Only the report of a real round was
    tested, where these agree with other readings of the files."""
    from fastslow.experiments import RunSpec
    from fastslow.pools import pool_evolution_html

    spec, h = _report_run(tmp_path)
    rl = RunSpec("toys", "rl", "toy-s0", ("toy",), 0)  # no pools: not in the report
    page = pool_evolution_html({spec.key: spec, rl.key: rl}, "toys", str(tmp_path))
    a, s = f"r0-{h['A'][:8]}", f"seed-{h['S'][:8]}"
    assert "<h3>toys/fst/toy-s0 (the same run as toys/fst/first-s0)</h3>" in page and "toys/rl" not in page
    assert (f"<h4>cycle 0: best context {a} (search score 0.750; 1 distinct in 2 slots; 3 proposed, "
            "2 accepted)</h4>") in page
    assert f"<tr><td>{a}</td><td>0</td><td>{s}</td><td>0.750</td><td>42</td></tr>" in page
    assert f"<tr><td>0</td><td>reflection</td><td>{s}</td><td>0.25 → 1.00 (2)</td><td>accepted, in the pool</td>" in page
    assert f"<tr><td>1</td><td>reflection</td><td>{s}</td><td>0.25 → 0.75 (1)</td><td>accepted</td><td><details>" in page
    assert f"<tr><td>2</td><td>reflection</td><td>{a}</td><td>0.50 → 0.00 (2)</td><td>rejected</td><td></td></tr>" in page
    assert (f"<tr><td>3</td><td>—</td><td>{s}</td><td>n/a → n/a (0)</td>"
            "<td>no proposal (no JSON &lt;edit&gt;)</td><td></td></tr>") in page
    assert page.count("<details>") == 3  # A and B in cycle 0, F in cycle 1
    assert page.count("<li><b>p1</b> (reward 0.5): wrong &lt;b&gt;</li>") == 3
    assert f"<td>carried-{h['Z'][:8]}</td>" in page and f"parent carried-{h['Z'][:8]}" in page
    assert f"<td>r3-{h['E'][:8]}</td><td>3</td><td>r3-{h['G'][:8]}</td><td>1.000</td>" in page
    assert f"<td>r3-{h['G'][:8]}</td><td>3</td><td>r1-{h['F'][:8]}</td><td>n/a</td>" in page
    assert "<answer>" not in page and page.count("&lt;answer&gt;") >= 2


def test_the_pool_report_diffs_a_new_best_context_against_its_parent_and_marks_a_kept_one_unchanged(
        tmp_path: Path) -> None:
    """A best context born in the cycle's round is diffed against its parent, whose text comes
    from the proposal that first used it (S, which left the pool), from an earlier proposal
    (Z) or from the pool itself (G, with no proposals file); a best carried from the last cycle
    (F in cycle 2, its parent's text known) is the last best, unchanged, not diffed against its
    parent again. A diff reads from the parent to the child: what the child added is green."""
    from fastslow.pools import pool_evolution_html

    spec, h = _report_run(tmp_path)
    page = pool_evolution_html({spec.key: spec}, "toys", str(tmp_path))
    labels = [f"parent seed-{h['S'][:8]}", f"parent carried-{h['Z'][:8]}", f"parent r3-{h['G'][:8]}"]
    assert [page.count(label) for label in labels] == [1, 1, 1] and page.count('<table class="diff"') == 3
    cycle0 = page[page.index("<h4>cycle 0:"):page.index("<h4>cycle 1:")]  # the line A added to S, on its side
    assert '<span class="diff_add">Put&nbsp;the&nbsp;result&nbsp;in&nbsp;&lt;answer&gt;&nbsp;tags.</span>' in cycle0
    cycle2 = page[page.index("<h4>cycle 2:"):page.index("<h4>cycle 3:")]
    assert "<p><i>unchanged</i></p><pre>Think first.\nPut the result in &lt;answer&gt; tags.</pre>" in cycle2
    assert '<table class="diff"' not in cycle2 and "<table class='pool'><tr><th>call" not in cycle2


def test_the_search_says_how_much_budget_it_has_used_and_how_long_the_rest_takes(monkeypatch) -> None:
    """A line before each search iteration: its number, the metric calls used of the budget, and
    at most how long the rest takes at the rate since the search began (a paper-scale round of
    960 calls had said nothing of its budget until it ended)."""
    from fastslow.fast import round as round_module

    clock = iter([100.0, 103.0, 109.0])
    monkeypatch.setattr(round_module.time, "perf_counter", lambda: next(clock))
    calls = iter([10, 16, 28, 36])
    lines: list[str] = []
    guard = round_module.BudgetGuard(40, 6, lambda: next(calls), log=lines.append)
    assert [guard(None) for _ in range(4)] == [False, False, False, True]
    assert lines == ["fast round: search iteration 1, 10/40 metric calls",
                     "fast round: search iteration 2, 16/40 metric calls, at most ~12s left",  # 3 s for 6 calls
                     "fast round: search iteration 3, 28/40 metric calls, at most ~6s left",  # 9 s for 18
                     "fast round stops (budget: 36 used, next iteration may need 6 of 40)"]


class RecordTexts(CountingProposer):
    """CountingProposer that also keeps every record's shown completion."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: list[str] = []

    def __call__(self, candidate: dict[str, str], dataset: Any, components: list[str]) -> dict[str, str]:
        self.shown += [r["Generated Outputs"] for name in components for r in dataset.get(name, [])]
        return super().__call__(candidate, dataset, components)


def test_the_round_shows_the_reflection_whole_completions_when_configured(tmp_path: Path) -> None:
    """`fast.reflection.max_record_chars: null` (paper.yaml) reaches the round's records: 6000-
    character traces are shown whole; with the key left out (4000) they are clipped, the
    omission said."""
    from fastslow.fast.testing import LongTraceGenerator

    shown = {}
    for name, extra in (("whole", {"max_record_chars": None}), ("left out", {})):
        cfg = FastConfig(pool_size=1, max_metric_calls=24, minibatch_size=2, proposer="reflective",
                         reflection={"kind": "hf", "path": "m", **extra})
        proposer = RecordTexts()
        run_round(Pool.seed(SEEDS[0], 1), LongTraceGenerator(6000, offset=1), TASK, TRAIN, VAL, cfg, 0,
                  tmp_path / name.replace(" ", "_"), log=quiet, proposer=proposer)
        assert proposer.calls >= 1 and proposer.shown, name
        shown[name] = proposer.shown
    assert {len(t) for t in shown["whole"]} == {6000}
    assert all("characters omitted" in t and len(t) <= 4000 + 60 for t in shown["left out"])


def test_gepa_log_lines_show_control_characters_escaped(caplog) -> None:
    """gepa logs a reflection model's whole proposal: its terminal escape sequences reached the
    job's log as they were, run by the terminal showing it (a cleared screen, a retitled window).
    The whole text goes to the job's log file only (tens of lines a proposal on the console), the
    round's log one line; gepa's "Loading gepa state" (the round's own seeds' state) not at all."""
    from fastslow.fast.round import _GepaLog

    caplog.set_level("INFO", logger="fastslow.fast.round")
    lines: list[str] = []
    gepa = _GepaLog(lines.append)
    gepa.log("Iteration 3: Proposed new text for ctx: Be brief.\x1b[2J\x1b]0;owned\x07\n\tand\x9b exact")
    gepa.log("Loading gepa state from run dir")
    gepa.log("Iteration 3: New subsample score 0.0 is not better than old score 0.0, skipping")
    assert lines == ["gepa: Iteration 3: proposed a new ctx of 35 characters (its text: the job's log file, "
                     "fast/proposals.json)",
                     "gepa: Iteration 3: New subsample score 0.0 is not better than old score 0.0, skipping"]
    (whole,) = caplog.records
    assert whole.getMessage() == ("gepa: Iteration 3: Proposed new text for ctx: Be brief.\\x1b[2J\\x1b]0;owned"
                                  "\\x07\n\tand\\x9b exact")
    assert whole.file_only  # jobs.setup_logging's console leaves it out


def test_no_edit_may_write_the_answer_of_a_problem_the_next_rl_steps_train_on(tmp_path: Path, monkeypatch) -> None:
    """The proposer's private problems are the validation set's and the next RL steps' together:
    with reuse, the RL steps may hold problems the validation set does not (more of them than
    `val_problems`), and an edit writing one's answer into a context would train the step with its
    answer in the prompt. A mutation that kept only the validation set survived the suite."""
    from fastslow.fast import round as round_module

    seen: dict[str, set[str]] = {}
    make = round_module.make_proposer

    def spy(cfg, train, log, task=None, private=(), **kw):
        seen["private"] = set(private)
        return make(cfg, train, log, task, private, **kw)

    monkeypatch.setattr(round_module, "make_proposer", spy)
    step = TRAIN[-4:]  # four RL-step problems; they lead the validation set, which holds two
    cfg = FastConfig(pool_size=2, max_metric_calls=30, minibatch_size=2)
    _, summary = run_round(Pool.seed(SEEDS[:2], 2), ScriptedGenerator(), TASK, TRAIN, VAL[:2], cfg, 0, tmp_path,
                           log=quiet, slow_problems=step, slow_samples=2)
    assert summary["val_problems"] == [p.id for p in step[:2]] and seen["private"] == {p.id for p in step}


def test_a_search_that_charges_nothing_stops_after_patience_iterations() -> None:
    """`fast.max_stalled_iterations`: the guard stops the search after `patience` iterations in a
    row that charged no metric call (every evaluation a free cache hit), since the count it reads
    would never reach the budget then; an iteration that charges one starts the count again.
    Nothing ran the stall stop: a guard that waited one iteration more, or never reset its
    count, passed the suite."""
    from fastslow.fast.round import BudgetGuard

    calls = iter([10, 10, 12, 12, 12, 12])
    lines: list[str] = []
    guard = BudgetGuard(100, 6, lambda: next(calls), patience=3, log=lines.append)
    assert [guard(None) for _ in range(6)] == [False] * 5 + [True]
    assert guard.reason == "stalled: 3 iterations generated nothing"
    assert lines[-1] == "fast round stops (stalled: 3 iterations generated nothing)" and guard.iterations == 5


def test_a_train_split_smaller_than_the_minibatch_makes_the_minibatch_smaller(tmp_path: Path) -> None:
    """The config check cuts fast.minibatch_size to the train problems left beside the validation
    ones (`fast_budget_error`), and so does the round: a budget that pays for a minibatch of the 2
    train problems runs, each proposal reads both, and one below it names the minibatch it used."""
    cfg = FastConfig(pool_size=1, max_metric_calls=16, minibatch_size=3)
    proposer = CountingProposer()
    _, summary = run_round(Pool.seed(SEEDS[1], 1), NeverRight(), TASK, TRAIN[:2], VAL, cfg, 0, tmp_path / "ok",
                           log=quiet, proposer=proposer)
    assert proposer.calls == 1 and proposer.problems == {p.id for p in TRAIN[:2]} and summary["metric_calls"] <= 16
    rows = json.loads((tmp_path / "ok" / "proposals.json").read_text())
    assert [len(r["minibatch"]) for r in rows] == [2]
    cfg = FastConfig(pool_size=1, max_metric_calls=15, minibatch_size=3)
    with pytest.raises(ValueError, match=r"^fast budget 15 metric calls is below one round's minimum 16 \(1 seed "
                                         r"contexts x 6 val problems \+ one iteration of 2 x 2 minibatch \+ 6 val\)"):
        run_round(Pool.seed(SEEDS[1], 1), NeverRight(), TASK, TRAIN[:2], VAL, cfg, 0, tmp_path / "low", log=quiet)


def test_minibatches_draw_from_every_train_problem_when_too_few_lie_outside_validation(tmp_path: Path) -> None:
    """The next RL step's problems lead the validation set; taken from the train problems, they
    may leave fewer than a minibatch outside it (2 of 4 here, minibatch 3): minibatches then come
    from all the train problems, not from the 2 (too few for a minibatch of 3)."""
    cfg = FastConfig(pool_size=1, max_metric_calls=30, minibatch_size=3, prefetch_minibatches=False)
    proposer = CountingProposer()
    _, summary = run_round(Pool.seed(SEEDS[1], 1), NeverRight(), TASK, TRAIN[:4], VAL, cfg, 0, tmp_path, log=quiet,
                           proposer=proposer, slow_problems=TRAIN[:2], slow_samples=2)
    assert summary["val_problems"] == [p.id for p in TRAIN[:2]] + [p.id for p in VAL[:4]]
    assert summary["train_problems"] == 4 and proposer.calls >= 1
    assert proposer.problems <= {p.id for p in TRAIN[:4]}


def test_reuse_tops_the_validation_set_up_when_fewer_problems_are_covered(tmp_path: Path) -> None:
    """The slow loop rolled the seed out on 3 problems: they lead the validation set, which keeps
    its 6 problems, topped up with the first 3 configured ones (the only ones generated for it)."""
    parquet = _rollouts(tmp_path / "rollouts.parquet", SEEDS[0], TRAIN[:3])
    cfg = FastConfig(pool_size=1, max_metric_calls=40, minibatch_size=3, reuse_rollouts=True)
    _, summary = run_round(Pool.seed(SEEDS[0], 1), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path / "r",
                           reuse_rollouts=parquet, log=quiet)
    assert summary["val_problems"] == [p.id for p in TRAIN[:3]] + [p.id for p in VAL[:3]]
    assert summary["seed_generations"] == 3


def test_reused_problems_left_over_that_just_fill_a_minibatch_feed_the_minibatches(tmp_path: Path) -> None:
    """10 reused problems, 6 of them the validation set: the 4 left over fill one minibatch of 4,
    so the minibatches come from them (their rollouts reused, nothing prefetched), as from more."""
    parquet = _rollouts(tmp_path / "rollouts.parquet", SEEDS[0], TRAIN[:10])
    cfg = FastConfig(pool_size=1, max_metric_calls=40, minibatch_size=4, reuse_rollouts=True)
    proposer = CountingProposer()
    _, summary = run_round(Pool.seed(SEEDS[0], 1), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path / "r",
                           reuse_rollouts=parquet, log=quiet, proposer=proposer)
    assert summary["train_problems"] == 4 and summary["prefetched"] == 0
    assert proposer.calls >= 1 and proposer.problems == {p.id for p in TRAIN[6:10]}


def test_an_accepted_child_is_matched_to_the_call_from_its_own_parent() -> None:
    """Two calls of one iteration (proposals_per_iteration > 1) propose the same text from two
    parents; GEPA accepts it as the second parent's child: that call is the accepted one, not the
    first with the same text."""
    from types import SimpleNamespace

    from fastslow.fast.round import RecordedProposer

    child = "Reply with <answer>N</answer>."
    recorded = RecordedProposer(lambda candidate, dataset, components: {"context": child})
    recorded.on_iteration_start({"iteration": 1})
    for parent in SEEDS[:2]:
        recorded({"context": parent}, {"context": []}, ["context"])
    recorded.on_candidate_accepted({"iteration": 1, "new_candidate_idx": 2, "new_score": 2.0, "parent_ids": [1]})
    result = SimpleNamespace(candidates=[{"context": SEEDS[0]}, {"context": SEEDS[1]}, {"context": child}],
                             parents=[[None], [None], [1]])
    assert recorded.accepted_calls(result) == {1: 2}


def test_a_call_that_proposed_nothing_has_no_how_and_only_its_own_note() -> None:
    """A proposal record says how its child was made and why a call made none: a failed call has
    neither a child nor a `how` (the report's "—"), and its note is its own failure; a call that
    proposed after it carries no note (the last failure of an earlier call was shown as its)."""
    from fastslow.fast import ReflectiveProposer
    from fastslow.fast.round import RecordedProposer

    replies = iter([ConnectionError("server gone"), "```\nSolve it. Give the final answer as <answer>N</answer>.\n```"])

    def lm(prompt: Any) -> str:
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        return reply

    recorded = RecordedProposer(ReflectiveProposer(lm, logger=quiet))
    dataset = {"context": [{"Inputs": "What is 1 + 1?", "Generated Outputs": "2", "Feedback": "Wrong format."}]}
    for _ in range(2):
        recorded({"context": SEEDS[0]}, dataset, ["context"])
    failed, made = recorded.calls
    assert (failed["text"], failed["how"], failed["note"]) == (None, None, "ConnectionError: server gone")
    assert made["text"] and made["how"] == "reflection" and made["note"] is None


def test_a_round_of_two_reflection_calls_that_both_raise_fails(tmp_path: Path) -> None:
    """Two calls are enough: a round whose only two reflection calls raised fails as one of
    more calls does (one call alone may be a blip, and only logs)."""
    from fastslow.fast import ReflectiveProposer

    def broken(prompt: Any) -> str:
        raise ConnectionError("reflection server unreachable")

    # 6 seed calls, then a parent on a minibatch of 3 each iteration; the third would pass 23 at worst
    cfg = FastConfig(pool_size=1, max_metric_calls=23, minibatch_size=3, prefetch_minibatches=False)
    proposer = ReflectiveProposer(broken, logger=quiet)
    with pytest.raises(RuntimeError, match=r"^fast round 0: all 2 reflection calls raised"):
        run_round(Pool.seed(SEEDS[0], 1), ScriptedGenerator(), TASK, TRAIN, VAL, cfg, 0, tmp_path, log=quiet,
                  proposer=proposer)
    assert proposer.calls == proposer.raised_calls == 2


def test_the_next_rl_steps_problems_change_nothing_without_samples_for_them(tmp_path: Path) -> None:
    """`slow_problems` with `slow_samples` 0 (no G/K to sample for the step) leave the validation
    set as configured and sample nothing for the slow loop."""
    cfg = FastConfig(pool_size=1, max_metric_calls=30, minibatch_size=3)
    _, s = run_round(Pool.seed(SEEDS[1], 1), NeverRight(), TASK, TRAIN, VAL, cfg, 0, tmp_path, log=quiet,
                     slow_problems=TRAIN[-2:], slow_samples=0)
    assert s["val_problems"] == [p.id for p in VAL] and s["slow_rollouts"] == s["slow_pairs"] == 0
