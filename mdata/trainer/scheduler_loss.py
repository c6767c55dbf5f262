"""Say so when a trainer's scheduler is gone, instead of surfacing a raw comm error.

A Loader talks to the scheduler (the Planner) on every step. When the scheduler process dies,
Dask raises ``CommClosedError`` (or, for a call started after the death, an ``OSError`` once its
connect attempts time out) from whichever call was in flight: an ack, a long-poll for the next
batch. Those say nothing about what happened or what to do. The Loader turns them into
:class:`~mdata.errors.SchedulerLostError` naming the scheduler's address, its rank and what to do
next. Calls to constructor workers are not concerned: a constructor that went away is followed
by the Loader (the batch is rebuilt elsewhere).

A call started after the death does not fail at once: Dask retries a refused connection until
its connect timeout (the Loader's timeout). The Dask client notices sooner, since its own stream
to the scheduler breaks at once: :class:`SchedulerWatch` turns a client that stays disconnected
for :data:`GRACE_S` into the same error, for the training loop waiting on its next batch and for
a call about to start (:meth:`SchedulerWatch.calls`), and a Loader closing then does not wait for
the calls stuck in their connect attempts.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

from mdata.errors import MdataError, SchedulerLostError

__all__ = ["SchedulerWatch", "detach_quietly"]

#: A client disconnected from its scheduler this long has lost it (a reconnect to a live
#: scheduler after a network blip takes milliseconds).
GRACE_S = 1.0


def scheduler_address(client: Any) -> str:
    try:
        return str(client.scheduler.address)
    except Exception:  # noqa: BLE001 - a client closing under us: say what we know
        return "(unknown address)"


class SchedulerWatch:
    """Whether one Loader's Dask client has lost its scheduler, and the error that says so (see
    the module docstring). The address is read once, while the client is connected: a client
    that gave up reconnecting no longer knows it."""

    def __init__(self, client: Any, rank: int) -> None:
        self.client = client
        self.rank = rank
        self.address = scheduler_address(client)
        self._since: float | None = None  # when the client was first seen disconnected

    def error(self, why: str) -> SchedulerLostError:
        return SchedulerLostError(
            f"rank {self.rank}: lost the mdata scheduler at {self.address} ({why}); the Planner "
            "and the job's state are gone with it: once the cluster is back, restart every rank "
            "from its last checkpoint (Loader(checkpoint=...))"
        )

    def _disconnected_error(self) -> SchedulerLostError:
        return self.error(f"the Dask client lost its connection to it (status {self.client.status!r})")

    def explain(self, exc: BaseException) -> BaseException:
        """``exc`` as a :class:`SchedulerLostError` when it is a broken or refused connection to
        the scheduler (an ``OSError`` out of a scheduler call), else ``exc`` unchanged."""
        if not isinstance(exc, OSError) or isinstance(exc, MdataError):
            return exc
        error = self.error(f"{type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return error

    def disconnected(self) -> bool:
        """The client is not connected to its scheduler now (maybe only for a moment)."""
        return str(getattr(self.client, "status", "running")) not in ("running", "newly-created")

    def lost(self, now: float | None = None) -> bool:
        """Disconnected for :data:`GRACE_S` by this watch's calls (call it regularly)."""
        now = time.monotonic() if now is None else now
        if not self.disconnected():
            self._since = None
            return False
        if self._since is None:
            self._since = now
        return now - self._since >= GRACE_S

    def check(self) -> None:
        """Raise :class:`SchedulerLostError` if the scheduler is lost."""
        if self.lost():
            raise self._disconnected_error()

    @contextmanager
    def calls(self) -> Iterator[None]:
        """Scheduler calls inside raise :class:`SchedulerLostError` when the scheduler is gone,
        and at once (after :data:`GRACE_S`) when the client already lost it: a new call would
        sit in Dask's connect retries for the whole connect timeout."""
        waited = time.monotonic() + GRACE_S
        while self.disconnected():
            if time.monotonic() > waited:
                raise self._disconnected_error()
            time.sleep(0.05)
        try:
            yield
        except OSError as exc:
            raise self.explain(exc) from exc


#: Longest a closing Loader waits to hand its rank back: a lost scheduler must not hold it up.
DETACH_S = 2.0


def detach_quietly(client: Any, request: Any, timeout: float = DETACH_S) -> None:
    """Send ``request`` (the Loader's detach) at most ``timeout`` seconds, ignoring failures:
    a cluster that is gone cannot take the lease back, and the lease dies with the Loader."""
    from mdata.wire.messages import ask

    if str(getattr(client, "status", "running")) != "running":
        return  # nobody to tell
    try:
        client.sync(ask, client.scheduler, request, callback_timeout=timeout)
    except Exception:  # noqa: BLE001 - best effort, see above
        pass
