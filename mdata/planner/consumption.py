"""Applying a step's consumption acknowledgements by DP group, not rank by rank.

At thousands of ranks the runtime coalesces the acknowledgements that arrive together into one
:class:`~mdata.planner.events.RanksConsumed` per step. What the Planner needs from them is per
DP group: which groups this event completed (their batches can be released) and which ranks are
new (for the lineage). Doing that with one set operation per group and numpy per rank keeps the
per-step cost of 16k ranks in the low milliseconds; the rank-by-rank path cost a tenth of a
second there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["consume_by_group"]


def consume_by_group(consumed: dict[int, set[int]], receivers: Sequence[frozenset[int]],
                     rank_dp: np.ndarray, ranks: np.ndarray) -> tuple[list[int], np.ndarray, np.ndarray]:
    """Add ``ranks`` to ``consumed`` (the step's ranks so far per DP group, changed in place).

    ``receivers[d]``: the ranks of group ``d`` that must consume; ``rank_dp[r]``: rank ``r``'s
    group, -1 for a rank that gets its data by broadcast (nothing to record). Ranks told before
    count once. Returns the groups this call completed (ascending) and, for the lineage, the
    group and rank of every new consumption (by group, ranks ascending).
    """
    dps = rank_dp[ranks]
    keep = dps >= 0
    ranks, dps = ranks[keep], dps[keep]
    if not ranks.size:
        return [], dps, ranks
    order = np.argsort(dps, kind="stable")
    ranks, dps = ranks[order], dps[order]
    cuts = (np.flatnonzero(np.diff(dps)) + 1).tolist()
    done: list[int] = []
    new_dp: list[int] = []
    new_rank: list[int] = []
    for a, b in zip([0, *cuts], [*cuts, len(ranks)]):
        dp = int(dps[a])
        group = consumed.setdefault(dp, set())
        fresh = sorted(set(ranks[a:b].tolist()) - group)
        if not fresh:
            continue
        group.update(fresh)
        new_rank.extend(fresh)
        new_dp.extend([dp] * len(fresh))
        if len(group) == len(receivers[dp]):
            done.append(dp)
    return done, np.asarray(new_dp, np.int64), np.asarray(new_rank, np.int64)
