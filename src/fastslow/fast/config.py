"""Configuration of the fast loop (one GEPA round over the pool of contexts).

`FastConfig.from_dict` accepts the `fast:` section of the workflow config (see
fastslow/config.schema.yaml) plus the sampling keys the caller merges in, and fails
with a one-line error that names the offending field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from fastslow.model.generation import SamplingParams

PROPOSERS = ("feedback_editor", "reflective")
PRESETS = ("light", "full")
REFLECTION_KINDS = ("openai", "litellm", "hf")
#: Metric-call budgets per round for the two GEPA recipes at toy (CPU) scale. The paper reports
#: about 960 metric calls per round (unverified) at paper scale; config/paper.yaml sets that.
DEFAULT_BUDGETS = {"light": 48, "full": 160}
#: The shortest `fast.reflection.max_record_chars` (a head and a tail of a completion, its answer in it).
MIN_RECORD_CHARS = 200
#: The smallest `fast.reflection.max_context_chars`.
MIN_CONTEXT_CHARS = 100


@dataclass
class FastConfig:
    """Settings of one fast round.

    Budget accounting: `budget()` metric calls per round, where one metric call is one
    (context, problem) rollout generated with the current weights. The K seed evaluations on
    the validation set are part of that budget (they are real generations), and so are GEPA's
    minibatch and validation evaluations; cache hits cost nothing. Rollouts generated ahead of
    use (`prefetch_minibatches`) and slow-loop rollouts (`reuse_rollouts`) count once, when the
    search first uses them; prefetched rollouts it never uses are reported, not counted.
    """

    #: K, the number of contexts in the pool.
    pool_size: int = 2
    #: Which budget of `budgets` a round gets, unless `max_metric_calls` overrides it.
    preset: str = "light"
    budgets: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_BUDGETS))
    #: Explicit per-round budget; overrides the preset.
    max_metric_calls: int | None = None
    #: Train problems per GEPA reflection minibatch.
    minibatch_size: int = 4
    #: "feedback_editor" (offline, no LLM) or "reflective" (GEPA's LLM reflection).
    proposer: str = "feedback_editor"
    #: Reflection model settings for the "reflective" proposer (see fast.proposers).
    reflection: dict[str, Any] = field(default_factory=dict)
    #: Feed the slow loop's last rollouts into the round instead of regenerating them.
    reuse_rollouts: bool = False
    #: The other direction: the next RL step's problems lead the validation set, each candidate
    #: scored there is sampled G/K times on them, and that step (same weights) trains on its
    #: pool contexts' samples instead of generating them (read by the cycle, which passes the
    #: step's problems to `run_round`).
    reuse_in_slow: bool = False
    #: With `reuse_in_slow`: how many of the cycle's RL steps, from the first, the round samples
    #: for (their P x `reuse_steps` problems lead the validation set). The first step trains on
    #: samples of its own weights; step t (from 0) on samples t updates old, which CISPO's
    #: truncated importance weight min(pi_theta / pi_behaviour, tau) corrects for, as it does
    #: for TRL's generation batches spanning several steps (`steps_per_generation`). Fewer,
    #: fuller generate calls: a CPU's decoding step reads all the weights whatever its rows, so
    #: the samples drawn together cost less than the steps' own calls (bench/HISTORY.md).
    reuse_steps: int = 1
    #: Generate the seed contexts' minibatch rollouts in the seeds' first generate call (on a
    #: random subset of train problems just large enough for the round's iterations), so a
    #: seed chosen as parent is scored from cache; they count as metric calls when first used.
    prefetch_minibatches: bool = True
    #: Children proposed per GEPA iteration (gepa's multi-proposal sampling), evaluated on their
    #: minibatches in one generate call; the best improving one is accepted (gepa's
    #: BestImprovement). 1 is GEPA's sequential default. Fewer when the budget left is short.
    proposals_per_iteration: int = 1
    # Sampling of the fast loop's rollouts.
    max_new_tokens: int = 96
    temperature: float = 0.7
    top_p: float = 1.0
    seed: int = 0
    #: feedback_editor: most worked demonstrations / rules kept in a context.
    max_demos: int = 3
    max_rules: int = 4
    #: feedback_editor: problems longer than this are not used as demonstrations.
    max_demo_chars: int = 600
    #: Sequences per generate() call (bounds memory on CPU); a pair sampled for the slow
    #: loop's next step adds its samples, not one.
    eval_batch_size: int = 16
    #: GEPA's search score is (1 - c) * reward + c * [an answer could be read]; 0 (default)
    #: searches on the reward alone. A small c gives GEPA a gradient where the base model
    #: scores 0 everywhere. Pool val scores are these search scores.
    format_credit: float = 0.0
    #: End the round after this many GEPA iterations in a row that charged no metric call
    #: (free cache hits, nothing new proposed): free iterations never exhaust the budget.
    max_stalled_iterations: int = 12

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first invalid field."""
        def bad(name: str, want: str) -> ValueError:
            return ValueError(f"fast.{name} must be {want}, got {getattr(self, name)!r}")

        for name in ("pool_size", "minibatch_size", "max_new_tokens", "max_demos",
                     "max_demo_chars", "eval_batch_size", "max_stalled_iterations",
                     "proposals_per_iteration", "reuse_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(name, "a positive integer")
        if not isinstance(self.max_rules, int) or self.max_rules < 0:
            raise bad("max_rules", "a non-negative integer")
        if self.preset not in PRESETS:
            raise bad("preset", f"one of {PRESETS}")
        if not isinstance(self.budgets, dict) or any(
            not isinstance(self.budgets.get(p), int) or self.budgets[p] < 1 for p in PRESETS
        ):
            raise bad("budgets", "a mapping with positive integer 'light' and 'full' budgets")
        if self.max_metric_calls is not None and (
            not isinstance(self.max_metric_calls, int) or self.max_metric_calls < 1
        ):
            raise bad("max_metric_calls", "a positive integer or null")
        if self.proposer not in PROPOSERS:
            raise bad("proposer", f"one of {PROPOSERS}")
        if not isinstance(self.reflection, dict):
            raise bad("reflection", "a mapping")
        if self.proposer == "reflective":
            kind = self.reflection.get("kind", "openai")
            if kind not in REFLECTION_KINDS:
                raise ValueError(f"fast.reflection.kind must be one of {REFLECTION_KINDS}, got {kind!r}")
            need = {"openai": ("base_url", "model"), "litellm": ("model",), "hf": ("path",)}[kind]
            for key in need:
                if not self.reflection.get(key):
                    raise ValueError(f"fast.reflection.{key} is required when fast.reflection.kind={kind!r}")
            from fastslow.config import prompt_template_error

            problem = prompt_template_error(self.reflection.get("prompt_template"))
            if problem:  # else every reflection call would fail, one by one
                raise ValueError(problem)
            # left out: the default; max_record_chars null: whole completions
            for key, low, null in (("max_record_chars", MIN_RECORD_CHARS, " or null (whole completions)"),
                                   ("max_context_chars", MIN_CONTEXT_CHARS, "")):
                chars = self.reflection.get(key)
                if key in self.reflection and not (chars is None and null) and (
                        not isinstance(chars, int) or isinstance(chars, bool) or chars < low):
                    raise ValueError(f"fast.reflection.{key} must be an integer >= {low}{null}, got {chars!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise bad("temperature", "a number >= 0")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise bad("top_p", "a number in (0, 1]")
        if not isinstance(self.format_credit, (int, float)) or not 0 <= self.format_credit < 1:
            raise bad("format_credit", "a number in [0, 1)")
        for name in ("reuse_rollouts", "reuse_in_slow", "prefetch_minibatches"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "true or false")

    @property
    def record_chars(self) -> int | None:
        """The most characters of a completion a reflective record shows (None: all of it):
        `fast.reflection.max_record_chars` for the reflective proposer, the adapter's own limit
        for the offline one (which reads a record's working, not its whole trace)."""
        from fastslow.fast.adapter import MAX_RECORD_COMPLETION_CHARS

        if self.proposer != "reflective":
            return MAX_RECORD_COMPLETION_CHARS
        return self.reflection.get("max_record_chars", MAX_RECORD_COMPLETION_CHARS)

    @property
    def context_chars(self) -> int:
        """The longest context the reflective proposer accepts (`junk_reason`), in characters:
        `fast.reflection.max_context_chars`, else `MAX_CONTEXT_CHARS`."""
        from fastslow.fast.proposers import MAX_CONTEXT_CHARS

        return self.reflection.get("max_context_chars", MAX_CONTEXT_CHARS)

    def budget(self) -> int:
        """Metric calls allowed in one round (seed evaluations included)."""
        return self.max_metric_calls if self.max_metric_calls is not None else self.budgets[self.preset]

    def sampling(self, seed: int | None = None) -> SamplingParams:
        return SamplingParams(max_new_tokens=self.max_new_tokens, temperature=float(self.temperature),
                              top_p=float(self.top_p), seed=self.seed if seed is None else seed)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> FastConfig:
        """Build from a config mapping. `max_metric_calls` may be an int (explicit budget) or,
        as in the workflow schema, a {light, full} mapping of preset budgets. Unknown keys and
        the schema-only `val_problems` and `dtype` (the caller sizes the validation set and loads
        the generator) are handled here."""
        data = dict(data or {})
        data.pop("val_problems", None)
        data.pop("dtype", None)  # the generator's dtype: the caller loads the weights
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"fast.{unknown[0]} is not a known fast-loop setting")
        mmc = data.get("max_metric_calls")
        if isinstance(mmc, dict):
            extra = sorted(set(mmc) - set(PRESETS))
            if extra:
                raise ValueError(f"fast.max_metric_calls.{extra[0]} is not a preset (light, full)")
            data["budgets"] = {**DEFAULT_BUDGETS, **data.get("budgets", {}), **mmc}
            data["max_metric_calls"] = None
        return cls(**data)
