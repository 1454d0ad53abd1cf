"""fastslow.provenance: which library modules a workflow script can run, and their digest."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest

from fastslow import provenance

ROOT = Path(__file__).resolve().parents[1]

PACKAGE = {
    "__init__.py": '"""The package."""\n',
    "a.py": ('"""Module a."""\nfrom typing import TYPE_CHECKING\n\nimport pkg.b\n\nif TYPE_CHECKING:\n'
             '    from pkg import hints\n\n\ndef thing():\n    """Lazy imports count too."""\n'
             '    from .c import f\n    return f() + pkg.b.VALUE\n\n\n'
             'PLUGINS = {"e": "pkg.sub.e"}  # named for importlib\n'),
    "b.py": "import pkg.x as renamed\n\nVALUE = renamed.X\n",
    "c.py": "from pkg import sub  # a subpackage, absolute\n\n\ndef f():\n    return 2\n",
    "x.py": 'X = 1\n\n\nclass Box:\n    """A class with a docstring."""\n\n    size = 2\n',
    "hints.py": "H = int\n",
    "unused.py": "X = 0\n",
    "sub/__init__.py": "from . import d\n",
    "sub/d.py": "from ..b import VALUE\nD = VALUE\n",
    "sub/e.py": "from .deep import G\nE = 3\n",
    "sub/deep/__init__.py": "from .. import f2  # two levels up from a package: pkg.sub\nG = 1\n",
    "sub/f2.py": "F2 = 2\n",
}
REACHED = ("pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.hints", "pkg.sub", "pkg.sub.d", "pkg.sub.deep",
           "pkg.sub.e", "pkg.sub.f2", "pkg.x")


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package `pkg` in tmp_path, a script importing from it, and a fresh digest cache."""
    monkeypatch.setenv("FASTSLOW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(provenance, "_CACHE", None)
    root = tmp_path / "pkg"
    for name, text in PACKAGE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    script = tmp_path / "script.py"
    script.write_text("from pkg.a import thing\nprint(thing())\n")
    return root, script


def digest(package_and_script, **kwargs) -> str:
    root, script = package_and_script
    return provenance.script_digest(script, root, **kwargs)


def cache_entries(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "cache/code-digests.json").read_text())


def test_modules_follow_every_form_of_import(package):
    """Top-level, inside functions and TYPE_CHECKING, `import a.b as c`, relative (one and two
    levels, from modules and packages), `from package import subpackage`, and by name."""
    root, script = package
    assert provenance.library_modules(script, root) == REACHED


def test_importing_a_module_runs_its_packages_first(package):
    """`import pkg.sub.f2` runs pkg and pkg.sub (and what they import) before f2, for a script
    and for a task's modules alike."""
    root, script = package
    script.write_text("import pkg.sub.f2\n")
    assert provenance.library_modules(script, root) == ("pkg", "pkg.b", "pkg.sub", "pkg.sub.d", "pkg.sub.f2", "pkg.x")
    first = provenance.task_digest(["pkg.sub.f2"], root)
    (root / "sub/__init__.py").write_text(PACKAGE["sub/__init__.py"] + "CHANGED = True\n")
    assert provenance.task_digest(["pkg.sub.f2"], root) != first


def test_only_a_whole_string_is_a_module_name(package):
    """A string naming a module counts (importlib); prose that starts with one does not."""
    root, script = package
    (root / "hints.py").write_text(PACKAGE["hints.py"] + 'NOTE = "pkg.unused.X, in prose, names no module."\n')
    assert provenance.library_modules(script, root) == REACHED
    (root / "hints.py").write_text(PACKAGE["hints.py"] + 'NAME = "pkg.unused"\n')
    assert "pkg.unused" in provenance.library_modules(script, root)


def test_comments_docstrings_and_layout_change_nothing(package):
    root, _ = package
    first = digest(package)
    (root / "a.py").write_text(PACKAGE["a.py"].replace('"""Lazy imports count too."""', '"""Reworded."""')
                               .replace("# named for importlib", "# a comment\n\n"))
    (root / "__init__.py").write_text('"""Another docstring."""\n# and a comment\n')
    (root / "c.py").write_text("from pkg import sub\n\ndef f():\n\n    return (2)\n")
    # a class's docstring too (only functions' and modules' had been reworded)
    (root / "x.py").write_text(PACKAGE["x.py"].replace("A class with a docstring.", "Reworded, at length."))
    assert digest(package) == first
    # and an async function's
    (root / "hints.py").write_text(PACKAGE["hints.py"] + 'async def fetch():\n    """Old words."""\n    return 1\n')
    second = digest(package)
    (root / "hints.py").write_text(PACKAGE["hints.py"] + 'async def fetch():\n    """New words."""\n    return 1\n')
    assert digest(package) == second


@pytest.mark.parametrize("module", ["c.py", "x.py", "hints.py", "sub/d.py", "sub/e.py", "sub/f2.py",
                                    "sub/deep/__init__.py", "__init__.py"])
def test_code_change_in_a_reachable_module_changes_the_digest(package, module):
    root, _ = package
    first = digest(package)
    (root / module).write_text((root / module).read_text() + "CHANGED = True\n")
    assert digest(package) != first


def test_a_same_size_edit_with_the_same_mtime_is_seen(package):
    """The cache is keyed by content, not by size and mtime (which copies and installs keep)."""
    root, _ = package
    first = digest(package)
    path = root / "x.py"
    stat = path.stat()
    path.write_text("X = 2\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert digest(package) != first


def test_unreachable_module_changes_nothing(package):
    root, _ = package
    first = digest(package)
    (root / "unused.py").write_text("X = 1\n")
    assert digest(package) == first


def test_extra_files_count_by_content_not_place(package, tmp_path):
    one, two = tmp_path / "one/fsdp2.yaml", tmp_path / "two/fsdp2.yaml"
    for path in (one, two):
        path.parent.mkdir()
        path.write_text("mixed_precision: bf16\n")
    assert digest(package, extra=[one]) == digest(package, extra=[two]) != digest(package)
    # a comment or another layout is not a change (a user pulling a comment edit retrains nothing)
    two.write_text("# the GPUs' precision\nmixed_precision:   bf16   # native on A100/H100\n")
    assert digest(package, extra=[two]) == digest(package, extra=[one])
    two.write_text("mixed_precision: 'no'\n")
    assert digest(package, extra=[two]) != digest(package, extra=[one])
    # a mapping's order is layout too, and so is the order the files are named in
    one.write_text("mixed_precision: bf16\nnum_machines: 1\n")
    two.write_text("num_machines: 1\nmixed_precision: bf16\n")
    assert digest(package, extra=[one]) == digest(package, extra=[two])
    yml = tmp_path / "one/other.yml"  # .yml is YAML too
    yml.write_text("a: 1\n")
    assert digest(package, extra=[one, yml]) == digest(package, extra=[yml, one])
    first = digest(package, extra=[yml])
    yml.write_text("# a comment\na:   1\n")
    assert digest(package, extra=[yml]) == first
    other = tmp_path / "one/notes.txt"  # other data files: their bytes
    other.write_text("a\n")
    first = digest(package, extra=[other])
    other.write_text("a \n")
    assert digest(package, extra=[other]) != first
    with pytest.raises(FileNotFoundError, match="no file .*missing.yaml to digest"):
        digest(package, extra=[tmp_path / "missing.yaml"])
    # place is not the order either: files in two folders, one of them moved
    (tmp_path / "zz").mkdir()
    moved = tmp_path / "zz/other.yml"  # now after two/fsdp2.yaml by path, before it by name
    moved.write_text(yml.read_text())
    assert digest(package, extra=[two, yml]) == digest(package, extra=[two, moved])
    # a YAML file that does not parse stopped every Snakemake start with yaml's own lines, which
    # name "<unicode string>", not the file (an accelerate config a user was editing)
    two.write_text("mixed_precision: [bf16\nnum_machines: 1\n")
    with pytest.raises(ValueError) as err:
        digest(package, extra=[one, two])
    assert str(err.value) == f"{two} does not parse as YAML (expected ',' or ']', but got ':', line 2)"


def test_the_cache_is_used_and_a_broken_one_ignored(package, tmp_path, monkeypatch):
    root, _ = package
    first = digest(package)
    entries = cache_entries(tmp_path)
    assert len(entries) == len(REACHED) + 1  # and the script
    # an entry is trusted for the same module name and bytes: a tampered one shows
    key = next(k for k in entries if "|pkg.b|" in k)
    entries[key][0] = "0" * 64
    (tmp_path / "cache/code-digests.json").write_text(json.dumps(entries))
    monkeypatch.setattr(provenance, "_CACHE", None)
    assert digest(package) != first
    for broken in ("{not json", "[]", json.dumps({key: "not an entry"}), json.dumps({key: ["only one"]}),
                   json.dumps({key: [0, []]}), json.dumps({key: ["0" * 64, "pkg.x"]})):
        (tmp_path / "cache/code-digests.json").write_text(broken)
        monkeypatch.setattr(provenance, "_CACHE", None)
        assert digest(package) == first
    assert len(cache_entries(tmp_path)) == len(entries)  # rewritten whole, the bad entry replaced


def test_the_same_code_elsewhere_shares_entries_and_the_cache_is_bounded(package, tmp_path, monkeypatch):
    root, script = package
    first = digest(package)
    copy = tmp_path / "copy/pkg"
    copy.parent.mkdir()
    shutil.copytree(root, copy)
    assert provenance.script_digest(script, copy) == first
    assert len(cache_entries(tmp_path)) == len(REACHED) + 1  # no entries for the copy's paths
    monkeypatch.setattr(provenance, "CACHE_ENTRIES", 3)
    (root / "x.py").write_text("X = 5\n")
    digest(package)
    entries = cache_entries(tmp_path)
    assert len(entries) == 3 and any("|pkg.x|" in k for k in entries)  # the newest kept


def test_one_script_digested_against_two_packages(package, tmp_path, monkeypatch):
    """A script's imports are cached by its bytes: read for one package, they were then those of
    any other (the script importing both got no modules, the digest of nothing, of the second)."""
    root, script = package
    other = tmp_path / "other"
    other.mkdir()
    (other / "__init__.py").write_text("")
    (other / "m.py").write_text("M = 1\n")
    script.write_text("import pkg.x\nimport other.m\n")
    assert provenance.library_modules(script, root) == ("pkg", "pkg.x")
    assert provenance.library_modules(script, other) == ("other", "other.m")
    digest = provenance.script_digest(script, other)
    monkeypatch.setattr(provenance, "_CACHE", None)
    shutil.rmtree(tmp_path / "cache")
    assert provenance.script_digest(script, other) == digest


def test_a_cache_that_cannot_be_written_leaves_nothing_behind(package, tmp_path, monkeypatch):
    """A full disk: the digest as ever, the cache as it was, and no partial file left in its
    folder at each Snakemake start."""
    first = digest(package)
    before = cache_entries(tmp_path)
    (package[0] / "x.py").write_text("X = 5\n")  # a new entry to save

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(json, "dump", disk_full)
        changed = digest(package)
    assert changed != first and cache_entries(tmp_path) == before
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["code-digests.json"]


def test_a_module_that_does_not_parse_is_hashed_as_bytes_with_a_warning(package, monkeypatch):
    """An edit in progress elsewhere must not stop the whole workflow from parsing."""
    root, _ = package
    first = digest(package)
    (root / "c.py").write_text("def f(:\n")
    (root / "hints.py").write_text("H = float\n")  # and a new analysis to save with it
    with pytest.warns(UserWarning, match=r"c\.py does not parse \(.*line 1\)"):
        broken = digest(package)
    assert broken != first
    # the next start says so again (the cached analysis kept it silent), once however many rules ask
    monkeypatch.setattr(provenance, "_CACHE", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert digest(package) == digest(package) == broken
    assert [str(w.message).split(" (")[0] for w in caught] == [f"{root / 'c.py'} does not parse"]
    (root / "c.py").write_text(PACKAGE["c.py"])
    (root / "hints.py").write_text(PACKAGE["hints.py"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert digest(package) == first


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


def test_excluded_modules_are_digested_per_job_instead(package):
    """pkg.a names pkg.sub.e for importlib (as fastslow.tasks names every task's module): with it
    excluded, an edit of e (or of what only e imports) leaves the script's digest as it was and
    changes e's own `task_digest`, not that of another excluded module."""
    root, script = package
    (root / "sub/other.py").write_text("O = 1\n")
    excluded = ("pkg.sub.e", "pkg.sub.other")
    assert provenance.library_modules(script, root, exclude=excluded) == tuple(
        m for m in REACHED if m not in ("pkg.sub.e", "pkg.sub.deep", "pkg.sub.f2"))
    script_before = digest(package, exclude=excluded)
    e_before = provenance.task_digest(["pkg.sub.e"], root, exclude=excluded)
    other_before = provenance.task_digest(["pkg.sub.other"], root, exclude=excluded)
    assert e_before != other_before
    (root / "sub/f2.py").write_text("F2 = 3\n")  # imported only through e
    assert digest(package, exclude=excluded) == script_before
    assert provenance.task_digest(["pkg.sub.e"], root, exclude=excluded) != e_before
    assert provenance.task_digest(["pkg.sub.other"], root, exclude=excluded) == other_before
    assert digest(package) != provenance.script_digest(script, root, exclude=excluded)  # without: e counts
    with pytest.raises(ModuleNotFoundError, match="no module pkg.nope"):
        provenance.task_digest(["pkg.nope"], root)
    # which modules, not only their code: the same code under another name is another digest
    (root / "hints.py").write_text((root / "unused.py").read_text())
    assert provenance.task_digest(["pkg.hints"], root) != provenance.task_digest(["pkg.unused"], root)


def test_every_task_module_is_left_out_of_the_rules_code_and_in_its_tasks_own():
    """The real package: no workflow script reaches a task's module but through fastslow.tasks'
    registry, and each task's digest holds its own module, not another task's."""
    from fastslow.config import load_config, task_modules
    from fastslow.tasks import TASK_MODULES, TASK_NAMES

    # what makes leaving them out sound: no module but the registry (and the task modules
    # themselves) imports a task module, so only jobs that build tasks run one
    modules = provenance._package_modules(provenance.PACKAGE_DIR)
    importers = {name for name, path in modules.items() if name not in ("fastslow.tasks", *TASK_MODULES)
                 and set(provenance._read(path, "fastslow", name)[1]) & set(TASK_MODULES)}
    assert not importers
    assert set(TASK_MODULES) <= set(provenance._read(modules["fastslow.tasks"], "fastslow", "fastslow.tasks")[1])
    cycle = provenance.library_modules(ROOT / "workflow/scripts/cycle.py", exclude=TASK_MODULES)
    assert "fastslow.tasks" in cycle and "fastslow.tasks.rgym" not in cycle  # rgym: the tasks' own
    cfg = load_config(ROOT / "config" / "config.yaml")
    digests = {name: provenance.task_digest(task_modules(cfg, name), exclude=TASK_MODULES) for name in TASK_NAMES}
    assert digests["hover"] == digests["hover_hard"] and digests["math"] != digests["hover"]
    assert len(set(digests.values())) == len(TASK_MODULES)
