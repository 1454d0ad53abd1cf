"""Regressions from the task audit: unit parsing (written-out units, "per", products, negative
exponents, SI prefix case), exact integer scoring, labels inside sentences, reference answers that
contradict their own expression, and splits that leaked the same problem reworded."""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest

from fastslow.tasks import get_task
from fastslow.tasks.base import Problem
from fastslow.tasks.generated import Candidate as _Candidate
from fastslow.tasks.loaders import load_task_file
from fastslow.tasks.rgym import rg_score
from fastslow.tasks.scoring import normalize_label, numbers_close
from fastslow.tasks.units import SI, UNITS, canonical_unit, convert, parse_quantity, parse_unit

LABELS = ("SUPPORTED", "NOT_SUPPORTED")


def physics_problem(value: float, unit: str) -> Problem:
    dim = UNITS[unit][0]
    meta = {"value": value, "unit": unit, "dimension": dim, "formula": "x = y", "values": {},
            "value_si": value * UNITS[unit][1], "rel_tol": 0.02}
    return Problem("p", "physics", "…", f"{value:g} {unit}", meta)


# --- physics units -------------------------------------------------------------------------
@pytest.mark.parametrize("value, unit, answers", [
    (12.5, "m/s", ["12.5 meters per second", "12.5 Metres per second", "12.5 m s^-1", "12.5 m·s⁻¹",
                   "45 kilometers per hour", "45 km per hour", "45 kph", r"12.5\ \mathrm{m\,s^{-1}}",
                   r"12.5 \frac{\text{m}}{\text{s}}", "1250 cm/s"]),
    (12.5, "km/h", ["12.5 kilometres per hour", "3.472 m/s", "3.472 meters/second"]),
    (3.2, "kg·m/s", ["3.2 N s", "3.2 N·s", "3.2 newton seconds", "3.2 kg m/s", "3.2 kg·m/s",
                     r"3.2 \text{kg} \cdot \text{m/s}", r"$3.2\,\mathrm{kg\,m\,s^{-1}}$", "3.2 kgms^-1",
                     "3200 g·m/s", "3.2 kilogram meters per second"]),
    (1500.0, "J", ["1500 N m", "1500 N·m", "1500 newton-metres", "1.5 kJ", "1.5 kilojoules", "1.5 KJ"]),
    (0.3544, "W", ["354.4 mW", "354.4 milliwatts", "0.3544 J/s", "0.3544 watts"]),
    (0.0045, "J", ["4.5 mJ", "4.5 millijoules", "4.5e-9 MJ"]),
    (12.0, "mA", ["12 mA", "0.012 A", "12 milliamps", "12000 μA"]),
    (2.5, "kΩ", ["2.5 kohm", "2500 ohms", r"2.5 k\Omega", "2.5 kiloohms", "2.5 k\u2126"]),
    (9.8, "m/s²", ["9.8 meters per second squared", "9.8 m s^-2", "9.8 ms^-2", "9.8 m/s/s"]),
])
def test_physics_reads_written_out_units_products_and_prefixes(value: float, unit: str, answers: list[str]) -> None:
    task = get_task("physics")
    p = physics_problem(value, unit)
    for a in answers:
        assert task.reward(p, f"<answer>{a}</answer>") == 1.0, (a, task.feedback(p, f"<answer>{a}</answer>"))


@pytest.mark.parametrize("value, unit, answer, note", [
    (0.0045, "J", "4.5 MJ", "too high"),           # MJ is megajoules, never millijoules
    (4.5e6, "J", "4.5 mJ", "too low"),
    (0.3544, "W", "354.4 MW", "too high"),
    (12.0, "mA", "12 MA", "too high"),
    (12.5, "m/s", "12.5 meters", "Wrong kind of unit: m measures length"),
    (3.2, "kg·m/s", "3.2 N", "Wrong kind of unit: N measures force"),
    (1500.0, "J", "1500 N", "Wrong kind of unit: N measures force"),
    (1500.0, "J", "1500 W", "Wrong kind of unit: W measures power"),
])
def test_physics_prefix_case_and_dimension_are_checked(value: float, unit: str, answer: str, note: str) -> None:
    task = get_task("physics")
    p = physics_problem(value, unit)
    assert task.reward(p, f"<answer>{answer}</answer>") == 0.0
    assert note in task.feedback(p, f"<answer>{answer}</answer>")


@pytest.mark.parametrize("answer", ["96{,}800", r"$\boxed{96{,}800}$", "96 800", "96\u202f800", "96\u00a0800",
                                    "96,800", "96800"])
def test_math_reads_thousands_grouped_as_latex_and_spaces_write_them(answer: str) -> None:
    """`96{,}800`, `96 800` (also with narrow and plain no-break spaces) scored 0 for 96800 ("holds 2
    numbers"), though physics reads them; 28% of math_hard's answers are 1000 or more."""
    task = get_task("math")
    p = Problem("m", "math", "…", "96800", {})
    assert task.reward(p, f"<answer>{answer}</answer>") == 1.0, task.feedback(p, f"<answer>{answer}</answer>")


@pytest.mark.parametrize("answer", ["96 80", "9 6800", "96 800 1", "31 2"])
def test_math_takes_no_other_grouping_for_one_number(answer: str) -> None:
    task = get_task("math")
    assert task.reward(Problem("m", "math", "…", "96800", {}), f"<answer>{answer}</answer>") == 0.0


@pytest.mark.parametrize("name", ["physics_easy", "physics", "physics_hard"])
def test_physics_asks_for_the_precision_it_judges(name: str) -> None:
    """Nothing said how precise an answer must be, and two-figure answers, as two-figure givens
    suggest, missed the 2% tolerance one time in ten. The prompt asks for 3 significant figures,
    and every answer rounded so scores 1."""
    task = get_task(name)
    for p in task.problems("train", 150, seed=0):
        assert "to at least 3 significant figures" in p.prompt
        three = float(f"{p.metadata['value']:.3g}")
        assert task.reward(p, f"<answer>{three:g} {p.metadata['unit']}</answer>") == 1.0, (p.id, p.answer, three)


def test_physics_reads_an_answer_in_latex_math_delimiters_with_its_unit() -> None:
    """`\\(65190\\ \\text{J}\\)` for 65.19 kJ: the trailing `\\)` stuck to the unit, which was then
    not read, and the number was taken in the requested unit: the right answer scored 0, a
    thousand times too small one 1."""
    task = get_task("physics")
    p = physics_problem(65.19, "kJ")
    for right in (r"\(65190\ \text{J}\)", r"\[65190 \text{ J}\]", r"\(65.19\,\mathrm{kJ}\)", r"\(65.19\)"):
        assert task.reward(p, f"<answer>{right}</answer>") == 1.0, (right, task.feedback(p, f"<answer>{right}</answer>"))
    assert task.reward(p, r"<answer>\(65.19\ \text{J}\)</answer>") == 0.0
    assert parse_quantity(r"\(65190\ \text{J}\)")[:2] == (65190.0, "J")


def test_physics_reads_a_small_answer_in_scientific_notation() -> None:
    """1.2 mA as 1.2 × 10^-3 A, as models write small values: the exponent's sign counts (read
    as +3 it is a million times too large, and the right answer scores 0)."""
    task = get_task("physics")
    p = physics_problem(1.2, "mA")
    for right in ("1.2 × 10^-3 A", r"\(1.2 \times 10^{-3}\ \text{A}\)", "1.2e-3 A"):
        assert task.reward(p, f"<answer>{right}</answer>") == 1.0, right
    assert task.reward(p, "<answer>1.2 × 10^3 A</answer>") == 0.0


def test_an_unreadable_unit_is_reported_never_given_a_wrong_dimension() -> None:
    task = get_task("physics")
    p = physics_problem(12.5, "m/s")
    fb = task.feedback(p, "<answer>12.5 meters per secnd</answer>")
    assert "'meters per secnd' was not recognised" in fb and "Wrong kind" not in fb
    q = physics_problem(4.5, "kJ")
    fb = task.feedback(q, "<answer>4.5 mj</answer>")  # mJ or MJ? not guessed, and neither is kJ
    assert task.reward(q, "<answer>4.5 mj</answer>") == 0.0  # (it was read as kJ: 1.0)
    assert "could be MJ or mJ, and neither is the kJ asked for" in fb and "case-sensitive" in fb
    for value, unit, written in ((14020, "J", "mj"), (637, "W", "mw"), (2.722, "kN", "mn"), (4.5, "kJ", "Mj")):
        assert task.reward(physics_problem(value, unit), f"<answer>{value} {written}</answer>") == 0.0, written
    # a case-ambiguous unit one of whose readings is the one asked for is read as it
    assert task.reward(physics_problem(4.5, "mA"), "<answer>4.5 ma</answer>") == 1.0
    # ...but either is an energy: for a current it is the wrong kind of unit, not amperes
    a = physics_problem(0.068, "A")
    assert task.reward(a, "<answer>0.068 mj</answer>") == 0.0
    assert "Wrong kind of unit: MJ or mJ measures energy" in task.feedback(a, "<answer>0.068 mj</answer>")
    assert parse_quantity("12.5 m/s approx") == (12.5, "m/s", "m/s approx")
    assert parse_quantity("250 m or 300 m")[0] is None


def test_physics_answers_to_3_figures_pass_and_g_10_for_the_stated_9_8_does_not(monkeypatch) -> None:
    """The prompt asks for 3 significant figures and states g = 9.8 m/s². At 2% the judge took
    g = 10 on every free-fall problem (sqrt(10/9.8): 1.0% off) and on a fifth to a third of the
    linear ones, rounding included. The same problems generated with g = 10 (`physics.G`: their
    givens and identities are the same) give that answer, to 3 figures."""
    import fastslow.tasks.physics as physics

    problems = {}
    for difficulty in ("easy", "default", "hard"):
        problems[difficulty] = get_task("physics", difficulty=difficulty).problems("train", 400, seed=3)
        for p in problems[difficulty]:  # every right answer to the figures asked for passes
            answer = f"<answer>{p.metadata['value']:.3g} {p.metadata['unit']}</answer>"
            assert get_task("physics").reward(p, answer) == 1.0, (p.answer, answer)
    monkeypatch.setattr(physics, "G", 10.0)
    passed, tried = 0, 0
    for difficulty, ps in problems.items():
        with_10 = {q.metadata["generator"] + repr(q.metadata["values"]): q
                   for q in get_task("physics", difficulty=difficulty).problems("train", 400, seed=3)}
        for p in ps:
            q = with_10.get(p.metadata["generator"] + repr(p.metadata["values"]))
            if "Use g = 9.8" not in p.prompt or q is None or q.metadata["unit"] != p.metadata["unit"]:
                continue
            assert q.metadata["value"] != p.metadata["value"]
            tried += 1
            passed += get_task("physics").reward(p, f"<answer>{q.metadata['value']:.3g} {q.metadata['unit']}</answer>")
    assert tried >= 150 and passed / tried < 0.03, (passed, tried)


def test_unit_table_parses_to_itself_and_conversions_are_consistent() -> None:
    assert set(UNITS) >= set(SI.values())
    for sym, (dim, factor) in UNITS.items():
        assert canonical_unit(sym) == sym
        assert convert(1.0, sym, SI[dim]) == pytest.approx(factor)
    assert parse_unit("N·s") == parse_unit("kg·m/s") == parse_unit("kg m s^-1")
    assert parse_unit("mW").scale == pytest.approx(1e-3) and parse_unit("MW").scale == pytest.approx(1e6)
    assert convert(1.0, "m/s", "kg") is None and parse_unit("meters per") is None
    # powers spelled before the unit, as people write areas and volumes, or after it
    assert parse_unit("square meters") == parse_unit("sq m") == parse_unit("meters squared") == parse_unit("m^2")
    assert convert(2.0, "cubic centimeters", "m^3") == pytest.approx(2e-6) == convert(2.0, "cm cubed", "m^3")
    assert parse_unit("kg per square meter") == parse_unit("kg/m^2")
    assert [parse_unit(t) for t in ("square", "cubic", "squared", "per squared m")] == [None] * 4


def test_every_generated_physics_answer_reads_in_si_and_spelled_forms() -> None:
    names = {"m": "metres", "s": "seconds", "kg": "kilograms", "m/s": "metres per second",
             "m/s²": "metres per second squared", "N": "newtons", "J": "joules", "W": "watts",
             "V": "volts", "A": "amperes", "Ω": "ohms", "kg·m/s": "newton seconds"}
    for name in ("physics", "physics_hard"):
        task = get_task(name)
        for p in task.problems("train", 60, seed=2):
            m = p.metadata
            for unit in (SI[m["dimension"]], names[SI[m["dimension"]]]):
                answer = f"<answer>{m['value_si']:.6g} {unit}</answer>"
                assert task.reward(p, answer) == 1.0, (p.answer, answer, task.feedback(p, answer))


# --- exact numeric scoring -----------------------------------------------------------------
def test_integer_golds_compare_exactly_and_decimals_with_a_tolerance() -> None:
    assert not numbers_close(176204233, 176204232) and not numbers_close(176204235.0, 176204232)
    assert numbers_close(176204232.0, 176204232) and not numbers_close(42.0000001, 42)
    assert numbers_close(0.1 + 0.2, 0.3) and numbers_close(0.333333333, 1 / 3)
    assert numbers_close(2.3500001, 2.35) and not numbers_close(2.36, 2.35)
    assert not numbers_close(float("nan"), 1.0) and not numbers_close(1.0, float("inf"))
    # a tiny non-integer gold is matched relatively too: 0 (or 1e-10) is not 5e-10
    assert not numbers_close(0.0, 5e-10) and not numbers_close(1e-10, 5e-10) and numbers_close(5.0000001e-10, 5e-10)


def test_math_and_the_numeric_file_scorer_are_exact_on_integers(tmp_path: Path) -> None:
    task = get_task("math")
    p = Problem("m", "math", "Calculate ( -70 - -719 ) * ( -430 - -55 ) * -724 + 732.", "176204232",
                {"source": "basic_arithmetic", "expression": "( -70 - -719 ) * ( -430 - -55 ) * -724 + 732"})
    for ok in ("176204232", "176,204,232", "1.76204232e8", "x = 176204232"):
        assert task.reward(p, f"<answer>{ok}</answer>") == 1.0, ok
    for bad in ("176204233", "176204235", "176204231.5", "1.762042e8"):
        assert task.reward(p, f"<answer>{bad}</answer>") == 0.0, bad
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"q{i}?", "answer": str(176204232 + i)}) + "\n"
                            for i in range(12)), encoding="utf-8")
    file_task = load_task_file(path, scorer="numeric")
    q = file_task.problems("train", 3, seed=0)[0]
    assert file_task.reward(q, f"<answer>{q.answer}</answer>") == 1.0
    assert file_task.reward(q, f"<answer>{int(q.answer) + 1}</answer>") == 0.0


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_math_agrees_with_reasoning_gym_on_basic_arithmetic() -> None:
    """Right, off-by-one and off-by-three answers to basic_arithmetic problems (big golds from the
    hard mixture): our reward is reasoning-gym's own score_answer (which compares strings)."""
    task = get_task("math_hard")
    problems = [p for p in task.problems("train", 60, seed=4) if p.metadata["source"] == "basic_arithmetic"][:8]
    assert len(problems) >= 4 and max(abs(int(p.answer)) for p in problems) > 10**7
    for p in problems:
        gold = int(p.answer)
        entry = {"question": p.prompt, "answer": p.answer, "metadata": {"expression": p.metadata["expression"]}}
        for answer in (str(gold), str(gold + 1), str(gold - 1), str(gold + 3)):
            if answer != p.answer and p.answer in answer:
                continue  # reasoning-gym gives partial credit for a superstring
            assert task.reward(p, f"<answer>{answer}</answer>") == rg_score("basic_arithmetic", answer, entry), answer


def test_math_golds_equal_their_expression() -> None:
    """reasoning-gym's parenthesis-free basic_arithmetic reports left-to-right results and swapped
    divisors ("Calculate 5 / 9." = 10); those items are dropped, so every gold is its expression."""
    for name in ("math_easy", "math_hard"):
        for p in get_task(name).problems("train", 150, seed=0):
            expr = p.metadata.get("expression")
            if expr:
                assert re.fullmatch(r"[\d\s()+\-*/]+", expr)
                assert eval(expr, {"__builtins__": {}}) == pytest.approx(float(p.answer), abs=1e-9), (expr, p.answer)



def test_math_word_problems_whose_reference_truncates_a_step_are_dropped() -> None:
    """Eight gsm_symbolic templates took int() of a fraction ("half as many as 15 tubes" = 7, "0.38*40
    = 15", "108 / 24 = 4" pans, "899.7 / 0.7 = 1285" crackers, 4752 minutes as 79 hours): 2% of word
    problems had a gold the exact working misses. Every `a op b = c` step of their reference
    solutions (read from its text) is now exact; 30 of the first four templates' 91 were not."""
    step = re.compile(r"(?<![\d.*/+-])(?<![\d.*/+-] )[$€£]?(\d+(?:\.\d+)?)\s*([*/x+-])\s*[$€£]?(\d+(?:\.\d+)?)"
                      r"\s*=\s*[$€£]?(\d+(?:\.\d+)?)(?![\d./])")
    from fractions import Fraction as F

    seen = 0
    for difficulty in ("default", "hard"):
        for p in get_task("math", difficulty=difficulty).problems("train", 1500, seed=1):
            if p.metadata["source"] != "gsm_symbolic" or not any(
                    f in p.prompt for f in ("tubes of", "students, ", "worth of", "vending machines",
                                            "penpal", " cards", "and wants to buy")):
                continue
            seen += 1
            for a, op, b, c in step.findall(p.metadata["solution"]):
                value = {"*": F(a) * F(b), "x": F(a) * F(b), "/": F(a) / F(b), "+": F(a) + F(b), "-": F(a) - F(b)}[op]
                assert value == F(c), (f"{a} {op} {b} = {c}", p.answer, p.prompt[:120])
    assert seen >= 40  # the four templates' items are still there, the exact ones


def test_a_number_with_two_signs_is_not_read_as_one_with_one() -> None:
    """"--5" and "- -5" are +5 if anything; the reader took the second sign and scored them -5."""
    from fastslow.tasks.scoring import extract_number

    math_task = get_task("math")
    p = Problem("m", "math", "...", "-5", {})
    for answer in ("--5", "- -5", "x = --5", "−−5", "+-5"):
        assert extract_number(answer)[0] is None, answer
        assert math_task.reward(p, f"<answer>{answer}</answer>") == 0.0, answer
    assert math_task.reward(p, "<answer>-5</answer>") == 1.0 and math_task.reward(p, "<answer>x = - 5</answer>") == 1.0
    assert extract_number("5 - 3")[0] is None and extract_number("The answer is -5.")[0] == -5.0
    assert extract_number("---\n42")[0] == 42.0  # a markdown rule above the number is no sign


def test_a_sign_before_brackets_is_not_dropped() -> None:
    """"-(-5)" is 5 and "-(5)" is -5; the reader dropped the sign before the brackets and scored
    "-(-5)" 1 for -5 and "-(5)" 1 for 5. A signed bracket is an expression: read as no number."""
    from fastslow.tasks.scoring import extract_number

    math_task = get_task("math")
    for gold, answer in (("-5", "-(-5)"), ("5", "-(5)"), ("-5", "+(-5)"), ("5", "-(+5)"), ("-5", "x = -[5]"),
                         ("5", "− ( −5 )"), ("0.5", "-(.5)")):
        assert extract_number(answer)[0] is None, answer
        assert math_task.reward(Problem("m", "math", "...", gold, {}), f"<answer>{answer}</answer>") == 0.0, answer
    assert extract_number("(-5)")[0] == -5.0 and extract_number("answer: (5)")[0] == 5.0
    assert extract_number("- (a) 42")[0] == 42.0  # a list item's marker before a bracket is no sign

# --- labels inside sentences ---------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("The claim is NOT_SUPPORTED", "NOT_SUPPORTED"),
    ("Answer: SUPPORTED", "SUPPORTED"),
    ("SUPPORTED (see doc 3)", "SUPPORTED"),
    ("SUPPORTED, because doc 2 says so", "SUPPORTED"),
    ("The claim is not supported.", "NOT_SUPPORTED"),
    ("Final answer: NOT SUPPORTED, since doc 1 disagrees", "NOT_SUPPORTED"),
    ("Verdict - not-supported", "NOT_SUPPORTED"),
    ("NOT SUPPORTED", "NOT_SUPPORTED"),
    ("not supported", "NOT_SUPPORTED"),
    ("SUPPORTED or NOT_SUPPORTED", None),
    ("It is SUPPORTED, not NOT_SUPPORTED", None),
    ("The claim isn't supported", None),
    ("The claim isn’t supported", None),  # a typographic apostrophe negates too
    ("The claim is never supported", None),
    ("Doc 1 does not name the town; SUPPORTED", "SUPPORTED"),  # a negation in an earlier clause
    ("The claim is not fully supported", None),
    ("unsupported", None),
    ("non-supported", None),
    ("I cannot tell", None),
    # a label with its own negation as the alternative is a hedge, as two labels are
    ("supported or not", None),
    ("SUPPORTED or not", None),
    ("Either SUPPORTED or NOT.", None),
    ("SUPPORTED, or not", None),
    ("SUPPORTED (or not)", None),
    ("SUPPORTED/not", None),
    ("SUPPORTED or no", None),
    ("SUPPORTED whether or not doc 2 names the year", "SUPPORTED"),
    ("SUPPORTED or NOTHING else", "SUPPORTED"),
])
def test_a_label_inside_a_sentence_is_found_and_negation_is_never_read_as_support(text: str, expected: str | None) -> None:
    assert normalize_label(text, LABELS) == expected


def test_hover_rewards_labels_written_in_sentences() -> None:
    task = get_task("hover")
    problems = task.problems("train", 10, seed=1)
    for p in (next(q for q in problems if q.answer == "SUPPORTED"), next(q for q in problems if q.answer == "NOT_SUPPORTED")):
        other = "NOT_SUPPORTED" if p.answer == "SUPPORTED" else "SUPPORTED"
        for form in ("The claim is {}", "Answer: {}", "{} (see doc 3)", "So the answer is {}."):
            assert task.reward(p, f"<answer>{form.format(p.answer)}</answer>") == 1.0, form
            assert task.reward(p, f"<answer>{form.format(other)}</answer>") == 0.0, form
        assert task.reward(p, "<answer>SUPPORTED or NOT_SUPPORTED</answer>") == 0.0
        assert task.reward(p, "<answer>supported or not</answer>") == 0.0  # a hedge, whatever the label
        if p.answer == "SUPPORTED":
            assert task.reward(p, "<answer>The claim is not supported</answer>") == 0.0


# --- splits keyed by problem identity ------------------------------------------------------
def _physics_identity(p: Problem) -> str:
    return p.metadata["generator"] + json.dumps(p.metadata["values"], sort_keys=True, ensure_ascii=False)


def _math_identity(p: Problem) -> str:
    return re.sub(r"\s+", "", p.metadata["expression"]) or p.prompt


@pytest.mark.parametrize("names, identity, n_train", [
    (("physics", "physics_hard", "physics_easy"), _physics_identity, 1000),
    (("math_easy",), _math_identity, 1000),
])
def test_no_val_or_test_problem_is_a_reworded_train_problem(names, identity, n_train: int) -> None:
    """The same problem reworded ("1.7 kΩ" / "1700 Ω"; "Calculate 7 - 5." / "7 - 5 =") or asked
    in another unit lands in one split, also across a family's difficulties."""
    train = {identity(p) for name in names for p in get_task(name).problems("train", n_train, seed=0)}
    for name in names:
        for split in ("val", "test"):
            leaked = [p.prompt[:80] for p in get_task(name).problems(split, 200, seed=0) if identity(p) in train]
            assert not leaked, (name, split, leaked[:3])


# --- the CPU default's task data ------------------------------------------------------------
def test_every_task_of_the_cpu_default_builds_its_splits_at_the_default_sizes(tmp_path: Path) -> None:
    """What the main job's task_data jobs do, for every task config.yaml's experiments name, at
    its sizes and options: each split fills (a split key that a generator's own pre-filter does
    not agree with starves a split: codeio gave 17 of 32 val problems), and codeio's splits
    share no program."""
    import polars as pl

    from fastslow.config import load_config, task_spec
    from fastslow.experiments import expand
    from fastslow.tasks.data import write_splits

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "config" / "config.yaml")
    names = set(cfg["data"]["tasks"]) | {t for run in expand(cfg).values() for t in (*run.schedule, *run.eval_tasks)}
    assert {"codeio", "hover", "physics", "math"} <= names
    sizes = cfg["data"]["sizes"]
    for name in sorted(names):
        registry, options = task_spec(cfg, name)
        paths = write_splits(registry, tmp_path / name, sizes, cfg["data"]["seed"], **options)
        rows = {split: pl.read_parquet(path) for split, path in paths.items()}
        assert {split: df.height for split, df in rows.items()} == dict(sizes), name
        for split, df in rows.items():  # no split holds one problem twice, however worded
            keys = [json.loads(m).get("split_key") for m in df["metadata"]]
            if getattr(get_task(registry, **options), "key_names_one_problem", False) and None not in keys:
                assert len(set(keys)) == len(keys), (name, split)
            assert df["prompt"].n_unique() == df.height, (name, split)
    programs = {split: [json.loads(m)["program_id"] for m in
                        pl.read_parquet(tmp_path / "codeio" / f"{split}.parquet")["metadata"]] for split in sizes}
    assert not set(programs["train"]) & set(programs["val"] + programs["test"])
    # ...while a program's other inputs stay: its key names a group of problems, not one
    assert len(set(programs["train"])) < len(programs["train"])


# --- a user's own task: scorer bugs, small problem spaces, the codeio worker's command line ----
def _reverse_task_class(words: tuple[str, ...], key: str = "word", exact: bool = True) -> type:
    """A user's GeneratedTask "reverse a word" over `words`; its judge reads metadata[`key`]
    ("wrd": a typo, a KeyError) and, unless `exact`, wrongly compares to upper case."""
    import random as _random

    from fastslow.tasks.base import ANSWER_FORMAT, Judgement, extract_answer
    from fastslow.tasks.generated import Candidate, GeneratedTask

    class ReverseTask(GeneratedTask):
        family = "reverse"

        def candidate(self, rng: _random.Random, index: int, split: str, seed: int,
                      attempt: int) -> Candidate | None:
            word = rng.choice(words)
            return Candidate(prompt=f"Reverse the word {word!r}. {ANSWER_FORMAT}", answer=word[::-1],
                             metadata={"word": word})

        def judge(self, problem: Problem, completion: str) -> Judgement:
            expected = problem.metadata[key][::-1]  # key="wrd": the user's typo, a KeyError
            got = extract_answer(completion)
            ok = got == expected if exact else got == expected.upper()
            return Judgement(float(ok), expected, got)

    return ReverseTask


_WORDS = tuple(f"w{i:03d}{c}" for i in range(300) for c in "ab")


def _register(monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
    """Register `cls` as task "reverse", as a user does in fastslow.tasks._FAMILIES."""
    import sys

    import fastslow.tasks as tasks

    module = sys.modules[__name__]
    monkeypatch.setattr(module, "ReverseTask", cls, raising=False)
    monkeypatch.setitem(tasks._FAMILIES, "reverse", (__name__, "ReverseTask", ("default",)))
    monkeypatch.setitem(tasks._VARIANTS, "reverse", ("reverse", "default"))


def test_a_scorer_bug_is_logged_once_per_task_and_exception_type(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """judge reading problem.metadata["wrd"] still scores 0 and never raises, but the first
    failure of each (task, exception type) is a WARNING naming the exception and the problem."""
    import logging

    import fastslow.tasks.base as base

    monkeypatch.setattr(base, "_LOGGED_FAILURES", set())
    task = _reverse_task_class(_WORDS, key="wrd")(name="reverse")
    problems = task.problems("train", 3, seed=0)
    with caplog.at_level(logging.WARNING, logger="fastslow.tasks"):
        for p in problems:
            assert task.reward(p, f"<answer>{p.answer}</answer>") == 0.0
            assert "Detailed feedback failed: KeyError" in task.feedback(p, f"<answer>{p.answer}</answer>")
        logged = [r.getMessage() for r in caplog.records if r.name == "fastslow.tasks"]
        assert len(logged) == 1, logged
        assert "reverse" in logged[0] and "KeyError" in logged[0] and "'wrd'" in logged[0]
        assert problems[0].id in logged[0] and "reward" in logged[0]
        task.reward(Problem("odd", "reverse", "…", "x", metadata={"wrd": None}), "<answer>x</answer>")  # TypeError
        task.feedback(Problem("odd", "reverse", "…", "x", metadata={"wrd": None}), "x")
        logged = [r.getMessage() for r in caplog.records if r.name == "fastslow.tasks"]
        assert len(logged) == 2 and "TypeError" in logged[1] and "'odd'" in logged[1], logged


def test_task_data_stops_on_a_scorer_that_raises_on_its_own_gold_answer(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """write_splits (the task_data job) scores each problem's own answer in <answer> tags: a
    KeyError there is a one-line TaskDataError naming task, problem and exception, and nothing
    is written."""
    from fastslow.tasks.base import TaskDataError
    from fastslow.tasks.data import write_splits

    _register(monkeypatch, _reverse_task_class(_WORDS, key="wrd"))
    with pytest.raises(TaskDataError) as info:
        write_splits("reverse", tmp_path, {"train": 8, "val": 2, "test": 2}, seed=0)
    message = str(info.value)
    assert "\n" not in message
    assert re.search(r"reverse: .*problem reverse-train-00000-\w+.*KeyError: 'wrd'", message), message
    assert not list(tmp_path.iterdir())


def test_task_data_warns_when_gold_answers_score_below_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A scorer that does not raise but rejects its own answers (here: compares to upper case)
    is one WARNING with the count and the first example; the splits are still written."""
    import logging

    from fastslow.tasks.data import write_checked_splits, write_splits

    _register(monkeypatch, _reverse_task_class(_WORDS, exact=False))
    with caplog.at_level(logging.WARNING, logger="fastslow.tasks.data"):
        paths, below = write_checked_splits("reverse", tmp_path, {"train": 8, "val": 2, "test": 2}, seed=0)
    assert set(paths) == {"train", "val", "test"} and all(p.exists() for p in paths.values())
    assert below == 12  # the task_data job's MLflow metric gold_below_one
    assert write_splits("reverse", tmp_path / "again", {"train": 8, "val": 2, "test": 2}, seed=0) == \
        {s: tmp_path / "again" / f"{s}.parquet" for s in ("train", "val", "test")}
    logged = [r.getMessage() for r in caplog.records if r.name == "fastslow.tasks.data"]
    assert len(logged) == 2 and logged[0] == logged[1], logged  # once a call
    assert re.search(r"reverse: 12 of 12 problems score below 1 .*first: reverse-train-00000-\w+ "
                     r"\(reward 0\.00\): Incorrect", logged[0]), logged[0]


@pytest.mark.parametrize(("made", "expected"), [
    (lambda word: _Candidate(prompt=f"Reverse {word}", answer=len(word)),
     "reverse: candidate() returned a Candidate whose answer is a int (5); it must be text: str(answer)"),
    (lambda word: (f"Reverse {word}", word[::-1]),
     "reverse: candidate() returned a tuple (('Reverse w000a', 'a000w')); expected a "
     "fastslow.tasks.generated.Candidate(prompt, answer, ...) or None"),
])
def test_a_candidate_that_is_not_text_stops_the_splits_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path, made, expected) -> None:
    """`Candidate(prompt, a + b)`: the int answer was written to the splits as a number (every
    gold answer then scored below 1, a warning) and read back as text; a tuple failed on `.key`."""
    from fastslow.tasks.base import TaskDataError
    from fastslow.tasks.data import write_splits

    cls = _reverse_task_class(_WORDS, exact=True)

    class Made(cls):
        def candidate(self, rng, index, split, seed, attempt):
            return made(_WORDS[0])

    _register(monkeypatch, Made)
    with pytest.raises(TaskDataError) as info:
        write_splits("reverse", tmp_path, {"train": 8, "val": 2, "test": 2}, seed=0)
    assert str(info.value) == expected


def test_a_note_given_as_a_string_is_one_feedback_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """`Judgement(notes="...")` was read as a list of characters: a feedback line each, which is
    what GEPA reflects on."""
    from fastslow.tasks.base import Judgement

    assert Judgement(0.0, "a", "b", notes="the word is reversed letter by letter").notes == [
        "the word is reversed letter by letter"]
    cls = _reverse_task_class(_WORDS, exact=True)

    class Noted(cls):
        def judge(self, problem, completion):
            return Judgement(0.0, "x", "y", notes="reverse the letters")

    _register(monkeypatch, Noted)
    task = get_task("reverse")
    (problem,) = task.problems("train", 1, seed=0)
    assert "\nreverse the letters" in task.feedback(problem, "<answer>y</answer>")


def test_every_shipped_task_scores_its_own_gold_answers_1() -> None:
    """The measurement behind the gold check: no shipped task (nor the file loader's scorers on
    config/parity.jsonl) leaves a gold answer below 1, so the check never warns on them."""
    from fastslow.tasks import TASK_NAMES
    from fastslow.tasks.data import check_gold_answers

    sizes = {"train": 64, "val": 8, "test": 8}
    for name in TASK_NAMES:
        task = get_task(name)
        many = getattr(task, "problems_for_splits", None)
        splits = many(sizes, 1234) if many else {s: task.problems(s, n, 1234) for s, n in sizes.items()}
        assert check_gold_answers(task, splits) == 0, name
    root = Path(__file__).resolve().parents[1]
    task = load_task_file(root / "config" / "parity.jsonl", scorer="label", labels=["EVEN", "ODD"])
    assert check_gold_answers(task, task.rows()) == 0


def test_a_too_small_problem_space_is_a_task_data_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Too few distinct problems for a split: TaskDataError (the task_data job's one line), not a
    bare ValueError with a traceback; also through codeio's child process."""
    from fastslow.tasks.base import TaskDataError
    from fastslow.tasks.data import write_splits

    _register(monkeypatch, _reverse_task_class(_WORDS[:40]))
    with pytest.raises(TaskDataError, match=r"reverse: only \d+ distinct val problems after \d+ tries "
                                            r"\(asked for 8\)"):
        write_splits("reverse", tmp_path, {"train": 8, "val": 8, "test": 2}, seed=0)
    with pytest.raises(TaskDataError, match=r"codeio: only 0 distinct val problems"):
        get_task("codeio", max_prompt_chars=1).problems("val", 1, seed=0)


def test_a_generated_split_gets_200_tries_beyond_its_share() -> None:
    """`problems` gives up after `attempts_per_problem` tries per problem asked plus 200, which a
    small val or test split (about 1 draw in 10 is its own) needs: one val problem whose
    generator returns nothing for its first 259 draws is found on the 260th, not on the 261st."""
    import random as _random

    from fastslow.tasks.base import Judgement, TaskDataError
    from fastslow.tasks.generated import Candidate, GeneratedTask, split_of

    prompt = next(f"q{i}" for i in range(200) if split_of(f"q{i}") == "val")

    class LateTask(GeneratedTask):
        family = "late"

        def __init__(self, first: int) -> None:
            super().__init__()
            self.first = first

        def candidate(self, rng: _random.Random, index: int, split: str, seed: int,
                      attempt: int) -> Candidate | None:
            return Candidate(prompt, "a") if attempt >= self.first else None

        def judge(self, problem: Problem, completion: str) -> Judgement:
            return Judgement(0.0, problem.answer, None)

    assert LateTask.attempts_per_problem == 60
    assert [p.prompt for p in LateTask(259).problems("val", 1, seed=0)] == [prompt]
    with pytest.raises(TaskDataError, match=r"^late: only 0 distinct val problems after 260 tries"):
        LateTask(260).problems("val", 1, seed=0)


@pytest.mark.parametrize("sources, expected", [
    # a misspelt dataset was skipped item by item: the mixture silently became basic_arithmetic alone
    ([{"dataset": "basic_arithmetic"}, {"dataset": "chain_summ", "weight": 3}],
     "math: source 'chain_summ': reasoning-gym cannot create this dataset "
     "(ValueError: Dataset 'chain_summ' not registered)"),
    # a misspelt config key ended in "the generator's problem space is too small"
    ([{"dataset": "chain_sum", "config": {"max_termz": 2}}],
     "math: source 'chain_sum': reasoning-gym cannot create this dataset (TypeError: "
     "ChainSumConfig.__init__() got an unexpected keyword argument 'max_termz')"),
])
def test_a_source_reasoning_gym_rejects_stops_the_split_naming_it(sources: list, expected: str) -> None:
    from fastslow.tasks.base import TaskDataError

    with pytest.raises(TaskDataError) as info:
        get_task("math", sources=sources).problems("train", 20, 0)
    assert str(info.value) == expected


@pytest.mark.parametrize("source, expected", [
    ({"dataset": "chain_sum", "weight": "heavy"}, "math: source 'chain_sum': weight: expected a positive number, "
                                                  "got str 'heavy'"),
    ({"dataset": "chain_sum", "weight": [2]}, "math: source 'chain_sum': weight: expected a positive number, "
                                              "got list [2]"),
    ({"dataset": "chain_sum", "config": ["max_terms", 2]}, "math: source 'chain_sum': config: expected a mapping"),
])
def test_a_bad_source_weight_or_config_is_one_line_naming_the_source_and_key(source: dict, expected: str) -> None:
    with pytest.raises(ValueError) as info:
        get_task("math", sources=[{"dataset": "basic_arithmetic"}, source])
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)


@pytest.mark.parametrize("args", [["--help"], [], ["only-one.json"], ["a.json", "b.json", "c.json"]])
def test_the_codeio_worker_prints_usage_on_wrong_arguments(args: list[str], tmp_path: Path) -> None:
    """`python -m fastslow.tasks.codeio --help` was an IndexError traceback: one usage line, exit 2."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "fastslow.tasks.codeio", *args], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("usage: python -m fastslow.tasks.codeio "), proc.stderr
    assert not list(tmp_path.iterdir())


# --- the forty-seventh session's audit: answers as models write them ---------------------------
@pytest.mark.parametrize("value, unit, right, wrong", [
    (45.29, "m", ["**45.29 m**", "__45.29 m__", "**0.04529 km**"], ["**45.29 km**", "**45.29 s**"]),
    (209.5, "Ω", ["0.2095 kilo ohms", "0.2095 kilo-ohms"], ["209.5 kilo ohms"]),
    (4500.0, "J", ["4.5 kilo joules", "**4500 J**"], ["4.5 J"]),
    (1200.0, "m", [r"1\,200 m", "1\u2009200 m", "1.2 km"], ["200 m"]),
])
def test_bold_spelt_prefixes_and_thin_space_thousands_read_as_written(value, unit, right, wrong):
    """Markdown bold ("**" read as a power lost the unit, so "**45.29 s**" scored 1 against 45.29 m),
    a prefix spelt apart ("kilo ohms" was kg·Ω: a right answer scored 0, with false feedback) and
    a LaTeX thin space between thousands ("1\\,200 m" was 200 m)."""
    task, p = get_task("physics"), physics_problem(value, unit)
    for answer in right:
        assert task.reward(p, f"<answer>{answer}</answer>") == 1.0, answer
    for answer in wrong:
        assert task.reward(p, f"<answer>{answer}</answer>") == 0.0, answer
    assert parse_quantity("3 kilo per hour")[1] == "kg/h"  # "kilo" alone is still the kilogram


def test_codeio_integers_are_exact():
    """Every number compared with a relative tolerance of 1e-6, so a wrong integer of 7+ digits
    scored 1 (about 7% of generated CodeIO answers have one); floats keep the tolerance."""
    task = get_task("codeio")
    problem = Problem("c", "codeio", "…", json.dumps({"total": 2399813805, "ratio": 0.1}))
    assert task.reward(problem, '<answer>{"total": 2399813805, "ratio": 0.1}</answer>') == 1.0
    assert task.reward(problem, '<answer>{"total": 2399815805, "ratio": 0.1}</answer>') == 0.0
    assert task.reward(problem, '<answer>{"total": 2399813805, "ratio": 0.10000001}</answer>') == 1.0
    # an integer written as a float is exact too (it passed within 1e-6 of the gold)
    assert task.reward(problem, '<answer>{"total": 2399813805.0, "ratio": 0.1}</answer>') == 1.0
    for wrong in ("2399815805.0", "2.3998e9", "2399813000.0"):
        assert task.reward(problem, f'<answer>{{"total": {wrong}, "ratio": 0.1}}</answer>') == 0.0, wrong


@pytest.mark.parametrize("gold, right, wrong", [
    ("-0.75", [r"-\frac{3}{4}", r"\boxed{-\frac34}", r"-\dfrac{3}{4}", "-3/4"], [r"\frac{3}{4}"]),
    ("7", ["7", "x = 7"], ["x = - 7", "- 7"]),
    ("-7", ["- 7", "x = - 7"], ["7"]),
])
def test_signed_latex_fractions_and_a_spaced_minus_keep_their_sign(gold, right, wrong):
    """`-\\frac{3}{4}` was no number at all, and "- 7" was read as 7 (a wrong answer scored 1)."""
    task = get_task("math")
    problem = Problem("m", "math", "…", gold)
    for answer in right:
        assert task.reward(problem, f"<answer>{answer}</answer>") == 1.0, answer
    for answer in wrong:
        assert task.reward(problem, f"<answer>{answer}</answer>") == 0.0, answer


def test_a_latex_percent_and_an_escaped_underscore_are_read():
    from fastslow.tasks.scoring import parse_number

    assert parse_number("10\\%") == parse_number("10%") == 10.0  # "10\\" before: the suffixes' order
    for text in (r"\boxed{\text{NOT\_SUPPORTED}}", r"\text{NOT\_SUPPORTED}", r"NOT\_SUPPORTED"):
        assert normalize_label(text, LABELS) == "NOT_SUPPORTED", text
    assert normalize_label(r"\boxed{\text{SUPPORTED}}", LABELS) == "SUPPORTED"


@functools.cache
def _hover_train(name: str) -> tuple:
    return tuple(get_task(name).problems("train", 1200, seed=0))


def _hover_problems(name: str, n: int) -> list:
    """The first n of a hover task's train problems (seed 0), generated once for the module's
    tests: a task's first n problems are the same whatever n asks for."""
    return list(_hover_train(name)[:n])


@pytest.mark.parametrize("name", ["hover_easy", "hover", "hover_hard"])
def test_the_number_of_hover_documents_says_nothing_about_the_label(name):
    """The neighbouring chain's documents were shown only for NOT_SUPPORTED claims (but on hard),
    so the document count alone told the label: 74% right on hover_easy, 62% on hover. Now the
    majority label of each (hops, documents) cell, fitted on 600 problems, reads the next 600
    about as well as a coin (read on the problems it was fitted on, the many small cells of
    today's varied counts overfit: 57% on hover)."""
    import collections

    problems = _hover_problems(name, 1200)
    cells = collections.defaultdict(collections.Counter)
    for p in problems[:600]:
        cells[p.metadata["hops"], p.metadata["n_docs"]][p.answer] += 1
    rule = {cell: c.most_common(1)[0][0] for cell, c in cells.items()}
    held_out = problems[600:]
    right = sum(rule.get((p.metadata["hops"], p.metadata["n_docs"]), "SUPPORTED") == p.answer for p in held_out)
    assert right / len(held_out) < 0.56, (name, right / len(held_out))


@pytest.mark.parametrize("name", ["hover_easy", "hover", "hover_hard"])
def test_every_hover_claim_names_a_value_the_documents_mention(name):
    """A NOT_SUPPORTED claim fell back to a value no document mentions when none of its type was
    shown (74 of 500 on hover_easy, 44 on hover): "never mentioned, so NOT_SUPPORTED" was a
    shortcut to the label. Now every claim's value is in the documents, whatever its label."""
    for p in _hover_problems(name, 1000):
        docs = p.prompt.split("Documents:\n")[1].split("\n\nClaim:")[0]
        assert p.metadata["claimed_value"] in docs, (p.id, p.answer, p.metadata["claimed_value"])


def _hover_documents(p) -> list[tuple[str, str]]:
    """A hover problem's documents as (title, text), in the prompt's order."""
    body = p.prompt.split("Documents:\n")[1].split("\n\nClaim:")[0]
    return re.findall(r"^\[\d+\] ([^:]+): (.*)$", body, re.M)


def _stated_in_the_claims_relation(p) -> bool:
    """Whether a document states the claimed value in the relation of the claim's last hop, for
    any subject: the last deciding fact with its subject and value replaced."""
    return bool(_value_stating_documents(p)[1])


@pytest.mark.parametrize("name", ["hover_easy", "hover", "hover_hard"])
def test_a_hover_claims_value_is_stated_in_its_relation_whatever_the_label(name):
    """A changed value was one the documents mention, but only in another relation (1920 as a
    birth year, claimed as a founding year): "no document states it so, so NOT_SUPPORTED" read
    64.5% of hover_easy's labels right and 60.5% of hover's without following the chain, and a
    value that was one of the chain's entities ("The mayor of Tarnfell was born in Tarnfell")
    was always NOT_SUPPORTED. Now every claim's value is stated in its relation by some document,
    so that rule reads a coin's 50%, and no claim names an entity twice."""
    problems = _hover_problems(name, 400)
    assert all(_stated_in_the_claims_relation(p) for p in problems), name
    for p in problems:
        claim, value = p.metadata["claim"], p.metadata["claimed_value"]
        assert claim.count(value) == 1, (p.id, claim)


def _value_stating_documents(p) -> tuple[list[tuple[str, str]], list[str]]:
    """A hover problem's documents (title, text) and the titles of those stating the claimed value
    in the claim's last relation."""
    docs = _hover_documents(p)
    last = p.metadata["chain"][-1]
    template = last["fact"].replace(docs[last["doc"] - 1][0], "\x01").replace(p.metadata["true_value"], "\x02")
    return docs, [title for title, text in docs
                  if template.replace("\x01", title).replace("\x02", p.metadata["claimed_value"]) in text]


@pytest.mark.parametrize("name", ["hover_easy", "hover", "hover_hard"])
def test_whether_another_document_mentions_the_value_stating_one_says_nothing_about_the_label(name):
    """A false value was stated by a subject no other document mentioned (a distractor, or a
    neighbouring chain's sibling), while the true value's subject is always named by the chain's
    previous document: "nobody refers to the document stating the value, so NOT_SUPPORTED" read
    92% of hover_easy's labels right, 80% of hover's and 64% of hover_hard's without following
    the chain. Now a document mentions the subject whatever the label, and the rule reads a coin
    (the same signal one level further out is the next test's)."""
    problems = _hover_problems(name, 600)
    right = 0
    for p in problems:
        docs, stating = _value_stating_documents(p)
        assert stating, p.id
        referred = any(subject in text for subject in stating for title, text in docs if title != subject)
        right += ("SUPPORTED" if referred else "NOT_SUPPORTED") == p.answer
    assert right / len(problems) < 0.56, (name, right / len(problems))


@pytest.mark.parametrize("name", ["hover_easy", "hover", "hover_hard"])
def test_whether_the_value_stating_subjects_mentioner_is_mentioned_says_nothing_about_the_label(name):
    """One level further out than the test above: a false value's subject was named by a document
    nobody names (a neighbouring chain's sibling, or the document linked in to name it), while
    the true value's is named by the chain's previous document, which the one before names in
    turn. "A document naming the stating subject is itself named, so SUPPORTED" read 69% of
    hover's labels and 72% of hover_hard's without looking at the claim's entity. A false value
    is now a twin chain's, with the true one's ancestry, and the rule reads a coin."""
    problems = _hover_problems(name, 600)
    right = 0
    for p in problems:
        docs, stating = _value_stating_documents(p)
        mentioners = [title for title, text in docs for subject in stating if title != subject and subject in text]
        named = any(m in text for m in mentioners for title, text in docs if title != m)
        right += ("SUPPORTED" if named else "NOT_SUPPORTED") == p.answer
    assert right / len(problems) < 0.56, (name, right / len(problems))


def _claim_hops(p, docs: dict[str, str]) -> list[tuple[str, str, str]]:
    """The claim's hops as (deciding fact, its subject's title, its object): the templates that
    `_hop` reads another subject's document with."""
    titles, chain = list(docs), p.metadata["chain"]
    names = [titles[f["doc"] - 1] for f in chain] + [p.metadata["true_value"]]  # each hop's subject, the value
    return [(f["fact"], subject, obj) for f, subject, obj in zip(chain, names[:-1], names[1:], strict=True)]


def _hop(docs: dict[str, str], hop: tuple[str, str, str], current: str) -> str | None:
    """The object `current`'s document states in `hop`'s relation (None if it has no such
    document or fact): the deciding fact with its subject and object replaced."""
    fact, subject, obj = hop
    if current not in docs:
        return None
    pattern = re.escape(fact.replace(subject, "\x01").replace(obj, "\x02"))
    pattern = pattern.replace("\x01", re.escape(current)).replace("\x02", r"([^.]+?)")
    found = re.search(pattern, docs[current])  # the fact's own full stop ends the value
    return None if found is None else found.group(1).strip('"')


def _linked(docs: dict[str, str], reached: set[str]) -> set[str]:
    """The documents whose titles the `reached` documents name: one link of any kind further."""
    return {t for d in reached for t in docs if t != d and t in docs.get(d, "")}


def _reaches(p, start: str) -> str | None:
    """The value reached by following the claim's relations, read from the documents' text, from
    the document titled `start` (None where a hop's document is not shown)."""
    docs = dict(_hover_documents(p))
    current: str | None = start
    for hop in _claim_hops(p, docs):
        current = _hop(docs, hop, current) if current is not None else None
    return current


@pytest.mark.parametrize("name", ["hover_easy", "hover", "hover_hard"])
def test_only_the_chain_from_the_claims_entity_decides_a_hover_label(name):
    """Following the claim's relations from any shown document, not only from the claim's entity,
    read 73% / 85% / 91% of hover_easy's / hover's / hover_hard's labels (a false value had no
    chain of the claim's relations above it). Every problem now shows a twin chain along the
    same relations from another start, ending on the false value whatever the label (and one
    along the swapped relations, ending on the truth): that rule reads a coin, and the same
    walk from the claim's entity reads every label."""
    problems = _hover_problems(name, 400)
    any_start = from_entity = 0
    for p in problems:
        value = p.metadata["claimed_value"]
        starts = re.findall(r"^\[\d+\] ([^:]+):", p.prompt, re.M)
        entity = starts[p.metadata["chain"][0]["doc"] - 1]
        any_start += ("SUPPORTED" if any(_reaches(p, s) == value for s in starts) else "NOT_SUPPORTED") == p.answer
        from_entity += ("SUPPORTED" if _reaches(p, entity) == value else "NOT_SUPPORTED") == p.answer
    assert from_entity == len(problems), name
    assert any_start / len(problems) < 0.56, (name, any_start / len(problems))


@pytest.mark.parametrize("name", ["hover_easy", "hover", "hover_hard"])
def test_following_any_links_from_the_claims_entity_says_nothing_about_the_label(name):
    """With a twin chain from another start, a false value was never reachable from the claim's
    entity: "walk k-1 links (a document naming another's title) from the claim's entity and look
    for the value" read 99.8% / 99.7% / 99.4% of hover_easy's / hover's / hover_hard's labels
    without reading one relation. The false value is now also reached from the claim's entity,
    through each sibling-bearing hop swapped for its sibling (lives in for born in, led by for
    founded by, ...), and the rule reads a coin: only the relations tell the paths apart."""
    problems = _hover_problems(name, 400)
    right = 0
    for p in problems:
        docs = dict(_hover_documents(p))
        value = p.metadata["claimed_value"]
        reached = {list(docs)[p.metadata["chain"][0]["doc"] - 1]}
        for _ in range(p.metadata["hops"] - 1):
            reached = _linked(docs, reached)
        right += ("SUPPORTED" if any(value in docs[d] for d in reached) else "NOT_SUPPORTED") == p.answer
    assert right / len(problems) < 0.56, (name, right / len(problems))


def _walk_with_one_hop_free(p, free: int) -> bool:
    """Whether the claimed value is reached from the claim's entity along the claim's relations,
    read from the documents' text, but for hop `free` (1 .. k), where any document a title of
    names is followed (the last hop: any mention of the value)."""
    docs = dict(_hover_documents(p))
    hops, value = _claim_hops(p, docs), p.metadata["claimed_value"]
    reached = {hops[0][1]}
    for number, hop in enumerate(hops, start=1):
        if number == free:
            if number == len(hops):
                return any(value in docs.get(d, "") for d in reached)
            reached = _linked(docs, reached)
            continue
        reached = {o for d in reached if (o := _hop(docs, hop, d)) is not None}
    return value in reached


SIBLING_FACTS = ("was born in ", "lives in", "was founded by", "is led by", "The mayor of", "The deputy mayor of",
                 "is dedicated to", "written by", "recorded by", "directed by")


def _sibling_hop(fact: str) -> bool:
    """Whether a deciding fact's relation has a sibling (born in / lives in, ...)."""
    return "born in the year" not in fact and any(w in fact for w in SIBLING_FACTS)


@pytest.mark.parametrize("name", ["hover_easy", "hover", "hover_hard"])
def test_ignoring_one_sibling_bearing_hops_relation_says_nothing_about_the_label(name):
    """The false value was reached from the claim's entity through one swapped hop, chosen among
    those with a sibling relation: reading the claim's relations but one such hop's read 71-89%
    of the labels ("the chain's last document names the value": 75-81%). Swapping any
    sibling-bearing hop now flips a path's end between the two values, so each rule reads a
    coin, while reading every relation reads every label. (A hop without a sibling is read right
    by its type alone.)"""
    problems = _hover_problems(name, 600)
    checked = 0
    for hop in range(1, 5):
        cases = [p for p in problems if p.metadata["hops"] >= hop and _sibling_hop(p.metadata["chain"][hop - 1]["fact"])]
        if len(cases) < 100:
            continue
        right = sum(("SUPPORTED" if _walk_with_one_hop_free(p, hop) else "NOT_SUPPORTED") == p.answer for p in cases)
        assert right / len(cases) < 0.56, (name, hop, right / len(cases), len(cases))
        checked += 1
    assert checked >= 2, (name, checked)
    assert all(_walk_with_one_hop_free(p, 0) == (p.answer == "SUPPORTED") for p in problems)


@pytest.mark.parametrize("name", ["hover_easy", "hover", "hover_hard"])
def test_counting_the_documents_that_name_the_value_says_nothing_about_the_label(name):
    """With every one-swap path from the claim's entity ending on the false value, the false value
    was reached by as many paths as the claim has sibling-bearing hops, the truth by one: "walk
    k-1 links of any kind from the claim's entity; two or more documents reached name the value,
    so NOT_SUPPORTED" read 74% / 80% / 87% of the labels. A swap now flips a path's end (an even
    number of swaps from the claim's entity ends on the truth, an odd one on the false value), so
    each value is reached by as many paths, and the rule reads a coin."""
    problems = _hover_problems(name, 600)
    right = 0
    for p in problems:
        docs = dict(_hover_documents(p))
        reached = {list(docs)[p.metadata["chain"][0]["doc"] - 1]}
        for _ in range(p.metadata["hops"] - 1):
            reached = _linked(docs, reached)
        naming = sum(p.metadata["claimed_value"] in docs[d] for d in reached)
        right += ("NOT_SUPPORTED" if naming >= 2 else "SUPPORTED") == p.answer
    assert right / len(problems) < 0.56, (name, right / len(problems))


@pytest.mark.parametrize("name", ["hover_easy", "hover", "hover_hard"])
def test_a_claimed_birth_year_fits_the_organisation_or_work_whatever_the_label(name):
    """The world draws an organisation's founding 24-60 years after its founder's birth and a
    work 20-55 years after its creator's, but a head's or a dedicatee's birth year anywhere: in
    "The head of X was born in Y" the false value was the founder's year or the true one the
    head's, and "does Y fit X's founding year" read 73% / 87% / 84% of such claims. Every path's
    year now fits (`_square`), so the claimed year does whatever the label, and the rule reads
    nothing."""
    spans = {"was founded by": (24, 60), "is led by": (24, 60), "written by": (20, 55), "recorded by": (20, 55),
             "directed by": (20, 55), "is dedicated to": (20, 55)}
    cases = 0
    for p in _hover_problems(name, 1200):
        chain = p.metadata["chain"]
        if len(chain) < 2 or "born in the year" not in chain[-1]["fact"]:
            continue
        words = [w for w in spans if w in chain[-2]["fact"]]
        if not words:
            continue
        document = _hover_documents(p)[chain[-2]["doc"] - 1][1]
        year = int(re.search(r"(?:founded|published|released) in (\d{4})\.", document).group(1))
        lo, hi = spans[words[0]]
        assert lo <= year - int(p.metadata["claimed_value"]) <= hi, (p.id, p.answer, chain, document)
        cases += 1
    assert cases >= 3, cases  # such claims are rare now (about 0.5%): the rest of a square rarely fits too


@pytest.mark.parametrize("name", ["hover", "hover_hard"])
def test_how_many_documents_state_the_claimed_value_says_nothing_about_the_label(name):
    """A draft of the square whose paths could meet (never committed) stated the false value and
    the truth by unequal numbers of documents: a rule on that count read 56-58% of hover_hard's
    labels. Paths that meet are refused, and each value is stated by as many documents."""
    import collections

    problems = _hover_problems(name, 1000)
    cells = collections.defaultdict(collections.Counter)
    for p in problems:
        docs, stating = _value_stating_documents(p)
        cells[p.metadata["hops"], len(stating)][p.answer] += 1
    assert sum(max(c.values()) for c in cells.values()) / len(problems) < 0.56


def _path_documents(p) -> int:
    """How many documents a hover problem's square shows: from each of its two starts, the entity
    after hops 1 .. d, for d = 0 .. k-1, on 2^s paths apart (s: the sibling-bearing hops among
    them)."""
    swaps = [_sibling_hop(f["fact"]) for f in p.metadata["chain"]]
    return 2 * sum(2 ** sum(swaps[:depth]) for depth in range(len(swaps)))


@pytest.mark.parametrize(("name", "hops", "distractors"), [
    ("hover_easy", {2}, {1}), ("hover", {2, 3, 4}, {0, 1, 2}), ("hover_hard", {3, 4}, {1, 2, 3})])
def test_hover_difficulties_draw_the_hops_and_distractors_they_document(name, hops, distractors):
    """hover_easy claims 2 hops with 1 distractor document, hover 2-4 hops (drawn from 2, 2, 3,
    3, 4) with 0-2, hover_hard 3-4 hops with 1-3 ("more distractor documents");
    a claim has one or two sibling-bearing hops. Only the hops' upper sets had been checked: a
    default that never drew 4 hops, or a hard one showing no distractor, passed."""
    problems = get_task(name).problems("train", 60, seed=2)
    assert {p.metadata["hops"] for p in problems} == hops
    assert {p.metadata["n_docs"] - _path_documents(p) for p in problems} == distractors
    assert {sum(map(_sibling_hop, (f["fact"] for f in p.metadata["chain"]))) for p in problems} == {1, 2}
    if name == "hover":  # drawn 2:2:1, a world redrawn for the same hops (one try per draw: 49 of 60 on 2)
        drawn = Counter(p.metadata["hops"] for p in problems)
        assert drawn[2] <= 36 and drawn[4] >= 6, drawn


def test_hover_documents_are_shown_once_each_in_a_shuffled_order():
    """Each document is shown once (distractors are drawn from the documents not shown yet), and in
    a shuffled order: the square lists the claim's entity first, so unshuffled, "the first
    document is the claim's subject" would hold every time."""
    problems = get_task("hover").problems("train", 40, seed=4)
    firsts = set()
    for p in problems:
        titles = [title for title, _ in _hover_documents(p)]
        assert len(set(titles)) == len(titles) == p.metadata["n_docs"], p.id
        firsts.add(p.metadata["chain"][0]["doc"] == 1)
    assert firsts == {True, False}


def test_the_label_order_of_each_pair_of_hover_problems_is_seeded():
    """Each consecutive pair of problems holds one of each label, in an order drawn from the
    seed: with a fixed order, the label would be the problem's index's parity."""
    labels = [p.answer for p in get_task("hover_easy").problems("train", 40, seed=1)]
    pairs = {tuple(labels[i:i + 2]) for i in range(0, len(labels), 2)}
    assert pairs == {("SUPPORTED", "NOT_SUPPORTED"), ("NOT_SUPPORTED", "SUPPORTED")}


def _kind(title: str, text: str) -> str:
    """A hover document's subject kind: person, town, an organisation's kind (its name's last
    word: University, Press, ...) or a work's (novel, album, film)."""
    work = re.match(r'"[^"]+" is an? (\w+)', text)
    if work:
        return work.group(1)
    if " born in the year " in text:
        return "person"
    return "town" if " is a town in the " in text else title.split()[-1]


@pytest.mark.parametrize("name", ["hover", "hover_hard"])
def test_a_hover_twin_start_is_of_the_claims_entity_kind(name):
    """The twin chain starts from an entity of the claim entity's own kind: a press's twin is a
    press and a novel's a novel (a film's relations read "directed by", not "written by"), so the
    kind of a chain's start tells nothing the claim's relations do not."""
    kinds = set()
    for p in get_task(name).problems("train", 60, seed=6):
        docs = dict(_hover_documents(p))
        entity = list(docs)[p.metadata["chain"][0]["doc"] - 1]
        twin = p.metadata["twin_start"]
        assert _kind(entity, docs[entity]) == _kind(twin, docs[twin]), (p.id, entity, twin)
        kinds.add(_kind(entity, docs[entity]))
    assert len(kinds - {"person", "town"}) >= 3, kinds


def test_a_hover_world_draws_its_years_over_the_spans_the_square_keeps():
    """An organisation is founded 24-60 years after its founder's birth, a work made 20-55 after
    its creator's: the world draws every year of those spans and none outside, so a year the
    square sets within `_YEAR_SPANS` is one the world could have drawn."""
    import random

    from fastslow.tasks import hover

    gaps: dict[str, set[int]] = {"founded_year": set(), "year": set()}
    for seed in range(150):
        world = hover.World(random.Random(seed), 20)
        for e in world.orgs + world.works:
            year_rel = "founded_year" if e.type == "org" else "year"
            person = world.get(e, hover._YEAR_SPANS[year_rel][0])
            gaps[year_rel].add(int(world.get(e, year_rel).name) - int(world.get(person, "birth_year").name))
    assert gaps == {"founded_year": set(range(24, 61)), "year": set(range(20, 56))}
    assert hover._YEAR_SPANS == {"founded_year": ("founded_by", 24, 60), "year": ("creator", 20, 55)}


def test_a_fact_the_hover_square_sets_fits_the_years_at_both_ends_of_the_span():
    """`_fits`: a founder born 24 or 60 years before the founding fits, 23 or 61 does not (a
    creator: 20-55 before the work); so does a founding or work year, and a birth year, which
    must fit every organisation and work the person founded or made."""
    import random

    from fastslow.tasks import hover
    from fastslow.tasks.hover import Entity

    world = hover.World(random.Random(0), 20)
    org, work = world.orgs[0], world.works[0]
    nobody = [p for p in world.people if all(world.get(e, r) is not p for e, r in
                                             [(o, "founded_by") for o in world.orgs] + [(w, "creator") for w in world.works])]
    founder, creator = nobody[:2]
    world._set(org, "founded_by", founder)
    world._set(work, "creator", creator)
    founded, made = int(world.get(org, "founded_year").name), int(world.get(work, "year").name)
    for (lo, hi), subject, rel, year in (((24, 60), org, "founded_by", founded), ((20, 55), work, "creator", made)):
        person = founder if rel == "founded_by" else creator
        year_rel = "founded_year" if rel == "founded_by" else "year"
        for gap, fits in ((lo - 1, False), (lo, True), (hi, True), (hi + 1, False)):
            born = Entity(str(year - gap), "year")
            assert hover._fits(world, person, "birth_year", born) == fits, (rel, gap)
            world._set(person, "birth_year", born)
            assert hover._fits(world, subject, rel, person) == fits, (rel, gap)
            assert hover._fits(world, subject, year_rel, Entity(str(year), "year")) == fits, (rel, gap)


def _near_miss_world(seed: int, founds: dict[int, int] | None = None):
    """A world where the claim "the mayor of the birthplace of A was born in 1950" has one-swap
    paths ending on 1952 (the birthplace's deputy mayor) and 1990 (the mayor of A's home town),
    with a twin start X whose square fits. Nobody on the paths founded or made anything, but
    `founds`: person index -> the founding year of an organisation they found."""
    import random

    from fastslow.tasks import hover

    world = hover.World(random.Random(seed), 20)
    people = world.people
    for e, rel, year_rel in [(o, "founded_by", "founded_year") for o in world.orgs] + [
            (w, "creator", "year") for w in world.works]:
        world._set(e, rel, people[-1])
        world._set(e, year_rel, hover.Entity(str(int(world.get(people[-1], "birth_year").name) + 30), "year"))
    for start, towns, officials, years in ((people[0], world.towns[:2], people[2:6], (1950, 1952, 1990, 1930)),
                                           (people[1], world.towns[2:4], people[6:10], (1960, 1961, 1962, 1963))):
        world._set(start, "born_in", towns[0])
        world._set(start, "lives_in", towns[1])
        for town, (mayor, deputy) in zip(towns, (officials[:2], officials[2:]), strict=True):
            world._set(town, "mayor", mayor)
            world._set(town, "deputy_mayor", deputy)
        for person, year in zip(officials, years, strict=True):
            world._set(person, "birth_year", hover.Entity(str(year), "year"))
    for org, (index, year) in zip(world.orgs, (founds or {}).items(), strict=False):
        world._set(org, "founded_by", people[index])
        world._set(org, "founded_year", hover.Entity(str(year), "year"))
    rels = ["born_in", "mayor", "birth_year"]
    return world, hover._walk(world, people[0], rels), rels


def test_hover_hard_claims_the_one_swap_year_nearest_the_truth(monkeypatch):
    """hover_hard's false year is the one-swap path's nearest the truth (1952 beside 1950, not
    1990); hover's is either one-swap path's, drawn. Only hover_hard asks for the nearest."""
    import random

    from fastslow.tasks import hover

    for near, expected in ((True, {"1952"}), (False, {"1952", "1990"})):
        claimed = set()
        for seed in range(12):
            world, ents, rels = _near_miss_world(seed)
            square = hover._square(world, random.Random(seed), ents, rels, near=near)
            claimed.add(square.near_miss[-1].name)
        assert claimed == expected, near
    asked = []
    real = hover._square
    monkeypatch.setattr(hover, "_square", lambda *args, near: asked.append(near) or real(*args, near=near))
    get_task("hover_hard").problems("train", 2, seed=0)
    get_task("hover").problems("train", 2, seed=0)
    assert set(asked) == {True, False} and asked[0] is True and asked[-1] is False



@pytest.mark.parametrize("far", [1990, 1910])
def test_hover_hard_takes_the_nearest_false_year_below_the_truth_as_above_it(far):
    """Nearest is by distance: a one-swap year 40 years before the truth (1910 for 1950) is
    farther than one 2 years after (1952), as one 40 years after is; hover draws either."""
    import random

    from fastslow.tasks import hover

    for near, expected in ((True, {"1952"}), (False, {"1952", str(far)})):
        claimed = set()
        for seed in range(12):
            world, ents, rels = _near_miss_world(seed)
            world._set(world.get(world.towns[1], "mayor"), "birth_year", hover.Entity(str(far), "year"))
            claimed.add(hover._square(world, random.Random(seed), ents, rels, near=near).near_miss[-1].name)
        assert claimed == expected, (near, far)


def test_hover_draws_two_and_three_hops_twice_as_often_as_four():
    """hover's hops are drawn from 2, 2, 3, 3, 4 (a world redrawn for the same hops until one
    holds a square): about 40% / 40% / 20% of 1200 claims, not a third each."""
    drawn = Counter(p.metadata["hops"] for p in _hover_problems("hover", 1200))
    assert drawn[2] >= 420 and drawn[3] >= 420 and 150 <= drawn[4] <= 300, drawn

def test_a_false_hover_year_is_one_the_claims_subject_could_hold():
    """The near miss is a one-swap path's end that fits the claim's subject as the world draws
    years: the mayor born in 1950 founded an organisation in 2000, so 1990 (10 years before
    it) is never claimed for him, 1952 always; and a square whose set birth year would put an
    organisation 10 years after its founder's birth (the home town's deputy mayor, born 1930,
    founded one in 1960, and the square sets his year to 1950) is refused."""
    import random

    from fastslow.tasks import hover

    claimed = set()
    for seed in range(12):
        world, ents, rels = _near_miss_world(seed, founds={2: 2000})
        claimed.add(hover._square(world, random.Random(seed), ents, rels, near=False).near_miss[-1].name)
    assert claimed == {"1952"}
    for seed in range(4):
        world, ents, rels = _near_miss_world(seed, founds={5: 1960})
        assert hover._square(world, random.Random(seed), ents, rels, near=False) is None, seed


def test_a_hover_twin_chain_ends_on_years_its_start_could_hold():
    """In "the head of X was born in 1950" (false: 1940, the founder's year), the twin start's
    paths end on 1940 (its head) and 1950 (its founder), and both must fit the twin's founding
    year: of the organisations of X's kind only the one founded in 1995 can be the twin, not
    those founded in 2001 (61 years after 1940), whose founder's year alone would fit."""
    import random

    from fastslow.tasks import hover
    from fastslow.tasks.hover import Entity

    for seed in range(12):
        world = hover.World(random.Random(seed), 20)
        people = world.people
        for e, rel, year_rel in [(o, "founded_by", "founded_year") for o in world.orgs] + [
                (w, "creator", "year") for w in world.works]:
            world._set(e, rel, people[-1])
            world._set(e, year_rel, Entity(str(int(world.get(people[-1], "birth_year").name) + 30), "year"))
        kind = Counter(o.kind for o in world.orgs).most_common(1)[0][0]
        same = [o for o in world.orgs if o.kind == kind]
        assert len(same) >= 3, kind
        for i, (org, year) in enumerate(zip(same, [2000, 1995] + [2001] * (len(same) - 2), strict=True)):
            head, founder = people[2 * i], people[2 * i + 1]
            world._set(org, "led_by", head)
            world._set(org, "founded_by", founder)
            world._set(org, "founded_year", Entity(str(year), "year"))
            world._set(head, "birth_year", Entity("1950" if i == 0 else "1945", "year"))
            world._set(founder, "birth_year", Entity("1940" if i == 0 else "1960", "year"))
        rels = ["led_by", "birth_year"]
        square = hover._square(world, random.Random(seed), hover._walk(world, same[0], rels), rels, near=False)
        assert square.near_miss[-1].name == "1940" and square.twin[0] is same[1], seed


def test_a_hover_square_whose_truth_is_a_document_of_another_path_is_refused():
    """"The founder of the university attended by the head of X" is X's own founder, whose document
    the swapped path (the founder of X, in place of its head) shows: the truth would have a
    document and the false value none, so such a claim is refused; with the university founded
    by someone else, the same world makes a square."""
    import random

    from fastslow.tasks import hover
    from fastslow.tasks.hover import Entity

    made = []
    for seed in range(6):
        for university_founder in (1, 2):  # X's founder (a document of the swapped path), someone else
            world = hover.World(random.Random(seed), 20)
            for person in world.people:  # every fact fits the world's years
                world._set(person, "birth_year", Entity("1950", "year"))
            for e, year_rel in [(o, "founded_year") for o in world.orgs] + [(w, "year") for w in world.works]:
                world._set(e, year_rel, Entity("1990", "year"))
            org = next(o for o in world.orgs if o.kind != "university")
            first, second = [o for o in world.orgs if o.kind == "university"][:2]
            head, founder = world.people[:2]
            world._set(org, "led_by", head)
            world._set(org, "founded_by", founder)
            world._set(head, "studied_at", first)
            world._set(founder, "studied_at", second)
            world._set(first, "founded_by", world.people[university_founder])
            rels = ["led_by", "studied_at", "founded_by"]
            square = hover._square(world, random.Random(seed), hover._walk(world, org, rels), rels, near=False)
            assert square is None or university_founder == 2, seed
            made.append(square is not None)
    assert any(made)


@pytest.mark.parametrize("name", ["hover_easy", "hover", "hover_hard"])
def test_a_hover_claim_is_a_sentence_and_its_perturbation_names_the_swap(name):
    """A claim starts with a capital ("The birthplace of ...", not "the birthplace of ..."), and
    a NOT_SUPPORTED claim's perturbation names the swapped hop's sibling relation in place of the
    claim's own: two different relations, the claim's one its phrase uses (for an inner hop)."""
    problems = _hover_problems(name, 200)
    assert any(p.metadata["claim"].startswith("The ") for p in problems)
    for p in problems:
        m = p.metadata
        assert m["claim"][0].isupper() and m["true_statement"][0].isupper(), p.id
        if p.answer != "NOT_SUPPORTED":
            continue
        found = re.search(r"with '(.+?)' at hop (\d+) in place of the claim's '(.+?)'", m["perturbation"])
        assert found, m["perturbation"]
        swapped, hop, claimed = found.group(1), int(found.group(2)), found.group(3)
        assert swapped != claimed and 1 <= hop <= m["hops"], m["perturbation"]
        if hop < m["hops"]:  # an inner hop's relation is a noun phrase of the claim
            assert claimed.split("…")[0].lower() in m["claim"].lower(), (claimed, m["claim"])


def test_a_hover_demo_gist_is_the_claim_or_none():
    """The condensed worked example quotes the claim; a problem without one (blank or missing)
    has no gist rather than "Claim: " with nothing after it."""
    from dataclasses import replace

    task = get_task("hover")
    p = _hover_problems("hover", 1)[0]
    assert task.demo_gist(p) == f"Claim: {p.metadata['claim']}"
    for claim in ("", "  ", None):
        assert task.demo_gist(replace(p, metadata={**p.metadata, "claim": claim})) is None, claim


def test_no_hover_town_is_named_as_a_surname():
    """"The mayor of Corford is Tobin Corford" named the town twice: a town's name is never one
    of the surnames people are drawn with."""
    from fastslow.tasks import hover

    assert hover._TOWN_NAMES and set(hover._TOWN_NAMES).isdisjoint(hover._SURNAMES)
    assert {n.split()[-1] for n in hover._PERSON_NAMES} == set(hover._SURNAMES)


def test_physics_feedback_names_a_tolerance_under_half_a_percent():
    """`{tol:.0%}` said "tolerance 0%" for rel_tol 0.004: false feedback the fast loop learns from."""
    task, p = get_task("physics"), physics_problem(100.0, "m")
    p.metadata["rel_tol"] = 0.004
    assert "(tolerance 0.4%)" in task.feedback(p, "<answer>101 m</answer>")
    p.metadata["rel_tol"] = 0.02
    assert "(tolerance 2%)" in task.feedback(p, "<answer>110 m</answer>")


def test_the_article_a_is_no_label_a():
    """A multiple-choice file task (labels A-D): "C, a prime" named both C and A (the article),
    so a right answer scored 0."""
    labels = ("A", "B", "C", "D")
    assert normalize_label("C, a prime", labels) == "C"
    assert normalize_label("Option C: a prime number", labels) == "C"
    assert normalize_label("The answer is (b).", labels) == "B"
    assert normalize_label("a", labels) == normalize_label("A", labels) == "A"
    assert normalize_label("B or C", labels) is None


def test_the_exact_file_scorer_keeps_words_apart_and_reads_latex_variants(tmp_path: Path) -> None:
    """The `exact` scorer deleted every space ("1 2" passed for 12, "newyork" for New York) and
    read \\dfrac and \\left( as other text than \\frac and (. Spaces beside a symbol still go."""
    path = tmp_path / "exact.jsonl"
    golds = ["12", "New York", r"\frac{\sqrt{3}}{2}", "(1,2)", "x+1"] * 3
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"q{i}?", "answer": g}) + "\n"
                            for i, g in enumerate(golds)), encoding="utf-8")
    task = load_task_file(path, scorer="exact")
    by_gold = {p.answer: p for s in ("train", "val", "test") for p in task.problems(s, 15, seed=0)}
    cases = {"12": (["12", "\\boxed{12}."], ["1 2"]), "New York": (["new  york", "\\boxed{New York}."], ["newyork"]),
             r"\frac{\sqrt{3}}{2}": ([r"\dfrac{\sqrt{3}}{2}", r"\frac {\sqrt{3}}{2}"], [r"\frac{3}{2}"]),
             "(1,2)": ([r"\left(1, 2\right)"], ["(1,3)"]), "x+1": (["x + 1"], ["x+2"])}
    for gold, (right, wrong) in cases.items():
        for answer in right:
            assert task.reward(by_gold[gold], f"<answer>{answer}</answer>") == 1.0, (gold, answer)
        for answer in wrong:
            assert task.reward(by_gold[gold], f"<answer>{answer}</answer>") == 0.0, (gold, answer)


def test_a_star_graph_path_with_an_extra_node_is_wrong() -> None:
    """The path must be the answer exactly: one with a node more (the right path, then 7) scores
    0, as one with a node less does. Only shorter and other paths had been tested, so reading
    the answer's length of nodes and ignoring the rest passed."""
    task = get_task("stargraph")
    (p,) = task.problems("val", 1, 0)
    path = p.answer.split()
    assert task.reward(p, f"<answer>{' '.join(path)}</answer>") == 1.0
    extra = str(max(map(int, path)) + 1)
    assert task.reward(p, f"<answer>{' '.join(path)} {extra}</answer>") == 0.0
    assert task.reward(p, f"<answer>{' '.join(path[:-1])}</answer>") == 0.0


def test_one_equation_in_two_variables_is_one_problem() -> None:
    """An equation's identity renames its variable x, so "2*y + 3 = 7" and "2*x + 3 = 7" share a
    split (the identity keys it) and cannot sit in train and val at once."""
    from fastslow.tasks.math_task import problem_identity

    assert problem_identity("", "2*y + 3 = 7", "y") == problem_identity("", "2*x + 3 = 7", "x")
    assert problem_identity("", "2*y + 3 = 7", "y") != problem_identity("", "2*y + 3 = 8", "y")


# --- answers that are not ASCII English (a task of your own) -------------------------------
def _nfd(text: str) -> str:
    import unicodedata

    return unicodedata.normalize("NFD", text)


def test_answers_in_decomposed_unicode_match_their_composed_spelling(tmp_path: Path) -> None:
    """A file saved in decomposed form (NFD: macOS exports, copied PDF text) scored every composed
    answer a model writes 0, and its own gold 1, so the gold check stayed silent; a label so
    written stopped the splits as "not one of the labels" that looked identical on screen."""
    rows = [{"id": i, "prompt": f"Q{i}? <answer></answer>", "answer": _nfd(a), "split": s}
            for i, (a, s) in enumerate([("café", "train"), ("서울", "val"), ("réfuté", "test")])]
    path = tmp_path / "nfd.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    task = load_task_file(path)
    by_id = {p.id: p for s in ("train", "val", "test") for p in task.rows()[s]}
    for pid, composed in (("0", "café"), ("1", "서울"), ("2", "Réfuté.")):
        assert by_id[pid].answer != composed.lower().rstrip(".")  # stored decomposed
        assert task.reward(by_id[pid], f"<answer>{composed}</answer>") == 1.0
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps({"id": i, "prompt": "Vrai ou réfuté ? <answer></answer>",
                                          "answer": a, "split": "train"}) + "\n"
                              for i, a in enumerate(["vrai", "réfuté", _nfd("réfuté")])), encoding="utf-8")
    task = load_task_file(labels, scorer="label", labels=[_nfd("RÉFUTÉ"), "VRAI"])
    p = next(p for p in task.rows()["train"] if p.id == "2")
    assert task.reward(p, "<answer>réfuté</answer>") == 1.0 and task.reward(p, "<answer>vrai</answer>") == 0.0


@pytest.mark.parametrize("text, value", [("共42个", 42.0), ("约3.5米", 3.5), ("答案是7。", 7.0), ("42個です", 42.0),
                                         ("x2", None), ("abc123", None), ("about 42 apples", 42.0)])
def test_a_number_beside_a_script_without_spaces_is_read(text: str, value: float | None) -> None:
    """A Chinese or Japanese letter stuck to a number hid it: \\w is Unicode, so "共42个" held no
    number. A Latin letter stuck to one still makes it part of a word."""
    from fastslow.tasks.scoring import extract_number

    assert extract_number(text)[0] == value


def test_a_cjk_near_miss_is_shown_as_worked_example() -> None:
    from fastslow.fast.proposers import near_miss_working

    assert near_miss_working("首都是北京", "北京") == "首都是北京"
    assert near_miss_working("111 apples", "11") is None and near_miss_working("so 11 it is", "11") == "so 11"


@pytest.mark.parametrize("text, labels, label", [
    ("ДАННЫЕ ВЕРНЫ", ("ДА", "НЕТ"), None),     # ДА was read inside a longer Cyrillic word
    ("Ответ: да", ("ДА", "НЕТ"), "ДА"),
    ("不是", ("是", "否"), None),                # 是 inside 不是: no label, not the wrong one
    ("是", ("是", "否"), "是"),
    ("La réponse est VRAI", ("VRAI", "FAUX"), "VRAI"),
    ("VRAIMENT", ("VRAI", "FAUX"), None),
    ("isn't supported", LABELS, None),
    ("答案是SUPPORTED", LABELS, "SUPPORTED"),  # a Latin label beside Chinese text is still a word
    ("答案是NOT SUPPORTED。", LABELS, "NOT_SUPPORTED"),
    ("答案：是", ("是", "否"), "是"),
])
def test_a_label_is_a_whole_word_in_every_script(text: str, labels: tuple[str, ...], label: str | None) -> None:
    assert normalize_label(text, labels) == label


def test_float_answers_of_a_file_are_the_numbers_they_spell(tmp_path: Path) -> None:
    """An integer column with nulls dropped reads as floats: the gold 0 was stored as '0.0', and
    `<answer>0</answer>` scored 0 under `exact`, the gold check passing on '0.0' itself. A full
    stop in Chinese ends an answer as "." does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "floats.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c", "d", "e"], "prompt": ["Q? <answer></answer>"] * 5,
                             "answer": pa.array([0.0, 9e15, 2.5, -3.0, 1.5e25], pa.float64()),
                             "split": ["train", "train", "val", "test", "test"]}), path)
    task = load_task_file(path)
    got = {p.id: p.answer for s in ("train", "val", "test") for p in task.rows()[s]}
    # whole numbers as integers up to 2**53 (where a float still holds each), beyond as Python spells them
    assert got == {"a": "0", "b": "9000000000000000", "c": "2.5", "d": "-3", "e": "1.5e+25"}
    a = next(p for p in task.rows()["train"] if p.id == "a")
    assert task.reward(a, "<answer>0</answer>") == 1.0 and task.reward(a, "<answer>0.0</answer>") == 0.0
    cn = Problem("c", "file:x", "首都? <answer></answer>", "北京", {"scorer": "exact"})
    assert task.reward(cn, "<answer>北京。</answer>") == 1.0


def test_an_answer_that_only_looks_like_a_tag_loads(tmp_path: Path) -> None:
    """An answer holding an <answer> tag stops the splits (no completion can give it); one that
    holds the word and a ">" ("x_answer>0") is an answer like any other, and scores."""
    path = tmp_path / "tags.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt": "Q? <answer></answer>", "answer": a, "split": "train"}) + "\n"
                            for i, a in enumerate(["x_answer>0", "answer>=3"])), encoding="utf-8")
    task = load_task_file(path)
    for p in task.rows()["train"]:
        assert task.reward(p, f"<answer>{p.answer}</answer>") == 1.0


def test_an_answer_with_a_huge_number_scores_zero_without_an_error(tmp_path: Path) -> None:
    """A 400-digit integer against a float gold raised OverflowError in codeio's comparison, and
    a 5000-digit node label ValueError in stargraph's (past int()'s 4300 digits): each scored 0
    through the "bug in the task's judge" warning. An integer past float's range now equals no
    float (a float gold written out in digits still equals it), and a digit run no node label has
    reads as no label (not dropped: the rest could then read as the right path). A researcher's
    JSONL nested past the recursion limit is one line, not a traceback."""
    from fastslow.tasks.base import TaskDataError
    from fastslow.tasks.scoring import json_equal

    assert not json_equal(10**400, 1.5) and not json_equal(1.5, 10**400)
    assert json_equal(2399813805, 2399813805.0) and json_equal(10**300, 1e300)
    assert json_equal(6.02e23, 602000000000000000000000)  # the float gold written out
    # a program's float("inf") is JSON's Infinity: it can be answered (it matched nothing before)
    assert json_equal(float("inf"), json.loads("Infinity")) and json_equal([float("-inf")], [-math.inf])
    assert not json_equal(math.inf, -math.inf) and not json_equal(math.inf, 1e308) and not json_equal(1e308, math.inf)
    assert not json_equal(math.inf, 10**400) and not json_equal(math.inf, math.nan)
    # the gold first: a float gold is matched relatively, an integer answer too, and never by an
    # absolute 1e-12 (0.0 scored 1 for a photon's energy of 1.5e-20 J; 274736 scored 0 for 274736.1056)
    assert not json_equal(1.548507282554281e-20, 0.0) and not json_equal(1.5e-20, 1e-13)
    assert json_equal(1.5e-20, 1.5000001e-20) and json_equal(0.0, 0.0) and json_equal(0.0, 0)
    assert json_equal(274736.10559530533, 274736) and json_equal(274736.10559530533, 274736.0)
    assert not json_equal(5, 5.0000001) and not json_equal(2399813805.0, 2399813806)  # integer golds: exact,
    assert not json_equal(2399813805.0, 2399813806.0) and json_equal(2399813805.0, 2399813805)  # 42.0 too
    codeio = get_task("codeio")
    p = Problem("c", "codeio", "...", json.dumps({"x": 1.5}), {})
    inf = Problem("i", "codeio", "...", json.dumps({"x": math.inf}), {})
    assert codeio.judge(inf, '<answer>{"x": Infinity}</answer>').reward == 1.0
    assert codeio.judge(inf, '<answer>{"x": 1e308}</answer>').reward == 0.0
    tiny = Problem("t", "codeio", "...", json.dumps({"energy": 1.548507282554281e-20}), {})
    assert codeio.judge(tiny, '<answer>{"energy": 0.0}</answer>').reward == 0.0
    assert codeio.judge(tiny, '<answer>{"energy": 1.5485073e-20}</answer>').reward == 1.0
    assert codeio.judge(p, "<answer>{\"x\": " + "9" * 400 + "}</answer>").reward == 0.0
    stargraph = get_task("stargraph")
    (q,) = stargraph.problems("val", 1, seed=0)
    path = q.answer
    assert stargraph.judge(q, f"<answer>{path}</answer>").reward == 1.0
    assert stargraph.judge(q, f"<answer>{path} {'7' * 5000}</answer>").reward < 1.0
    assert stargraph.judge(q, f"<answer>{'7' * 5000}</answer>").reward == 0.0
    # a node past the first 5000 characters is read too (it was cut: the path with one more scored 1)
    assert stargraph.judge(q, f"<answer>{path}{' ' * 5000} 7</answer>").reward < 1.0
    deep = tmp_path / "deep.jsonl"
    row = {"id": "a", "prompt": "p", "answer": "1"}
    deep.write_text(json.dumps(row)[:-1] + ', "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(TaskDataError, match=r"deep\.jsonl: row 1: not valid JSON$"):
        load_task_file(deep).rows()


def test_codeio_feedback_names_where_two_json_values_differ() -> None:
    """`json_diff`, the codeio feedback's list of differences: keys missing or unexpected, a
    list of another length, a value, each at its path; at most `limit` of them; a value too
    deeply nested to walk is said to be so, not a crash."""
    from fastslow.tasks.scoring import json_diff

    assert json_diff({"a": [1, 2, 3], "b": {"c": 1}, "d": 2}, {"a": [1, 2], "b": {"c": 2, "e": 0}}) == [
        "$: missing key 'd'", "$.a: expected a list of 3 items, got 2", "$.b: unexpected key 'e'",
        "$.b.c: expected 1, got 2"]
    assert json_diff([1, [2, 3]], [1, [2, 4]]) == ["$[1][1]: expected 3, got 4"]
    assert json_diff(1.0, 1) == [] and len(json_diff(list(range(20)), list(range(1, 21)))) == 6
    deep, other = [], []
    for root, leaf in ((deep, None), (other, 1)):
        node = root
        for _ in range(5000):
            node.append([])
            node = node[0]
        if leaf is not None:
            node.append(leaf)
    assert json_diff(deep, other) == ["$: too deeply nested to compare"]


# --- mutation review of physics.py and units.py ----------------------------------------------
class _FixedGivens:
    """A stand-in for physics._Given: hands out the givens listed (SI), shown in SI; its rng
    draws a fixed μ (0.25) and never a non-SI unit."""

    class _Rng:
        def uniform(self, lo: float, hi: float) -> float:
            return 0.25

        def random(self) -> float:
            return 0.99

    def __init__(self, *values: float) -> None:
        self.values, self.rng = iter(values), self._Rng()

    def __call__(self, dim: str, lo: float, hi: float, alt: str | None = None, digits: int = 2) -> tuple[float, str]:
        x = next(self.values)
        return x, f"{x:g} {SI[dim]}"


@pytest.mark.parametrize("generator, givens, expected", [
    ("final_speed", (3, 2, 5), 13.0),              # 3 m/s + 2 m/s² · 5 s
    ("distance", (2, 1, 10), 70.0),                # 2·10 + ½·1·10²
    ("stopping", (20, 5), 40.0),                   # 20²/(2·5)
    ("avg_speed", (1200, 300), 4.0),
    ("fall_time", (19.6,), 2.0),                   # √(2·19.6/9.8)
    ("fall_speed", (20,), 19.79898987),            # √(2·9.8·20)
    ("kinetic", (2, 3), 9.0),
    ("potential", (10, 2), 196.0),
    ("lift_power", (100, 10, 49), 200.0),          # 100·9.8·10/49
    ("ohm", (12, 400), 0.03),
    ("series", (12, 100, 200), 0.04),
    ("parallel", (30, 60), 20.0),
    ("power_dissipated", (12, 48), 3.0),
    ("momentum", (2, 3), 6.0),
    ("collision", (2, 3, 1), 2.0),
    ("force", (50, 2), 100.0),
    ("braking_force", (1000, 20, 50), 4000.0),     # a = 400/100 = 4 m/s²
    ("series_power", (12, 4, 2), 8.0),             # I = 2 A, P2 = 4·2
    ("fall_momentum", (0.5, 5), 4.949747468),      # 0.5·√(2·9.8·5)
    ("collision_loss", (2, 3, 1), 3.0),            # v = 2 m/s: 9 J − 6 J
    ("slide", (0.5,), 2.0),                        # d = h/μ, μ = 0.25
    ("horizontal_launch", (19.6, 3), 6.0),         # t = 2 s
])
def test_each_physics_generator_computes_its_answer_worked_by_hand(generator: str, givens: tuple, expected: float) -> None:
    """Each generator's answer for round givens, worked out by hand (the formula test recomputes
    from the metadata the generator itself writes)."""
    import fastslow.tasks.physics as physics

    spec = getattr(physics, "_" + generator)(_FixedGivens(*givens))
    assert spec.value == pytest.approx(expected, rel=1e-9), (generator, spec.value)


def test_glued_per_second_kilo_ohm_names_and_latex_omega_convert_to_the_unit_asked() -> None:
    """"12.5 ms^-1" is 45 km/h (m·s⁻¹, the glued form), "2.5 kilohms" and "2500 \\Omega" are
    2.5 kΩ: read in the unit asked they had passed anyway, so they are checked against another."""
    task = get_task("physics")
    assert parse_unit("ms^-1") == parse_unit("ms-1") == parse_unit("m/s") and parse_unit("kgms-1") == parse_unit("N s")
    assert task.reward(physics_problem(45.0, "km/h"), "<answer>12.5 ms^-1</answer>") == 1.0
    assert task.reward(physics_problem(12.5, "m/s"), "<answer>45 ms^-1</answer>") == 0.0
    kohm = physics_problem(2.5, "kΩ")
    for answer in ("2500 \\Omega", "2500\\,\\Omega", "2.5 kilohms", "2.5 kilohm"):
        assert task.reward(kohm, f"<answer>{answer}</answer>") == 1.0, (answer, task.feedback(kohm, f"<answer>{answer}</answer>"))
    assert task.reward(physics_problem(2500.0, "Ω"), "<answer>2.5 kilohms</answer>") == 1.0


def test_a_unit_followed_by_a_word_is_read_longest_first_and_powers_up_to_four() -> None:
    """"3.2 kg m/s approx" is kg·m/s, not its first word kg (the longest reading that ends cleanly
    wins); a power up to 4 reads ("s^4·A^2/(kg·m^2)", the farad), 5 does not."""
    assert parse_quantity("3.2 kg m/s approx")[:2] == (3.2, "kg·m/s")
    assert parse_quantity("1.5 kilowatt hours roughly")[:2] == (1.5, "kW·h")
    assert parse_unit("s^4·A^2/(kg·m^2)") == ((-2, -1, 4, 2), 1.0) and parse_unit("m^4") is not None
    assert parse_unit("m^5") is None


@pytest.mark.parametrize("rel_tol", [0, 0.0, 1, 1.5, -0.01])
def test_physics_rel_tol_outside_zero_one_is_one_line_naming_it(rel_tol: float) -> None:
    with pytest.raises(ValueError, match=rf"^physics: rel_tol: expected a number in \(0, 1\), got {rel_tol!r}$"):
        get_task("physics", rel_tol=rel_tol)


def test_physics_feedback_names_the_default_tolerance_to_two_figures() -> None:
    task, p = get_task("physics"), physics_problem(100.0, "m")
    p.metadata["rel_tol"] = 0.0075
    assert "(tolerance 0.75%)" in task.feedback(p, "<answer>101 m</answer>")


def test_physics_hard_states_more_givens_in_non_si_units_than_default() -> None:
    """physics_hard shows a given in km/h, g, kΩ... about twice as often as physics (0.6 against 0.3)."""
    non_si = re.compile(r"\d (?:km/h|km|cm|g|kΩ|min)\b")
    share = {name: sum(bool(non_si.search(p.prompt.split("\n\n")[0])) for p in get_task(name).problems("train", 300, seed=5)) / 300
             for name in ("physics", "physics_hard")}
    assert 0.4 <= share["physics_hard"] <= 0.75 and share["physics_hard"] > 1.5 * share["physics"], share


def test_sig_writes_extreme_magnitudes_with_an_exponent_of_n_figures() -> None:
    from fastslow.tasks.physics import sig

    assert sig(1.5e20) == "1.500e+20" and sig(0.00001234) == "1.234e-05" and sig(-2.5e-7, 2) == "-2.5e-07"
    assert sig(123456789012345.0) == "123500000000000" and sig(0.0001) == "0.0001" and sig(0.0) == "0"


def test_physics_reads_space_grouped_thousands_with_decimals_as_one_number() -> None:
    """"1 234.5 J" is 1234.5 J, as the math scorer reads "96 800.5": it was read as 234.5 J (the
    "1" taken for a bare number before it), so a right answer scored 0 and 234.5 J's scored 1."""
    task = get_task("physics")
    assert parse_quantity("1 234.5 J")[:2] == (1234.5, "J") and parse_quantity("12 000.25 N")[:2] == (12000.25, "N")
    assert task.reward(physics_problem(1234.5, "J"), "<answer>1 234.5 J</answer>") == 1.0
    assert task.reward(physics_problem(234.5, "J"), "<answer>1 234.5 J</answer>") == 0.0
    assert task.reward(physics_problem(1.2345, "kJ"), "<answer>1\u202f234.5 J</answer>") == 1.0
    assert parse_quantity("1 234,5 J")[0] is None  # a decimal comma after a space group: not guessed


def test_physics_reads_a_unit_restated_in_brackets_once() -> None:
    """"12.5 m/s (meters per second)" was m²/s² (the bracket's terms multiplied in): a right answer
    scored 0, its feedback saying it was the wrong kind of unit. A bracket restating the unit
    before it is read once; any other bracket is read as before."""
    task = get_task("physics")
    speed = physics_problem(12.5, "m/s")
    for answer in ("12.5 m/s (meters per second)", "12.5 m/s [m s^-1]", "45 km/h (kilometres per hour)",
                   "12.5 m/s (metres per second) approx"):
        assert task.reward(speed, f"<answer>{answer}</answer>") == 1.0, (answer, task.feedback(speed, f"<answer>{answer}</answer>"))
    assert parse_quantity("1500 J (joules)")[:2] == (1500.0, "J")
    assert parse_quantity("3.2 kg m/s (N s)")[:2] == (3.2, "kg·m/s")
    assert parse_quantity("12 m (s)")[1] == "m·s" and parse_quantity("4.5 kJ (joules)")[1] == "kJ·J"
    assert task.reward(speed, "<answer>12.5 m (metres)</answer>") == 0.0


def test_physics_refuses_a_bare_number_just_before_one_with_a_unit() -> None:
    """"3 1/2 m" (3.5 m written as a mixed number) was read as 0.5 m and "1 2000 J" as 2000 J: the
    bare number before was dropped, so an answer meaning another value scored 1. Two numbers with
    only a space between, the unit written once, are not one reading: 0, and feedback says so."""
    task = get_task("physics")
    for answer, problem in (("3 1/2 m", physics_problem(0.5, "m")), ("1 2000 J", physics_problem(2000.0, "J")),
                            ("12 3.5 m/s", physics_problem(3.5, "m/s"))):
        assert parse_quantity(answer)[0] is None, answer
        assert task.reward(problem, f"<answer>{answer}</answer>") == 0.0, answer
        assert "Could not read one number" in task.feedback(problem, f"<answer>{answer}</answer>"), answer
    # a number with words between, a numbered step, and thousands grouped by a space still read
    assert parse_quantity("2 significant figures: 250 m")[:2] == (250.0, "m")
    assert parse_quantity("1. 250 m")[:2] == (250.0, "m") and parse_quantity("1 250 m")[:2] == (1250.0, "m")


def test_an_upper_case_glued_newton_product_is_not_read_as_a_nano_unit() -> None:
    """"3.2 NS" was read as 3.2 ns (case ignored: "ns" alone was taken for unambiguous, though "Ns"
    is N·s) and "1500 NM" as nanometres: right answers scored 0 as the wrong kind of unit. Case
    decides between them, so neither is read: the number is taken in the unit asked, and feedback
    says the unit was not recognised. "ns", "nm", "Ns" and "Nm" read as written."""
    task = get_task("physics")
    for answer, problem in (("3.2 NS", physics_problem(3.2, "kg·m/s")), ("1500 NM", physics_problem(1500.0, "J"))):
        assert task.reward(problem, f"<answer>{answer}</answer>") == 1.0, (answer, task.feedback(problem, f"<answer>{answer}</answer>"))
        assert "was not recognised" in task.feedback(problem, f"<answer>{answer}</answer>")
    assert parse_unit("NS") is None and parse_unit("NM") is None
    assert parse_unit("ns").scale == pytest.approx(1e-9) and parse_unit("nm") == ((1, 0, 0, 0), pytest.approx(1e-9))
    assert parse_unit("Ns") == parse_unit("kg·m/s") and parse_unit("Nm") == parse_unit("J")


def test_spelt_and_latex_units_convert_and_a_broken_per_is_not_read() -> None:
    """"12000 \\mu\\text{A}" is 12 mA, "45 km/hr" and "12.5 mps" are 12.5 m/s — checked against another
    unit, where reading them as the unit asked would fail; "m//s" and "m per squared s" are no unit."""
    task = get_task("physics")
    for answer, problem in ((r"12000\,\mu\text{A}", physics_problem(12.0, "mA")), (r"12000 \mu\mathrm{A}", physics_problem(12.0, "mA")),
                            ("45 km/hr", physics_problem(12.5, "m/s")), ("12.5 mps", physics_problem(45.0, "km/h"))):
        assert task.reward(problem, f"<answer>{answer}</answer>") == 1.0, (answer, task.feedback(problem, f"<answer>{answer}</answer>"))
    assert parse_unit("m//s") is None and parse_unit("m per / s") is None and parse_unit("m per squared s") is None


def test_an_unread_case_ambiguous_unit_read_as_the_one_asked_says_case_matters() -> None:
    """"4.5 ma" for 4.5 mA scores 1, and its feedback says the number was read as mA and that MA and mA differ."""
    task, p = get_task("physics"), physics_problem(4.5, "mA")
    fb = task.feedback(p, "<answer>4.5 ma</answer>")
    assert "was read as mA. Unit symbols are case-sensitive: MA and mA are different units." in fb, fb


def test_physics_easy_draws_only_the_one_formula_generators() -> None:
    problems = get_task("physics_easy").problems("train", 200, seed=5)
    assert {p.metadata["generator"] for p in problems} == {"final_speed", "ohm", "momentum", "kinetic", "potential",
                                                          "force", "avg_speed"}


def test_latex_mu_written_apart_from_its_unit_is_the_micro_prefix() -> None:
    """"12000 \\mu A" (LaTeX's spacing, rendered μA) was not read, so the number was taken in the
    unit asked: 12 mA written so scored 0 (read as 12000 mA). A lone μ is still no unit."""
    task, p = get_task("physics"), physics_problem(12.0, "mA")
    for answer in (r"12000 \mu A", r"12000\ \mu \text{A}", r"$12000 \, \mu A$"):
        assert task.reward(p, f"<answer>{answer}</answer>") == 1.0, (answer, task.feedback(p, f"<answer>{answer}</answer>"))
    assert parse_unit(r"\mu \Omega") == parse_unit("μΩ") and parse_quantity(r"12 \mu")[1] is None


def test_a_case_ambiguous_unit_followed_by_words_is_still_not_read_as_the_unit_asked() -> None:
    """"4.5 mj" for 4.5 kJ scores 0 (mJ or MJ, neither is kJ), but "4.5 mj approx" scored 1, and
    "0.068 mj roughly" 1 for 0.068 A: with a word after it the unit was "not recognised" and the
    number taken in the unit asked. The unit's leading word decides, as it does for a unit read."""
    task = get_task("physics")
    for value, unit, answer, note in ((4.5, "kJ", "4.5 mj approx", "could be MJ or mJ, and neither is the kJ asked for"),
                                      (4.5, "kJ", "4.5 mj (rounded)", "could be MJ or mJ"),
                                      (4.5, "kW", "4.5 mw approx", "could be MW or mW"),
                                      (0.068, "A", "0.068 mj roughly", "Wrong kind of unit: MJ or mJ measures energy")):
        p = physics_problem(value, unit)
        assert task.reward(p, f"<answer>{answer}</answer>") == 0.0, answer
        fb = task.feedback(p, f"<answer>{answer}</answer>")
        assert note in fb and "case-sensitive" in fb, (answer, fb)
    # one of its readings is the unit asked: read as it, words after or not
    assert task.reward(physics_problem(4.5, "mA"), "<answer>4.5 ma approx</answer>") == 1.0
    # words that continue the unit ("per s") make it another unit, unread: not judged by "mj" alone
    assert "Wrong kind" not in task.feedback(physics_problem(4.5, "kW"), "<answer>4.5 mj per s</answer>")


@pytest.mark.parametrize("gold, answer", [("4", "x = 3 or x = 4"), ("4", "Either x=3 or x=4"), ("4", "3 or x = 4"),
                                          ("4", "x = 3, x = 4"), ("4", "x = 3; x = 4"), ("4", "x = 3\nx = 4"),
                                          ("4", "x = 3 and x = 4 apples"), ("4", "y = 3 OR y = 4"),
                                          ("4", "3 OR x = 4")])
def test_math_refuses_a_hedge_written_as_two_equations(gold: str, answer: str) -> None:
    """Only the part after the last "=" was read, so "x = 3 or x = 4" scored 1 for 4: two values
    of one variable, or alternatives joined by "or", are a hedge and read as no number."""
    from fastslow.tasks.scoring import extract_number

    assert extract_number(answer)[0] is None, answer
    task = get_task("math")
    p = Problem("m", "math", "…", gold, {})
    assert task.reward(p, f"<answer>{answer}</answer>") == 0.0
    assert "give exactly one" in task.feedback(p, f"<answer>{answer}</answer>")


@pytest.mark.parametrize("answer", ["x = 6/2, so x = 3", "x = 3, x = 3.0", "a = 1, b = 3", "x = 2 + 1 = 3",
                                    "For y = 2, x = 3", "x = 3", "Since 2 < 4, x = 3", "x > 2, so x = 3",
                                    "apples or pears: total = 3"])
def test_math_still_reads_a_derivation_that_ends_in_one_value(answer: str) -> None:
    task = get_task("math")
    assert task.reward(Problem("m", "math", "…", "3", {}), f"<answer>{answer}</answer>") == 1.0, answer


@pytest.mark.parametrize("gold, answer", [("3", "±3"), ("-3", "±3"), ("3", "x = ±3"), ("3", "∓3"), ("3", "+/- 3"),
                                          ("-3", "+/-3"), ("3", "-/+3")])
def test_math_refuses_a_plus_minus_hedge(gold: str, answer: str) -> None:
    """"±3" is the two numbers 3 and -3: it scored 1 for 3 (and "+/-3" 1 for -3)."""
    task = get_task("math")
    p = Problem("m", "math", "…", gold, {})
    assert task.reward(p, f"<answer>{answer}</answer>") == 0.0
    assert "± gives two numbers" in task.feedback(p, f"<answer>{answer}</answer>")


@pytest.mark.parametrize("gold, answer", [("42", "x < 42"), ("3", "x > 3"), ("42", "x ≤ 42"), ("42", "≥42"),
                                          ("3", "x ≠ 3"), ("3", "x != 3"), ("3", "x <= 3"), ("3", "x >= 3"),
                                          ("3", "3 < x"), ("3", "3<x")])
def test_math_refuses_an_inequality(gold: str, answer: str) -> None:
    """An inequality's number was read as the answer: "x != 3" (after its "=") and "x > 3" scored 1
    for 3. A relation is no number."""
    task = get_task("math")
    p = Problem("m", "math", "…", gold, {})
    assert task.reward(p, f"<answer>{answer}</answer>") == 0.0
    assert "the answer is a relation" in task.feedback(p, f"<answer>{answer}</answer>")


@pytest.mark.parametrize("answer", ["-> 42", "=> 42", "x ≈ 42", "x == 42"])
def test_math_reads_an_arrow_or_approximation_before_the_number(answer: str) -> None:
    task = get_task("math")
    assert task.reward(Problem("m", "math", "…", "42", {}), f"<answer>{answer}</answer>") == 1.0, answer


@pytest.mark.parametrize("gold, answer", [("1000", "1,0000"), ("12345", "about 12,3456"), ("1000", "1,0005 apples")])
def test_a_thousands_group_of_four_digits_is_not_cut_to_three(gold: str, answer: str) -> None:
    """Free text's thousands groups stopped after three digits: "1,0000" read 1000 (and "12,3456"
    12345), scoring 1 for a number with a misplaced separator."""
    from fastslow.tasks.scoring import find_numbers

    assert len(find_numbers(answer)) != 1 or find_numbers(answer)[0] != float(gold)
    task = get_task("math")
    assert task.reward(Problem("m", "math", "…", gold, {}), f"<answer>{answer}</answer>") == 0.0
    assert find_numbers("1,000 and 2,345,678") == [1000.0, 2345678.0]


@pytest.mark.parametrize("gold, answer", [("4", "4²"), ("2", "2³"), ("10", "10⁵")])
def test_a_superscript_power_is_not_its_base(gold: str, answer: str) -> None:
    """"4²" is 16; its only number 4 was read, and it scored 1 for 4 ("4^2" read as an expression)."""
    task = get_task("math")
    p = Problem("m", "math", "…", gold, {})
    assert task.reward(p, f"<answer>{answer}</answer>") == 0.0
    assert task.reward(Problem("m", "math", "…", "42", {}), "<answer>42 m²</answer>") == 1.0  # a unit's power


def test_math_feedback_on_a_difference_past_floats_range() -> None:
    """A wrong answer of 1e308 to -1e308 is off by an infinity; formatting it raised OverflowError,
    so the judge failed instead of explaining the miss."""
    from fastslow.tasks.scoring import format_number

    assert format_number(math.inf) == "inf" and format_number(-math.inf) == "-inf" and format_number(math.nan) == "nan"
    task = get_task("math")
    p = Problem("m", "math", "…", "-1e308", {})
    assert "Your 1e+308 is not -1e+308 (off by inf)" in task.judge(p, "<answer>1e308</answer>").notes[0]


@pytest.mark.parametrize("gold, answer", [("0.5", "$\\frac{1}{2}$."), ("-0.5", "$-\\frac{1}{2}$."),
                                          ("42", "$\\boxed{42}$."), ("42", "**$42$**."), ("0.75", "$$\\frac{3}{4}$$."),
                                          ("0.5", "**$\\frac{1}{2}$**"), ("0.5", "`$\\frac{1}{2}$`")])
def test_a_number_in_dollar_delimiters_ending_a_sentence_is_read(gold: str, answer: str) -> None:
    """The full stop was taken off only after the wrappers were tried, and then a leading "$" as
    a currency sign: "$\\frac{1}{2}$." left "\\frac{1}{2}$", read as two numbers, and scored 0 for
    0.5 ("$42$." passed only as "the only number", with a note to answer with the number alone).
    A "$" a wrapper laid bare ("**$\\frac{1}{2}$**") was likewise taken as a currency sign."""
    from fastslow.tasks.scoring import extract_number, parse_number

    assert parse_number(answer) == float(gold)
    assert extract_number(answer) == (float(gold), "read as a number")
    task = get_task("math")
    p = Problem("m", "math", "…", gold, {})
    assert task.reward(p, f"<answer>{answer}</answer>") == 1.0
    assert "answer with the number alone" not in task.feedback(p, f"<answer>{answer}</answer>")
