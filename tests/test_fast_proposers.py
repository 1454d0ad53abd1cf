"""Proposers: the offline feedback editor on hand-made feedback, and LLM reflection against a
fake OpenAI-compatible server that returns junk, errors, empty text or times out."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fastslow.fast import (
    ContextDoc,
    Demo,
    FastConfig,
    FeedbackEditor,
    Pool,
    ReflectiveProposer,
    build_reflection_lm,
    junk_reason,
    run_round,
)
from fastslow.fast.proposers import (
    FORMAT_RULE_PREFIX,
    boilerplate,
    demo_text,
    mine_rules,
    near_miss_working,
)
from fastslow.fast.testing import LongTraceGenerator, ScriptedGenerator, ToyTask

TASK = ToyTask()
TRAIN = TASK.problems("train", 12, 0)
BY_ID = {p.id: p for p in TRAIN}


def rec(pid: str, score: float, output: str, feedback: str = "") -> dict[str, Any]:
    p = BY_ID[pid]
    return {"Inputs": p.prompt, "Generated Outputs": output, "Score": score, "problem_id": pid,
            "Feedback": feedback or TASK.feedback(p, output)}


def test_context_doc_round_trip() -> None:
    doc = ContextDoc("Solve the problem.", ["Be brief.", "Use integers."],
                     [("What is 1 + 2?", "3"), ("Line one\n\nline two?", "x y")])
    assert ContextDoc.parse(doc.render()) == doc
    plain = ContextDoc.parse("You are a helpful assistant.\nSolve it.")
    assert plain == ContextDoc("You are a helpful assistant.\nSolve it.")
    assert ContextDoc.parse(ContextDoc("", ["r"]).render()) == ContextDoc("", ["r"])


def test_a_long_context_without_answers_parses_in_linear_time() -> None:
    """A context's worked examples were matched by a regex of lazy parts: text with many
    "User:/Assistant:" turns and no complete answer (a reflection model's proposal) took cubic
    time, 26 s at 17k characters (hours at 100k). The examples are now found part by part, to
    the same result as that regex on any text (random texts of its pieces below). In a child
    process, so a regression fails at its timeout instead of stalling the suite."""
    import random
    import re
    import subprocess
    import sys

    from fastslow.fast.proposers import _demos

    probe = ("from fastslow.fast.proposers import ContextDoc, DEMOS_HEADER\n"
             "for unit in ('User: q\\nAssistant: a\\n', 'User: q\\nAssistant: <answer>a\\n',\n"
             "             'User: q\\nAssistant: <answer>', 'User: q\\nAssistant: <answer>a</answer'):\n"
             "    assert ContextDoc.parse('Solve.\\n\\n' + DEMOS_HEADER + '\\n' + unit * 5000).demos == []\n")
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
    regex = re.compile(r"User: (.*?)\nAssistant: (.*?)<answer>(.*?)</answer>", re.DOTALL)
    pieces = ["User: ", "\nAssistant: ", "<answer>", "</answer>", "\n", "\n\n", "x", "2+2", " "]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        assert list(_demos(text)) == regex.findall(text), repr(text)
    text = ("Solve.\n\nWorked examples:\nUser: 2+2?\nAssistant: 2+2=4\n<answer>4</answer>\n\n"
            "User: no answer here\nAssistant: none\n\nUser: x\nAssistant: <answer>y</answer>")
    assert ContextDoc.parse(text).demos == [Demo("2+2?", "4", "2+2=4"), Demo("no answer here", "y", "none\n\nUser: x\nAssistant:")]


def test_demo_text_strips_shared_boilerplate() -> None:
    from fastslow.tasks.base import Problem

    probs = [Problem(f"p{i}", "t", f"Find the path.\nExample: a b\n|{i} {i + 1}| =\n\nWrite labels. <answer></answer>", "x")
             for i in range(3)]
    assert boilerplate([p.prompt for p in probs]) == (2, 2)
    assert demo_text(probs[1], 2, 2) == "|1 2| ="
    assert demo_text(probs[1], 0, 5) == probs[1].prompt.strip()  # nothing left: the full prompt
    assert boilerplate(["one"]) == (0, 0) and boilerplate(["a\nb", "a\nb"]) == (2, 0)
    ed = FeedbackEditor(BY_ID)
    assert ed.demo_text(BY_ID["train-0"]) == BY_ID["train-0"].prompt.split("\n")[0]


def test_format_rule_first_when_parse_failures_dominate() -> None:
    ed = FeedbackEditor(BY_ID, seed=0)
    records = [rec("train-0", 0.0, "It is 5."), rec("train-1", 0.0, "maybe 7"), rec("train-2", 1.0, "<answer>x</answer>")]
    new = ed.edit("Solve the problem.", records)
    doc = ContextDoc.parse(new)
    assert doc.instruction == "Solve the problem." and doc.rules[0].startswith(FORMAT_RULE_PREFIX)
    example = doc.rules[0].split("<answer>")[2].split("</answer>")[0]
    assert example == BY_ID["train-3"].answer  # a real answer's shape, not from the minibatch
    assert not doc.demos


def test_the_format_rule_comes_at_exactly_half_the_failures_unparsed() -> None:
    """"At least half" of the failures unread: two failures, one without an answer, get the
    format rule first. A mutation to "more than half" survived the suite."""
    records = [rec("train-0", 0.0, "It is 5."), rec("train-1", 0.0, "<answer>9</answer>")]
    doc = ContextDoc.parse(FeedbackEditor(BY_ID, seed=0).edit("Solve the problem.", records))
    assert doc.rules and doc.rules[0].startswith(FORMAT_RULE_PREFIX)
    read = [rec("train-0", 0.0, "<answer>4</answer>"), rec("train-1", 0.0, "<answer>9</answer>"),
            rec("train-2", 0.0, "It is 5.")]  # one of three unread: no format rule
    edited = FeedbackEditor(BY_ID, seed=0)
    edited.edit("Solve the problem.", read)
    assert "add-format-rule" not in edited.edits


def test_a_demonstration_is_stale_only_after_two_observations_each_way() -> None:
    """A worked example is dropped as stale when the minibatches scored with it do worse than
    those without it, over at least two observations each: one noisy pair is not evidence. A
    mutation to one observation each survived the suite."""
    ed = FeedbackEditor(BY_ID, seed=0)
    ed.with_demo["k"], ed.without_demo["k"] = [0.2], [0.8]
    assert not ed._stale("k")
    ed.with_demo["k"], ed.without_demo["k"] = [0.2, 0.3], [0.8, 0.7]
    assert ed._stale("k")
    ed.with_demo["k"], ed.without_demo["k"] = [0.9, 0.8], [0.1, 0.2]
    assert not ed._stale("k")


def test_an_echoed_empty_answer_block_is_a_format_failure() -> None:
    """A 135M model often echoes the prompt's "<answer></answer>": no answer was given, so the
    format rule still comes first (it had counted as read, and the rule never came)."""
    from fastslow.fast.proposers import answer_read

    assert not answer_read({"parsed_answer": ""}) and answer_read({"parsed_answer": "7"})
    assert not answer_read({"Generated Outputs": "Put it in <answer></answer>."})
    ed = FeedbackEditor(BY_ID, seed=0)
    echoed = [rec(f"train-{i}", 0.0, "Answer inside <answer></answer> tags.") for i in range(3)]
    doc = ContextDoc.parse(ed.edit("Solve the problem.", echoed))
    assert doc.rules and doc.rules[0].startswith(FORMAT_RULE_PREFIX)


def test_demo_from_earlier_failures_not_the_current_minibatch() -> None:
    ed = FeedbackEditor(BY_ID, seed=1)
    base = ContextDoc("Solve.", [f"{FORMAT_RULE_PREFIX}, for example <answer>1</answer>."]).render()
    ed.edit("Another parent.", [rec("train-5", 0.0, "<answer>0</answer>")])  # banks train-5
    new = ContextDoc.parse(ed.edit(base, [rec("train-6", 0.0, "<answer>0</answer>")]))
    assert new.demos == [Demo(demo_text(BY_ID["train-5"]), BY_ID["train-5"].answer)]
    assert "<answer></answer>" not in new.demos[0][0]  # the format line is stripped from demos
    assert ed.edits[-1].startswith("add-demo:")


def test_no_edit_writes_a_private_problems_answer_into_a_context() -> None:
    """The round's validation problems and the next RL steps' (with reuse, train problems) are
    private: the format rule's example and the demonstrations come from other problems. The
    example was the first answer outside the minibatch, a validation problem's under reuse."""
    records = [rec("train-0", 0.0, "It is 5."), rec("train-1", 0.0, "maybe 7"), rec("train-2", 1.0, "<answer>x</answer>")]
    doc = ContextDoc.parse(FeedbackEditor(BY_ID, seed=0, private={"train-3"}).edit("Solve the problem.", records))
    example = doc.rules[0].split("<answer>")[2].split("</answer>")[0]
    assert example == BY_ID["train-4"].answer != BY_ID["train-3"].answer
    ed = FeedbackEditor(BY_ID, seed=1, private={"train-5"})
    base = ContextDoc("Solve.", [f"{FORMAT_RULE_PREFIX}, for example <answer>1</answer>."]).render()
    ed.edit("Another parent.", [rec("train-5", 0.0, "<answer>0</answer>"), rec("train-7", 0.0, "<answer>0</answer>")])
    new = ContextDoc.parse(ed.edit(base, [rec("train-6", 0.0, "<answer>0</answer>")]))
    assert new.demos == [Demo(demo_text(BY_ID["train-7"]), BY_ID["train-7"].answer)]


def test_a_round_keeps_its_validation_answers_out_of_the_feedback_editors_edits(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """run_round names its validation problems (and the next RL steps') private to the editor."""
    import fastslow.fast.round as round_module

    made = []  # the editors the round really used (not only what it passed make_proposer)
    real = round_module.make_proposer
    monkeypatch.setattr(round_module, "make_proposer",
                        lambda *args, **kwargs: made.append(real(*args, **kwargs)) or made[-1])
    val = TASK.problems("val", 4, 0)
    run_round(Pool.seed(["Solve."], k=1), ScriptedGenerator(), TASK, TRAIN, val,
              FastConfig(pool_size=1, max_metric_calls=20, minibatch_size=2), 0, tmp_path, log=lambda _m: None,
              slow_problems=TRAIN[:1], slow_samples=1)
    assert all(isinstance(p, FeedbackEditor) for p in made)
    assert [set(p.private) for p in made] == [{p.id for p in val[:3]} | {TRAIN[0].id}]


def test_each_round_seeds_its_proposer_anew(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every round's feedback editor drew from random.Random(cfg.seed): each round replayed the
    same rule-or-demonstration coin flips. Now a round's proposer draws from the round's seed, as
    its sampling and minibatches do; a local reflection model samples from it too."""
    import random

    import fastslow.fast.round as round_module
    from fastslow.fast.proposers import build_reflection_lm
    from fastslow.model.generation import derive_seed

    seeds = []
    real = round_module.make_proposer
    monkeypatch.setattr(round_module, "make_proposer",
                        lambda *args, **kwargs: seeds.append(kwargs["seed"]) or real(*args, **kwargs))
    cfg = FastConfig(pool_size=1, max_metric_calls=20, minibatch_size=2, seed=3)
    for r in (0, 1):
        run_round(Pool.seed(["Solve."], k=1), ScriptedGenerator(), TASK, TRAIN, TASK.problems("val", 4, 0), cfg, r,
                  tmp_path / str(r),
                  log=lambda _m: None)
    assert seeds == [derive_seed(3, 0), derive_seed(3, 1)] and seeds[0] != seeds[1]
    editor = real(cfg, TRAIN, lambda _m: None, seed=seeds[1])
    assert editor.rng.getstate() == random.Random(seeds[1]).getstate()
    assert real(cfg, TRAIN, lambda _m: None).rng.getstate() == random.Random(3).getstate()  # no seed: cfg's
    assert build_reflection_lm({"kind": "hf", "path": "unused"}, seed=seeds[1]).seed == seeds[1]


def test_near_miss_working() -> None:
    assert near_miss_working("79 + 32 = 111", "111") == "79 + 32 = 111"
    assert near_miss_working("So 43 + 6 = **49**. Done.", "49") == "So 43 + 6 = **49"
    assert near_miss_working("It is 1111.", "111") is None  # not standalone
    assert near_miss_working("It is 111.5", "111") is None
    assert near_miss_working("It is 112.", "111") is None
    assert near_miss_working("x <answer>5</answer> so 111", "111") is None  # already tagged
    assert near_miss_working("The claim is NOT_SUPPORTED.", "SUPPORTED") is None
    assert near_miss_working("a" * 300 + " 111", "111") is None  # too long for a demonstration
    assert near_miss_working("111", "111") == "111"


def test_near_miss_demonstrated_first_with_its_own_working() -> None:
    ed = FeedbackEditor(BY_ID, seed=1)
    base = ContextDoc("Solve.", [f"{FORMAT_RULE_PREFIX}, for example <answer>1</answer>."]).render()
    right = BY_ID["train-3"].answer
    # Banks train-5 (a plain failure) and then train-3 (right answer, no tags).
    ed.edit("Another parent.", [rec("train-5", 0.0, "<answer>0</answer>"),
                                rec("train-3", 0.0, f"I add them: {right}. Yes.")])
    new = ContextDoc.parse(ed.edit(base, [rec("train-6", 0.0, "<answer>0</answer>")]))
    assert new.demos == [Demo(demo_text(BY_ID["train-3"]), right, f"I add them: {right}")]
    rendered = new.render()
    assert f"Assistant: I add them: {right}\n<answer>{right}</answer>" in rendered
    assert ContextDoc.parse(rendered) == new  # round trip with working


def test_demo_dropped_when_its_own_problem_still_fails() -> None:
    ed = FeedbackEditor(BY_ID, seed=0)
    p = BY_ID["train-4"]
    ctx = ContextDoc("Solve.", [f"{FORMAT_RULE_PREFIX}."], [(demo_text(p), p.answer)]).render()
    new = ContextDoc.parse(ed.edit(ctx, [rec("train-4", 0.0, "<answer>0</answer>")]))
    assert new.demos == [] and ed.edits == [f"drop-demo:{ed.edits[0].split(':')[1]}"]


def test_weakest_demo_replaced_when_full_and_edits_not_repeated() -> None:
    ed = FeedbackEditor(BY_ID, seed=0, max_demos=1)
    p = BY_ID["train-1"]
    ctx = ContextDoc("Solve.", [f"{FORMAT_RULE_PREFIX}."], [(demo_text(p), p.answer)]).render()
    ed.edit(ctx, [rec("train-7", 0.0, "<answer>0</answer>")])  # bank train-7 (fallback adds it)
    first = ContextDoc.parse(ed.edit(ctx, [rec("train-8", 0.0, "<answer>0</answer>")]))
    assert len(first.demos) == 1 and first.demos[0][1] in {BY_ID["train-7"].answer, BY_ID["train-8"].answer}
    # Same parent again: the tried edits are skipped, a different one comes.
    seen = set(ed.edits)
    ed.edit(ctx, [rec("train-9", 0.0, "<answer>0</answer>")])
    assert len(set(ed.edits)) == len(ed.edits) and set(ed.edits) > seen


def test_rules_mined_from_recurring_feedback() -> None:
    fb = "Incorrect (reward 0.00).\nExpected answer: {a}\nAnswer given: abc\nThe answer must be a single integer."
    records = [rec(f"train-{i}", 0.0, "<answer>abc</answer>", fb.format(a=BY_ID[f"train-{i}"].answer))
               for i in range(3)]
    rules = mine_rules(records, {pid: p.answer for pid, p in BY_ID.items()})
    assert rules == ["The answer must be a single integer."]
    # A note seen once, or one naming a number, is not a rule.
    assert mine_rules(records[:1], {}) == []
    ed = FeedbackEditor(BY_ID, seed=0)
    ctx = ContextDoc("Solve.", [f"{FORMAT_RULE_PREFIX}."]).render()
    outs = set()
    for _ in range(4):
        new = ed.edit(ctx, records)
        if new:
            outs.add(new)
    assert any("The answer must be a single integer." in ContextDoc.parse(o).rules for o in outs)


def test_no_edit_when_everything_passed_and_determinism() -> None:
    ed = FeedbackEditor(BY_ID, seed=0)
    assert ed.edit("Solve.", [rec("train-0", 1.0, "<answer>1</answer>")]) is None
    assert ed({"context": "Solve."}, {"context": [rec("train-0", 1.0, "x")]}, ["context"]) == {}

    def trace(seed: int) -> list[str]:
        e = FeedbackEditor(BY_ID, seed=seed)
        out = []
        ctx = "Solve."
        for i in range(6):
            new = e.edit(ctx, [rec(f"train-{i}", 0.0, "<answer>0</answer>"), rec(f"train-{i + 6}", 0.0, "no")])
            ctx = new or ctx
            out.append(ctx)
        return out

    assert trace(3) == trace(3)  # (these records leave the editor no choice: every seed edits alike)


def test_junk_reason() -> None:
    parent = "Solve the problem."
    assert junk_reason("", parent) == "empty"
    assert junk_reason(None, parent) == "empty"
    assert junk_reason("ok", parent).startswith("too short")
    assert junk_reason(parent, parent) == "unchanged"
    assert junk_reason("!!!! ???? #### 1234 5678 !!!! ????", parent) == "mostly non-letters"
    assert junk_reason(" ".join(["the"] * 100), parent) == "degenerate repetition"
    assert junk_reason("x" * 20000, parent).startswith("too long")
    # at most max_chars, or as long as a longer parent (a long seed context): a child had been
    # allowed 4x its parent, so a context could grow round after round without end
    grown = " ".join(f"Rule {i}: check case {i} before answering." for i in range(180))
    assert len(grown) == 7519
    assert junk_reason(grown + " Check the answer again.", grown) is None
    assert junk_reason(grown + " " + grown, grown).startswith("too long (15039 chars, at most 8000")
    assert junk_reason(grown, parent, max_chars=1000).startswith("too long (7519 chars, at most 1000")
    assert junk_reason(grown[:-40] + " Box it.", grown, max_chars=1000) is None  # an edit of a long seed
    assert junk_reason(grown + " Box it.", grown, max_chars=1000).startswith("too long (7527 chars, at most 7519")
    assert junk_reason("Here is <curr_param> again and again", parent) == "echoed the reflection template"
    assert junk_reason("Solve the problem step by step and box the answer.", parent) is None


# -- reflection against a fake OpenAI-compatible server --------------------------------------

GOOD = "Here you go:\n```\nSolve the problem step by step. End with <answer>N</answer>.\n```"


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server API; no /models, as on some servers
        srv: Any = self.server
        srv.gets.append(self.path)
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:  # noqa: N802 - http.server API
        srv: Any = self.server
        srv.auth.append(self.headers.get("Authorization"))
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        srv.requests.append(body)
        mode = srv.modes[min(len(srv.requests) - 1, len(srv.modes) - 1)]
        if mode == "error":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b"boom")
            return
        if mode == "timeout":
            time.sleep(2.0)
        if mode == "malformed":  # a 200 without choices
            payload: dict[str, Any] = {"nope": True}
        else:
            content = {"junk": "#### !!!! ???? ....", "empty": "", "null": None, "good": GOOD, "timeout": GOOD}[mode]
            payload = {"choices": [{"message": {"role": "assistant", "content": content}}]}
        data = json.dumps(payload).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass


@pytest.fixture
def fake_server() -> Iterator[Any]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.requests, srv.modes, srv.gets, srv.auth = [], ["good"], [], []
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _settings(srv: Any, timeout: float = 5.0) -> dict[str, Any]:
    return {"kind": "openai", "base_url": f"http://127.0.0.1:{srv.server_address[1]}", "model": "fake",
            "timeout_s": timeout, "max_tokens": 64}


DATASET = {"context": [{"Inputs": "What is 1 + 1?", "Generated Outputs": "3", "Feedback": "Expected answer: 2"}]}


@pytest.mark.parametrize("mode", ["junk", "empty", "error", "timeout", "malformed"])
def test_reflective_proposer_survives_bad_reflection(fake_server: Any, mode: str) -> None:
    fake_server.modes = [mode]
    lines: list[str] = []
    # 0.5 s against the server's 2 s sleep in "timeout"; the other modes answer at once, and their
    # 5 s keep a slow reply on a busy machine from reading as a timeout
    timeout = 0.5 if mode == "timeout" else 5.0
    prop = ReflectiveProposer(build_reflection_lm(_settings(fake_server, timeout=timeout)), logger=lines.append)
    assert prop({"context": "Solve."}, DATASET, ["context"]) == {}
    assert len(prop.failures) == 1 and lines
    # each mode its own failure: the server answered (a 500 or a body), but for the timeout
    assert ("Timeout" in prop.failures[0]) == (mode == "timeout") and "Connection error" not in prop.failures[0], \
        prop.failures


def test_reflective_proposer_good_reply(fake_server: Any) -> None:
    prop = ReflectiveProposer(build_reflection_lm(_settings(fake_server)))
    assert prop({"context": "Solve."}, DATASET, ["context"]) == {
        "context": "Solve the problem step by step. End with <answer>N</answer>."}
    req = fake_server.requests[-1]
    assert req["model"] == "fake" and "Solve." in req["messages"][0]["content"]
    assert "Expected answer: 2" in req["messages"][0]["content"]  # gepa's reflection prompt
    lm = build_reflection_lm(_settings(fake_server))
    assert lm("hello") == GOOD
    fake_server.modes = ["error"]
    import openai

    with pytest.raises(openai.APIStatusError, match="500"):  # the server's error as such; the proposer catches it
        lm("hello")


@pytest.mark.parametrize("reply", [
    # GEPA's extraction cut from the first ``` (inside the trace) to the last
    "<think>\nThe seed says ```Be brief.``` and it fails the format. I should add a rule.\n</think>\n\n"
    "```\nSolve the problem step by step. End with <answer>N</answer>.\n```",
    # and took a reply without fences whole, trace included
    "<think>\nOkay, the model never used the tags, so I will ask for them.\n</think>\n\n"
    "Solve the problem step by step. End with <answer>N</answer>.",
])
def test_a_thinking_reflection_models_trace_stays_out_of_the_context(reply: str) -> None:
    """A local Qwen3 as reflection model (`fast.reflection.kind: hf`) thinks first: its trace
    became part of the proposed context, the system prompt of every rollout after."""
    prop = ReflectiveProposer(lambda prompt: reply)
    assert prop({"context": "Solve."}, DATASET, ["context"]) == {
        "context": "Solve the problem step by step. End with <answer>N</answer>."}


@pytest.mark.parametrize("advice", [
    "Reason step by step inside <think></think> tags, then give the final answer as <answer>N</answer>.",
    "First write your reasoning between <think> and </think>. Then give <answer>N</answer>.",
    "Do not write <think> tags; give the final answer as <answer>N</answer>.",
])
def test_a_proposal_that_mentions_the_think_tags_stays_whole(advice: str) -> None:
    """Only a trace the reply begins with is dropped: advice about the tags (likely when the
    rollouts reflected on are Qwen3's) was cut at its "</think>", or refused as a cut-off trace.
    After a trace of the reflection model's own, too: the trace ends at its first "</think>"."""
    prop = ReflectiveProposer(lambda prompt: f"```\n{advice}\n```")
    assert prop({"context": "Solve."}, DATASET, ["context"]) == {"context": advice}
    thought = ReflectiveProposer(lambda prompt: f"<think>\nThe tags matter.\n</think>\n\n```\n{advice}\n```")
    assert thought({"context": "Solve."}, DATASET, ["context"]) == {"context": advice}


def test_the_trace_filter_is_copied_as_itself() -> None:
    import copy

    from fastslow.fast.proposers import WithoutThinking

    class Model:
        model = "m"

        def __call__(self, prompt: Any) -> str:
            return "<think>x</think>reply"

        def __deepcopy__(self, memo: dict) -> Model:
            return Model()

    wrapped = copy.deepcopy(WithoutThinking(Model()))
    assert isinstance(wrapped, WithoutThinking) and wrapped("p") == "reply" and wrapped.model == "m"


def test_a_reflection_whose_thinking_is_cut_off_proposes_nothing() -> None:
    lines: list[str] = []
    prop = ReflectiveProposer(lambda prompt: "<think>\nFirst, the feedback says ```", logger=lines.append)
    assert prop({"context": "Solve."}, DATASET, ["context"]) == {}
    assert prop.raised_calls == prop.failed_calls == 1
    assert "never ended with </think>" in prop.failures[0] and "fast.reflection.max_tokens" in prop.failures[0]


def test_round_survives_a_failing_reflection_model(fake_server: Any, tmp_path: Path) -> None:
    """Junk, errors and timeouts from the reflection model: the round ends normally, nothing
    is proposed, and the pool comes back unchanged (same contexts, fresh scores)."""
    fake_server.modes = ["junk", "error", "timeout", "empty", "malformed", "junk", "error", "junk"] * 3
    task, gen = ToyTask(), ScriptedGenerator()
    cfg = FastConfig(pool_size=2, proposer="reflective", reflection=_settings(fake_server, timeout=0.5),
                     max_metric_calls=60, minibatch_size=3)
    pool = Pool.seed(["Solve the problem.", "Answer briefly."], k=2)
    new, summary = run_round(pool, gen, task, task.problems("train", 9, 0), task.problems("val", 6, 1),
                             cfg, 0, tmp_path, log=lambda s: None)
    assert sorted(new.texts) == sorted(pool.texts)
    assert summary["num_candidates"] == 2 and summary["reflection_proposed"] == 0
    assert len(summary["reflection_failures"]) >= 3 and gen.prompts <= 60
    assert (tmp_path / "pool.json").exists()


def test_reflection_lm_kinds(tiny_model_dir: Path) -> None:
    from gepa.lm import LM

    lm = build_reflection_lm({"kind": "litellm", "model": "openai/some-model", "timeout_s": 3})
    assert isinstance(lm, LM) and lm.completion_kwargs["timeout"] == 3.0  # nothing called yet
    local = build_reflection_lm({"kind": "hf", "path": str(tiny_model_dir), "max_tokens": 6})
    out = local("Rewrite: Solve the problem.")
    assert isinstance(out, str) and len(local._generator.tokenizer(out, add_special_tokens=False)["input_ids"]) <= 6
    with pytest.raises(ValueError, match="kind"):
        build_reflection_lm({"kind": "nope"})


@pytest.mark.parametrize("given", ["MAYBE", "x\nDeciding facts: none.\nSo the documents give: nothing."],
                         ids=["plain", "lines_in_the_answer"])
def test_long_problems_demonstrated_condensed_from_their_feedback(given: str) -> None:
    """Hover's problems (documents + claim) are longer than a demonstration may be: with the
    task's working labels the editor shows the claim after an elision mark, worked by the
    feedback's deciding facts; without them it has nothing to demonstrate and stalls. An answer
    that writes lines of its own cannot pass them off as the feedback's working."""
    from fastslow.fast.proposers import ELISION
    from fastslow.fast.round import make_proposer
    from fastslow.tasks import get_task

    hover = get_task("hover_hard")
    probs = hover.problems("train", 8, 0)
    by_id = {p.id: p for p in probs}
    fmt = ContextDoc("Decide.", [f"{FORMAT_RULE_PREFIX}."]).render()

    def records(ids: list[str]) -> list[dict[str, Any]]:
        return [{"problem_id": i, "Score": 0.0, "Generated Outputs": f"<answer>{given}</answer>",
                 "Feedback": hover.feedback(by_id[i], f"<answer>{given}</answer>")} for i in ids]

    ids = list(by_id)
    plain = FeedbackEditor(by_id, seed=0)
    assert all(len(plain.demo_text(p)) > plain.max_demo_chars for p in probs)
    plain.edit("Another parent.", records(ids[:3]))
    assert plain.edit(fmt, records(ids[3:5])) is None  # the stall without working labels

    ed = make_proposer(FastConfig(), probs, lambda _m: None, hover)
    assert isinstance(ed, FeedbackEditor) and ed.working_labels == hover.demo_working and ed.gist == hover.demo_gist
    ed.edit("Another parent.", records(ids[:3]))  # banks the first three, condensed
    new = ContextDoc.parse(ed.edit(fmt, records(ids[3:5])))
    assert len(new.demos) == 1 and ed.edits[-1].startswith("add-demo:")
    demo = new.demos[0]
    source = next(p for p in probs[:3] if p.metadata["claim"] in demo.problem)
    assert demo.problem == f"{ELISION}\n\nClaim: {source.metadata['claim']}"
    assert demo.answer == source.answer
    feedback = hover.feedback(source, "<answer>MAYBE</answer>").split("\n")
    deciding = next(line for line in feedback if line.startswith("Deciding facts:"))
    gives = next(line for line in feedback if line.startswith("So the documents give:"))
    assert demo.working == f"{deciding} {gives}"
    assert "Expected answer" not in demo.working and "Near miss" not in demo.working
    assert "nothing" not in demo.working and "none." not in demo.working
    assert len(demo.render()) <= ed.max_demo_chars
    assert ContextDoc.parse(new.render()) == new  # the condensed demonstration round-trips

    # It is the problem's demonstration: dropped when its own problem still fails with it.
    again = ContextDoc.parse(ed.edit(new.render(), records([source.id])))
    assert again.demos == [] and ed.edits[-1].startswith("drop-demo:")


def test_condensed_demo_needs_a_gist_and_the_working_lines_named_that_fit() -> None:
    from fastslow.tasks.base import Problem

    long = {"p": Problem("p", "t", "Documents:\n" + "x " * 400 + "\n\nClaim: c is d.", "SUPPORTED")}
    claim = lambda p: p.prompt.split("\n\n")[-1]  # noqa: E731
    ed = FeedbackEditor(long, working_labels=("Why:",), max_demo_chars=200, gist=claim)
    assert ed.condensed_demo(long["p"], "Incorrect.\nWhy: d holds.") == Demo("[...]\n\nClaim: c is d.", "SUPPORTED", "Why: d holds.")
    assert ed.condensed_demo(long["p"], "Incorrect.\nExpected answer: SUPPORTED") is None  # no working line
    assert ed.condensed_demo(long["p"], "Why: " + "w " * 200) is None  # still too long
    assert FeedbackEditor(long, working_labels=("Why:",)).condensed_demo(long["p"], "Why: d holds.") is None  # no gist
    assert FeedbackEditor(long, gist=lambda p: None).condensed_demo(long["p"], "Why: d.") is None  # none for it
    # A task that names no working lines gets examples without working.
    assert FeedbackEditor(long, gist=claim).condensed_demo(long["p"], "Incorrect.") == Demo("[...]\n\nClaim: c is d.", "SUPPORTED")
    too_long = FeedbackEditor(long, gist=lambda p: "c " * 300)
    assert too_long.condensed_demo(long["p"], "") is None


@pytest.mark.parametrize("formatted", [True, False])
def test_long_formatted_failures_are_not_format_failures(formatted: bool) -> None:
    """Paper-scale traces (6000 characters) with a wrong but tagged answer at the end are not
    parse failures, though their records show them clipped; the same traces without the tags
    are, and get the format rule."""
    from fastslow.fast import FastAdapter
    from fastslow.model.generation import SamplingParams

    gen = LongTraceGenerator(6000, offset=1, tagged=formatted)
    adapter = FastAdapter(gen, TASK, SamplingParams(8))
    cand = {"context": "Solve the problem."}
    eb = adapter.evaluate(TRAIN[:4], cand, capture_traces=True)
    assert eb.scores == [0.0] * 4
    records = adapter.make_reflective_dataset(cand, eb, ["context"])["context"]
    editor = FeedbackEditor(BY_ID, seed=0, logger=lambda s: None)
    editor.edit(cand["context"], records)
    assert ("add-format-rule" in editor.edits) is not formatted


def test_a_litellm_reflection_model_without_its_key_stops_the_cycle_first(monkeypatch, tmp_path):
    """paper.yaml reflects with litellm ('openai/gpt-5.2', the key from the environment). Without
    the key every reflection call failed, the round logged one ERROR and FST trained as RL would,
    every job finishing. The cycle now stops first thing, in one line naming the key litellm
    misses (litellm.validate_environment; litellm is in the gpu extra, faked here)."""
    import sys
    import types

    from fastslow.config import load_config
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.fast.proposers import reflection_environment_error

    asked = []

    def validate_environment(model=None):
        asked.append(model)
        return {"keys_in_environment": False, "missing_keys": ["OPENAI_API_KEY"]}

    monkeypatch.setitem(sys.modules, "litellm", types.SimpleNamespace(validate_environment=validate_environment))
    settings = {"kind": "litellm", "model": "openai/gpt-5.2"}
    assert reflection_environment_error(settings) == (
        "fast.reflection.model 'openai/gpt-5.2': litellm finds no OPENAI_API_KEY in the environment; "
        "export it where the cycle jobs run (every reflection call would fail)")
    assert asked == ["openai/gpt-5.2"]
    config = load_config("config/config.yaml", "config/smoke.yaml",
                         overrides={"fast": {"proposer": "reflective", "reflection": settings}})
    spec = RunSpec(experiment="e", method="fst", name="r", schedule=("math",), seed=0)
    with pytest.raises(ValueError, match=r"^fast\.reflection\.model 'openai/gpt-5\.2': litellm finds no OPENAI_API_KEY"):
        run_cycle(spec, config, 0, tmp_path / "no-model", None, tmp_path / "no-train.parquet", tmp_path / "c0")
    # RL has no round; another kind is not litellm's to check; a key that is set passes
    run_rl = RunSpec(experiment="e", method="rl", name="r", schedule=("math",), seed=0)
    with pytest.raises(FileNotFoundError, match="no-train.parquet"):  # past the check, to the missing files
        run_cycle(run_rl, config, 0, tmp_path / "no-model", None, tmp_path / "no-train.parquet", tmp_path / "c0")
    assert reflection_environment_error({"kind": "hf", "path": "x"}) is None
    # a key given by api_key_env is the one checked: litellm's own variables are not read then
    keyed = {**settings, "api_key_env": "MY_REFLECTION_KEY"}
    monkeypatch.delenv("MY_REFLECTION_KEY", raising=False)
    assert reflection_environment_error(keyed) == (
        "fast.reflection.api_key_env: $MY_REFLECTION_KEY is not set in the environment the cycle jobs run in; "
        "export it there (every reflection call would fail)")
    monkeypatch.setenv("MY_REFLECTION_KEY", "secret")
    assert reflection_environment_error(keyed) is None
    monkeypatch.setitem(sys.modules, "litellm", types.SimpleNamespace(
        validate_environment=lambda model=None: {"keys_in_environment": True, "missing_keys": []}))
    assert reflection_environment_error(settings) is None
    monkeypatch.setitem(sys.modules, "litellm", None)  # not installed: import fails
    assert "needs the litellm package" in reflection_environment_error(settings)
    assert "needs the litellm package" in reflection_environment_error(keyed)


def test_an_openai_reflection_endpoint_that_cannot_be_reached_stops_the_cycle_first(fake_server, tmp_path,
                                                                                    monkeypatch):
    """A reflection endpoint nobody listens on (or one that never answers): every reflection
    call failed with APIConnectionError, the round logged one ERROR and FST trained as RL would,
    exit code 0. The cycle now stops first thing, in one line naming fast.reflection.base_url. An
    endpoint that answers, even 404 on /models (some servers do not implement it), passes."""
    import socket

    from ports import free_port

    from fastslow.config import load_config
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.fast.proposers import reflection_environment_error

    port = free_port()  # nobody listens on it: connection refused
    settings = {"kind": "openai", "base_url": f"http://127.0.0.1:{port}", "model": "m", "timeout_s": 5}
    problem = reflection_environment_error(settings)
    assert problem is not None and "\n" not in problem
    assert problem.startswith(f"fast.reflection.base_url 'http://127.0.0.1:{port}': cannot connect to "
                              f"http://127.0.0.1:{port}/v1 (ConnectError: ")
    assert "Connection refused" in problem and problem.endswith(
        "start the server or fix the URL (every reflection call would fail)")
    config = load_config("config/config.yaml", "config/smoke.yaml",
                         overrides={"fast": {"proposer": "reflective", "reflection": settings}})
    spec = RunSpec(experiment="e", method="fst", name="r", schedule=("math",), seed=0)
    with pytest.raises(ValueError, match=r"^fast\.reflection\.base_url 'http://127\.0\.0\.1:\d+': cannot connect"):
        run_cycle(spec, config, 0, tmp_path / "no-model", None, tmp_path / "no-train.parquet", tmp_path / "c0")

    with socket.socket() as s:  # accepts connections, never answers: a timeout (min(10 s, timeout_s))
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        silent = {**settings, "base_url": f"http://127.0.0.1:{s.getsockname()[1]}/v1", "timeout_s": 0.5}
        assert "(ReadTimeout: " in reflection_environment_error(silent)

    # a key the config names but the environment lacks: stopped before any connection is tried
    keyed = {**_settings(fake_server), "api_key_env": "FASTSLOW_TEST_UNSET_KEY"}
    monkeypatch.delenv("FASTSLOW_TEST_UNSET_KEY", raising=False)
    assert reflection_environment_error(keyed) == (
        "fast.reflection.api_key_env: $FASTSLOW_TEST_UNSET_KEY is not set in the environment the cycle jobs "
        "run in; export it there (every reflection call would fail)")
    assert fake_server.gets == []
    assert reflection_environment_error(_settings(fake_server)) is None  # 404 on /models: reached
    assert fake_server.gets == ["/v1/models"] and fake_server.requests == []  # no completion spent


def test_an_hf_reflection_model_answers_and_names_its_own_length_key(tiny_model_dir):
    """kind hf: a local model reflects (loaded on its first call). Its sampler's lengths come from
    fast.reflection.max_tokens, which a context overflow names, not generation.max_new_tokens."""
    from fastslow.fast.proposers import build_reflection_lm

    lm = build_reflection_lm({"kind": "hf", "path": str(tiny_model_dir), "max_tokens": 4})
    text = lm("Rewrite this context: be brief.")
    assert isinstance(text, str) and len(lm._generator.tokenizer(text, add_special_tokens=False)["input_ids"]) <= 4
    assert lm._generator.length_key == "fast.reflection.max_tokens"
    assert lm._calls == 1 and lm.max_new_tokens == 4


def test_a_reflection_models_chat_template_kwargs_reach_its_template(fake_server, tiny_model_dir, tmp_path):
    """`fast.reflection.chat_template_kwargs` ({enable_thinking: false}: Qwen3's non-thinking
    mode). A local Qwen3 as reflection model always thought: its trace's tokens were spent on
    every call, then dropped from the reply. The openai kind now sends them in each request's body
    (vLLM's, SGLang's and llama.cpp's servers read `chat_template_kwargs` there), and the hf kind
    renders its template with them. Unset, a request carries no such field (a hosted API may
    refuse one)."""
    import shutil

    from fastslow.fast.proposers import build_reflection_lm
    from fastslow.model.convert import load_tokenizer

    off = {"enable_thinking": False}
    assert build_reflection_lm({**_settings(fake_server), "chat_template_kwargs": off})("hello") == GOOD
    assert fake_server.requests[-1]["chat_template_kwargs"] == off
    assert build_reflection_lm(_settings(fake_server))("hello") == GOOD
    assert "chat_template_kwargs" not in fake_server.requests[-1]
    model = tmp_path / "reflector"
    shutil.copytree(tiny_model_dir, model)
    tokenizer = load_tokenizer(model)
    tokenizer.chat_template = (  # marks the non-thinking mode in the prompt
        "{%- if enable_thinking is defined and not enable_thinking %}[no-think]{% endif -%}"
        "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor -%}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}")
    tokenizer.save_pretrained(model)
    prompt_tokens = {}
    for name, extra in (("default", {}), ("off", {"chat_template_kwargs": off})):
        lm = build_reflection_lm({"kind": "hf", "path": str(model), "max_tokens": 2, **extra})
        lm("Rewrite this context: be brief.")  # loads its generator
        generate, seen = lm._generator.generate, []
        lm._generator.generate = lambda convs, params, generate=generate, seen=seen: seen.extend(
            generate(convs, params)) or seen
        lm("Rewrite this context: be brief.")
        prompt_tokens[name] = seen[0].prompt_tokens
    marker = len(tokenizer("[no-think]", add_special_tokens=False)["input_ids"])
    assert prompt_tokens["off"] == prompt_tokens["default"] + marker, prompt_tokens


def test_a_proposer_name_without_a_proposer_is_one_line_naming_it() -> None:
    """A name added to `PROPOSERS` (and the schema) but not to `make_proposer` went down the
    reflective path and failed there as KeyError 'base_url'."""
    from fastslow.fast import round as round_

    cfg = FastConfig()
    object.__setattr__(cfg, "proposer", "fixed_hint")
    with pytest.raises(ValueError, match=r"^fast\.proposer: 'fixed_hint' has no proposer in "
                                         r"fastslow\.fast\.round\.make_proposer$"):
        round_.make_proposer(cfg, TRAIN, log=lambda _: None)


# -- second-pass review: behaviour that mutants of proposers.py changed without a test failing --


def test_junk_reason_bounds_and_a_parent_with_surrounding_whitespace() -> None:
    """The limits are inclusive where the docstring says "at most": 16 characters are enough, and
    exactly `max_chars` is allowed. A parent as a YAML block scalar leaves it (a trailing
    newline): the same text back is still "unchanged", and its whitespace buys no extra length.
    GEPA's own placeholders echoed back, either of them, are the template, not a context."""
    parent = "Solve the problem."
    assert junk_reason("a" * 15, parent) == "too short (15 chars)"
    assert junk_reason("Solve it, please", parent) is None  # 16 characters
    exact = " ".join(f"Rule {i}: check case {i} before answering." for i in range(40))[:999] + "."
    assert len(exact.strip()) == 1000 and junk_reason(exact, parent, max_chars=1000) is None
    assert junk_reason(exact + "x", parent, max_chars=1000).startswith("too long (1001 chars, at most 1000")
    assert junk_reason("Solve the problem.", "Solve the problem.\n") == "unchanged"
    assert junk_reason("  Solve the problem.\n", "\nSolve the problem.  ") == "unchanged"
    long_parent = exact + "\n" * 50  # its trailing newlines do not raise the limit
    assert junk_reason(exact + " More.", long_parent, max_chars=100).startswith("too long (1006 chars, at most 1000")
    assert junk_reason("Use the facts in <side_info> to answer.", parent) == "echoed the reflection template"


def test_a_reflection_reply_with_whitespace_before_its_trace_loses_the_trace() -> None:
    """A reply that opens with a newline or spaces before "<think>" (chat templates often leave
    one) is still a thinking reply: its trace stays out of the context."""
    reply = "\n  <think>\nThe format fails.\n</think>\n\nSolve the problem. End with <answer>N</answer>."
    prop = ReflectiveProposer(lambda prompt: reply)
    assert prop({"context": "Solve."}, DATASET, ["context"]) == {
        "context": "Solve the problem. End with <answer>N</answer>."}


def test_the_reflective_proposers_counts_tell_proposals_junk_and_errors_apart() -> None:
    """`calls` every call; `proposed` the proposals that passed `junk_reason`; `failed_calls` the
    calls that proposed nothing for a failure, `raised_calls` only those that raised. The round's
    ERROR (every call failed) and its stop (every call raised) are read from these."""
    replies = iter(["```\nSolve the problem step by step. End with <answer>N</answer>.\n```",
                    "```\n#### !!!! ???? ....\n```", ConnectionError("gone")])

    def lm(prompt: Any) -> str:
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        return reply

    prop = ReflectiveProposer(lm, logger=lambda _m: None)
    counts = []
    for _ in range(3):
        prop({"context": "Solve."}, DATASET, ["context"])
        counts.append((prop.calls, prop.proposed, prop.failed_calls, prop.raised_calls))
    assert counts == [(1, 1, 0, 0), (2, 1, 1, 0), (3, 1, 2, 1)]
    assert prop.failures == ["mostly non-letters", "ConnectionError: gone"]


def test_a_call_with_no_records_asks_nothing_and_fails_nothing() -> None:
    """A component without records is not reflected on (gepa skips it): no model call, no
    proposal, and no failure counted against the reflection setup."""
    def lm(prompt: Any) -> str:
        raise AssertionError("the reflection model was called")

    prop = ReflectiveProposer(lm, logger=lambda _m: None)
    assert prop({"context": "Solve."}, {"context": []}, ["context"]) == {}
    assert (prop.calls, prop.failed_calls, prop.raised_calls, prop.failures) == (1, 0, 0, [])


def test_a_reflection_error_is_recorded_clipped() -> None:
    """An error with a long message (a server's HTML error page) is recorded as its type and its
    message's first 200 characters: the round summary's failures stay readable."""
    def lm(prompt: Any) -> str:
        raise RuntimeError("<html>" + "x" * 5000)

    prop = ReflectiveProposer(lm, logger=lambda _m: None)
    assert prop({"context": "Solve."}, DATASET, ["context"]) == {}
    assert prop.failures == ["RuntimeError: " + ("<html>" + "x" * 5000)[:200]]


def test_a_reflection_that_returns_its_parent_or_too_much_proposes_nothing() -> None:
    """The proposer judges a reply against the parent it reflected on (the same context back
    proposes nothing) and against its own `max_chars` (fast.reflection.max_context_chars)."""
    lines: list[str] = []
    parent = "Solve the problem step by step. End with <answer>N</answer>."
    echo = ReflectiveProposer(lambda prompt: f"```\n{parent}\n```", logger=lines.append)
    assert echo({"context": parent}, DATASET, ["context"]) == {}
    assert echo.failures == ["unchanged"] and echo.failed_calls == 1 and "unchanged" in lines[-1]
    long = " ".join(f"Rule {i}: check case {i} before answering." for i in range(10))
    capped = ReflectiveProposer(lambda prompt: f"```\n{long}\n```", logger=lambda _m: None, max_chars=100)
    assert capped({"context": "Solve."}, DATASET, ["context"]) == {}
    assert capped.failures == [f"too long ({len(long)} chars, at most 100: fast.reflection.max_context_chars)"]
    assert ReflectiveProposer(lambda prompt: f"```\n{long}\n```")({"context": "Solve."}, DATASET, ["context"]) == {
        "context": long}  # the default limit takes it


def test_the_openai_reflection_model_sends_its_settings_and_key(fake_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request carries the configured max_tokens and temperature, and the key from the
    variable `api_key_env` names."""
    monkeypatch.setenv("FASTSLOW_TEST_REFLECTION_KEY", "sekrit")
    lm = build_reflection_lm({**_settings(fake_server), "temperature": 0.25,
                              "api_key_env": "FASTSLOW_TEST_REFLECTION_KEY"})
    assert lm("hello") == GOOD
    req = fake_server.requests[-1]
    assert (req["max_tokens"], req["temperature"]) == (64, 0.25)
    assert fake_server.auth[-1] == "Bearer sekrit"


def test_the_connection_check_waits_no_longer_than_the_models_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """`connection_error` asks within its own timeout, or the model's if that is shorter (a
    cycle's start must not wait 10 s on a model configured for 0.5 s)."""
    from fastslow.fast.proposers import OpenAICompatibleLM

    asked: list[float | None] = []

    class Client:
        class models:  # noqa: N801 - openai's attribute
            @staticmethod
            def list() -> None:
                return None

    monkeypatch.setattr(OpenAICompatibleLM, "client", lambda self, timeout_s=None: asked.append(timeout_s) or Client)
    assert OpenAICompatibleLM("http://h:1", "m", timeout_s=0.5).connection_error() is None
    assert OpenAICompatibleLM("http://h:1", "m", timeout_s=60).connection_error(timeout_s=3) is None
    assert asked == [0.5, 3]


def test_a_local_reflection_model_samples_each_call_with_its_own_seed() -> None:
    """Call n samples with seed + n: two reflections on the same parent and records are two
    draws, not the same reply twice."""
    from fastslow.fast.proposers import HFReflectionLM

    seen = []

    class Generator:
        def generate(self, convs: list[Any], params: Any) -> list[Any]:
            seen.append((convs, params.seed))
            return [type("R", (), {"text": "reply"})()]

    lm = HFReflectionLM("unused", seed=7)
    lm._generator = Generator()
    assert lm("p") == lm("p") == "reply"
    assert seen == [([[{"role": "user", "content": "p"}]], 8), ([[{"role": "user", "content": "p"}]], 9)]


def test_rules_are_mined_from_failures_only_and_never_name_a_number() -> None:
    """A passing rollout's feedback is not mined; a recurring sentence with a number in it is
    about an instance, not the task."""
    rule = "The answer must be a single integer."
    fb = f"Incorrect.\n{rule}"
    passed = [rec(f"train-{i}", 1.0, "<answer>x</answer>", fb) for i in range(3)]
    assert mine_rules(passed, {}) == []
    assert mine_rules([passed[0], {**passed[1], "Score": 0.0}], {}) == []  # one failure: not recurring
    numbered = "Incorrect.\nYou must add all 2 numbers."
    assert mine_rules([rec(f"train-{i}", 0.0, "<answer>x</answer>", numbered) for i in range(3)], {}) == []


def test_a_passing_rollout_is_not_banked_for_demonstration() -> None:
    ed = FeedbackEditor(BY_ID, seed=0)
    ed.edit("Solve.", [rec("train-0", 1.0, "<answer>2</answer>"), rec("train-1", 0.0, "<answer>0</answer>")])
    assert list(ed.bank) == ["train-1"]


def test_the_first_failure_of_a_round_is_demonstrated_from_its_own_minibatch() -> None:
    """An editor with no earlier failures falls back on the minibatch's own (after the rule
    edits): the first calls of a round are not left without a demonstration."""
    ed = FeedbackEditor(BY_ID, seed=0)
    base = ContextDoc("Solve.", [f"{FORMAT_RULE_PREFIX}, for example <answer>1</answer>."]).render()
    new = ContextDoc.parse(ed.edit(base, [rec("train-5", 0.0, "<answer>0</answer>")]))
    assert new.demos == [Demo(demo_text(BY_ID["train-5"]), BY_ID["train-5"].answer)]


def test_the_weakest_demonstration_goes_and_an_unobserved_one_stays() -> None:
    """Full, the editor drops the demonstration whose minibatches scored lowest; one not yet
    observed (no evidence against it) is kept."""
    from fastslow.fast.proposers import _key

    ed = FeedbackEditor(BY_ID, seed=0, max_demos=2)
    strong, weak, new = Demo("strong?", "1"), Demo("weak?", "2"), Demo("new?", "3")
    ed.with_demo[_key(strong.problem)] = [0.9, 0.8]
    ed.with_demo[_key(weak.problem)] = [0.1, 0.2]
    doc = ContextDoc("Solve.", [], [weak, strong])
    assert ed._with_demo(doc, new).demos == [strong, new]
    unseen = Demo("unseen?", "4")
    assert ed._with_demo(ContextDoc("Solve.", [], [unseen, strong]), new).demos == [unseen, new]


def test_a_demonstration_is_observed_both_with_and_without_it() -> None:
    """Minibatch means are kept for contexts holding a demonstration and for those without it,
    so a demonstration that stopped helping becomes stale and is dropped."""
    from fastslow.fast.proposers import _key

    ed = FeedbackEditor(BY_ID, seed=0)
    demo = Demo("What is 9 + 9?", "18")
    with_it = ContextDoc("Solve.", [f"{FORMAT_RULE_PREFIX}."], [demo]).render()
    without = ContextDoc("Solve.", [f"{FORMAT_RULE_PREFIX}."]).render()
    for ctx, score in ((with_it, 0.0), (without, 1.0), (with_it, 0.0), (without, 1.0)):
        ed.edit(ctx, [rec("train-0", score, "<answer>2</answer>")])
    k = _key(demo.problem)
    assert ed.with_demo[k] == [0.0, 0.0] and ed.without_demo[k] == [1.0, 1.0] and ed._stale(k)
    new = ContextDoc.parse(ed.edit(with_it, [rec("train-1", 0.0, "<answer>0</answer>")]))
    assert new.demos == [] and ed.edits[-1] == f"drop-demo:{k}"


def test_a_mined_rule_never_displaces_the_format_rule() -> None:
    from fastslow.fast.proposers import _with_rule

    fmt = f"{FORMAT_RULE_PREFIX}, for example <answer>1</answer>."
    doc = ContextDoc("Solve.", [fmt, "Old rule."])
    assert _with_rule(doc, "New rule.", 2).rules == [fmt, "New rule."]  # the oldest mined rule goes
    assert _with_rule(ContextDoc("Solve.", [fmt]), "New rule.", 1) is None  # no room beside it


def test_the_format_rules_example_is_a_short_answer() -> None:
    """The example in the format rule is the first answer of at most 80 characters: a long one
    would teach the format with a wall of text."""
    from fastslow.tasks.base import Problem

    probs = {"a": Problem("a", "t", "Q a?", "x" * 200), "b": Problem("b", "t", "Q b?", "short answer")}
    rule = FeedbackEditor(probs)._with_format_rule(ContextDoc("Solve."), set()).rules[0]
    assert "<answer>short answer</answer>" in rule


def test_an_instruction_that_mentions_a_section_header_round_trips() -> None:
    """The sections are found from the last header: an instruction paragraph that itself begins
    with "Rules:" or "Worked examples:" stays part of the instruction."""
    doc = ContextDoc("Intro.\n\nRules:\nread them all.\n\nWorked examples:\nnone below.", ["Be brief."],
                     [("What is 1 + 2?", "3")])
    assert ContextDoc.parse(doc.render()) == doc


def test_working_with_markup_is_not_shown_as_a_demonstrations_working() -> None:
    """A "<" in a near miss's or a feedback line's working (a tag fragment) could break the
    demonstration's answer markup: no working is taken from it."""
    from fastslow.tasks.base import Problem

    assert near_miss_working("Since 3 < 5, it is 111", "111") is None
    long = {"p": Problem("p", "t", "Documents:\n" + "x " * 400 + "\n\nClaim: c is d.", "SUPPORTED")}
    ed = FeedbackEditor(long, working_labels=("Why:",), max_demo_chars=200, gist=lambda p: "Claim: c is d.")
    assert ed.condensed_demo(long["p"], "Why: d holds <answer>x</answer>.") is None


def test_a_batching_reflection_models_replies_lose_their_traces_too() -> None:
    """gepa sends several prompts (one per component) through the model's `batch_complete` when
    it has one (gepa's litellm `LM` does). The trace filter read that attribute through from the
    wrapped model, so batched replies reached the contexts with their "<think>" traces."""
    reply = "<think>\nAdd the format.\n</think>\n\nSolve the problem. End with <answer>N</answer>."

    class Batching:
        def __call__(self, prompt: Any) -> str:
            return reply

        def batch_complete(self, messages_list: list[Any]) -> list[str]:
            return [reply for _ in messages_list]

    prop = ReflectiveProposer(Batching())
    both = {"context": DATASET["context"], "other": DATASET["context"]}
    assert prop({"context": "Solve.", "other": "Answer."}, both, ["context", "other"]) == {
        "context": "Solve the problem. End with <answer>N</answer>.",
        "other": "Solve the problem. End with <answer>N</answer>."}


def test_a_reply_without_content_is_an_empty_reply_not_an_error(fake_server: Any) -> None:
    """A server may answer with `"content": null` (vLLM with a reasoning parser, when the whole
    budget went to reasoning): that is a reply with nothing in it, judged as junk ("empty"), not a
    call that raised (which, on every call of a round, stops the round as a broken setup)."""
    fake_server.modes = ["null"]
    lm = build_reflection_lm(_settings(fake_server))
    assert lm("hello") == ""
    prop = ReflectiveProposer(lm, logger=lambda _m: None)
    assert prop({"context": "Solve."}, DATASET, ["context"]) == {}
    assert prop.failures == ["empty"] and (prop.failed_calls, prop.raised_calls) == (1, 0)


def test_the_endpoint_path_is_normalised() -> None:
    """A bare host (with or without a trailing slash) gets OpenAI's /v1; a given path is kept,
    without its trailing slash; litellm retries a failed call once."""
    from fastslow.fast.proposers import OpenAICompatibleLM

    assert OpenAICompatibleLM("http://h:1/", "m").base_url == "http://h:1/v1"
    assert OpenAICompatibleLM("http://h:1", "m").base_url == "http://h:1/v1"
    assert OpenAICompatibleLM("http://h:1/api/v1/", "m").base_url == "http://h:1/api/v1"
    assert build_reflection_lm({"kind": "litellm", "model": "openai/m"}).num_retries == 1


def test_without_room_for_rules_the_editor_edits_otherwise() -> None:
    """max_rules 0: parse failures get no format rule (nor a no-op edit in its name); the call
    edits the demonstrations instead."""
    ed = FeedbackEditor(BY_ID, seed=0, max_rules=0)
    ed.edit("Another parent.", [rec("train-5", 0.0, "no tags")])
    new = ContextDoc.parse(ed.edit("Solve.", [rec("train-6", 0.0, "It is 5."), rec("train-7", 0.0, "maybe")]))
    assert new.rules == [] and new.demos and "add-format-rule" not in ed.edits


def test_small_details_of_mining_and_demonstrations() -> None:
    """A recurring sentence over 200 characters is not a rule; an upper-case answer tag is a
    tag (no near miss); a demonstration's answer is the stripped answer."""
    from fastslow.tasks.base import Problem

    long = "You must " + "always check every step " * 10 + "before answering."
    assert len(long) > 200
    assert mine_rules([rec(f"train-{i}", 0.0, "<answer>x</answer>", f"Incorrect.\n{long}") for i in range(3)], {}) == []
    assert near_miss_working("111, so: <ANSWER>111</ANSWER>", "111") is None
    padded = {"p": Problem("p", "t", "What is 40 + 2?", " 42\n"), "q": Problem("q", "t", "What is 1 + 1?", "2")}
    ed = FeedbackEditor(padded)
    ed.edit("Solve.", [{"problem_id": "p", "Score": 0.0, "Generated Outputs": "<answer>0</answer>", "Feedback": ""}])
    assert ed.demo("p").answer == "42"
