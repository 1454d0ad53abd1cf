"""What a workflow job does around its work: its label, lock, tags and a full disk said in one line."""

from __future__ import annotations

import contextlib
import errno
from pathlib import Path
from types import SimpleNamespace

import pytest

from fastslow.jobs import disk_full, job_label, job_lock, snakemake_job


def test_a_job_of_part_of_a_runs_wildcards_is_labelled_by_them_all():
    assert job_label("curves", {"experiment": "e", "task": "math"}) == "curves experiment=e task=math"


def test_a_full_disk_is_known_by_its_errno_and_said_in_one_short_line(tmp_path):
    err = OSError(errno.ENOSPC, "os error 28")
    assert disk_full(err, tmp_path).endswith("the write failed with OSError: [Errno 28] os error 28")
    long = RuntimeError("unexpected pos 704 vs 598\n" + "x " * 300)
    line = disk_full(long, tmp_path / "not" / "yet")
    assert "\n" not in line and line.endswith("unexpected pos 704 vs 598 " + "x " * 87)
    assert f"under {tmp_path / 'not' / 'yet'} (" in line and " GiB free there now)" in line
    # our own line, raised from the full disk's error, already says where and what to do
    ours = RuntimeError(f"not enough disk space for cycle 1 at {tmp_path}; free some space or move results/")
    ours.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert disk_full(ours, tmp_path) is None


def test_a_job_is_locked_beside_its_log_and_a_job_without_a_log_is_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with job_lock(None, "base_model"):
        assert list(tmp_path.iterdir()) == []
    log = tmp_path / "logs" / "x.log"
    with job_lock(log, "base_model"):
        assert Path(f"{log}.lock").read_text().startswith("pid ")
    assert list((tmp_path / "logs").iterdir()) == []


def test_a_jobs_run_is_tagged_with_its_code_its_log_by_absolute_path_and_no_threads_unless_given(
        tmp_path, monkeypatch):
    """The tags say which code ran (`code`, `task_code`: an empty digest is none) and where the
    log is, from whatever directory the MLflow UI is read."""
    opened = []

    @contextlib.contextmanager
    def job_run(**kwargs):
        opened.append(kwargs)
        yield None

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("fastslow.jobs.job_run", job_run)
    monkeypatch.setattr("fastslow.jobs.setup_logging", lambda log_path, label=None: None)
    job = SimpleNamespace(log=["logs/x.log"], wildcards={}, params={"code": "c0de", "task_code": ""}, threads=None,
                          rule="curves", config={}, input=SimpleNamespace(tracking="t.json"))
    with snakemake_job(job):
        pass
    (tags,) = [kw["extra_tags"] for kw in opened]
    assert tags["fastslow.log"] == str(tmp_path / "logs" / "x.log")
    assert tags["fastslow.code"] == "c0de" and "fastslow.task_code" not in tags
    assert "fastslow.threads" not in tags and "fastslow.run" not in tags


def test_a_job_that_is_not_of_its_run_names_both(monkeypatch):
    @contextlib.contextmanager
    def job_run(**kwargs):
        yield None

    monkeypatch.setattr("fastslow.jobs.job_run", job_run)
    monkeypatch.setattr("fastslow.jobs.setup_logging", lambda log_path, label=None: None)
    job = SimpleNamespace(log=[], wildcards={"experiment": "e", "method": "fst", "run": "a"}, params={}, threads=1,
                          rule="cycle", config={}, input=SimpleNamespace(tracking="t.json"))
    with pytest.raises(ValueError, match=r"^snakemake_job of run 'e/fst/a' was given run 'e/fst/b'$"), \
            snakemake_job(job, run=SimpleNamespace(key="e/fst/b")):
        pass
