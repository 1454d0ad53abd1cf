"""Slow loop, fast unit tests: config validation, rollout layout, data order, KL/entropy."""

from __future__ import annotations

import dataclasses
import math

import pytest

from fastslow.slow import SlowConfig, expand_rows
from fastslow.slow.loop import check_device, take_problems
from fastslow.tasks.base import Problem


def test_defaults_are_paper_values() -> None:
    cfg = SlowConfig()
    assert (cfg.lr, cfg.warmup_steps, cfg.beta, cfg.epsilon_high) == (1e-6, 10, 0.001, 4.0)
    assert (cfg.num_generations, cfg.problems_per_step, cfg.steps_per_cycle) == (8, 32, 6)
    assert cfg.baseline == "problem"
    # as the help texts state them: on-policy sampling of the raw distribution, no clipping
    assert (cfg.temperature, cfg.top_p, cfg.steps_per_generation, cfg.max_grad_norm) == (1.0, 1.0, 1, None)
    assert all(SlowConfig.help_text().values()), "every field documents itself"


@pytest.mark.parametrize("kwargs, field", [
    ({"num_generations": 1}, "num_generations"),
    ({"problems_per_step": 0}, "problems_per_step"),
    ({"baseline": "context"}, "baseline"),
    ({"epsilon_high": 0.0}, "epsilon_high"),
    ({"lr": -1.0}, "lr"),
    ({"warmup_steps": -1}, "warmup_steps"),
    ({"micro_batch_size": 3, "num_generations": 4, "problems_per_step": 2}, "micro_batch_size"),
    ({"vllm_mode": "server"}, "vllm_mode"),
    ({"top_p": 0.0}, "top_p"),
    ({"temperature": 1e-40}, "temperature"),  # the loss's logits / T overflow: NaN
    ({"lr": 0.0}, "lr"),
    ({"max_grad_norm": 0.0}, "max_grad_norm"),
    ({"vllm_gpu_memory_utilization": 1.0}, "vllm_gpu_memory_utilization"),
    ({"scale_rewards": "std"}, "scale_rewards"),
    ({"problems_per_step": True}, "problems_per_step"),
    ({"warmup_steps": True}, "warmup_steps"),
    ({"chat_template_kwargs": {1: True}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
])
def test_config_rejects_bad_values_naming_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"SlowConfig\.{field}: expected") as err:
        SlowConfig(**kwargs)
    assert "\n" not in str(err.value) and str(err.value).endswith(f"got {kwargs[field]!r}")


def test_config_accepts_the_boundary_values() -> None:
    """Warm-up 0, beta 0 (no reference model), the lowest temperature the config check takes,
    top_p 1 and a positive clip are all valid settings."""
    from fastslow.config import MIN_TEMPERATURE

    cfg = SlowConfig(warmup_steps=0, beta=0.0, temperature=MIN_TEMPERATURE, top_p=1.0, max_grad_norm=1e-3,
                     vllm_gpu_memory_utilization=0.99)
    assert (cfg.warmup_steps, cfg.beta, cfg.temperature) == (0, 0.0, MIN_TEMPERATURE)


def test_vllm_refuses_sampling_ahead_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^SlowConfig\.steps_per_generation: 2 samples ahead.*set it to 1$"):
        SlowConfig(use_vllm=True, steps_per_generation=2)
    assert SlowConfig(use_vllm=True).steps_per_generation == 1


def test_from_dict_rejects_unknown_keys() -> None:
    assert SlowConfig.from_dict({"lr": 2e-5}).lr == 2e-5
    with pytest.raises(ValueError, match="unknown key.*'learning_rate'"):
        SlowConfig.from_dict({"learning_rate": 1e-5})


def test_pool_size_must_divide_g() -> None:
    cfg = SlowConfig(num_generations=8)
    for k in (1, 2, 4, 8):
        cfg.check_pool(k)
    with pytest.raises(ValueError, match=r"K=3 does not divide num_generations G=8.*\[1, 2, 4, 8\]"):
        cfg.check_pool(3)
    with pytest.raises(ValueError, match=r"K=0 does not divide"):
        cfg.check_pool(0)
    with pytest.raises(ValueError, match="groups of one rollout"):
        SlowConfig(num_generations=8, baseline="prompt").check_pool(8)


def test_gpu_options_fail_clearly_on_cpu(monkeypatch) -> None:
    import torch

    from fastslow import hardware

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="use_vllm needs a CUDA GPU"):
        check_device(SlowConfig(use_vllm=True))
    check_device(SlowConfig())  # the CPU config passes
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)
    check_device(SlowConfig(bf16=True))  # bf16 autocast on a CPU with native bf16
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: False)
    with pytest.raises(RuntimeError, match="bf16=true needs a CUDA GPU with native bf16 .* or a CPU with native bf16"):
        check_device(SlowConfig(bf16=True))


def test_a_gpu_that_only_emulates_bf16_is_not_native(monkeypatch) -> None:
    """`bfloat16_if_native` and `slow.bf16: auto` had taken any CUDA GPU as native bf16: a V100
    or T4 (torch emulates bf16 there) sampled and trained in bf16, slower than fp32."""
    import torch

    from fastslow import hardware

    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)  # the GPU decides, not the host CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for native in (False, True):
        asked = []
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True, native=native, asked=asked:
                            asked.append(including_emulation) or native)
        assert hardware.native_bf16_available() is native and asked == [False]


def test_rows_spread_g_copies_over_k_contexts() -> None:
    problems = [Problem(f"p{i}", "toy", f"question {i}", "0") for i in range(2)]
    contexts = [("a", "context A"), ("b", "context B")]
    rows = expand_rows(problems, contexts, num_generations=4)
    assert [(r["problem_id"], r["context_id"]) for r in rows] == [
        ("p0", "a"), ("p0", "a"), ("p0", "b"), ("p0", "b"),
        ("p1", "a"), ("p1", "a"), ("p1", "b"), ("p1", "b"),
    ]
    # The policy sees the context as its system prompt, then the problem.
    assert rows[2]["prompt"] == [{"role": "system", "content": "context B"},
                                 {"role": "user", "content": "question 0"}]


def test_data_stream_is_a_seeded_permutation_per_epoch() -> None:
    first = take_problems(5, seed=3, cursor=0, count=5)
    second = take_problems(5, seed=3, cursor=5, count=5)
    assert sorted(first) == sorted(second) == list(range(5))
    epochs = [first, second, take_problems(5, 3, 10, 5), take_problems(5, 3, 15, 5)]
    assert all(e != first for e in epochs[1:])  # each epoch reshuffles (seed 3: no repeat in four)
    assert take_problems(5, seed=4, cursor=0, count=5) != first  # and the seed decides the order
    # Reading in pieces gives the same stream as reading at once (the resumable position).
    whole = take_problems(5, seed=3, cursor=0, count=12)
    assert whole == take_problems(5, 3, 0, 4) + take_problems(5, 3, 4, 4) + take_problems(5, 3, 8, 4)
    assert take_problems(5, seed=4, cursor=0, count=5) != first


def test_data_stream_is_the_one_earlier_cycles_drew() -> None:
    """A resumed or continued run reads the stream at its saved cursor, so the stream must not
    change under it. numpy does not promise `Generator` streams across versions (and numpy is
    not pinned): these orders are numpy 2.x's PCG64 draws, and a numpy that changed them fails
    here instead of silently training a resumed cycle on other problems."""
    assert take_problems(10, seed=0, cursor=0, count=10) == [4, 6, 2, 7, 3, 5, 9, 0, 8, 1]
    assert take_problems(10, seed=7, cursor=13, count=5) == [6, 7, 1, 3, 4]


def _policy_and_base(model_dir, seed: int) -> tuple:
    """The tiny model twice, the first with its weights moved by seeded noise (a nonzero KL)."""
    import torch

    from fastslow.model.convert import load_model

    policy = load_model(model_dir, dtype="float32")
    base = load_model(model_dir, dtype="float32")
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return policy, base


def test_kl_and_entropy_match_a_direct_computation(tiny_model_dir, tokenizer) -> None:
    import torch

    from fastslow.slow import kl_and_entropy

    policy, base = _policy_and_base(tiny_model_dir, seed=0)
    # repeated prompts (their prefix is shared), a one-token prompt, a one-token completion
    prompts = [[1, 2, 3, 4], [5, 6], [1, 2, 3, 4], [9], [5, 6]]
    completions = [[7, 8, 9], [10, 11, 12, 13, 14], [20, 21], [22, 23], [24]]
    n = sum(len(c) for c in completions)

    kl, ent = kl_and_entropy(policy, base, tokenizer, prompts, completions, batch_size=2,
                             token_chunk=2)
    for batch_size in (1, 8):
        again = kl_and_entropy(policy, base, tokenizer, prompts, completions, batch_size=batch_size)
        assert again == pytest.approx((kl, ent), rel=1e-4)
    kl_sum = ent_sum = base_ent_sum = 0.0
    with torch.no_grad():
        for p, c in zip(prompts, completions, strict=True):
            ids = torch.tensor([p + c])
            lp = torch.log_softmax(policy(ids).logits[0, len(p) - 1: -1].float(), -1)
            lq = torch.log_softmax(base(ids).logits[0, len(p) - 1: -1].float(), -1)
            kl_sum += float((lp.exp() * (lp - lq)).sum())
            ent_sum += float(-(lp.exp() * lp).sum())
            base_ent_sum += float(-(lq.exp() * lq).sum())
    assert kl == pytest.approx(kl_sum / n, rel=1e-4)
    assert ent == pytest.approx(ent_sum / n, rel=1e-5)
    assert kl > 1e-4

    same, base_ent = kl_and_entropy(base, base, tokenizer, prompts, completions, batch_size=2)
    assert abs(same) < 1e-6
    assert base_ent == pytest.approx(base_ent_sum / n, rel=1e-5)  # one forward, same entropy
    assert all(math.isnan(x) for x in kl_and_entropy(base, base, tokenizer, [[1]], [[]]))


@pytest.mark.parametrize("family", ["granite", "cohere", "gemma2"])
def test_kl_and_entropy_see_the_logits_the_models_own_forward_gives(family) -> None:
    """Granite divides its head's logits by `logits_scaling`, Cohere multiplies them by
    `logit_scale`, Gemma 2 soft-caps them: the entropy (and so the KL, and fst_distill's loss,
    which share `_log_probs`) must be that of the model's own logits. Only the soft-cap was
    applied, so Granite's and Cohere's were those of logits 4x too large or too small."""
    import types

    import torch
    import transformers

    from fastslow.slow import kl_and_entropy
    from fastslow.slow.divergence import logit_scale

    config_class, model_class, extra, scale = {
        "granite": ("GraniteConfig", "GraniteForCausalLM", {"logits_scaling": 4.0}, 0.25),
        "cohere": ("CohereConfig", "CohereForCausalLM", {"logit_scale": 4.0, "eos_token_id": 2}, 4.0),
        "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"final_logit_softcapping": 2.0, "head_dim": 8}, 1.0),
    }[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(vocab_size=64, hidden_size=16, intermediate_size=32,
                                                 num_hidden_layers=1, num_attention_heads=2,
                                                 num_key_value_heads=2, **extra)
    model = getattr(transformers, model_class)(config).eval()
    assert logit_scale(model.config.get_text_config()) == scale
    prompts, completions = [[1, 2, 3], [4, 5]], [[6, 7, 8], [9, 10]]
    kl, ent = kl_and_entropy(model, model, types.SimpleNamespace(pad_token_id=0), prompts, completions, batch_size=2)
    total = 0.0
    with torch.no_grad():
        for p, c in zip(prompts, completions, strict=True):
            lp = torch.log_softmax(model(torch.tensor([p + c])).logits[0, len(p) - 1: -1].float(), -1)
            total += float(-(lp.exp() * lp).sum())
    assert ent == pytest.approx(total / 5, rel=1e-5)
    assert abs(kl) < 1e-6


def test_kl_is_policy_to_base_not_base_to_policy(tiny_model_dir, tokenizer) -> None:
    """KL(π_θ ‖ π_base) weighs the log-ratio by the policy's probabilities. With the 0.05 noise
    of the test above the two directions agree to ~6e-5 relative, inside its 1e-4 tolerance, so
    KL(π_base ‖ π_θ) passed; moved 10x further they differ by tens of percent."""
    import torch

    from fastslow.slow import kl_and_entropy

    policy, base = _policy_and_base(tiny_model_dir, seed=0)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5 * torch.randn_like(p))
    prompts, completions = [[1, 2, 3, 4], [5, 6]], [[7, 8, 9], [10, 11]]
    forward = reverse = 0.0
    with torch.no_grad():
        for p, c in zip(prompts, completions, strict=True):
            ids = torch.tensor([p + c])
            lp = torch.log_softmax(policy(ids).logits[0, len(p) - 1: -1].float(), -1)
            lq = torch.log_softmax(base(ids).logits[0, len(p) - 1: -1].float(), -1)
            forward += float((lp.exp() * (lp - lq)).sum()) / 5
            reverse += float((lq.exp() * (lq - lp)).sum()) / 5
    assert abs(forward - reverse) > 0.1 * forward  # the directions are told apart
    kl, _ = kl_and_entropy(policy, base, tokenizer, prompts, completions, batch_size=2)
    assert kl == pytest.approx(forward, rel=1e-4)


def _policy_passes(monkeypatch, policy) -> list[tuple[int, int]]:
    """The KL passes over `policy` (not the base model), as `kl_and_entropy` makes them from now on:
    each as (rows, longest prompt + longest completion)."""
    from fastslow.slow import divergence

    passes: list[tuple[int, int]] = []
    real = divergence._completion_hidden

    def spy(model, prompts_, groups, pad):
        if model is policy:
            passes.append((sum(len(g) for g in groups),
                           max(len(p) for p in prompts_) + max(len(c) for g in groups for c in g)))
        return real(model, prompts_, groups, pad)

    monkeypatch.setattr(divergence, "_completion_hidden", spy)
    return passes


def test_kl_passes_hold_at_most_max_tokens_positions(tiny_model_dir, tokenizer, monkeypatch) -> None:
    """evaluation.divergence_tokens: each pass holds at most `max_tokens` positions (rows x
    (longest prompt + longest completion)), whole prompts while they fit, a prompt's
    completions split over passes when they do not fit together (and one completion alone when
    it does not fit at all); the numbers are those of the unbounded passes."""
    from fastslow.slow import divergence

    policy, base = _policy_and_base(tiny_model_dir, seed=1)
    long_prompt = list(range(1, 21))
    prompts = [[1, 2, 3], [1, 2, 3], [4, 5], long_prompt, long_prompt, long_prompt, [7, 8, 9, 10]]
    completions = [[11, 12], [13], [14, 15, 16], [17, 18, 19, 20], [21, 22], [23], list(range(30, 62))]
    passes = _policy_passes(monkeypatch, policy)
    whole = divergence.kl_and_entropy(policy, base, tokenizer, prompts, completions, batch_size=16)
    assert passes == [(7, 20 + 32)]
    passes.clear()
    bounded = divergence.kl_and_entropy(policy, base, tokenizer, prompts, completions, batch_size=16,
                                        max_tokens=48)
    assert bounded == pytest.approx(whole, rel=1e-4)
    assert passes == [(3, 3 + 3), (1, 4 + 32), (2, 20 + 4), (1, 20 + 1)]  # long prompt: 3 rows, 2 passes
    for max_tokens, batch_size in ((30, 16), (48, 2), (10**6, 3)):
        passes.clear()
        again = divergence.kl_and_entropy(policy, base, tokenizer, prompts, completions,
                                          batch_size=batch_size, max_tokens=max_tokens)
        assert again == pytest.approx(whole, rel=1e-4)
        assert sum(rows for rows, _ in passes) == 7
        assert all(rows <= batch_size and rows * width <= max_tokens for rows, width in passes if rows > 1)
        if max_tokens == 30:  # 4 + 32 > 30: that completion runs alone, over the bound (never cut)
            assert passes == [(3, 6), (1, 36), (1, 24), (1, 22), (1, 21)]


def test_kl_passes_fill_to_batch_size_and_to_max_tokens_exactly(tiny_model_dir, tokenizer, monkeypatch,
                                                                 caplog) -> None:
    """A pass takes prompts while its rows stay within `batch_size` and its positions within
    `max_tokens`, a pass of exactly `max_tokens` included; a prompt's completions are cut by the
    longest among them, not the last one's length (a 10-token completion and a 1-token one held
    2 x 30 positions under a bound of 48). The progress counts completions, not prompts."""
    import logging

    from fastslow.slow import divergence

    policy, base = _policy_and_base(tiny_model_dir, seed=2)
    passes = _policy_passes(monkeypatch, policy)
    prompts, completions = [[1, 2], [3, 4], [5, 6], [7, 8]], [[9, 10], [11, 12], [13, 14], [15, 16]]
    with caplog.at_level(logging.INFO, logger="fastslow.slow.divergence"):
        divergence.kl_and_entropy(policy, base, tokenizer, prompts, completions, batch_size=2, log_every=1)
    assert passes == [(2, 4), (2, 4)]
    assert [r.getMessage().split(" (")[0] for r in caplog.records if r.name == "fastslow.slow.divergence"] == [
        "KL/entropy: 2/4 completions", "KL/entropy: 4/4 completions"]
    passes.clear()
    divergence.kl_and_entropy(policy, base, tokenizer, prompts, completions, batch_size=16, max_tokens=8)
    assert passes == [(2, 4), (2, 4)]  # 2 rows x (2 + 2) = 8 positions: within the bound
    passes.clear()
    long_prompt = list(range(1, 21))
    divergence.kl_and_entropy(policy, base, tokenizer, [long_prompt] * 3, [list(range(30, 40)), [41], [42]],
                              batch_size=16, max_tokens=48)
    assert passes == [(1, 20 + 10), (2, 20 + 1)]


def test_kl_and_entropy_are_those_of_both_models_at_the_given_temperature(tiny_model_dir, tokenizer) -> None:
    """`temperature` divides both models' logits: KL(π_θ/T ‖ π_base/T) and the entropy of π_θ/T,
    which differ from the untempered numbers (every test called it at 1.0, so ignoring it,
    multiplying by it or tempering one model only went unseen)."""
    import torch

    from fastslow.slow import kl_and_entropy

    policy, base = _policy_and_base(tiny_model_dir, seed=3)
    prompts, completions = [[1, 2, 3, 4], [5, 6], [9]], [[7, 8, 9], [10, 11, 12, 13], [20, 21]]

    def direct(temperature: float) -> tuple[float, float]:
        kl_sum = ent_sum = 0.0
        with torch.no_grad():
            for p, c in zip(prompts, completions, strict=True):
                ids = torch.tensor([p + c])
                lp = torch.log_softmax(policy(ids).logits[0, len(p) - 1: -1].float() / temperature, -1)
                lq = torch.log_softmax(base(ids).logits[0, len(p) - 1: -1].float() / temperature, -1)
                kl_sum += float((lp.exp() * (lp - lq)).sum())
                ent_sum += float(-(lp.exp() * lp).sum())
        return kl_sum / 9, ent_sum / 9

    tempered, plain = direct(0.5), direct(1.0)
    assert abs(tempered[0] - plain[0]) > 0.5 * plain[0] and abs(tempered[1] - plain[1]) > 0.01 * plain[1]
    got = kl_and_entropy(policy, base, tokenizer, prompts, completions, batch_size=2, token_chunk=3,
                         temperature=0.5)
    assert got == pytest.approx(tempered, rel=1e-4)


def test_a_soft_capped_models_logits_are_capped_before_the_temperature_divides_them() -> None:
    """Gemma 2 caps its logits inside its forward; a sampler at temperature T divides those capped
    logits. Capping logits already divided by T gives other numbers (tested at T=1 only, so the
    order went unseen)."""
    import types

    import torch
    import transformers

    from fastslow.slow import kl_and_entropy

    config = transformers.Gemma2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=2, head_dim=8,
                                       final_logit_softcapping=0.5)
    torch.manual_seed(0)
    policy, base = transformers.Gemma2ForCausalLM(config).eval(), transformers.Gemma2ForCausalLM(config).eval()
    with torch.no_grad():  # logits well past the cap, where capping and dividing do not commute
        policy.lm_head.weight.mul_(20)
        base.lm_head.weight.mul_(20)
    prompts, completions, t = [[1, 2, 3], [4, 5]], [[6, 7, 8], [9, 10]], 0.5

    def direct(cap_first: bool) -> tuple[float, float]:
        kl = ent = 0.0
        with torch.no_grad():
            for p, c in zip(prompts, completions, strict=True):
                ids = torch.tensor([p + c])
                if cap_first:  # the models' own (capped) logits, then / T
                    lp, lq = (torch.log_softmax(m(ids).logits[0, len(p) - 1: -1].float() / t, -1)
                              for m in (policy, base))
                else:
                    raw = [m.lm_head(m.model(ids).last_hidden_state)[0, len(p) - 1: -1].float() / t
                           for m in (policy, base)]
                    lp, lq = (torch.log_softmax(torch.tanh(r / 0.5) * 0.5, -1) for r in raw)
                kl += float((lp.exp() * (lp - lq)).sum()) / 5
                ent += float(-(lp.exp() * lp).sum()) / 5
        return kl, ent

    right, wrong = direct(True), direct(False)
    assert abs(right[1] - wrong[1]) > 1e-2 * right[1]
    got = kl_and_entropy(policy, base, types.SimpleNamespace(pad_token_id=0), prompts, completions,
                         batch_size=2, temperature=t)
    assert got == pytest.approx(right, rel=1e-4)


def test_a_pass_width_counts_the_longest_completion_of_every_prompt_it_takes(tiny_model_dir, tokenizer,
                                                                           monkeypatch) -> None:
    """Prompts run shortest first; a later, longer prompt with a short completion widens the pass
    to its prompt plus the longest completion already taken (2 x (3 + 10) = 26 > 24), not its own."""
    from fastslow.slow import divergence

    policy, base = _policy_and_base(tiny_model_dir, seed=4)
    passes = _policy_passes(monkeypatch, policy)
    prompts, completions = [[1, 2], [3, 4, 5]], [list(range(10, 20)), [6]]
    whole = divergence.kl_and_entropy(policy, base, tokenizer, prompts, completions, batch_size=16)
    passes.clear()
    bounded = divergence.kl_and_entropy(policy, base, tokenizer, prompts, completions, batch_size=16,
                                        max_tokens=24)
    assert passes == [(1, 2 + 10), (1, 3 + 1)]
    assert bounded == pytest.approx(whole, rel=1e-4)


def test_a_model_without_a_decoder_backbone_is_refused_by_its_type() -> None:
    import types

    from fastslow.slow.divergence import _decoder

    class Bare:
        def get_decoder(self):
            return self

    with pytest.raises(TypeError, match=r"^Bare exposes no decoder backbone"):
        _decoder(Bare())
    with pytest.raises(TypeError, match=r"^SimpleNamespace exposes no decoder backbone"):
        _decoder(types.SimpleNamespace())


def test_kl_and_entropy_run_in_eval_mode_and_leave_each_models_mode_as_it_was() -> None:
    """A model handed over in training mode (dropout on) is measured without dropout, and each
    model goes back to the mode it came in: the policy to training, the base to eval."""
    import types

    import torch
    import transformers

    from fastslow.slow import kl_and_entropy

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, attention_dropout=0.5)
    policy, base = transformers.LlamaForCausalLM(config).eval(), transformers.LlamaForCausalLM(config).eval()
    prompts, completions = [[1, 2, 3, 4], [5, 6, 7]], [[8, 9, 10, 11], [12, 13, 14]]
    tokenizer = types.SimpleNamespace(pad_token_id=0)
    evaluated = kl_and_entropy(policy, base, tokenizer, prompts, completions, batch_size=2)
    assert not policy.training and not base.training  # eval in, eval out
    policy.train()
    assert kl_and_entropy(policy, base, tokenizer, prompts, completions, batch_size=2) == pytest.approx(
        evaluated, rel=1e-5)
    assert policy.training and not base.training


@pytest.mark.parametrize("fields, scale", [
    ({"lm_head_multiplier": 0.5}, 0.5),                              # Falcon-H1
    ({"output_multiplier": 3.0}, 3.0),
    ({"logits_scaling": 4.0, "model_type": "granite"}, 0.25),
    ({"logits_scaling": 4.0, "model_type": "hyperclovax"}, 4.0),     # multiplies by it
    ({"model_type": "llama"}, 1.0),
])
def test_logit_scale_reads_each_familys_own_field(fields: dict, scale: float) -> None:
    """The factor each family's forward multiplies its head's logits by (as TRL's fused head reads it)."""
    import types

    from fastslow.slow.divergence import logit_scale

    assert logit_scale(types.SimpleNamespace(**fields)) == scale


def test_evaluate_weights_samples_in_bf16_and_measures_kl_in_model_dtype(tiny_model_dir, monkeypatch) -> None:
    """evaluation.dtype: the sampler runs in its dtype, KL/entropy in the model's (bf16 log-probs
    would drown the KL of nearby checkpoints). The tokenizer is loaded once, by the sampler: the
    KL pass reads the one the samples were encoded with, and the prompts as the sampler encoded
    them (each prompt is encoded once, not again for the KL pass)."""
    import torch
    from slow_toys import LengthTask

    from fastslow import evaluate
    from fastslow.model import convert, generation
    from fastslow.model.generation import SamplingParams
    from fastslow.slow import divergence

    seen: dict[str, object] = {}
    real_make, real_kl, real_tokenizer = generation.make_generator, divergence.kl_and_entropy, convert.load_tokenizer
    tokenizers: list[object] = []

    def load_tokenizer(*args, **kwargs):
        tokenizers.append(args)
        return real_tokenizer(*args, **kwargs)

    monkeypatch.setattr(convert, "load_tokenizer", load_tokenizer)
    real_encode, encoded = generation.encode_prompts, []

    def encode_prompts(tokenizer, conversations, *args, **kwargs):
        encoded.extend(conversations)
        return real_encode(tokenizer, conversations, *args, **kwargs)

    monkeypatch.setattr(generation, "encode_prompts", encode_prompts)

    def make(*args, **kwargs):
        seen["sample"] = kwargs["dtype"]
        gen = real_make(*args, **kwargs)
        seen["sample_params"] = next(gen.model.parameters()).dtype
        return gen

    def kl(model, base, *args, **kwargs):
        seen["kl"] = next(model.parameters()).dtype
        return real_kl(model, base, *args, **kwargs)

    monkeypatch.setattr(generation, "make_generator", make)
    monkeypatch.setattr(divergence, "kl_and_entropy", kl)
    task = LengthTask()
    summary, rows = evaluate.evaluate_weights(tiny_model_dir, task, task.problems("val", 3, 0), "ctx", 2,
                                              SamplingParams(6, 1.0, 1.0, 0), dtype="float32",
                                              sample_dtype="bfloat16")
    assert seen == {"sample": "bfloat16", "sample_params": torch.bfloat16, "kl": torch.float32}
    assert len(tokenizers) == 1, tokenizers
    assert len(encoded) == 6  # 3 problems x 2 samples, by the sampler only
    assert len(rows) == 6 and summary["problems"] == 3 and summary["kl_to_base"] == 0.0
    assert summary["entropy"] > 0
    seen.clear()
    summary, rows = evaluate.evaluate_weights(tiny_model_dir, task, task.problems("val", 3, 0), "ctx", 2,
                                              SamplingParams(6, 1.0, 1.0, 0), divergence=False)
    assert "kl" not in seen and seen["sample"] == "float32"  # no KL/entropy pass at all
    assert math.isnan(summary["kl_to_base"]) and math.isnan(summary["entropy"])
    assert all("completion_ids" not in r for r in rows)


def test_native_bf16_is_read_from_the_cpu_flags(monkeypatch, tmp_path) -> None:
    """cpu_has_native_bf16 looks for avx512_bf16 or amx_bf16 among /proc/cpuinfo's flags (whole
    words: avx512_bf16x is not one), and says no when the file cannot be read."""
    from pathlib import Path

    from fastslow import hardware

    real_read = Path.read_text
    cpuinfo = {"text": ""}

    def read_text(self, *args, **kwargs):
        if str(self) == "/proc/cpuinfo":
            if cpuinfo["text"] is None:
                raise OSError("no /proc here")
            return cpuinfo["text"]
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    for text, expected in [
        ("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n", True),
        ("processor\t: 0\nflags\t\t: fpu avx512f amx_tile amx_bf16 amx_int8\n", True),
        ("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n", False),
        ("flags\t\t: avx512_bf16x\n", False),
        (None, False),
    ]:
        cpuinfo["text"] = text
        assert hardware.cpu_has_native_bf16() is expected, text


def test_bf16_auto_resolves_to_what_this_machine_has(monkeypatch) -> None:
    """slow.bf16: auto becomes a plain bool when the config is built: on with native bf16 (or a
    GPU), off without; anything but true/false/auto is a one-line error naming the value."""
    import torch

    from fastslow import hardware

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)
    assert SlowConfig(bf16="auto").bf16 is True
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: False)
    assert SlowConfig.from_dict({"bf16": "auto"}).bf16 is False
    assert SlowConfig(bf16=True).bf16 is True  # explicit values are kept (check_device judges them)
    with pytest.raises(ValueError, match="SlowConfig.bf16: expected true, false or 'auto', got 'yes'"):
        SlowConfig(bf16="yes")


# ---------------------------------------------------------------- GPU paths, on fakes


def test_a_visible_gpu_trains_there_with_or_without_bf16(monkeypatch, tmp_path) -> None:
    """TRL's use_cpu follows the machine, not the precision: a GPU job with bf16 off trains on
    the GPU in fp32 (it trained on the CPU); without a GPU everything stays on the CPU."""
    import torch
    import trl

    from fastslow.slow.trainer import grpo_args

    cfg = SlowConfig(num_generations=4, problems_per_step=2, bf16=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert grpo_args(cfg, 2, tmp_path).use_cpu is True
    assert grpo_args(SlowConfig(num_generations=4, problems_per_step=2, bf16=True), 2, tmp_path).use_cpu is True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # A GRPOConfig with use_cpu=False would look for the (absent) GPU: record its arguments only.
    monkeypatch.setattr(trl, "GRPOConfig", lambda **kwargs: kwargs)
    assert grpo_args(cfg, 2, tmp_path)["use_cpu"] is False


@pytest.mark.parametrize("on", [True, False])
def test_checkpointing_is_set_by_the_name_this_transformers_has(on, monkeypatch, tmp_path) -> None:
    """transformers >= 5.18 calls it activation_checkpointing and warns (FutureWarning, in every
    cycle job's log) when given the old name; the GPU pin set (< 5.18) has only the old name."""
    import warnings

    import transformers
    import trl

    from fastslow.slow.trainer import grpo_args

    cfg = SlowConfig(num_generations=4, problems_per_step=2, activation_checkpointing=on)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        args = grpo_args(cfg, 2, tmp_path)
    assert args.activation_checkpointing is on and args.gradient_checkpointing is on  # TRL's default: True

    @dataclasses.dataclass
    class Older:  # TrainingArguments before 5.18
        gradient_checkpointing: bool = False

    monkeypatch.setattr(transformers, "TrainingArguments", Older)
    monkeypatch.setattr(trl, "GRPOConfig", lambda **kwargs: kwargs)
    kwargs = grpo_args(cfg, 2, tmp_path)
    assert kwargs["gradient_checkpointing"] is on and "activation_checkpointing" not in kwargs


def test_the_loss_settings_are_stated_not_left_to_trls_defaults(tmp_path) -> None:
    """The GRPOConfig fields that change what a step trains on, as the paper's CISPO step needs
    them, whatever a TRL release makes their defaults (GRPO's loss_type default already moved)."""
    from fastslow.slow.trainer import grpo_args

    cfg = SlowConfig(num_generations=4, problems_per_step=2, micro_batch_size=2)
    args = grpo_args(cfg, 2, tmp_path)
    assert (args.loss_type, args.importance_sampling_level, args.num_iterations) == ("cispo", "token", 1)
    assert args.steps_per_generation == args.gradient_accumulation_steps == 4  # one generation a step
    assert args.mask_truncated_completions is False  # a truncated completion stays in the loss
    assert (args.top_entropy_quantile, args.entropy_coef, args.use_adaptive_entropy) == (1.0, 0.0, False)
    assert (args.delta, args.off_policy_mask_threshold, args.reward_weights) == (None, None, None)
    assert (args.min_p, args.repetition_penalty, args.top_k) == (None, 1.0, 0)
    assert args.use_bias_correction_kl is True
    assert (args.sync_ref_model, args.cast_lm_head_to_fp32, args.generation_kwargs) == (False, False, None)
    assert args.vllm_importance_sampling_clip_min is None


def test_the_configs_sampling_advantage_and_optimiser_settings_reach_trl(tmp_path) -> None:
    """`slow.scale_rewards`, `temperature`, `top_p`, `weight_decay` and Adam's betas, each away
    from its default: a mutation review replaced each with TRL's default and no test noticed, so a
    user's setting could have been dropped without a trace."""
    from fastslow.slow.trainer import grpo_args

    cfg = SlowConfig(num_generations=4, problems_per_step=2, micro_batch_size=2, scale_rewards="none",
                     temperature=0.7, top_p=0.9, weight_decay=0.05, adam_beta1=0.8, adam_beta2=0.95)
    args = grpo_args(cfg, 2, tmp_path)
    assert (args.scale_rewards, args.temperature, args.top_p) == ("none", 0.7, 0.9)
    assert (args.weight_decay, args.adam_beta1, args.adam_beta2) == (0.05, 0.8, 0.95)
    assert grpo_args(dataclasses.replace(cfg, scale_rewards="batch"), 2, tmp_path).scale_rewards == "batch"


def test_a_cycle_on_a_new_task_samples_its_first_steps_from_the_streams_start(tmp_path) -> None:
    """`cycle_step_problems` (the problems the fast round samples for the first RL steps under
    reuse) must read the data stream where `resume_point` starts it: at 0 for a continual run's
    first cycle on a new task (`new_data`), at the previous cycle's cursor otherwise. A mutation
    that ignored `new_data` survived: the round's samples would go unused and be drawn again."""
    import json

    from fastslow.slow.loop import STATE_FILE, cycle_step_problems, resume_point

    problems = [Problem(f"p{i}", "math", f"q{i}", str(i)) for i in range(10)]
    cfg = SlowConfig(num_generations=2, problems_per_step=2, micro_batch_size=2)
    state = tmp_path / "cycle0"
    (state / "trainer_state").mkdir(parents=True)
    (state / "trainer_state" / STATE_FILE).write_text(json.dumps({"cursor": 5, "global_step": 3,
                                                                  "problems_fingerprint": "elsewhere"}))
    fresh = cycle_step_problems(None, problems, cfg, steps=2)
    assert cycle_step_problems(state, problems, cfg, steps=2, new_data=True) == fresh
    _, _, cursor, _ = resume_point(tmp_path / "base", state, problems, new_data=True)
    assert cursor == 0
    later = cycle_step_problems(state, problems, cfg, steps=2)
    assert [p.id for p in later] == [problems[i].id for i in take_problems(10, cfg.seed, 5, 4)] != \
        [p.id for p in fresh]


def test_only_a_first_cycle_loaded_from_the_references_own_directory_starts_at_it(tmp_path) -> None:
    """`starts_at_reference`: a first cycle whose weights come from another directory than the
    KL reference's (the library's `ref_model_dir`) skipped the reference forward in a mutation,
    training and logging KL 0 against the wrong reference, and no test saw it."""
    from fastslow.slow.loop import starts_at_reference

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert starts_at_reference(None, tmp_path / "a", tmp_path / "a") is True
    assert starts_at_reference(None, tmp_path / "a", tmp_path / "a" / ".." / "a") is True
    assert starts_at_reference(None, tmp_path / "a", tmp_path / "b") is False
    assert starts_at_reference(str(tmp_path / "state.json"), tmp_path / "a", tmp_path / "a") is False


def test_vllm_context_is_the_longest_prompt_plus_the_completion_budget(tmp_path) -> None:
    """TRL's vllm_max_model_length (else vLLM reserves the model's whole context, 40960 tokens
    for Qwen3-8B) and the memory share vLLM may take, from the slow config."""
    from fastslow.slow.trainer import grpo_args

    cfg = SlowConfig(num_generations=4, problems_per_step=2, max_new_tokens=96, use_vllm=True,
                     vllm_gpu_memory_utilization=0.25)
    args = grpo_args(cfg, 2, tmp_path, max_prompt_tokens=700)
    assert args.vllm_max_model_length == 796 and args.vllm_gpu_memory_utilization == 0.25
    assert grpo_args(cfg, 2, tmp_path).vllm_max_model_length is None
    assert not args.vllm_enable_sleep_mode  # TRL's sleep mode only when asked for
    asleep = SlowConfig(num_generations=4, problems_per_step=2, use_vllm=True, vllm_enable_sleep_mode=True)
    assert grpo_args(asleep, 2, tmp_path).vllm_enable_sleep_mode
    with pytest.raises(ValueError, match="SlowConfig.vllm_enable_sleep_mode: expected true or false, got 'yes'"):
        SlowConfig(vllm_enable_sleep_mode="yes")
    plain = SlowConfig(num_generations=4, problems_per_step=2, max_new_tokens=96)
    assert grpo_args(plain, 2, tmp_path, max_prompt_tokens=700).vllm_max_model_length is None
    # The vLLM/trainer mismatch enters as CISPO's per-token weight min(rho, tau), not TRL's
    # default sequence mask at 3.
    assert (args.vllm_importance_sampling_correction, args.vllm_importance_sampling_mode,
            args.vllm_importance_sampling_clip_max) == (True, "token_truncate", cfg.epsilon_high)


class _FakeAccelerator:
    def __init__(self, num_processes: int, is_fsdp2: bool) -> None:
        self.num_processes, self.is_fsdp2 = num_processes, is_fsdp2
        self.no_sync_calls = 0

    def no_sync(self, model):
        import contextlib

        self.no_sync_calls += 1
        return contextlib.nullcontext()


@pytest.mark.parametrize("num_processes, fsdp2, expected", [(1, False, 0), (2, False, 2), (2, True, 0)])
def test_gradient_accumulation_skips_no_sync_under_fsdp2(num_processes: int, fsdp2: bool, expected: int) -> None:
    """DDP defers the all-reduce to the last of 3 micro batches (no_sync on the first 2); FSDP2's
    no_sync would keep every parameter's full unsharded gradient, so it reduce-scatters each."""
    from fastslow.slow.loop import _accumulation_context

    accelerator = _FakeAccelerator(num_processes, fsdp2)
    for i in range(3):
        with _accumulation_context(accelerator, object(), last=i == 2):
            pass
    assert accelerator.no_sync_calls == expected


def test_cycle_trains_fp32_master_weights_and_sizes_vllm(tiny_model_dir, tokenizer, tmp_path, monkeypatch) -> None:
    """A bf16 checkpoint (Qwen3's) trains with fp32 weights (and so fp32 AdamW state: lr-1e-6
    updates would round away in bf16); with vLLM the trainer gets the cycle's longest prompt."""
    import torch
    from slow_toys import LengthTask

    from fastslow.model.convert import load_model
    from fastslow.model.generation import encode_prompts
    from fastslow.slow import loop
    from fastslow.tasks.base import build_messages

    bf16_dir = tmp_path / "bf16"
    load_model(tiny_model_dir, dtype="bfloat16").save_pretrained(bf16_dir)
    tokenizer.save_pretrained(bf16_dir)
    seen: dict[str, object] = {}

    class Stop(Exception):
        pass

    def build_trainer(model, tok, cfg, num_contexts, reward, work_dir, num_processes=1, max_prompt_tokens=None):
        seen["dtypes"] = {p.dtype for p in model.parameters()}
        seen["max_prompt_tokens"] = max_prompt_tokens
        raise Stop

    monkeypatch.setattr(loop, "build_trainer", build_trainer)
    monkeypatch.setattr(loop, "check_device", lambda cfg: None)  # use_vllm on this CPU: only the sizing runs
    problems = [Problem(f"p{i}", "length", "Say the number " + "1" * (3 * i) + ".", str(i)) for i in range(6)]
    contexts = [("a", "Be brief."), ("b", "Think step by step, then give the answer in the format asked.")]
    cfg = SlowConfig(num_generations=2, problems_per_step=2, steps_per_cycle=2, use_vllm=True, seed=5)
    with pytest.raises(Stop):
        loop.run_cycle(bf16_dir, None, contexts, LengthTask(), problems, cfg, tmp_path / "out", "r", 0,
                       progress=False)
    assert seen["dtypes"] == {torch.float32}
    cycle = [problems[i] for i in take_problems(len(problems), 5, 0, 4)]
    assert len({p.id for p in cycle}) < len(problems)  # the cycle's problems only, not the set's longest
    expected = max(len(ids) for ids in encode_prompts(tokenizer, [build_messages(t, p) for p in cycle
                                                                  for _, t in contexts]))
    assert seen["max_prompt_tokens"] == expected
    with pytest.raises(Stop):  # without vLLM nothing is tokenised ahead
        loop.run_cycle(bf16_dir, None, contexts, LengthTask(), problems,
                       SlowConfig(num_generations=2, problems_per_step=2), tmp_path / "out2", "r", 0,
                       progress=False)
    assert seen["max_prompt_tokens"] is None


def test_kl_and_entropy_log_their_progress(tiny_model_dir, tokenizer, caplog) -> None:
    """The KL/entropy pass costs about as much as sampling: it says how far it is."""
    import logging

    from fastslow.model.convert import load_model
    from fastslow.slow.divergence import kl_and_entropy

    model = load_model(tiny_model_dir, dtype="float32")
    prompts = [[1, 2, 3 + i] for i in range(5)]
    completions = [[7, 8], [9], [10, 11, 12], [13], [14, 15]]
    with caplog.at_level(logging.INFO, logger="fastslow.slow.divergence"):
        kl_and_entropy(model, load_model(tiny_model_dir, dtype="float32"), tokenizer, prompts, completions,
                       batch_size=1, log_every=2)
        kl_and_entropy(model, model, tokenizer, prompts, completions, batch_size=1, log_every=5)
    lines = [r.getMessage() for r in caplog.records if r.name == "fastslow.slow.divergence"]
    assert [line.split(" (")[0] for line in lines] == [
        "KL/entropy: 2/5 completions", "KL/entropy: 4/5 completions", "KL/entropy: 5/5 completions",
        "entropy: 5/5 completions"]  # the base model against itself: no second forward, KL 0


def test_truncated_rows_are_those_whose_last_completion_token_is_no_eos() -> None:
    """A row's completion runs to its first EOS inclusive (`completion_mask`); a row cut at the
    length limit ends on another token. Any of the model's EOS ids ends a row (Qwen3 has two);
    padding after an EOS is not read."""
    import torch

    from fastslow.slow.loop import truncated_rows

    ids = torch.tensor([[5, 9, 2, 0], [5, 6, 7, 8], [2, 0, 0, 0], [5, 3, 0, 0], [4, 4, 4, 3]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    assert truncated_rows(ids, mask, [2, 3]) == [False, True, False, False, False]
    assert truncated_rows(ids, mask, [2]) == [False, True, False, True, True]
    # an empty completion (a reused rollout of no tokens) was not cut: its padding is no token of it
    empty = torch.tensor([[0, 0], [5, 6]]), torch.tensor([[0, 0], [1, 1]])
    assert truncated_rows(*empty, [2]) == [False, True]


def test_the_kl_metric_estimates_kl_of_the_policy_to_the_reference_on_its_own_samples() -> None:
    """`kl_to_base` (k3): exp(r) - r - 1 with r = log pi_ref - log pi_theta, masked. Only its sign
    had been tested (> 0), which the reversed direction passes too. On a two-token vocabulary
    the mean over pi_theta's own samples is the exact KL(pi_theta || pi_ref)."""
    import torch

    from fastslow.slow.loop import k3_terms

    logp, ref = torch.log(torch.tensor([[0.5, 0.5]])), torch.log(torch.tensor([[0.25, 0.75]]))
    terms = k3_terms(ref, logp, torch.tensor([[1.0, 0.0]]))
    assert terms[0].tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0])  # r = log 0.5: 0.193, masked 0
    # pi_theta = (0.5, 0.5), pi_ref = (0.25, 0.75): E_theta[k3] over both tokens is KL(theta || ref)
    exact = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert float((0.5 * k3_terms(ref, logp, torch.ones(1, 2))).sum()) == pytest.approx(exact)
    # the step's metric takes the reference from TRL's batch, the policy's from its own forward:
    # arguments swapped there read KL(ref || theta)'s terms, positive too
    from fastslow.slow.loop import base_kl_terms

    batch = {"ref_per_token_logps": ref.half()}  # TRL's dtype may be the model's: read as float32
    assert float((0.5 * base_kl_terms(batch, logp, torch.ones(1, 2))).sum()) == pytest.approx(exact, rel=1e-3)
    assert base_kl_terms({}, logp, torch.ones(1, 2)) is None  # beta = 0: no reference model


class _RunsCode:
    """A pickle that runs code when loaded (what a planted rng_state.pt could hold)."""

    def __reduce__(self):
        import os

        return (os.system, ("echo planted > planted.txt",))


def test_a_resumed_rng_state_unpickles_no_code(tmp_path, monkeypatch) -> None:
    """`rng_state*.pt` was loaded with `weights_only=False`: a file in a shared or copied results/
    tree ran any code when a cycle resumed from it. The state `_rng_state` saves still loads and
    puts every generator back."""
    import random

    import numpy as np
    import torch

    from fastslow.slow import loop

    monkeypatch.chdir(tmp_path)
    torch.save(loop._rng_state(), tmp_path / "rng_state.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    loop._set_rng_state(loop._load_rng_state(tmp_path / "rng_state.pt"))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    torch.save({"python": _RunsCode()}, tmp_path / "planted.pt")
    with pytest.raises(Exception, match="Weights only load failed"):
        loop._load_rng_state(tmp_path / "planted.pt")
    assert not (tmp_path / "planted.txt").exists()


def test_a_step_metric_outside_the_tables_schema_stops_at_its_step():
    """metrics.parquet has one schema for every method (records.METRIC_COLUMNS): a step's metric
    not in it raises as the row is made (`check_metrics`), not after the cycle trained, when the
    table is written; a row a method leaves short is completed with NaN, or None for a count."""
    from fastslow.records import METRIC_COLUMNS, check_metrics, complete_metrics

    with pytest.raises(KeyError, match=r"metrics \['kl_to_teacher'\] are not in fastslow.records.METRIC_COLUMNS"):
        check_metrics({"run": "r", "step": 0, "kl_to_teacher": 0.1})
    row = complete_metrics({"run": "r", "cycle": 0, "step": 1, "fast_seconds": 2.5})
    assert list(row) == list(METRIC_COLUMNS) and row["fast_seconds"] == 2.5
    assert math.isnan(row["reward_mean"]) and row["completion_tokens"] is None


def test_a_metrics_table_has_every_column_in_its_type_and_keeps_a_zero() -> None:
    """`metrics_frame`: a GEPA-only cycle's one row becomes a row of every METRIC_COLUMNS column
    in its type (counts Int64 and null, floats Float64 and NaN, `fast_seconds` a float), so one
    glob reads every method's files as one table; a measured 0 stays 0. `complete_metrics` checks
    the row too: a misspelt metric of a row no step checked is not dropped in silence."""
    import polars as pl

    from fastslow.records import METRIC_COLUMNS, complete_metrics, metrics_frame, polars_schema

    assert polars_schema({"a": "str", "b": "int64", "c": "float64", "d": "bool"}) == {
        "a": pl.String, "b": pl.Int64, "c": pl.Float64, "d": pl.Boolean}
    df = metrics_frame([{"run": "r", "cycle": 1, "step": 9, "fast_seconds": 2.5},
                        {"run": "r", "cycle": 1, "step": 10, "reward_mean": 0.0, "reused_rollouts": 0}])
    assert df.columns == list(METRIC_COLUMNS) and dict(df.schema) == polars_schema(METRIC_COLUMNS)
    assert (df.schema["completion_tokens"], df.schema["loss"]) == (pl.Int64, pl.Float64)
    assert df["fast_seconds"].to_list()[0] == 2.5 and df.schema["fast_seconds"] == pl.Float64
    assert df["completion_tokens"].to_list() == [None, None] and math.isnan(df["loss"][0])
    assert math.isnan(df["reward_mean"][0]) and df["reward_mean"][1] == 0.0 and df["reused_rollouts"][1] == 0
    with pytest.raises(KeyError, match=r"metrics \['fast_secs'\] are not in fastslow.records.METRIC_COLUMNS"):
        complete_metrics({"run": "r", "cycle": 0, "step": 0, "fast_secs": 1.0})


def test_the_rl_reward_reads_the_completion_tokens_not_trls_parsed_message(tokenizer) -> None:
    """TRL parses a completion into its message with the tokenizer's `response_template` when one
    is set (some hub tokenizers ship one), which can move a reasoning trace out of `content`: the
    reward then read the answer without its trace, and under a template that opens the trace
    itself ("<think>" + content) never closed one. The reward decodes the token ids instead, as
    our generators do; without a tokenizer it reads the message, as before."""
    from fastslow.slow.trainer import TaskReward
    from fastslow.tasks import get_task

    task, problem = get_task("math"), Problem("p", "math", "What is 3 + 4?", "7")
    ids = tokenizer("<think>maybe <answer>7</answer>? no.</think> <answer>8</answer>", add_special_tokens=False)
    ids = ids["input_ids"] + [tokenizer.eos_token_id]
    parsed = [[{"role": "assistant", "content": "<answer>7</answer>", "reasoning_content": "maybe 7? no."}]]
    reward = TaskReward(task, {"p": problem}, tokenizer=tokenizer)
    assert reward(prompts=[[]], completions=parsed, problem_id=["p"], completion_ids=[ids]) == [0.0]
    assert reward.last_texts == [tokenizer.decode(ids, skip_special_tokens=True)] and "<think>" in reward.last_texts[0]
    assert TaskReward(task, {"p": problem})(prompts=[[]], completions=parsed, problem_id=["p"],
                                            completion_ids=[ids]) == [1.0]  # the message's content
    cut = tokenizer("so 3 + 4 = 7, I write <answer>7</answer> and check", add_special_tokens=False)["input_ids"]
    opened = TaskReward(task, {"p": problem}, opener="<think>", tokenizer=tokenizer)
    assert opened(prompts=[[]], completions=[[{"role": "assistant", "content": ""}]], problem_id=["p"],
                  completion_ids=[cut]) == [0.0]  # a trace the template opened, cut off
    assert opened.last_texts[0].startswith("<think>so 3 + 4")
    # ...and without a tokenizer, the message's content gets the opener too
    message = [[{"role": "assistant", "content": "so 3 + 4 = 7, I write <answer>7</answer> and check"}]]
    assert TaskReward(task, {"p": problem}, opener="<think>")(prompts=[[]], completions=message,
                                                              problem_id=["p"]) == [0.0]
    assert TaskReward(task, {"p": problem})(prompts=[[]], completions=message, problem_id=["p"]) == [1.0]


def test_a_cycles_prompt_budget_covers_every_step_it_draws(tokenizer) -> None:
    """The context check and the vLLM engine's length read the longest prompt of all T*P problems
    the cycle at a data position draws (not only its first step's), under the longest context."""
    from fastslow.slow.loop import cycle_prompt_tokens
    from fastslow.slow.trainer import longest_prompt_tokens

    problems = [Problem(f"p{i}", "toy", " ".join(["word"] * (3 + 7 * i)), "0") for i in range(5)]
    contexts = [("a", "Short."), ("b", "A much longer context than the other one, by some words.")]
    cfg = SlowConfig(num_generations=4, problems_per_step=1, steps_per_cycle=3, seed=1)
    beyond_first = 0
    for cursor in range(10):
        drawn = take_problems(len(problems), cfg.seed, cursor, 3)
        want = max(longest_prompt_tokens(tokenizer, [problems[i]], contexts) for i in drawn)
        assert cycle_prompt_tokens(tokenizer, problems, contexts, cfg, cursor) == want, cursor
        beyond_first += want > longest_prompt_tokens(tokenizer, [problems[drawn[0]]], contexts)
    assert beyond_first, "no cycle whose longest prompt comes after its first step: the test could not fail"


def test_tied_groups_warn_from_the_threshold_on(caplog) -> None:
    """`warn_tied_groups` warns once a cycle's mean share of tied groups reaches TIED_WARNING."""
    import logging

    from fastslow.slow.loop import TIED_WARNING, warn_tied_groups

    def warned(share: float) -> bool:
        caplog.clear()
        rows = [{"frac_zero_std_groups": share, "reward_mean": 0.5, "answered_fraction": 1.0}] * 2
        with caplog.at_level(logging.WARNING, logger="fastslow.slow"):
            warn_tied_groups(rows, "slow r cycle 0")
        return any("little learning signal" in r.getMessage() for r in caplog.records)

    assert warned(TIED_WARNING) and warned(1.0)
    assert not warned(TIED_WARNING - 0.01)


def test_a_pool_with_a_repeated_context_id_is_refused_before_any_work(tiny_model_dir, tmp_path) -> None:
    from fastslow.slow.loop import run_cycle

    problems = [Problem(f"p{i}", "toy", f"question {i}", "0") for i in range(2)]
    cfg = SlowConfig(num_generations=4, problems_per_step=2, steps_per_cycle=1, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"context ids must be unique, got \['c0', 'c0'\]"):
        run_cycle(tiny_model_dir, None, [("c0", "A."), ("c0", "B.")], object(), problems, cfg,
                  tmp_path / "out", "r", 0, progress=False)
    assert not tmp_path.joinpath("out").exists()


@pytest.mark.parametrize("bf16", [False, True])
def test_sampling_ahead_runs_in_eval_mode_with_the_cache_and_restores_the_training_state(
        tiny_model_dir, tokenizer, monkeypatch, bf16: bool) -> None:
    """`sample_ahead` generates as an evaluation does (eval mode, KV cache on, bf16 autocast only
    under slow.bf16) and hands the trainer its model back as it was (training, no cache)."""
    import torch

    from fastslow.model import generation
    from fastslow.model.convert import load_model
    from fastslow.records import context_hash
    from fastslow.slow.loop import sample_ahead

    seen = []
    real = generation.HFGenerator.generate

    def spy(self, conversations, params):
        seen.append((self.model.training, self.model.config.use_cache, torch.is_autocast_enabled("cpu")))
        return real(self, conversations, params)

    monkeypatch.setattr(generation.HFGenerator, "generate", spy)
    model = load_model(tiny_model_dir, dtype="float32")
    model.train()
    model.config.use_cache = False
    problems = [Problem("p0", "toy", "question 0", "0")]
    contexts = [("c0", "Be brief.")]
    cfg = SlowConfig(num_generations=2, problems_per_step=1, max_new_tokens=2, bf16=bf16)
    left: dict = {}
    out = sample_ahead(model, tokenizer, [expand_rows(problems, contexts, 2)], left, {"c0": context_hash("Be brief.")},
                       {("p0", "c0"): (problems[0], "Be brief.")}, cfg, seed=0, sampled_at=3)
    assert seen == [(False, True, bf16)]
    assert model.training and model.config.use_cache is False
    assert out[2] == 2 and [r["sampled_at"] for r in left[(context_hash("Be brief."), "p0")]] == [3, 3]


def test_per_rank_batches_refuses_no_processes_by_name() -> None:
    from fastslow.slow.trainer import per_rank_batches

    cfg = SlowConfig(num_generations=4, problems_per_step=2)
    with pytest.raises(ValueError, match=r"^num_processes must be >= 1, got 0$"):
        per_rank_batches(cfg, 0)


@pytest.mark.parametrize("kind", ["deepspeed", "fsdp1", "fsdp2", "ddp"])
def test_prepare_wraps_ddp_and_fsdp2_and_refuses_deepspeed_and_fsdp1(kind: str) -> None:
    """DeepSpeed steps the optimiser inside backward() and FSDP1 is not FSDP2: both refused in one
    line before anything is wrapped. DDP wraps the model for the forward/backward only
    (`model_wrapped`); FSDP2's sharded model is the trainer's model too; the optimiser is the
    prepared one either way."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from fastslow.slow.trainer import prepare

    calls = []

    def fake_prepare(model, optimizer):
        calls.append((model, optimizer))
        return f"wrapped {model}", f"wrapped {optimizer}"

    distributed_type = {"deepspeed": DistributedType.DEEPSPEED, "fsdp1": DistributedType.FSDP,
                        "fsdp2": DistributedType.FSDP, "ddp": DistributedType.MULTI_CPU}[kind]
    accelerator = SimpleNamespace(distributed_type=distributed_type, is_fsdp2=kind == "fsdp2", prepare=fake_prepare)
    trainer = SimpleNamespace(accelerator=accelerator, model="model", optimizer="adam", model_wrapped="model")
    if kind in ("deepspeed", "fsdp1"):
        message = r"DeepSpeed \(zero3\.yaml\) is not supported" if kind == "deepspeed" else "FSDP1 is not supported"
        with pytest.raises(RuntimeError, match=rf"^slow loop: {message}"):
            prepare(trainer)
        assert calls == [] and (trainer.model, trainer.optimizer) == ("model", "adam")
        return
    prepare(trainer)
    assert calls == [("model", "adam")]
    assert (trainer.model_wrapped, trainer.optimizer) == ("wrapped model", "wrapped adam")
    assert trainer.model == ("wrapped model" if kind == "fsdp2" else "model")


def test_the_rl_reward_keeps_each_rows_feedback_on_its_own_problem_and_text() -> None:
    """`TaskReward` records, row by row, the text (with the opener), the reward and the task's
    feedback on that row's problem and text: the rollout table's `feedback` column (and GEPA's
    reflection) reads `last_feedback`; a mutation that asked for feedback on an empty completion
    survived every test."""
    from fastslow.slow.trainer import TaskReward

    class Echo:
        def reward(self, problem: Problem, text: str) -> float:
            return float(problem.answer in text)

        def feedback(self, problem: Problem, text: str) -> str:
            return f"{problem.id} read {text!r}"

    problems = {p.id: p for p in (Problem("p0", "toy", "q0", "0"), Problem("p1", "toy", "q1", "1"))}
    reward = TaskReward(Echo(), problems, opener="> ")
    message = [[{"role": "assistant", "content": c}] for c in ("say 1", "say 0", "say 1")]
    assert reward(prompts=[[]] * 3, completions=message, problem_id=["p1", "p1", "p0"]) == [1.0, 0.0, 0.0]
    assert reward.last_texts == ["> say 1", "> say 0", "> say 1"]
    assert reward.last_rewards == [1.0, 0.0, 0.0]
    assert reward.last_feedback == ["p1 read '> say 1'", "p1 read '> say 0'", "p0 read '> say 1'"]


def test_a_baseline_without_an_advantage_group_is_refused_by_name(tmp_path) -> None:
    """A baseline name SlowConfig accepted but `grpo_args` has no group for (a new entry of
    BASELINES) fails in one line naming it, not with a bare KeyError."""
    from fastslow.slow.trainer import grpo_args

    cfg = SlowConfig(num_generations=4, problems_per_step=2)
    cfg.baseline = "context"  # past SlowConfig's own check, as a new BASELINES entry would be
    with pytest.raises(ValueError, match=r"^slow\.baseline: 'context' has no advantage group in "
                                         r"fastslow\.slow\.trainer\.grpo_args$"):
        grpo_args(cfg, 2, tmp_path)
    cfg.baseline = "prompt"
    assert grpo_args(cfg, 2, tmp_path).num_generations == 2 and grpo_args(cfg, 1, tmp_path).num_generations == 4
