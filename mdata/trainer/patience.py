"""How long a Loader waits for a batch: its timeout, except while the job waits on storage.

``mdata.trainer.timeout`` (120 s) bounds a wait for one batch so that a stuck job fails instead of
hanging; ``mdata.storage.retry-deadline`` (300 s) is how long loaders wait out unreachable storage.
Were the first to end a wait during an outage, a 2-5 minute outage would end training with a
``TrainerTimeoutError`` while the loaders were still allowed to ride it out. So while a batch is
late, the Loader asks the job's status every ``check_every`` seconds; whenever one of the job's
sources waits on storage, its timeout starts again (:class:`~mdata.sources.outage_deadline.OutageDeadline`).
The wait ends when the batch arrives (storage came back) or when the job fails: past the retry
deadline the load fails it with ``StorageUnavailableError`` naming the source and shard, and that
is what the trainer raises. The same answers feed the training log's warning
(:class:`~mdata.trainer.storage_notice.StorageNotice`).

The check costs one small message per late Loader per ``check_every`` (the poll interval, 5 s by
default, or a quarter of the timeout if shorter), and nothing while batches are on time. It asks
only whether the job waits on storage (:class:`~mdata.wire.messages.JobStorageWaitsRequest`, as
large as the sources that wait), never the job's whole status: a status holds a figure per rank,
and when every rank of a large world is late at once (the first step, any data stall) that made
the scheduler's work grow with ranks x ranks.
"""

from __future__ import annotations

import queue
import time
from typing import Any

from mdata.sources.outage_deadline import OutageDeadline
from mdata.trainer.scheduler_loss import SchedulerWatch
from mdata.trainer.storage_notice import StorageNotice
from mdata.wire.messages import JobStorageWaitsRequest, ask_sync

__all__ = ["Patience"]


class Patience:
    """One Loader's waits for batches (see the module docstring); shared by its two threads."""

    def __init__(self, client: Any, job: str, rank: int, *, timeout: float, poll_interval: float) -> None:
        self.client = client
        self.job = job
        self.poll_interval = float(poll_interval)
        self.set_timeout(timeout)
        self.notice = StorageNotice(client, job, rank)
        self.outage_seen = float("-inf")  # monotonic time the job was last seen waiting on storage
        self.scheduler = SchedulerWatch(client, rank)  # a lost scheduler ends the wait at once

    def set_timeout(self, timeout: float) -> None:
        """The Loader's timeout changed (``loader.timeout = ...``): waits from now on use it."""
        self.timeout = float(timeout)
        self.check_every = max(0.1, min(self.poll_interval, self.timeout / 4))

    def begin(self) -> OutageDeadline:
        """The deadline of a wait that starts now."""
        return OutageDeadline(self.timeout, time.monotonic(), check_every=self.check_every)

    def poll_s(self, wait: OutageDeadline, longest: float) -> float:
        """How long the next long-poll may last: short enough to check storage in time."""
        return max(0.1, min(longest, wait.check_every, wait.remaining(time.monotonic())))

    def keep_waiting(self, wait: OutageDeadline, step: int) -> bool:
        """Whether the wait for ``step`` goes on; asks about storage when a check is due."""
        now = time.monotonic()
        if wait.check_due(now):
            waits = self._storage_waits()
            wait.observe(now, bool(waits))
            if waits:
                self.outage_seen = now
                self.notice.tell(step, wait.waited(now), waits, now)
        return not wait.expired(now)

    def take(self, items: queue.Queue) -> Any:
        """The next item the prefetch thread queued, waiting up to the timeout from now or from
        the last sign of a storage outage; raises :class:`queue.Empty` past it, and
        :class:`~mdata.errors.SchedulerLostError` as soon as the scheduler is lost."""
        began = time.monotonic()
        while True:
            left = max(began, self.outage_seen) + self.timeout - time.monotonic()
            if left <= 0:
                raise queue.Empty
            try:
                return items.get(timeout=min(left, 0.25))
            except queue.Empty:
                self.scheduler.check()  # the prefetch thread may be stuck connecting to it

    def _storage_waits(self):
        try:
            return ask_sync(self.client, JobStorageWaitsRequest(self.job)).storage_waits
        except Exception:  # noqa: BLE001 - no answer is no outage: the timeout runs on
            return None
