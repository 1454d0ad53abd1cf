"""Proposers: how a new context is written from a parent and its reflective dataset.

Both run through gepa's `custom_candidate_proposer` hook, so GEPA keeps parent selection,
minibatch acceptance, validation and the Pareto state; a proposer only writes text.

- `FeedbackEditor` ("feedback_editor"): offline, no LLM. Edits the context from the feedback
  of failed rollouts: worked demonstrations, format and rule statements, and drops
  demonstrations that stopped helping. The CPU default, where no capable reflection model
  exists.
- `ReflectiveProposer` ("reflective"): gepa's own LLM reflection (its prompt template and
  output extraction) with a configurable reflection model; `build_reflection_lm` makes that
  model from settings: any OpenAI-compatible endpoint, a LiteLLM model name or a local Hugging
  Face model. A call that errors, times out or returns junk proposes nothing (the parent
  stays as it is) and is counted and logged; the round goes on, unless every one of its (at
  least two) calls raised (no reply to judge: a connection or HTTP error, a timeout): then the
  reflection setup is broken, and the round raises.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from fastslow.records import context_hash
from fastslow.tasks.base import ANSWER_FORMAT, THINK_CLOSE, THINK_OPEN, Problem, answered
from fastslow.tasks.scoring import NO_SPACE_SCRIPTS, STANDALONE_BEFORE

log = logging.getLogger(__name__)

LanguageModel = Callable[[Any], str]

# --------------------------------------------------------------------------------------------
# The offline proposer
# --------------------------------------------------------------------------------------------

RULES_HEADER = "Rules:"
DEMOS_HEADER = "Worked examples:"
FORMAT_RULE_PREFIX = "Always end with your final answer inside <answer></answer> tags"
_SECTION_RE = {h: re.compile(rf"(?:^|\n\n){re.escape(h)}\n") for h in (RULES_HEADER, DEMOS_HEADER)}
#: A worked example mirrors the chat the model is in: the user's problem, the assistant's reply
#: (optionally some working before the tagged answer): `_demos`.
_USER, _ASSISTANT, _OPEN, _CLOSE = "User: ", "\nAssistant: ", "<answer>", "</answer>"
#: Longest working (characters) kept from a near miss for a worked example.
MAX_WORKING_CHARS = 240
#: The longest context a reflection may propose, in characters (`junk_reason`), unless its parent
#: is longer; `fast.reflection.max_context_chars` sets it.
MAX_CONTEXT_CHARS = 8000
#: Where a condensed worked example leaves out the start of a long problem.
ELISION = "[...]"
#: Feedback sentences with these words read as general statements about the task.
_RULE_HINT = re.compile(r"\b(must|should|always|never|only|format|remember|note|hint|tip|use)\b", re.I)
#: ... and so do sentences that open with an imperative verb.
_IMPERATIVE = re.compile(r"^(Trace|Use|Write|Put|Give|Check|Answer|Start|End|Keep|Avoid|Do not|Don't|"
                         r"Make sure|Read|Compute|Count|Find|List|Return|Include|Separate|Follow)\b")
#: Lines of the uniform feedback layout that are about one instance or the tag format (the
#: format rule covers the latter), never mined as rules.
_NOT_A_RULE = re.compile(r"^(Format|Expected answer|Answer given|Correct|Incorrect|Partially correct)\b")


def demo_text(problem: Problem, prefix_lines: int = 0, suffix_lines: int = 0) -> str:
    """A problem as shown in a worked demonstration: its prompt without the lines every problem
    of the task shares (`boilerplate`; the user turn repeats them anyway) and without the
    format line (the demonstration's answer shows the format). The full prompt if nothing
    would be left."""
    lines = problem.prompt.split("\n")
    middle = "\n".join(lines[prefix_lines:len(lines) - suffix_lines])
    text = middle.replace(ANSWER_FORMAT, "").strip()
    return text or problem.prompt.replace(ANSWER_FORMAT, "").strip() or problem.prompt.strip()


def boilerplate(prompts: Sequence[str]) -> tuple[int, int]:
    """How many leading and trailing lines all `prompts` share (0, 0 for fewer than two)."""
    if len(prompts) < 2:
        return 0, 0
    split = [p.split("\n") for p in prompts]
    shortest = min(len(s) for s in split)
    pre = 0
    while pre < shortest and all(s[pre] == split[0][pre] for s in split):
        pre += 1
    suf = 0
    while pre + suf < shortest and all(s[-1 - suf] == split[0][-1 - suf] for s in split):
        suf += 1
    return pre, suf


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]


class Demo(NamedTuple):
    """A worked example: the problem as shown, its correct answer, and optionally the working
    that leads to it (a near miss's own words: see `near_miss_working`)."""

    problem: str
    answer: str
    working: str = ""

    def render(self) -> str:
        working = f"{self.working}\n" if self.working else ""
        return f"User: {self.problem}\nAssistant: {working}<answer>{self.answer}</answer>"


def near_miss_working(completion: str, answer: str, max_chars: int = MAX_WORKING_CHARS) -> str | None:
    """The working of a failed rollout that reached the right answer without the answer format:
    the completion up to the first standalone occurrence of `answer` (e.g. "79 + 32 = 111" for
    answer "111"), or None when the answer is not there, the completion already has `<answer>`
    tags, or the working is empty or longer than `max_chars`.

    Such a near miss, shown back as a worked example with the tagged answer appended, teaches
    the format in the model's own words rather than in a bare `<answer>` line it does not
    produce by itself.
    """
    answer = answer.strip()
    if not answer or "<answer" in completion.lower():
        return None
    # Standalone: not inside a longer number or word ("11" in "111", "5" in "5.5" or "a5").
    # A letter of a script without spaces (共, 是) is a boundary: "首都是北京" holds 北京.
    m = re.search(rf"{STANDALONE_BEFORE}{re.escape(answer)}(?:(?![\w]|\.\d)|(?=[{NO_SPACE_SCRIPTS}]))", completion)
    if m is None:
        return None
    working = " ".join(completion[:m.end()].split()).strip("* ")
    if not working or len(working) > max_chars or "<" in working:
        return None
    return working


@dataclass
class ContextDoc:
    """A context as the feedback editor sees it: an instruction, rules, worked examples.

    `render` and `parse` round-trip; a context the editor did not write (a seed, an LLM's
    proposal) parses as an instruction with no rules and no examples.
    """

    instruction: str
    rules: list[str] = field(default_factory=list)
    demos: list[Demo] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.demos = [Demo(*d) for d in self.demos]  # (problem, answer) pairs are welcome

    @classmethod
    def parse(cls, text: str) -> ContextDoc:
        rest, demos, rules = text, [], []
        m = _last_match(_SECTION_RE[DEMOS_HEADER], rest)
        if m is not None:
            demos = [Demo(q.strip(), a.strip(), w.strip()) for q, w, a in _demos(rest[m.end():])]
            rest = rest[:m.start()]
        m = _last_match(_SECTION_RE[RULES_HEADER], rest)
        if m is not None:
            rules = [ln[2:].strip() for ln in rest[m.end():].splitlines() if ln.startswith("- ")]
            rest = rest[:m.start()]
        return cls(instruction=rest.strip(), rules=rules, demos=demos)

    def render(self) -> str:
        parts = [self.instruction] if self.instruction else []
        if self.rules:
            parts.append(RULES_HEADER + "\n" + "\n".join(f"- {r}" for r in self.rules))
        if self.demos:
            parts.append(DEMOS_HEADER + "\n" + "\n\n".join(d.render() for d in self.demos))
        return "\n\n".join(parts)

    def has_format_rule(self) -> bool:
        return any(r.startswith(FORMAT_RULE_PREFIX) for r in self.rules)


def _demos(text: str) -> Iterator[tuple[str, str, str]]:
    """Each worked example in `text` as (problem, working, answer): "User: " up to the first
    "\nAssistant: ", the working up to the first `<answer>` after it, the answer up to the first
    `</answer>` after that, then on from there. The regex `User: (.*?)\nAssistant: (.*?)<answer>
    (.*?)</answer>` matched the same, in cubic time on text with many turns and no answer (26 s
    for 17k characters): each part is found once here, and once one is missing no later
    example can be complete."""
    pos = 0
    while (user := text.find(_USER, pos)) >= 0:
        assistant = text.find(_ASSISTANT, user + len(_USER))
        opened = text.find(_OPEN, assistant + len(_ASSISTANT)) if assistant >= 0 else -1
        closed = text.find(_CLOSE, opened + len(_OPEN)) if opened >= 0 else -1
        if closed < 0:
            return
        yield (text[user + len(_USER):assistant], text[assistant + len(_ASSISTANT):opened],
               text[opened + len(_OPEN):closed])
        pos = closed + len(_CLOSE)


def answer_read(record: Mapping[str, Any]) -> bool:
    """Whether an answer could be read from a record's completion: its `parsed_answer` (the
    adapter parses the full completion; a long one is shown clipped in "Generated Outputs"),
    else the shown completion parsed as the tasks do. An empty block is no answer (`answered`)."""
    if "parsed_answer" in record:
        return bool(record["parsed_answer"])
    return answered(str(record.get("Generated Outputs", "")))


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = None
    for found in pattern.finditer(text):  # noqa: B007 - we want the last one
        pass
    return found


def mine_rules(records: Sequence[Mapping[str, Any]], answers: Mapping[str, str]) -> list[str]:
    """General statements drawn from failed rollouts' feedback.

    A sentence qualifies when it reads as a rule (must / should / format / ...), names no
    number and no expected answer (so it is not about one instance), and recurs in the
    feedback of at least two failed rollouts. Most frequent first, then first seen.
    """
    counts: dict[str, int] = {}
    for r in records:
        if float(r.get("Score", 0.0)) >= 1.0:
            continue
        answer = answers.get(str(r.get("problem_id")), "")
        seen_here: set[str] = set()
        for sent in re.split(r"(?<=[.!?])\s+|\n+", str(r.get("Feedback", ""))):
            s = " ".join(sent.split())
            if not (12 <= len(s) <= 200) or not (_RULE_HINT.search(s) or _IMPERATIVE.match(s)) \
                    or re.search(r"\d", s) \
                    or _NOT_A_RULE.match(s):
                continue
            if answer and answer in s:
                continue
            if s not in seen_here:
                seen_here.add(s)
                counts[s] = counts.get(s, 0) + 1
    return [s for s, c in sorted(counts.items(), key=lambda kv: -kv[1]) if c >= 2]


class FeedbackEditor:
    """Offline proposer: edits a context from the textual feedback of failed rollouts.

    One edit per call, the first untried of, in order:

    1. add a format rule (with an example in the exact `<answer>` format) when parse
       failures make up at least half of the failures;
    2. drop a worked demonstration that stopped helping: its own problem still fails with
       the demonstration in context, or the minibatch scores of contexts holding it are lower
       than those of contexts without it (two observations each at least);
    3. add a rule mined from recurring feedback (`mine_rules`), or a worked demonstration
       (problem and correct answer) of a train problem that failed, replacing the weakest
       demonstration when full; the order of the two is drawn from a seeded RNG. A failure
       whose completion reached the right answer without the answer format (a near miss,
       `near_miss_working`) is demonstrated first, with its own working before the tagged
       answer.

    Demonstrations come from a bank of failures seen in earlier calls, outside the current
    minibatch first, so the acceptance test on that minibatch does not see its own answers
    (the minibatch's own failures come last, for the first calls of a round). Problems are
    shown without the lines all problems share (`boilerplate`). Edits already tried on a
    parent are not proposed again for it. Deterministic given the seed and the call order.

    A problem longer than `max_demo_chars` is demonstrated condensed when its task says how
    (`gist`, the task's `demo_gist`): that gist after an elision mark (hover: the claim; codeio:
    the question, the output's specification and the input, without the program). When the
    task names the feedback lines that work its answer out (`working_labels`, its
    `demo_working`), the example needs them, from a failed rollout's feedback, as its working
    (hover: the deciding facts and what they give). That is what a reflection model would write
    from the same feedback; without it a task of long problems (hover's documents, codeio's
    programs) gets no demonstrations at all.
    """

    def __init__(self, problems: Mapping[str, Problem], seed: int = 0, max_demos: int = 3,
                 max_rules: int = 4, max_demo_chars: int = 600,
                 logger: Callable[[str], None] | None = None, working_labels: Sequence[str] = (),
                 gist: Callable[[Problem], str | None] | None = None, private: Collection[str] = ()) -> None:
        self.problems = dict(problems)
        # Problems whose answers no edit may write into a context: the round's validation set
        # (its Pareto scores) and the next RL steps' problems (reuse makes them train problems).
        self.private = frozenset(private)
        self.rng = random.Random(seed)
        self.max_demos = max_demos
        self.max_rules = max_rules
        self.max_demo_chars = max_demo_chars
        self.log = logger or log.info
        self.bank: dict[str, None] = {}  # failed problem ids, insertion-ordered
        self.near_misses: dict[str, str] = {}  # problem id -> working of a right-but-unformatted answer
        self.working_labels = tuple(working_labels)
        self.gist = gist
        self.condensed: dict[str, Demo] = {}  # problem id -> its condensed demonstration (long problems)
        self.with_demo: dict[str, list[float]] = {}
        self.without_demo: dict[str, list[float]] = {}
        self.tried: dict[str, set[str]] = {}
        self.edits: list[str] = []  # history, for the round summary
        self._boiler = boilerplate([p.prompt for p in self.problems.values()])
        self._by_demo_key = {_key(self.demo_text(p)): p.id for p in self.problems.values()}

    def demo_text(self, problem: Problem) -> str:
        """How `problem` appears in a worked demonstration of this editor."""
        return demo_text(problem, *self._boiler)

    def demo(self, pid: str) -> Demo:
        """The worked demonstration of banked problem `pid`: condensed for a long problem."""
        if pid in self.condensed:
            return self.condensed[pid]
        problem = self.problems[pid]
        return Demo(self.demo_text(problem), problem.answer.strip(), self.near_misses.get(pid, ""))

    def condensed_demo(self, problem: Problem, feedback: str) -> Demo | None:
        """`problem` shown by its `gist`, worked by the feedback lines named in `working_labels`
        (if any are named); None when there is no gist, the feedback has no such line, or the
        demonstration would still be longer than `max_demo_chars`."""
        shown = self.gist(problem) if self.gist is not None else None
        if not shown or not shown.strip():
            return None
        working = " ".join(" ".join(line.split()) for line in feedback.split("\n")
                           if line.strip().startswith(self.working_labels)) if self.working_labels else ""
        if (self.working_labels and not working) or "<" in working:
            return None
        demo = Demo(f"{ELISION}\n\n{shown.strip()}", problem.answer.strip(), working)
        return demo if len(demo.render()) <= self.max_demo_chars else None

    def __call__(self, candidate: dict[str, str], reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
                 components_to_update: list[str]) -> dict[str, str]:
        out = {}
        for name in components_to_update:
            new = self.edit(candidate[name], list(reflective_dataset.get(name) or []))
            if new is not None and new != candidate[name]:
                out[name] = new
        return out

    def _observe(self, doc: ContextDoc, records: list[Mapping[str, Any]]) -> None:
        if not records:
            return
        mean = sum(float(r["Score"]) for r in records) / len(records)
        present = {_key(d.problem) for d in doc.demos}
        for k in present:
            self.with_demo.setdefault(k, []).append(mean)
        for k in set(self.with_demo) - present:
            self.without_demo.setdefault(k, []).append(mean)
        for r in records:
            pid = str(r.get("problem_id"))
            if float(r["Score"]) >= 1.0 or pid not in self.problems:
                continue
            problem = self.problems[pid]
            if len(self.demo_text(problem)) <= self.max_demo_chars:
                self.bank.setdefault(pid, None)
                working = None if answer_read(r) else near_miss_working(str(r.get("Generated Outputs", "")),
                                                                        problem.answer)
                if working is not None:
                    self.near_misses.setdefault(pid, working)
            elif pid not in self.condensed:
                demo = self.condensed_demo(problem, str(r.get("Feedback", "")))
                if demo is not None:
                    self.condensed[pid] = demo
                    self._by_demo_key[_key(demo.problem)] = pid
                    self.bank.setdefault(pid, None)

    def _demo_strength(self, k: str) -> float:
        w = self.with_demo.get(k, [])
        return sum(w) / len(w) if w else float("inf")

    def _stale(self, k: str) -> bool:
        w, wo = self.with_demo.get(k, []), self.without_demo.get(k, [])
        return len(w) >= 2 and len(wo) >= 2 and sum(w) / len(w) < sum(wo) / len(wo)

    def edit(self, text: str, records: list[Mapping[str, Any]]) -> str | None:
        """The edited context, or None when no untried edit applies."""
        doc = ContextDoc.parse(text)
        self._observe(doc, records)
        failed = [r for r in records if float(r["Score"]) < 1.0]
        if not failed:
            return None
        batch = {str(r.get("problem_id")) for r in records}
        failed_ids = {str(r.get("problem_id")) for r in failed}
        tried = self.tried.setdefault(context_hash(text), set())
        for key, make in self._edits(doc, records, failed, batch, failed_ids):
            if key in tried:
                continue
            tried.add(key)
            new = make()
            if new is None:
                continue
            self.edits.append(key)
            self.log(f"feedback_editor: {key}")
            return new.render()
        return None

    def _edits(self, doc: ContextDoc, records: list[Mapping[str, Any]], failed: list[Mapping[str, Any]],
               batch: set[str], failed_ids: set[str]) -> list[tuple[str, Callable[[], ContextDoc | None]]]:
        edits: list[tuple[str, Callable[[], ContextDoc | None]]] = []
        unparsed = sum(1 for r in failed if not answer_read(r))
        if not doc.has_format_rule() and unparsed * 2 >= len(failed) and self.max_rules > 0:
            edits.append(("add-format-rule", lambda: self._with_format_rule(doc, batch)))
        for q in (d.problem for d in doc.demos):
            k = _key(q)
            own = self._by_demo_key.get(k)
            if (own in failed_ids) or self._stale(k):
                edits.append((f"drop-demo:{k}", lambda q=q: _without_demo(doc, q)))
        rule_edits = [(f"add-rule:{_key(s)}", lambda s=s: _with_rule(doc, s, self.max_rules))
                      for s in mine_rules(records, {pid: p.answer for pid, p in self.problems.items()})
                      if s not in doc.rules]
        present = {_key(d.problem) for d in doc.demos}
        # Earlier failures first; this minibatch's own failures only after them (their answers
        # would make the acceptance test on this minibatch look better than it is).
        banked = [pid for pid in self.bank if pid not in self.private]
        pool = [pid for pid in banked if pid not in batch]
        pool += [pid for pid in banked if pid in failed_ids]
        # Near misses (right answer, wrong format) first: their working is the model's own.
        pool.sort(key=lambda pid: pid not in self.near_misses)
        demos = {pid: self.demo(pid) for pid in pool}
        demo_edits = [(f"add-demo:{_key(demos[pid].problem)}", lambda pid=pid: self._with_demo(doc, demos[pid]))
                      for pid in pool if _key(demos[pid].problem) not in present]
        first, second = (rule_edits, demo_edits) if self.rng.random() < 0.5 else (demo_edits, rule_edits)
        return edits + first + second

    def _with_format_rule(self, doc: ContextDoc, batch: set[str]) -> ContextDoc:
        # The example shows the shape of a real answer, from a problem outside the minibatch
        # (and outside the private ones).
        hidden = batch | self.private
        answers = [p.answer.strip() for pid, p in self.problems.items() if pid not in hidden]
        example = next((a for a in answers if 0 < len(a) <= 80), answers[0][:80] if answers else "42")
        rule = f"{FORMAT_RULE_PREFIX}, for example <answer>{example}</answer>. Put only the final answer inside the tags."
        return _with_rule(doc, rule, self.max_rules, front=True) or doc

    def _with_demo(self, doc: ContextDoc, demo: Demo) -> ContextDoc:
        demos = list(doc.demos)
        if len(demos) >= self.max_demos:
            weakest = min(range(len(demos)), key=lambda i: (self._demo_strength(_key(demos[i].problem)), i))
            demos.pop(weakest)
        demos.append(demo)
        return ContextDoc(doc.instruction, list(doc.rules), demos)


def _with_rule(doc: ContextDoc, rule: str, max_rules: int, front: bool = False) -> ContextDoc | None:
    if max_rules < 1:
        return None
    rules = [rule, *doc.rules] if front else [*doc.rules, rule]
    # Over capacity, the oldest mined rule goes (the format rule stays).
    while len(rules) > max_rules:
        drop = next((i for i, r in enumerate(rules) if not r.startswith(FORMAT_RULE_PREFIX) and r != rule), None)
        if drop is None:
            return None
        rules.pop(drop)
    return ContextDoc(doc.instruction, rules, list(doc.demos))


def _without_demo(doc: ContextDoc, q: str) -> ContextDoc:
    return ContextDoc(doc.instruction, list(doc.rules), [d for d in doc.demos if d.problem != q])


# --------------------------------------------------------------------------------------------
# LLM reflection
# --------------------------------------------------------------------------------------------


def _messages(prompt: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


class OpenAICompatibleLM:
    """Chat completions from any OpenAI-compatible server (vLLM, llama.cpp, hosted APIs).

    Uses the `openai` client (a dependency). No retries: a failed reflection simply proposes nothing.
    The API key is read from the environment variable `api_key_env` (local servers need none).
    `chat_template_kwargs` go to the server's chat template with each request (vLLM's, SGLang's and
    llama.cpp's servers read them from the request body: {"enable_thinking": False} is Qwen3's
    non-thinking mode); none are sent when empty, so hosted APIs see the plain request.
    """

    def __init__(self, base_url: str, model: str, timeout_s: float = 60.0, max_tokens: int = 1024,
                 temperature: float = 0.7, api_key_env: str = "OPENAI_API_KEY",
                 chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        url = base_url.rstrip("/")
        if urllib.parse.urlparse(url).path in ("", "/"):
            url += "/v1"  # a bare host:port means the standard OpenAI path layout
        self.base_url = url
        self.model = model
        self.timeout_s = float(timeout_s)
        self.max_tokens = int(max_tokens)
        self.temperature = float(temperature)
        self.api_key = os.environ.get(api_key_env) or "not-needed"
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def client(self, timeout_s: float | None = None) -> Any:
        """The `openai` client for the endpoint (no retries), with this model's timeout by default."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key,
                             timeout=self.timeout_s if timeout_s is None else timeout_s, max_retries=0)

    def __call__(self, prompt: Any) -> str:
        extra = {"extra_body": {"chat_template_kwargs": self.chat_template_kwargs}} if self.chat_template_kwargs else {}
        resp = self.client().chat.completions.create(model=self.model, messages=_messages(prompt),
                                                     max_tokens=self.max_tokens, temperature=self.temperature,
                                                     **extra)
        return resp.choices[0].message.content or ""

    def connection_error(self, timeout_s: float = 10.0) -> str | None:
        """Why the endpoint cannot be reached (refused, unknown host, timeout), or None: asks it
        for `/models` within `timeout_s`. An answer of any HTTP status counts as reached (some
        servers do not implement `/models`; a wrong key or model shows in the calls themselves)."""
        import openai

        try:
            self.client(min(timeout_s, self.timeout_s)).models.list()
        except openai.APIConnectionError as e:  # APITimeoutError included
            cause = e.__cause__ or e
            return " ".join(f"{type(cause).__name__}: {cause}".split())
        except Exception:  # it answered, with an error status or an odd body
            return None
        return None


class HFReflectionLM:
    """A local Hugging Face model as reflection model (loaded on first call); its chat template
    renders with `chat_template_kwargs` ({"enable_thinking": False}: Qwen3 answers without a trace)."""

    def __init__(self, path: str, max_new_tokens: int = 512, temperature: float = 0.7, seed: int = 0,
                 chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.path = path
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed
        self._generator: Any = None
        self._calls = 0

    def __call__(self, prompt: Any) -> str:
        from fastslow.model.generation import SamplingParams, make_generator

        if self._generator is None:
            self._generator = make_generator("hf", self.path, batch_size=1,
                                             chat_template_kwargs=self.chat_template_kwargs or None)
            self._generator.length_key = "fast.reflection.max_tokens"
        self._calls += 1
        params = SamplingParams(self.max_new_tokens, self.temperature, 1.0, self.seed + self._calls)
        return self._generator.generate([_messages(prompt)], params)[0].text


def reflection_environment_error(settings: Mapping[str, Any]) -> str | None:
    """What keeps the reflection model from being called from here, or None: for `litellm`, the
    litellm package missing or the provider's API key unset (`litellm.validate_environment`);
    for `openai`, the variable `api_key_env` names unset, or an endpoint that cannot be connected
    to (`OpenAICompatibleLM.connection_error`).
    Without them every reflection call fails, the pool never changes, and FST trains as RL would."""
    key = settings.get("api_key_env")  # named in the config: the endpoint wants a key (unset: none)
    if key and not os.environ.get(key) and settings.get("kind", "openai") in ("openai", "litellm"):
        return (f"fast.reflection.api_key_env: ${key} is not set in the environment the cycle jobs run in; "
                "export it there (every reflection call would fail)")
    if settings.get("kind", "openai") == "openai":
        lm = build_reflection_lm(settings)
        problem = lm.connection_error()
        if problem:
            return (f"fast.reflection.base_url {settings['base_url']!r}: cannot connect to {lm.base_url} "
                    f"({problem}); start the server or fix the URL (every reflection call would fail)")
        return None
    if settings.get("kind") != "litellm":
        return None
    try:
        import litellm
    except ImportError:
        return ("fast.reflection.kind 'litellm' needs the litellm package, which is not installed here "
                "(it is in the gpu extra: pip install -e '.[gpu]')")
    if key:  # the key is given (checked above): litellm's provider variables are not read
        return None
    missing = (litellm.validate_environment(model=settings["model"]) or {}).get("missing_keys") or []
    if missing:
        return (f"fast.reflection.model {settings['model']!r}: litellm finds no {', '.join(missing)} in the "
                f"environment; export it where the cycle jobs run (every reflection call would fail)")
    return None


def build_reflection_lm(settings: Mapping[str, Any], seed: int = 0) -> LanguageModel:
    """The reflection model described by `settings`:

    - `{"kind": "openai", "base_url": ..., "model": ..., "timeout_s": 60, "api_key_env": ...}`
    - `{"kind": "litellm", "model": "provider/name", "timeout_s": 60}` (keys from the environment)
    - `{"kind": "hf", "path": "/local/model/dir"}`
    Optional for all: `max_tokens`, `temperature`; for openai and hf, `chat_template_kwargs`.
    `seed`: the local model's sampling seed (the hosted kinds take none).
    """
    kind = settings.get("kind", "openai")
    timeout = float(settings.get("timeout_s", 60))
    max_tokens = int(settings.get("max_tokens", 1024))
    temperature = float(settings.get("temperature", 0.7))
    if kind == "openai":
        return OpenAICompatibleLM(settings["base_url"], settings["model"], timeout, max_tokens, temperature,
                                  settings.get("api_key_env", "OPENAI_API_KEY"),
                                  settings.get("chat_template_kwargs"))
    if kind == "litellm":
        from gepa.lm import LM  # imports litellm only when called

        extra: dict[str, Any] = {}
        if settings.get("base_url"):  # a self-hosted endpoint of the provider named in `model`
            extra["api_base"] = settings["base_url"]
        if settings.get("api_key_env"):  # else litellm reads its provider's own variable
            name = settings["api_key_env"]
            if not os.environ.get(name):
                raise ValueError(f"fast.reflection.api_key_env: the environment variable {name} is not set")
            extra["api_key"] = os.environ[name]
        return LM(settings["model"], temperature=temperature, max_tokens=max_tokens, num_retries=1,
                  timeout=timeout, **extra)
    if kind == "hf":
        return HFReflectionLM(settings["path"], max_new_tokens=max_tokens, temperature=temperature, seed=seed,
                              chat_template_kwargs=settings.get("chat_template_kwargs"))
    raise ValueError(f"fast.reflection.kind must be openai, litellm or hf, got {kind!r}")


def junk_reason(text: Any, parent: str, max_chars: int = MAX_CONTEXT_CHARS) -> str | None:
    """Why a proposed context is unusable, or None if it is acceptable. Longer than `max_chars`
    only where its parent is too (a long seed context), and then no longer than its parent: a
    child had been allowed 4x its parent's length, so over a long run's rounds a context could
    grow without end, and every rollout's prompt with it."""
    if not isinstance(text, str) or not text.strip():
        return "empty"
    t = text.strip()
    if len(t) < 16:
        return f"too short ({len(t)} chars)"
    limit = max(max_chars, len(parent.strip()))
    if len(t) > limit:
        return f"too long ({len(t)} chars, at most {limit}: fast.reflection.max_context_chars)"
    if t == parent.strip():
        return "unchanged"
    if "<curr_param>" in t or "<side_info>" in t:
        return "echoed the reflection template"
    if sum(c.isalpha() for c in t) < 0.3 * len(t):
        return "mostly non-letters"
    words = t.split()
    if len(words) > 30 and len(set(words)) < 0.15 * len(words):
        return "degenerate repetition"
    return None


class ReflectionThinkingCutOff(RuntimeError):
    """A reflection model's reasoning trace did not end within its token budget."""


class WithoutThinking:
    """A reflection model whose replies lose the reasoning trace they begin with: a thinking
    reflection model (a local Qwen3, `fast.reflection.kind: hf`, which thinks by default; an
    OpenAI-compatible server run without a reasoning parser) replies "<think>…</think>" and then
    the new context, and GEPA's extraction (from the first ``` to the last, or the whole reply)
    made the trace part of the context every rollout is prompted with. Only a trace at the start
    of the reply is a trace, up to its first `</think>`: a proposal that mentions the tags ("reason
    inside <think></think>, then …", likely when the rollouts reflected on are Qwen3's) stays
    whole. A trace that never ends raises `ReflectionThinkingCutOff`: the call proposes nothing
    (`ReflectiveProposer`). The wrapped model's attributes read through (`.model`, `.max_tokens`), but for
    `batch_complete`: gepa's batched replies (several components) would skip the filter."""

    def __init__(self, lm: LanguageModel) -> None:
        self.lm = lm

    def __call__(self, prompt: Any) -> str:
        reply = self.lm(prompt)
        if not isinstance(reply, str) or not reply.lstrip().startswith(THINK_OPEN):
            return reply
        end = reply.find(THINK_CLOSE)
        if end < 0:
            raise ReflectionThinkingCutOff(f"the reply's thinking ({THINK_OPEN}) never ended with {THINK_CLOSE}: "
                                           f"raise fast.reflection.max_tokens")
        return reply[end + len(THINK_CLOSE):]

    def __getattr__(self, name: str) -> Any:
        if name == "lm" or name.startswith("__"):  # not set yet (copy, unpickling); copy's own protocol
            raise AttributeError(name)
        if name == "batch_complete":  # gepa's batched replies would bypass the filter: it calls us in turn
            raise AttributeError(name)
        return getattr(self.lm, name)


class ReflectiveProposer:
    """GEPA's LLM reflection (its default prompt and extraction, `StatelessReflectionLM`) with
    a guard: a reflection call that raises (HTTP error, timeout) or yields junk (`junk_reason`)
    proposes nothing for that component, which GEPA treats as "no proposal" (no metric calls
    spent). `failures` lists what went wrong, for the round summary; `calls` counts the calls,
    `failed_calls` those that proposed nothing because of such a failure and `raised_calls` those
    of them that raised (no reply to judge, unlike junk)."""

    def __init__(self, lm: LanguageModel, prompt_template: str | None = None,
                 logger: Callable[[str], None] | None = None, max_chars: int = MAX_CONTEXT_CHARS) -> None:
        from gepa.proposer.reflective_mutation.reflection_lm import StatelessReflectionLM

        self.log = logger or log.info
        self.reflector = StatelessReflectionLM(WithoutThinking(lm), prompt_template, None)
        self.max_chars = max_chars
        self.failures: list[str] = []
        self.proposed = 0  # proposals that passed `junk_reason`, handed to GEPA to evaluate
        self.calls = 0
        self.failed_calls = 0
        self.raised_calls = 0

    def __call__(self, candidate: dict[str, str], reflective_dataset: Mapping[str, Sequence[Mapping[str, Any]]],
                 components_to_update: list[str]) -> dict[str, str]:
        self.calls += 1
        try:
            proposal, _ = self.reflector.reflect(candidate, reflective_dataset, components_to_update)
        except Exception as e:  # any failure of the reflection model leaves the parent as it is
            reason = f"{type(e).__name__}: {str(e)[:200]}"
            self.failures.append(reason)
            self.failed_calls += 1
            self.raised_calls += 1
            self.log(f"reflective: reflection call failed ({reason}); no proposal")
            return {}
        out = {}
        for name, text in proposal.new_texts.items():
            reason = junk_reason(text, candidate.get(name, ""), self.max_chars)
            if reason is not None:
                self.failures.append(reason)
                raw = proposal.raw_lm_outputs.get(name, "")
                self.log(f"reflective: rejected proposal for {name} ({reason}); raw output: {raw[:120]!r}")
                continue
            out[name] = text.strip()
            self.proposed += 1
        if proposal.new_texts and not out:  # the model answered, with nothing usable
            self.failed_calls += 1
        return out
