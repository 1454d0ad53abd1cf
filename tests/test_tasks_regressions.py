"""Regressions from the task audit: unit parsing (written-out units, "per", products, negative
exponents, SI prefix case), exact integer scoring, labels inside sentences, reference answers that
contradict their own expression, and splits that leaked the same problem reworded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fastslow.tasks import get_task
from fastslow.tasks.base import Problem
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


def test_an_unreadable_unit_is_reported_never_given_a_wrong_dimension() -> None:
    task = get_task("physics")
    p = physics_problem(12.5, "m/s")
    fb = task.feedback(p, "<answer>12.5 meters per secnd</answer>")
    assert "'meters per secnd' was not recognised" in fb and "Wrong kind" not in fb
    q = physics_problem(4.5, "kJ")
    fb = task.feedback(q, "<answer>4.5 mj</answer>")  # mJ or MJ? not guessed
    assert "not recognised" in fb and "case-sensitive" in fb and "MJ and mJ" in fb
    assert parse_quantity("12.5 m/s approx") == (12.5, "m/s", "m/s approx")
    assert parse_quantity("250 m or 300 m")[0] is None


def test_unit_table_parses_to_itself_and_conversions_are_consistent() -> None:
    assert set(UNITS) >= set(SI.values())
    for sym, (dim, factor) in UNITS.items():
        assert canonical_unit(sym) == sym
        assert convert(1.0, sym, SI[dim]) == pytest.approx(factor)
    assert parse_unit("N·s") == parse_unit("kg·m/s") == parse_unit("kg m s^-1")
    assert parse_unit("mW").scale == pytest.approx(1e-3) and parse_unit("MW").scale == pytest.approx(1e6)
    assert convert(1.0, "m/s", "kg") is None and parse_unit("meters per") is None


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
    ("The claim is not fully supported", None),
    ("unsupported", None),
    ("non-supported", None),
    ("I cannot tell", None),
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
    programs = {split: {json.loads(m)["program_id"] for m in
                        pl.read_parquet(tmp_path / "codeio" / f"{split}.parquet")["metadata"]} for split in sizes}
    assert not programs["train"] & (programs["val"] | programs["test"])
