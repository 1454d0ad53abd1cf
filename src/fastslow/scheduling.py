"""One pending wake-up of Snakemake's scheduler at a time, instead of one more for every finished job.

Snakemake's job scheduler (9.27) wakes its loop with a semaphore: a finished job releases it, and
so does a `threading.Timer` that every pass of the loop starts when a job rate limit is set, which
the command line always sets (`--max-jobs-per-timespan`, default 100/1s). Each pass starts a new
timer, each timer starts a pass, and each finished job starts one more such chain; so after N
finished jobs the loop runs about N times a second. A pass with jobs waiting for cores stats every
input file of every waiting job (`update_input_sizes`) and starts a thread. Measured on the
every-figure smoke DAG (115 jobs, 2 cores; bench/HISTORY.md, 2026-12-07): 14,000-25,000 passes
in 7.5-8.5 minutes without this, 531-539 with it; Snakemake's own process 51-64 CPU-seconds
against 28 (the DAG's wall time 6% shorter on the mean, within its run-to-run spread). The chains
end only when no job is left waiting; on a cluster, where ready jobs wait for the SLURM profile's
64 job slots over days, the submit host's Snakemake would pass once a second for every job
finished meanwhile, stat-ing the shared file system each time. (snakemake/snakemake#3744 reports
the extra passes.)

`one_pending_wakeup()` replaces the scheduler's `_schedule_reevalutation` (sic) with one that
starts a timer only when none is pending that fires as early: the loop still wakes within the
delay it asked for, so the rate limit and queue input waits behave as before, and jobs still wake
it when they finish. Its timers are daemon threads, so Snakemake's exit no longer waits for the
last one (up to a second per run). The Snakefile calls it while it is parsed, in Snakemake's own
process; where Snakemake no longer has the method, nothing is replaced.
"""

from __future__ import annotations

import threading
import time
from typing import Any

#: what the replaced method is called in Snakemake's scheduler (its spelling)
METHOD = "_schedule_reevalutation"


def _schedule_wakeup(self: Any, delay: float) -> None:
    """Release the scheduler's semaphore after `delay` seconds, unless a pending timer already
    releases it by then."""
    due = time.monotonic() + delay
    pending = getattr(self, "_fastslow_wakeup", None)
    if pending is not None and pending[0] <= due and pending[1].is_alive():
        return
    timer = threading.Timer(delay, self._open_jobs.release)
    timer.daemon = True
    timer.start()
    self._fastslow_wakeup = (due, timer)


def one_pending_wakeup() -> bool:
    """Make Snakemake's scheduler keep at most one wake-up timer pending; True if it was replaced
    (or already is), False where this Snakemake has no such method."""
    from snakemake.scheduling.job_scheduler import JobScheduler

    if not hasattr(JobScheduler, METHOD):
        return False
    setattr(JobScheduler, METHOD, _schedule_wakeup)
    return True
