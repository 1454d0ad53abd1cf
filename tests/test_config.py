"""Config validation: defaults fill in, and every malformed config fails in one line naming the key."""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from fastslow.config import ConfigError, deep_update, load_config, validate_config

ROOT = Path(__file__).resolve().parents[1]


def _default() -> dict:
    return yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def test_the_schema_is_package_data_and_a_lost_one_is_named_in_one_line(tmp_path, monkeypatch):
    """The schema sits beside fastslow.config (package data, in every wheel: the packaging test
    below), so it is found from any directory; an install that lost it says where it looked."""
    import fastslow.config as config

    monkeypatch.chdir(tmp_path)  # not a checkout
    assert config.schema_path() == Path(config.__file__).resolve().with_name("config.schema.yaml")
    validate_config(load_config(ROOT / "config" / "config.yaml"))
    monkeypatch.setattr(config, "SCHEMA_PATH", tmp_path / "site-packages" / "fastslow" / "config.schema.yaml")
    with pytest.raises(FileNotFoundError, match=r"^no config schema at .*site-packages/fastslow/config\.schema\.yaml: "
                                                 r"this fastslow install lacks its package data; reinstall it"):
        config.schema_path()


def test_shipped_configs_validate():
    for name in ("config.yaml", "paper.yaml"):
        cfg = load_config(ROOT / "config" / name)
        assert cfg["slow"]["num_generations"] % cfg["fast"]["pool_size"] == 0
    smoke = load_config(ROOT / "config" / "config.yaml", ROOT / "config" / "smoke.yaml")
    assert smoke["model"]["base"] == "tiny-random"
    assert smoke["slow"]["steps_per_cycle"] == 2


def test_defaults_fill_an_empty_config():
    cfg = validate_config({})
    assert cfg["model"]["base"] == "smollm2-135m-instruct"
    assert cfg["slow"]["epsilon_high"] == 4.0 and cfg["slow"]["beta"] == 0.001
    assert cfg["fast"]["max_metric_calls"]["light"] == 48


# (override, substring the one-line error must contain)
BAD = [
    ({"modle": {}}, "unknown key 'modle'"),
    ({"slow": {"lrr": 1e-5}}, "slow: unknown key 'lrr'"),
    ({"slow": {"num_generations": -3}}, "slow.num_generations: expected an integer >= 2, got -3"),
    ({"slow": {"num_generations": "four"}}, "slow.num_generations: expected an integer"),
    ({"slow": {"steps_per_cycle": -1}}, "slow.steps_per_cycle"),
    ({"slow": {"lr": 0}}, "slow.lr: expected a number > 0"),
    ({"slow": {"baseline": "group"}}, "slow.baseline: expected one of 'problem', 'prompt'"),
    ({"slow": {"bf16": "yes"}}, "slow.bf16: expected one of True, False, 'auto', got 'yes'"),
    ({"fast": {"pool_size": 3}}, "fast.pool_size: K=3 must divide slow.num_generations G=4"),
    ({"fast": {"pool_size": 0}}, "fast.pool_size"),
    # names that are one directory under results/ on macOS's case-insensitive file system
    ({"experiments": {"Efficiency": {"tasks": ["math"], "methods": ["rl"]}}},
     "experiments.Efficiency: differs from experiment 'efficiency' only in case"),
    ({"experiments": {"ablations": {"variants": {"K1": {"fast": {"pool_size": 1}}}}}},
     "experiments.ablations.variants.K1: differs from variant 'k1' only in case"),
    ({"data": {"source": "hf", "hf_datasets": {"../../tmp/x": {"path": "x/y"}}}},
     "data.hf_datasets: names use letters, digits and '_' only, got '../../tmp/x'"),
    ({"fast": {"preset": "medium"}}, "fast.preset: expected one of 'light', 'full'"),
    ({"fast": {"proposer": "magic"}}, "fast.proposer"),
    ({"fast": {"proposer": "reflective", "reflection": {"kind": "openai"}}}, "fast.reflection.base_url"),
    # no scheme: every reflection call failed (APIConnectionError) and FST trained as RL would
    ({"fast": {"reflection": {"base_url": "localhost:8000"}}},
     "fast.reflection.base_url: expected an http:// or https:// URL (e.g. http://localhost:8000/v1), got 'localhost:8000'"),
    ({"fast": {"proposer": "reflective", "reflection": {"kind": "hf", "path": "m", "prompt_template": "Improve: <curr_param>"}}},
     "fast.reflection.prompt_template: Missing placeholder(s) in prompt template: <side_info>"),
    ({"fast": {"reflection": {"api_key_env": "MY-KEY"}}}, "fast.reflection.api_key_env"),
    # keys the chosen kind never reads were dropped: a local model's URL, an endpoint's model path
    ({"fast": {"proposer": "reflective", "reflection": {"kind": "hf", "path": "m", "base_url": "http://h:8000/v1"}}},
     "fast.reflection.base_url: 'http://h:8000/v1' is not read by reflection kind 'hf' (openai and litellm only); remove it"),
    ({"fast": {"proposer": "reflective", "reflection": {"kind": "litellm", "model": "openai/m", "path": "/models/m"}}},
     "fast.reflection.path: '/models/m' is not read by reflection kind 'litellm' (hf only); remove it"),
    ({"fast": {"proposer": "reflective", "reflection": {"kind": "litellm", "model": "openai/m",
                                                        "chat_template_kwargs": {"enable_thinking": False}}}},
     "fast.reflection.chat_template_kwargs: {'enable_thinking': False} is not read by reflection kind 'litellm' "
     "(openai and hf only); remove it"),
    ({"fast": {"reflection": {"max_tokens": 0}}}, "fast.reflection.max_tokens: expected an integer >= 1, got 0"),
    ({"fast": {"max_metric_calls": {"light": 0}}}, "fast.max_metric_calls.light"),
    ({"fast": {"format_credit": 1.0}}, "fast.format_credit"),
    ({"data": {"tasks": []}}, "data.tasks: expected a list with at least 1 item"),
    ({"data": {"tasks": ["math", "chess"]}}, "data.tasks[1]: unknown task 'chess'"),
    ({"data": {"source": "web"}}, "data.source"),
    ({"data": {"sizes": {"val": 0}}}, "data.sizes.val"),
    ({"model": {"base": ""}}, "model.base: expected a non-empty string"),
    ({"model": {"base": "tiny-randm"}}, "model.base: unknown base model 'tiny-randm': expected"),
    ({"model": {"dtype": "float8"}}, "model.dtype"),
    ({"model": {"name": "a/b"}}, "model.name"),
    ({"generation": {"backend": "tgi"}}, "generation.backend"),
    ({"generation": {"top_p": 1.5}}, "generation.top_p: expected a number <= 1"),
    ({"generation": {"temperature": -1}}, "generation.temperature"),
    ({"generation": {"temperature": 1e-40}}, "generation.temperature: expected 0 (greedy) or a number >= 0.001, got 1e-40"),
    ({"slow": {"temperature": 1e-40}}, "slow.temperature: expected a number >= 0.001, got 1e-40"),
    # a greedy round cannot hand its samples to RL steps, which cannot be greedy (slow.temperature >= 0.001)
    ({"generation": {"temperature": 0}, "fast": {"reuse_in_slow": True}},
     "fast.reuse_in_slow: generation.temperature=0.0 must equal the slow loop's temperature 1.0 (the RL step trains "
     "on the fast round's samples); RL steps cannot sample greedily: turn fast.reuse_in_slow off for a greedy round"),
    # an hf reflection model samples here (SamplingParams): every call raised, the round gave up
    ({"fast": {"proposer": "reflective", "reflection": {"kind": "hf", "path": "gpt2", "temperature": 1e-5}}},
     "fast.reflection.temperature: expected 0 (greedy) or a number >= 0.001 for reflection kind 'hf', got 1e-05"),
    ({"evaluation": {"k": 0}}, "evaluation.k"),
    ({"mlflow_experiment": 3}, "mlflow_experiment: expected a string"),
    ({"data": {"options": {"physics": {"rel_tol": "tight"}}}},
     "data.options.physics.rel_tol: expected a number, got str 'tight'"),
    # not finite: stopped here, not by a traceback in the cycle job
    ({"slow": {"lr": float("inf"), "warmup_steps": 0}}, "slow.lr: expected a finite number, got inf"),
    ({"slow": {"lr": float("nan")}}, "slow.lr: expected a finite number, got nan"),
    ({"slow": {"max_grad_norm": float("inf")}}, "slow.max_grad_norm: expected a finite number, got inf"),
    ({"generation": {"temperature": float("-inf")}}, "generation.temperature: expected a finite number, got -inf"),
    ({"data": {"options": {"physics": {"rel_tol": float("nan")}}}},
     "data.options.physics.rel_tol: expected a finite number, got nan"),
    ({"slow": {"num_generations": 8.0}}, "slow.num_generations: expected an integer, got float 8.0"),
    # a key that also takes null says so, and an integer key says integer ([integer, "null"])
    ({"slow": {"micro_batch_size": 0}}, "slow.micro_batch_size: expected an integer >= 1 or null, got 0"),
    ({"slow": {"micro_batch_size": 2.0}}, "slow.micro_batch_size: expected an integer or null, got float 2.0"),
    ({"slow": {"max_grad_norm": "none"}}, "slow.max_grad_norm: expected a number or null, got str 'none'"),
    ({"slow": {"max_grad_norm": -1}}, "slow.max_grad_norm: expected a number > 0 or null, got -1"),
    ({"experiments": {"ablations": {"variants": {"k8": 8}}}},
     "experiments.ablations.variants.k8: expected an object or null, got int 8"),
    # what the slow loop checks of its batches (SlowConfig), checked before any job
    ({"slow": {"micro_batch_size": 3}},
     "slow.micro_batch_size: expected null or a divisor of P*G = 8 (slow.problems_per_step x slow.num_generations; "
     "one of [1, 2, 4, 8]), got 3"),
    ({"slow": {"baseline": "prompt"}, "fast": {"pool_size": 4}},
     "slow.baseline: 'prompt' with G=4, K=4 (fast.pool_size) gives groups of one rollout"),
    ({"model": {"name": ".."}}, "model.name: expected a directory name under results/models/, not '.' or '..', got '..'"),
    ({"model": {"name": "."}}, "model.name: expected a directory name under results/models/, not '.' or '..', got '.'"),
    # a brace in the name a local model.base gives broke planning (a WildcardError's traceback)
    ({"model": {"base": "/tmp/m{x}"}}, "model.base: the directory name it gives, 'm{x}', has characters other than "
     "letters, digits, '.', '_' and '-': set model.name, got '/tmp/m{x}'"),
    ({"seed_context": ""}, "seed_context: must be a non-empty string, got ''"),
    ({"seed_context": "  "}, "seed_context: must be a non-empty string, got '  '"),
    ({"data": {"options": {"codeio": {"max_prompt_chars": 2500.5}}}},
     "data.options.codeio.max_prompt_chars: expected an integer, got float 2500.5"),
    ({"data": {"options": {"codeio": {"isolate": "no"}}}}, "data.options.codeio.isolate: expected true or false"),
    ({"data": {"options": {"math": {"colour": 1}}}}, "data.options.math.colour: unknown option; expected one of sources"),
    # values each generator refuses: stopped here, not by a traceback in the task_data job
    ({"data": {"options": {"physics": {"rel_tol": 5}}}},
     "data.options.physics.rel_tol: expected a number in (0, 1), got 5"),
    ({"data": {"options": {"math": {"sources": "basic_arithmetic"}}}},
     "data.options.math.sources: expected a list of {dataset, config, weight} mappings, got str 'basic_arithmetic'"),
    ({"data": {"options": {"math": {"sources": {"dataset": "basic_arithmetic"}}}}},
     "data.options.math.sources: expected a list of {dataset, config, weight} mappings, got dict"),
    ({"data": {"options": {"math": {"sources": []}}}},
     "data.options.math.sources: expected at least one source, all with positive weight, got []"),
    ({"data": {"options": {"math": {"sources": [{"dataset": "basic_arithmetic", "weight": 0}]}}}},
     "data.options.math: source 'basic_arithmetic': weight: expected a positive number, got int 0"),
    ({"data": {"options": {"codeio": {"max_prompt_chars": 0}}}},
     "data.options.codeio.max_prompt_chars: expected an integer >= 1, got 0"),
    ({"data": {"options": {"codeio": {"max_answer_chars": -5}}}},
     "data.options.codeio.max_answer_chars: expected an integer >= 1, got -5"),
    ({"data": {"options": {"codeio": {"item_timeout": -1}}}},
     "data.options.codeio.item_timeout: expected a number of CPU seconds > 0, got -1"),
    ({"data": {"options": {"codeio": {"rel_tol": 1.5}}}},
     "data.options.codeio.rel_tol: expected a number in [0, 1), got 1.5"),
    # a template variable that rendering sets itself, or a name YAML made a number or a bool of,
    # had failed every prompt's rendering in the first job that samples
    ({"model": {"chat_template_kwargs": {"add_generation_prompt": False}}},
     "model.chat_template_kwargs.add_generation_prompt: set by every rendering itself"),
    ({"model": {"chat_template_kwargs": {"messages": []}}}, "model.chat_template_kwargs.messages: set by every"),
    ({"model": {"chat_template_kwargs": {True: "x"}}},
     "model.chat_template_kwargs: expected template variable names, got the bool True (quote it in YAML)"),
    # transformers' set_seed takes at most 2**32 - 1: the cycle had failed after its fast round
    ({"experiments": {"efficiency": {"seeds": [2**32]}}}, "experiments.efficiency.seeds[0]: expected"),
    # MLflow refuses a name over 500 characters (init_mlflow had failed naming no key)
    ({"mlflow_experiment": "x" * 501}, "mlflow_experiment: expected at most 500 characters, got 501"),
    ({"mlflow_experiment": "  "}, "mlflow_experiment: must name an MLflow experiment, got '  '"),
    # a path the file system refuses had been a traceback (OSError: File name too long)
    ({"model": {"base": "./" + "b" * 300}}, "model.base: './bbbb"),
    ({"data": {"files": {"mine": {"path": "b" * 300 + ".jsonl"}}}}, "data.files.mine.path: 'bbbb"),
    # a hub id the hub's own rules refuse had passed, to fail in the base_model job
    ({"model": {"base": "foo--bar/baz"}},
     "model.base: not a Hugging Face repository id: Cannot have -- or .. in repo_id: 'foo--bar/baz'"),
    # a value the train split cuts had been shown only as cut ("2 x 250 fast.minibatch_size")
    ({"fast": {"minibatch_size": 1000}}, "2 x 250 fast.minibatch_size (set 1000, cut to the 256 train problems "
                                         "less the 6 validation ones)"),
    ({"fast": {"val_problems": 1000}}, "2 x 128 fast.val_problems (set 1000, cut to half the 256 train problems)"),
    # a flag is no integer (Python's True == 1): `k: true` had been one sample, silently
    ({"evaluation": {"k": True}}, "evaluation.k: expected an integer, got bool True"),
    ({"data": {"options": {"codeio": {"max_prompt_chars": True}}}},
     "data.options.codeio.max_prompt_chars: expected an integer, got bool True"),
]


@pytest.mark.parametrize(("override", "expected"), BAD, ids=[str(o) for o, _ in BAD])
def test_bad_config_is_one_line_naming_the_key(override, expected):
    cfg = deep_update(copy.deepcopy(_default()), override)
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("config error: ")
    assert expected in msg, msg


def test_snakemake_stops_before_any_job_with_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("slow:\n  num_generations: -3\n")
    out = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--configfile", str(bad)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "slow.num_generations: expected an integer >= 2, got -3" in out.stderr
    assert "Traceback" not in out.stderr
    assert "Job stats" not in out.stdout + out.stderr


def test_an_overlay_drops_a_variant_with_null(tmp_path):
    from fastslow.experiments import expand

    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("experiments: {ablations: {variants: {t1: null, k8: {fast: {pool_size: 4}}}}}\n")
    cfg = load_config(ROOT / "config" / "config.yaml", overlay)
    variants = {s.variant for s in expand(cfg).values() if s.experiment == "ablations"}
    assert "t1" not in variants and {"k1", "k4", "k8", "full_gepa"} <= variants


def test_an_overlay_drops_an_experiment_with_null(tmp_path):
    from fastslow.experiments import expand

    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("experiments: {radar: null, plasticity: null}\n")
    cfg = load_config(ROOT / "config" / "config.yaml", overlay)
    assert "radar" not in cfg["experiments"] and "plasticity" not in cfg["experiments"]
    assert {s.experiment for s in expand(cfg).values()} == set(cfg["experiments"]) - {"radar", "plasticity"}


def test_a_config_file_that_does_not_parse_is_one_line(tmp_path) -> None:
    """load_config (the library's entry for notebooks) gave yaml's multi-line error naming
    "<unicode string>", not the file; a file that is not text gave a UnicodeDecodeError."""
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("fast:\n  pool_size: 4\n rounds: 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "config" / "config.yaml", overlay)
    assert str(err.value) == (f"config error: {overlay} does not parse as YAML "
                              "(expected <block end>, but found '<block mapping start>', line 3)")
    overlay.write_bytes(b"fast: \xff\n")
    with pytest.raises(ConfigError) as err:
        load_config(overlay)
    assert str(err.value) == f"config error: {overlay} is not UTF-8 text (invalid start byte at byte 6)"


def test_task_options_reach_the_generator_and_are_checked() -> None:
    from fastslow.config import make_task

    config = ROOT / "config" / "config.yaml"
    cfg = load_config(config)
    assert make_task(cfg, "codeio").max_prompt_chars == 2500
    assert make_task(cfg, "physics").rel_tol == 0.0075
    for bad, key in (({"codeio": {"max_promt_chars": 1}}, "data.options.codeio.max_promt_chars"),
                     ({"codex": {}}, "data.options.codex")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
            load_config(config, overrides={"data": {"options": bad}})
        assert "\n" not in str(err.value)


def test_a_math_mixture_from_the_config(tmp_path) -> None:
    """data.options.math.sources: a researcher's own reasoning-gym mixture, written as mappings."""
    from fastslow.config import make_task

    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({"data": {"options": {"math": {"sources": [
        {"dataset": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                   "max_digits": 2, "operators": ["+"]}}]}}}}))
    task = make_task(load_config(ROOT / "config" / "config.yaml", overlay), "math")
    shipped = load_config(ROOT / "config" / "config.yaml", ROOT / "config" / "addition.yaml")
    (source,) = make_task(shipped, "math").sources
    assert source.dataset == "basic_arithmetic" and source.config["max_terms"] == 2
    assert shipped["fast"]["format_credit"] == 0.5
    problems = task.problems("train", 5, 0)
    assert [s.dataset for s in task.sources] == ["basic_arithmetic"]
    for p in problems:
        a, b = (int(x) for x in p.prompt.split("Calculate ")[1].split(".")[0].split(" + "))
        assert int(p.answer) == a + b
    overlay.write_text(yaml.safe_dump({"data": {"options": {"math": {"sources": [
        {"dataset": "basic_arithmetic", "weigth": 2}]}}}}))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['weigth'\]"):
        make_task(load_config(ROOT / "config" / "config.yaml", overlay), "math")


def _tiny_experiments(reuse: dict, efficiency_eval: dict | None = None) -> dict:
    cfg = load_config(ROOT / "config" / "config.yaml")
    cfg["experiments"] = {
        "efficiency": {"tasks": ["math"], "methods": ["rl", "fst"], "cycles": 2,
                       **({"overrides": efficiency_eval} if efficiency_eval else {})},
        "reuse": {"tasks": ["math"], "methods": ["fst"], "cycles": 2, **reuse},
    }
    return validate_config(cfg)


def test_the_curves_params_follow_the_configs_order_of_variants():
    """The first variant of an experiment without `default` is the one its figures and claims read
    (`figures.headline_tables`, by the curves table's row order: the config's). The curves job's
    `labels` param was sorted and Snakemake records inputs sorted, so swapping two variants (of an
    experiment of one's own, or in config.yaml itself: an overlay's variants of config.yaml's
    experiments are put back in its order) left the table and figures up to date, showing the old
    first variant."""
    from fastslow.experiments import expand
    from fastslow.layout import curves_labels

    def labels(order: list[str]) -> list[str]:
        lrs = {"lr_hi": 2e-5, "lr_lo": 5e-6}
        cfg = _tiny_experiments({"variants": {v: {"slow": {"lr": lrs[v]}} for v in order}})
        return [variant for _, _, variant, _, _ in curves_labels(expand(cfg), "reuse")]

    assert labels(["lr_hi", "lr_lo"]) == ["lr_hi", "lr_lo"]
    assert labels(["lr_lo", "lr_hi"]) == ["lr_lo", "lr_hi"]


def test_a_key_read_only_under_a_switch_is_no_param_while_the_switch_is_off():
    """`fast.reuse_steps` is read only under `reuse_in_slow`, `slow.vllm_enable_sleep_mode` only
    under `use_vllm`, and an `hf` reflection model has no `timeout_s`: each was an FST cycle's
    param whatever the switch, so setting one retrained every FST run for nothing (and kept two
    variants differing only there from sharing one run). With the switch on they are params."""
    from fastslow.experiments import cycle_section, expand

    def fst_params(**sections):
        cfg = _tiny_experiments({})
        cfg = validate_config(deep_update(cfg, sections))
        run = expand(cfg)["efficiency/fst/math-default-s0"]
        return run.cycle_params(cfg, ("slow", "fast"))

    assert fst_params(fast={"reuse_steps": 2}) == fst_params()
    assert "reuse_steps" not in fst_params()["fast"]
    on = {"reuse_rollouts": True, "reuse_in_slow": True}
    assert fst_params(fast={**on, "reuse_steps": 2}) != fst_params(fast=on)
    assert fst_params(slow={"vllm_enable_sleep_mode": True}) == fst_params()
    assert cycle_section("fst", "slow", {"use_vllm": True, "vllm_enable_sleep_mode": True}) == {
        "use_vllm": True, "vllm_enable_sleep_mode": True}
    hf = {"proposer": "reflective", "reflection": {"kind": "hf", "path": "gpt2"}}
    assert fst_params(fast=deep_update(copy.deepcopy(hf), {"reflection": {"timeout_s": 5}})) == fst_params(fast=hf)
    hosted = {"proposer": "reflective", "reflection": {"kind": "openai", "base_url": "http://localhost:1/v1",
                                                        "model": "m"}}
    assert fst_params(fast=deep_update(copy.deepcopy(hosted), {"reflection": {"timeout_s": 5}})) != \
        fst_params(fast=hosted)


def test_a_local_hf_reflection_model_is_tracked_by_its_files(tmp_path, monkeypatch, tiny_model_dir):
    """An `hf` reflection model's weights saved again in place left every reflective cycle up to
    date (its path alone was a param). A local directory is now tracked by its files (names,
    sizes, times), the base model's directory (built by the workflow) as a cycle input, and a hub
    id (fixed by a pinned revision) and the other kinds not at all."""
    from fastslow.config import reflection_model

    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "refl")
    cfg = load_config(ROOT / "config" / "config.yaml")
    first = reflection_model(cfg, {"kind": "hf", "path": "./refl"})
    assert set(first) == {"files"} and reflection_model(cfg, {"kind": "hf", "path": str(tmp_path / "refl")}) == first
    weights = tmp_path / "refl" / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # saved again in place
    assert reflection_model(cfg, {"kind": "hf", "path": "./refl"}) != first
    assert reflection_model(cfg, {"kind": "hf", "path": "./results/models/smollm2-135m-instruct/"}) == {
        "input": "results/models/smollm2-135m-instruct"}
    final = tmp_path / "results/runs/efficiency/fst/math-default-s0/final/model"  # another run's weights
    assert reflection_model(cfg, {"kind": "hf", "path": str(final)}) == {"input": str(final.relative_to(tmp_path))}
    assert reflection_model(cfg, {"kind": "hf", "path": "HuggingFaceTB/SmolLM2-135M-Instruct"}) == {}
    assert reflection_model(cfg, {"kind": "openai", "base_url": "http://x/v1", "model": "m"}) == {}
    assert reflection_model(cfg, None) == {}


def test_a_run_identical_to_an_earlier_experiments_run_is_shared():
    from fastslow.experiments import expand
    from fastslow.layout import cycle_dir, eval_point_file, run_path

    cfg = _tiny_experiments({"overrides": {"evaluation": {"divergence": False}},
                             "variants": {"no_reuse": {}, "reuse": {"fast": {"reuse_rollouts": True}}}})
    runs = expand(cfg)
    same, own = runs["reuse/fst/math-no_reuse-s0"], runs["reuse/fst/math-reuse-s0"]
    assert same.shared == "efficiency/fst/math-default-s0" and own.shared is None
    assert run_path(same) == "results/runs/efficiency/fst/math-default-s0"
    assert cycle_dir(same, 1) == "results/runs/efficiency/fst/math-default-s0/cycle1"
    assert eval_point_file(same, "cycle0", "math") == "results/runs/efficiency/fst/math-default-s0/eval/cycle0/math.json"
    assert run_path(own) == "results/runs/reuse/fst/math-reuse-s0"
    assert (same.experiment, same.variant) == ("reuse", "no_reuse")  # the curves keep its own labels


def test_a_memory_bound_is_no_param_and_does_not_split_a_shared_run():
    """evaluation.divergence_tokens bounds the KL pass's memory only: it is left out of the
    jobs' params (changing it reruns nothing), and a run that differs from an earlier
    experiment's only there is still that run; it reaches evaluate_weights all the same."""
    from fastslow.config import evaluation_options, job_params
    from fastslow.experiments import expand

    cfg = load_config(ROOT / "config" / "config.yaml")
    assert cfg["evaluation"]["divergence_tokens"] == 32768  # the schema's default
    params = job_params(cfg, ("model", "evaluation"))
    assert params["model"] == cfg["model"]
    assert params["evaluation"] == {k: v for k, v in cfg["evaluation"].items() if k != "divergence_tokens"}
    assert "divergence_tokens" in cfg["evaluation"]  # the config itself is not changed
    options = evaluation_options(deep_update(copy.deepcopy(cfg), {"evaluation": {"divergence_tokens": 512}}))
    assert options["divergence_tokens"] == 512 and options["dtype"] == cfg["model"]["dtype"]

    runs = expand(_tiny_experiments({"overrides": {"evaluation": {"divergence_tokens": 4096}},
                                     "variants": {"no_reuse": {}}}))
    assert runs["reuse/fst/math-no_reuse-s0"].shared == "efficiency/fst/math-default-s0"


def test_a_key_without_a_schema_default_written_at_its_default_is_no_param():
    """slow and fast keys without a schema default take SlowConfig's / FastConfig's default when
    left out, and the filled-in config lacks them. Written out at that default (the schema's
    `x-implied`, held here to the dataclasses'), a key is left out of the jobs' params too: the
    cycle reads the same value, so nothing reruns and a run that spells them out is still the
    earlier experiment's. Any other value is a param, and a run of its own."""
    from dataclasses import fields, replace

    from fastslow.config import implied_defaults, job_params, load_schema
    from fastslow.experiments import CYCLE_READS, expand
    from fastslow.fast import FastConfig
    from fastslow.slow.config import SlowConfig

    implied = implied_defaults()
    schema = load_schema()["properties"]
    for section, dataclass in (("slow", SlowConfig), ("fast", FastConfig)):
        no_default = {k for k, v in schema[section]["properties"].items() if "default" not in v}
        assert set(implied[section]) == no_default, section
        defaults = {f.name: f.default for f in fields(dataclass)}
        for key, value in implied[section].items():
            assert value == defaults[key] and type(value) is type(defaults[key]), (section, key)

    cfg = load_config(ROOT / "config" / "config.yaml")
    # (the keys config.yaml leaves out: it sets activation_checkpointing, to auto)
    spelt = deep_update(copy.deepcopy(cfg), {s: {k: v for k, v in keys.items() if k not in cfg[s]}
                                             for s, keys in implied.items()})
    assert cfg["slow"]["activation_checkpointing"] == "auto" and len(spelt["slow"]) > len(cfg["slow"])
    assert job_params(spelt, ("slow", "fast")) == job_params(cfg, ("slow", "fast"))
    assert "top_p" not in cfg["slow"]  # left out, the filled-in config lacks it
    # any other value is a param
    assert "steps_per_generation" in job_params(deep_update(copy.deepcopy(cfg), {"slow": {"steps_per_generation": 2}}),
                                                ("slow",))["slow"]
    assert job_params(deep_update(copy.deepcopy(cfg), {"slow": {"activation_checkpointing": True}}),
                      ("slow",))["slow"]["activation_checkpointing"] is True

    tiny = _tiny_experiments({"overrides": {"slow": {"top_p": 1, "scale_rewards": "group",
                                                     "vllm_enable_sleep_mode": False},
                                            "fast": {"reuse_steps": 1}},
                              "variants": {"spelt": {}, "clipped": {"slow": {"max_grad_norm": 1.0}}}})
    runs = expand(tiny)
    assert runs["reuse/fst/math-spelt-s0"].shared == "efficiency/fst/math-default-s0"
    assert runs["reuse/fst/math-clipped-s0"].shared is None
    own = runs["reuse/fst/math-spelt-s0"].cycle_params(tiny, ("slow", "fast"))
    assert "top_p" not in own["slow"] and "reuse_steps" not in own["fast"]
    # a distillation cycle (CYCLE_READS keeps its slow keys by name) leaves a spelt-out default out too
    distill = replace(runs["reuse/fst/math-spelt-s0"], method="fst_distill")
    assert distill.cycle_params(tiny, ("slow",)) == replace(distill, overrides={}).cycle_params(tiny, ("slow",))
    assert "top_p" in CYCLE_READS["fst_distill"]["slow"] and "top_p" not in distill.cycle_params(tiny, ("slow",))["slow"]


def test_a_run_differing_only_in_what_its_method_never_reads_is_shared():
    """An RL-only run's fast settings and slow.baseline (its K is 1 whatever they say) and a GEPA-only run's slow
    settings but T change none of its jobs' params (`CYCLE_READS`): the run is the earlier
    experiment's, or its own experiment's earlier variant's. FST reads both, so the same
    overrides make an FST run its own."""
    from fastslow.experiments import expand

    fast = {"preset": "full", "pool_size": 4, "minibatch_size": 3}
    runs = expand(_tiny_experiments({"methods": ["rl", "fst"], "overrides": {"fast": fast}}))
    assert runs["reuse/rl/math-default-s0"].shared == "efficiency/rl/math-default-s0"
    assert runs["reuse/fst/math-default-s0"].shared is None

    cfg = load_config(ROOT / "config" / "config.yaml")
    cfg["experiments"] = {
        "first": {"tasks": ["math"], "methods": ["gepa", "fst"], "cycles": 1},
        "second": {"tasks": ["math"], "methods": ["gepa", "fst"], "cycles": 1,
                   "overrides": {"slow": {"lr": 3.0e-5, "num_generations": 8}}},
        "third": {"tasks": ["math"], "methods": ["gepa"], "cycles": 1, "overrides": {"slow": {"steps_per_cycle": 5}}},
    }
    runs = expand(validate_config(cfg))
    assert runs["second/gepa/math-default-s0"].shared == "first/gepa/math-default-s0"
    assert runs["second/fst/math-default-s0"].shared is None
    assert runs["third/gepa/math-default-s0"].shared is None  # T: the step its rounds are filed at
    # ...and within one experiment: variants of the fast settings are one RL run, trained once
    cfg["experiments"] = {"ablations": {"tasks": ["math"], "methods": ["rl", "fst"], "cycles": 1, "variants": {
        "k1": {"fast": {"pool_size": 1}}, "k4": {"fast": {"pool_size": 4}}, "lr": {"slow": {"lr": 3.0e-5}},
        "k2_prompt": {"fast": {"pool_size": 2}, "slow": {"baseline": "prompt"}}}}}
    runs = expand(validate_config(cfg))
    assert {k: s.shared for k, s in runs.items()} == {
        "ablations/rl/math-k1-s0": None, "ablations/rl/math-k4-s0": "ablations/rl/math-k1-s0",
        "ablations/rl/math-lr-s0": None, "ablations/rl/math-k2_prompt-s0": "ablations/rl/math-k1-s0",
        "ablations/fst/math-k1-s0": None, "ablations/fst/math-k4-s0": None,
        "ablations/fst/math-lr-s0": None, "ablations/fst/math-k2_prompt-s0": None}
    # one context: per-problem and per-prompt groups are both the problem's G rollouts
    assert runs["ablations/rl/math-k2_prompt-s0"].settings(cfg)["slow"]["baseline"] == "problem"
    # ...for FST too: with K = 1 a per-prompt variant trained the K = 1 run again, a bar of its own
    cfg["experiments"]["ablations"]["variants"]["k1_prompt"] = {"fast": {"pool_size": 1},
                                                                "slow": {"baseline": "prompt"}}
    runs = expand(validate_config(cfg))
    assert runs["ablations/fst/math-k1_prompt-s0"].shared == "ablations/fst/math-k1-s0"
    assert runs["ablations/fst/math-k2_prompt-s0"].settings(cfg)["slow"]["baseline"] == "prompt"


@pytest.mark.parametrize("reuse, efficiency_eval", [
    ({"cycles": 3}, None),                                                # one cycle more
    ({"seeds": [1]}, None),                                               # another seed
    ({"overrides": {"evaluation": {"k": 8}}}, None),                      # other evaluations
    ({"overrides": {"slow": {"lr": 2.0e-5}}}, None),                      # other training
    ({}, {"evaluation": {"divergence": False}}),                          # needs KL the other skips
    ({"methods": ["gepa"]}, None),                                        # another method
    ({"eval_every": 2, "cycles": 3}, None),                               # other cycles and points
])
def test_a_run_that_differs_is_not_shared(reuse, efficiency_eval):
    from fastslow.experiments import expand

    runs = expand(_tiny_experiments(reuse, efficiency_eval))
    assert all(s.shared is None for s in runs.values()), {k: s.shared for k, s in runs.items() if s.shared}


def test_the_default_shares_plasticitys_base_run_and_fig10s_no_reuse_run():
    from fastslow.experiments import expand

    shared = {k: s.shared for k, s in expand(load_config(ROOT / "config" / "config.yaml")).items() if s.shared}
    assert shared == {"plasticity/rl/hover_hard-default-s0": "efficiency/rl/hover_hard-default-s0",
                      "reuse/fst/hover_hard-no_reuse-s0": "efficiency/fst/hover_hard-default-s0"}


def _readme_keys() -> list[tuple[str, str, str]]:
    """(key, default cell, config.yaml cell) of every row of config/README.md's key table."""
    import re

    text = (ROOT / "config" / "README.md").read_text().split("## Keys", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| (.*?) \| (.*?) \| .* \|$", text, re.M)
    assert rows, "config/README.md has no key table"
    return rows


def _expand(key: str) -> list[str]:
    """`a.{b,c}` -> a.b, a.c; `a.<task>` (a mapping by name) -> a."""
    import re

    m = re.search(r"\{([^}]+)\}", key)
    if m:
        return [key[:m.start()] + part + key[m.end():] for part in m.group(1).split(",")]
    return [key.split(".<", 1)[0]]


def _schema_leaves(schema: dict, prefix: str = "") -> dict:
    out = {}
    for name, sub in schema.get("properties", {}).items():
        if sub.get("properties") and name != "experiments":
            out.update(_schema_leaves(sub, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = sub
    return out


def _literals(cell: str) -> list | None:
    """The values of a cell made only of backticked literals (`a` / `b`), else None (prose)."""
    parts = [p.strip() for p in cell.split(" / ")]
    if not all(len(p) > 2 and p[0] == p[-1] == "`" and "`" not in p[1:-1] for p in parts):
        return None
    return [yaml.safe_load(p[1:-1]) for p in parts]


def _same(documented, actual) -> bool:
    if isinstance(actual, (int, float)) and not isinstance(actual, bool) and isinstance(documented, str):
        try:
            documented = float(documented)  # YAML reads 1e-5 as a string
        except ValueError:
            return False
    return documented == actual


def test_config_readme_documents_every_key_with_the_schema_default_and_the_shipped_value():
    """config/README.md's table: every schema key once, its default the schema's, and its
    `config.yaml` column the value the embedded default runs with (— where that is the default)."""
    from fastslow.config import load_schema

    leaves = _schema_leaves(load_schema())
    rows = _readme_keys()
    documented = [k for key, _, _ in rows for k in _expand(key)]
    assert sorted(documented) == sorted(leaves), (
        f"undocumented: {sorted(set(leaves) - set(documented))}, unknown: {sorted(set(documented) - set(leaves))}")
    shipped = load_config(ROOT / "config" / "config.yaml")
    checked = 0
    for key, default_cell, shipped_cell in rows:
        keys = _expand(key)
        defaults = [leaves[k].get("default") for k in keys]
        values = []
        for k in keys:
            node = shipped
            for part in k.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            values.append(node)
        if default_cell == "—":
            assert all("default" not in leaves[k] for k in keys), f"{key}: the schema has a default"
        elif (lits := _literals(default_cell)) is not None:
            assert len(lits) == len(defaults) and all(map(_same, lits, defaults)), (
                f"{key}: README default {default_cell}, schema {defaults}")
            checked += 1
        if values == defaults:
            assert shipped_cell == "—", f"{key}: config.yaml runs the default {defaults}, README says {shipped_cell}"
        else:
            assert shipped_cell != "—", f"{key}: config.yaml runs {values}, README says the default"
            if (lits := _literals(shipped_cell)) is not None:
                assert len(lits) == len(values) and all(map(_same, lits, values)), (
                    f"{key}: README config.yaml {shipped_cell}, config.yaml {values}")
                checked += 1
    assert checked > 40  # the literal cells were compared, not skipped as prose


def test_reflection_settings_reach_the_reflection_model(monkeypatch):
    """The reflection keys the schema admits are the ones build_reflection_lm reads."""
    from fastslow.fast.proposers import OpenAICompatibleLM, build_reflection_lm

    cfg = deep_update(copy.deepcopy(_default()), {"fast": {"proposer": "reflective", "reflection": {
        "kind": "openai", "base_url": "http://localhost:8000", "model": "m", "api_key_env": "MY_KEY",
        "max_tokens": 256, "temperature": 0.2, "prompt_template": "Improve <curr_param> given <side_info>",
        "chat_template_kwargs": {"enable_thinking": False}}}})
    refl = validate_config(cfg)["fast"]["reflection"]
    monkeypatch.setenv("MY_KEY", "secret")
    lm = build_reflection_lm(refl)
    assert isinstance(lm, OpenAICompatibleLM)
    assert (lm.api_key, lm.max_tokens, lm.temperature, lm.timeout_s) == ("secret", 256, 0.2, 60.0)
    assert lm.base_url == "http://localhost:8000/v1" and lm.model == "m"
    assert lm.chat_template_kwargs == {"enable_thinking": False}
    # ...and the round's proposer reflects with that model and the configured prompt template
    from fastslow.fast import FastConfig
    from fastslow.fast.round import make_proposer

    proposer = make_proposer(FastConfig(proposer="reflective", reflection=refl), [], lambda _m: None)
    assert proposer.reflector.reflection_prompt_template == "Improve <curr_param> given <side_info>"
    assert proposer.reflector.lm.model == "m"


def test_a_litellm_reflection_model_reaches_the_endpoint_and_key_it_is_given(monkeypatch):
    """kind litellm with base_url: the URL was dropped and every call went to the hosted provider
    (its cost, or an auth error) instead of the self-hosted endpoint. It is litellm's api_base now,
    and api_key_env its api_key; neither set, litellm's own defaults (nothing passed)."""
    from fastslow.fast.proposers import build_reflection_lm

    def settings(**extra):
        cfg = deep_update(copy.deepcopy(_default()), {"fast": {"proposer": "reflective", "reflection": {
            "kind": "litellm", "model": "openai/served-model", **extra}}})
        return validate_config(cfg)["fast"]["reflection"]

    monkeypatch.setenv("MY_KEY", "secret")
    lm = build_reflection_lm(settings(base_url="http://localhost:8000/v1", api_key_env="MY_KEY", max_tokens=64))
    assert lm.model == "openai/served-model"
    assert {k: lm.completion_kwargs.get(k) for k in ("api_base", "api_key", "max_tokens", "timeout")} == {
        "api_base": "http://localhost:8000/v1", "api_key": "secret", "max_tokens": 64, "timeout": 60.0}
    plain = build_reflection_lm(settings())
    assert "api_base" not in plain.completion_kwargs and "api_key" not in plain.completion_kwargs
    monkeypatch.delenv("MY_KEY")
    with pytest.raises(ValueError, match=r"^fast\.reflection\.api_key_env: the environment variable MY_KEY is not set$"):
        build_reflection_lm(settings(api_key_env="MY_KEY"))


def test_a_task_files_path_may_start_at_the_home_directory(tmp_path, monkeypatch):
    """`~/mine.jsonl` was "no such file '~/mine.jsonl'" while the file was there (model.base and
    fast.reflection.path expand `~`)."""
    import shutil

    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copy(ROOT / "config" / "parity.jsonl", tmp_path / "mine.jsonl")
    cfg = load_config(ROOT / "config" / "config.yaml", overrides={
        "data": {"files": {"mine": {"path": "~/mine.jsonl", "scorer": "label"}}, "tasks": ["mine"]}})
    assert cfg["data"]["files"]["mine"]["path"] == str(tmp_path / "mine.jsonl")


def test_a_task_of_your_own_from_a_file(tmp_path, monkeypatch):
    """data.files.<name>: the config's task `name` is the user's file, under any data source, and
    a built-in name it takes is replaced; the experiments and data.tasks accept it."""
    from fastslow.config import make_task, task_spec
    from fastslow.experiments import expand
    from fastslow.tasks.loaders import LocalFileTask

    monkeypatch.chdir(ROOT)
    cfg = load_config(ROOT / "config" / "config.yaml", ROOT / "config" / "own_task.yaml")
    assert task_spec(cfg, "parity") == ("file", {"path": "config/parity.jsonl", "name": "parity",
                                                 "scorer": "label", "labels": ["EVEN", "ODD"]})
    task = make_task(cfg, "parity")
    assert isinstance(task, LocalFileTask) and task.name == "parity"
    problem = task.problems("val", 1, seed=0)[0]
    assert problem.task == "parity" and problem.metadata["split"] == "val"
    wrong = "ODD" if problem.answer == "EVEN" else "EVEN"
    assert task.reward(problem, f"<answer>{problem.answer.lower()}</answer>") == 1.0
    assert task.reward(problem, f"<answer>{wrong}</answer>") == 0.0
    assert {s.schedule for s in expand(cfg).values()} == {("parity",) * 4}
    # the same file under a built-in name, with the Hugging Face source: the file wins
    cfg = load_config(ROOT / "config" / "config.yaml", overrides={"data": {
        "source": "hf", "hf_datasets": {"hover": {"path": "hover-nlp/hover"}},
        "files": {"hover": {"path": "config/parity.jsonl"}}}})
    assert task_spec(cfg, "hover") == ("file", {"path": "config/parity.jsonl", "name": "hover", "scorer": "exact"})


def test_the_shipped_example_file_is_right():
    """config/parity.jsonl: every answer is its prompt's number's parity, splits 320/40/40."""
    import re

    from fastslow.tasks.loaders import load_task_file

    task = load_task_file(ROOT / "config" / "parity.jsonl", scorer="label", labels=["EVEN", "ODD"])
    rows = task.rows()
    assert {s: len(ps) for s, ps in rows.items()} == {"train": 320, "val": 40, "test": 40}
    for p in (p for ps in rows.values() for p in ps):
        n = int(re.search(r"number (\d+) ", p.prompt).group(1))
        assert p.answer == ("EVEN" if n % 2 == 0 else "ODD"), p.id
        assert "<answer></answer>" in p.prompt


@pytest.mark.parametrize(("files", "expected"), [
    ({"mine": {"path": "nowhere/mine.jsonl"}}, "data.files.mine.path: no such file 'nowhere/mine.jsonl'"),
    ({"mine": {"path": "config/config.yaml"}}, "data.files.mine.path: expected a .parquet, .jsonl or .ndjson file"),
    ({"my-task": {"path": "config/parity.jsonl"}}, "data.files: names use letters, digits and '_' only, got 'my-task'"),
    ({"mine": {"path": "config/parity.jsonl", "labels": ["EVEN", "ODD"]}},
     "data.files.mine.labels: only for scorer 'label', got scorer 'exact'"),
    ({"mine": {"path": "config/parity.jsonl", "scorer": "fuzzy"}}, "data.files.mine.scorer: expected one of"),
    ({"mine": {"file": "config/parity.jsonl"}}, "data.files.mine: unknown key 'file'"),
    # hf_datasets' preset and revision are no keys of a file task, which needs its path
    ({"mine": {"scorer": "exact"}}, "data.files.mine: missing required key; 'path' is a required property"),
    ({"mine": {"path": "config/parity.jsonl", "preset": "polaris"}}, "data.files.mine: unknown key 'preset'"),
    # one directory on macOS's file system: results/data/math/
    ({"Math": {"path": "config/parity.jsonl"}}, "data.files.Math: differs from task 'math' only in case, and both "
                                                "would write results/data/math/ on a case-insensitive file system"),
    ({"mine": {"path": "config/parity.jsonl"}, "MINE": {"path": "config/parity.jsonl"}},
     "data.files.MINE: differs from task 'mine' only in case"),
])
def test_a_bad_file_task_is_one_line_naming_the_key(files, expected, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml", overrides={"data": {"files": files}})
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_a_generator_that_fails_to_build_stops_the_config_in_one_line(monkeypatch):
    """The config check builds each configured generator (a user's task may read a file an option
    names in its constructor): an error other than ValueError is one line naming the task too,
    not a traceback from the Snakefile."""
    import fastslow.tasks

    def missing(name, /, **options):
        raise FileNotFoundError(2, "No such file or directory", "words.txt")

    monkeypatch.setattr(fastslow.tasks, "get_task", missing)
    with pytest.raises(ConfigError) as info:  # config.yaml's one configured generator: codeio's
        load_config(ROOT / "config" / "config.yaml")
    assert str(info.value) == ("config error: data.options.codeio: building the task failed (FileNotFoundError: "
                               "[Errno 2] No such file or directory: 'words.txt')")


def test_an_experiment_no_figure_reads_is_a_config_warning(caplog):
    """An overlay's `efficency:` planned the built-in efficiency experiment and none of the user's
    runs, without a word: the name no figure reads is a warning, with the name it is close to."""
    import copy as copy_

    import yaml

    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())["experiments"]
    mine = {"efficency": copy_.deepcopy(base["efficiency"]), "my_sweep": copy_.deepcopy(base["stargraph"])}
    with caplog.at_level("WARNING", logger="fastslow"):
        load_config(ROOT / "config" / "config.yaml", overrides={"experiments": mine})
    unread = sorted(r.getMessage() for r in caplog.records if "no figure or claim reads" in r.getMessage())
    assert unread == [
        "config warning: experiments.efficency: no figure or claim reads an experiment of this name (did you "
        "mean 'efficiency'?), and no experiment starts from it: its runs are built only as targets of their "
        "own (results/runs/efficency/...)",
        "config warning: experiments.my_sweep: no figure or claim reads an experiment of this name, and no "
        "experiment starts from it: its runs are built only as targets of their own (results/runs/my_sweep/...)"]
    caplog.clear()  # the shipped configs name no such experiment; one an init starts from is read
    for extra in ([], [ROOT / "config" / "paper.yaml"], [ROOT / "config" / "own_task.yaml"]):
        load_config(ROOT / "config" / "config.yaml", *extra)
    assert not [r for r in caplog.records if "no figure or claim reads" in r.getMessage()]
    mine = {"pre": copy_.deepcopy(base["stargraph"]),
            "post": {**copy_.deepcopy(base["plasticity"]), "init": {"experiment": "pre", "tasks": ["stargraph"]}}}
    with caplog.at_level("WARNING", logger="fastslow"):
        load_config(ROOT / "config" / "config.yaml", overrides={"experiments": mine})
    assert [r.getMessage().split(":")[1] for r in caplog.records if "no figure or claim reads" in r.getMessage()] \
        == [" experiments.post"]


class _Broken:
    """A task of a user's own whose constructor fails: without options, or with them."""

    def __init__(self, name, difficulty, words_file=""):
        raise RuntimeError("could not load the word list")


class _NoName:
    def __init__(self, length=5):  # takes no name= and difficulty=, which get_task passes
        pass


@pytest.mark.parametrize(("entry", "options", "expected"), [
    (("fastslow.tasks.bugy", "BugyTask"), {}, "config error: task 'mine' (_FAMILIES in src/fastslow/tasks/__init__.py): "
     "building it failed (ModuleNotFoundError: No module named 'fastslow.tasks.bugy')"),
    ((__name__, "BugyTask"), {}, "config error: task 'mine' (_FAMILIES in src/fastslow/tasks/__init__.py): building "
     f"it failed (AttributeError: module '{__name__}' has no attribute 'BugyTask')"),
    ((__name__, "_NoName"), {}, "config error: task 'mine' (_FAMILIES in src/fastslow/tasks/__init__.py): building "
     "it failed (TypeError: _NoName.__init__() got an unexpected keyword argument 'name')"),
    ((__name__, "_Broken"), {}, "config error: task 'mine' (_FAMILIES in src/fastslow/tasks/__init__.py): building "
     "it failed (RuntimeError: could not load the word list)"),
    ((__name__, "_Broken"), {"words_file": "w.txt"}, "config error: data.options.mine: building the task failed "
     "(RuntimeError: could not load the word list)"),
])
def test_a_registered_task_that_cannot_be_built_stops_the_config_in_one_line(monkeypatch, entry, options, expected):
    """A task of one's own registered with a misspelt module or class, a constructor without
    name= and difficulty=, or one raising any error: one line naming the task at the config
    check, with or without options, not a task_data job's traceback."""
    import fastslow.tasks

    monkeypatch.setitem(fastslow.tasks._FAMILIES, "mine", (*entry, ("default",)))
    monkeypatch.setitem(fastslow.tasks._VARIANTS, "mine", ("mine", "default"))
    monkeypatch.setattr(fastslow.tasks, "TASK_NAMES", (*fastslow.tasks.TASK_NAMES, "mine"))
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml", overrides={"data": {"options": {"mine": options}}} if options
                    else None)
    assert str(info.value) == expected


def test_generator_options_on_a_file_task_say_where_its_settings_go(monkeypatch):
    """data.options.<a data.files task> read "unknown task" of a task the config knows."""
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml", overrides={"data": {
            "files": {"parity": {"path": "config/parity.jsonl"}}, "options": {"parity": {"scorer": "label"}}}})
    assert str(info.value).startswith("config error: data.options.parity: 'parity' is a data.files task; ")
    assert "set its scorer and labels under data.files.parity" in str(info.value)


def test_a_task_without_a_file_or_generator_is_still_unknown(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError, match=r"data\.tasks\[0\]: unknown task 'parity'"):
        load_config(ROOT / "config" / "config.yaml", overrides={"data": {"tasks": ["parity"]}})
    with pytest.raises(ConfigError, match=r"experiments\.efficiency\.tasks\[1\]: unknown task 'parity'"):
        load_config(ROOT / "config" / "config.yaml",
                    overrides={"experiments": {"efficiency": {"tasks": ["math", "parity"]}}})
    # efficiency's only task misspelt: named as such, not as radar's init finding no efficiency run
    with pytest.raises(ConfigError, match=r"experiments\.efficiency\.tasks\[0\]: unknown task 'mathh'"):
        load_config(ROOT / "config" / "config.yaml",
                    overrides={"experiments": {"efficiency": {"tasks": ["mathh"]}}})
    with pytest.raises(ConfigError, match=r"experiments\.continual\.sequence\[1\]: unknown task 'codio'"):
        load_config(ROOT / "config" / "config.yaml",
                    overrides={"experiments": {"continual": {"sequence": ["hover", "codio"]}}})


def test_task_names_are_checked_under_every_data_source_against_what_it_can_build(monkeypatch):
    """Under source hf, data.tasks was never checked ('mathh' passed `snakemake -n`); under
    offline, an experiment could name a data.hf_datasets entry, which task_spec reads under hf
    only: its task_data job died late with a traceback. One known set for both: the generators,
    data.files and (under hf only) data.hf_datasets."""
    monkeypatch.chdir(ROOT)
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "config" / "paper.yaml", overrides={"data": {"tasks": ["math", "mathh"]}})
    assert str(err.value).startswith("config error: data.tasks[1]: unknown task 'mathh'; expected one of codeio, ")
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "config" / "config.yaml", overrides={
            "data": {"hf_datasets": {"mine": {"path": "org/mine"}}},
            "experiments": {"efficiency": {"tasks": ["math", "mine"]}}})
    assert str(err.value).startswith("config error: experiments.efficiency.tasks[1]: unknown task 'mine'; ")
    assert str(err.value).endswith("(data.hf_datasets.mine is read under data.source 'hf' only, this config's "
                                   "is 'offline')")
    with pytest.raises(ConfigError, match=r"^config error: data\.tasks\[1\]: unknown task 'mine'; .* under data\.source"):
        load_config(ROOT / "config" / "config.yaml", overrides={
            "data": {"hf_datasets": {"mine": {"path": "org/mine"}}, "tasks": ["math", "mine"]}})
    # under hf the entry is a task, as is a file under any source
    cfg = load_config(ROOT / "config" / "paper.yaml", overrides={
        "data": {"hf_datasets": {"mine": {"path": "org/mine"}}, "tasks": ["math", "mine"],
                 "files": {"parity": {"path": "config/parity.jsonl"}}},
        "experiments": {"continual": {"sequence": ["mine", "parity"]}}})
    assert cfg["data"]["tasks"] == ["math", "mine"]


@pytest.mark.parametrize(("experiments", "expected"), [
    # a misspelt name said "no default-variant runs of 'efficency' match (define it before ...)"
    ({"plasticity": {"init": {"experiment": "efficency"}}},
     "experiments.plasticity.init.experiment: unknown experiment 'efficency' (experiments: efficiency, radar, "),
    ({"plasticity": {"init": {"experiment": "continual"}}},
     "experiments.plasticity.init.experiment: 'continual' is defined after 'plasticity'; define it before"),
    # efficiency defined first, but not on the task asked for: it said to define efficiency first
    ({"efficiency": {"tasks": ["math"]}, "plasticity": {"init": {"tasks": ["physics"]}}},
     "experiments.plasticity.init: 'efficiency' has no default-variant run of methods ['rl', 'fst'] ending on "
     "tasks ['physics'] (it has methods ['rl', 'fst'], final tasks ['math']); set experiments.plasticity.init.tasks, "
     "or drop the experiment with `plasticity: null` in an overlay"),
    # init.methods left out: the methods asked for are those that train (it named gepa too)
    ({"mine": {"tasks": ["hover"], "methods": ["rl"], "cycles": 1,
               "init": {"experiment": "efficiency", "tasks": ["stargraph"]}}},
     "experiments.mine.init: 'efficiency' has no default-variant run of methods ['rl', 'fst', 'fst_distill'] ending "
     "on tasks ['stargraph'] (it has methods ['rl', 'fst'], final tasks "),
    ({"plasticity": {"init": {"experiment": "plasticity"}}},
     "experiments.plasticity.init.experiment: 'plasticity' is this experiment; name the one whose runs it starts"),
    ({"efficiency": {"variants": {"lr2": {"slow": {"lr": 2e-6}}}}},
     "experiments.radar.init.experiment: 'efficiency' has no default-variant run to start from (its variants: lr2)"),
    # GEPA-only runs train no weights: planning stopped on a final_weights input no rule makes
    ({"mine": {"tasks": ["hover"], "methods": ["rl"], "cycles": 1, "init": {"experiment": "radar"}}},
     "experiments.mine.init.experiment: 'radar' has only GEPA-only runs, which train no weights to start from"),
    ({"mine": {"tasks": ["hover"], "methods": ["rl"], "cycles": 1,
               "init": {"experiment": "ceiling", "methods": ["gepa"]}}},
     "experiments.mine.init.methods[0]: expected one of 'rl', 'fst', 'fst_distill', got 'gepa'"),
])
def test_an_init_that_finds_no_run_says_why(experiments, expected):
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml", overrides={"experiments": experiments})
    assert str(info.value).startswith(f"config error: {expected}"), str(info.value)
    assert "\n" not in str(info.value)


def test_an_init_from_an_experiment_with_gepa_only_runs_starts_from_its_trained_runs_only():
    """The ceiling experiment runs GEPA-only and FST-distill: starting from it takes the latter
    (a GEPA-only run keeps its initial weights, and no rule makes its final ones)."""
    from fastslow.experiments import expand

    cfg = load_config(ROOT / "config" / "config.yaml", overrides={"experiments": {"mine": {
        "tasks": ["hover"], "methods": ["rl"], "cycles": 1, "init": {"experiment": "ceiling", "include_base": False}}}})
    assert {r.init for r in expand(cfg).values() if r.experiment == "mine"} == {"ceiling/fst_distill/hover-default-s0"}


@pytest.mark.parametrize("name", ["foundation", "figures"])
def test_an_experiment_cannot_take_a_parent_group_of_the_workflows_own_jobs(name):
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml",
                    overrides={"experiments": {name: {"tasks": ["math"], "methods": ["rl"], "cycles": 1}}})
    assert f"experiments.{name}: {name!r} is the MLflow parent group" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_continual_sequence_lists_each_task_once():
    """Stages are told apart by their task (run names, curves, Fig 6, the claims)."""
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml",
                    overrides={"experiments": {"continual": {"sequence": ["hover", "codeio", "hover"]}}})
    assert "experiments.continual.sequence: task 'hover' appears twice" in str(info.value)
    assert "\n" not in str(info.value)


def test_an_experiments_tasks_list_each_task_once():
    """`tasks: [math, math]` made one run per entry under the same key: the second silently
    replaced the first, so the experiment had fewer runs than it listed."""
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml",
                    overrides={"experiments": {"efficiency": {"tasks": ["math", "hover", "math"]}}})
    assert str(info.value) == ("config error: experiments.efficiency.tasks: ['math', 'hover', 'math'] "
                               "has non-unique elements")


def _init_pairs(overrides: dict) -> list[tuple[int, int]]:
    """(seed of each plasticity run started from an efficiency run, that source run's seed)."""
    from fastslow.experiments import expand

    runs = expand(load_config(ROOT / "config" / "config.yaml", overrides={"experiments": overrides}))
    return [(r.seed, runs[r.init].seed) for r in runs.values()
            if r.experiment == "plasticity" and r.init is not None]


def test_seed_s_of_a_run_from_another_experiments_weights_starts_from_its_seed_s_runs():
    """Runs that start from another experiment's checkpoints took every source seed in every seed:
    with seeds [0, 1] on both sides, each plasticity seed started from both efficiency seeds, so
    the seeds were not independent repeats (and twice the runs were trained)."""
    two_seeds = {"efficiency": {"seeds": [0, 1]}, "plasticity": {"seeds": [0, 1]}}
    pairs = _init_pairs(two_seeds)
    assert pairs and all(seed == source for seed, source in pairs), pairs
    assert sorted(pairs) == [(0, 0)] * 2 + [(1, 1)] * 2  # from efficiency's RL and FST math runs
    # asked for, every seed from every source run
    crossed = _init_pairs({**two_seeds, "plasticity": {"seeds": [0, 1], "init": {"pair_seeds": False}}})
    assert sorted(crossed) == sorted([(s, t) for s in (0, 1) for t in (0, 1)] * 2)
    # one checkpoint per method, three repeats from it: only unpaired
    with pytest.raises(ConfigError) as info:
        _init_pairs({"plasticity": {"seeds": [0, 1, 2]}})
    assert str(info.value).startswith("config error: experiments.plasticity.seeds: [1, 2] have no run of "
                                      "'efficiency' to start from (its runs' seeds: [0]); add the seeds there, "
                                      "or set experiments.plasticity.init.pair_seeds: false"), str(info.value)
    assert len(_init_pairs({"plasticity": {"seeds": [0, 1, 2], "init": {"pair_seeds": False}}})) == 6


@pytest.mark.parametrize(("experiment", "expected"), [
    # tasks beside a sequence were ignored (one continual run through the sequence)
    ({"continual": {"tasks": ["math"]}},
     "experiments.continual.tasks: ['math'] beside sequence ['hover', 'codeio', 'physics']; an experiment is one "
     "run per task (tasks) or one continual run (sequence): keep one"),
    # each kind of experiment ignored the other's cycle count
    ({"efficiency": {"cycles_per_stage": 3}},
     "experiments.efficiency.cycles_per_stage: 3 without a 'sequence' (cycles per task of a continual run); "
     "a 'tasks' experiment's runs take 'cycles'"),
    ({"continual": {"cycles": 3}},
     "experiments.continual.cycles: 3 with a 'sequence', whose run takes 'cycles_per_stage' cycles per task; "
     "set that instead"),
    # ...and so do their variants: a sequence variant's `cycles` read as cycles per stage
    ({"continual": {"variants": {"long": {"cycles": 3}}}},
     "experiments.continual.variants.long.cycles: 3 in a 'sequence' experiment, whose run takes "
     "'cycles_per_stage' cycles per task; set that instead"),
    ({"efficiency": {"variants": {"long": {"cycles_per_stage": 3}}}},
     "experiments.efficiency.variants.long.cycles_per_stage: 3 in a 'tasks' experiment, whose runs take "
     "'cycles'; set that instead"),
])
def test_a_key_the_kind_of_experiment_ignores_is_an_error(experiment, expected):
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml", overrides={"experiments": experiment})
    assert str(info.value) == f"config error: {expected}"


def test_a_sequence_experiments_variant_sets_its_cycles_per_stage():
    from fastslow.experiments import expand

    cfg = load_config(ROOT / "config" / "config.yaml", overrides={"experiments": {"continual": {
        "cycles_per_stage": 1, "variants": {"default": {}, "long": {"cycles_per_stage": 3}}}}})
    runs = expand(cfg)
    assert runs["continual/fst/hover.codeio.physics-default-s0"].schedule == ("hover", "codeio", "physics")
    assert runs["continual/fst/hover.codeio.physics-long-s0"].schedule == ("hover",) * 3 + ("codeio",) * 3 + ("physics",) * 3
    assert "cycles_per_stage" not in runs["continual/fst/hover.codeio.physics-long-s0"].overrides


def test_a_validated_config_is_valid_again():
    """No cycle count is filled into an experiment that does not read it (a filled-in config, e.g.
    bench_fst_step's with its --sets, is validated again)."""
    cfg = load_config(ROOT / "config" / "config.yaml")
    assert "cycles" not in cfg["experiments"]["continual"] and "cycles_per_stage" not in cfg["experiments"]["radar"]
    assert validate_config(copy.deepcopy(cfg)) == cfg


def test_a_warmup_longer_than_a_run_is_a_config_warning(caplog):
    """slow.warmup_steps W > a run's cycles x T RL steps: its lr never came near slow.lr, silently
    (step s < W trains at lr x s/W). A warning, not an error; gepa (radar) trains nothing; W equal
    to the steps (the smoke config's) is not warned about."""
    caplog.set_level("WARNING", logger="fastslow.experiments")
    load_config(ROOT / "config" / "config.yaml")
    load_config(ROOT / "config" / "config.yaml", ROOT / "config" / "smoke.yaml")
    assert not caplog.records
    load_config(ROOT / "config" / "config.yaml", overrides={"experiments": {
        "radar": {"overrides": {"slow": {"warmup_steps": 50}}},
        "plasticity": {"overrides": {"slow": {"warmup_steps": 7}}},
        "ablations": {"overrides": {"slow": {"warmup_steps": 4}}}}})
    assert [r.getMessage() for r in caplog.records] == [
        "config warning: experiments.plasticity: slow.warmup_steps 7 > its runs' 6 RL steps (2 cycles x 3 "
        "slow.steps_per_cycle): their learning rate never reaches slow.lr 1e-05 (step s < 7 trains at lr x s/7)",
        "config warning: experiments.ablations (variants k1, k4, k2_prompt_baseline, full_gepa): "
        "slow.warmup_steps 4 > its runs' 3 RL steps (1 cycle x 3 slow.steps_per_cycle): their learning rate "
        "never reaches slow.lr 1e-05 (step s < 4 trains at lr x s/4)",
        "config warning: experiments.ablations (variant t1): slow.warmup_steps 4 > its runs' 3 RL steps "
        "(3 cycles x 1 slow.steps_per_cycle): their learning rate never reaches slow.lr 1e-05 (step s < 4 "
        "trains at lr x s/4)"]


def test_a_short_warmup_of_the_default_and_another_variant_names_both(caplog):
    """The default variant's runs and k4's are 1 cycle x 3 RL steps: one line holds both, in the
    config's order of variants. It named k4 alone, as if the default's runs reached slow.lr; the
    default alone is named by the experiment's name (test above)."""
    caplog.set_level("WARNING", logger="fastslow.experiments")
    load_config(ROOT / "config" / "config.yaml", overrides={"experiments": {"ablations": {
        "overrides": {"slow": {"warmup_steps": 4}},
        "variants": {"default": {}, "k1": None, "k2_prompt_baseline": None, "t1": None, "full_gepa": None}}}})
    assert [r.getMessage().split(": slow.")[0] for r in caplog.records] == [
        "config warning: experiments.ablations (variants k4, default)"]


@pytest.mark.parametrize(("overrides", "named"), [
    ({"experiments": {"ablations": {"overrides": {"slow": {"warmup_steps": 1, "steps_per_cycle": 1}}}}},
     "config error: experiments.ablations (variant k1): slow.warmup_steps 1 with runs of 1 RL step"),
    ({"experiments": {"stargraph": {"cycles": 1, "overrides": {"slow": {"steps_per_cycle": 1}}}}},  # W = 2 > 1
     "config error: experiments.stargraph: slow.warmup_steps 2 with runs of 1 RL step"),
])
def test_a_one_step_run_with_a_warmup_is_a_config_error(overrides, named):
    """Its only step trains at lr x 0/W: the run's weights were its initial ones, silently."""
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "config" / "config.yaml", overrides=overrides)
    assert str(err.value).startswith(named) and "\n" not in str(err.value)
    load_config(ROOT / "config" / "config.yaml", overrides={"experiments": {"ablations": {  # no warm-up: trains
        "overrides": {"slow": {"warmup_steps": 0, "steps_per_cycle": 1}}}}})


def test_every_stage_end_of_a_continual_run_is_evaluated():
    """3 cycles a stage, a point every 2 cycles: the stages' last cycles (2, 5) are points too."""
    from fastslow.experiments import expand
    from fastslow.layout import eval_points

    cfg = load_config(ROOT / "config" / "config.yaml", overrides={"experiments": {"continual": {
        "sequence": ["hover", "codeio", "physics"], "cycles_per_stage": 3, "eval_every": 2}}})
    spec = next(s for s in expand(cfg).values() if s.experiment == "continual")
    assert eval_points(spec)[1:] == ["cycle1", "cycle2", "cycle3", "cycle5", "cycle7", "cycle8"]


def test_a_run_evaluated_otherwise_starts_from_its_own_initial_evaluation():
    """A base-initialised run shares the base model's evaluation as its step-0 point only when
    its rewards would be scored alike: another k or problem count gets an 'init' evaluation of
    its own (its curve started at the global k before); the KL switches do not matter, but for
    one that asks for the KL/entropy pass the base model's evaluation (global switch off) lacks."""
    from fastslow.experiments import expand
    from fastslow.layout import eval_point_file, eval_points

    cfg = load_config(ROOT / "config" / "config.yaml", overrides={
        "evaluation": {"divergence": False}, "experiments": {"stargraph": {"variants": {
            "k8": {"evaluation": {"k": 8}}, "few": {"evaluation": {"max_problems": 2}},
            "nokl": {"evaluation": {"divergence": False, "divergence_tokens": 1024}},
            "kl": {"evaluation": {"divergence": True}}}}}})
    runs = {s.variant: s for s in expand(cfg).values() if s.experiment == "stargraph" and s.method == "rl"}
    assert eval_point_file(runs["nokl"], "init", "stargraph") == "results/eval/base/stargraph.json"
    # the global switch on: `true` repeats it, and the run (shared with an identical one) keeps the
    # base evaluation, not an extra one in the directory of the run it shares
    exp = {"tasks": ["math"], "methods": ["rl"], "seeds": [0], "cycles": 2}
    again = load_config(ROOT / "config" / "config.yaml", overrides={"experiments": {
        "first": exp, "again": {**exp, "overrides": {"evaluation": {"divergence": True}}}}})
    assert again["evaluation"]["divergence"] is True
    spec = expand(again)["again/rl/math-default-s0"]
    assert spec.shared in ("first/rl/math-default-s0", "efficiency/rl/math-default-s0")
    assert "evaluation" not in spec.overrides
    assert eval_point_file(spec, "init", "math") == "results/eval/base/math.json"
    for variant in ("k8", "few", "kl"):
        assert eval_points(runs[variant])[0] == "init"
        assert eval_point_file(runs[variant], "init", "stargraph") == \
            f"results/runs/stargraph/rl/stargraph-{variant}-s0/eval/init/stargraph.json"
    # a run started from another run's weights (Fig 5's) evaluates them itself: the base model's
    # evaluation would start its curve at the base model's reward
    started = [s for s in expand(load_config(ROOT / "config" / "config.yaml")).values()
               if s.experiment == "plasticity" and s.init is not None]
    assert started and all(eval_point_file(s, "init", "hover_hard").startswith(f"results/runs/{s.key}/eval/init/")
                           for s in started)


# --- data.hf_datasets presets (paper scale) ---------------------------------------------------------

def _hf(entries: dict) -> dict:
    return load_config(ROOT / "config" / "config.yaml", overrides={"data": {"source": "hf", "hf_datasets": entries}})


def test_an_hf_entry_names_a_preset_whose_keys_it_can_override():
    from fastslow.config import task_spec
    from fastslow.tasks.loaders import HF_PRESETS

    cfg = _hf({"hover": {"preset": "hover_real"},
               "hover_hard": {"preset": "hover_hard_real", "revision": "main", "splits": {"train": "train"}}})
    registry, opts = task_spec(cfg, "hover")
    assert registry == "hf" and opts == {**HF_PRESETS["hover_real"], "name": "hover"}
    assert opts["revision"] == "refs/convert/parquet"  # hover-nlp/hover is a loading script
    assert "SUPPORTED or NOT_SUPPORTED" in opts["prompt_template"]
    _, hard = task_spec(cfg, "hover_hard")
    assert hard["filters"] == {"num_hops": [3, 4]} and hard["name"] == "hover_hard"
    assert hard["revision"] == "main" and hard["split_map"] == {"train": "train"}  # the entry's keys win
    assert hard["dataset"] == "hover-nlp/hover" and hard["scorer"] == "label"
    # filters (GEPA's and DSPy's HoVer-hard reading: 3-hop claims only) replace the preset's; a
    # column merges into its mapping (an answer column alone lost the preset's prompt column)
    cfg = _hf({"hover_hard": {"preset": "hover_hard_real", "filters": {"num_hops": [3]}, "columns": {"answer": "gold"}}})
    _, hard = task_spec(cfg, "hover_hard")
    assert hard["filters"] == {"num_hops": [3]} and hard["columns"] == {"prompt": "claim", "answer": "gold"}
    with pytest.raises(ConfigError, match=r"^config error: data\.hf_datasets\.hover_hard\.filters\.num_hops: "):
        _hf({"hover_hard": {"preset": "hover_hard_real", "filters": {"num_hops": []}}})


def test_paper_scale_hover_asks_whether_the_claim_is_supported():
    """paper.yaml: hover and hover_hard go through the HoVer presets (HoVer-hard: 3-4 hops), not
    the generic loader's bare claim, and not hover_hard's offline generator; math is Polaris."""
    from fastslow.config import task_spec
    from fastslow.tasks.loaders import HF_PRESETS

    cfg = load_config(ROOT / "config" / "paper.yaml")
    for task, preset in (("hover", "hover_real"), ("hover_hard", "hover_hard_real"), ("math", "polaris")):
        assert task_spec(cfg, task) == ("hf", {**HF_PRESETS[preset], "name": task}), task
    assert task_spec(cfg, "hover_hard")[1]["filters"] == {"num_hops": [3, 4]}
    # the tasks without a paper dataset keep their offline generators, and paper.yaml says so
    text = (ROOT / "config" / "paper.yaml").read_text()
    for task in ("physics", "stargraph", "math_hard"):
        assert task_spec(cfg, task)[0] == task
        assert task in text.split("hf_datasets:", 1)[1].split("math:", 1)[0], task


def test_fig2_orders_difficulty_levels_only_from_one_source(tmp_path):
    """Fig 2's radar calls a harder level of a family easy→hard only when its data and the
    training task's come from one source (`fastslow.figures.radar_group`): paper.yaml's math is
    Polaris, math_hard reasoning-gym's; its hover and hover_hard are both HoVer."""
    from fastslow.config import task_sources

    paper = task_sources(load_config(ROOT / "config" / "paper.yaml"))
    assert paper["math"] == "hf:POLARIS-Project/Polaris-Dataset-53K" and paper["math_hard"] == "generator"
    assert paper["hover"] == paper["hover_hard"] == "hf:hover-nlp/hover"
    assert paper["physics"] == paper["codeio"] == "generator"
    rows = tmp_path / "mine.jsonl"
    rows.write_text('{"id": "a", "prompt": "1+1?", "answer": "2"}\n')
    offline = task_sources(load_config(ROOT / "config" / "config.yaml", overrides={
        "data": {"files": {"math": {"path": str(rows)}, "mine": {"path": str(rows)}}}}))
    assert offline["math"] == offline["mine"] == f"file:{rows}" and offline["math_hard"] == "generator"


@pytest.mark.parametrize(("entry", "expected"), [
    ({"preset": "hover_rea"}, "data.hf_datasets.hover.preset: unknown preset 'hover_rea'; expected one of "
                              "hover_hard_real, hover_real, polaris"),
    ({"splits": {"train": "train"}}, "data.hf_datasets.hover: missing required key 'path' (a dataset id) or 'preset'"),
    ({"preset": "hover_real", "revison": "main"}, "data.hf_datasets.hover: unknown key 'revison'"),
    # a misnamed split or column was ignored: the validation split unused, the id column not read
    ({"path": "hover-nlp/hover", "splits": {"train": "train", "valid": "validation"}},
     "data.hf_datasets.hover.splits: unknown key 'valid'; expected one of test, train, val"),
    ({"preset": "hover_real", "columns": {"prompt": "claim", "id": "uid"}},
     "data.hf_datasets.hover.columns: unknown key 'id'; expected one of answer, prompt"),
])
def test_a_bad_hf_entry_is_one_line_naming_the_key(entry, expected):
    with pytest.raises(ConfigError) as info:
        _hf({"hover": entry})
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)


@pytest.mark.filterwarnings("ignore:.*only .* exist")
def test_the_hover_preset_loads_the_parquet_conversion(tmp_path, monkeypatch):
    """Through the config, hover_hard_real asks `datasets` for hover-nlp/hover at the Hub's
    Parquet revision (served here from local files with HoVer's schema), keeps the 3-4 hop
    claims, asks whether each is supported and takes test from the labelled validation split."""
    datasets = pytest.importorskip("datasets")
    from fastslow.config import make_task
    from fastslow.tasks import SPLITS

    features = datasets.Features({"uid": datasets.Value("string"), "claim": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["NOT_SUPPORTED", "SUPPORTED"]),
                                  "num_hops": datasets.Value("int32"), "hpqa_id": datasets.Value("string")})
    for split, n in (("train", 60), ("validation", 12)):
        datasets.Dataset.from_dict({"uid": [f"{split}{i}" for i in range(n)],
                                    "claim": [f"Claim {split} {i}." for i in range(n)],
                                    "label": [i % 2 for i in range(n)], "num_hops": [2 + i % 3 for i in range(n)],
                                    "hpqa_id": [f"{split}-item{i // 3}" for i in range(n)]},
                                   features=features).to_parquet(str(tmp_path / f"{split}.parquet"))
    real, calls = datasets.load_dataset, []

    def hub(path, name=None, *, split, revision=None, **_):
        calls.append((path, name, split, revision))
        return real("parquet", data_files={split: str(tmp_path / f"{split}.parquet")}, split=split,
                    cache_dir=str(tmp_path / "cache"))

    monkeypatch.setattr(datasets, "load_dataset", hub)
    task = make_task(load_config(ROOT / "config" / "paper.yaml"), "hover_hard")
    rows = {s: task.problems(s, 100, seed=0) for s in SPLITS}
    assert sorted(calls) == [("hover-nlp/hover", None, "train", "refs/convert/parquet"),
                             ("hover-nlp/hover", None, "validation", "refs/convert/parquet")]
    assert all(rows.values())
    assert {p.id.split("-", 1)[1].rstrip("0123456789") for p in rows["test"]} == {"validation"}
    assert sum(map(len, rows.values())) == sum(1 for n in (60, 12) for i in range(n) if 2 + i % 3 >= 3)
    items = {s: {q.metadata["hpqa_id"] for q in rows[s]} for s in SPLITS}  # one item's claims, one split
    assert not (items["train"] & items["val"])
    p = rows["train"][0]
    assert p.task == "hover_hard" and p.prompt.startswith("Is the following claim supported")
    assert "SUPPORTED or NOT_SUPPORTED" in p.prompt and "<answer></answer>" in p.prompt
    assert task.reward(p, f"<answer>{p.answer}</answer>") == 1.0


# --- every run's effective settings are a valid config --------------------------------------------

@pytest.mark.parametrize(("experiments", "expected"), [
    ({"continual": {"overrides": {"slow": {"stesp_per_cycle": 5}}}},
     "experiments.continual.overrides: slow: unknown key 'stesp_per_cycle'"),
    ({"continual": {"overrides": {"slow": {"steps_per_cycle": 0}}}},
     "experiments.continual.overrides: slow.steps_per_cycle: expected an integer >= 1, got 0"),
    ({"stargraph": {"overrides": {"fast": {"pool_size": 3}}}},
     "experiments.stargraph.overrides: fast.pool_size: K=3 must divide slow.num_generations G=4"),
    ({"radar": {"overrides": {"evaluation": {"K": 8}}}}, "experiments.radar.overrides: evaluation: unknown key 'K'"),
    # an experiment with variants: the variant, or the experiment's overrides, whichever is wrong
    ({"ablations": {"variants": {"k3": {"fast": {"pool_size": 3}}}}},
     "experiments.ablations.variants.k3: fast.pool_size: K=3 must divide"),
    ({"reuse": {"overrides": {"slow": {"lrr": 1.0}}}}, "experiments.reuse.overrides: slow: unknown key 'lrr'"),
    ({"continual": {"overrides": {"slow": {"micro_batch_size": 3}}}},
     "experiments.continual.overrides: slow.micro_batch_size: expected null or a divisor of P*G = 8"),
    ({"ablations": {"variants": {"k4": {"slow": {"baseline": "prompt"}}}}},
     "experiments.ablations.variants.k4: slow.baseline: 'prompt' with G=4, K=4 (fast.pool_size) gives groups"),
    ({"continual": {"overrides": {"slow": {"lr": float("nan")}}}},
     "experiments.continual.overrides: slow.lr: expected a finite number, got nan"),
])
def test_bad_experiment_overrides_are_one_line_naming_the_experiment(experiments, expected):
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml", overrides={"experiments": experiments})
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_overrides_are_validated_per_method():
    """RL runs take K = 1 whatever the overrides say, so a K that only FST cannot use names FST's runs' config."""
    cfg = load_config(ROOT / "config" / "config.yaml", overrides={"experiments": {
        "stargraph": {"methods": ["rl"], "overrides": {"fast": {"pool_size": 3}}}}})
    assert cfg["experiments"]["stargraph"]["overrides"]["fast"]["pool_size"] == 3


# --- the slow loop's keys: what SlowConfig reads ----------------------------------------------------

NEW_SLOW = {"top_p": 0.95, "scale_rewards": "batch", "max_grad_norm": 1.0, "weight_decay": 0.01,
            "adam_beta1": 0.8, "adam_beta2": 0.99, "vllm_mode": "colocate", "vllm_enable_sleep_mode": True}


def test_the_schema_takes_exactly_the_slow_keys_slowconfig_reads():
    from dataclasses import fields

    from fastslow.config import load_schema
    from fastslow.slow.config import SlowConfig

    schema_keys = set(load_schema()["properties"]["slow"]["properties"])
    # seed: each run's own; chat_template_kwargs: model.chat_template_kwargs, every prompt's
    assert schema_keys == {f.name for f in fields(SlowConfig)} - {"seed", "chat_template_kwargs"}
    # (Fig 10's reuse variant samples RL rows in the fast round: both loops' top_p alike)
    cfg = load_config(ROOT / "config" / "config.yaml", overrides={"slow": NEW_SLOW, "generation": {"top_p": 0.95}})
    slow = SlowConfig.from_dict({**cfg["slow"], "bf16": False, "seed": 0})
    assert {k: getattr(slow, k) for k in NEW_SLOW} == NEW_SLOW
    # left out, they take SlowConfig's defaults (the filled-in config, so the jobs' params, unchanged)
    assert not set(NEW_SLOW) & set(load_config(ROOT / "config" / "config.yaml")["slow"])
    rows = {key: cell for key, cell, _ in _readme_keys()}
    for f in fields(SlowConfig):
        if f.name in NEW_SLOW:
            assert f"SlowConfig's `{yaml.safe_dump(f.default).splitlines()[0]}`" in rows[f"slow.{f.name}"], f.name


def test_every_choice_the_schema_offers_is_one_the_code_runs():
    """A value is named in the schema and again where the code dispatches on it: one added to the
    schema alone passed planning and failed (or fell through to another branch) at run time. The
    schema's enums are the code's tuples, and every method has its cycle rule, its traits and
    its figure styles, so a half-added extension fails here (README "Extending fastslow")."""
    from fastslow import figures
    from fastslow.config import load_schema
    from fastslow.experiments import CYCLE_RULE, FAST, METHODS, TRAINS
    from fastslow.fast.config import PRESETS, PROPOSERS, REFLECTION_KINDS
    from fastslow.slow.config import BASELINES, SCALE_REWARDS
    from fastslow.tasks.loaders import SCORERS

    props = load_schema()["properties"]
    experiment = props["experiments"]["additionalProperties"]["properties"]
    data = props["data"]["properties"]
    assert tuple(props["slow"]["properties"]["baseline"]["enum"]) == BASELINES
    assert tuple(props["slow"]["properties"]["scale_rewards"]["enum"]) == SCALE_REWARDS
    assert tuple(props["fast"]["properties"]["proposer"]["enum"]) == PROPOSERS
    assert tuple(props["fast"]["properties"]["preset"]["enum"]) == PRESETS
    assert tuple(props["fast"]["properties"]["reflection"]["properties"]["kind"]["enum"]) == REFLECTION_KINDS
    assert tuple(data["files"]["additionalProperties"]["properties"]["scorer"]["enum"]) == SCORERS
    assert tuple(data["hf_datasets"]["additionalProperties"]["properties"]["scorer"]["enum"]) == SCORERS
    assert tuple(experiment["methods"]["items"]["enum"]) == METHODS
    assert tuple(experiment["init"]["properties"]["methods"]["items"]["enum"]) == tuple(m for m in METHODS if TRAINS[m])
    assert set(TRAINS) == set(FAST) == set(CYCLE_RULE) == set(METHODS)
    smk = (ROOT / "workflow" / "rules" / "train.smk").read_text()
    assert all(f'rule {rule}:' in smk or f"as {rule} with:" in smk for rule in set(CYCLE_RULE.values()))
    for styles in (figures.COLORS, figures.LABELS, figures.LINES):
        assert set(styles) == {*METHODS, "base"}


NEW_FAST = {"max_demos": 5, "max_rules": 0, "max_demo_chars": 900, "max_stalled_iterations": 3}


def test_the_schema_takes_every_fast_key_fastconfig_reads_from_the_fast_section():
    """FastConfig's fields less those the cycle fills from elsewhere (generation.*, the run's
    seed, the budgets as max_metric_calls), plus the two the cycle reads itself (val_problems,
    dtype). The feedback editor's limits reach it from the config, and leave a reflective
    proposer's params, which never reads them."""
    from dataclasses import fields

    from fastslow.config import load_schema
    from fastslow.experiments import cycle_section
    from fastslow.fast import FastConfig

    schema_keys = set(load_schema()["properties"]["fast"]["properties"])
    from_elsewhere = {"budgets", "max_new_tokens", "temperature", "top_p", "seed", "eval_batch_size"}
    assert schema_keys == {f.name for f in fields(FastConfig)} - from_elsewhere | {"val_problems", "dtype"}
    cfg = load_config(ROOT / "config" / "config.yaml", overrides={"fast": NEW_FAST})
    fast = FastConfig.from_dict(cycle_section("fst", "fast", cfg["fast"]))  # as fastslow.cycle builds it
    assert {k: getattr(fast, k) for k in NEW_FAST} == NEW_FAST
    assert not set(NEW_FAST) & set(load_config(ROOT / "config" / "config.yaml")["fast"])
    reflective = load_config(ROOT / "config" / "config.yaml", overrides={"fast": {
        **NEW_FAST, "proposer": "reflective", "reflection": {"base_url": "http://localhost:8000/v1", "model": "m"}}})
    read = cycle_section("fst", "fast", reflective["fast"])
    assert read["max_stalled_iterations"] == 3 and not {"max_demos", "max_rules", "max_demo_chars"} & set(read)
    assert {"max_demos", "max_rules", "max_demo_chars"} <= set(cycle_section("fst", "fast", cfg["fast"]))


@pytest.mark.parametrize(("fast", "expected"), [
    ({"max_demos": 0}, "fast.max_demos: expected an integer >= 1, got 0"),
    ({"max_rules": -1}, "fast.max_rules: expected an integer >= 0, got -1"),
    ({"max_demo_chars": "long"}, "fast.max_demo_chars: expected an integer"),
    ({"max_stalled_iterations": 0}, "fast.max_stalled_iterations: expected an integer >= 1, got 0"),
])
def test_a_bad_feedback_editor_limit_is_one_line(fast, expected):
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml", overrides={"fast": fast})
    assert expected in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("slow", "expected"), [
    ({"activation_checkpointing": "yes"}, "slow.activation_checkpointing: expected one of True, False, 'auto', got 'yes'"),
    ({"top_p": 1.5}, "slow.top_p: expected a number <= 1, got 1.5"),
    ({"top_p": 0}, "slow.top_p: expected a number > 0"),
    ({"scale_rewards": "std"}, "slow.scale_rewards: expected one of 'group', 'batch', 'none'"),
    ({"max_grad_norm": 0}, "slow.max_grad_norm: expected a number > 0"),
    ({"weight_decay": -0.1}, "slow.weight_decay: expected a number >= 0"),
    ({"adam_beta2": 1.0}, "slow.adam_beta2: expected a number < 1"),
    ({"vllm_mode": "server"}, "slow.vllm_mode: expected one of 'colocate'"),
    ({"vllm_enable_sleep_mode": "on"}, "slow.vllm_enable_sleep_mode: expected a boolean"),
    ({"seed": 3}, "slow: unknown key 'seed'"),
])
def test_bad_slow_loop_keys_are_one_line(slow, expected):
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml", overrides={"slow": slow})
    assert expected in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_reuse_in_slow_compares_the_slow_loops_top_p():
    reuse = {"fast": {"reuse_in_slow": True}, "generation": {"max_new_tokens": 64}}
    cfg = load_config(ROOT / "config" / "config.yaml", overrides={**reuse, "slow": {"top_p": 0.9},
                                                                  "generation": {"max_new_tokens": 64, "top_p": 0.9}})
    assert cfg["slow"]["top_p"] == cfg["generation"]["top_p"] == 0.9
    with pytest.raises(ConfigError, match=r"generation\.top_p=1\.0 must equal the slow loop's top_p 0\.9"):
        load_config(ROOT / "config" / "config.yaml", overrides={**reuse, "slow": {"top_p": 0.9}})
    with pytest.raises(ConfigError, match=r"generation\.top_p=0\.9 must equal the slow loop's top_p 1\.0"):
        load_config(ROOT / "config" / "config.yaml", overrides={**reuse, "generation": {"max_new_tokens": 64,
                                                                                         "top_p": 0.9}})
    # left out, slow.top_p is SlowConfig's default, which config.py states as a literal
    from fastslow.slow.config import SlowConfig

    assert SlowConfig().top_p == 1.0


def test_reuse_rollouts_alone_needs_the_two_loops_to_sample_alike():
    """fast.reuse_rollouts: the round scores its seeds on the RL steps' rollouts (slow.*) and its
    children on its own samples (generation.*); with other lengths every child was judged against
    another baseline and the pool silently stopped changing. Only reuse_in_slow was checked."""
    reuse = {"fast": {"reuse_rollouts": True}}
    assert load_config(ROOT / "config" / "config.yaml", overrides=reuse)["fast"]["reuse_rollouts"] is True
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml", overrides={**reuse, "slow": {"max_new_tokens": 128}})
    assert str(info.value) == ("config error: fast.reuse_rollouts: generation.max_new_tokens=64 must equal the slow "
                               "loop's max_new_tokens 128 (the round scores its seeds on the RL steps' rollouts and "
                               "its children on its own samples)")
    with pytest.raises(ConfigError, match=r"^config error: fast\.reuse_rollouts: generation\.temperature=0\.5 must"):
        load_config(ROOT / "config" / "config.yaml", overrides={**reuse, "generation": {"temperature": 0.5}})


def test_reuse_steps_must_fit_the_cycle_and_the_validation_set():
    """fast.reuse_steps: the first n steps' n x P problems lead the round's validation set, so
    they must fit in it (n counted up to the cycle's T); the refusal is one line naming the value."""
    reuse = {"fast": {"reuse_in_slow": True, "reuse_steps": 3}, "generation": {"max_new_tokens": 64}}
    cfg = load_config(ROOT / "config" / "config.yaml", overrides=reuse)  # 3 x P = 2 fits val_problems = 6
    assert cfg["fast"]["reuse_steps"] == 3
    # more than a cycle's T serves its T steps: the continual experiment's T = 2 takes reuse_steps 3
    assert load_config(ROOT / "config" / "config.yaml",
                       overrides=deep_update(copy.deepcopy(reuse), {"fast": {"reuse_steps": 9}}))["fast"]["reuse_steps"] == 9
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "config" / "config.yaml", overrides=deep_update(copy.deepcopy(reuse), {"fast": {"val_problems": 5}}))
    assert "fast.reuse_steps: 3 steps x slow.problems_per_step=2 problems must fit" in str(info.value)
    assert "lower fast.reuse_steps to at most 2" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="fast.reuse_steps: expected an integer >= 1|fast.reuse_steps: .*0"):
        load_config(ROOT / "config" / "config.yaml", overrides=deep_update(copy.deepcopy(reuse), {"fast": {"reuse_steps": 0}}))
    # left out, FastConfig's default, which config.py states as a literal; the filled-in config
    # (so every job's params) does not gain the key
    from fastslow.fast import FastConfig

    assert FastConfig().reuse_steps == 1
    assert "reuse_steps" not in load_config(ROOT / "config" / "config.yaml")["fast"]


def test_config_readme_states_slowconfigs_own_defaults():
    """The slow and fast keys without a schema default take SlowConfig's or FastConfig's:
    config/README.md says which, and says it right (the twin of the schema descriptions; a changed
    default must show)."""
    import re

    from fastslow.config import load_schema
    from fastslow.fast import FastConfig
    from fastslow.slow.config import SlowConfig

    text = (ROOT / "config" / "README.md").read_text(encoding="utf-8")
    for section, dataclass in (("slow", SlowConfig), ("fast", FastConfig)):
        stated = dict(re.findall(rf"^\| `{section}\.(\w+)` \| {dataclass.__name__}'s `([^`]*)` \|", text, flags=re.M))
        schema = load_schema()["properties"][section]["properties"]
        assert set(stated) == {k for k, v in schema.items() if "default" not in v}, section
        for key, value in stated.items():
            assert yaml.safe_load(value) == getattr(dataclass(), key) == schema[key]["x-implied"], key


# --- paper.yaml's figures and docs --------------------------------------------------------------------

def test_fig9_compares_paper_scale_variants_at_the_step_paper_yaml_states():
    """figures.common_step over the curves Fig 9 reads (the ablations and efficiency's codeio RL
    and FST runs), from paper.yaml's settings: the step its comment names."""
    import re

    import polars as pl

    from fastslow.experiments import expand
    from fastslow.figures import common_step
    from fastslow.layout import eval_points

    cfg = load_config(ROOT / "config" / "paper.yaml")
    rows = []
    for spec in expand(cfg).values():
        if spec.experiment == "ablations" or (spec.experiment == "efficiency" and spec.schedule[0] == "codeio"):
            steps = spec.settings(cfg)["slow"]["steps_per_cycle"]
            for point in eval_points(spec):
                cycle = -1 if point == "init" else int(point.removeprefix("cycle"))
                rows.append({"run": spec.source, "step": (cycle + 1) * steps})
    step = common_step(pl.DataFrame(rows))
    assert step == 120
    text = (ROOT / "config" / "paper.yaml").read_text().split("  ablations:", 1)[1].split("variants:", 1)[0]
    assert re.findall(r"at step (\d+) \(figures\.common_step\)", text) == [str(step)], text


def test_config_docs_name_every_shipped_config():
    text = (ROOT / "config" / "README.md").read_text().split("## Keys", 1)[0]
    for path in sorted((ROOT / "config").glob("*.yaml")):
        assert f"| `{path.name}` |" in text, path.name
    paper = (ROOT / "config" / "paper.yaml").read_text()
    assert "no schema key" not in paper and "slow.vllm_gpu_memory_utilization" in paper


# --- what YAML 1.1 reads as text, empty values, local model paths ------------------------------------

def test_a_number_yaml_reads_as_text_is_a_number_by_every_route(tmp_path):
    """`lr: 1e-5` (no dot: PyYAML's YAML 1.1 makes it text) is the number a user means, at a key that
    takes a number and no text: in a file, an overlay, an experiment's overrides and variants, a task
    option and `--config`. Quoted text that is no such number ("8", 'nan') stays an error."""
    from fastslow.experiments import expand

    config = ROOT / "config" / "config.yaml"
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("slow: {lr: 1e-5, max_grad_norm: 1E2, weight_decay: 5e-1}\n"
                       "seed_context: 1e-5\nmlflow_experiment: 2e3\n"
                       "data: {options: {physics: {rel_tol: 1e-3}}}\n"
                       "experiments:\n  continual: {overrides: {slow: {lr: 2e-5}}}\n"
                       "  ablations: {variants: {k4: {slow: {lr: 3.5E-6}}}}\n")
    assert yaml.safe_load(overlay.read_text())["slow"]["lr"] == "1e-5"  # what PyYAML gives
    cfg = load_config(config, overlay)
    assert (cfg["slow"]["lr"], cfg["slow"]["max_grad_norm"], cfg["slow"]["weight_decay"]) == (1e-5, 100.0, 0.5)
    assert cfg["data"]["options"]["physics"]["rel_tol"] == 1e-3
    assert (cfg["seed_context"], cfg["mlflow_experiment"]) == ("1e-5", "2e3")  # text keys keep the text
    runs = expand(cfg).values()
    assert {r.settings(cfg)["slow"]["lr"] for r in runs if r.experiment == "continual"} == {2e-5}
    assert {r.settings(cfg)["slow"]["lr"] for r in runs if r.variant == "k4"} == {3.5e-6}
    # --config slow='{lr: 1e-5}': Snakemake hands the nested value over as text
    given = {"slow": {"lr": "1e-5", "warmup_steps": "0"}}
    cfg = validate_config(deep_update(_default(), copy.deepcopy(given)), command_line=given)
    assert (cfg["slow"]["lr"], cfg["slow"]["warmup_steps"]) == (1e-5, 0)
    for slow, expected in (({"num_generations": "8"}, "slow.num_generations: expected an integer, got str '8'"),
                           ({"lr": "nan"}, "slow.lr: expected a number, got str 'nan'"),
                           ({"lr": "1e-5x"}, "slow.lr: expected a number, got str '1e-5x'"),
                           ({"num_generations": "1e3"}, "slow.num_generations: expected an integer, got str '1e3'")):
        with pytest.raises(ConfigError) as info:
            load_config(config, overrides={"slow": slow})
        assert expected in str(info.value), str(info.value)


def test_an_integer_at_a_number_key_is_the_float_the_default_is():
    """`temperature: 1` is the default's 1.0. Snakemake compares params by their repr, and 1 and
    1.0 print differently, so the int reran every job carrying the key (and `timeout_s: 60`
    written against the schema's default 60 the other way round). Integer keys keep their ints."""
    from fastslow.config import job_params
    from fastslow.experiments import expand

    base = load_config(ROOT / "config" / "config.yaml")
    spelt = load_config(ROOT / "config" / "config.yaml", overrides={
        "generation": {"temperature": 1, "top_p": 1}, "slow": {"temperature": 1, "epsilon_high": 4},
        "fast": {"format_credit": 0, "reflection": {"timeout_s": 60}},
        "experiments": {"continual": {"overrides": {"slow": {"temperature": 1}}},
                        "ablations": {"variants": {"k4": {"slow": {"temperature": 2}}}}}})
    sections = ("generation", "slow", "fast")
    assert repr(job_params(spelt, sections)) == repr(job_params(base, sections))
    assert type(spelt["fast"]["reflection"]["timeout_s"]) is float  # the schema's own default too
    assert type(base["fast"]["reflection"]["timeout_s"]) is float
    for run in expand(spelt).values():
        if run.experiment == "continual":
            assert repr(run.settings(spelt)["slow"]["temperature"]) == "1.0"
        if run.variant == "k4":
            assert repr(run.settings(spelt)["slow"]["temperature"]) == "2.0"
    assert type(spelt["slow"]["num_generations"]) is int and type(spelt["evaluation"]["k"]) is int


def test_an_empty_seed_context_from_the_command_line_is_named_as_given():
    """`--config seed_context=''`: Snakemake makes an empty value None; the error names ''."""
    cfg = _default()
    cfg["seed_context"] = None
    with pytest.raises(ConfigError, match=r"^config error: seed_context: must be a non-empty string, got ''$"):
        validate_config(cfg, command_line={"seed_context": None})


def test_the_model_directory_of_a_local_path_is_the_directory_it_names(tmp_path, monkeypatch):
    from fastslow.config import model_name

    local = tmp_path / "mymodel"
    local.mkdir()
    monkeypatch.chdir(local)
    for base in (f"{local}/.", f"{local}/", ".", "./", f"{local}/sub/..", "../mymodel"):
        assert model_name({"model": {"base": base}}) == "mymodel", base
    assert model_name({"model": {"base": "Qwen/Qwen3-8B"}}) == "Qwen3-8B"
    assert model_name({"model": {"base": "tiny-random"}}) == "tiny-random"
    assert model_name({"model": {"base": ".", "name": "mine"}}) == "mine"
    with pytest.raises(ConfigError, match=r"^config error: model\.base: names no directory under results/models/ "
                                          r"\(set model\.name\), got '/'$"):
        validate_config(deep_update(_default(), {"model": {"base": "/"}}))


def test_the_config_check_of_the_slow_batches_is_slowconfigs():
    """The config check and SlowConfig apply the same batch rules (config.micro_batch_fits,
    config.prompt_groups_fit), each on its own reading of the settings: both agree."""
    import itertools

    from fastslow.slow.config import SlowConfig

    disagree = []
    for p, g, micro, baseline, k in itertools.product((1, 2, 3), (2, 4, 6), (None, 1, 2, 3, 4, 5, 8),
                                                      ("problem", "prompt"), (1, 2, 3, 4, 6)):
        if g % k:  # fast.pool_size's own check
            continue
        slow = {"problems_per_step": p, "num_generations": g, "micro_batch_size": micro, "baseline": baseline}
        try:
            SlowConfig.from_dict({**slow, "bf16": False}).check_pool(k)
            loop_error = None
        except ValueError as err:
            loop_error = str(err)
        cfg = deep_update(_default(), {"slow": slow, "fast": {"pool_size": k}})
        cfg["experiments"] = {}  # theirs set K otherwise
        try:
            validate_config(cfg)
            config_error = None
        except ConfigError as err:
            config_error = str(err)
        if (loop_error is None) != (config_error is None):
            disagree.append((slow, k, loop_error, config_error))
    assert not disagree, disagree[:3]


def _smoke(**overrides) -> dict:
    return load_config(ROOT / "config/config.yaml", ROOT / "config/smoke.yaml", overrides=overrides)


def test_a_fast_budget_below_a_rounds_minimum_with_k_contexts_is_one_line():
    """The round refuses a budget below its minimum, which grows with the distinct contexts in the
    pool: a budget fine for cycle 0's seed context alone stopped a later cycle with a traceback.
    The config check asks for K distinct contexts (a one-cycle run's round has the seed alone),
    per run: the global budget, an experiment's overrides or a variant named; RL has no round."""
    with pytest.raises(ConfigError) as err:  # smoke: K=2, 2 val problems, minibatch 2
        _smoke(fast={"max_metric_calls": {"light": 9}})
    assert str(err.value) == (
        "config error: fast.max_metric_calls.light: 9 is below a round's minimum 10 with K=2 distinct "
        "contexts (2 x 2 fast.val_problems + 2 x 2 fast.minibatch_size + 2 fast.val_problems); raise it "
        "or lower fast.val_problems / fast.minibatch_size / fast.pool_size")
    assert _smoke(fast={"max_metric_calls": {"light": 10}})
    with pytest.raises(ConfigError, match=r"^config error: experiments\.ablations\.variants\.k4: fast\."
                       r"max_metric_calls\.light: 12 is below a round's minimum 14 with K=4 "):
        _smoke(experiments={"ablations": {"variants": {"k4": {"cycles": 2}}}})
    with pytest.raises(ConfigError, match=r"^config error: experiments\.ablations\.overrides: fast\."
                       r"max_metric_calls\.full: 20 is below a round's minimum 22 "):
        _smoke(experiments={"ablations": {"overrides": {"fast": {"preset": "full", "val_problems": 6}}}})
    # the preset a run uses: an unused one may be anything
    assert _smoke(fast={"max_metric_calls": {"full": 1}}, experiments={"ablations": {"variants": {"full_gepa": None}}})
    # no run with a round (rl only): no minimum
    rl_only = {"efficiency": {"tasks": ["math"], "methods": ["rl"], "cycles": 2}}
    cfg = deep_update(_default(), {"fast": {"max_metric_calls": {"light": 1}}})
    cfg["experiments"] = rl_only
    assert validate_config(cfg)
    cfg = deep_update(_default(), {"fast": {"max_metric_calls": {"light": 1}}})
    cfg["experiments"] = {"efficiency": {**rl_only["efficiency"], "methods": ["rl", "gepa"]}}
    with pytest.raises(ConfigError, match=r"^config error: fast\.max_metric_calls\.light: 1 is below "):
        validate_config(cfg)


def test_a_train_split_too_small_for_a_fast_round_is_one_line_naming_data_sizes_train(tmp_path):
    """data.sizes.train: 1 passed the check, then every cycle with a fast round died with a
    traceback: the cycle cuts the round's validation and minibatch problems from the train split
    (`gepa_split`), so one problem leaves the minibatches none. RL alone needs no minimum."""
    from fastslow.cycle import gepa_split
    from fastslow.fast import FastConfig, Pool, run_round
    from fastslow.tasks import get_task

    assert all(gepa_split([1, 2], 4)) and not all(gepa_split([1], 4))  # 2: the true minimum
    with pytest.raises(ConfigError) as err:
        _smoke(data={"sizes": {"train": 1}})
    assert str(err.value) == ("config error: data.sizes.train: expected an integer >= 2 with a fast method (a fast "
                              "round validates on some train problems and reflects on the others), got 1")
    assert _smoke(data={"sizes": {"train": 2}})
    cfg = deep_update(_default(), {"data": {"sizes": {"train": 1}}})
    cfg["experiments"] = {"efficiency": {"tasks": ["math"], "methods": ["rl"], "cycles": 2}}
    assert validate_config(cfg)
    # the round's own check names what it got
    reflect, pareto = gepa_split(get_task("math").problems("train", 1, 0), 4)
    with pytest.raises(ValueError, match=r"^a fast round needs train and validation problems, got 0 train and 1 "
                                         r"validation problems \(.*2 problems at least: data\.sizes\.train\)$"):
        run_round(Pool.seed("Solve.", 2), None, get_task("math"), reflect, pareto, FastConfig(pool_size=2), 0,
                  tmp_path / "r")


@pytest.mark.parametrize("cycles, k", [(1, 3), (2, 1), (2, 2), (2, 3)])
def test_the_config_budget_minimum_is_the_rounds(cycles, k, tmp_path):
    """The config check (`fast_budget_error`: K, fast.val_problems and fast.minibatch_size cut to
    data.sizes.train as it reckons the cycle cuts them) refuses exactly the budgets the round
    itself refuses (`run_round` on the problems `gepa_split` gives it, the pool of the cycle:
    the seed alone in the first, K distinct contexts from the second on): the smallest budget
    the config passes starts a round, one less stops it at its check."""
    import itertools

    from fastslow.config import fast_budget_error
    from fastslow.cycle import gepa_split
    from fastslow.fast import FastConfig, Pool, PoolEntry, run_round
    from fastslow.tasks import get_task

    class Started(Exception):
        pass

    class Generator:  # the round got past its budget check: it samples the seeds' validation
        def generate(self, conversations, params):
            raise Started

    task = get_task("math")
    distinct = 1 if cycles == 1 else k
    pool = Pool(entries=[PoolEntry(text=f"context {i}") for i in range(distinct)], k=k)
    for val_problems, minibatch, train in itertools.product((1, 3, 8), (1, 3, 6), (2, 5, 12)):
        def settings(budget, val_problems=val_problems, minibatch=minibatch, train=train):
            return {"fast": {"pool_size": k, "val_problems": val_problems, "minibatch_size": minibatch,
                             "preset": "light", "max_metric_calls": {"light": budget}},
                    "data": {"sizes": {"train": train}}}
        need = next(b for b in range(1, 500) if fast_budget_error(settings(b), cycles) is None)
        assert fast_budget_error(settings(need - 1), cycles)
        reflect, pareto = gepa_split(task.problems("train", train, 0), val_problems)
        with pytest.raises(ValueError, match=f"below one round's minimum {need} "):
            run_round(pool, Generator(), task, reflect, pareto,
                      FastConfig(pool_size=k, minibatch_size=minibatch, max_metric_calls=need - 1), 0, tmp_path / "r")
        with pytest.raises(Started):
            run_round(pool, Generator(), task, reflect, pareto,
                      FastConfig(pool_size=k, minibatch_size=minibatch, max_metric_calls=need), 0, tmp_path / "r")


def test_an_hf_reflection_model_that_does_not_exist_is_one_line(tmp_path, monkeypatch, tiny_model_dir):
    """kind hf with a missing local path passed the check: every reflection call of every round
    then failed, the pool never evolved, and the run 'succeeded'. A local-looking path must exist,
    unless it is the base model's directory, which the workflow builds before any cycle."""
    monkeypatch.chdir(tmp_path)

    def reflection(path: str) -> dict:
        return load_config(ROOT / "config/config.yaml", ROOT / "config/smoke.yaml", overrides={
            "fast": {"proposer": "reflective", "reflection": {"kind": "hf", "path": path}}})

    with pytest.raises(ConfigError) as err:
        reflection("/nonexistent")
    assert str(err.value).startswith("config error: fast.reflection.path: model directory /nonexistent "
                                     "does not exist")
    assert "\n" not in str(err.value)
    for missing in ("results/models/other", "./mymodel", "~/nonexistent-fastslow-model"):
        with pytest.raises(ConfigError, match=r"^config error: fast\.reflection\.path: "):
            reflection(missing)
    (tmp_path / "afile").write_text("")
    with pytest.raises(ConfigError, match=r"^config error: fast\.reflection\.path: .* is not a directory"):
        reflection("afile")
    (tmp_path / "mymodel").mkdir()  # a directory, but no model: found only after a whole round
    with pytest.raises(ConfigError, match=r"^config error: fast\.reflection\.path: .*mymodel.* config\.json"):
        reflection("./mymodel")
    shutil.rmtree(tmp_path / "mymodel")
    shutil.copytree(tiny_model_dir, tmp_path / "mymodel")
    for fine in ("results/models/tiny-random", "./results/models/tiny-random/", str(tmp_path / "mymodel"),
                 "./mymodel", "HuggingFaceTB/SmolLM2-135M-Instruct", "gpt2"):
        assert reflection(fine)["fast"]["reflection"]["path"] == fine


def test_job_params_do_not_depend_on_which_config_file_set_a_key_first():
    """Snakemake compares params by repr: the same settings merged in another order were
    "changed params" and re-ran every job (`--configfile own.yaml` vs `--configfile
    config/config.yaml own.yaml`)."""
    from fastslow.config import MEMORY_BOUNDS, job_params

    cfg = load_config(ROOT / "config" / "config.yaml")
    shuffled = {k: (dict(reversed(list(v.items()))) if isinstance(v, dict) else v) for k, v in reversed(cfg.items())}
    assert shuffled == cfg and repr(shuffled) != repr(cfg)
    sections = ("model", "generation", "seed_context", "slow", "fast")
    assert repr(job_params(shuffled, sections)) == repr(job_params(cfg, sections))
    # the settings less their memory bounds: vLLM's GPU shares
    params = job_params(cfg, sections)
    assert MEMORY_BOUNDS["generation"] == ("gpu_memory_utilization",)
    assert MEMORY_BOUNDS["slow"] == ("vllm_gpu_memory_utilization",)
    assert params["generation"] == {k: v for k, v in cfg["generation"].items() if k != "gpu_memory_utilization"}
    assert params["slow"] == {k: v for k, v in cfg["slow"].items() if k != "vllm_gpu_memory_utilization"}
    assert "gpu_memory_utilization" in cfg["generation"] and "vllm_gpu_memory_utilization" in cfg["slow"]
    assert {k: params[k] for k in ("model", "seed_context", "fast")} == {k: cfg[k] for k in ("model", "seed_context", "fast")}


def test_task_data_tracks_the_content_of_the_files_a_tasks_options_name(tmp_path, monkeypatch):
    """data.options.<task>: each option (or list item) that names an existing file, relative to
    the working directory, is a task_data param by its sha256, in sorted order; other values
    (a word, even one a file is named after, a number, a missing path, a directory) are not.
    Only the option's text was."""
    from fastslow.config import file_sha256, option_files

    monkeypatch.chdir(tmp_path)
    (tmp_path / "words.txt").write_text("apple pear\n")
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists/extra.txt").write_text("fig\n")
    (tmp_path / "hard").write_text("a file that happens to be named like a bare option word\n")
    options = {"words_file": "words.txt", "mode": "hard", "rel_tol": 0.1, "missing": "gone.txt", "folder": "lists",
               "more": ["lists/extra.txt", "plum"], "aaa": {"inner": "words.txt"}}
    cfg = {"data": {"source": "offline", "options": {"mytask": options, "other": {}}}}
    files = option_files(cfg, "mytask")
    assert list(files) == ["aaa.inner", "more[0]", "words_file"]
    assert files["words_file"] == file_sha256("words.txt") == files["aaa.inner"]
    assert files["more[0]"] == file_sha256("lists/extra.txt")
    assert option_files(cfg, "other") == {} == option_files(cfg, "math")
    (tmp_path / "words.txt").write_text("kiwi lime plum\n")  # an edit: another digest, one a dry run sees
    assert option_files(cfg, "mytask")["words_file"] != files["words_file"]
    assert option_files(cfg, "mytask")["more[0]"] == files["more[0]"]
    # the shipped configs name no file in their options: the param is {} for their tasks
    shipped = load_config(ROOT / "config" / "config.yaml", ROOT / "config" / "smoke.yaml")
    monkeypatch.chdir(ROOT)
    assert all(option_files(shipped, task) == {} for task in shipped["data"]["options"])


def test_task_data_params_are_what_its_loader_reads_in_one_key_order(tmp_path, monkeypatch):
    """task_data's `spec` param is `task_spec`'s loader and options with every key sorted (the
    same options merged in another order from `--configfile a b` and `--configfile b` re-ran the
    task's splits and everything trained on them); the settings of a source the task does not
    come from are no part of it, and a task served from the Hub has no option files."""
    from fastslow.config import option_files, task_data_spec

    base = load_config(ROOT / "config" / "config.yaml")
    one = deep_update(copy.deepcopy(base), {"data": {"options": {"codeio": {"rel_tol": 0.1}}}})
    other = copy.deepcopy(one)
    other["data"]["options"]["codeio"] = dict(reversed(list(one["data"]["options"]["codeio"].items())))
    assert repr(other["data"]["options"]["codeio"]) != repr(one["data"]["options"]["codeio"])
    assert repr(task_data_spec(other, "codeio")) == repr(task_data_spec(one, "codeio"))
    assert task_data_spec(one, "codeio") == ["codeio", {"max_prompt_chars": 2500, "rel_tol": 0.1}]
    hub = deep_update(copy.deepcopy(base), {"data": {"hf_datasets": {"math": {"preset": "polaris"}}}})
    assert task_data_spec(hub, "math") == task_data_spec(base, "math")  # offline: the entry is unread
    served = deep_update(copy.deepcopy(hub), {"data": {"source": "hf"}})
    assert task_data_spec(served, "math")[0] != "math"
    assert task_data_spec(served, "stargraph") == task_data_spec(base, "stargraph")  # no entry: its generator
    monkeypatch.chdir(tmp_path)
    (tmp_path / "words.txt").write_text("apple\n")
    named = {"data": {"options": {"math": {"words_file": "words.txt"}}}}
    assert set(option_files(deep_update(copy.deepcopy(hub), named), "math")) == {"words_file"}
    assert option_files(deep_update(copy.deepcopy(served), named), "math") == {}  # from the Hub: unread


def test_experiments_follow_the_default_configs_order_and_init_sources_come_first():
    """Snakemake merges `--configfile overlay.yaml` alone with the overlay's keys first: the
    experiments are put back in config/config.yaml's order (which decides shared runs and where
    an init may point), and an experiment an init names goes before the one naming it, so a
    default experiment can start from an overlay's own."""
    import copy

    from fastslow.config import follow_order, validate_config

    default = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    overlay = {"experiments": {"mine": {"tasks": ["math"], "methods": ["rl"], "cycles": 1},
                               "plasticity": {"init": {"experiment": "mine", "tasks": ["math"], "methods": ["rl"]}},
                               "reuse": {"seeds": [0]}}}
    merged = copy.deepcopy(overlay)  # as Snakemake merges an overlay given alone: its keys first
    for name, exp in default["experiments"].items():
        merged["experiments"][name] = {**exp, **merged["experiments"].get(name, {})}
    merged.update({k: v for k, v in default.items() if k != "experiments"})
    follow_order(merged, default)
    names = list(merged["experiments"])
    assert names.index("mine") < names.index("plasticity")
    assert [n for n in names if n != "mine"] == list(default["experiments"])
    validate_config(merged)  # "'mine' is defined after 'plasticity'" before


def test_a_runs_tasks_are_read_back_from_its_key_for_every_run_the_configs_define():
    """Fig 2's radar groups, Fig 5's panels and the plasticity claim read a starting point's tasks
    from its run's key. Each read it its own way; Fig 5's and the claim's took the key's first
    '-' field, which for a run that itself starts from another ("from_<init>-<tasks>-...") is
    the prefix, not the tasks."""
    from fastslow.experiments import expand, run_tasks

    for files in (("config/config.yaml",), ("config/config.yaml", "config/paper.yaml"),
                  ("config/config.yaml", "config/smoke.yaml")):
        for key, spec in expand(load_config(*files)).items():
            assert run_tasks(key) == tuple(dict.fromkeys(spec.schedule)), key
    chained = "plasticity/rl/from_efficiency_fst_math-default-s0-hover_hard-default-s0"
    assert run_tasks(chained) == ("hover_hard",)
    assert run_tasks("continual/fst/hover.codeio.physics-default-s0") == ("hover", "codeio", "physics")


def test_a_bf16_sampler_only_where_bf16_is_native(monkeypatch):
    """The CPU default sampled its evaluations and fast rounds in bf16, about 2x fp32's generate
    on a CPU with AVX512-BF16, but emulated (a matmul 3.8x slower than fp32's) on one without,
    this machine's kind among them. `bfloat16_if_native` is bf16 where it is native, else
    model.dtype; explicit dtypes stay as they are."""
    from fastslow import hardware
    from fastslow.config import resolve_sample_dtype, sample_dtype

    cfg = load_config(ROOT / "config" / "config.yaml")
    assert cfg["evaluation"]["dtype"] == cfg["fast"]["dtype"] == "bfloat16_if_native"
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    for native, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda native=native: native)
        assert sample_dtype(cfg) == expected
        assert resolve_sample_dtype(cfg["fast"]["dtype"], cfg["model"]["dtype"]) == expected
        assert resolve_sample_dtype("bfloat16_if_native", "float16") == ("bfloat16" if native else "float16")
        assert resolve_sample_dtype("bfloat16", "float32") == "bfloat16"
        assert resolve_sample_dtype("model", "float32") == "float32"


def test_activation_checkpointing_auto_is_on_where_the_weights_train_on_a_cpu_in_fp32(monkeypatch):
    """The CPU default's `slow.activation_checkpointing: auto`: fp32 training on a CPU (no native
    bf16, or bf16 turned off) holds activations of twice bf16's bytes, and a hover_hard cycle
    peaked over 6 GiB there; with bf16 (native on the CPU) or on a GPU it stays off. Explicit
    values stay as they are; anything else is refused naming the key."""
    from fastslow import hardware
    from fastslow.slow.config import SlowConfig

    cfg = load_config(ROOT / "config" / "config.yaml")
    assert cfg["slow"]["activation_checkpointing"] == "auto" and cfg["slow"]["bf16"] == "auto"

    def built(**slow):
        return SlowConfig.from_dict({**cfg["slow"], "seed": 0, **slow})

    for cuda, native, bf16, expected in ((False, False, "auto", True), (False, True, "auto", False),
                                         (False, True, False, True), (True, True, "auto", False),
                                         (True, True, False, False)):
        monkeypatch.setattr("torch.cuda.is_available", lambda cuda=cuda: cuda)
        monkeypatch.setattr("torch.cuda.is_bf16_supported", lambda native=native, **_: native, raising=False)
        monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda native=native: native)
        slow = built(bf16=bf16)
        assert slow.activation_checkpointing is expected, (cuda, native, bf16)
        assert built(bf16=bf16, activation_checkpointing=False).activation_checkpointing is False
        assert built(bf16=bf16, activation_checkpointing=True).activation_checkpointing is True
    with pytest.raises(ValueError, match="SlowConfig.activation_checkpointing: expected true, false or 'auto', got 1"):
        built(activation_checkpointing=1)


def test_the_workflow_stops_in_one_line_on_windows_and_needs_python_3_11():
    """Jobs lock files with fcntl and stop process groups: on Windows the workflow stops before
    planning, naming WSL2; elsewhere it plans. pyproject says what the pin set installs on (TRL
    1.16, Snakemake 9 and transformers 5 need Python 3.11; it said 3.10, which pip could not
    resolve)."""
    import tomllib

    from fastslow.hardware import unsupported_platform

    assert unsupported_platform("win32") == ("fastslow runs on Linux or macOS, not on Windows itself: run it in "
                                             "WSL2 (README Quick start)")
    assert unsupported_platform("linux") is None and unsupported_platform("darwin") is None
    assert "unsupported_platform()" in (ROOT / "workflow/rules/common.smk").read_text()
    import importlib.metadata as metadata

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    ours = SpecifierSet(project["project"]["requires-python"])
    floor = min(v for v in ("3.10", "3.11", "3.12", "3.13") if v in ours)
    # every core dependency, as installed here, takes the oldest Python pyproject admits
    refused = {r.name: metadata.metadata(r.name)["Requires-Python"] for r in map(
        Requirement, project["project"]["dependencies"]) if metadata.metadata(r.name)["Requires-Python"]
        and floor not in SpecifierSet(metadata.metadata(r.name)["Requires-Python"])}
    assert not refused, f"requires-python admits {floor}, which these dependencies do not: {refused}"
    assert project["tool"]["ruff"]["target-version"] == "py" + floor.replace(".", "")


def test_the_reserved_chat_template_names_are_the_installed_transformers_arguments():
    """`CHAT_TEMPLATE_RESERVED` is `apply_chat_template`'s named arguments and the template's
    `messages`: a transformers that adds one has it refused here too."""
    import inspect

    from transformers import PreTrainedTokenizerBase

    from fastslow.config import CHAT_TEMPLATE_RESERVED

    named = {name for name, p in inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters.items()
             if name != "self" and p.kind is not p.VAR_KEYWORD}
    assert CHAT_TEMPLATE_RESERVED == named | {"messages"}


def test_every_top_level_entry_of_the_repository_is_in_the_readmes_layout():
    """The README's layout block names each top-level file and directory of the repository, so a
    stray file committed at the root (three a probe run from there wrote were, once) fails here.
    The packaging and front-door files are named by the README's other sections."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0 or not listed.stdout:
        pytest.skip(f"not a git checkout git can read: {listed.stderr.strip()[:200]}")
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in readme.split("```")[1::2] if b.lstrip().startswith("Snakefile"))
    named = {entry.split("/")[0] for line in block.splitlines() if line.strip() and not line.startswith(" ")
             for entry in re.split(r"\s{2,}", line)[0].split(", ")}  # the first column: "ci/slurm/, .ci/run"
    top = {path.split("/")[0] for path in listed.stdout.splitlines()}
    assert top - named - {"README.md", "pyproject.toml", "Makefile", ".gitignore", "LICENSE", "MANIFEST.in"} == set(), sorted(top - named)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation but '-' and '_' dropped,
    spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("doc", ["README.md", "config/README.md", "profiles/slurm/README.md", "bench/measured/README.md"])
def test_every_link_to_a_section_finds_its_heading(doc):
    """A `[text](#anchor)` link in a document names one of its headings (the README's contents line
    links every section; a heading reworded, as the Quick start's was, would leave it dead), and the
    README's contents name every top-level section."""
    text = (ROOT / doc).read_text()
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    headings = [line.lstrip("#").strip() for line in prose.splitlines() if re.match(r"#{1,6} ", line)]
    anchors = {github_anchor(h) for h in headings}
    links = re.findall(r"\]\(#([^)]+)\)", prose)
    assert not sorted(set(links) - anchors), sorted(set(links) - anchors)
    if doc == "README.md":
        sections = {github_anchor(line[3:]) for line in prose.splitlines() if line.startswith("## ")}
        assert sections <= set(links), sorted(sections - set(links))


def test_pyproject_builds_without_setuptools_deprecations():
    """setuptools reads pyproject.toml's metadata without a deprecation warning. A `license` TOML
    table (`{ text = ... }`) warned on every install from setuptools 77 on, with builds to fail
    from 2027-02-18; the license is an SPDX string, and its text the LICENSE file it names."""
    setuptools_config = pytest.importorskip("setuptools.config.pyprojecttoml")
    from setuptools.dist import Distribution
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = setuptools_config.apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert dist.metadata.license_expression == "Apache-2.0"
    assert dist.metadata.license_files == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().split()[:3] == ["Apache", "License", "Version"]


@pytest.mark.slow
def test_the_sdist_is_the_repository_and_its_wheel_validates_configs_anywhere(tmp_path):
    """Packaging as pip does it from a source archive: the sdist built from the tracked files holds
    every one of them (it held the library and the test files alone, without the Snakefile,
    workflow/, config/ or the tests' helpers), and the wheel built from the unpacked sdist carries
    the config schema, so the library validates a config outside any checkout (the schema sat in
    workflow/schemas/ and every wheel install failed with a FileNotFoundError)."""
    import tarfile
    import zipfile

    if shutil.which("git") is None:
        pytest.skip("needs git")
    # the tracked files and the new ones git would add (a change not yet committed is packaged too)
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0 or not listed.stdout:
        pytest.skip(f"not a git checkout git can read: {listed.stderr.strip()[:200]}")
    tracked = {p for p in listed.stdout.splitlines() if (ROOT / p).is_file()}
    checkout = tmp_path / "checkout"
    for path in tracked:
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, checkout / path)

    def build(kind: str, source: Path) -> Path:
        out = tmp_path / kind
        code = f"from setuptools import build_meta; print(build_meta.build_{kind}({str(out)!r}))"
        done = subprocess.run([sys.executable, "-c", code], cwd=source, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        return out / done.stdout.strip().splitlines()[-1]

    sdist = build("sdist", checkout)
    with tarfile.open(sdist) as archive:
        root = archive.getnames()[0].split("/")[0]
        members = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name
                   and archive.getmember(name).isfile()}
        # the data filter (Python 3.11.4+) where there is one; the archive is our own either way
        archive.extractall(tmp_path / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    assert tracked - {".gitignore"} <= members, sorted(tracked - {".gitignore"} - members)[:10]
    assert not {m for m in members if "__pycache__" in m or m.endswith(".pyc")}

    wheel = build("wheel", tmp_path / "unpacked" / root)
    with zipfile.ZipFile(wheel) as archive:
        assert {"fastslow/config.schema.yaml", "fastslow/py.typed"} <= set(archive.namelist())
        archive.extractall(tmp_path / "site")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (f"import fastslow, fastslow.config as c; cfg = c.load_config({str(ROOT / 'config' / 'config.yaml')!r}); "
            "print(fastslow.__file__, c.schema_path(), cfg['fast']['pool_size'])")
    ran = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert ran.returncode == 0, ran.stderr[-2000:]
    module, schema, pool_size = ran.stdout.split()
    assert Path(module).is_relative_to(tmp_path / "site") and Path(schema).is_relative_to(tmp_path / "site")
    assert int(pool_size) == load_config(ROOT / "config" / "config.yaml")["fast"]["pool_size"]
    version = subprocess.run([sys.executable, "-c", "import fastslow; print(fastslow.__version__)"],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert f"fastslow-{version.stdout.strip()}-" in wheel.name  # the one version: pyproject reads it


@pytest.mark.parametrize("experiment, expected", [
    ({"my-exp": {"tasks": ["math"], "methods": ["rl"]}},
     "config error: experiments.my-exp: experiment names use letters, digits and '_' only"),
    ({"e": {"sequence": [], "methods": ["fst"]}},
     "config error: experiments.e.sequence: expected a non-empty list of tasks, got []"),
    ({"e": {"methods": ["rl"]}},
     "config error: experiments.e.tasks: expected a non-empty list of tasks (or a 'sequence'), got None"),
    ({"e": {"tasks": [], "methods": ["rl"]}},
     "config error: experiments.e.tasks: expected a non-empty list of tasks (or a 'sequence'), got []"),
    ({"e": {"tasks": ["math"], "methods": ["fst"], "variants": {"k-4": {"fast": {"pool_size": 4}}}}},
     "config error: experiments.e.variants.k-4: variant names use letters, digits and '_' only"),
])
def test_an_experiment_the_schema_admits_but_no_run_can_come_from_stops_in_one_line(experiment, expected):
    """Names that become directory names, and experiments with no task: the schema lets them
    through (names and list lengths are checked when the runs are made), `expand` refuses them
    naming the key."""
    from fastslow.experiments import expand

    cfg = load_config(ROOT / "config" / "config.yaml")
    cfg["experiments"] = experiment
    with pytest.raises(ConfigError) as err:
        expand(validate_config(cfg))
    assert str(err.value) == expected


# --- planning the runs (fastslow.experiments) ------------------------------------------------------

@pytest.mark.parametrize(("changes", "expected"), [
    ({"method": "FST"}, "RunSpec.method: expected one of rl, fst, gepa, fst_distill, got 'FST'"),
    ({"schedule": ()}, "RunSpec.schedule: expected a tuple of each cycle's training task, e.g. ('math',) * 2, "
                       "got ()"),
    # a string is a sequence too: "math" would have been four cycles, on tasks 'm', 'a', 't' and 'h'
    ({"schedule": "math"}, "RunSpec.schedule: expected a tuple of each cycle's training task, e.g. ('math',) * 2, "
                           "got 'math'"),
])
def test_a_run_spec_of_an_unknown_method_or_without_a_schedule_is_one_line(changes, expected):
    from fastslow.experiments import RunSpec

    with pytest.raises(ValueError) as err:
        RunSpec(**{"experiment": "nb", "method": "fst", "name": "math-s0", "schedule": ("math",), "seed": 0, **changes})
    assert str(err.value) == expected


def _fst_cycle_params(**sections) -> dict:
    from fastslow.experiments import expand

    cfg = validate_config(deep_update(_tiny_experiments({}), sections))
    return expand(cfg)["efficiency/fst/math-default-s0"].cycle_params(cfg, ("model", "slow", "fast"))


def test_an_fst_cycle_reads_model_dtype_only_where_its_round_may_sample_in_it():
    """The RL steps train fp32 master weights: model.dtype reaches an FST cycle through its round's
    sampling alone, which reads it for fast.dtype `model` or `bfloat16_if_native` only. With an
    explicit fast.dtype a new model.dtype retrains nothing."""
    own = _fst_cycle_params(fast={"dtype": "model"})
    assert own["model"]["dtype"] == "float32"
    assert _fst_cycle_params(fast={"dtype": "model"}, model={"dtype": "bfloat16"}) != own
    explicit = _fst_cycle_params(fast={"dtype": "bfloat16"})
    assert "dtype" not in explicit["model"] and explicit["fast"]["dtype"] == "bfloat16"
    assert _fst_cycle_params(fast={"dtype": "bfloat16"}, model={"dtype": "bfloat16"}) == explicit


def test_a_round_reads_its_presets_budget_alone():
    """fast.max_metric_calls holds a budget per preset: a round reads its preset's, so a new budget
    of the other preset retrains no run."""
    light = _fst_cycle_params()["fast"]
    assert light["preset"] == "light" and light["max_metric_calls"] == {"light": 32}
    assert _fst_cycle_params(fast={"max_metric_calls": {"full": 200}}) == _fst_cycle_params()
    assert _fst_cycle_params(fast={"preset": "full"})["fast"]["max_metric_calls"] == {"full": 96}


def test_every_cycles_params_list_each_sections_keys_in_sorted_order():
    """Snakemake compares params by their repr: a section's keys are in one order (`job_params`'s,
    sorted) whichever way the method's cycle picks them (`CYCLE_READS`, `CYCLE_SKIPS`), so
    reordering those tables reruns nothing."""
    from dataclasses import replace

    from fastslow.experiments import METHODS, expand

    cfg = _tiny_experiments({})
    run = expand(cfg)["efficiency/fst/math-default-s0"]
    sections = ("model", "generation", "seed_context", "slow", "fast")
    for method in METHODS:
        params = replace(run, method=method).cycle_params(cfg, sections)
        for name, section in params.items():
            if isinstance(section, dict):
                assert list(section) == sorted(section), (method, name)


def test_a_fast_section_without_a_proposer_is_read_as_the_feedback_editors():
    """The schema's default proposer is the offline feedback editor: a fast section that names none
    (a library caller's) keeps the editor's limits and no reflection model."""
    from fastslow.experiments import cycle_section

    section = {"pool_size": 2, "max_demos": 3, "max_rules": 4, "reflection": {"kind": "openai", "model": "m"}}
    assert cycle_section("fst", "fast", section) == {"pool_size": 2, "max_demos": 3, "max_rules": 4}
    assert cycle_section("fst", "fast", {**section, "proposer": "reflective"}) == {
        "pool_size": 2, "proposer": "reflective", "reflection": {"kind": "openai", "model": "m"}}


def _runs_of(experiments: dict) -> dict:
    """The runs of config.yaml with only `experiments` (validated), keyed as `expand` keys them."""
    from fastslow.experiments import expand

    cfg = load_config(ROOT / "config" / "config.yaml")
    cfg["experiments"] = experiments
    return expand(validate_config(cfg))


def test_a_run_evaluated_at_some_of_an_earlier_identical_runs_points_is_shared_and_at_more_is_not():
    """A run reads an earlier run's files when they hold every evaluation it plots: fewer points
    (no initial one, every other cycle) are shared; a point the earlier run skips is not."""
    from fastslow.layout import eval_points

    exp = {"tasks": ["math"], "methods": ["rl"], "cycles": 2}
    runs = _runs_of({"first": exp, "no_init": {**exp, "eval_init": False}, "sparse": {**exp, "eval_every": 2}})
    assert eval_points(runs["sparse/rl/math-default-s0"]) == ["init", "cycle1"]
    assert runs["no_init/rl/math-default-s0"].shared == "first/rl/math-default-s0"
    assert runs["sparse/rl/math-default-s0"].shared == "first/rl/math-default-s0"
    runs = _runs_of({"first": {**exp, "eval_init": False}, "again": exp})
    assert eval_points(runs["first/rl/math-default-s0"]) == ["cycle0", "cycle1"]
    assert runs["again/rl/math-default-s0"].shared is None


def test_cycles_left_out_are_four_per_run_and_two_per_stage_of_a_sequence():
    """The counts the schema's descriptions state (`CYCLES`, `CYCLES_PER_STAGE`)."""
    runs = _runs_of({"per_task": {"tasks": ["math"], "methods": ["rl"]},
                     "sequence": {"sequence": ["math", "hover"], "methods": ["rl"]}})
    assert runs["per_task/rl/math-default-s0"].schedule == ("math",) * 4
    assert runs["sequence/rl/math.hover-default-s0"].schedule == ("math", "math", "hover", "hover")


def test_a_continual_run_is_evaluated_on_every_task_of_its_sequence_and_a_tasks_run_on_its_own():
    """Forgetting is read from the earlier stages' tasks (Fig 6): a continual run evaluates them
    all, in sequence order, at every point."""
    runs = _runs_of({"per_task": {"tasks": ["math", "hover"], "methods": ["rl"], "cycles": 1},
                     "sequence": {"sequence": ["hover", "math", "physics"], "methods": ["rl"], "cycles_per_stage": 1}})
    assert runs["sequence/rl/hover.math.physics-default-s0"].eval_tasks == ("hover", "math", "physics")
    assert runs["per_task/rl/hover-default-s0"].eval_tasks == ("hover",)


def test_an_experiment_with_eval_init_false_has_no_initial_point():
    from fastslow.layout import eval_points

    exp = {"tasks": ["math"], "methods": ["fst"], "cycles": 2}
    runs = _runs_of({"plotted": exp, "ends": {**exp, "eval_init": False}})
    assert eval_points(runs["plotted/fst/math-default-s0"]) == ["init", "cycle0", "cycle1"]
    assert eval_points(runs["ends/fst/math-default-s0"]) == ["cycle0", "cycle1"]


def test_an_init_picks_the_source_runs_of_its_methods_by_their_final_task():
    """`init.tasks` names the task a source run ends on (a continual run's last stage), and
    `init.methods` the methods it was trained by."""
    seq = {"sequence": ["math", "hover"], "methods": ["rl", "fst"], "cycles_per_stage": 1}
    post = {"tasks": ["physics"], "methods": ["rl"], "cycles": 1}
    runs = _runs_of({"seq": seq, "post": {**post, "init": {"experiment": "seq", "tasks": ["hover"],
                                                           "methods": ["fst"], "include_base": False}}})
    assert [r.init for r in runs.values() if r.experiment == "post"] == ["seq/fst/math.hover-default-s0"]
    with pytest.raises(ConfigError) as err:
        _runs_of({"seq": seq, "post": {**post, "init": {"experiment": "seq", "tasks": ["math"], "methods": ["rl", "fst"]}}})
    assert str(err.value).startswith("config error: experiments.post.init: 'seq' has no default-variant run of "
                                     "methods ['rl', 'fst'] ending on tasks ['math'] (it has methods ['rl', 'fst'], "
                                     "final tasks ['hover'])")


def test_a_run_started_from_a_shared_run_starts_from_the_run_it_shares():
    """A shared run has no weights of its own: a run starting from it starts from the run whose
    files it reads, and is the same run as one starting from that run directly."""
    exp = {"tasks": ["math"], "methods": ["rl"], "cycles": 1}
    post = {"tasks": ["hover"], "methods": ["rl"], "cycles": 1}
    runs = _runs_of({"first": exp, "again": exp, "from_first": {**post, "init": {"experiment": "first"}},
                     "from_again": {**post, "init": {"experiment": "again"}}})
    assert runs["again/rl/math-default-s0"].shared == "first/rl/math-default-s0"
    key = "from_again/rl/from_first_rl_math-default-s0-hover-default-s0"
    assert runs[key].init == "first/rl/math-default-s0"
    assert runs[key].shared == "from_first/rl/from_first_rl_math-default-s0-hover-default-s0"


def test_a_variants_setting_wins_over_its_experiments_overrides():
    """The variant is applied over the experiment's overrides (which apply to every variant)."""
    runs = _runs_of({"abl": {"tasks": ["math"], "methods": ["fst"], "cycles": 1,
                             "overrides": {"slow": {"lr": 2e-5, "max_grad_norm": 0.5}},
                             "variants": {"same": {}, "faster": {"slow": {"lr": 3e-5}}}}})
    cfg = load_config(ROOT / "config" / "config.yaml")
    same, faster = (runs[f"abl/fst/math-{v}-s0"].settings(cfg)["slow"] for v in ("same", "faster"))
    assert (same["lr"], same["max_grad_norm"]) == (2e-5, 0.5)
    assert (faster["lr"], faster["max_grad_norm"]) == (3e-5, 0.5)


def test_a_short_warmup_is_warned_about_once_for_the_run_that_trains(caplog):
    """A shared run trains nothing of its own: the warning names the experiment whose run trains."""
    exp = {"tasks": ["math"], "methods": ["rl"], "cycles": 1, "overrides": {"slow": {"warmup_steps": 7}}}
    with caplog.at_level("WARNING", logger="fastslow.experiments"):
        cfg = load_config(ROOT / "config" / "config.yaml")
        cfg["experiments"] = {"first": exp, "again": exp}
        validate_config(cfg)
    assert [r.getMessage().split(":")[1] for r in caplog.records if "warmup_steps" in r.getMessage()] == \
        [" experiments.first"]


def test_each_method_is_run_by_one_cycle_rule():
    """The cycle rules' `method` wildcard patterns (workflow/rules/train.smk) split the methods."""
    from fastslow.experiments import METHODS, methods_of_rule

    assert methods_of_rule("cycle") == "rl|fst"
    assert methods_of_rule("cycle_frozen") == "gepa"
    assert methods_of_rule("cycle_distill") == "fst_distill"
    assert sorted(m for rule in ("cycle", "cycle_frozen", "cycle_distill")
                  for m in methods_of_rule(rule).split("|")) == sorted(METHODS)


def test_loading_a_config_leaves_the_overrides_it_was_given_as_they_were():
    """deep_update copies what it merges in: sharing it, load_config(overrides=...) filled the
    caller's own sections with their defaults, and an edit of the config reached the overrides."""
    overrides = {"slow": {"num_generations": 8}, "data": {"tasks": ["math"]}}
    cfg = load_config(overrides=overrides)
    assert overrides == {"slow": {"num_generations": 8}, "data": {"tasks": ["math"]}}
    cfg["data"]["tasks"].append("physics")
    assert overrides["data"]["tasks"] == ["math"]
    base = {"slow": {"lr": 1e-5}}
    new = {"slow": {"num_generations": 8}, "data": {"tasks": ["math"]}}
    assert deep_update(base, new) == {"slow": {"lr": 1e-5, "num_generations": 8}, "data": {"tasks": ["math"]}}
    assert base["data"] is not new["data"] and base["data"]["tasks"] is not new["data"]["tasks"]


def test_defaults_fill_each_experiment_and_each_init():
    """The defaults of a map's entries (experiments.<name>, its init) fill in as a section's do,
    each entry with its own copy (one experiment's seeds list is not another's)."""
    experiments = load_config(ROOT / "config" / "config.yaml")["experiments"]
    radar, plasticity = experiments["radar"], experiments["plasticity"]
    assert radar["seeds"] == plasticity["seeds"] == [0]
    assert radar["seeds"] is not plasticity["seeds"]
    assert (experiments["efficiency"]["eval_init"], experiments["efficiency"]["eval_every"]) == (True, 1)
    assert radar["eval_init"] is False  # as written
    assert plasticity["init"]["pair_seeds"] is True and plasticity["init"]["include_base"] is True


def test_of_two_bad_values_the_error_names_the_outermost():
    """One error per run, the same whichever order the validator finds them: the one nearest
    the top level (a misspelt section before a bad value inside another)."""
    cfg = deep_update(_default(), {"modle": {}, "slow": {"num_generations": -3}})
    with pytest.raises(ConfigError, match=r"^config error: <top level>: unknown key 'modle'"):
        validate_config(cfg)
    cfg = deep_update(_default(), {"slow": {"num_generations": -3}, "fast": {"pool_size": 0}})
    with pytest.raises(ConfigError, match=r"^config error: fast\.pool_size: "):  # one depth: by key
        validate_config(cfg)


def test_text_at_a_key_that_also_takes_text_stays_text():
    """A filter value "1e5" (a key taking text and numbers) is the text written, not the number
    YAML 1.2 would read: only a key that takes a number and no text reads it as one."""
    cfg = load_config(ROOT / "config" / "config.yaml", overrides={
        "data": {"hf_datasets": {"mine": {"path": "org/set", "filters": {"code": ["1e5", 3, 2.5, True]}}}}})
    assert cfg["data"]["hf_datasets"]["mine"]["filters"]["code"] == ["1e5", 3, 2.5, True]


def test_the_lowest_sampling_temperature_is_allowed():
    """MIN_TEMPERATURE itself samples (only values between 0 and it are refused), in generation and
    in an hf reflection model."""
    from fastslow.config import MIN_TEMPERATURE

    cfg = validate_config(deep_update(_default(), {
        "generation": {"temperature": MIN_TEMPERATURE}, "slow": {"temperature": MIN_TEMPERATURE}, "fast": {
        "proposer": "reflective", "reflection": {"kind": "hf", "path": "gpt2", "temperature": MIN_TEMPERATURE}}}))
    assert cfg["generation"]["temperature"] == cfg["fast"]["reflection"]["temperature"] == MIN_TEMPERATURE


def test_text_given_with_config_stays_text_where_the_key_takes_only_text(tmp_path, monkeypatch):
    """A task named `2024` given with `--config data='{tasks: [2024, math]}'` is that name, not the
    number YAML reads; and a value the command line did not give as it stands (a file's `"8"`) is
    not read back as YAML."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "config" / "parity.jsonl", tmp_path / "y.jsonl")
    given = {"data": {"tasks": ["2024", "math"]}}
    cfg = deep_update(_default(), {"data": {"files": {"2024": {"path": "y.jsonl"}}, "tasks": ["2024", "math"]}})
    assert validate_config(cfg, command_line=given)["data"]["tasks"] == ["2024", "math"]
    cfg = deep_update(_default(), {"slow": {"num_generations": "8"}})
    with pytest.raises(ConfigError, match=r"slow\.num_generations: expected an integer, got str '8'"):
        validate_config(cfg, command_line={"slow": {"num_generations": "4"}})


def test_a_task_file_may_name_its_type_in_capitals(tmp_path):
    """`MINE.JSONL`: the loader reads a file's suffix in any case, and so does the config check."""
    from fastslow.config import make_task

    rows = tmp_path / "MINE.JSONL"
    shutil.copy(ROOT / "config" / "parity.jsonl", rows)
    cfg = load_config(ROOT / "config" / "config.yaml", overrides={"data": {"files": {"mine": {"path": str(rows)}}}})
    assert len(make_task(cfg, "mine").problems("val", 2, seed=0)) == 2


def test_a_micro_batch_is_a_positive_divisor_of_a_steps_rollouts():
    """micro_batch_fits, SlowConfig's rule too: None, or a divisor >= 1 of P*G (-2 divides 8)."""
    from fastslow.config import micro_batch_fits

    assert micro_batch_fits(8, None) and micro_batch_fits(8, 2) and micro_batch_fits(8, 8)
    assert not micro_batch_fits(8, 3) and not micro_batch_fits(8, -2) and not micro_batch_fits(8, 16)


def test_one_reused_step_may_have_more_problems_than_the_validation_set():
    """fast.reuse_steps 1 (or left out) with P > fast.val_problems: the step's problems beyond the
    validation set sample their own rollouts, as before the key; only n > 1 steps must fit."""
    reuse = {"fast": {"reuse_in_slow": True, "val_problems": 1}, "generation": {"max_new_tokens": 64},
             "experiments": {"reuse": None}}  # its variant reuses 3 steps
    for steps in ({}, {"reuse_steps": 1}):
        cfg = load_config(ROOT / "config" / "config.yaml", overrides=deep_update(copy.deepcopy(reuse), {"fast": steps}))
        assert cfg["slow"]["problems_per_step"] > cfg["fast"]["val_problems"] == 1


def test_an_experiments_variants_follow_the_default_configs_order():
    """Snakemake merges an overlay's variants before the default file's: follow_order puts them
    back in config/config.yaml's order, an overlay's own variant after them."""
    from fastslow.config import follow_order

    default = _default()
    merged = copy.deepcopy(default)
    variants = merged["experiments"]["ablations"]["variants"]
    merged["experiments"]["ablations"]["variants"] = {"k8": {"fast": {"pool_size": 4}},
                                                     **dict(reversed(list(variants.items())))}
    follow_order(merged, default)
    assert list(merged["experiments"]["ablations"]["variants"]) == [
        *default["experiments"]["ablations"]["variants"], "k8"]


def test_a_hub_ids_revision_is_no_part_of_the_model_directory():
    """`org/name@rev` and `org/name` are one model directory (results/models/name)."""
    from fastslow.config import model_name

    assert model_name({"model": {"base": "HuggingFaceTB/SmolLM2-135M-Instruct@main"}}) == "SmolLM2-135M-Instruct"
    assert model_name({"model": {"base": "HuggingFaceTB/SmolLM2-135M-Instruct/"}}) == "SmolLM2-135M-Instruct"


def test_a_local_model_above_the_working_directory_is_spelt_absolute(tmp_path, monkeypatch):
    """canonical_model_base: a directory inside the working directory relative to it, any other
    (its parent `..` too) by its absolute path, however it was spelt."""
    from fastslow.config import canonical_model_base

    work = tmp_path / "work"
    (work / "models" / "m").mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("PWD", str(work))
    assert canonical_model_base("..") == canonical_model_base(str(tmp_path) + "/") == str(tmp_path)
    assert canonical_model_base("./models/m/") == canonical_model_base(str(work / "models" / "m")) == "models/m"



def test_a_config_file_that_is_not_a_mapping_is_one_line_naming_the_file(tmp_path):
    """A config file whose top level is a list or text had stopped load_config with a traceback
    (AttributeError: 'list' object has no attribute 'items'); an empty file is no settings."""
    for text, kind in (("- slow\n- fast\n", "list"), ("slow\n", "str")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_config(ROOT / "config" / "config.yaml", bad)
        assert str(info.value) == f"config error: {bad}: expected a mapping at the top level, got {kind}"
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    assert load_config(ROOT / "config" / "config.yaml", empty) == load_config(ROOT / "config" / "config.yaml")


def test_a_filter_given_with_config_keeps_the_rows_a_config_file_keeps():
    """`--config data='{..., filters: {num_hops: [3]}}'`: Snakemake hands the 3 over as text, and
    at a key that takes text and numbers it had stayed '3', so every row (num_hops is the int 3)
    was dropped. It is read as a config file reads it; `1e5` stays text there too (YAML 1.1)."""
    given = {"data": {"source": "hf", "hf_datasets": {"hover": {
        "preset": "hover_real", "filters": {"num_hops": ["3", "4"], "code": ["1e5", "true", "x"]}}}}}
    cfg = validate_config(deep_update(_default(), copy.deepcopy(given)), command_line=given)
    assert cfg["data"]["hf_datasets"]["hover"]["filters"] == {"num_hops": [3, 4], "code": ["1e5", True, "x"]}
    as_file = load_config(ROOT / "config" / "config.yaml", overrides=yaml.safe_load(
        "data: {source: hf, hf_datasets: {hover: {preset: hover_real, filters: {num_hops: [3, 4], code: [1e5, true, x]}}}}"))
    assert as_file["data"]["hf_datasets"]["hover"] == cfg["data"]["hf_datasets"]["hover"]
