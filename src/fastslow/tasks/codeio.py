"""CodeIO: predict a program's output for a given input (reasoning-gym `codeio`, CodeI/O data).

Only *output* prediction is used: scoring an input-prediction answer properly needs running the
program, and scoring never executes code — answers are parsed as JSON (or Python literals via
`ast.literal_eval`) and compared structurally, numbers with a relative tolerance.

Generating a problem does run the shipped reference program (reasoning-gym computes the output
by `exec`). That happens only while building splits, in a child process (`isolate=True`) with
PYTHONHASHSEED=0 (set iteration order, hence outputs, reproducible), a per-item time limit and the
global RNGs seeded per item. An item is kept only if its program gives the gold again with other
seeds of the global RNGs and under other string hash seeds (`HASH_SEEDS`, in helper processes):
a gold that is one ordering of a set of strings cannot be read from the program. Splits are
disjoint by *program*: no program of the test split appears in training with other inputs.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import decimal
import functools
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fastslow.tasks.base import SPLITS, Judgement, Problem, TaskDataError, extract_answer
from fastslow.tasks.generated import OTHER_SPLIT, Candidate, split_of, stable_int
from fastslow.tasks.rgym import ReasoningGymTask, Source, jsonable, quiet, rg_score
from fastslow.tasks.scoring import json_diff, json_equal, parse_json_value

#: reasoning-gym 0.1.25's output-prediction prompt: the question, the input/output requirements,
#: the given input, then the instructions and the reference program.
_LAYOUT = re.compile(r"as follows:\n\n(?P<question>.+?)\n\nThe input and output requirements are as follows:"
                     r"\n\n.*?\bOutput:\n(?P<output>.+?)\n\nGiven the following input:\n\n(?P<input>.+?)"
                     r"\n\nCan you predict the output", re.DOTALL)


log = logging.getLogger(__name__)

#: Modules whose import marks a reference program that reaches outside its process (files,
#: directories, the network, subprocesses, threads, signals: the limits' own), and the names of
#: `os`, `sys`, `time` and `datetime` that do (`_outside_uses`); anything else of `os` but a few
#: path helpers.
_OUTSIDE_MODULES = frozenset({"tempfile", "shutil", "glob", "subprocess", "socket", "ssl", "threading", "_thread",
                              "multiprocessing", "concurrent", "asyncio", "requests", "urllib", "http", "ftplib",
                              "smtplib", "webbrowser", "pathlib", "signal", "ctypes", "importlib", "sqlite3",
                              "secrets"})
_HARMLESS_MODULES = frozenset({"urllib.parse"})  # string functions
_HARMLESS_OS = frozenset({"os.path.join", "os.path.basename", "os.path.dirname", "os.path.splitext", "os.sep",
                          "os.linesep"})
_OUTSIDE_SYS = frozenset({"sys.exit", "sys.stdin", "sys.modules", "sys.settrace", "sys.setprofile"})
_OUTSIDE_CALLS = frozenset({"open", "input", "exit", "quit", "__import__", "breakpoint"})
_OUTSIDE_NAMES = frozenset({"time.sleep", "io.open", "io.FileIO", "codecs.open", "builtins.open", "builtins.input"})
#: The clock: a program's output that reads it is the day (or second) it ran, which no model can
#: read from the program; the re-runs (`_reproducible`) miss what changes only once a day or a year
#: (`date.today()`, an age "as of today"). Read as the names of `_OUTSIDE_NAMES` are.
_CLOCK_NAMES = frozenset({*(f"time.{f}{ns}" for f in ("time", "perf_counter", "monotonic", "process_time",
                                                      "thread_time", "clock_gettime") for ns in ("", "_ns")),
                          "time.localtime", "time.gmtime", "time.ctime", "time.asctime", "time.strftime",
                          "datetime.datetime.now", "datetime.datetime.today", "datetime.datetime.utcnow",
                          "datetime.date.today"})
#: The operating system's randomness: a program (or input generator) drawing from it gives other
#: inputs or outputs at every build, so the same task, options and seed no longer make the same
#: splits (`secrets.token_bytes` in program 482's inputs; program 365's `random.seed()`, whose
#: items the reruns kept or dropped by chance). Read as `_OUTSIDE_NAMES` are; `secrets` as an
#: import. The seeders are refused only when called without a seed (or with None).
_ENTROPY_NAMES = frozenset({"random.SystemRandom", "uuid.uuid1", "uuid.uuid4"})
_UNSEEDED_WITHOUT_ARGUMENT = frozenset({
    "random.seed", "random.Random", "Random",  # `Random` is in the programs' namespace (`_rerun`)
    *(f"numpy.random.{f}" for f in ("seed", "default_rng", "RandomState", "SeedSequence", "PCG64", "PCG64DXSM",
                                    "MT19937", "Philox", "SFC64"))})
#: Names a program may not use at all, not only call: `o = open`, `getattr(__builtins__, "open")`.
_OUTSIDE_VALUES = frozenset({"open", "__import__", "breakpoint", "__builtins__"})
#: numpy's and pandas' readers and writers of files.
_FILE_FUNCTIONS = frozenset({"save", "savez", "savez_compressed", "savetxt", "load", "loadtxt", "genfromtxt",
                             "fromfile", "tofile", "memmap", "read_csv", "to_csv", "read_pickle", "to_pickle"})


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` of an attribute chain on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


@functools.lru_cache(maxsize=4096)
def _outside_uses(source: str) -> tuple[int, str] | None:
    """The first thing in `source` that reaches outside the process, read from its syntax tree
    (not its text: comments and docstrings name `input (x)` and `signal` harmlessly), as (its
    line, what), or None. A check of what programs name, not a sandbox: `getattr(os, "system")`
    passes it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the programs' invalid escape sequences ("\\s" in a str)
            tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 0, "code that does not parse"
    aliases: dict[str, str] = {}  # a name bound by an import -> the dotted name it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _outside_module(a.name):
                    return node.lineno, f"import {a.name}"
                aliases[(a.asname or a.name).split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}  # `from os import path`
            imported = set(names.values())
            if _outside_module(node.module) or imported & (_OUTSIDE_SYS | {"time.sleep"}) \
                    or (node.module.split(".")[0] == "os" and imported - _HARMLESS_OS - {"os.path"}):
                return node.lineno, f"from {node.module} import {', '.join(a.name for a in node.names)}"
            aliases.update(names)
    own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}  # a `def input(io)`
    for node in ast.walk(tree):
        seeder = _unseeded(node, aliases, own) if isinstance(node, ast.Call) else None
        if seeder is not None:
            return node.lineno, f"{seeder}() without a seed"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in _OUTSIDE_CALLS - own:
                return node.lineno, f"{node.func.id}()"
            name = aliases.get(node.func.id)  # `from numpy import save`; save(...)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in _OUTSIDE_VALUES - own:
            return node.lineno, node.id  # `o = open`: what it calls it by is no longer `open`
        elif isinstance(node, ast.Attribute):
            name = _dotted(node)  # (an attribute chain's inner links come later in the walk)
            if name is not None:
                root = name.split(".", 1)[0]
                name = _resolved(name, aliases)
                if root in aliases and _outside_module(name):  # `import urllib.parse`; urllib.request.urlopen
                    return node.lineno, name
        else:
            continue
        if name is not None and _outside_name(name):
            return node.lineno, name
    return None


def _resolved(name: str, aliases: Mapping[str, str]) -> str:
    """A dotted name with its first part read through the program's imports (`np.random.seed` is
    `numpy.random.seed` after `import numpy as np`)."""
    root, dot, rest = name.partition(".")
    return aliases.get(root, root) + dot + rest


def _unseeded(call: ast.Call, aliases: Mapping[str, str], own: set[str]) -> str | None:
    """The seeder `call` calls (imports resolved) when it is given no seed, or None as its seed
    (`random.seed()`, `np.random.default_rng(None)`: the operating system's randomness), else None.
    A program's own `Random` class is its own."""
    name = _dotted(call.func)
    if name is None or name in own:
        return None
    name = _resolved(name, aliases)
    if name not in _UNSEEDED_WITHOUT_ARGUMENT:
        return None
    seeds = [*call.args[:1], *(k.value for k in call.keywords if k.arg in ("a", "x", "seed", "entropy"))]
    if any(isinstance(v, ast.Starred) for v in call.args) or any(k.arg is None for k in call.keywords):
        return None  # `seed(*args)`, `Random(**kw)`: not read here
    return name if all(isinstance(v, ast.Constant) and v.value is None for v in seeds) else None


def _outside_module(module: str) -> bool:
    """Whether importing `module` (or naming something in it) marks a program that reaches outside
    its process."""
    return module.split(".")[0] in _OUTSIDE_MODULES and not any(
        module == harmless or module.startswith(harmless + ".") for harmless in _HARMLESS_MODULES)


def _outside_name(name: str) -> bool:
    """Whether a dotted name (imports resolved) reaches outside the process."""
    parts = name.split(".")
    return ((parts[0] == "os" and len(parts) > 1 and name not in _HARMLESS_OS | {"os.path"})
            or ".".join(parts[:2]) in _OUTSIDE_SYS or name in _OUTSIDE_NAMES | _CLOCK_NAMES | _ENTROPY_NAMES
            or (parts[0] in ("numpy", "pandas") and parts[-1] in _FILE_FUNCTIONS))


def reaches_outside(program: Mapping[str, Any]) -> str | None:
    """Why a reference program of reasoning-gym's codeio data is not run, or None. 46 of
    reasoning-gym 0.1.25's 3002 programs reach outside their process in their `code_sample` or
    `input_generator` (`_outside_uses`): one input generator writes, `chmod`s and removes
    `/home/...history` files (as root, in the real /home), another makes directories in /tmp,
    three exit the process (which stopped the split's whole worker), one reads stdin, seven
    start threads; 15 more read the clock (an age "as of today"), and 5 more draw the operating
    system's randomness (`secrets`, `random.seed()`). Their inputs or outputs also depend on the
    machine (which files exist), the day or the build, so they are skipped unrun, as another
    split's programs are: 66 in all."""
    code, generator = (str(program.get(part) or "") for part in ("code_sample", "input_generator"))
    # one source, as reasoning-gym runs them: an import of one part may serve the other
    found = _outside_uses(f"{code}\n{generator}")
    if found is None:
        return None
    line, why = found
    part = "code_sample" if line <= code.count("\n") + 1 else "input_generator"
    return f"{part}: {why}"


#: A worker that writes nothing for this long is stopped: its progress lines come every
#: `fastslow.tasks.generated.PROGRESS_SECONDS`, and each program has `item_timeout` CPU seconds, so
#: only a program stuck where the time limit cannot reach it (inside C code) goes this quiet.
STALL_SECONDS = 600.0
#: The worker's progress lines start with this on its stderr; the parent logs them.
_PROGRESS = "progress: "


#: What the worker keeps of this process's environment: where programs and libraries are, the
#: locale and the temporary directory. Not the rest: third-party reference programs run there, and
#: a job's environment holds tokens (HF_TOKEN, OPENAI_API_KEY, MLflow's credentials).
WORKER_ENVIRONMENT = ("PATH", "LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "PYTHONHOME", "PYTHONNOUSERSITE", "LANG",
                      "LANGUAGE", "TZ", "TMPDIR", "SYSTEMROOT", "PYTHONWARNINGS")


def worker_environment() -> dict[str, str]:
    """The codeio worker's share of this process's environment (`WORKER_ENVIRONMENT`, `LC_*`)."""
    return {k: v for k, v in os.environ.items() if k in WORKER_ENVIRONMENT or k.startswith("LC_")}


def run_worker(cmd: list[str], env: Mapping[str, str], cwd: str, stall: float | None = None) -> tuple[int, list[str]]:
    """Run the generation worker `cmd`: its progress lines are logged as they come (a paper-scale
    codeio split takes tens of minutes), and it is stopped once it has written nothing for
    `stall` seconds (default STALL_SECONDS). Returns its exit status and its last other lines.
    Its time is not capped as a whole: 50000 problems take as long as they take."""
    stall = STALL_SECONDS if stall is None else stall
    proc = subprocess.Popen(cmd, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    tail: collections.deque[str] = collections.deque(maxlen=20)
    last = [time.monotonic()]

    def relay() -> None:
        for line in proc.stderr:
            last[0] = time.monotonic()
            line = line.rstrip("\n")
            if line.startswith(_PROGRESS):
                log.info("%s", line.removeprefix(_PROGRESS))
            elif line.strip():
                tail.append(line)

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    while True:
        try:
            proc.wait(timeout=min(5.0, stall))
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() - last[0] > stall:
                proc.kill()
                proc.wait()
                reader.join(5)
                raise TaskDataError(f"codeio: the generation worker wrote nothing for {stall:.0f}s and was stopped "
                                    f"(a reference program stuck where its time limit cannot reach it); "
                                    f"its last line: {tail[-1] if tail else 'none'}") from None
    reader.join()
    return proc.returncode, list(tail)


def program_id(program: str) -> str:
    """A program's identity: 16 hex digits of a hash of its source; splits are keyed by it."""
    return f"{stable_int('program', program):016x}"


class CodeIOTask(ReasoningGymTask):
    """Output prediction for CodeI/O programs; JSON-normalised comparison, no code execution."""

    family = "codeio"
    key_names_one_problem = False  # its key is its program's, shared by that program's inputs
    instruction = "Answer with the output as a JSON value only."
    # reasoning-gym 0.1.25 asks for the *output* when random() < input_prediction_probability.
    sources_by_difficulty = {d: (Source("codeio", {"input_prediction_probability": 1.0}),)
                             for d in ("easy", "default", "hard")}
    attempts_per_problem = 80  # val/test own ~10% of the programs

    def __init__(self, name: str | None = None, difficulty: str = "default", *, isolate: bool = True,
                 partial_credit: bool = False, rel_tol: float = 1e-6, max_prompt_chars: int = 6000,
                 max_answer_chars: int = 400, item_timeout: float = 2.0) -> None:
        if difficulty != "default":
            raise ValueError(f"codeio: only difficulty 'default' exists, got {difficulty!r}")
        super().__init__(name, difficulty)
        for key, value, low in (("max_prompt_chars", max_prompt_chars, 1), ("max_answer_chars", max_answer_chars, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"codeio: {key}: expected an integer >= {low}, got {value!r}")
        if isinstance(item_timeout, bool) or not isinstance(item_timeout, (int, float)) or not item_timeout > 0:
            raise ValueError(f"codeio: item_timeout: expected a number of CPU seconds > 0, got {item_timeout!r}")
        if isinstance(rel_tol, bool) or not isinstance(rel_tol, (int, float)) or not 0 <= rel_tol < 1:
            raise ValueError(f"codeio: rel_tol: expected a number in [0, 1), got {rel_tol!r}")
        self.isolate, self.partial_credit, self.rel_tol = isolate, partial_credit, rel_tol
        self.max_prompt_chars, self.max_answer_chars = max_prompt_chars, max_answer_chars
        self.item_timeout = item_timeout

    # --- generation -------------------------------------------------------------------------
    def options(self) -> dict[str, Any]:
        """Constructor options that change the problems (sent to the worker process)."""
        return {"max_prompt_chars": self.max_prompt_chars, "max_answer_chars": self.max_answer_chars,
                "item_timeout": self.item_timeout}

    def problems(self, split: str, n: int, seed: int) -> list[Problem]:
        """`n` output-prediction problems of `split` (generated in a child process by default)."""
        return self.problems_for_splits({split: n}, seed)[split]

    def problems_for_splits(self, sizes: Mapping[str, int], seed: int) -> dict[str, list[Problem]]:
        """Several splits at once: one child process (reasoning-gym import) for all of them."""
        if not self.isolate:
            return {s: super(CodeIOTask, self).problems(s, n, seed) for s, n in sizes.items()}
        for s in sizes:
            if s not in SPLITS:
                raise ValueError(f"{self.name}: unknown split {s!r}; expected one of {', '.join(SPLITS)}")
        request = {"name": self.name, "options": self.options(), "sizes": dict(sizes), "seed": seed}
        with tempfile.TemporaryDirectory(prefix="fastslow-codeio-") as tmp:
            req, out = Path(tmp) / "request.json", Path(tmp) / "problems.json"
            req.write_text(json.dumps(request), encoding="utf-8")
            # The child runs in a scratch cwd (programs may write files); keep our package importable.
            src = str(Path(__file__).resolve().parents[2])
            path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
            # one thread for numpy's BLAS: a program's CPU-time limit counts every thread's, and two
            # threads spinning on each other took a 0.2 CPU-s program to 0.7-3.4 (`_seeded_run`)
            env = {**worker_environment(), "PYTHONHASHSEED": "0", "HF_HUB_OFFLINE": "1", "PYTHONPATH": path,
                   **dict.fromkeys(BLAS_THREAD_VARIABLES, "1")}
            code, lines = run_worker([sys.executable, "-m", "fastslow.tasks.codeio", str(req), str(out)], env, tmp)
            if code != 0 or not out.exists():
                tail = lines[-1:] or ["no output"]
                if code == _DATA_ERROR_EXIT and tail[0].startswith("TaskDataError: "):
                    raise TaskDataError(tail[0].removeprefix("TaskDataError: "))
                raise RuntimeError(f"codeio generation worker failed (exit {code}): {tail[0]}")
            rows = json.loads(out.read_text(encoding="utf-8"))
        return {s: [Problem.from_row(r) for r in rows[s]] for s in sizes}

    def entry(self, source: Source, split: str, seed: int, attempt: int) -> dict[str, Any] | None:
        chunk, idx = divmod(attempt, self.chunk_size)
        ds_seed = self.dataset_seed(source, split, seed, chunk)
        ds = self.dataset(source, ds_seed)
        # Mirror the first draw of CodeIODataset.__getitem__ to learn the program before running it:
        # programs owned by another split are skipped without executing anything.
        program = random.Random(ds.seed + idx).choice(type(ds)._jsonl_data)
        if split_of(program_id(program["task_description"])) != split:  # the key `convert` gives it
            return self.skip(OTHER_SPLIT)
        if reaches_outside(program):
            return None
        if self._too_long_for_any_input(program):
            return self.skip(f"data.options.{self.name}.max_prompt_chars={self.max_prompt_chars} (longer prompts)")
        global_seed = stable_int("codeio-globals", ds_seed, idx, bits=32)
        item = _run_item(ds, idx, global_seed, self.item_timeout)
        if item is None:
            return self.skip(f"data.options.{self.name}.item_timeout={self.item_timeout} (the program failed or "
                             f"ran out of CPU seconds)")
        if program["task_description"] not in item["question"]:
            raise RuntimeError("reasoning-gym codeio changed how it samples programs; update CodeIOTask.entry")
        if "Can you predict the output" in str(item["question"]) and not _reproducible(
                program["code_sample"], (item.get("metadata") or {}).get("input_data"), str(item["answer"]),
                global_seed, self.item_timeout):
            return None
        item["program"] = program["task_description"]
        return item

    def _too_long_for_any_input(self, program: Mapping[str, Any]) -> bool:
        """Whether `program`'s question is longer than max_prompt_chars with an empty input, so that
        `convert` rejects it whatever the program outputs: it is not run (469 programs of the CPU
        default's train split at 2500). Its splits come out the same as when every program ran, as
        long as a program skipped changed no process state a later one reads (`_seeded_run` restores
        the RNGs, `decimal`'s context and numpy's error handling, not every module's globals). The
        CPU default's splits came out byte-identical; at paper.yaml's sizes a review read the
        skipped programs and found none whose state a kept one reads; and
        `tests/test_tasks.py` compares a small split with the check off."""
        from reasoning_gym.code.codeio import OUTPUT_PREDICTION_PROMPT_TEMPLATE as question_of

        return len(question_of.format(program["task_description"], program["input_output_spec"], "",
                                      program["code_sample"])) > self.max_prompt_chars

    def convert(self, item: Mapping[str, Any], source: Source) -> Candidate | None:
        question = str(item["question"])
        meta = item.get("metadata", {}) or {}
        if "Can you predict the output" not in question or not meta.get("input_data"):
            return None  # input prediction, or the program failed on this input
        try:
            answer = json.dumps(json.loads(str(item["answer"])), sort_keys=True)
            given_input = jsonable(meta["input_data"])
        except (TypeError, ValueError):
            return None
        if len(answer) > self.max_answer_chars:
            return self.skip(f"data.options.{self.name}.max_answer_chars={self.max_answer_chars} (longer answers)")
        if len(question) > self.max_prompt_chars:
            return self.skip(f"data.options.{self.name}.max_prompt_chars={self.max_prompt_chars} (longer prompts)")
        cand = super().convert(item, source)
        cand.answer = answer
        cand.metadata = {"source": source.dataset, "input": given_input,
                         "program_id": program_id(str(item["program"]))}
        cand.key = cand.metadata["program_id"]  # the program's identity, short (kept as metadata["split_key"])
        return cand

    # --- worked examples --------------------------------------------------------------------
    def demo_gist(self, problem: Problem) -> str | None:
        """The question, the output's specification and the input, without the reference program
        and the instructions every problem repeats: what the answer's shape (its JSON type and
        keys) is learnt from. None when the prompt is not in reasoning-gym's layout."""
        m = _LAYOUT.search(problem.prompt)
        if m is None:
            return None
        output = " ".join(m["output"].split())
        return f"{m['question'].strip()}\n\nOutput: {output}\n\nInput: {m['input'].strip()}"

    # --- scoring ----------------------------------------------------------------------------
    def judge(self, problem: Problem, completion: str) -> Judgement:
        expected = json.loads(problem.answer)
        raw = extract_answer(completion)
        notes = []
        if problem.metadata.get("input") is not None:
            notes.append("Input was: " + json.dumps(problem.metadata["input"])[:500])
        if not raw:  # no block, or an empty one: no answer (`answered`), even where the output is ""
            return Judgement(0.0, problem.answer, raw, notes)
        ok, got = parse_json_value(raw)
        if not ok and isinstance(expected, str):
            ok, got = True, raw.strip()  # a bare string answer without JSON quotes
        if not ok:
            notes.insert(0, "The answer is not a JSON value (use double quotes, true/false/null).")
            return Judgement(self._partial(raw, problem), problem.answer, raw, notes)
        if json_equal(expected, got, self.rel_tol):
            return Judgement(1.0, problem.answer, raw, notes)
        diffs = json_diff(expected, got, rel_tol=self.rel_tol)
        notes.insert(0, "Differences: " + "; ".join(diffs) if diffs else "The value differs.")
        return Judgement(self._partial(raw, problem), problem.answer, raw, notes)

    def _partial(self, raw: str, problem: Problem) -> float:
        """reasoning-gym's tree-edit similarity (optional); skipped on long answers (quadratic)."""
        if not self.partial_credit or len(raw) > 2 * len(problem.answer) + 200:
            return 0.0
        return min(0.9, rg_score("codeio", raw, {"answer": problem.answer}))


#: The worker runs numpy's BLAS on one thread (its CPU-time limit counts every thread's).
BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: A program's wall-clock limit, in multiples of its CPU-time limit (`item_timeout`): only for one
#: that waits (sleeps, blocks) rather than computes, which the CPU-time limit never stops.
WALL_FACTOR = 10


@contextlib.contextmanager
def _seeded_run(global_seed: int, timeout: float) -> Iterator[None]:
    """A reference program's run: stdout silenced, the global RNGs (`random`, `np.random`)
    seeded with `global_seed` and restored afterwards, the state a program may set for the rest of
    its process started afresh and restored afterwards (`decimal`'s context, numpy's error
    handling: 12 shipped programs set the precision, and the next program to use `Decimal` in the
    same worker computed its gold at that precision, not at the default its code shows), and
    (main thread) a limit of `timeout` seconds of CPU time (`ITIMER_PROF`), with `WALL_FACTOR`
    times that of wall-clock time behind it. Wall-clock time alone made the splits depend on the
    machine's load: a program of about a second, run while other jobs shared the cores, passed 2 s
    and its item was dropped, which shifted every later item of its split (a quiet rebuild wrote
    other splits)."""
    import numpy as np

    py_state, np_state, np_errors, context = random.getstate(), np.random.get_state(), np.geterr(), decimal.getcontext()
    decimal.setcontext(decimal.Context())  # a new interpreter's (DefaultContext's values)
    np.seterr(**_NUMPY_ERRORS)
    random.seed(global_seed)
    np.random.seed(global_seed % 2**32)
    use_alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    handlers = {sig: signal.signal(sig, _timeout) for sig in _LIMITS} if use_alarm else {}
    timers = {}
    try:
        if use_alarm:
            timers = {which: signal.setitimer(which, seconds) for which, seconds in
                      ((signal.ITIMER_PROF, timeout), (signal.ITIMER_REAL, timeout * WALL_FACTOR))}
        with quiet():
            yield
    finally:
        if use_alarm:
            _disarm(handlers, timers)
        random.setstate(py_state)
        np.random.set_state(np_state)
        np.seterr(**np_errors)
        decimal.setcontext(context)


#: numpy's error handling in a new interpreter (`np.geterr()` before anything sets it).
_NUMPY_ERRORS = {"divide": "warn", "over": "warn", "under": "ignore", "invalid": "warn"}


#: The signals of a program's limits (`_seeded_run`): CPU time, then wall-clock time.
_LIMITS = (signal.SIGPROF, signal.SIGALRM) if hasattr(signal, "SIGPROF") else ()


def _disarm(handlers: Mapping[int, Any], timers: Mapping[int, tuple[float, float]]) -> None:
    """Stop a run's timers and put back what it replaced (the signals' handlers, a profiler's
    timers, the signal mask), with the signals blocked, and drop a limit that struck as the run ended: its
    TimeoutError would otherwise cut this short and leave a timer armed, to strike later in code
    that has nothing to do with the program (or, its handler gone, to kill the process). A limit
    whose handler runs before the signals are blocked is caught, and the whole done again."""
    while True:
        try:
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, _LIMITS)
            try:
                _stop_timers()
                _take_pending(_LIMITS)  # the limits that struck after the program, not delivered
                for sig, handler in handlers.items():
                    signal.signal(sig, handler)
                for which, (delay, interval) in timers.items():
                    if delay > 0:
                        signal.setitimer(which, delay, interval)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            return
        except TimeoutError:
            continue


def _run_item(ds: Any, idx: int, global_seed: int, timeout: float) -> dict[str, Any] | None:
    """`ds[idx]` in a `_seeded_run`; None when it fails or runs out of time."""
    try:
        with _seeded_run(global_seed, timeout):
            return dict(ds[idx])
    except (Exception, SystemExit):  # a program's own exit() too: it would end the whole worker
        return None


def _rerun(code: str, shown_input: dict[str, Any], global_seed: int, timeout: float) -> Any:
    """The program's output on a copy of `shown_input`, as JSON values, in a `_seeded_run`
    (raises what the program raises, TimeoutError past its limit)."""
    import copy

    namespace: dict[str, Any] = {"Random": random.Random}
    with _seeded_run(global_seed, timeout), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the programs' own (np.matrix's deprecation)
        exec(code, namespace, namespace)  # noqa: S102 - reasoning-gym's own reference program
        out = namespace["main_solution"](**copy.deepcopy(shown_input))
    return json.loads(json.dumps(out))


#: The string hash seeds (PYTHONHASHSEED) an item's program runs under again (`_reproducible`),
#: each in a helper process of the worker's (the worker's own is 0). Of 474 items a review ran
#: under other seeds, 3 gave other golds: a list made from a set of names, `max` over a set with
#: ties. Each seed more catches a set of two strings in the gold's order half as often.
HASH_SEEDS = (1, 2)


class _HashSeedRunner:
    """A helper process under PYTHONHASHSEED=`seed` that runs programs (`_rerun`) on request,
    started on first use and again after a program killed it (that item then fails)."""

    def __init__(self, seed: int) -> None:
        self.seed, self.proc, self.conn = seed, None, None

    def _start(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # a new interpreter: the hash seed is read at start
        parent, child = ctx.Pipe()
        before = os.environ.get("PYTHONHASHSEED")
        os.environ["PYTHONHASHSEED"] = str(self.seed)
        try:
            proc = ctx.Process(target=_hash_seed_server, args=(child,), daemon=True)
            proc.start()
            self.proc = proc
        finally:
            if before is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = before
        child.close()
        self.conn = parent
        # a helper that cannot start (a spawn that fails, a script without a __main__ guard) or
        # that ignores the environment (python -E/-I: its hash seed then a random one) stops the
        # build in one line, instead of dropping every item it was asked about
        try:
            ready = parent.recv() if parent.poll(120) else None
        except (EOFError, OSError):  # it ended before a word
            ready = None
        if ready != ("ready", str(self.seed)):
            self.stop()
            raise RuntimeError(f"codeio: the helper process that re-runs programs under PYTHONHASHSEED={self.seed} "
                               f"did not start (it said {ready!r}); generating codeio splits needs one")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None

    def submit(self, code: str, shown_input: dict[str, Any], global_seed: int, timeout: float) -> bool:
        """Send a program to run (`result` takes its output); False when the helper cannot take it."""
        if self.proc is None or not self.proc.is_alive():
            self.stop()
            self._start()
        try:
            self.conn.send((code, shown_input, global_seed, timeout))
            return True
        except OSError:
            self.stop()
            return False

    def result(self, timeout: float) -> tuple[bool, Any]:
        """(True, the output) of the program submitted, or (False, None) when it failed, ran out
        of time or ended the helper."""
        try:
            # its own limits stop a program (`_seeded_run`); this one a process that stopped answering
            if self.conn.poll(timeout * WALL_FACTOR + 30):
                return self.conn.recv()
        except (EOFError, OSError):
            pass
        self.stop()
        return False, None


def _hash_seed_server(conn: Any) -> None:
    """`_HashSeedRunner`'s process: run each program sent, answer (ok, output)."""
    limit_memory()
    for name in BLAS_THREAD_VARIABLES:
        os.environ[name] = "1"
    seed = os.environ.get("PYTHONHASHSEED") if not sys.flags.ignore_environment else "ignored (python -E or -I)"
    conn.send(("ready", seed))
    while True:
        try:
            code, shown_input, global_seed, timeout = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, _rerun(code, shown_input, global_seed, timeout)))
        except (Exception, SystemExit):
            conn.send((False, None))


_RUNNERS: dict[int, _HashSeedRunner] = {}


def _reproducible(code: str, shown_input: Any, answer: str, global_seed: int, timeout: float) -> bool:
    """Whether the reference program gives the gold output again on the input its prompt shows,
    run twice more on copies of it, with other seeds of the global RNGs and under other string
    hash seeds (`HASH_SEEDS`, the k-th with RNG seed `global_seed` + k, in helper processes that
    run at once). Of 164 programs a review ran again, 8 drew from unseeded `random`/`np.random`
    (their output a draw no model can predict) and 1 changed its input in place, which
    reasoning-gym then put in the prompt (the input shown is not the one the output came from);
    of 474 items another review ran under other hash seeds, 3 gave their gold in the order of a
    set of strings. No model could answer any of them."""
    if not isinstance(shown_input, dict):
        return False
    try:
        gold = json.loads(answer)
    except ValueError:
        return False
    # twice the limit: the worker's own run kept to it, and a helper imports a program's modules
    # afresh (on the CPU-time clock, a first import of scipy is most of it). The helpers run at once.
    runners = [_RUNNERS.setdefault(seed, _HashSeedRunner(seed)) for seed in HASH_SEEDS]
    sent = [runner.submit(code, shown_input, global_seed + k, 2 * timeout) for k, runner in enumerate(runners, 1)]
    results = [runner.result(2 * timeout) if ok else (False, None) for runner, ok in zip(runners, sent, strict=True)]
    return all(ok and out == gold for ok, out in results)


def _take_pending(signals: tuple[int, ...]) -> None:
    """Take those of `signals` that are pending (blocked, struck), without waiting: another
    thread may take a pending one first, and a bare `sigwait` would then wait for ever. macOS has
    no `sigtimedwait`: there each signal `sigpending` names is taken, which returns at once."""
    if hasattr(signal, "sigtimedwait"):
        while signal.sigtimedwait(signals, 0) is not None:
            pass
        return
    for sig in sorted(signal.sigpending() & set(signals)):
        signal.sigwait({sig})


def _stop_timers() -> None:
    """Both of a program's limits off (`_seeded_run`'s CPU-time and wall-clock timers)."""
    for which in (signal.ITIMER_PROF, signal.ITIMER_REAL):
        signal.setitimer(which, 0)


def _timeout(signum: int, frame: Any) -> None:
    """A program's limit struck: both timers off first (the other must not strike later, in
    whatever runs then), then the run is stopped."""
    _stop_timers()
    raise TimeoutError("codeio reference program took too long")


#: The worker's address space: a reference program allocating past it gets a MemoryError (its item
#: is dropped), not the machine's memory, which the other jobs share. The worker's own peak is
#: about 0.27 GB of address space (0.15 GB resident) building 96 problems.
WORKER_ADDRESS_SPACE = 4 << 30


def limit_memory(limit: int = WORKER_ADDRESS_SPACE) -> None:
    """Cap this process's address space at `limit` bytes where the OS enforces it (Linux; macOS
    refuses or ignores the limit, and the worker then runs without it)."""
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        lower = [x for x in (soft, hard) if x != resource.RLIM_INFINITY]  # a stricter limit stays
        resource.setrlimit(resource.RLIMIT_AS, (min([limit, *lower]), hard))


def _worker(request_path: str, out_path: str) -> None:
    """Child-process entry point: generate the requested splits and write them as JSON rows."""
    limit_memory()
    req = json.loads(Path(request_path).read_text(encoding="utf-8"))
    handler = logging.StreamHandler(sys.stderr)  # progress lines, for the parent to log (`run_worker`)
    handler.setFormatter(logging.Formatter(_PROGRESS + "%(message)s"))
    progress = logging.getLogger("fastslow.tasks.generated")
    progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    progress.propagate = False
    task = CodeIOTask(req["name"], isolate=False, **req["options"])
    result = task.problems_for_splits(req["sizes"], int(req["seed"]))
    rows = {s: [p.to_row() for p in ps] for s, ps in result.items()}
    Path(out_path).write_text(json.dumps(rows), encoding="utf-8")


#: How the worker is called; `CodeIOTask.problems_for_splits` is its only caller.
USAGE = ("usage: python -m fastslow.tasks.codeio REQUEST.json OUT.json  (internal: the codeio "
         "generation worker CodeIOTask starts; not a command for users)")
#: The worker's exit status for a TaskDataError (re-raised as one by the parent).
_DATA_ERROR_EXIT = 3


def main(argv: list[str]) -> int:
    """The worker's command line: exactly a request file and an output path, else usage (exit 2)."""
    if len(argv) != 2 or any(a.startswith("-") for a in argv) or not Path(argv[0]).is_file():
        print(USAGE, file=sys.stderr)
        return 2
    try:
        _worker(argv[0], argv[1])
    except TaskDataError as exc:  # the parent turns this line back into a TaskDataError
        print(f"TaskDataError: {exc}", file=sys.stderr)
        return _DATA_ERROR_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
