"""Token-level KL(π_θ ‖ π_base) and entropy of π_θ on given completions (evaluation, Fig 4/8/11).

Both are exact over the vocabulary, not sampled estimates: at every completion position t,

    KL_t = Σ_v π_θ(v | x, y_<t) [log π_θ(v | x, y_<t) − log π_base(v | x, y_<t)]
    H_t  = −Σ_v π_θ(v | x, y_<t) log π_θ(v | x, y_<t)

and the returned numbers are means over all completion tokens of the batch (token-level, so long
completions weigh more). Distributions are the models' raw ones (temperature 1) unless
`temperature` is given. Only the completion positions go through the LM head, in chunks, so
memory stays O(chunk × vocab) even for a 150k vocabulary.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)


def _decoder(model: Any) -> Any:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or decoder is model:
        raise TypeError(f"{type(model).__name__} exposes no decoder backbone (get_decoder())")
    return decoder


def _hidden_at(model: Any, input_ids: Any, attention_mask: Any, positions: Any) -> Any:
    """Final hidden states at `positions` (a boolean mask) of one plain pass, shape (n, hidden)."""
    out = _decoder(model)(input_ids=input_ids, attention_mask=attention_mask)
    return out.last_hidden_state[positions]


def _completion_hidden(model: Any, prompts: Sequence[Sequence[int]],
                       groups: Sequence[Sequence[Sequence[int]]], pad: int) -> Any:
    """Final hidden states of every position that predicts a completion token, shape (n, hidden).

    `groups[u]` are the completions sampled from `prompts[u]`. Each prompt but its last token
    goes through the model once (left padded), its KV cache is copied to one row per completion,
    and a second pass runs [last prompt token] + completion[:-1] (right padded) on that cache:
    its outputs are exactly the positions that predict the completion. Rows are returned in
    order, completion by completion, `len(c)` positions each.
    """
    import torch
    from transformers import DynamicCache

    device = next(model.parameters()).device
    decoder = _decoder(model)
    width = max(len(p) for p in prompts) - 1
    rows = [u for u, comps in enumerate(groups) for _ in comps]
    comps = [c for cs in groups for c in cs]
    seg = max(len(c) for c in comps)
    prefix = torch.full((len(prompts), width), pad, dtype=torch.long)
    prefix_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for u, p in enumerate(prompts):
        if len(p) > 1:
            prefix[u, width - len(p) + 1:] = torch.tensor(p[:-1])
            prefix_mask[u, width - len(p) + 1:] = 1
    ids = torch.full((len(comps), seg), pad, dtype=torch.long)
    mask = torch.zeros((len(comps), seg), dtype=torch.long)
    for r, (u, c) in enumerate(zip(rows, comps, strict=True)):
        ids[r, : len(c)] = torch.tensor([prompts[u][-1], *c[:-1]])
        mask[r, : len(c)] = 1
    lengths = prefix_mask.sum(-1)
    cache = None
    if width > 0 and bool(prefix_mask.any()):
        cache = DynamicCache(config=model.config)
        positions = (prefix_mask.cumsum(-1) - 1).clamp(min=0)
        decoder(input_ids=prefix.to(device), attention_mask=prefix_mask.to(device),
                position_ids=positions.to(device), past_key_values=cache, use_cache=True)
        cache.batch_select_indices(torch.tensor(rows, device=device))
        full_mask = torch.cat([prefix_mask[rows], mask], dim=1)
    else:
        full_mask = mask
    positions = lengths[rows, None] + torch.arange(seg)[None, :]
    out = decoder(input_ids=ids.to(device), attention_mask=full_mask.to(device),
                  position_ids=positions.to(device), past_key_values=cache, use_cache=cache is not None)
    return out.last_hidden_state[mask.to(device).bool()]


def logit_scale(text_config: Any) -> float:
    """The factor a model's own forward multiplies its head's logits by before any soft-cap, as
    TRL's fused head reads it (`trl.trainer.utils.add_fused_lm_head`): Cohere's `logit_scale`,
    `output_multiplier`, Falcon-H1's `lm_head_multiplier`, Granite's and MiniCPM3's 1 /
    `logits_scaling` (HyperCLOVA X multiplies by it); 1.0 for the rest (Llama, Qwen, SmolLM2)."""
    for key in ("logit_scale", "output_multiplier", "lm_head_multiplier"):
        value = getattr(text_config, key, None)
        if value is not None:
            return float(value)
    scaling = getattr(text_config, "logits_scaling", None)
    if scaling is not None:
        return float(scaling) if text_config.model_type == "hyperclovax" else 1.0 / float(scaling)
    return 1.0


def _log_probs(model: Any, hidden: Any, temperature: float) -> Any:
    import torch

    logits = model.get_output_embeddings()(hidden.to(model.get_output_embeddings().weight.dtype))
    text_config = model.config.get_text_config()
    softcap = getattr(text_config, "final_logit_softcapping", None)
    logits = logits.float() * logit_scale(text_config)  # as the model's own forward scales them
    if softcap:  # Gemma-style models cap logits inside their own forward; do the same
        logits = torch.tanh(logits / softcap) * softcap
    return torch.log_softmax(logits / temperature, dim=-1)


def _split_groups(items: list[tuple[tuple[int, ...], list[list[int]]]],
                  max_tokens: int) -> list[tuple[tuple[int, ...], list[list[int]]]]:
    """`items` with each prompt's completions cut into runs that fit `max_tokens` positions
    (rows x (prompt + longest completion)); a completion that alone does not fit runs alone."""
    out = []
    for p, cs in items:
        i = 0
        while i < len(cs):
            j, longest = i + 1, len(cs[i])
            while j < len(cs) and (j + 1 - i) * (len(p) + max(longest, len(cs[j]))) <= max_tokens:
                longest, j = max(longest, len(cs[j])), j + 1
            out.append((p, cs[i:j]))
            i = j
    return out


def kl_and_entropy(
    model: Any,
    base_model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    batch_size: int = 8,
    token_chunk: int = 1024,
    temperature: float = 1.0,
    log_every: int = 10,
    max_tokens: int | None = None,
) -> tuple[float, float]:
    """Mean token KL(π_θ ‖ π_base) and mean token entropy of π_θ over the given completions.

    Args:
        model, base_model: causal LMs sharing `tokenizer`'s vocabulary (π_θ and π_base).
        prompt_ids, completion_ids: unpadded token ids, one pair per sample (the rendered
            prompt as fed to generation, and the sampled completion).
        batch_size: sequences per forward pass; token_chunk: positions per LM-head call.
        max_tokens: most positions a pass holds, counted as its rows x (its longest prompt +
            its longest completion), the keys and values it caches (None: no bound). A pass
            takes whole prompts while they fit; a prompt whose completions do not fit together
            is split over passes (its prefix then runs once per pass). At paper scale (4096-token
            completions, batch 256) this, not `batch_size`, keeps the pass in GPU memory.
        log_every: log the progress (completions done / total) every this many passes, and
            after the last; the pass costs about as much as sampling them.

    Returns (nan, nan) when there is no completion token. No gradients are taken.
    """
    import torch

    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"prompt_ids and completion_ids must have the same length, got {len(prompt_ids)} "
                         f"and {len(completion_ids)}")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    kl_sum, ent_sum, count = 0.0, 0.0, 0
    # Completions grouped by prompt (evaluation samples k per prompt): each prompt's prefix is
    # run once per model, however many completions share it (`_completion_hidden`).
    by_prompt: dict[tuple[int, ...], list[list[int]]] = {}
    for p, c in zip(prompt_ids, completion_ids, strict=True):
        if len(c):
            by_prompt.setdefault(tuple(p), []).append(list(c))
    items = sorted(by_prompt.items(), key=lambda pc: len(pc[0]))  # similar lengths pad little
    if max_tokens is not None:
        items = _split_groups(items, max_tokens)
    total = sum(len(cs) for _, cs in items)
    done, passes, t0 = 0, 0, time.perf_counter()
    same = base_model is model
    was_training = (model.training, base_model.training)
    model.eval()
    base_model.eval()
    try:
        with torch.no_grad():
            lo = 0
            while lo < len(items):
                # about `batch_size` completions (and at most `max_tokens` positions) per pass,
                # whole prompts only; items run by prompt length, so the last taken is the longest
                hi, rows, seg = lo, 0, 0
                while hi < len(items):
                    p, cs = items[hi]
                    more, longest = rows + len(cs), max(seg, *(len(c) for c in cs))
                    if hi > lo and (more > batch_size
                                    or (max_tokens is not None and more * (len(p) + longest) > max_tokens)):
                        break
                    rows, seg, hi = more, longest, hi + 1
                prompts = [list(p) for p, _ in items[lo:hi]]
                groups = [cs for _, cs in items[lo:hi]]
                lo = hi
                h = _completion_hidden(model, prompts, groups, pad)
                # The same model on both sides (a base-model evaluation): KL is 0 by definition,
                # and the second full forward over long prompts would double the cost.
                hb = None if same else _completion_hidden(base_model, prompts, groups, pad)
                for start in range(0, h.shape[0], token_chunk):
                    logp = _log_probs(model, h[start: start + token_chunk], temperature)
                    prob = logp.exp()
                    if hb is not None:
                        logq = _log_probs(base_model, hb[start: start + token_chunk], temperature)
                        kl_sum += float((prob * (logp - logq.to(logp.device))).sum())
                    ent_sum += float(-(prob * logp).sum())
                    count += logp.shape[0]
                done += rows
                passes += 1
                if passes % log_every == 0 or lo == len(items):
                    log.info("%s: %d/%d completions (%.0fs)", "entropy" if same else "KL/entropy", done, total,
                             time.perf_counter() - t0)
    finally:
        model.train(was_training[0])
        base_model.train(was_training[1])
    if count == 0:
        return float("nan"), float("nan")
    return kl_sum / count, ent_sum / count
