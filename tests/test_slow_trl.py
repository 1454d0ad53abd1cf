"""The slow loop's use of TRL: advantage grouping by baseline, and the CISPO loss by hand.

Both go through TRL's own code (`_generate_and_score_completions`, `compute_loss`) on the tiny
model, so a TRL upgrade that changes grouping or normalisation fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from decoding_probes import decoded_rows, decoding_masks

from fastslow.slow import SlowConfig, expand_rows
from fastslow.slow.trainer import build_trainer
from fastslow.tasks.base import Problem

PROBLEMS = [Problem(f"p{i}", "toy", f"question {i}", "0") for i in range(2)]
CONTEXTS = [("a", "context A"), ("b", "context B")]
# Scripted rewards of the 2 problems x 4 rollouts (2 per context), in row order.
SCRIPT = {("p0", "a"): [1.0, 0.0], ("p0", "b"): [1.0, 1.0],
          ("p1", "a"): [0.0, 0.0], ("p1", "b"): [0.0, 1.0]}


def _trainer(tiny_model_dir, tokenizer, tmp_path, reward: Any, **overrides: Any) -> Any:
    from fastslow.model.convert import load_model

    cfg = SlowConfig(**{"num_generations": 4, "problems_per_step": 2, "max_new_tokens": 4,
                        "lr": 1e-3, "warmup_steps": 0, **overrides})
    return build_trainer(load_model(tiny_model_dir, dtype="float32"), tokenizer, cfg,
                         len(CONTEXTS), reward, tmp_path)


def scripted_reward(prompts: list, completions: list, problem_id: list[str],
                    context_id: list[str], **_: Any) -> list[float]:
    seen: dict[tuple[str, str], int] = {}
    out = []
    for prompt, pid, cid in zip(prompts, problem_id, context_id, strict=True):
        # Each copy really carries its own context as the system prompt.
        assert prompt[0] == {"role": "system", "content": dict(CONTEXTS)[cid]}
        i = seen.get((pid, cid), 0)
        seen[(pid, cid)] = i + 1
        out.append(SCRIPT[(pid, cid)][i])
    return out


@pytest.mark.parametrize("baseline, expected, zero_std_groups", [
    # One group of G=4 per problem, across contexts. p0: r=[1,0,1,1], mean .75, sample std .5;
    # p1: r=[0,0,0,1], mean .25, std .5. A = (r - mean) / (std + 1e-4).
    ("problem", [0.5, -1.5, 0.5, 0.5, -0.5, -0.5, -0.5, 1.5], 0.0),
    # One group of G/K=2 per (problem, context): [1,0] -> ±1/sqrt(2); [1,1], [0,0] -> 0.
    ("prompt", [0.70711, -0.70711, 0.0, 0.0, 0.0, 0.0, -0.70711, 0.70711], 0.5),
])
def test_advantages_grouped_by_baseline(tiny_model_dir, tokenizer, tmp_path, baseline: str,
                                        expected: list[float], zero_std_groups: float) -> None:
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, scripted_reward, beta=0.0,
                       baseline=baseline)
    trainer.model.train()
    batch = trainer._generate_and_score_completions(expand_rows(PROBLEMS, CONTEXTS, 4))
    assert batch["advantages"].tolist() == pytest.approx(expected, abs=3e-4)
    assert trainer._metrics["train"]["frac_reward_zero_std"][-1] == pytest.approx(zero_std_groups)


def test_cispo_loss_matches_hand_computation(tiny_model_dir, tokenizer, tmp_path) -> None:
    """loss = Σ_tokens mask·[−sg(min(ρ, τ))·A·log π + β·ρ·k3] / Σ mask  (TRL 1.16, cispo).

    Normalisation: the token sum of the whole step's P·G rollouts divided by their total number
    of completion tokens (`num_items_in_batch`), i.e. a token-level mean, not a per-sequence one.
    k3 = exp(ref − log π) − (ref − log π) − 1 is TRL's KL estimator, multiplied by the
    (differentiable) ratio ρ: TRL's default `use_bias_correction_kl=True`, the unbiased
    reverse-KL gradient. On-policy (our CPU path) ρ = 1 in value.
    """
    import torch

    tau, beta = 1.5, 0.04
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, scripted_reward, beta=beta,
                       epsilon_high=tau)
    model = trainer.model
    model.train()
    prompt_ids = torch.tensor([[0, 11, 12], [21, 22, 23]])
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])  # left padding, as TRL builds it
    completion_ids = torch.tensor([[31, 32, 33, 34], [41, 42, 0, 0]])
    completion_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    advantages = torch.tensor([1.0, -0.5])
    ratios = torch.tensor([[0.5, 1.0, 2.0, 8.0], [3.0, 0.25, 1.0, 1.0]])  # ρ = π/π_old

    def policy_logps() -> torch.Tensor:
        ids = torch.cat([prompt_ids, completion_ids], 1)
        logits = model(input_ids=ids, attention_mask=torch.cat([prompt_mask, completion_mask], 1)).logits
        logp = torch.log_softmax(logits[:, 2:-1].float(), -1)
        return logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)

    with torch.no_grad():
        logp0 = policy_logps()
    ref = logp0 + torch.tensor([[0.3, -0.2, 0.1, 0.0], [-0.4, 0.2, 0.0, 0.0]])
    batch = {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
        "completion_ids": completion_ids, "completion_mask": completion_mask,
        "advantages": advantages, "num_items_in_batch": completion_mask.sum(),
        "old_per_token_logps": logp0 - ratios.log(), "ref_per_token_logps": ref,
    }
    loss = trainer.compute_loss(model, batch)
    loss.backward()
    trl_grad = model.get_input_embeddings().weight.grad.clone()
    model.zero_grad()

    logp = policy_logps()
    rho = torch.exp(logp - batch["old_per_token_logps"])  # = ratios in value, with a gradient
    weight = rho.detach().clamp(max=tau)  # sg(min(ρ, τ)): no gradient through the weight
    k3 = torch.exp(ref - logp) - (ref - logp) - 1
    per_token = -weight * advantages[:, None] * logp + beta * rho * k3
    hand = (per_token * completion_mask).sum() / completion_mask.sum()
    hand.backward()
    hand_grad = model.get_input_embeddings().weight.grad.clone()

    # Spelled out for the first token: −min(0.5, 1.5)·1.0·log π + 0.04·0.5·k3(0.3).
    first = -0.5 * logp0[0, 0] + beta * 0.5 * (torch.exp(torch.tensor(0.3)) - 0.3 - 1)
    assert float(per_token[0, 0].detach()) == pytest.approx(float(first), rel=1e-5)
    assert float(loss.detach()) == pytest.approx(float(hand.detach()), rel=1e-5)
    assert torch.allclose(trl_grad, hand_grad, rtol=1e-4, atol=1e-7)
    assert trl_grad.abs().sum() > 0
    # Clipped = ρ > τ with A > 0: tokens 3 and 4 of row 0, out of 6 completion tokens.
    assert trainer._metrics["train"]["cispo_clip_ratio"][-1] == pytest.approx(2 / 6)


def test_rollouts_share_the_prompt_prefill(tiny_model_dir, tokenizer, tmp_path) -> None:
    """A step's G/K copies of each prompt are prefilled once, in generation and in the KL
    reference forward: same rollouts (same seed) and reference log-probs as TRL's plain path,
    with fewer prompt positions through the policy and through the reference model."""
    import torch

    def constant(prompts: list, **_: Any) -> list[float]:
        return [0.0] * len(prompts)

    outs, refs, positions = [], [], []
    for share in (True, False):
        trainer = _trainer(tiny_model_dir, tokenizer, tmp_path / str(share), constant, beta=0.01)
        trainer.share_prefill = share
        seen: dict[str, list[int]] = {"policy": [], "ref": []}

        def count(_m: Any, _a: Any, kw: dict, seen: list[int]) -> None:
            if kw.get("input_ids") is not None:
                seen.append(kw["input_ids"].numel())

        hooks = [model.register_forward_pre_hook(lambda m, a, kw, s=seen[name]: count(m, a, kw, s), with_kwargs=True)
                 for name, model in (("policy", trainer.model), ("ref", trainer.ref_model))]
        torch.manual_seed(0)
        try:
            batch = trainer._generate_and_score_completions(expand_rows(PROBLEMS, CONTEXTS, 4))
        finally:
            for hook in hooks:
                hook.remove()
        assert "generate" not in vars(trainer.model)  # the class method again
        outs.append(batch["completion_ids"].tolist())
        refs.append(batch["ref_per_token_logps"])
        positions.append({name: sum(v) for name, v in seen.items()})
    assert outs[0] == outs[1]
    assert torch.allclose(refs[0], refs[1], atol=1e-5) and refs[0].abs().sum() > 0
    assert positions[0]["policy"] < positions[1]["policy"]
    assert 0 < positions[0]["ref"] < positions[1]["ref"]


def test_rollouts_decode_only_unstopped_rows(tiny_model_dir, tokenizer, tmp_path) -> None:
    """TRL's generation through our path drops rows that stopped (`generate_compacting`): fewer
    rows decoded; until the first drop the same tokens as one generate() call (the same random
    stream), and every completion ends at its first stop token or at the length limit. Every
    decoding step has an attention mask, though no prompt is padded."""
    import torch

    def constant(prompts: list, **_: Any) -> list[float]:
        return [0.0] * len(prompts)

    rows = expand_rows(PROBLEMS, CONTEXTS, 4)
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, constant, beta=0.0, max_new_tokens=12)

    def rollout(compact: bool) -> tuple[list[list[int]], int]:
        trainer.compact_generation = compact
        (decoded, counting), (masks, masking) = decoded_rows(trainer.model), decoding_masks(trainer.model)
        torch.manual_seed(0)
        try:
            batch = trainer._generate_and_score_completions(rows)
        finally:
            counting.remove()
            masking.remove()
        # the 4 prompts are unpadded (equal lengths); decoding keeps a mask (`masked_decoding`)
        assert masks and all(masks)
        ids, mask = batch["completion_ids"], batch["completion_mask"]
        return [r[m.bool()].tolist() for r, m in zip(ids, mask, strict=True)], sum(decoded)

    free, _ = rollout(False)
    # Stop tokens that end the rows at different depths (the random model's EOS is too rare).
    stops = sorted({c[2 + i % 7] for i, c in enumerate(free)})
    trainer.eos_token_ids = stops
    trainer.generation_config.eos_token_id = stops
    plain, plain_rows = rollout(False)
    ours, our_rows = rollout(True)
    lengths = [len(c) for c in plain]
    assert len(set(lengths)) >= 3  # ragged
    assert our_rows < plain_rows
    first_end = min(lengths)  # no row is dropped before the first row stops
    assert [c[:first_end] for c in ours] == [c[:first_end] for c in plain]
    for c in ours:
        ends = [i for i, t in enumerate(c) if t in stops]
        assert ends == [len(c) - 1] or (not ends and len(c) == 12)


@pytest.mark.parametrize("bf16", [False, True])
def test_reference_logprobs_share_the_prompt_forward(tiny_model_dir, tokenizer, tmp_path, bf16: bool) -> None:
    """The KL reference forward runs each distinct prompt once (its G/K copies share it): the
    same per-token log-probs as TRL's row-by-row forward, with fewer positions through the model.
    Rows: 3 prompts (left-padded, one repeated 3 times, one twice, one alone), ragged completions."""
    import torch

    from fastslow.slow.trainer import shared_prefix_logps

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, scripted_reward, beta=0.01, bf16=bf16)
    ref, vocab = trainer.ref_model, trainer.ref_model.config.vocab_size
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, vocab, (n,), generator=g) for n in (9, 6, 4)]
    which = [0, 0, 1, 0, 2, 1]  # the prompt of each row
    width, keep = 9, 5
    ids = torch.zeros(len(which), width + keep, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(which):
        n = len(prompts[p])
        ids[r, width - n:width] = prompts[p]  # left padding
        mask[r, width - n:width] = 1
        done = keep - r % 3  # completions end at different lengths (right padding)
        ids[r, width:width + done] = torch.randint(3, vocab, (done,), generator=g)
        mask[r, width:width + done] = 1
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else None
    results = []
    for share in (True, False):
        trainer.share_prefill = share
        seen: list[int] = []

        def count(_m: Any, _a: Any, kw: dict, seen: list[int] = seen) -> None:
            seen.append(kw["input_ids"].numel())

        hook = ref.register_forward_pre_hook(count, with_kwargs=True)
        try:
            with torch.no_grad(), (autocast() if autocast else torch.autocast("cpu", enabled=False)):
                logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
                    ref, ids, mask, keep, batch_size=2, num_images=None, num_tiles=None)
        finally:
            hook.remove()
        assert entropies is None
        results.append((logps, sum(seen)))
    (shared, n_shared), (full, n_full) = results
    assert shared.shape == full.shape == (len(which), keep)
    # The same sums in another order (measured: 1e-6 in fp32, 0 under bf16 autocast). Counting
    # positions from the attention mask instead, as generate() does, moves them by 1e-3.
    assert torch.allclose(shared, full, atol=1e-4 if bf16 else 1e-5), (shared - full).abs().max()
    assert shared.abs().sum() > 0
    # on CPU the 3 distinct prompts run alone, unpadded (all but the last token: 8 + 5 + 3
    # positions), then 6 rows of 1 + 5 positions, against TRL's 6 rows of 14
    assert (n_shared, n_full) == (8 + 5 + 3 + 6 * (1 + keep), 6 * (width + keep))
    # as one padded batch (a GPU's way): 3 prompts of 8 positions, the same log-probs
    seen = []
    hook = ref.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw["input_ids"].numel()), with_kwargs=True)
    try:
        with torch.no_grad(), (autocast() if autocast else torch.autocast("cpu", enabled=False)):
            batched, _ = shared_prefix_logps(ref, ids, mask, keep, batch_size=2, alone=False)
    finally:
        hook.remove()
    assert torch.allclose(batched, full, atol=1e-4 if bf16 else 1e-5), (batched - full).abs().max()
    assert sum(seen) == 3 * (width - 1) + 6 * (1 + keep)
    with torch.no_grad():  # nothing repeats: nothing to share, TRL's forward runs instead
        assert shared_prefix_logps(ref, ids[[0, 2, 4]], mask[[0, 2, 4]], keep) is None


def test_loss_forward_shares_the_prompt_within_a_micro_batch(tiny_model_dir, tokenizer, tmp_path) -> None:
    """Micro batches of 2 rows hold the 2 copies of one (context, problem) prompt: the loss
    forward runs that prompt once, with the log-probs, entropies and gradients of every
    parameter of TRL's row-by-row forward."""
    import torch
    from trl.trainer.utils import split_tensor_dict

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, scripted_reward, beta=0.01, micro_batch_size=2)
    model = trainer.model
    model.train()
    torch.manual_seed(0)
    # prompts of different lengths: the shorter ones are left-padded (run alone, unpadded, on CPU)
    problems = [PROBLEMS[0], Problem("p1", "toy", "a longer question, number 1, in more words", "0")]
    batch = trainer._generate_and_score_completions(expand_rows(problems, CONTEXTS, 4))
    assert batch["advantages"].abs().sum() > 0
    assert (batch["prompt_mask"] == 0).any()
    results = []
    for share in (True, False):
        trainer.share_prefill = share
        trainer.reset_step_stats()
        seen: list[int] = []
        hook = model.register_forward_pre_hook(lambda _m, _a, kw, seen=seen: seen.append(kw["input_ids"].numel()),
                                               with_kwargs=True)
        try:
            for micro in split_tensor_dict(batch, 4):
                trainer.compute_loss(model, micro).backward()
        finally:
            hook.remove()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        logps = torch.cat([lp for lp, _ in trainer.stash])
        entropies = torch.cat([e for _, e in trainer.stash])
        results.append((grads, logps, entropies, sum(seen)))
    (grads_s, logp_s, ent_s, n_s), (grads_f, logp_f, ent_f, n_f) = results
    assert torch.allclose(logp_s, logp_f, atol=1e-5) and torch.allclose(ent_s, ent_f, atol=1e-5)
    prompt, completion = batch["prompt_ids"].shape[1], batch["completion_ids"].shape[1]
    assert n_f == 8 * (prompt + completion)
    # 4 distinct prompts, once each and unpadded (all but their last token), then every row's tail
    assert n_s == int(batch["prompt_mask"][::2].sum()) - 4 + 8 * (1 + completion)
    assert grads_s.keys() == grads_f.keys() and grads_s
    for name, g in grads_s.items():
        assert torch.allclose(g, grads_f[name], atol=1e-6), name
    assert sum(float(g.abs().sum()) for g in grads_s.values()) > 0


@pytest.mark.parametrize("problems_per_step, generations, micro", [
    (2, 4, 2),  # each prompt's 4 copies fill two micro batches of 2
    (3, 2, 3),  # [A A B] [B C C]: the first micro batch holds two prompts, one of them spanning both
])
def test_a_prompt_spanning_micro_batches_runs_forward_and_backward_once(tiny_model_dir, tokenizer, tmp_path,
                                                                         problems_per_step: int, generations: int,
                                                                         micro: int) -> None:
    """RL-only (one context), a prompt's copies spread over micro batches. With the step's
    `PromptGradients` (as `_rl_step` sets it) each prompt's forward runs once for all of them,
    and one backward sends the micro batches' summed gradient through it: log-probs, entropies
    and every parameter's gradient equal TRL's row-by-row forward's."""
    import torch
    from trl.trainer.utils import split_tensor_dict

    from fastslow.slow.trainer import PromptGradients

    rows = problems_per_step * generations
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path,
                       lambda completions, **_: [float(i % 3 == 0) for i in range(len(completions))],
                       beta=0.01, micro_batch_size=micro, num_generations=generations,
                       problems_per_step=problems_per_step)
    model = trainer.model
    model.train()
    torch.manual_seed(0)
    problems = [Problem(f"p{i}", "toy", "question " + "in more words " * i, "0") for i in range(problems_per_step)]
    batch = trainer._generate_and_score_completions(expand_rows(problems, CONTEXTS[:1], generations))
    assert (batch["prompt_mask"] == 0).any() and batch["advantages"].abs().sum() > 0
    micro_rows = [range(i, i + micro) for i in range(0, rows, micro)]
    micros = split_tensor_dict(batch, len(micro_rows))
    heads = range(0, rows, generations)  # each prompt's first row
    results = {}
    for mode in ("once", "per_micro_batch", "trl"):
        trainer.share_prefill = mode != "trl"
        trainer.reset_step_stats()
        prompts = PromptGradients(PromptGradients.counts(micros))
        assert sum(prompts.uses.values()) > len(heads)  # some prompt spans micro batches
        trainer.prompt_grads = prompts if mode == "once" else None
        seen: list[int] = []
        hook = model.register_forward_pre_hook(lambda _m, _a, kw, seen=seen: seen.append(kw["input_ids"].numel()),
                                               with_kwargs=True)
        try:
            for part in micros:
                trainer.compute_loss(model, part).backward()
                prompts.backward_done()
        finally:
            hook.remove()
            trainer.prompt_grads = None
        if mode == "once":
            assert prompts.forwards == len(heads) and not prompts.kv  # each prompt run once, all released
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        results[mode] = (grads, torch.cat([lp for lp, _ in trainer.stash]), torch.cat([e for _, e in trainer.stash]),
                         sum(seen))
    completion = batch["completion_ids"].shape[1]
    prompt_tokens = {h: int(batch["prompt_mask"][h].sum()) - 1 for h in heads}  # unpadded, all but the last
    assert results["once"][3] == sum(prompt_tokens.values()) + rows * (1 + completion)
    per_micro = sum(prompt_tokens[r - r % generations] for part in micro_rows
                    for r in {r - r % generations for r in part})
    assert results["per_micro_batch"][3] == per_micro + rows * (1 + completion) > results["once"][3]
    grads_o, logp_o, ent_o, _ = results["once"]
    for mode in ("per_micro_batch", "trl"):
        grads, logp, ent, _ = results[mode]
        assert torch.allclose(logp_o, logp, atol=1e-5) and torch.allclose(ent_o, ent, atol=1e-5)
        assert grads_o.keys() == grads.keys() and grads_o
        for name, g in grads_o.items():
            assert torch.allclose(g, grads[name], atol=1e-6), (mode, name)
    assert sum(float(g.abs().sum()) for g in grads_o.values()) > 0


@pytest.mark.parametrize("problems_per_step, generations, micro", [(2, 4, 2), (3, 2, 3)])
def test_activation_checkpointing_recomputes_the_shared_prompt_forward(tiny_model_dir, tokenizer, tmp_path,
                                                                       problems_per_step: int, generations: int,
                                                                       micro: int) -> None:
    """Under `activation_checkpointing` the loss forward still runs each prompt once for all its
    micro batches, with its decoder layers recomputed in the backward (`layer_recompute`): the
    log-probs, entropies and every parameter's gradient of the same forward without
    checkpointing and of TRL's own checkpointed row-by-row forward, the same positions through
    the model as without checkpointing, and a fraction of the activations kept for the backward."""
    import torch
    from trl.trainer.utils import split_tensor_dict

    from fastslow.slow.trainer import PromptGradients

    rows = problems_per_step * generations
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path,
                       lambda completions, **_: [float(i % 3 == 0) for i in range(len(completions))],
                       beta=0.01, micro_batch_size=micro, num_generations=generations,
                       problems_per_step=problems_per_step, activation_checkpointing=True)
    model = trainer.model
    model.train()
    assert model.is_gradient_checkpointing and trainer.args.gradient_checkpointing
    torch.manual_seed(0)
    problems = [Problem(f"p{i}", "toy", "question " + "in more words " * (16 + i), "0")
                for i in range(problems_per_step)]
    batch = trainer._generate_and_score_completions(expand_rows(problems, CONTEXTS[:1], generations))
    assert batch["advantages"].abs().sum() > 0
    micros = split_tensor_dict(batch, rows // micro)
    weights = {p.data_ptr() for p in model.parameters()}
    results = {}
    for mode in ("recomputed", "kept", "trl"):
        trainer.share_prefill = mode != "trl"
        trainer.args.gradient_checkpointing = mode != "kept"
        if mode == "kept":
            model.gradient_checkpointing_disable()
        trainer.reset_step_stats()
        prompts = PromptGradients(PromptGradients.counts(micros))
        trainer.prompt_grads = prompts if mode != "trl" else None
        seen: list[int] = []
        saved = [0]

        def pack(t: Any, saved: list[int] = saved, weights: set[int] = weights) -> Any:
            if t.data_ptr() not in weights:  # activations kept outside a recomputed layer
                saved[0] += t.numel() * t.element_size()
            return t

        hook = model.register_forward_pre_hook(lambda _m, _a, kw, seen=seen: seen.append(kw["input_ids"].numel()),
                                               with_kwargs=True)
        try:
            for part in micros:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    loss = trainer.compute_loss(model, part)
                loss.backward()
                prompts.backward_done()
        finally:
            hook.remove()
            trainer.prompt_grads = None
        if mode != "trl":
            assert prompts.forwards == problems_per_step and not prompts.kv  # each prompt once, all released
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        results[mode] = (grads, torch.cat([lp for lp, _ in trainer.stash]),
                         torch.cat([e for _, e in trainer.stash]), sum(seen), saved[0])
    grads_r, logp_r, ent_r, seen_r, saved_r = results["recomputed"]
    assert seen_r == results["kept"][3] < results["trl"][3]
    assert saved_r < results["kept"][4] / 2, (saved_r, results["kept"][4])
    for mode in ("kept", "trl"):
        grads, logp, ent, _, _ = results[mode]
        assert torch.allclose(logp_r, logp, atol=1e-5) and torch.allclose(ent_r, ent, atol=1e-5)
        assert grads_r.keys() == grads.keys() and grads_r
        for name, g in grads_r.items():
            assert torch.allclose(g, grads[name], atol=1e-6), (mode, name)
    assert sum(float(g.abs().sum()) for g in grads_r.values()) > 0


@pytest.mark.parametrize("transformers_layers", ["5.18+", "older"])
def test_a_checkpointed_prompt_forward_as_one_padded_batch_gives_the_same_gradients(tiny_model_dir, tokenizer,
                                                                                    tmp_path, monkeypatch,
                                                                                    transformers_layers) -> None:
    """A GPU's way (`alone=False`: the distinct prompts as one padded batch into one cache) under
    checkpointing: each layer recomputed in the backward, the gradients of every parameter those
    of the same forward with its activations kept. "older": transformers < 5.18 (the GPU pin set)
    checkpoints in the layer's `__call__` (its code, as 5.17 has it), not in its class's forward."""
    import functools

    import torch
    from torch import nn
    from transformers.modeling_layers import GradientCheckpointingLayer

    from fastslow.slow.trainer import decoder_layers, shared_prefix_logps

    if transformers_layers == "older":
        def call(self, *args, **kwargs):  # transformers 5.17's GradientCheckpointingLayer.__call__, its warning left out
            if self.gradient_checkpointing and self.training:
                if kwargs.get("use_cache"):
                    kwargs["use_cache"] = False
                if not self._can_checkpoint_with_cache and kwargs.get("past_key_values") is not None:
                    kwargs["past_key_values"] = None
                return self._gradient_checkpointing_func(functools.partial(nn.Module.__call__, self, **kwargs), *args)
            return nn.Module.__call__(self, *args, **kwargs)

        monkeypatch.setattr(GradientCheckpointingLayer, "__call__", call)
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, scripted_reward, beta=0.0, activation_checkpointing=True)
    model = trainer.model
    model.train()
    if transformers_layers == "older":  # ... and its layers' forward unwrapped
        for layer_class in {type(layer) for layer in decoder_layers(model)}:
            monkeypatch.setattr(layer_class, "forward", layer_class.forward.__wrapped__)
    g = torch.Generator().manual_seed(7)
    vocab = model.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=g) for n in (9, 6)]
    width, keep = 9, 4
    ids = torch.zeros(4, width + keep, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate([0, 1, 0, 1]):
        n = len(prompts[p])
        ids[r, width - n:width], mask[r, width - n:width] = prompts[p], 1
        ids[r, width:] = torch.randint(3, vocab, (keep,), generator=g)
        mask[r, width:] = 1
    grads = []
    for checkpoint in (True, False):
        if not checkpoint:
            model.gradient_checkpointing_disable()
        logps, _ = shared_prefix_logps(model, ids, mask, keep, alone=False, checkpoint=checkpoint)
        (logps * torch.linspace(-1, 1, keep)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        model.zero_grad(set_to_none=True)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][name], atol=1e-6), name
    assert sum(float(g.abs().sum()) for g in grads[0].values()) > 0


def test_a_checkpointed_models_forward_without_a_gradient_keeps_the_prompts_cache(tiny_model_dir, tokenizer,
                                                                                 tmp_path) -> None:
    """Transformers' checkpointing drops the KV cache of a training-mode layer whatever the
    gradient mode; the shared forward without a gradient (a policy-side reference or old-log-prob
    forward) runs the layers as they are, so its rows read their prompt: TRL's log-probs."""
    import torch

    from fastslow.slow.trainer import shared_prefix_logps

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, scripted_reward, beta=0.0, activation_checkpointing=True)
    model = trainer.model
    model.train()
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(3, model.config.vocab_size, (7,), generator=g)
    ids = torch.cat([prompt.repeat(3, 1), torch.randint(3, model.config.vocab_size, (3, 4), generator=g)], dim=1)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        shared, _ = shared_prefix_logps(model, ids, mask, 4, checkpoint=True)
        trainer.share_prefill = False
        full, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, 4, batch_size=3)
    assert torch.allclose(shared, full, atol=1e-5), (shared - full).abs().max()


def test_fused_lm_head_scores_only_completion_positions_on_cpu(tiny_model_dir, tokenizer, tmp_path) -> None:
    """TRL's fused LM head, after build_trainer, projects only the labelled (completion) positions
    on CPU: same log-probs, entropies and gradients as projecting every position, TRL's own CPU
    behaviour (restored here to compare), which the test sees through the rows projected."""
    from types import SimpleNamespace

    import torch
    import trl.trainer.utils as trl_utils

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, scripted_reward, beta=0.0)
    model = trainer.model
    patched = trl_utils._use_triton
    assert patched.trl_original is not patched  # our wrapper, TRL's function inside
    ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-5] = -100  # the last 5 positions are the "completion"

    function = trl_utils._ChunkedLogProbFunction
    results = []
    for use in (patched, patched.trl_original):  # compact, then TRL's original
        rows: list[int] = []

        def spy(hidden, *args, rows=rows):
            rows.append(hidden.shape[0])
            return function.apply(hidden, *args)

        trl_utils._use_triton = use
        trl_utils._ChunkedLogProbFunction = SimpleNamespace(apply=spy)
        try:
            out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
            ((out.log_probs + out.entropy) * torch.linspace(-1, 1, 11)).sum().backward()
        finally:
            trl_utils._use_triton = patched
            trl_utils._ChunkedLogProbFunction = function
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        results.append((rows, out.log_probs.detach(), out.entropy.detach(), grads))
    (rows_c, logp_c, ent_c, grads_c), (rows_f, logp_f, ent_f, grads_f) = results
    assert rows_c == [int((labels[:, 1:] != -100).sum())] == [2 * 5]  # 5 labelled positions a row
    assert rows_f == [2 * 11]  # every position
    assert torch.allclose(logp_c, logp_f, atol=1e-5) and torch.allclose(ent_c, ent_f, atol=1e-5)
    assert logp_c.abs().sum() > 0
    assert grads_c.keys() == grads_f.keys() and grads_c
    for name, g in grads_c.items():
        assert torch.allclose(g, grads_f[name], atol=1e-6), name
    assert sum(float(g.abs().sum()) for g in grads_c.values()) > 0


def test_reference_model_holds_bf16_linears_with_the_same_logprobs(tiny_model_dir, tokenizer,
                                                                    tmp_path) -> None:
    """bf16 training: the KL reference stores its Linear weights in bf16 (half the bytes) and,
    under the autocast the step runs in, gives exactly the logits of the fp32 initial weights."""
    import torch

    from fastslow.model.convert import load_model

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, scripted_reward, beta=0.01, bf16=True)
    ref = trainer.ref_model
    dtypes = {n: m.weight.dtype for n, m in ref.named_modules() if isinstance(m, torch.nn.Linear)}
    assert ref.lm_head.weight is ref.get_input_embeddings().weight  # tied: must stay fp32
    assert dtypes.pop("lm_head") == torch.float32
    assert ref.get_input_embeddings().weight.dtype == torch.float32
    assert dtypes and set(dtypes.values()) == {torch.bfloat16}
    assert not any(p.requires_grad for p in ref.parameters() if p.dtype == torch.bfloat16)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # the policy trains fp32

    fp32 = load_model(tiny_model_dir, dtype="float32").eval()
    ids = torch.randint(0, fp32.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(ref(ids).logits, fp32(ids).logits)
    with torch.no_grad():  # without autocast the stored rounding would show: the test can fail
        assert not torch.equal(ref.float()(ids).logits, fp32(ids).logits)


def test_reference_model_stays_fp32_without_bf16(tiny_model_dir, tokenizer, tmp_path) -> None:
    import torch

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, scripted_reward, beta=0.01, bf16=False)
    assert all(p.dtype == torch.float32 for p in trainer.ref_model.parameters())


def test_bf16_reference_no_longer_maps_the_checkpoint(tiny_model_dir, tmp_path) -> None:
    """transformers maps the safetensors file; after the cast nothing refers to it, so its pages
    (all resident once a forward touched them) leave the process (Linux /proc/self/maps)."""
    import gc
    import shutil

    import torch

    from fastslow.model.convert import load_model
    from fastslow.slow.trainer import bf16_linear_weights

    own = tmp_path / "ref"
    shutil.copytree(tiny_model_dir, own)
    checkpoint = str((own / "model.safetensors").resolve())

    def mapped() -> bool:
        return checkpoint in Path("/proc/self/maps").read_text()

    if not Path("/proc/self/maps").exists():
        pytest.skip("reads which files are mapped from Linux's /proc/self/maps")

    model = load_model(own, dtype="float32")
    if not mapped():
        pytest.skip("this transformers copies checkpoints instead of mapping them")
    saved = bf16_linear_weights(model)
    gc.collect()
    assert not mapped()
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not model.lm_head]
    assert saved == sum(m.weight.numel() * 2 for m in linears) > 0


@pytest.mark.parametrize("vllm", [False, True])
def test_reused_rows_are_spliced_into_trl_generation(tiny_model_dir, tokenizer, tmp_path, vllm: bool) -> None:
    """fast.reuse_in_slow: given rows keep their completion (and, on the vLLM path, their
    per-token sampling log-probs, which TRL's importance-sampling correction reads); the other
    rows are generated, in one call, in row order. On the vLLM path a given row without
    log-probs cannot be used and is generated (counted as such, not as other prompt tokens)."""
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, lambda prompts, **_: [0.0] * len(prompts), beta=0.0)
    trainer.use_vllm = vllm  # only the splice is exercised: generation itself is faked below
    trainer.vllm_generation, trainer._last_loaded_step = _FakeVLLMGeneration(), -1  # the vLLM path syncs first
    asked: list[list[list[int]]] = []

    def fake_generate(prompt_ids: list, images: Any, fields: Any, *_: Any, **__: Any) -> Any:
        asked.append([list(p) for p in prompt_ids])
        ids = [[100 + len(p)] for p in prompt_ids]
        return ids, ([[-1.0] for _ in prompt_ids] if vllm else None)

    trainer._generate_rows = fake_generate
    prompts = [[1, 2], [3, 4, 5], [6], [7, 8, 9, 10]]
    trainer.reuse_rows = {0: ([1, 2], [11, 12], [-0.1, -0.2]), 1: ([3, 4, 5], [13], None),
                          2: ([6], [14, 15], [-0.3, -0.4])}
    completions, logprobs = trainer._generate_single_turn(prompts, None, {}, 4)
    if vllm:
        assert asked == [[[3, 4, 5], [7, 8, 9, 10]]] and trainer.reuse_without_logprobs == 1
        assert trainer.reuse_mismatches == 0
        assert completions == [[11, 12], [103], [14, 15], [104]]
        assert logprobs == [[-0.1, -0.2], [-1.0], [-0.3, -0.4], [-1.0]]
        assert trainer.reused == {0, 2}
    else:
        assert asked == [[[7, 8, 9, 10]]] and trainer.reuse_mismatches == 0
        assert completions == [[11, 12], [13], [14, 15], [104]] and logprobs is None
        assert trainer.reused == {0, 1, 2}
        assert set(trainer.behaviour) == {0, 2} and trainer.reuse_unweighted == 1  # row 1: no log-probs
    assert trainer.reuse_rows == {}  # consumed: the next generation is TRL's own
    asked.clear()
    trainer._generate_single_turn(prompts, None, {}, 4)
    assert asked == [prompts] and trainer.reused == set()


@pytest.mark.parametrize("vllm", [False, True])
def test_reused_rows_need_one_log_prob_per_completion_token(tiny_model_dir, tokenizer, tmp_path, vllm: bool) -> None:
    """A given row whose log-probs do not match its completion token for token (one for two
    tokens) has no usable sampling log-probs: on the vLLM path it is generated (a mismatch), on
    the HF path it is reused but trained as on-policy (`reuse_unweighted`), never weighted by
    misaligned log-probs. The splice test's rows had log-probs of the right length or none, so a
    check of presence only passed. A row whose prompt tokens are not TRL's is a mismatch on both."""
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, lambda prompts, **_: [0.0] * len(prompts), beta=0.0)
    trainer.use_vllm = vllm
    trainer.vllm_generation, trainer._last_loaded_step = _FakeVLLMGeneration(), -1
    asked: list[list[list[int]]] = []

    def fake_generate(prompt_ids: list, images: Any, fields: Any, *_: Any, **__: Any) -> Any:
        asked.append([list(p) for p in prompt_ids])
        return [[100 + len(p)] for p in prompt_ids], ([[-1.0] for _ in prompt_ids] if vllm else None)

    trainer._generate_rows = fake_generate
    prompts = [[1, 2], [3, 4, 5], [6], [7, 8]]
    # rows 2 and 3: other prompt tokens, of another length and of the same length (a matching
    # length is no match: a changed context or chat template can keep it)
    trainer.reuse_rows = {0: ([1, 2], [11, 12], [-0.1, -0.2]), 1: ([3, 4, 5], [13, 14], [-0.3]),
                          2: ([6, 6], [15], [-0.5]), 3: ([7, 9], [16], [-0.6])}
    completions, logprobs = trainer._generate_single_turn(prompts, None, {}, 2)
    assert trainer.reuse_mismatches == 2
    if vllm:
        assert asked == [[[3, 4, 5], [6], [7, 8]]] and trainer.reuse_without_logprobs == 1
        assert completions == [[11, 12], [103], [101], [102]]
        assert logprobs == [[-0.1, -0.2], [-1.0], [-1.0], [-1.0]]
        assert trainer.reused == {0}
    else:
        assert asked == [[[6], [7, 8]]] and completions == [[11, 12], [13, 14], [101], [102]]
        assert trainer.reused == {0, 1} and set(trainer.behaviour) == {0}
        assert trainer.reuse_unweighted == 1 and trainer.reuse_without_logprobs == 0


def test_reused_rows_train_against_the_policy_that_sampled_them(tiny_model_dir, tokenizer, tmp_path) -> None:
    """HF path, fast.reuse_in_slow: a reused row's per-token log-probs from its sampler (the
    fast round's generator, bf16 on the CPU default) become that row's old log-probs in the
    loss, so CISPO weighs its tokens by min(pi_theta / pi_behaviour, tau); the generated rows
    stay on-policy (old = the loss forward's own). Checked against TRL's loss given those old
    log-probs explicitly, whose formula test_cispo_loss_matches_hand_computation checks."""
    import torch

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, scripted_reward, beta=0.0, epsilon_high=1.5)
    model = trainer.model
    rows = expand_rows(PROBLEMS, CONTEXTS, 4)
    first = trainer._generate_and_score_completions(rows)
    assert "behaviour_logps" not in first  # nothing reused: TRL's batch as it is

    def unpadded(ids: Any, mask: Any, i: int) -> list[int]:
        return ids[i][mask[i].bool()].tolist()

    given = {}
    for i, offset in ((0, -0.25), (5, 0.5)):  # the sampler found its tokens less / more likely
        completion = unpadded(first["completion_ids"], first["completion_mask"], i)
        given[i] = (unpadded(first["prompt_ids"], first["prompt_mask"], i), completion,
                    [-1.0 + offset + 0.1 * j for j in range(len(completion))])
    trainer.reuse_rows = dict(given)
    batch = trainer._generate_and_score_completions(rows)
    assert trainer.reused == {0, 5} and trainer.behaviour == {}
    behaviour = batch["behaviour_logps"]
    for i, (_, completion, logps) in given.items():
        assert unpadded(batch["completion_ids"], batch["completion_mask"], i) == completion
        assert behaviour[i, :len(logps)].tolist() == pytest.approx(logps)
        assert torch.isnan(behaviour[i, len(logps):]).all()
    others = [i for i in range(len(rows)) if i not in given]
    assert torch.isnan(behaviour[others]).all()

    model.train()
    with torch.no_grad():  # the policy's log-probs of the batch's completions
        width = batch["prompt_ids"].size(1)
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        logits = model(input_ids=ids, attention_mask=torch.cat([batch["prompt_mask"],
                                                                batch["completion_mask"]], 1)).logits
        logp = torch.log_softmax(logits[:, width - 1:-1].float(), -1)
        logp = logp.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    plain = {k: v for k, v in batch.items() if k != "behaviour_logps"}
    explicit = {**plain, "old_per_token_logps": torch.where(torch.isnan(behaviour), logp, behaviour)}
    with_behaviour = trainer.compute_loss(model, dict(batch)).detach()
    assert float(with_behaviour) == pytest.approx(float(trainer.compute_loss(model, explicit)), rel=1e-4)
    assert float(with_behaviour) != pytest.approx(float(trainer.compute_loss(model, plain)), rel=1e-3)


class _FakeVLLMGeneration:
    """Stands in for TRL's `VLLMGeneration`: counts the weight syncs (a collective under FSDP2)."""

    def __init__(self) -> None:
        self.syncs = 0

    def sync_weights(self) -> None:
        self.syncs += 1


def test_the_vllm_batch_carries_the_samplers_log_probs(tiny_model_dir, tokenizer, tmp_path, monkeypatch) -> None:
    """On the vLLM path the step's clip fraction and the rollouts' logprob_sum read TRL's
    `sampling_per_token_logps` (loop.py); a TRL that renamed the key would leave them describing
    the trainer's own forward with no error. TRL's real batch, vLLM's sampling faked."""
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, lambda prompts, **_: [0.0] * len(prompts), beta=0.0)
    trainer.use_vllm = True
    trainer.vllm_generation, trainer._last_loaded_step = _FakeVLLMGeneration(), -1
    trainer._generate_rows = lambda ids, *_, **__: ([[5, 6] for _ in ids], [[-0.5, -0.7] for _ in ids])
    rows = expand_rows(PROBLEMS, CONTEXTS, 4)
    batch = trainer._generate_and_score_completions(rows)
    assert batch["sampling_per_token_logps"][:, :2].flatten().tolist() == pytest.approx([-0.5, -0.7] * len(rows))
    from trl import GRPOTrainer

    trl_batch = GRPOTrainer._generate_and_score_completions  # a TRL that renamed the key:
    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", lambda self, inputs: {
        k: v for k, v in trl_batch(self, inputs).items() if k != "sampling_per_token_logps"})
    with pytest.raises(RuntimeError, match=r"^TRL \S+'s vLLM batch has no 'sampling_per_token_logps'"):
        trainer._generate_and_score_completions(rows)


@pytest.mark.parametrize("all_reused", [True, False])
def test_vllm_weights_are_synced_whatever_rows_are_reused(tiny_model_dir, tokenizer, tmp_path,
                                                           all_reused: bool) -> None:
    """Every rank must take part in TRL's vLLM weight sync at a new step: a rank whose rows were
    all reused (fast.reuse_in_slow) never reaches TRL's generation, where that sync lives, and
    the other ranks would wait for it forever. The sync happens once per step either way."""
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, lambda prompts, **_: [0.0] * len(prompts), beta=0.0)
    trainer.use_vllm = True
    trainer.vllm_generation = vllm = _FakeVLLMGeneration()
    trainer._last_loaded_step = -1
    trainer.state.global_step = 3
    asked: list[list[list[int]]] = []

    def trl_generate(prompt_ids: list, *_: Any, **__: Any) -> Any:  # TRL's vLLM branch, faked
        assert trainer._last_loaded_step == trainer.state.global_step  # ours synced before TRL's
        if trainer.state.global_step != trainer._last_loaded_step:
            trainer.vllm_generation.sync_weights()
            trainer._last_loaded_step = trainer.state.global_step
        asked.append([list(p) for p in prompt_ids])
        return [[9] for _ in prompt_ids], [[-1.0] for _ in prompt_ids]

    trainer._generate_rows = trl_generate
    prompts = [[1, 2], [3, 4]]
    trainer.reuse_rows = {0: ([1, 2], [11], [-0.1])}
    if all_reused:
        trainer.reuse_rows[1] = ([3, 4], [12], [-0.2])
    completions, _ = trainer._generate_single_turn(prompts, None, {}, 2)
    assert asked == ([] if all_reused else [[[3, 4]]])
    assert completions == [[11], [12] if all_reused else [9]]
    assert vllm.syncs == 1 and trainer._last_loaded_step == 3
    trainer._generate_single_turn(prompts, None, {}, 2)  # same step: the weights are current
    assert vllm.syncs == 1
    trainer.state.global_step = 4
    trainer.reuse_rows = {0: ([1, 2], [11], [-0.1]), 1: ([3, 4], [12], [-0.2])}
    trainer._generate_single_turn(prompts, None, {}, 2)
    assert vllm.syncs == 2 and trainer._last_loaded_step == 4


@pytest.mark.parametrize("setup", ["fsdp", "fsdp_vllm", "fsdp_one_process", "ddp", "one"])
def test_a_rank_with_every_row_reused_still_generates_under_fsdp(tiny_model_dir, tokenizer, tmp_path,
                                                                 setup: str) -> None:
    """Under FSDP without vLLM, HF generate is a collective (each decoding step gathers the
    sharded weights; transformers decodes in lockstep, `synced_gpus`): a rank whose rows were
    all reused must still call it, with one row whose completion is thrown away, or the other
    ranks wait for it forever. Elsewhere (vLLM, DDP, one process) it generates nothing."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, lambda prompts, **_: [0.0] * len(prompts), beta=0.0)
    kind = {"fsdp": DistributedType.FSDP, "fsdp_vllm": DistributedType.FSDP,
            "fsdp_one_process": DistributedType.FSDP, "ddp": DistributedType.MULTI_CPU,
            "one": DistributedType.NO}[setup]
    alone = setup in ("one", "fsdp_one_process")
    trainer.accelerator = SimpleNamespace(num_processes=1 if alone else 2, distributed_type=kind,
                                          is_main_process=True)  # (TRL's profiling reads it)
    trainer.use_vllm = setup == "fsdp_vllm"
    trainer.vllm_generation, trainer._last_loaded_step = _FakeVLLMGeneration(), -1
    asked: list[list[list[int]]] = []

    def fake_generate(prompt_ids: list, *_: Any, **__: Any) -> Any:
        asked.append([list(p) for p in prompt_ids])
        return [[99] for _ in prompt_ids], ([[-1.0] for _ in prompt_ids] if trainer.use_vllm else None)

    trainer._generate_rows = fake_generate
    prompts = [[1, 2], [3, 4]]
    trainer.reuse_rows = {0: ([1, 2], [11], [-0.1]), 1: ([3, 4], [12], [-0.2])}
    completions, _ = trainer._generate_single_turn(prompts, None, {}, 2)
    assert completions == [[11], [12]] and trainer.reused == {0, 1}
    assert asked == ([[[1, 2]]] if setup == "fsdp" else [])
    trainer.reuse_rows = {0: ([1, 2], [11], [-0.1])}  # a row left to generate: one call either way
    asked.clear()
    completions, _ = trainer._generate_single_turn(prompts, None, {}, 2)
    assert asked == [[[3, 4]]] and completions == [[11], [99]]


def test_activation_checkpointing_without_its_new_name(tiny_model_dir, tokenizer, tmp_path,
                                                       monkeypatch) -> None:
    """transformers < 5.18 (the GPU pin set) has no `activation_checkpointing_enable`: the older
    `gradient_checkpointing_enable` turns the same recomputation on."""
    from transformers import PreTrainedModel

    calls: list[dict] = []

    def older(self, gradient_checkpointing_kwargs=None, **kwargs):  # what < 5.18 has, by its old name
        calls.append(gradient_checkpointing_kwargs)
        self._activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    monkeypatch.delattr(PreTrainedModel, "activation_checkpointing_enable")
    monkeypatch.setattr(PreTrainedModel, "gradient_checkpointing_enable", older)
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, scripted_reward, beta=0.0,
                       activation_checkpointing=True)
    assert {"use_reentrant": False} in calls
    assert trainer.model.is_gradient_checkpointing


# A pool whose two contexts have the same text (distinct ids, the same context hash): their
# rollouts of a problem share one queue of the fast round's rollouts (`reuse_plan`).
REPEATED = [("a", "context A"), ("b", "context A")]


@pytest.mark.parametrize("baseline, expected", [
    # One group of G=4 per problem, across both copies of the context, filled from the shared
    # queue in order. p0: r=[1,0,0,0], mean .25, std .5; p1: r=[1,1,0,1], mean .75, std .5.
    ("problem", [1.5, -0.5, -0.5, -0.5, 0.5, 0.5, -1.5, 0.5]),
    # One group of G/K=2 per (problem, context id), though both contexts read the same:
    # [1,0] -> ±1/sqrt(2); [0,0], [1,1] -> 0; [0,1] -> ∓1/sqrt(2).
    ("prompt", [0.70711, -0.70711, 0.0, 0.0, 0.0, 0.0, -0.70711, 0.70711]),
])
def test_a_repeated_context_shares_its_problems_group_and_reuse_queue(tiny_model_dir, tokenizer, tmp_path,
                                                                      baseline: str, expected: list[float]) -> None:
    """The same context twice in the pool: a problem's G rows carry one prompt, and the fast
    round's rollouts of that (context, problem) pair, one queue for both context ids, are each
    dealt once, in row order. The advantage baseline is still the problem's G rows
    (`baseline: problem`) or each context id's G/K (`prompt`), over the rollouts as dealt."""
    from fastslow.records import context_hash
    from fastslow.slow.loop import reuse_plan

    hit = 7  # a completion starting with this token scores 1
    scored: list[tuple[str, str, list[int]]] = []

    def reward(prompts: list, completions: list, problem_id: list[str], context_id: list[str],
               completion_ids: list[list[int]], **_: Any) -> list[float]:
        scored.extend(zip(problem_id, context_id, [list(c) for c in completion_ids], strict=True))
        return [1.0 if c[0] == hit else 0.0 for c in completion_ids]

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, reward, beta=0.0, baseline=baseline)
    rows = expand_rows(PROBLEMS, REPEATED, 4)
    assert [(r["problem_id"], r["context_id"]) for r in rows] == [
        ("p0", "a"), ("p0", "a"), ("p0", "b"), ("p0", "b"), ("p1", "a"), ("p1", "a"), ("p1", "b"), ("p1", "b")]
    first = trainer._generate_and_score_completions(rows)
    prompt_ids = [first["prompt_ids"][i][first["prompt_mask"][i].bool()].tolist() for i in range(len(rows))]
    assert prompt_ids[0] == prompt_ids[3] != prompt_ids[4] == prompt_ids[7]  # one prompt per problem

    firsts = {"p0": [hit, 8, 8, 8], "p1": [hit, hit, 8, hit]}  # each queue's rollouts, in order
    hashes = {cid: context_hash(text) for cid, text in REPEATED}
    assert hashes["a"] == hashes["b"]
    left = {(hashes["a"], pid): [{"prompt_ids": prompt_ids[4 * p], "completion_ids": [tok, 10 + j],
                                  "logprobs": None} for j, tok in enumerate(firsts[pid])]
            for p, pid in enumerate(("p0", "p1"))}
    trainer.reuse_rows = reuse_plan(rows, left, hashes)
    assert all(not queue for queue in left.values())  # every rollout dealt, none twice
    scored.clear()
    trainer.model.train()
    batch = trainer._generate_and_score_completions(rows)
    assert trainer.reused == set(range(8)) and trainer.reuse_mismatches == 0
    assert scored == [(r["problem_id"], r["context_id"], [firsts[r["problem_id"]][i % 4], 10 + i % 4])
                      for i, r in enumerate(rows)]
    assert batch["advantages"].tolist() == pytest.approx(expected, abs=3e-4)
    assert trainer.num_generations == {"problem": 4, "prompt": 2}[baseline]


def test_a_reused_row_beyond_the_ranks_rows_is_a_mismatch_not_a_crash(tiny_model_dir, tokenizer, tmp_path) -> None:
    """A given row whose index is past this rank's prompts (a plan made for other rows) is
    counted with the mismatches and every prompt is generated; it raised IndexError."""
    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, lambda prompts, **_: [0.0] * len(prompts), beta=0.0)
    asked: list[list[list[int]]] = []

    def fake_generate(prompt_ids: list, *_: Any, **__: Any) -> Any:
        asked.append([list(p) for p in prompt_ids])
        return [[100 + len(p)] for p in prompt_ids], None

    trainer._generate_rows = fake_generate
    trainer.reuse_rows = {1: ([3, 4], [11], [-0.1]), 2: ([5], [12], [-0.2])}
    completions, _ = trainer._generate_single_turn([[1, 2], [3, 4]], None, {}, 2)
    assert completions == [[102], [11]] and asked == [[[1, 2]]]
    assert trainer.reuse_mismatches == 1 and trainer.reused == {1}


@pytest.mark.parametrize("head_first", [True, False])
def test_bf16_linear_weights_leave_a_tied_head_fp32_and_tied(head_first: bool) -> None:
    """A Linear whose weight is another module's (a tied lm_head is the input embedding) keeps
    fp32: rounding it would round the embedding's output too, which is not autocast. Untied
    Linears are stored in bf16, their bytes saved counted; everything stays frozen."""
    import torch
    from torch import nn

    from fastslow.slow.trainer import bf16_linear_weights

    class Tied(nn.Module):
        def __init__(self, head_first: bool) -> None:
            super().__init__()
            if head_first:  # the head's module is met before the embedding's
                self.head = nn.Linear(4, 10, bias=False)
            self.embed = nn.Embedding(10, 4)
            self.proj = nn.Linear(4, 4)
            if not head_first:
                self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight

    model = Tied(head_first)
    embedding = model.embed.weight.detach().clone()
    assert bf16_linear_weights(model) == 4 * 4 * 2  # proj's weight only: 2 bytes saved a value
    assert model.proj.weight.dtype == torch.bfloat16 and model.proj.bias.dtype == torch.float32
    assert model.head.weight is model.embed.weight and model.embed.weight.dtype == torch.float32
    assert torch.equal(model.embed.weight, embedding)
    assert not any(p.requires_grad for p in model.parameters())


def test_a_trainer_whose_accelerator_disagrees_with_world_size_is_refused(tiny_model_dir, tokenizer,
                                                                         tmp_path) -> None:
    """WORLD_SIZE sized the per-rank batches (`per_rank_batches`); an accelerator with another
    number of processes would train a step of another size: one line naming both."""
    with pytest.raises(RuntimeError, match=r"^slow loop: expected 2 processes \(WORLD_SIZE\) but the "
                                           r"accelerator has 1$"):
        build_trainer(_load(tiny_model_dir), tokenizer, SlowConfig(num_generations=4, problems_per_step=2,
                                                                   max_new_tokens=4, beta=0.0),
                      len(CONTEXTS), scripted_reward, tmp_path, num_processes=2)


def _load(model_dir: Path) -> Any:
    from fastslow.model.convert import load_model

    return load_model(model_dir, dtype="float32")


def test_a_loss_that_read_the_skipped_reference_placeholder_is_an_error(tiny_model_dir, tokenizer, tmp_path,
                                                                        monkeypatch) -> None:
    """At the reference (`policy_is_reference`) the reference log-probs are NaN until the loss
    forward fills them in with its own; a TRL whose loss no longer runs that forward the way we
    hook it would train on NaN KL (or on none): one line instead, and the stashed inputs let go."""
    import torch
    from trl import GRPOTrainer

    trainer = _trainer(tiny_model_dir, tokenizer, tmp_path, scripted_reward, beta=0.04)
    trainer.reference_skipped = True
    seen = []

    def trl_loss(self: Any, model: Any, inputs: dict[str, Any]) -> Any:  # TRL's, minus the forward
        seen.append(self._loss_inputs is inputs)
        if fill:
            inputs["ref_per_token_logps"] = torch.zeros(1, 2)  # what our hook writes
        return torch.tensor(0.5)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", trl_loss)
    fill = True
    assert float(trainer._compute_loss(trainer.model, {"ref_per_token_logps": torch.full((1, 2), float("nan"))})) == 0.5
    fill = False
    with pytest.raises(RuntimeError, match=r"^slow loop: the loss read the skipped reference forward's placeholder"):
        trainer._compute_loss(trainer.model, {"ref_per_token_logps": torch.full((1, 2), float("nan"))})
    assert seen == [True, True] and trainer._loss_inputs is None
