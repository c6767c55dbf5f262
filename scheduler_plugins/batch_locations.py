"""Where the batches of one step are, for one rank or for every rank of one process at once.

Trainers long-poll here (``mdata_batch_location`` for one rank, ``mdata_host_location`` for the
ranks that share a Dask client). A request waits until the batches of its ranks' DP groups are
built, or the job fails, or its poll timeout passes; each rank is then answered with where its
group's batch is (the constructors that hold it), its slice, and the step's checkpoint, or with
``TIMEOUT`` (ask again) or ``FAILED`` (a stale lease, the job's failure, the batch's own error).

Several ranks in one request are answered together: when some of their batches are ready, the
others get ``GATHER_S`` to follow, so one answer serves the whole process in the common case
without holding a ready rank back for a straggling group. A batch whose constructor died has
no holder: the job rebuilds it (Dask recomputes the task) and its ranks wait on, as for a new one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from mdata.errors import MdataError
from mdata.planner.roster import TrainerRoster
from mdata.wire.host_location import LocationAsk
from mdata.wire.messages import BatchLocation, BatchLocationReply, Status
from scheduler_plugins.consumption import delivery_events
from scheduler_plugins.job_runtime import JobRuntime

__all__ = ["GATHER_S", "locate_many"]

#: Once some batches of a request are ready, how long the others get to follow before the ready
#: ranks are answered (the rest ``TIMEOUT``, asked again at once).
GATHER_S = 0.02


async def locate_many(runtime: JobRuntime, step: int, asks: Sequence[LocationAsk],
                      timeout: float) -> list[BatchLocationReply]:
    """One reply per ask (see the module docstring), in the asks' order."""
    runtime.location_requests += 1  # what ranks asked for, next to what was pushed to them
    runtime.location_asks += len(asks)
    replies: list[BatchLocationReply | None] = [None] * len(asks)
    waiting: dict[int, tuple[int, int]] = {}  # ask index -> (step, DP rank): its batch's key
    events: list = []
    for i, ask in enumerate(asks):
        if ask.token:
            stale = _stale(runtime.roster, ask.rank, ask.token, ask.generation)
            if stale is not None:
                replies[i] = stale
                continue
        if ask.delivered is not None and not runtime.closed:
            events += delivery_events(runtime, ask.rank, ask.delivered, ask.token)
        waiting[i] = (step, runtime.rank_dp[ask.rank])
    if events:
        runtime.enqueue(events)  # queued now, before any later acknowledgement
    began, asking = time.monotonic(), list(waiting)
    try:
        await _wait_and_answer(runtime, step, asks, waiting, replies, began + timeout)
    finally:
        waited = time.monotonic() - began
        for i in asking:
            runtime.wait_seconds[asks[i].rank] += waited
            runtime.trainer_meter.waited(asks[i].rank, step, waited)
    return [BatchLocationReply(Status.TIMEOUT) if r is None else r for r in replies]


async def _wait_and_answer(runtime: JobRuntime, step: int, asks: Sequence[LocationAsk],
                           waiting: dict[int, tuple[int, int]],
                           replies: list[BatchLocationReply | None], deadline: float) -> None:
    gather_until: float | None = None
    checkpoint: list[Any] = []  # the step's checkpoint, looked up once for every rank
    while waiting:
        keys = set(waiting.values())
        ready = {key for key in keys if _ready(runtime, key)}
        moved = answered = False
        for i, key in list(waiting.items()):
            if key in ready:
                reply = await _answer(runtime, step, asks[i], key, checkpoint)
                if reply is None:  # its constructor died: wait for the rebuild
                    moved = True
                    continue
                replies[i], answered = reply, True
                del waiting[i]
        if not waiting:
            return
        now = time.monotonic()
        if answered and gather_until is None:  # the others get a moment to follow
            gather_until = now + GATHER_S
        until = deadline if gather_until is None else min(deadline, gather_until)
        if now >= until:
            return
        if moved:  # the client may not have heard of the loss yet
            await asyncio.sleep(min(0.05, until - now))
            continue
        try:
            await asyncio.wait_for(_any_ready(runtime, set(waiting.values())), until - now)
        except asyncio.TimeoutError:
            return


async def _answer(runtime: JobRuntime, step: int, ask: LocationAsk, key: tuple[int, int],
                  checkpoint: list[Any]) -> BatchLocationReply | None:
    """The reply for a rank whose batch is ready (or whose job failed); None when the batch
    lost its holder and is being rebuilt."""
    if ask.token and ask.generation != runtime.roster.generation:  # rewound while waiting
        stale = _stale(runtime.roster, ask.rank, ask.token, ask.generation)
        if stale is not None:
            return stale
    if runtime.failure is not None:
        return BatchLocationReply(Status.FAILED, reason=runtime.failure, error=runtime.failure_error)
    batches = runtime.batches
    if key in batches.errors:
        reason, error = batches.errors[key]
        return BatchLocationReply(Status.FAILED, reason=reason, error=error)
    fut = batches.futures[key]
    who_has = batches.who_has(fut.key)
    if not who_has:
        batches.lost(key, fut)  # Dask recomputes it
        return None
    if not checkpoint:
        found = runtime.view.checkpoint(step + 1)
        if found is None:  # not in the view (asked again after every group consumed it)
            found = (await runtime.read_state(
                lambda state: state.checkpoint(step + 1, light=True))).to_dict()
        checkpoint.append(found)
    role = runtime.plan.mesh.role(ask.rank)
    return BatchLocationReply(Status.OK, BatchLocation(
        key=tuple(fut.key),
        who_has=tuple(who_has),
        cp_rank=int(role.cp_rank),
        receives_tokens=bool(role.receives_tokens),
        receives_labels=bool(role.receives_labels),
        checkpoint=checkpoint[0],
        dp_rank=key[1],  # the group's batch within its construct task's part
    ))


async def _any_ready(runtime: JobRuntime, keys: set[tuple[int, int]]) -> None:
    """Until one of ``keys`` is ready (its batch built) or the job failed."""
    while not any(_ready(runtime, key) for key in keys):
        waiters = {asyncio.ensure_future(runtime.batches.ready[key].wait()) for key in keys}
        waiters.add(asyncio.ensure_future(runtime.failed.wait()))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when the long poll itself is cancelled (timeout, trainer gone)
            for waiter in waiters:
                waiter.cancel()


def _ready(runtime: JobRuntime, key: tuple[int, int]) -> bool:
    """Whether a rank waiting for the batch of ``key`` can be answered: it is built, or the job
    failed."""
    return runtime.failed.is_set() or runtime.batches.is_built(key)


def _stale(roster: TrainerRoster, rank: int, token: str, generation: int) -> BatchLocationReply | None:
    """A FAILED reply for a Loader that lost its rank or whose generation is over."""
    try:
        roster.check(rank, token, generation)
    except MdataError as exc:
        return BatchLocationReply(Status.FAILED, reason=str(exc), error=exc)
    return None
