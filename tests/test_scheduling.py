"""fastslow.scheduling: Snakemake's scheduler keeps one wake-up timer pending, not one more per job.

The timers are checked on a stand-in for the scheduler (its semaphore), against Snakemake's own
method, which piles them up; then at the end of a real Snakemake run of a small workflow, with and
without the replacement: the run without it shows that the pinned Snakemake still piles them up
(when it no longer does, this test says so and the replacement can go).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fastslow import scheduling

ROOT = Path(__file__).resolve().parents[1]


def _releases(schedule, delays: list[float], wait: float) -> tuple[int, Any]:
    """How often a stand-in scheduler's semaphore is released within `wait` seconds of asking for
    a wake-up after each of `delays`."""
    sched = SimpleNamespace(_open_jobs=threading.Semaphore(0))
    for delay in delays:
        schedule(sched, delay)
    time.sleep(wait)
    count = 0
    while sched._open_jobs.acquire(blocking=False):
        count += 1
    return count, sched


def test_a_wakeup_is_asked_for_on_every_pass_and_one_timer_answers_them():
    from snakemake.scheduling.job_scheduler import JobScheduler

    original = JobScheduler.__dict__[scheduling.METHOD]
    assert original is not scheduling._schedule_wakeup  # nothing in this process replaced it
    piled, _ = _releases(original, [0.05] * 30, 0.5)
    assert piled == 30  # Snakemake's: every pass's timer wakes the loop again
    once, sched = _releases(scheduling._schedule_wakeup, [0.05] * 30, 0.5)
    assert once == 1
    assert sched._fastslow_wakeup[1].daemon  # the run's exit does not wait for it


def test_an_earlier_wakeup_is_not_held_back_by_a_later_pending_one():
    start = time.monotonic()
    sched = SimpleNamespace(_open_jobs=threading.Semaphore(0))
    scheduling._schedule_wakeup(sched, 30.0)  # e.g. a queue input wait
    scheduling._schedule_wakeup(sched, 0.05)  # the rate limit's second
    assert sched._open_jobs.acquire(timeout=5)
    assert time.monotonic() - start < 5
    # ...and a later one is not started while an earlier one is pending
    count, sched = _releases(scheduling._schedule_wakeup, [0.05, 10.0, 20.0], 0.5)
    assert count == 1
    # ...and once it has fired, the next pass's wake-up starts a timer again
    scheduling._schedule_wakeup(sched, 0.05)
    assert sched._open_jobs.acquire(timeout=5)


SNAKEFILE = """
import threading

if config.get("fix"):
    from fastslow.scheduling import one_pending_wakeup
    assert one_pending_wakeup()

rule all:
    input: expand("out/{i}.txt", i=range(8))

rule one:
    output: "out/{i}.txt"
    shell: "touch {output}"

onsuccess:
    print("pending wake-ups:", sum(isinstance(t, threading.Timer) and t.is_alive() for t in threading.enumerate()))
"""


def _pending_wakeups(work: Path, fix: bool) -> int:
    """The scheduler's wake-up timers still pending when a run of 8 jobs on one core ends."""
    work.mkdir()
    (work / "Snakefile").write_text(SNAKEFILE)
    out = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--config", f"fix={int(fix)}"],
                         cwd=work, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(list((work / "out").glob("*.txt"))) == 8
    return int(re.search(r"^pending wake-ups: (\d+)$", out.stdout, re.M)[1])


def test_a_snakemake_run_keeps_one_wakeup_pending_not_one_per_finished_job(tmp_path):
    """With the replacement one timer is pending at the end of a run; without it, one per finished
    job (each starts a chain of timers that wakes the loop every second until Snakemake exits)."""
    assert _pending_wakeups(tmp_path / "fixed", True) <= 1
    piled = _pending_wakeups(tmp_path / "piled", False)
    assert piled >= 8, (
        f"{piled} wake-ups pending without fastslow.scheduling: this Snakemake no longer piles them "
        "up, so the replacement can go (Snakefile, fastslow/scheduling.py)")


def test_the_workflow_applies_it():
    """The Snakefile makes the replacement while it is parsed (in Snakemake's own process)."""
    text = (ROOT / "Snakefile").read_text()
    assert re.search(r"^from fastslow\.scheduling import one_pending_wakeup$", text, re.M)
    assert re.search(r"^one_pending_wakeup\(\)$", text, re.M)
