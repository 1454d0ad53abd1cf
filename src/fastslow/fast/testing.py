"""Test doubles for the fast loop: a toy task, a scripted generator that reacts to context, and
a generator of long (paper-scale) traces.

`ScriptedGenerator` answers in the `<answer>` format only when the context states the format
rule or shows worked examples, and then answers correctly a fixed fraction of problems, more
with more demonstrations. So a context edit has a measurable, deterministic effect, which is
what tests of the search, the budget and the proposers need; it also counts every prompt it
is asked to complete.
"""

from __future__ import annotations

import hashlib

from fastslow.model.generation import Generation, SamplingParams
from fastslow.tasks.base import ANSWER_FORMAT, Judgement, Problem, TaskBase, extract_answer


class ToyTask(TaskBase):
    """Integer answers; the feedback uses the shared layout (verdict, expected, format)."""

    name = "toy"

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        out = []
        for i in range(n):
            a, b = (seed * 7 + i * 3) % 50 + 1, (seed * 11 + i * 5) % 40 + 1
            out.append(Problem(id=f"{split}-{i}", task=self.name,
                               prompt=f"What is {a} + {b}?\n{ANSWER_FORMAT}", answer=str(a + b)))
        return out

    def judge(self, problem: Problem, completion: str) -> Judgement:
        got = extract_answer(completion)
        notes = ["The answer must be a single integer."] if got is not None and not got.isdigit() else []
        if got is None:
            notes.append("Remember: the answer must be only the number.")
        return Judgement(float(got == problem.answer), problem.answer, got, notes)


def _h(*parts: str) -> int:
    return int(hashlib.sha256("|".join(parts).encode()).hexdigest()[:8], 16)


class ScriptedGenerator:
    """A fake `Generator`. With a context that contains "<answer>" (a format rule or a worked
    example) it answers in tags, correctly for a share of problems that grows with the number
    of worked examples; otherwise it answers in prose (a parse failure). Deterministic."""

    def __init__(self) -> None:
        self.prompts = 0
        self.calls = 0

    def generate(self, conversations: list[list[dict[str, str]]], params: SamplingParams) -> list[Generation]:
        self.calls += 1
        self.prompts += len(conversations)
        out = []
        for conv in conversations:
            system = conv[0]["content"] if conv[0]["role"] == "system" else ""
            user = conv[-1]["content"]
            nums = [int(t) for t in user.replace("?", " ").split() if t.isdigit()]
            right = str(sum(nums[:2])) if len(nums) >= 2 else "0"
            if "<answer>" not in system:
                text = f"I think it is {right}."
            else:
                share = min(0.9, 0.4 + 0.15 * system.count("User: "))
                ok = (_h(user) % 100) < share * 100
                text = f"Sum. <answer>{right if ok else int(right) + 1}</answer>"
            # Stand-in token ids (one per character): enough to follow a rollout around.
            out.append(Generation(text=text, prompt_tokens=len(user) // 4, completion_tokens=len(text) // 4,
                                  prompt_ids=tuple(map(ord, system + user)), completion_ids=tuple(map(ord, text))))
        return out


class LongTraceGenerator:
    """A fake `Generator` writing paper-scale traces: `length` characters of working that end
    in the sum (`offset` off the right one; 0: correct), in `<answer>` tags when `tagged`,
    whatever the context."""

    def __init__(self, length: int = 6000, offset: int = 0, tagged: bool = True) -> None:
        self.length, self.offset, self.tagged = length, offset, tagged
        self.prompts = 0

    def generate(self, conversations: list[list[dict[str, str]]], params: SamplingParams) -> list[Generation]:
        self.prompts += len(conversations)
        out = []
        for conv in conversations:
            nums = [int(t) for t in conv[-1]["content"].replace("?", " ").split() if t.isdigit()]
            answer = sum(nums[:2]) + self.offset
            end = " So the sum is final. " + (f"<answer>{answer}</answer>" if self.tagged else f"It is {answer}.")
            text = "Let me think step by step. " + "Adding the digits carefully. " * (self.length // 29 + 1)
            text = text[:self.length - len(end)] + end
            out.append(Generation(text=text, prompt_tokens=len(conv[-1]["content"]) // 4,
                                  completion_tokens=len(text) // 4))
        return out
