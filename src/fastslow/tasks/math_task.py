"""Math: numeric-answer problems from reasoning-gym, scored by numeric value.

easy: short arithmetic chains; default: GSM-style word problems (gsm_symbolic) mixed with
arithmetic expressions and linear equations; hard: longer expressions with bigger numbers, harder
equations and word problems. Answers compare by value, so "42", "42.0", "$42", "4.2e1", "84/2",
"\\boxed{42}" and "x = 42" are all right for 42, and scoring is exact: an integer answer must be
that integer (176204233 is wrong for 176204232); only a non-integer gold (a decimal such as 2.35)
is matched within a relative 1e-6, see `scoring.numbers_close`. (Paper scale uses Polaris via
`loaders`.)

Checked golds: reasoning-gym's `basic_arithmetic` without parentheses computes its answer left to
right and may swap a divisor without showing it ("Calculate 5 / 9." with answer 10), so an item
whose answer is not the exact value of its own expression is dropped. Eight `gsm_symbolic`
templates truncate a step's fraction ("half as many as 9 tubes" is 4, 38% of 40 students is 15, 108
muffins fill 4 pans of 24, €899.5 buys 666 crackers at €1.35, 4752 minutes are 79 hours); an item
of theirs whose steps are not exact (`GSM_EXACT`, from the item's own variables) is dropped (about
2% of word problems).

Splits: a problem's identity is its expression (basic_arithmetic and chain_sum word the same
"7 - 5" differently), its equation up to the variable's name, or a word problem's template, numbers
and answer (gsm_symbolic tells one problem of James or of David); other items are keyed by prompt.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from fastslow.tasks.base import Judgement, Problem, extract_answer
from fastslow.tasks.generated import Candidate
from fastslow.tasks.rgym import ReasoningGymTask, Source
from fastslow.tasks.scoring import extract_number, format_number, numbers_close, parse_number

_ARITH = "basic_arithmetic"


class MathTask(ReasoningGymTask):
    """Numeric math problems (reasoning-gym mixture), exact numeric scoring (see the module)."""

    family = "math"
    key_names_one_problem = True  # its key is the problem's identity (`problem_identity`)
    instruction = "Give the final result as a single number."
    sources_by_difficulty = {
        "easy": (
            Source("chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
            Source(_ARITH, {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2,
                            "allow_parentheses": False}),
        ),
        "default": (
            Source("gsm_symbolic", {}, 2.0),
            Source(_ARITH, {"min_terms": 2, "max_terms": 4, "min_digits": 1, "max_digits": 3}),
            Source("simple_equations", {}),
        ),
        "hard": (
            Source("gsm_symbolic", {}),
            Source(_ARITH, {"min_terms": 5, "max_terms": 7, "min_digits": 2, "max_digits": 4}),
            Source("simple_equations", {"min_terms": 3, "max_terms": 5, "max_value": 1000}),
        ),
    }

    def convert(self, item: Mapping[str, Any], source: Source) -> Candidate | None:
        # gsm_symbolic ends its questions with its own answer instruction; keep one instruction.
        question = str(item["question"]).replace(" Give the result as your final answer. Do not include units.", "")
        cand = super().convert({**item, "question": question}, source)
        if cand is None or parse_number(cand.answer) is None:
            return None  # only numeric answers belong to this task
        rg_meta = item.get("metadata", {}) or {}
        expression = str(rg_meta.get("expression", ""))
        if expression and not _gold_matches(expression, cand.answer):
            return None  # a wrong reference answer (see the module docstring)
        if not gsm_exact(rg_meta.get("variables")):
            return None  # a word problem whose reference solution truncates a step
        cand.metadata = {"source": source.dataset, "solution": str(rg_meta.get("answer_cot", "")),
                         "expression": expression}
        cand.key = problem_identity(expression, str(rg_meta.get("equation", "")),
                                    str(rg_meta.get("variable", "")), rg_meta.get("variables"), cand.answer)
        return cand

    def judge(self, problem: Problem, completion: str) -> Judgement:
        expected = parse_number(problem.answer)
        raw = extract_answer(completion)
        notes = []
        meta = problem.metadata
        if meta.get("solution"):
            steps = str(meta["solution"]).split("####")[0].strip()
            notes.append("Reference solution: " + " ".join(steps.split())[:1200])
        elif meta.get("expression"):
            notes.append(f"Expression to evaluate: {meta['expression']}")
        if raw is None:
            return Judgement(0.0, problem.answer, None, notes)
        got, how = extract_number(raw)
        if expected is None:  # a task file's gold that is no number: nothing the answer could match
            notes.insert(0, f"The expected answer {problem.answer!r} is not a number, so no answer can match it.")
            return Judgement(0.0, problem.answer, raw, notes)
        if got is None:
            notes.insert(0, f"Could not read the answer as one number ({how}).")
            return Judgement(0.0, problem.answer, raw, notes)
        ok = numbers_close(got, expected)
        if not ok:
            notes.insert(0, _miss(got, expected))
        elif how != "read as a number":
            notes.insert(0, f"Accepted ({how}), but answer with the number alone.")
        return Judgement(float(ok), problem.answer, raw, notes)


def _numbers(value: Any) -> bool:
    """Is `value` a number, or a list of numbers (a word problem's prices, quantities)?"""
    if isinstance(value, (list, tuple)):
        return bool(value) and all(_numbers(v) for v in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def problem_identity(expression: str, equation: str = "", variable: str = "",
                     variables: Any = None, answer: str = "") -> str | None:
    """What makes two math problems the same however worded: the expression without spaces
    ("7-5"), or the equation with its variable renamed x, or a word problem's template (the names
    of its `variables`), its numbers (lists of them too) and its `answer`, without the names and
    objects it is told with (gsm_symbolic: "James is 11 ..." and "David is 11 ..." are one problem);
    None (key by prompt) for none. The answer is part of it because not every variable that changes
    the problem is a number: "per day ... one week" (112) and "... one month" (480) differ in a
    word, and a template whose numbers were all lists had one key for 59 answers; two problems of
    one key are one problem (`GeneratedTask.key_names_one_problem`: a split holds it once)."""
    if expression.strip():
        return "math|expression|" + re.sub(r"\s+", "", expression)
    if equation.strip():
        if re.fullmatch(r"[A-Za-z]", variable):
            equation = re.sub(rf"(?<![A-Za-z]){variable}(?![A-Za-z])", "x", equation)
        return "math|equation|" + re.sub(r"\s+", "", equation)
    if isinstance(variables, Mapping) and variables:
        numbers = {str(k): v for k, v in variables.items() if _numbers(v)}
        return "math|template|" + json.dumps({"template": sorted(map(str, variables)), "numbers": numbers,
                                              "answer": answer.strip()}, sort_keys=True, default=str)
    return None


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _exact_value(node: ast.AST) -> Fraction:
    """The exact value of an arithmetic syntax tree (integers, + - * /, unary minus)."""
    if isinstance(node, ast.Expression):
        return _exact_value(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _exact_value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_exact_value(node.left), _exact_value(node.right))
    raise ValueError("not plain arithmetic")


def _gold_matches(expression: str, answer: str) -> bool:
    """Whether `answer` is the exact value of a generator's `expression` (True when the
    expression is not plain arithmetic we can check; False when it divides by zero)."""
    try:
        gold = Fraction(answer.strip())
    except (ValueError, ZeroDivisionError):
        return False
    try:
        value = _exact_value(ast.parse(expression[:2000], mode="eval"))
    except ZeroDivisionError:
        return False
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return True
    return value == gold


def _q(value: Any) -> Fraction:
    """A template variable's exact value (0.5 as 1/2: floats through their decimal text)."""
    return Fraction(str(value))


#: gsm_symbolic's templates that truncate a step (int() of a fraction), by their variables' names,
#: and whether an item's steps are exact (its gold then the exact answer).
GSM_EXACT: dict[frozenset[str], Any] = {
    # "James has 9 tubes of yellow paint ... Joseph has half as many": 9 * 0.5 taken as 4
    frozenset({"name1", "name2", "color1", "color2", "n1", "n2", "frac1", "mult1", "n1_result", "n2_result"}):
        lambda v: _q(v["n1"]) * _q(v["frac1"]) == _q(v["n1_result"])
        and _q(v["n2"]) * _q(v["mult1"]) == _q(v["n2_result"]),
    # "In Mrs. Garcia's class of 100 students ... 38% of the remaining 40": 15.2 taken as 15
    frozenset({"teacher", "total_students", "percent_group1", "percent_group23", "group1", "group2", "group3",
               "event", "group1_count", "group23_count"}):
        lambda v: _q(v["total_students"]) * _q(v["percent_group1"]) / 100 == _q(v["group1_count"])
        and (_q(v["total_students"]) - _q(v["group1_count"])) * _q(v["percent_group23"]) / 100
        == _q(v["group23_count"]),
    # "9 jars ... 12 muffins each ... each pan holds 24": 4.5 pans taken as 4
    frozenset({"name", "items", "food", "location", "container", "num_jars", "per_jar", "per_pan", "total_items"}):
        lambda v: _q(v["num_jars"]) * _q(v["per_jar"]) == _q(v["total_items"])
        and (_q(v["total_items"]) / _q(v["per_pan"])).denominator == 1,
    # "The vending machines sell crackers for 135 cents ... €1000 ... 10% left": 666.3 taken as 666
    frozenset({"name", "item1", "item2", "price1", "price2", "total_spent", "num_item1", "num_item2",
               "percent_change", "currency"}):
        lambda v: (_q(v["total_spent"]) * (100 - _q(v["percent_change"])) / 100
                   - _q(v["num_item1"]) * _q(v["price1"]) / 100) / (_q(v["price2"]) / 100) == _q(v["num_item2"]),
    # "... walks 10 km on the beach ... sidewalk ...": int() of the sidewalk time (55 + 32.5 as 87)
    frozenset({"beach_distance", "beach_time", "name", "sidewalk_distance", "sidewalk_time", "speed_multiplier",
               "total_distance", "unit"}):
        lambda v: _q(v["sidewalk_distance"]) * _q(v["beach_time"]) / (_q(v["beach_distance"]) * _q(v["speed_multiplier"]))
        == _q(v["sidewalk_time"]),
    # "... €77.32 ... 39 items at €0.88 ... how many left": int(42.99999999999999) as 42
    frozenset({"currency", "initial_amount", "item", "name", "quantity", "remaining", "store_type", "total_cost",
               "unit_price"}):
        lambda v: _q(v["remaining"]).denominator == 1,
    # "... penpals ... how many hours": total_minutes // 60 (4752 minutes as 79 hours)
    frozenset({"current_penpals", "initial_penpals", "letters_per_week", "lost_penpals", "minutes_per_page", "name",
               "pages_per_letter", "total_minutes"}):
        lambda v: _q(v["total_minutes"]) % 60 == 0,
    # "... 58% more cards than 50": int(0.58 * 50) as 28
    frozenset({"c1", "c2", "c3", "item", "more_cards", "n1", "p", "total"}):
        lambda v: _q(v["p"]) * _q(v["n1"]) / 100 == _q(v["more_cards"]),
}


def gsm_exact(variables: Any) -> bool:
    """Whether a gsm_symbolic item's steps are exact (True for a template not in `GSM_EXACT`,
    and for an item of no template); False when its variables cannot be read."""
    if not isinstance(variables, Mapping):
        return True
    check = GSM_EXACT.get(frozenset(map(str, variables)))
    if check is None:
        return True
    try:
        return bool(check(variables))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return False


def _miss(got: float, expected: float) -> str:
    """A one-line diagnosis of a wrong number (sign, rounding, magnitude)."""
    text = f"Your {format_number(got)} is not {format_number(expected)} (off by {format_number(got - expected)})"
    if expected and numbers_close(got, -expected):
        return text + ": the sign is wrong."
    if expected and abs(got - expected) / abs(expected) < 0.01:
        return text + ": close, but the answer must be exact (no rounding)."
    if expected and got and any(numbers_close(got, expected * f) for f in (10, 100, 1000, 0.1, 0.01, 0.001)):
        return text + ": a factor-of-ten (place value or unit) slip."
    return text + "."
