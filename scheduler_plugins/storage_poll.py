"""The Planner's view of storage outages: poll the loader workers, publish each job's waiting sources.

While storage is unreachable, a loader worker's load tasks wait out the outage in their retry loop
(``mdata/sources/retry.py``) and the worker records the wait (:func:`mdata.sources.storage_waits`).
Nothing reaches the scheduler meanwhile: a stalled load looks exactly like a slow one. So the
Planner asks, from its periodic tick, every worker of the pools of its jobs' sources
(``mdata_storage_waits``), merges the answers per source (:func:`mdata.sources.merge_storage_waits`)
and gives each job the waits of its own sources (``JobRuntime.storage_waits``), which its status,
the JSON routes and the dashboard show.

Why polling rather than workers pushing "wait began / ended" messages: a push needs a hook from
the pure retry loop (a worker thread) into the worker's event loop and comms, a message per
attempt to keep the attempt count and last error current, and a rule to forget the waits of a
worker that died mid-outage (its "ended" never comes). A poll carries the current figures, and a
worker that is gone simply stops answering. The cost is one small message per loader worker per
interval (``mdata.planner.storage-poll-interval``, 1 s by default).

The tick never waits for the poll: it starts one only when the previous one finished and the
interval passed; each worker gets ``timeout`` seconds to answer. A worker that does not answer
(busy, leaving, a process without mdata's plugin) is ignored; its last answer is kept for a few
intervals so that one slow reply does not make an ongoing wait vanish and reappear.

Counting outages (``recoveries["storage_outages"]``) from the waits a poll sees would miss a wait
that began and ended between two polls (an outage of a few seconds, under load). Each worker also
reports how many wait periods each source has begun in it so far (cumulative); the poller keeps the
last figure per (worker, source), and counts for a source the largest increase over its workers
since the previous poll: an outage usually hits every loader of the source at once, and it is one
outage, not one per worker. A worker first heard of counts from zero (it started after the job).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from mdata.sources import SourceStorageWait, StorageWait, merge_storage_waits
from mdata.wire.messages import StorageWaitsRequest, ask

if TYPE_CHECKING:
    from scheduler_plugins.job_runtime import JobRuntime

__all__ = ["StoragePoller", "loader_workers"]

logger = logging.getLogger("mdata.planner")

#: A worker's last answer outlives this many intervals without a new one.
KEEP_INTERVALS = 3


def loader_workers(scheduler, sources: Iterable[str]) -> list[str]:
    """Addresses of the workers holding a pool resource (``pool_<source>``) of any of ``sources``."""
    resources = {f"pool_{name}" for name in sources}
    return sorted(address for address, ws in scheduler.workers.items()
                  if any(ws.resources.get(r, 0) > 0 for r in resources))


class StoragePoller:
    """Polls loader workers for their storage waits and publishes them to each job's runtime.

    Call :meth:`tick` from the Planner's periodic tick; it returns at once.
    """

    def __init__(self, scheduler, *, interval: float, timeout: float | None = None) -> None:
        self.scheduler = scheduler
        self.interval = float(interval)
        self.timeout = float(timeout if timeout is not None else max(0.2, min(self.interval, 2.0)))
        self.merged: dict[str, SourceStorageWait] = {}
        self._answers: dict[str, tuple[float, tuple[StorageWait, ...]]] = {}
        self._begun: dict[tuple[str, str], int] = {}
        self._task: asyncio.Task | None = None
        self._last = float("-inf")

    def tick(self, jobs: Mapping[str, "JobRuntime"], now: float | None = None) -> None:
        """Start a poll if the interval passed and none is running; ``jobs`` is the Planner's live
        table (read again when the poll ends, so a job registered meanwhile gets its waits)."""
        now = time.monotonic() if now is None else now
        if self.interval <= 0 or (self._task is not None and not self._task.done()):
            return
        if now - self._last < self.interval or not jobs:
            return
        self._last = now
        self._task = asyncio.ensure_future(self.poll(jobs))

    async def poll(self, jobs: Mapping[str, "JobRuntime"]) -> dict[str, SourceStorageWait]:
        """Ask every loader worker of the jobs' sources once, merge, publish; returns the merge."""
        try:
            sources = {name for runtime in list(jobs.values()) for name in runtime.sources}
            workers = loader_workers(self.scheduler, sources)
            answers = await asyncio.gather(*(self._ask(address) for address in workers))
            now = time.monotonic()
            began: dict[str, int] = {}
            for address, answer in zip(workers, answers):
                if answer is not None:
                    waits, begun = answer
                    self._answers[address] = (now, waits)
                    for source, count in begun.items():
                        new = count - self._begun.get((address, source), 0)
                        self._begun[(address, source)] = count
                        began[source] = max(began.get(source, 0), new)
            keep = KEEP_INTERVALS * max(self.interval, self.timeout)
            current = set(workers)
            self._answers = {a: (t, w) for a, (t, w) in self._answers.items()
                             if a in current and now - t <= keep}
            self._begun = {key: n for key, n in self._begun.items() if key[0] in current}
            self.merged = merge_storage_waits({a: w for a, (_, w) in self._answers.items()})
            for runtime in list(jobs.values()):
                waits = {name: wait for name, wait in self.merged.items() if name in runtime.sources}
                runtime.recoveries.storage_outages_began(
                    sum(n for name, n in began.items() if name in runtime.sources and n > 0))
                runtime.storage_waits = waits
        except Exception:  # never let the poll's failure surface as an unretrieved task error
            logger.exception("mdata: polling loader workers for storage waits failed")
        return self.merged

    async def _ask(self, address: str) -> tuple[tuple[StorageWait, ...], dict[str, int]] | None:
        try:
            reply: Any = await asyncio.wait_for(
                ask(self.scheduler.rpc(address), StorageWaitsRequest()), self.timeout)
        except Exception as exc:  # noqa: BLE001 - busy, gone, or without mdata's plugin: ignored
            logger.debug("mdata: worker %s did not report its storage waits: %r", address, exc)
            return None
        return tuple(w.wait() for w in reply.waits), reply.begun_by_source()

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
