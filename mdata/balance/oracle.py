"""The exact minimum makespan of tiny instances, by branch and bound: the oracle for tests.

Why: heuristics are only trustworthy when checked against the true optimum; this gives it for up
to 16 samples, where exhaustive search is still fast.
"""

from __future__ import annotations

import numpy as np

from mdata.balance.bounds import lower_bound
from mdata.balance.inputs import positive_int
from mdata.errors import PlanError

__all__ = ["brute_force_min_makespan"]

_BRUTE_FORCE_LIMIT = 16


def brute_force_min_makespan(costs: np.ndarray, dp: int) -> float:
    """The exact minimum over all assignments of the maximum per-rank cost (tiny instances only).

    Ignores token capacity. Branch and bound over samples in decreasing cost order, skipping
    symmetric placements (ranks with equal load); limited to 16 samples.
    """
    dp = positive_int("dp", dp)
    values = sorted((float(c) for c in np.asarray(costs, dtype=np.float64)), reverse=True)
    if len(values) > _BRUTE_FORCE_LIMIT:
        raise PlanError(
            f"brute_force_min_makespan is exponential; it takes at most {_BRUTE_FORCE_LIMIT} "
            f"samples, got {len(values)}"
        )
    if not values:
        return 0.0
    loads = [0.0] * dp
    best = [sum(values)]
    bound = lower_bound(np.asarray(values), dp)

    def place(k: int, current_max: float) -> None:
        if current_max >= best[0]:
            return
        if k == len(values):
            best[0] = current_max
            return
        seen: set[float] = set()
        for r in range(dp):
            if loads[r] in seen:
                continue
            seen.add(loads[r])
            loads[r] += values[k]
            place(k + 1, max(current_max, loads[r]))
            loads[r] -= values[k]
            if best[0] <= bound:
                return

    place(0, 0.0)
    return best[0]
