"""Units for the physics task: unit text -> (dimension vector, factor to SI).

A unit is read as a product of terms, each a unit token with an optional exponent, so one small
grammar covers what a model may write: "m/s", "m s^-1", "m·s⁻¹", "meters per second", "kg m/s",
"N·s", "newton seconds", "\\text{kg} \\cdot \\text{m/s}". Terms after "/" or "per" are divided
("J/kg K" is J/(kg·K)); "squared" / "square" square a term. A token is

- a symbol with an optional SI prefix (G M k c m μ/u n), read case-sensitively as SI requires:
  mJ is millijoules and MJ megajoules, mW / MW, mA / MA, ms / Ms are different units;
- a spoken name in any case, plural or prefixed: "metres", "Kilometers", "milliamps", "kohm";
- a few glued spellings: "Nm", "Ns", "kgm", "kph", "kmh", "mps", "kWh", "ms^-2" (m·s⁻²). A
  power binds to the unit it follows, "kgm^2" is kg·m² and "Nm^-1" N/m; a glued quotient's power
  ("kph^2") is not read.

Only when the case-sensitive reading fails is a token's case ignored, and only where that is
unambiguous: "KJ" and "kw" are kilo-units, but "mj" (mJ or MJ?), "mw" and "NS" (N·s or ns?) are not read.
Dimensions are exponent vectors over (m, kg, s, A); the named ones are those of `SI`. A unit the
grammar cannot read is reported back (the number is then compared as if it were in the requested
unit, and feedback says so) — it is never guessed from its first word.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import NamedTuple

from fastslow.tasks.scoring import parse_number

Dims = tuple[int, int, int, int]  # exponents of m, kg, s, A


class Unit(NamedTuple):
    """A parsed unit: its dimension vector and the factor that takes it to SI."""

    dims: Dims
    scale: float


_BASE: dict[str, Unit] = {  # symbols that take SI prefixes
    "m": Unit((1, 0, 0, 0), 1.0), "g": Unit((0, 1, 0, 0), 1e-3), "s": Unit((0, 0, 1, 0), 1.0),
    "A": Unit((0, 0, 0, 1), 1.0), "N": Unit((1, 1, -2, 0), 1.0), "J": Unit((2, 1, -2, 0), 1.0),
    "W": Unit((2, 1, -3, 0), 1.0), "V": Unit((2, 1, -3, -1), 1.0), "Ω": Unit((2, 1, -3, -2), 1.0),
}
_PREFIXES = {"G": 1e9, "M": 1e6, "k": 1e3, "c": 1e-2, "m": 1e-3, "μ": 1e-6, "u": 1e-6, "n": 1e-9}
#: Case-exact symbols: every base symbol bare and prefixed, and the units that take no prefix.
_SYMBOLS: dict[str, Unit] = {p + b: Unit(u.dims, f * u.scale) for b, u in _BASE.items()
                             for p, f in {"": 1.0, **_PREFIXES}.items()}
_SYMBOLS.update({"min": Unit((0, 0, 1, 0), 60.0), "h": Unit((0, 0, 1, 0), 3600.0),
                 "t": Unit((0, 1, 0, 0), 1000.0)})
_by_lower: dict[str, set[str]] = {}
for _symbol in _SYMBOLS:
    _by_lower.setdefault(_symbol.lower(), set()).add(_symbol)
#: Case-insensitive fallback: only spellings that name one unit whatever their case.
_SYMBOLS_ANYCASE = {low: next(iter(syms)) for low, syms in _by_lower.items() if len(syms) == 1}
#: Lower-case spellings that name two units ("mj": mJ or MJ), for feedback.
CASE_AMBIGUOUS = {low: tuple(sorted(syms)) for low, syms in _by_lower.items() if len(syms) > 1}

#: Spoken names (lower case, singular) -> symbol. Names of `_BASE` units also take word prefixes.
_NAMES = {
    "meter": "m", "metre": "m", "gram": "g", "gramme": "g", "second": "s", "sec": "s",
    "ampere": "A", "amp": "A", "newton": "N", "joule": "J", "watt": "W", "volt": "V", "ohm": "Ω",
    "minute": "min", "min": "min", "hour": "h", "hr": "h", "tonne": "t", "kilo": "kg",
    "kilohm": "kΩ", "megohm": "MΩ",
}
_WORD_PREFIXES = {"giga": "G", "mega": "M", "kilo": "k", "centi": "c", "milli": "m", "micro": "μ",
                  "nano": "n"}
#: A spoken prefix written apart from its unit ("kilo ohms", "kilo-joules"), joined to it.
_PREFIX_APART_RE = re.compile(rf"(?i)\b({'|'.join(_WORD_PREFIXES)})[\s\-·]+(?=(?!per\b)[^\W\d_])")
#: Glued products, case-exact ("nm" is a nanometre, "Nm" a newton metre) and any-case.
_GLUED = {"Nm": "N·m", "Ns": "N·s", "Wh": "W·h", "kWh": "kW·h"}
for _glued in _GLUED:  # "NS": N·s or ns? "NM": N·m or nm? Case decides, so it is not ignored.
    _SYMBOLS_ANYCASE.pop(_glued.lower(), None)
_GLUED_ANYCASE = {"kph": "km/h", "kmh": "km/h", "kmph": "km/h", "mps": "m/s", "kwh": "kW·h",
                  "kgm": "kg·m"}
#: "ms^-1", "kgms-1": with a negative exponent the trailing s is its own term (m·s⁻¹).
_GLUED_PER_SECOND = {"ms": "m", "kgms": "kg·m"}

#: Units the physics generator states or asks in: symbol -> (dimension, factor to SI).
_TABLE = ("m", "km", "cm", "mm", "s", "min", "h", "ms", "kg", "g", "t", "m/s", "km/h", "m/s²", "N",
          "kN", "J", "kJ", "MJ", "W", "kW", "V", "mV", "kV", "A", "mA", "Ω", "kΩ", "kg·m/s")
#: The SI unit of each dimension (what formulas compute in).
SI: dict[str, str] = {"length": "m", "time": "s", "mass": "kg", "speed": "m/s",
                      "acceleration": "m/s²", "force": "N", "energy": "J", "power": "W",
                      "voltage": "V", "current": "A", "resistance": "Ω", "momentum": "kg·m/s"}

_TERM_RE = re.compile(r"^([^\W\d_]+)(?:\^?([+-]?\d))?$")
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻", "0123456789+-")
_LATEX_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^\W\d_\\][^{}]*)\}\s*\{([^{}]*)\}")
_LATEX_WRAP_RE = re.compile(r"\\(?:text|mathrm|textrm|rm|mbox|operatorname|mathit)\s*\{([^{}]*)\}")


def tidy_unit_text(text: str) -> str:
    """LaTeX and typography reduced to the plain grammar: "\\text{kg}\\cdot\\text{m/s}" ->
    "kg·m/s", "m·s⁻¹" -> "m·s^-1", "s^{-2}" -> "s^-2", "kΩ" (U+2126) -> "kΩ"."""
    s = re.sub(r"\^\s*\{([^{}]*)\}", r"^\1", text)  # s^{-1} -> s^-1
    for _ in range(2):
        s = _LATEX_WRAP_RE.sub(r"\1", s)
    s = _LATEX_FRAC_RE.sub(r"\1/(\2)", s)  # \frac{m}{s} -> m/(s)
    s = re.sub(r"\\[dt]?frac\s*\{\s*([+-]?[\d.]+)\s*\}\s*\{\s*([\d.]+)\s*\}", r"\1/\2", s)  # \frac{3}{4} -> 3/4
    s = re.sub(r"\\mu\s+(?=[^\W\d_]|\\Omega)", "μ", s)  # "\mu A" is μA (a lone μ is no unit)
    for old, new in (("\\cdot", "·"), ("\\times", "·"), ("\\Omega", "Ω"), ("\\omega", "Ω"),
                     ("\\mu", "μ"), ("\\,", " "), ("\\;", " "), ("\\:", " "), ("\\!", ""), ("\\ ", " "),
                     ("$", ""), ("{", ""), ("}", ""), ("~", " "), ("**", "^"), ("\u2126", "Ω"), ("\u00b5", "μ"),
                     ("−", "-"), ("⋅", "·"), ("∙", "·"), ("•", "·"), ("×", "·"), ("*", "·")):
        s = s.replace(old, new)
    s = re.sub(r"[⁺⁻]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+", lambda m: "^" + m.group(0).translate(_SUPERSCRIPTS), s)
    return re.sub(r"\s*\^\s*", "^", s)


def _tokens(text: str) -> list[str] | None:
    s = tidy_unit_text(text).strip().strip(" .,;:`'\"")
    if not s or len(s) > 60:
        return None
    s = _PREFIX_APART_RE.sub(r"\1", s)  # kilo ohms
    s = re.sub(r"(?<=[^\W\d_])[.\-](?=[^\W\d_])", "·", s)  # kg.m/s, newton-seconds
    s = re.sub(r"[()\[\]]", " ", s).replace("/", " / ").replace("·", " ")
    return ["/" if t.lower() == "per" else t for t in s.split()]


def _name(word: str) -> tuple[str, Unit] | None:
    """A spoken unit name ("kilometres", "Milliamps", "kohm", "msec") as (symbol, unit)."""
    low = word.lower()

    def singular(w: str) -> tuple[str, ...]:
        return (w, w[:-1]) if w.endswith("s") else (w,)

    for w in singular(low):
        if w in _NAMES:
            return _NAMES[w], _SYMBOLS[_NAMES[w]]
    splits = [(p, low[len(w):]) for w, p in _WORD_PREFIXES.items() if low.startswith(w)]
    if len(word) > 3 and word[0] in _PREFIXES:  # a prefix symbol on a name: "kohm", "MOhm"
        splits.append((word[0], low[1:]))
    for prefix, rest in splits:
        for r in singular(rest):
            if _NAMES.get(r) in _BASE:
                sym = prefix + _NAMES[r]
                return sym, _SYMBOLS[sym]
    return None


def _term(body: str, exp: int, alone: bool) -> list[tuple[str, int, Unit]] | None:
    """One token as [(symbol, exponent, unit)] (a glued token gives several)."""
    if exp < 0 and body in _GLUED_PER_SECOND:
        head = _parse(_GLUED_PER_SECOND[body])
        return None if head is None else [*head[1], ("s", exp, _SYMBOLS["s"])]
    if body in _SYMBOLS:
        return [(body, exp, _SYMBOLS[body])]
    glued = _GLUED.get(body) or _GLUED_ANYCASE.get(body.lower())
    if glued is not None:
        inner = _parse(glued)
        if inner is None:
            return None
        *head, (s, e, u) = inner[1]
        if exp != 1 and any(e2 < 0 for _, e2, _ in inner[1]):  # "kph^2": (km/h)² or km/h²? not read
            return None
        return [*head, (s, e * exp, u)]  # the power binds to the unit it follows: "kgm^2" is kg·m²
    named = _name(body)
    if named is not None:
        return [(named[0], exp, named[1])]
    sym = _SYMBOLS_ANYCASE.get(body.lower())
    if sym is not None and (len(body) > 1 or alone):  # a lone "a" in a sentence is no ampere
        return [(sym, exp, _SYMBOLS[sym])]
    return None


@lru_cache(maxsize=4096)
def _parse(text: str) -> tuple[Unit, tuple[tuple[str, int, Unit], ...]] | None:
    tokens = _tokens(text)
    if not tokens:
        return None
    terms: list[tuple[str, int, Unit]] = []
    sign, power, pending = 1, 1, False  # pending: a "/" that still needs its term
    for tok in tokens:
        low = tok.lower()
        if tok == "/":
            if pending:  # "m//s", "m per / s"
                return None
            sign, pending = -1, True
            continue
        if low in ("square", "sq", "cubic"):
            power = 3 if low == "cubic" else 2
            continue
        if low in ("squared", "cubed"):
            if not terms or pending:
                return None
            s, e, u = terms[-1]
            terms[-1] = (s, e * (3 if low == "cubed" else 2), u)
            continue
        m = _TERM_RE.match(tok)
        got = _term(m.group(1), int(m.group(2) or 1), len(tokens) == 1) if m else None
        if got is None:
            return None
        terms.extend((s, e * power * sign, u) for s, e, u in got)
        power, pending = 1, False
    if pending or power != 1 or not terms or any(abs(e) > 4 for _, e, _ in terms):
        return None
    dims = [0, 0, 0, 0]
    scale = 1.0
    for _, e, u in terms:
        dims = [d + e * x for d, x in zip(dims, u.dims, strict=True)]
        scale *= u.scale**e
    return Unit((dims[0], dims[1], dims[2], dims[3]), scale), tuple(terms)


def parse_unit(text: str) -> Unit | None:
    """The unit `text` names, or None if the grammar above cannot read it."""
    if not isinstance(text, str):
        return None
    got = _parse(text)
    return None if got is None else got[0]


def _compose(terms: tuple[tuple[str, int, Unit], ...]) -> str:
    def power(s: str, e: int) -> str:
        return s if e == 1 else f"{s}^{e}"

    num = [power(s, e) for s, e, _ in terms if e > 0]
    den = [power(s, -e) for s, e, _ in terms if e < 0]
    if not num:
        return "·".join(power(s, e) for s, e, _ in terms)
    return "·".join(num) + ("/" + "·".join(den) if den else "")


def _same(a: Unit, b: Unit) -> bool:
    return a.dims == b.dims and math.isclose(a.scale, b.scale, rel_tol=1e-9)


def canonical_unit(text: str) -> str | None:
    """A symbol for the unit `text` names: the table symbol when it is one of the table's units
    ("meters per second" and "m s^-1" -> "m/s", "N s" -> "kg·m/s"), else the symbols read, joined
    ("354 mW" -> "mW", "g cm/s" -> "g·cm/s"); None if it cannot be read."""
    got = _parse(text) if isinstance(text, str) else None
    if got is None:
        return None
    unit, terms = got
    return next((sym for sym, u in _TABLE_UNITS.items() if _same(u, unit)), None) or _compose(terms)


def _dims_text(dims: Dims) -> str:
    parts = [(b, e) for b, e in zip(("m", "kg", "s", "A"), dims, strict=True) if e]
    return "·".join(b if e == 1 else f"{b}^{e}" for b, e in parts) or "no dimension"


def dimension_name(unit: str) -> str:
    """What `unit` measures ("length", "speed", or its SI base units, e.g. "m^2·s^-1")."""
    u = parse_unit(unit)
    if u is None:
        return "an unknown quantity"
    return _DIMENSIONS.get(u.dims) or _dims_text(u.dims)


def convert(value: float, from_unit: str, to_unit: str) -> float | None:
    """`value` in `from_unit` expressed in `to_unit`; None if either is unreadable or the
    dimensions differ."""
    a, b = parse_unit(from_unit), parse_unit(to_unit)
    if a is None or b is None or a.dims != b.dims:
        return None
    return value * a.scale / b.scale


def _unit_goes_on(last: str, nxt: str) -> bool:
    """Whether the word after a unit's `last` word is still part of the unit ("m per s", "m /s",
    "m squared"): a reading must not stop between them."""
    return (last.lower() in ("per", "/", "square", "sq", "cubic") or last.endswith("/")
            or nxt.lower() in ("per", "squared", "cubed") or nxt.startswith(("/", "^", "·")))


def case_readings(raw: str) -> tuple[str, ...]:
    """The symbols an unread unit whose case decides its meaning could be ("mj": MJ, mJ), also
    when words follow it ("mj approx"), as `_read_unit` reads a unit's leading words; () if none."""
    words = tidy_unit_text(raw).strip(" .,;:").split()
    if not words:
        return ()
    whole = CASE_AMBIGUOUS.get(" ".join(words).lower())
    if whole or len(words) == 1:
        return whole or ()
    if _unit_goes_on(words[0], words[1]):
        return ()  # "mj per s": the words after it are part of the unit
    return CASE_AMBIGUOUS.get(words[0].strip(" .,;:").lower(), ())


def case_hint(raw: str) -> str:
    """For an unread unit whose case decides its meaning ("mj"), which symbols it could be."""
    options = case_readings(raw)
    if not options:
        return ""
    return f" Unit symbols are case-sensitive: {' and '.join(options)} are different units."


def _known(sym: str) -> Unit:
    unit = parse_unit(sym)
    if unit is None:
        raise AssertionError(f"units: the table's own symbol {sym!r} does not parse")
    return unit


_TABLE_UNITS = {sym: _known(sym) for sym in _TABLE}
_DIMENSIONS: dict[Dims, str] = {_known(sym).dims: dim for dim, sym in SI.items()}
#: symbol -> (dimension, factor to the SI unit of that dimension), for the units the generator uses.
UNITS: dict[str, tuple[str, float]] = {sym: (dimension_name(sym), u.scale) for sym, u in _TABLE_UNITS.items()}

_QUANTITY_RE = re.compile(
    r"([+\-−]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:[eE][+-]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"
    r"(?:\s*(?:×|x|\*|·|\\times|\\cdot)\s*10\s*(?:\^|\*\*)\s*\{?[+-]?\d+\}?)?)"
    r"\s*([^\d\s=,;](?:[^\d=,;]|(?<=[\^\-+A-Za-z])\d){0,45})?")


#: A unit restated in brackets after itself: "J (joules)", "m/s [meters per second]".
_RESTATED_RE = re.compile(r"(.*[^\s/(\[])\s*[(\[]([^()\[\]]+)[)\]]")


def _unit_text(text: str) -> str | None:
    """`canonical_unit(text)`, a unit restated in brackets read once ("J (joules)" is J, not J²)."""
    m = _RESTATED_RE.fullmatch(text.strip())
    if m:
        a, b = parse_unit(m.group(1)), parse_unit(m.group(2))
        if a is not None and b is not None and _same(a, b):
            return canonical_unit(m.group(1))
    return canonical_unit(text)


def _read_unit(raw: str) -> str | None:
    """The unit of `raw`, or of its longest leading words that end cleanly ("m/s approx" -> m/s;
    "meters per secnd" -> None, never "meters")."""
    unit = _unit_text(raw)
    if unit is not None:
        return unit
    words = raw.split()
    for k in range(len(words) - 1, 0, -1):
        head = words[:k]
        if _unit_goes_on(head[-1], words[k]):
            continue  # the words dropped would be part of the unit
        unit = _unit_text(" ".join(head))
        if unit is not None:
            return unit
    return None


#: What between a bare number and a later one with a unit makes them alternatives or a range.
_HEDGE_RE = re.compile(r"\b(?:or|and|to|between)\b|[,;/\-–—±]")


def parse_quantity(text: str) -> tuple[float | None, str | None, str]:
    """(value, unit symbol or None, raw unit text) of an answer like "12.5 m/s" or "v = 3 kJ".

    The text after the last "=" is read. With several numbers, the first one followed by a known
    unit wins; a lone number may carry no unit. Value None means no number could be read, or the
    answer hedges: two values with units that differ ("250 m or 300 m"), or a bare number offered
    beside one with a unit ("100 or 679.1 J", "between 1 and 679.1 J", "3 1/2 m": 3.5 m or 0.5 m?).
    Digits grouped by spaces are one number ("1 200 J", "1 234.5 J").
    """
    if not isinstance(text, str) or not text.strip():
        return None, None, ""
    s = text.rsplit("=", 1)[-1].strip()[:400]
    s = re.sub(r"\\[()\[\]]", " ", s)  # LaTeX math delimiters \( \) \[ \]: a trailing "\)" hid the unit
    s = re.sub(r"(\*\*|__)(.+?)\1", r"\2", s)  # markdown bold, before "**" means a power
    s = re.sub(r"(?<=\d)(?:\\,|\u2009|\u202f)(?=\d{3}(?!\d))", "", s)  # 1\,200 thousands
    s = re.sub(r"(?<![\d.,])\d{1,3}(?: \d{3})+(?!,?\d)", lambda m: m.group(0).replace(" ", ""), s)  # 1 200, 1 234.5
    for junk in ("$", "\\,", "\\ ", "\\!", "~"):
        s = s.replace(junk, " " if junk != "$" else "")
    whole = parse_number(s.strip())
    if whole is not None:
        return whole, None, ""
    s = tidy_unit_text(s).strip()
    readings = []
    for m in _QUANTITY_RE.finditer(s):
        value = parse_number(m.group(1).replace(" ", ""))
        if value is None:
            continue
        raw = (m.group(2) or "").strip()
        readings.append((value, _read_unit(raw) if raw else None, raw, m.start(), m.end(1)))
    first = next((r for r in readings if r[1] is not None), None)
    if first is not None and any(r[1] is None and (_HEDGE_RE.search(s[r[4]:first[3]]) or not s[r[4]:first[3]].strip())
                                 for r in readings if r[4] <= first[3]):
        return None, None, ""  # "100 or 679.1 J": two answers, the unit written once; "3 1/2 m": 3.5 or 0.5?
    readings = [r[:3] for r in readings]
    with_unit = [r for r in readings if r[1] is not None]
    if with_unit:
        # "12 m/s (43.2 km/h)" restates one value; "250 m or 300 m" hedges between two: refuse.
        si = [v * _known(u).scale for v, u, _ in with_unit]
        if any(abs(x - si[0]) > 0.01 * max(abs(x), abs(si[0])) for x in si[1:]):
            return None, None, ""
        return with_unit[0]
    if len(readings) == 1:
        return readings[0]
    return None, None, ""  # no number, or several numbers and none with a unit: ambiguous
