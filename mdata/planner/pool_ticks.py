"""What a Planner tick decides about loader pools: feed the sizer, read the mixture ahead.

Kept apart from :mod:`mdata.planner.state` because pool sizing only *reads* the Planner's
progress (consumed, planned and balanced steps, the mixture) and never changes what is planned:
a tick here can resize pools but cannot move a sample.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from mdata.planner.events import Tick
from mdata.planner.instructions import PoolTarget

if TYPE_CHECKING:
    from mdata.planner.state import PlannerState

__all__ = ["pool_targets_on_tick", "weights_ahead"]


def pool_targets_on_tick(state: "PlannerState", ev: Tick) -> list[PoolTarget]:
    """The pool targets that changed at this tick (most ticks: none; the sizer decides on its
    own interval)."""
    if ev.now is None:
        return []
    sizer = state.pool_sizer
    sizer.observe_all_threads(ev.pool_threads)
    sizer.observe_progress(ev.now, state.consumed_step, ev.waited_s)
    return [PoolTarget(d, stimulus_id=ev.stimulus_id) for d in sizer.decide(
        ev.now, state.provisioner.last_weights, state.global_batch, ahead=weights_ahead(state),
        wall=ev.wall, lead=state.balanced_step - state.consumed_step, window=state.window)]


def weights_ahead(state: "PlannerState") -> np.ndarray | None:
    """The mixture ``pool_sizer.lead_s`` seconds of consumption past the planned window, so
    pools grow before a shift reaches the trainers (None for a schedule that depends on
    trainers' metrics: its future is not known, and asking could change its state)."""
    schedule = state.provisioner.schedule
    rate = state.pool_sizer.step_rate
    if schedule.stateful or not rate:
        return None
    step = state.planned_step + math.ceil(rate * state.pool_sizer.lead_s)
    return schedule.weights_vector(step, state.names)
