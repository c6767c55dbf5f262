"""A job's Dask tasks on the scheduler: who holds one now, and letting go of all of them when the
job closes, before ``close_job`` answers.

A job's runtime holds its load, summary and construct tasks through futures of the Planner's own
client. ``Future.release()`` only queues a release on that client's batched stream, which the
scheduler reads a few milliseconds later, so a job could answer ``close_job`` while the scheduler
still held every chunk and batch it had planned ahead. A cluster closed right after (what
``MdataCluster.close`` and ``mdata cluster up`` do at shutdown) then removed its workers while
those tasks were in memory, and Dask logged "Removing worker ... caused the cluster to lose
already computed task(s), which will be recomputed elsewhere" for a job nobody ran any more.

The runtime runs on the scheduler, so it releases the tasks on the scheduler itself, at once:
when :func:`release_job_tasks` returns, the scheduler no longer holds a task of the job for the
Planner's client (tasks another client asked for by the same key stay theirs).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

__all__ = ["JOB_TASK_PREFIXES", "job_task_keys", "release_job_tasks", "release_job_tasks_settled",
           "task_holders"]

#: The key prefixes of a job's tasks: ``(prefix, job, ...)`` (mdata.order.chunk_key, the runtime).
JOB_TASK_PREFIXES = frozenset({"mdata-load", "mdata-summary", "mdata-construct"})


def task_holders(scheduler: Any, key: Any) -> list[str]:
    """The addresses of the workers that hold task ``key``'s result now (none: not computed, or
    lost with its worker)."""
    ts = scheduler.tasks.get(key)
    return [ws.address for ws in ts.who_has] if ts is not None and ts.who_has else []


def job_task_keys(tasks: Any, job: str) -> list[tuple]:
    """The keys of ``job``'s tasks among the scheduler's ``tasks`` (any mapping keyed by key)."""
    return [key for key in tasks
            if isinstance(key, tuple) and len(key) > 1 and key[0] in JOB_TASK_PREFIXES
            and key[1] == job]


def release_job_tasks(scheduler: Any, client_id: str, job: str) -> int:
    """Release, on the scheduler now, every task of ``job`` that the client ``client_id`` wants;
    returns how many. Tasks nobody else wants are forgotten (a running one is cancelled on its
    worker) before this returns."""
    state = scheduler.clients.get(client_id)
    if state is None:  # the Planner's client left already: the scheduler released its keys
        return 0
    keys = [key for key in job_task_keys(scheduler.tasks, job)
            if scheduler.tasks[key] in state.wants_what]
    if keys:
        scheduler.client_releases_keys(keys=keys, client=client_id,
                                       stimulus_id=f"mdata-close-job-{job}")
    return len(keys)


async def release_job_tasks_settled(scheduler: Any, client_id: str, job: str, *,
                                    quiet_s: float = 0.05, limit_s: float = 2.0) -> int:
    """:func:`release_job_tasks` until none of the job's tasks is left for ``quiet_s``: a task
    the runtime submitted just before closing travels on the client's batched stream and may
    reach the scheduler after the first release (seen under load as two construct tasks of a
    closed job). Bounded by ``limit_s``; returns how many were released in all."""
    released = release_job_tasks(scheduler, client_id, job)
    deadline = time.monotonic() + limit_s
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet_s / 5)
        n = release_job_tasks(scheduler, client_id, job)
        released += n
        if n:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            break
    return released
