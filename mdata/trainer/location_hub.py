"""Loaders that share one Dask client ask where their batches are, and tell what they consumed, together.

The scheduler's cost per training step is mostly per message: decoding it, dispatching it,
encoding the answer (the step's checkpoint included). Ranks in one process (threads that share a
client: a per-host driver, the control-plane benchmark's simulated hosts) need the same answers
at nearly the same time, so they share one :class:`LocationHub` per client and job: the first
rank to ask for a step waits a moment (``gather_s``, or until every member rank asked) for the
others, then sends one :class:`~mdata.wire.host_location.HostLocationRequest` for all of them and
hands each rank its own answer. A rank alone in its process asks at once, without waiting.

Consumption that no location request carried (the Loaders' teller threads,
:mod:`mdata.trainer.consumption`) is gathered the same way into one
:class:`~mdata.wire.host_location.ConsumedRequest`, or, once the scheduler pushes to this client
(and ``mdata.trainer.stream-tells`` is on), into one message over the client's stream that the
scheduler confirms (:mod:`mdata.trainer.stream_tells`): no RPC for the scheduler to serve.

Ranks whose batches were not ready by the answer get ``TIMEOUT`` and simply ask again (with
whoever asks for that step next); a request that fails (the scheduler is gone) fails every rank
that was in it, each in its own thread, as a lone request would have.

With ``mdata.trainer.location-push`` on (the default), the requests name the client and the
scheduler pushes the later steps' locations over the client's stream instead
(:mod:`mdata.trainer.pushed_locations`): a rank takes its step's location from
:meth:`LocationHub.pushed` and long-polls only when none came (not subscribed yet, a reconnect,
a rewind, its batch moved).

Ranks fed by broadcast (``Plan.broadcast_at``) neither ask nor tell: they take each step's
checkpoint from what the hub received for its receiving ranks (:mod:`mdata.trainer.fed_steps`),
and ask for a step themselves (:meth:`LocationHub.ask_fed`, gathered, never subscribed) only
when none of those brought it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from mdata.errors import TrainerError
from mdata.trainer.fed_steps import StepCheckpoints
from mdata.trainer.pushed_locations import PushedLocations, current_stream, push_handler
from mdata.trainer.stream_tells import TellStream, confirm_handler
from mdata.wire.delivery import BatchLocation, BatchLocationReply
from mdata.wire.host_location import ConsumedRequest, ConsumedTell, HostLocationRequest, LocationAsk
from mdata.wire.location_push import PUSH_OP
from mdata.wire.stream_tells import CONFIRM_OP
from mdata.wire.messages import Status, ask_sync

__all__ = ["LoaderClosed", "LocationHub", "hub_for"]

#: How often a rank waiting for its round's answer looks at its Loader's stop event.
STOP_CHECK_S = 0.05


class LoaderClosed(TrainerError):
    """The rank's Loader was closed while it waited for a location: nobody wants the answer."""

_hubs: dict[tuple[int, str], "LocationHub"] = {}
_hubs_lock = threading.Lock()


class _Round:
    """The asks (or tells) that go in one request, and their answers once it returns."""

    def __init__(self) -> None:
        self.asks: list[Any] = []
        self.polls: list[float] = []
        self.answers: tuple[Any, ...] | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def answer(self, index: int, stop: threading.Event | None = None) -> Any:
        """Answer ``index`` once the request returned; with ``stop``, a :class:`LoaderClosed`
        as soon as it is set (the request goes on for the round's other ranks)."""
        if stop is None:
            self.done.wait()
        else:
            while not self.done.wait(STOP_CHECK_S):
                if stop.is_set():
                    raise LoaderClosed("loader closed")
        if self.error is not None:
            raise self.error
        assert self.answers is not None
        return self.answers[index]


class LocationHub:
    """The location requests of the Loaders of one job that share one client (module docstring)."""

    def __init__(self, client: Any, job: str, gather_s: float = 0.005, push: bool = False,
                 tells_timeout_s: float | None = None) -> None:
        self.client, self.job, self.gather_s = client, job, float(gather_s)
        # the step checkpoints that reach this hub, for its ranks fed by broadcast
        self.steps = StepCheckpoints()
        # locations the scheduler pushes (None: push off, every location is asked for)
        self.pushes = PushedLocations(client, job, self.steps) if push else None
        # consumption told over the client's stream (None: as the mdata_consumed RPC)
        self.streamed = (TellStream(client, job, tells_timeout_s)
                         if push and tells_timeout_s is not None else None)
        self.members = 0
        self.requests = 0  # sent so far, and the asks they carried: how well ranks were grouped
        self.asks = 0
        self.fed_requests = 0  # the same, of fed ranks asking for a step none of the others brought
        self.fed_asks = 0
        self._open: dict[Any, _Round] = {}  # step (or "consumed") -> the round still gathering
        self._cond = threading.Condition()

    def join(self) -> None:
        with self._cond:
            self.members += 1

    def leave(self) -> None:
        with self._cond:
            self.members -= 1
            self._cond.notify_all()  # a leader waiting for this member stops waiting
        self.steps.wake()  # a fed rank waiting for a step may have lost its last receiving rank

    # -- ranks fed by broadcast ---------------------------------------------------------------------
    def feed(self, rank: int) -> None:
        """``rank`` (a member) gets its batch by broadcast: it asks nothing per step."""
        with self._cond:
            self.steps.fed.add(int(rank))

    def unfeed(self, rank: int) -> None:
        with self._cond:
            self.steps.fed.discard(int(rank))
        self.steps.wake()

    def receiving(self) -> bool:
        """Whether a member of this hub receives batches (is not fed by broadcast)."""
        return self.members > len(self.steps.fed)

    def fed_checkpoint(self, step: int, generation: int, wait_s: float,
                       stop: threading.Event | None = None) -> Any:
        """The checkpoint of ``step`` (``generation``) as this hub's receiving ranks got it,
        waiting up to ``wait_s``; None when none of them brought it (or there is none)."""
        return self.steps.take(step, generation, wait_s, self.receiving, stop)

    def ask_fed(self, step: int, poll: float, ask: LocationAsk,
                stop: threading.Event | None = None) -> BatchLocationReply:
        """A fed rank's own long poll for ``step`` (with the other fed ranks of this process
        asking for it): as :meth:`locate`, but never subscribing to pushes (the scheduler then
        pushes nothing per step for the rank) and telling nothing."""
        def send(asks: tuple, polls: list[float]) -> tuple:
            reply = ask_sync(self.client, HostLocationRequest(
                job=self.job, step=step, timeout=min(polls), asks=asks, client=""))
            self._seen(step, asks, reply.answers)
            return reply.answers

        return self._together(("fed", step), ask, float(poll), send, stop)

    def _seen(self, step: int, asks: tuple, answers: tuple) -> None:
        """File the step's checkpoint of a request's answers for the fed ranks; a failed answer
        (the job failed or rewound, a lease was lost) has them ask for themselves meanwhile."""
        if any(a.status is Status.FAILED for a in answers):
            self.steps.reset()
        for ask, answer in zip(asks, answers):
            if answer.status is Status.OK:
                self.steps.file(ask.generation, ((step, answer.location.checkpoint),))
                break

    def locate(self, step: int, poll: float, ask: LocationAsk,
               stop: threading.Event | None = None) -> BatchLocationReply:
        """The answer to ``ask`` for ``step``, asked with this process' other ranks; ``poll``:
        the longest this rank may long-poll. With ``stop`` (the Loader's), the long poll runs in
        a thread of its own and the rank stops waiting for it with :class:`LoaderClosed` when
        ``stop`` is set, so closing a Loader never waits out a long poll; the request still
        answers the round's other ranks."""
        def send(asks: tuple, polls: list[float]) -> tuple:
            pushes, stream = self.pushes, current_stream(self.client)
            if pushes is not None:
                pushes.subscribing([(a.rank, a.generation) for a in asks])
            reply = ask_sync(self.client, HostLocationRequest(
                job=self.job, step=step, timeout=min(polls), asks=asks,
                client="" if pushes is None else str(self.client.id)))
            if pushes is not None and reply.pushing:
                pushes.subscribed([(a.rank, a.generation) for a, r in zip(asks, reply.answers)
                                   if r.status is not Status.FAILED], stream)
            if self.streamed is not None and reply.tells:
                self.streamed.accepted = True
            self._seen(step, asks, reply.answers)
            return reply.answers

        return self._together(step, ask, float(poll), send, stop)

    def pushed(self, step: int, rank: int, generation: int, wait_s: float,
               stop: threading.Event | None = None) -> tuple[BatchLocation | None, float]:
        """``rank``'s pushed location of ``step`` (waiting up to ``wait_s`` for it) and the
        seconds waited; None when push is off, the rank is not subscribed or none came."""
        if self.pushes is None:
            return None, 0.0
        return self.pushes.take(step, rank, generation, wait_s, stop)

    def pushed_waits(self, rank: int, steps: tuple[int, ...]) -> tuple[float, ...]:
        """:meth:`PushedLocations.waits` (empty when push is off)."""
        return () if self.pushes is None else self.pushes.waits(rank, steps)

    def tell(self, tell: ConsumedTell) -> None:
        """Tell ``tell`` with this process' other ranks' consumption; raises its own error."""
        def send(tells: tuple, _polls: list[float]) -> tuple:
            if self.streamed is not None and self.streamed.usable():
                return self.streamed.tell(tells)
            return ask_sync(self.client, ConsumedRequest(job=self.job, tells=tells)).errors

        error = self._together("consumed", tell, 0.0, send)
        if error is not None:
            raise error

    def _together(self, key: Any, item: Any, poll: float, send,
                  stop: threading.Event | None = None) -> Any:
        """Put ``item`` in the open round of ``key`` (opening it, and then leading it, when there
        is none); the leader gathers for a moment, sends the round, and each gets its answer
        (with ``stop``: sent from a thread of its own, waited for until ``stop`` is set)."""
        if stop is not None and stop.is_set():
            raise LoaderClosed("loader closed")
        with self._cond:
            round_ = self._open.get(key)
            leader = round_ is None
            if leader:
                round_ = self._open[key] = _Round()
            index = len(round_.asks)
            round_.asks.append(item)
            round_.polls.append(poll)
            self._cond.notify_all()
            if leader:
                until = time.monotonic() + self.gather_s
                while len(round_.asks) < self.members:
                    left = until - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                del self._open[key]  # later items start the next round
                if isinstance(key, tuple):  # ("fed", step)
                    self.fed_requests += 1
                    self.fed_asks += len(round_.asks)
                elif key != "consumed":
                    self.requests += 1
                    self.asks += len(round_.asks)
        if leader:
            if stop is None:
                _send_round(round_, send)
            else:
                threading.Thread(target=_send_round, args=(round_, send), daemon=True,
                                 name=f"mdata-locate-{self.job}-{key}").start()
        return round_.answer(index, stop)


def _send_round(round_: _Round, send) -> None:
    """Send ``round_``'s request and file its answers (or its error) for the round's ranks."""
    try:
        answers = send(tuple(round_.asks), round_.polls)
        if len(answers) != len(round_.asks):
            raise RuntimeError(f"the scheduler answered {len(answers)} of "
                               f"{len(round_.asks)} asks of one request")
        round_.answers = tuple(answers)
    except BaseException as exc:  # every rank of the round hears it, in its own thread
        round_.error = exc
    finally:
        round_.done.set()


def hub_for(client: Any, job: str) -> LocationHub:
    """The hub of ``job``'s Loaders on ``client`` (made on first use; :func:`release` ends it)."""
    from mdata import config

    through_agent = getattr(client, "agent_hub", None)  # a rank of the host agent (agent_client)
    if through_agent is not None:
        hub = through_agent(job)
        if hub is not None:  # None: the agent is lost, this client is the rank's own now
            return hub
    key = (id(client), job)
    with _hubs_lock:
        hub = _hubs.get(key)
        if hub is None or hub.client is not client:
            push = bool(config.get("trainer.location-push")) and hasattr(client, "_stream_handlers")
            tells = push and bool(config.get("trainer.stream-tells"))
            hub = _hubs[key] = LocationHub(
                client, job, config.seconds("trainer.location-gather"), push=push,
                tells_timeout_s=config.seconds("requests.timeout") if tells else None)
            if push and PUSH_OP not in client._stream_handlers:  # one handler for all its hubs
                client._stream_handlers[PUSH_OP] = push_handler(client, _hubs, _hubs_lock)
            if tells and CONFIRM_OP not in client._stream_handlers:
                client._stream_handlers[CONFIRM_OP] = confirm_handler(client, _hubs, _hubs_lock)
        hub.join()
        return hub


def release(hub: LocationHub, rank: int | None = None) -> None:
    """A Loader (of ``rank``) leaves its hub; the last one out removes it."""
    if not isinstance(hub, LocationHub):  # the host agent's (mdata.trainer.agent_proxy.AgentHub)
        hub.release(rank)
        return
    if rank is not None and hub.pushes is not None:
        hub.pushes.forget(rank)
    if rank is not None:
        hub.unfeed(rank)
    hub.leave()
    with _hubs_lock:
        key = (id(hub.client), hub.job)
        if hub.members <= 0 and _hubs.get(key) is hub:
            del _hubs[key]
