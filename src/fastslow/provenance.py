"""Which library code a workflow job runs: a digest of the fastslow modules its script reaches.

Snakemake re-runs a job whose `script:` changed (its code trigger), but the scripts here are a
few lines that call this library, so an edit of, say, the CISPO loss in `fastslow.slow.trainer`
would leave every trained run looking up to date. `script_digest` closes that gap: every rule
with a script gets ``params: code=script_digest(<script>)``, a digest of the library modules the
script imports, directly or through other modules (imports inside functions too, and modules
named in strings for `importlib`, as `fastslow.tasks` does), so a job re-runs exactly when code
it can run changed.

What counts is each module's syntax tree without docstrings (`ast.unparse`): comments,
docstrings, blank lines and formatting change nothing. Modules the script cannot reach change
nothing either (an edit of `fastslow.figures` re-draws figures and trains nothing).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

#: The package whose modules are digested: this file's own.
PACKAGE_DIR = Path(__file__).resolve().parent
#: A dotted module name inside a string (`importlib.import_module("fastslow.tasks.hover")`).
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
#: Characters of the digest kept: 64 bits, ample to tell versions of one code base apart.
DIGEST_CHARS = 16


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


class _Cache:
    """Each file's (code hash, imports) by (module, path, size, mtime): parsing the library takes
    ~0.4 s on the project's CPU, and Snakemake computes the digests every time it starts. Kept in
    ``$XDG_CACHE_HOME/fastslow/code-digests.json`` (else ``~/.cache/...``); a cache that cannot
    be read or written is only slower."""

    def __init__(self) -> None:
        root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        self.path = Path(root) / "fastslow" / "code-digests.json"
        try:
            self.entries: dict[str, list] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.entries = {}
        self.dirty = False

    def read(self, path: Path, package: str, module: str) -> tuple[str, tuple[str, ...]]:
        stat = path.stat()
        key = f"{module}|{path}|{stat.st_size}|{stat.st_mtime_ns}"
        if key not in self.entries:
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            except SyntaxError as err:
                raise ValueError(f"{path}: cannot digest a module that does not parse "
                                 f"({err.msg}, line {err.lineno})") from None
            code, names = _normalise(tree, package, module, path.name == "__init__.py")
            stale = [k for k in self.entries if k.startswith(f"{module}|{path}|")]
            for k in stale:
                del self.entries[k]
            self.entries[key] = [hashlib.sha256(code.encode()).hexdigest(), names]
            self.dirty = True
        code_hash, names = self.entries[key]
        return code_hash, tuple(names)

    def save(self) -> None:
        if not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.entries))
            tmp.replace(self.path)
            self.dirty = False
        except OSError:
            pass


_CACHE: _Cache | None = None


def _read(path: Path, package: str, module: str) -> tuple[str, tuple[str, ...]]:
    """(hash of the normalised code, module names it may import) of one file, `module` its
    dotted name (``__main__`` for a script)."""
    global _CACHE
    if _CACHE is None:
        _CACHE = _Cache()
    return _CACHE.read(path, package, module)


def _module_file(name: str, package_dir: Path) -> Path | None:
    """The file of module `name` (dotted, starting with the package's name), None if not a module
    (an attribute imported with ``from module import name``)."""
    base = package_dir.joinpath(*name.split(".")[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _with_parents(name: str) -> Iterable[str]:
    """A module and the packages that importing it runs first (``a.b.c``: a, a.b, a.b.c)."""
    parts = name.split(".")
    return (".".join(parts[:i]) for i in range(1, len(parts) + 1))


def library_modules(script: str | Path, package_dir: Path = PACKAGE_DIR) -> tuple[str, ...]:
    """Dotted names of the package's modules `script` can run, sorted."""
    package = package_dir.name
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(f"no script {script} to digest")
    _, todo = _read(script.resolve(), package, "__main__")
    seen: dict[str, Path] = {}
    stack = [parent for name in todo for parent in _with_parents(name)]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        path = _module_file(name, package_dir)
        if path is None:
            continue
        seen[name] = path
        for imported in _read(path, package, name)[1]:
            stack += [p for p in _with_parents(imported) if p not in seen]
    return tuple(sorted(seen))


def script_digest(script: str | Path, package_dir: Path = PACKAGE_DIR) -> str:
    """A digest of the code of every package module `script` can run (`library_modules`), as
    hex: equal exactly when none of them changed but for comments, docstrings and layout."""
    package = package_dir.name
    digest = hashlib.sha256()
    for name in library_modules(script, package_dir):
        code_hash, _ = _read(_module_file(name, package_dir), package, name)
        digest.update(f"{name}\0{code_hash}\0".encode())
    if _CACHE is not None:
        _CACHE.save()
    return digest.hexdigest()[:DIGEST_CHARS]
