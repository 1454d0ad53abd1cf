"""evaluate_weights on the vLLM backend, with vLLM and CUDA faked: what reaches the engine, and
that the engine is gone (and its GPU memory returned) before the KL/entropy models load."""

from __future__ import annotations

import gc
import logging
import re
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from slow_toys import LengthTask

from fastslow import evaluate
from fastslow.model import convert, generation
from fastslow.model.generation import Generation, SamplingParams, encode_prompts
from fastslow.tasks.base import build_messages


class FakeVLLMGenerator:
    """A vLLM-backed generator as evaluation sees it: no `.model`, completions with their ids.
    It refers to itself, as engines with callbacks do: only the garbage collector frees it."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.myself = self

    def generate(self, conversations: list, params: SamplingParams) -> list[Generation]:
        getattr(self, "sizes", []).append(len(conversations))
        return [Generation(text="x" * (i % 3 + 1), prompt_tokens=5, completion_tokens=2,
                           completion_ids=(40 + i % 7, 41)) for i in range(len(conversations))]


def test_vllm_evaluation_sizes_the_engine_and_releases_it_before_the_kl_pass(
        tiny_model_dir: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    made: list[tuple[tuple, dict]] = []
    engines: list[weakref.ref] = []
    events: list[Any] = []
    sizes: list[int] = []
    real_load = convert.load_model

    def make_generator(*args: Any, **kwargs: Any) -> FakeVLLMGenerator:
        made.append((args, kwargs))
        gen = FakeVLLMGenerator(**kwargs)
        gen.sizes = sizes
        engines.append(weakref.ref(gen))
        return gen

    def load_model(path: Any, dtype: str = "auto", device: str = "cpu") -> Any:
        events.append(("load", Path(path), device, engines[0]() is None))
        return real_load(path, dtype=dtype)  # this machine has no GPU: the model stays on the CPU

    monkeypatch.setattr(generation, "make_generator", make_generator)
    monkeypatch.setattr(convert, "load_model", load_model)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append(("empty_cache", engines[0]() is None)))
    task = LengthTask()
    problems = task.problems("val", 3, 0)
    context = "Answer briefly, then stop."
    params = SamplingParams(7, 1.0, 1.0, 0)
    with caplog.at_level(logging.INFO, logger="fastslow.slow.divergence"):
        summary, rows = evaluate.evaluate_weights(tiny_model_dir, task, problems, context, 2, params,
                                                  backend="vllm", dtype="float32", batch_size=2,
                                                  gpu_memory_utilization=0.45)
    gc.collect()
    (args, kwargs), = made
    assert args == ("vllm", tiny_model_dir) and kwargs["gpu_memory_utilization"] == 0.45
    longest = max(len(ids) for ids in encode_prompts(tokenizer, [build_messages(context, p) for p in problems]))
    assert kwargs["max_model_len"] == longest + 7
    assert sizes == [2, 2, 2]  # generation.batch_size prompts a vLLM call (it was 32 whatever the config)
    # The engine was collected and CUDA's cache emptied before the policy loaded, on the GPU.
    assert events[:2] == [("empty_cache", True), ("load", Path(tiny_model_dir), "cuda", True)]
    assert summary["kl_to_base"] == 0.0 and summary["entropy"] > 0 and len(rows) == 6
    assert any("entropy: 6/6 completions" in r.getMessage() for r in caplog.records)  # the base model: no KL pass


def test_make_generator_forwards_the_engine_size_to_vllm_only(tiny_model_dir: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """generation.gpu_memory_utilization and max_model_len reach VLLMGenerator; hf ignores them."""
    seen: dict[str, Any] = {}

    class Recorder:
        def __init__(self, model_path: Any, **kwargs: Any) -> None:
            seen.update(kwargs, model_path=model_path)

    monkeypatch.setattr(generation, "VLLMGenerator", Recorder)
    generation.make_generator("vllm", tiny_model_dir, dtype="bfloat16", gpu_memory_utilization=0.45,
                              max_model_len=1234)
    assert seen == {"model_path": tiny_model_dir, "dtype": "bfloat16", "gpu_memory_utilization": 0.45,
                    "max_model_len": 1234}
    seen.clear()
    generation.make_generator("vllm", tiny_model_dir)  # unset: VLLMGenerator's own defaults
    assert seen == {"model_path": tiny_model_dir, "dtype": "auto", "max_model_len": None}
    hf = generation.make_generator("hf", tiny_model_dir, dtype="float32", gpu_memory_utilization=0.45,
                                   max_model_len=1234)
    assert isinstance(hf, generation.HFGenerator)


def test_the_hf_sampler_runs_on_the_gpu_when_there_is_one(tiny_model_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """make_generator("hf") loaded the model on the CPU unless told otherwise, and no caller told
    it: evaluation, the fast round and a local reflection model sampled on the CPU of a GPU node.
    Now None means the GPU when torch sees one (an explicit device still wins)."""
    import torch

    from fastslow.model import convert

    devices: list[str] = []
    real = convert.load_model

    def recording(path: Any, dtype: str = "auto", device: str = "cpu") -> Any:
        devices.append(device)
        return real(path, dtype=dtype, device="cpu")  # no GPU here: record where it was asked for

    monkeypatch.setattr(convert, "load_model", recording)
    generation.make_generator("hf", tiny_model_dir)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    generation.make_generator("hf", tiny_model_dir)
    generation.make_generator("hf", tiny_model_dir, device="cpu")
    assert devices == ["cpu", "cuda", "cpu"]


def test_fast_round_generator_gets_the_configured_gpu_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fastslow.cycle builds the fast round's generator with generation.gpu_memory_utilization."""
    from fastslow import cycle as cycle_mod
    from fastslow.config import load_config
    from fastslow.experiments import RunSpec
    from fastslow.tasks.data import write_problems

    class Stop(Exception):
        pass

    seen: dict[str, Any] = {}

    def make_generator(*args: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(generation, "make_generator", make_generator)
    root = Path(__file__).resolve().parents[1]
    config = load_config(root / "config" / "config.yaml",
                         overrides={"generation": {"backend": "vllm", "gpu_memory_utilization": 0.45}})
    train = write_problems(LengthTask().problems("train", 4, 0), tmp_path / "train.parquet")
    spec = RunSpec(experiment="e", method="gepa", name="r", schedule=("math",), seed=0)
    with pytest.raises(Stop):
        cycle_mod.run_cycle(spec, config, 0, tmp_path / "init", None, train, tmp_path / "c0")
    assert seen["gpu_memory_utilization"] == 0.45


def test_evaluation_progress_says_how_long_is_left(caplog) -> None:
    """A line per chunk of samples: how many, the reward so far, the speed and, until the last
    chunk, the time left at the rate so far (any backend; the fake engine here)."""
    task = LengthTask()
    problems = task.problems("val", 5, 0)
    with caplog.at_level(logging.INFO, logger="fastslow.evaluate"):
        rows = evaluate.sample_and_score(FakeVLLMGenerator(), task, problems, "Be brief.", 2,
                                         SamplingParams(7, 1.0, 1.0, 0), chunk=4)
    assert len(rows) == 10
    lines = [r.getMessage() for r in caplog.records if r.name == "fastslow.evaluate"]
    assert [line.split(": ")[1].split(",")[0] for line in lines] == ["4/10 samples", "8/10 samples", "10/10 samples"]
    assert all(re.search(r", sampling ~\d+s left$", line) for line in lines[:-1]), lines
    assert "left" not in lines[-1] and "reward so far" not in lines[-1] and "10/10 samples, reward " in lines[-1]


def test_vllm_generator_asks_and_reads_the_engine_as_the_hf_path_does(tiny_model_dir: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """VLLMGenerator itself, with vLLM and CUDA faked (vLLM's RequestOutput shapes: a
    CompletionOutput with token_ids, cumulative_logprob, per-step {token id: Logprob} dicts and
    a finish reason): the engine's settings, one seeded request per prompt, greedy as
    temperature 0 with top-p 1, and completions read back into `Generation`s as HFGenerator
    returns them (prompt ids as `encode_prompts` makes them, per-token log-probs, "length" for a
    completion cut at the budget, the sum taken from the per-token log-probs when vLLM gives no
    cumulative one)."""
    import sys
    from types import ModuleType, SimpleNamespace

    made: dict[str, Any] = {}
    asked: list[tuple[list[Any], list[dict[str, Any]]]] = []

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            made.update(kwargs)

        def generate(self, prompts: list[Any], sampling: list[dict[str, Any]], use_tqdm: bool) -> list[Any]:
            asked.append((prompts, sampling))
            outs = []
            for i, _ in enumerate(prompts):
                ids = [5, 6, 7][: 3 - i]
                steps = [{t: SimpleNamespace(logprob=-0.25 * (k + 1))} for k, t in enumerate(ids)]
                outs.append(SimpleNamespace(outputs=[SimpleNamespace(
                    text=f"answer {i}", token_ids=ids, logprobs=steps,
                    cumulative_logprob=None if i else -1.5, finish_reason="stop" if i else "length")]))
            return outs

    fake = ModuleType("vllm")
    fake.LLM, fake.SamplingParams = LLM, lambda **kwargs: kwargs
    inputs = ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    fake.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    gen = generation.VLLMGenerator(tiny_model_dir, dtype="bfloat16", gpu_memory_utilization=0.4,
                                   max_model_len=512, seed=3)
    assert made["model"] == str(tiny_model_dir) and made["dtype"] == "bfloat16" and made["seed"] == 3
    assert (made["gpu_memory_utilization"], made["max_model_len"]) == (0.4, 512)
    assert made["logprobs_mode"] == "processed_logprobs" and made["enable_prefix_caching"] is True
    task = LengthTask()
    chats = [build_messages("Be brief.", p) for p in task.problems("val", 2, 0)]
    out = gen.generate(chats, SamplingParams(3, 0.7, 0.9, seed=11))
    [(prompts, sampling)] = asked
    expected_ids = encode_prompts(gen.tokenizer, chats)
    assert [p["prompt_token_ids"] for p in prompts] == expected_ids
    assert [s["seed"] for s in sampling] == [generation.derive_seed(11, 0), generation.derive_seed(11, 1)]
    assert all((s["n"], s["temperature"], s["top_p"], s["max_tokens"], s["logprobs"]) == (1, 0.7, 0.9, 3, 0)
               for s in sampling)
    assert [(g.text, g.completion_ids, g.completion_tokens, g.finish_reason) for g in out] == [
        ("answer 0", (5, 6, 7), 3, "length"), ("answer 1", (5, 6), 2, "stop")]
    assert [g.prompt_ids for g in out] == [tuple(ids) for ids in expected_ids]
    assert [g.prompt_tokens for g in out] == [len(ids) for ids in expected_ids]
    assert out[0].token_logprobs == (-0.25, -0.5, -0.75) and out[0].logprob_sum == -1.5  # vLLM's sum
    assert out[1].token_logprobs == (-0.25, -0.5) and out[1].logprob_sum == pytest.approx(-0.75)  # ours
    asked.clear()
    gen.generate(chats[:1], SamplingParams(3, 0.0, 0.9, seed=11))  # greedy: no nucleus either
    assert (asked[0][1][0]["temperature"], asked[0][1][0]["top_p"]) == (0.0, 1.0)
    # a template that opens the reasoning trace: its "<think>" in front of vLLM's text, as HFGenerator puts it
    monkeypatch.setattr(generation, "trace_opener", lambda tokenizer, kwargs=None: "<think>")
    assert [g.text for g in gen.generate(chats, SamplingParams(3, 0.7, 0.9, seed=11))] == ["<think>answer 0", "<think>answer 1"]
