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
from operator import add

import numpy as np

from mdata.balance.lpt import _SCAN_UP_TO

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
    room = [cap] * dp  # each rank's largest free space: cap - min(used[r]), kept as it changes
    totals = [[0.0] * m for _ in range(dp)]  # each micro-batch's total over the stages
    bottleneck = [0] * dp  # each rank's busiest stage so far
    excess = [0.0] * dp  # max over its micro-batches of (total - time on that stage)
    rank, mb = [0] * len(tok), [0] * len(tok)
    heap = [(0.0, r) for r in range(dp)]
    parked: list[tuple[float, int]] = []
    # many micro-batches: per rank a heap of (time on its busiest stage, index), rebuilt when that
    # stage changes; popped until one has room (the scan's choice, ties to the lowest index)
    bins = [[(0.0, k) for k in range(m)] for _ in range(dp)] if m > _SCAN_UP_TO else None
    aside: list[tuple[float, int]] = []
    sums = [sum(c) for c in sc]
    # Each heap's entries are distinct (a rank, a micro-batch index), so popping the least and
    # later pushing its new value is the same heap order as replacing it in place (heapreplace:
    # one sift instead of two), which is what the common case does: the least has room.
    for i in order:
        t, c = tok[i], sc[i]
        r = heap[0][1] if heap else -1
        if r >= 0 and room[r] >= t:
            popped = False
        else:
            while True:
                if not heap:
                    return None
                load, r = heapq.heappop(heap)
                if room[r] >= t:
                    break
                parked.append((load, r))
            for item in parked:
                heapq.heappush(heap, item)
            parked.clear()
            popped = True
        bz, rr, ur, tr = busy[r], rows[r], used[r], totals[r]
        b = bottleneck[r]
        limit = cap - t
        k_popped = False
        if bins is not None:
            heap_r = bins[r]
            k = heap_r[0][1]
            if ur[k] > limit:
                k_popped = True
                while True:
                    entry = heapq.heappop(heap_r)
                    if ur[entry[1]] <= limit:
                        k = entry[1]
                        break
                    aside.append(entry)
                for entry in aside:
                    heapq.heappush(heap_r, entry)
                aside.clear()
        else:
            k, least = -1, float("inf")
            for j in range(m):
                if ur[j] <= limit and rr[j][b] < least:
                    k, least = j, rr[j][b]
        row = rr[k] = list(map(add, rr[k], c))  # the same sums as element by element
        bz = busy[r] = list(map(add, bz, c))
        filled_least = ur[k] == cap - room[r]
        ur[k] += t
        if filled_least:
            room[r] = cap - min(ur)
        tr[k] += sums[i]
        rank[i], mb[i] = r, k
        nb = bz.index(max(bz))  # the first busiest stage
        if nb != b:  # the busiest stage moved: every micro-batch's excess changes
            bottleneck[r] = nb
            excess[r] = max(x - y[nb] for x, y in zip(tr, rr))
            if bins is not None:
                bins[r] = [(y[nb], j) for j, y in enumerate(rr)]
                heapq.heapify(bins[r])
        else:  # only micro-batch k's excess grew
            excess[r] = max(excess[r], tr[k] - row[b])
            if bins is not None:
                (heapq.heappush if k_popped else heapq.heapreplace)(bins[r], (row[b], k))
        (heapq.heappush if popped else heapq.heapreplace)(heap, (bz[nb] + excess[r], r))
    return np.asarray(rank, dtype=np.int64), np.asarray(mb, dtype=np.int64)
