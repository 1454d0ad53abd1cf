"""Atomic writes: all or nothing, and outputs readable as a plain write would leave them."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from fastslow.io import atomic_path, exception_chain, umask, write_json


@pytest.fixture(params=[0o022, 0o027])
def mask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_umask_is_read_without_changing_it(mask):
    assert umask() == mask
    assert umask() == mask


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a synced file through Linux's /proc/self/fd")
def test_what_an_atomic_write_renames_is_on_disk_before_the_rename_and_the_rename_after(tmp_path, monkeypatch):
    """Renamed without a sync, a node crash could leave a complete-looking empty or truncated
    output (the rename reached the disk, the data not). Every file and directory written is synced
    before the rename, the directory holding the output after it."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("sync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(b))), real_replace(a, b))[1])
    with atomic_path(tmp_path / "model", is_dir=True) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "weights.bin").write_bytes(b"w" * 10)
        (tmp / "sub" / "config.json").write_text("{}")
        written = [str(tmp / "weights.bin"), str(tmp / "sub" / "config.json"), str(tmp / "sub"), str(tmp)]
    renamed = events.index(("replace", str(tmp_path / "model")))
    assert sorted(path for _, path in events[:renamed]) == sorted(written)
    assert events[renamed + 1:] == [("sync", str(tmp_path))]
    events.clear()
    write_json({"a": 1}, tmp_path / "cycle.json")
    assert [kind for kind, _ in events] == ["sync", "replace", "sync"] and events[-1] == ("sync", str(tmp_path))


def test_atomic_outputs_get_the_modes_of_a_plain_write(tmp_path, mask):
    """A directory output (model, final weights) gets mkdir's mode, not mkdtemp's 0700, and a
    file output open()'s: collaborators on a shared file system can read both."""
    with atomic_path(tmp_path / "model", is_dir=True) as tmp:
        (tmp / "config.json").write_text("{}")
    write_json({"a": 1}, tmp_path / "x.json")
    (tmp_path / "plain_dir").mkdir()
    (tmp_path / "plain.json").write_text("{}")
    assert _mode(tmp_path / "model") == _mode(tmp_path / "plain_dir") == 0o777 & ~mask
    assert _mode(tmp_path / "x.json") == _mode(tmp_path / "plain.json") == 0o666 & ~mask
    assert _mode(tmp_path / "model" / "config.json") == 0o666 & ~mask


def test_a_failed_write_leaves_the_old_output_and_no_temporary(tmp_path):
    write_json({"v": 1}, tmp_path / "x.json")
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "x.json") as tmp:
        tmp.write_text('{"v": ')
        raise RuntimeError("killed")
    assert (tmp_path / "x.json").read_text().replace(" ", "").replace("\n", "") == '{"v":1}'
    with pytest.raises(RuntimeError), atomic_path(tmp_path / "d", is_dir=True) as tmp:
        (tmp / "part").write_text("half")
        raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_figures_are_saved_whole_and_alone(tmp_path):
    """_save writes the PDF and the PNG through temporaries: both exist, nothing else is left."""
    from fastslow.figures import _plt, _save

    fig = _plt().figure()
    fig.gca().plot([0, 1], [1, 0])
    _save(fig, tmp_path / "figs" / "fig.pdf")
    files = sorted((tmp_path / "figs").iterdir())
    assert [p.name for p in files] == ["fig.pdf", "fig.png"]
    assert files[0].read_bytes()[:4] == b"%PDF" and files[1].read_bytes()[:4] == b"\x89PNG"


def _write_private(path: Path, text: str = "w") -> None:
    """Create `path` 0600, as safetensors' save_file leaves model.safetensors (its Rust temp file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def test_files_a_writer_creates_private_are_committed_with_a_plain_writes_mode(tmp_path, mask):
    """Weights (model/model.safetensors, and final weights hard-linked to them) must be readable by
    the group like every other output, whatever mode their writer created them with."""
    with atomic_path(tmp_path / "model", is_dir=True) as tmp:
        _write_private(tmp / "model.safetensors")
        (tmp / "trainer_state").mkdir(mode=0o700)
        _write_private(tmp / "trainer_state" / "optimizer.pt")
        script = tmp / "run.sh"
        _write_private(script)
        os.chmod(script, 0o700)
        os.symlink("model.safetensors", tmp / "link")
    with atomic_path(tmp_path / "weights.bin") as tmp:
        _write_private(tmp)
    model = tmp_path / "model"
    assert _mode(model / "model.safetensors") == 0o666 & ~mask
    assert _mode(model / "trainer_state") == 0o777 & ~mask
    assert _mode(model / "trainer_state" / "optimizer.pt") == 0o666 & ~mask
    assert _mode(model / "run.sh") == 0o777 & ~mask  # an executable stays executable
    assert (model / "link").is_symlink()
    assert _mode(tmp_path / "weights.bin") == 0o666 & ~mask


def test_safetensors_weights_are_committed_readable(tmp_path, mask):
    """The real writer: safetensors' save_file leaves its file 0600 (a renamed Rust temp file)."""
    import torch
    from safetensors.torch import save_file

    with atomic_path(tmp_path / "model", is_dir=True) as tmp:
        save_file({"w": torch.zeros(2)}, str(tmp / "model.safetensors"))
    assert _mode(tmp_path / "model" / "model.safetensors") == 0o666 & ~mask


def test_temporaries_of_a_killed_writer_are_removed_by_the_next_write(tmp_path):
    """A job killed mid-write (SIGKILL, or job_run's signal handler, which ends the process without
    unwinding) leaves `.name.XXXXXXXX`; the next write of the same path removes it, and only it."""
    import tempfile

    stale_dir = Path(tempfile.mkdtemp(prefix=".cycle1.", dir=tmp_path))
    (stale_dir / "model").mkdir()
    stale_file = Path(tempfile.mkdtemp(prefix=".x.json.", dir=tmp_path))
    (stale_file / "x.json").write_text("half")
    keep = [tmp_path / ".cycle10.abcd1234",  # another cycle's temporary
            tmp_path / ".cycle1.work",  # the ranks' shared work dir of a distributed cycle
            tmp_path / ".cycle1.abcd12345",  # not mkdtemp's 8 characters
            tmp_path / ".cycle1.ABCD1234"]  # not its alphabet
    for p in keep:
        p.mkdir()
    (tmp_path / ".cycle1.job.json").write_text("{}")  # a launched cycle's job spec
    with atomic_path(tmp_path / "cycle1", is_dir=True) as tmp:
        (tmp / "cycle.json").write_text("{}")
    write_json({"v": 1}, tmp_path / "x.json")
    assert not stale_dir.exists() and not stale_file.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["cycle1", "x.json", ".cycle1.job.json", *(p.name for p in keep)])


def test_write_json_writes_standard_json_with_null_for_nan_and_inf(tmp_path):
    """An evaluation without its KL pass has entropy NaN: Python wrote a bare NaN, which polars,
    jq and JavaScript reject. Written as null (curves read null as NaN again)."""
    import math

    import polars as pl

    from fastslow.curves import _number

    path = write_json({"entropy": math.nan, "k": 4, "fits": [math.inf, 0.5, (-math.inf, 1.0)],
                       "nested": {"kl_to_base": math.nan, "label": "nan"}}, tmp_path / "eval.json")

    def no_constants(name):
        raise AssertionError(f"{name} is not JSON")

    data = json.loads(path.read_text(), parse_constant=no_constants)
    assert data == {"entropy": None, "k": 4, "fits": [None, 0.5, [None, 1.0]],
                    "nested": {"kl_to_base": None, "label": "nan"}}
    assert pl.read_json(path).height == 1
    assert math.isnan(_number(data["entropy"])) and _number(0.25) == 0.25


def test_json_text_is_standard_json():
    """The figure job logged Fig 3's unfitted asymptotes as a bare NaN, which is no JSON."""
    import json

    from fastslow.io import json_text

    text = json_text({"math": {"rl": float("nan"), "fst": 0.5, "inf": float("inf")}, "when": Path("x")})
    assert json.loads(text) == {"math": {"rl": None, "fst": 0.5, "inf": None}, "when": "x"}
    assert "NaN" not in text


def test_link_tree_links_every_file_but_snakemakes_timestamp(tmp_path):
    """A run's final weights are hard links to its last cycle's model (final_weights.py). The
    cycle's `.snakemake_timestamp` was linked too, so Snakemake touching the final model's touched
    the cycle's, which then looked newer than its evaluation (re-run under --notemp)."""
    from fastslow.io import link_tree

    src = tmp_path / "cycle2/model"
    (src / "sub").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "sub/tokenizer.json", ".hidden", ".snakemake_timestamp"):
        (src / name).write_text(name)
    with atomic_path(tmp_path / "final/model", is_dir=True) as tmp:
        link_tree(src, tmp)
    out = tmp_path / "final/model"
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == [".hidden", "config.json", "model.safetensors", "sub/tokenizer.json"]
    assert all((out / f).stat().st_ino == (src / f).stat().st_ino for f in files)  # links, not copies


def test_an_exception_chain_is_each_error_once_cause_before_context() -> None:
    """What `jobs.disk_full` and the MLflow lock retry walk: the error, then what it was raised
    from (else what it was raised while handling); a chain that loops ends instead of spinning."""
    root, cause, context = RuntimeError("top"), OSError("cause"), ValueError("context")
    root.__cause__, root.__context__, cause.__context__ = cause, context, context
    assert list(exception_chain(root)) == [root, cause, context]
    loop = KeyError("a")
    loop.__context__ = loop
    assert list(exception_chain(loop)) == [loop]


def test_a_sibling_whose_name_only_ends_like_a_temporary_is_kept(tmp_path):
    """Only `.name.XXXXXXXX` is a temporary of `name`: a directory whose name merely has mkdtemp's
    8 characters where the prefix would end is someone's data."""
    keep = tmp_path / "keep_me_abcd1234"  # as long as `.x.json.` plus 8 characters
    keep.mkdir()
    write_json({"v": 1}, tmp_path / "x.json")
    assert keep.is_dir()


def test_a_link_in_a_directory_output_is_committed_and_its_target_left_alone(tmp_path, mask):
    """A link's target is not the output's: its mode stays, and a link to nothing (yet) does not
    fail the write (syncing it followed the link and raised FileNotFoundError, losing the output)."""
    private = tmp_path / "private.bin"
    _write_private(private)
    with atomic_path(tmp_path / "model", is_dir=True) as tmp:
        (tmp / "config.json").write_text("{}")
        os.symlink(private, tmp / "linked.bin")
        os.symlink(tmp_path / "not-yet", tmp / "dangling")
    assert (tmp_path / "model" / "linked.bin").read_text() == "w"
    assert os.readlink(tmp_path / "model" / "dangling") == str(tmp_path / "not-yet")
    assert _mode(private) == 0o600


def test_linked_weights_of_a_private_directory_are_committed_with_a_plain_mode(tmp_path, mask):
    """link_tree copies the source directory's mode onto the output's (copytree's copystat): a
    cycle's model saved 0700 made the run's final weights 0700 too."""
    from fastslow.io import link_tree

    src = tmp_path / "cycle1" / "model"
    src.mkdir(parents=True)
    (src / "config.json").write_text("{}")
    os.chmod(src, 0o700)
    with atomic_path(tmp_path / "final" / "model", is_dir=True) as tmp:
        link_tree(src, tmp)
    assert _mode(tmp_path / "final" / "model") == 0o777 & ~mask


def test_a_directory_the_file_system_cannot_sync_is_left_but_a_file_it_cannot_sync_fails_the_write(
        tmp_path, monkeypatch):
    """Some network file systems refuse to sync a directory: the output is written all the same. A
    file that cannot be synced may not be on disk: the write fails and the old output stays."""
    import errno
    import stat as st

    real_fsync = os.fsync
    refuse = {"dir"}

    def fsync(fd):
        kind = "dir" if st.S_ISDIR(os.fstat(fd).st_mode) else "file"
        if kind in refuse:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_json({"v": 1}, tmp_path / "x.json")
    refuse = {"file"}
    with pytest.raises(OSError, match="Invalid argument"):
        write_json({"v": 2}, tmp_path / "x.json")
    assert json.loads((tmp_path / "x.json").read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_the_cache_is_where_the_environment_says(tmp_path, monkeypatch):
    from fastslow.io import cache_root

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FASTSLOW_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root() == tmp_path / "home" / ".cache" / "fastslow"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "fastslow"
    monkeypatch.setenv("FASTSLOW_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_a_lock_held_by_a_process_that_wrote_nothing_says_so(tmp_path):
    import fcntl

    from fastslow.io import LockedError, exclusive_lock

    lock = tmp_path / "c0.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another open file: refused as another process's would be
        with pytest.raises(LockedError, match=r"^cycle 0 is being written by another process \(a process that wrote "
                                              r"no name, lock .*c0\.lock\): "):
            with exclusive_lock(lock, "cycle 0"):
                pass
    finally:
        os.close(fd)


def test_a_lock_names_its_holder_alone_whatever_an_ended_holder_wrote_before(tmp_path, monkeypatch):
    from fastslow.io import exclusive_lock

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    lock = tmp_path / "c0.lock"
    lock.write_text("pid 1 on a-host-whose-name-is-longer-than-this-ones (SLURM job 4242, restart 0)\n")
    with exclusive_lock(lock, "cycle 0"):
        assert lock.read_text() == f"pid {os.getpid()} on {__import__('socket').gethostname()}\n"


def test_free_space_is_enough_when_it_is_what_is_needed(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from fastslow.io import free_space_error

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(8 * 1024 ** 3, 0, 2 * 1024 ** 3))
    assert free_space_error(tmp_path, 2 * 1024 ** 3, "cycle 1") is None
    assert free_space_error(tmp_path, 3 * 1024 ** 3, "cycle 1") == (
        f"not enough disk space for cycle 1: 2.00 GiB free at {tmp_path}, it needs about 3.00 GiB; free some space "
        f"or move results/ to a larger file system")


def test_a_fingerprint_changes_with_a_files_name_size_or_time_but_not_with_hidden_files(tmp_path):
    from fastslow.io import tree_bytes, tree_fingerprint

    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "w.bin").write_bytes(b"1234")
    first = tree_fingerprint(model)
    (model / ".cache").mkdir()
    (model / ".cache" / "meta").write_text("download metadata")
    (model / ".snakemake_timestamp").write_text("")
    assert tree_fingerprint(model) == first
    os.utime(model / "sub" / "w.bin", ns=(1, 1))
    touched = tree_fingerprint(model)
    assert touched != first
    (model / "sub" / "w.bin").rename(model / "sub" / "v.bin")
    os.utime(model / "sub" / "v.bin", ns=(1, 1))
    assert tree_fingerprint(model) != touched
    other = tmp_path / "other"
    other.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (other / name).write_text("{}")
        os.utime(other / name, ns=(2, 2))
    os.utime(model / "config.json", ns=(2, 2))
    assert tree_fingerprint(other / "config.json") == tree_fingerprint(model / "config.json")  # its name, not its path
    assert tree_fingerprint(other / "tokenizer.json") != tree_fingerprint(other / "config.json")
    assert tree_bytes(model / "sub" / "v.bin") == 4 and tree_bytes(model) == 4 + 2 + 17 + 0


def test_nested_settings_are_dotted_and_an_empty_mapping_is_a_value():
    from fastslow.io import dotted

    assert dotted({"slow": {"lr": 1e-5, "opt": {"beta": 0.9}}, "tags": {}, "k": 4}) == {
        "slow.lr": 1e-5, "slow.opt.beta": 0.9, "tags": {}, "k": 4}


def test_a_parquet_column_empty_at_first_takes_the_type_of_a_later_value(tmp_path):
    import polars as pl

    from fastslow.io import write_parquet

    rows = [{"error": None}] * 150 + [{"error": "timeout"}]
    path = write_parquet(rows, tmp_path / "rollouts.parquet")
    assert pl.read_parquet(path)["error"].to_list()[-2:] == [None, "timeout"]


def test_a_directory_output_written_again_is_the_new_one_alone(tmp_path):
    """A rerun's model replaces the last one's whole: no file of the old one is left beside it."""
    with atomic_path(tmp_path / "model", is_dir=True) as tmp:
        (tmp / "old.bin").write_text("old")
    with atomic_path(tmp_path / "model", is_dir=True) as tmp:
        (tmp / "new.bin").write_text("new")
    assert [p.name for p in (tmp_path / "model").iterdir()] == ["new.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.parametrize(("holder", "restart", "squeue", "gone"), [
    ("pid 7 on n1 (SLURM job 42, restart 0)", "1", None, True),  # this job before SLURM requeued it
    ("pid 7 on n1 (SLURM job 42, restart 1)", "1", None, False),  # this very run's other process
    ("pid 7 on n1 (SLURM job 5, restart 0)", "0", (0, "", ""), True),  # squeue knows it no more
    ("pid 7 on n1 (SLURM job 5, restart 0)", "0", (0, "TIMEOUT\n", ""), True),
    ("pid 7 on n1 (SLURM job 5, restart 0)", "0", (0, "RUNNING\n", ""), False),
    ("pid 7 on n1 (SLURM job 5, restart 0)", "0", (1, "", "Invalid job id specified"), True),
    ("pid 7 on n1 (SLURM job 5, restart 0)", "0", (1, "", "Socket timed out"), False),
    ("pid 7 on n1", "0", (0, "", ""), False),  # no SLURM job named: nothing says it ended
])
def test_a_locks_holder_is_gone_only_when_slurm_says_its_job_ended(holder, restart, squeue, gone, monkeypatch):
    import subprocess

    from fastslow.io import _holder_gone

    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_RESTART_COUNT", restart)
    asked = []

    def run(cmd, **kwargs):
        asked.append(cmd)
        code, out, err = squeue
        return subprocess.CompletedProcess(cmd, code, out, err)

    monkeypatch.setattr(subprocess, "run", run)
    assert _holder_gone(holder) is gone
    assert asked == ([] if squeue is None or "SLURM" not in holder else [["squeue", "-h", "-j", "5", "-o", "%T"]])


def test_a_lock_is_taken_over_once_and_a_second_refusal_stops(tmp_path, monkeypatch):
    """A lock taken over from a gone holder, then refused again (another copy locked the new file
    first), is that copy's: it is not taken over in turn."""
    import fastslow.io as fio

    def refused(fd, path, what, advice=fio.JOB_LEFT_RUNNING):
        raise fio.LockedError(f"{what} is being written by another process", "pid 7 on n1 (SLURM job 5, restart 0)")

    asked = []
    monkeypatch.setattr(fio, "_flock", refused)
    monkeypatch.setattr(fio, "_holder_gone", lambda holder: asked.append(holder) or len(asked) < 3)
    with pytest.raises(fio.LockedError, match="^cycle 0 is being written by another process$"):
        with fio.exclusive_lock(tmp_path / "c0.lock", "cycle 0"):
            pass
    assert len(asked) == 1
