"""Which library code a workflow job runs: a digest of the fastslow modules its script reaches.

Snakemake re-runs a job whose `script:` changed (its code trigger), but the scripts here are a
few lines that call this library, so an edit of, say, the CISPO loss in `fastslow.slow.trainer`
would leave every trained run looking up to date. `script_digest` closes that gap: every rule
with a script gets ``params: code=library_code(<script>)`` (workflow/rules/common.smk), a digest
of the library modules the script can import, directly or through other modules (imports inside
functions too, and modules named in strings for `importlib`, as `fastslow.tasks` does), and of
any data files the rule names (`extra`): a job re-runs when code it can import changed.

What counts is each module's syntax tree without docstrings (`ast.unparse`): comments,
docstrings, blank lines and formatting change nothing, nor do a YAML data file's comments and
layout (its values count). Modules the script cannot import change
nothing either (an edit of `fastslow.figures` redraws figures and trains nothing). A module
counts whether or not the job calls it, so the digest errs towards re-running. Not covered: a
module name built at run time (none today), and files the library reads that no rule names.
`ast.unparse` prints some code differently in another Python minor version (f-strings since
3.12), so a new Python changes the digests: the README says how `--touch` accepts that.

Task modules are the exception (`task_digest`): `fastslow.tasks` names every task's module in a
string, so every job that can build a task would reach them all, and an edit of one task's reward
would re-run every task's jobs. The rules leave them out of their `code` (``exclude=``) and the
jobs that build tasks get a `task_code` param of their own tasks' modules instead.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

#: The package whose modules are digested: this file's own.
PACKAGE_DIR = Path(__file__).resolve().parent
#: A dotted module name inside a string (`importlib.import_module("fastslow.tasks.hover")`).
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
#: Characters of the digest kept: 64 bits, ample to tell versions of one code base apart.
DIGEST_CHARS = 16
#: Part of every cache key: a change of how files are read here, or of Python (whose
#: `ast.unparse` may print the same code differently), invalidates what was cached.
CACHE_VERSION = f"1-py{sys.version_info[0]}.{sys.version_info[1]}"
#: Entries kept in the cache file, the most recently added last (about 100 bytes each).
CACHE_ENTRIES = 4096


def _normalise(tree: ast.Module, package: str, module: str, is_package: bool) -> tuple[str, list[str]]:
    """(the tree's code without docstrings, the package's module names it may import), one walk."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
        elif isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's package, up level - 1 more
                parts = module.split(".")
                base = ".".join(parts[:len(parts) - node.level + is_package] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names]  # `from pkg import module`
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith(package + ".") and _DOTTED.fullmatch(node.value):
            names.append(node.value)
    return ast.unparse(tree), [n for n in names if n == package or n.startswith(package + ".")]


def _analyse(path: Path, source: bytes, package: str, module: str) -> tuple[list, bool]:
    """([hash of the normalised code, module names it may import], whether it parsed) of one
    file. A file that does not parse (an edit in progress) is hashed as it is, with a warning:
    only the jobs that import it fail, when they do, and the workflow itself still parses."""
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as err:
        warnings.warn(f"{path} does not parse ({err.msg}, line {err.lineno}): its digest is of its "
                      f"bytes, and the modules it imports are not followed", stacklevel=4)
        return [hashlib.sha256(source).hexdigest(), []], False
    code, names = _normalise(tree, package, module, path.name == "__init__.py")
    return [hashlib.sha256(code.encode()).hexdigest(), names], True


class _Cache:
    """Each file's analysis by (CACHE_VERSION, package, module name, sha256 of its bytes; the
    package as what a script, ``__main__``, imports depends on it): reading and hashing the
    library takes milliseconds, parsing it ~0.35 s on the project's CPU, and Snakemake computes
    the digests every time it starts (on a cluster, in every job too). Kept in
    ``code-digests.json`` under $FASTSLOW_CACHE_DIR, else ``$XDG_CACHE_HOME/fastslow`` (else
    ``~/.cache/fastslow``); a cache that cannot be read or written is only slower."""

    def __init__(self) -> None:
        from fastslow.io import cache_root

        self.path = cache_root() / "code-digests.json"
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            entries = {}
        self.entries: dict[str, list] = entries if isinstance(entries, dict) else {}
        # files that do not parse, for this start only: the next one warns of them again
        self.unparsed: dict[str, list] = {}
        self.dirty = False

    def read(self, path: Path, package: str, module: str) -> tuple[str, tuple[str, ...]]:
        source = path.read_bytes()
        key = f"{CACHE_VERSION}|{package}|{module}|{hashlib.sha256(source).hexdigest()}"
        entry = self.unparsed.get(key) or self.entries.get(key)
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)
                and isinstance(entry[1], list)):
            entry, parsed = _analyse(path, source, package, module)
            if parsed:
                self.entries[key] = entry
                self.dirty = True
            else:
                self.unparsed[key] = entry
        return entry[0], tuple(entry[1])

    def save(self) -> None:
        if not self.dirty:
            return
        entries = dict(list(self.entries.items())[-CACHE_ENTRIES:])
        tmp = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
            with os.fdopen(fd, "w") as fh:
                json.dump(entries, fh)
            os.replace(tmp, self.path)
            self.dirty = False
        except OSError:
            if tmp is not None:  # a full disk: no partial file left at each start
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


_CACHE: _Cache | None = None


def _read(path: Path, package: str, module: str) -> tuple[str, tuple[str, ...]]:
    """(hash of the normalised code, module names it may import) of one file, `module` its
    dotted name (``__main__`` for a script)."""
    global _CACHE
    if _CACHE is None:
        _CACHE = _Cache()
    return _CACHE.read(path, package, module)


def _package_modules(package_dir: Path) -> dict[str, Path]:
    """Every module of the package by dotted name, as the file system spells it (so on a
    case-insensitive one, ``from fastslow.fast import Pool`` is not ``fast/pool.py``)."""
    package = package_dir.name
    modules: dict[str, Path] = {}
    for directory, subdirs, files in os.walk(package_dir):
        subdirs[:] = [d for d in subdirs if d.isidentifier()]  # importable names; no __init__.py: no package
        rel = Path(directory).relative_to(package_dir).parts
        if "__init__.py" not in files:
            subdirs[:] = []
            continue
        prefix = ".".join((package, *rel))
        modules[prefix] = Path(directory) / "__init__.py"
        for name in files:
            if name.endswith(".py") and name != "__init__.py" and name[:-3].isidentifier():
                modules[f"{prefix}.{name[:-3]}"] = Path(directory) / name
    return modules


def _with_parents(name: str) -> Iterable[str]:
    """A module and the packages that importing it runs first (``a.b.c``: a, a.b, a.b.c)."""
    parts = name.split(".")
    return (".".join(parts[:i]) for i in range(1, len(parts) + 1))


def library_modules(script: str | Path, package_dir: Path = PACKAGE_DIR,
                    exclude: Iterable[str] = ()) -> tuple[str, ...]:
    """Dotted names of the package's modules `script` can run, sorted; with `exclude`, not
    through those modules (nor them)."""
    return tuple(sorted(_closure(script, package_dir, frozenset(exclude))))


def _closure(script: str | Path | None, package_dir: Path, exclude: frozenset[str] = frozenset(),
             roots: Iterable[str] = ()) -> dict[str, Path]:
    """The package's modules `script` (or, without one, the modules `roots`) can run, by name, not
    going through the `exclude`d ones (a name imported with ``from module import name`` that is
    not a module, an attribute, is no module of the package and is skipped)."""
    package = package_dir.name
    modules = _package_modules(package_dir)
    todo = list(roots)
    if script is not None:
        script = Path(script)
        if not script.is_file():
            raise FileNotFoundError(f"no script {script} to digest")
        todo += _read(script.resolve(), package, "__main__")[1]
    seen: dict[str, Path] = {}
    stack = [parent for name in todo for parent in _with_parents(name)]
    while stack:
        name = stack.pop()
        if name in seen or name not in modules or name in exclude:
            continue
        seen[name] = modules[name]
        for imported in _read(seen[name], package, name)[1]:
            stack += [p for p in _with_parents(imported) if p not in seen]
    return seen


def script_digest(script: str | Path, package_dir: Path = PACKAGE_DIR, extra: Sequence[str | Path] = (),
                  exclude: Iterable[str] = ()) -> str:
    """A digest of the code of every package module `script` can run (`library_modules`, not
    through the `exclude`d modules) and of the bytes of the `extra` files (data the library reads,
    e.g. accelerate configs), as hex: equal exactly when none of them changed but for comments,
    docstrings and layout."""
    return _digest(_closure(script, package_dir, frozenset(exclude)), package_dir, extra)


def task_digest(modules: Iterable[str], package_dir: Path = PACKAGE_DIR, exclude: Iterable[str] = ()) -> str:
    """A digest of the code the task `modules` can run, not through the other `exclude`d modules
    (the other tasks': their package names them all), as hex: what a job that builds those tasks
    runs beyond its rule's `script_digest` with the task modules excluded."""
    modules = sorted(modules)
    known = _package_modules(package_dir)
    unknown = [m for m in modules if m not in known]
    if unknown:
        raise ModuleNotFoundError(f"no module {', '.join(unknown)} in {package_dir} to digest")
    others = frozenset(exclude) - set(modules)
    return _digest(_closure(None, package_dir, others, roots=modules), package_dir, ())


def _data_bytes(path: Path) -> bytes:
    """What of a data file counts: a YAML file's values (its comments and layout change
    nothing, as a module's do not), any other file's bytes. A YAML file that does not parse is
    a one-line error naming it and the line."""
    if path.suffix in (".yaml", ".yml"):
        from fastslow.io import read_yaml

        return json.dumps(read_yaml(path), sort_keys=True, default=str).encode()
    return path.read_bytes()


def _digest(closure: dict[str, Path], package_dir: Path, extra: Sequence[str | Path]) -> str:
    package = package_dir.name
    digest = hashlib.sha256()
    for name, path in sorted(closure.items()):
        code_hash, _ = _read(path, package, name)
        digest.update(f"{name}\0{code_hash}\0".encode())
    files = []
    for path in sorted(Path(p) for p in extra):
        if not path.is_file():
            raise FileNotFoundError(f"no file {path} to digest")
        files.append((path.name, hashlib.sha256(_data_bytes(path)).hexdigest()))
    for name, data_hash in sorted(files):  # by name, not place: their folders may sort otherwise
        digest.update(f"{name}\0{data_hash}\0".encode())
    if _CACHE is not None:
        _CACHE.save()
    return digest.hexdigest()[:DIGEST_CHARS]
