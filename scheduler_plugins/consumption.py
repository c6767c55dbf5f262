"""What trainers' training loops consumed, turned into Planner events per step and DP group.

Consumption reaches the scheduler a client message at a time: one ``mdata_consumed`` request,
stream tell or location request carries every rank of a trainer process or host agent that
consumed since the last one. Taken rank by rank, each rank and step cost the event loop two
Planner events (its delivery, which consumption implies, and its consumption) that the runtime
then merged again by step before applying them; at thousands of ranks that per-rank work was
most of what the scheduler spent on consumption. :func:`consumption_events` takes a whole
message's ranks in one pass and returns one :class:`~mdata.planner.BatchDelivered` per step and
DP group and one :class:`~mdata.planner.RanksConsumed` per step, which the pure Planner applies by
group with array operations. What is still done per rank is what belongs to the rank: its
lease and steps (checked by the caller), the runtime's counters (steps told first,
:mod:`scheduler_plugins.told_steps`; the dashboard's consumption and wait figures) and the
delivery it has not told yet.

A delivery is recorded once per rank and step: it arrives with a later location request or is
implied by the consumption, whichever comes first (a rank that gets its batch by broadcast has
none).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import NamedTuple

from mdata import planner as ps
from scheduler_plugins.job_runtime import JobRuntime

__all__ = ["Told", "consumption_events", "delivery_events", "new_delivery"]

#: Steps of delivery remembered per rank before those under the consumed step are forgotten.
DELIVERED_KEEP = 64


class Told(NamedTuple):
    """One rank's consumption, as a message told it (already checked): ``steps`` ascending;
    ``stalled_s`` the loop's total wait (-1: not told); ``waits`` each step's exposed wait."""

    rank: int
    steps: tuple[int, ...]
    token: str
    stalled_s: float = -1.0
    waits: tuple[float, ...] = ()


def consumption_events(runtime: JobRuntime, told: Sequence[Told]) -> tuple[list, list[tuple[int, ...]]]:
    """The Planner events of what ``told`` ranks consumed (see the module docstring), and per
    entry the steps its Loader told for the first time (a resend counts once in the counters;
    the Planner ignores a repeat). Counts each rank's figures as it goes."""
    if _one_step(told):
        return _one_step_events(runtime, told)
    now = time.monotonic()
    storage: frozenset[str] | None = None
    consumed: dict[int, list[int]] = {}
    delivered: dict[tuple[int, int], list[int]] = {}
    firsts: list[tuple[int, ...]] = []
    rank_dp = runtime.rank_dp
    for rank, steps, token, stalled_s, waits in told:
        if stalled_s >= 0:
            runtime.stalled_seconds[rank] = stalled_s
        if waits:
            if storage is None:
                storage = frozenset(runtime.storage_waits)
            for step, wait in zip(steps, waits):
                if math.isfinite(wait) and wait >= 0:  # -1: not measured
                    runtime.data_waits.waited(rank, step, wait, at=now, storage_waiting=storage)
        if runtime.closed or not steps:
            firsts.append(())
            continue
        dp = rank_dp[rank]
        new: list[int] = []
        for step in steps:
            if runtime.told.first(rank, step, token):
                new.append(step)
                runtime.trainer_meter.consumed(rank, step)
            if new_delivery(runtime, rank, dp, step, token):
                delivered.setdefault((step, dp), []).append(rank)
            consumed.setdefault(step, []).append(rank)
        runtime.consumed_steps[rank] = max(runtime.consumed_steps.get(rank, -1), max(steps))
        firsts.append(tuple(new))
    events: list = [ps.BatchDelivered(step=step, dp_rank=dp, ranks=tuple(ranks),
                                      stimulus_id=f"delivered-{step}-{dp}-{ranks[0]}")
                    for (step, dp), ranks in delivered.items()]
    events += [ps.RanksConsumed(step=step, ranks=tuple(ranks), stimulus_id=f"ack-{step}-{ranks[0]}")
               for step, ranks in consumed.items()]
    return events, firsts


def _one_step(told: Sequence[Told]) -> bool:
    """Whether every entry tells the same single step: a host's message of all its ranks, the
    case thousands of ranks make every step."""
    if not told:
        return False
    steps = told[0].steps
    return len(steps) == 1 and all(t.steps == steps for t in told)


def _one_step_events(runtime: JobRuntime, told: Sequence[Told]) -> tuple[list, list[tuple[int, ...]]]:
    """:func:`consumption_events` of entries that all tell one step (:func:`_one_step`): the
    same events and counters, taken by collaborator for all ranks at once instead of rank by
    rank (each collaborator's ``*_many``)."""
    step = told[0].steps[0]
    ranks = [t.rank for t in told]
    runtime.stalled_seconds.update((t.rank, t.stalled_s) for t in told if t.stalled_s >= 0)
    waited = [(t.rank, t.waits[0]) for t in told
              if t.waits and math.isfinite(t.waits[0]) and t.waits[0] >= 0]  # -1: not measured
    if waited:
        runtime.data_waits.waited_many(step, [r for r, _ in waited], [w for _, w in waited],
                                       at=time.monotonic(),
                                       storage_waiting=frozenset(runtime.storage_waits))
    if runtime.closed:
        return [], [()] * len(told)
    tokens = [t.token for t in told]
    firsts = runtime.told.first_many(step, ranks, tokens)
    runtime.trainer_meter.consumed_many(step, [r for r, first in zip(ranks, firsts) if first])
    delivered: dict[int, list[int]] = {}
    rank_dp, last = runtime.rank_dp, runtime.consumed_steps
    for rank, token in zip(ranks, tokens):
        dp = rank_dp[rank]
        if new_delivery(runtime, rank, dp, step, token):
            delivered.setdefault(dp, []).append(rank)
        if last.get(rank, -1) < step:
            last[rank] = step
    events: list = [ps.BatchDelivered(step=step, dp_rank=dp, ranks=tuple(group),
                                      stimulus_id=f"delivered-{step}-{dp}-{group[0]}")
                    for dp, group in delivered.items()]
    events.append(ps.RanksConsumed(step=step, ranks=tuple(ranks), stimulus_id=f"ack-{step}-{ranks[0]}"))
    return events, [(step,) if first else () for first in firsts]


def delivery_events(runtime: JobRuntime, rank: int, step: int, token: str) -> list:
    """The delivery of ``step`` to ``rank`` as an event, unless that Loader told it already."""
    dp = runtime.rank_dp[rank]
    if not new_delivery(runtime, rank, dp, step, token):
        return []
    return [ps.BatchDelivered(step=step, dp_rank=dp, ranks=(rank,),
                              stimulus_id=f"delivered-{rank}-{step}")]


def new_delivery(runtime: JobRuntime, rank: int, dp: int, step: int, token: str) -> bool:
    """Whether ``rank`` (in DP group ``dp``, lease ``token``) receiving ``step`` is news to the
    Planner; remembers it. Not for a rank fed by broadcast, nor a step already retired."""
    consumed = runtime.view.consumed_step
    if step < consumed or rank not in runtime.state.receivers[dp]:
        return False
    told = runtime.delivered.get(rank)
    if told is None or told[0] != token:
        told = runtime.delivered[rank] = (token, set())
    if step in told[1]:
        return False
    told[1].add(step)
    if len(told[1]) > DELIVERED_KEEP:  # steps before the consumed one are refused above: forget them
        told[1].difference_update([s for s in told[1] if s < consumed])
    return True
