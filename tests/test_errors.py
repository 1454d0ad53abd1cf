"""Bad inputs give one-line errors that name the bad path, key or value."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from fastslow.fast.pool import Pool
from fastslow.model.convert import load_model, load_tokenizer
from fastslow.slow import train
from fastslow.slow.config import SlowConfig
from fastslow.tasks.base import Problem


def one_line(err: BaseException | str) -> str:
    text = str(err.value if isinstance(err, pytest.ExceptionInfo) else err)
    assert text and "\n" not in text.strip(), f"not one line: {text!r}"
    return text


# --- load_model / load_tokenizer ------------------------------------------------------------

@pytest.mark.parametrize("load", [load_model, load_tokenizer])
def test_load_missing_directory_names_it(load, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    for arg in (missing, str(missing)):
        with pytest.raises(FileNotFoundError) as err:
            load(arg)
        msg = one_line(err)
        assert str(missing) in msg and "does not exist" in msg


def test_load_relative_missing_directory_is_not_a_hub_id(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for rel in ("./model", "runs/x/model"):
        with pytest.raises(FileNotFoundError) as err:
            load_model(rel)
        assert rel in one_line(err)


def test_load_model_empty_directory_says_no_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as err:
        load_model(tmp_path)
    msg = one_line(err)
    assert str(tmp_path) in msg and "no config.json" in msg


def test_load_model_file_instead_of_directory(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    f.write_text("x")
    with pytest.raises(NotADirectoryError) as err:
        load_model(f)
    assert str(f) in one_line(err)


def test_load_tokenizer_empty_directory_says_no_tokenizer_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError) as err:
        load_tokenizer(tmp_path)
    msg = one_line(err)
    assert str(tmp_path) in msg and "tokenizer.json" in msg


def test_load_hub_ids_still_go_to_from_pretrained(monkeypatch) -> None:
    import transformers

    seen: list[str] = []

    class Fake:
        def to(self, device):
            return self

        def eval(self):
            return self

    def fake(name, **kwargs):
        seen.append(name)
        return Fake()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake)
    monkeypatch.setattr("fastslow.model.convert._set_padding", lambda tok: tok)
    for hub_id in ("Qwen/Qwen3-8B", "gpt2"):
        load_model(hub_id)
        load_tokenizer(hub_id)
    assert seen == ["Qwen/Qwen3-8B", "Qwen/Qwen3-8B", "gpt2", "gpt2"]


def test_load_tokenizer_of_a_prepared_directory_still_works(tiny_model_dir: Path) -> None:
    assert load_tokenizer(tiny_model_dir).padding_side == "left"


# --- Pool.from_json / to_json ---------------------------------------------------------------

def _pool_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pool.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize("content, expected", [
    ('{"k": 2, "entr', "invalid JSON"),
    ('{"entries": [{"text": "a"}]}', "'k'"),
    ('{"k": "x", "entries": [{"text": "a"}]}', "'k'"),
    ('{"k": 1, "entries": [{"text": "a", "born_round": "r1"}]}', "born_round"),
    ('{"k": 1, "entries": [{"text": "a", "born_round": true}]}', "born_round"),
    ('{"k": 1, "entries": [{"text": "a", "born_round": 1.5}]}', "born_round"),
    ('{"k": 1, "entries": [{"text": "a", "parent": 3}]}', "'parent'"),
    ('{"k": 0, "entries": [{"text": "a"}]}', "'k'"),
    ('{"k": 1, "entries": [{"text": "a"}], "meta": [1]}', "'meta'"),
    ('{"k": 1, "entries": [{"text": "a", "val_scores": {"p1": "high"}}]}', "val_scores"),
    ('{"k": 1, "entries": [{"txt": "a"}]}', "'text'"),
    ('{"k": 1, "entries": "abc"}', "entries"),
    ('{"k": 1, "entries": []}', "no entries"),
    ('[1, 2]', "JSON object"),
])
def test_pool_from_json_bad_file_names_path_and_key(tmp_path: Path, content: str, expected: str) -> None:
    path = _pool_file(tmp_path, content)
    with pytest.raises(ValueError) as err:
        Pool.from_json(path)
    msg = one_line(err)
    assert str(path) in msg and expected in msg


def test_pool_to_json_layout_mode_and_no_temp_on_failure(tmp_path: Path, monkeypatch) -> None:
    pool = Pool.seed(["a", "b"], k=2)
    path = pool.to_json(tmp_path / "pool.json")
    assert path.read_text() == json.dumps(pool.to_dict(), indent=2, sort_keys=False) + "\n"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert Pool.from_json(path).texts == ["a", "b"]

    pool.meta["bad"] = object()  # not JSON-serialisable: the write fails half-way
    with pytest.raises(TypeError):
        pool.to_json(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pool.json"]
    assert Pool.from_json(path).texts == ["a", "b"]


# --- python -m fastslow.slow.train --spec ---------------------------------------------------

@pytest.mark.parametrize("content, expected", [
    (None, "cannot read"),
    ("{bad", "invalid JSON"),
    ("[1]", "JSON object"),
    ('{"version": 99}', "version"),
    ('{"version": 1, "method": "rl", "init_model": "m"}',
     "job spec lacks prev_dir, contexts, task, train_file, slow, out_dir, run_id, cycle, result"),
    (json.dumps({"version": 1, "method": "grpo", "init_model": "m", "prev_dir": None, "contexts": [], "task": {},
                 "train_file": "t", "slow": {}, "out_dir": "o", "run_id": "r", "cycle": 0, "result": "TMP/r.json"}),
     "unknown method 'grpo': expected one of rl, fst, fst_distill"),
])
def test_train_bad_spec_is_one_line_exit_2(tmp_path: Path, capsys, content: str | None, expected: str) -> None:
    spec = tmp_path / "job.json"
    if content is not None:
        spec.write_text(content.replace("TMP", str(tmp_path)))  # were it run, its error record lands there
    assert train.main(["--spec", str(spec)]) == 2
    err = capsys.readouterr().err.strip()
    one_line(err)
    assert str(spec) in err and expected in err


# --- Problem metadata -----------------------------------------------------------------------

def test_problem_bad_metadata_names_file_and_problem(tmp_path: Path) -> None:
    row = {"id": "p-17", "task": "math", "prompt": "x", "answer": "1", "metadata": "{oops"}
    source = tmp_path / "train.parquet"
    with pytest.raises(ValueError) as err:
        Problem.from_row(row, source=source)
    msg = one_line(err)
    assert str(source) in msg and "p-17" in msg and "metadata" in msg
    with pytest.raises(ValueError) as err:
        Problem.from_row({**row, "metadata": "[1, 2]"}, source=source)
    assert "p-17" in one_line(err) and "JSON object" in str(err.value)
    assert Problem.from_row({**row, "metadata": '{"a": 1}'}).metadata == {"a": 1}
    # ... and a split file read by load_problems names itself
    import polars as pl

    from fastslow.tasks.data import load_problems

    pl.DataFrame([row]).write_parquet(source)
    with pytest.raises(ValueError) as err:
        load_problems(source)
    assert one_line(err).startswith(f"{source}: problem 'p-17'")


# --- SlowConfig float fields ----------------------------------------------------------------

FLOAT_FIELDS = ["lr", "beta", "epsilon_high", "temperature", "top_p", "weight_decay", "adam_beta1",
                "adam_beta2", "vllm_gpu_memory_utilization", "max_grad_norm"]


@pytest.mark.parametrize("field, value", [(f, v) for f in FLOAT_FIELDS for v in ("1e-6", True, None, [0.5])
                                          if not (f == "max_grad_norm" and v is None)])  # None: no clip
def test_slow_config_float_fields_are_type_checked(field: str, value) -> None:
    with pytest.raises(ValueError) as err:
        SlowConfig(**{field: value})
    msg = one_line(err)
    assert msg.startswith(f"SlowConfig.{field}: expected") and repr(value) in msg


def test_slow_config_micro_batch_size_is_type_checked() -> None:
    with pytest.raises(ValueError, match=r"SlowConfig\.micro_batch_size: expected .* got '4'"):
        SlowConfig(micro_batch_size="4")


def test_slow_config_accepts_ints_for_float_fields() -> None:
    cfg = SlowConfig(lr=1, temperature=1, max_grad_norm=1, weight_decay=0)
    assert cfg.lr == 1 and cfg.max_grad_norm == 1


def test_a_missing_model_path_under_an_existing_directory_is_no_hub_id(tmp_path: Path, monkeypatch) -> None:
    """'models/my-llama' is shaped like a hub id ('org/name'). With models/ here it is a path
    with a typo: the config check said nothing and the base_model job tried the Hub. Now it is a
    missing local directory, in one line; with no such directory it is still a hub id."""
    from fastslow.config import ConfigError, load_config
    from fastslow.model.convert import base_model_error, prepare_base_model

    monkeypatch.chdir(tmp_path)
    assert base_model_error("models/my-llama") is None  # no models/ here: a hub id
    (tmp_path / "models").mkdir()
    problem = base_model_error("models/my-llama")
    assert problem == (f"'models/my-llama': no model directory at {tmp_path / 'models/my-llama'} "
                       "(a local path: a hub id's owner is no local directory)")
    with pytest.raises(ValueError, match="no model directory at"):
        prepare_base_model("models/my-llama", tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="model directory models/my-llama does not exist"):
        load_model("models/my-llama")
    root = Path(__file__).resolve().parents[1]
    with pytest.raises(ConfigError) as err:
        load_config(root / "config/config.yaml", overrides={"model": {"base": "models/my-llama"}})
    assert str(err.value) == f"config error: model.base: {problem}"


def test_one_local_model_directory_is_one_model_base_however_it_is_spelt(tiny_model_dir: Path, tmp_path: Path,
                                                                          monkeypatch) -> None:
    """Every job's params hold the model section: `./models/m/` after `models/m` (or its absolute
    path) planned the whole workflow again, base model, evaluations and cycles."""
    import shutil

    from fastslow.config import load_config

    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "m")
    shutil.copytree(tiny_model_dir, tmp_path.parent / f"{tmp_path.name}-outside")

    def base(spelt: str) -> str:
        return load_config(root / "config/config.yaml", overrides={"model": {"base": spelt}})["model"]["base"]

    for spelt in ("models/m", "./models/m/", str(tmp_path / "models" / "m"), "models/../models/m"):
        assert base(spelt) == "models/m", spelt
    outside = str(tmp_path.parent / f"{tmp_path.name}-outside")
    assert base(f"../{tmp_path.name}-outside/") == outside  # outside the working directory: absolute
    assert base("tiny-random") == "tiny-random" and base("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    # the working directory reached through a symlink, as `pwd` prints it ($PWD): still inside
    link = tmp_path.parent / f"{tmp_path.name}-link"
    link.symlink_to(tmp_path)
    monkeypatch.setenv("PWD", str(link))
    assert base(str(link / "models" / "m")) == "models/m"


def test_a_model_directory_the_workflow_cannot_prompt_stops_its_base_model_job_in_one_line(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """A tokenizer_config.json without the vocabulary it needs, a chat template that refuses a
    system turn: each passed the base_model job and failed the first evaluation with a
    traceback (naming the prepared copy under results/, or "install sentencepiece")."""
    import shutil

    from fastslow.model.convert import prepare_base_model

    def variant(name: str) -> Path:
        path = tmp_path / name
        shutil.copytree(tiny_model_dir, path)
        return path

    no_vocab = variant("no-vocab")
    (no_vocab / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=rf"^{no_vocab}: its tokenizer does not load \("):
        prepare_base_model(str(no_vocab), tmp_path / "out1")
    no_system = variant("no-system")
    template = ("{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
                "{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    (no_system / "chat_template.jinja").write_text(template)
    with pytest.raises(ValueError, match=r"its chat template does not take a system turn then a user turn "
                                         r"\(TemplateError: System role not supported\)"):
        prepare_base_model(str(no_system), tmp_path / "out2")
    unknown = variant("unknown-type")  # a model type newer than the installed transformers
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "model_type": "llama9000"}))
    with pytest.raises(ValueError) as info:
        prepare_base_model(str(unknown), tmp_path / "out4")
    assert re.match(rf"^{unknown}: transformers \S+ cannot read its config\.json \(\w+Error: .*llama9000.*\); "
                    r"a newer model type needs a newer transformers$", str(info.value)), str(info.value)
    assert not any((tmp_path / f"out{i}").exists() for i in (1, 2, 4))
    assert prepare_base_model(str(variant("fine")), tmp_path / "out3").is_dir()


@pytest.mark.parametrize("method", ["fst", "fst_distill"])
def test_a_gpu_setting_on_a_cpu_machine_stops_the_cycle_before_the_fast_round(
        method: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """slow.use_vllm: true on a machine without CUDA (paper.yaml with a CPU overlay): the cycle job
    ran its whole fast round and only then failed, in the slow loop's device check. The cycle now
    runs that check right after reading the slow settings: no generator built, no round run. An
    fst_distill cycle samples with transformers' generate whatever use_vllm says (its params
    leave the key out): it goes on to its round."""
    import torch

    import fastslow.fast
    import fastslow.model.generation
    from fastslow.config import load_config
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.tasks.data import write_problems

    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")

    def fast_round(*args, **kwargs):
        raise AssertionError("the fast round started")

    monkeypatch.setattr(fastslow.fast, "run_round", fast_round)
    monkeypatch.setattr(fastslow.model.generation, "make_generator", fast_round)
    config = load_config("config/config.yaml", "config/smoke.yaml", overrides={"slow": {"use_vllm": True}})
    train = write_problems([Problem(f"p{i}", "math", f"What is {i} + 1?", str(i + 1)) for i in range(8)],
                           tmp_path / "train.parquet")
    spec = RunSpec(experiment="e", method=method, name="r", schedule=("math",), seed=0)
    if method == "fst_distill":
        with pytest.raises(AssertionError, match="^the fast round started$"):
            run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "c0")
        return
    with pytest.raises(RuntimeError) as err:
        run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "c0")
    assert one_line(err) == ("slow loop: use_vllm needs a CUDA GPU, and none is visible here; set "
                             "slow.use_vllm=false to run on CPU")
    assert not (tmp_path / "c0").exists() and not (tmp_path / "c0.fast").exists()


def _cycle_that_must_not_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """(spec, config, train file) of an FST cycle whose fast round and generator raise if built."""
    import fastslow.fast
    import fastslow.model.generation
    from fastslow.config import load_config
    from fastslow.experiments import RunSpec
    from fastslow.tasks.data import write_problems

    def fast_round(*args, **kwargs):
        raise AssertionError("the fast round started")

    monkeypatch.setattr(fastslow.fast, "run_round", fast_round)
    monkeypatch.setattr(fastslow.model.generation, "make_generator", fast_round)
    config = load_config("config/config.yaml", "config/smoke.yaml")
    train = write_problems([Problem(f"p{i}", "math", f"What is {i} + 1?", str(i + 1)) for i in range(8)],
                           tmp_path / "train.parquet")
    return RunSpec(experiment="e", method="fst", name="r", schedule=("math",), seed=0), config, train


def test_a_disk_too_full_for_the_cycles_weights_stops_it_before_the_fast_round(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk was found when the cycle saved its weights, after the fast round and every RL
    step, as torch's 'basic_ios::clear: iostream error'. The cycle checks the space its weights
    need first, in one line: at cycle 0, float32 weights and AdamW's two moments, 12 bytes a
    parameter (it had asked for the initial model's size, a third of that in float32 and a sixth
    in bf16)."""
    import shutil

    import fastslow.io
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.fast import Pool
    from fastslow.model.convert import load_model

    spec, config, train = _cycle_that_must_not_start(monkeypatch, tmp_path)
    needed = 12 * load_model(tiny_model_dir).num_parameters()
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(fastslow.io.shutil, "disk_usage", lambda p: usage._replace(free=needed - 1))
    with pytest.raises(OSError) as err:
        run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "c0")
    gib = 1024 ** 3
    assert one_line(err) == (f"not enough disk space for cycle 0 of e/fst/r: {(needed - 1) / gib:.2f} GiB free at "
                             f"{tmp_path}, it needs about {needed / gib:.2f} GiB; free some space or move results/ "
                             "to a larger file system")
    assert not (tmp_path / "c0").exists() and not (tmp_path / "c0.fast").exists()
    # a later cycle asks for what the previous one saved: its weights and its optimiser state
    prev = tmp_path / "c0"
    (prev / "model").mkdir(parents=True)
    (prev / "model" / "model.safetensors").write_bytes(b"0" * 3000)
    (prev / "trainer_state").mkdir()
    (prev / "trainer_state" / "optimizer.pt").write_bytes(b"0" * 6000)
    Pool.seed([config["seed_context"]], 2).to_json(prev / "pool.json")  # not among what it saves
    monkeypatch.setattr(fastslow.io.shutil, "disk_usage", lambda p: usage._replace(free=8999))
    spec = RunSpec(experiment="e", method="fst", name="r", schedule=("math", "math"), seed=0)
    with pytest.raises(OSError) as err:
        run_cycle(spec, config, 1, tiny_model_dir, prev, train, tmp_path / "c1")
    assert one_line(err).startswith(f"not enough disk space for cycle 1 of e/fst/r: {8999 / gib:.2f} GiB free at "
                                    f"{tmp_path}, it needs about {9000 / gib:.2f} GiB")
    monkeypatch.setattr(fastslow.io.shutil, "disk_usage", lambda p: usage._replace(free=9000))
    with pytest.raises(AssertionError, match="^the fast round started$"):  # enough: on to the round
        run_cycle(spec, config, 1, tiny_model_dir, prev, train, tmp_path / "c1")
    # A save killed midway left its weights in a hidden temporary beside the cycle: they are
    # removed before the space is measured (they had held it until the save, after the round).
    stale = tmp_path / ".c1.k3x9_q2a"
    (stale / "model").mkdir(parents=True)
    (stale / "model" / "model.safetensors").write_bytes(b"0" * 3000)
    monkeypatch.setattr(fastslow.io.shutil, "disk_usage",
                        lambda p: usage._replace(free=9000 - 3000 * stale.exists()))
    with pytest.raises(AssertionError, match="^the fast round started$"):
        run_cycle(spec, config, 1, tiny_model_dir, prev, train, tmp_path / "c1")
    assert not stale.exists()



def test_the_space_a_first_cycle_needs_counts_every_shard_and_falls_back_to_the_models_size(tmp_path: Path) -> None:
    """`first_cycle_bytes`: 12 bytes a parameter over every safetensors shard of a sharded
    checkpoint (an 8B model comes in several), whatever their dtype; a model without safetensors
    (pytorch_model.bin) asks for its directory's size, not for nothing."""
    import torch
    from safetensors.torch import save_file

    from fastslow.cycle import first_cycle_bytes

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    save_file({"a": torch.zeros(3, 4, dtype=torch.bfloat16), "b": torch.zeros(2)},
              str(sharded / "model-00001-of-00002.safetensors"))
    save_file({"c": torch.zeros(5, dtype=torch.float16)}, str(sharded / "model-00002-of-00002.safetensors"))
    assert first_cycle_bytes(sharded) == 12 * (12 + 2 + 5)
    # a consolidated copy beside the shards (Mistral ships one): the index names what is loaded
    save_file({"a": torch.zeros(3, 4), "b": torch.zeros(2), "c": torch.zeros(5)},
              str(sharded / "consolidated.safetensors"))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors"}}))
    assert first_cycle_bytes(sharded) == 12 * (12 + 2 + 5)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "pytorch_model.bin").write_bytes(b"0" * 1000)
    (legacy / "config.json").write_text("{}")
    assert first_cycle_bytes(legacy) == 1002


def test_a_cycle_outside_its_schedule_or_without_its_previous_cycle_stops_in_one_line(tmp_path: Path) -> None:
    """A negative cycle (Python would index the schedule from its end) and a later cycle given no
    previous cycle's directory (it would start from the initial weights and the seed pool) are
    refused before anything is read or written."""
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec

    spec = RunSpec(experiment="e", method="fst", name="r", schedule=("math", "math_hard"), seed=0)
    with pytest.raises(ValueError) as err:
        run_cycle(spec, {}, -1, tmp_path / "base", None, tmp_path / "train.parquet", tmp_path / "c")
    assert one_line(err) == ("cycle -1 of e/fst/r: its schedule has 2 cycle(s) (math, math_hard); "
                             "it lists each cycle's training task")
    with pytest.raises(ValueError) as err:
        run_cycle(spec, {}, 1, tmp_path / "base", None, tmp_path / "train.parquet", tmp_path / "c")
    assert one_line(err) == "cycle 1 of e/fst/r: prev_dir is None; give cycle 0's out_dir"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("own_file", [False, True], ids=["generated", "data-files"])
def test_a_train_split_too_small_for_a_fast_round_stops_the_cycle_in_one_line(
        own_file: bool, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A train split of one problem (a user's file with one train row) leaves a fast round
    nothing to reflect on or nothing to validate on: the cycle stops before its generator is
    built, naming the split, the count and what to change; two problems are enough to start."""
    from fastslow.cycle import run_cycle
    from fastslow.tasks.data import write_problems

    spec, config, _ = _cycle_that_must_not_start(monkeypatch, tmp_path)
    path = Path(__file__).resolve().parents[1] / "config" / "parity.jsonl"
    if own_file:
        config["data"]["files"] = {"math": {"path": str(path)}}
    one = write_problems([Problem("p0", "math", "What is 0 + 1?", "1")], tmp_path / "one.parquet")
    with pytest.raises(ValueError) as err:
        run_cycle(spec, config, 0, tiny_model_dir, None, one, tmp_path / "c0")
    fix = f"add train rows to {path}" if own_file else "raise data.sizes.train"
    assert one_line(err) == (f"task 'math': its train split {one} has 1 problem(s), and a fast round needs at least 2 "
                             f"(one to validate on, one to reflect on): {fix}")
    two = write_problems([Problem(f"p{i}", "math", f"What is {i} + 1?", str(i + 1)) for i in range(2)],
                         tmp_path / "two.parquet")
    with pytest.raises(AssertionError, match="^the fast round started$"):
        run_cycle(spec, config, 0, tiny_model_dir, None, two, tmp_path / "c0")


HOLD_LOCK = """
import sys, time
from fastslow.io import exclusive_lock
with exclusive_lock(sys.argv[1], "test"):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_process_on_one_cycle_stops_in_one_line(tiny_model_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle job a killed Snakemake left running, and its rerun after `--unlock`: the two wrote
    the same cycle (the first removed the second's live temporaries as stale, and took its fast
    round's files as its own). The second stops now, naming the first; once the first is gone
    (killed: the kernel drops its lock), the cycle can run again."""
    import signal
    import subprocess
    import sys

    from fastslow.cycle import run_cycle
    from fastslow.io import LockedError, exclusive_lock

    spec, config, train = _cycle_that_must_not_start(monkeypatch, tmp_path)
    lock = tmp_path / "c0.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockedError) as err:
            run_cycle(spec, config, 0, tiny_model_dir, None, train, tmp_path / "c0")
        assert one_line(err).startswith(f"cycle 0 of e/fst/r ({tmp_path / 'c0'}) is being written by another "
                                        f"process (pid {holder.pid} on ")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with exclusive_lock(lock, "test"):  # the dead holder's lock is gone with it
        assert lock.read_text().startswith("pid ")
    assert not lock.exists()  # removed once the block completes


def test_a_lock_held_until_exit_is_released_and_removed_when_the_process_ends(tmp_path: Path) -> None:
    """Snakemake's onstart hook takes the workflow's lock with no block to hold it in: the process
    holds it until it exits, then the file is gone (the next run's lock is not a stale file's)."""
    import subprocess
    import sys

    lock = tmp_path / "results" / ".workflow.lock"
    code = ("import sys; from fastslow.io import hold_until_exit, exclusive_lock, LockedError\n"
            "hold_until_exit(sys.argv[1], 'w'); hold_until_exit(sys.argv[1] + '2', 'w2')\n"
            "print(open(sys.argv[1]).read().split()[1])\n")
    out = subprocess.run([sys.executable, "-c", code, str(lock)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().isdigit()  # held (its pid written) while the process ran
    assert not lock.exists() and not Path(f"{lock}2").exists()
    # Taken by a relative path, then the process changes directory (Snakemake given --directory
    # goes back before it exits): its own file goes, not the one of that name where it ends up
    # (another run's live lock); released (`release_held`, the onsuccess hook), it can be taken again.
    (tmp_path / "wd").mkdir()
    other = tmp_path / "results" / ".workflow.lock"
    other.write_text("pid 1 on another run\n")
    code = ("import os; from fastslow.io import hold_until_exit, release_held\n"
            "hold_until_exit('results/.workflow.lock', 'w'); release_held()\n"
            "hold_until_exit('results/.workflow.lock', 'w'); os.chdir('..')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "wd", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert other.read_text() == "pid 1 on another run\n" and not (tmp_path / "wd" / "results" / ".workflow.lock").exists()


def test_a_lock_whose_slurm_job_has_ended_is_taken_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lock on a network file system can outlive a node that died (NFSv3 until it reboots):
    SLURM's retry of that node's job elsewhere was refused, attempt after attempt, naming a
    process nobody could stop. The holder names its SLURM job; when squeue says that job has
    ended (or knows it no more), or it was this job before SLURM requeued it, the lock is taken
    over. A running job's, or one squeue cannot be asked about, still refuses. (The holder here is
    alive: it stands for the dead node's process, whose lock the file system keeps.)"""
    import signal
    import subprocess
    import sys

    from fastslow.io import LockedError, exclusive_lock

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text('#!/bin/sh\nif [ "$FAKE_STATE" = gone ]; then echo "slurm_load_jobs error: Invalid job id '
                      'specified" >&2; exit 1; fi\nif [ "$FAKE_STATE" = down ]; then echo "slurm_load_jobs error: '
                      'Socket timed out on send/recv operation" >&2; exit 1; fi\necho "$FAKE_STATE"\n')
    squeue.chmod(0o755)
    lock = tmp_path / "c0.lock"
    env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": ""}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert lock.read_text().strip().endswith("(SLURM job 4242, restart 0)")
        for key in ("SLURM_JOB_ID", "SLURM_RESTART_COUNT"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        # its job still runs, its process may too; or the controller does not answer: nothing says it ended
        for state in ("RUNNING", "COMPLETING", "down"):
            monkeypatch.setenv("FAKE_STATE", state)
            with pytest.raises(LockedError, match=f"pid {holder.pid} on .* \\(SLURM job 4242, restart 0\\)"):
                with exclusive_lock(lock, "cycle 0"):
                    pass
        monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no squeue to ask: refused
        with pytest.raises(LockedError), exclusive_lock(lock, "cycle 0"):
            pass
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        for state in ("gone", "NODE_FAIL"):
            monkeypatch.setenv("FAKE_STATE", state)
            with exclusive_lock(lock, "cycle 0"):
                assert lock.read_text().startswith(f"pid {os.getpid()} ")
            lock.unlink(missing_ok=True)
            # the holder keeps its nameless old file; for the next round, it locks a new one
            holder.send_signal(signal.SIGKILL)
            holder.wait()
            holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(lock)], stdout=subprocess.PIPE, text=True,
                                      env=env)
            assert holder.stdout.readline().strip() == "held"
        # this very job before SLURM requeued it: taken over without asking squeue
        monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
        monkeypatch.setenv("SLURM_JOB_ID", "4242")
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
        with exclusive_lock(lock, "cycle 0"):
            assert lock.read_text().strip().endswith("(SLURM job 4242, restart 1)")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_a_lock_file_its_holder_removed_after_we_opened_it_is_not_taken(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Three copies of one job: the second opens the lock file, the first ends (its lock released,
    the file unlinked), a third creates and locks a new file under the name. The second then
    locked the nameless old file and ran beside the third. It now opens the name again and stops,
    naming the third."""
    import fcntl

    from fastslow.io import LockedError, exclusive_lock

    lock = tmp_path / "c0.lock"
    lock.write_text("pid 1 on first\n")
    real_flock = fcntl.flock
    third: list[int] = []

    def flock(fd: int, operation: int) -> None:
        if not third:  # between the second's open and its flock: the first ends, the third starts
            os.unlink(lock)
            third.append(os.open(lock, os.O_RDWR | os.O_CREAT, 0o666))
            real_flock(third[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(third[0], b"pid 3 on third\n")
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    try:
        with pytest.raises(LockedError) as err, exclusive_lock(lock, "cycle 0"):
            pytest.fail("the block ran beside the third process's")
        assert one_line(err).startswith(f"cycle 0 is being written by another process (pid 3 on third, lock {lock})")
    finally:
        for fd in third:
            os.close(fd)
    assert lock.read_text() == "pid 3 on third\n"  # the third's file is left alone


def test_a_train_split_too_small_for_a_fast_round_names_the_file_to_fix(tmp_path: Path, monkeypatch) -> None:
    """A data.files task whose file holds one train row passes the config check (data.sizes.train
    is 256). The round then stopped with "... needs 2 problems at least: data.sizes.train", a key
    already far above 2. The cycle now names the split, its size and the file to add rows to."""
    import fastslow.fast
    from fastslow.config import load_config
    from fastslow.cycle import run_cycle
    from fastslow.experiments import RunSpec
    from fastslow.tasks.data import write_problems

    def no_round(*args, **kwargs):
        raise AssertionError("the fast round ran")

    monkeypatch.setattr(fastslow.fast, "run_round", no_round)
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    config = load_config("config/config.yaml", "config/smoke.yaml", overrides={
        "data": {"files": {"parity": {"path": "config/parity.jsonl"}}}})
    write_problems([Problem("p0", "parity", "Is 3 even?", "ODD")], tmp_path / "train.parquet")
    spec = RunSpec(experiment="e", method="fst", name="r", schedule=("parity",), seed=0)
    with pytest.raises(ValueError) as err:
        run_cycle(spec, config, 0, tmp_path / "no-model", None, tmp_path / "train.parquet", tmp_path / "c0")
    assert str(err.value) == (
        f"task 'parity': its train split {tmp_path / 'train.parquet'} has 1 problem(s), and a fast round needs "
        "at least 2 (one to validate on, one to reflect on): add train rows to config/parity.jsonl")
    spec = RunSpec(experiment="e", method="fst", name="r", schedule=("math",), seed=0)
    with pytest.raises(ValueError, match=r"has 1 problem\(s\), .*: raise data\.sizes\.train$"):
        run_cycle(spec, config, 0, tmp_path / "no-model", None, tmp_path / "train.parquet", tmp_path / "c1")


def test_sampling_and_scoring_errors_name_the_bad_values() -> None:
    """One line naming what is wrong: the batch size asked for, both lengths, the short problem."""
    from fastslow.evaluate import summarize
    from fastslow.model.generation import HFGenerator
    from fastslow.slow.divergence import kl_and_entropy

    with pytest.raises(ValueError, match=r"^batch_size must be >= 1, got 0$"):
        HFGenerator(None, None, batch_size=0)
    with pytest.raises(ValueError, match=r"^prompt_ids and completion_ids must have the same length, got 2 and 1$"):
        kl_and_entropy(None, None, None, [[1], [2]], [[3]])
    rows = [{"problem_id": p, "reward": 1.0, "completion_tokens": 3} for p in ("a", "a", "b")]
    with pytest.raises(ValueError, match=r"^expected 2 samples per problem, got \[1, 2\] \(problem 'b' has 1\)$"):
        summarize(rows, 2)
