"""Registration's waits, each bounded: a lock per job, a loader per source, a listing deadline.

Registering a job lists every source on a loader of its pool. Three things could make that hang:
a source that no worker serves (its listing task waits for a worker that never comes: a typo in a
hand-started worker's ``--resources``), a listing stuck on storage or on a wedged worker, and a
registration lock shared by every job (one stuck registration stalls all later ones). So the
Planner waits at most ``planner.pool-wait`` for each source's pool to have a worker
(:class:`~mdata.errors.NoPoolError` naming the source, the resource and what the cluster has),
at most ``planner.listing-timeout`` for the listings (a :class:`~mdata.errors.SourceError`
naming the sources still listing and their workers), and registrations lock per job name.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from mdata.errors import NoPoolError, SourceError
from mdata.wire.errors import error_from_msg
from workers.loader import list_shards_task

__all__ = ["JobLocks", "list_sources", "wait_for_pools"]


class JobLocks:
    """One asyncio lock per job name: the Loaders of one job's ranks register one at a time,
    while another job's registration never waits for them."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def of(self, job: str) -> asyncio.Lock:
        return self._locks.setdefault(job, asyncio.Lock())

    def forget(self, job: str) -> None:
        """Drop a closed job's lock (unless a registration holds or awaits it)."""
        lock = self._locks.get(job)
        if lock is not None and not lock.locked():
            del self._locks[job]


def _has_worker(scheduler, resource: str) -> bool:
    return any(ws.resources.get(resource, 0) > 0 for ws in scheduler.workers.values())


def _cluster_resources(scheduler, limit: int = 8) -> str:
    """The cluster's workers and their resources, for an error message."""
    rows = [f"{addr} ({', '.join(f'{k}={v:g}' for k, v in sorted(ws.resources.items())) or 'no resources'})"
            for addr, ws in sorted(scheduler.workers.items())]
    if not rows:
        return "no workers at all"
    more = f", and {len(rows) - limit} more" if len(rows) > limit else ""
    return "; ".join(rows[:limit]) + more


async def wait_for_pools(scheduler, plan, pool_resource, wait_s: float) -> None:
    """Return once every source of ``plan`` has a worker holding its pool resource; raise
    :class:`NoPoolError` for the first that still has none after ``wait_s`` seconds (workers
    that are still starting get that long to join)."""
    deadline = time.monotonic() + wait_s
    while True:
        missing = [s.name for s in plan.sources if not _has_worker(scheduler, pool_resource(s.name))]
        if not missing:
            return
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.1)
    name = missing[0]
    resource = pool_resource(name)
    others = f" (and {', '.join(repr(m) for m in missing[1:])})" if len(missing) > 1 else ""
    raise NoPoolError(
        f"source {name!r}{others} has no loader worker: no worker of the cluster holds resource "
        f"{resource!r} after {wait_s:g}s (workers: {_cluster_resources(scheduler)}); start loader "
        f"workers with `--resources {resource}=<threads>` (a pool serving several sources holds "
        "pool_<source> for each), or add the source to a PoolSpec of start_cluster",
        source=name, resource=resource,
    )


async def list_sources(client, scheduler, plan, pool_resource,
                       timeout: float) -> tuple[dict[str, list[list]], list[str], dict[str, list]]:
    """``[[shard name, rows], ...]`` of every source, each listed on a loader of its pool (which
    also builds the Source there: the registration's import check of its transform), the
    sources whose transform yields images, and per source the shards listed with no rows because
    their footer is corrupt (``on_corrupt="skip"``); within ``timeout`` seconds, else a
    :class:`SourceError` naming the sources still listing and where."""
    futures = {
        src.name: client.submit(list_shards_task, src, resources={pool_resource(src.name): 1}, pure=False)
        for src in plan.sources
    }
    names = list(futures)
    try:
        results = await asyncio.wait_for(client.gather([futures[n] for n in names]), timeout)
    except asyncio.TimeoutError:
        pending = [n for n in names if not futures[n].done()] or names
        raise SourceError(
            f"listing did not finish within {timeout:g}s (on {_where(scheduler, futures[pending[0]].key)}"
            f"{'; also still listing: ' + ', '.join(pending[1:]) if len(pending) > 1 else ''})",
            source=pending[0],
            hint="a loader stuck on storage that accepts connections but never answers, or a wedged "
            "worker: check the loader's log; raise mdata.planner.listing-timeout for huge sources",
        ) from None
    finally:
        stuck = [f for f in futures.values() if not f.done()]  # finished ones go with their futures
        if stuck:
            with contextlib.suppress(Exception):  # never masks the listing's own error
                await client.cancel(stuck)  # a stuck listing must not hold its task
    for result in results:  # a listing's typed error, sent as data (list_shards_task)
        if "error" in result:
            raise error_from_msg(result["error"])
    listings = {n: [list(s) for s in r["shards"]] for n, r in zip(names, results)}
    return (listings, [n for n, r in zip(names, results) if r["produces_images"]],
            {n: r["quarantined"] for n, r in zip(names, results) if r.get("quarantined")})


def _where(scheduler, key: Any) -> str:
    ts = scheduler.tasks.get(key)
    if ts is not None and ts.processing_on is not None:
        return f"worker {ts.processing_on.address}"
    return "no worker yet" if ts is not None else "a worker"
