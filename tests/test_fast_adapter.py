"""The GEPA adapter on the tiny model, its rollout cache, and rollout reuse from Parquet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastslow.fast import FastAdapter, RolloutCache, read_rollouts
from fastslow.fast.adapter import BudgetExceeded
from fastslow.fast.testing import LongTraceGenerator, ScriptedGenerator, ToyTask
from fastslow.model.generation import Generation, SamplingParams
from fastslow.records import ROLLOUT_COLUMNS, context_hash


@pytest.fixture(scope="module")
def tiny_generator(tiny_model_dir: Path) -> Any:
    from fastslow.model.generation import make_generator

    return make_generator("hf", tiny_model_dir, batch_size=4)


class CountingGenerator:
    def __init__(self, inner: Any) -> None:
        self.inner, self.prompts = inner, 0

    def generate(self, conversations, params):  # noqa: ANN001, ANN201 - Generator protocol
        self.prompts += len(conversations)
        return self.inner.generate(conversations, params)

    def render_prompts(self, conversations):  # noqa: ANN001, ANN201
        return self.inner.render_prompts(conversations)


def test_adapter_evaluate_and_reflective_dataset_on_tiny_model(tiny_generator: Any) -> None:
    task = ToyTask()
    problems = task.problems("train", 3, 0)
    gen = CountingGenerator(tiny_generator)
    adapter = FastAdapter(gen, task, SamplingParams(max_new_tokens=8, temperature=1.0, seed=3))
    cand = {"context": "You are a helpful assistant."}

    eb = adapter.evaluate(problems + problems[:1], cand, capture_traces=True)  # a padded minibatch
    assert len(eb.scores) == len(eb.outputs) == len(eb.trajectories) == 4
    assert gen.prompts == 3 and eb.num_metric_calls == 3  # the repeat is generated once
    t = eb.trajectories[0]
    assert t["problem_id"] == problems[0].id and t["context_hash"] == context_hash(cand["context"])
    assert "<|im_start|>system\nYou are a helpful assistant." in t["prompt"]  # full rendered prompt
    assert problems[0].prompt in t["prompt"]
    assert isinstance(t["completion"], str) and "Expected answer: " + problems[0].answer in t["feedback"]
    assert all(0.0 <= s <= 1.0 for s in eb.scores)

    again = adapter.evaluate(problems, cand)  # cached: nothing generated
    assert gen.prompts == 3 and again.num_metric_calls == 0 and again.trajectories is None
    assert again.scores == eb.scores[:3]

    ds = adapter.make_reflective_dataset(cand, eb, ["context"])
    records = ds["context"]
    assert len(records) == 3  # one per distinct problem
    assert {"Inputs", "Generated Outputs", "Feedback", "Score", "problem_id"} <= set(records[0])
    # each record carries its problem's reward (the failures-first order: see the scripted test below)
    assert {r["problem_id"]: r["Score"] for r in records} == {t["problem_id"]: t["reward"] for t in eb.trajectories}

    other = adapter.evaluate(problems[:2], {"context": "Be concise."})
    assert gen.prompts == 5 and other.num_metric_calls == 2


def test_reflective_dataset_puts_failures_first_in_stable_order() -> None:
    """With mixed scores, the records are the failed problems then the solved ones, one per
    problem, each group in the order the problems first appear in the batch (a stable sort)."""
    task, gen = ToyTask(), ScriptedGenerator()
    probs = task.problems("train", 10, 0)
    batch = probs[::-1] + probs[:3]  # ids out of order, padded with repeats as GEPA does
    adapter = FastAdapter(gen, task, SamplingParams(8))
    cand = {"context": "Reply with the sum as <answer>N</answer>."}  # the generator then answers some right
    eb = adapter.evaluate(batch, cand, capture_traces=True)
    first: dict[str, float] = {}
    for p, score in zip(batch, eb.scores, strict=True):
        first.setdefault(p.id, score)
    fails = [pid for pid, score in first.items() if score == 0.0]
    wins = [pid for pid, score in first.items() if score == 1.0]
    assert len(fails) >= 2 and len(wins) >= 2 and len(fails) + len(wins) == len(probs)
    assert list(first) != fails + wins  # the batch is not already in failures-first order

    records = adapter.make_reflective_dataset(cand, eb, ["context"])["context"]
    assert [r["problem_id"] for r in records] == fails + wins
    assert [r["Score"] for r in records] == [0.0] * len(fails) + [1.0] * len(wins)
    assert all(("<answer>" in r["Generated Outputs"]) and r["Feedback"].startswith(
        "Correct" if r["Score"] == 1.0 else "Incorrect") for r in records)


def test_adapter_batch_evaluate_and_hard_cap() -> None:
    task, gen = ToyTask(), ScriptedGenerator()
    probs = task.problems("train", 4, 0)
    adapter = FastAdapter(gen, task, SamplingParams(8), max_metric_calls=5)
    res = adapter.batch_evaluate([({"context": "a"}, probs[:2]), ({"context": "b"}, probs[:2]),
                                  ({"context": "a"}, probs[1:3][:1])])  # a repeat: a cache hit
    assert [r.num_metric_calls for r in res] == [2, 2, 0] and all(r.trajectories for r in res)
    assert gen.calls == 1 and gen.prompts == 4  # both candidates' rollouts in one generate call
    assert res[2].scores == res[0].scores[1:]
    with pytest.raises(BudgetExceeded):
        adapter.evaluate(probs, {"context": "c"})
    assert gen.prompts == 4 and adapter.metric_calls == 4


def test_cache_is_keyed_by_weights_id() -> None:
    task, gen = ToyTask(), ScriptedGenerator()
    probs = task.problems("val", 2, 0)
    cache = RolloutCache()
    FastAdapter(gen, task, SamplingParams(8), weights_id="w0", cache=cache).evaluate(probs, {"context": "x"})
    FastAdapter(gen, task, SamplingParams(8), weights_id="w0", cache=cache).evaluate(probs, {"context": "x"})
    assert gen.prompts == 2
    FastAdapter(gen, task, SamplingParams(8), weights_id="w1", cache=cache).evaluate(probs, {"context": "x"})
    assert gen.prompts == 4 and len(cache) == 4


def write_rollouts(path: Path, rows: list[dict[str, Any]]) -> Path:
    types = {"str": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}
    schema = pa.schema([(c, types[t]) for c, t in ROLLOUT_COLUMNS.items()])
    blank = {"str": "", "bool": False}
    full = [{c: r.get(c, blank.get(ROLLOUT_COLUMNS[c], 0)) for c in ROLLOUT_COLUMNS} for r in rows]
    pq.write_table(pa.Table.from_pylist(full, schema=schema), path)
    return path


def test_rollout_reuse_from_parquet(tmp_path: Path) -> None:
    task, gen = ToyTask(), ScriptedGenerator()
    probs = task.problems("train", 3, 0)
    ctx = "Solve it."
    h = context_hash(ctx)
    rows = [
        {"problem_id": probs[0].id, "context_hash": h, "prompt": "P0", "completion": "<answer>1</answer>",
         "reward": 0.0, "feedback": "Incorrect", "run": "r", "cycle": 0, "step": 3},
        {"problem_id": probs[0].id, "context_hash": h, "prompt": "P0", "completion": f"<answer>{probs[0].answer}</answer>",
         "reward": 1.0, "feedback": "Correct"},
        {"problem_id": probs[1].id, "context_hash": h, "prompt": "P1", "completion": "x", "reward": 1.0,
         "feedback": "Correct"},
        {"problem_id": "not-a-train-problem", "context_hash": h, "prompt": "P", "completion": "x",
         "reward": 1.0, "feedback": "Correct"},
        {"problem_id": probs[2].id, "context_hash": "otherctx", "prompt": "P2", "completion": "x",
         "reward": 1.0, "feedback": "Correct"},
    ]
    rollouts = read_rollouts(write_rollouts(tmp_path / "rollouts.parquet", rows))
    adapter = FastAdapter(gen, task, SamplingParams(8))
    assert adapter.preload(rollouts, {p.id: p for p in probs}) == 3

    eb = adapter.evaluate(probs, {"context": ctx}, capture_traces=True)
    assert gen.prompts == 1  # only probs[2] had no reusable rollout
    assert eb.num_metric_calls == 3 and adapter.reused_calls == 2  # first uses of reused pairs count
    assert adapter.prefetch_used == adapter.slow_used == 0
    again = adapter.evaluate(probs[:2], {"context": ctx})
    assert again.num_metric_calls == 0 and adapter.metric_calls == 3  # then they are cache hits
    assert eb.scores[0] == 0.5 and eb.scores[1] == 1.0  # mean over the G/K rollouts
    assert eb.trajectories[0]["reused"] and eb.trajectories[0]["samples"] == 2
    assert eb.trajectories[0]["completion"] == "<answer>1</answer>"  # the worst one, for reflection
    assert adapter.reused_hits == 4 and adapter.cache_hits == 4
    adapter.evaluate(probs[2:], {"context": ctx})  # a generated pair's cache hit: not a reused one
    assert adapter.reused_hits == 4 and adapter.cache_hits == 5



def test_reused_rollouts_score_with_format_credit_and_reflect_on_the_lowest_reward(tmp_path: Path) -> None:
    """The shipped config sets fast.format_credit 0.5, and reuse had no test with it: a reused
    pair's score must be the mean of the search score of its rollouts, (1 - c) * mean reward +
    c * share of completions with a readable answer, as a generated pair's is, not the mean
    reward. And the trajectory shown to reflection is the lowest-reward rollout, not the first
    row (here a correct one comes first)."""
    task, gen = ToyTask(), ScriptedGenerator()
    probs = task.problems("train", 2, 0)
    ctx = "Solve it."
    h = context_hash(ctx)
    right = f"<answer>{probs[0].answer}</answer>"
    rows = [  # rewards 1, 0, 0; answers readable in 2 of 3
        {"problem_id": probs[0].id, "context_hash": h, "prompt": "P0", "completion": right,
         "reward": 1.0, "feedback": "Correct"},
        {"problem_id": probs[0].id, "context_hash": h, "prompt": "P0", "completion": "I think it is 3.",
         "reward": 0.0, "feedback": "No answer found"},
        {"problem_id": probs[0].id, "context_hash": h, "prompt": "P0", "completion": "<answer>1</answer>",
         "reward": 0.0, "feedback": "Incorrect"},
        {"problem_id": probs[1].id, "context_hash": h, "prompt": "P1", "completion": "no tags", "reward": 1.0,
         "feedback": "Correct"},
    ]
    rollouts = read_rollouts(write_rollouts(tmp_path / "rollouts.parquet", rows))
    c = 0.5
    adapter = FastAdapter(gen, task, SamplingParams(8), format_credit=c)
    assert adapter.preload(rollouts, {p.id: p for p in probs}) == 2
    eb = adapter.evaluate(probs, {"context": ctx}, capture_traces=True)
    assert gen.prompts == 0
    assert eb.scores[0] == pytest.approx((1 - c) * (1 / 3) + c * (2 / 3))  # 0.5, not the mean reward 1/3
    assert eb.scores[1] == pytest.approx((1 - c) * 1.0)  # right, but nothing readable: no credit
    worst = eb.trajectories[0]
    assert worst["completion"] == "I think it is 3." and worst["reward"] == 0.0
    assert worst["feedback"] == "No answer found" and worst["parsed_answer"] is None


class AlternatingGenerator:
    """A fake `Generator` answering in tags, right and wrong in turn over every sequence it
    writes (with stand-in token ids): samples of one (context, problem) pair differ."""

    def __init__(self) -> None:
        self.sequences = 0

    def generate(self, conversations, params):  # noqa: ANN001, ANN201 - Generator protocol
        from fastslow.model.generation import Generation

        out = []
        for conv in conversations:
            nums = [int(t) for t in conv[-1]["content"].replace("?", " ").split() if t.isdigit()]
            answer = sum(nums[:2]) + self.sequences % 2  # even sequences right, odd ones 1 off
            self.sequences += 1
            text = f"<answer>{answer}</answer>"
            out.append(Generation(text=text, prompt_tokens=3, completion_tokens=3, prompt_ids=(1, 2, 3),
                                  completion_ids=tuple(map(ord, text))))
        return out


def test_a_pair_sampled_several_times_for_the_slow_loop_scores_the_samples_mean() -> None:
    """A pair the slow loop's next step trains on is sampled G/K times in the validation call;
    its search score is the mean of its samples' scores (the docstring and the round test say
    so, nothing checked it: scoring only the first sample went unnoticed, since the scripted
    generator samples a pair the same way every time)."""
    task, gen = ToyTask(), AlternatingGenerator()
    val = task.problems("val", 3, 1)
    c = 0.5
    adapter = FastAdapter(gen, task, SamplingParams(8), format_credit=c)
    adapter.feed_slow(val[:2], 3, [p.id for p in val])  # 3 samples of each of the step's 2 problems
    eb = adapter.evaluate(val, {"context": "Solve."}, capture_traces=True)
    assert gen.sequences == 3 + 3 + 1
    sampled = adapter.cache.sampled(["Solve."], val, "base")
    h = context_hash("Solve.")
    rewards = [[r["reward"] for r in sampled[(h, p.id)]] for p in val[:2]]
    assert rewards == [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]  # samples of one pair differ
    # every answer is readable: a sample scores c + (1 - c) * reward, the pair their mean
    assert eb.scores == pytest.approx([c + (1 - c) * 2 / 3, c + (1 - c) / 3, c + (1 - c) * 1.0])
    assert [t["samples"] for t in eb.trajectories] == [3, 3, 1]
    assert [t["reward"] for t in eb.trajectories] == [0.0, 0.0, 1.0]  # reflection sees the worst sample
    # and all of it: its feedback and its answer (the first sample of val[0] was right)
    assert [t["feedback"].startswith("Incorrect") for t in eb.trajectories] == [True, True, False]
    assert [t["parsed_answer"] for t in eb.trajectories[:2]] == [str(int(p.answer) + 1) for p in val[:2]]
    assert "rollouts" not in eb.trajectories[2]  # not a step problem: no tokens kept for training


def test_rollouts_without_token_ids_are_not_offered_to_the_slow_loop() -> None:
    """`RolloutCache.sampled` serves a pair to the trainer only if every one of its rollouts has
    prompt and completion token ids (the trainer trains on the ids; a backend may not report
    them). Nothing checked that: without the check, id-less rollouts were handed over."""
    from fastslow.fast.adapter import Scored

    task = ToyTask()
    val = task.problems("val", 2, 1)
    adapter = FastAdapter(LongTraceGenerator(200), task, SamplingParams(8))  # reports no token ids
    adapter.feed_slow(val, 2, [p.id for p in val])
    adapter.evaluate(val, {"context": "Solve."})
    h = context_hash("Solve.")
    assert [len(adapter.cache.get(h, p.id, "base").trajectory["rollouts"]) for p in val] == [2, 2]
    assert adapter.cache.sampled(["Solve."], val, "base") == {}
    # one rollout of a pair without ids is enough to keep the pair out
    cache = RolloutCache()
    full = {"prompt_ids": (1,), "completion_ids": (2,), "logprobs": (-0.1,), "reward": 1.0}
    cache.put(h, val[0].id, "w", Scored(1.0, {"rollouts": [full, full]}))
    cache.put(h, val[1].id, "w", Scored(1.0, {"rollouts": [full, {**full, "completion_ids": ()}]}))
    assert list(cache.sampled(["Solve."], val, "w")) == [(h, val[0].id)]

def test_rollouts_generated_ahead_share_the_call_and_count_when_first_used() -> None:
    task, gen = ToyTask(), ScriptedGenerator()
    val, train = task.problems("val", 4, 1), task.problems("train", 6, 0)
    adapter = FastAdapter(gen, task, SamplingParams(8), batch_size=16, max_metric_calls=8)
    ctx = {"context": "Solve it."}
    [eb] = adapter.evaluate_many([(ctx, val)], ahead=[(ctx, train), (ctx, val[:2])])
    assert gen.calls == 1 and gen.prompts == 10  # 4 requested + 6 ahead, one generate call
    assert eb.num_metric_calls == 4 and adapter.metric_calls == 4 and adapter.prefetched == 6
    mb = adapter.evaluate(train[:3], ctx, capture_traces=True)  # served from the prefetched ones
    assert gen.calls == 1 and mb.num_metric_calls == 3 and adapter.metric_calls == 7
    assert adapter.prefetch_used == 3 and mb.trajectories[0]["prefetched"]
    assert adapter.reused_calls == adapter.slow_used == 0  # the first uses were of prefetched rollouts only
    assert adapter.evaluate(train[:3], ctx).num_metric_calls == 0 and adapter.metric_calls == 7
    # The hard cap counts rollouts on request only: 6 prefetched fit beside a cap of 8.
    other = {"context": "Think."}
    with pytest.raises(BudgetExceeded):
        adapter.evaluate(train[3:5], other)  # 7 + 2 > 8


def test_generate_calls_are_even_not_a_full_call_and_a_tail() -> None:
    task, gen = ToyTask(), ScriptedGenerator()
    sizes = []
    orig = gen.generate
    gen.generate = lambda convs, params: (sizes.append(len(convs)), orig(convs, params))[1]
    adapter = FastAdapter(gen, task, SamplingParams(8), batch_size=16)
    adapter.evaluate(task.problems("val", 18, 1), {"context": "Solve it."})
    assert sizes == [9, 9]


def test_read_rollouts_rejects_wrong_schema(tmp_path: Path) -> None:
    pq.write_table(pa.table({"problem_id": ["a"], "reward": [1.0]}), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="context_hash"):
        read_rollouts(tmp_path / "bad.parquet")


def test_format_credit_shapes_the_search_score() -> None:
    task = ToyTask()
    probs = task.problems("train", 4, 0)
    plain = FastAdapter(ScriptedGenerator(), task, SamplingParams(8), format_credit=0.2)
    prose = plain.evaluate(probs, {"context": "Solve."}, capture_traces=True)
    assert prose.scores == [0.0] * 4  # no tags: nothing readable
    tagged = plain.evaluate(probs, {"context": "Use <answer>1</answer>."}, capture_traces=True)
    for s, t in zip(tagged.scores, tagged.trajectories, strict=True):
        assert s == pytest.approx(0.2 + 0.8 * t["reward"]) and t["parsed_answer"] is not None
    assert [o["completion"] for o in tagged.outputs] == [t["completion"] for t in tagged.trajectories]

    class Echo:  # the prompt's format sentence echoed: an empty block, no answer
        def generate(self, conversations, params):
            return [Generation(text="Answer inside <answer></answer> tags.", prompt_tokens=5, completion_tokens=8)
                    for _ in conversations]

    echoed = FastAdapter(Echo(), task, SamplingParams(8), format_credit=0.2).evaluate(
        probs, {"context": "Solve."}, capture_traces=True)
    assert echoed.scores == [0.0] * 4 and [t["parsed_answer"] for t in echoed.trajectories] == [""] * 4


def test_reflective_record_keeps_the_head_and_the_tail_of_a_long_completion() -> None:
    """A 6000-character trace ending in its answer: the record shows its start, its end with
    "<answer>42</answer>", and how much was left out in between; the full completion's parsed
    answer comes along."""
    from fastslow.fast.adapter import MAX_RECORD_COMPLETION_CHARS
    from fastslow.tasks.base import ANSWER_FORMAT, Problem

    task = ToyTask()
    problem = Problem(id="p", task="toy", prompt=f"What is 40 + 2?\n{ANSWER_FORMAT}", answer="42")
    adapter = FastAdapter(LongTraceGenerator(6000), task, SamplingParams(8))
    eb = adapter.evaluate([problem], {"context": "Solve."}, capture_traces=True)
    assert len(eb.trajectories[0]["completion"]) == 6000 and eb.scores == [1.0]
    shown = adapter.make_reflective_dataset({"context": "Solve."}, eb, ["context"])["context"][0]
    out = shown["Generated Outputs"]
    assert out.endswith("So the sum is final. <answer>42</answer>")
    assert out.startswith("Let me think step by step.")
    assert "characters omitted" in out and len(out) <= MAX_RECORD_COMPLETION_CHARS + 60
    assert shown["parsed_answer"] == "42"


def test_reflection_reads_whole_completions_when_max_record_chars_is_null() -> None:
    """The paper's reflection reads a rollout's full text; every record was cut to 4000
    characters, most of a paper-scale thinking trace. `fast.reflection.max_record_chars` sets the
    limit for the reflective proposer (null: whole), through `FastConfig.record_chars` into the
    adapter; the offline proposer keeps 4000."""
    from fastslow.fast import FastConfig
    from fastslow.fast.adapter import MAX_RECORD_COMPLETION_CHARS
    from fastslow.tasks.base import ANSWER_FORMAT, Problem

    problem = Problem(id="p", task="toy", prompt=f"What is 40 + 2?\n{ANSWER_FORMAT}", answer="42")
    reflective = {"proposer": "reflective", "reflection": {"kind": "hf", "path": "m"}}
    whole = FastConfig.from_dict({**reflective, "reflection": {"kind": "hf", "path": "m", "max_record_chars": None}})
    assert whole.record_chars is None
    assert FastConfig.from_dict({**reflective, "reflection": {"kind": "hf", "path": "m",
                                                              "max_record_chars": 500}}).record_chars == 500
    assert FastConfig.from_dict(reflective).record_chars == MAX_RECORD_COMPLETION_CHARS
    assert FastConfig.from_dict({"reflection": {"max_record_chars": None}}).record_chars == MAX_RECORD_COMPLETION_CHARS
    with pytest.raises(ValueError, match=r"fast.reflection.max_record_chars must be an integer >= 200 or null"):
        FastConfig.from_dict({**reflective, "reflection": {"kind": "hf", "path": "m", "max_record_chars": 50}})

    for chars, length in ((None, 6000), (500, None)):
        adapter = FastAdapter(LongTraceGenerator(6000), ToyTask(), SamplingParams(8), record_chars=chars)
        eb = adapter.evaluate([problem], {"context": "Solve."}, capture_traces=True)
        out = adapter.make_reflective_dataset({"context": "Solve."}, eb, ["context"])["context"][0]["Generated Outputs"]
        if length:
            assert out == eb.trajectories[0]["completion"] and len(out) == length
        else:
            assert "characters omitted" in out and len(out) <= 500 + 60 and out.endswith("<answer>42</answer>")


def test_the_longest_context_a_reflection_may_propose_is_a_setting_the_proposer_gets() -> None:
    """`fast.reflection.max_context_chars` reaches the reflective proposer's junk check; left
    out, 8000 characters; a bad value is one line naming it."""
    import fastslow.fast.round as round_module
    from fastslow.fast import FastConfig
    from fastslow.fast.proposers import MAX_CONTEXT_CHARS
    from fastslow.fast.round import make_proposer

    reflective = {"proposer": "reflective", "reflection": {"kind": "hf", "path": "m"}}
    cfg = FastConfig.from_dict(reflective)
    assert cfg.context_chars == MAX_CONTEXT_CHARS == 8000
    cfg = FastConfig.from_dict({**reflective, "reflection": {"kind": "hf", "path": "m", "max_context_chars": 3000}})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(round_module, "build_reflection_lm", lambda settings, seed: lambda prompt: "")  # no model
        assert make_proposer(cfg, [], None).max_chars == 3000
    for bad in (50, "many", True):
        with pytest.raises(ValueError, match=rf"fast.reflection.max_context_chars must be an integer >= 100, got {bad!r}"):
            FastConfig.from_dict({**reflective, "reflection": {"kind": "hf", "path": "m", "max_context_chars": bad}})



def test_clip_middle_keeps_a_long_final_answer_block_whole() -> None:
    from fastslow.fast.adapter import clip_middle

    assert clip_middle("short", 100) == "short"
    text = "a" * 5000 + "<answer>" + "b" * 60 + "</answer>"
    clipped = clip_middle(text, 100)
    assert clipped.startswith("a") and clipped.endswith("<answer>" + "b" * 60 + "</answer>")
    assert "[… " in clipped and len(clipped.split("\n")[0]) + len(clipped.split("\n")[-1]) <= 100
    plain = clip_middle("x" * 1000 + "y" * 1000, 100)
    assert plain == "x" * 40 + "\n[… 1900 characters omitted …]\n" + "y" * 60
    # the block kept whole right where the head ends, and at the most the budget allows it (80 of 100)
    block = "<answer>" + "b" * 50 + "</answer>"
    assert clip_middle("a" * 40 + block, 100) == "a" * 33 + "\n[… 7 characters omitted …]\n" + block
    block = "<answer>" + "b" * 63 + "</answer>"
    assert clip_middle("a" * 1000 + block, 100) == "a" * 20 + "\n[… 980 characters omitted …]\n" + block


def test_a_long_problem_and_a_long_expected_answer_are_bounded_in_a_reflective_record() -> None:
    """A 50,000-character document task: the record's Inputs were the whole problem (the record
    limit bounded completions only), so a small reflection model's context overflowed and every
    call gave no proposal. Now Inputs keep the document's start and the question at its end; the
    feedback quotes a long multi-line expected answer on one bounded line (its lines had read
    as rules to the offline proposer)."""
    from fastslow.fast.adapter import MAX_RECORD_COMPLETION_CHARS
    from fastslow.tasks.base import (
        ANSWER_FORMAT,
        EXPECTED_CHARS,
        Judgement,
        Problem,
        render_feedback,
    )

    doc = "Document. " + "filler text " * 4200
    problem = Problem(id="p", task="toy", prompt=f"{doc}\nWhat is 40 + 2?\n{ANSWER_FORMAT}", answer="42")
    assert len(problem.prompt) > 50_000
    adapter = FastAdapter(LongTraceGenerator(600), ToyTask(), SamplingParams(8))
    eb = adapter.evaluate([problem], {"context": "Solve."}, capture_traces=True)
    shown = adapter.make_reflective_dataset({"context": "Solve."}, eb, ["context"])["context"][0]["Inputs"]
    assert len(shown) <= MAX_RECORD_COMPLETION_CHARS + 60 and "characters omitted" in shown
    assert shown.startswith("Document. ") and shown.endswith(f"What is 40 + 2?\n{ANSWER_FORMAT}")

    expected = "first  line\nsecond line\r\n" + "x" * 5000
    text = render_feedback(Judgement(0.0, expected, "y", []), [])
    line = next(li for li in text.splitlines() if li.startswith("Expected answer: "))
    # its lines joined, its other spacing kept (an exact answer's "a  b" is not "a b")
    assert line.startswith("Expected answer: first  line second line xxx") and "5,0" in line
    assert len(line) <= len("Expected answer: ") + EXPECTED_CHARS and "\nsecond line" not in text


def test_clip_middle_keeps_a_text_of_exactly_the_limit_whole_and_cuts_from_the_last_answer_tag() -> None:
    """A completion of exactly `max_chars` is shown whole; a long one whose working holds an
    earlier <answer> draft keeps its final block, whatever the tag's case (the tasks read tags
    case-insensitively)."""
    from fastslow.fast.adapter import clip_middle

    assert clip_middle("x" * 100, 100) == "x" * 100
    final = "<answer>" + "b" * 60 + "</answer>"
    drafted = "a" * 50 + "<answer>1</answer>" + "a" * 5000 + final
    assert clip_middle(drafted, 100).endswith("\n" + final)
    shouted = "a" * 5000 + final.upper()
    assert clip_middle(shouted, 100).endswith("\n" + final.upper())


def test_a_carried_cache_keeps_only_the_paid_evaluations_of_its_weights_as_plain_entries() -> None:
    """`carried` is what the next round on the same frozen weights starts from: the entries of
    those weights that a round paid for, without token ids and with the reuse, prefetch and
    slow-loop flags cleared (a flag left on charged the entry again when first served)."""
    from fastslow.fast.adapter import Scored

    tokens = [{"prompt_ids": (1,), "completion_ids": (2,), "logprobs": (-0.1,), "reward": 1.0}]
    cache = RolloutCache()
    cache.put("h", "p0", "w", Scored(0.5, {"completion": "a", "reused": True, "prefetched": True,
                                          "for_slow": True, "charged": True, "rollouts": tokens}))
    cache.put("h", "p1", "w", Scored(1.0, {"completion": "b", "prefetched": True, "charged": False}))  # never served
    cache.put("h", "p2", "w", Scored(0.0, {"completion": "c"}))  # read from a file written before the mark
    cache.put("h", "p0", "other", Scored(1.0, {"completion": "d", "charged": True}))
    carried = cache.carried("w")
    assert sorted(carried.entries) == [("h", "p0", "w"), ("h", "p2", "w")]
    assert carried.get("h", "p0", "w").score == 0.5
    assert carried.get("h", "p0", "w").trajectory == {"completion": "a", "charged": True, "reused": False,
                                                      "prefetched": False, "for_slow": False}
    assert cache.get("h", "p0", "w").trajectory["rollouts"] == tokens  # the cache itself is left as it was


def test_a_chain_of_cache_files_holds_each_rounds_new_evaluations_and_reads_after_its_directory_moved(
        tmp_path: Path) -> None:
    """Each cycle's file holds only the evaluations it did not read from the earlier files, and
    names those by paths relative to its own directory, so a run directory copied elsewhere
    still reads; where a key is in two files, the newest one's evaluation is taken."""
    from fastslow.fast.adapter import Scored

    run = tmp_path / "run"
    first, second = run / "c0" / "fast_cache.json", run / "c1" / "fast_cache.json"
    first.parent.mkdir(parents=True)
    second.parent.mkdir()
    RolloutCache({("h", "p", "w"): Scored(0.25, {"completion": "old"})}).to_json(first, "w")
    cache, files = RolloutCache.from_chain(first)
    read = set(cache.entries)
    cache.put("h", "q", "w", Scored(1.0, {"completion": "new"}))
    assert cache.to_json(second, "w", skip=read, earlier=files) == 1
    assert [e["problem_id"] for e in json.loads(second.read_text())["entries"]] == ["q"]
    RolloutCache({("h", "p", "w"): Scored(0.75, {"completion": "redone"})}).to_json(run / "c1" / "newer.json", "w",
                                                                                  earlier=[first])
    run.rename(tmp_path / "moved")
    moved = tmp_path / "moved"
    cache, files = RolloutCache.from_chain(moved / "c1" / "fast_cache.json")
    assert files == [moved / "c0" / "fast_cache.json", moved / "c1" / "fast_cache.json"]
    assert {k: v.score for k, v in cache.entries.items()} == {("h", "p", "w"): 0.25, ("h", "q", "w"): 1.0}
    assert RolloutCache.from_chain(moved / "c1" / "newer.json")[0].get("h", "p", "w").score == 0.75


def test_rollouts_without_prompt_token_ids_are_not_offered_to_the_slow_loop() -> None:
    from fastslow.fast.adapter import Scored

    [p] = ToyTask().problems("val", 1, 0)
    cache = RolloutCache()
    rollout = {"prompt_ids": (1,), "completion_ids": (2,), "logprobs": (-0.1,), "reward": 1.0}
    cache.put(context_hash("Solve."), p.id, "w", Scored(1.0, {"rollouts": [{**rollout, "prompt_ids": ()}]}))
    assert cache.sampled(["Solve."], [p], "w") == {}
    cache.put(context_hash("Solve."), p.id, "w", Scored(1.0, {"rollouts": [rollout]}))
    assert cache.sampled(["Solve.", "Solve."], [p], "w") == {(context_hash("Solve."), p.id): [rollout]}


class RecordingGenerator(ScriptedGenerator):
    """A `ScriptedGenerator` that keeps the sampling parameters of each call."""

    def __init__(self) -> None:
        super().__init__()
        self.params: list[SamplingParams] = []

    def generate(self, conversations, params):  # noqa: ANN001, ANN201 - Generator protocol
        self.params.append(params)
        return super().generate(conversations, params)


def test_each_generate_call_samples_with_its_own_seed_derived_from_the_sampling_seed() -> None:
    """Distinct calls must not share one random stream: call i samples with
    `derive_seed(seed, i)`, the other settings as given."""
    from fastslow.model.generation import derive_seed

    gen = RecordingGenerator()
    adapter = FastAdapter(gen, ToyTask(), SamplingParams(8, 0.7, 0.9, seed=5), batch_size=2)
    adapter.evaluate(ToyTask().problems("val", 4, 0), {"context": "Solve."})
    adapter.evaluate(ToyTask().problems("train", 1, 0), {"context": "Solve."})
    assert gen.params == [SamplingParams(8, 0.7, 0.9, derive_seed(5, i)) for i in range(3)]


def test_a_generator_returning_too_few_completions_is_one_error_naming_the_counts() -> None:
    class Short(ScriptedGenerator):
        def generate(self, conversations, params):  # noqa: ANN001, ANN201 - Generator protocol
            return super().generate(conversations, params)[:-1]

    adapter = FastAdapter(Short(), ToyTask(), SamplingParams(8))
    with pytest.raises(RuntimeError, match=r"^generator returned 1 completions for 2 prompts$"):
        adapter.evaluate(ToyTask().problems("val", 2, 0), {"context": "Solve."})


def test_a_prompt_the_generator_cannot_render_is_kept_as_its_plain_messages() -> None:
    """The rendered prompt is for the record only: a generator without `render_prompts`, or
    whose rendering fails, gets its trajectories' prompts as the plain role-tagged messages,
    and the evaluation goes on."""

    class Unrenderable(ScriptedGenerator):
        def render_prompts(self, conversations):  # noqa: ANN001, ANN201
            raise RuntimeError("no chat template")

    task = ToyTask()
    [p] = task.problems("val", 1, 0)
    for gen in (ScriptedGenerator(), Unrenderable()):
        eb = FastAdapter(gen, task, SamplingParams(8)).evaluate([p], {"context": "Solve."}, capture_traces=True)
        assert eb.trajectories[0]["prompt"] == f"<system>\nSolve.\n<user>\n{p.prompt}"


def test_rollouts_that_fill_the_cap_exactly_are_generated() -> None:
    task, gen = ToyTask(), ScriptedGenerator()
    probs = task.problems("train", 3, 0)
    adapter = FastAdapter(gen, task, SamplingParams(8), max_metric_calls=4)
    adapter.evaluate(probs[:2], {"context": "a"})
    adapter.evaluate(probs[:2], {"context": "b"})  # 2 + 2 = the cap
    assert adapter.metric_calls == 4 and gen.prompts == 4
    with pytest.raises(BudgetExceeded, match=r"^4 metric calls used, 1 more rollouts would pass the cap of 4$"):
        adapter.evaluate(probs[2:], {"context": "a"})


def test_a_duplicate_problem_id_is_one_error_naming_it() -> None:
    from fastslow.fast.adapter import problems_by_id

    probs = ToyTask().problems("train", 2, 0)
    assert problems_by_id(probs) == {p.id: p for p in probs}
    with pytest.raises(ValueError, match=r"^duplicate problem id 'train-1'$"):
        problems_by_id([*probs, probs[1]])


def test_rollouts_sampled_only_for_the_slow_loop_are_uncharged_until_the_search_uses_them() -> None:
    """A step problem outside the validation set is sampled for the slow loop with each
    validation call: it passes no cap and is not carried to the next frozen round until the
    search is served it, which charges it once."""
    task, gen = ToyTask(), ScriptedGenerator()
    val, step = task.problems("val", 2, 1), task.problems("step", 2, 3)
    ctx = {"context": "Solve it."}
    h = context_hash(ctx["context"])
    adapter = FastAdapter(gen, task, SamplingParams(8), max_metric_calls=2)
    adapter.feed_slow(step, 2, [p.id for p in val])
    adapter.evaluate(val, ctx)  # 2 on request + 2 x 2 for the step, within a cap of 2
    assert gen.prompts == 6 and adapter.metric_calls == 2 and adapter.slow_pairs == 2
    assert sorted(pid for _, pid, _ in adapter.cache.carried("base").entries) == [p.id for p in val]
    assert adapter.evaluate(step, ctx).num_metric_calls == 2 and adapter.slow_used == 2
    assert adapter.evaluate(step, ctx).num_metric_calls == 0 and adapter.metric_calls == 4
    assert sorted(adapter.cache.carried("base").entries) == sorted((h, p.id, "base") for p in val + step)


def test_reused_rollouts_the_search_never_used_are_not_carried() -> None:
    task = ToyTask()
    probs = task.problems("train", 2, 0)
    h = context_hash("Solve it.")
    rows = [{"problem_id": p.id, "context_hash": h, "prompt": "P", "completion": "<answer>1</answer>",
             "reward": 0.0, "feedback": "Incorrect"} for p in probs]
    adapter = FastAdapter(ScriptedGenerator(), task, SamplingParams(8))
    assert adapter.preload(rows, {p.id: p for p in probs}) == 2
    adapter.evaluate(probs[:1], {"context": "Solve it."})
    assert list(adapter.cache.carried("base").entries) == [(h, probs[0].id, "base")]


def test_a_record_without_a_parsed_answer_reads_it_from_its_completion() -> None:
    """Trajectories written before `parsed_answer` was kept (a carried cache file) still give
    the offline proposer the answer read from the completion."""
    from gepa.core.adapter import EvaluationBatch

    traj = {"problem_id": "p", "problem": "What is 1 + 1?", "completion": "So <answer> 2 </answer>",
            "feedback": "Correct", "reward": 1.0}
    eb = EvaluationBatch(outputs=[{}], scores=[1.0], trajectories=[traj])
    adapter = FastAdapter(ScriptedGenerator(), ToyTask(), SamplingParams(8))
    [record] = adapter.make_reflective_dataset({"context": ""}, eb, ["context"])["context"]
    assert record["parsed_answer"] == "2"


def test_the_record_limit_bounds_a_long_problem_as_it_bounds_a_completion() -> None:
    """`record_chars` is the limit for both of a record's long texts: a reflective proposer
    set to 500 characters gets a 2000-character problem cut to 500, not to the default 4000."""
    from fastslow.tasks.base import ANSWER_FORMAT, Problem

    problem = Problem(id="p", task="toy", prompt="Words. " * 300 + f"What is 40 + 2?\n{ANSWER_FORMAT}", answer="42")
    adapter = FastAdapter(LongTraceGenerator(600), ToyTask(), SamplingParams(8), record_chars=500)
    eb = adapter.evaluate([problem], {"context": "Solve."}, capture_traces=True)
    shown = adapter.make_reflective_dataset({"context": "Solve."}, eb, ["context"])["context"][0]["Inputs"]
    assert len(shown) <= 500 + 60 and shown.endswith(f"What is 40 + 2?\n{ANSWER_FORMAT}")


def test_clip_middle_keeps_the_answer_tag_after_a_letter_that_lowercases_to_two() -> None:
    """The last <answer> was looked up in `text.lower()`, whose positions are the text's only
    while no letter lowercases to two characters; "İ" does. After ten of them the tail began ten
    characters late: the record showed "bbb…</answer>" without its opening tag."""
    from fastslow.fast.adapter import clip_middle

    block = "<answer>" + "b" * 50 + "</answer>"
    clipped = clip_middle("İ" * 10 + "a" * 5000 + block, 100)
    assert clipped == "İ" * 10 + "a" * 23 + "\n[… 4977 characters omitted …]\n" + block
