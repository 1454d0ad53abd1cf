"""Session-wide test fixtures shared by every module's tests.

Tests never reach the Hugging Face hub: the environment is forced offline before any
transformers import. The tiny model is built once per test session (a few seconds, most of it
parsing SmolLM2's GGUF tokenizer) under pytest's session temp directory.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: The repository: every test runs from it (`cd tests && pytest test_x.py` too), as the configs'
#: relative paths (config/parity.jsonl) and the tests' own `config/config.yaml` expect.
ROOT = Path(__file__).resolve().parents[1]
#: The test suite's own switches among the FASTSLOW_* variables; every other one (a SLURM
#: partition, the GPUs a job trains on, the store on a cluster) and the developer's MLflow URI
#: and Snakemake profile would redirect or reshape the tests' runs, so they are cleared here.
TEST_SWITCHES = ("FASTSLOW_TEST_", "FASTSLOW_REQUIRE_SLURM")
for _key in [k for k in os.environ if (k.startswith("FASTSLOW_") and not k.startswith(TEST_SWITCHES))
             or k in ("MLFLOW_TRACKING_URI", "SNAKEMAKE_PROFILE")]:
    del os.environ[_key]
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# fastslow.provenance's cache of parsed modules: the session's own, not the developer's
os.environ["FASTSLOW_CACHE_DIR"] = tempfile.mkdtemp(prefix="fastslow-test-cache-")
atexit.register(shutil.rmtree, os.environ["FASTSLOW_CACHE_DIR"], True)


def pytest_configure(config: pytest.Config) -> None:
    """Torch on one thread unless FASTSLOW_TEST_THREADS says otherwise.

    The test machines are small and shared; there, two OpenMP threads contending for busy
    cores made a forward pass ~10x slower than one thread. Tiny test models gain nothing from
    intra-op parallelism anyway.
    """
    import torch

    torch.set_num_threads(int(os.environ.get("FASTSLOW_TEST_THREADS", "1")))


#: Printed under the session's summary (also with -q, which hides pytest's header): the versions
#: behind a failure, since the pins leave ranges (transformers, polars, pyarrow, numpy, ...) that
#: resolve differently over time and CI keeps no log of what pip installed.
REPORTED_PACKAGES = ("torch", "transformers", "trl", "gepa", "snakemake", "mlflow", "polars", "pyarrow",
                     "numpy", "reasoning-gym", "datasets", "accelerate")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    terminalreporter.write_line(f"versions: python {platform.python_version()}, " + ", ".join(
        f"{name} {installed(name)}" for name in REPORTED_PACKAGES))


#: Scheduling (pyproject's addopts, `-n 2 --dist loadfile`): each test file runs on one worker.
#: pytest-xdist starts files in order of their test count, largest first (its default
#: `--loadscope-reorder`); this order only breaks ties. So the every-figure file (two tests: a
#: ~110-job Snakemake DAG on `--cores 2`, and the SLURM build that runs beside it, mostly waiting
#: for status checks) starts among the last, after the workflow DAGs, and has both cores mostly
#: to itself. Measured on this 2-core machine (2026-11-26, one run each, when the SLURM test was
#: a file of its own): 15 min 7 s that way; 16 min 4 s with the longest files started first
#: (`--no-loadscope-reorder`), the every-figure DAG taking 890 s instead of 485 s beside the SLURM
#: and workflow DAGs; 16 min 55 s with it started last of all (no tie order). Most of a smoke
#: DAG's time is its jobs' start-up: an evaluation job takes ~10 s, ~80% of it (under cProfile)
#: importing torch, transformers and MLflow, so the suite is bound by CPU.
TIE_ORDER = ("test_workflow_figures.py", "test_config.py", "test_slurm.py", "test_resume.py",
             "test_workflow.py", "test_mlflow_server.py", "test_slow_distributed.py",
             "test_fast_llama_server.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(TIE_ORDER)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept


#: What a test session may leave in the repository it runs from (pytest's and hypothesis's own
#: caches); anything else is a test writing into the checkout instead of its tmp_path.
SESSION_LEFTOVERS = {".pytest_cache", ".hypothesis", "__pycache__"}


@pytest.fixture(autouse=True, scope="session")
def _from_the_repository():
    """Every test runs from the repository, and none leaves a file there (an MLflow experiment
    made without an artifact location wrote its runs' artifacts to ./mlruns/ of the checkout)."""
    before = os.getcwd()
    entries = set(os.listdir(ROOT))
    os.chdir(ROOT)
    yield
    os.chdir(before)
    left = sorted(set(os.listdir(ROOT)) - entries - SESSION_LEFTOVERS)
    if left:
        pytest.fail(f"the tests left {left} in the repository {ROOT}: a test wrote to its working "
                    f"directory instead of its tmp_path (or a job ran in the checkout meanwhile)", pytrace=False)


@pytest.fixture(autouse=True)
def _no_leaked_tracking_uri():
    """A test that points MLflow somewhere must not redirect later tests' workflow runs there."""
    before = os.environ.get("MLFLOW_TRACKING_URI")
    yield
    if before is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template, as an HF directory.

    Shared by the whole session: treat it as read-only (save trained copies elsewhere).
    """
    from fastslow.model.convert import prepare_base_model

    return prepare_base_model("tiny-random", tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    """The tiny model's tokenizer (SmolLM2's), left padding, pad token set. Do not mutate."""
    from fastslow.model.convert import load_tokenizer

    return load_tokenizer(tiny_model_dir)
