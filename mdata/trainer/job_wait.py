"""Wait for a job to be registered, saying which jobs the cluster has while waiting.

A trainer started with a job name that nobody registered (a typo, or a default that differs from
the one the cluster registered) would otherwise wait its whole timeout in silence. The Planner
lists its jobs on every poll anyway, so the wait says at once, and again every :data:`EVERY_S`
seconds, which jobs exist (one log line, no traceback), and fails at its timeout with a
:class:`~mdata.errors.TrainerTimeoutError` naming them. A job registered meanwhile (the driver is
still starting) ends the wait quietly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from mdata.errors import TrainerTimeoutError
from mdata.wire.messages import JobInfo, JobInfoRequest, JobsRequest, ask_sync

__all__ = ["wait_for_job", "jobs_text"]

logger = logging.getLogger("mdata.trainer")

EVERY_S = 5.0  # repeat the "waiting for job" line this often
POLL_S = 0.2  # ask the Planner for its jobs this often


def jobs_text(jobs: Sequence[str]) -> str:
    """``jobs`` as a user reads them: ``'a', 'b'`` or ``none yet``."""
    return ", ".join(repr(j) for j in sorted(jobs)) if jobs else "none yet"


def _hint(job: str, jobs: Sequence[str]) -> str:
    if jobs:
        return (f"jobs on this cluster: {jobs_text(jobs)}; pass one of them as the job name "
                "(train.py --job NAME, Loader(job=NAME)), or register {job!r} first".format(job=job))
    return ("no job is registered on this cluster yet; register it (mdata cluster up --plan FILE "
            "--job NAME, mdata.driver.submit_job) or pass plan= to the Loader")


def wait_for_job(client: Any, job: str, rank: int, timeout: float, *,
                 every_s: float = EVERY_S, poll_s: float = POLL_S) -> JobInfo:
    """The info of ``job`` once registered; logs which jobs exist while it is not (see module)."""
    began = time.monotonic()
    deadline = began + timeout
    told = float("-inf")
    while True:
        jobs = list(ask_sync(client, JobsRequest()).jobs)
        if job in jobs:
            return ask_sync(client, JobInfoRequest(job))
        now = time.monotonic()
        if now > deadline:
            raise TrainerTimeoutError(
                f"rank {rank}: job {job!r} was not registered within {timeout:.0f}s; "
                + _hint(job, jobs))
        if now - told >= every_s:
            told = now
            logger.warning("mdata: rank %d waits for job %r (%.0fs of %.0fs): not registered; %s",
                           rank, job, now - began, timeout, _hint(job, jobs))
        time.sleep(poll_s)
