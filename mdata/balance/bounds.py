"""Lower bounds on a step's makespan: what no assignment of indivisible samples can beat.

Why here: the balancer stops refining once it is within a hair of :func:`lower_bound`, the
assignment reports its ratio to it, and the benchmarks and tests judge quality against both bounds.
"""

from __future__ import annotations

import numpy as np

__all__ = ["lower_bound", "pigeonhole_lower_bound"]


def lower_bound(costs: np.ndarray, dp: int) -> float:
    """``max(total/dp, largest item)``: no assignment of indivisible samples can beat it."""
    costs = np.asarray(costs, dtype=np.float64)
    if costs.size == 0:
        return 0.0
    return float(max(costs.sum() / dp, costs.max()))


def pigeonhole_lower_bound(costs: np.ndarray, dp: int) -> float:
    """A tighter bound than :func:`lower_bound` when many samples are large.

    Among the ``k*dp + 1`` largest samples, some rank holds at least ``k + 1`` of them, so the
    makespan is at least the sum of the ``k + 1`` smallest of those. The bound is the largest of
    these over ``k`` (and of :func:`lower_bound`). It matters when a step holds more
    full-context documents than there are ranks: then two of them must share a rank, however the
    rest is spread.
    """
    costs = np.sort(np.asarray(costs, dtype=np.float64))[::-1]
    best = lower_bound(costs, dp)
    if costs.size <= dp:
        return best
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    k = np.arange(1, (costs.size - 1) // dp + 1)
    top = k * dp + 1  # the k*dp+1 largest samples...
    sums = prefix[top] - prefix[top - (k + 1)]  # ...of which the k+1 smallest share a rank
    return float(max(best, sums.max()))
