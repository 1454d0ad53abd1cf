"""fastslow.provenance: which library modules a workflow script can run, and their digest."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fastslow import provenance

ROOT = Path(__file__).resolve().parents[1]

PACKAGE = {
    "__init__.py": '"""The package."""\n',
    "a.py": ('"""Module a."""\nimport pkg.b\n\n\ndef thing():\n    """Lazy imports count too."""\n'
             '    from .c import f\n    return f() + pkg.b.VALUE\n\n\n'
             'PLUGINS = {"e": "pkg.sub.e"}  # named for importlib\n'),
    "b.py": "VALUE = 1\n",
    "c.py": "def f():\n    return 2\n",
    "unused.py": "X = 0\n",
    "sub/__init__.py": "from . import d\n",
    "sub/d.py": "from ..b import VALUE\nD = VALUE\n",
    "sub/e.py": "E = 3\n",
}


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package `pkg` in tmp_path, a script importing from it, and a fresh digest cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(provenance, "_CACHE", None)
    root = tmp_path / "pkg"
    for name, text in PACKAGE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    script = tmp_path / "script.py"
    script.write_text("from pkg.a import thing\nprint(thing())\n")
    return root, script


def edit(path: Path, text: str) -> None:
    """Write `text` to `path` with a later mtime than before (the cache's key), however fast."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))


def digest(package_and_script) -> str:
    root, script = package_and_script
    return provenance.script_digest(script, root)


def test_modules_follow_imports_in_functions_relative_and_by_name(package):
    root, script = package
    assert provenance.library_modules(script, root) == (
        "pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.sub", "pkg.sub.d", "pkg.sub.e")


def test_comments_docstrings_and_layout_change_nothing(package):
    root, _ = package
    first = digest(package)
    edit(root / "a.py", PACKAGE["a.py"].replace('"""Lazy imports count too."""', '"""Reworded."""')
         .replace("# named for importlib", "# a comment\n\n"))
    edit(root / "__init__.py", '"""Another docstring."""\n# and a comment\n')
    edit(root / "c.py", "def f():\n\n    return (2)\n")
    assert digest(package) == first


@pytest.mark.parametrize("module", ["c.py", "sub/d.py", "sub/e.py", "__init__.py"])
def test_code_change_in_a_reachable_module_changes_the_digest(package, module):
    root, _ = package
    first = digest(package)
    edit(root / module, (root / module).read_text() + "CHANGED = True\n")
    assert digest(package) != first


def test_unreachable_module_changes_nothing(package):
    root, _ = package
    first = digest(package)
    edit(root / "unused.py", "X = 1\n")
    assert digest(package) == first


def test_the_cache_is_used_and_a_broken_one_ignored(package, tmp_path, monkeypatch):
    root, _ = package
    first = digest(package)
    cache = tmp_path / "cache/fastslow/code-digests.json"
    entries = json.loads(cache.read_text())
    assert len(entries) == len(PACKAGE) - 1 + 1  # every module but unused.py, and the script
    # a cached entry is trusted while the file's size and mtime are unchanged
    key = next(k for k in entries if k.startswith("pkg.b|"))
    entries[key][0] = "0" * 64
    cache.write_text(json.dumps(entries))
    monkeypatch.setattr(provenance, "_CACHE", None)
    assert digest(package) != first
    cache.write_text("{not json")
    monkeypatch.setattr(provenance, "_CACHE", None)
    assert digest(package) == first
    assert len(json.loads(cache.read_text())) == len(entries)  # rewritten whole


def test_an_edited_file_replaces_its_cache_entry(package, tmp_path):
    root, _ = package
    digest(package)
    edit(root / "b.py", "VALUE = 2\n")
    digest(package)
    entries = json.loads((tmp_path / "cache/fastslow/code-digests.json").read_text())
    assert sum(k.startswith("pkg.b|") for k in entries) == 1


def test_a_module_that_does_not_parse_is_named(package):
    root, _ = package
    edit(root / "c.py", "def f(:\n")
    with pytest.raises(ValueError, match=r"c\.py: cannot digest a module that does not parse"):
        digest(package)


def test_a_missing_script_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no script .*nope.py"):
        provenance.script_digest(tmp_path / "nope.py")


def test_workflow_scripts_reach_what_they_run():
    """The real scripts: training reaches the trainer and the fast loop, figures do not."""
    scripts = ROOT / "workflow/scripts"
    cycle = provenance.library_modules(scripts / "cycle.py")
    assert {"fastslow.slow.trainer", "fastslow.fast.round", "fastslow.tasks.hover"} <= set(cycle)
    assert "fastslow.figures" not in cycle
    figure = provenance.library_modules(scripts / "figure.py")
    assert "fastslow.figures" in figure and "fastslow.slow.trainer" not in figure
