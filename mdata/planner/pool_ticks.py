"""What a Planner tick decides about loader pools: feed the sizer, read the mixture ahead.

Kept apart from :mod:`mdata.planner.state` because pool sizing only *reads* the Planner's
progress (consumed, planned and balanced steps, the mixture) and never changes what is planned:
a tick here can resize pools but cannot move a sample. The state passes the parts a tick reads
(the sizer, the provisioner and its progress), not itself.
"""

from __future__ import annotations

import math
import numpy as np

from mdata.planner.apportion import Provisioner
from mdata.planner.events import Tick
from mdata.planner.instructions import PoolTarget
from mdata.pools.demand import PoolSizer

__all__ = ["pool_targets_on_tick", "weights_ahead"]


def pool_targets_on_tick(ev: Tick, sizer: PoolSizer, provisioner: Provisioner, global_batch: int,
                         window: int, progress: tuple[int, int, int]) -> list[PoolTarget]:
    """The pool targets that changed at this tick (most ticks: none; the sizer decides on its
    own interval). ``progress``: the first step not consumed, not balanced, not apportioned."""
    if ev.now is None:
        return []
    consumed, balanced, planned = progress
    sizer.observe_all_threads(ev.pool_threads)
    sizer.observe_progress(ev.now, consumed, ev.waited_s)
    return [PoolTarget(d, stimulus_id=ev.stimulus_id) for d in sizer.decide(
        ev.now, provisioner.last_weights, global_batch, ahead=weights_ahead(sizer, provisioner, planned),
        wall=ev.wall, lead=balanced - consumed, window=window)]


def weights_ahead(sizer: PoolSizer, provisioner: Provisioner, planned: int) -> np.ndarray | None:
    """The mixture ``sizer.lead_s`` seconds of consumption past the planned window (``planned``:
    the first step not apportioned), so pools grow before a shift reaches the trainers (None for
    a schedule that depends on trainers' metrics: its future is not known, and asking could
    change its state)."""
    schedule = provisioner.schedule
    rate = sizer.step_rate
    if schedule.stateful or not rate:
        return None
    step = planned + math.ceil(rate * sizer.lead_s)
    return schedule.weights_vector(step, provisioner.names)
