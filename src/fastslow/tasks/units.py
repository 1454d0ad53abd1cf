"""A small unit table for the physics task: symbols, spoken aliases, dimensions, SI factors.

Only what the physics generator asks about is covered; an unknown unit is reported back (the
number is then compared as if it were in the requested unit, and feedback says so).
"""

from __future__ import annotations

import re

from fastslow.tasks.scoring import parse_number

# symbol -> (dimension, factor to the SI unit of that dimension)
UNITS: dict[str, tuple[str, float]] = {
    "m": ("length", 1.0), "km": ("length", 1000.0), "cm": ("length", 0.01), "mm": ("length", 0.001),
    "s": ("time", 1.0), "min": ("time", 60.0), "h": ("time", 3600.0), "ms": ("time", 0.001),
    "kg": ("mass", 1.0), "g": ("mass", 0.001), "t": ("mass", 1000.0),
    "m/s": ("speed", 1.0), "km/h": ("speed", 1 / 3.6),
    "m/s²": ("acceleration", 1.0),
    "N": ("force", 1.0), "kN": ("force", 1000.0),
    "J": ("energy", 1.0), "kJ": ("energy", 1000.0), "MJ": ("energy", 1e6),
    "W": ("power", 1.0), "kW": ("power", 1000.0),
    "V": ("voltage", 1.0), "mV": ("voltage", 0.001), "kV": ("voltage", 1000.0),
    "A": ("current", 1.0), "mA": ("current", 0.001),
    "Ω": ("resistance", 1.0), "kΩ": ("resistance", 1000.0),
    "kg·m/s": ("momentum", 1.0),
}
#: The SI unit of each dimension (what formulas compute in).
SI: dict[str, str] = {"length": "m", "time": "s", "mass": "kg", "speed": "m/s",
                      "acceleration": "m/s²", "force": "N", "energy": "J", "power": "W",
                      "voltage": "V", "current": "A", "resistance": "Ω", "momentum": "kg·m/s"}
#: Spoken names and spellings (matched case-insensitively, after squeezing spaces and dots).
_ALIASES = {
    "meter": "m", "meters": "m", "metre": "m", "metres": "m", "kilometer": "km", "kilometers": "km",
    "kilometre": "km", "kilometres": "km", "centimeters": "cm", "centimetres": "cm", "millimeters": "mm",
    "sec": "s", "secs": "s", "second": "s", "seconds": "s", "mins": "min", "minute": "min",
    "minutes": "min", "hr": "h", "hrs": "h", "hour": "h", "hours": "h", "milliseconds": "ms",
    "kgs": "kg", "kilogram": "kg", "kilograms": "kg", "gram": "g", "grams": "g", "tonnes": "t",
    "m/sec": "m/s", "mps": "m/s", "meterspersecond": "m/s", "metrespersecond": "m/s",
    "kmh": "km/h", "kph": "km/h", "km/hr": "km/h", "kilometersperhour": "km/h",
    "kilometresperhour": "km/h", "m/s2": "m/s²", "m/s^2": "m/s²", "m/s**2": "m/s²", "ms-2": "m/s²",
    "ms^-2": "m/s²", "newton": "N", "newtons": "N", "n": "N", "kn": "kN", "kilonewtons": "kN",
    "joule": "J", "joules": "J", "j": "J", "kj": "kJ", "kilojoules": "kJ", "mj": "MJ",
    "megajoules": "MJ", "watt": "W", "watts": "W", "w": "W", "kw": "kW", "kilowatts": "kW",
    "volt": "V", "volts": "V", "v": "V", "mv": "mV", "millivolts": "mV", "kv": "kV",
    "kilovolts": "kV", "amp": "A", "amps": "A", "ampere": "A", "amperes": "A", "a": "A",
    "ma": "mA", "milliamps": "mA", "milliamperes": "mA", "ohm": "Ω", "ohms": "Ω", "omega": "Ω",
    "\\omega": "Ω", "kohm": "kΩ", "kohms": "kΩ", "kiloohms": "kΩ", "k\\omega": "kΩ",
    "kgm/s": "kg·m/s", "kg*m/s": "kg·m/s", "kg.m/s": "kg·m/s", "n·s": "kg·m/s",
    "n*s": "kg·m/s", "kgms-1": "kg·m/s", "ω": "Ω", "kω": "kΩ",
}


def canonical_unit(text: str) -> str | None:
    """The table symbol for a unit as a model may write it ("km/h", "kph", "ohms"), else None."""
    if not isinstance(text, str):
        return None
    s = text.strip()
    s = re.sub(r"\\(?:text|mathrm|rm)\s*\{([^{}]*)\}", r"\1", s)  # \text{m/s} -> m/s
    s = s.replace("\\,", "").replace("\\ ", "").replace("$", "").replace("{", "").replace("}", "")
    s = s.strip(" .,;:()[]*`")
    if not s or len(s) > 40:
        return None
    s = s.replace("⋅", "·").replace("²", "^2").replace(" per ", "/")
    squeezed = re.sub(r"\s+", "", s)
    if squeezed in UNITS:
        return squeezed
    low = squeezed.lower()
    if low in _ALIASES:
        return _ALIASES[low]
    return _ALIASES.get(low.replace("·", "").replace(".", ""))


def convert(value: float, from_unit: str, to_unit: str) -> float | None:
    """`value` in `from_unit` expressed in `to_unit`; None if the dimensions differ."""
    a, b = UNITS.get(from_unit), UNITS.get(to_unit)
    if a is None or b is None or a[0] != b[0]:
        return None
    return value * a[1] / b[1]


_QUANTITY_RE = re.compile(
    r"([+\-−]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:[eE][+-]?\d+)?"
    r"(?:\s*(?:×|x|\*|·|\\times|\\cdot)\s*10\s*(?:\^|\*\*)\s*\{?[+-]?\d+\}?)?)"
    r"\s*([^\d\s=,;](?:[^\d=,;]|(?<=[\^\-])\d){0,30})?")


def parse_quantity(text: str) -> tuple[float | None, str | None, str]:
    """(value, unit symbol or None, raw unit text) of an answer like "12.5 m/s" or "v = 3 kJ".

    The text after the last "=" is read. With several numbers, the first one followed by a known
    unit wins; a lone number may carry no unit. Value None means no number could be read.
    """
    if not isinstance(text, str) or not text.strip():
        return None, None, ""
    s = text.rsplit("=", 1)[-1].strip()[:400]
    for junk in ("$", "\\,", "\\ ", "\\!", "~"):
        s = s.replace(junk, " " if junk != "$" else "")
    s = re.sub(r"(?<=[A-Za-z])\s*(?:\^\{?2\}?|\*\*\s*2)", "²", s).strip()  # m/s^2 -> m/s²
    whole = parse_number(s)
    if whole is not None:
        return whole, None, ""
    matches = list(_QUANTITY_RE.finditer(s))
    readings = []
    for m in matches:
        value = parse_number(m.group(1).replace(" ", ""))
        if value is None:
            continue
        raw = (m.group(2) or "").strip()
        unit = canonical_unit(raw) if raw else None
        if unit is None and raw:  # "12 m/s approx": try the first word(s) only
            unit = canonical_unit(raw.split()[0])
        readings.append((value, unit, raw))
    with_unit = [r for r in readings if r[1] is not None]
    if with_unit:
        # "12 m/s (43.2 km/h)" restates one value; "250 m or 300 m" hedges between two: refuse.
        si = [v * UNITS[u][1] for v, u, _ in with_unit]
        if any(abs(x - si[0]) > 0.01 * max(abs(x), abs(si[0])) for x in si[1:]):
            return None, None, ""
        return with_unit[0]
    if len(readings) == 1:
        return readings[0]
    return None, None, ""  # no number, or several numbers and none with a unit: ambiguous
