"""A waiter's timeout that does not run out while storage is being waited out.

Why: a trainer waiting for its batch, or a constructor waiting for a lost chunk to be loaded again,
cannot tell a slow pool from unreachable storage, and its own timeout (``mdata.trainer.timeout``,
``mdata.constructor.chunk-wait``) is shorter than the loaders' storage retry deadline
(``mdata.storage.retry-deadline``). Giving up at its own timeout would end a job that the loaders
are still allowed to save, with a vaguer error than theirs. So the waiter asks, every
``check_every`` seconds, whether the sources it waits on wait on storage (the Planner knows:
``scheduler_plugins/storage_poll.py``); each time they do, its timeout starts again. The outage
then ends one of two ways: storage answers and the data arrives, or the retry deadline passes and
the load fails the job with ``StorageUnavailableError`` naming the source and shard, which reaches
the waiter well within the ``timeout`` it still has after the last sign of the outage.

Pure: the caller passes the clock (``time.monotonic()``) and what it learnt.
"""

from __future__ import annotations

__all__ = ["OutageDeadline"]


class OutageDeadline:
    """``timeout`` seconds from ``now``, or from the last time storage was seen being waited on.

    Args:
        timeout: the waiter's own timeout, in seconds.
        now: when the wait began (a monotonic clock).
        check_every: how often to ask whether storage is waited on (:meth:`check_due`); at most
            ``timeout / 2`` so that an outage is noticed before the timeout runs out.
    """

    def __init__(self, timeout: float, now: float, *, check_every: float) -> None:
        if timeout < 0 or check_every <= 0:
            raise ValueError(f"OutageDeadline needs timeout >= 0 and check_every > 0, got "
                             f"timeout={timeout!r}, check_every={check_every!r}")
        self.timeout = float(timeout)
        self.began = float(now)
        self.check_every = min(float(check_every), max(self.timeout / 2, 0.05))
        self.expires = self.began + self.timeout
        self.outage_seen: float | None = None  # the last time storage was seen waited on
        self._next_check = self.began + self.check_every

    def check_due(self, now: float) -> bool:
        """Whether it is time to ask again whether storage is waited on."""
        return now >= self._next_check

    def observe(self, now: float, waiting_on_storage: bool) -> None:
        """What the last question answered; an outage restarts the timeout from ``now``."""
        self._next_check = now + self.check_every
        if waiting_on_storage:
            self.outage_seen = now
            self.expires = max(self.expires, now + self.timeout)

    def expired(self, now: float) -> bool:
        return now > self.expires

    def remaining(self, now: float) -> float:
        """Seconds left (0 once expired)."""
        return max(0.0, self.expires - now)

    def waited(self, now: float) -> float:
        return max(0.0, now - self.began)
