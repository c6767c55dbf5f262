"""A rank's :class:`~mdata.trainer.location_hub.LocationHub`, kept by the host agent.

The Loader talks to its hub (``locate``, ``pushed``, ``pushed_waits``, ``tell``, and leaving it)
without knowing where it is. With the host agent, :class:`AgentHub` sends each call to the real
hub the agent keeps on its one client (:mod:`mdata.trainer.host_agent`), so the asks of all the
host's ranks for a step go in one request, their consumption in one tell, and the scheduler
pushes each step's locations to one client per host. When the agent is lost
(:class:`~mdata.trainer.agent_client.AgentLost`), the call goes to a real hub made on the rank's
own client instead (:meth:`~mdata.trainer.agent_client.AgentClient.direct`), and every later one
too: a location not pushed there yet is long-polled, which subscribes the rank again.
A rank fed by broadcast takes its steps' checkpoints from the agent's hub, as the host's
receiving ranks got them (:mod:`mdata.trainer.fed_steps`); once the agent is lost its own hub
has no receiving rank, so it asks for its steps.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from mdata.trainer.agent_lock import AgentLost
from mdata.trainer.location_hub import hub_for, release
from mdata.wire.codec import Reader
from mdata.wire.delivery import BatchLocation, BatchLocationReply
from mdata.wire.jobs import read_checkpoint
from mdata.wire.host_location import ConsumedTell, LocationAsk

__all__ = ["AgentCalls", "AgentHub"]


class AgentCalls(Protocol):
    """What a hub uses of the rank's :class:`~mdata.trainer.agent_client.AgentClient`: calls on
    the agent, the switch to the rank's own client once the agent is lost, and (through
    :func:`~mdata.trainer.location_hub.hub_for`) the client itself. The client makes the hubs, so
    the hub names only this much of it."""

    lost: str | None

    def sync(self, func: Any, *args: Any, **kwargs: Any) -> Any: ...

    async def call(self, op: str, /, **kw: Any) -> Any: ...

    async def direct(self) -> Any: ...


class AgentHub:
    """One Loader's hub calls, through the host agent (see the module docstring)."""

    def __init__(self, client: AgentCalls, job: str, pushes: bool) -> None:
        self.client, self.job = client, job
        self._pushes = pushes
        self._direct: Any = None  # the hub on the rank's own client, once the agent is lost
        self._lock = threading.Lock()
        self._fed: set[int] = set()  # this Loader's ranks fed by broadcast (fed again when direct)

    @property
    def pushes(self) -> Any:
        """Not None when the scheduler pushes locations to this rank's hub (as on LocationHub)."""
        if self._direct is not None:
            return self._direct.pushes
        return True if self._pushes else None

    def _call(self, op: str, **kw: Any) -> Any:
        if self._direct is not None:
            raise AgentLost(self.client.lost or "host agent lost")
        return self.client.sync(self.client.call, op, job=self.job, **kw)

    def direct(self) -> Any:
        """The hub on this rank's own client (made on first use, after the agent was lost)."""
        with self._lock:
            if self._direct is None:
                self.client.sync(self.client.direct)
                direct = hub_for(self.client, self.job)  # the agent is lost: a real hub
                for rank in self._fed:
                    direct.feed(rank)
                self._direct = direct
        return self._direct

    def feed(self, rank: int) -> None:
        """:meth:`LocationHub.feed`, on the agent's hub."""
        self._fed.add(int(rank))
        try:
            self._call("agent_feed", rank=int(rank))
        except AgentLost:
            self.direct()  # fed there

    def fed_checkpoint(self, step: int, generation: int, wait_s: float,
                       stop: threading.Event | None = None) -> Any:
        """:meth:`LocationHub.fed_checkpoint`, from what the agent's hub got for the host's
        receiving ranks; None once the agent is lost (the rank then asks on its own hub)."""
        try:
            raw = self._call("agent_fed_checkpoint", step=int(step), generation=int(generation),
                             wait_s=float(wait_s))
        except AgentLost:
            self.direct()
            return None
        if raw is None:
            return None
        return read_checkpoint(raw, Reader("FedCheckpoint", {"checkpoint": raw}),
                               "checkpoint").to_dict()

    def ask_fed(self, step: int, poll: float, ask: LocationAsk,
                stop: threading.Event | None = None) -> BatchLocationReply:
        """:meth:`LocationHub.ask_fed`, gathered with the host's other fed ranks by the agent."""
        return self._gathered("ask_fed", step, poll, ask, stop)

    def locate(self, step: int, poll: float, ask: LocationAsk,
               stop: threading.Event | None = None) -> BatchLocationReply:
        """:meth:`LocationHub.locate`, gathered with the host's other ranks by the agent."""
        return self._gathered("locate", step, poll, ask, stop)

    def _gathered(self, method: str, step: int, poll: float, ask: LocationAsk,
                  stop: threading.Event | None) -> BatchLocationReply:
        """The agent's ``agent_<method>``; the client's own hub's ``method`` if the agent is lost."""
        try:
            raw = self._call(f"agent_{method}", step=int(step), poll=float(poll), ask=ask.to_msg())
        except AgentLost:
            return getattr(self.direct(), method)(step, poll, ask, stop)
        return BatchLocationReply.from_msg(raw)

    def pushed(self, step: int, rank: int, generation: int, wait_s: float,
               stop: threading.Event | None = None) -> tuple[BatchLocation | None, float]:
        """:meth:`LocationHub.pushed`, from the pushes to the agent's client; a lost agent is
        "none came" (the Loader long-polls, which subscribes this rank's own client)."""
        began = time.monotonic()
        try:
            raw = self._call("agent_pushed", step=int(step), rank=int(rank),
                             generation=int(generation), wait_s=float(wait_s))
        except AgentLost:
            if self._direct is None:
                self.direct()
                return None, time.monotonic() - began
            return self._direct.pushed(step, rank, generation, wait_s, stop)
        if raw["location"] is None:
            return None, float(raw["waited"])
        return BatchLocationReply.from_msg(raw["location"]).location, float(raw["waited"])

    def pushed_waits(self, rank: int, steps: tuple[int, ...]) -> tuple[float, ...]:
        """:meth:`LocationHub.pushed_waits` (the agent's hub measured them)."""
        try:
            return tuple(float(w) for w in self._call("agent_pushed_waits", rank=int(rank),
                                                      steps=[int(s) for s in steps]))
        except AgentLost:
            return self.direct().pushed_waits(rank, steps)

    def tell(self, tell: ConsumedTell) -> None:
        """:meth:`LocationHub.tell`, with the host's other ranks' consumption; raises its error."""
        try:
            self._call("agent_tell", tell=tell.to_msg())
        except AgentLost:
            self.direct().tell(tell)

    def release(self, rank: int | None = None) -> None:
        """This Loader leaves the hub (the agent's, or its own client's)."""
        if self._direct is not None:
            release(self._direct, rank)
            return
        try:
            self._call("agent_leave", rank=rank)
        except AgentLost:
            pass
        except Exception:  # noqa: BLE001 - leaving is best effort: the agent's pid check ends it
            pass
