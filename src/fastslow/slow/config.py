"""`SlowConfig`: every knob of the slow loop (CISPO RL on the weights), validated on construction.

Defaults are the paper's values where it states them (arXiv 2605.12484: lr 1e-6 with a 10-step
warm-up, G=8, 32 problems per step, T=6, cap 4.0, KL 0.001; the last three are unverified
readings). The toy scale of the embedded default lives in config/config.yaml, not here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from fastslow.config import MIN_TEMPERATURE, is_number, micro_batch_fits, prompt_groups_fit
from fastslow.hardware import native_bf16_available

BASELINES = ("problem", "prompt")
SCALE_REWARDS = ("group", "batch", "none")


def _one_of(values: tuple[str, ...]) -> str:
    """`'a', 'b' or 'c'`: the values an error names."""
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _help(text: str, **kwargs: Any) -> Any:
    """A dataclass field whose help text is kept in its metadata (config/README.md mirrors it)."""
    return field(metadata={"help": text}, **kwargs)


@dataclass
class SlowConfig:
    """Hyper-parameters of one slow-loop run; `help_text()` lists them with their meaning."""

    lr: float = _help("AdamW learning rate after warm-up (constant, no decay).", default=1e-6)
    warmup_steps: int = _help(
        "Linear warm-up length in RL steps (HF `constant_with_warmup`: the lr at step s < W is "
        "lr*s/W, so the very first step has lr 0 when W > 0).", default=10)
    beta: float = _help("Weight of the KL penalty to the initial weights (0 disables the "
                        "reference model).", default=0.001)
    epsilon_high: float = _help("CISPO importance-weight cap tau: weights min(rho, tau), "
                                "stop-gradient.", default=4.0)
    num_generations: int = _help("G: rollouts per problem, spread evenly over the K contexts.",
                                 default=8)
    problems_per_step: int = _help("P: problems per RL step (P*G rollouts, one optimiser step).",
                                   default=32)
    steps_per_cycle: int = _help("T: RL steps per cycle (between two fast rounds).", default=6)
    steps_per_generation: int = _help(
        "RL steps whose rollouts one generate call samples (TRL's `steps_per_generation`): 1 = each "
        "step samples its own with its own weights (on-policy); n > 1 = the first step of each n "
        "samples the n steps' rollouts in one call and the later ones train on them, 1..n-1 updates "
        "old, under CISPO's truncated importance weight against their sampling log-probs. Blocks do "
        "not cross cycles (more than T: all T). Rollouts the fast round sampled "
        "(`fast.reuse_in_slow`) are taken first. One process, transformers' generate (not vLLM).",
        default=1)
    max_new_tokens: int = _help("Maximum completion length in tokens.", default=512)
    temperature: float = _help("Sampling temperature of the rollouts (also divides the logits "
                               "in the loss, as TRL does).", default=1.0)
    top_p: float = _help("Nucleus sampling for rollouts (1.0 = off; below 1 the recorded "
                         "logprob_sum of a row generated in the step on the HF path is the "
                         "untruncated policy's, of a vLLM or reused row its sampler's).", default=1.0)
    baseline: Literal["problem", "prompt"] = _help(
        "Advantage baseline: 'problem' = one group of G across contexts (the paper's default), "
        "'prompt' = one group of G/K per (problem, context).", default="problem")
    scale_rewards: Literal["group", "batch", "none"] = _help(
        "Advantage scaling: divide by the group std ('group', A=(r-mean)/(std+1e-4)), the batch std, "
        "or not at all.", default="group")
    micro_batch_size: int | None = _help(
        "Rollouts per forward/backward pass (gradient accumulation inside one RL step); must "
        "divide P*G. None = all P*G at once.", default=None)
    max_grad_norm: float | None = _help("Gradient-norm clip; None = no clipping (paper, "
                                        "unverified).", default=None)
    weight_decay: float = _help("AdamW weight decay.", default=0.0)
    adam_beta1: float = _help("AdamW beta1.", default=0.9)
    adam_beta2: float = _help("AdamW beta2.", default=0.999)
    activation_checkpointing: bool | Literal["auto"] = _help(
        "Recompute activations in the backward pass: in one process, each prompt's decoder layers "
        "in its shared forward (the completion tokens keep theirs); across ranks, every layer of "
        "TRL's forward. Saves memory for extra compute. 'auto': on where the weights train on a "
        "CPU in fp32 (bf16 off), whose activations take twice bf16's bytes (resolved when the "
        "config is built, after bf16).", default=False)
    bf16: bool | Literal["auto"] = _help(
        "bfloat16 mixed precision: fp32 master weights and optimiser, the step's forward passes "
        "(rollouts, reference and policy log-probs) under bf16 autocast; on a GPU, or on a CPU "
        "with native bf16 (AVX512-BF16 / AMX). 'auto': on wherever one of those is present "
        "(resolved to true/false when the config is built).", default=False)
    use_vllm: bool = _help("Generate rollouts with vLLM inside the training process (GPU only).",
                           default=False)
    vllm_mode: Literal["colocate"] = _help(
        "vLLM mode; only 'colocate' keeps a different context per rollout copy (TRL's 'server' "
        "mode samples a whole group from its first prompt).", default="colocate")
    vllm_gpu_memory_utilization: float = _help("GPU memory fraction vLLM may take (colocate).",
                                               default=0.3)
    vllm_enable_sleep_mode: bool = _help(
        "Put the colocated vLLM engine to sleep (TRL's sleep level 2: weights and KV cache "
        "released) while the step trains, and wake it for the next generation, which re-pushes "
        "the weights; frees its GPU share for the backward pass at a host-device transfer per "
        "step.", default=False)
    seed: int = _help("Seed of sampling, data order and everything random in the run; with "
                      "use_vllm, vLLM's sampler is seeded by TRL (the process index), not by this.",
                      default=0)
    chat_template_kwargs: dict[str, Any] = _help(
        "Keyword arguments for the chat template wherever the loop renders a prompt (TRL's "
        "`chat_template_kwargs` and our own renderings alike), e.g. {'enable_thinking': False}; "
        "the cycle fills it from `model.chat_template_kwargs`.", default_factory=dict)

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> ValueError:
            return ValueError(f"SlowConfig.{name}: expected {expected}, got {getattr(self, name)!r}")

        if not isinstance(self.chat_template_kwargs, dict) or not all(isinstance(k, str) for k in self.chat_template_kwargs):
            raise bad("chat_template_kwargs", "a mapping of template variable names to values")

        if self.bf16 == "auto":
            self.bf16 = native_bf16_available()
        elif not isinstance(self.bf16, bool):
            raise bad("bf16", "true, false or 'auto'")
        if self.activation_checkpointing == "auto":
            from fastslow.slow.trainer import train_on_cpu

            self.activation_checkpointing = not self.bf16 and train_on_cpu()
        elif not isinstance(self.activation_checkpointing, bool):
            raise bad("activation_checkpointing", "true, false or 'auto'")

        for name in ("num_generations", "problems_per_step", "steps_per_cycle", "steps_per_generation",
                     "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(name, "a positive integer")
        if self.num_generations < 2:
            raise bad("num_generations", "at least 2 (an advantage needs a group)")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) \
                or self.warmup_steps < 0:
            raise bad("warmup_steps", "an integer >= 0")
        expected = {"lr": "a positive float", "beta": "a float >= 0",
                    "epsilon_high": "a positive float (the importance-weight cap, e.g. 4.0)",
                    "temperature": f"a float >= {MIN_TEMPERATURE}", "top_p": "a float in (0, 1]",
                    "weight_decay": "a float", "adam_beta1": "a float", "adam_beta2": "a float",
                    "vllm_gpu_memory_utilization": "a float in (0, 1)"}
        for name, what in expected.items():
            if not is_number(getattr(self, name)):
                raise bad(name, what)
        if self.max_grad_norm is not None and not is_number(self.max_grad_norm):
            raise bad("max_grad_norm", "None or a positive float")
        if self.micro_batch_size is not None and (isinstance(self.micro_batch_size, bool)
                                                  or not isinstance(self.micro_batch_size, int)):
            raise bad("micro_batch_size", f"None or a divisor of P*G = {self.rollouts_per_step}")
        if not self.lr > 0:
            raise bad("lr", expected["lr"])
        if not self.beta >= 0:
            raise bad("beta", expected["beta"])
        if not self.epsilon_high > 0:
            raise bad("epsilon_high", expected["epsilon_high"])
        if not self.temperature >= MIN_TEMPERATURE:  # below, the loss's logits / T overflow near 1e-38
            raise bad("temperature", expected["temperature"])
        if not 0 < self.top_p <= 1:
            raise bad("top_p", expected["top_p"])
        if self.baseline not in BASELINES:
            raise bad("baseline", _one_of(BASELINES))
        if self.scale_rewards not in SCALE_REWARDS:
            raise bad("scale_rewards", _one_of(SCALE_REWARDS))
        if not micro_batch_fits(self.rollouts_per_step, self.micro_batch_size):
            raise bad("micro_batch_size",
                      f"None or a divisor of P*G = {self.rollouts_per_step}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise bad("max_grad_norm", "None or a positive float")
        if self.vllm_mode != "colocate":
            raise bad("vllm_mode", "'colocate' (server mode would drop the per-rollout contexts)")
        if self.use_vllm and self.steps_per_generation > 1:
            raise ValueError(f"SlowConfig.steps_per_generation: {self.steps_per_generation} samples ahead with "
                             f"transformers' generate on the training weights; with use_vllm the steps sample "
                             f"with vLLM, one step at a time: set it to 1")
        if not isinstance(self.vllm_enable_sleep_mode, bool):
            raise bad("vllm_enable_sleep_mode", "true or false")
        if not 0 < self.vllm_gpu_memory_utilization < 1:
            raise bad("vllm_gpu_memory_utilization", expected["vllm_gpu_memory_utilization"])

    @property
    def rollouts_per_step(self) -> int:
        """P*G: rollouts (and completions trained on) per RL step."""
        return self.problems_per_step * self.num_generations

    def check_pool(self, num_contexts: int) -> None:
        """Reject a pool size K that cannot split G evenly (or that leaves 1-rollout groups)."""
        g = self.num_generations
        divisors = [k for k in range(1, g + 1) if g % k == 0]
        if num_contexts < 1 or g % num_contexts:
            raise ValueError(
                f"pool size K={num_contexts} does not divide num_generations G={g}: each problem's "
                f"G rollouts are spread evenly over the K contexts; expected K in {divisors}")
        if not prompt_groups_fit(self.baseline, g, num_contexts):
            raise ValueError(
                f"baseline='prompt' with G={g}, K={num_contexts} gives groups of one rollout "
                f"(no advantage); use baseline='problem' or K <= {g // 2}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SlowConfig:
        """Build from a config mapping; unknown keys are an error naming the valid ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"SlowConfig: unknown key(s) {unknown}; valid keys: {sorted(known)}")
        return cls(**values)

    @classmethod
    def help_text(cls) -> dict[str, str]:
        """Field name -> help text, in declaration order."""
        return {f.name: f.metadata.get("help", "") for f in fields(cls)}
