"""The task suite: registry, generation (determinism, split disjointness), scoring, feedback,
split files, and the real-data loaders on small local files."""

from __future__ import annotations

import builtins
import json
import random
import re
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fastslow.tasks import LOADER_NAMES, TASK_NAMES, get_task
from fastslow.tasks.base import (
    ANSWER_FORMAT,
    MAX_PARSE_CHARS,
    SPLITS,
    Problem,
    Task,
    TaskDataError,
    answered,
    extract_answer,
    format_problems,
)
from fastslow.tasks.data import gold_completion, load_problems, write_problems, write_splits
from fastslow.tasks.generated import split_of
from fastslow.tasks.loaders import HFDatasetTask, load_task_file
from fastslow.tasks.physics import sig
from fastslow.tasks.scoring import extract_number, normalize_label, parse_number
from fastslow.tasks.units import SI, convert, parse_quantity, parse_unit

CHEAP = ("math", "stargraph", "hover", "hover_hard", "physics", "physics_hard", "math_hard")
MB = 1_000_000


def right(problem: Problem) -> str:
    return f"Let me think step by step.\n<answer>{problem.answer}</answer>"


def wrong(problem: Problem) -> str:
    """A well-formed but wrong answer for any task."""
    task = problem.task.split("_")[0]
    if task == "hover":
        return "<answer>" + ("NOT_SUPPORTED" if problem.answer == "SUPPORTED" else "SUPPORTED") + "</answer>"
    if task == "math":
        return f"<answer>{parse_number(problem.answer) + 1:g}</answer>"
    if task == "physics":
        return f"<answer>{problem.metadata['value'] * 1.5} {problem.metadata['unit']}</answer>"
    if task == "stargraph":
        return "<answer>" + " ".join(reversed(problem.answer.split())) + "</answer>"
    return '<answer>{"definitely": "wrong"}</answer>'


@pytest.fixture(scope="module")
def generated() -> dict[str, list[Problem]]:
    """A few train problems of every cheap task (codeio has its own fixture: it spawns a worker)."""
    return {name: get_task(name).problems("train", 6, seed=11) for name in CHEAP}


@pytest.fixture(scope="module")
def codeio_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("codeio")
    write_splits("codeio", out, {"train": 6, "val": 3, "test": 3}, seed=5)
    return out


# --- registry -------------------------------------------------------------------------------
def test_registry_names_and_variants() -> None:
    for name in ("codeio", "math", "stargraph", "hover", "physics", "hover_hard", "math_hard", "physics_hard"):
        assert name in TASK_NAMES
    assert get_task("hover", difficulty="hard").name == "hover_hard"
    assert get_task("hover_hard").difficulty == "hard"
    assert get_task("physics_easy").name == "physics_easy"
    for name in TASK_NAMES:
        task = get_task(name)
        assert isinstance(task, Task) and task.name == name


def test_registry_errors_are_one_line_and_name_the_choices() -> None:
    with pytest.raises(ValueError) as err:
        get_task("hover-hard")
    msg = str(err.value)
    assert "\n" not in msg and "'hover-hard'" in msg and "hover_hard" in msg and "codeio" in msg
    with pytest.raises(ValueError, match="difficulty"):
        get_task("hover_hard", difficulty="easy")
    with pytest.raises(ValueError, match="difficulty"):
        get_task("codeio", difficulty="hard")
    with pytest.raises(ValueError, match="unknown difficulty|no difficulty"):
        get_task("math", difficulty="impossible")
    with pytest.raises(ValueError, match="path"):
        get_task("file")
    assert "polaris" in LOADER_NAMES


# --- answer extraction and parsing ----------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("<answer>42</answer>", "42"),
    ("<answer>1</answer> then <answer> 2 </answer>", "2"),
    ("<answer><answer>7</answer></answer>", "7"),
    ("<ANSWER>x</Answer>", "x"),
    ("<answer>1</answer> trailing <answer>unclosed", "1"),
    ("<answer>unclosed", None),
    ("</answer>42<answer>", None),
    ("", None),
])
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    # Qwen3's thinking mode: only what follows the trace answers
    ("<think>\nso it is 7. I must write <answer>7</answer>. Wait, let me double-check the", None),  # cut off
    ("<think>\nMaybe <answer>7</answer>? Check again...\n</think>\n\nThe answer is 12345.", None),
    ("<think>\nMaybe <answer>7</answer>?\n</think>\n\n<answer>12</answer>", "12"),
    ("<think>a</think> <think>b <answer>3</answer></think><answer>4</answer>", "4"),
    ("reasoning the template opened\n</think>\n\n<answer>5</answer>", "5"),  # "<think>" in the prompt
    ("<think>\n\n</think>\n\n<answer>6</answer>", "6"),  # an empty trace
    # a second trace, cut off: its answer is a draft (it scored 5); one given before it counts
    ("<think>a</think> <think>b <answer>5</answer>", None),
    ("<think>a</think><think>b <answer>5</answer>", None),  # reopened right at the close
    ("<think>a</think><answer>1</answer><think>b <answer>2</answer>", "1"),
    # answered, then thought again to the end: nothing follows the last trace
    ("<think>a</think><answer>1</answer><think>b <answer>2</answer></think>", None),
])
def test_an_answer_counts_only_after_the_thinking(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected and answered(text) == (expected is not None)


def test_a_draft_answer_in_the_thinking_earns_nothing_and_the_feedback_says_why() -> None:
    """A tiny random Qwen3 with Qwen3's template (thinking on, the paper config's default) wrote
    answers while thinking: the last <answer> block anywhere was read, so the math task scored a
    trace cut off at the token budget 1.0, and GEPA's feedback called it answered."""
    task = get_task("math")
    problem = Problem("p", "math", "What is 3 + 4? " + ANSWER_FORMAT, "7")
    cut = "<think>\nso it is 7. I must write <answer>7</answer>. Wait, let me double-check the"
    drafted = "<think>\nMaybe <answer>7</answer>? Check again...\n</think>\n\nThe answer is 12345."
    assert task.reward(problem, cut) == task.reward(problem, drafted) == 0.0
    assert "never ends with </think>" in task.feedback(problem, cut)
    assert "only inside the thinking" in task.feedback(problem, drafted)
    assert task.reward(problem, drafted.replace("12345.", "<answer>7</answer>")) == 1.0
    assert format_problems("<think>x</think><answer>7</answer>") == []
    assert format_problems("<think>x</think><answer>7") == ["an <answer> tag is opened but never closed with </answer>"]
    reopened = "<think>x</think> <think>so <answer>7</answer>"  # a second trace, cut off
    assert task.reward(problem, reopened) == 0.0 and "opened after the last </think> never ends" in \
        task.feedback(problem, reopened)
    assert "only inside the thinking" not in task.feedback(problem, reopened)


def test_a_correct_answers_feedback_carries_no_format_complaint() -> None:
    """Format notes explain a failure; on a correct answer (two <answer> blocks, the last one
    right) GEPA would read them as something to fix. A mutation that showed them always survived."""
    task = get_task("math")
    problem = Problem("p", "math", "What is 3 + 4? " + ANSWER_FORMAT, "7")
    twice = "<answer>6</answer> no: <answer>7</answer>"
    assert format_problems(twice) == ["2 <answer> tags were found; only the last complete block counts"]
    assert task.reward(problem, twice) == 1.0 and "Format:" not in task.feedback(problem, twice)
    assert "Format:" in task.feedback(problem, "<answer>6</answer> no: <answer>5</answer>")


def test_extract_answer_reads_only_the_tail() -> None:
    assert extract_answer("<answer>early</answer>" + "x" * MAX_PARSE_CHARS) is None
    assert extract_answer("x" * (2 * MB) + "<answer>late</answer>") == "late"


def test_the_format_notes_read_the_tail_the_answer_is_read_from() -> None:
    """format_problems' notes follow extract_answer's window, the last MAX_PARSE_CHARS characters:
    the length note from one character past it, tags counted in the window only, and an answer
    block before the window of a completion without a trace is not "inside the thinking" (mutants
    of each boundary survived the suite)."""
    block = "<answer>7</answer>"
    fits = "x" * (MAX_PARSE_CHARS - len(block)) + block
    assert len(fits) == MAX_PARSE_CHARS and format_problems(fits) == [] and extract_answer(fits) == "7"
    longer = format_problems("x" + fits)
    assert len(longer) == 1 and "20,001 characters long; only the last 20,000 are read" in longer[0]
    early = format_problems(block + "x" * MAX_PARSE_CHARS)  # no trace: the block fell out of the window
    assert len(early) == 2 and early[1].startswith("no <answer>…</answer> block was found"), early
    split = format_problems("<answer>" + "7" * MAX_PARSE_CHARS + "</answer>")  # its opening tag fell out
    assert split[1:] == ["a </answer> tag appears without an opening <answer>"], split


def test_an_answer_after_the_thinking_that_fell_out_of_the_window_is_no_draft() -> None:
    """An <answer> block given after </think> but before the last MAX_PARSE_CHARS characters was
    noted as "appears only inside the thinking" (the whole completion was searched): the fast loop
    read a lesson about thinking beside the length note's about the window. It is "no block
    found"; one written while thinking still gets the thinking note."""
    block = "<answer>7</answer>"
    late = format_problems("<think>x</think>" + block + "x" * MAX_PARSE_CHARS)
    assert len(late) == 2 and late[0].startswith("the completion is 20,034 characters long"), late
    assert late[1].startswith("no <answer>…</answer> block was found"), late
    drafted = format_problems(f"<think>{block}</think>" + "x" * MAX_PARSE_CHARS)
    assert drafted[1:] == ["an <answer> block appears only inside the thinking; only an answer after </think> counts"]

def test_tags_out_of_order_and_a_blank_completion_get_their_own_format_notes() -> None:
    """Both tags present but never forming a block is "no block", not a missing tag (mutants that
    dropped either side of `opens and not closes` survived); whitespace alone is "empty"."""
    no_block = ["no <answer>…</answer> block was found (put the final answer inside <answer></answer> tags)"]
    assert format_problems("</answer>7<answer>") == no_block
    assert format_problems("<answer>7") == format_problems("<ANSWER>7") == [
        "an <answer> tag is opened but never closed with </answer>"]
    assert format_problems("7</answer>") == ["a </answer> tag appears without an opening <answer>"]
    assert format_problems(" \n\t ") == format_problems("") == ["the completion is empty"]
    assert format_problems(None) == ["the completion is not text (got NoneType)"]  # type: ignore[arg-type]


def test_a_completion_that_is_not_text_is_read_as_text_or_as_nothing() -> None:
    """`answered` and `extract_answer` take anything (None is no answer, never an error); the task
    methods coerce first: bytes (bytearray too) are decoded leniently, so a right answer sent as
    bytes scores 1, and None or an object whose str() raises is an empty completion."""
    from fastslow.tasks.base import coerce_text

    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no text")

    for value in (None, 42, b"<answer>7</answer>", ["<answer>7</answer>"]):
        assert extract_answer(value) is None and not answered(value)  # type: ignore[arg-type]
    assert coerce_text(None) == "" and coerce_text(Hostile()) == "" and coerce_text(7) == "7"
    assert coerce_text(bytearray(b"a\xffb")) == "a\ufffdb" and coerce_text(b"\xc3\xa9") == "é"
    task = get_task("math")
    problem = Problem("p", "math", "What is 3 + 4? " + ANSWER_FORMAT, "7")
    for value in (b"<answer>7</answer>", bytearray(b"<answer>7</answer>"), b"\xff<answer>7</answer>"):
        assert task.reward(problem, value) == 1.0, value  # type: ignore[arg-type]
    for value in (None, Hostile()):
        fb = task.feedback(problem, value)  # type: ignore[arg-type]
        assert fb.endswith("Format: the completion is empty.") and "Detailed feedback failed" not in fb, fb


def test_rewards_and_verdicts_are_clipped_to_0_1_whatever_the_judge_returns() -> None:
    """A judge's reward outside [0, 1] (or NaN) is clipped (NaN is 0) in both the reward and the
    feedback's verdict line; an empty answer read is shown as "(empty)", the expected answer on one
    line without its surrounding whitespace."""
    from fastslow.tasks.base import Judgement, TaskBase

    class Raw(TaskBase):
        name = "raw"

        def __init__(self, value: float, given: str | None = "x") -> None:
            self.value, self.given = value, given

        def judge(self, problem: Problem, completion: str) -> Judgement:
            return Judgement(self.value, "  7\n", self.given)

    p = Problem("p", "raw", "q", "7")
    for value, reward, verdict in ((1.5, 1.0, "Correct (reward 1.00)."), (float("inf"), 1.0, "Correct (reward 1.00)."),
                                   (-0.5, 0.0, "Incorrect (reward 0.00)."), (float("nan"), 0.0, "Incorrect (reward 0.00)."),
                                   (0.25, 0.25, "Partially correct (reward 0.25).")):
        assert Raw(value).reward(p, "x") == reward, value
        assert Raw(value).feedback(p, "x").splitlines()[:3] == [verdict, "Expected answer: 7", "Answer given: x"], value
    assert Raw(0.0, " \n ").feedback(p, "x").splitlines()[2] == "Answer given: (empty)"
    assert Raw(0.0, None).feedback(p, "x").splitlines()[2] == "Answer given: none could be read."


def test_an_expected_answer_of_exactly_the_limit_is_quoted_whole() -> None:
    from fastslow.tasks.base import EXPECTED_CHARS, expected_line, shorten

    assert expected_line("7" * EXPECTED_CHARS) == "7" * EXPECTED_CHARS
    longer = expected_line("7" * (EXPECTED_CHARS + 1))
    assert len(longer) <= EXPECTED_CHARS and longer.endswith("… [1,001 chars]")
    assert shorten("abc", 3) == "abc"
    assert expected_line(" a \n  b\r\n c  ") == "a b c" and expected_line("a  b") == "a  b"


def test_the_policy_sees_the_context_as_a_system_turn_only_when_there_is_one() -> None:
    from fastslow.tasks.base import build_messages

    p = Problem("p", "math", "What is 3 + 4?", "7")
    assert build_messages("", p) == [{"role": "user", "content": "What is 3 + 4?"}]
    assert build_messages("Be brief.", p) == [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "What is 3 + 4?"}]


def test_duplicate_ids_names_them_in_first_seen_order_and_counts_only_the_rest() -> None:
    from fastslow.tasks.base import duplicate_ids

    def rows(*ids: str) -> list[Problem]:
        return [Problem(i, "t", "q", "a") for i in ids]

    assert duplicate_ids(rows("a", "b", "c")) == ""
    assert duplicate_ids(rows("z", "b", "z", "b", "c")) == "'z', 'b'"
    five = [f"p{i}" for i in range(5)]
    assert duplicate_ids(rows(*five, *five)) == "'p0', 'p1', 'p2', 'p3', 'p4'"  # no " and 0 more"
    assert duplicate_ids(rows(*five, *five), show=2) == "'p0', 'p1' and 3 more"


def test_a_problems_metadata_round_trips_and_a_row_may_carry_it_as_a_mapping() -> None:
    """`to_row` writes metadata as JSON with sorted keys, values JSON cannot hold as their str()
    (a Path); `from_row` reads that back, and a mapping (a Parquet struct column) as it is."""
    p = Problem("p", "t", "q", "a", {"path": Path("x/y"), "b": 2})
    row = p.to_row()
    assert row == {"id": "p", "task": "t", "prompt": "q", "answer": "a", "metadata": '{"b": 2, "path": "x/y"}'}
    assert Problem.from_row(row) == replace(p, metadata={"b": 2, "path": "x/y"})
    assert Problem.from_row({**row, "metadata": {"k": [1, 2]}}).metadata == {"k": [1, 2]}
    with pytest.raises(ValueError, match=r"^problem 'p': invalid metadata JSON \(.*\): '\[1, 2\]'$"):
        Problem.from_row({**row, "metadata": [1, 2]})  # a list column: one line naming the problem
    assert Problem.from_row({**row, "id": 7, "answer": 12}) == Problem("7", "t", "q", "12", {"b": 2, "path": "x/y"})


@pytest.mark.parametrize("text", ["42", "42.0", "$42", "4.2e1", "84/2", "\\frac{84}{2}", "\\boxed{42}",
                                  "$\\boxed{42}$", "+42", "42.", "**42**", "4.2 × 10^1", "42%"])
def test_parse_number_accepts_forms_of_42(text: str) -> None:
    assert parse_number(text) == pytest.approx(42)


@pytest.mark.parametrize("text", ["", "forty-two", "4 2", "1e999", "1/0", "42 or 43", "x" * 1000, "nan",
                                  "1 × 10^{400}", "2.5 \\times 10^{-400}",  # overflow, or read as 0
                                  "0." + "0" * 400 + "1"])  # longer than any number a model means
def test_parse_number_rejects(text: str) -> None:
    assert parse_number(text) is None


@pytest.mark.parametrize(("text", "value"), [("2.5 × 10^{-3}", 0.0025), ("2.5 \\times 10^{-3}", 0.0025),
                                             ("-1.2 x 10^-4", -1.2e-4), ("3 · 10^{+2}", 300.0)])
def test_parse_number_reads_an_exponents_sign(text: str, value: float) -> None:
    """Only "4.2 × 10^1" was tested: a negative exponent read as positive (2500 for
    2.5 × 10^-3) passed, and small physics answers are written so."""
    assert parse_number(text) == pytest.approx(value)


def test_json_equal_needs_the_same_keys_and_items() -> None:
    """CodeIO's answers: an output with an extra key, a missing one or an extra item is wrong
    (only equal structures had been tested, so a subset check passed); numbers compare with
    the tolerance, integers exactly."""
    from fastslow.tasks.scoring import json_equal

    assert json_equal({"a": 1, "b": [1.0, 2]}, {"b": [1, 2.0], "a": 1})
    assert not json_equal({"a": 1}, {"a": 1, "b": 2})
    assert not json_equal({"a": 1, "b": 2}, {"a": 1})
    assert not json_equal([1, 2], [1, 2, 3])
    assert json_equal(0.1 + 0.2, 0.3) and not json_equal(2399815805, 2399813805)


def test_extract_number_and_labels() -> None:
    assert extract_number("x = 1,234.5")[0] == pytest.approx(1234.5)
    assert extract_number("42 apples")[0] == 42
    assert extract_number("3 apples and 4 pears")[0] is None
    labels = ("SUPPORTED", "NOT_SUPPORTED")
    assert normalize_label("not supported.", labels) == "NOT_SUPPORTED"
    assert normalize_label("**Supported**", labels) == "SUPPORTED"
    assert normalize_label("SUPPORTED or NOT_SUPPORTED", labels) is None
    assert normalize_label("unsupported", labels) is None



def test_extract_number_reads_the_value_after_the_last_equals_sign() -> None:
    """A worked answer "x = 2 + 3 = 5" states 5: the part after the last "=" is read. Only
    one-"=" answers were tested, so reading after the first "=" (three numbers: ambiguous) passed."""
    assert extract_number("x = 2 + 3 = 5") == (5, "read the value after the last '='")
    assert extract_number("d = 3 * 4 m = 12 m")[0] == 12
    assert extract_number("a = 1, b = 2")[0] == 2

# --- per-task scoring on right / wrong / malformed / empty / huge completions --------------
@pytest.mark.parametrize("name", CHEAP)
def test_reward_and_feedback_cases(name: str, generated: dict[str, list[Problem]]) -> None:
    task = get_task(name)
    for p in generated[name][:3]:
        assert task.reward(p, right(p)) == 1.0, (p.id, p.answer)
        assert task.reward(p, wrong(p)) == 0.0, (p.id, wrong(p))
        for bad in ("", "<answer>", "<answer></answer>", "no tags " + p.answer, "</answer>x<answer>"):
            assert task.reward(p, bad) == 0.0
        fb_right, fb_wrong, fb_empty = (task.feedback(p, c) for c in (right(p), wrong(p), ""))
        assert fb_right.startswith("Correct") and fb_wrong.startswith("Incorrect")
        assert all(p.answer in fb for fb in (fb_right, fb_wrong, fb_empty))
        assert "empty" in fb_empty


@pytest.mark.parametrize("name", CHEAP)
def test_huge_completions_are_fast(name: str, generated: dict[str, list[Problem]]) -> None:
    task, p = get_task(name), generated[name][0]
    junk = ("<answer>" + "9 " * 40 + "</answer> ") * (MB // 100)
    start = time.perf_counter()
    assert task.reward(p, junk + right(p)) == 1.0  # the tail is what counts
    assert task.reward(p, right(p) + "z" * MB) == 0.0  # answer truncated away
    fb = task.feedback(p, right(p) + "z" * MB)
    assert time.perf_counter() - start < 3.0
    assert "only the last" in fb and p.answer in fb


def test_math_numeric_forms() -> None:
    task = get_task("math")
    p = Problem("m1", "math", "What is 6*7?", "42", {"source": "basic_arithmetic", "expression": "6*7"})
    for ok in ("42", "42.0", "$42", "4.2e1", "84/2", "\\boxed{42}", "x = 42", "42 apples"):
        assert task.reward(p, f"<answer>{ok}</answer>") == 1.0, ok
    for bad in ("41", "-42", "42.5", "42 or 43", "forty-two"):
        assert task.reward(p, f"<answer>{bad}</answer>") == 0.0, bad
    assert "sign is wrong" in task.feedback(p, "<answer>-42</answer>")
    assert "6*7" in task.feedback(p, "<answer>41</answer>")
    # the diagnosis of a wrong number: a rounding, a place-value slip, or neither
    big = Problem("m2", "math", "What is 12345*1?", "12345", {"source": "basic_arithmetic"})
    assert "close, but the answer must be exact (no rounding)." in task.feedback(big, "<answer>12340</answer>")
    assert "a factor-of-ten (place value or unit) slip." in task.feedback(big, "<answer>1234.5</answer>")
    plain = task.feedback(big, "<answer>999</answer>")
    assert "Your 999 is not 12345 (off by -11346)." in plain and "slip" not in plain and "rounding" not in plain


@pytest.mark.parametrize("gold, answer", [("16", "16\\pi"), ("2", "\\sqrt{2}"), ("3", "\\frac{\\pi}{3}"), ("5", "x^5"),
                                          ("10", "10!"), ("7", "7i"), ("6", "\\log_2 6"), ("8", "\\pi r^2 = 8\\pi")])
def test_a_math_expression_is_not_its_only_number(gold: str, answer: str) -> None:
    """The only number of an answer was read as its value: 16\\pi scored 1 against 16, and
    \\sqrt{2} against 2. An expression around the number now reads as no number."""
    task = get_task("math")
    p = Problem("m1", "math", "?", gold, {"source": "gsm_symbolic"})
    assert task.reward(p, f"<answer>{answer}</answer>") == 0.0
    assert "the answer is an expression" in task.feedback(p, f"<answer>{answer}</answer>")
    assert task.reward(p, f"<answer>\\text{{{gold} apples}}</answer>") == 1.0  # words around it still pass


def test_math_splits_keep_a_word_problem_told_with_other_names_in_one_split() -> None:
    """gsm_symbolic items had no identity but their prompt, so the same template and numbers told
    of James in test and of David in train were two problems: 6 of 182 such test items at these
    sizes had a train twin. They are keyed by template and numbers now."""
    from fastslow.tasks.math_task import problem_identity
    from fastslow.tasks.scoring import find_numbers

    james = {"name": "James", "age": 11, "years": 7, "multiplier": 3}
    assert problem_identity("", variables=james) == problem_identity("", variables={**james, "name": "David"})
    assert problem_identity("", variables=james) != problem_identity("", variables={**james, "age": 12})
    task = get_task("math")

    def told(p: Problem) -> tuple:  # the numbers a word problem states and its answer, names aside
        return tuple(find_numbers(p.prompt.split("\n\nGive the final")[0])), p.answer

    train = {told(p) for p in task.problems("train", 2000, seed=0) if p.metadata["source"] == "gsm_symbolic"}
    test = [p for p in task.problems("test", 400, seed=0) if p.metadata["source"] == "gsm_symbolic"]
    assert len(test) > 150 and not [p.prompt[:80] for p in test if told(p) in train]


def test_physics_units_and_tolerance() -> None:
    task = get_task("physics")
    meta = {"value": 250.0, "unit": "m", "dimension": "length", "formula": "d = v²/(2·a)",
            "values": {"v": "25 m/s", "a": "1.25 m/s²"}, "value_si": 250.0, "rel_tol": 0.02}
    p = Problem("p1", "physics", "…", "250 m", meta)
    for ok in ("250 m", "250", "0.25 km", "25000 cm", "254 m", "d = 250 metres", "2.5e2 m"):
        assert task.reward(p, f"<answer>{ok}</answer>") == 1.0, ok
    for bad in ("260 m", "250 km", "250 J", "two hundred fifty", "250 m or 300 m",
                "100 or 250 m", "between 1 and 250 m", "1, 2, 3 or 250 m", "1 250 m"):  # hedges, and 1250 m
        assert task.reward(p, f"<answer>{bad}</answer>") == 0.0, bad
    assert task.reward(p, "<answer>2 significant figures: 250 m</answer>") == 1.0
    big = Problem("p2", "physics", "…", "1200 J", {**meta, "value": 1200.0, "unit": "J", "dimension": "energy",
                                                     "value_si": 1200.0})
    assert task.reward(big, "<answer>1 200 J</answer>") == 1.0  # read as 200 J before
    assert "too high by 4.0%" in task.feedback(p, "<answer>260 m</answer>")
    assert "Wrong kind of unit" in task.feedback(p, "<answer>250 J</answer>")
    assert "d = v²/(2·a)" in task.feedback(p, "<answer>1</answer>")


G = 9.8  # m/s², as stated in the physics prompts
#: Every physics generator's formula, written out here from the SI givens in metadata["values"].
PHYSICS_FORMULAS = {
    "final_speed": lambda x: x["v0"] + x["a"] * x["t"],
    "distance": lambda x: x["v0"] * x["t"] + x["a"] * x["t"] ** 2 / 2,
    "stopping": lambda x: x["v"] ** 2 / (2 * x["a"]),
    "avg_speed": lambda x: x["d"] / x["t"],
    "fall_time": lambda x: (2 * x["h"] / G) ** 0.5,
    "fall_speed": lambda x: (2 * G * x["h"]) ** 0.5,
    "kinetic": lambda x: x["m"] * x["v"] ** 2 / 2,
    "potential": lambda x: x["m"] * G * x["h"],
    "lift_power": lambda x: x["m"] * G * x["h"] / x["t"],
    "ohm": lambda x: x["V"] / x["R"],
    "series": lambda x: x["V"] / (x["R1"] + x["R2"]),
    "parallel": lambda x: 1 / (1 / x["R1"] + 1 / x["R2"]),
    "power_dissipated": lambda x: x["V"] ** 2 / x["R"],
    "momentum": lambda x: x["m"] * x["v"],
    "collision": lambda x: x["m1"] * x["v1"] / (x["m1"] + x["m2"]),
    "force": lambda x: x["m"] * x["a"],
    "braking_force": lambda x: x["m"] * x["v"] ** 2 / (2 * x["d"]),
    "series_power": lambda x: x["R2"] * (x["V"] / (x["R1"] + x["R2"])) ** 2,
    "fall_momentum": lambda x: x["m"] * (2 * G * x["h"]) ** 0.5,
    "collision_loss": lambda x: x["m1"] * x["v1"] ** 2 / 2 * x["m2"] / (x["m1"] + x["m2"]),
    "slide": lambda x: x["h"] / x["μ"],
    "horizontal_launch": lambda x: x["v"] * (2 * x["h"] / G) ** 0.5,
}
#: Factor to SI of every unit an answer may be asked in, with the SI unit of each dimension.
ANSWER_UNITS = {
    "m": ("length", 1.0), "km": ("length", 1e3), "cm": ("length", 1e-2), "s": ("time", 1.0),
    "min": ("time", 60.0), "ms": ("time", 1e-3), "m/s": ("speed", 1.0), "km/h": ("speed", 1 / 3.6),
    "N": ("force", 1.0), "kN": ("force", 1e3), "J": ("energy", 1.0), "kJ": ("energy", 1e3),
    "W": ("power", 1.0), "kW": ("power", 1e3), "A": ("current", 1.0), "mA": ("current", 1e-3),
    "Ω": ("resistance", 1.0), "kΩ": ("resistance", 1e3), "kg·m/s": ("momentum", 1.0),
}


def test_physics_answers_match_their_formula() -> None:
    """Each generator's answer equals its physics formula recomputed here from the SI givens in the
    metadata (3 problems per generator, every difficulty). The givens and the answer are rounded to 4
    significant digits (each off by at most 0.05%), so 0.2% covers a formula's accumulated rounding
    (at most 0.09% seen over 1,800 problems) while a wrong constant or exponent is far outside it."""
    seen: dict[str, int] = {}
    for name in ("physics_easy", "physics", "physics_hard"):
        for p in get_task(name).problems("train", 100, seed=11):
            m = p.metadata
            gen = m["generator"]
            if seen.get(gen, 0) >= 3:
                continue
            seen[gen] = seen.get(gen, 0) + 1
            value, unit = p.answer.split(" ", 1)
            assert unit == m["unit"] and f"in {unit}" in p.prompt
            dim, factor = ANSWER_UNITS[unit]
            assert dim == m["dimension"], p.id
            givens = {k: float(v.split(" ")[0]) for k, v in m["values"].items()}
            expected = PHYSICS_FORMULAS[gen](givens)
            assert float(value) * factor == pytest.approx(expected, rel=2e-3), (p.id, gen, m["values"], p.answer)
    assert set(seen) == set(PHYSICS_FORMULAS) and min(seen.values()) == 3, seen


def test_hover_labels_balanced_and_claims_sound() -> None:
    for name, hops in (("hover", {2, 3, 4}), ("hover_hard", {3, 4})):
        problems = get_task(name).problems("val", 40, seed=3)
        assert sum(p.answer == "SUPPORTED" for p in problems) == 20
        for p in problems:
            m = p.metadata
            assert m["hops"] in hops and len(m["chain"]) == m["hops"]
            for fact in m["chain"]:  # every deciding fact is in the shown documents
                assert fact["fact"] in p.prompt
            assert (m["claimed_value"] == m["true_value"]) == (p.answer == "SUPPORTED")
            assert f"] {m['twin_start']}: " in p.prompt  # the twin chain's start is shown, whatever the label
            if p.answer == "NOT_SUPPORTED":  # the near miss (a one-swap path from the claim's entity) is shown
                assert all(f["fact"] in p.prompt for f in m["decoy_chain"])
                assert m["decoy_chain"][-1]["fact"].endswith(f"{m['claimed_value']}.") or \
                    f"the {m['claimed_value']} region" in m["decoy_chain"][-1]["fact"]
    hard = get_task("hover_hard").problems("val", 20, seed=3)
    easy = get_task("hover_easy").problems("val", 20, seed=3)
    assert min(p.metadata["n_docs"] for p in hard) > max(p.metadata["n_docs"] for p in easy)
    task = get_task("hover")
    p = next(p for p in get_task("hover").problems("train", 10, seed=1) if p.answer == "NOT_SUPPORTED")
    for form in ("not supported", "Not-Supported.", "**NOT_SUPPORTED**"):
        assert task.reward(p, f"<answer>{form}</answer>") == 1.0
    fb = task.feedback(p, "<answer>SUPPORTED</answer>")
    assert "Deciding facts" in fb and p.metadata["true_value"] in fb
    assert "Near miss: [" in fb and "reached from" in fb and p.metadata["twin_start"] in fb.split("Near miss:")[1]


def test_hover_feedback_works_the_claim_out_from_what_the_documents_give(generated: dict[str, list[Problem]]) -> None:
    """The working line (which the condensed worked examples quote) states the true statement,
    the value the claim names and the verdict: "matches" for a SUPPORTED claim, "contradicts"
    for a NOT_SUPPORTED one. Only its label had been tested: the claim in place of the true
    statement, the true value in place of the claimed one, or the verdicts swapped all passed."""
    task = get_task("hover")
    problems = generated["hover"][:2]  # each consecutive pair holds one of each label
    assert {p.answer for p in problems} == {"SUPPORTED", "NOT_SUPPORTED"}
    for p in problems:
        m = p.metadata
        verdict = "matches" if p.answer == "SUPPORTED" else "contradicts"
        working = (f"So the documents give: {m['true_statement']} The claim says {m['claimed_value']}, "
                   f"which {verdict} them.")
        for given in ("SUPPORTED", "NOT_SUPPORTED"):
            assert working in task.feedback(p, f"<answer>{given}</answer>").split("\n"), (p.id, given)


def test_hover_feedback_shows_the_near_miss_after_a_right_answer_too(generated: dict[str, list[Problem]]) -> None:
    """A NOT_SUPPORTED problem's feedback names its near miss whatever the answer: a right
    answer's feedback explains the decoy as well (only a wrong answer's had been tested)."""
    task = get_task("hover")
    p = next(q for q in generated["hover"] if q.answer == "NOT_SUPPORTED")
    fb = task.feedback(p, "<answer>NOT_SUPPORTED</answer>")
    assert fb.startswith("Correct") and "\nNear miss: [" in fb
    # the near miss explains a NOT_SUPPORTED label only: a problem relabelled SUPPORTED (its
    # metadata kept) does not argue against its own label
    relabelled = replace(p, answer="SUPPORTED")
    for given in ("SUPPORTED", "NOT_SUPPORTED"):
        assert "Near miss" not in task.feedback(relabelled, f"<answer>{given}</answer>"), given


def test_hover_feedback_quotes_the_label_as_read_or_the_unreadable_answer_as_written(
        generated: dict[str, list[Problem]]) -> None:
    """"Answer given" shows the label an answer was read as ("not supported" as NOT_SUPPORTED);
    an answer naming no label is quoted as written, with a note that it must be one of the two;
    a completion without an answer block reads as none, and gets no such note."""
    task = get_task("hover")
    p = generated["hover"][0]
    rule = "The answer must be exactly SUPPORTED or NOT_SUPPORTED."
    read = task.feedback(p, "<answer>not supported</answer>").split("\n")
    assert "Answer given: NOT_SUPPORTED" in read and rule not in read
    unreadable = task.feedback(p, "<answer>MAYBE</answer>").split("\n")
    assert "Answer given: MAYBE" in unreadable and rule in unreadable
    missing = task.feedback(p, "The claim is supported.").split("\n")
    assert "Answer given: none could be read." in missing and rule not in missing


def test_a_hover_gold_label_is_compared_in_upper_case(generated: dict[str, list[Problem]]) -> None:
    """The expected label is upper-cased and stripped before the comparison: a problem written
    by hand with its answer in lower case still rewards the right label and not the other."""
    task = get_task("hover")
    for p in generated["hover"][:2]:
        other = "NOT_SUPPORTED" if p.answer == "SUPPORTED" else "SUPPORTED"
        lower = replace(p, answer=f" {p.answer.lower()} ")
        assert task.reward(lower, f"<answer>{p.answer}</answer>") == 1.0, p.answer
        assert task.reward(lower, f"<answer>{other}</answer>") == 0.0, p.answer



def test_a_hover_gold_label_written_with_spaces_or_hyphens_is_read_as_its_label(
        generated: dict[str, list[Problem]]) -> None:
    """A hand-written gold label "not supported" / "Not-Supported" is NOT_SUPPORTED, as the same
    words are when a model answers them: it was only upper-cased ("NOT SUPPORTED"), matched
    neither label, and scored the right answer 0 (and the feedback said "matches" for a false
    claim's verdict: any label but SUPPORTED read as a contradiction)."""
    task = get_task("hover")
    p = next(q for q in generated["hover"] if q.answer == "NOT_SUPPORTED")
    for gold in ("not supported", "Not-Supported", " NOT SUPPORTED "):
        written = replace(p, answer=gold)
        assert task.reward(written, "<answer>NOT_SUPPORTED</answer>") == 1.0, gold
        assert task.reward(written, "<answer>not supported</answer>") == 1.0, gold
        assert task.reward(written, "<answer>SUPPORTED</answer>") == 0.0, gold
        assert "Near miss: [" in task.feedback(written, "<answer>SUPPORTED</answer>"), gold
    s = next(q for q in generated["hover"] if q.answer == "SUPPORTED")
    written = replace(s, answer="Supported.")
    assert task.reward(written, "<answer>SUPPORTED</answer>") == 1.0
    assert task.reward(written, "<answer>NOT_SUPPORTED</answer>") == 0.0


def test_stargraph_lenient_separators_and_arm_feedback(generated: dict[str, list[Problem]]) -> None:
    task = get_task("stargraph")
    p = generated["stargraph"][0]
    nodes = p.answer.split()
    assert task.reward(p, "<answer>" + " -> ".join(nodes) + "</answer>") == 1.0
    assert task.reward(p, "<answer>" + " ".join(nodes[:-1]) + "</answer>") == 0.0
    fb = task.feedback(p, f"<answer>{nodes[0]} 1 2</answer>")
    assert f"arm that starts at {nodes[1]}" in fb and "not an edge" in fb


def test_codeio_scoring_is_structural_and_never_executes(monkeypatch: pytest.MonkeyPatch) -> None:
    task = get_task("codeio")
    p = Problem("c1", "codeio", "…", json.dumps({"a": [1, 2.5, "x"], "b": True, "c": None}, sort_keys=True),
                {"input": {"n": 3}})

    calls: list[str] = []
    good = ('{"c": null, "b": true, "a": [1.0, 2.5, "x"]}', "{'a': [1, 2.5, 'x'], 'b': True, 'c': None}",
            '```json\n{"a": [1, 2.5, "x"], "b": true, "c": null}\n```')
    bad = ('{"a": [1, 2.5, "y"], "b": true, "c": null}', '{"a": [1, 2.5, "x"], "b": 1, "c": null}',
           "__import__('os').system('echo hi')", "[" * 5000)
    # ast.literal_eval parses (compile with PyCF_ONLY_AST) but must never exec/eval anything.
    with monkeypatch.context() as m:
        m.setattr(builtins, "exec", lambda *a, **k: calls.append("exec"))
        m.setattr(builtins, "eval", lambda *a, **k: calls.append("eval"))
        good_rewards = [task.reward(p, f"<answer>{x}</answer>") for x in good]
        bad_rewards = [task.reward(p, f"<answer>{x}</answer>") for x in bad]
    assert calls == []
    assert good_rewards == [1.0] * len(good) and bad_rewards == [0.0] * len(bad)
    fb = task.feedback(p, '<answer>{"a": [1, 2.5, "y"], "b": true, "c": null}</answer>')
    assert "$.a[2]" in fb and p.answer in fb and '"n": 3' in fb


def test_codeio_reads_a_value_in_the_wrappers_models_write() -> None:
    """\\boxed{312}, `312` and "Output: 312" scored 0 for gold 312 (only ``` fences were taken off):
    a value that does not parse as it stands is read unwrapped; a wrong one still scores 0."""
    task = get_task("codeio")
    for gold, forms in ((312, [r"\boxed{312}", "`312`", "Output: 312", "$312$", "The output is 312", "**312**"]),
                        ([1, [2, "x"]], [r"\boxed{[1, [2, 'x']]}", '`[1, [2, "x"]]`', 'Output: [1, [2, "x"]]']),
                        ({"k": True}, ['`{"k": true}`', "Result = {'k': True}"])):
        p = Problem("c1", "codeio", "…", json.dumps(gold), {"input": {"n": 3}})
        for form in forms:
            assert task.reward(p, f"<answer>{form}</answer>") == 1.0, (form, task.feedback(p, f"<answer>{form}</answer>"))
    p = Problem("c1", "codeio", "…", "312", {"input": {"n": 3}})
    assert task.reward(p, r"<answer>\boxed{313}</answer>") == 0.0
    assert task.reward(p, "<answer>Output: 31 2</answer>") == 0.0


def test_an_empty_answer_block_is_no_answer_even_where_the_output_is_the_empty_string() -> None:
    """A program whose output is "" is answered `<answer>""</answer>` (its gold, JSON) or with the
    bare string; an empty block is no answer (`answered`), so it scored 1 there by the bare-string
    reading of its empty content."""
    task = get_task("codeio")
    p = Problem("c1", "codeio", "…", json.dumps(""), {"input": {"n": 3}})
    assert task.reward(p, '<answer>""</answer>') == 1.0 and task.reward(p, gold_completion(p)) == 1.0
    assert task.reward(p, "<answer></answer>") == 0.0 and task.reward(p, "<answer>  </answer>") == 0.0
    assert not answered("<answer></answer>") and "the <answer></answer> block is empty" in task.feedback(p, "<answer></answer>")
    assert task.reward(Problem("c2", "codeio", "…", json.dumps("ab"), {}), "<answer>ab</answer>") == 1.0


def test_codeio_reads_the_python_literals_a_program_prints_as_json() -> None:
    """Python's spellings of a JSON value are read as it: a tuple is a list, a dict's integer
    keys are JSON's string keys, and a ```python fence comes off as a ```json one does."""
    task = get_task("codeio")
    for gold, forms in (([1, 2], ["(1, 2)", "```python\n[1, 2]\n```"]), ({"1": [2, 3]}, ["{1: (2, 3)}"])):
        p = Problem("c1", "codeio", "…", json.dumps(gold), {"input": {"n": 3}})
        for form in forms:
            assert task.reward(p, f"<answer>{form}</answer>") == 1.0, form


def test_codeio_a_nan_or_infinite_output_is_answered_by_the_same_value_only() -> None:
    """A program's float('nan') or float('inf') is JSON's NaN or Infinity in the gold: the same
    value answers it (NaN equals NaN here), the other infinity or a large finite number does not."""
    task = get_task("codeio")
    for gold, right, wrongs in ((float("nan"), "NaN", ["0", "null", "Infinity"]),
                                (float("inf"), "Infinity", ["-Infinity", "1e308", "NaN"]),
                                (float("-inf"), "-Infinity", ["Infinity", "-1e308"])):
        p = Problem("c1", "codeio", "…", json.dumps(gold), {"input": {"n": 3}})
        assert task.reward(p, f"<answer>{right}</answer>") == 1.0, p.answer
        for wrong in wrongs:
            assert task.reward(p, f"<answer>{wrong}</answer>") == 0.0, (p.answer, wrong)


def test_codeio_tolerance_is_relative_and_only_for_a_fractional_gold() -> None:
    """The gold decides the comparison: an integer gold is met exactly, not by a fraction within
    the relative tolerance (2399813805.5 for 2399813805), and a tiny float gold is not met by 0
    (there is no absolute tolerance)."""
    task = get_task("codeio")
    for gold, wrong in ((2399813805, "2399813805.5"), (1.5e-20, "0"), (1.5e-20, "0.0")):
        p = Problem("c1", "codeio", "…", json.dumps({"v": gold}), {"input": {"n": 3}})
        assert task.reward(p, f'<answer>{{"v": {wrong}}}</answer>') == 0.0, (gold, wrong)
        assert task.reward(p, f"<answer>{p.answer}</answer>") == 1.0


def test_codeio_rel_tol_sets_the_tolerance_of_the_reward_and_of_the_listed_differences() -> None:
    """`rel_tol` (1e-6 by default) is the tolerance of both the reward and the feedback's
    "Differences": with 1e-3, 0.5004 for 0.5 is right, and beside a wrong key it is not listed."""
    from fastslow.tasks import codeio

    p = Problem("c1", "codeio", "…", json.dumps({"a": 0.5, "b": "x"}), {"input": {"n": 3}})
    loose = codeio.CodeIOTask(isolate=False, rel_tol=1e-3)
    close = '<answer>{"a": 0.5004, "b": "x"}</answer>'
    assert loose.reward(p, close) == 1.0 and codeio.CodeIOTask(isolate=False).reward(p, close) == 0.0
    lines = loose.feedback(p, '<answer>{"a": 0.5004, "b": "y"}</answer>').split("\n")
    assert 'Differences: $.b: expected "x", got "y"' in lines


def test_codeio_says_an_answer_is_no_json_value_unless_the_gold_is_a_string() -> None:
    """An answer that parses as no JSON (or Python) value is told so; where the gold is a string
    the bare text is read as one instead (no quotes needed), right or wrong."""
    task = get_task("codeio")
    note = "The answer is not a JSON value (use double quotes, true/false/null)."
    number = Problem("c1", "codeio", "…", "312", {"input": {"n": 3}})
    assert note in task.feedback(number, "<answer>three hundred</answer>").split("\n")
    text = Problem("c2", "codeio", "…", json.dumps("three hundred"), {"input": {"n": 3}})
    assert task.reward(text, "<answer>three hundred</answer>") == 1.0
    assert note not in task.feedback(text, "<answer>two hundred</answer>")


def test_codeio_feedback_quotes_the_input_cut_to_500_characters_whatever_the_verdict() -> None:
    """The program's input is quoted in the feedback (as JSON, its first 500 characters) after a
    right answer as after a wrong one."""
    task = get_task("codeio")
    shown = {"xs": list(range(1000))}
    p = Problem("c1", "codeio", "…", "1", {"input": shown})
    for completion in ("<answer>1</answer>", "<answer>2</answer>"):
        assert "Input was: " + json.dumps(shown)[:500] in task.feedback(p, completion).split("\n"), completion


def test_codeio_keeps_only_items_whose_program_gives_the_gold_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference program drawing from unseeded `random` (a Monte Carlo estimate of e), or one
    changing its input in place (reasoning-gym shows the changed input), made problems no model
    can answer: ~1-5% of them. An item is kept only if the program, run again twice with other
    seeds on a copy of the input shown, gives the gold."""
    from fastslow.tasks import codeio

    plain = "def main_solution(xs):\n    return sorted(xs)[::-1]\n"
    drawn = "import random\ndef main_solution(n):\n    return sum(random.random() for _ in range(n))\n"
    mutating = "def main_solution(arr):\n    arr.reverse()\n    return [arr, sorted(arr)]\n"
    seeded = "import random\ndef main_solution(n):\n    r = random.Random(n)\n    return r.randint(0, 10**9)\n"
    assert codeio._reproducible(plain, {"xs": [3, 1, 2]}, "[3, 2, 1]", 7, 2.0)
    assert not codeio._reproducible(plain, {"xs": [3, 1, 2]}, "[1, 2, 3]", 7, 2.0)
    import random as random_

    random_.seed(7)  # the gold as generation drew it, with its own seed of the global RNG
    gold = sum(random_.random() for _ in range(5))
    assert not codeio._reproducible(drawn, {"n": 5}, json.dumps(gold), 7, 2.0)
    # the shown input is the one the program left behind: [2, 1] (it was [1, 2]); its gold [[2, 1], [1, 2]]
    assert not codeio._reproducible(mutating, {"arr": [2, 1]}, "[[2, 1], [1, 2]]", 7, 2.0)
    assert codeio._reproducible(seeded, {"n": 4}, json.dumps(random_.Random(4).randint(0, 10**9)), 7, 2.0)
    assert not codeio._reproducible("def main_solution(n):\n    while True: pass\n", {"n": 1}, "1", 7, 0.2)
    # generation asks it of every output-prediction item, with the shown input and the gold
    seen = []
    monkeypatch.setattr(codeio, "_reproducible", lambda code, shown, answer, *_: seen.append((shown, answer)) or True)
    (problem,) = codeio.CodeIOTask(isolate=False).problems("val", 1, seed=0)
    assert seen and (problem.metadata["input"], problem.answer) in [(s, json.dumps(json.loads(a), sort_keys=True))
                                                                   for s, a in seen]
    monkeypatch.setattr(codeio, "_reproducible", lambda *_: False)
    with pytest.raises(TaskDataError, match="codeio: only 0 distinct val problems"):
        codeio.CodeIOTask(isolate=False).problems("val", 1, seed=0)


def test_codeio_keeps_no_item_whose_gold_is_one_order_of_a_set_of_strings() -> None:
    """A program returning `list(set(names))` (or `max` over a set with ties) gives its gold in
    the order of the worker's string hashes (PYTHONHASHSEED=0), which no model can read from the
    program: 3 of 474 items a review ran again, kept when the re-runs ran in the worker's own
    process. They run in helper processes under other hash seeds now."""
    import os
    import subprocess
    import sys

    from fastslow.tasks import codeio

    names = {"names": ["Alice", "Bob", "Frank", "Hank", "Grace", "Ivy"]}
    as_set = "def main_solution(names):\n    return list(set(names))\n"
    ordered = "def main_solution(names):\n    return sorted(set(names))\n"
    # as the worker asks it: in a process under PYTHONHASHSEED=0, of a gold that process made
    check = (f"import json\nfrom fastslow.tasks import codeio\n{as_set}gold = json.dumps(main_solution(**{names!r}))\n"
             f"print(json.dumps([gold, codeio._reproducible({as_set!r}, {names!r}, gold, 7, 2.0), "
             f"codeio._reproducible({ordered!r}, {names!r}, json.dumps(sorted({names['names']!r})), 7, 2.0)]))")
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", check], env=env, check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    gold, kept_as_set, kept_ordered = json.loads(out)
    assert json.loads(gold) != sorted(names["names"])  # (the worker's order is not the sorted one)
    assert not kept_as_set and kept_ordered
    # a helper that cannot start stops the build in one line (it dropped every item, silently)
    import multiprocessing.spawn

    runner = codeio._HashSeedRunner(5)
    executable = multiprocessing.spawn.get_executable()
    multiprocessing.spawn.set_executable("/bin/false")
    try:
        with pytest.raises(RuntimeError, match=r"^codeio: the helper process that re-runs programs under "
                                               r"PYTHONHASHSEED=5 did not start \(it said None\)"):
            runner.submit(ordered, names, 7, 2.0)
    finally:
        multiprocessing.spawn.set_executable(executable)
    assert runner.proc is None and runner.conn is None
    # a program that ends its helper fails its item; the helper is started again for the next
    assert not codeio._reproducible("import os\ndef main_solution(names):\n    os._exit(3)\n", names, "1", 7, 2.0)
    assert codeio._reproducible(ordered, names, json.dumps(sorted(names["names"])), 7, 2.0)


def test_a_codeio_programs_time_limit_is_cpu_time_not_the_machines_load() -> None:
    """A reference program's limit was wall-clock time: with other jobs on the cores a program of
    about a second passed 2 s, its item was dropped and every later item of the split shifted, so
    the splits depended on the machine's load. Time spent not running (here asleep, as when the
    cores are taken) no longer counts; computing past the limit still stops the program, and one
    that waits for ever is stopped by the wall-clock limit behind it."""
    from fastslow.tasks.codeio import WALL_FACTOR, _seeded_run

    with _seeded_run(0, 0.2):
        time.sleep(0.5)  # 0.5 s of wall-clock time, none of it CPU time
    start, cpu = time.monotonic(), time.process_time()
    with pytest.raises(TimeoutError), _seeded_run(0, 0.2):
        while time.monotonic() - start < 5:
            pass
    # stopped by its CPU time (the wall-clock limit, 2 s, would let it compute for up to 2 s on
    # an idle core); counted in CPU time, the check holds when a loaded machine lends it little
    assert time.process_time() - cpu < 0.2 * WALL_FACTOR / 2
    start = time.monotonic()
    with pytest.raises(TimeoutError), _seeded_run(0, 0.05):
        time.sleep(5)
    assert time.monotonic() - start < 1


@pytest.mark.parametrize("platform", ["linux", "macos"])
def test_a_codeio_limit_leaves_no_timer_armed_and_puts_back_what_it_replaced(platform: str, monkeypatch) -> None:
    """Once a run ends, by its limit or not, neither timer is armed (a limit striking later would
    raise in code unrelated to the program), the signals' handlers and a profiler's own CPU-time
    timer are back; and the worker runs numpy's BLAS on one thread, whose CPU time alone the
    limit then counts (two threads spinning on each other took a 0.2 CPU-s program past 2 s).
    macOS has no `signal.sigtimedwait`: every run's end raised AttributeError there, so every
    item was dropped and the main job's codeio splits failed."""
    import os
    import signal

    from fastslow.tasks import codeio

    sigtimedwait = signal.sigtimedwait
    if platform == "macos":
        monkeypatch.delattr(signal, "sigtimedwait")
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, codeio._LIMITS)
    try:  # a limit that struck while blocked is taken, and nothing else waits
        signal.raise_signal(signal.SIGALRM)
        assert signal.SIGALRM in signal.sigpending()
        codeio._take_pending(codeio._LIMITS)
        assert not signal.sigpending() & set(codeio._LIMITS)
        codeio._take_pending(codeio._LIMITS)
    finally:  # (what a failure left pending would end the test process once unblocked)
        while sigtimedwait(codeio._LIMITS, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def profiler(signum, frame):  # a sampling profiler's stand-in
        pass

    before = signal.signal(signal.SIGPROF, profiler)
    signal.setitimer(signal.ITIMER_PROF, 100.0)
    try:
        for body in ("pass", "while True: pass"):
            try:
                with codeio._seeded_run(0, 0.1):
                    exec(body)  # noqa: S102
            except TimeoutError:
                assert body != "pass"
            assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
            assert signal.getsignal(signal.SIGPROF) is profiler and 90 < signal.getitimer(signal.ITIMER_PROF)[0] < 101
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, before)
    seen = {}

    def worker(cmd, env, cwd, stall=None):
        seen.update(env)
        return 1, ["stopped here"]

    monkeypatch.setattr(codeio, "run_worker", worker)
    monkeypatch.setitem(os.environ, "OPENBLAS_NUM_THREADS", "8")
    monkeypatch.setitem(os.environ, "HF_TOKEN", "hf_secret")  # the job's tokens stay out of the worker
    with pytest.raises(Exception, match="stopped here"):
        get_task("codeio").problems_for_splits({"train": 1}, 0)
    assert all(seen[v] == "1" for v in codeio.BLAS_THREAD_VARIABLES) and seen["PYTHONHASHSEED"] == "0"
    assert "HF_TOKEN" not in seen and seen["PATH"] == os.environ["PATH"]


def test_codeio_partial_credit_never_scores_a_wrong_answer_as_right() -> None:
    """`partial_credit` (off by default, and untested before) gives a near miss reasoning-gym's
    similarity, at most 0.9: a wrong answer stays below a right one's 1, and without the option
    it scores 0."""
    from fastslow.tasks import codeio
    from fastslow.tasks.base import Problem

    p = Problem(id="x", task="codeio", prompt="q", answer=json.dumps({"x": 1.0, "name": "abcdefgh"}))
    near = '<answer>{"x": 1.00001, "name": "abcdefgh"}</answer>'  # outside rel_tol 1e-6
    partial = codeio.CodeIOTask(isolate=False, partial_credit=True)
    assert partial.reward(p, near) == pytest.approx(0.9)
    assert 0 < partial.reward(p, '<answer>{"x": 1.0, "name": "abcdefgi"}</answer>') < 0.9
    assert partial.reward(p, '<answer>{"x": 1.0, "name": "abcdefgh"}</answer>') == 1.0
    assert partial.reward(p, "<answer>nonsense</answer>") == 0.0
    assert codeio.CodeIOTask(isolate=False).reward(p, near) == 0.0


def test_codeio_partial_credit_reaches_an_answer_that_is_no_json_value() -> None:
    """With `partial_credit`, an answer holding the gold object with words after it (no JSON
    value as a whole) gets reasoning-gym's similarity, below 0.9 and above 0, and its feedback
    opens "Partially correct"."""
    from fastslow.tasks import codeio

    p = Problem(id="x", task="codeio", prompt="q", answer=json.dumps({"x": 1.0, "name": "abcdefgh"}))
    partial = codeio.CodeIOTask(isolate=False, partial_credit=True)
    words = f"<answer>{p.answer} are the values</answer>"
    assert 0 < partial.reward(p, words) < 0.9
    fb = partial.feedback(p, words)
    assert fb.startswith("Partially correct (reward 0.") and "The answer is not a JSON value" in fb


def test_codeio_partial_credit_stops_at_twice_the_golds_length_plus_200_characters() -> None:
    """`_partial` skips long answers (reasoning-gym's similarity is quadratic): an answer of up
    to 2 * len(gold) + 200 characters gets its similarity, one a character longer gets 0."""
    from fastslow.tasks import codeio

    p = Problem(id="x", task="codeio", prompt="q", answer=json.dumps({"x": 1.0, "name": "abcdefgh"}))
    partial = codeio.CodeIOTask(isolate=False, partial_credit=True)
    limit = 2 * len(p.answer) + 200
    padded = {n: p.answer + " " + "w" * (n - len(p.answer) - 1) for n in (limit, limit + 1)}
    assert [len(a) for a in padded.values()] == [limit, limit + 1]
    assert partial.reward(p, f"<answer>{padded[limit]}</answer>") > 0
    assert partial.reward(p, f"<answer>{padded[limit + 1]}</answer>") == 0.0


@pytest.mark.parametrize(("options", "named"), [
    ({"max_prompt_chars": 1}, "data.options.codeio.max_prompt_chars=1 (longer prompts)"),
    ({"item_timeout": 1e-6}, "data.options.codeio.item_timeout=1e-06 (the program failed or ran out of CPU seconds)"),
])
def test_a_codeio_option_that_rejects_every_program_is_named(options: dict[str, Any], named: str) -> None:
    """A setting the config check accepts but no program passes: the error blamed the problem
    space ("widen the generator") after running every program; it names the setting, across the
    worker's process boundary."""
    from fastslow.tasks import codeio

    with pytest.raises(TaskDataError) as err:
        codeio.CodeIOTask(**options).problems_for_splits({"val": 1}, 0)
    assert str(err.value).startswith("codeio: only 0 distinct val problems after ")
    assert str(err.value).endswith(f" left were rejected by {named}"), str(err.value)


def test_a_codeio_program_whose_prompt_is_too_long_anyway_is_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its question holds the program's text, so one longer than max_prompt_chars with an empty
    input is rejected whatever it outputs: not run. The bound never exceeds the real question."""
    from reasoning_gym.code.codeio import OUTPUT_PREDICTION_PROMPT_TEMPLATE

    from fastslow.tasks import codeio

    task = codeio.CodeIOTask(isolate=False)
    ds = task.dataset(task.sources[0], 5)
    checked = 0
    for idx in range(40):
        program = random.Random(ds.seed + idx).choice(type(ds)._jsonl_data)
        if codeio.reaches_outside(program):
            continue
        item = codeio._run_item(ds, idx, 7, 2.0)
        if item is None or "Can you predict the output" not in item["question"]:
            continue
        bound = OUTPUT_PREDICTION_PROMPT_TEMPLATE.format(program["task_description"], program["input_output_spec"],
                                                         "", program["code_sample"])
        assert len(bound) < len(item["question"])
        checked += 1
    assert checked >= 5
    ran = []
    real = codeio._run_item
    monkeypatch.setattr(codeio, "_run_item", lambda *a: ran.append(a) or real(*a))
    with pytest.raises(TaskDataError, match="max_prompt_chars=1 "):
        codeio.CodeIOTask(isolate=False, max_prompt_chars=1).problems("val", 1, seed=0)
    assert not ran
    codeio.CodeIOTask(isolate=False, max_prompt_chars=2500).problems("val", 1, seed=0)
    assert ran  # the check is not what stopped every run


def test_codeio_splits_are_the_same_with_and_without_the_length_check(tmp_path: Path) -> None:
    """Programs too long for any input are no longer run: the problems must not change. Each
    side in a process of its own, as the worker runs (a program may change process state)."""
    import os
    import subprocess
    import sys

    script = ("import json, sys\n"
              "from fastslow.tasks import codeio\n"
              "if sys.argv[1] == 'off':\n"
              "    codeio.CodeIOTask._too_long_for_any_input = lambda self, program: False\n"
              "task = codeio.CodeIOTask(isolate=False)\n"
              "got = task.problems_for_splits({'train': 16, 'val': 4}, 11)\n"
              "print(json.dumps({s: [[p.id, p.prompt, p.answer] for p in ps] for s, ps in got.items()}))\n")
    env = {**os.environ, "PYTHONHASHSEED": "0", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = {side: subprocess.run([sys.executable, "-c", script, side], capture_output=True, text=True, env=env,
                                cwd=tmp_path, timeout=300, check=True).stdout for side in ("on", "off")}
    assert json.loads(out["on"]) == json.loads(out["off"]) and len(json.loads(out["on"])["train"]) == 16


def test_codeio_generated_splits(codeio_dir: Path) -> None:
    task = get_task("codeio")
    splits = {s: load_problems(codeio_dir / f"{s}.parquet") for s in SPLITS}
    assert [len(splits[s]) for s in SPLITS] == [6, 3, 3]
    programs = {s: {p.metadata["program_id"] for p in ps} for s, ps in splits.items()}
    assert not programs["train"] & programs["test"] and not programs["train"] & programs["val"]
    for p in splits["train"]:
        assert "Can you predict the output" in p.prompt and "<answer>" in p.prompt
        assert task.reward(p, right(p)) == 1.0 and task.reward(p, wrong(p)) == 0.0


def test_codeio_write_splits_is_byte_identical(codeio_dir: Path, tmp_path: Path) -> None:
    write_splits("codeio", tmp_path, {"train": 6, "val": 3, "test": 3}, seed=5)
    for s in SPLITS:
        assert (tmp_path / f"{s}.parquet").read_bytes() == (codeio_dir / f"{s}.parquet").read_bytes()


# --- generation: determinism, disjointness, prefix stability --------------------------------
@pytest.mark.parametrize("name", CHEAP)
def test_generation_is_deterministic_and_split_disjoint(name: str) -> None:
    task = get_task(name)
    a = {s: task.problems(s, 12, seed=7) for s in SPLITS}
    assert a["train"] == get_task(name).problems("train", 12, seed=7)
    assert a["val"][:5] == task.problems("val", 5, seed=7)  # growing a split only appends
    assert [p.id for p in task.problems("train", 12, seed=8)] != [p.id for p in a["train"]]
    ids = [p.id for ps in a.values() for p in ps]
    prompts = [p.prompt for ps in a.values() for p in ps]
    assert len(set(ids)) == len(ids) == 36 and len(set(prompts)) == 36
    for s, ps in a.items():  # each problem lies in the hash region its split owns
        assert all(p.task == name and f"-{s}-" in p.id and split_of(p.metadata.get("split_key", p.prompt)) == s
                   for p in ps)


@pytest.mark.parametrize(("name", "split", "n"), [("physics", "test", 32), ("math_easy", "val", 32),
                                                  ("physics_hard", "val", 64)])
def test_a_split_holds_one_problem_once_however_worded(name: str, split: str, n: int) -> None:
    """A key that names one problem is in a split once: physics' test split at the CPU default's
    size held "1.5 kΩ" and "1500 Ω" of one problem (only equal prompts were told apart), and
    math_easy's val "7 - 5 =" beside "Calculate 7 - 5."; a val mean counted them twice."""
    problems = get_task(name).problems(split, n, seed=1234)
    keys = [p.metadata["split_key"] for p in problems]
    assert len(problems) == n and len(set(keys)) == n, Counter(keys).most_common(2)


@pytest.mark.parametrize("name", ["math", "physics", "physics_hard"])
def test_a_key_that_names_one_problem_has_one_answer(name: str) -> None:
    """Where a key names one problem (a split then holds one candidate of it), its candidates
    have one answer: math's word-problem key had left out list-valued numbers and words, and one
    flower-stand template's key had 17 answers in 3000 candidates, of which a split kept one.
    (physics_hard asks some in another unit: one value in SI.)"""
    import random as _random

    from fastslow.tasks.generated import stable_int

    task = get_task(name)
    assert task.key_names_one_problem
    answers: dict[str, set] = {}
    for split in ("train", "val"):
        for attempt in range(1500):
            rng = _random.Random(stable_int(task.family, task.difficulty, 1234, split, attempt))
            cand = task.candidate(rng, 0, split, 1234, attempt)
            if cand is not None:
                answers.setdefault(cand.key, set()).add(
                    cand.answer if task.family == "math" else float(f"{cand.metadata['value_si']:.6g}"))
    assert len(answers) > 2500
    assert not {k: v for k, v in answers.items() if len(v) > 1}


def test_a_word_problems_key_holds_its_lists_and_its_answer_not_its_names() -> None:
    """The key above is checked over generated candidates, where the answer in the key makes a
    second answer impossible by construction: the parts of the key each, directly. Lists of
    numbers tell two problems apart (one template's numbers were all lists), so does the answer
    (a word, "week" or "month", changes it), and names and objects do not."""
    from fastslow.tasks.math_task import problem_identity

    base = {"name": "James", "item": "roses", "prices": [3, 5], "count": 4}
    key = problem_identity("", "", "", base, "32")
    assert key == problem_identity("", "", "", {**base, "name": "David", "item": "tulips"}, "32")
    assert key != problem_identity("", "", "", {**base, "prices": [3, 6]}, "32")  # only a list differs
    assert key != problem_identity("", "", "", base, "128")  # only a word (and so the answer) differs
    assert key != problem_identity("", "", "", {**base, "count": 5}, "32")


def test_series_and_parallel_resistors_in_either_order_are_one_problem() -> None:
    """"410 Ω and 570 Ω" in parallel is the problem of "570 Ω and 410 Ω": one key, so one split.
    At paper.yaml's sizes 2 of physics' 256 val problems had their twin in train; R2's power in
    series is not symmetric, and keeps the order."""
    from fastslow.tasks.physics import problem_identity

    for gen in ("series", "parallel"):
        assert problem_identity(gen, {"R1": "410 Ω", "R2": "570 Ω", "V": "12 V"}) == \
            problem_identity(gen, {"V": "12 V", "R1": "570 Ω", "R2": "410 Ω"})
    assert problem_identity("series_power", {"R1": "410 Ω", "R2": "570 Ω", "V": "12 V"}) != \
        problem_identity("series_power", {"R1": "570 Ω", "R2": "410 Ω", "V": "12 V"})
    # ...and the generated problems' keys are made so
    problems = get_task("physics").problems("train", 300, seed=1)
    swapped = [p for p in problems if p.metadata["generator"] in ("series", "parallel")]
    assert swapped
    for p in swapped:
        values = dict(p.metadata["values"])
        values["R1"], values["R2"] = values["R2"], values["R1"]
        assert problem_identity(p.metadata["generator"], values) == p.metadata["split_key"]


def test_write_splits_deterministic_atomic_and_roundtrip(tmp_path: Path) -> None:
    sizes = {"train": 10, "val": 4, "test": 4}
    first = write_splits("hover_hard", tmp_path / "a", sizes, seed=1)
    second = write_splits("hover_hard", tmp_path / "b", sizes, seed=1)
    other = write_splits("hover_hard", tmp_path / "c", sizes, seed=2)
    for s in SPLITS:
        assert first[s].read_bytes() == second[s].read_bytes()
        assert first[s].read_bytes() != other[s].read_bytes()
    assert sorted(x.name for x in (tmp_path / "a").iterdir()) == ["test.parquet", "train.parquet", "val.parquet"]
    loaded = load_problems(first["train"])
    assert loaded == get_task("hover_hard").problems("train", 10, seed=1)
    with pytest.raises(ValueError, match="'dev'"):
        write_splits("hover", tmp_path / "d", {"dev": 3}, seed=1)


def test_write_problems_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    ps = get_task("physics").problems("test", 3, seed=1)
    write_problems(ps, path)
    write_problems(ps[:1], path)
    assert load_problems(path) == ps[:1]
    assert [f.name for f in tmp_path.iterdir()] == ["x.parquet"]
    # a writer killed mid-write (SIGKILL: no clean-up) leaves its temporary; the next write of the
    # split removes it (its own mkstemp files had stayed for good), and a failed write keeps the old file
    import tempfile

    stale = Path(tempfile.mkdtemp(prefix=".x.parquet.", dir=tmp_path))
    (stale / "x.parquet").write_bytes(b"PAR1 half")
    write_problems(ps, path)
    assert [f.name for f in tmp_path.iterdir()] == ["x.parquet"] and load_problems(path) == ps

    class Bad:
        def to_row(self) -> dict[str, Any]:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_problems([*ps, Bad()], path)  # type: ignore[list-item]
    assert load_problems(path) == ps and [f.name for f in tmp_path.iterdir()] == ["x.parquet"]


def test_write_splits_names_every_unknown_split_before_generating(tmp_path: Path) -> None:
    """The splits' own check names them all and the splits there are; a task's own check of one
    split (which most tasks also make) named only the first."""
    with pytest.raises(ValueError, match=r"^unknown split\(s\) 'dev', 'bad'; expected train, val, test$"):
        write_splits("hover", tmp_path / "d", {"train": 2, "dev": 3, "bad": 1}, seed=1)
    assert not (tmp_path / "d").exists()


def test_a_split_asked_for_no_problems_is_written_empty(tmp_path: Path) -> None:
    """Only a split asked for problems and given none is the 'empty split' error; size 0 is a
    split file without rows."""
    paths = write_splits("hover_hard", tmp_path, {"train": 4, "val": 0, "test": 2}, seed=1)
    assert [len(load_problems(paths[s])) for s in SPLITS] == [4, 0, 2]


def test_a_task_giving_one_id_to_two_splits_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fastslow.tasks as tasks

    class Twice:
        name = "twice"

        def problems(self, split: str, n: int, seed: int) -> list[Problem]:
            return [Problem("p1" if split == "test" else "p0", "twice", f"The {split} question?", "1")]

    monkeypatch.setattr(tasks, "get_task", lambda name, **options: Twice())
    with pytest.raises(RuntimeError, match=r"^twice: problem p0 appears in train and val$"):
        write_splits("twice", tmp_path / "out", {"train": 1, "val": 1, "test": 1}, seed=0)
    assert not (tmp_path / "out").exists()


def test_gold_answers_below_1_or_nan_are_counted_and_the_first_is_logged_with_its_feedback(
        caplog: pytest.LogCaptureFixture) -> None:
    """A bare `Task` (no judge): its reward of each problem's own answer in <answer> tags; a NaN
    is below 1, exactly 1 is not; the first (in split order) is logged with its feedback's
    non-blank lines joined."""
    import logging

    from fastslow.tasks.data import check_gold_answers

    class Bare:
        name = "bare"
        rewards = {"a": 1.0, "b": float("nan"), "c": 0.5, "d": 1.0}

        def reward(self, problem: Problem, completion: str) -> float:
            assert completion == f"<answer>{problem.answer}</answer>"
            return self.rewards[problem.id]

        def feedback(self, problem: Problem, completion: str) -> str:
            return f"  Incorrect  \n\n expected {problem.answer}\n"

    def problem(pid: str) -> Problem:
        return Problem(pid, "bare", f"{pid}?", pid.upper())

    splits = {"val": [problem("c")], "train": [problem("a"), problem("b")], "test": [problem("d")]}
    with caplog.at_level(logging.WARNING, logger="fastslow.tasks.data"):
        assert check_gold_answers(Bare(), splits) == 2
    assert [r.getMessage() for r in caplog.records] == [
        "bare: 2 of 4 problems score below 1 on their own answer written as the task asks (<answer>…</answer>); "
        "first: b (reward nan): Incorrect | expected B"]


def test_a_scorer_raising_on_a_gold_answer_is_one_line_with_the_answer_and_the_error_cut_short(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fastslow.tasks.data import check_gold_answers

    task = get_task("math")

    def judge(problem: Problem, completion: str) -> Any:
        raise ValueError("cannot\n   parse " + "x" * 300)

    monkeypatch.setattr(task, "judge", judge)
    gold = "1" * 80
    with pytest.raises(TaskDataError) as err:
        check_gold_answers(task, {"val": [Problem("m1", "math", "What is 1?", gold)]})
    assert str(err.value) == (f"math: scoring problem m1's own answer {gold[:60]!r} raised ValueError: "
                              f"{('cannot parse ' + 'x' * 300)[:200]} (a bug in the task's scorer: every "
                              "completion would score 0)")


def test_a_split_file_without_a_column_names_the_file_and_every_missing_column(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "old.parquet"
    pq.write_table(pa.table({"id": ["p0"], "task": ["math"], "prompt": ["1 + 1?"]}), path)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: missing column\(s\) answer, metadata$"):
        load_problems(path)
    # a row's metadata that is no JSON object names the file and the problem; null is no metadata
    columns = {"id": ["p0", "p1"], "task": ["math"] * 2, "prompt": ["1 + 1?", "2 + 2?"], "answer": ["2", "4"]}
    pq.write_table(pa.table({**columns, "metadata": [None, '{"k": 1}']}), path)
    assert [p.metadata for p in load_problems(path)] == [{}, {"k": 1}]
    pq.write_table(pa.table({**columns, "metadata": ["{}", "[1]"]}), path)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: problem 'p1': metadata must be a JSON object, "
                                         r"got list$"):
        load_problems(path)


# --- loaders --------------------------------------------------------------------------------
def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _rows(n: int = 30) -> list[dict]:
    return [{"id": f"q{i}", "prompt": f"What is {i} + 1? <answer></answer>", "answer": str(i + 1),
             "metadata": {"k": i}} for i in range(n)]


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_local_file_task_jsonl_and_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _rows()
    task = load_task_file(_jsonl(tmp_path / "mine.jsonl", rows), scorer="numeric")
    pq.write_table(pa.Table.from_pylist([{**r, "metadata": json.dumps(r["metadata"])} for r in rows]),
                   tmp_path / "mine.parquet")
    task_pq = load_task_file(tmp_path / "mine.parquet", scorer="numeric")
    for t in (task, task_pq):
        split = {s: t.problems(s, 100, seed=0) for s in SPLITS}
        assert sum(len(v) for v in split.values()) == 30
        assert not {p.id for p in split["train"]} & {p.id for p in split["test"]}
        p = split["train"][0]
        assert t.reward(p, f"<answer>{p.answer}.0</answer>") == 1.0
        assert t.reward(p, "<answer>-1</answer>") == 0.0
        assert p.metadata["k"] == int(p.id[1:])
    with pytest.warns(UserWarning, match="only"):
        task.problems("val", 1000, seed=0)


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_local_file_split_column_and_label_scorer(tmp_path: Path) -> None:
    rows = [{"id": i, "prompt": "Claim?", "answer": ["SUPPORTED", "NOT_SUPPORTED"][i % 2],
             "split": SPLITS[i % 3]} for i in range(12)]
    task = load_task_file(_jsonl(tmp_path / "claims.jsonl", rows), scorer="label")
    assert {p.id for p in task.problems("val", 10, seed=0)} == {str(i) for i in range(12) if i % 3 == 1}
    p = task.problems("train", 1, seed=0)[0]
    assert task.reward(p, f"<answer>{p.answer.lower().replace('_', ' ')}</answer>") == 1.0
    assert "must be one of" in task.feedback(p, "<answer>maybe</answer>")


@pytest.mark.parametrize("mutate, reason", [
    (lambda rows: [{k: v for k, v in r.items() if k != "answer"} for r in rows], "missing column"),
    (lambda rows: rows[:3] + [{**rows[3], "prompt": "  "}] + rows[4:], "row 4: empty prompt"),
    (lambda rows: rows[:5] + [{**rows[5], "id": "q1"}] + rows[6:], "row 6: duplicate id 'q1'"),
    # ids are compared stripped, and the message names the twin's row
    (lambda rows: rows[:5] + [{**rows[5], "id": " q1 "}] + rows[6:], "row 6: duplicate id 'q1' (first seen in row 2)"),
    (lambda rows: [{**r, "split": "dev" if i == 2 else "train"} for i, r in enumerate(rows)], "row 3: split 'dev'"),
    # a file with a split column: a row without one was hash-split, into any split, silently
    (lambda rows: [{**r, "split": None if i == 3 else "train"} for i, r in enumerate(rows)],
     "row 4: empty split; a file with a split column gives every row one of train, val, test"),
    (lambda rows: rows[:1] + [{**r, "split": "test"} for r in rows[1:]], "row 1: empty split"),
    # no answer read from a completion holds the tag: the problem scored 0 whatever was written
    (lambda rows: rows[:6] + [{**rows[6], "answer": "a</answer>b"}] + rows[7:], "row 7: the answer holds an <answer>"),
    (lambda rows: rows[:6] + [{**rows[6], "answer": "x <ANSWER> y"}] + rows[7:], "row 7: the answer holds an <answer>"),
    (lambda rows: rows[:1] + [{**rows[1], "metadata": [1]}] + rows[2:], "row 2: metadata"),
    # a misspelt split column was ignored: the rows were hash-split, test rows leaking into train
    (lambda rows: [{**r, "splt": "test"} for r in rows],
     "unknown column(s) 'splt'; expected id, prompt, answer, split, metadata"),
    (lambda rows: rows[:2] + [{**rows[2], "prompt": 42}] + rows[3:], "row 3: prompt: expected text, got int 42"),
    # written as their repr, answers no model gives: the task scored 0 whatever it learnt
    (lambda rows: rows[:1] + [{**rows[1], "answer": [1, 2]}] + rows[2:], "row 2: answer: expected text or a number, got list [1, 2]"),
    (lambda rows: rows[:1] + [{**rows[1], "answer": True}] + rows[2:], "row 2: answer: expected text or a number, got bool True"),
    (lambda rows: rows[:1] + [{**rows[1], "answer": float("nan")}] + rows[2:], "row 2: answer: expected text or a number, got float nan"),
    (lambda rows: rows[:1] + [{**rows[1], "id": [0]}] + rows[2:], "row 2: id: expected text or an integer, got list [0]"),
    # a source's own split name in the metadata decided the split, or crashed with KeyError
    (lambda rows: rows[:4] + [{**rows[4], "metadata": {"split": "validation"}}] + rows[5:],
     "row 5: metadata key 'split' ('validation') is reserved; give the row's split in the split column"),
    (lambda rows: rows[:4] + [{**rows[4], "metadata": {"split": "test"}}] + rows[5:], "row 5: metadata key 'split'"),
    (lambda rows: rows[:2] + [{**rows[2], "id": " "}] + rows[3:], "row 3: empty id"),
    (lambda rows: rows[:1] + [{**rows[1], "metadata": "{not json"}] + rows[2:], "row 2: metadata is not valid JSON"),
    (lambda rows: rows[:1] + [{**rows[1], "prompt": "half a pair \ud800"}] + rows[2:],
     "row 2: text is not valid UTF-8 (lone surrogate)"),
    (lambda rows: rows[:3] + [{k: v for k, v in rows[3].items() if k != "answer"}] + rows[4:], "row 4: missing answer"),
    (lambda rows: rows[:3] + [[rows[3]["prompt"]]] + rows[4:], "row 4: expected a JSON object"),
])
def test_bad_user_files_fail_with_one_line(tmp_path: Path, mutate, reason: str) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", mutate(_rows(8)))
    with pytest.raises(ValueError) as err:
        load_task_file(path)
    assert str(path) in str(err.value) and reason in str(err.value) and "\n" not in str(err.value)


def test_a_parquet_file_that_is_not_one_fails_with_one_line(tmp_path: Path) -> None:
    """A truncated or mislabelled .parquet (pyarrow raises several types) is a TaskDataError
    naming the file, not pyarrow's traceback."""
    path = tmp_path / "mine.parquet"
    path.write_bytes(b"id,prompt,answer\nq0,What is 1+1?,2\n")  # a CSV under a Parquet name
    with pytest.raises(TaskDataError, match=r"mine\.parquet: not a readable Parquet file \(\w+\)$"):
        load_task_file(path)


def test_a_file_task_reads_numbers_a_bom_and_its_split_column_beside_a_metadata_split(tmp_path: Path) -> None:
    """Integer and float answers and integer ids are read as text; a JSONL file saved with a
    byte-order mark (Windows' 'UTF-8') is read, not called invalid JSON on row 1; a split column
    decides the split even where the metadata names one."""
    rows = [{"id": i, "prompt": f"What is {i} + 1? <answer></answer>", "answer": i + 1 if i % 2 else i + 1.5,
             "split": "test" if i == 0 else "train", "metadata": {"split": "validation"}} for i in range(6)]
    path = tmp_path / "bom.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8-sig")
    assert path.read_bytes()[:3] == b"\xef\xbb\xbf"
    task = load_task_file(path, scorer="numeric")
    assert [p.id for p in task.rows()["test"]] == ["0"]
    assert sorted((p.id, p.answer) for p in task.rows()["train"]) == [
        ("1", "2"), ("2", "3.5"), ("3", "4"), ("4", "5.5"), ("5", "6")]


def test_bad_utf8_and_bad_files(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw = tmp_path / "latin1.jsonl"
    raw.write_bytes(b'{"id": "a", "prompt": "ok", "answer": "1"}\n{"id": "b", "prompt": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(ValueError, match=r"latin1\.jsonl: row 2: not valid UTF-8"):
        load_task_file(raw)
    table = pa.table({"id": ["a", "b"], "prompt": [b"fine", b"\xff\xfe"], "answer": ["1", "2"]})
    pq.write_table(table, tmp_path / "bin.parquet")
    with pytest.raises(ValueError, match=r"bin\.parquet: row 2: column 'prompt' is not valid UTF-8"):
        load_task_file(tmp_path / "bin.parquet")
    (tmp_path / "x.csv").write_text("id,prompt,answer\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        load_task_file(tmp_path / "x.csv")
    with pytest.raises(ValueError, match="no such file"):
        load_task_file(tmp_path / "missing.jsonl")


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_hf_loader_on_local_parquet_with_classlabel(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"uid": datasets.Value("string"), "claim": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["NOT_SUPPORTED", "SUPPORTED"]),
                                  "num_hops": datasets.Value("int32")})
    ds = datasets.Dataset.from_dict({"uid": [f"u{i}" for i in range(40)], "claim": [f"Claim {i}." for i in range(40)],
                                     "label": [i % 2 for i in range(40)], "num_hops": [2 + i % 3 for i in range(40)]},
                                    features=features)
    ds.to_parquet(str(tmp_path / "hover.parquet"))
    task = get_task("hf", dataset="parquet", data_files={"train": str(tmp_path / "hover.parquet")},
                    columns={"prompt": "claim", "answer": "label"}, id_column="uid", scorer="label",
                    filters={"num_hops": [3, 4]}, cache_dir=str(tmp_path / "cache"), name="hover_local")
    assert isinstance(task, HFDatasetTask)
    got = [p for s in SPLITS for p in task.problems(s, 100, seed=0)]
    assert len(got) == sum(1 for i in range(40) if 2 + i % 3 >= 3)
    assert {p.answer for p in got} == {"SUPPORTED", "NOT_SUPPORTED"}
    p = got[0]
    assert p.prompt.startswith("Claim") and "<answer></answer>" in p.prompt
    assert task.reward(p, f"<answer>{p.answer}</answer>") == 1.0
    with pytest.raises(ValueError, match="missing column"):
        HFDatasetTask("parquet", data_files={"train": str(tmp_path / "hover.parquet")},
                      cache_dir=str(tmp_path / "cache")).problems("train", 1, seed=0)
    # a map naming only train (as paper.yaml's codeio entry): the splits it leaves out are carved
    # from the source split train reads, disjointly, instead of being written empty
    mapped = get_task("hf", dataset="parquet", data_files={"train": str(tmp_path / "hover.parquet")},
                      columns={"prompt": "claim", "answer": "label"}, id_column="uid", scorer="label",
                      split_map={"train": "train"}, cache_dir=str(tmp_path / "cache"), name="hover_mapped")
    parts = {s: {q.id for q in mapped.problems(s, 100, seed=0)} for s in SPLITS}
    assert all(parts.values()) and sum(map(len, parts.values())) == 40
    assert not (parts["train"] & parts["val"]) and not (parts["val"] & parts["test"])


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_a_hub_dataset_without_ids_is_split_alike_under_any_task_name(tmp_path: Path) -> None:
    """A dataset without an id column had its rows named by their place in their Hub split:
    row 7 of train and row 7 of test were one id, and the splits' check stopped the task_data job.
    And its rows were cut into our splits by a hash of the task's name with that place: the same
    data read as "math" and as "polaris_math" (or a task renamed) had most of one's val in the
    other's train."""
    datasets = pytest.importorskip("datasets")
    for hub in ("train", "test"):
        # (train's last row repeats its first up to whitespace, its answer spelt otherwise: a Hub
        # dataset cannot be edited, so the loader drops it, as write_splits would refuse it)
        datasets.Dataset.from_dict({"q": [f"{hub} question {i}?" for i in range(40)] + [f"{hub}  question 0? "],
                                    "a": [str(i) for i in range(40)] + ["0.0"]}).to_parquet(str(tmp_path / f"{hub}.parquet"))
    files = {hub: str(tmp_path / f"{hub}.parquet") for hub in ("train", "test")}
    common = {"dataset": "parquet", "data_files": files, "columns": {"prompt": "q", "answer": "a"},
              "cache_dir": str(tmp_path / "cache")}
    with pytest.warns(UserWarning, match=r"mine: 2 rows of parquet repeat an earlier row's prompt \(up to whitespace\)"):
        paths = write_splits("hf", tmp_path / "out", {"train": 20, "val": 4, "test": 8}, 0,
                             split_map={"train": "train", "test": "test"}, name="mine", **common)
    test_ids = {p.id for p in load_problems(paths["test"])}
    assert len(test_ids) == 8 and all(i.startswith("mine-test-") for i in test_ids)
    parts = {name: {s: {p.id.removeprefix(f"{name}-") for p in get_task("hf", name=name, **common).problems(s, 100, 0)}
                    for s in ("train", "val")} for name in ("math", "polaris_math")}
    assert parts["math"] == parts["polaris_math"] and parts["math"]["val"]
    assert not parts["math"]["val"] & parts["polaris_math"]["train"]


def test_a_hub_dataset_that_does_not_load_stops_its_task_data_job_in_one_line(tmp_path: Path) -> None:
    """A dataset not found (or gated, or offline) and a split name it lacks: `load_dataset`'s
    own errors had reached the user as a traceback; now a TaskDataError naming the task, the
    dataset and split, and the config entry to check (task_data prints it in one line)."""
    datasets = pytest.importorskip("datasets")
    from fastslow.tasks.base import TaskDataError

    datasets.Dataset.from_dict({"q": ["a"], "a": ["1"]}).to_parquet(str(tmp_path / "t.parquet"))
    common = {"columns": {"prompt": "q", "answer": "a"}, "cache_dir": str(tmp_path / "cache")}
    missing = HFDatasetTask("parquet", data_files={"train": str(tmp_path / "gone.parquet")}, name="mine", **common)
    with pytest.raises(TaskDataError, match=r"^mine: cannot load split 'train' of 'parquet': \w+Error: .*"
                                            r"check its entry under data.hf_datasets") as err:
        missing.problems("train", 1, seed=0)
    assert "\n" not in str(err.value)
    no_split = HFDatasetTask("parquet", data_files={"train": str(tmp_path / "t.parquet")}, name="mine",
                             split_map={"train": "nosuch"}, **common)
    with pytest.raises(TaskDataError, match=r"^mine: cannot load split 'nosuch' of 'parquet'"):
        no_split.problems("train", 1, seed=0)


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_claims_of_one_hotpotqa_item_stay_in_one_split(tmp_path: Path) -> None:
    """HoVer makes several claims of one HotpotQA item (its 2-4-hop extensions and their mutated
    NOT_SUPPORTED versions, one `hpqa_id`): carved by claim id, near-duplicates of opposite labels
    landed in train and val. The hover presets split by `group_column: hpqa_id`."""
    datasets = pytest.importorskip("datasets")
    from fastslow.tasks.loaders import HF_PRESETS

    assert HF_PRESETS["hover_real"]["group_column"] == HF_PRESETS["hover_hard_real"]["group_column"] == "hpqa_id"
    n = 240
    ds = datasets.Dataset.from_dict({"uid": [f"u{i}" for i in range(n)], "claim": [f"Claim {i}." for i in range(n)],
                                     "label": [["NOT_SUPPORTED", "SUPPORTED"][i % 2] for i in range(n)],
                                     "hpqa_id": [f"h{i // 6}" for i in range(n)]})
    ds.to_parquet(str(tmp_path / "hover.parquet"))
    common = {"dataset": "parquet", "data_files": {"train": str(tmp_path / "hover.parquet")}, "scorer": "label",
              "columns": {"prompt": "claim", "answer": "label"}, "id_column": "uid", "split_map": {"train": "train"},
              "cache_dir": str(tmp_path / "cache")}

    def groups(task: Any) -> dict[str, set[str]]:
        return {s: {q.metadata["hpqa_id"] for q in task.problems(s, n, seed=0)} for s in SPLITS}

    by_claim = groups(get_task("hf", name="by_claim", **common))
    assert by_claim["train"] & by_claim["val"]  # what the claim ids' hash did
    by_item = groups(get_task("hf", name="by_item", group_column="hpqa_id", **common))
    assert all(by_item.values()) and sum(map(len, by_item.values())) == n // 6
    assert not (by_item["train"] & by_item["val"]) and not (by_item["val"] & by_item["test"])
    assert not (by_item["train"] & by_item["test"])


def test_codeio_worked_examples_show_question_output_spec_and_input_without_the_program(codeio_dir: Path) -> None:
    """CodeIO's problems carry their reference program, longer than a worked example may be: the
    offline proposer demonstrates them by the question, the output's specification and the given
    input (no working: the feedback does not work the output out); without that it stalls."""
    from fastslow.fast.config import FastConfig
    from fastslow.fast.proposers import ELISION, FORMAT_RULE_PREFIX, ContextDoc, FeedbackEditor
    from fastslow.fast.round import make_proposer

    task = get_task("codeio")
    probs = [p for s in SPLITS for p in load_problems(codeio_dir / f"{s}.parquet")]
    by_id = {p.id: p for p in probs}
    for p in probs:
        gist = task.demo_gist(p)
        question = p.prompt.split("as follows:\n\n", 1)[1].split("\n\n")[0]
        given = p.prompt.split("Given the following input:\n\n", 1)[1].split("\n\nCan you predict")[0]
        assert gist is not None and gist.startswith(question) and gist.endswith(f"Input: {given}")
        assert "\n\nOutput: " in gist and "def main_solution" not in gist and "Tip:" not in gist
        assert "Can you predict" not in gist and len(gist) < len(p.prompt) / 2
    assert task.demo_gist(Problem("x", "codeio", "What does f(3) print?", "9")) is None  # not reasoning-gym's layout

    def records(ids: list[str]) -> list[dict[str, Any]]:
        return [{"problem_id": i, "Score": 0.0, "Generated Outputs": "<answer>0</answer>",
                 "Feedback": task.feedback(by_id[i], "<answer>0</answer>")} for i in ids]

    fmt = ContextDoc("Predict.", [f"{FORMAT_RULE_PREFIX}."]).render()
    ids = list(by_id)
    plain = FeedbackEditor(by_id, seed=0)
    assert all(len(plain.demo_text(p)) > plain.max_demo_chars for p in probs)
    plain.edit("Another parent.", records(ids[:8]))
    assert plain.edit(fmt, records(ids[8:])) is None  # the stall without the gist

    ed = make_proposer(FastConfig(), probs, lambda _m: None, task)
    ed.edit("Another parent.", records(ids[:8]))
    new = ContextDoc.parse(ed.edit(fmt, records(ids[8:])))
    assert len(new.demos) == 1 and ed.edits[-1].startswith("add-demo:")
    demo = new.demos[0]
    source = next(p for p in probs[:8] if demo.problem == f"{ELISION}\n\n{task.demo_gist(p)}")
    assert demo.answer == source.answer and demo.working == ""
    assert len(demo.render()) <= ed.max_demo_chars and ContextDoc.parse(new.render()) == new
    again = ContextDoc.parse(ed.edit(new.render(), records([source.id])))  # its own problem still fails
    assert again.demos == [] and ed.edits[-1].startswith("drop-demo:")


def test_a_label_file_task_scores_against_every_label_before_its_rows_are_read(tmp_path: Path) -> None:
    """A job judges with a task whose rows it never asked for: the label set still comes from the
    file, so naming the other label is a wrong answer with feedback listing both (not "must be
    one of: <the expected label>")."""
    from fastslow.tasks.loaders import LocalFileTask

    rows = [{"id": i, "prompt": "Claim?", "answer": ["SUPPORTED", "NOT_SUPPORTED"][i % 2]} for i in range(10)]
    task = LocalFileTask(_jsonl(tmp_path / "claims.jsonl", rows), scorer="label")
    problem = Problem(id="x", task=task.name, prompt="Claim?", answer="SUPPORTED", metadata={"scorer": "label"})
    assert task.reward(problem, "<answer>supported</answer>") == 1.0
    assert task.reward(problem, "<answer>not supported</answer>") == 0.0
    assert "must be one of: NOT_SUPPORTED, SUPPORTED" in task.feedback(problem, "<answer>maybe</answer>")


def test_labels_with_spaces_or_hyphens_score_and_problems_carry_their_label_set(tmp_path: Path) -> None:
    """A file's answers "Supported" / "Not supported": the right answer scores 1 however it is
    spelled, the other label 0; each problem carries the label set into the split files, so a
    job judges it without the source; an answer outside given labels stops in one line."""
    rows = [{"id": i, "prompt": "Claim?", "answer": ["Supported", "Not supported"][i % 2]} for i in range(30)]
    path = _jsonl(tmp_path / "claims.jsonl", rows)
    task = load_task_file(path, scorer="label")
    assert task.labels == ("NOT_SUPPORTED", "SUPPORTED")
    (p,) = [q for q in task.problems("train", 30, seed=0) if q.answer == "Not supported"][:1]
    assert p.metadata["labels"] == ["NOT_SUPPORTED", "SUPPORTED"]
    for given in ("Not supported", "not-supported", "NOT_SUPPORTED"):
        assert task.reward(p, f"<answer>{given}</answer>") == 1.0
    assert task.reward(p, "<answer>Supported</answer>") == 0.0
    write_problems([p], tmp_path / "split.parquet")
    (back,) = load_problems(tmp_path / "split.parquet")
    path.unlink()  # the judging job has only the split file
    fresh = get_task("file", path=path, scorer="label", name=task.name)
    assert fresh.reward(back, "<answer>not supported</answer>") == 1.0
    assert "must be one of: NOT_SUPPORTED, SUPPORTED" in fresh.feedback(back, "<answer>maybe</answer>")
    labelled = _jsonl(tmp_path / "three.jsonl", rows + [{"id": 99, "prompt": "Claim?", "answer": "Unclear"}])
    with pytest.raises(ValueError) as err:
        load_task_file(labelled, scorer="label", labels=["SUPPORTED", "NOT-SUPPORTED"])
    assert "problem 99: answer 'Unclear' is not one of the labels SUPPORTED, NOT_SUPPORTED" in str(err.value)


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_a_file_tasks_problems_are_the_ones_earlier_runs_drew(tmp_path: Path) -> None:
    """`problems(split, n, seed)` of a file task is a shuffle seeded by the task's name, the seed
    and the split, cut to n: these orders are pinned, as a resumed run's split files must be the
    ones it began with. n = 0 or below gives none, and asking for every row warns of nothing."""
    import warnings

    task = load_task_file(_jsonl(tmp_path / "mine.jsonl", _rows()), scorer="numeric", name="mine")
    assert [p.id for p in task.problems("train", 5, seed=0)] == ["q27", "q11", "q1", "q24", "q4"]
    assert [p.id for p in task.problems("train", 5, seed=1)] == ["q4", "q11", "q25", "q15", "q23"]
    assert [p.id for p in task.problems("val", 3, seed=0)] == ["q19", "q2", "q18"]
    assert task.problems("train", 0, seed=0) == [] and task.problems("train", -2, seed=0) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(task.problems("val", 3, seed=0)) == 3


def test_a_file_tasks_errors_name_the_files_own_line(tmp_path: Path) -> None:
    """A JSONL file's blank lines are skipped, and an error names the row by its line in the file
    (where an editor shows it), not by its place among the rows read."""
    lines = [json.dumps(r) for r in _rows(4)]
    lines[3] = json.dumps({**_rows(4)[3], "prompt": " "})
    (tmp_path / "gaps.jsonl").write_text("\n".join([lines[0], "", lines[1], "  ", lines[2], lines[3]]) + "\n")
    with pytest.raises(TaskDataError, match=r"gaps\.jsonl: row 6: empty prompt$"):
        load_task_file(tmp_path / "gaps.jsonl")


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_our_splits_sharing_a_hub_split_divide_it_as_split_fractions_do(tmp_path: Path) -> None:
    """Our splits that read one Hub split share it in the proportion of SPLIT_FRACTIONS among
    them: train and val 8 : 1 (hover's map), val and test 1 : 1. A problem's metadata keeps the
    row's other columns with scalar values, not its prompt and answer again, nor a list."""
    datasets = pytest.importorskip("datasets")
    n = 900
    for hub in ("train", "validation"):
        datasets.Dataset.from_dict({"q": [f"{hub} question {i}?" for i in range(n)], "a": [str(i) for i in range(n)],
                                    "source": ["s"] * n, "docs": [["d1", "d2"]] * n}).to_parquet(str(tmp_path / f"{hub}.parquet"))
    common = {"data_files": {hub: str(tmp_path / f"{hub}.parquet") for hub in ("train", "validation")},
              "columns": {"prompt": "q", "answer": "a"}, "cache_dir": str(tmp_path / "cache"), "name": "mine"}
    hover_like = HFDatasetTask("parquet", split_map={"train": "train", "val": "train", "test": "validation"},
                               **common).rows()
    assert len(hover_like["train"]) + len(hover_like["val"]) == n and len(hover_like["test"]) == n
    assert 60 < len(hover_like["val"]) < 140  # 1/9 of 900 (all of val's 0.1 alone would be 0.2: 180)
    assert hover_like["train"][0].metadata == {"source": "s", "scorer": "numeric"}
    evaluation = HFDatasetTask("parquet", split_map={"train": "train", "val": "validation", "test": "validation"},
                               **common).rows()
    assert len(evaluation["train"]) == n and 350 < len(evaluation["val"]) < 550 and len(evaluation["test"]) > 350


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_a_hub_datasets_unlabeled_rows_are_left_out(tmp_path: Path) -> None:
    """A ClassLabel of -1 marks a row without a label (a hidden test split): it is no problem,
    and -1 is not taken for one of the labels."""
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"claim": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["NOT_SUPPORTED", "SUPPORTED"])})
    datasets.Dataset.from_dict({"claim": [f"Claim {i}." for i in range(12)], "label": [-1, 0, 1] * 4},
                               features=features).to_parquet(str(tmp_path / "claims.parquet"))
    task = HFDatasetTask("parquet", data_files={"train": str(tmp_path / "claims.parquet")}, scorer="label",
                         columns={"prompt": "claim", "answer": "label"}, cache_dir=str(tmp_path / "cache"))
    assert sum(len(ps) for ps in task.rows().values()) == 8
    assert task.labels == ("NOT_SUPPORTED", "SUPPORTED")


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_a_hub_dataset_with_a_split_column_of_its_own_loads(tmp_path: Path) -> None:
    """A Hub dataset with a `split` column (its own names, say the source each row came from)
    stopped its task_data job at row 0: "metadata key 'split' is reserved; give the row's split in
    the split column", which no user can do to a Hub dataset. The column is left out of the
    metadata (our splits are the split map's); a filter still reads it."""
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"q": [f"question {i}?" for i in range(60)], "a": [str(i) for i in range(60)],
                                "split": ["dev", "main"] * 30}).to_parquet(str(tmp_path / "t.parquet"))
    common = {"data_files": {"train": str(tmp_path / "t.parquet")}, "columns": {"prompt": "q", "answer": "a"},
              "cache_dir": str(tmp_path / "cache"), "name": "mine"}
    rows = HFDatasetTask("parquet", **common).rows()
    assert sum(map(len, rows.values())) == 60 and all(rows.values())
    assert all("split" not in p.metadata for ps in rows.values() for p in ps)
    main = HFDatasetTask("parquet", filters={"split": ["main"]}, **common).rows()
    assert sorted(int(p.answer) for ps in main.values() for p in ps) == list(range(1, 60, 2))
    # ...so it cannot be the column rows are grouped by: said, not ignored (rows would split by id)
    with pytest.raises(ValueError, match=r"^mine: group_column 'split' cannot group rows"):
        HFDatasetTask("parquet", group_column="split", **common)


def test_an_empty_split_of_a_file_task_stops_its_splits_in_one_line(tmp_path: Path) -> None:
    rows = [{"id": i, "prompt": f"q{i}?", "answer": str(i), "split": "train"} for i in range(6)]
    path = _jsonl(tmp_path / "train_only.jsonl", rows)
    with pytest.raises(TaskDataError) as err:
        write_splits("file", tmp_path / "out", {"train": 4, "val": 2, "test": 2}, 0, path=path, name="mine")
    assert "mine: the val split is empty" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_a_duplicate_row_of_a_file_task_is_named_with_its_twin(tmp_path: Path) -> None:
    rows = [{"id": f"q{i}", "prompt": f"q{i}?", "answer": str(i), "split": SPLITS[i % 3]} for i in range(9)]
    rows.append({"id": "q9", "prompt": "q0?", "answer": "0", "split": "train"})
    with pytest.raises(TaskDataError) as err:
        write_splits("file", tmp_path / "out", {"train": 4, "val": 3, "test": 3}, 0,
                     path=_jsonl(tmp_path / "dup.jsonl", rows), name="mine")
    assert "mine: problems q0 (train) and q9 (train) have the same prompt (up to whitespace)" in str(err.value)
    assert "\n" not in str(err.value)
    # ...and a twin in another split that differs in its spaces and its answer's spelling: val was
    # scored on a problem train had taught (it was written without complaint)
    rows[-1] = {"id": "q9", "prompt": "q0?  \n", "answer": "0.0", "split": "val"}
    with pytest.raises(TaskDataError, match=r"problems q0 \(train\) and q9 \(val\) have the same prompt"):
        write_splits("file", tmp_path / "out", {"train": 4, "val": 4, "test": 3}, 0,
                     path=_jsonl(tmp_path / "twin.jsonl", rows), name="mine")


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_the_workflows_own_split_files_are_valid_task_files(tmp_path: Path) -> None:
    """results/data/<task>/<split>.parquet carries a `task` column: pointing data.files at one
    must not fail on it as an unknown column (a misspelt `split` still does, above)."""
    import polars as pl

    from fastslow.tasks import get_task
    from fastslow.tasks.data import write_problems

    problems = get_task("math").problems("train", 6, seed=0)
    path = write_problems(problems, tmp_path / "train.parquet")
    assert "task" in pl.read_parquet(path).columns
    task = load_task_file(path)
    assert {p.id for split in SPLITS for p in task.problems(split, 6, seed=0)} == {p.id for p in problems}


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_a_hub_datasets_repeated_rows_are_dropped_with_a_warning(tmp_path: Path) -> None:
    """A Hub dataset with a row repeated (Polaris merges two sources) stopped its task_data job:
    the splits' check asked to 'drop one', which a user cannot do to a Hub dataset. The loader keeps
    the first and says how many it dropped."""
    datasets = pytest.importorskip("datasets")
    from fastslow.tasks.data import write_splits

    rows = [(f"What is {i} + 1?", str(i + 1)) for i in range(30)] + [("What is 3 + 1?", "4")] * 2
    datasets.Dataset.from_dict({"problem": [q for q, _ in rows], "answer": [a for _, a in rows]}).to_parquet(
        str(tmp_path / "math.parquet"))
    options = {"dataset": "parquet", "data_files": {"train": str(tmp_path / "math.parquet")},
               "columns": {"prompt": "problem", "answer": "answer"}, "cache_dir": str(tmp_path / "cache"),
               "name": "polaris_local"}
    with pytest.warns(UserWarning, match=r"polaris_local: 2 rows of parquet repeat an earlier row's prompt \(up to whitespace\)"):
        paths = write_splits("hf", tmp_path / "out", {"train": 30, "val": 30, "test": 30}, 0, **options)
    import polars as pl

    assert sum(pl.read_parquet(p).height for p in paths.values()) == 30


def test_the_codeio_worker_is_followed_and_stopped_only_when_it_goes_quiet(caplog) -> None:
    """The generation worker's progress lines reach the job's log as they come, its other lines
    are kept for an error's last line, and it is stopped only after `stall` seconds without a
    line: a worker that keeps writing runs past that (a paper-scale split had a fixed 1800 s
    cap, about what its 50000 problems take), a quiet one is stopped in one line."""
    import logging
    import sys
    import time

    from fastslow.tasks import codeio
    from fastslow.tasks.base import TaskDataError

    # 12 lines 0.3 s apart outlast a 3 s stall: 2.7 s of slack for a loaded machine's start-up
    steady = ("import sys, time\n"
              "for i in range(12):\n"
              "    print(f'progress: train {i}/12', file=sys.stderr, flush=True); time.sleep(0.3)\n"
              "print('a last word', file=sys.stderr); sys.exit(3)\n")
    with caplog.at_level(logging.INFO, logger="fastslow.tasks.codeio"):
        start = time.monotonic()
        code, lines = codeio.run_worker([sys.executable, "-c", steady], {}, ".", stall=3.0)
    assert code == 3 and lines == ["a last word"] and time.monotonic() - start > 3.3
    assert [r.getMessage() for r in caplog.records if r.name == "fastslow.tasks.codeio"] == [
        f"train {i}/12" for i in range(12)]
    quiet = "import sys, time\nprint('progress: train 0/6', file=sys.stderr, flush=True); time.sleep(60)\n"
    start = time.monotonic()
    with pytest.raises(TaskDataError, match=r"^codeio: the generation worker wrote nothing for 3s and was stopped"):
        codeio.run_worker([sys.executable, "-c", quiet], {}, ".", stall=3.0)
    assert time.monotonic() - start < 30


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_a_codeio_program_that_reaches_outside_its_process_is_not_run() -> None:
    """reasoning-gym's codeio data holds programs that write, `chmod` and remove files in /home
    and /tmp, exit the process (which ended the split's whole worker), read stdin or start threads;
    46 of its 3002 were drawn like any other, 4 of seed 0's first 150 train problems among them.
    (Run in this process: the kept programs' own warnings, numpy's matrix, are theirs.)
    They are read from their syntax tree, not their text, so a comment naming `input (x)`, a
    method called `exit` or `urllib.parse` does not skip a program."""
    import gzip
    import pathlib

    import reasoning_gym

    from fastslow.tasks import codeio

    outside = {
        "def main_solution(p):\n    with open(p, 'w') as f:\n        f.write('')\n": "open()",
        "import os as o\ndef main_solution(p):\n    o.remove(p)\n": "os.remove",
        "import os\ndef main_solution(p):\n    return os.path.exists(p)\n": "os.path.exists",
        "from sys import exit\ndef main_solution(n):\n    exit('Fatal')\n": "from sys import exit",
        "import threading\ndef main_solution(n):\n    return n\n": "import threading",
        "import time\ndef main_solution(n):\n    time.sleep(n)\n": "time.sleep",
        "def main_solution(n):\n    return int(input('n? '))\n": "input()",
        "from os import path as p\ndef main_solution(f):\n    return p.exists(f)\n": "os.path.exists",
        "from numpy import save\ndef main_solution(f):\n    save(f, [1])\n": "numpy.save",
        "import io\ndef main_solution(f):\n    return io.open(f).read()\n": "io.open",
    }
    for code, why in outside.items():
        assert codeio.reaches_outside({"code_sample": "x = 1\n", "input_generator": code}) == f"input_generator: {why}"
    inside = ("import os\nfrom urllib.parse import urlparse\n"
              "def input(io):  # the input (x) of a gate; the signal it reads\n    return io\n"
              "class Queue:\n    def exit(self, t):\n        return t\n"
              "def main_solution(a, b):\n    return input(os.path.join(a, b)) + urlparse(a).path + os.sep\n")
    assert codeio.reaches_outside({"code_sample": inside, "input_generator": "def f(rng):\n    return {}\n"}) is None
    assert codeio.reaches_outside({"code_sample": "def main_solution(:\n"}) == "code_sample: code that does not parse"
    # an import of one part serves the other (reasoning-gym runs them together)
    assert codeio.reaches_outside({"code_sample": "import os as o\n", "input_generator": "o.remove('/tmp/x')\n"}) \
        == "input_generator: os.remove"
    # the shipped data: the programs seen doing so, and a sample of the rest kept
    data = next(pathlib.Path(reasoning_gym.__file__).parent.rglob("codeio.jsonl.gz"))
    rows = [json.loads(line) for line in gzip.open(data, "rt", encoding="utf-8")]
    skipped = {i for i, r in enumerate(rows) if codeio.reaches_outside(r)}
    assert len(rows) == 3002 and len(skipped) == 66 and {367, 2306, 205, 1149, 1922, 2002, 1300} <= skipped
    assert {1653, 1254, 1737, 1885} <= skipped  # (the clock: `date.today()`)
    assert {101, 365, 482, 1447, 1924} <= skipped  # (the operating system's randomness)
    # and none is drawn: seed 0's 8th train problem was program 1660's (it reads files)
    ids = {codeio.program_id(rows[i]["task_description"]) for i in skipped}
    problems = codeio.CodeIOTask(isolate=False).problems("train", 10, seed=0)
    assert len(problems) == 10 and not ids & {p.metadata["program_id"] for p in problems}


def test_a_codeio_program_that_exits_loses_its_item_not_the_worker(tmp_path: Path) -> None:
    """A reference program's `exit()` raised SystemExit through the item's run and ended the
    worker, and the whole split with it. The worker also runs with stdin closed, without this
    process's tokens in its environment, and with its address space capped."""
    import os
    import subprocess
    import sys

    from fastslow.tasks import codeio

    exiting = "import sys\ndef main_solution(n):\n    sys.exit('Fatal error!')\n"
    assert not codeio._reproducible(exiting, {"n": 1}, "1", 7, 2.0)

    class Exits:
        def __getitem__(self, idx: int) -> dict:
            raise SystemExit("Fatal error!")

    assert codeio._run_item(Exits(), 0, 7, 2.0) is None
    env = {"HF_TOKEN": "hf_secret", "OPENAI_API_KEY": "sk-secret", "MLFLOW_TRACKING_PASSWORD": "pw",
           "PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8", "TMPDIR": str(tmp_path)}
    old = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        kept = codeio.worker_environment()
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert kept == {"PATH": env["PATH"], "LC_ALL": "C.UTF-8", "TMPDIR": str(tmp_path)}
    # the worker's own entry point, its generation replaced by what a program might do
    probe = ("import sys\nfrom fastslow.tasks import codeio\n"
             "def generate(task, sizes, seed):\n"
             "    print(repr(sys.stdin.read()), file=sys.stderr)\n"
             "    try:\n        bytearray(6 << 30)\n    except MemoryError:\n"
             "        print('MemoryError', file=sys.stderr)\n"
             "    return {}\n"
             "codeio.CodeIOTask.problems_for_splits = generate\nsys.exit(codeio.main(sys.argv[1:]))\n")
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"name": "codeio", "options": {}, "sizes": {}, "seed": 0}), encoding="utf-8")
    typed, writer = os.pipe()  # this process's stdin holds an answer the worker must not read
    os.write(writer, b"typed")
    os.close(writer)
    stdin = os.dup(0)
    os.dup2(typed, 0)
    try:
        code, lines = codeio.run_worker([sys.executable, "-c", probe, str(request), str(tmp_path / "out.json")],
                                        {**kept, "PYTHONPATH": os.pathsep.join(sys.path)}, str(tmp_path), stall=60)
    finally:
        os.dup2(stdin, 0)
        os.close(stdin)
        os.close(typed)
    assert code == 0 and lines == ["''", "MemoryError"], lines
    # a stricter limit the job already had stays (it was raised to 4 GiB)
    stricter = ("import resource\nfrom fastslow.tasks.codeio import limit_memory\n"
                "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.RLIM_INFINITY))\nlimit_memory()\n"
                "print(resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)\n")
    out = subprocess.run([sys.executable, "-c", stricter], capture_output=True, text=True, check=True,
                         env={**kept, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.split() == [str(3 << 10)]


# --- codeio generation: a mutation review's survivors --------------------------------------------
@pytest.mark.parametrize(("code", "why"), [
    ("import importlib\n", "import importlib"),
    ("import sys\ndef main_solution(m):\n    return sys.modules[m].getcwd()\n", "sys.modules"),
    ("def main_solution(m):\n    return __import__(m).getcwd()\n", "__import__()"),
    ("def main_solution(n):\n    exit(n)\n", "exit()"),
    ("import builtins\ndef main_solution(p):\n    return builtins.open(p).read()\n", "builtins.open"),
    ("import numpy as np\ndef main_solution(p):\n    return np.loadtxt(p).tolist()\n", "numpy.loadtxt"),
    ("from os import environ\ndef main_solution(k):\n    return environ[k]\n", "from os import environ"),
])
def test_a_codeio_program_naming_any_listed_module_or_name_is_not_run(code: str, why: str) -> None:
    """Each kind of name `_outside_uses` refuses, one example each: a module whose import reaches
    outside (`importlib`), a name of `sys`, a builtin call, `builtins.open`, numpy's file readers,
    and an import of `os`'s environment that the program then only indexes (no call, no attribute)."""
    from fastslow.tasks import codeio

    assert codeio.reaches_outside({"code_sample": code, "input_generator": ""}) == f"code_sample: {why}"


def test_codeio_says_which_part_of_a_program_reaches_outside_up_to_the_code_samples_last_line() -> None:
    """A use on the code sample's last line (no newline after it) is the code sample's; the input
    generator's first line is the generator's. `import os.path` binds `os`: `os.path.join` stays
    a harmless path helper."""
    from fastslow.tasks import codeio

    assert codeio.reaches_outside({"code_sample": "x = 1\nimport socket", "input_generator": ""}) \
        == "code_sample: import socket"
    assert codeio.reaches_outside({"code_sample": "x = 1\ny = 2", "input_generator": "import socket\n"}) \
        == "input_generator: import socket"
    joined = "import os.path\ndef main_solution(a, b):\n    return os.path.join(a, b)\n"
    assert codeio.reaches_outside({"code_sample": joined, "input_generator": ""}) is None


def test_a_codeio_run_seeds_the_global_rngs_and_puts_back_their_state() -> None:
    """Inside a run `random` and `np.random` draw from the item's seed; afterwards both are where
    they were, so the caller's own draws do not depend on the programs run in between."""
    import numpy as np

    from fastslow.tasks import codeio

    random.seed(3)
    np.random.seed(3)
    before, np_before = random.getstate(), np.random.get_state()
    with codeio._seeded_run(11, 2.0):
        drawn, np_drawn = random.random(), np.random.random()
    assert drawn == random.Random(11).random() and np_drawn == np.random.RandomState(11).random()
    assert random.getstate() == before
    np_after = np.random.get_state()
    assert np_after[0] == np_before[0] and np.array_equal(np_after[1], np_before[1]) and np_after[2:] == np_before[2:]


def test_a_codeio_programs_decimal_precision_and_numpy_error_handling_do_not_reach_the_next() -> None:
    """Program 881 sets `getcontext().prec = 100` (11 more shipped programs set the context); a
    later program in the same worker that computes with `Decimal` under the default context its
    code shows (63 shipped programs use `decimal`) got its gold at 100 digits. Each run now starts
    from a new interpreter's decimal context and numpy error handling, and the caller's own are
    back afterwards."""
    import decimal

    import numpy as np

    from fastslow.tasks import codeio

    sets = ("from decimal import getcontext\nimport numpy as np\n"
            "def main_solution(n):\n    getcontext().prec = n\n    np.seterr(all='raise')\n    return n\n")
    divides = ("from decimal import Decimal\nimport numpy as np\n"
               "def main_solution(n):\n    return [str(Decimal(1) / Decimal(n)), np.geterr()['divide']]\n")
    with decimal.localcontext(decimal.Context(prec=7)), np.errstate(divide="ignore"):
        assert codeio._rerun(sets, {"n": 100}, 0, 2.0) == 100
        assert codeio._rerun(divides, {"n": 3}, 0, 2.0) == ["0." + "3" * 28, "warn"]
        assert decimal.getcontext().prec == 7 and np.geterr()["divide"] == "ignore"


def test_a_codeio_hash_seed_helper_runs_under_its_seed_and_leaves_this_environment_alone(monkeypatch) -> None:
    """The helper reads PYTHONHASHSEED as it starts; this process's own value (or its absence) is
    back once it has started, so nothing started later inherits the helper's seed. A program that
    exits fails its item without ending the helper."""
    import os

    from fastslow.tasks import codeio

    reads = "import os\ndef main_solution(n):\n    return os.environ['PYTHONHASHSEED']\n"
    exits = "import sys\ndef main_solution(n):\n    sys.exit(n)\n"
    for before in (None, "17"):
        if before is None:
            monkeypatch.delenv("PYTHONHASHSEED", raising=False)
        else:
            monkeypatch.setenv("PYTHONHASHSEED", before)
        runner = codeio._HashSeedRunner(3)
        try:
            assert runner.submit(reads, {"n": 1}, 7, 2.0) and runner.result(2.0) == (True, "3")
            assert os.environ.get("PYTHONHASHSEED") == before
            pid = runner.proc.pid
            assert runner.submit(exits, {"n": 1}, 7, 2.0) and runner.result(2.0) == (False, None)
            assert runner.proc is not None and runner.proc.pid == pid and runner.proc.is_alive()
        finally:
            runner.stop()


def test_codeio_keeps_an_item_only_if_every_rerun_gives_its_gold() -> None:
    """Each rerun has its own RNG seed and hash seed, neither the worker's: a gold that one rerun
    gives again and the other does not is dropped, whichever rerun it is."""
    import os
    import subprocess
    import sys

    from fastslow.tasks import codeio

    # a coin from the global RNG: reruns k = 1, 2 draw with seed g + k
    g = next(g for g in range(100) if random.Random(g + 1).randint(0, 1) != random.Random(g + 2).randint(0, 1))
    coin = "import random\ndef main_solution(n):\n    return random.randint(0, n)\n"
    for k in (1, 2):
        assert not codeio._reproducible(coin, {"n": 1}, json.dumps(random.Random(g + k).randint(0, 1)), g, 2.0)
    # a set of two strings: orders under the hash seeds 0 (the worker's), 1 and 2
    pairs = [[f"a{i}", f"b{i}"] for i in range(60)]
    orders = {seed: json.loads(subprocess.run([sys.executable, "-c", f"import json; print(json.dumps("
                                               f"[list(set(p)) for p in {pairs!r}]))"],
                                              env={**os.environ, "PYTHONHASHSEED": str(seed)}, check=True,
                                              capture_output=True, text=True).stdout) for seed in (0, 1, 2)}
    as_set = "def main_solution(names):\n    return list(set(names))\n"
    for same, other in ((1, 2), (2, 1)):  # the worker's order again under one helper's seed, not the other's
        i = next(i for i in range(len(pairs)) if orders[0][i] == orders[same][i] != orders[other][i])
        assert not codeio._reproducible(as_set, {"names": pairs[i]}, json.dumps(orders[0][i]), 7, 2.0)
    i = next(i for i in range(len(pairs)) if orders[0][i] == orders[1][i] == orders[2][i])
    assert codeio._reproducible(as_set, {"names": pairs[i]}, json.dumps(orders[0][i]), 7, 2.0)


def test_a_codeio_rerun_that_waits_within_its_wall_clock_limit_is_kept() -> None:
    """A rerun's helper is given up on only past the program's own wall-clock limit (`WALL_FACTOR`
    times its CPU seconds) and some: a program waiting longer than its CPU limit, as on a loaded
    machine, still gives its gold."""
    from fastslow.tasks import codeio

    waits = "import time\ndef main_solution(n):\n    time.sleep(0.6)\n    return n\n"
    assert 0.6 < 2 * 0.1 * codeio.WALL_FACTOR  # (the helpers' limit is twice the item's)
    assert codeio._reproducible(waits, {"n": 1}, "1", 7, 0.1)


def _codeio_item(program: str, answer: Any, question: str = "Can you predict the output") -> dict[str, Any]:
    return {"question": question, "answer": json.dumps(answer), "program": program,
            "metadata": {"input_data": {"n": 1}, "output_data": answer}}


def test_codeio_splits_by_program_the_same_before_and_after_running_it(monkeypatch) -> None:
    """`entry` skips another split's program unrun, by the key `convert` then gives the problem
    (its program's description): no own program is skipped, none of another split's is run. An
    answer of max_answer_chars characters is kept, and a program whose prompt with an empty input
    is max_prompt_chars long is run."""
    from fastslow.tasks import codeio
    from fastslow.tasks.generated import OTHER_SPLIT, split_of

    task = codeio.CodeIOTask(isolate=False, max_answer_chars=12)
    ran = []
    monkeypatch.setattr(codeio, "_run_item", lambda ds, idx, *_: ran.append(idx))  # None: as if it failed
    source = task.sources[0]
    ds = task.dataset(source, task.dataset_seed(source, "val", 0, 0))
    own = 0
    for attempt in range(40):
        program = random.Random(ds.seed + attempt).choice(type(ds)._jsonl_data)
        task._skipped = Counter()
        task.entry(source, "val", 0, attempt)
        mine = split_of(codeio.program_id(program["task_description"])) == "val"
        assert task._skipped[OTHER_SPLIT] == (not mine), attempt
        assert (attempt in ran) == (mine and not codeio.reaches_outside(program)
                                    and not task._too_long_for_any_input(program)), attempt
        own += mine
    assert own
    cand = task.convert(_codeio_item("Sort the list.", "a" * 10), source)  # '"aaaaaaaaaa"': 12 characters
    assert cand.key == cand.metadata["program_id"] == codeio.program_id("Sort the list.")
    assert task.convert(_codeio_item("Sort the list.", "a" * 11), source) is None
    # the bound of a program's prompt is its length with an empty input: at the limit, not too long
    from reasoning_gym.code.codeio import OUTPUT_PREDICTION_PROMPT_TEMPLATE

    program = type(ds)._jsonl_data[0]
    bound = len(OUTPUT_PREDICTION_PROMPT_TEMPLATE.format(program["task_description"], program["input_output_spec"],
                                                         "", program["code_sample"]))
    task.max_prompt_chars = bound
    assert not task._too_long_for_any_input(program)
    task.max_prompt_chars = bound - 1
    assert task._too_long_for_any_input(program)


@pytest.mark.parametrize(("code", "why"), [
    ("from datetime import date\ndef main_solution(born):\n    return date.today().year - born\n",
     "datetime.date.today"),
    ("import datetime as dt\ndef main_solution(n):\n    return str(dt.datetime.now())\n", "datetime.datetime.now"),
    ("from time import time\ndef main_solution(n):\n    return time() > n\n", "time.time"),
    ("import time\ndef main_solution(n):\n    return time.strftime('%Y')\n", "time.strftime"),
    ("def main_solution(p):\n    o = open\n    return o(p).read()\n", "open"),
    ("def main_solution(p):\n    return getattr(__builtins__, 'open')(p).read()\n", "__builtins__"),
    ("import urllib.parse\ndef main_solution(u):\n    return urllib.request.urlopen(u).read()\n",
     "urllib.request.urlopen"),
])
def test_a_codeio_program_that_reads_the_clock_or_renames_what_is_refused_is_not_run(code: str, why: str) -> None:
    """A program reading the clock gave a gold of the day its split was built: an age "as of today"
    (reasoning-gym's program 1653), which the reruns, that same day, gave again. 15 of the 3002
    shipped programs read it (11 of them gave kept items). `open` given another name, `__builtins__`,
    and a module refused reached through a harmless import of its package passed too."""
    from fastslow.tasks import codeio

    assert codeio.reaches_outside({"code_sample": code, "input_generator": ""}) == f"code_sample: {why}"
    # what stays: a `time` of datetime's, a parameter called `input`, urllib.parse's own functions
    kept = ("import urllib.parse\nfrom datetime import date, time\n"
            "def main_solution(input, day):\n    t = time(8, 0)\n"
            "    return [input, str(date.fromisoformat(day)), str(t), urllib.parse.quote(day)]\n")
    assert codeio.reaches_outside({"code_sample": kept, "input_generator": ""}) is None


@pytest.mark.parametrize(("code", "why"), [
    ("import random\ndef main_solution(n):\n    random.seed()\n    return random.random() < n\n",
     "random.seed() without a seed"),
    ("import numpy as np\ndef main_solution(n):\n    return int(np.random.default_rng(None).integers(n))\n",
     "numpy.random.default_rng() without a seed"),
    ("from numpy.random import RandomState\ndef main_solution(n):\n    return RandomState().rand() < n\n",
     "numpy.random.RandomState() without a seed"),
    ("def main_solution(n):\n    return Random().random() < n\n", "Random() without a seed"),
    ("import secrets\ndef main_solution(n):\n    return secrets.randbelow(n)\n", "import secrets"),
    ("import uuid\ndef main_solution(n):\n    return str(uuid.uuid4())[:n]\n", "uuid.uuid4"),
    ("from random import SystemRandom\ndef main_solution(n):\n    return SystemRandom().random() < n\n",
     "random.SystemRandom"),
])
def test_a_codeio_program_drawing_the_systems_randomness_is_not_run(code: str, why: str) -> None:
    """Two builds of the same codeio splits (2000/256/512 problems, seed 1234) differed: program
    482's input generator draws `secrets.token_bytes`, and program 365 calls `random.seed()`, so
    the reruns kept or dropped its items by chance and every later item of its split moved. Such
    a program is not run: 5 of the 3002 shipped ones. A seeded seeder, or a program's own
    `Random`, stays."""
    from fastslow.tasks import codeio

    assert codeio.reaches_outside({"code_sample": code, "input_generator": ""}) == f"code_sample: {why}"
    kept = ("import random\nimport numpy as np\nfrom numpy.random import default_rng\n"
            "def main_solution(n, seed):\n    random.seed(n)\n    r = random.Random(seed)\n"
            "    g = np.random.default_rng(seed=n)\n    return [r.random(), default_rng(n).random(), g.random()]\n")
    assert codeio.reaches_outside({"code_sample": kept, "input_generator": "def f(rng):\n    return Random(7)\n"}) \
        is None
    own = "class Random:\n    pass\ndef main_solution(n):\n    return str(Random())\n"
    assert codeio.reaches_outside({"code_sample": own, "input_generator": ""}) is None


def test_a_long_generation_logs_its_progress(monkeypatch, caplog) -> None:
    """A split that takes longer than PROGRESS_SECONDS says how many problems it has, of how
    many, after how many tries, and the time left at the rate so far."""
    import logging

    from fastslow.tasks import generated

    monkeypatch.setattr(generated, "PROGRESS_SECONDS", 0.0)
    with caplog.at_level(logging.INFO, logger="fastslow.tasks.generated"):
        get_task("physics").problems("val", 3, 0)
    lines = [r.getMessage() for r in caplog.records if r.name == "fastslow.tasks.generated"]
    assert lines[0].startswith("physics val: 0/3 problems after 0 tries")
    assert re.fullmatch(r"physics val: 2/3 problems after \d+ tries, ~\d+s left", lines[-1]), lines[-1]


def test_the_polaris_preset_scores_equivalent_latex_answers_right(tmp_path: Path) -> None:
    """Polaris' golds are numbers or LaTeX. Its preset's `numeric` scorer fell back to an
    exact match for them, so `2\\sqrt3` against `2\\sqrt{3}`, `45` against `45^\\circ` and `B`
    against `\\text{(B)}` scored 0. The preset's `math` scorer reads both sides with math-verify:
    equivalent answers score 1, different ones 0, and a number still compares by value. Rows in
    Polaris' own schema (problem, answer, difficulty), through the preset, from a local Parquet file."""
    datasets = pytest.importorskip("datasets")
    from fastslow.tasks.loaders import HF_PRESETS

    golds = {"a": "2\\sqrt{3}", "b": "45^\\circ", "c": "\\text{(B)}", "d": "e^2", "e": "\\frac{\\pi}{2}",
             "f": "9375", "g": "\\frac{1}{2}", "h": "x+1", "i": "0.3", "j": "2"}
    datasets.Dataset.from_dict({"problem": [f"Problem {k}: find it." for k in golds], "answer": list(golds.values()),
                                "difficulty": ["7/8"] * len(golds)}).to_parquet(str(tmp_path / "polaris.parquet"))
    options = {**HF_PRESETS["polaris"], "dataset": "parquet", "data_files": {"train": str(tmp_path / "polaris.parquet")},
               "cache_dir": str(tmp_path / "cache"), "name": "polaris_local"}
    assert HF_PRESETS["polaris"]["scorer"] == "math"
    task = get_task("hf", **options)
    problems = {p.answer: p for ps in task.rows().values() for p in ps}
    assert set(problems) == set(golds.values())

    def reward(gold: str, answer: str, scorer: str = "math") -> float:
        problem = problems[gold]
        problem = problem if scorer == "math" else replace(problem, metadata={**problem.metadata, "scorer": scorer})
        return task.reward(problem, f"So <answer>{answer}</answer>")

    same = [("2\\sqrt{3}", "2\\sqrt3"), ("45^\\circ", "45"), ("45^\\circ", "45^{\\circ}"), ("\\text{(B)}", "B"),
            ("e^2", "e^{2}"), ("\\frac{\\pi}{2}", "\\pi/2"), ("9375", "9375.0"), ("\\frac{1}{2}", "0.5"),
            ("x+1", "1+x"), ("2\\sqrt{3}", "$2\\sqrt{3}$")]
    different = [("2\\sqrt{3}", "3\\sqrt{2}"), ("45^\\circ", "46"), ("\\text{(B)}", "C"), ("9375", "9376"),
                 ("\\frac{\\pi}{2}", "\\pi"), ("x+1", "x-1"), ("e^2", "two"),
                 # math-verify rounds to 6 decimals, and read `$2**10$` as LaTeX: 2; the numeric rules
                 # judge a number they read, and Python's power is read as one
                 ("0.3", "0.3000004"), ("2", "2**10"), ("2", "2*10**6")]
    assert [reward(g, a) for g, a in same] == [1.0] * len(same)
    assert [reward(g, a) for g, a in different] == [0.0] * len(different)
    # what the numeric scorer made of the same answers: a number by value, LaTeX only verbatim
    assert [reward(g, a, "numeric") for g, a in same[:5]] == [0.0] * 5
    assert reward("9375", "9375.0", "numeric") == 1.0
    from fastslow.tasks.loaders import MATH_VERIFY_MAX_CHARS, math_equivalent

    padded = "x+1" + " " * MATH_VERIFY_MAX_CHARS  # a derivation's length: not read, not a match
    assert math_equivalent("x+1 ", "x+1") and not math_equivalent(padded, "x+1")
    assert math_equivalent("x+1" + " " * (MATH_VERIFY_MAX_CHARS - 3), "x+1")  # the longest still read


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_a_hub_datasets_unusable_rows_are_dropped_with_a_count_and_a_files_stop_the_task(tmp_path: Path) -> None:
    """A Hub row without an answer (a Polaris source lists six) or with a tag in it stopped the
    task_data job of a 50000-row dataset, naming a row no user can fix: the loader drops such rows
    and says how many. A file of one's own is still refused at the row, where it can be fixed."""
    datasets = pytest.importorskip("datasets")

    rows = [(f"What is {i} + 1?", str(i + 1)) for i in range(30)]
    bad = [("What is 40 + 1?", ""), ("What is 41 + 1?", None), ("   ", "3"), ("What is 43 + 1?", "<answer>44</answer>")]
    table = rows[:10] + bad + rows[10:]
    datasets.Dataset.from_dict({"problem": [q for q, _ in table], "answer": [a for _, a in table]}).to_parquet(
        str(tmp_path / "math.parquet"))
    task = HFDatasetTask("parquet", data_files={"train": str(tmp_path / "math.parquet")}, cache_dir=str(tmp_path / "c"),
                         columns={"prompt": "problem", "answer": "answer"}, name="polaris_local")
    with pytest.warns(UserWarning, match=r"^polaris_local: 4 rows of parquet have an empty prompt or answer, or an "
                                         r"<answer> tag in the answer; dropped"):
        kept = task.rows()
    assert sorted(p.answer for ps in kept.values() for p in ps) == sorted(a for _, a in rows)
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps({"id": i, "prompt": q or "", "answer": a or ""}) + "\n"
                                                 for i, (q, a) in enumerate(rows[:3] + bad[:1])))
    with pytest.raises(TaskDataError, match=r"mine\.jsonl: row 4: empty answer$"):
        load_task_file(tmp_path / "mine.jsonl").rows()


def test_unit_factors_are_the_si_definitions_not_the_tables_own() -> None:
    """Every prefix and non-SI unit converts by its SI definition, written out here (a check of the table against itself would pass any factor)."""
    for value, unit, si_unit, factor in [
        (1.0, "GJ", "J", 1e9), (1.0, "MJ", "J", 1e6), (1.0, "kJ", "J", 1e3), (1.0, "cm", "m", 1e-2),
        (1.0, "mm", "m", 1e-3), (1.0, "μA", "A", 1e-6), (1.0, "uA", "A", 1e-6), (1.0, "nm", "m", 1e-9),
        (1.0, "min", "s", 60.0), (1.0, "h", "s", 3600.0), (1.0, "t", "kg", 1000.0), (1.0, "g", "kg", 1e-3),
        (1.0, "km/h", "m/s", 1 / 3.6), (2.0, "tonnes", "kg", 1000.0), (3.0, "minutes", "s", 60.0),
    ]:
        assert convert(value, unit, si_unit) == pytest.approx(value * factor, rel=1e-12), unit


def test_physics_minutes_in_givens_and_answers_are_sixty_seconds() -> None:
    """A given shown in min enters the formula as 60 s per minute, and an answer asked in min is the SI value / 60."""
    shown = 0
    for p in get_task("physics_hard").problems("train", 400, seed=4) + get_task("physics").problems("train", 400, seed=4):
        m = p.metadata
        given = re.search(r"(?:in|for) (\d+(?:\.\d+)?) min\b", p.prompt.split("\n\n")[0])
        if given and "t" in m["values"]:
            shown += 1
            assert float(m["values"]["t"].split(" ")[0]) == pytest.approx(60 * float(given.group(1)), rel=1e-3), p.id
    assert shown >= 5, shown
    meta = {"value": 150.0, "unit": "s", "dimension": "time", "formula": "t = d/v", "values": {},
            "value_si": 150.0, "rel_tol": 0.0075}
    p = Problem("p", "physics", "…", "150 s", meta)
    assert get_task("physics").reward(p, "<answer>2.5 min</answer>") == 1.0


def test_physics_reads_unicode_micro_ohm_and_minus_signs() -> None:
    """The micro sign (U+00B5), the ohm sign (U+2126) and the minus sign (U+2212) read as μ, Ω and "-"."""
    task = get_task("physics")

    def problem(value: float, unit: str, dim: str, factor: float) -> Problem:
        meta = {"value": value, "unit": unit, "dimension": dim, "formula": "x = y", "values": {},
                "value_si": value * factor, "rel_tol": 0.0075}
        return Problem("p", "physics", "…", f"{value:g} {unit}", meta)

    ma = problem(12.0, "mA", "current", 1e-3)
    for answer in ("12000 \u00b5A", "12000 \u03bcA", "1.2 × 10^\u22122 A", "1.2 \u00d7 10^{\u22122} A"):
        assert task.reward(ma, f"<answer>{answer}</answer>") == 1.0, (answer, task.feedback(ma, f"<answer>{answer}</answer>"))
    speed = problem(12.5, "m/s", "speed", 1.0)
    assert task.reward(speed, "<answer>12.5 m s\u22121</answer>") == 1.0
    assert task.reward(speed, "<answer>12.5 m s\u22122</answer>") == 0.0
    assert parse_quantity("12.5 m·s\u22121")[:2] == (12.5, "m/s")
    assert parse_unit("V/\u2126") == parse_unit("A") and parse_unit("\u2126 m") == parse_unit("Ω·m")


def test_physics_reads_a_prefix_symbol_written_on_a_unit_name() -> None:
    """"2.5 kohm" and "0.0025 MOhm" are 2500 Ω (unread, the number was taken in the asked unit: 2.5 Ω)."""
    task = get_task("physics")
    meta = {"value": 2500.0, "unit": "Ω", "dimension": "resistance", "formula": "R = V/I", "values": {},
            "value_si": 2500.0, "rel_tol": 0.0075}
    p = Problem("p", "physics", "…", "2500 Ω", meta)
    for answer in ("2.5 kohm", "2.5 kOhm", "0.0025 MOhm", "2.5 kohms"):
        assert task.reward(p, f"<answer>{answer}</answer>") == 1.0, (answer, task.feedback(p, f"<answer>{answer}</answer>"))


def test_a_lone_letter_unit_is_read_in_any_case_but_not_a_letter_in_a_sentence() -> None:
    """"0.012 a" alone is 0.012 A (12 mA); the article in "250 m (a rough estimate)" is no ampere."""
    task = get_task("physics")
    ma = Problem("p", "physics", "…", "12 mA", {"value": 12.0, "unit": "mA", "dimension": "current",
                                                "formula": "I = V/R", "values": {}, "value_si": 0.012, "rel_tol": 0.0075})
    assert task.reward(ma, "<answer>0.012 a</answer>") == 1.0
    m = Problem("q", "physics", "…", "250 m", {"value": 250.0, "unit": "m", "dimension": "length",
                                               "formula": "d = v·t", "values": {}, "value_si": 250.0, "rel_tol": 0.0075})
    for answer in ("250 m (a rough estimate)", "0.25 km (a rough estimate)"):
        assert task.reward(m, f"<answer>{answer}</answer>") == 1.0, (answer, task.feedback(m, f"<answer>{answer}</answer>"))


def test_every_term_after_a_slash_or_per_is_divided() -> None:
    """"J/kg s" is J/(kg·s), as the units module documents ("J/kg K" is J/(kg·K)), never J·s/kg."""
    assert parse_unit("J/kg s") == parse_unit("W/kg") == parse_unit("J per kg per s")
    assert parse_unit("m/s s") == parse_unit("m/s²")
    assert convert(9.8, "m per s s", "m/s²") == pytest.approx(9.8)


def test_physics_refuses_a_hedge_between_two_values_however_written() -> None:
    """Two values 4% apart ("12 m/s (12.5 m/s)"), two bare numbers ("250 or 300") and a range with "to" are hedges: 0."""
    task = get_task("physics")
    v = Problem("p", "physics", "…", "12 m/s", {"value": 12.0, "unit": "m/s", "dimension": "speed", "formula": "v = d/t",
                                                "values": {}, "value_si": 12.0, "rel_tol": 0.0075})
    d = Problem("q", "physics", "…", "250 m", {"value": 250.0, "unit": "m", "dimension": "length", "formula": "d = v·t",
                                               "values": {}, "value_si": 250.0, "rel_tol": 0.0075})
    assert task.reward(v, "<answer>12 m/s (43.2 km/h)</answer>") == 1.0  # one value restated
    for problem, hedge in ((v, "12 m/s (12.5 m/s)"), (v, "12 m/s or 12.6 m/s"), (d, "250 or 300"),
                           (d, "250 or 260"), (d, "100 to 250 m"), (d, "from 240 to 250 m")):
        assert task.reward(problem, f"<answer>{hedge}</answer>") == 0.0, hedge
        assert parse_quantity(hedge)[0] is None, hedge
        assert "Could not read one number" in task.feedback(problem, f"<answer>{hedge}</answer>"), hedge


def test_physics_reads_the_value_after_the_last_equals_sign() -> None:
    """A worked answer "v = v0 + a·t = 2 + 3 × 4 = 14 m/s" is read as its result, 14 m/s."""
    task = get_task("physics")
    p = Problem("p", "physics", "…", "14 m/s", {"value": 14.0, "unit": "m/s", "dimension": "speed",
                                                "formula": "v = v0 + a·t", "values": {}, "value_si": 14.0, "rel_tol": 0.0075})
    for answer in ("v = v0 + a·t = 2 + 3 × 4 = 14 m/s", "v = 2 m/s + 3 m/s² × 4 s = 14 m/s", "v = 50.4 km/h = 14 m/s"):
        assert task.reward(p, f"<answer>{answer}</answer>") == 1.0, (answer, task.feedback(p, f"<answer>{answer}</answer>"))
    assert parse_quantity("P = 1.5 kW = 1500 W")[:2] == (1500.0, "W")


def test_physics_reads_powers_written_with_a_double_star_and_glued_products() -> None:
    """"980 cm/s**2" is 9.8 m/s², "3.2 Ns" and "3200 g m/s" are 3.2 kg·m/s, "45 kph"/"45 kmh" are 12.5 m/s."""
    task = get_task("physics")

    def problem(value: float, unit: str, dim: str) -> Problem:
        return Problem("p", "physics", "…", f"{value:g} {unit}", {"value": value, "unit": unit, "dimension": dim,
                                                                  "formula": "x = y", "values": {}, "value_si": value,
                                                                  "rel_tol": 0.0075})

    cases = [(problem(9.8, "m/s²", "acceleration"), ["980 cm/s**2", "9.8 m*s**-2", "980 cm s^-2"]),
             (problem(3.2, "kg·m/s", "momentum"), ["3.2 Ns", "3200 g m/s", "3.2 kgm/s"]),
             (problem(12.5, "m/s", "speed"), ["45 kph", "45 kmh", "45 KPH", "12.5 mps"])]
    for p, answers in cases:
        for answer in answers:
            assert task.reward(p, f"<answer>{answer}</answer>") == 1.0, (answer, task.feedback(p, f"<answer>{answer}</answer>"))
    assert task.reward(cases[1][0], "<answer>3.2 N/s</answer>") == 0.0


_NON_SI_GIVEN = r"\d (?:km/h|km|cm|g|kΩ|min)\b"  # a given stated in a non-SI unit


def test_physics_easy_and_default_state_and_ask_as_their_difficulty_says() -> None:
    """physics_easy states every given in SI; physics states some (15-45%) in non-SI units; neither asks a non-SI answer."""
    for name, lo, hi in (("physics_easy", 0.0, 0.0), ("physics", 0.15, 0.45)):
        problems = get_task(name).problems("train", 300, seed=5)
        non_si = sum(bool(re.search(_NON_SI_GIVEN, p.prompt.split("\n\n")[0])) for p in problems) / len(problems)
        assert lo <= non_si <= hi, (name, non_si)
        assert all(p.metadata["unit"] == SI[p.metadata["dimension"]] for p in problems), name


def test_physics_hard_is_mostly_chained_problems_and_asks_some_answers_in_other_units() -> None:
    """physics_hard draws ~70% of its problems from the chained generators and asks some in kJ, kN… with a value in [1, 1000)."""
    hard_generators = {"braking_force", "series_power", "fall_momentum", "collision_loss", "slide", "horizontal_launch"}
    problems = get_task("physics_hard").problems("train", 300, seed=5)
    chained = sum(p.metadata["generator"] in hard_generators for p in problems) / len(problems)
    assert 0.6 <= chained <= 0.8, chained
    other = [p for p in problems if p.metadata["unit"] != SI[p.metadata["dimension"]]]
    assert len(other) >= 20, len(other)
    for p in other:
        assert 1 <= p.metadata["value"] < 1000, (p.answer, p.metadata["value_si"])


def test_physics_givens_are_two_figure_numbers_of_readable_size() -> None:
    """Every number a prompt states has at most 2 significant figures and lies in [0.01, 10000) ("1500000 g" stays 1500 kg)."""
    def figures(n: str) -> int:
        digits = n.replace(".", "").lstrip("0")
        return len(digits.rstrip("0")) if "." not in n else len(digits)

    for name in ("physics_easy", "physics", "physics_hard"):
        for p in get_task(name).problems("train", 300, seed=6):
            text = p.prompt.split("\n\n")[0]
            for n in re.findall(r"(?<![\w.])\d+(?:\.\d+)?", text):
                assert figures(n) <= 2 and 0.01 <= float(n) < 10_000, (n, text)


#: The range (SI) each generator draws each given from, as physics.py states it.
_GIVEN_RANGES = {
    "final_speed": {"v0": (0, 15), "a": (0.5, 4), "t": (2, 20)},
    "distance": {"v0": (0, 20), "a": (0.5, 3), "t": (3, 30)},
    "stopping": {"v": (8, 35), "a": (2, 8)},
    "avg_speed": {"d": (100, 5000), "t": (20, 900)},
    "fall_time": {"h": (2, 120)}, "fall_speed": {"h": (2, 120)},
    "kinetic": {"m": (0.2, 1500), "v": (1, 30)},
    "potential": {"m": (0.5, 80), "h": (1, 50)},
    "lift_power": {"m": (20, 800), "h": (2, 40), "t": (4, 120)},
    "ohm": {"V": (1.5, 240), "R": (10, 5000)},
    "series": {"V": (3, 48), "R1": (10, 900), "R2": (10, 900)},
    "parallel": {"R1": (10, 900), "R2": (10, 900)},
    "power_dissipated": {"V": (3, 240), "R": (5, 2000)},
    "momentum": {"m": (0.05, 2000), "v": (1, 40)},
    "collision": {"m1": (0.5, 1500), "v1": (1, 25), "m2": (0.5, 1500)},
    "force": {"m": (0.5, 2000), "a": (0.2, 6)},
    "braking_force": {"m": (600, 2500), "v": (10, 35), "d": (15, 120)},
    "series_power": {"V": (6, 48), "R1": (10, 900), "R2": (10, 900)},
    "fall_momentum": {"m": (0.1, 20), "h": (1, 60)},
    "collision_loss": {"m1": (0.5, 1500), "v1": (1, 25), "m2": (0.5, 1500)},
    "slide": {"h": (0.5, 20), "μ": (0.1, 0.6)},
    "horizontal_launch": {"h": (1, 80), "v": (2, 30)},
}


def test_physics_givens_in_any_unit_stay_in_their_generators_range() -> None:
    """A given shown in km, g, kΩ, km/h or min is drawn from the same SI range as one shown in SI (2-figure rounding aside)."""
    seen = set()
    for name in ("physics", "physics_hard"):
        for p in get_task(name).problems("train", 400, seed=7):
            gen = p.metadata["generator"]
            seen.add(gen)
            for k, v in p.metadata["values"].items():
                lo, hi = _GIVEN_RANGES[gen][k]
                x = float(v.split(" ")[0])
                assert lo * 0.95 <= x <= hi * 1.05, (gen, k, v, p.prompt[:120])
    assert seen == set(_GIVEN_RANGES), set(_GIVEN_RANGES) - seen


def test_physics_gold_answer_text_has_four_figures_and_no_exponent() -> None:
    """The gold answer text (shown in feedback) is the value to 4 significant figures, small currents as 0.0009167 A, not 9.167e-04."""
    assert sig(0.00091666) == "0.0009167" and sig(0.0123456) == "0.01235" and sig(1234.56) == "1235"
    for name in ("physics", "physics_hard"):
        for p in get_task(name).problems("train", 300, seed=8):
            number, unit = p.answer.split(" ", 1)
            assert "e" not in number and unit == p.metadata["unit"], p.answer
            assert float(number) == pytest.approx(p.metadata["value"], rel=5e-4), (p.answer, p.metadata["value"])
            assert len(number.replace(".", "").lstrip("0").rstrip("0")) <= 4, p.answer


def test_physics_feedback_states_the_conversion_and_the_formulas_si_result() -> None:
    """Feedback says "Your 0.26 km is 260 m." and ends the formula line with the SI result (65190 J for an answer asked in kJ)."""
    task = get_task("physics")
    m = Problem("p", "physics", "…", "250 m", {"value": 250.0, "unit": "m", "dimension": "length", "formula": "d = v·t",
                                               "values": {"v": "25 m/s", "t": "10 s"}, "value_si": 250.0, "rel_tol": 0.0075})
    fb = task.feedback(m, "<answer>0.26 km</answer>")
    assert "Your 0.26 km is 260 m." in fb and "Your value 260 m is too high by 4.0%" in fb
    kj = Problem("q", "physics", "…", "65.19 kJ", {"value": 65.19, "unit": "kJ", "dimension": "energy",
                                                  "formula": "E = ½·m·v²", "values": {"m": "1200 kg", "v": "10.42 m/s"},
                                                  "value_si": 65190.0, "rel_tol": 0.0075})
    fb = task.feedback(kj, "<answer>60 kJ</answer>")
    assert "Formula: E = ½·m·v² with m = 1200 kg, v = 10.42 m/s → 65190 J." in fb, fb
    assert "too low by 8.0%" in fb


def test_physics_tolerance_includes_its_boundary() -> None:
    """An answer exactly rel_tol off (204 m for 200 m at 2%) is within the tolerance; one just past it is not."""
    task = get_task("physics")
    p = Problem("p", "physics", "…", "200 m", {"value": 200.0, "unit": "m", "dimension": "length", "formula": "d = v·t",
                                               "values": {}, "value_si": 200.0, "rel_tol": 0.02})
    assert task.reward(p, "<answer>204 m</answer>") == 1.0
    assert task.reward(p, "<answer>196 m</answer>") == 1.0
    assert task.reward(p, "<answer>204.01 m</answer>") == 0.0


def test_physics_rel_tol_option_is_stored_in_each_problem_and_judged_with() -> None:
    """get_task("physics", rel_tol=0.02) writes 0.02 into every problem's metadata, so a 1.5%-off answer scores 1."""
    task = get_task("physics", rel_tol=0.02)
    problems = task.problems("train", 5, seed=1)
    assert all(p.metadata["rel_tol"] == 0.02 for p in problems)
    p = problems[0]
    answer = f"<answer>{p.metadata['value'] * 1.015} {p.metadata['unit']}</answer>"
    assert task.reward(p, answer) == 1.0 and get_task("physics").reward(p, answer) == 1.0
    assert get_task("physics").problems("train", 1, seed=1)[0].metadata["rel_tol"] == 0.0075


def test_physics_reads_units_joined_by_a_hyphen_or_a_dot() -> None:
    """"1500 newton-metres" is 1.5 kJ and "3200 g.m/s" 3.2 kg·m/s (unread, the number was taken in the asked unit: 0)."""
    task = get_task("physics")
    kj = Problem("p", "physics", "…", "1.5 kJ", {"value": 1.5, "unit": "kJ", "dimension": "energy", "formula": "E = F·d",
                                                 "values": {}, "value_si": 1500.0, "rel_tol": 0.0075})
    p = Problem("q", "physics", "…", "3.2 kg·m/s", {"value": 3.2, "unit": "kg·m/s", "dimension": "momentum",
                                                    "formula": "p = m·v", "values": {}, "value_si": 3.2, "rel_tol": 0.0075})
    for problem, answer in ((kj, "1500 newton-metres"), (kj, "1500 N-m"), (p, "3200 g.m/s"), (p, "3200 gram-metres per second")):
        assert task.reward(problem, f"<answer>{answer}</answer>") == 1.0, (answer, task.feedback(problem, f"<answer>{answer}</answer>"))


def test_physics_givens_in_the_prompt_are_the_si_values_the_gold_is_computed_from() -> None:
    """Each given the prompt states ("45 km/h", "350 g", "1.7 kΩ", "12 min"), converted to SI here, is a value in metadata["values"]."""
    to_si = {"km/h": 1 / 3.6, "m/s²": 1.0, "m/s": 1.0, "km": 1e3, "cm": 1e-2, "m": 1.0, "kg": 1.0, "g": 1e-3,
             "kΩ": 1e3, "Ω": 1.0, "min": 60.0, "s": 1.0, "V": 1.0}
    given = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) (km/h|m/s²|m/s|km|cm|m|kg|g|kΩ|Ω|min|s|V)(?![\w/])")
    converted = 0
    for name in ("physics_easy", "physics", "physics_hard"):
        for p in get_task(name).problems("train", 200, seed=10):
            text = p.prompt.split("\n\n")[0].split(" Use g =")[0]
            stated = sorted(float(n) * to_si[u] for n, u in given.findall(text))
            converted += sum(u in ("km/h", "km", "cm", "g", "kΩ", "min") for _, u in given.findall(text))
            values = sorted(float(v.split(" ")[0]) for k, v in p.metadata["values"].items() if k != "μ")
            assert len(stated) == len(values), (text, p.metadata["values"])
            for s, v in zip(stated, values, strict=True):
                assert s == pytest.approx(v, rel=6e-4), (text, p.metadata["values"])
    assert converted >= 50, converted


def test_a_power_on_a_glued_product_binds_to_its_last_unit() -> None:
    """"kgm^2/s^2" is a joule and "Nm^-1" a newton per metre: the power is the last unit's, not the
    whole product's (kg²·m²/s² scored a right energy 0, its feedback naming the wrong kind of unit)."""
    assert parse_unit("kgm^2/s^2") == parse_unit("kgm²/s²") == parse_unit("kg m^2/s^2") == parse_unit("J")
    assert parse_unit("Nm^-1") == parse_unit("N/m") and parse_unit("Nm^2/kg^2") == parse_unit("N m^2 kg^-2")
    assert parse_unit("kph^2") is None  # (km/h)² or km/h²: not guessed
    task = get_task("physics")
    p = Problem("p", "physics", "…", "1500 J", {"value": 1500.0, "unit": "J", "dimension": "energy",
                                               "formula": "E = m·g·h", "values": {}, "value_si": 1500.0,
                                               "rel_tol": 0.0075})
    for answer in ("1500 kgm^2/s^2", "1.5 kJ", "1500 kg m^2 s^-2"):
        assert task.reward(p, f"<answer>{answer}</answer>") == 1.0, (answer, task.feedback(p, f"<answer>{answer}</answer>"))


GSM_TAIL = " Give the result as your final answer. Do not include units."


def _star() -> Problem:
    """A hand-made path-star problem: centre 1, arms 1-2-3-4 (the goal's), 1-5-6-7 and 1-8-9-10."""
    edges = [[1, 2], [2, 3], [3, 4], [1, 5], [5, 6], [6, 7], [1, 8], [8, 9], [9, 10]]
    return Problem("s", "stargraph", "…", "1 2 3 4", {"source": "path_star", "center": 1, "goal": 4, "edges": edges})


def test_a_word_problem_keeps_one_answer_instruction() -> None:
    """gsm_symbolic's own "Give the result as your final answer" sentence is cut from the question."""
    from fastslow.tasks.rgym import Source

    task = get_task("math")
    item = {"question": "Tom has 3 apples and buys 4 more. How many has he?" + GSM_TAIL, "answer": "7",
            "metadata": {"answer_cot": "3 + 4 = 7\n#### 7"}}
    cand = task.convert(item, Source("gsm_symbolic"))
    assert cand is not None and "Give the result as your final answer" not in cand.prompt
    assert cand.prompt.count("Give the final result as a single number.") == 1
    assert all("Give the result as your final answer" not in p.prompt for p in task.problems("train", 30, seed=0))


def test_a_math_item_whose_answer_is_no_number_is_dropped() -> None:
    """Only items with a numeric gold become math problems (a source of word answers gives none)."""
    from fastslow.tasks.rgym import Source

    task = get_task("math")
    assert task.convert({"question": "Sort these words.", "answer": "apple, banana", "metadata": {}},
                        Source("word_sorting")) is None
    assert task.convert({"question": "What is 3 + 4?", "answer": "7", "metadata": {}}, Source("chain_sum")) is not None


def test_a_word_problems_reference_solution_is_its_working_without_the_final_answer_line() -> None:
    """Generated word problems carry reasoning-gym's worked solution, and feedback quotes it before "####", cut to 1200."""
    task = get_task("math")
    words = [p for p in task.problems("train", 30, seed=0) if p.metadata["source"] == "gsm_symbolic"]
    assert words and all("####" in p.metadata["solution"] and "=" in p.metadata["solution"] for p in words)
    steps = "Tom has 3 + 4 = 7 apples.\n#### 7"
    p = Problem("m", "math", "?", "7", {"source": "gsm_symbolic", "solution": steps})
    fb = task.feedback(p, "<answer>8</answer>")
    assert "Reference solution: Tom has 3 + 4 = 7 apples." in fb and "####" not in fb
    long = Problem("m", "math", "?", "7", {"source": "gsm_symbolic", "solution": "step " * 400 + "\n#### 7"})
    line = next(x for x in task.feedback(long, "<answer>8</answer>").splitlines() if x.startswith("Reference"))
    assert len(line) == len("Reference solution: ") + 1200


def test_math_feedback_asks_for_the_number_alone_only_when_it_read_more() -> None:
    """A right answer read from "x = 42" or "42 apples" is accepted with a note; a bare "42" gets none."""
    task = get_task("math")
    p = Problem("m", "math", "What is 6*7?", "42", {"source": "basic_arithmetic", "expression": "6*7"})
    assert "answer with the number alone" not in task.feedback(p, "<answer>42</answer>")
    for answer in ("x = 42", "42 apples"):
        assert task.reward(p, f"<answer>{answer}</answer>") == 1.0
        assert "answer with the number alone" in task.feedback(p, f"<answer>{answer}</answer>"), answer


def test_math_miss_diagnosis_thresholds() -> None:
    """A miss within 1% is "close"; 5% off is not; a factor of 1000 either way is a place-value slip."""
    task = get_task("math")
    p = Problem("m", "math", "?", "1000", {"source": "basic_arithmetic"})
    assert "close, but" in task.feedback(p, "<answer>995</answer>")
    plain = task.feedback(p, "<answer>950</answer>")
    assert "Your 950 is not 1000 (off by -50)." in plain and "close" not in plain
    for slip in ("1000000", "1"):
        assert "a factor-of-ten (place value or unit) slip." in task.feedback(p, f"<answer>{slip}</answer>"), slip
    neither = task.feedback(p, "<answer>-990</answer>")
    assert "sign is wrong" not in neither and "close" not in neither and "slip" not in neither


def test_stargraph_feedback_names_a_wrong_start_or_end() -> None:
    """A path from the wrong node is told its start; one from the centre to the wrong node its end."""
    task = get_task("stargraph")
    p = _star()
    start = task.feedback(p, "<answer>2 3 4</answer>")
    assert "The path must start at the start node 1, not 2." in start and "must end" not in start
    assert "first step" not in start  # a path that leaves the wrong node took no first step from the centre
    end = task.feedback(p, "<answer>1 2 3</answer>")
    assert "The path must end at the goal 4, not 3." in end and "must start" not in end
    assert "not an edge" not in end and "first step" not in end
    both = task.feedback(p, "<answer>2 3</answer>")  # one diagnosis of the ends at a time: the start first
    assert "must start at the start node 1, not 2." in both and "must end" not in both
    bare = Problem("s", "stargraph", "…", "1 2 3 4", {})  # no graph stored: the gold path's ends
    assert "The path must start at the start node 1, not 2." in task.feedback(bare, "<answer>2 3 4</answer>")
    assert "The path must end at the goal 4, not 3." in task.feedback(bare, "<answer>1 2 3</answer>")


def test_stargraph_feedback_finds_the_first_missing_edge_and_counts_the_arms() -> None:
    """The first non-edge of the path is named, and the arms from the centre are counted and listed."""
    task = get_task("stargraph")
    p = _star()
    fb = task.feedback(p, "<answer>1 2 4</answer>")
    assert "2–4 is not an edge of the graph." in fb
    assert "From 1, 3 arms start (2, 5, 8); the goal 4 is on the arm through 2." in fb
    wrong_arm = task.feedback(p, "<answer>1 5 6 7</answer>")
    assert "The first step went to 5, but the goal lies on the arm that starts at 2." in wrong_arm


def test_stargraph_problems_carry_their_own_graph() -> None:
    """A generated problem's edges are the task's graph (not the prompt's example), its centre and goal the path's ends."""
    task = get_task("stargraph")
    for p in task.problems("val", 3, seed=0):
        task_line = p.prompt.split("Solve the following task:")[1]
        edges = {frozenset(e) for e in p.metadata["edges"]}
        path = [int(x) for x in p.answer.split()]
        assert p.metadata["center"] == path[0] and p.metadata["goal"] == path[-1]
        assert all(frozenset(pair) in edges for pair in zip(path, path[1:], strict=False))
        assert len(edges) == task_line.count("|")


def test_a_source_weight_defaults_to_one() -> None:
    """A config source without a weight weighs 1, as much as one given weight 1."""
    from fastslow.tasks.rgym import as_source

    assert as_source({"dataset": "chain_sum"}).weight == 1.0
    with pytest.raises(ValueError, match="weight: expected a positive number"):
        as_source({"dataset": "chain_sum", "weight": True})
    with pytest.raises(ValueError, match="weight: expected a positive number"):
        as_source({"dataset": "chain_sum", "weight": 0})




_TEMPLATES = {
    "tubes": ("name1 name2 color1 color2", ("n1", "n2", "frac1", "mult1", "n1_result", "n2_result")),
    "class": ("teacher group1 group2 group3 event", ("total_students", "percent_group1", "percent_group23",
                                                     "group1_count", "group23_count")),
    "muffins": ("name items food location container", ("num_jars", "per_jar", "per_pan", "total_items")),
    "crackers": ("name item1 item2 currency", ("price1", "price2", "total_spent", "num_item1", "num_item2",
                                               "percent_change")),
    "beach": ("name unit", ("beach_distance", "beach_time", "sidewalk_distance", "sidewalk_time",
                            "speed_multiplier", "total_distance")),
    "store": ("currency item name store_type", ("initial_amount", "quantity", "remaining", "total_cost",
                                                "unit_price")),
    "penpals": ("name", ("current_penpals", "initial_penpals", "letters_per_week", "lost_penpals",
                         "minutes_per_page", "pages_per_letter", "total_minutes")),
    "cards": ("c1 c2 c3 item", ("more_cards", "n1", "p", "total")),
}


def _vars(template: str, **values: object) -> dict[str, object]:
    """Variables of one of the eight truncating templates: its words, 1 for unnamed numbers, then `values`."""
    words, numbers = _TEMPLATES[template]
    return {w: "w" for w in words.split()} | dict.fromkeys(numbers, 1) | values


@pytest.mark.parametrize(("template", "exact", "truncated"), [
    ("tubes", {"n1": 8, "frac1": 0.5, "n1_result": 4, "n2": 3, "mult1": 2, "n2_result": 6},
     {"n1": 9, "frac1": 0.5, "n1_result": 4, "n2": 3, "mult1": 2, "n2_result": 6}),
    ("tubes", {"n1": 10, "frac1": 0.1, "n1_result": 1, "n2": 4, "mult1": 1.5, "n2_result": 6},
     {"n1": 8, "frac1": 0.5, "n1_result": 4, "n2": 3, "mult1": 1.5, "n2_result": 4}),
    ("class", {"total_students": 100, "percent_group1": 20, "group1_count": 20, "percent_group23": 25,
               "group23_count": 20},
     {"total_students": 100, "percent_group1": 60, "group1_count": 60, "percent_group23": 38, "group23_count": 15}),
    ("muffins", {"num_jars": 9, "per_jar": 12, "total_items": 108, "per_pan": 12},
     {"num_jars": 9, "per_jar": 12, "total_items": 108, "per_pan": 24}),
    ("crackers", {"total_spent": 1000, "percent_change": 10, "num_item1": 10, "price1": 100, "price2": 200,
                  "num_item2": 445},
     {"total_spent": 1000, "percent_change": 10, "num_item1": 10, "price1": 100, "price2": 135, "num_item2": 659}),
    ("beach", {"beach_distance": 10, "beach_time": 60, "speed_multiplier": 2, "sidewalk_distance": 5,
               "sidewalk_time": 15},
     {"beach_distance": 10, "beach_time": 60, "speed_multiplier": 8, "sidewalk_distance": 5, "sidewalk_time": 3}),
    ("store", {"remaining": 42}, {"remaining": 42.99999999999999}),
    ("penpals", {"total_minutes": 4800}, {"total_minutes": 4770}),
    ("cards", {"p": 58, "n1": 50, "more_cards": 29}, {"p": 58, "n1": 50, "more_cards": 28}),
])
def test_gsm_exact_keeps_exact_items_and_drops_truncating_ones(template: str, exact: dict, truncated: dict) -> None:
    """Each truncating gsm_symbolic template keeps an item whose steps are exact and drops one that truncates."""
    from fastslow.tasks.math_task import gsm_exact

    assert gsm_exact(_vars(template, **exact)) is True
    assert gsm_exact(_vars(template, **truncated)) is False
    assert gsm_exact(_vars(template, **{**exact, next(iter(exact)): "many"})) is False  # unreadable: dropped
    assert gsm_exact({"name": "w", "age": 3}) is True and gsm_exact(None) is True  # no truncating template


@pytest.mark.parametrize(("expression", "answer", "kept"), [
    ("-3 * 4", "-12", True), ("-3 * 4", "12", False), ("7 / 2", "3.5", True), ("7 / 2", "3", False),
    ("5 / 9", "10", False), ("5 / 0", "1", False), ("1 + 2 + 3 + 4 + 5 + 6 + 7 + 8", "35", False),
    ("1 + 2 + 3 + 4 + 5 + 6 + 7 + 8", "36", True), ("sqrt(16)", "4", True),
    ("0.1 + 0.2", "0.3", True),  # decimals are not integer arithmetic: not checked (0.1 as a float is not 1/10)
])
def test_a_math_item_is_kept_only_when_its_gold_is_its_expressions_exact_value(expression: str, answer: str,
                                                                               kept: bool) -> None:
    """An arithmetic item whose gold is not its expression's exact value is dropped; an expression we cannot check is kept."""
    from fastslow.tasks.rgym import Source

    item = {"question": f"Calculate {expression}.", "answer": answer, "metadata": {"expression": expression}}
    cand = get_task("math").convert(item, Source("basic_arithmetic"))
    assert (cand is not None) is kept
    if kept:
        assert cand.metadata["expression"] == expression
        assert cand.key == "math|expression|" + expression.replace(" ", "")


def test_generated_arithmetic_problems_show_their_expression_in_feedback() -> None:
    """Generated arithmetic problems keep their expression, and a wrong answer's feedback quotes it."""
    task = get_task("math_easy")
    arithmetic = [p for p in task.problems("train", 20, seed=0) if p.metadata["source"] in ("basic_arithmetic",
                                                                                              "chain_sum")]
    assert arithmetic and all(p.metadata["expression"] for p in arithmetic)
    p = arithmetic[0]
    assert f"Expression to evaluate: {p.metadata['expression']}" in task.feedback(p, "<answer>-99999</answer>")


def test_a_word_problems_identity_holds_its_template_names_but_not_a_flag() -> None:
    """Two templates with the same numbers but differently named words are two problems; a true/false flag is no number."""
    from fastslow.tasks.math_task import problem_identity

    assert problem_identity("", variables={"name": "Jo", "n": 3}, answer="6") != \
        problem_identity("", variables={"person": "Jo", "n": 3}, answer="6")
    assert problem_identity("", variables={"n": 3, "weekend": True}, answer="6") == \
        problem_identity("", variables={"n": 3, "weekend": False}, answer="6")


def test_a_word_problems_key_holds_its_answer() -> None:
    """Two items of one template and numbers whose answers differ (a word changed) get different split keys."""
    from fastslow.tasks.rgym import Source

    task = get_task("math")

    def key(period: str, answer: str) -> str | None:
        variables = {"name": "Jo", "per_day": 16, "period": period}
        item = {"question": f"Jo eats 16 a day. How many in one {period}?", "answer": answer,
                "metadata": {"variables": variables, "answer_cot": f"16 * n = {answer}\n#### {answer}"}}
        cand = task.convert(item, Source("gsm_symbolic"))
        assert cand is not None
        return cand.key

    assert key("week", "112") != key("month", "480")
    assert key("week", "112") == key("fortnight", "112")


def test_a_math_problem_with_an_unreadable_gold_scores_zero_without_raising() -> None:
    """A gold that is no number (a hand-made or loaded problem) scores every answer 0 and still gives feedback."""
    task = get_task("math")
    p = Problem("m", "math", "?", "seven", {})
    assert task.judge(p, "<answer>7</answer>").reward == 0.0
    assert task.reward(p, "<answer>7</answer>") == 0.0 and "Expected answer: seven" in task.feedback(p, "<answer>7</answer>")
    # the note blames the gold, not the answer, which was read ("Could not read the answer" said otherwise)
    notes = task.judge(p, "<answer>7</answer>").notes
    assert notes[0] == "The expected answer 'seven' is not a number, so no answer can match it.", notes


def test_a_reasoning_gym_task_draws_other_problems_for_another_seed() -> None:
    """The seed picks the item stream: seeds 0 and 1 give different star graphs, one seed the same ones."""
    task = get_task("stargraph")
    first = [p.prompt for p in task.problems("train", 4, seed=0)]
    assert first == [p.prompt for p in get_task("stargraph").problems("train", 4, seed=0)]
    assert not set(first) & {p.prompt for p in task.problems("train", 4, seed=1)}


def test_a_source_with_an_unknown_key_is_refused() -> None:
    """A config source's keys are dataset, config and weight only; a misspelt or extra key is named."""
    from fastslow.tasks.rgym import as_source

    with pytest.raises(ValueError, match=r"unknown key\(s\) \['seed'\]"):
        as_source({"dataset": "chain_sum", "seed": 3})


def test_a_rarely_drawn_source_reasoning_gym_rejects_still_stops_the_split() -> None:
    """Every source's dataset is made before any item is drawn, so a bad one stops even a split that never draws it."""
    task = get_task("math", sources=[{"dataset": "chain_sum"}, {"dataset": "chain_summ", "weight": 1e-9}])
    with pytest.raises(TaskDataError, match="source 'chain_summ': reasoning-gym cannot create this dataset"):
        task.problems("train", 1, 0)


def test_the_math_mixture_draws_word_problems_by_their_weight() -> None:
    """Default math weighs gsm_symbolic 2 against 1 and 1: about half its problems are word problems."""
    problems = get_task("math").problems("train", 300, seed=0)
    share = sum(p.metadata["source"] == "gsm_symbolic" for p in problems) / len(problems)
    assert 0.42 < share < 0.58, share


@pytest.mark.parametrize("text", ["1,2345", "1,234,5678", "12,3456.5", "0.123,456"])
def test_parse_number_takes_no_thousands_group_that_runs_on(text: str) -> None:
    """A thousands group is three digits between separators: "1,2345" is no number (it read 12345
    if the group's edges were not checked)."""
    assert parse_number(text) is None


@pytest.mark.parametrize(("text", "value"), [("42.5.", 42.5), ("\\boxed{42}.", 42), ("**42**.", 42),
                                             ("5.0.", 5.0)])
def test_parse_number_drops_a_sentences_full_stop(text: str, value: float) -> None:
    """An answer ending a sentence ("\\boxed{42}.") is the number itself, read as one (no
    "answer with the number alone" note)."""
    assert parse_number(text) == value
    assert extract_number(text) == (value, "read as a number")


def test_numbers_close_tolerance_is_one_in_a_million() -> None:
    """A non-integer gold is matched within a relative 1e-6, not more: 2.35 * (1 + 1e-5) is wrong."""
    from fastslow.tasks.scoring import numbers_close

    assert numbers_close(2.35 * (1 + 5e-7), 2.35) and not numbers_close(2.35 * (1 + 1e-5), 2.35)
    assert not numbers_close(2.35 * (1 - 1e-5), 2.35)


@pytest.mark.parametrize(("gold", "answer", "reward"), [("123456.789", "123456.7891", 1.0),
                                                         ("0.000001234", "0.000001", 0.0),
                                                         ("0.000001234", "0.0000012340001", 1.0),
                                                         ("42", "42.0000001", 0.0)])
def test_math_compares_a_decimal_gold_relatively(gold: str, answer: str, reward: float) -> None:
    """The math judge's tolerance is relative (numbers_close): a large decimal gold takes an answer
    off in its 10th digit, and a tiny one is not matched by any answer within 1e-6 of it."""
    task = get_task("math")
    assert task.reward(Problem("m", "math", "?", gold, {}), f"<answer>{answer}</answer>") == reward


@pytest.mark.parametrize(("value", "text"), [(42.0, "42"), (-3.0, "-3"), (2.5, "2.5"), (1 / 3, "0.3333"),
                                             (1e20, "1e+20"), (-1e15, "-1e+15"), (999999999999999.0, "999999999999999")])
def test_format_number_writes_integers_whole_and_others_to_four_digits(value: float, text: str) -> None:
    """Feedback's numbers: an integer whole, up to 15 digits; past that, or not an integer, 4 significant digits."""
    from fastslow.tasks.scoring import format_number

    assert format_number(value) == text


def test_a_linear_equation_is_one_problem_whatever_its_variable() -> None:
    """simple_equations names its variable at random: "3*y + 2 = 11" and "3*x + 2 = 11" are one
    problem (one key), but a variable's letter inside another name is no variable."""
    from fastslow.tasks.math_task import problem_identity

    assert problem_identity("", "3*y + 2 = 11", "y") == problem_identity("", "3*x + 2 = 11", "x") == "math|equation|3*x+2=11"
    assert problem_identity("", "3*y + 2 = 11", "y") != problem_identity("", "3*y + 2 = 12", "y")
    assert problem_identity("", "ab*b + 1 = 5", "b") == "math|equation|ab*x+1=5"


def test_a_word_problems_identity_holds_its_answer_and_only_its_numbers() -> None:
    """A template told with the same numbers but a different word ("per week" / "per month") has another
    answer: two keys. Names, and variables that are no number (or an empty list), are not in the key."""
    from fastslow.tasks.math_task import _numbers, problem_identity

    week = {"name": "Ann", "rate": 16, "period": "week"}
    assert problem_identity("", variables=week, answer="112") != problem_identity("", variables=week, answer="480")
    assert problem_identity("", variables=week, answer="112") == problem_identity(
        "", variables={**week, "name": "Bo"}, answer=" 112 ")
    assert problem_identity("", variables={"n": [], "m": 2}) == problem_identity("", variables={"n": "few", "m": 2})
    assert _numbers([1, 2.5]) and _numbers(3) and not _numbers([]) and not _numbers(True) and not _numbers([1, "a"])
