"""Forward hooks shared by the generation tests of test_model and test_slow_trl: what each
decoding step (one new token a row) of a model ran."""

from __future__ import annotations

from typing import Any


def decoded_rows(model: Any) -> tuple[list[int], Any]:
    """A list that collects the rows every decoding forward of `model` runs, and the hook
    handle to remove."""
    rows: list[int] = []

    def count(module: Any, args: Any, kwargs: Any) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] == 1:
            rows.append(ids.shape[0])

    return rows, model.register_forward_pre_hook(count, with_kwargs=True)


def decoding_masks(model: Any) -> tuple[list[bool], Any]:
    """A list that collects whether each decoding step of `model`'s first attention layer got
    an attention mask, and the hook handle to remove."""
    seen: list[bool] = []

    def record(module: Any, args: Any, kwargs: Any) -> None:
        if kwargs["hidden_states"].shape[1] == 1:
            seen.append(kwargs.get("attention_mask") is not None)

    return seen, model.model.layers[0].self_attn.register_forward_pre_hook(record, with_kwargs=True)
