"""Checks of a rank's requests against its job: lease, steps, metrics. Wrong ones fail alone.

The job's Planner state applies acknowledgements in batches (``JobRuntime.handle_coalesced``),
and an event it cannot apply fails the whole job: a token-less ack for a step not yet balanced
once ended every rank's training with a ``TrainerError``, and one NaN metric made a metric-driven
mixture raise. So each handler that takes a rank's message checks it here first, on the event
loop, against what the Planner says now (its :class:`~scheduler_plugins.planner_view.PlannerView`
and the job's roster), and a wrong request gets its error back to its sender only:

- every rank message (``batch_location``, ``ack``, ``report_metrics``) carries the lease token
  and generation its Loader got on attach (mdata.planner.roster): a caller with none, a Loader
  that lost its rank or one of an older generation is refused;
- a step the rank says it received, consumed or trained on must be balanced already (its batch
  exists): ``step < balanced_step``;
- metrics and stall times are finite numbers.

:mod:`scheduler_plugins.request_checks` checks what depends only on the request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mdata.errors import MdataError
from mdata.wire.errors import InvalidRequestError

__all__ = ["check_lease", "lease_is_current", "check_received", "check_metrics", "check_stall"]


def check_lease(handler: str, rank: int, token: str, roster: Any = None,
                generation: int = 0) -> None:
    """The request carries a lease token; with ``roster``, the token holds ``rank`` in the job's
    current ``generation``.

    Raises InvalidRequestError without a token; the roster's StaleGenerationError or
    RankTakenError for a Loader that lost its rank (it restarts from its checkpoint)."""
    if not token:
        raise InvalidRequestError(
            f"{handler}: rank {rank}: the request carries no lease token; every request of a "
            "rank carries the token and generation of the Loader holding it, which it gets by "
            "attaching (mdata.trainer.Loader does both)")
    if roster is not None:
        roster.check(rank, token, generation)


def lease_is_current(roster: Any, req: Any) -> bool:
    """Whether ``req`` (with ``rank``, ``token``, ``generation``) comes from the Loader that holds
    its rank now; a stale one is told so by the handler itself, not by a range error."""
    try:
        roster.check(req.rank, req.token, req.generation)
    except MdataError:
        return False
    return True


def check_received(handler: str, view: Any, rank: int, step: int, what: str = "step") -> int:
    """``step`` has been balanced (its batch exists or existed): a rank can have received it."""
    balanced = int(view.balanced_step)
    if step >= balanced:
        done = f"steps up to {balanced - 1} are" if balanced > 0 else "no step is"
        raise InvalidRequestError(
            f"{handler}: rank {rank}: {what} {step} is not balanced yet ({done}); a rank "
            "acknowledges or reports only a step whose batch it received")
    return step


def check_metrics(handler: str, rank: int, step: int, metrics: Mapping[str, float]) -> None:
    """Every metric is a finite number (a NaN or inf would poison a metric-driven mixture)."""
    bad = {name: value for name, value in metrics.items() if not math.isfinite(float(value))}
    if bad:
        raise InvalidRequestError(
            f"{handler}: rank {rank}, step {step}: metrics {sorted(bad)} are not finite "
            f"({bad}); report finite numbers (skip a metric whose loss diverged)")


def check_stall(handler: str, rank: int, stalled_s: float) -> float:
    """A rank's total stall: -1 (not told) or a finite number of seconds >= 0."""
    if stalled_s != -1.0 and not (math.isfinite(stalled_s) and stalled_s >= 0.0):
        raise InvalidRequestError(
            f"{handler}: rank {rank}: stalled_s {stalled_s!r} must be -1 (not told) or a finite "
            "number of seconds >= 0")
    return stalled_s
