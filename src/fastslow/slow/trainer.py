"""TRL's `GRPOTrainer`, configured for CISPO and used as a library of parts by our own loop.

How pool conditioning is done, and why this way
-----------------------------------------------
Our loop (`fastslow.slow.loop`) builds each RL step's P*G rollout rows itself, problem-major and
context-minor (see `expand_rows`): the G copies of a problem carry the K contexts, G/K copies
each, as the system prompt. The rows go straight into TRL's
`_generate_and_score_completions`, which samples one completion per row (TRL's HF-generate and
vLLM-colocate paths sample per row, so every copy keeps its own context), scores them with our
reward function, and computes advantages over each run of `num_generations` consecutive rows.
So the baseline is chosen by one number, no TRL code changed:

* ``baseline="problem"``: ``num_generations = G``: one group per problem, across contexts;
* ``baseline="prompt"``:  ``num_generations = G/K``: one group per (problem, context).

The alternatives were heavier: a dataset of (problem, context) rows needs a custom sampler that
keeps a problem's K contexts together and rebuilds the dataset whenever the pool changes;
`rollout_func` replaces TRL's generation (its own vLLM calls) only to change a prompt; a
`_generate_and_score_completions` override would copy 600 lines. What we do override is small:
timers around generation and scoring (for the step-time split), and a stash of the per-token
log-probabilities and entropies of the training forward pass, which gives each rollout's
sampling log-prob sum and the step's entropy without another forward. And, in one process,
each distinct prompt's forward runs once for its copies (a step holds each prompt G/K times):
in HF generation (`shared_prefill`), in the KL reference forward, and in the loss forward of a
micro batch that holds several copies (`shared_prefix_logps`), and a prompt whose copies span
several micro batches runs forward and backward once a step (`PromptGradients`). On CPU those prompts also run one
at a time without their padding (`fastslow.model.generation.prefill_rows_alone`), which costs
less there than a padded batch. Rows sampled elsewhere (`reuse_rows`, the fast round's) replace
generated ones; on the HF path their sampler's per-token log-probs become their old log-probs in
the loss (`behaviour_logps`), as vLLM's do in TRL's own importance-sampling correction.

Why our loop and not `trainer.train()`: a cycle is T steps with a *different pool each cycle*
and must resume bit-exactly from the previous cycle's files. Owning the ~30-line loop makes the
data position, RNG and optimiser state explicit (see loop.py) instead of relying on the HF
Trainer's epoch/sampler skipping. The loss, the advantage computation, the KL reference, the
optimiser and the scheduler are TRL's and transformers' own.

Several processes (``accelerate launch``, see `fastslow.launch`)
----------------------------------------------------------------
Each of the N ranks gets a contiguous 1/N slice of the step's P*G rows (`rank_slice`). TRL's
`_generate_and_score_completions` expects exactly that: every rank generates and scores its own
rows, the rewards are gathered across ranks in rank order (so the groups of `num_generations`
consecutive rows are the same as in one process), advantages are computed over the whole step
and each rank keeps the slice `process_index * rows .. (process_index + 1) * rows`. The CISPO loss
divides each rank's token sum by (all ranks' completion tokens) / N, and data-parallel gradient
averaging divides by N again: the gradient is the whole step's token mean, as in one process.
`grpo_args` therefore sets the per-rank micro batch and accumulation so that
micro x accumulation x N = P*G, and `build_trainer` passes the model and optimiser through the
trainer's own `accelerator.prepare` (DDP, or FSDP2 from the launcher's config; the accelerator is
configured by the environment `accelerate launch` sets). DeepSpeed is refused: its engine steps
the optimiser inside `backward`, which our explicit step would contradict.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from fastslow.slow.config import SlowConfig
from fastslow.tasks.base import Problem, Task, build_messages

log = logging.getLogger(__name__)


def expand_rows(problems: Sequence[Problem], contexts: Sequence[tuple[str, str]],
                num_generations: int) -> list[dict[str, Any]]:
    """The P*G rollout rows of one step: problem-major, then context, then copy.

    Copy g of a problem gets context g // (G/K), so each consecutive run of G rows is one
    problem (the per-problem group) and each run of G/K rows is one (problem, context) pair
    (the per-prompt group).
    """
    per_context = num_generations // len(contexts)
    rows = []
    for problem in problems:
        for context_id, text in contexts:
            for _ in range(per_context):
                rows.append({
                    "prompt": build_messages(text, problem),
                    "problem_id": problem.id,
                    "context_id": context_id,
                })
    return rows


class TaskReward:
    """A TRL reward function that calls `task.reward` and records what the rollout table needs.

    TRL passes the dataset columns of each row as keyword lists; we look the problem up by id.
    With `tokenizer`, a completion's text is its token ids decoded (special tokens skipped), as
    our generators decode theirs; without, the content of TRL's completion message. TRL parses a
    completion into its message with the tokenizer's `response_template` when one is set, which
    may move a reasoning trace out of the content (and the reward, the rollout tables and GEPA's
    feedback would read the answer without its trace). Either way the text comes after `opener`:
    the reasoning-trace opener the chat template wrote into the prompt, if any
    (`fastslow.model.generation.trace_opener`), so a trace cut off reads as one, as our
    generators' completions do.
    """

    __name__ = "task_reward"  # TRL names the reward's metrics after this

    def __init__(self, task: Task, problems: dict[str, Problem], opener: str = "", tokenizer: Any = None):
        self.task = task
        self.problems = problems
        self.opener = opener
        self.tokenizer = tokenizer
        self.last_texts: list[str] = []
        self.last_rewards: list[float] = []
        self.last_feedback: list[str] = []

    def __call__(self, prompts: list[Any], completions: list[Any], problem_id: list[str],
                 completion_ids: list[list[int]] | None = None, **_: Any) -> list[float]:
        if self.tokenizer is not None and completion_ids is not None:
            texts = [self.opener + t for t in self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)]
        else:
            texts = [self.opener + (c[-1]["content"] if isinstance(c, list) else str(c)) for c in completions]
        problems = [self.problems[pid] for pid in problem_id]
        rewards = [float(self.task.reward(p, t)) for p, t in zip(problems, texts, strict=True)]
        self.last_texts, self.last_rewards = texts, rewards
        self.last_feedback = [self.task.feedback(p, t) for p, t in zip(problems, texts, strict=True)]
        return rewards


def world_size() -> int:
    """Processes of this training job: WORLD_SIZE as set by `accelerate launch` (torchrun), else 1.

    Read from the environment because the split must be known before the trainer (and with it
    torch.distributed) exists.
    """
    from fastslow.launch import env_int

    return env_int("WORLD_SIZE", 1)


def process_rank() -> int:
    """This process's global rank: RANK as set by `accelerate launch`, else 0 (one process)."""
    from fastslow.launch import env_int

    return env_int("RANK", 0, minimum=0)


def per_rank_batches(cfg: SlowConfig, num_processes: int) -> tuple[int, int]:
    """(micro batch, accumulation steps) of each of `num_processes` ranks for one RL step.

    Every rank trains on P*G / N rows in micro batches of `micro_batch_size` (None: all of the
    rank's rows at once). Raises a one-line ValueError when P*G does not split that way.
    """
    rows = cfg.rollouts_per_step
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if rows % num_processes:
        raise ValueError(f"slow loop: P*G = {cfg.problems_per_step}*{cfg.num_generations} = {rows} "
                         f"rollouts per step cannot be split over {num_processes} processes")
    micro = cfg.micro_batch_size or rows // num_processes
    if rows % (num_processes * micro):
        raise ValueError(f"slow loop: P*G = {cfg.problems_per_step}*{cfg.num_generations} = {rows} "
                         f"rollouts per step must be divisible by processes x micro_batch_size = "
                         f"{num_processes} x {micro} = {num_processes * micro}")
    return micro, rows // (num_processes * micro)


def rank_slice(num_rows: int, rank: int, num_processes: int) -> slice:
    """The contiguous rows of `rank` among `num_processes` (TRL slices advantages the same way)."""
    per_rank = num_rows // num_processes
    return slice(rank * per_rank, (rank + 1) * per_rank)


def _grpo_trainer_class() -> type:
    from trl import GRPOTrainer

    class PoolGRPOTrainer(GRPOTrainer):
        """GRPOTrainer plus timers and a stash of the training forward's per-token outputs."""

        def reset_step_stats(self) -> None:
            self.timings = {"generation": 0.0, "scoring": 0.0}
            self.stash: list[tuple[Any, Any]] = []
            self.reused: set[int] = set()  # rows of the last generation served from `reuse_rows`
            self.reuse_mismatches = 0  # given rows whose prompt tokens are not TRL's (generated)
            #: vLLM path: given rows without their per-token sampling log-probs (generated)
            self.reuse_without_logprobs = 0
            #: HF path: reused rows without their sampler's per-token log-probs (trained as on-policy)
            self.reuse_unweighted = 0
            #: HF path: reused row -> the per-token log-probs of the policy that sampled it
            #: (`behaviour_logps`); consumed by `_generate_and_score_completions`
            self.behaviour: dict[int, Sequence[float]] = {}
            self._loss_inputs: dict[str, Any] | None = None
            #: this step's reference forward was skipped (`policy_is_reference`)
            self.reference_skipped = False

        #: the weights are still the KL reference's (set by the loop before each step: a run's
        #: first steps, until an optimiser step with lr > 0, e.g. step 0 of the warm-up). The
        #: reference forward is then skipped: each loss forward takes its own log-probs as the
        #: reference's, so KL and its gradient are exactly 0, as they are at θ = θ_ref.
        policy_is_reference = False

        #: row -> (prompt ids, completion ids, per-token sampling log-probs or None) sampled
        #: before this step (the fast round, `fast.reuse_in_slow`, or an earlier step of its block,
        #: `slow.steps_per_generation`): the next generation takes these rows as they are and
        #: generates the others. Consumed by it.
        reuse_rows: dict[int, tuple[Sequence[int], Sequence[int], Sequence[float] | None]] = {}

        def _generate(self, prompts: list) -> Any:
            start = time.perf_counter()
            try:
                return super()._generate(prompts)
            finally:
                self.timings["generation"] += time.perf_counter() - start

        share_prefill = True
        #: the plain generate path decodes only the rows that have not stopped (`generate_compacting`)
        compact_generation = True
        #: the step's `PromptGradients` while its loss forwards run (set by the loop), else None
        prompt_grads: PromptGradients | None = None

        def _generate_single_turn(self, prompt_ids: Any, images: Any, multimodal_fields: Any,
                                  *args: Any, **kwargs: Any) -> Any:
            """TRL's generation of completion ids for `prompt_ids`, except the rows of
            `reuse_rows` whose prompt tokens are exactly TRL's: those keep their given completion
            (a row whose tokens differ is generated and counted in `reuse_mismatches`). On the
            vLLM path TRL also gets each token's sampling log-prob (for its importance-sampling
            correction): a reused row then needs its own, else it is generated too (counted in
            `reuse_without_logprobs`). Text prompts only.

            On the vLLM path the weights are synced into vLLM first, on every rank, whatever rows
            are reused (`sync_vllm_weights`). Where generation is itself a collective (FSDP without
            vLLM: HF `generate` decodes in lockstep across ranks, `synced_gpus`), a rank whose
            rows were all reused still generates one row, discarded, so the others are not left
            waiting for it (`generation_is_collective`)."""
            if self.use_vllm:
                self.sync_vllm_weights()
            reuse, self.reuse_rows = self.reuse_rows, {}

            def has_logprobs(r: Any) -> bool:  # one sampling log-prob per completion token
                return r[2] is not None and len(r[2]) == len(r[1])

            same = {i: r for i, r in reuse.items() if i < len(prompt_ids) and list(prompt_ids[i]) == list(r[0])}
            hits = {i: r for i, r in same.items() if not self.use_vllm or has_logprobs(r)}
            self.reuse_mismatches += len(reuse) - len(same)
            self.reuse_without_logprobs += len(same) - len(hits)
            self.reused = set(hits)
            if not self.use_vllm:  # TRL's HF path has no sampling log-probs: `behaviour_logps`
                self.behaviour = {i: r[2] for i, r in hits.items() if has_logprobs(r)}
                self.reuse_unweighted += len(hits) - len(self.behaviour)  # trained as on-policy
            if not hits:
                return self._generate_rows(prompt_ids, images, multimodal_fields, *args, **kwargs)
            if images or multimodal_fields:
                raise RuntimeError("slow loop: reused rollouts need text prompts")
            todo = [i for i in range(len(prompt_ids)) if i not in hits]
            if not todo and self.generation_is_collective():
                self._generate_rows([prompt_ids[0]], images, multimodal_fields, *args, **kwargs)
            completion_ids: list[Any] = [list(hits[i][1]) if i in hits else None for i in range(len(prompt_ids))]
            logprobs: list[Any] | None = ([list(hits[i][2]) if i in hits else None for i in range(len(prompt_ids))]
                                          if self.use_vllm else None)
            if todo:
                new, new_logprobs = self._generate_rows([prompt_ids[i] for i in todo], images,
                                                        multimodal_fields, *args, **kwargs)
                if (new_logprobs is None) != (logprobs is None):
                    raise RuntimeError("slow loop: sampling log-probs on a path that should not "
                                       "return them (or none where vLLM should)")
                for j, i in enumerate(todo):
                    completion_ids[i] = new[j]
                    if logprobs is not None:
                        logprobs[i] = new_logprobs[j]
            return completion_ids, logprobs

        def generation_is_collective(self) -> bool:
            """Whether every rank must call HF `generate` together: FSDP shards the weights, so
            each decoding step's forward gathers them from all ranks, and transformers then
            decodes with `synced_gpus` until every rank is done."""
            from accelerate.utils import DistributedType

            return (not self.use_vllm and self.accelerator.num_processes > 1
                    and self.accelerator.distributed_type == DistributedType.FSDP)

        def sync_vllm_weights(self) -> None:
            """Load the current weights into vLLM if this step has not yet, as TRL's
            `_generate_single_turn` does before it generates. Under FSDP2 the sync gathers every
            parameter, a collective: a rank whose rows were all reused would never reach TRL's
            call while the others wait in it (a hang). So every rank syncs here before the rows
            to generate are chosen; TRL's own check then finds the weights current."""
            if self.state.global_step == self._last_loaded_step:
                return
            from trl.extras.profiling import profiling_context

            with profiling_context(self, "sync_weights"):
                self.vllm_generation.sync_weights()
            self._last_loaded_step = self.state.global_step

        def _generate_rows(self, prompt_ids: Any, images: Any, multimodal_fields: Any,
                           *args: Any, **kwargs: Any) -> Any:
            """TRL's own generation, with the prompt prefill shared between the copies of a
            prompt (`shared_prefill`): a step holds each (context, problem) prompt G/K times.
            Plain `generate` path only (not vLLM, continuous batching, images or FSDP)."""
            from accelerate.utils import DistributedType

            plain = (self.share_prefill and not self.use_vllm and not images and not multimodal_fields
                     and not getattr(self, "use_transformers_continuous_batching", False)
                     and self.accelerator.distributed_type != DistributedType.FSDP)
            if not plain:
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)
            from fastslow.model.generation import (
                generate_compacting,
                masked_decoding,
                shared_prefill,
            )

            model = self.accelerator.unwrap_model(self.model_wrapped)
            original = model.generate

            def generate(*, input_ids: Any, attention_mask: Any, **gen_kwargs: Any) -> Any:
                config = gen_kwargs.get("generation_config")
                pad_id = config.pad_token_id if config is not None and config.pad_token_id is not None \
                    else self._tokenizer.pad_token_id
                input_ids, attention_mask, added = masked_decoding(input_ids, attention_mask, pad_id)
                cache = shared_prefill(model, input_ids, attention_mask)
                if self.compact_generation and config is not None and config.max_new_tokens:
                    # Rows that stopped leave the batch (a step's completions end at very different
                    # lengths); generate()'s multinomial then draws for the rows left.
                    out = generate_compacting(original, model, input_ids, attention_mask, cache,
                                              eos=self.eos_token_ids, max_new_tokens=config.max_new_tokens,
                                              pad_id=pad_id, **gen_kwargs)
                else:
                    if cache is not None:
                        gen_kwargs["past_key_values"] = cache
                    out = original(input_ids=input_ids, attention_mask=attention_mask, **gen_kwargs)
                return out[:, added:]  # TRL cuts the completions at its own prompt width

            model.generate = generate
            try:
                return super()._generate_single_turn(prompt_ids, images, multimodal_fields, *args, **kwargs)
            finally:
                del model.generate  # back to the class's method

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            """TRL's batch, plus ``behaviour_logps`` (B, completion width) when rows were reused
            on the HF path with their sampling log-probs: those rows' per-token log-probs under
            the policy that sampled them (the fast round's generator, bf16 on the CPU default,
            while the step trains in the model's dtype), NaN on every other row. The loss then
            takes them as those rows' old log-probs (`_compute_loss`), so CISPO's truncated
            weight min(pi_theta / pi_behaviour, tau) corrects for the sampler, as TRL's own
            importance-sampling correction does for vLLM's samples."""
            import torch

            out = super()._generate_and_score_completions(inputs)
            if self.use_vllm and "sampling_per_token_logps" not in out:
                # the step's clip fraction and the rollouts' logprob_sum read vLLM's own log-probs;
                # without them they would quietly describe the trainer's forward instead
                import trl

                raise RuntimeError(f"TRL {trl.__version__}'s vLLM batch has no 'sampling_per_token_logps' "
                                   f"(fastslow.slow.trainer expects TRL 1.16's keys)")
            behaviour, self.behaviour = self.behaviour, {}
            if behaviour:
                ids = out["completion_ids"]
                logps = torch.full(ids.shape, float("nan"), dtype=torch.float32, device=ids.device)
                for i, row in behaviour.items():
                    n = min(len(row), ids.size(1))
                    logps[i, :n] = torch.tensor(list(row[:n]), dtype=torch.float32)
                out["behaviour_logps"] = logps
            return out

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
            """TRL's loss; a micro batch with ``behaviour_logps`` gets its old log-probs from the
            loss forward's own (on-policy rows, as TRL does without them) and from the
            behaviour policy's (reused rows), set while that forward runs. When the step skipped
            the reference forward (`policy_is_reference`), the reference log-probs are that
            forward's own too."""
            if "behaviour_logps" not in inputs and not self.reference_skipped:
                return super()._compute_loss(model, inputs)
            self._loss_inputs = inputs
            try:
                loss = super()._compute_loss(model, inputs)
            finally:
                self._loss_inputs = None
            if self.reference_skipped and bool(inputs["ref_per_token_logps"].isnan().any()):
                raise RuntimeError("slow loop: the loss read the skipped reference forward's placeholder "
                                   "(TRL's loss forward no longer asks for entropies)")
            return loss

        def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return super()._calculate_rewards(*args, **kwargs)
            finally:
                self.timings["scoring"] += time.perf_counter() - start

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            if self.policy_is_reference and self.ref_model is not None and args and args[0] is self.ref_model:
                import torch

                # the reference's log-probs are the policy's: the loss forward fills them in
                # (`_compute_loss`); until then NaN, which no loss may read
                ids, keep = args[1], args[3]
                self.reference_skipped = True
                return torch.full((ids.size(0), keep), float("nan"), device=ids.device), None, None
            shared = self._shared_prefix_forward(args, kwargs)
            logps, entropies, aux = shared or super()._get_per_token_logps_and_entropies(*args, **kwargs)
            # Only the loss's forward asks for entropies: these are log π_θ of the sampled tokens
            # before this step's update, i.e. the sampling policy's (on-policy), for free.
            if kwargs.get("compute_entropy"):
                self.stash.append((logps.detach(), entropies.detach()))
                inputs = self._loss_inputs  # TRL reads the old and reference log-probs after this forward
                if inputs is not None and "behaviour_logps" in inputs:
                    import torch

                    behaviour = inputs["behaviour_logps"]
                    base = inputs.get("old_per_token_logps")
                    base = logps.detach() if base is None else base
                    inputs["old_per_token_logps"] = torch.where(  # fp32: no bf16 rounding
                        torch.isnan(behaviour), base.float(), behaviour.float())
                if inputs is not None and self.reference_skipped:
                    inputs["ref_per_token_logps"] = logps.detach()
            return logps, entropies, aux

        def _shared_prefix_forward(self, args: tuple, kwargs: dict[str, Any]) -> Any:
            """`shared_prefix_logps` in place of TRL's forward when it applies: text rows, one
            process (the loss forward runs the model twice, which DDP's reducer does not allow),
            no FSDP, no MoE aux loss. Under activation checkpointing the prompt's layers are
            recomputed in the backward and the completion's are not (`layer_recompute`: a replay
            of transformers' would append to the prompt's cache a second time). None: TRL's own."""
            import torch

            grad = torch.is_grad_enabled()
            extra = {k: v for k, v in kwargs.items() if k not in ("batch_size", "compute_entropy", "compute_aux_loss")}
            if (not self.share_prefill or len(args) != 4 or kwargs.get("compute_aux_loss")
                    or any(v is not None for v in extra.values()) or self.accelerator.num_processes > 1):
                return None
            out = shared_prefix_logps(*args, batch_size=kwargs.get("batch_size"),
                                      entropy=bool(kwargs.get("compute_entropy")),
                                      autocast=self.accelerator.autocast,
                                      prompts=self.prompt_grads if grad else None,
                                      checkpoint=bool(self.args.gradient_checkpointing))
            return None if out is None else (*out, None)

    return PoolGRPOTrainer


class PromptGradients:
    """One step's loss forwards of the prompts whose copies span several micro batches, each run
    once, with its gradient taken once.

    Micro batches of 2 rows hold the G = 4 copies of an RL-only prompt in two micro batches, so
    each ran the ~790-token prompt forward and backward twice. Here the first micro batch that
    needs a prompt runs its forward and keeps the keys and values (the graph) plus detached
    copies that require a gradient (the leaves); every micro batch's completions attend to the
    leaves, whose gradients add up over the micro batches' backward passes; after the backward
    of the prompt's last micro batch (`backward_done`), one backward from the graph's keys and
    values with those summed gradients reaches the weights. The weights' gradients are the sum
    of the per-micro-batch ones, as before; a prompt's activations live from its first to its
    last micro batch. `uses`: prompt key -> the number of micro batches that hold it.
    """

    def __init__(self, uses: dict[Any, int]) -> None:
        self.uses = dict(uses)
        self.kv: dict[Any, tuple[list[Any], list[Any]]] = {}  # key -> (graph tensors, leaves)
        self._used: set[Any] = set()
        self.forwards = 0

    @staticmethod
    def key(ids_row: Any, mask_row: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(ids_row.tolist()), tuple(mask_row.tolist())

    def has(self, key: Any) -> bool:
        return key in self.kv

    def put(self, key: Any, tensors: list[Any]) -> None:
        """`tensors`: the prompt's per-layer keys and values (keys_0, values_0, keys_1, ...)."""
        leaves = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
        self.kv[key] = (tensors, leaves)
        self.forwards += 1

    def leaves(self, key: Any) -> list[Any]:
        self._used.add(key)
        return self.kv[key][1]

    def backward_done(self) -> None:
        """After a micro batch's backward: prompts used for the last time send their summed
        gradients through their forward now, and are dropped."""
        import torch

        for key in self._used:
            self.uses[key] = self.uses.get(key, 1) - 1
            if self.uses[key] > 0:
                continue
            graph, leaves = self.kv.pop(key)
            pairs = [(t, leaf.grad) for t, leaf in zip(graph, leaves, strict=True)
                     if t.requires_grad and leaf.grad is not None]
            if pairs:
                torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
        self._used.clear()

    @staticmethod
    def counts(micros: Sequence[Mapping[str, Any]]) -> dict[Any, int]:
        """Prompt key -> the micro batches (TRL batch dicts) holding it (the key covers all but
        the prompt's last token, as `shared_prefix_logps` caches)."""
        uses: dict[Any, int] = {}
        for micro in micros:
            ids, mask = micro["prompt_ids"][:, :-1], micro["prompt_mask"][:, :-1]
            for key in {PromptGradients.key(i, m) for i, m in zip(ids, mask, strict=True)}:
                uses[key] = uses.get(key, 0) + 1
        return uses


def shared_prefix_logps(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int,
                        batch_size: int | None = None, entropy: bool = False,
                        autocast: Callable[[], Any] | None = None,
                        alone: bool | None = None,
                        prompts: PromptGradients | None = None,
                        checkpoint: bool = False) -> tuple[Any, Any] | None:
    """TRL's per-token log-probs (and entropies, with `entropy`) of the last `logits_to_keep`
    tokens of each row, as `GRPOTrainer._get_per_token_logps_and_entropies` computes them
    through the fused LM head, with each distinct prompt's forward run once instead of once per
    row. Returns (log-probs, entropies or None), or None when no prompt repeats (the caller
    runs TRL's own forward).

    A step holds each (context, problem) prompt G/K times, so the KL reference forward, and the
    loss forward of a micro batch holding several copies, computed every prompt over again: on
    HoVer-hard (~790 prompt tokens, 64 completion tokens) that was most of their cost. Here each
    distinct prompt (all but its last token) fills a KV cache, in chunks of `batch_size`
    distinct prompts; its rows then run only the last prompt token and the completion against
    that cache, expanded to them. Positions and masks are TRL's (no `position_ids`: the model
    counts positions from the cache, as in TRL's full-row forward), so only the order of
    floating-point sums differs. Under a gradient, the prompt's activations are kept once and
    the gradient of every copy flows into them (through the cache's expansion), as it flows
    into each copy's own prompt in the row-by-row forward.

    `alone` (default: on CPU) runs each distinct prompt by itself without its padding
    (`fastslow.model.generation.prefill_rows_alone`, with TRL's positions: each token at its
    column) instead of as one padded batch, whose padding and masked attention cost on a CPU:
    a 760-token prompt with 40 columns of padding took 0.95 s forward and 2.75 s forward and
    backward, alone 0.77 s and 2.38 s (SmolLM2-135M, bf16 autocast, 1 thread).

    `prompts` (under a gradient): the step's `PromptGradients`; a prompt already run for an
    earlier micro batch is not run again, and even a micro batch of distinct prompts goes
    through here.

    `checkpoint` (`slow.activation_checkpointing`): under a gradient, each decoder layer of a
    prompt's forward keeps only its input and recomputes the rest in the backward
    (`layer_recompute`), so a held prompt costs its keys, values and layer inputs instead of all
    its activations; the completion tokens' forward, which reads and extends the prompt's cache,
    keeps its (few) activations. Without a gradient nothing is recomputed. None when the model's
    layers cannot be recomputed this way (the caller's own forward checkpoints them).
    """
    import torch
    from transformers import DynamicCache

    from fastslow.model.generation import distinct_rows, prefill_rows_alone

    prompt_len = input_ids.shape[1] - logits_to_keep
    if prompt_len < 2:
        return None
    if checkpoint and not decoder_layers(model):
        return None
    group, first = distinct_rows(input_ids[:, :prompt_len - 1], attention_mask[:, :prompt_len - 1])
    grad = torch.is_grad_enabled()
    if prompts is not None and not grad:
        prompts = None
    if len(first) == len(group) and prompts is None:
        return None
    chunk = batch_size or len(first)
    autocast = autocast or contextlib.nullcontext
    if alone is None:
        alone = input_ids.device.type == "cpu"

    prompt_mode = "recompute" if checkpoint and grad else "keep" if checkpoint else None
    tail_mode = "keep" if checkpoint else None

    def prompt_cache(heads: list[int]) -> Any:
        with layer_recompute(model, prompt_mode):
            cache = prefill_rows_alone(model, input_ids[heads, :prompt_len - 1], attention_mask[heads, :prompt_len - 1],
                                       column_positions=True, autocast=autocast) if alone else None
            if cache is None:
                cache = DynamicCache(config=model.config)
                with autocast():
                    model(input_ids=input_ids[heads, :prompt_len - 1],
                          attention_mask=attention_mask[heads, :prompt_len - 1],
                          past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache

    parts = []
    for start in range(0, len(first), chunk):
        stop = min(start + chunk, len(first))
        rows = [i for i, u in enumerate(group) if start <= u < stop]
        heads = first[start:stop]
        if prompts is None:
            cache = prompt_cache(heads)
        else:  # each prompt's forward once a step: from the store, or run now and stored
            keys = [PromptGradients.key(input_ids[h, :prompt_len - 1], attention_mask[h, :prompt_len - 1])
                    for h in heads]
            for head, k in zip(heads, keys, strict=True):
                if not prompts.has(k):  # alone: a prompt's graph shared with another's would be
                    fresh = prompt_cache([head])  # freed by the first of their two backwards
                    prompts.put(k, [getattr(layer, part) for layer in fresh.layers for part in ("keys", "values")])
            stored = [prompts.leaves(k) for k in keys]
            cache = DynamicCache(config=model.config)
            for layer in range(len(cache.layers)):
                cache.update(torch.cat([t[2 * layer] for t in stored]), torch.cat([t[2 * layer + 1] for t in stored]),
                             layer)
        cache.batch_select_indices(torch.tensor([group[i] - start for i in rows], device=input_ids.device))
        tail = input_ids[rows, prompt_len - 1:]
        labels = tail.masked_fill(attention_mask[rows, prompt_len - 1:] == 0, -100)
        labels[:, 0] = -100  # the last prompt token: only its prediction (of the first completion token) counts
        with autocast(), layer_recompute(model, tail_mode):
            outputs = model(input_ids=tail, attention_mask=attention_mask[rows], past_key_values=cache,
                            labels=labels, fused_lm_head=True)
        parts.append((rows, outputs.log_probs[:, -logits_to_keep:],
                      outputs.entropy[:, -logits_to_keep:] if entropy else None))
    order = torch.tensor([i for rows, _, _ in parts for i in rows], device=input_ids.device).argsort()
    logps = torch.cat([lp for _, lp, _ in parts])[order]
    entropies = torch.cat([e for _, _, e in parts])[order] if entropy else None
    return logps, entropies


def decoder_layers(model: Any) -> list[Any]:
    """`model`'s transformers decoder layers (`GradientCheckpointingLayer`s), the units that
    `layer_recompute` and transformers' own activation checkpointing recompute."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


_UNSET = object()


@contextlib.contextmanager
def layer_recompute(model: Any, mode: str | None) -> Iterator[None]:
    """Each decoder layer of `model` run, for the block, by its own forward, whatever
    transformers' activation checkpointing is set to.

    - "keep": no recomputation; the layer keeps its activations and reads and writes the KV
      cache as usual. Transformers' checkpointing would instead drop the cache of every layer
      that writes one (a replay would append its keys a second time): the completion tokens'
      forward over a prompt's cache.
    - "recompute": the layer keeps only its input (non-reentrant `torch.utils.checkpoint`) and
      runs again in the backward. It writes the cache in the forward; its replay writes into an
      empty cache of its own instead, the same operations on the same values (the first write
      of a layer into an empty cache), so the recomputed tensors are the ones the forward saved
      and the gradient reaching the keys and values written in the forward flows through them.
      A prompt's forward into a fresh cache only.
    - None: the model as it is.
    """
    if mode is None:
        yield
        return
    import functools

    from torch.utils.checkpoint import checkpoint
    from transformers import DynamicCache

    def recomputed(layer: Any, inner: Callable[..., Any]) -> Callable[..., Any]:
        def forward(hidden_states: Any, *args: Any, **kwargs: Any) -> Any:
            calls = 0

            def run(hidden: Any) -> Any:
                nonlocal calls
                calls += 1
                kw = kwargs
                if calls > 1 and kwargs.get("past_key_values") is not None:  # the backward's replay
                    kw = {**kwargs, "past_key_values": DynamicCache(config=model.config)}
                return inner(layer, hidden, *args, **kw)

            return checkpoint(run, hidden_states, use_reentrant=False)

        return forward

    layers = decoder_layers(model)
    # transformers < 5.18 (the GPU pin set) checkpoints in the layer's __call__ while the layer's
    # flag is on: off for the block (`gradient_checkpointing_enable` sets it on each layer itself;
    # restored after). 5.18 on checkpoints in a wrapper of the class's forward, which the block
    # and the backward's replay (after the block, the flag on again) call unwrapped.
    flags = [vars(layer).get("gradient_checkpointing", _UNSET) for layer in layers]
    try:
        for layer in layers:
            inner = type(layer).forward
            while getattr(getattr(inner, "__code__", None), "co_name", None) == "forward_with_checkpointing":
                inner = inner.__wrapped__
            layer.gradient_checkpointing = False
            layer.forward = (recomputed(layer, inner) if mode == "recompute"
                             else functools.partial(inner, layer))
        yield
    finally:
        for layer, flag in zip(layers, flags, strict=True):
            vars(layer).pop("forward", None)  # back to the class's
            if flag is _UNSET:
                vars(layer).pop("gradient_checkpointing", None)
            else:
                layer.gradient_checkpointing = flag


def longest_prompt_tokens(tokenizer: Any, problems: Sequence[Problem],
                          contexts: Sequence[tuple[str, str]],
                          chat_template_kwargs: dict[str, Any] | None = None) -> int:
    """Tokens of the longest rollout prompt (a problem under one of the contexts, through the chat
    template, as TRL tokenises it: `encode_prompts` gives the same ids, see `reuse_rows`)."""
    from fastslow.model.generation import longest_prompt

    return longest_prompt(tokenizer, [build_messages(text, p) for p in problems for _, text in contexts],
                          chat_template_kwargs=chat_template_kwargs)


def train_on_cpu() -> bool:
    """Whether the policy trains on the CPU (TRL's `use_cpu`): exactly when no CUDA GPU is
    visible. A visible GPU trains, with bf16 or in fp32 (`check_device` has already refused
    the GPU-only options on a machine without one)."""
    import torch

    return not torch.cuda.is_available()


def grpo_args(cfg: SlowConfig, num_contexts: int, output_dir: str | Path,
              num_processes: int = 1, max_prompt_tokens: int | None = None) -> Any:
    """The `GRPOConfig` that makes one RL step exactly one optimiser step over P*G rollouts
    (spread over `num_processes` ranks).

    With vLLM, `max_prompt_tokens` (the longest prompt the trainer will see,
    `longest_prompt_tokens`) caps vLLM's context at that plus `max_new_tokens`: by default vLLM
    reserves KV cache for the model's whole context (40960 tokens for Qwen3-8B), which may not
    fit in its `vllm_gpu_memory_utilization` share beside the training weights.
    """
    from transformers import TrainingArguments
    from trl import GRPOConfig

    micro, accumulation = per_rank_batches(cfg, num_processes)
    # transformers 5.18 renamed gradient_checkpointing to activation_checkpointing (the old name
    # warns in every job); the GPU pin set (< 5.18) has only the old one.
    checkpointing = ("activation_checkpointing" if "activation_checkpointing" in
                     TrainingArguments.__dataclass_fields__ else "gradient_checkpointing")
    # the advantage baseline's group: a problem's G rollouts across contexts, or one context's G / K
    groups = {"problem": cfg.num_generations, "prompt": cfg.num_generations // num_contexts}
    if cfg.baseline not in groups:  # a name SlowConfig takes (BASELINES) that has no group here
        raise ValueError(f"slow.baseline: {cfg.baseline!r} has no advantage group in fastslow.slow.trainer.grpo_args")
    group = groups[cfg.baseline]
    max_model_length = (max_prompt_tokens + cfg.max_new_tokens
                        if cfg.use_vllm and max_prompt_tokens is not None else None)
    return GRPOConfig(
        output_dir=str(output_dir),
        loss_type="cispo",
        epsilon_high=cfg.epsilon_high,
        beta=cfg.beta,
        # the KL term is k3 to the run's initial weights, per completion token; its gradient is the
        # unbiased reverse-KL one (k3 times the differentiable ratio pi_theta / pi_old, 1 on-policy;
        # on reused samples pi_old is the sampler's, the ratio uncapped): TRL's default, stated
        use_bias_correction_kl=True,
        num_generations=group,
        # generation batch = micro * accumulation * N = P*G; steps_per_generation = accumulation, so
        # TRL generates once per optimiser step (on-policy) and normalises the CISPO token sum by
        # the whole step's token count.
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation,
        num_iterations=1,
        max_completion_length=cfg.max_new_tokens,
        # The rest of the loss and the sampling as the paper's, stated rather than left to TRL's
        # defaults (a TRL release that moves one would otherwise train another loss silently): a
        # truncated completion stays in the loss; every token, each token's own ratio, no entropy
        # term or mask, no two-sided clip, no off-policy mask, one reward, no extra warpers.
        mask_truncated_completions=False,
        top_entropy_quantile=1.0,
        importance_sampling_level="token",
        off_policy_mask_threshold=None,
        entropy_coef=0.0,
        use_adaptive_entropy=False,
        delta=None,
        reward_weights=None,
        min_p=None,
        repetition_penalty=1.0,
        generation_kwargs=None,
        sync_ref_model=False,  # the KL reference stays the run's initial weights
        cast_lm_head_to_fp32=False,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        top_k=0,
        scale_rewards=cfg.scale_rewards,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=cfg.warmup_steps,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_beta1,
        adam_beta2=cfg.adam_beta2,
        max_grad_norm=cfg.max_grad_norm if cfg.max_grad_norm is not None else 0.0,
        disable_dropout=True,
        # Our loop never calls trainer.train(), which is where HF would enable it; see build_trainer.
        **{checkpointing: cfg.activation_checkpointing},
        use_cpu=train_on_cpu(),
        # Under accelerate launch (DDP): every parameter of a causal LM gets a gradient; the HF
        # default (True) costs an extra autograd-graph traversal per backward.
        ddp_find_unused_parameters=False,
        bf16=cfg.bf16,
        use_vllm=cfg.use_vllm,
        vllm_mode=cfg.vllm_mode,
        vllm_gpu_memory_utilization=cfg.vllm_gpu_memory_utilization,
        vllm_max_model_length=max_model_length,
        vllm_enable_sleep_mode=cfg.vllm_enable_sleep_mode,
        # vLLM samples, the trainer scores: CISPO's weight sg(min(rho, tau)) with rho = pi_theta /
        # pi_vLLM per token, the cap tau the step's own. TRL's default (a whole sequence dropped
        # once its summed log-ratio passes ln 3) is a different loss than the paper's.
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=cfg.epsilon_high,
        vllm_importance_sampling_clip_min=None,  # no floor under the weight: CISPO caps it above only
        seed=cfg.seed,
        report_to="none",  # our tracker logs; TRL's MLflow callback would open a second run
        logging_steps=1,
        save_strategy="no",
        log_completions=False,
        # model.chat_template_kwargs: TRL renders the prompts it samples and trains on with these,
        # as our own renderings (longest_prompt_tokens, the round's rollouts) do
        chat_template_kwargs=dict(cfg.chat_template_kwargs) or None,
    )


def build_trainer(model: Any, tokenizer: Any, cfg: SlowConfig, num_contexts: int,
                  reward_func: Callable[..., list[float]], work_dir: str | Path,
                  num_processes: int = 1, max_prompt_tokens: int | None = None) -> Any:
    """A CISPO `PoolGRPOTrainer` on `model`, with its optimiser and lr scheduler created.

    TRL builds the KL reference model from ``model.config._name_or_path`` (when beta > 0), so the
    caller points that at the initial weights θ0. With `num_processes` > 1 (under `accelerate
    launch`) the model and optimiser go through the trainer's `accelerator.prepare` (`prepare`);
    in one process nothing is wrapped, so single-process training is unchanged.
    `max_prompt_tokens`: the longest prompt of the trainer's rows, which sizes vLLM's context
    (`grpo_args`).
    """
    from datasets import Dataset

    compact_fused_lm_head()
    args = grpo_args(cfg, num_contexts, Path(work_dir) / "trl", num_processes, max_prompt_tokens)
    # TRL requires a train dataset even though our loop feeds rows itself; it is never read.
    placeholder = Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]]})
    trainer = _grpo_trainer_class()(
        model=model, reward_funcs=[reward_func], args=args, train_dataset=placeholder,
        processing_class=tokenizer,
    )
    if cfg.bf16 and num_processes == 1 and getattr(trainer, "ref_model", None) is not None:
        # The reference forward runs under bf16 autocast (loop._rl_step), which casts every Linear
        # weight to bf16 anyway: storing them in bf16 gives the same log-probs, half the bytes.
        bf16_linear_weights(trainer.ref_model)
    if cfg.activation_checkpointing:
        enable_activation_checkpointing(trainer.model)
    # A finite horizon is required by the API; constant_with_warmup never reads it.
    trainer.create_optimizer_and_scheduler(num_training_steps=10**9)
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    if trainer.accelerator.num_processes != num_processes:
        raise RuntimeError(f"slow loop: expected {num_processes} processes (WORLD_SIZE) but the "
                           f"accelerator has {trainer.accelerator.num_processes}")
    if num_processes > 1:
        prepare(trainer)
    trainer.reset_step_stats()
    return trainer


def enable_activation_checkpointing(model: Any) -> None:
    """Non-reentrant activation checkpointing on `model`: transformers' `activation_checkpointing_enable`,
    or, in transformers without it (the GPU pin set, < 5.18), its older name
    `gradient_checkpointing_enable`."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def compact_fused_lm_head() -> bool:
    """Make TRL's fused LM head score only the completion positions on CPU, as it does on CUDA.

    TRL (`trl.trainer.utils.add_fused_lm_head`) projects through the LM head only the positions
    that carry a label (the completion) on Triton devices; elsewhere it projects every position,
    prompt included, to keep tile shapes fixed for compiling backends (its comment names
    Neuron). Eager CPU compiles nothing, and with SmolLM2's 49152-token vocabulary the prompt's
    projection (forward, and its fp32 backward) was a third of an RL step: HoVer-hard (~790
    prompt tokens, 8 rollouts) reference forward 12.9 -> 9.2 s, the 8 forward/backward passes
    46.6 -> 28.4 s, same log-probs. The per-position arithmetic is unchanged (rows of the same
    matmuls); only which rows are computed differs. Patches the name TRL's fused forward looks
    up at call time (the kernels keep their own, so no Triton kernel is tried on CPU). Returns
    whether the patch is in place; False (a warning, nothing changed) if this TRL lacks that
    name.
    """
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None:
        log.warning("slow loop: this TRL has no trl.trainer.utils._use_triton; the fused LM head "
                    "keeps projecting every prompt position on CPU")
        return False
    if hasattr(original, "trl_original"):  # patched already
        return True

    def compact_here(device: Any) -> bool:
        return device.type == "cpu" or original(device)

    compact_here.trl_original = original  # type: ignore[attr-defined]
    trl_utils._use_triton = compact_here
    return True


def bf16_linear_weights(model: Any) -> int:
    """Store a frozen model's `nn.Linear` weights in bf16 (frozen), for use only under bf16 autocast.

    CPU/CUDA autocast runs `linear` in bf16 by rounding its fp32 weight to bf16 on every call, so a
    weight stored already rounded gives bit-identical outputs under autocast while holding half
    the bytes (SmolLM2-135M: 405 of its 513 MiB are such weights, 202 MiB saved). Linears whose
    weight is shared with another module (a tied `lm_head` is the input embedding) stay fp32: the
    embedding's output is not autocast, and rounding it would change the residual stream.

    transformers maps a checkpoint's tensors from the safetensors file: they become resident
    pages of that mapping as the forward passes touch them, and the mapping lives as long as any
    tensor of the file does. So the parameters that stay fp32 (embedding, norms, biases) are
    copied too: then nothing refers to the file and its pages leave this process (measured: a
    cast that kept the mapping made a HoVer-hard RL cycle peak 220 MiB *higher*).
    Returns the number of bytes saved.
    """
    import torch

    shared = {id(p) for m in model.modules() if not isinstance(m, torch.nn.Linear)
              for p in m.parameters(recurse=False)}
    saved = 0
    # old parameter id -> (old, replacement): a tied parameter is copied once and stays tied
    done: dict[int, tuple[Any, Any]] = {}
    with torch.no_grad():
        for module in model.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                if id(p) not in done:
                    cast = (name == "weight" and isinstance(module, torch.nn.Linear)
                            and p.dtype == torch.float32 and id(p) not in shared)
                    new = p.to(torch.bfloat16) if cast else p.clone()  # an own copy either way
                    done[id(p)] = (p, torch.nn.Parameter(new, requires_grad=False))
                    saved += p.numel() * 2 if cast else 0
                setattr(module, name, done[id(p)][1])
        for module in model.modules():  # buffers (rotary inv_freq, ...) may map the file too
            for name, b in list(module.named_buffers(recurse=False)):
                if b is not None:
                    module._buffers[name] = b.clone()
    return saved


def prepare(trainer: Any) -> None:
    """Wrap the trainer's model and optimiser for data-parallel training, as the HF Trainer's own
    `_inner_training_loop` does: DDP, or FSDP2 sharding (model and optimiser together, so the
    optimiser's parameters are the sharded ones). The lr scheduler stays unprepared: accelerate's
    scheduler wrapper steps N times per optimiser step (it assumes an N-times-shorter dataloader).

    Afterwards `trainer.model_wrapped` is what the forward/backward must run through (gradient
    synchronisation) and what TRL generates with; `trainer.model` stays the plain model (DDP) or is
    the sharded model itself (FSDP), as in the HF Trainer.
    """
    from accelerate.utils import DistributedType

    accelerator = trainer.accelerator
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        raise RuntimeError("slow loop: DeepSpeed (zero3.yaml) is not supported: its engine steps the "
                           "optimiser inside backward(); use FASTSLOW_ACCELERATE_STRATEGY=fsdp2 or ddp")
    if accelerator.distributed_type == DistributedType.FSDP and not accelerator.is_fsdp2:
        raise RuntimeError("slow loop: FSDP1 is not supported; use fsdp_version: 2 (fsdp2.yaml)")
    model, optimizer = accelerator.prepare(trainer.model, trainer.optimizer)
    trainer.model_wrapped = model
    if accelerator.distributed_type == DistributedType.FSDP:
        trainer.model = model
    trainer.optimizer = optimizer
