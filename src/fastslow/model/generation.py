"""Generation backends behind one interface.

`Generator.generate(conversations, params)` samples one completion per conversation (repeat a
conversation to get several). Backends: `HFGenerator` (transformers `generate`, CPU default)
and `VLLMGenerator` (GPU only, imported lazily). Both tokenise prompts with `encode_prompts`
(the model's chat template with the generation prompt), so RL, GEPA and evaluation see the
same token ids whichever backend produced the text.

`Generation.logprob_sum` is the log-probability of the completion tokens under the
distribution they were *sampled from*: the model's logits after temperature and top-p (the
"processed" distribution, as in vLLM's ``logprobs_mode="processed_logprobs"``). Under greedy
decoding (temperature 0) it is the log-probability under the unmodified model (temperature 1).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from fastslow.config import MIN_TEMPERATURE, is_number

log = logging.getLogger(__name__)

Conversation = list[dict[str, str]]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` means greedy decoding."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(f"SamplingParams.{name}: expected {expected}, got {getattr(self, name)!r}")

        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise bad("max_new_tokens", "an integer >= 1")
        if not (is_number(self.temperature) and (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature < math.inf)):
            raise bad("temperature", f"0 (greedy) or a finite number >= {MIN_TEMPERATURE}")
        if not (is_number(self.top_p) and 0 < self.top_p <= 1):
            raise bad("top_p", "a number in (0, 1]")


@dataclass(frozen=True)
class Generation:
    """One completion. Token counts include the EOS token when the model emitted one."""

    #: the completion decoded, after the reasoning-trace opener its chat template wrote, if any
    #: (`trace_opener`: "<think>" for a template that opens the trace in the prompt)
    text: str
    prompt_tokens: int
    completion_tokens: int
    #: Sum of the sampling log-probabilities of the completion tokens (None if not computed).
    logprob_sum: float | None = None
    #: The completion's token ids (including EOS if emitted), for training without re-tokenising.
    completion_ids: tuple[int, ...] = ()
    #: "stop" (EOS emitted) or "length" (hit max_new_tokens).
    finish_reason: str = "stop"
    #: The prompt's token ids as sampled from (empty if the backend does not report them).
    prompt_ids: tuple[int, ...] = ()
    #: Each completion token's sampling log-probability (processed: after temperature/top-p).
    token_logprobs: tuple[float, ...] = ()


class Generator(Protocol):
    def generate(
        self, conversations: list[list[dict[str, str]]], params: SamplingParams
    ) -> list[Generation]:
        """One completion per conversation, in order."""
        ...


def render_prompts(
    tokenizer: Any, conversations: Sequence[Conversation],
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[str]:
    """Each conversation through the chat template, ending with the assistant's turn opener."""
    kwargs = chat_template_kwargs or {}
    return [
        tokenizer.apply_chat_template(
            list(conv), tokenize=False, add_generation_prompt=True, **kwargs
        )
        for conv in conversations
    ]


def trace_opener(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """`THINK_OPEN` when the chat template opens the assistant's reasoning trace itself (its
    generation prompt ends with `<think>`: DeepSeek-R1's distilled models, Qwen3's Thinking-2507
    models), else "". A completion then starts inside the trace and holds only its `</think>`, so
    a trace cut off at the token budget would read as an answer. The generators put the opener in
    front of each completion's `text`, and the RL reward in front of TRL's completions
    (`TaskReward.opener`), so every scorer reads the trace whole (`fastslow.tasks.base.answer_part`).
    Qwen3-8B's template opens none: the model writes `<think>` itself. A template that cannot
    render a lone user turn opens none either."""
    from fastslow.tasks.base import THINK_OPEN

    try:
        text = render_prompts(tokenizer, [[{"role": "user", "content": "?"}]], chat_template_kwargs)[0]
    except Exception:  # noqa: BLE001 - a template's own error (Jinja, a role it refuses): no opener
        return ""
    return THINK_OPEN if isinstance(text, str) and text.rstrip().endswith(THINK_OPEN) else ""


def encode_prompts(
    tokenizer: Any, conversations: Sequence[Conversation],
    chat_template_kwargs: dict[str, Any] | None = None,
) -> list[list[int]]:
    """Token ids of `render_prompts`. The template already holds the special tokens, so the
    tokenizer must not add a BOS of its own (it would appear twice for Llama-style templates)."""
    texts = render_prompts(tokenizer, conversations, chat_template_kwargs)
    if not texts:  # (a fast tokenizer raises IndexError on an empty batch)
        return []
    return [list(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def longest_prompt(tokenizer: Any, conversations: Sequence[Conversation], chunk: int = 256,
                   chat_template_kwargs: dict[str, Any] | None = None) -> int:
    """Tokens of the longest of `encode_prompts(tokenizer, conversations)` (0 for none), encoded
    `chunk` at a time: what sizes a vLLM engine's context."""
    return max((len(ids) for lo in range(0, len(conversations), chunk)
                for ids in encode_prompts(tokenizer, conversations[lo:lo + chunk], chat_template_kwargs)),
               default=0)


#: Config keys that bound a model's positions, by architecture (Llama/Qwen, GPT-2, others).
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def context_limit(model: Any) -> tuple[int, str] | None:
    """The most positions `model` takes (prompt and completion together) and the key of its
    config.json that says so (GPT-2's n_positions, which transformers also answers to as
    max_position_embeddings); None when its config names none."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for key in _CONTEXT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, getattr(config, "attribute_map", {}).get(key, key)
    return None


def _learned_positions(model: Any, limit: int) -> bool:
    """Whether `model` has a learned position-embedding table of about `limit` rows (GPT-2's
    `wpe`, OPT's `embed_positions`): past it generation fails, where a rotary model (Llama,
    Qwen) goes on, only outside the lengths it was trained on."""
    import torch

    return any(isinstance(m, torch.nn.Embedding) and limit <= m.num_embeddings <= limit + 2
               and ("pos" in name.rsplit(".", 1)[-1] or name.endswith("wpe"))
               for name, m in model.named_modules())


_WARNED_CONTEXT: set[int] = set()


def check_context(model: Any, prompt_tokens: int, max_new_tokens: int,
                  key: str = "generation.max_new_tokens") -> None:
    """When the longest prompt and its completion do not fit the model's positions: one line
    naming the lengths, raised for a model with learned positions (a GPT-2-style model fails with
    `IndexError: index out of range`), a warning once a model for a rotary one, which generates
    on (and usually stops long before max_new_tokens). `key`: the config key that set
    `max_new_tokens` (`HFGenerator.length_key`)."""
    limit = context_limit(model)
    if limit is None or prompt_tokens + max_new_tokens <= limit[0]:
        return
    text = (f"a prompt of {prompt_tokens} tokens plus {key} {max_new_tokens} "
            f"exceeds the model's {limit[0]} positions (config {limit[1]})")
    if _learned_positions(model, limit[0]):
        raise ValueError(f"{text}: shorten the task's prompts or the contexts, lower max_new_tokens, "
                         "or use a model with a longer context")
    if id(model) not in _WARNED_CONTEXT:
        _WARNED_CONTEXT.add(id(model))
        log.warning("%s: beyond the lengths the model was trained on", text)


def derive_seed(seed: int, index: int | str) -> int:
    """A 63-bit seed for sub-stream `index` of `seed` (batches, requests, named tensors)."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def _eos_ids(tokenizer: Any, model: Any = None) -> set[int]:
    ids: set[int] = set()
    sources = [tokenizer.eos_token_id]
    if model is not None:
        sources.append(getattr(model.generation_config, "eos_token_id", None))
    for value in sources:
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(int(v) for v in value)
    return ids


def _split_completion(ids: list[int], eos: set[int]) -> tuple[list[int], str]:
    """Cut a generated row after its first EOS (later positions are padding)."""
    for i, tok in enumerate(ids):
        if tok in eos:
            return ids[: i + 1], "stop"
    return ids, "length"


class _RowMap:
    """The original row of each row a logits processor sees now: `generate_compacting` drops
    stopped rows between its generate() calls and tells the processors with `select`."""

    def __init__(self, width: int | None = None) -> None:
        self.width = width  # rows of the original batch
        self.rows: Any = None  # original index of each current row (None: all, in order)

    def select(self, keep: Any) -> None:
        """Only the current rows at positions `keep` go on."""
        import torch

        if self.rows is None and self.width is None:  # len(keep) would be the rows kept, not the batch's
            raise ValueError("a row map follows compaction only with its batch's width (rows=...)")
        current = self.rows if self.rows is not None else torch.arange(self.width)
        self.rows = current[keep.to(current.device)]


class _SampledLogprobs(_RowMap):
    """Logits processor, last in the list: records the log-probability of each sampled token.

    At step t it sees the processed scores it hands to the sampler, and, through `input_ids`,
    the token sampled at step t-1. It keeps only the previous step's scores and log-normaliser
    (O(batch × vocab) memory, unlike `output_scores`, which keeps every step), and one
    log-probability per row per step.

    Across the calls of `generate_compacting` it follows the batch's rows: `flush` records a
    call's last tokens, `select` keeps the rows that go on, and `finish` returns one row per
    original row (0 after a row stopped).
    """

    def __init__(self, rows: int | None = None) -> None:
        super().__init__(rows)
        self.steps: list[tuple[Any, Any]] = []  # (original rows, their log-probabilities)
        self._scores: Any = None
        self._lse: Any = None

    def _take(self, tokens: Any) -> None:
        picked = self._scores.gather(1, tokens.view(-1, 1)).squeeze(1)
        self.steps.append((self.rows, picked - self._lse))

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self._scores is not None:
            self._take(input_ids[:, -1])
        self._scores = scores
        self._lse = torch.logsumexp(scores.float(), dim=-1)
        return scores

    def flush(self, last_tokens: Any) -> None:
        """Record the tokens a generate() call sampled last (the next call starts afresh)."""
        if self._scores is not None:
            self._take(last_tokens)
        self._scores = self._lse = None

    def finish(self, last_tokens: Any) -> Any:
        """Per-row, per-step log-probabilities, shape (batch, generated length)."""
        import torch

        self.flush(last_tokens)
        width = self.width if self.width is not None else len(self.steps[0][1])
        out = torch.zeros((width, len(self.steps)), dtype=self.steps[0][1].dtype)
        for step, (rows, values) in enumerate(self.steps):
            out[rows if rows is not None else slice(None), step] = values.to(out.device)
        return out


def inverse_cdf_sample(scores: Any, u: Any) -> Any:
    """Row-wise draws from softmax(`scores`) by inverting the CDF at `u` (shape (batch, 1), in
    [0, 1)): token i is drawn for u in [F(i-1), F(i)), so with uniform u exactly with probability
    p_i. Tokens of zero probability (a -inf score: top-p's cut) are never drawn, even where the
    float64 CDF rounds at the top. Returns token ids, shape (batch, 1)."""
    import torch

    probs = torch.softmax(scores.double(), dim=-1)
    cdf = probs.cumsum(-1)
    token = torch.searchsorted(cdf, u.double() * cdf[:, -1:], right=True)
    last = probs.shape[-1] - 1 - (probs > 0).flip(-1).to(torch.uint8).argmax(-1, keepdim=True)
    return torch.minimum(token, last)


class _InverseCdfSampler(_RowMap):
    """Logits processor, after the recorder: draws each row's next token (`inverse_cdf_sample`,
    one uniform from the torch RNG per row) and leaves it the only finite score, so generate()'s
    greedy step (do_sample=False) takes it. The same distribution as generate()'s own
    `torch.multinomial`, which on this CPU costs ~0.7 ms per row per decoding step over
    SmolLM2's 49152-token vocabulary (11 ms at batch 15) against ~1 ms for this whole draw.

    With `width` set, every step draws one uniform per row of the original batch and the
    current rows (`rows`, original indices) take theirs: dropping stopped rows
    (`generate_compacting`) leaves every other row's draws, hence its tokens, as they were."""

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        u = torch.rand((self.width or scores.shape[0], 1), dtype=torch.float64, device=scores.device)
        if self.rows is not None:
            u = u[self.rows.to(u.device)]
        token = inverse_cdf_sample(scores, u)
        return torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)


def distinct_rows(input_ids: Any, attention_mask: Any) -> tuple[list[int], list[int]]:
    """(each row's group, each group's first row) of a padded token batch: rows equal in tokens
    and mask share a group; groups are numbered in order of first appearance."""
    import torch

    index: dict[tuple[int, ...], int] = {}
    group: list[int] = []
    first: list[int] = []
    for row, key in enumerate(torch.cat([input_ids, attention_mask], dim=1).tolist()):
        g = index.setdefault(tuple(key), len(index))
        if g == len(first):
            first.append(row)
        group.append(g)
    return group, first


#: Attention implementations that, under autocast, round the cached keys and values to the
#: autocast dtype before using them (SDPA and matmul are autocast's lower-precision ops).
AUTOCAST_ROUNDS_KV = ("sdpa", "eager")


@functools.cache
def _kv_layer() -> type:
    from transformers.cache_utils import DynamicLayer

    class KVLayer(DynamicLayer):
        """A plain `DynamicLayer` (the same keys and values, the same shapes) that decodes
        without copying its whole cache every step, and that keeps keys and values in the
        autocast dtype while autocast is on.

        *Room to grow.* `DynamicLayer.update` concatenates the cache with each step's new key
        and value, so every decoding step copies the whole cache of every layer (the torch
        profiler puts `aten::cat` at a third of a bf16 decoding step of 8 rows after 750 prompt
        tokens; by the clock it is less: bench_decode.py, 1 thread, 107 -> 98 ms a step at
        8 rows, within noise at 1-4, and 3.5% of the fast round's seed call of 15 hover_hard
        prompts). Here keys and values live in buffers with
        room at the end (`spare`: at least that many tokens, or a quarter of the length):
        a step writes its token into the room, and `keys` / `values` are views of the filled part.
        A buffer is copied only when its room runs out (once a 64-token call). The views hold
        the very values concatenation would give, so the attention and the logits are
        bit-identical. A tensor assigned from outside (`batch_select_indices`, `crop`, a
        stitched prompt cache) is kept as it is, with no room: the next step moves it into a
        buffer. Tensors with a gradient (the loss forward's prompt cache) take the
        concatenation path, since writing into a buffer autograd saved would break the backward.

        *Autocast dtype* (`round_to_autocast`, set for SDPA and eager attention). Under CPU bf16
        autocast with fp32 weights (the slow loop's rollouts and reference forward) the rotary
        embedding leaves keys in fp32, so a plain cache holds fp32 keys and values: each
        decoding step then reads the whole fp32 cache and autocast rounds all of it to bf16 for
        the attention. Storing new keys and values rounded once (when no gradient flows into
        them) gives the attention the same bf16 values (bit-identical logits) at half the
        bytes. Measured (SmolLM2-135M, 1 thread, 8 rows after 750 prompt tokens): 74 -> 56 ms
        a decoding step. Tensors that require a gradient stay as they are: the gradients of a
        prompt's copies are summed through the cache, and that sum belongs in fp32.
        """

        #: the least room (tokens) a buffer gets when it grows; 0: concatenate every step
        spare = 64

        def __init__(self, round_to_autocast: bool = False, **kwargs: Any) -> None:
            self.round_to_autocast = round_to_autocast
            self._kv: list[Any] = [None, None]  # key and value buffers
            self._length = [0, 0]  # tokens filled in each
            super().__init__(**kwargs)

        def _view(self, i: int) -> Any:
            buffer = self._kv[i]
            if buffer is None or buffer.dim() != 4 or buffer.shape[-2] == self._length[i]:
                return buffer
            return buffer[..., :self._length[i], :]

        def _assign(self, i: int, tensor: Any) -> None:
            self._kv[i] = tensor
            self._length[i] = tensor.shape[-2] if tensor is not None and tensor.dim() == 4 else 0

        keys = property(lambda self: self._view(0), lambda self, t: self._assign(0, t))
        values = property(lambda self: self._view(1), lambda self, t: self._assign(1, t))

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            import torch

            device = key_states.device.type
            if (self.round_to_autocast and torch.is_autocast_enabled(device)
                    and not key_states.requires_grad and not value_states.requires_grad):
                dtype = torch.get_autocast_dtype(device)
                key_states, value_states = key_states.to(dtype), value_states.to(dtype)
            new = (key_states, value_states)
            if not self._can_write(new):
                return super().update(key_states, value_states, *args, **kwargs)
            for i, states in enumerate(new):
                buffer, n = self._kv[i], self._length[i]
                end = n + states.shape[-2]
                if buffer.shape[-2] < end:  # out of room: a bigger buffer (the one copy)
                    grown = buffer.new_empty((*buffer.shape[:2], end + max(self.spare, end // 4),
                                              buffer.shape[-1]))
                    grown[..., :n, :] = buffer[..., :n, :]
                    buffer = self._kv[i] = grown
                buffer[..., n:end, :] = states
                self._length[i] = end
            return self.keys, self.values

        def _can_write(self, new: tuple[Any, Any]) -> bool:
            """Whether this step's keys and values can go into the buffers' room (else: concatenate)."""
            import torch

            if self.spare <= 0 or not self.is_initialized:
                return False
            inference = torch.is_inference_mode_enabled()
            for buffer, states in zip(self._kv, new, strict=True):
                if (buffer is None or buffer.dim() != 4 or states.requires_grad or buffer.requires_grad
                        or (buffer.is_inference() and not inference)  # (no in-place writes there)
                        or buffer.dtype != states.dtype or buffer.device != states.device
                        or buffer.shape[:2] != states.shape[:2] or buffer.shape[-1] != states.shape[-1]):
                    return False
            return True

    return KVLayer


def plain_dynamic_cache(model: Any) -> Any:
    """An empty DynamicCache for `model` if every layer of it is a plain (full-attention,
    growing) `DynamicLayer`, whose keys and values can be stitched row by row; else None.
    Its layers are `KVLayer`s: the same keys and values, with room to decode into, and (for
    SDPA and eager attention) kept in the autocast dtype while autocast is on: the same logits,
    a cheaper decoding step."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    rounds = getattr(model.config, "_attn_implementation", None) in AUTOCAST_ROUNDS_KV
    layer_class = _kv_layer()
    cache.layers = [layer_class(round_to_autocast=rounds) for _ in layers]
    return cache


def left_aligned(attention_mask: Any) -> bool:
    """Every row's real tokens form one block at the right end (left padding)."""
    import torch

    lengths = attention_mask.sum(-1, keepdim=True)
    width = attention_mask.shape[1]
    expected = torch.arange(width, device=attention_mask.device)[None, :] >= width - lengths
    return bool((attention_mask.bool() == expected).all())


#: Fewest leading tokens distinct prompts must share before `prefill_rows_alone` runs them once
#: for all of them (the chat template's header alone is shorter).
MIN_SHARED_PREFIX = 16
#: ... and, for the first span (the one that gives the rows a cache), at least this fraction of
#: the longest row's tokens after it. A row prefilled over a cache runs its attention through an
#: explicit mask instead of SDPA's causal kernel. Measured (bench_prefix.py, SmolLM2-135M bf16,
#: 1 thread, hover_hard): 15 prompts sharing the 82-token seed context ran 10.6% fewer tokens
#: in the same time (19.6 vs 19.8 s); 3 sharing a 566-token context, 32% fewer in 20-22% less.
MIN_SHARED_FRACTION = 0.25


def prefix_tree(rows: Sequence[Sequence[int]], extend: Callable[[Any, int, int, int], Any],
                min_shared: int = MIN_SHARED_PREFIX, min_fraction: float = MIN_SHARED_FRACTION) -> dict[int, Any]:
    """Run token `rows` through `extend` with the leading spans they share run once.

    `extend(node, row, start, end)` runs `rows[row][start:end]` on top of `node` (None: from
    nothing; else what an earlier call returned, which holds the tokens before `start`) and
    returns the new node. Rows are split where they first differ, recursively (a radix tree);
    a span several rows share is run once when it is at least `min_shared` tokens long and, if
    it is the rows' first, `min_fraction` of the longest one's tokens after it (else each row
    runs it); it never reaches a row's last token. Returns each row's final node."""
    out: dict[int, Any] = {}

    def visit(members: list[int], depth: int, node: Any) -> None:
        if len(members) == 1:
            out[members[0]] = extend(node, members[0], depth, len(rows[members[0]]))
            return
        head, shortest = rows[members[0]], min(len(rows[m]) for m in members)
        split = depth
        while split < shortest - 1 and all(rows[m][split] == head[split] for m in members):
            split += 1
        need = max(min_shared, 1)
        if node is None:  # the rows' first span: it also buys their attention a mask
            need = max(need, min_fraction * (max(len(rows[m]) for m in members) - split))
        if split - depth >= need:
            node, depth = extend(node, members[0], depth, split), split
        branches: dict[int, list[int]] = {}
        for m in members:
            branches.setdefault(rows[m][split], []).append(m)
        if len(branches) == 1:  # one row is the others' prefix but its last token: each alone
            for m in members:
                out[m] = extend(node, m, depth, len(rows[m]))
            return
        for branch in branches.values():
            visit(branch, depth, node)

    if rows:
        visit(list(range(len(rows))), 0, None)
    return out


def prefill_rows_alone(model: Any, input_ids: Any, attention_mask: Any, column_positions: bool = False,
                       autocast: Callable[[], Any] | None = None, share_prefixes: bool = True) -> Any:
    """The KV cache of a left-padded batch with each row run through `model` alone, without its
    padding, its keys/values placed at the right end of the row over zeros under the padding
    (which the attention mask hides). None when the model's cache cannot be stitched this way
    (not all plain full-attention layers), the padding is not on the left, or no row has a
    token.

    Positions: by default each row counts its own tokens from 0, as generate() does from the
    attention mask; `column_positions` gives each token its column index instead, as TRL's
    training forward (no position ids) does. Autograd-safe: under a gradient, each row's
    activations are kept and the stitched cache carries its gradient back to them.

    Shared prefixes (`share_prefixes`, with positions from 0 and no gradient: generation).
    Leading tokens several rows share (a context in the system turn, the same for every
    problem of a GEPA candidate's minibatch or validation call, and the task's opening lines)
    are run once (`prefix_tree`); each row then runs only its own tokens after them, attending
    to a copy of their keys and values at the same positions: the same attention as one forward
    of the row, up to the order of floating-point sums. (vLLM caches prefixes by itself.)
    """
    import torch

    cache = plain_dynamic_cache(model)
    if cache is None or not left_aligned(attention_mask):
        return None
    width = input_ids.shape[1]
    lengths = attention_mask.sum(-1).tolist()
    real = [row for row, n in enumerate(lengths) if n > 0]

    def extend(node: Any, i: int, start: int, end: int) -> Any:
        """Row `real[i]`'s real tokens [start, end) into a copy of `node` (a cache of those before)."""
        row, n = real[i], lengths[real[i]]
        cache = plain_dynamic_cache(model)
        for layer, held in enumerate(node.layers if node is not None else ()):
            cache.update(held.keys, held.values, layer)  # a copy: this row's tokens append to it
        first = (width - n if column_positions else 0) + start
        with autocast() if autocast else nullcontext():
            model(input_ids=input_ids[row:row + 1, width - n + start:width - n + end].to(model.device),
                  past_key_values=cache, position_ids=torch.arange(first, first + end - start, device=model.device)[None],
                  use_cache=True, logits_to_keep=1)
        return cache

    if share_prefixes and not column_positions and not torch.is_grad_enabled():
        caches = prefix_tree([input_ids[row, width - lengths[row]:].tolist() for row in real], extend)
    else:
        caches = {i: extend(None, i, 0, lengths[row]) for i, row in enumerate(real)}
    own: list[Any] = [None] * len(lengths)
    for i, row in enumerate(real):
        own[row] = caches[i]
    template = next((c for c in own if c is not None), None)
    if template is None:
        return None
    for layer in range(len(cache.layers)):
        stitched = []
        for part in ("keys", "values"):
            like = getattr(template.layers[layer], part)
            rows = []
            for n, c in zip(lengths, own, strict=True):
                padding = like.new_zeros((1, like.shape[1], width - n, like.shape[3]))
                rows.append(padding if c is None else torch.cat([padding, getattr(c.layers[layer], part)], dim=2))
            stitched.append(torch.cat(rows))
        cache.update(*stitched, layer)
        for c in own:  # this layer's row caches are copied: free them (the peak stays ~1x the cache)
            if c is not None:
                c.layers[layer].keys = c.layers[layer].values = None
    return cache


def shared_prefill(model: Any, input_ids: Any, attention_mask: Any,
                   alone: bool | None = None) -> Any:
    """The KV cache of a left-padded prompt batch (all but the last position), each distinct row
    run through `model` once and its cache rows copied to every row that repeats it; pass it to
    `generate(..., past_key_values=cache)`, which then runs only the last prompt position.

    Evaluation samples k completions of one prompt and RL G of one (context, problem): without
    this, generate() prefills every copy, and on long prompts (CodeIO's ~700-1000 tokens) the
    prefill is most of the cost.

    `alone` (default: on CPU) prefills each distinct row by itself, without its padding, and
    stitches the rows' keys/values into one left-padded cache. A padded batch pays for its
    padding and, through its attention mask, for SDPA's masked path. Measured on this CPU
    (SmolLM2-135M, bf16, 1 thread), model forwards of the same prompts as a padded batch and
    one at a time: 9 hover_hard 9.0 vs 6.3 s, 9 codeio 8.8 vs 5.0 s, 16 math 1.8 vs 1.2 s; through
    HFGenerator (stitching included), 9 hover_hard prompts' prefill 8.1 -> 6.4 s and a 64-token
    call 12.0 -> 10.1 s. On a GPU the batch wins, so there the distinct rows are prefilled as
    one batch (and only when some row repeats).
    Models whose cache is not plain full-attention layers (sliding windows, linear attention)
    always take the batched path.

    None when there is nothing to do (generate()'s own prefill is the same). Call it under
    no_grad/inference_mode.
    """
    import torch
    from transformers import DynamicCache

    if input_ids.shape[1] < 2:
        return None
    rows, first = distinct_rows(input_ids, attention_mask)
    if alone is None:
        alone = model.device.type == "cpu"
    device = model.device
    cache = prefill_rows_alone(model, input_ids[first, :-1], attention_mask[first, :-1]) if alone else None
    if cache is None:
        if len(first) == len(rows):
            return None
        ids = input_ids[first, :-1].to(device)
        mask = attention_mask[first, :-1].to(device)
        # Left padding: positions count real tokens only, as generate() computes them.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
              use_cache=True, logits_to_keep=1)
    if len(first) < len(rows):
        cache.batch_select_indices(torch.tensor(rows, device=device))
    return cache


def masked_decoding(input_ids: Any, attention_mask: Any, pad_id: int,
                    device: Any = None) -> tuple[Any, Any, int]:
    """(input ids, attention mask, columns added): when the model runs on CPU (`device`, by
    default the batch's), one column of left padding (masked out) in front of a batch in which
    some row has none, so that every row of every later decoding step has some.

    transformers drops the attention mask of a batch without padding, and SDPA then decodes
    grouped-query attention through `enable_gqa`, which on this CPU is 1.3-2.7x slower than the
    masked path (one query token packed over the key/value heads). Measured (bench_decode.py:
    SmolLM2-135M, 1 thread, 750 prompt tokens), a decoding step without the mask against with
    the column: 8 rows 297 vs 109 ms in bf16, 337 vs 151 ms in fp32 under bf16 autocast;
    2 rows 105 vs 57 ms in bf16. The column changes nothing else: positions come from the
    mask, and its key/value are masked out (the attention's summation order, hence a sampled
    token now and then, does change). On a GPU the unmasked kernels are the fast ones, so
    nothing is added there.
    """
    import torch

    on = (device if device is not None else input_ids.device).type == "cpu"
    if not on or input_ids.shape[1] == 0 or not bool(attention_mask[:, 0].any()):
        return input_ids, attention_mask, 0
    rows = input_ids.shape[0]
    return (torch.cat([input_ids.new_full((rows, 1), pad_id), input_ids], dim=1),
            torch.cat([attention_mask.new_zeros((rows, 1)), attention_mask], dim=1), 1)


#: `generate_compacting` ends a generate() call once this fraction of its rows (at least one)
#: has stopped, and the next call goes on with the others only.
COMPACT_FRACTION = 0.25


@functools.cache
def _stop_for_compaction() -> type:
    from transformers import StoppingCriteria

    class StopForCompaction(StoppingCriteria):
        """Ends a generate() call (every row reported done) once `need` rows have produced an
        EOS token since position `start`."""

        def __init__(self, start: int, eos: Any, need: int) -> None:
            self.start, self.eos, self.need = start, eos, need

        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            import torch

            done = torch.isin(input_ids[:, self.start:], self.eos.to(input_ids.device)).any(-1)
            return torch.full_like(done, int(done.sum()) >= self.need)

    return StopForCompaction


def generate_compacting(generate: Callable[..., Any], model: Any, input_ids: Any, attention_mask: Any,
                        cache: Any, *, eos: Sequence[int], max_new_tokens: int, pad_id: int,
                        hooks: Sequence[Any] = (), fraction: float = COMPACT_FRACTION,
                        **kwargs: Any) -> Any:
    """`generate(input_ids=..., attention_mask=..., **kwargs)`'s output (prompt and completion
    tokens, pad after a row's end), decoding only the rows that have not stopped.

    generate() runs every row until the last one stops: on a batch whose completions end at
    different lengths (RL's and GEPA's: mean ~35 of 64 tokens on hover_hard, with one row at
    64 in every step) most of the rows a late decoding step computes are finished ones. Here a
    call ends once `fraction` of its rows (at least one) have stopped; the rows still going
    continue in the next call from the same KV cache (`cache.batch_select_indices`), with the
    tokens they have so far. `hooks` (logits processors with `select(keep)` and optionally
    `flush(last_tokens)`) follow the rows: `_SampledLogprobs` and `_InverseCdfSampler` (whose
    per-row draws, hence tokens, do not depend on which rows are left). generate()'s own
    sampler (`torch.multinomial`) draws for the rows present, so there the random stream, not
    the distribution, differs from one call.

    `cache` is the prompt's KV cache (`shared_prefill`), or None for a fresh DynamicCache.
    """
    import math

    import torch
    from transformers import DynamicCache, StoppingCriteriaList

    if cache is None:
        cache = DynamicCache(config=model.config)
    rows, width = input_ids.shape
    out = torch.full((rows, width + max_new_tokens), pad_id, dtype=input_ids.dtype, device=input_ids.device)
    out[:, :width] = input_ids
    eos_ids = torch.tensor(sorted(eos), dtype=input_ids.dtype)
    active = torch.arange(rows, device=input_ids.device)
    ids, mask, made = input_ids, attention_mask, 0
    config = kwargs.pop("generation_config", None)
    while True:
        stop = _stop_for_compaction()(ids.shape[1], eos_ids, max(1, math.ceil(len(active) * fraction)))
        if config is not None:  # (generate() wants max_new_tokens in the config it is given)
            length = {"generation_config": copy.deepcopy(config)}
            length["generation_config"].max_new_tokens = max_new_tokens - made
        else:
            length = {"max_new_tokens": max_new_tokens - made}
        seq = generate(input_ids=ids, attention_mask=mask, past_key_values=cache,
                       stopping_criteria=StoppingCriteriaList([stop]), **length, **kwargs)
        new = seq[:, ids.shape[1]:]
        out[active, width + made: width + made + new.shape[1]] = new
        made += new.shape[1]
        for hook in hooks:
            if hasattr(hook, "flush"):
                hook.flush(new[:, -1])
        going = ~torch.isin(new, eos_ids.to(new.device)).any(-1)
        if made >= max_new_tokens or not bool(going.any()):
            return out[:, :width + made]
        keep = going.nonzero().squeeze(1)
        cache.batch_select_indices(keep)
        for hook in hooks:
            hook.select(keep.cpu())
        active = active[keep]
        ids = seq[keep]
        mask = torch.cat([mask[keep], mask.new_ones((len(keep), new.shape[1]))], dim=1)


class HFGenerator:
    """Batched generation with transformers `generate` (CPU, one GPU, or one rank of an FSDP2-sharded
    model: see `inference_mode`, and `compact`/`share_prefill` off, which run rank-dependent forwards).

    Prompts are sorted by length so that each batch pads little, generated in batches of
    `batch_size` with left padding, and returned in the caller's order. Sampling is seeded per
    batch from `params.seed` inside a forked RNG, so results depend only on the inputs and the
    seed, and the caller's global RNG is left untouched.
    """

    #: draw tokens with `_InverseCdfSampler` (False: generate()'s own torch.multinomial)
    inverse_cdf_sampling = True
    #: decode only the rows that have not stopped (`generate_compacting`; False: one generate())
    compact = True
    #: on CPU, one masked-out column of padding in front of every batch (`masked_decoding`)
    pad_column = True
    #: decode under `torch.inference_mode` (False: `torch.no_grad`, for an FSDP2-sharded model,
    #: whose gather buffers are made once and reused by the training forward after it: made under
    #: inference mode they could not be saved for backward; TRL generates under no_grad too)
    inference_mode = True

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 8,
                 chat_template_kwargs: dict[str, Any] | None = None,
                 share_prefill: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self.model = model
        #: the config key its callers' max_new_tokens come from, for `check_context`'s message
        self.length_key = "generation.max_new_tokens"
        self.share_prefill = share_prefill
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.chat_template_kwargs = chat_template_kwargs
        self.pad_id = tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = tokenizer.eos_token_id
        self.eos = _eos_ids(tokenizer, model)
        #: called with (rows done, rows in the call) after each batch of a `generate` call, for
        #: progress inside a long call (an evaluation's 32 samples are one call); None: nothing
        self.on_batch: Callable[[int, int], None] | None = None

    def render_prompts(self, conversations: Sequence[Conversation]) -> list[str]:
        """Prompt texts as this generator renders them."""
        return render_prompts(self.tokenizer, conversations, self.chat_template_kwargs)

    def encode_prompts(self, conversations: Sequence[Conversation]) -> list[list[int]]:
        """Prompt token ids as this generator feeds them to the model."""
        return encode_prompts(self.tokenizer, conversations, self.chat_template_kwargs)

    def _generation_kwargs(self, params: SamplingParams, recorder: Any, rows: int | None = None) -> dict[str, Any]:
        from transformers import (
            GenerationConfig,
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopPLogitsWarper,
        )

        greedy = params.temperature <= 0
        # Temperature and top-p are applied by our own processors, placed before the recorder:
        # generate() would append its warpers *after* user processors, so the recorder would
        # see unwarped logits. generate() itself is asked for no warping at all (top_k=0
        # overrides its global default of 50).
        # `recorder` follows them. With `inverse_cdf_sampling` the draw itself is ours too
        # (`_InverseCdfSampler`, after the recorder) and generate() decodes greedily over it.
        processors: list[Any] = []
        sampling: dict[str, Any] = {}
        ours = not greedy and self.inverse_cdf_sampling
        if not greedy:
            if params.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_p < 1.0:
                processors.append(TopPLogitsWarper(params.top_p))
            if not ours:
                sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=not greedy and not ours,
            eos_token_id=sorted(self.eos),
            pad_token_id=self.pad_id,
            bos_token_id=self.tokenizer.bos_token_id,
            **sampling,
        )
        processors.append(recorder)
        if ours:
            processors.append(_InverseCdfSampler(rows))
        return {"generation_config": config, "logits_processor": LogitsProcessorList(processors)}

    @contextmanager
    def _neutral_generation_config(self) -> Iterator[None]:
        """Hide the checkpoint's generation defaults during a call.

        generate() fills every unset option from `model.generation_config`, so a checkpoint's
        `repetition_penalty` or `min_p` (hub models ship such files) would silently change the
        sampling distribution. Only `SamplingParams` should decide it.
        """
        from transformers import GenerationConfig

        saved = self.model.generation_config
        self.model.generation_config = GenerationConfig(
            bos_token_id=saved.bos_token_id, eos_token_id=saved.eos_token_id,
            pad_token_id=saved.pad_token_id,
        )
        try:
            yield
        finally:
            self.model.generation_config = saved

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams,
                        seed: int) -> list[Generation]:
        import torch

        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids):] = 1
        device = self.model.device
        if self.pad_column:  # on CPU every row gets padding: decoding keeps SDPA's masked path
            input_ids, attention, added = masked_decoding(input_ids, attention, self.pad_id, device)
            width += added
        recorder = _SampledLogprobs(len(prompts))
        kwargs = self._generation_kwargs(params, recorder, len(prompts))
        devices = [device.index or 0] if device.type == "cuda" else []
        with (torch.random.fork_rng(devices=devices),
              torch.inference_mode() if self.inference_mode else torch.no_grad(),
              self._neutral_generation_config()):
            cache = shared_prefill(self.model, input_ids, attention) if self.share_prefill else None
            torch.manual_seed(seed)
            if self.compact:
                hooks = [p for p in kwargs["logits_processor"] if hasattr(p, "select")]
                out = generate_compacting(self.model.generate, self.model, input_ids.to(device),
                                          attention.to(device), cache, eos=sorted(self.eos),
                                          max_new_tokens=params.max_new_tokens, pad_id=self.pad_id,
                                          hooks=hooks, **kwargs)
            else:
                if cache is not None:
                    kwargs["past_key_values"] = cache
                out = self.model.generate(
                    input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs
                )
        generated = out[:, width:]
        step_logprobs = recorder.finish(generated[:, -1]).float().cpu()
        results = []
        opener = trace_opener(self.tokenizer, self.chat_template_kwargs)
        for row, ids in enumerate(generated.tolist()):
            completion, reason = _split_completion(ids, self.eos)
            results.append(Generation(
                text=opener + self.tokenizer.decode(completion, skip_special_tokens=True),
                prompt_tokens=len(prompts[row]),
                completion_tokens=len(completion),
                logprob_sum=float(step_logprobs[row, : len(completion)].sum()),
                completion_ids=tuple(completion),
                finish_reason=reason,
                prompt_ids=tuple(prompts[row]),
                token_logprobs=tuple(step_logprobs[row, : len(completion)].tolist()),
            ))
        return results

    def generate(self, conversations: list[Conversation],
                 params: SamplingParams) -> list[Generation]:
        """One completion per conversation, in order."""
        prompts = self.encode_prompts(conversations)
        if prompts:
            check_context(self.model, max(len(p) for p in prompts), params.max_new_tokens, self.length_key)
        # Longest first: similar lengths share a batch (less padding), and the largest
        # memory peak comes first rather than after minutes of work. Equal prompts stay
        # adjacent, so their copies share a batch and its prefill (`shared_prefill`).
        order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), prompts[i]))
        results: list[Generation | None] = [None] * len(prompts)
        for b, start in enumerate(range(0, len(order), self.batch_size)):
            idx = order[start: start + self.batch_size]
            batch = self._generate_batch([prompts[i] for i in idx], params,
                                         derive_seed(params.seed, b))
            for i, gen in zip(idx, batch, strict=True):
                results[i] = gen
            if self.on_batch is not None:
                self.on_batch(min(start + self.batch_size, len(order)), len(order))
        return [r for r in results if r is not None]


VLLM_PIN = "vllm==0.31.0"


class VLLMGenerator:
    """Generation with vLLM on a CUDA GPU (paper-scale runs).

    Prompts are tokenised here with `encode_prompts` and passed as token ids, so vLLM sees
    exactly what `HFGenerator` would. Each request gets its own seed derived from
    `params.seed` and its index, so results do not depend on how vLLM schedules batches.
    `logprobs=0` asks for the sampled token's log-probability only, and
    ``logprobs_mode="processed_logprobs"`` makes it the post-temperature/top-p one, matching
    `HFGenerator`.
    """

    def __init__(self, model_path: str | Path, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.85, max_model_len: int | None = None,
                 seed: int = 0, chat_template_kwargs: dict[str, Any] | None = None,
                 **llm_kwargs: Any) -> None:
        import torch

        missing = []
        if not torch.cuda.is_available():
            missing.append("no CUDA GPU")
        try:
            import vllm
        except ImportError:
            vllm = None
            missing.append("no vllm installed")
        if missing:
            raise RuntimeError(
                f"vLLM generation needs a CUDA GPU and `pip install {VLLM_PIN}`; "
                f"this machine has {' and '.join(missing)} (use backend 'hf' here)"
            )
        from fastslow.model.convert import load_tokenizer

        self.tokenizer = load_tokenizer(model_path)
        self.chat_template_kwargs = chat_template_kwargs
        self.eos = _eos_ids(self.tokenizer)
        self.llm = vllm.LLM(
            model=str(model_path),
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,  # the K contexts are shared prefixes of many prompts
            **llm_kwargs,
        )

    def render_prompts(self, conversations: Sequence[Conversation]) -> list[str]:
        """Prompt texts as this generator renders them."""
        return render_prompts(self.tokenizer, conversations, self.chat_template_kwargs)

    def encode_prompts(self, conversations: Sequence[Conversation]) -> list[list[int]]:
        """Prompt token ids as this generator feeds them to the model."""
        return encode_prompts(self.tokenizer, conversations, self.chat_template_kwargs)

    def generate(self, conversations: list[Conversation],
                 params: SamplingParams) -> list[Generation]:
        """One completion per conversation, in order."""
        import vllm
        from vllm.inputs import TokensPrompt

        prompts = self.encode_prompts(conversations)
        greedy = params.temperature <= 0
        sampling = [
            vllm.SamplingParams(
                n=1,
                temperature=0.0 if greedy else params.temperature,
                top_p=1.0 if greedy else params.top_p,
                max_tokens=params.max_new_tokens,
                seed=derive_seed(params.seed, i),
                logprobs=0,
                skip_special_tokens=True,
            )
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids in prompts], sampling, use_tqdm=False
        )
        results = []
        opener = trace_opener(self.tokenizer, self.chat_template_kwargs)
        for ids, out in zip(prompts, outputs, strict=True):
            comp = out.outputs[0]
            token_ids = list(comp.token_ids)
            token_logprobs = () if comp.logprobs is None else tuple(
                float(step[t].logprob) for step, t in zip(comp.logprobs, token_ids, strict=True))
            if comp.cumulative_logprob is not None:
                logprob = float(comp.cumulative_logprob)
            else:  # as before: without per-token log-probs there is nothing to sum (an error)
                logprob = sum(step[t].logprob for step, t in zip(comp.logprobs, token_ids, strict=True))
            results.append(Generation(
                text=opener + comp.text,
                prompt_tokens=len(ids),
                completion_tokens=len(token_ids),
                logprob_sum=logprob,
                completion_ids=tuple(token_ids),
                finish_reason="stop" if comp.finish_reason == "stop" else "length",
                prompt_ids=tuple(ids),
                token_logprobs=token_logprobs,
            ))
        return results


def make_generator(backend: Literal["hf", "vllm"], model_path: str | Path,
                   dtype: str = "auto", batch_size: int = 8, device: str | None = None,
                   gpu_memory_utilization: float | None = None, max_model_len: int | None = None,
                   **kwargs: Any) -> Generator:
    """A generator for the model at `model_path`: "hf" (transformers) or "vllm" (GPU).

    `gpu_memory_utilization` (config `generation.gpu_memory_utilization`; None: VLLMGenerator's
    default) and `max_model_len` (None: the model's whole context) size the vLLM engine; the hf
    backend ignores both. `device` (hf): None is the GPU when there is one (evaluation, the fast
    round and a local reflection model sampled on the CPU of a GPU node), else the CPU.
    """
    if backend == "hf":
        import torch

        from fastslow.model.convert import load_model, load_tokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        model = load_model(model_path, dtype=dtype, device=device)
        return HFGenerator(model, load_tokenizer(model_path), batch_size=batch_size, **kwargs)
    if backend == "vllm":
        if gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        return VLLMGenerator(model_path, dtype=dtype, max_model_len=max_model_len, **kwargs)
    raise ValueError(f"unknown generation backend {backend!r}: expected 'hf' or 'vllm'")
