"""The pool of contexts: Pareto selection on hand-made score matrices, pool.json, FastConfig."""

from __future__ import annotations

import json

import pytest

from fastslow.fast import FastConfig, Pool, PoolEntry, select_pareto_pool
from fastslow.records import context_hash


def _m(rows: list[list[float]]) -> list[dict[int, float]]:
    return [dict(enumerate(r)) for r in rows]


def test_pareto_best_aggregate_first_then_cover() -> None:
    # 0 is best on average; 1 alone covers instance 3; 2 alone covers instance 2.
    scores = _m([[1, 1, 0, 0, 1], [0, 0, 0, 1, 0], [0, 1, 1, 0, 0]])
    # After 0, 1 and 2 each cover one new instance; 2 has the higher aggregate.
    assert select_pareto_pool(scores, 3) == [0, 2, 1]
    assert select_pareto_pool(scores, 1) == [0]


def test_pareto_coverage_ties_broken_by_aggregate() -> None:
    # After 0, both 1 and 2 cover the one uncovered instance (3); 2 has the higher aggregate.
    scores = _m([[1, 1, 1, 0], [0, 0, 0, 1], [0, 1, 0, 1]])
    assert select_pareto_pool(scores, 2) == [0, 2]


def test_pareto_greedy_cover_when_front_needs_more_than_k() -> None:
    # Front members 1..4 each own one instance, 4 owns two: greedy takes the widest first.
    scores = _m([
        [0.5, 0.5, 0.5, 0.5, 0.5],
        [1.0, 0.0, 0.0, 0.0, 0.0],
        [0.0, 1.0, 0.0, 0.0, 0.0],
        [0.0, 0.0, 1.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, 1.0, 1.0],
    ])
    assert select_pareto_pool(scores, 2) == [0, 4]


def test_pareto_fills_with_best_remaining_when_front_is_small() -> None:
    # One candidate dominates everywhere; the rest fill by aggregate (ties: lower index).
    scores = _m([[1, 1, 1], [0.5, 0.5, 0], [0.2, 0.2, 0.2], [0.5, 0.5, 0]])
    assert select_pareto_pool(scores, 3) == [0, 1, 3]


def test_pareto_duplicate_texts_counted_once() -> None:
    scores = _m([[1, 0], [1, 0], [0, 1]])
    assert select_pareto_pool(scores, 3, texts=["a", "a", "b"]) == [0, 2]


def test_pareto_missing_scores_count_as_minus_inf() -> None:
    scores = [{0: 0.0, 1: 0.0}, {0: 1.0}]
    assert select_pareto_pool(scores, 1) == [0]  # 1's aggregate is -inf over both instances
    assert select_pareto_pool(scores, 2) == [0, 1]


def test_pareto_edge_cases() -> None:
    assert select_pareto_pool([], 2) == []
    with pytest.raises(ValueError):
        select_pareto_pool(_m([[1]]), 0)


def test_pool_json_round_trip(tmp_path) -> None:
    pool = Pool(entries=[
        PoolEntry(text="Solve it.", born_round=-1, val_scores={"val-0": 1.0, "val-1": 0.0}),
        PoolEntry(text="Solve it.\n\nRules:\n- Be brief.", parent=context_hash("Solve it."),
                  born_round=2, val_scores={"val-0": 0.5}),
    ], k=2, round=2, meta={"summary": {"budget": 48}})
    path = pool.to_json(tmp_path / "sub" / "pool.json")
    raw = json.loads(path.read_text())
    assert raw["entries"][1]["hash"] == context_hash("Solve it.\n\nRules:\n- Be brief.")
    assert raw["entries"][1]["parent"] == context_hash("Solve it.")
    assert raw["entries"][0]["id"].startswith("seed-") and raw["entries"][1]["id"].startswith("r2-")
    back = Pool.from_json(path)
    assert back.to_dict() == pool.to_dict()
    assert back.entries[0].val_mean == 0.5
    assert not list(tmp_path.glob("sub/.pool.*"))  # atomic write left no temp file


def test_pool_hash_is_recomputed_and_bad_files_rejected(tmp_path) -> None:
    d = {"k": 1, "entries": [{"text": "abc", "hash": "stale"}]}
    assert Pool.from_dict(d).entries[0].hash == context_hash("abc")
    with pytest.raises(ValueError, match="no entries"):
        Pool.from_dict({"k": 1, "entries": []})
    with pytest.raises(ValueError, match="format"):
        Pool.from_dict({"format": "other/9", "k": 1, "entries": [{"text": "a"}]})


def test_pool_seed_and_contexts_cycle() -> None:
    pool = Pool.seed(["a", "a", "b"], k=4)
    assert pool.texts == ["a", "b"]
    assert [e.text for e in pool.contexts()] == ["a", "b", "a", "b"]
    with pytest.raises(ValueError):
        Pool.seed([], k=2)


@pytest.mark.parametrize(("texts", "k", "expected"), [
    # k = 0 made a pool without entries, whose contexts() divided by zero
    ("a", 0, "Pool.seed: k: expected an integer >= 1, got 0"),
    ("a", 2.0, "Pool.seed: k: expected an integer >= 1, got 2.0"),
    # an empty context was a pool entry (the config refuses an empty seed_context)
    ("", 2, "Pool.seed: texts: expected non-empty contexts, got ''"),
    (["a", "  "], 2, "Pool.seed: texts: expected non-empty contexts, got '  '"),
])
def test_pool_seed_refuses_an_empty_context_or_no_slots(texts, k, expected) -> None:
    with pytest.raises(ValueError) as info:
        Pool.seed(texts, k)
    assert str(info.value) == expected


def test_fast_config_budget_and_schema_shape() -> None:
    cfg = FastConfig.from_dict({"pool_size": 4, "preset": "full", "max_metric_calls": {"light": 10, "full": 99},
                                "minibatch_size": 2, "val_problems": 8, "proposer": "feedback_editor",
                                "reflection": {"kind": "openai", "timeout_s": 5}, "reuse_rollouts": True})
    assert cfg.budget() == 99 and cfg.pool_size == 4 and cfg.reuse_rollouts
    assert FastConfig(max_metric_calls=7).budget() == 7
    assert FastConfig().budget() == 48
    assert cfg.sampling(5).seed == 5


@pytest.mark.parametrize(("data", "field"), [
    ({"pool_size": 0}, "fast.pool_size"),
    ({"preset": "medium"}, "fast.preset"),
    ({"max_metric_calls": -3}, "fast.max_metric_calls"),
    ({"proposer": "magic"}, "fast.proposer"),
    ({"temperature": -1}, "fast.temperature"),
    ({"bogus": 1}, "fast.bogus"),
    ({"max_metric_calls": {"huge": 5}}, "fast.max_metric_calls.huge"),
    ({"proposer": "reflective", "reflection": {"kind": "openai", "model": "m"}}, "fast.reflection.base_url"),
    ({"proposer": "reflective", "reflection": {"kind": "carrier-pigeon"}}, "fast.reflection.kind"),
    ({"proposer": "reflective", "reflection": {"kind": "hf", "path": "m", "prompt_template": "Improve: <curr_param>"}},
     "fast.reflection.prompt_template: Missing placeholder(s) in prompt template: <side_info>"),
    ({"proposer": "reflective", "reflection": {"kind": "hf", "path": "m", "prompt_template": "Do better."}},
     "Missing placeholder(s) in prompt template: <curr_param>, <side_info>"),
    ({"proposer": "reflective", "reflection": {"kind": "hf", "path": "m", "prompt_template": ["<curr_param>"]}},
     "fast.reflection.prompt_template: expected a string with the placeholders"),
])
def test_fast_config_errors_name_the_field(data: dict, field: str) -> None:
    with pytest.raises(ValueError) as err:
        FastConfig.from_dict(data)
    msg = str(err.value)
    assert field in msg and "\n" not in msg


@pytest.mark.parametrize(("data", "message"), [
    ({"budgets": {"light": 0, "full": 160}}, "fast.budgets must be"),
    ({"max_metric_calls": 0}, "fast.max_metric_calls must be a positive integer or null, got 0"),
    ({"format_credit": 1.0}, "fast.format_credit must be a number in [0, 1), got 1.0"),
    ({"top_p": 0.0}, "fast.top_p must be a number in (0, 1], got 0.0"),
    ({"reuse_in_slow": "yes"}, "fast.reuse_in_slow must be true or false, got 'yes'"),
    ({"prefetch_minibatches": 1}, "fast.prefetch_minibatches must be true or false, got 1"),
    # the kind left out is 'openai', which needs a base_url
    ({"proposer": "reflective", "reflection": {"model": "m"}},
     "fast.reflection.base_url is required when fast.reflection.kind='openai'"),
    ({"proposer": "reflective", "reflection": {"kind": "hf", "path": "m", "max_context_chars": None}},
     "fast.reflection.max_context_chars must be an integer >= 100, got None"),
])
def test_fast_config_refuses_a_bad_value_in_one_line(data: dict, message: str) -> None:
    with pytest.raises(ValueError) as err:
        FastConfig.from_dict(data)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_fast_config_defaults_and_boundary_values() -> None:
    """The toy-scale defaults config/README.md documents, greedy sampling (temperature 0), the
    shortest record a reflection reads, and preset budgets merged key by key."""
    cfg = FastConfig()
    assert (cfg.pool_size, cfg.preset, cfg.minibatch_size, cfg.temperature) == (2, "light", 4, 0.7)
    assert cfg.budgets == {"light": 48, "full": 160}
    assert FastConfig(temperature=0).temperature == 0
    assert FastConfig(proposer="reflective", reflection={"kind": "hf", "path": "m",
                                                         "max_record_chars": 200}).record_chars == 200
    merged = FastConfig.from_dict({"budgets": {"light": 5, "full": 7}, "max_metric_calls": {"full": 9}})
    assert merged.budgets == {"light": 5, "full": 9} and merged.budget() == 5


def test_fast_config_accepts_a_template_with_both_placeholders() -> None:
    cfg = FastConfig(proposer="reflective", reflection={
        "kind": "hf", "path": "m", "prompt_template": "Improve <curr_param> given <side_info>"})
    assert cfg.reflection["prompt_template"].startswith("Improve")


def test_bad_pool_and_loader_inputs_name_the_value() -> None:
    """One line naming what is wrong: the k asked for, and which ids a split holds twice."""
    from fastslow.fast.round import ProblemLoader
    from fastslow.tasks.base import Problem

    with pytest.raises(ValueError, match=r"^k must be >= 1, got 0$"):
        select_pareto_pool([{"a": 1.0}], 0)
    rows = [Problem(i, "t", "q", "a") for i in ("p1", "p2", "p1", "p3", "p2", "p1")]
    with pytest.raises(ValueError, match=r"^duplicate problem ids in the val problems: 'p1', 'p2'$"):
        ProblemLoader(rows, "val")
    many = [Problem(f"p{i}", "t", "q", "a") for i in range(7)] * 2
    with pytest.raises(ValueError, match=r"^duplicate problem ids in the train problems: 'p0', 'p1', 'p2', "
                                         r"'p3', 'p4' and 2 more$"):
        ProblemLoader(many, "train")


def test_an_entrys_id_names_the_round_that_made_it() -> None:
    """`r<round>-<hash>` for a context a round found, round 0's included; `seed-<hash>` only for a
    user-given seed context (born_round -1)."""
    h = context_hash("x")[:8]
    assert PoolEntry(text="x", born_round=0).id == f"r0-{h}"
    assert PoolEntry(text="x", born_round=3).id == f"r3-{h}"
    assert PoolEntry(text="x", born_round=-1).id == f"seed-{h}"


def test_pareto_keeps_a_low_mean_context_that_alone_solves_a_problem() -> None:
    """The second slot goes to the context covering a problem no one else solves (2), not to the
    runner-up by mean score (1), which adds no problem: every earlier matrix ranked its front
    members by mean as well, so a selection by mean alone passed them all."""
    scores = _m([[1, 1, 0], [0.9, 0.9, 0], [0, 0, 1]])
    assert select_pareto_pool(scores, 2) == [0, 2]
    assert select_pareto_pool(scores, 3) == [0, 2, 1]  # the runner-up by mean then fills


def test_pareto_ignores_the_scores_of_a_dropped_duplicate() -> None:
    """A context's second copy (2, same text as 0) is dropped with its scores: its extra
    instance (1) would make every kept context's mean -inf and the first pick the lowest index."""
    scores = [{0: 0.0}, {0: 1.0}, {0: 0.0, 1: 1.0}]
    assert select_pareto_pool(scores, 1, texts=["b", "a", "b"]) == [1]


def test_a_minimal_pool_file_reads_as_a_seed_pool() -> None:
    """A hand-written pool.json with only `k` and texts: round -1 (the seed pool), each entry a
    seed context (born_round -1, id `seed-…`, no parent) with no score yet (val_mean None, not 0)."""
    pool = Pool.from_dict({"k": 2, "entries": [{"text": "a"}]})
    assert pool.round == -1 and pool.meta == {}
    (entry,) = pool.entries
    assert entry.born_round == -1 and entry.id.startswith("seed-") and entry.parent is None
    assert entry.val_scores == {} and entry.val_mean is None


def test_pool_entry_scores_read_as_floats_keyed_by_string() -> None:
    """JSON integers read as float scores, and problem ids as strings (the rollouts' ids)."""
    entry = PoolEntry.from_dict({"text": "a", "val_scores": {0: 1, "p1": 0}})
    assert entry.val_scores == {"0": 1.0, "p1": 0.0}
    assert all(type(v) is float for v in entry.val_scores.values())


def test_an_entrys_hash_follows_its_text() -> None:
    """The hash is the text's, whatever the constructor was given: a stale one, or the old
    text's carried by `dataclasses.replace`."""
    import dataclasses

    assert PoolEntry(text="abc", hash="stale").hash == context_hash("abc")
    edited = dataclasses.replace(PoolEntry(text="abc"), text="abd")
    assert edited.hash == context_hash("abd") and edited.id.endswith(context_hash("abd")[:8])


def test_pool_seed_keeps_the_first_k_distinct_contexts() -> None:
    """More seed contexts than slots: the first K distinct ones, in the order given."""
    assert Pool.seed(["a", "b", "a", "c"], k=2).texts == ["a", "b"]
    assert Pool.seed(["a", "b", "a", "c"], k=3).texts == ["a", "b", "c"]


def test_pareto_a_tie_in_mean_goes_to_the_lower_index_whatever_the_order_of_the_scores() -> None:
    """The same scores on different instances are the same mean: the lower index first. A plain
    sum made 0.3 + 0.2 + 0.1 one bit smaller than 0.1 + 0.2 + 0.3, so the later candidate won
    the first slot, and the fill order, against the documented tie rule."""
    scores = [{0: 0.3, 1: 0.2, 2: 0.1}, {0: 0.1, 1: 0.2, 2: 0.3}]
    assert select_pareto_pool(scores, 1) == [0]
    fill = [{0: 1.0, 1: 1.0, 2: 1.0}, *scores]  # 0 covers everything; 1 and 2 fill, by mean then index
    assert select_pareto_pool(fill, 3) == [0, 1, 2]


def test_a_context_hash_is_the_first_12_hex_digits_of_its_texts_sha256() -> None:
    """Hashes are stored (pools, rollouts, proposals, curves) and compared across runs and
    versions: the same text must keep its hash. A text with a lone surrogate (which Python strings
    can hold) hashes as its own bytes, not as a replacement character other texts share."""
    assert context_hash("abc") == "ba7816bf8f01"  # sha256("abc") = ba7816bf8f01cfea...
    assert context_hash("\ud800x") == "74a7e4a2ddd5" != context_hash("\udfffx")
