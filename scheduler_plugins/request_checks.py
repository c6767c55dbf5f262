"""Range checks of the Planner's requests: what the typed messages cannot know.

:mod:`mdata.wire.messages` checks every field's type where a request is read; whether a rank is in
the job's world, a step is not negative or a long-poll timeout is sane depends on the job, so it is
checked here, before a handler touches the job's state, and answered with an
:class:`~mdata.wire.errors.InvalidRequestError` that names the handler, the field and the range.
Every ``mdata_*`` handler of the Planner calls these first (docs/deploying.md: anyone who reaches
the scheduler's port can call them).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TypeVar

from mdata.wire.errors import InvalidRequestError

__all__ = ["check_job_name", "check_rank", "check_step", "check_timeout", "check_count", "known_job"]

T = TypeVar("T")

#: Job names become parts of task keys and dashboard URLs: keep them printable and short.
_JOB = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:@+=-]{0,127}$")
#: The longest single long-poll a trainer may ask for (its timeout bounds the total wait).
MAX_POLL_S = 3600.0


def check_job_name(handler: str, job: str) -> str:
    if not _JOB.match(job):
        raise InvalidRequestError(
            f"{handler}: job name {job!r:.80} is not accepted; use 1-128 letters, digits and "
            "'_.:@+=-', starting with a letter or digit")
    return job


def check_rank(handler: str, rank: int, world_size: int) -> int:
    if not 0 <= rank < world_size:
        raise InvalidRequestError(
            f"{handler}: rank {rank} is outside the job's world of {world_size} ranks "
            f"(ranks 0..{world_size - 1})")
    return rank


def check_step(handler: str, step: int, what: str = "step") -> int:
    if step < 0:
        raise InvalidRequestError(f"{handler}: {what} {step} is negative; steps count from 0")
    return step


def check_count(handler: str, value: int, limit: int, what: str) -> int:
    """``0 <= value <= limit`` (e.g. how many steps of lineage: at most those planned)."""
    if not 0 <= value <= limit:
        raise InvalidRequestError(f"{handler}: {what} must be in 0..{limit}, got {value}")
    return value


def check_timeout(handler: str, timeout: float) -> float:
    if not math.isfinite(timeout) or not 0.0 <= timeout <= MAX_POLL_S:
        raise InvalidRequestError(
            f"{handler}: timeout {timeout!r} must be a number of seconds in [0, {MAX_POLL_S:g}]")
    return timeout


def known_job(jobs: Mapping[str, T], job: str) -> T:
    """The job ``job`` names among the Planner's ``jobs``; an error naming the jobs there are
    (and how to register one) when there is none."""
    try:
        return jobs[job]
    except KeyError:
        known = ", ".join(sorted(jobs)) or "none"
        raise InvalidRequestError(
            f"no mdata job named {job!r} on this cluster (jobs: {known}); register it first with "
            "mdata.driver.submit_job(client, plan, job=...) or pass plan= to the Loader"
        ) from None
