"""fastslow.scheduling: Snakemake's scheduler keeps one wake-up timer pending, not one more per job.

The timers are counted on a stand-in for the scheduler (its semaphore), against Snakemake's own
method, which piles them up; then during a real Snakemake run of a small workflow, with and
without the replacement: the run without it shows that the pinned Snakemake still piles them up
(when it no longer does, this test says so and the replacement can go). The counts are of live
timers, not of wake-ups within a wait, so a busy machine does not change them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fastslow import scheduling

ROOT = Path(__file__).resolve().parents[1]


def _timers(sched: Any) -> list[threading.Timer]:
    """The live timers started since the stand-in scheduler was made (`_scheduler`)."""
    return [t for t in threading.enumerate() if isinstance(t, threading.Timer) and t not in sched.before]


def _scheduler() -> Any:
    """A stand-in for Snakemake's scheduler: its loop's semaphore (and the threads alive before)."""
    return SimpleNamespace(_open_jobs=threading.Semaphore(0), before=set(threading.enumerate()))


def test_a_wakeup_is_asked_for_on_every_pass_and_one_timer_answers_them():
    from snakemake.scheduling.job_scheduler import JobScheduler

    original = JobScheduler.__dict__[scheduling.METHOD]
    assert original is not scheduling._schedule_wakeup  # nothing in this process replaced it
    sched = _scheduler()
    for _ in range(30):
        original(sched, 5.0)
    piled = _timers(sched)
    for timer in piled:
        timer.cancel()
    assert len(piled) == 30  # Snakemake's: every pass starts a timer that wakes the loop again
    sched = _scheduler()
    for _ in range(30):
        scheduling._schedule_wakeup(sched, 0.05)
    [timer] = _timers(sched)
    assert timer.daemon  # the run's exit does not wait for it
    assert sched._open_jobs.acquire(timeout=10)  # ...and it wakes the loop


def test_an_earlier_wakeup_is_not_held_back_by_a_later_pending_one():
    sched = _scheduler()
    scheduling._schedule_wakeup(sched, 30.0)  # e.g. a queue input wait
    scheduling._schedule_wakeup(sched, 0.05)  # the rate limit's second
    pending = _timers(sched)
    assert len(pending) == 2
    assert sched._open_jobs.acquire(timeout=10)
    for timer in pending:
        timer.cancel()
    # ...a later one is not started while an earlier one is pending
    sched = _scheduler()
    for delay in (0.05, 10.0, 20.0):
        scheduling._schedule_wakeup(sched, delay)
    assert len(_timers(sched)) == 1
    assert sched._open_jobs.acquire(timeout=10)
    # ...and once it has fired, the next pass's wake-up starts a timer again
    scheduling._schedule_wakeup(sched, 0.05)
    assert sched._open_jobs.acquire(timeout=10)


SNAKEFILE = """
import threading

from snakemake.scheduling.job_scheduler import JobScheduler

if config.get("fix"):
    from fastslow.scheduling import one_pending_wakeup
    assert one_pending_wakeup()

peak = [0]
_ask = JobScheduler._schedule_reevalutation

def ask(self, delay):
    _ask(self, delay)
    peak[0] = max(peak[0], sum(isinstance(t, threading.Timer) and t.is_alive() for t in threading.enumerate()))

JobScheduler._schedule_reevalutation = ask

rule all:
    input: expand("out/{i}.txt", i=range(8))

rule one:
    output: "out/{i}.txt"
    shell: "touch {output}"

onsuccess:
    print("most wake-ups pending:", peak[0])
"""


def _pending_wakeups(work: Path, fix: bool) -> int:
    """The most wake-up timers pending at once (after any pass of the scheduler's loop) in a run
    of 8 jobs on one core."""
    work.mkdir()
    (work / "Snakefile").write_text(SNAKEFILE)
    out = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "--config", f"fix={int(fix)}"],
                         cwd=work, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(list((work / "out").glob("*.txt"))) == 8
    return int(re.search(r"^most wake-ups pending: (\d+)$", out.stdout, re.M)[1])


def test_a_snakemake_run_keeps_one_wakeup_pending_not_one_per_finished_job(tmp_path):
    """With the replacement one timer is pending at a time (two for the moment one fires);
    without it, one more for every job that finished while others were waiting (each starts a
    chain of timers that wakes the loop every second), 8 here whatever the machine's speed."""
    assert _pending_wakeups(tmp_path / "fixed", True) <= 2
    piled = _pending_wakeups(tmp_path / "piled", False)
    assert piled >= 5, (
        f"at most {piled} wake-ups pending without fastslow.scheduling: this Snakemake no longer piles "
        "them up, so the replacement can go (Snakefile, fastslow/scheduling.py)")


def test_the_workflow_applies_it():
    """The Snakefile makes the replacement while it is parsed (in Snakemake's own process)."""
    text = (ROOT / "Snakefile").read_text()
    assert re.search(r"^from fastslow\.scheduling import one_pending_wakeup$", text, re.M)
    assert re.search(r"^one_pending_wakeup\(\)$", text, re.M)
