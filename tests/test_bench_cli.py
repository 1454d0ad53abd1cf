"""The benchmark scripts' argument checks and bench_fst_step's partial report.

Benchmarks never run here: each script runs as a subprocess under a guard that makes starting a
child process or loading a model raise, so a bad argument must be rejected before either, with one
line naming it (argparse's `error:` line, no traceback).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

# Runs a script as __main__ with child processes and model loading refused. matplotlib's first
# import on a machine (no font cache yet, as on a fresh CI machine) lists the fonts with `fc-list`:
# that one command may run.
GUARD = """
import os, runpy, subprocess, sys
run = subprocess.run
def refuse(*args, **kwargs):
    raise RuntimeError("GUARD: the script went on to start a child process or load a model")
def guarded_run(cmd, *args, **kwargs):
    if isinstance(cmd, (list, tuple)) and cmd and cmd[0] == "fc-list":
        return run(cmd, *args, **kwargs)
    refuse()
subprocess.run = guarded_run
import fastslow.model.convert, fastslow.model.generation
fastslow.model.convert.prepare_base_model = refuse
fastslow.model.generation.make_generator = refuse
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))  # as `python script.py` runs it
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_script(name: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # matplotlib without a font cache, as on a fresh machine: its first import runs `fc-list`
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLCONFIGDIR": str(cwd / ".matplotlib")}
    return subprocess.run([sys.executable, "-c", GUARD, str(BENCH / name), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def error_line(proc: subprocess.CompletedProcess[str], name: str) -> str:
    """The one `error:` line of a rejected call (after argparse's usage lines, if any)."""
    assert "Traceback" not in proc.stderr and "GUARD" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    errors = [line for line in proc.stderr.splitlines() if line.startswith(f"{name}: error: ")]
    assert len(errors) == 1 and proc.stderr.rstrip("\n").splitlines()[-1] == errors[0], proc.stderr
    return errors[0]


@pytest.mark.parametrize(("args", "named"), [
    (["--seeds", "a"], "--seeds 'a'"),
    (["--seeds", "0,x"], "--seeds '0,x'"),
    (["--cycles", "0"], "--cycles 0"),
    (["--reps", "0"], "--reps 0"),
    (["--methods", "rl,fts"], "'fts'"),
    (["--set", "slow.lr=fast"], "--set 'slow.lr=fast': config error: slow.lr: expected a number"),
    (["--set", "generation.temperature=0.5", "--set", "generation.max_new_token=32"],
     "--set 'generation.max_new_token=32': config error: generation: unknown key 'max_new_token'"),
    (["--set", "slow.a=1", "--set", "slow.a.b=2"], "--set 'slow.a.b=2': slow.a is already set to 1"),
    (["--set", "slow.lr"], "--set 'slow.lr': expected SECTION.KEY=VALUE"),
    (["--set", "fast.pool_size=3"], "--set 'fast.pool_size=3'"),
    # the cross-field checks too (SlowConfig's, which the cycle job would otherwise raise)
    (["--set", "slow.micro_batch_size=3"],
     "--set 'slow.micro_batch_size=3': config error: slow.micro_batch_size: expected null or a divisor of P*G = 8"),
    (["--set", "slow.lr=.inf"], "--set 'slow.lr=.inf': config error: slow.lr: expected a finite number, got inf"),
    # what the benchmark does not read (it was recorded in the report and ignored)
    (["--set", "model.base=tiny-random"], "--set 'model.base=tiny-random': the benchmark runs the embedded "
                                          "default (SmolLM2-135M-Instruct) on results/data/<task>/train.parquet "
                                          "and does not read model.base"),
    (["--set", "data.sizes.train=8"], "does not read data.sizes.train"),
    (["--set", "slow.lr=1e-5", "--task", "nope"], "--task 'nope': unknown task"),  # 1e-5 passed the check
])
def test_bench_fst_step_rejects_bad_arguments(tmp_path: Path, args: list[str], named: str) -> None:
    proc = run_script("bench_fst_step.py", [*args, "--out", str(tmp_path / "fst_step.json")], tmp_path)
    assert named in error_line(proc, "bench_fst_step.py")
    assert not (tmp_path / "fst_step.json").exists()


@pytest.mark.parametrize(("args", "named"), [
    (["--sources", "[bad"], "--sources '[bad': not JSON"),
    (["--sources", '{"basic_arithmetic": {}}'], "expected a non-empty JSON list"),
    (["--sources", '[["basic_arithmatic", {}]]'], "'basic_arithmatic'"),
    (["--sources", '[["basic_arithmetic", {"min_termz": 2}]]'], "min_termz"),
    (["--task", "nope"], "--task 'nope'"),
    (["--k", "0"], "--k 0"),
])
def test_gepa_probe_rejects_bad_arguments(tmp_path: Path, args: list[str], named: str) -> None:
    proc = run_script("gepa_probe.py", [*args, "--out", str(tmp_path / "gepa.json")], tmp_path)
    assert named in error_line(proc, "gepa_probe.py")


@pytest.mark.parametrize(("args", "named"), [
    (["--reps", "0"], "--reps: must be an integer >= 1, got 0"),
    (["--child-prompts", "-1"], "--child-prompts: must be an integer >= 1, got -1"),
    (["--task", "nope"], "--task 'nope'"),
])
def test_bench_prefix_rejects_bad_arguments(tmp_path: Path, args: list[str], named: str) -> None:
    proc = run_script("bench_prefix.py", [*args, "--out", str(tmp_path / "prefix.json")], tmp_path)
    assert named in error_line(proc, "bench_prefix.py")


@pytest.mark.parametrize(("args", "named"), [
    (["--copies", "0"], "--copies: must be an integer >= 1, got 0"),
    (["--reps", "0"], "--reps: must be an integer >= 1, got 0"),
    (["--copies", "4", "--sizes", "8", "10", "24"], "--sizes 10: every size must be a positive multiple of --copies 4"),
    (["--sizes", "0", "8"], "--sizes 0"),
    (["--sizes", "8", "8"], "--sizes 8 8: need at least two different sizes"),
    (["--dtype", "float16"], "--dtype: invalid choice: 'float16'"),
])
def test_bench_call_cost_rejects_bad_arguments(tmp_path: Path, args: list[str], named: str) -> None:
    proc = run_script("bench_call_cost.py", [*args, "--out", str(tmp_path / "call_cost.json")], tmp_path)
    assert named in error_line(proc, "bench_call_cost.py")
    assert not (tmp_path / "call_cost.json").exists()

@pytest.mark.parametrize(("args", "named"), [
    (["--steps", "0"], "--steps: must be an integer >= 1, got 0"),  # ran no cycle, then failed on its state
    (["--cycle-steps", "0"], "--cycle-steps: must be an integer >= 1, got 0"),  # divided by zero
    (["--steps", "25"], "--steps must be a multiple of --cycle-steps, got 25 and 10"),
    (["--seeds", "-1"], "--seeds: must be an integer >= 0, got -1"),
])
def test_rl_math_probe_rejects_bad_arguments_before_preparing_the_model(tmp_path: Path, args: list[str],
                                                                       named: str) -> None:
    proc = run_script("rl_math_probe.py", [*args, "--out", str(tmp_path / "probe.json")], tmp_path)
    assert named in error_line(proc, "rl_math_probe.py")
    assert not (tmp_path / "results").exists()  # the model (results/bench/...) was not prepared first



def load(name: str) -> ModuleType:
    """A bench/ script as a module, imported as it runs: with bench/ on sys.path for its siblings."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load("bench_fst_step")


@pytest.fixture(scope="module")
def environment() -> ModuleType:
    return load("environment")


AMD_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx fma avx2 bmi2
processor\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx fma avx2 bmi2
"""
AMX_CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""


def test_environment_names_the_cpu_kind_that_sets_the_ratios(environment: ModuleType) -> None:
    """The three machine kinds the README's Targets name apart: their CPU flags decide bf16."""
    assert environment.cpu(AMD_CPUINFO) == {"model": "AMD EPYC", "flags": ["avx2", "fma"], "native_bf16": False}
    assert environment.cpu(AMX_CPUINFO) == {
        "model": "Intel(R) Xeon(R) Platinum 8488C",
        "flags": ["avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"], "native_bf16": True}
    assert environment.cpu("")["flags"] == []  # no /proc/cpuinfo: the platform's name, no flags
    zen5 = "model name\t: AMD EPYC\nflags\t\t: avx2 fma avx512f avx512_bf16 avx512_vp2intersect\n"
    assert environment.cpu(zen5)["flags"][-2:] == ["avx512_bf16", "avx512_vp2intersect"]  # Zen 5, not Zen 4


def test_every_report_says_where_it_ran(environment: ModuleType, tmp_path: Path) -> None:
    machine = environment.describe()
    linux = Path("/proc/cpuinfo").exists()
    assert machine["cpu"] == environment.cpu(Path("/proc/cpuinfo").read_text() if linux else "")
    assert machine["cpu_count"] >= machine["usable_cpus"] >= 1 and (machine["memory_gib"] > 0 or not linux)
    assert machine["libraries"]["torch"].split("+")[0].count(".") == 2  # e.g. 2.13.0
    assert len(machine["commit"]) == 40 and isinstance(machine["tracked_files_modified"], bool)
    written = environment.write_report(tmp_path / "sub" / "x.json", {"a": 1})
    assert json.loads((tmp_path / "sub" / "x.json").read_text()) == written
    assert written["a"] == 1 and set(written["environment"]) == set(machine)
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["x.json"]  # no temporaries


def test_a_report_names_the_settings_that_change_its_numbers(environment: ModuleType,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # three RL runs of one command on one seed, glibc's mmap threshold at 4 MiB, 16 MiB and left
    # alone, peaked 5789, 5876 and 5880 MiB: without the variable their reports read alike
    monkeypatch.setenv("FASTSLOW_MMAP_THRESHOLD", "4194304")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    machine = environment.describe()
    assert machine["variables"]["FASTSLOW_MMAP_THRESHOLD"] == "4194304"
    assert machine["variables"]["OMP_NUM_THREADS"] == "1" and "HF_HUB_OFFLINE" not in machine["variables"]
    assert environment.variables({"MALLOC_ARENA_MAX": "2", "HOME": "/root", "LD_PRELOAD": "x.so",
                                  "FASTSLOW": "no underscore"}) == {"LD_PRELOAD": "x.so", "MALLOC_ARENA_MAX": "2"}


def test_peak_memory_is_in_mib_on_linux_and_on_macos(environment: ModuleType) -> None:
    """`ru_maxrss` is KiB on Linux and bytes on macOS: a Mac's report read it as KiB."""
    assert environment.peak_rss_mb(5 * 2**20, "Linux") == environment.peak_rss_mb(5 * 2**30, "Darwin") == 5 * 2**10
    assert 50 < environment.peak_rss_mb() < 2**20  # this process, in MiB


def test_set_values_parse_as_the_schema_expects(bench: ModuleType) -> None:
    """Parent and children parse --set alike (one function); YAML 1.1 leaves 1e-5 a string."""
    assert bench.parse_sets(["slow.lr=1e-5", "slow.micro_batch_size=1", "slow.bf16=false", "a.b=1.5E3",
                             "seed_context=Be brief.", "a.c=1e-5x"]) == \
        {"slow": {"lr": 1e-5, "micro_batch_size": 1, "bf16": False}, "a": {"b": 1500.0, "c": "1e-5x"},
         "seed_context": "Be brief."}
    bench.check_config(list(bench.METHODS), "math", 2, None, ["slow.lr=1e-5", "slow.micro_batch_size=1"])
    with pytest.raises(ValueError, match=r"^--set 'slow.num_generations=5' \(method fst\): config error"):
        bench.check_config(list(bench.METHODS), "math", 2, None, ["slow.num_generations=5"])
    bench.check_config(["rl"], "math", 2, None, ["slow.num_generations=5"])  # RL-only: pool size 1


def fake_run(method: str, seed: int, seconds: float) -> dict[str, Any]:
    per_step = {"generation": seconds / 2, "scoring": 0.0, "training": seconds / 2, "fast_round": 0.0, "other": 0.0}
    return {"method": method, "seed": seed, "process": "run", "peak_rss_mb": 100.0,
            "cycles": [{"cycle": 0, "steps": 2, "wall_s": 2 * seconds, "per_step": per_step,
                        "wall_per_step_s": seconds}]}


def test_write_report_marks_partial_reports(bench: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "fst_step.json"
    results: dict[str, list[dict[str, Any]]] = {"rl": [fake_run("rl", 0, 4.0)], "fst": []}
    bench.write_report(out, {"task": "math"}, results, planned=2)
    report = json.loads(out.read_text())
    assert (report["task"], report["complete"], report["runs_done"], report["runs_planned"]) == ("math", False, 1, 2)
    assert report["runs"]["rl"][0]["cycles"][0]["wall_per_step_s"] == 4.0 and report["runs"]["fst"] == []
    assert set(report["summary"]) == {"rl"} and report["summary"]["rl"]["ratio_to_rl"] == 1.0
    results["fst"].append(fake_run("fst", 0, 5.0))
    machine = {"cpu": {"model": "the machine the benchmark started on"}}
    bench.write_report(out, {"task": "math"}, results, planned=2, machine=machine)
    report = json.loads(out.read_text())
    assert report["complete"] is True and report["runs_done"] == 2
    assert report["environment"] == machine  # a report rewritten after each run keeps its start's
    assert report["summary"]["fst"]["ratio_to_rl"] == 1.25
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fst_step.json", "fst_step.png"]  # no temporaries


def test_a_failing_run_keeps_the_finished_ones(bench: ModuleType, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """rl finishes, fst's child fails: the report on disk holds rl's run, marked incomplete."""
    (tmp_path / "data" / "math").mkdir(parents=True)
    (tmp_path / "data" / "math" / "train.parquet").touch()
    monkeypatch.setattr(bench, "DATA", tmp_path / "data", raising=False)  # the train file it checks
    calls: list[str] = []

    def run_child(cmd: list[str], method: str) -> dict[str, Any]:
        calls.append(method)
        if method == "fst":
            raise SystemExit("fst failed:\nboom")
        return fake_run(method, 0, 4.0)

    monkeypatch.setattr(bench, "run_child", run_child)
    out = tmp_path / "fst_step.json"
    monkeypatch.setattr(sys, "argv", ["bench_fst_step.py", "--methods", "rl,fst", "--cycles", "1",
                                      "--process", "run", "--out", str(out)])
    with pytest.raises(SystemExit, match="fst failed"):
        bench.main()
    assert calls == ["rl", "fst"]
    report = json.loads(out.read_text())
    assert report["complete"] is False and [r["method"] for r in report["runs"]["rl"]] == ["rl"]
    assert report["runs"]["fst"] == [] and set(report["summary"]) == {"rl"}
    assert report["environment"]["cpu"]["model"] and len(report["environment"]["commit"]) == 40


def test_report_gives_the_search_floor_of_each_fast_method(bench: ModuleType, tmp_path: Path) -> None:
    """search_floor_ratio = 1 + the search's evaluation seconds a step / RL-only's seconds a step:
    what a method would cost if its round were only the children's rollouts."""
    out = tmp_path / "fst_step.json"
    fst = fake_run("fst", 0, 6.0)
    fst["cycles"][0]["per_step"]["fast_round"] = 2.0
    fst["cycles"][0]["fast_round_per_step"] = {"seeds": 1.0, "search": 0.8, "rest": 0.2}
    old = fake_run("fst_reuse", 0, 5.0)  # a run from before the split: no floor
    bench.write_report(out, {"task": "math"}, {"rl": [fake_run("rl", 0, 4.0)], "fst": [fst], "fst_reuse": [old]},
                       planned=3)
    summary = json.loads(out.read_text())["summary"]
    assert summary["fst"]["search_floor_ratio"] == pytest.approx(1.2)
    assert summary["rl"]["search_floor_ratio"] is None and summary["fst_reuse"]["search_floor_ratio"] is None
    assert (tmp_path / "fst_step.png").stat().st_size > 0


def test_summary_pairs_each_method_with_rl_on_the_same_seeds(bench: ModuleType, tmp_path: Path) -> None:
    """Seconds a step: the mean over seeds of each seed's fastest repetition; the ratio divides by
    RL-only's over the same seeds (never one method's fastest seed by another's); peak RSS is the
    highest of all runs, not the fastest run's."""
    out = tmp_path / "fst_step.json"
    rl = [fake_run("rl", 0, 10.0), fake_run("rl", 1, 6.0), fake_run("rl", 1, 7.0)]  # seed 1 twice (reps)
    fst = [fake_run("fst", 0, 11.0), fake_run("fst", 1, 9.0)]
    fst[0]["peak_rss_mb"] = 300.0  # the slower seed's run peaked higher
    for run, search in zip(fst, (1.0, 3.0), strict=True):
        run["cycles"][0]["fast_round_per_step"] = {"seeds": 0.0, "search": search, "rest": 0.0}
    bench.write_report(out, {"task": "math"}, {"rl": rl, "fst": fst}, planned=5)
    summary = json.loads(out.read_text())["summary"]
    assert summary["rl"]["s_per_step"] == pytest.approx(8.0) and summary["rl"]["seeds"] == [0, 1]
    assert summary["fst"]["s_per_step"] == pytest.approx(10.0)
    assert summary["fst"]["ratio_to_rl"] == pytest.approx(10.0 / 8.0)  # not 9 / 6 (fastest of each)
    assert summary["fst"]["ratio_by_seed"] == {"0": pytest.approx(1.1), "1": pytest.approx(1.5)}
    assert summary["fst"]["mean_ratio_by_seed"] == pytest.approx(1.3)  # the seeds' ratios averaged, not 10 / 8
    assert summary["fst"]["search_floor_ratio"] == pytest.approx(1 + 2.0 / 8.0)
    assert summary["fst"]["peak_rss_mb"] == 300.0
    assert summary["rl"]["mean_s_per_step"] == pytest.approx(23.0 / 3)
    assert summary["fst"]["job_s_per_step"] is None  # --process run, or a report from before it
    for run, job in zip(rl + fst, (24.0, 16.0, 18.0, 26.0, 22.0), strict=True):
        run["cycles"][0]["job_wall_s"] = job  # the cycle job, start-up included (2 steps a cycle)
    bench.write_report(out, {"task": "math"}, {"rl": rl, "fst": fst}, planned=5)
    summary = json.loads(out.read_text())["summary"]
    assert summary["fst"]["job_s_per_step"] == pytest.approx(12.0)  # (26 + 22) / 2 / 2 steps
    assert summary["fst"]["job_ratio_to_rl"] == pytest.approx(12.0 / 10.0)  # RL: (24 + 16) / 2 / 2
    # a partial report: fst has a seed RL-only has not finished; only the shared seed is compared
    bench.write_report(out, {"task": "math"}, {"rl": rl[:1], "fst": fst}, planned=5)
    summary = json.loads(out.read_text())["summary"]
    assert summary["fst"]["seeds"] == [0] and summary["fst"]["ratio_to_rl"] == pytest.approx(1.1)
    bench.write_report(out, {"task": "math"}, {"rl": rl[1:], "fst": fst[:1]}, planned=5)  # no seed shared
    summary = json.loads(out.read_text())["summary"]
    assert summary["fst"]["ratio_to_rl"] is None and summary["fst"]["ratio_by_seed"] == {}


def test_run_child_times_the_whole_process(bench: ModuleType) -> None:
    """job_wall_s: the child's wall time from start to exit, start-up included."""
    code = 'import json, time; time.sleep(0.2); print("RESULT " + json.dumps({"a": 1}))'
    res = bench.run_child([sys.executable, "-c", code], "rl")
    assert res["a"] == 1 and res["job_wall_s"] >= 0.2
    with pytest.raises(SystemExit, match="rl failed"):
        bench.run_child([sys.executable, "-c", "raise SystemExit(3)"], "rl")


def test_plot_label_names_the_task_and_overrides(bench: ModuleType) -> None:
    assert bench.plot_label({"task": "hover_hard", "overrides": {}}) == "hover_hard"
    assert bench.plot_label({"task": "hover_hard", "overrides": {"slow": {"steps_per_cycle": 6},
                                                                 "fast": {"max_metric_calls": {"light": 18}}}}) == \
        "hover_hard, slow.steps_per_cycle=6, fast.max_metric_calls.light=18"
    assert bench.plot_label({"task": "math", "overrides": {}}, 0.5) == \
        "math\n0.50 GEPA metric calls per RL rollout (paper 0.625)"


def test_report_gives_the_search_size_per_rl_rollout(bench: ModuleType, tmp_path: Path) -> None:
    """calls_per_rl_rollout = the last cycle's fast-round metric calls / its RL rollouts (the
    paper's 960 / (6 x 256)); none for RL-only or a run recorded without the counts."""
    out = tmp_path / "fst_step.json"
    fst = fake_run("fst", 0, 6.0)
    fst["cycles"].append({**fst["cycles"][0], "cycle": 1, "fast_metric_calls": 30, "rl_rollouts": 48})
    fst["cycles"][0].update(fast_metric_calls=12, rl_rollouts=48)  # cycle 0 is not the one reported
    rl = fake_run("rl", 0, 4.0)
    rl["cycles"][0].update(fast_metric_calls=None, rl_rollouts=48)
    bench.write_report(out, {"task": "math"}, {"rl": [rl], "fst": [fst], "fst_reuse": [fake_run("fst_reuse", 0, 5.0)]},
                       planned=3)
    summary = json.loads(out.read_text())["summary"]
    assert summary["fst"]["calls_per_rl_rollout"] == pytest.approx(30 / 48)
    assert summary["rl"]["calls_per_rl_rollout"] is None and summary["fst_reuse"]["calls_per_rl_rollout"] is None
    assert bench.PAPER_CALLS_PER_ROLLOUT == pytest.approx(0.625)


def test_rl_batched_samples_its_cycle_in_one_call_and_is_compared_with(bench: ModuleType, tmp_path: Path) -> None:
    """rl_batched is RL-only with slow.steps_per_generation above any T (a --set may choose its own);
    it runs only when named, and the summary gives each method's ratio to it on the same seeds."""
    import dataclasses

    spec = bench.run_spec("rl_batched", "math", 2, 0, None, {})
    assert spec.method == "rl" and spec.overrides["slow"]["steps_per_generation"] >= 1000
    assert bench.run_spec("rl_batched", "math", 2, 0, False, bench.parse_sets(["slow.steps_per_generation=2"])) \
        .overrides["slow"] == {"bf16": False, "steps_per_generation": 2}
    assert "steps_per_generation" not in bench.run_spec("rl", "math", 2, 0, None, {}).overrides.get("slow", {})
    bench.check_config(["rl_batched"], "math", 2, None, [])  # a valid config, T or not
    assert "rl_batched" in bench.METHODS and "rl_batched" not in bench.DEFAULT_METHODS
    assert dataclasses.is_dataclass(spec)
    out = tmp_path / "fst_step.json"
    runs = {"rl": [fake_run("rl", 0, 10.0)], "rl_batched": [fake_run("rl_batched", 0, 8.0)],
            "fst_reuse": [fake_run("fst_reuse", 0, 11.0), fake_run("fst_reuse", 1, 9.0)]}
    # its cycles report an (empty) round split, as every cycle of a real run does
    runs["rl_batched"][0]["cycles"][0]["fast_round_per_step"] = {"seeds": 0.0, "search": 0.0, "rest": 0.0}
    bench.write_report(out, {"task": "math"}, runs, planned=4)
    summary = json.loads(out.read_text())["summary"]
    assert summary["fst_reuse"]["ratio_to_rl"] == pytest.approx(1.1)
    assert summary["fst_reuse"]["ratio_to_rl_batched"] == pytest.approx(11.0 / 8.0)
    assert summary["rl_batched"]["ratio_to_rl"] == pytest.approx(0.8)
    assert summary["rl_batched"]["search_floor_ratio"] is None  # RL-only: no search
    del runs["rl_batched"]
    bench.write_report(out, {"task": "math"}, runs, planned=3)
    assert json.loads(out.read_text())["summary"]["fst_reuse"]["ratio_to_rl_batched"] is None


def test_targets_plot_reads_each_kinds_ratios_from_the_kept_reports(tmp_path: Path) -> None:
    """bench/targets.py: the README's Targets numbers come out of the raw JSON in bench/measured/,
    and a report that names its machine joins its kind without being listed."""
    targets = load("targets")
    measured = tmp_path / "measured"
    measured.mkdir()
    for name in targets.SOURCES:
        (measured / name).write_bytes((BENCH / "measured" / name).read_bytes())
    summary = targets.summarize(targets.points(measured))
    assert summary["amx/fst"]["runs"] == 3 and round(summary["amx/fst"]["mean"], 2) == 1.31  # README: 1.31x
    assert summary["amx/fst_reuse"]["runs"] == 4 and round(summary["amx/fst_reuse"]["mean"], 2) == 1.00
    assert [round(r, 2) for r in summary["amd_fp32/fst"]["ratios"]] == [1.60]
    assert summary["intel_fp32/fst"]["met"] is False and "intel_fp32/fst_reuse" not in summary
    assert (summary["amd_fp32/fst_reuse"]["runs"], summary["amd_fp32/fst_reuse"]["seeds"]) == (4, 2)
    # a new report of the CPU default on an AMD machine: counted there; one with a --set is not
    new = {"task": "hover_hard", "overrides": {}, "bf16": None, "complete": True, "threads": 1, "process": "cycle",
           "cycles": 2,
           "summary": {"rl": {"ratio_by_seed": {"5": 1.0}}, "fst": {"ratio_by_seed": {"5": 1.5}},
                       "fst_reuse": {"ratio_by_seed": {"5": 0.9}}},
           "environment": {"cpu": {"model": "AMD EPYC 7B13", "flags": ["avx2", "fma"], "native_bf16": False}}}
    (measured / "fst_step_new.json").write_text(json.dumps(new))
    (measured / "fst_step_p4.json").write_text(json.dumps({**new, "overrides": {"slow": {"problems_per_step": 4}}}))
    # ...nor one cut short, on two threads, of one cycle, or with the steps in the benchmark's process
    for name, change in {"cut": {"complete": False}, "threads": {"threads": 2}, "one_cycle": {"cycles": 1},
                         "run": {"process": "run"}}.items():
        (measured / f"fst_step_{name}.json").write_text(json.dumps({**new, **change}))
    # one whose cycles trained under activation checkpointing (the fp32 kinds' `auto`, dbca0fa on)
    # is a group of its own beside its kind's; a checkpointed bf16 kind's has no column
    cycles = {"rl": [{"cycles": [{"activation_checkpointing": True}]}], "fst": [{"cycles": [{}]}]}
    ckpt = {**new, "runs": cycles, "summary": {"rl": {"ratio_by_seed": {"6": 1.0}},
                                               "fst": {"ratio_by_seed": {"6": 1.25}}}}
    (measured / "fst_step_ckpt.json").write_text(json.dumps(ckpt))
    zen4 = {"cpu": {"model": "AMD EPYC", "flags": ["avx2", "avx512f", "avx512_bf16"], "native_bf16": True}}
    (measured / "fst_step_ckpt_bf16.json").write_text(json.dumps({**ckpt, "environment": zen4}))
    assert targets.checkpointed({**new, "runs": cycles}) and not targets.checkpointed(new)
    report = targets.main(["--measured", str(measured), "--out", str(tmp_path / "out" / "targets.png")])
    assert summary["amd_fp32/fst"]["runs"] + 1 == report["summary"]["amd_fp32/fst"]["runs"]
    assert report["summary"]["amd_fp32/fst"]["ratios"][-1] == 1.5
    # a seed run twice weighs once: AMD fp32's reuse ran seeds 0 and 1 twice each (s40, s43:
    # 1.1774 and 1.0221; 1.1016 and 1.0832), the new report seed 5 once (0.9)
    reuse = report["summary"]["amd_fp32/fst_reuse"]
    assert (reuse["runs"], reuse["seeds"]) == (5, 3)
    assert reuse["mean"] == pytest.approx((1.09975 + 1.0924 + 0.9) / 3, abs=1e-4)  # 1.0307
    assert reuse["run_mean"] == pytest.approx(1.05686, abs=1e-4) and reuse["met"] is False
    assert [p["file"] for p in report["points"]].count("fst_step_new.json") == 2  # fst and fst_reuse, not rl
    assert {p["file"] for p in report["points"]}.isdisjoint(
        {f"fst_step_{name}.json" for name in ("p4", "cut", "threads", "one_cycle", "run", "ckpt_bf16")})
    assert report["summary"]["amd_fp32_ckpt/fst"]["ratios"] == [1.25]
    assert [p["kind"] for p in report["points"] if p["file"] == "fst_step_ckpt.json"] == ["amd_fp32_ckpt"]
    assert "bf16_no_amx_ckpt/fst" not in report["summary"]
    assert (tmp_path / "out" / "targets.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "out" / "targets.json").read_text())["summary"] == report["summary"]
    amx = {"cpu": {"model": "Intel(R) Xeon(R) Platinum 8488C", "flags": ["avx512_bf16", "amx_bf16"],
                   "native_bf16": True}}
    zen = {"cpu": {"model": "AMD EPYC", "flags": ["avx2", "avx512f", "avx512_bf16"], "native_bf16": True}}
    assert targets.kind_of(amx) == "amx" and targets.kind_of(zen) == "bf16_no_amx"
    assert targets.kind_of({"cpu": {"model": "Intel Xeon", "flags": ["avx2"], "native_bf16": False}}) == "intel_fp32"


def test_methods_run_in_a_rotated_order_per_seed(bench: ModuleType, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine drifting during a benchmark must not always count against the method that runs
    last: seed s starts at method s mod M, so seeds 0-2 put each of 3 methods once in each place."""
    (tmp_path / "data" / "math").mkdir(parents=True)
    (tmp_path / "data" / "math" / "train.parquet").touch()
    monkeypatch.setattr(bench, "DATA", tmp_path / "data", raising=False)
    calls: list[tuple[int, str]] = []

    def run_child(cmd: list[str], method: str) -> dict[str, Any]:
        seed = int(cmd[cmd.index("--seeds") + 1])
        calls.append((seed, method))
        run = fake_run(method, seed, {"rl": 4.0, "fst": 5.0, "fst_reuse": 4.4}[method])
        run["cycles"][0].update(fast_metric_calls=24, rl_rollouts=24)  # the progress line prints them
        return run

    monkeypatch.setattr(bench, "run_child", run_child)
    out = tmp_path / "fst_step.json"
    monkeypatch.setattr(sys, "argv", ["bench_fst_step.py", "--seeds", "0,1,2", "--cycles", "1",
                                      "--process", "run", "--out", str(out)])
    bench.main()
    assert calls == [(0, "rl"), (0, "fst"), (0, "fst_reuse"), (1, "fst"), (1, "fst_reuse"), (1, "rl"),
                     (2, "fst_reuse"), (2, "rl"), (2, "fst")]
    summary = json.loads(out.read_text())["summary"]
    assert list(summary) == ["rl", "fst", "fst_reuse"]  # the report keeps the methods' order
    assert summary["fst"]["ratio_by_seed"] == {"0": 1.25, "1": 1.25, "2": 1.25}
    assert bench.method_order(["rl", "fst"], seed=1, rep=1) == ["rl", "fst"]  # repetitions rotate too


def test_identical_training_work_gauges_the_timing_between_runs(bench: ModuleType) -> None:
    """FST whose pool kept the seed context trains on RL-only's very rollouts (same mean length to
    the token): its training time over RL-only's is the runs' timing alone. Other lengths: none."""
    rl, fst, reuse = fake_run("rl", 0, 4.0), fake_run("fst", 0, 4.4), fake_run("fst_reuse", 0, 4.0)
    for run, tokens in ((rl, 38.0), (fst, 38.0), (reuse, 42.7)):
        run["cycles"][0]["mean_completion_tokens"] = tokens
    summary = bench.summarize({"rl": [rl], "fst": [fst], "fst_reuse": [reuse]})
    assert summary["fst"]["training_ratio_same_tokens_by_seed"] == {"0": pytest.approx(1.1)}
    assert summary["fst_reuse"]["training_ratio_same_tokens_by_seed"] == {}
    assert summary["rl"]["training_ratio_same_tokens_by_seed"] == {}


def test_a_rule_snakemake_sampled_no_memory_of_has_no_peak_not_zero() -> None:
    """bench_workflow wrote "peak RSS 0 MB" for a rule none of whose jobs Snakemake sampled."""
    import polars as pl

    jobs = pl.DataFrame({"job": ["a", "b", "c"], "rule": ["cycle", "cycle", "figure"],
                         "seconds": [10.0, 30.0, 2.0], "max_rss_mb": [4000.0, None, None],
                         "cpu_seconds": [9.0, 28.0, 1.0]})
    totals = load("bench_workflow").rule_totals(jobs)
    assert totals == {"cycle": {"jobs": 2, "seconds": 40.0, "max_seconds": 30.0, "max_rss_mb": 4000.0},
                      "figure": {"jobs": 1, "seconds": 2.0, "max_seconds": 2.0, "max_rss_mb": None}}


def test_a_dry_run_whose_job_count_cannot_be_read_stops_the_cost_table(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    """paper_cost read no 'total N' line as 0 jobs; only "Nothing to be done" is 0 now."""
    paper_cost = load("paper_cost")
    outputs = iter(["Job stats:\njob    count\n-----  -----\ncycle   1680\ntotal   2094\n", "Nothing to be done.\n",
                    "Building DAG of jobs...\n"])
    monkeypatch.setattr(paper_cost.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a[0], 0, stdout=next(outputs), stderr=""))
    assert paper_cost.dry_run_jobs("all", "config/paper.yaml", tmp_path)[0] == 2094
    assert paper_cost.dry_run_jobs("all", "config/paper.yaml", tmp_path)[0] == 0
    with pytest.raises(SystemExit, match=r"^snakemake -n all: no job count \('total N'\) in its output"):
        paper_cost.dry_run_jobs("all", "config/paper.yaml", tmp_path)


def test_the_cost_table_times_all_targets_planning_as_the_median_of_its_runs(monkeypatch: pytest.MonkeyPatch,
                                                                              tmp_path: Path) -> None:
    """The README's `snakemake -n` target reads `dry_run_all_s`: it was one run, the first."""
    paper_cost = load("paper_cost")
    seconds = iter([11.0, 9.2, 9.4])
    planned = []

    def dry_run(target: str, config: str, workdir: Path) -> tuple[int, float]:
        planned.append(target)
        return (2094, next(seconds)) if target == "all" else (100, 1.0)

    monkeypatch.setattr(paper_cost, "dry_run_jobs", dry_run)
    monkeypatch.setattr(sys, "argv", ["paper_cost.py", "--out", str(tmp_path / "cost.json")])
    paper_cost.main()
    report = json.loads((tmp_path / "cost.json").read_text())
    assert planned[:3] == ["all"] * 3 and "all" not in planned[3:]
    assert (report["all_jobs"], report["dry_run_all_s"], report["dry_run_all_runs_s"]) == (2094, 9.4, [11.0, 9.2, 9.4])

    # a plan that changes between runs is not timed as one
    jobs = iter([2094, 0])
    monkeypatch.setattr(paper_cost, "dry_run_jobs", lambda *a: (next(jobs), 9.0))
    monkeypatch.setattr(sys, "argv", ["paper_cost.py", "--repeat", "2", "--out", str(tmp_path / "cost2.json")])
    with pytest.raises(SystemExit, match=r"^snakemake -n all planned \[2094, 0\] jobs in its 2 runs$"):
        paper_cost.main()
    assert not (tmp_path / "cost2.json").exists()


@pytest.mark.parametrize(("script", "args", "named"), [
    ("paper_cost.py", ["--repeat", "0"], "argument --repeat: must be an integer >= 1, got 0"),
    # a traceback from torch.set_num_threads, and a ZeroDivisionError after the whole simulation
    ("bench_generate.py", ["--threads", "0"], "argument --threads: must be an integer >= 1, got 0"),
    ("claims_noise.py", ["--pairs", "0"], "argument --pairs: must be an integer >= 1, got 0"),
    # these went on to load the model
    ("bench_generate.py", ["--reps", "0"], "argument --reps: must be an integer >= 1, got 0"),
    ("bench_generate.py", ["--dtypes", "float8"], "argument --dtypes: invalid choice: 'float8'"),
    ("bench_decode.py", ["--task", "nope"], "argument --task: unknown task 'nope' (tasks: "),
    ("bench_rl_step.py", ["--generations", "1"], "argument --generations: must be an integer >= 2, got 1"),
    ("bench_pool_step.py", ["--k", "0"], "argument --k: must be an integer >= 1, got 0"),
    ("bench_pool_step.py", ["--steps", "x"], "argument --steps: must be an integer >= 2, got 'x'"),
    # this one went on to build the every-figure DAG first
    ("bench_scheduler.py", ["--variants", "with,sometimes"],
     "argument --variants: must be a comma-separated list of with and without, got 'with,sometimes'"),
])
def test_the_other_benchmarks_reject_bad_arguments_before_they_start(tmp_path: Path, script: str,
                                                                     args: list[str], named: str) -> None:
    proc = run_script(script, [*args, "--out", str(tmp_path / "out.json")], tmp_path)
    assert named in error_line(proc, script)
    assert not (tmp_path / "out.json").exists()


def test_the_suite_benchmark_reads_counts_and_slowest_tests_from_junit() -> None:
    suite = load("bench_suite")
    xml = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="5">
    <testcase classname="tests.test_a" name="test_ok" time="1.5"/>
    <testcase classname="tests.test_a" name="test_slow" time="30.25"/>
    <testcase classname="tests.test_b" name="test_bad" time="2.0"><failure message="x">assert 0</failure></testcase>
    <testcase classname="tests.test_b" name="test_gpu" time="0.0"><skipped message="no GPU"/></testcase>
    <testcase classname="tests.test_c" name="test_setup" time="0.1"><error message="fixture">E</error></testcase>
    <testcase classname="tests.test_c" name="test_both" time="0.2"><failure message="x"/><error message="teardown"/></testcase>
    <testcase classname="tests.test_d" name="test_known" time="0.3"><skipped type="pytest.xfail" message="known"/></testcase>
    </testsuite></testsuites>"""
    outcome = suite.junit_outcome(xml, slowest=2)
    assert {k: outcome[k] for k in ("tests", "passed", "failed", "errors", "skipped", "xfailed")} == \
        {"tests": 7, "passed": 2, "failed": 2, "errors": 2, "skipped": 1, "xfailed": 1}
    assert outcome["slowest"] == [["tests.test_a::test_slow", 30.25], ["tests.test_b::test_bad", 2.0]]
    # 887 s printed as "15 min 47 s": the minutes were rounded, not floored
    assert [suite.minutes_seconds(s) for s in (887.4, 902.0, 59.6, 0.2)] == \
        ["14 min 47 s", "15 min 2 s", "1 min 0 s", "0 min 0 s"]


def test_the_suite_benchmark_reports_a_run_of_part_of_the_suite(tmp_path: Path) -> None:
    """A real run of one small test through the script: the report names the machine, the exit code
    and the counts pytest's JUnit file gave (a failing selection's exit code is kept, not hidden)."""
    out = tmp_path / "suite.json"
    ran = subprocess.run([sys.executable, str(BENCH / "bench_suite.py"), "--out", str(out), "--", "-n", "0",
                          "-p", "no:cacheprovider", "tests/test_bench_cli.py", "-k", "peak_memory_is_in_mib"],
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:] + ran.stdout[-2000:]
    report = json.loads(out.read_text())
    assert (report["exit_code"], report["tests"], report["passed"], report["failed"]) == (0, 1, 1, 0)
    assert report["slowest"][0][0].endswith("test_peak_memory_is_in_mib_on_linux_and_on_macos")
    assert report["cpu_seconds"] > 0 and report["wall_seconds"] > 0 and "cpu" in report["environment"]
    assert ran.stdout.rstrip().splitlines()[-1].startswith("suite: exit 0, ")
