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

from collections.abc import Sequence
from typing import Any


def _completion_hidden(model: Any, input_ids: Any, attention_mask: Any, positions: Any) -> Any:
    """Final hidden states at `positions` (a boolean mask), shape (n, hidden)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or decoder is model:
        raise TypeError(f"{type(model).__name__} exposes no decoder backbone (get_decoder())")
    out = decoder(input_ids=input_ids, attention_mask=attention_mask)
    return out.last_hidden_state[positions]


def _log_probs(model: Any, hidden: Any, temperature: float) -> Any:
    import torch

    logits = model.get_output_embeddings()(hidden.to(model.get_output_embeddings().weight.dtype))
    softcap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    logits = logits.float()
    if softcap:  # Gemma-style models cap logits inside their own forward; do the same
        logits = torch.tanh(logits / softcap) * softcap
    return torch.log_softmax(logits / temperature, dim=-1)


def kl_and_entropy(
    model: Any,
    base_model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    batch_size: int = 8,
    token_chunk: int = 1024,
    temperature: float = 1.0,
) -> tuple[float, float]:
    """Mean token KL(π_θ ‖ π_base) and mean token entropy of π_θ over the given completions.

    Args:
        model, base_model: causal LMs sharing `tokenizer`'s vocabulary (π_θ and π_base).
        prompt_ids, completion_ids: unpadded token ids, one pair per sample (the rendered
            prompt as fed to generation, and the sampled completion).
        batch_size: sequences per forward pass; token_chunk: positions per LM-head call.

    Returns (nan, nan) when there is no completion token. No gradients are taken.
    """
    import torch

    if len(prompt_ids) != len(completion_ids):
        raise ValueError("prompt_ids and completion_ids must have the same length")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    base_device = next(base_model.parameters()).device
    kl_sum, ent_sum, count = 0.0, 0.0, 0
    pairs = [(list(p), list(c)) for p, c in zip(prompt_ids, completion_ids, strict=True) if len(c)]
    pairs.sort(key=lambda pc: len(pc[0]) + len(pc[1]))  # similar lengths pad little
    same = base_model is model
    was_training = (model.training, base_model.training)
    model.eval()
    base_model.eval()
    try:
        with torch.no_grad():
            for lo in range(0, len(pairs), batch_size):
                chunk = pairs[lo: lo + batch_size]
                width = max(len(p) + len(c) for p, c in chunk)
                ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                attn = torch.zeros((len(chunk), width), dtype=torch.long)
                # Position t predicts token t+1: completion token j is predicted at p+j-1.
                where = torch.zeros((len(chunk), width), dtype=torch.bool)
                for row, (p, c) in enumerate(chunk):
                    ids[row, : len(p) + len(c)] = torch.tensor(p + c)
                    attn[row, : len(p) + len(c)] = 1
                    where[row, len(p) - 1: len(p) + len(c) - 1] = True
                h = _completion_hidden(model, ids.to(device), attn.to(device), where.to(device))
                # The same model on both sides (a base-model evaluation): KL is 0 by definition,
                # and the second full forward over long prompts would double the cost.
                hb = None if same else _completion_hidden(base_model, ids.to(base_device),
                                                          attn.to(base_device), where.to(base_device))
                for start in range(0, h.shape[0], token_chunk):
                    logp = _log_probs(model, h[start: start + token_chunk], temperature)
                    prob = logp.exp()
                    if hb is not None:
                        logq = _log_probs(base_model, hb[start: start + token_chunk], temperature)
                        kl_sum += float((prob * (logp - logq.to(logp.device))).sum())
                    ent_sum += float(-(prob * logp).sum())
                    count += logp.shape[0]
    finally:
        model.train(was_training[0])
        base_model.train(was_training[1])
    if count == 0:
        return float("nan"), float("nan")
    return kl_sum / count, ent_sum / count
