"""What the Planner's pool sizing reads from the scheduler besides its own state, once a second.

Pool sizing (:mod:`mdata.pools.demand`) decides each source's workers from what it measures. Two
of its inputs only the scheduler knows: how many loader threads one worker of each source's pool
runs (the amount of ``pool_<source>`` a worker holds; 0: the pool has no worker), and how long the
ranks' training loops stall for data (their own waits, not the prefetchers' long polls). Reading
the first walks every worker's resources, so a job reads both once a second, not at every tick,
and in one pass over the workers for all its sources (at 10,000 sources, one pass per source was
the cost).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mdata.pools.standbys import pool_resource

__all__ = ["PoolInputs", "pool_threads", "pool_workers"]


def pool_threads(workers: Iterable[Any], index: Mapping[str, int]) -> tuple[int, ...]:
    """Per source (``index``: its pool resource -> position), the loader threads of one worker
    of its pool (the largest amount of ``pool_<source>`` a worker holds; 0: no worker). One pass
    over the workers' resources, not one per source over every worker (10,000 sources times
    the workers, once a second)."""
    threads = [0] * len(index)
    for ws in workers:
        for name, amount in ws.resources.items():
            i = index.get(name)
            if i is not None and amount > threads[i]:
                threads[i] = int(amount)
    return tuple(threads)


def pool_workers(scheduler: Any, source: str) -> int:
    """How many workers hold the source's pool resource (``pool_<source>``) right now."""
    resource = pool_resource(source)
    return sum(1 for ws in scheduler.workers.values() if ws.resources.get(resource, 0) > 0)


class PoolInputs:
    """One job's pool-sizing inputs from the scheduler (see the module docstring): ``threads``
    per source and ``waited``, the mean stall of the ranks' training loops, as last read."""

    def __init__(self, scheduler: Any, source_names: Sequence[str]) -> None:
        self.scheduler = scheduler
        self._index = {pool_resource(n): i for i, n in enumerate(source_names)}
        self.read_at = -1.0
        self.threads: tuple[int, ...] = ()
        self.waited = 0.0

    def refresh(self, now: float, stalls: Mapping[int, float]) -> bool:
        """Read again when a second passed since the last read (``now``: the monotonic clock;
        ``stalls``: each rank's training-loop wait as its Loader last told it); whether it did."""
        if now - self.read_at < 1.0:
            return False
        self.threads = pool_threads(self.scheduler.workers.values(), self._index)
        self.waited = sum(stalls.values()) / len(stalls) if stalls else 0.0
        self.read_at = now
        return True
