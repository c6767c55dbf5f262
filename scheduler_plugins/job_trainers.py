"""What one job does for its trainer ranks: leases and resumes, and what the ranks consumed.

The trainer-facing half of a job on the scheduler. A Loader *attaches* to lease its rank, and a
checkpoint it brings may *rewind* the whole job (:mod:`mdata.planner.roster` decides;
:mod:`scheduler_plugins.rewind` builds and checks the resumed state first); a driver that
registers a running job again with a checkpoint rewinds it too. Ranks then ask where their batch
is (:func:`batch_location`; several ranks of one process at once:
:func:`scheduler_plugins.batch_locations.locate_many`) and tell what their training loops
consumed (:func:`acknowledge`, :func:`consumed_many`), which become a few Planner events per
step (:mod:`scheduler_plugins.consumption`).

The other half, :mod:`scheduler_plugins.job_runtime`, turns the Planner's instructions into Dask
tasks and keeps the state both halves share (the roster, the built batches, the counters); these
functions act on that runtime, and the runtime never imports them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from mdata import planner as ps
from mdata.planner.roster import Holder
from mdata.wire.host_location import LocationAsk
from mdata.wire.messages import AttachReply, AttachRequest, BatchLocationReply
from scheduler_plugins import rewind
from scheduler_plugins.batch_locations import locate_many
from scheduler_plugins.consumption import Told, consumption_events, delivery_events
from scheduler_plugins.job_runtime import JobRuntime

__all__ = ["acknowledge", "attach", "batch_location", "consumed_many", "consumed_told",
           "progress_rank", "pushed_waits", "pushed_waits_many", "rewind_for_driver"]

logger = logging.getLogger("mdata.planner")


# -- leases and resumes ----------------------------------------------------------------------------
async def attach(runtime: JobRuntime, req: AttachRequest) -> AttachReply:
    """Lease a rank to a Loader; a checkpoint from a rank that already ran in this generation
    (or that starts another step) rewinds the job to it (see mdata.planner.roster)."""
    holder = Holder(req.client, req.token, req.host, req.pid)
    step = None if req.checkpoint is None else int(req.checkpoint["step"])
    options = ps.ResumeOptions(req.accept_appended_shards, req.allow_mixture_change)
    roster = runtime.roster

    def is_live(held: Holder) -> bool:
        # a lease lives while its Loader's Dask client is connected (a killed trainer's client
        # leaves the scheduler when its connection drops)
        return held.client in runtime.scheduler.clients

    async with runtime.lock:
        last = runtime.consumed_steps.get(progress_rank(runtime, req.rank))
        att = roster.decide(req.rank, holder, checkpoint_step=step, is_live=is_live,
                            next_step=None if last is None else last + 1)
        # the checkpoint is checked (and the rewound state built) before the roster moves on:
        # one this job cannot restore fails its own rank only (scheduler_plugins.rewind)
        state = rewind.resumed_state(runtime, req.checkpoint, options) if att.rewind else None
        if step is not None and state is None:
            rewind.check_joining(runtime, req.checkpoint, options)
        roster.commit(att)
        if state is not None:
            await runtime.rewind_to(state, options)
        identity = runtime.state.identity
    logger.info("mdata job %s: rank %d attached (%s), generation %d from step %d%s", runtime.job,
                req.rank, holder.describe(), att.generation, att.start_step,
                ", rewound" if att.rewind else "")
    return AttachReply(att.generation, att.start_step, identity.job_data())


def progress_rank(runtime: JobRuntime, rank: int) -> int:
    """The rank whose consumption tells how far ``rank`` trained: itself, or for a rank fed
    by broadcast (which tells none: the Planner does not wait for it) the rank it gets its
    batch from, whose training loop it follows step by step."""
    source = runtime.plan.mesh.broadcast_source(rank, runtime.plan.broadcast)
    return rank if source is None else source


async def rewind_for_driver(runtime: JobRuntime, checkpoint: dict,
                            options: "ps.ResumeOptions | None" = None) -> None:
    """A driver registered this (live) job again with a checkpoint of another step."""
    async with runtime.lock:
        if int(checkpoint["step"]) != runtime.roster.start_step:
            state = rewind.resumed_state(runtime, checkpoint, options)  # before the roster moves
            runtime.roster.rewound_by_driver(int(checkpoint["step"]))
            await runtime.rewind_to(state, options)


# -- where a batch is --------------------------------------------------------------------------------
async def batch_location(runtime: JobRuntime, rank: int, step: int, timeout: float, token: str = "",
                         generation: int = 0, delivered: int | None = None) -> BatchLocationReply:
    """Long-poll until the batch of ``step`` for ``rank``'s DP group is built (or fails)."""
    asks = [LocationAsk(rank, token, generation, delivered)]
    return (await locate_many(runtime, step, asks, timeout))[0]


# -- what the ranks consumed -------------------------------------------------------------------------
async def acknowledge(runtime: JobRuntime, rank: int, step: int, *, consumed: bool = True,
                      token: str = "", generation: int = 0, stalled_s: float = -1.0) -> None:
    """``rank`` consumed (its training loop took the next batch) or only received ``step``;
    ``stalled_s``: the rank's training loop's total wait for batches (-1: not told)."""
    if stalled_s >= 0:
        runtime.stalled_seconds[rank] = stalled_s
    if token:
        runtime.roster.check(rank, token, generation)  # a stale Loader hears it as an error
    if not consumed:
        delivery = delivery_events(runtime, rank, step, token)
        if delivery:
            await runtime.handle_coalesced(*delivery)
        return
    events, _ = consumption_events(runtime, [Told(rank, (step,), token)])
    await runtime.handle_coalesced(*events)


def consumed_told(runtime: JobRuntime, rank: int, steps: tuple[int, ...], token: str,
                  stalled_s: float, waits: tuple[float, ...] = ()) -> tuple[int, ...]:
    """``rank`` consumed ``steps``, told with its location request (checked by the handler):
    :func:`consumed_many` for one rank. Returns the steps told first."""
    return consumed_many(runtime, [Told(rank, tuple(steps), token, stalled_s, tuple(waits))])[0]


def consumed_many(runtime: JobRuntime, told: Sequence[Told]) -> list[tuple[int, ...]]:
    """What several ranks consumed (:class:`~scheduler_plugins.consumption.Told` entries,
    checked by the handler), queued for the Planner now as a few events per step and DP
    group (:mod:`scheduler_plugins.consumption`), without waiting for them to be applied,
    so the message that carried them is answered at once. ``waits`` feed the dashboard's
    waiting page (:mod:`mdata.observe.data_waits`). Per entry, the steps told first."""
    events, firsts = consumption_events(runtime, told)
    if events:
        runtime.enqueue(events)
    return firsts


def pushed_waits(runtime: JobRuntime, rank: int, steps: Iterable[int],
                 waited: Iterable[float]) -> None:
    """How long ``rank``'s prefetcher waited for the pushed locations of ``steps`` (-1: it
    long-polled, measured in ``locate_many``), counted as a long poll's wait is."""
    for step, seconds in zip(steps, waited):
        if seconds >= 0:
            runtime.wait_seconds[rank] += seconds
            runtime.trainer_meter.waited(rank, step, seconds)


def pushed_waits_many(runtime: JobRuntime, step: int, ranks: Sequence[int],
                      waited: Sequence[float]) -> None:
    """:func:`pushed_waits` of one ``step`` for several ranks (one message of many)."""
    kept = [(r, w) for r, w in zip(ranks, waited) if w >= 0]
    if kept:
        totals = runtime.wait_seconds
        for rank, seconds in kept:
            totals[rank] += seconds
        runtime.trainer_meter.waited_many(step, [r for r, _ in kept], [w for _, w in kept])
