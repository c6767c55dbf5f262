"""Loaders that share one Dask client ask where their batches are together.

The scheduler's cost per training step is mostly per message: decoding it, dispatching it,
encoding the answer (the step's checkpoint included). Ranks in one process (threads that share a
client: a per-host driver, the control-plane benchmark's simulated hosts) need the same answers
at nearly the same time, so they share one :class:`LocationHub` per client and job: the first
rank to ask for a step waits a moment (``gather_s``, or until every member rank asked) for the
others, then sends one :class:`~mdata.wire.host_location.HostLocationRequest` for all of them and
hands each rank its own answer. A rank alone in its process asks at once, without waiting.

Ranks whose batches were not ready by the answer get ``TIMEOUT`` and simply ask again (with
whoever asks for that step next); a request that fails (the scheduler is gone) fails every rank
that was in it, each in its own thread, as a lone request would have.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from mdata.wire.delivery import BatchLocationReply
from mdata.wire.host_location import HostLocationRequest, LocationAsk
from mdata.wire.messages import ask_sync

__all__ = ["LocationHub", "hub_for"]

_hubs: dict[tuple[int, str], "LocationHub"] = {}
_hubs_lock = threading.Lock()


class _Round:
    """The asks for one step that go in one request, and their answers once it returns."""

    def __init__(self) -> None:
        self.asks: list[LocationAsk] = []
        self.polls: list[float] = []
        self.answers: tuple[BatchLocationReply, ...] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def answer(self, index: int) -> BatchLocationReply:
        self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.answers is not None
        return self.answers[index]


class LocationHub:
    """The location requests of the Loaders of one job that share one client (module docstring)."""

    def __init__(self, client: Any, job: str, gather_s: float = 0.005) -> None:
        self.client, self.job, self.gather_s = client, job, float(gather_s)
        self.members = 0
        self.requests = 0  # sent so far, and the asks they carried: how well ranks were grouped
        self.asks = 0
        self._open: dict[int, _Round] = {}  # step -> the round still gathering asks
        self._cond = threading.Condition()

    def join(self) -> None:
        with self._cond:
            self.members += 1

    def leave(self) -> None:
        with self._cond:
            self.members -= 1
            self._cond.notify_all()  # a leader waiting for this member stops waiting

    def locate(self, step: int, poll: float, ask: LocationAsk) -> BatchLocationReply:
        """The answer to ``ask`` for ``step``, asked with this process' other ranks; ``poll``:
        the longest this rank may long-poll."""
        with self._cond:
            round_ = self._open.get(step)
            leader = round_ is None
            if leader:
                round_ = self._open[step] = _Round()
            index = len(round_.asks)
            round_.asks.append(ask)
            round_.polls.append(float(poll))
            self._cond.notify_all()
            if leader:
                until = time.monotonic() + self.gather_s
                while len(round_.asks) < self.members:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                del self._open[step]  # later asks for this step start the next round
                self.requests += 1
                self.asks += len(round_.asks)
        if leader:
            self._send(step, round_)
        return round_.answer(index)

    def _send(self, step: int, round_: _Round) -> None:
        try:
            reply = ask_sync(self.client, HostLocationRequest(
                job=self.job, step=step, timeout=min(round_.polls), asks=tuple(round_.asks)))
            if len(reply.answers) != len(round_.asks):
                raise RuntimeError(f"the scheduler answered {len(reply.answers)} of "
                                   f"{len(round_.asks)} location asks")
            round_.answers = reply.answers
        except BaseException as exc:  # every rank of the round hears it, in its own thread
            round_.error = exc
        finally:
            round_.done.set()


def hub_for(client: Any, job: str) -> LocationHub:
    """The hub of ``job``'s Loaders on ``client`` (made on first use; :func:`release` ends it)."""
    from mdata import config

    key = (id(client), job)
    with _hubs_lock:
        hub = _hubs.get(key)
        if hub is None or hub.client is not client:
            hub = _hubs[key] = LocationHub(client, job, config.seconds("trainer.location-gather"))
        hub.join()
        return hub


def release(hub: LocationHub) -> None:
    """A Loader leaves its hub; the last one out removes it."""
    hub.leave()
    with _hubs_lock:
        key = (id(hub.client), hub.job)
        if hub.members <= 0 and _hubs.get(key) is hub:
            del _hubs[key]
