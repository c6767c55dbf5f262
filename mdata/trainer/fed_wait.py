"""How a rank fed by broadcast waits for a step: its checkpoint from its hub, asked for if need be.

Why a module of its own: the :class:`~mdata.trainer.loader.Loader` of a rank under
``Plan.broadcast_at(axis)`` that is not the axis' first rank fetches no batch; per step it only
needs the step's checkpoint (for ``state_dict()`` and resume) and a pace (the step's batch is
built, or the job failed). :mod:`mdata.trainer.fed_steps` holds the checkpoints its hub saw for
the receiving ranks; this is the wait around it, with the Loader's patience and timeout.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from mdata.errors import TrainerError, TrainerTimeoutError
from mdata.trainer.location_hub import LocationHub
from mdata.trainer.patience import Patience
from mdata.wire.messages import LocationAsk, Status

__all__ = ["fed_checkpoint"]


def fed_checkpoint(hub: LocationHub, patience: Patience, stop: threading.Event, *, step: int,
                   ask: LocationAsk, poll_interval: float, timeout: float, source: int,
                   locate_seconds) -> Any:
    """The checkpoint of ``step`` for rank ``ask.rank``, fed by broadcast from rank ``source``
    (once the step's batch is built): from the locations its hub got for its receiving ranks, so
    the rank sends the scheduler nothing per step; asked for (without subscribing to pushes)
    only when none of them brought it within a poll, the hub has no receiving rank, or the job
    was reset (:mod:`mdata.trainer.fed_steps`). Its consumption is never told: the Planner does
    not wait for it (``PlannerState.receivers``). Time spent asking is appended to
    ``locate_seconds``."""
    wait = patience.begin()
    while True:
        if stop.is_set():  # closing: no new wait
            raise TrainerError("loader closed")
        poll = patience.poll_s(wait, poll_interval)
        checkpoint = hub.fed_checkpoint(step, ask.generation, poll, stop)
        if checkpoint is not None:
            return checkpoint
        if stop.is_set():
            raise TrainerError("loader closed")
        asked = time.monotonic()
        reply = hub.ask_fed(step, poll, ask, stop)
        if reply.status is Status.OK:
            locate_seconds.append(time.monotonic() - asked)
            return reply.location.checkpoint
        if reply.status is Status.FAILED:
            raise reply.failure(f"rank {ask.rank}, step {step}")
        if not patience.keep_waiting(wait, step):
            raise TrainerTimeoutError(
                f"rank {ask.rank} (fed by broadcast from rank {source}): step {step} was not "
                f"ready within {timeout:.0f}s; check the Planner's dashboard for a stalled "
                "source pool"
            )
