"""Answer parsing shared by the tasks: numbers, labels, JSON values and exact strings.

Every function here is total on arbitrary text (returns None / False instead of raising) and
linear-time, because the text comes straight from a model. Inputs are answers already cut out of
a completion by `extract_answer` (at most `MAX_PARSE_CHARS` long).
"""

from __future__ import annotations

import ast
import json
import math
import re
import unicodedata
from typing import Any

_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_NUMBER_RE = re.compile(rf"^{_NUM}$")
_FRACTION_RE = re.compile(rf"^({_NUM})\s*/\s*({_NUM})$")
# \frac{3}{4}, and LaTeX's one-digit shorthand \frac34 (each argument a single token)
_LATEX_FRAC_RE = re.compile(r"^\\[dt]?frac\s*(?:\{([^{}]*)\}|(\d))\s*(?:\{([^{}]*)\}|(\d))$")
_SCI_RE = re.compile(rf"^({_NUM})\s*(?:\*|x|×|·|\\times|\\cdot)\s*10\s*(?:\^|\*\*)\s*\{{?\s*([+-]?\d+)\s*\}}?$")
_THOUSANDS_RE = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d,])")
#: Scripts written without spaces between words (kana, CJK ideographs, Hangul syllables): a letter of
#: theirs next to a number is a word boundary ("共42个" holds 42), where a Latin one is not ("x2").
NO_SPACE_SCRIPTS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
#: Before a standalone number or word: not a letter, digit, "_" or "." (a boundary), or a letter of
#: `NO_SPACE_SCRIPTS`.
STANDALONE_BEFORE = rf"(?:(?<![\w.])|(?<=[{NO_SPACE_SCRIPTS}]))"
# A number token inside free text: optional sign, thousands commas, decimals, exponent, fraction.
_TOKEN_RE = re.compile(
    STANDALONE_BEFORE + r"[+\-−]?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)?(?:\.\d+)?(?:[eE][+-]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"
)
_WRAPPERS = (
    (re.compile(r"^\\boxed\s*\{(.*)\}$", re.DOTALL), 1),
    (re.compile(r"^\\text\s*\{(.*)\}$", re.DOTALL), 1),
    (re.compile(r"^\$+(.*?)\$+$", re.DOTALL), 1),
    (re.compile(r"^\\\((.*)\\\)$", re.DOTALL), 1),
    (re.compile(r"^\\\[(.*)\\\]$", re.DOTALL), 1),
    (re.compile(r"^\*\*(.*)\*\*$", re.DOTALL), 1),
    (re.compile(r"^`(.*)`$", re.DOTALL), 1),
)
_MAX_NUMBER_CHARS = 400  # nothing a model means as one number is longer; keeps float() cheap


def _unwrap(text: str) -> str:
    """Strip markdown/LaTeX decorations and currency signs around a single value."""
    s = text.strip().replace("−", "-").replace("\u2009", "").replace("\\,", "").replace("\\!", "")
    s = s.replace("\\left", "").replace("\\right", "")
    for _ in range(6):  # a few nested layers at most, e.g. $\boxed{42}$
        before = s
        s = s.rstrip(".").strip()  # first: "$\\frac{1}{2}$." is the $…$ wrapper, not a "$" sign
        for pattern, group in _WRAPPERS:
            m = pattern.match(s)
            if m:
                s = m.group(group).strip()
        if not (len(s) > 1 and s[0] == s[-1] == "$"):  # "$42$" left by "**$42$**": math, unwrapped next pass
            s = re.sub(r"^(?:\\\$|[$€£¥])\s*", "", s)
        s = re.sub(r"^([+-])\s*(?:\\\$|[$€£¥])\s*", r"\1", s)
        if s == before:
            break
    return s


def _to_float(text: str) -> float | None:
    try:
        value = float(text)
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def parse_number(text: Any) -> float | None:
    """The value of `text` if the whole of it is one number, else None.

    Accepts "42", "42.0", "-3", "$42", "1,234.5", "96{,}800", "96 800", "4.2e1", "3/4",
    "\\frac{3}{4}", "\\boxed{42}", "2.5 × 10^3", "42%" (read as 42). Returns None for anything
    else, and for inf/NaN.
    """
    if not isinstance(text, str) or not text.strip() or len(text) > _MAX_NUMBER_CHARS:
        return None
    s = _unwrap(text).replace("{,}", ",")  # LaTeX's 96{,}800
    # digits grouped in threes by a (no-break, narrow no-break) space: "96 800", as physics reads them
    s = re.sub(r"^([+-]?\d{1,3})((?:[ \u00a0\u202f]\d{3})+)(?=$|\.\d)",
               lambda m: m.group(1) + re.sub(r"\D", "", m.group(2)), s)
    s = _THOUSANDS_RE.sub(lambda m: m.group(1).replace(",", ""), s)
    s = s.removesuffix("\\%").removesuffix("%").strip()
    if _NUMBER_RE.match(s):
        return _to_float(s)
    if s[:1] in "+-" and s[1:].lstrip().startswith("\\"):  # -\frac{3}{4}
        inner = parse_number(s[1:])
        return None if inner is None else (-inner if s[0] == "-" else inner)
    m = _FRACTION_RE.match(s)
    parts = m.groups() if m else None
    if parts is None and (m := _LATEX_FRAC_RE.match(s)):
        parts = (m.group(1) or m.group(2), m.group(3) or m.group(4))
    if parts:
        num, den = parse_number(parts[0]), parse_number(parts[1])
        if num is None or den is None or den == 0:
            return None
        return _to_float(str(num / den))
    m = _SCI_RE.match(s)
    if m:
        mantissa, exponent = _to_float(m.group(1)), int(m.group(2))
        if mantissa is None or abs(exponent) > 300:
            return None
        return _to_float(str(mantissa * 10.0**exponent))
    return None


def find_numbers(text: str) -> list[float]:
    """Every number token of free text, in order (thousands commas and fractions understood)."""
    if not isinstance(text, str):
        return []
    values = []
    for m in _TOKEN_RE.finditer(text):
        token = m.group(0).strip()
        if not any(c.isdigit() for c in token):
            continue
        value = parse_number(token)
        if value is not None:
            values.append(value)
    return values


#: Notation that makes an answer's only number part of another value: a LaTeX command other than
#: the wrappers parse_number takes off (\\boxed, \\text, ...), a power, an index, a factorial, a
#: root or pi sign, or a letter stuck to a digit ("7i", "16pi", "3x").
_SYMBOLIC_RE = re.compile(r"\\(?!(?:boxed|text|textbf|textrm|mathrm|mathbf|mbox|displaystyle|left|right)\b)[A-Za-z]+"
                          r"|[\^_!√π∞]|\d(?:[A-Za-z]|pi)\b|\d[¹²³⁰⁴-⁹]")


def extract_number(text: Any) -> tuple[float | None, str]:
    """The number an answer states, and how it was read (for feedback).

    The whole answer is tried first; then the part after the last "=" ("x = 42"); then the only
    number in the text ("42 apples"), unless the text around it is mathematics ("16\\pi", "\\sqrt{2}",
    "x^5", "10!", "7i": another value, which happens to contain the number). Several candidate
    numbers make it ambiguous: None; so do a hedge ("±3", "x = 3 or x = 4", "x = 3, x = 4") and a
    relation ("x < 42", "x != 3").
    """
    if not isinstance(text, str) or not text.strip():
        return None, "the answer is empty"
    value = parse_number(text)
    if value is not None:
        return value, "read as a number"
    head, tail = text.rsplit("=", 1) if "=" in text else ("", text)
    # the answer's own clause only, the one after its last "=" with the sign before it ("x <= 3"):
    # a derivation's inequality ("since 3 < 4, x = 4") is not the answer
    sign = head.rstrip()[-1:] if head.rstrip().endswith(("<", ">", "!")) else ""
    relation = re.search(r"(<|(?<![-=])>|[≤≥≠]|!=)=?[ \t]*[+\-−]?\.?\d|\d[ \t]*([<>≤≥≠]|!=)",
                         sign + text[len(head):])  # the last "=" and what follows it
    if relation:  # "x < 42", "x != 3", "3 < x": not the number
        return None, f"the answer is a relation ({relation.group(1) or relation.group(2)!r} in it), not a number"
    if re.search(r"[±∓]|[+\-−][ \t]*/[ \t]*[+\-−]", text):  # "±3", "+/- 3": two numbers
        return None, "a ± gives two numbers, not one"
    if re.search(r"[=\d][^=]*\bor\b", head, re.IGNORECASE):  # "x = 3 or x = 4", "3 or x = 4": alternatives
        # (an "or" after a value; "apples or pears: total = 12" offers none)
        return None, "the answer gives alternatives ('or'); give exactly one"
    value = parse_number(tail)
    if value is not None:
        if _reassigned(head, value):
            return None, "the answer gives its variable two values; give exactly one"
        return value, "read the value after the last '='"
    tail = re.sub(r"(^|[\s=(:])([+\-−])\s+(?=\d)", r"\1\2", tail)  # "- 7" keeps its sign
    if re.search(r"[+\-−][ \t]*[+\-−][ \t]*\.?\d", tail):  # "--5", "- -5": not -5 (a "---" rule's line ends)
        return None, "a number has two signs"
    if re.search(r"[+\-−][ \t]*[(\[{][ \t]*[+\-−]?[ \t]*\.?\d", tail):  # "-(5)" is -5 and "-(-5)" 5: not read
        return None, "a sign stands before brackets: the answer is an expression, not a number"
    numbers = find_numbers(tail[:_MAX_NUMBER_CHARS * 5])
    if len(numbers) == 1:
        symbolic = _SYMBOLIC_RE.search(tail)
        if symbolic:
            return None, f"the answer is an expression ({symbolic.group(0).strip()!r} in it), not a number"
        if _reassigned(head, numbers[0]):
            return None, "the answer gives its variable two values; give exactly one"
        return numbers[0], "read the only number in the answer"
    if not numbers:
        return None, "no number could be read from the answer"
    return None, f"the answer holds {len(numbers)} numbers; give exactly one"


def _reassigned(head: str, value: float) -> bool:
    """Whether the text before an answer's last "=" ("x = 3, x =" of "x = 3, x = 4") gives the
    variable that "=" assigns another number (a hedge); "x = 6/2, so x = 3" gives it the same."""
    name = re.search(r"(?<![\w\\])([A-Za-z]\w*)\s*$", head)
    if name is None:
        return False
    for m in re.finditer(rf"(?<![\w\\]){re.escape(name.group(1))}\s*=\s*([^\s=,;]+)", head):
        earlier = parse_number(m.group(1))
        if earlier is not None and earlier != value:
            return True
    return False


def numbers_close(got: float, expected: float, rel_tol: float = 1e-6, abs_tol: float = 0.0) -> bool:
    """Whether `got` is the number `expected`; the rule of the numeric answers (math task, the
    loaders' "numeric" scorer):

    - an integer-valued `expected` (42, -3, 176204232, 1e6) must be matched exactly — no relative
      tolerance, so 176204233 is wrong for 176204232 however large the gold;
    - a non-integer `expected` (2.35, 1/3) is matched within `rel_tol` (or `abs_tol`, none by
      default), which only absorbs decimal/float rounding ("0.333333" for 1/3, 0.1 + 0.2 for 0.3).
      A non-integer gold is never 0, so the relative tolerance is enough; an absolute one would
      let 0 pass for any gold under it (5e-10).

    Integers beyond 2**53 compare as the floats they parse to. False (not an error) for
    non-finite inputs.
    """
    try:
        if not (math.isfinite(got) and math.isfinite(expected)):
            return False
        if float(expected).is_integer():
            return got == expected
        return math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol)
    except TypeError:
        return False


def relative_error(got: float, expected: float) -> float:
    """|got − expected| / |expected| (absolute error if expected is 0)."""
    return abs(got - expected) / (abs(expected) if expected else 1.0)


def format_number(value: float) -> str:
    """A short, readable rendering: integers without ".0", others to 4 significant digits."""
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def label_form(text: str) -> str:
    """A label's canonical spelling: upper case, runs of spaces and hyphens as one '_'
    ("Not supported", "not-supported" -> NOT_SUPPORTED). Labels, expected answers and given
    answers are all compared in this form."""
    return re.sub(r"[\s\-]+", "_", unicodedata.normalize("NFC", str(text)).strip().upper())


#: Words that negate a label named after them in the same clause ("isn't supported").
_NEGATIONS = frozenset({"NOT", "NO", "NEVER", "NOR", "NEITHER", "CANNOT", "HARDLY"})
_CLAUSE_END = re.compile(r"[.,;:!?()\[\]{}<>\n]")
# "SUPPORTED or not", "SUPPORTED (or not)", "SUPPORTED/no": the label's own negation as its
# alternative, a hedge as "SUPPORTED or NOT_SUPPORTED" is
_OR_NOT = re.compile(r"[\s,;(\-]*(?:\bOR\b|/)\s*(?:NOT|NO)(?![\w\-])")


def _negated(before: str) -> bool:
    clause = _CLAUSE_END.split(before)[-1]
    words = re.findall(r"[^\W\d_]+(?:['’][^\W\d_]+)?", clause)
    return any(w in _NEGATIONS or w.endswith(("N'T", "N’T")) for w in words)


def normalize_label(text: Any, labels: tuple[str, ...]) -> str | None:
    """Which of `labels` (upper-case, underscores) the text names; None if none or several.

    "not supported", "Not-Supported.", "**NOT_SUPPORTED**" all give NOT_SUPPORTED, and so does a
    label inside a sentence: "The claim is NOT_SUPPORTED", "Answer: not supported (doc 3)". A
    label's words may be joined by spaces, hyphens or underscores; a longer label containing a
    shorter one ("NOT_SUPPORTED" ⊃ "SUPPORTED") never counts as both. Text naming two labels
    ("SUPPORTED or NOT_SUPPORTED", "supported or not"), or negating the one it names in the same
    clause ("isn't supported", "not fully supported"), is ambiguous: None.
    """
    if not isinstance(text, str):
        return None
    t = unicodedata.normalize("NFC", text[:2000]).replace("\\_", "_")
    s = t.upper()
    whole = label_form(s).strip("_.*`'\"!:;()[]{}")
    if whole in labels:
        return whole
    # Longest label first, so the alternation reads NOT_SUPPORTED before SUPPORTED at one spot.
    spelled = sorted(labels, key=len, reverse=True)
    parts = "|".join(r"[\s_\-]+".join(map(re.escape, filter(None, lab.split("_")))) for lab in spelled)
    if not parts:
        return None
    found = set()
    # A label is a whole word: no letter or digit of any script beside it ("ДА" is not in "ДАННЫЕ"),
    # but a letter of a script without spaces beside a label's other letter ("答案是SUPPORTED")
    edge = f"[{NO_SPACE_SCRIPTS}]"
    for m in re.finditer(rf"(?:(?<![\w\-])|(?<={edge})(?!{edge}))(?:{parts})(?:(?![\w\-])|(?<!{edge})(?={edge}))", s):
        if m.end() - m.start() == 1 and len(t) == len(s) and t[m.start()] == "a":
            continue  # the article is no label A: "C, a prime" is C
        if _negated(s[:m.start()]) or _OR_NOT.match(s, m.end()):
            return None
        found.add(label_form(m.group(0)))
    found &= set(labels)
    return found.pop() if len(found) == 1 else None


def normalize_text(text: Any, casefold: bool = True) -> str:
    """Whitespace-collapsed (and by default case-folded) text for exact comparison, in Unicode's
    composed form (NFC: "é" typed as e and a combining accent is "é")."""
    if not isinstance(text, str):
        return ""
    s = " ".join(unicodedata.normalize("NFC", text).split())
    return s.casefold() if casefold else s


def parse_json_value(text: Any) -> tuple[bool, Any]:
    """(ok, value): `text` as JSON, else as a Python literal (True/None/'single quotes').

    `ast.literal_eval` evaluates literals only, never code. Tuples become lists so the value
    compares like JSON.
    """
    if not isinstance(text, str) or not text.strip():
        return False, None
    s = text.strip()
    fence = re.match(r"^```(?:json|python)?\s*(.*?)\s*```$", s, re.DOTALL)
    if fence:
        s = fence.group(1)
    ok, value = _literal(s)
    if ok:
        return ok, value
    # what does not parse as it stands, unwrapped: \boxed{312}, `312`, $312$, "Output: 312" (no
    # JSON value is written so: a string needs its quotes)
    bare = _unwrap(re.sub(r"^(?:the\s+)?(?:output|answer|result|return(?:s|ed)?(?:\s+value)?)\s*(?:is)?\s*[:=]?\s*",
                          "", _unwrap(s), flags=re.IGNORECASE))
    return _literal(bare) if bare and bare != s else (False, None)


def _literal(s: str) -> tuple[bool, Any]:
    """(ok, value) of `s` as JSON, else as a Python literal."""
    try:
        return True, json.loads(s)
    except (ValueError, RecursionError):
        pass
    try:
        return True, _jsonable(ast.literal_eval(s))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset, complex, bytes)):
        raise ValueError("not a JSON value")
    return value


def json_equal(a: Any, b: Any, rel_tol: float = 1e-6) -> bool:
    """Structural equality of JSON values, `a` the gold and `b` the answer; numbers compare with
    `rel_tol` (1 == 1.0), but an integer gold (42, or 42.0) exactly, and with no absolute
    tolerance (0.0 is not a gold of 1.5e-20)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b if isinstance(a, bool) and isinstance(b, bool) else False
    if isinstance(a, int) and isinstance(b, int):
        return a == b  # integers are exact: 2399815805 is not 2399813805
    if isinstance(a, int) and isinstance(b, float) or isinstance(a, float) and a.is_integer() and isinstance(b, (int, float)):
        try:  # and so is an integer written as a float: 2399813805.0 too (6.02e23 as 602000000000000000000000)
            return float(a) == float(b)
        except OverflowError:  # an integer past float's range (a 400-digit answer) equals no float
            return False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            return True
        try:  # a float gold: the answer within rel_tol, an integer answer too (274736 for 274736.1056)
            x, y = float(a), float(b)  # CodeIO compares every number with a relative tolerance
        except OverflowError:
            return False
        if math.isinf(x) or math.isinf(y):  # a program's float('inf'), JSON's Infinity: the same infinity
            return x == y
        return math.isfinite(x) and math.isfinite(y) and math.isclose(x, y, rel_tol=rel_tol)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k], rel_tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y, rel_tol) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def json_diff(expected: Any, got: Any, path: str = "$", limit: int = 6, rel_tol: float = 1e-6) -> list[str]:
    """Up to `limit` human-readable differences between two JSON values (for feedback), numbers
    compared as `json_equal` does with `rel_tol` (the task's)."""
    out: list[str] = []

    def short(v: Any) -> str:
        s = json.dumps(v, default=str)
        return s if len(s) <= 80 else s[:70] + "…"

    def walk(e: Any, g: Any, p: str) -> None:
        if len(out) >= limit or json_equal(e, g, rel_tol):
            return
        if isinstance(e, dict) and isinstance(g, dict):
            for k in sorted(set(e) - set(g))[:limit]:
                out.append(f"{p}: missing key {k!r}")
            for k in sorted(set(g) - set(e))[:limit]:
                out.append(f"{p}: unexpected key {k!r}")
            for k in sorted(set(e) & set(g)):
                walk(e[k], g[k], f"{p}.{k}")
        elif isinstance(e, list) and isinstance(g, list) and len(e) == len(g):
            for i, (x, y) in enumerate(zip(e, g, strict=True)):
                walk(x, y, f"{p}[{i}]")
        elif isinstance(e, list) and isinstance(g, list):
            out.append(f"{p}: expected a list of {len(e)} items, got {len(g)}")
        else:
            out.append(f"{p}: expected {short(e)}, got {short(g)}")

    try:
        walk(expected, got, path)
    except RecursionError:
        out.append(f"{path}: too deeply nested to compare")
    return out[:limit]
