"""The paper's figures from the curves tables (results/tables/curves/<experiment>.parquet).

Each `figN(tables, out)` takes {experiment: polars.DataFrame} and writes `out` (PDF) plus a PNG
beside it. Every figure has a title, axis labels, a legend and a footnote with the run count and
seeds, so a reader can tell at a glance how much evidence is behind it.
"""

from __future__ import annotations

import logging
import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from fastslow.analysis import (
    FIT_POINTS,
    answered_share,
    escape_step,
    fit_sigmoid,
    no_reward,
    reward_onset_note,
    rolling_mean,
    running_max,
    start_reward,
    steps_to_peak_note,
    steps_to_peak_ratio,
)
from fastslow.experiments import run_tasks
from fastslow.io import atomic_path
from fastslow.layout import FIGURE_EXPERIMENTS  # noqa: F401 - re-exported
from fastslow.tasks import DIFFICULTIES, TASK_NAMES

log = logging.getLogger("fastslow.figures")

#: FST-distill in Paul Tol's wine: matplotlib's purple was RL's blue to a protanope (CIEDE2000 1.9).
COLORS = {"rl": "#1f77b4", "fst": "#2ca02c", "gepa": "#7f7f7f", "fst_distill": "#882255", "base": "#444444"}
LABELS = {"rl": "RL", "fst": "FST", "gepa": "GEPA only", "fst_distill": "FST-distill", "base": "Base"}
#: Each method's line style and marker besides its colour: curves that coincide (every method at
#: zero reward, the CPU default's usual start) still show each one, a dashed RL over a solid FST;
#: and told apart without colour (grayscale print, colour-blind readers): no two share a style.
LINES = {"fst": ("-", "o"), "rl": ("--", "s"), "gepa": ((0, (1, 1)), "^"), "fst_distill": ("-.", "D"),
         "base": (":", "x")}


def _line(method: str) -> dict[str, Any]:
    """Keyword arguments of `ax.plot` for a method's curve (LINES); FST's solid line below the rest."""
    ls, marker = LINES.get(method, ("-", "o"))
    return {"color": COLORS.get(method, "k"), "ls": ls, "marker": marker, "ms": 4, "zorder": 2 if method == "fst" else 3}

# figure → experiments whose curves it reads: in fastslow.layout (the Snakefile needs it
# without this module's numpy/polars/matplotlib imports).


#: The paper's names of the tasks, for what a figure draws only: tables, MLflow metrics and file
#: names keep the ids. A difficulty variant `<task>_<level>` of a named task is "<name>-<level>"
#: (hover_hard: HoVer-hard, math_hard: Math-hard); `task_label`.
TASK_LABELS = {"codeio": "CodeIO", "math": "Math", "hover": "HoVer", "physics": "Physics",
               "stargraph": "Star graph", "path_star": "Star graph"}  # path_star: reasoning-gym's name


def task_label(task: str) -> str:
    """A task's name in a figure: the paper's (TASK_LABELS, HoVer-hard for hover_hard), else the
    id unchanged (a researcher's own task)."""
    if task in TASK_LABELS:
        return TASK_LABELS[task]
    family, _, level = task.rpartition("_")
    registered = task in TASK_NAMES and family in TASK_LABELS  # codeio_hard is no task: its id stays
    return f"{TASK_LABELS[family]}-{level}" if registered else task


def tasks_label(tasks: str) -> str:
    """A run's tasks as its key joins them ("hover.codeio.physics"), each by `task_label`."""
    return " → ".join(map(task_label, tasks.split(".")))


#: Readable names of variants (Fig 10's, Fig 9's bars by name); any other is its name with
#: spaces for its underscores (`variant_label`). Metric keys keep the names.
VARIANT_LABELS = {"no_reuse": "no reuse", "reuse": "rollout reuse"}


def variant_label(variant: str) -> str:
    """A variant's name in a figure (VARIANT_LABELS, else its name with spaces for underscores)."""
    return VARIANT_LABELS.get(variant, variant.replace("_", " "))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3, "font.size": 9,
                         "axes.spines.top": False, "axes.spines.right": False})
    return plt


#: Characters of 7-pt text a line, per inch of figure width (DejaVu Sans sets three of the
#: figures' notes at 20.4-20.7 characters an inch: 18 keeps a line inside the figure; other sizes
#: in proportion), and a 7-pt line's height in inches (at matplotlib's 1.2 line spacing).
FOOTNOTE_CHARS_PER_INCH = 18
FOOTNOTE_LINE_INCHES = 0.12


def _fit_width(fig: Any, text: str, points: float) -> str:
    """`text` wrapped to the figure's width at a font of `points`: a footnote or title wider than
    the figure widened the saved figure, the plot left in a corner of white space."""
    width = max(20, int(fig.get_figwidth() * FOOTNOTE_CHARS_PER_INCH * 7 / points))
    return "\n".join(textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False))


#: The tables whose variants a figure compares (its bars, its lines), drawn for FST's runs alone;
#: every other table a figure reads is drawn at its headline variant (`headline_tables`).
VARIANT_TABLES: dict[str, tuple[str, ...]] = {"fig9": ("ablations",), "fig10": ("reuse",)}
#: What `draw` left out of the figure it is drawing (`headline_tables`' note), for its footnote.
_NOT_DRAWN: ContextVar[str] = ContextVar("not_drawn", default="")


def headline_tables(tables: Mapping[str, pl.DataFrame], compared: tuple[str, ...] = ()
                    ) -> tuple[dict[str, pl.DataFrame], dict[str, str]]:
    """`tables` each cut to one curve per method and seed, and for each table cut a note naming
    what was left out ({table: note}; `cut_note` joins them).
    A table in `compared` (whose variants a figure or claim compares: FST's ablations, FST with
    and without reuse) keeps every variant but one method: FST, else its first. Any other keeps
    one variant: `default`, else the experiment's first (the table's row order: the config's).
    Runs of several variants of one experiment are no seeds of one curve: averaged, Fig 6's
    stages mixed a run of one stage length with another's; and a bar averaging two methods'
    runs is neither's."""
    out, notes = {}, {}
    for name, df in tables.items():
        column = "method" if name in compared else "variant"
        values = df[column].unique(maintain_order=True).to_list()
        if len(values) < 2:
            out[name] = df
            continue
        first = "fst" if column == "method" else "default"
        keep = first if first in values else values[0]
        out[name] = df.filter(pl.col(column) == keep)
        left = [v for v in values if v != keep]
        if column == "method":
            notes[name] = (f"{name}: its {LABELS.get(keep, keep)} runs read, its "
                           f"{', '.join(LABELS.get(m, m) for m in left)} runs not")
        else:
            notes[name] = f"{name}: variant {keep} read, variant{'s' if len(left) > 1 else ''} {', '.join(left)} not"
        log.warning("%s", notes[name])
    return out, notes


def cut_note(notes: Mapping[str, str]) -> str:
    """`headline_tables`' notes as one sentence (a figure's footnote), or ""."""
    return ("; ".join(notes.values()) + ".") if notes else ""


def draw(fig: str, tables: Mapping[str, pl.DataFrame], out: str | Path, **options: Any) -> tuple[Any, dict]:
    """Figure `fig` (`FIGURES`) from `tables` cut to one curve per method and seed
    (`headline_tables`; the footnote says what was left out). Returns the figure's numbers and
    the tables it drew."""
    tables, notes = headline_tables(tables, VARIANT_TABLES.get(fig, ()))
    token = _NOT_DRAWN.set(cut_note(notes))
    try:
        return FIGURES[fig](tables, out, **options), tables
    finally:
        _NOT_DRAWN.reset(token)


def _footnote(fig: Any, frames: list[pl.DataFrame], extra: str = "") -> None:
    runs = sorted({r for df in frames for r in df["run"].unique().to_list()})
    seeds = sorted({s for df in frames for s in df["seed"].unique().to_list()})
    text = f"{len(runs)} run{'' if len(runs) == 1 else 's'}, seeds {seeds}. " + " ".join(
        t for t in (extra, _NOT_DRAWN.get()) if t)
    fig.text(0.01, 0.005, _fit_width(fig, text.strip(), 7), fontsize=7, color="#555555", ha="left",
             va="bottom", gid="footnote")  # `_save` leaves room for its lines


def _suptitle(fig: Any, text: str) -> None:
    """The figure's title, wrapped to its width (Fig 3's formula over one panel was wider)."""
    from matplotlib.font_manager import FontProperties

    fig.suptitle(_fit_width(fig, text, FontProperties(size=_plt().rcParams["figure.titlesize"]).get_size_in_points()))


def _save(fig: Any, out: str | Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # room for the footnote: 0.04 of the height for one line, a 7-pt line more for each other
    lines = max((t.get_text().count("\n") + 1 for t in fig.texts if t.get_gid() == "footnote"), default=1)
    fig.tight_layout(rect=(0, 0.04 + (lines - 1) * FOOTNOTE_LINE_INCHES / fig.get_figheight(), 1, 1))
    for path in (out, out.with_suffix(".png")):  # atomically: a killed job leaves no half a figure
        # no creation date in the PDF: a rebuilt figure is the same file
        metadata = {"CreationDate": None} if path.suffix == ".pdf" else None
        with atomic_path(path) as tmp:
            fig.savefig(tmp, bbox_inches="tight", format=path.suffix[1:], metadata=metadata)  # a title wider than a one-panel figure: not cut
    _plt().close(fig)


def seed_mean_se(df: pl.DataFrame) -> pl.DataFrame:
    """Per step, the standard error over problems of mean@k averaged over the rows (seeds):
    the spread of the seed-averaged per-problem means over the square root of their number. Every
    seed is scored on the same problems, so their errors are not independent (sqrt(sum se^2)/n
    would shrink the error bar as a seed is duplicated). Without per-problem means (tables from
    before they were kept), the rows' mean standard error (conservative)."""
    if "problem_ids" not in df.columns or df["problem_ids"].null_count():
        se = pl.col("mean_at_k_se").mean() if "mean_at_k_se" in df.columns else pl.lit(float("nan"))
        return df.group_by("step").agg(se.alias("mean_at_k_se"))
    # sorted: a group_by's groups come in a hash order that differs from process to process, and
    # the spread's last bits with the order it sums in
    per = (df.select("step", "problem_ids", "problem_means").explode(["problem_ids", "problem_means"])
           .group_by("step", "problem_ids").agg(pl.col("problem_means").mean()).sort("step", "problem_ids"))
    return per.group_by("step", maintain_order=True).agg((pl.col("problem_means").std(ddof=1) / pl.col("problem_means").count().sqrt())
                                    .alias("mean_at_k_se"))


def rows_where(df: pl.DataFrame, **where: Any) -> pl.DataFrame:
    """The rows whose columns equal `where`'s values."""
    for k, v in where.items():
        df = df.filter(pl.col(k) == v)
    return df


def seed_curve(df: pl.DataFrame, **where: Any) -> pl.DataFrame:
    """Rows matching `where`, averaged over seeds per step (sorted by step), with the seed
    mean's standard error (`seed_mean_se`)."""
    df = rows_where(df, **where)
    curve = df.group_by("step").agg(pl.col("mean_at_k").mean(), pl.col("best_at_k").mean(),
                                    pl.col("kl_to_base").mean(), pl.col("entropy").mean())
    return curve.join(seed_mean_se(df), on="step", how="left").sort("step")


def _axes(plt: Any, n: int, size: tuple[float, float] = (3.6, 3.0), rows: int = 1, sharey: bool = False):
    cols = max(1, math.ceil(n / rows))
    fig, axes = plt.subplots(rows, cols, figsize=(size[0] * cols, size[1] * rows), squeeze=False, sharey=sharey)
    return fig, list(axes.flat)


def _tasks(df: pl.DataFrame, col: str = "eval_task") -> list[str]:
    return sorted(df[col].unique().to_list())


#: The tasks of Fig 2 and Fig 3 in the paper (its efficiency experiment also runs hover and physics,
#: for Fig 4 and Fig 11).
EFFICIENCY_TASKS = ("codeio", "math", "hover_hard")


def _panel_tasks(df: pl.DataFrame, wanted: tuple[str, ...] | list[str]) -> list[str]:
    """The tasks of `wanted` the table has, in that order; all of the table's when it has none
    of them (a config of one's own tasks)."""
    have = _tasks(df)
    return [t for t in wanted if t in have] or have


def _answered(*frames: pl.DataFrame, form: str = "; {}") -> str:
    """`form` holding "3% answered" for a no-reward note: its evaluations' share of samples with an
    answer in <answer> tags (`answered_share`), which tells a format never written from wrong
    answers; "" for a table that does not record it."""
    share = answered_share(*frames)
    return "" if share is None else form.format(f"{100 * share:.0f}% answered")


def _no_reward(head: str, tail: str, *rows: pl.DataFrame) -> str:
    """A corner note, "no reward for either method:\nthe lines overlap at 0", with the share of
    the rows' samples that gave an answer on a line of its own ("(0% answered)"; `_answered`)."""
    return f"{head}:\n{tail}" + _answered(*rows, form="\n({})")


def _missing_methods(present: Any, methods: tuple[str, ...] = ("rl", "fst")) -> str:
    """"no RL run" for a panel whose title promises a method the table has no run of."""
    absent = [LABELS[m] for m in methods if m not in present]
    return f"no {' or '.join(absent)} run" if absent else ""


def _note_title(ax: Any, title: str, note: str, width: int = 44) -> None:
    """The panel's title with a note under it (wrapped to the panel): notes drawn inside the axes
    sat on the curves."""
    lines = [title] + [w for part in note.split("\n") for w in textwrap.wrap(part, width)] if note else [title]
    ax.set_title("\n".join(lines), fontsize=9 if note else None)


# The shortest reward axis: curves at 0 everywhere (the CPU default) sit at the bottom of 0..0.1,
# not in the middle of matplotlib's -0.05..0.05, which draws rewards no run can have.
REWARD_MIN_TOP = 0.1


def _corner_note(ax: Any, text: str) -> None:
    """A grey note in the axes' top-left corner: why a panel shows less than it seems to (no
    reward, no fit, lines lying on each other)."""
    ax.text(0.02, 0.95, text, transform=ax.transAxes, va="top", fontsize=8, color="#555555",
            bbox={"fc": "white", "alpha": 0.8, "lw": 0, "pad": 1})  # legible where a curve runs under it


def _step_axis(ax: Any) -> None:
    """An RL-step x axis: integer ticks only (a step is never 2.5)."""
    from matplotlib.ticker import MaxNLocator

    # at most 6 ticks: a 3.6-inch panel of 400 steps ran its labels together ("0 50100150200")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=6))


def _reward_axis(ax: Any) -> None:
    """A reward y axis (mean@k, best@k: fractions of right samples, never below 0), called once
    the axes are drawn: from 0 to the data's top, at least `REWARD_MIN_TOP`. Also a polar axes'
    radius (the radars): their centre is 0. Markers at 0 lie on the axis and are drawn whole,
    not cut in half by its edge."""
    from matplotlib.collections import PathCollection

    ax.set_ylim(0, max(ax.get_ylim()[1], REWARD_MIN_TOP))
    marked = [ln for ln in ax.lines if ln.get_marker() not in (None, "None", "", " ")]
    for artist in [*marked, *(c for c in ax.collections if isinstance(c, PathCollection))]:  # not error bars
        artist.set_clip_on(False)


def fig2(tables: Mapping[str, pl.DataFrame], out: str | Path,
         task_sources: Mapping[str, str] | None = None) -> dict[str, float]:
    """Data efficiency: running max of val mean@k by step, FST vs RL, steps-to-RL's-peak ratio.
    With a `radar` experiment, a second row shows Mean@k / Best@k radars of Base→GEPA, RL→GEPA and
    FST→GEPA over its axes (grouped as `radar_group` says, given where each task's data come from,
    `task_sources`; None: one source for all)."""
    plt = _plt()
    df = tables["efficiency"]
    tasks = _panel_tasks(df, EFFICIENCY_TASKS)
    df = df.filter(pl.col("eval_task").is_in(tasks))
    radar = tables.get("radar")
    rows = 2 if radar is not None and radar.height else 1
    ncols = max(len(tasks), 2 if rows == 2 else 1)  # the radar row needs two columns
    # the radars' legends stand right of the second radar: room for them, or the radars close up
    fig = plt.figure(figsize=(3.8 * max(ncols, 1.5) + (1.6 if rows == 2 else 0), 3.2 * rows))
    ratios = {}
    for i, task in enumerate(tasks):
        ax = fig.add_subplot(rows, ncols, i + 1)
        curves = {}
        txt = ""
        for method in ("rl", "fst"):
            c = seed_curve(df, eval_task=task, method=method)
            if c.height:
                curves[method] = c
                ax.plot(c["step"], running_max(c["mean_at_k"].to_numpy()), label=LABELS[method], **_line(method))
        if {"rl", "fst"} <= curves.keys():
            rl, fst = curves["rl"], curves["fst"]
            ratio = steps_to_peak_ratio(rl["step"].to_numpy(), running_max(rl["mean_at_k"].to_numpy()),
                                        fst["step"].to_numpy(), running_max(fst["mean_at_k"].to_numpy()))
            ratios[task] = ratio
            ax.axhline(float(rl["mean_at_k"].max()), color=COLORS["rl"], ls=":", lw=1, label="RL peak")
            onset = reward_onset_note(rl["step"].to_numpy(), rl["mean_at_k"].to_numpy(),
                                      fst["step"].to_numpy(), fst["mean_at_k"].to_numpy())
            if no_reward(rl["mean_at_k"], fst["mean_at_k"]):
                compared = df.filter((pl.col("eval_task") == task) & pl.col("method").is_in(["rl", "fst"]))
                txt = f"no reward for either method (peak 0{_answered(compared)})"
            elif onset is not None:  # RL has no peak to reach
                txt = onset.replace("; ", ";\n")
            else:
                why, _ = steps_to_peak_note(rl["step"].to_numpy(), running_max(rl["mean_at_k"].to_numpy()),
                                            fst["step"].to_numpy(), running_max(fst["mean_at_k"].to_numpy()))
                txt = why.replace(": ", ":\n", 1) if why else f"steps to RL's peak: {ratio:.1f}×"
        _note_title(ax, task_label(task), txt or _missing_methods(curves))
        ax.set(xlabel="RL step", ylabel=f"val mean@{int(df['k'][0])} (running max)")
        _step_axis(ax)
        _reward_axis(ax)
        ax.legend(loc="best", fontsize=8)
    note = ""
    if rows == 2:
        unordered = _radars(fig, radar, ncols=ncols, task_sources=task_sources)
        if unordered:
            note = (f"Not grouped: {', '.join(map(task_label, unordered))}, whose data and its family's "
                    "training task's come from different sources, so which is harder is not known.")
    _suptitle(fig, "Fig 2 — data efficiency: FST vs RL at matched steps")
    _footnote(fig, [df] + ([radar] if rows == 2 else []), note)
    _save(fig, out)
    return ratios


def radar_values(last: pl.DataFrame, method: str, metric: str, axes_tasks: list[str]) -> tuple[list[float], list[str]]:
    """One starting point's `metric` on each radar axis: the last evaluations of the runs started
    from a `method`'s weights (`_init_method`: "base", "rl", "fst"), averaged over them (its seeds),
    NaN where it has none, and the axes it has none on (drawn as a gap, named in the legend: a 0
    there would read as a measured zero)."""
    sub = last.filter(pl.col("init").map_elements(_init_method, return_dtype=pl.String) == method)
    means = {t: sub.filter(pl.col("eval_task") == t)[metric].mean() for t in axes_tasks}
    return ([float("nan") if v is None else float(v) for v in means.values()],
            [t for t, v in means.items() if v is None])


def _init_method(init: str) -> str:
    """The method of a radar's starting point: "base", or the method of the run whose weights it
    is ("<experiment>/<method>/<run>")."""
    return "base" if init == "base" else init.split("/")[1]


def _init_tasks(init: str) -> tuple[str, ...]:
    """The tasks a starting point was trained on: none for the base model, else its run's
    (`fastslow.experiments.run_tasks`)."""
    return () if init == "base" else run_tasks(init)


#: Fig 2's radar axes grouped as in the caption, in its order, with its colours (sage, coral;
#: the third's name is cut off in the caption we could read).
RADAR_GROUPS = {"in-distribution": "#5f8f5a", "cross-domain": "#e0664f", "easy→hard": "#b07d12"}
#: Each group's mark on its spoke labels, beside the colour, which is about all the groups share
#: with the caption: to a protanope, and in grayscale, the three colours are one.
RADAR_MARKS = {"in-distribution": "ID", "cross-domain": "cross", "easy→hard": "E→H"}


def _task_family(task: str) -> str | None:
    """The registry family of an offline task (math of math_hard; `fastslow.tasks`), None for a
    task the registry does not know."""
    if task not in TASK_NAMES:
        return None
    family, _, level = task.rpartition("_")
    return family if family in TASK_NAMES and level in DIFFICULTIES else task


def radar_group(task: str, sources: tuple[str, ...], task_sources: Mapping[str, str] | None = None) -> str | None:
    """The group of radar axis `task` for starting points trained on `sources`: in-distribution
    (a source task), easy→hard (a harder difficulty of a source's family: math_hard after math),
    cross-domain (a task of another family); None where it cannot be told (no trained starting
    point, a task the registry does not know) or is none of these (an easier difficulty).

    `task_sources`: where each task's data come from (`fastslow.config.task_sources`; None: one
    source for all). Two levels of a family are ordered only from one source (its generator, or
    one Hub dataset cut by a filter): with data.source hf, math is Polaris (competition problems)
    while math_hard stays reasoning-gym's hard mixture, an easier set for all its name."""
    if task in sources:
        return "in-distribution"
    family, families = _task_family(task), {_task_family(s) for s in sources}
    if not sources or family is None or None in families:
        return None
    if family not in families:
        return "cross-domain"
    kin = [s for s in sources if _task_family(s) == family]
    if task_sources is not None and any(task_sources.get(s) is None or task_sources.get(s) != task_sources.get(task)
                                        for s in kin):
        return None  # levels of different sources: which is harder is not known
    harder = all(_level(task) > _level(s) for s in kin)
    return "easy→hard" if harder else None  # hard→easy (math after math_hard) is none of the caption's


def unordered_levels(last: pl.DataFrame, task_sources: Mapping[str, str] | None) -> list[str]:
    """The radar axes left ungrouped only because their data and the same family's training
    task's come from different sources (`radar_group`), named in Fig 2's footnote."""
    trained = _trained_on(last)
    return [t for t in _tasks(last) if radar_group(t, trained) == "easy→hard"
            and radar_group(t, trained, task_sources) is None]


def _level(task: str) -> int:
    """A registry task's difficulty as a rank (easy < default < hard)."""
    family, _, level = task.rpartition("_")
    return DIFFICULTIES.index(level) if family and level in DIFFICULTIES else DIFFICULTIES.index("default")


def _trained_on(last: pl.DataFrame) -> tuple[str, ...]:
    """The tasks the radar's trained starting points were trained on when they share them, else
    none: one of math and one of physics would put an axis in two groups at once."""
    sources = {_init_tasks(i) for i in last["init"].unique().to_list() if i != "base"}
    return next(iter(sources)) if len(sources) == 1 else ()


def radar_axes(last: pl.DataFrame, task_sources: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The radar's axis tasks, grouped in the caption's order (RADAR_GROUPS; ungrouped last), each
    with its group (`radar_group`, for the starting points' training tasks `_trained_on`)."""
    trained = _trained_on(last)
    groups = {t: radar_group(t, trained, task_sources) for t in _tasks(last)}
    order = list(RADAR_GROUPS)
    return dict(sorted(groups.items(), key=lambda tg: (order.index(tg[1]) if tg[1] else len(order), tg[0])))


def _init_rank(method: str) -> tuple[int, str]:
    """A radar's starting points (their methods) in the caption's order: Base, RL, FST, then any other."""
    order = ("base", "rl", "fst")
    return (order.index(method) if method in order else len(order), method)


def _radars(fig: Any, radar: pl.DataFrame, ncols: int, task_sources: Mapping[str, str] | None = None) -> list[str]:
    """Mean@k and Best@k over the radar axes for each starting point (init) after GEPA, the axes
    grouped and their labels coloured by group where the groups are known (`radar_axes`). Returns
    the axes left ungrouped for their data's source alone (`unordered_levels`), for the footnote."""
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    last = radar.filter(pl.col("cycle") == pl.col("cycle").max().over("run"))
    groups = radar_axes(last, task_sources)
    axes_tasks = list(groups)
    angles = np.linspace(0, 2 * np.pi, len(axes_tasks), endpoint=False)
    for j, metric in enumerate(("mean_at_k", "best_at_k")):
        ax = fig.add_subplot(2, ncols, ncols + j + 1, projection="polar")
        drawn: list[float] = []
        # one polygon per starting method, its seeds averaged (a polygon a seed drew look-alikes)
        for method in sorted({_init_method(i) for i in last["init"].unique().to_list()}, key=_init_rank):
            vals, missing = radar_values(last, method, metric, axes_tasks)
            drawn += vals
            ax.plot(np.append(angles, angles[0]), vals + vals[:1], **{**_line(method), "ms": 3, "zorder": 2},
                    label=f"{LABELS.get(method, method)}→GEPA"
                    + (f" (none on {', '.join(map(task_label, missing))})" if missing else ""))
            ax.fill(np.append(angles, angles[0]), vals + vals[:1], color=COLORS.get(method, "k"), alpha=0.08)
        ax.set_xticks(angles, [task_label(t) + (f"\n({RADAR_MARKS[groups[t]]})" if groups[t] else "")
                               for t in axes_tasks], fontsize=7)
        for task, tick in zip(axes_tasks, ax.get_xticklabels(), strict=True):  # each axis in its group's colour
            if groups[task]:
                tick.set(color=RADAR_GROUPS[groups[task]], fontweight="bold")
        ax.tick_params(axis="x", pad=6)  # spoke labels clear of the polygons' outline
        if not np.nansum(drawn):  # every polygon is a point at the centre: say so
            ax.text(0, 0, "0 on every axis", ha="center", va="center", fontsize=7, color="#555555")
        _reward_axis(ax)  # the centre is 0: an all-zero radar is a point there, not a ring
        ax.yaxis.set_major_locator(MaxNLocator(3))  # radius labels between the first two spokes,
        ax.set_rlabel_position(180 / len(axes_tasks))  # few enough not to pile up on one another
        ax.tick_params(axis="y", labelsize=7)
        # the radius labels readable where a polygon's edge crosses them: on a white ground, above
        # the polygons (the radius axis, its grey rings with it, drawn after them)
        for label in ax.get_yticklabels():
            label.set_bbox({"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 0.6})
        ax.yaxis.set_zorder(2.5)
        ax.set_title(f"{'Mean' if j == 0 else 'Best'}@{int(last['k'][0])}", fontsize=9)
    # one legend for both radars (the same starting points), right of the second, off its circle,
    # and under it the axes' groups (the tick labels' colours)
    drawn_groups = [g for g in RADAR_GROUPS if g in groups.values()]
    if drawn_groups:
        trained = ", ".join(map(task_label, _trained_on(last)))
        key = ax.add_artist(ax.legend(handles=[Patch(color=RADAR_GROUPS[g], label=f"{RADAR_MARKS[g]}: {g}")
                                               for g in drawn_groups],
                                      title=f"axes (trained on {trained})", fontsize=7,
                                      title_fontsize=7, loc="lower left", bbox_to_anchor=(1.15, 0.0)))
        # add_artist clips it to the polar axes: the saved figure's tight bounding box then left
        # out all of it past the axes and cut its right side off
        key.set_clip_on(False)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.15, 1.0))
    return unordered_levels(last, task_sources)


def fig3(tables: Mapping[str, pl.DataFrame], out: str | Path) -> dict[str, dict[str, float]]:
    """Asymptote: 4-parameter sigmoid fit per curve, upper asymptote A annotated (R0 held at the
    step-0 evaluation where the curve has one, `start_reward`)."""
    plt = _plt()
    df = tables["efficiency"]
    tasks = _panel_tasks(df, EFFICIENCY_TASKS)
    df = df.filter(pl.col("eval_task").is_in(tasks))
    fig, axes = _axes(plt, len(tasks))
    fits: dict[str, dict[str, float]] = {}
    drew_fit = drew_errors = False  # what the footnote explains
    for ax, task in zip(axes, tasks, strict=False):
        no_fit: list[str] = []  # methods without reward
        few: list[str] = []  # fewer evaluations after step 0 than a fit needs (the CPU default's 2)
        failed: list[str] = []  # curve_fit did not converge
        labels_at: list[tuple[float, float, str]] = []  # (A, where its label ends, method)
        present = set()
        for method in ("rl", "fst"):
            c = seed_curve(df, eval_task=task, method=method)
            if not c.height:
                continue
            present.add(method)
            x, y = c["step"].to_numpy().astype(float), c["mean_at_k"].to_numpy()
            ax.scatter(x, y, color=COLORS[method], s=12, marker=LINES[method][1], label=f"{LABELS[method]} (val)",
                       zorder=_line(method)["zorder"])
            if no_reward(y):  # a flat 0 has no level to fit (a fit put "A=0.00" on a 0..0.0008 axis)
                no_fit.append(method)
                fits.setdefault(task, {})[method] = float("nan")
                continue
            se = c["mean_at_k_se"].to_numpy() if "mean_at_k_se" in c.columns else np.array([np.nan])
            if np.isfinite(se).any():  # each evaluation's standard error over its problems
                drew_errors = True
                ax.errorbar(x, y, yerr=np.nan_to_num(se), fmt="none",
                            ecolor=COLORS[method], elinewidth=0.8, capsize=2, alpha=0.7)
            try:
                fit = fit_sigmoid(x, y, r0=start_reward(x, y))
            except ValueError:  # fewer than FIT_POINTS evaluations after step 0
                few.append(LABELS[method])
                fits.setdefault(task, {})[method] = float("nan")
                continue
            if not fit.ok:  # the optimiser gave up: its parameters are the starting guess, no fit to draw
                failed.append(LABELS[method])
                fits.setdefault(task, {})[method] = float("nan")
                continue
            xs = np.linspace(max(x[x > 0].min(), 1e-3), x.max(), 100)
            # still rising: A is the fit's bound, said in the legend (a label
            # at the curve's end lay on the other method's curve)
            ax.plot(xs, fit(xs), color=COLORS[method], ls=LINES[method][0],
                    label=f"{LABELS[method]} fit" + ("" if fit.identified else ": A not identified"))
            drew_fit = True
            xe = np.linspace(x.max(), 2 * x.max(), 50)
            ax.plot(xe, fit(xe), color=COLORS[method], ls=":")
            if not fit.identified:
                fits.setdefault(task, {})[method] = float("nan")
                continue
            ax.axhline(fit.a, color=COLORS[method], ls="-.", lw=0.8)  # (not "--": RL's fit line)
            labels_at.append((fit.a, xe[-1], method))
            fits.setdefault(task, {})[method] = fit.a
        # each A above its line; of two close ones (both on one level, touching) the lower below its own
        labels_at.sort()
        for i, (a, x_end, method) in enumerate(labels_at):
            below = i == 0 and len(labels_at) > 1 and labels_at[1][0] - a < 0.08
            ax.text(x_end, a, f"{LABELS[method]} A={a:.2f}", color=COLORS[method], fontsize=8, ha="right",
                    va="top" if below else "bottom")
        answered = _answered(df.filter((pl.col("eval_task") == task) & pl.col("method").is_in(no_fit)))
        notes = ([f"no reward ({', '.join(LABELS[m] for m in no_fit)}{answered}): no fit"] if no_fit else [])
        if few:
            notes.append(f"no fit ({', '.join(few)}): under {FIT_POINTS} evaluations after step 0")
        if failed:
            notes.append(f"no fit ({', '.join(failed)}): it did not converge")
        notes.append(_missing_methods(present))
        _note_title(ax, task_label(task), "; ".join(n for n in notes if n))
        ax.set(xlabel="RL step", ylabel=f"val mean@{int(df['k'][0])}")
        _step_axis(ax)
        _reward_axis(ax)
        ax.legend(fontsize=7, loc="best")
    _suptitle(fig, "Fig 3 — fitted asymptote A per curve")
    _footnote(fig, [df], " ".join(  # no reward (the CPU default), too few points: no fit to explain
        ([] if not drew_fit else ["Fit: R − R0 = (A − R0) / (1 + (C_mid/C)^B), R0 the step-0 evaluation where there is one.",
                                  "The fit window in its method's line style (FST solid, RL dashed); dotted: extrapolation."])
        + ([] if not drew_errors else ["Bars: ±1 standard error over val problems."])))
    _save(fig, out)
    return fits


def _kl_figure(tables: Mapping[str, pl.DataFrame], out: str | Path, tasks: list[str],
               title: str) -> dict[str, dict[str, dict[str, float]]]:
    """Reward vs KL per task; returns the last checkpoint's (seed-averaged) KL and reward by task
    and method."""
    plt = _plt()
    df = tables["efficiency"]
    tasks = _panel_tasks(df, tasks)
    df = df.filter(pl.col("eval_task").is_in(tasks))  # the footnote counts the runs drawn
    fig, axes = _axes(plt, len(tasks))
    last: dict[str, dict[str, dict[str, float]]] = {}
    drew_any = False  # the footnote explains markers and lines only where some were drawn
    for ax, task in zip(axes, tasks, strict=False):
        drawn, unmeasured = [], []
        for method in ("rl", "fst"):
            sub = df.filter((pl.col("eval_task") == task) & (pl.col("method") == method)).sort("step")
            if not sub.height:
                continue
            # its trained checkpoints' KL: the step-0 evaluation's (the base model, KL 0) may have one
            # where none of the others does, a lone marker at the origin (the claims: not measured)
            trained = sub.filter(pl.col("step") > 0)["kl_to_base"]
            measured = trained if trained.len() else sub["kl_to_base"]
            if not measured.fill_nan(None).drop_nulls().len():  # evaluation.divergence: false
                unmeasured.append(LABELS[method])  # said under the title, not a legend entry with nothing drawn
                c = seed_curve(sub)
                last.setdefault(task, {})[method] = {"kl": float("nan"), "reward": float(c["mean_at_k"][-1])}
                continue
            drawn.append((method, sub))
            ax.scatter(sub["kl_to_base"].to_numpy(), sub["mean_at_k"].to_numpy(), color=COLORS[method],
                       marker=LINES[method][1], alpha=0.35, s=14)  # every checkpoint of every seed
            c = seed_curve(sub)  # the line: along the seed-averaged curve, step by step
            ax.plot(rolling_mean(c["kl_to_base"].to_numpy(), 3, center=True),
                    rolling_mean(c["mean_at_k"].to_numpy(), 3, center=True), color=COLORS[method], ls=LINES[method][0],
                    marker=LINES[method][1], markevery=[-1], ms=4, label=LABELS[method])
            last.setdefault(task, {})[method] = {"kl": float(c["kl_to_base"][-1]), "reward": float(c["mean_at_k"][-1])}
        # a method without reward whose policy never moved sits on the origin, under the other's start
        still = {LABELS[m]: d for m, d in drawn
                 if no_reward(d["mean_at_k"]) and (d["kl_to_base"].fill_nan(None).drop_nulls() == 0).all()}
        if len(drawn) > 1 and no_reward(*(d["mean_at_k"] for _, d in drawn)):  # one method's markers hide the other's
            kls = [np.round(np.sort(d["kl_to_base"].to_numpy()), 6) for _, d in drawn]
            if all(np.array_equal(kls[0], k, equal_nan=True) for k in kls[1:]):
                at_zero = ",\nat KL 0 (neither policy moved)" if len(still) == len(drawn) else ""
                _corner_note(ax, _no_reward("no reward for either method", "the markers overlap at 0" + at_zero,
                                            *(d for _, d in drawn)))
            else:  # at other KLs the markers lie side by side along 0
                _corner_note(ax, _no_reward("no reward for either method", "both lie along reward 0",
                                            *(d for _, d in drawn)))
        else:  # said in its legend entry: a note in the corner would cover the other's curve
            for line in ax.lines:
                if line.get_label() in still:  # with its samples' answered share, as the notes give it
                    line.set_label(f"{line.get_label()} (no reward, KL 0:\nevery checkpoint at the origin"
                                   f"{_answered(still[line.get_label()])})")
        notes = [_missing_methods(last.get(task, {}))]
        if unmeasured:
            notes.append(f"KL not measured for {' or '.join(unmeasured)} (evaluation.divergence: false)")
        _note_title(ax, task_label(task), "\n".join(n for n in notes if n))
        ax.set(xlabel="token KL(π_train ‖ π_base) (nats/token)", ylabel=f"val mean@{int(df['k'][0])}")
        ax.set_xlim(left=0)  # summed over the vocabulary, a KL is never negative
        _reward_axis(ax)
        if drawn:
            drew_any = True
            ax.legend(fontsize=8)
    _suptitle(fig, title)
    _footnote(fig, [df], "Markers: checkpoints; lines: centred rolling mean (window 3) along training, "
                         "from the first checkpoint to the last." if drew_any else "")
    _save(fig, out)
    return last


def fig4(tables: Mapping[str, pl.DataFrame], out: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    return _kl_figure(tables, out, ["codeio", "hover", "physics"], "Fig 4 — validation reward vs KL to the base policy")


def fig11(tables: Mapping[str, pl.DataFrame], out: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    return _kl_figure(tables, out, ["codeio", "math", "hover", "physics"],
                      "Fig 11 — validation reward vs KL to the base policy, four tasks")


def fig5(tables: Mapping[str, pl.DataFrame], out: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """Plasticity probe: fresh RL on a new task from RL-, FST- and base-initialised weights, a
    panel per (target task, source task). Returns each line's last val mean@k by target, source
    and init ("base", "rl", "fst"): the figure run's metrics `fig5/<target>/<source>/<init>`."""
    plt = _plt()
    df = tables["plasticity"]
    # init is "base" or a run's key: one line per (method, source tasks), averaged over the
    # source runs' seeds (and this experiment's own seeds).
    df = df.with_columns(
        pl.col("init").map_elements(_init_method, return_dtype=pl.String).alias("init_method"),
        pl.col("init").map_elements(lambda i: ".".join(_init_tasks(i)) or None,
                                    return_dtype=pl.String).alias("init_task"))
    sources = sorted(df["init_task"].drop_nulls().unique().to_list()) or ["base"]
    panels = [(target, src) for target in _tasks(df) for src in sources]  # each target on its own
    inits = set(df["init_method"].to_list())
    fig, axes = _axes(plt, len(panels), sharey=True)
    finals: dict[str, dict[str, dict[str, float]]] = {}
    for ax, (target, src) in zip(axes, panels, strict=False):
        on = df.filter(pl.col("eval_task") == target)
        curves = {}
        for method in sorted(on["init_method"].unique().to_list()):
            c = (seed_curve(on, init_method="base") if method == "base"
                 else seed_curve(on, init_method=method, init_task=src))
            if not c.height:
                continue
            curves[method] = c["mean_at_k"].to_numpy()
            ax.plot(c["step"], c["mean_at_k"], label=f"{LABELS.get(method, method)} init", **_line(method))
            finals.setdefault(target, {}).setdefault(src, {})[method] = float(curves[method][-1])
        if len(curves) > 1 and no_reward(*curves.values()):  # the lines lie on each other at 0
            drawn = on.filter((pl.col("init_method") == "base") | (pl.col("init_task") == src))  # this panel's
            _corner_note(ax, _no_reward("no reward from any init", "the lines overlap at 0", drawn))
        ax.set(xlabel="RL step", ylabel=f"val mean@{int(df['k'][0])}" if ax is axes[0] else "")
        # a starting point the probe compares with no run in this panel: said, not just absent
        absent = [m for m in ("base", "rl", "fst") if m not in curves and (m != "base" or "base" in inits)]
        ax.set_title(f"from {tasks_label(src)} checkpoints\n→ RL on {task_label(target)}"
                     + (f"\n(no {' or '.join(LABELS[m] for m in absent)} init run)" if absent else ""), fontsize=10)
        _step_axis(ax)
    for ax in axes:  # the shared y axis once every panel is drawn
        _reward_axis(ax)
    # one legend, beside the last panel: inside, it hid the RL-init line's end, which the
    # plasticity claim reads
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    axes[-1].legend(handles.values(), handles.keys(), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    _suptitle(fig, "Fig 5 — plasticity probe")
    _footnote(fig, [df])
    _save(fig, out)
    return finals


def continual_seed_mean(df: pl.DataFrame) -> pl.DataFrame:
    """The continual curves averaged over seeds: mean@k per method, step and (train, eval) task."""
    keys = ["method", "step", "cycle", "train_task", "eval_task"]
    return df.group_by(keys).agg(pl.col("mean_at_k").mean(), pl.col("k").first()).sort(["method", "step"])


def stage_ends(df: pl.DataFrame) -> dict[str, int]:
    """The step of each stage's last evaluation in a continual curves table, in order: the
    stage's end, since every stage's last cycle is evaluated (`layout.eval_points`)."""
    ends = (df.filter(pl.col("cycle") >= 0).group_by("train_task").agg(pl.col("step").max().alias("end"))
            .sort("end"))
    return dict(zip(ends["train_task"].to_list(), map(int, ends["end"].to_list()), strict=True))


def stage_starts(df: pl.DataFrame) -> dict[str, int]:
    """The RL step at which each stage of a continual curves table starts, in order: 0, then the
    previous stage's end (`stage_ends`)."""
    ends = stage_ends(df)
    return dict(zip(ends, [0, *list(ends.values())[:-1]], strict=True))


def normalised_continual(df: pl.DataFrame) -> pl.DataFrame:
    """Per-stage accuracy (seeds averaged) normalised by the peak reached across methods within
    the stage.

    A stage where no method earned any reward (peak 0) has nothing to normalise by: its
    `normalised` is null, not 0, so neither the figure nor the claims read "0% of the peak"."""
    df = continual_seed_mean(df)
    stage = df.filter(pl.col("eval_task") == pl.col("train_task"))
    peak = stage.group_by("train_task").agg(pl.col("mean_at_k").max().alias("peak"))
    return (stage.join(peak, on="train_task")
            .with_columns(pl.when(pl.col("peak") > 0).then(pl.col("mean_at_k") / pl.col("peak"))
                          .otherwise(None).alias("normalised")))


def stage_start_points(mean: pl.DataFrame, norm: pl.DataFrame, starts: Mapping[str, int]) -> pl.DataFrame:
    """Each stage's starting level, for Fig 6's left panel: the evaluation on the stage's task of
    the weights it starts from (the first stage: the initial point; a later one: the previous
    stage's last, evaluated on every task), as rows of `normalised_continual` labelled with the
    stage's task and divided by its peak. Without them each stage's line began at its first
    evaluation inside the stage, one evaluation after the switch. The peak stays the one reached
    inside the stage (the claims' too): a start above it reads above 1. `mean` is the table's
    `continual_seed_mean`, `starts` its `stage_starts`."""
    peak = norm.select("train_task", "peak").unique("train_task")
    out = []
    for task, start in starts.items():
        at = mean.filter((pl.col("eval_task") == task)
                         & ((pl.col("cycle") < 0) if start == 0 else (pl.col("step") == start) & (pl.col("cycle") >= 0)))
        out.append(at.with_columns(pl.lit(task).alias("train_task")))
    if not out:
        return norm.clear()
    starts = pl.concat(out).join(peak, on="train_task")
    return (starts.with_columns(pl.when(pl.col("peak") > 0).then(pl.col("mean_at_k") / pl.col("peak"))
                                .otherwise(None).alias("normalised")).select(norm.columns))


STAGE_MARKERS = ("o", "s", "^", "D", "v")  # Fig 6's right panel: one per task, as well as its colour
#: Fig 6's right panel: a colour per task (none of the methods' own), the method as line style
#: (Okabe and Ito's: vermillion, sky blue, black, bluish green, orange. The paper's three stages
#: stay apart to colour-blind readers and in grayscale; matplotlib's red and brown were one.)
STAGE_COLORS = ("#D55E00", "#56B4E9", "#000000", "#009E73", "#E69F00")


def stage_segments(sub: pl.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    """A method's normalised curve (steps and `col`, sorted by step) with a gap between stages:
    the line from one stage's last point to the next one's first would draw a change of task as
    a drop or a rise in accuracy."""
    steps, values, tasks = sub["step"].to_list(), sub[col].to_list(), sub["train_task"].to_list()
    xs: list[float] = []
    ys: list[float] = []
    for i, (x, y, task) in enumerate(zip(steps, values, tasks, strict=True)):
        if i and task != tasks[i - 1]:
            xs.append(float("nan"))
            ys.append(float("nan"))
        xs.append(float(x))
        ys.append(float("nan") if y is None else float(y))
    return np.array(xs), np.array(ys)


def fig6(tables: Mapping[str, pl.DataFrame], out: str | Path) -> pl.DataFrame:
    """Continual learning: one run per method through the task sequence."""
    plt = _plt()
    df = tables["continual"]
    norm = normalised_continual(df)
    mean = continual_seed_mean(df)
    # one step axis: with no reward anywhere the left panel has no points to scale by, and its
    # stage labels at steps > 1 of a 0..1 axis made a PNG tens of thousands of pixels wide
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.4), sharex=True)
    starts = stage_starts(df)
    stages = list(starts)
    methods = sorted(norm["method"].unique().to_list())
    # each stage's line begins at the switch, with the level its weights start from
    begun = pl.concat([stage_start_points(mean, norm, starts), norm], how="vertical_relaxed")
    rank = {task: i for i, task in enumerate(stages)}
    for method in methods:
        sub = (begun.filter(pl.col("method") == method)
               .with_columns(pl.col("train_task").replace_strict(rank, return_dtype=pl.Int64).alias("_stage"))
               .sort(["_stage", "step"]))
        style, marker = LINES.get(method, ("-", "o"))
        ax.plot(*stage_segments(sub, "normalised"), color=COLORS[method], ls=style,
                marker=marker, ms=4, label=LABELS[method])
        for i, task in enumerate(stages):  # the task by colour and marker, the method by line style
            all_t = mean.filter((pl.col("method") == method) & (pl.col("eval_task") == task)).sort("step")
            ax2.plot(all_t["step"], all_t["mean_at_k"], color=STAGE_COLORS[i % len(STAGE_COLORS)],
                     ls=style, marker=STAGE_MARKERS[i % len(STAGE_MARKERS)], ms=5,
                     label=f"{LABELS[method]}: {task_label(task)}")
    for a in (ax, ax2):
        a.set_xlim(left=0)  # the first stage starts at step 0, before its first point
        _step_axis(a)
        for task, step in starts.items():
            if step > 0:
                a.axvline(step, color="#bbbbbb", lw=0.8)
            a.text(step, 1.02, task_label(task), transform=a.get_xaxis_transform(), fontsize=8)
    ends = stage_ends(df)
    zero = norm.filter(pl.col("peak") <= 0)["train_task"].unique(maintain_order=True)
    for task in zero:  # in the middle of its stage, off the lines where stages start
        step = (starts[task] + ends[task]) / 2
        stage = df.filter((pl.col("train_task") == task) & (pl.col("eval_task") == task))
        answered = _answered(stage, form=";\n{}")  # a line of its own: a stage is narrow
        ax.text(step, 0.5, f"{task_label(task)}: no reward\nfor any method\n(peak 0{answered})", ha="center",
                va="center", fontsize=8, color="#555555")
    ax.set(xlabel="RL step", ylabel="stage accuracy / stage peak across methods", ylim=(0, 1.1))
    ax.set_title("normalised accuracy on the current task", pad=14)
    ax2.set(xlabel="RL step", ylabel=f"val mean@{int(df['k'][0])}")
    ax2.set_title("every task's accuracy (forgetting)", pad=14)
    if mean.height and no_reward(mean["mean_at_k"]):  # the data: the stage lines run 0..1
        _corner_note(ax2, _no_reward("no reward on any task", "the lines overlap at 0", df))
    _reward_axis(ax2)
    ax.legend(fontsize=8)
    ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the curves, not on them
    _suptitle(fig, f"Fig 6 — continual learning: {' → '.join(map(task_label, stages))}")
    # one method's curve divided by its own peak reaches 1.0 on every stage by construction
    _footnote(fig, [df], "" if len(methods) != 1 else
              f"Only {LABELS.get(methods[0], methods[0])} runs: each stage normalised by that method's own peak.")
    _save(fig, out)
    return norm


def fig7(tables: Mapping[str, pl.DataFrame], out: str | Path) -> dict[str, dict[str, float]]:
    """Star-graph search from zero reward. Returns each method's escape step (NaN: it never left
    zero reward) and last val mean@k."""
    plt = _plt()
    df = tables["stargraph"]
    fig, ax = plt.subplots(figsize=(5, 3.4))
    stayed = []
    numbers: dict[str, dict[str, float]] = {"escape_step": {}, "last": {}}
    drawn = []
    for method in ("rl", "fst"):
        c = seed_curve(df, method=method)
        if c.height:
            drawn.append(c["mean_at_k"])
            ax.plot(c["step"], c["mean_at_k"], label=LABELS[method], **_line(method))
            se = c["mean_at_k_se"].to_numpy() if "mean_at_k_se" in c.columns else None
            first = escape_step(c["step"].to_numpy(), c["mean_at_k"].to_numpy(), se)
            numbers["escape_step"][method] = float(first)
            numbers["last"][method] = float(c["mean_at_k"][-1])
            if not math.isnan(first):
                ax.axvline(first, color=COLORS[method], ls=":", lw=1)
                # the number the caption's claim reads (~50 vs ~300), along its line
                ax.annotate(f" {LABELS[method]}: step {int(first)}", (first, 0.97), xycoords=ax.get_xaxis_transform(),
                            xytext=(-2, 0), textcoords="offset points", rotation=90, ha="right", va="top",
                            fontsize=7, color=COLORS[method],
                            bbox={"fc": "white", "alpha": 0.8, "lw": 0, "pad": 1})  # over the other's curve
            else:
                stayed.append(LABELS[method])
    overlap = len(drawn) > 1 and no_reward(*drawn)
    if overlap:  # RL's line, drawn on top, hides FST's; and did they write the format at all?
        _corner_note(ax, _no_reward("no reward for either method", "the lines overlap at 0",
                                    df.filter(pl.col("method").is_in(["rl", "fst"]))))
    missing = _missing_methods(numbers["last"])
    ax.set(title="Fig 7 — star-graph search" + (f" ({missing})" if missing else ""), xlabel="RL step",
           ylabel=f"val mean@{int(df['k'][0])}")
    _step_axis(ax)
    _reward_axis(ax)
    # beside the axes: inside, it covered an early escape's step label (the number the claim reads)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    never = f"; none for {', '.join(stayed)}" if stayed else ""  # short: a wider note widens the PNG
    # an escape step is an evaluated step: the escape itself came after the evaluation before it
    steps = np.unique(df["step"].to_numpy())
    every = f" (every {int(np.diff(steps).min())} steps)" if len(steps) > 1 else ""
    _footnote(fig, [df], f"Dotted: first evaluation{every} whose mean@k is above 2 standard errors "
                         f"(leaving zero reward){never}.")
    _save(fig, out)
    return numbers


def fig8(tables: Mapping[str, pl.DataFrame], out: str | Path) -> dict[str, dict[str, float]]:
    """HoVer: FST vs RL vs GEPA-only ceiling vs FST-distill, and actor entropy. Returns each
    method's last val mean@k and entropy."""
    plt = _plt()
    ceiling = tables["ceiling"]
    task = ceiling["eval_task"][0]
    frames = [ceiling]
    eff = tables.get("efficiency")
    if eff is not None:
        frames.append(eff.filter(pl.col("eval_task") == task))
    df = pl.concat(frames, how="diagonal_relaxed")
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10.2, 3.4))
    absent, unmeasured = [], []
    numbers: dict[str, dict[str, float]] = {"last": {}, "entropy": {}}
    drawn = []
    for method in ("rl", "fst", "fst_distill", "gepa"):
        c = seed_curve(df, method=method, eval_task=task)
        if not c.height:
            absent.append(LABELS[method])
            continue
        drawn.append(c["mean_at_k"])
        numbers["last"][method] = float(c["mean_at_k"][-1])
        numbers["entropy"][method] = float(c["entropy"][-1])
        ax.plot(c["step"], c["mean_at_k"], label=LABELS[method], **_line(method))
        if c["entropy"].fill_nan(None).drop_nulls().len():
            ax2.plot(c["step"], c["entropy"], label=LABELS[method], **_line(method))
        else:  # evaluation.divergence: false; said under the title, not an empty line
            unmeasured.append(LABELS[method])
    if len(drawn) > 1 and no_reward(*drawn):  # the last method's line hides the others'
        _corner_note(ax, _no_reward("no reward for any method", "the lines overlap at 0",
                                    df.filter(pl.col("eval_task") == task)))
    ax.set(title=f"{task_label(task)}: validation reward", xlabel="RL step", ylabel=f"val mean@{int(df['k'][0])}")
    ax2.set(title="actor entropy on val completions", xlabel="RL step", ylabel="entropy (nats/token)")
    # entropies that barely move (a few steps of a small model) read as plain numbers on a range
    # of at least ±0.05 nats, not as millionths under a "1e-6+1.08e1" offset
    ax2.ticklabel_format(axis="y", useOffset=False, style="plain")
    low, high = ax2.get_ylim()
    if high - low < 0.1:
        ax2.set_ylim((low + high) / 2 - 0.05, (low + high) / 2 + 0.05)
    if unmeasured:
        _note_title(ax2, "actor entropy on val completions",
                    f"not measured for {', '.join(unmeasured)} (evaluation.divergence: false)")
    for a in (ax, ax2):
        _step_axis(a)
    _reward_axis(ax)
    if drawn:  # beside the panels: inside, it covered the curves' ends, where the ceiling is read
        ax2.legend(*ax.get_legend_handles_labels(), fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    _suptitle(fig, "Fig 8 — FST vs RL vs GEPA-only ceiling vs FST-distill")
    # the title names four methods: one without a run on the task is said missing, not just absent
    notes = [f"{LABELS['gepa']} trains no weights: its round c is drawn at step (c + 1) × T, beside the "
             "others' cycle c." if "gepa" in numbers["last"] else "",  # its x is not its own: no RL step
             f"No run on {task_label(task)}: {', '.join(absent)}." if absent else ""]
    _footnote(fig, frames, " ".join(n for n in notes if n))
    _save(fig, out)
    return numbers


def common_step(df: pl.DataFrame) -> int:
    """The step to compare runs at: the last step (after 0) at which every run was evaluated;
    without one (cycle lengths and eval_every that never meet), the earliest last step.
    Variants with another T are evaluated at other steps (T = 12 with eval_every 5: 60, 120;
    T = 6: every 30), and comparing each at its own last point before a step would put bars of
    different steps side by side."""
    per_run = df.group_by("run").agg(pl.col("step").unique())["step"].to_list()
    shared = set.intersection(*(set(s) for s in per_run)) - {0} if per_run else set()
    return int(max(shared)) if shared else int(min(max(s) for s in per_run))


def value_at_step(df: pl.DataFrame, step: int) -> float:
    """A curve's mean@k at the last evaluated step ≤ `step`."""
    sub = df.filter(pl.col("step") <= step).sort("step")
    return float(sub["mean_at_k"][-1]) if sub.height else float("nan")


def seed_se_at_step(df: pl.DataFrame, step: int) -> float:
    """The standard error over seeds of a curve's mean@k at `step`, over the seeds evaluated at
    that very step (those the seed mean there averages, `seed_curve`): Fig 9's error bar on the
    bar it reads at `step`; NaN (no bar) with fewer than two such seeds."""
    per_seed = (df.filter(pl.col("step") == step).group_by("seed").agg(pl.col("mean_at_k").mean())
                .sort("seed")["mean_at_k"])  # in seed order: the groups' order differs between processes
    return float(per_seed.std(ddof=1) / math.sqrt(per_seed.len())) if per_seed.len() > 1 else float("nan")


#: Fig 9's panels: the settings the paper ablates, in its panel order, with their short names.
ABLATED = {"fast.pool_size": "K", "slow.baseline": "baseline", "slow.steps_per_cycle": "T", "fast.preset": "GEPA"}
PANEL_TITLES = {"fast.pool_size": "pool size K", "slow.baseline": "advantage baseline",
                "slow.steps_per_cycle": "RL steps per cycle T", "fast.preset": "GEPA recipe"}


def _ablated_rank(key: str) -> int:
    """Where a setting comes in Fig 9: the paper's panels (ABLATED) in their order, then the rest."""
    order = list(ABLATED)
    return order.index(key) if key in order else len(order)


def ablation_panels(info: Mapping[str, Any]) -> list[tuple[str, dict[str, Any], list[str]]]:
    """Fig 9's panels from what each variant changes (`fastslow.experiments.variant_settings`):
    (setting, the other settings it is compared at, the bars: "default" for the experiment's
    own settings, else variant names). A variant that changes one setting is compared with the
    default; one that changes several, with the bar that differs from it in one of them and
    nothing else (the paper's "prompt baseline at K=2" beside K=2), else with the default in a
    panel of its own (its bars by name). Panels come in the paper's order (ABLATED), then the
    rest by first appearance."""
    reference, changes = dict(info.get("reference", {})), info.get("variants", {})
    full = {"default": reference, **{v: {**reference, **d} for v, d in changes.items()}}
    panels: dict[tuple[str, tuple], tuple[dict[str, Any], list[str]]] = {}
    for variant, diff in changes.items():
        if not diff:
            continue
        key, context, other = (next(iter(diff)) if len(diff) == 1 else ", ".join(diff)), {}, "default"
        if len(diff) > 1:
            for name in full:
                keys = set(diff) | set(changes.get(name, {}))
                differing = [k for k in keys if full[name].get(k) != full[variant].get(k)]
                if name != variant and len(differing) == 1 and differing[0] in diff:
                    key, other = differing[0], name
                    context = {k: v for k, v in diff.items() if k != key}
                    break
        frozen = tuple(sorted((k, repr(v)) for k, v in context.items()))  # a setting may be a list
        _, bars = panels.setdefault((key, frozen), (context, []))
        for name in (other, variant):
            if name not in bars:
                bars.append(name)
    keys = sorted(panels, key=lambda kc: (_ablated_rank(kc[0]), len(kc[1])))
    out = []
    for key, frozen in keys:
        context, bars = panels[(key, frozen)]
        values = [full[b].get(key) for b in bars]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            bars = [b for _, b in sorted(zip(values, bars, strict=True), key=lambda vb: vb[0])]
        out.append((key, context, bars))
    return out


def headline_bars(key: str, bars: Sequence[str], reference: Mapping[str, Any],
                  changes: Mapping[str, Any]) -> set[str]:
    """The bars of Fig 9's panel on `key` that hold the headline configuration's setting (the
    paper's sage bars, "the headline configuration in each panel"): the default's bar, and in a
    panel compared at other settings (the prompt baseline beside the problem baseline, both at
    K=2) the bar whose `key` is the default's. A panel of bars by name has the default's alone."""
    if key in ("variant", "other") or key not in reference:  # also a panel of several settings
        return {b for b in bars if b == "default"}
    return {b for b in bars if b == "default" or {**reference, **(changes.get(b) or {})}.get(key) == reference[key]}


def _short_key(key: str) -> str:
    """A setting's name in a label: the paper's letter, else its last two parts
    (fast.max_metric_calls.light: max_metric_calls.light)."""
    return ABLATED.get(key, ".".join(key.split(".")[-2:]))


def _value_texts(values: list[Any]) -> list[str]:
    """Settings' values as labels, numbers in one notation: Python wrote 1e-05 beside 0.0001;
    when one float needs an exponent, every float of the list gets one (1e-5, 1e-4)."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    sci = any(number(v) and v != 0 and not 1e-3 <= abs(v) < 1e5 for v in values)

    def text(v: Any) -> str:
        if not number(v) or (isinstance(v, int) and not sci):
            return str(v)
        if v == 0:
            return "0"
        if sci:
            mantissa, exponent = f"{v:e}".split("e")
            return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
        return f"{v:g}"

    return [text(v) for v in values]


def _setting_label(key: str, value: Any) -> str:
    return f"{_short_key(key)}={_value_texts([value])[0]}"


def _panel_labels(key: str, bars: list[str], settings: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Fig 9's tick labels of a panel comparing the setting(s) `key` ("a, b" for a variant that
    changes several): each bar's value, or one line per setting, in one notation per setting."""
    keys = key.split(", ")
    columns = [_value_texts([settings[b].get(k) for b in bars]) for k in keys]
    if len(keys) == 1:
        return columns[0]
    return ["\n".join(f"{_short_key(k)}={col[i]}" for k, col in zip(keys, columns, strict=True))
            for i in range(len(bars))]


def _wrap_key(key: str, width: int) -> str:
    """A dotted setting name on lines of about `width` characters, broken after its dots."""
    lines = [""]
    for part in key.split("."):
        if lines[-1] and len(lines[-1]) + 1 + len(part) > width:
            lines[-1] += "."
            lines.append(part)
        else:
            lines[-1] += f".{part}" if lines[-1] else part
    return "\n".join(lines)


def _panel_texts(panels: list[tuple[str, dict[str, Any], list[str]]], reference: Mapping[str, Any],
                 changes: Mapping[str, Mapping[str, Any]], early: Mapping[str, int]) -> list[dict[str, Any]]:
    """Fig 9's words per panel: its title, tick labels (starred where read at another step),
    x label, and width in inches (0.8 a bar and 0.4, so bars are equally wide; more where a
    level's label or a setting's name needs the room, at ~14 characters an inch; bar names are
    rotated and need none)."""
    out = []
    for i, (key, ctx, bars) in enumerate(panels):
        by_name = key in ("variant", "other")
        ticks = ([variant_label(b) for b in bars] if by_name
                 else _panel_labels(key, bars, {b: {**reference, **changes.get(b, {})} for b in bars}))
        ticks = [f"{label}*" if b in early else label for b, label in zip(bars, ticks, strict=True)]
        letter = f"({chr(ord('a') + i)}) " if len(panels) > 1 else ""
        if key == "variant":
            title = ""
        elif key == "other":
            title = f"{letter}other variants"
        else:
            title = letter + ", ".join(PANEL_TITLES.get(k, _short_key(k)) for k in key.split(", "))
            if ctx:
                title += " at " + ", ".join(_setting_label(ck, cv) for ck, cv in ctx.items())
        xlabel = "" if by_name or "," in key else ABLATED.get(key, key)  # several settings: each tick names its own
        lines = [line for t in ([] if by_name else ticks) for line in t.split("\n")]
        words = [len(w) for w in title.split()] + [len(p) + 1 for p in xlabel.split(".")]
        width = max(0.8 * len(bars), len(bars) * max(map(len, lines), default=0) / 14, max(words) / 14) + 0.4
        out.append({"ticks": ticks, "width": width, "xlabel": _wrap_key(xlabel, int(14 * width)),
                    # wrapped to the panel: long setting names ran into the next panel's title
                    "title": textwrap.fill(title, int(15 * width), break_long_words=False)})
    return out


def fig9(tables: Mapping[str, pl.DataFrame], out: str | Path,
         variants: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Ablations at a fixed step, dashed line = RL at the same step. With `variants` (what each
    variant changes, `fastslow.experiments.variant_settings`) one panel per ablated setting as in
    the paper (`ablation_panels`): each bar labelled by its value, the default's bar green. Without
    it, one panel of bars by variant name."""
    plt = _plt()
    abl = tables["ablations"]  # one method's runs (`draw`, `headline_tables`)
    task = abl["eval_task"][0]
    eff = tables.get("efficiency")
    compared = [abl]
    if eff is not None:
        compared.append(eff.filter((pl.col("eval_task") == task) & pl.col("method").is_in(["fst", "rl"])))
    step = common_step(pl.concat(compared, how="diagonal_relaxed"))
    runs = {v: rows_where(abl, variant=v) for v in sorted(abl["variant"].unique().to_list())}  # each bar's rows
    frames = [abl]
    if eff is not None and eff.filter(pl.col("eval_task") == task).height:
        frames.append(eff.filter(pl.col("eval_task") == task))
        runs.setdefault("default", rows_where(eff, eval_task=task, method="fst"))
    curves = {v: seed_curve(r) for v, r in runs.items()}
    values = {v: value_at_step(c, step) for v, c in curves.items()}
    # a bar whose run has no evaluation at the step (a variant with another T) shows an earlier one
    read_at = {v: int(c.filter(pl.col("step") <= step)["step"].max() or 0) for v, c in curves.items()}
    spread = {v: seed_se_at_step(r, read_at[v]) for v, r in runs.items()}  # over the seeds its bar averages
    early = {v: at for v, at in read_at.items() if at != step}
    for v, at in early.items():
        log.warning("fig9: %s has no evaluation at step %d; its bar shows step %d (marked *)", v, step, at)
    rl = float("nan")
    if eff is not None:
        rl = value_at_step(seed_curve(eff, eval_task=task, method="rl"), step)
    k = int(abl["k"][0])
    panels = ablation_panels(variants) if variants and variants.get("variants") else []
    reference = dict(variants.get("reference", {})) if variants else {}
    panels = [(key, ctx, [b for b in bars if b in values]) for key, ctx, bars in panels]
    panels = [p for p in panels if p[2]]
    placed = {b for _, _, bars in panels for b in bars}
    rest = [v for v in values if v not in placed]  # e.g. a variant that changes nothing
    if panels and rest:
        panels.append(("other", {}, rest))
    if not panels:  # no variant definitions: one panel, bars by name
        panels = [("variant", {}, list(values))]
    texts = _panel_texts(panels, reference, variants["variants"] if variants else {}, early)
    widths = [t["width"] for t in texts]
    fig, axes = plt.subplots(1, len(panels), sharey=True, squeeze=False, gridspec_kw={"width_ratios": widths},
                             figsize=(max(4.0, sum(widths) + 0.5 * len(widths) + 1.5), 3.4))
    changes = variants["variants"] if variants else {}
    for i, (ax, (key, _, bars), text) in enumerate(zip(axes[0], panels, texts, strict=True)):
        se = [spread[b] for b in bars]  # NaN: one seed, no error bar; none at all in a panel of one-seed bars
        headline = headline_bars(key, bars, reference, changes)
        drawn = ax.bar(range(len(bars)), [values[b] for b in bars], yerr=None if np.isnan(se).all() else se,
                       color=["#8fbc8f" if b in headline else "#b0b0b0" for b in bars],
                       error_kw={"ecolor": "#333333", "elinewidth": 0.8, "capsize": 3})
        ax.set_xticks(range(len(bars)), text["ticks"])
        for b, tick in zip(bars, ax.get_xticklabels(), strict=True):
            if b in headline:  # told apart at zero reward too, where a bar has no colour to show
                tick.set(color="#2e7d32", fontweight="bold")
        ax.set_xlabel(text["xlabel"])
        ax.bar_label(drawn, fmt="%.2f", fontsize=7, padding=2)  # a bar of height 0 is otherwise no bar at all
        ax.margins(y=0.12)  # room above the tallest bar for its label
        if not math.isnan(rl):
            ax.axhline(rl, color=COLORS["rl"], ls="--", label=f"RL at step {step}")
        ax.set_title(text["title"], fontsize=9)
        if i == 0:
            ax.set_ylabel(f"val mean@{k}")
        if key in ("variant", "other"):
            plt.setp(ax.get_xticklabels(), rotation=30, ha="right", rotation_mode="anchor")  # each ends at its bar
    for ax in axes[0]:  # the shared y axis once every panel's bars are drawn: the tallest fits
        _reward_axis(ax)
    if not math.isnan(rl):
        values["rl"] = rl
        axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the bars
    _suptitle(fig, f"Fig 9 — {task_label(task)} ablations (val mean@{k} at step {step})")
    default = ", ".join(_setting_label(key, reference[key]) for key in sorted(reference, key=_ablated_rank))
    note = ("Green bars (bold labels): the headline configuration's setting in each panel (default variant"
            + (f": {default}" if default else "") + "); grey: its ablations." if "default" in values else
            "No default bar: no FST run of the efficiency experiment on this task; grey: the ablations.")
    if any(not math.isnan(se) for se in spread.values()):
        note += " Error bars: ±1 standard error over seeds (bars of one seed have none)."
    if early:
        note += " *: not evaluated at step {}; read at step {}.".format(
            step, ", ".join(f"{at} ({v})" for v, at in sorted(early.items())))
    _footnote(fig, frames, note)
    _save(fig, out)
    return values


def cycle_seconds_per_step(df: pl.DataFrame) -> dict[str, list[float]]:
    """Each evaluated cycle's wall seconds over its T (step = (cycle + 1) x T; a cycle's time
    from loading the pool and model, through the fast round and the T RL steps, to saving; the
    job's start-up and imports are not in it), by variant, over
    every seed's run, right when only every n-th cycle is evaluated (eval_every)."""
    # by variant: one run may be two variants' (shared within the experiment), each counts it
    per_step = (df.filter(pl.col("cycle") >= 0).unique(["variant", "run", "cycle"]).sort(["run", "cycle"])
                .with_columns((pl.col("cycle_seconds") * (pl.col("cycle") + 1) / pl.col("step")).alias("s"))
                .group_by("variant", maintain_order=True).agg(pl.col("s").drop_nulls()))
    return dict(zip(per_step["variant"].to_list(), per_step["s"].to_list(), strict=True))


def seconds_per_step(df: pl.DataFrame) -> dict[str, float]:
    """Wall seconds per RL step by variant (`cycle_seconds_per_step`, averaged)."""
    return {v: (sum(s) / len(s) if s else float("nan")) for v, s in cycle_seconds_per_step(df).items()}


#: How unequally two variants' cycles may have had the CPU (the ratio of their mean
#: `cycle_cpu_share`s) before their wall times compare the machine's other jobs rather than the
#: variants: Fig 10 says so, and its claim has no verdict.
CPU_SHARE_RATIO = 1.25


def cpu_shares(df: pl.DataFrame) -> dict[str, float]:
    """Each variant's mean `cycle_cpu_share` over its evaluated cycles: the CPU time a cycle got
    of its threads' wall time (1: the cores to itself). Variants whose cycles recorded none (on a
    GPU, or cycle.json files older than the column) are left out."""
    if "cycle_cpu_share" not in df.columns:
        return {}
    per = (df.filter(pl.col("cycle") >= 0).unique(["variant", "run", "cycle"], maintain_order=True)
           .group_by("variant", maintain_order=True)
           .agg(pl.col("cycle_cpu_share").cast(pl.Float64).drop_nulls().drop_nans().mean()))
    return {v: float(s) for v, s in zip(per["variant"], per["cycle_cpu_share"], strict=True) if s is not None}


def unequal_cpu(shares: Mapping[str, float], label: Any = None) -> str:
    """Why two or more variants' wall times do not compare them (`CPU_SHARE_RATIO`), or "";
    the variants named by `label` (the figure's `variant_label`; the claims table keeps ids)."""
    if len(shares) < 2:
        return ""
    low, high = min(shares.values()), max(shares.values())
    if low > 0 and high / low <= CPU_SHARE_RATIO:
        return ""
    got = ", ".join(f"{(label or variant_label)(v)} {s:.0%}" for v, s in sorted(shares.items()))
    return (f"the variants' cycles had the CPU unequally ({got} of their threads' time): their wall "
            f"times differ by what else ran on the machine, not only by the variants")


def fig10(tables: Mapping[str, pl.DataFrame], out: str | Path) -> dict[str, dict[str, float]]:
    """Rollout reuse: validation reward by step and wall time per RL step, reuse vs none, and
    RL-only on the same task (efficiency's run, when the config has one) as the reference the
    paper's claim reads (RL ≈ 60 s a step, FST ≈ 100, FST with reuse ≈ 47). Returns each
    variant's seconds per RL step and last val mean@k, RL-only's under "rl"."""
    plt = _plt()
    df = tables["reuse"]
    task = df["eval_task"][0]
    eff = tables.get("efficiency")
    rl = (eff.filter((pl.col("eval_task") == task) & (pl.col("method") == "rl")) if eff is not None
          else df.clear())
    # RL-only over the reuse runs' steps alone: a step's cost follows its completions' lengths,
    # which drift as training goes on, so a longer run's mean step compared unlike stretches
    # (paper.yaml: efficiency's 300 steps against reuse's 150)
    last_step = df["step"].max()
    cut = rl.height and rl["step"].max() > last_step
    rl_steps = rl["step"].max() if cut else None
    rl = rl.filter(pl.col("step") <= last_step)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    variants = sorted(df["variant"].unique().to_list())
    # every variant is an FST run: FST's green throughout, told apart by line style and hatch
    # (no "--": RL-only's, beside them; in grayscale its blue and FST's green are one)
    styles, hatches = ("-", "-.", ":", (0, (5, 1))), ("", "//", "..", "xx")
    last, per_step, shares = {}, seconds_per_step(df), cpu_shares(df)  # shares: the CPU each variant's cycles got
    for i, v in enumerate(variants):
        c = seed_curve(df, variant=v)
        ax.plot(c["step"], c["mean_at_k"], marker="o", ms=3, label=variant_label(v), color=COLORS["fst"],
                ls=styles[i % 4])
        last[v] = float(c["mean_at_k"][-1])
    order = [v for v in variants if v in per_step]  # the bars in the legend's order
    colors, hatch, labels = [COLORS["fst"]] * len(order), [hatches[variants.index(v) % 4] for v in order], \
        [variant_label(v) for v in order]
    if rl.height:
        c = seed_curve(rl)
        ax.plot(c["step"], c["mean_at_k"], label=LABELS["rl"], **_line("rl"))
        last["rl"] = float(c["mean_at_k"][-1])
        rl_seconds = list(seconds_per_step(rl).values())
        if rl_seconds:  # one variant: efficiency's RL run (its seeds averaged)
            per_step["rl"] = rl_seconds[0]
            order.append("rl")
            colors.append(COLORS["rl"])
            hatch.append("")
            labels.append(LABELS["rl"])
            rl_share = list(cpu_shares(rl).values())  # none on a GPU
            if rl_share:
                shares["rl"] = rl_share[0]
    bars = ax2.bar(range(len(order)), [per_step[v] for v in order], color=colors, alpha=0.75,
                   edgecolor="white", hatch=hatch)
    ax2.set_xticks(range(len(order)), labels)
    ax2.bar_label(bars, [f"{per_step[v]:.{1 if per_step[v] >= 10 else 2}f}" + (f"\nCPU {shares[v]:.0%}" if v in shares else "") for v in order],
                  fontsize=8)  # the ratio is what the claim reads
    ax2.margins(y=0.35 if shares else 0.2)  # room above the tallest bar for its (two-line) label
    if len(last) > 1 and no_reward(df["mean_at_k"], rl["mean_at_k"]):  # the lines lie on each other at 0
        _corner_note(ax, _no_reward("no reward for any variant" + (" or RL" if rl.height else ""),
                                    "the lines overlap at 0", df, rl))
    ax.set(title="validation reward", xlabel="RL step", ylabel=f"val mean@{int(df['k'][0])}")
    _step_axis(ax)
    _reward_axis(ax)
    unequal = unequal_cpu(shares, lambda v: LABELS["rl"] if v == "rl" else variant_label(v))
    _note_title(ax2, "wall time per RL step\n(a cycle: loading, fast round, T steps, saving)",
                "not comparable: unequal CPU shares (the machine's other jobs)" if unequal else "")
    ax2.set(ylabel="seconds / step")
    ax.legend(fontsize=8)
    _suptitle(fig, f"Fig 10 — rollout reuse on {task_label(task)}")
    notes = ["" if rl.height else f"No RL-only run on {task_label(task)} (experiment efficiency) to compare with.",
             f"RL-only (efficiency's run, to step {rl_steps}) is drawn" + (" and timed" if "rl" in per_step else "")
             + f" up to step {last_step}, the reuse runs' last." if cut and rl.height else "",
             "CPU: the share of their threads' time the cycles got (100%: the cores to themselves; more than "
             f"{CPU_SHARE_RATIO:g}x apart, the wall times differ by load)." if shares else ""]
    _footnote(fig, [df, rl] if rl.height else [df], " ".join(n for n in notes if n))
    _save(fig, out)
    return {"seconds_per_step": per_step, "last": last}


def figure_metrics(fig: str, result: Any) -> dict[str, float]:
    """The numbers a figure function returned, as its MLflow run's metrics `<fig>/<key>[/<key>]`
    (Fig 9's bar heights, Fig 2's steps-to-peak ratios): nested mappings flattened, anything
    else (tables, fit objects) left out."""
    out: dict[str, float] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, Mapping):
            for name, sub in value.items():
                walk(sub, f"{key}/{name}")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)

    walk(result, fig)
    return out


FIGURES: dict[str, Callable[..., Any]] = {
    "fig2": fig2, "fig3": fig3, "fig4": fig4, "fig5": fig5, "fig6": fig6, "fig7": fig7,
    "fig8": fig8, "fig9": fig9, "fig10": fig10, "fig11": fig11,
}
