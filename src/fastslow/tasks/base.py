"""The task protocol: problems, a scalar reward in [0, 1] and rich textual feedback.

Every task (codeio, math, stargraph, hover, physics, or a user's own) implements `Task`. The
reward is what the slow loop (RL) learns from; the feedback string is what the fast loop (GEPA)
reads. Neither function may raise on any completion: a model can emit anything.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

#: The stated answer format every offline task asks for.
ANSWER_FORMAT = "Give your final answer inside <answer></answer> tags."
#: Completions longer than this are truncated before parsing (rewards stay cheap on 1 MB junk).
MAX_PARSE_CHARS = 20_000
#: A reasoning model's trace: Qwen3 (the paper's model, in its default thinking mode), DeepSeek-R1
#: and SmolLM3 think inside these tags before they answer (`answer_part`).
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

log = logging.getLogger("fastslow.tasks")
#: (task name, exception type) pairs whose scorer failure has been logged in this process.
_LOGGED_FAILURES: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Problem:
    """One problem: `prompt` is the user message (format instruction included)."""

    id: str
    task: str
    prompt: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        """A flat row for Parquet (metadata kept as a JSON string)."""
        import json

        row = asdict(self)
        row["metadata"] = json.dumps(self.metadata, sort_keys=True, default=str)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any], source: Any = None) -> Problem:
        """`to_row` undone; `source` (the split file the row came from) is named in errors."""
        import json

        pid = str(row["id"])
        meta = row.get("metadata") or "{}"
        where = f"{source}: problem {pid!r}" if source is not None else f"problem {pid!r}"
        try:
            metadata = json.loads(meta) if isinstance(meta, str) else dict(meta)
        except (json.JSONDecodeError, TypeError, ValueError) as err:
            raise ValueError(f"{where}: invalid metadata JSON ({err}): {str(meta)[:80]!r}") from None
        if not isinstance(metadata, dict):
            raise ValueError(f"{where}: metadata must be a JSON object, got {type(metadata).__name__}")
        return cls(
            id=pid,
            task=str(row["task"]),
            prompt=str(row["prompt"]),
            answer=str(row["answer"]),
            metadata=metadata,
        )


@runtime_checkable
class Task(Protocol):
    """What the fast and slow loops need from a task."""

    name: str

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split` ('train', 'val' or 'test'), deterministic in `seed`."""
        ...

    def reward(self, problem: Problem, completion: str) -> float:
        """Scalar reward in [0, 1]. Never raises."""
        ...

    def feedback(self, problem: Problem, completion: str) -> str:
        """Rich text: the expected answer, what was wrong, parse failures. Never raises."""
        ...


#: Opening or closing answer tag; used for a single linear scan (no backtracking on 1 MB junk).
_TAG_RE = re.compile(r"<(/?)answer>", re.IGNORECASE)
#: The three split names every task serves.
SPLITS: tuple[str, ...] = ("train", "val", "test")


class TaskDataError(ValueError):
    """A task's rows cannot make its splits (a file's bad row, an answer outside the labels, an
    empty split): the message names the file or task, the row and the reason, and the task_data
    job shows it as one line (no traceback: it is the data that is wrong, not the code)."""


#: Difficulty levels of the procedural tasks ("easy→hard" radar axes).
DIFFICULTIES: tuple[str, ...] = ("easy", "default", "hard")


def duplicate_ids(problems: Sequence[Problem], show: int = 5) -> str:
    """The ids `problems` hold more than once, for an error message ('' for none): the first
    `show`, quoted, and how many more."""
    counts = Counter(p.id for p in problems)
    twice = [pid for pid, n in counts.items() if n > 1]
    more = f" and {len(twice) - show} more" if len(twice) > show else ""
    return ", ".join(repr(pid) for pid in twice[:show]) + more


def answer_part(completion: str) -> str | None:
    """The part of a completion that answers: what follows the last `</think>` (a reasoning
    model's trace, `THINK_OPEN`/`THINK_CLOSE`), up to a later `<think>` that is never closed; the
    whole completion when it has neither tag; and None when it has a `<think>` but no `</think>`:
    the trace was cut off (at the token budget, say), so no answer was given. An <answer> block
    written while thinking is a draft: Qwen3 writes "maybe <answer>7</answer>? let me check" and
    goes on, and reading it would reward guesses the model did not commit to. Where the chat
    template opens the trace in the prompt itself (DeepSeek-R1's distilled models), the completions
    scored carry that `<think>` in front (`fastslow.model.generation.trace_opener`), so a cut-off
    trace reads as one there too.
    """
    close = completion.rfind(THINK_CLOSE)
    rest = completion[close + len(THINK_CLOSE):] if close >= 0 else completion
    # a trace opened after the last one closed (or the only one) never ends: it was cut off, and
    # an answer inside it is a draft; an answer given before it opened still counts
    opened = rest.find(THINK_OPEN)
    if opened < 0:
        return rest
    return rest[:opened] if close >= 0 else None


def extract_answer(completion: str) -> str | None:
    """The content of the last <answer>…</answer> block of the completion's answering part
    (`answer_part`: after a reasoning trace), stripped; None if there is none.

    Only the last `MAX_PARSE_CHARS` characters are read. Nested tags resolve to the innermost
    block: ``<answer><answer>42</answer></answer>`` gives ``42``.
    """
    if not isinstance(completion, str):
        return None
    answering = answer_part(completion)
    if answering is None:
        return None
    text = answering[-MAX_PARSE_CHARS:]
    last_open = last_block = None  # position after the latest "<answer>"; (start, end) of last block
    for m in _TAG_RE.finditer(text):
        if not m.group(1):
            last_open = m.end()
        elif last_open is not None:
            last_block = (last_open, m.start())
            last_open = None  # a second "</answer>" closes nothing new (outer tag of a nested pair)
    if last_block is None:
        return None
    return text[last_block[0]:last_block[1]].strip()


def answered(completion: Any) -> bool:
    """Whether `completion` gives an answer in the format every task's prompt asks for: a non-empty
    <answer>…</answer> block (`extract_answer`). Reward 0 with an answer is a wrong answer; without
    one, a format failure: the evaluations' and steps' `answered_fraction` tell the two apart."""
    return bool(extract_answer(completion))


def format_problems(completion: str) -> list[str]:
    """Plain-language notes on how a completion breaks the answer format (empty if it is fine).

    Used by every task's feedback so the fast loop learns *why* an answer could not be read.
    """
    if not isinstance(completion, str):
        return [f"the completion is not text (got {type(completion).__name__})"]
    notes = []
    if not completion.strip():
        return ["the completion is empty"]
    if len(completion) > MAX_PARSE_CHARS:
        notes.append(f"the completion is {len(completion):,} characters long; only the last "
                     f"{MAX_PARSE_CHARS:,} are read, so keep the final answer at the end")
    answering = answer_part(completion)
    if answering is None:
        notes.append(f"the thinking ({THINK_OPEN}) never ends with {THINK_CLOSE}, so no final answer "
                     f"follows it (cut off at the token budget?); only an answer after {THINK_CLOSE} counts")
        return notes
    close = completion.rfind(THINK_CLOSE)  # answer_part's cut: a trace opened after it never ends
    reopened = close >= 0 and THINK_OPEN in completion[close:]
    if reopened:
        notes.append(f"a thinking block ({THINK_OPEN}) opened after the last {THINK_CLOSE} never ends (cut off "
                     f"at the token budget?); an answer inside it does not count")
    tail = answering[-MAX_PARSE_CHARS:]
    opens = len(re.findall(r"<answer>", tail, re.IGNORECASE))
    closes = len(re.findall(r"</answer>", tail, re.IGNORECASE))
    answer = extract_answer(completion)
    if answer is None:
        if reopened and not opens and not closes:
            pass  # the note above says why no answer was read
        elif not opens and not closes and answering is not completion \
                and re.search(r"<answer>", completion[:close], re.IGNORECASE):  # in the thinking itself
            notes.append(f"an <answer> block appears only inside the thinking; only an answer after "
                         f"{THINK_CLOSE} counts")
        elif opens and not closes:
            notes.append("an <answer> tag is opened but never closed with </answer>")
        elif closes and not opens:
            notes.append("a </answer> tag appears without an opening <answer>")
        else:
            notes.append("no <answer>…</answer> block was found (put the final answer inside "
                         "<answer></answer> tags)")
    elif not answer:
        notes.append("the <answer></answer> block is empty")
    elif opens > 1:
        notes.append(f"{opens} <answer> tags were found; only the last complete block counts")
    return notes


def coerce_text(completion: Any) -> str:
    """Any completion as text: bytes are decoded leniently, None is empty, others use str()."""
    if isinstance(completion, str):
        return completion
    if completion is None:
        return ""
    if isinstance(completion, (bytes, bytearray)):
        return bytes(completion).decode("utf-8", errors="replace")
    try:
        return str(completion)
    except Exception:  # a hostile __str__ must not break scoring
        return ""


def shorten(text: str, limit: int = 300) -> str:
    """`text` cut to `limit` characters with a marker, for quoting model output in feedback."""
    text = coerce_text(text)
    return text if len(text) <= limit else text[: limit - 20] + f"… [{len(text):,} chars]"


#: Longest expected answer quoted whole in feedback (a longer one is cut, `shorten`).
EXPECTED_CHARS = 1000


def expected_line(expected: Any) -> str:
    """An expected answer as feedback quotes it: on one line (a line of its own would read as one
    of the feedback's rules; its other spacing kept, which an exact answer may need) and at most
    `EXPECTED_CHARS` characters."""
    return shorten(re.sub(r"\s*[\r\n]+\s*", " ", coerce_text(expected).strip()), EXPECTED_CHARS)


def build_messages(context: str, problem: Problem) -> list[dict[str, str]]:
    """The chat the policy sees: the context φ as system prompt, the problem as user turn."""
    messages = []
    if context:
        messages.append({"role": "system", "content": context})
    messages.append({"role": "user", "content": problem.prompt})
    return messages


@dataclass
class Judgement:
    """A task's verdict on one completion: the reward and the facts the feedback is built from."""

    reward: float
    expected: str  # the expected answer, as the learner should have written it
    given: str | None = None  # how the model's answer was read; None when nothing could be read
    notes: list[str] = field(default_factory=list)  # why: the deciding facts, formula, differences

    def __post_init__(self) -> None:
        # one note given as a string: a list of its characters would be one feedback line each
        if isinstance(self.notes, str):
            self.notes = [self.notes]


class TaskBase:
    """Shared, defensive plumbing of `reward` and `feedback` for concrete tasks.

    Subclasses implement `judge`; this class guarantees the protocol's promises: any input (not
    only `str`), never an exception, rewards clipped to [0, 1] (NaN counts as 0), and one uniform
    feedback layout the fast loop can learn to read.
    """

    name: str = "task"
    #: Labels of the feedback lines (the notes `judge` writes) that work the expected answer out
    #: from the problem, e.g. hover's "Deciding facts:". The offline proposer quotes them as the
    #: working of a condensed worked example (`demo_gist`); when a task names labels, a condensed
    #: example needs those lines, when it names none, the example has no working.
    demo_working: tuple[str, ...] = ()

    def demo_gist(self, problem: Problem) -> str | None:
        """What a condensed worked example shows of `problem` when the problem is too long to show
        whole (`FeedbackEditor`, after an elision mark): the part that, with the answer, teaches
        something without the rest. None (the default): this task's long problems are not
        demonstrated."""
        return None

    def judge(self, problem: Problem, completion: str) -> Judgement:  # pragma: no cover - abstract
        """Score `completion` (already coerced to str) against `problem`."""
        raise NotImplementedError

    def reward(self, problem: Problem, completion: str) -> float:
        """Scalar reward in [0, 1]. Never raises."""
        try:
            value = float(self.judge(problem, coerce_text(completion)).reward)
        except Exception as exc:
            self._log_failure("reward", problem, exc)
            return 0.0
        return min(1.0, max(0.0, value)) if value == value else 0.0

    def feedback(self, problem: Problem, completion: str) -> str:
        """Rich text: verdict, expected answer, the answer as read, why, format problems. Never raises."""
        try:
            text = coerce_text(completion)
            return render_feedback(self.judge(problem, text), format_problems(text))
        except Exception as exc:  # the fallback still names the expected answer
            self._log_failure("feedback", problem, exc)
            try:
                expected = shorten(str(problem.answer), 500)
            except Exception:
                expected = "(unavailable)"
            return f"Expected answer: {expected_line(expected)}\n(Detailed feedback failed: {type(exc).__name__}.)"

    def _log_failure(self, where: str, problem: Any, exc: BaseException) -> None:
        """A WARNING the first time this task's scorer raises `exc`'s type (in this process): a
        bug in `judge` otherwise only shows as reward 0 on every completion."""
        try:
            key = (str(getattr(self, "name", type(self).__name__)), type(exc).__name__)
            if key in _LOGGED_FAILURES:
                return
            _LOGGED_FAILURES.add(key)
            pid = getattr(problem, "id", None)
            message = " ".join(str(exc).split())[:300]
            log.warning("task %s: its scorer raised %s%s in %s on problem %r; that completion scores 0 "
                        "(a bug in the task's judge, not the model's answer; later %s of this task "
                        "are not logged)", key[0], key[1], f" ({message})" if message else "", where,
                        pid, key[1])
        except Exception:  # logging must not break the never-raises promise
            pass


def render_feedback(judgement: Judgement, format_notes: list[str]) -> str:
    """The uniform feedback layout: verdict line, expected, given, reasons, format problems."""
    r = min(1.0, max(0.0, float(judgement.reward))) if judgement.reward == judgement.reward else 0.0
    verdict = "Correct" if r >= 1.0 else ("Incorrect" if r <= 0.0 else "Partially correct")
    lines = [f"{verdict} (reward {r:.2f}).", f"Expected answer: {expected_line(judgement.expected)}"]
    if judgement.given is not None:  # on one line: the model's text never starts a line of ours
        given = " ".join(judgement.given.split())
        lines.append(f"Answer given: {shorten(given, 300) if given else '(empty)'}")
    else:
        lines.append("Answer given: none could be read.")
    lines.extend(judgement.notes)
    # Format notes matter only when they explain a failure (a correct answer in a long text is fine).
    if r < 1.0 and format_notes:
        lines.append("Format: " + "; ".join(n.rstrip(".") for n in format_notes) + ".")
    return "\n".join(lines)
