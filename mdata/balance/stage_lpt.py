"""LPT by stage: the greedy first assignment when a sample's cost differs from stage to stage.

Why: the scalar LPT (:mod:`mdata.balance.lpt`) balances totals, which leaves a rank that drew
many images with a slow stage 0; LPT on one stage's cost alone ignores the chain a very large
micro-batch makes through every stage. Here a rank's load is its estimated 1F1B makespan

    ``max_s S[s] + max_k (sum_s t[k, s] - t[k, b])``, ``b = argmax_s S[s]``

(``S[s]``: the rank's stage-``s`` busy time; ``t[k]``: its micro-batch ``k``'s stage times): the
busiest stage, plus what the costliest micro-batch adds on the other stages while it crosses the
pipeline. With even stages it is ``(sum + (p - 1) max) / p``, the estimate the scalar pipeline
pass uses (:func:`~mdata.balance.pipeline.pipeline_cost`). Samples in decreasing total go to the rank
of least load that has room, into its micro-batch that is least loaded on the busiest stage.
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["lpt_by_stage"]


def lpt_by_stage(order: list[int], tokens: np.ndarray, stage_costs: np.ndarray, dp: int, m: int,
                 cap: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(rank, micro_batch)`` per sample, or None when some sample finds no room."""
    tok = tokens.tolist()
    sc = stage_costs.tolist()
    p = stage_costs.shape[1]
    busy = [[0.0] * p for _ in range(dp)]
    rows = [[[0.0] * p for _ in range(m)] for _ in range(dp)]
    used = [[0] * m for _ in range(dp)]
    totals = [[0.0] * m for _ in range(dp)]  # each micro-batch's total over the stages
    bottleneck = [0] * dp  # each rank's busiest stage so far
    excess = [0.0] * dp  # max over its micro-batches of (total - time on that stage)
    rank, mb = [0] * len(tok), [0] * len(tok)
    heap = [(0.0, r) for r in range(dp)]
    parked: list[tuple[float, int]] = []
    for i in order:
        t, c = tok[i], sc[i]
        while True:
            if not heap:
                return None
            load, r = heapq.heappop(heap)
            if cap - min(used[r]) >= t:
                break
            parked.append((load, r))
        for item in parked:
            heapq.heappush(heap, item)
        parked.clear()
        bz, rr, ur, tr = busy[r], rows[r], used[r], totals[r]
        b = bottleneck[r]
        limit = cap - t
        k, least = -1, float("inf")
        for j in range(m):
            if ur[j] <= limit and rr[j][b] < least:
                k, least = j, rr[j][b]
        row = rr[k]
        for s in range(p):
            row[s] += c[s]
            bz[s] += c[s]
        ur[k] += t
        tr[k] += sum(c)
        rank[i], mb[i] = r, k
        nb = max(range(p), key=bz.__getitem__)
        if nb != b:  # the busiest stage moved: every micro-batch's excess changes
            bottleneck[r] = nb
            excess[r] = max(x - y[nb] for x, y in zip(tr, rr))
        else:  # only micro-batch k's excess grew
            excess[r] = max(excess[r], tr[k] - row[b])
        heapq.heappush(heap, (bz[nb] + excess[r], r))
    return np.asarray(rank, dtype=np.int64), np.asarray(mb, dtype=np.int64)
