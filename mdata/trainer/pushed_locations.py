"""The locations the scheduler pushed to this client, until its ranks take them.

With ``mdata.trainer.location-push`` on, a :class:`~mdata.trainer.location_hub.LocationHub`
names its client in its long polls; the scheduler answers ``pushing`` and from then on sends
each later step's locations for those ranks over the client's batched stream
(:mod:`mdata.wire.location_push`). The stream handler runs on the client's event loop and only
files each location here; a rank's prefetcher then takes its step's location without a round
trip, waiting for it when the batch is not built yet.

A rank takes a pushed location only while it is subscribed: for its current generation, over
the scheduler stream that is open now. After a reconnect (a new stream), a rewind (another
generation) or a reset (the job failed, rewound or closed), it has none and long-polls as
before, which subscribes it again. A rank whose batch moved (its constructor died) long-polls
too: that is what has the scheduler wait for the rebuild.

Every push's step checkpoints (and its resets) also go to the hub's
:class:`~mdata.trainer.fed_steps.StepCheckpoints`, for the client's ranks fed by broadcast, which
are never subscribed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from mdata.trainer.fed_steps import StepCheckpoints
from mdata.wire.delivery import BatchLocation
from mdata.wire.location_push import LocationPush

__all__ = ["PushedLocations"]

logger = logging.getLogger("mdata.trainer")

#: How often a rank waiting for a push checks that its client is still connected.
CHECK_S = 0.1


def current_stream(client: Any) -> Any:
    """The client's batched stream to its scheduler now (a reconnect opens another)."""
    return getattr(client, "scheduler_comm", None)


class PushedLocations:
    """Pushed locations of one job's ranks on one client (see the module docstring)."""

    def __init__(self, client: Any, job: str, seen: StepCheckpoints | None = None) -> None:
        self.client, self.job = client, job
        self.seen = seen  # the step checkpoints every push brings, for the hub's fed ranks
        self.received = 0  # pushes received, and locations the ranks took from them
        self.taken = 0
        self._cond = threading.Condition()
        self._subscribed: dict[int, tuple[int, Any]] = {}  # rank -> (generation, stream)
        self._asking: dict[int, int] = {}  # rank -> generation, of subscriptions being asked
        self._by_rank: dict[int, dict[int, BatchLocation]] = {}  # rank -> step -> location
        self._waits: dict[int, dict[int, float]] = {}  # rank -> step -> wait for it, to tell

    def subscribing(self, ranks: list[tuple[int, int]]) -> None:
        """These ``(rank, generation)``s are about to subscribe: pushes for them are kept from
        now on (the first may arrive on the stream before the reply that says so)."""
        with self._cond:
            for rank, generation in ranks:
                if self._generation(rank) != generation:
                    self._by_rank.pop(rank, None)  # another generation's pushes
                self._asking[rank] = generation

    def subscribed(self, ranks: list[tuple[int, int]], stream: Any) -> None:
        """The scheduler pushes for these ``(rank, generation)``s, over ``stream``."""
        with self._cond:
            if stream is not None and stream is current_stream(self.client):
                for rank, generation in ranks:
                    self._subscribed[rank] = (generation, stream)

    def _generation(self, rank: int) -> int | None:
        sub = self._subscribed.get(rank)
        return sub[0] if sub is not None else self._asking.get(rank)

    def forget(self, rank: int) -> None:
        """``rank``'s Loader left: what arrives for it is dropped."""
        with self._cond:
            self._subscribed.pop(rank, None)
            self._asking.pop(rank, None)
            self._by_rank.pop(rank, None)
            self._waits.pop(rank, None)
            self._cond.notify_all()

    def receive(self, push: LocationPush) -> None:
        """File a push (on the client's event loop): only for this client's ranks that
        subscribed (or are subscribing) in the push's generation."""
        with self._cond:
            self.received += 1
            if push.reset:
                self._subscribed.clear()
                self._asking.clear()
                self._by_rank.clear()
            else:
                for step, rank, location in push.locations():
                    if self._generation(rank) == push.generation:
                        self._by_rank.setdefault(rank, {})[step] = location
            self._cond.notify_all()
        if self.seen is not None:
            if push.reset:
                self.seen.reset()
            elif push.checkpoints:
                self.seen.file(push.generation, push.checkpoints.items())

    def held(self, rank: int) -> dict[int, BatchLocation]:
        """The pushed locations ``rank`` has not taken yet, by step (a copy)."""
        with self._cond:
            return dict(self._by_rank.get(rank, {}))

    def take(self, step: int, rank: int, generation: int, wait_s: float,
             stop: threading.Event | None = None) -> tuple[BatchLocation | None, float]:
        """``rank``'s pushed location of ``step`` and how long it waited for it, waiting at most
        ``wait_s``; ``(None, waited)`` when the rank is not subscribed (any more) or none came."""
        began = time.monotonic()
        deadline = began + wait_s
        with self._cond:
            while True:
                sub = self._subscribed.get(rank)
                if sub is None or sub[0] != generation or sub[1] is not current_stream(self.client) \
                        or getattr(self.client, "status", "running") != "running":
                    return None, time.monotonic() - began
                mine = self._by_rank.get(rank, {})
                for older in [s for s in mine if s < step]:
                    del mine[older]  # steps this rank passed (located by a long poll)
                location = mine.pop(step, None)
                now = time.monotonic()
                if location is not None:
                    self.taken += 1
                    self._waits.setdefault(rank, {})[step] = now - began
                    return location, now - began
                if now >= deadline or (stop is not None and stop.is_set()):
                    return None, now - began
                self._cond.wait(min(CHECK_S, deadline - now))

    def waits(self, rank: int, steps: tuple[int, ...]) -> tuple[float, ...]:
        """Per step of ``steps``, how long ``rank`` waited for its pushed location (-1: it was
        not pushed), each told once (``ConsumedTell.waited``); empty when none was pushed."""
        with self._cond:
            mine = self._waits.get(rank)
            waited = tuple(mine.pop(s, -1.0) for s in steps) if mine else ()
        return waited if any(w >= 0 for w in waited) else ()


def hub_stream_handler(client: Any, hubs: dict, lock: threading.Lock, *, key: str,
                       parse: Callable[[Any], Any], part: str, what: str):
    """A client stream handler that reads the message's ``key`` field with ``parse`` and hands it
    to ``receive`` of the ``part`` attribute of its job's hub on this client (``hubs``:
    (id(client), job) -> LocationHub). A malformed message is dropped with a warning naming
    ``what``: its senders' fallbacks (a long poll, a resend) take over."""
    def on_message(**msg: Any) -> None:
        try:
            message = parse(msg.get(key))
        except Exception as exc:  # noqa: BLE001 - dropped: the fallback covers it
            logger.warning("mdata: dropped a malformed %s: %s", what, exc)
            return
        with lock:
            hub = hubs.get((id(client), message.job))
        target = None if hub is None or hub.client is not client else getattr(hub, part, None)
        if target is not None:
            target.receive(message)

    return on_message


def push_handler(client: Any, hubs: dict, lock: threading.Lock):
    """The client's stream handler for :data:`~mdata.wire.location_push.PUSH_OP`: each push
    goes to the hub of its job on this client; a malformed one leaves the ranks long-polling."""
    return hub_stream_handler(client, hubs, lock, key="push", parse=LocationPush.from_msg,
                              part="pushes", what="location push")
