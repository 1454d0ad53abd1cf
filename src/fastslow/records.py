"""Shared record shapes: context hashes and the rollout table both loops read and write."""

from __future__ import annotations

import hashlib

#: Columns of every rollouts.parquet (slow-loop rollouts; the fast loop may reuse them).
ROLLOUT_COLUMNS: dict[str, str] = {
    "run": "str",  # run id (experiment/task/method/variant/seed)
    "cycle": "int64",
    "step": "int64",  # global RL step
    "problem_id": "str",
    "context_id": "str",  # stable id of the context in the pool
    "context_hash": "str",  # context_hash(text)
    "prompt": "str",  # the full rendered prompt (chat template applied)
    "completion": "str",
    "reward": "float64",
    "feedback": "str",
    "prompt_tokens": "int64",
    "completion_tokens": "int64",
    "logprob_sum": "float64",  # sum of sampling log-probs of the completion tokens
    "truncated": "bool",  # cut at slow.max_new_tokens before an EOS
    "answered": "bool",  # a non-empty <answer> block (`fastslow.tasks.base.answered`): else a format failure
}


def context_hash(text: str) -> str:
    """A short, stable content hash of a context's text."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
