"""The Planner takes consumption tells from clients' batched streams, and confirms each.

The trainers' hubs send what their ranks' training loops consumed as one
:class:`~mdata.wire.stream_tells.StreamedTells` per client over its existing stream to the
scheduler (op :data:`~mdata.wire.stream_tells.TELL_OP`), instead of one ``mdata_consumed`` RPC
(each RPC costs the scheduler a comm read, a dispatch and a reply write). :class:`StreamTells`
registers the stream handler when the Planner starts and removes it when it closes. Each message
is taken exactly as ``mdata_consumed`` takes its request (:func:`take_tells`, which both
use: the same checks, each tell's own typed error) and answered with one
:class:`~mdata.wire.stream_tells.TellsConfirmed` over the scheduler's stream to that client
(``scheduler.client_comms``), batched by Dask with the location pushes going there.

A stream handler that raises closes the client's whole stream, so this one never does: a
message it cannot read is confirmed with the error when it has a sequence number (its sender
hears it), else logged and dropped (no sender of this version sends one). A sender resends a
message not confirmed in time; the runtime counts a repeated step once
(:mod:`scheduler_plugins.told_steps`), and the pure Planner ignores it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mdata.errors import MdataError
from mdata.wire.codec import Handler
from mdata.wire.errors import InvalidRequestError
from mdata.wire.host_location import ConsumedTell
from mdata.wire.stream_tells import CONFIRM_OP, TELL_OP, StreamedTells, TellsConfirmed
from scheduler_plugins import job_trainers
from scheduler_plugins.consumption import Told
from scheduler_plugins.rank_checks import check_lease, check_received, check_stall
from scheduler_plugins.request_checks import check_rank, check_step

if TYPE_CHECKING:
    from scheduler_plugins.job_runtime import JobRuntime

__all__ = ["StreamTells", "take_tells"]

logger = logging.getLogger("mdata.planner")

#: The handler name the checks quote in their errors: a streamed tell is an ``mdata_consumed``.
HANDLER = Handler.CONSUMED.value


def take_tells(runtime: "JobRuntime", tells: Sequence[ConsumedTell],
               handler: str = HANDLER) -> tuple[MdataError | None, ...]:
    """Check and queue for the Planner what several ranks' training loops consumed; per tell,
    its error or None. Each tell is checked as an ack is, so a wrong one fails alone; the ones
    taken go to the Planner together, as a few events per step and DP group
    (:mod:`scheduler_plugins.consumption`)."""
    if _all_pass(runtime, tells):  # the common case, checked for the whole message at once
        step = tells[0].steps[0]
        firsts = job_trainers.consumed_many(
            runtime, [Told(t.rank, t.steps, t.token, t.stalled_s, t.waits) for t in tells])
        pushed = [(t.rank, t.waited[0]) for t, first in zip(tells, firsts) if first and t.waited]
        if pushed:  # a resent step's wait was counted when it was first told
            job_trainers.pushed_waits_many(runtime, step, [r for r, _ in pushed], [w for _, w in pushed])
        return (None,) * len(tells)
    errors: list[MdataError | None] = [None] * len(tells)
    taken: list[tuple[ConsumedTell, list[float]]] = []
    told: list[Told] = []
    world = runtime.plan.mesh.world_size
    for i, tell in enumerate(tells):
        try:
            check_rank(handler, tell.rank, world)
            check_lease(handler, tell.rank, tell.token, runtime.roster, tell.generation)
            for step in tell.steps:
                check_received(handler, runtime.view, tell.rank, check_step(handler, step))
            waited = [check_stall(handler, tell.rank, w) for w in tell.waited]
            stalled = check_stall(handler, tell.rank, tell.stalled_s)
        except MdataError as exc:
            errors[i] = exc
            continue
        taken.append((tell, waited))
        told.append(Told(tell.rank, tell.steps, tell.token, stalled, tell.waits))
    for (tell, waited), first in zip(taken, job_trainers.consumed_many(runtime, told)):
        if waited:  # a resent step's wait was counted when it was first told
            new = set(first)
            steps = [(s, w) for s, w in zip(tell.steps, waited) if s in new]
            job_trainers.pushed_waits(runtime, tell.rank, [s for s, _ in steps], [w for _, w in steps])
    return tuple(errors)


def _all_pass(runtime: "JobRuntime", tells: Sequence[ConsumedTell]) -> bool:
    """Whether every tell is of one and the same step and passes every check of ``take_tells``
    (rank, lease, step balanced, waits and stall -1 or finite and >= 0): a host's message of all
    its ranks, the case thousands of ranks make every step, checked in a few passes over the
    message instead of a call per check per rank. False sends it through the checks rank by
    rank, which name what fails."""
    if not tells:
        return False
    steps = tells[0].steps
    if len(steps) != 1 or not 0 <= steps[0] < int(runtime.view.balanced_step):
        return False
    for t in tells:
        if t.steps != steps or not t.token or not _stall_ok(t.stalled_s) \
                or not all(map(_stall_ok, t.waited)):
            return False
    return runtime.roster.holds_all([t.rank for t in tells], [t.token for t in tells],
                                    [t.generation for t in tells])


def _stall_ok(seconds: float) -> bool:
    """As :func:`~scheduler_plugins.rank_checks.check_stall` takes it (-1: not told)."""
    return seconds == -1.0 or (math.isfinite(seconds) and seconds >= 0.0)


class StreamTells:
    """The scheduler's stream handler for :data:`TELL_OP` (see the module docstring);
    ``jobs()``: the Planner's jobs by name, read at each message."""

    def __init__(self, scheduler: Any, jobs: Callable[[], dict[str, "JobRuntime"]]) -> None:
        self.scheduler, self.jobs = scheduler, jobs
        self.messages = 0  # messages taken, and confirmations sent
        self.confirmed = 0
        scheduler.stream_handlers[TELL_OP] = self.on_tell

    def close(self) -> None:
        if self.scheduler.stream_handlers.get(TELL_OP) == self.on_tell:
            del self.scheduler.stream_handlers[TELL_OP]

    def on_tell(self, client: str = "", tells: Any = None, **_ignored: Any) -> None:
        """One client's message (on the event loop): take it, confirm it; never raises."""
        self.messages += 1
        try:
            message = StreamedTells.from_msg(tells)
        except MdataError as exc:
            seq, job = _loose(tells)
            if seq is None:
                logger.warning("mdata: dropped a consumption tell from %s with no sequence "
                               "number: %s", client, exc)
                return
            self._confirm(client, TellsConfirmed(job, seq, error=exc))
            return
        try:
            runtime = self.jobs().get(message.job)
            if runtime is None:
                raise InvalidRequestError(f"no mdata job named {message.job!r} on this cluster")
            runtime.consumed_streamed += 1
            reply = TellsConfirmed(message.job, message.seq, take_tells(runtime, message.tells))
        except MdataError as exc:
            reply = TellsConfirmed(message.job, message.seq, error=exc)
        except Exception as exc:  # noqa: BLE001 - a bug here must not close the client's stream
            logger.exception("mdata: taking consumption tells from %s failed", client)
            reply = TellsConfirmed(message.job, message.seq, error=MdataError(
                f"the Planner failed taking consumption tells: {type(exc).__name__}: {exc}"))
        self._confirm(client, reply)

    def _confirm(self, client: str, reply: TellsConfirmed) -> None:
        comm = self.scheduler.client_comms.get(client)
        if comm is None:  # gone: it resends on its next stream, and hears it then
            return
        try:
            comm.send({"op": CONFIRM_OP, "confirmed": reply.to_msg()})
            self.confirmed += 1
        except Exception as exc:  # noqa: BLE001 - a closing stream: the sender resends
            logger.debug("mdata: confirmation to %s failed: %r", client, exc)


def _loose(msg: Any) -> tuple[int | None, str]:
    """The sequence number and job of a message that could not be read whole, if it has them."""
    if not isinstance(msg, dict):
        return None, ""
    seq, job = msg.get("seq"), msg.get("job")
    return (seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
            job if isinstance(job, str) else "")
