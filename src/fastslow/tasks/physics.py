"""Physics word problems with numeric answers and units, generated offline.

Topics: kinematics, free fall, energy and power, Ohm's law and simple circuits, momentum and
collisions, forces. Given quantities may be stated in non-SI units (km/h, g, kΩ, min…), and hard
problems chain two or three formulas and may ask for the answer in a non-SI unit (kJ, mA, km/h).

Scoring: the answer's number is compared with relative tolerance (0.75% by default: an answer to
the 3 significant figures asked for is within 0.5%, and g = 10 for the stated 9.8 m/s² is 1-2% off,
which 2% let through on every free-fall problem and on a fifth to a third of the others). A unit is
optional; when given and readable (`units`: symbols with SI prefixes, names, "per", products and
exponents, so "0.25 km", "250 metres" and "12.5 m s^-1" all read) it is converted to the requested
unit (so "0.25 km" is right for "250 m"), and a unit of the wrong dimension scores 0. Feedback
names the expected value and unit, the formula with the SI values, and how far off (or unreadable)
the answer was.

Splits: a problem's identity is its generator and its givens in SI (`problem_identity`), so "a
1.7 kΩ heater" and "a 1700 Ω heater" at the same voltage, or the same question asked in J and in
kJ, are one problem and always fall in the same split.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from fastslow.tasks.base import ANSWER_FORMAT, Judgement, Problem, extract_answer
from fastslow.tasks.generated import Candidate, GeneratedTask
from fastslow.tasks.scoring import relative_error
from fastslow.tasks.units import (
    SI,
    UNITS,
    case_hint,
    case_readings,
    convert,
    dimension_name,
    parse_quantity,
)

G = 9.8  # m/s², stated in every prompt that needs it
#: Non-SI units a hard problem may ask its answer in.
_ASK_ALT = {"energy": ("kJ",), "power": ("kW",), "speed": ("km/h",), "current": ("mA",),
            "resistance": ("kΩ",), "length": ("km", "cm"), "force": ("kN",), "time": ("min", "ms")}


@dataclass
class Spec:
    """A generated question before its answer unit is chosen."""

    topic: str
    text: str
    value: float  # SI
    dim: str
    formula: str
    values: dict[str, str] = field(default_factory=dict)  # symbol -> SI value with unit
    uses_g: bool = False


def sig(x: float, n: int = 4) -> str:
    """`x` to `n` significant digits, without exponent notation for everyday magnitudes."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    r = float(f"{x:.{n}g}")
    if r == int(r) and abs(r) < 1e15:
        return str(int(r))
    if 1e-4 <= abs(r) < 1e15:
        return f"{r:.10f}".rstrip("0").rstrip(".")
    return f"{r:.{n - 1}e}"


class _Given:
    """Draws given quantities; with `conv`, some are shown in a non-SI unit."""

    def __init__(self, rng: random.Random, conv: float) -> None:
        self.rng, self.conv = rng, conv

    def __call__(self, dim: str, lo: float, hi: float, alt: str | None = None,
                 digits: int = 2) -> tuple[float, str]:
        """(SI value, display text) of a quantity drawn from [lo, hi] (SI)."""
        unit = alt if alt is not None and self.rng.random() < self.conv else SI[dim]
        x = self.rng.uniform(lo, hi) / UNITS[unit][1]
        if not 0.01 <= x < 10_000:  # "1500000 g" reads badly: keep such values in SI
            unit, x = SI[dim], x * UNITS[unit][1]
        x = float(sig(x, digits))
        return x * UNITS[unit][1], f"{sig(x)} {unit}"


def _si(x: float, dim: str) -> str:
    return f"{sig(x)} {SI[dim]}"


# Each topic: (rng-driven given-drawer) -> Spec. Values are computed from the *displayed*
# (rounded) givens, so the stated numbers determine the answer exactly.
def _final_speed(q: _Given) -> Spec:
    v0, v0s = q("speed", 0, 15, "km/h")
    a, as_ = q("acceleration", 0.5, 4)
    t, ts = q("time", 2, 20)
    return Spec("kinematics", f"A cyclist moving at {v0s} accelerates uniformly at {as_} for {ts}. "
                "What is her final speed?", v0 + a * t, "speed", "v = v0 + a·t",
                {"v0": _si(v0, "speed"), "a": _si(a, "acceleration"), "t": _si(t, "time")})


def _distance(q: _Given) -> Spec:
    v0, v0s = q("speed", 0, 20, "km/h")
    a, as_ = q("acceleration", 0.5, 3)
    t, ts = q("time", 3, 30, "min" if q.rng.random() < 0.2 else None)
    return Spec("kinematics", f"A train moving at {v0s} accelerates uniformly at {as_} for {ts}. "
                "How far does it travel in that time?", v0 * t + 0.5 * a * t * t, "length",
                "s = v0·t + ½·a·t²", {"v0": _si(v0, "speed"), "a": _si(a, "acceleration"), "t": _si(t, "time")})


def _stopping(q: _Given) -> Spec:
    v, vs = q("speed", 8, 35, "km/h")
    a, as_ = q("acceleration", 2, 8)
    return Spec("kinematics", f"A car travelling at {vs} brakes with a constant deceleration of {as_}. "
                "What is its stopping distance?", v * v / (2 * a), "length", "d = v²/(2·a)",
                {"v": _si(v, "speed"), "a": _si(a, "acceleration")})


def _avg_speed(q: _Given) -> Spec:
    d, ds = q("length", 100, 5000, "km")
    t, ts = q("time", 20, 900, "min")
    return Spec("kinematics", f"A runner covers {ds} in {ts}. What is the average speed?", d / t,
                "speed", "v = d/t", {"d": _si(d, "length"), "t": _si(t, "time")})


def _fall_time(q: _Given) -> Spec:
    h, hs = q("length", 2, 120)
    return Spec("free fall", f"A stone is dropped from rest from a height of {hs}. Ignoring air "
                "resistance, how long does it take to reach the ground?", math.sqrt(2 * h / G), "time",
                "t = √(2·h/g)", {"h": _si(h, "length")}, uses_g=True)


def _fall_speed(q: _Given) -> Spec:
    h, hs = q("length", 2, 120)
    return Spec("free fall", f"A ball is dropped from rest from a height of {hs}. Ignoring air "
                "resistance, how fast is it moving just before it hits the ground?",
                math.sqrt(2 * G * h), "speed", "v = √(2·g·h)", {"h": _si(h, "length")}, uses_g=True)


def _kinetic(q: _Given) -> Spec:
    m, ms = q("mass", 0.2, 1500, "g" if q.rng.random() < 0.3 else None)
    v, vs = q("speed", 1, 30, "km/h")
    return Spec("energy", f"An object of mass {ms} moves at {vs}. What is its kinetic energy?",
                0.5 * m * v * v, "energy", "E = ½·m·v²", {"m": _si(m, "mass"), "v": _si(v, "speed")})


def _potential(q: _Given) -> Spec:
    m, ms = q("mass", 0.5, 80)
    h, hs = q("length", 1, 50, "cm" if q.rng.random() < 0.2 else None)
    return Spec("energy", f"A crate of mass {ms} is lifted {hs} straight up. By how much does its "
                "gravitational potential energy increase?", m * G * h, "energy", "E = m·g·h",
                {"m": _si(m, "mass"), "h": _si(h, "length")}, uses_g=True)


def _lift_power(q: _Given) -> Spec:
    m, ms = q("mass", 20, 800)
    h, hs = q("length", 2, 40)
    t, ts = q("time", 4, 120, "min" if q.rng.random() < 0.2 else None)
    return Spec("energy", f"A motor lifts a {ms} load {hs} at constant speed in {ts}. What is its "
                "average power output?", m * G * h / t, "power", "P = m·g·h/t",
                {"m": _si(m, "mass"), "h": _si(h, "length"), "t": _si(t, "time")}, uses_g=True)


def _ohm(q: _Given) -> Spec:
    v, vs = q("voltage", 1.5, 240)
    r, rs = q("resistance", 10, 5000, "kΩ")
    return Spec("circuits", f"A {vs} source is connected across a {rs} resistor. What current flows?",
                v / r, "current", "I = V/R", {"V": _si(v, "voltage"), "R": _si(r, "resistance")})


def _series(q: _Given) -> Spec:
    v, vs = q("voltage", 3, 48)
    r1, r1s = q("resistance", 10, 900, "kΩ")
    r2, r2s = q("resistance", 10, 900)
    return Spec("circuits", f"Resistors of {r1s} and {r2s} are connected in series to a {vs} battery. "
                "What current flows through the circuit?", v / (r1 + r2), "current", "I = V/(R1 + R2)",
                {"V": _si(v, "voltage"), "R1": _si(r1, "resistance"), "R2": _si(r2, "resistance")})


def _parallel(q: _Given) -> Spec:
    r1, r1s = q("resistance", 10, 900, "kΩ")
    r2, r2s = q("resistance", 10, 900)
    return Spec("circuits", f"Resistors of {r1s} and {r2s} are connected in parallel. What is their "
                "equivalent resistance?", r1 * r2 / (r1 + r2), "resistance", "R = R1·R2/(R1 + R2)",
                {"R1": _si(r1, "resistance"), "R2": _si(r2, "resistance")})


def _power_dissipated(q: _Given) -> Spec:
    v, vs = q("voltage", 3, 240)
    r, rs = q("resistance", 5, 2000, "kΩ")
    return Spec("circuits", f"A {rs} heater element is connected across {vs}. What power does it "
                "dissipate?", v * v / r, "power", "P = V²/R", {"V": _si(v, "voltage"), "R": _si(r, "resistance")})


def _momentum(q: _Given) -> Spec:
    m, ms = q("mass", 0.05, 2000, "g" if q.rng.random() < 0.3 else None)
    v, vs = q("speed", 1, 40, "km/h")
    return Spec("momentum", f"What is the momentum of a {ms} object moving at {vs}?", m * v,
                "momentum", "p = m·v", {"m": _si(m, "mass"), "v": _si(v, "speed")})


def _collision(q: _Given) -> Spec:
    m1, m1s = q("mass", 0.5, 1500)
    v1, v1s = q("speed", 1, 25, "km/h")
    m2, m2s = q("mass", 0.5, 1500)
    return Spec("momentum", f"A {m1s} cart moving at {v1s} collides with a {m2s} cart at rest, and "
                "they stick together. What is their speed just after the collision?",
                m1 * v1 / (m1 + m2), "speed", "v = m1·v1/(m1 + m2)",
                {"m1": _si(m1, "mass"), "v1": _si(v1, "speed"), "m2": _si(m2, "mass")})


def _force(q: _Given) -> Spec:
    m, ms = q("mass", 0.5, 2000)
    a, as_ = q("acceleration", 0.2, 6)
    return Spec("forces", f"What net force gives a {ms} body an acceleration of {as_}?", m * a,
                "force", "F = m·a", {"m": _si(m, "mass"), "a": _si(a, "acceleration")})


# --- hard: two or three formulas chained ---------------------------------------------------
def _braking_force(q: _Given) -> Spec:
    m, ms = q("mass", 600, 2500)
    v, vs = q("speed", 10, 35, "km/h")
    d, ds = q("length", 15, 120)
    return Spec("forces", f"A {ms} car travelling at {vs} brakes to a stop over {ds}. What is the "
                "magnitude of the average braking force?", m * v * v / (2 * d), "force",
                "a = v²/(2·d), F = m·a = m·v²/(2·d)",
                {"m": _si(m, "mass"), "v": _si(v, "speed"), "d": _si(d, "length")})


def _series_power(q: _Given) -> Spec:
    v, vs = q("voltage", 6, 48)
    r1, r1s = q("resistance", 10, 900, "kΩ")
    r2, r2s = q("resistance", 10, 900, "kΩ")
    return Spec("circuits", f"A {vs} battery drives resistors R1 = {r1s} and R2 = {r2s} in series. "
                "What power is dissipated in R2?", (v / (r1 + r2)) ** 2 * r2, "power",
                "I = V/(R1 + R2), P2 = I²·R2",
                {"V": _si(v, "voltage"), "R1": _si(r1, "resistance"), "R2": _si(r2, "resistance")})


def _fall_momentum(q: _Given) -> Spec:
    m, ms = q("mass", 0.1, 20, "g")
    h, hs = q("length", 1, 60, "cm")
    return Spec("momentum", f"A {ms} ball is dropped from rest from {hs}. Ignoring air resistance, "
                "what is its momentum just before it lands?", m * math.sqrt(2 * G * h), "momentum",
                "v = √(2·g·h), p = m·v", {"m": _si(m, "mass"), "h": _si(h, "length")}, uses_g=True)


def _collision_loss(q: _Given) -> Spec:
    m1, m1s = q("mass", 0.5, 1500, "g")
    v1, v1s = q("speed", 1, 25, "km/h")
    m2, m2s = q("mass", 0.5, 1500, "g")
    v = m1 * v1 / (m1 + m2)
    return Spec("momentum", f"A {m1s} cart moving at {v1s} hits a {m2s} cart at rest and they stick "
                "together. How much kinetic energy is lost in the collision?",
                0.5 * m1 * v1 * v1 - 0.5 * (m1 + m2) * v * v, "energy",
                "v = m1·v1/(m1 + m2), ΔE = ½·m1·v1² − ½·(m1 + m2)·v²",
                {"m1": _si(m1, "mass"), "v1": _si(v1, "speed"), "m2": _si(m2, "mass")})


def _slide(q: _Given) -> Spec:
    h, hs = q("length", 0.5, 20, "cm")
    mu = float(sig(q.rng.uniform(0.1, 0.6), 2))
    return Spec("energy", f"A block slides from rest down a frictionless ramp of height {hs}, then "
                f"along a level floor with friction coefficient {sig(mu)}. How far along the floor "
                "does it slide before stopping?", h / mu, "length", "m·g·h = μ·m·g·d, so d = h/μ",
                {"h": _si(h, "length"), "μ": sig(mu)})


def _horizontal_launch(q: _Given) -> Spec:
    h, hs = q("length", 1, 80)
    v, vs = q("speed", 2, 30, "km/h")
    return Spec("kinematics", f"A ball is thrown horizontally at {vs} from the top of a {hs} high "
                "wall. Ignoring air resistance, how far from the wall does it land?",
                v * math.sqrt(2 * h / G), "length", "t = √(2·h/g), x = v·t",
                {"v": _si(v, "speed"), "h": _si(h, "length")}, uses_g=True)


_EASY: tuple[Callable[[_Given], Spec], ...] = (_final_speed, _ohm, _momentum, _kinetic, _potential,
                                               _force, _avg_speed)
_DEFAULT = _EASY + (_distance, _stopping, _fall_time, _fall_speed, _series, _parallel,
                    _power_dissipated, _collision, _lift_power)
_HARD = (_braking_force, _series_power, _fall_momentum, _collision_loss, _slide, _horizontal_launch)


#: Givens a generator's answer is symmetric in: "resistors of 410 Ω and 570 Ω" in series or in
#: parallel is the problem of "570 Ω and 410 Ω" (`problem_identity` orders their values).
INTERCHANGEABLE: dict[str, tuple[str, ...]] = {"series": ("R1", "R2"), "parallel": ("R1", "R2")}


def problem_identity(generator: str, values: dict[str, str]) -> str:
    """What makes two physics problems the same, however worded: the generator (one template
    each) and its givens in SI, each already rounded to 4 significant digits ("R = 1700 Ω"), the
    givens it is symmetric in (`INTERCHANGEABLE`) in one order."""
    values = dict(values)
    names = INTERCHANGEABLE.get(generator, ())
    for name, value in zip(names, sorted(values[n] for n in names), strict=True):
        values[name] = value
    return "physics|" + generator + "|" + "|".join(f"{k}={v}" for k, v in sorted(values.items()))


class PhysicsTask(GeneratedTask):
    """Numeric physics word problems with units, scored with a relative tolerance."""

    family = "physics"
    key_names_one_problem = True  # its key is the problem's identity (`problem_identity`)

    def __init__(self, name: str | None = None, difficulty: str = "default",
                 rel_tol: float = 0.0075) -> None:
        super().__init__(name, difficulty)
        if not 0 < rel_tol < 1:
            raise ValueError(f"physics: rel_tol: expected a number in (0, 1), got {rel_tol!r}")
        self.rel_tol = rel_tol

    def candidate(self, rng: random.Random, index: int, split: str, seed: int,
                  attempt: int) -> Candidate | None:
        d = self.difficulty
        topic = rng.choice(_EASY if d == "easy" else _DEFAULT if d == "default" or rng.random() < 0.3 else _HARD)
        spec = topic(_Given(rng, {"easy": 0.0, "default": 0.3, "hard": 0.6}[d]))
        unit = SI[spec.dim]
        if d == "hard" and spec.dim in _ASK_ALT and rng.random() < 0.5:
            alt = rng.choice(_ASK_ALT[spec.dim])
            if 1 <= abs(convert(spec.value, unit, alt) or 0) < 1000:
                unit = alt
        value = convert(spec.value, SI[spec.dim], unit)
        if value is None or not math.isfinite(value) or value <= 0:
            return None
        g_note = f" Use g = {G} m/s²." if spec.uses_g else ""
        # the precision it is judged at (rel_tol, 0.75%): rounded to two figures, as two-figure
        # givens suggest, 10% of right answers missed even 2% (1100 N for 1125 N)
        prompt = (f"{spec.text}{g_note}\n\nGive the answer in {unit}, to at least 3 significant figures, "
                  f"as a number followed by its unit (e.g. <answer>12.5 {unit}</answer>). {ANSWER_FORMAT}")
        meta = {"topic": spec.topic, "generator": topic.__name__.strip("_"), "value": value,
                "unit": unit, "dimension": spec.dim, "formula": spec.formula, "values": spec.values,
                "value_si": spec.value, "rel_tol": self.rel_tol}
        return Candidate(prompt=prompt, answer=f"{sig(value)} {unit}", metadata=meta,
                         key=problem_identity(meta["generator"], spec.values))

    def judge(self, problem: Problem, completion: str) -> Judgement:
        m = problem.metadata
        unit = str(m.get("unit", ""))
        expected_value = float(m["value"])
        tol = float(m.get("rel_tol", self.rel_tol))
        notes = []
        if m.get("formula"):
            given = ", ".join(f"{k} = {v}" for k, v in (m.get("values") or {}).items())
            result = f"{sig(float(m.get('value_si', expected_value)))} {SI.get(m.get('dimension', ''), '')}"
            notes.append(f"Formula: {m['formula']}" + (f" with {given}" if given else "")
                         + f" → {result.rstrip()}.")
        raw = extract_answer(completion)
        if raw is None:
            return Judgement(0.0, problem.answer, None, notes)
        value, got_unit, raw_unit = parse_quantity(raw)
        if value is None:
            notes.insert(0, "Could not read one number from the answer; write just the number and "
                         f"its unit, e.g. {problem.answer}.")
            return Judgement(0.0, problem.answer, raw, notes)
        compared = value
        if got_unit is not None and got_unit != unit:
            converted = convert(value, got_unit, unit)
            if converted is None:
                notes.insert(0, f"Wrong kind of unit: {got_unit} measures {dimension_name(got_unit)}, but the "
                             f"question asks for {m.get('dimension', 'another quantity')} in {unit}.")
                return Judgement(0.0, problem.answer, raw, notes)
            compared = converted
            notes.insert(0, f"Your {sig(value)} {got_unit} is {sig(converted)} {unit}.")
        elif got_unit is None and raw_unit:
            readings = case_readings(raw_unit)
            if readings and all(convert(1.0, sym, unit) is None for sym in readings):
                # "0.068 mj" for 0.068 A: mJ or MJ, an energy either way, was read as amperes
                notes.insert(0, f"Wrong kind of unit: {' or '.join(readings)} measures "
                             f"{dimension_name(readings[0])}, but the question asks for "
                             f"{m.get('dimension', 'another quantity')} in {unit}." + case_hint(raw_unit))
                return Judgement(0.0, problem.answer, raw, notes)
            if readings and unit not in readings:
                # "65.19 mj" for 65.19 kJ: mJ or MJ, each 10^6 or 10^3 away from kJ, was read as kJ
                notes.insert(0, f"Unit {raw_unit[:30]!r} could be {' or '.join(readings)}, and neither is "
                             f"the {unit} asked for." + case_hint(raw_unit))
                return Judgement(0.0, problem.answer, raw, notes)
            notes.insert(0, f"Unit {raw_unit[:30]!r} was not recognised; the number was read as {unit}."
                         + case_hint(raw_unit))
        err = relative_error(compared, expected_value)
        ok = err <= tol
        if not ok:
            direction = "too high" if compared > expected_value else "too low"
            notes.insert(0, f"Your value {sig(compared)} {unit} is {direction} by {err:.1%} "
                         f"(tolerance {tol * 100:.2g}%).")
        return Judgement(float(ok), problem.answer, raw, notes)
