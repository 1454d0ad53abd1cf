"""Atomic file writes: a crash never leaves a half-written output that looks finished."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any


def umask() -> int:
    """The process's file-creation mask (read without changing it where Linux allows)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: The names `tempfile.mkdtemp(prefix=f".{name}.")` makes: the prefix, then 8 characters of
#: tempfile's alphabet (`tempfile._RandomNameSequence.characters`). Neither `.cycle10.xxxxxxxx`
#: nor `.cycle1.work`, `.cycle1.job.json` (other files beside a cycle) matches `.cycle1.`'s.
_TEMP_SUFFIX = re.compile(r"[a-z0-9_]{8}")


def _stale_temporaries(path: Path) -> list[Path]:
    """The temporary siblings `atomic_path(path)` made in earlier processes and never removed."""
    prefix = f".{path.name}."
    with contextlib.suppress(FileNotFoundError):
        return [Path(e.path) for e in os.scandir(path.parent)
                if e.name.startswith(prefix) and _TEMP_SUFFIX.fullmatch(e.name[len(prefix):])
                and e.is_dir(follow_symlinks=False)]
    return []


def remove_stale_temporaries(path: str | Path) -> None:
    """Remove what `atomic_path(path)` left in earlier processes that were killed mid-write (it
    does so itself; a job also calls this before measuring the disk space it needs: a cycle
    killed while saving leaves its weights and optimiser state, ~100 GB at 8B, in a hidden
    `.cycleN.*` directory)."""
    for stale in _stale_temporaries(Path(path)):
        shutil.rmtree(stale, ignore_errors=True)


def _plain_modes(root: Path) -> None:
    """Give `root` and everything under it the mode a plain `open()` / `mkdir` gives under the
    umask: 0o666 & ~umask for files (0o777 & ~umask for those the owner may execute), 0o777 &
    ~umask for directories. Symbolic links are left alone (their targets are not ours)."""
    mask = umask()
    file_mode, exec_mode = 0o666 & ~mask, 0o777 & ~mask

    def fix(p: Path, mode: int) -> None:
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            return
        if stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_IXUSR:
            mode = exec_mode
        if stat.S_IMODE(st.st_mode) != mode:
            with contextlib.suppress(PermissionError):  # a hard link to another user's file
                os.chmod(p, mode)

    if root.is_dir() and not root.is_symlink():
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames:
                fix(Path(dirpath, name), exec_mode)
            for name in filenames:
                fix(Path(dirpath, name), file_mode)
        fix(root, exec_mode)
    elif root.exists():
        fix(root, file_mode)


def _fsync(path: Path) -> None:
    """Flush `path` (a file, or a directory's entries) to the disk; a file system that cannot
    sync a directory (some network ones refuse it) is left as it is."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        if not path.is_dir():
            raise
    finally:
        os.close(fd)


def sync_tree(root: Path) -> None:
    """Every file under `root` (or `root` itself), then the directories that name them, on disk.
    A symbolic link is its directory's entry alone: its target, not ours, may be none (yet)."""
    if root.is_dir():
        for dirpath, _, filenames in os.walk(root):
            for name in filenames:
                if not (path := Path(dirpath, name)).is_symlink():
                    _fsync(path)
            _fsync(Path(dirpath))
    elif root.exists():
        _fsync(root)


def cache_root() -> Path:
    """fastslow's cache directory: $FASTSLOW_CACHE_DIR, else ``$XDG_CACHE_HOME/fastslow`` (else
    ``~/.cache/fastslow``). What is kept there only saves time: a cache that cannot be read or
    written is only slower."""
    return Path(os.environ.get("FASTSLOW_CACHE_DIR")
                or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fastslow")


@contextlib.contextmanager
def atomic_path(path: str | Path, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `path`; on success rename it to `path` (replacing it).

    What gets renamed into place has the modes a plain `open()` / `mkdir` would give under the
    umask (`_plain_modes`), whatever its writer created: mkdtemp makes the directory 0700, and
    safetensors' `save_file` (0.8, under transformers' `save_pretrained`) writes the weights to a
    temporary file of Rust's `tempfile` crate, created 0600, then renames it onto
    `model.safetensors`, which so stays 0600. Either would hide a model or a run's outputs from
    the other users of a shared cluster file system.

    Temporaries an earlier process left for the same `path` (it was killed: SIGKILL, or a signal
    whose handler ends the process without unwinding, as `fastslow.tracking.job_run`'s does) are
    removed first.

    What is renamed is on disk first, and so is the rename (the files, then their directory, are
    fsynced): after a machine or node crash a finished output is whole or absent, never a
    complete-looking empty or truncated file whose job Snakemake records as done."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Safe because one path has one writer at a time: Snakemake never runs two jobs with the same
    # output (and its lock keeps a second Snakemake out of the working directory), and the
    # library's other writers (`python -m fastslow.tracking`, by hand) own their paths too.
    remove_stale_temporaries(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    if is_dir:
        os.chmod(tmp, 0o777 & ~umask())
    target = tmp if is_dir else tmp / path.name
    try:
        yield target
        _plain_modes(target)
        sync_tree(target)
        if is_dir:
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
        else:
            os.replace(target, path)
        _fsync(path.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


class LockedError(RuntimeError):
    """Another live process holds the lock (`exclusive_lock`); `holder` is what it wrote there."""

    def __init__(self, message: str, holder: str = "") -> None:
        super().__init__(message)
        self.holder = holder


#: How a lock's holder line names its SLURM job (`exclusive_lock` writes it, `_holder_gone` reads it).
_SLURM_HOLDER = "(SLURM job {job}, restart {restart})"
_SLURM_HOLDER_RE = re.compile(re.escape(_SLURM_HOLDER).replace(r"\{job\}", r"(\d+)").replace(r"\{restart\}", r"(\d+)"))

#: SLURM states of a job that has ended (`squeue -o %T`): its processes are gone with it.
_SLURM_ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "SPECIAL_EXIT", "TIMEOUT"}


def _holder_gone(holder: str) -> bool:
    """Is the lock's holder, a process of a SLURM job (`exclusive_lock` wrote its id), gone? A lock
    on a network file system can outlive a node that died (NFSv3 until it reboots, Lustre until
    it is evicted): SLURM's retry of that node's job on another node was refused, each attempt,
    by a process nobody could stop. The holder is gone when SLURM says its job ended (or knows it
    no more), or when it was an earlier run of this very job (requeued under its id)."""
    import subprocess

    m = _SLURM_HOLDER_RE.search(holder)
    if not m:
        return False
    if m.group(1) == os.environ.get("SLURM_JOB_ID"):  # this job's earlier run, before SLURM requeued it
        return int(m.group(2)) < int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    try:
        out = subprocess.run(["squeue", "-h", "-j", m.group(1), "-o", "%T"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):  # no squeue here: nothing says it is gone
        return False
    if out.returncode != 0:
        return "invalid job id" in out.stderr.lower()
    return out.stdout.strip() == "" or out.stdout.strip() in _SLURM_ENDED


#: What `exclusive_lock`'s error advises by default: the holder is a job a killed Snakemake left.
JOB_LEFT_RUNNING = "a job of an earlier Snakemake may still be running; stop it (ps, squeue) and rerun"


def _flock(fd: int, path: Path, what: str, advice: str = JOB_LEFT_RUNNING) -> bool:
    """Lock the open file `fd` (`exclusive_lock`'s lock file `path`) without waiting: True once
    locked, False on a file system that takes no locks (with a warning); LockedError naming the
    holder if another process has it."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "a process that wrote no name"
        raise LockedError(f"{what} is being written by another process ({holder}, lock {path}): {advice}",
                          holder) from None
    except OSError as err:  # ENOLCK, EOPNOTSUPP: no locks on this file system
        logging.getLogger(__name__).warning("%s: not locked (%s: the file system takes no locks); "
                                            "nothing stops a second process writing it", what, err)
        return False


def _same_file(fd: int, path: Path) -> bool:
    """Does the name `path` still lead to the open file `fd`?"""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


@contextlib.contextmanager
def exclusive_lock(path: str | Path, what: str, advice: str = JOB_LEFT_RUNNING) -> Iterator[None]:
    """Hold an exclusive lock (`fcntl.flock`) on the file `path` while the block runs, or raise a
    one-line LockedError naming `what` and the holder (its pid and host, which it writes into the
    file). The kernel drops a lock when its holder dies, however it dies, so only a live process
    refuses another: a job left running by a killed Snakemake (`--unlock`, then a rerun started
    a second copy of it, and the two wrote each other's temporaries). On a file system without
    locks (Lustre without its `flock` mount option) the block runs unlocked, with a warning, and
    its file stays; NFS mounted `nolock` (or Lustre with `localflock`) takes the lock within one
    node only, with no warning: copies on two nodes both run. Locked, the file is removed when
    the block ends.

    A lock is held only on the file that still has the name `path` once locked: a process that
    opened the file just before its holder ended (and unlinked it) would otherwise lock that
    nameless file while a third process locks the new one under the name, and both would run.
    It opens the name again instead."""
    import socket

    shown = Path(path)  # as given, in the error; the file itself by its absolute path: the holder
    path = shown.absolute()  # may change directory before it ends (Snakemake, given --directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    taken_over = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            locked = _flock(fd, shown, what, advice)
            if not locked or _same_file(fd, path):
                break
        except LockedError as err:
            os.close(fd)
            if taken_over or not _holder_gone(err.holder):
                raise
            # its holder's SLURM job has ended, the lock left on a node that died: a new file
            # under the name (the dead holder keeps the old, nameless one)
            logging.getLogger(__name__).warning("%s: the lock's holder (%s) is gone with its SLURM job; taking "
                                                "the lock over (%s)", what, err.holder, shown)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            taken_over = True
            continue
        except BaseException:  # anything else before the block: the file is not ours
            os.close(fd)
            raise
        os.close(fd)  # its holder removed it after we opened it: lock the file under the name now
    try:
        if locked:
            job = os.environ.get("SLURM_JOB_ID")
            slurm = " " + _SLURM_HOLDER.format(job=job, restart=os.environ.get("SLURM_RESTART_COUNT") or 0) if job else ""
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}{slurm}\n".encode(), 0)
        yield
    finally:
        if locked:
            with contextlib.suppress(OSError):
                path.unlink()
        os.close(fd)


_HELD = contextlib.ExitStack()  # the locks `hold_until_exit` took, released as the process exits


def hold_until_exit(path: str | Path, what: str, advice: str = JOB_LEFT_RUNNING) -> None:
    """`exclusive_lock` held from now until `release_held` or this process's exit (Snakemake's
    `onstart` hook, which has no block to hold it in; its `onsuccess` and `onerror` hooks release
    it, so a second workflow run in one process, from the API, can take it again); a process
    killed outright loses it with its life."""
    import atexit

    _HELD.enter_context(exclusive_lock(path, what, advice))
    atexit.unregister(_HELD.close)  # once, however many locks it holds
    atexit.register(_HELD.close)


def release_held() -> None:
    """Release the locks `hold_until_exit` took (none: nothing to do)."""
    _HELD.close()


def free_space_error(directory: str | Path, needed: int, what: str) -> str | None:
    """One line saying that `directory`'s file system has less than `needed` bytes free for
    `what`, or None."""
    free = shutil.disk_usage(directory).free
    if free >= needed:
        return None
    gib = 1024 ** 3
    return (f"not enough disk space for {what}: {free / gib:.2f} GiB free at {directory}, it needs about "
            f"{needed / gib:.2f} GiB; free some space or move results/ to a larger file system")


def tree_fingerprint(path: str | Path) -> str:
    """A digest of the files at `path` (a file, or a directory's files but hidden ones: .git,
    download metadata, Snakemake's .snakemake_timestamp): each one's name, size and modification
    time, not its bytes (an 8B model is 16 GB). Links are followed: a linked file counts as its
    target."""
    import hashlib

    root = Path(path)
    files = [root] if root.is_file() else sorted(root.rglob("*"))
    digest = hashlib.sha256()
    for file in files:
        rel = Path(file.name) if file == root else file.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or not file.is_file():
            continue
        st = file.stat()
        digest.update(f"{rel.as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def tree_bytes(path: str | Path) -> int:
    """Bytes of the files under `path` (links followed: a linked model counts its weights)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def link_tree(src: str | Path, dst: str | Path) -> None:
    """Hard links in `dst` (an existing directory) to every file under `src` (copies across file
    systems): a second name for a model, no second copy. Snakemake's `.snakemake_timestamp` stays
    behind: linked, Snakemake touching the new directory's would touch the source's too, making it
    look newer than what was built from it."""

    def link_or_copy(f: str, dest: str) -> None:
        try:
            os.link(f, dest)
        except OSError:  # another filesystem: copy instead
            shutil.copy2(f, dest)

    # copytree's copystat gives dst src's modes (atomic_path gives plain ones after)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".snakemake_timestamp"), copy_function=link_or_copy,
                    dirs_exist_ok=True)


def write_parquet(rows: Sequence[Mapping[str, Any]] | Any, path: str | Path,
                  schema: Mapping[str, Any] | None = None) -> Path:
    """Rows (list of dicts) or a polars DataFrame → Parquet, atomically."""
    import polars as pl

    df = rows if isinstance(rows, pl.DataFrame) else pl.DataFrame(list(rows), schema=schema,
                                                                    infer_schema_length=None)
    with atomic_path(path) as tmp:
        df.write_parquet(tmp)
    return Path(path)


def _finite(obj: Any) -> Any:
    """`obj` with every NaN or infinite float as None: JSON has neither (Python writes a bare
    `NaN`, which polars, jq and JavaScript reject)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def exception_chain(err: BaseException) -> Iterator[BaseException]:
    """`err`, then each error it was raised from or while handling (`__cause__`, else
    `__context__`), each once."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def dotted(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as dotted keys, values kept: {'slow': {'lr': 1e-5}} -> {'slow.lr': 1e-5}.
    An empty mapping is a value of its own. (MLflow's params, `tracking.flatten`, are these as
    text; Fig 9's variants compare them as they are. Here, where every job's code may import it.)"""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out.update(dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def read_yaml(path: str | Path) -> Any:
    """A YAML file's data. One that does not parse (a config or an accelerate config being
    edited) is a one-line ValueError naming the file, yaml's problem and the line: yaml's own
    error spans several lines and names "<unicode string>", not the file."""
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ValueError(f"{path} does not parse as YAML ({problem}"
                         f"{f', line {mark.line + 1}' if mark else ''})") from None


def json_text(obj: Any, **kwargs: Any) -> str:
    """`obj` as standard JSON text: a NaN or infinite number (no KL pass, no fit) is null,
    anything else JSON has no type for is its str()."""
    return json.dumps(_finite(obj), default=str, allow_nan=False, **kwargs)


def write_json(obj: Any, path: str | Path) -> Path:
    """`obj` as standard JSON (`json_text`), atomically."""
    text = json_text(obj, indent=2, sort_keys=True)
    with atomic_path(path) as tmp:
        tmp.write_text(text + "\n", encoding="utf-8")
    return Path(path)
