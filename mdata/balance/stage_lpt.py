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


def _load(busy: list[float], rows: list[list[float]]) -> float:
    b = max(range(len(busy)), key=busy.__getitem__)
    return busy[b] + max(sum(row) - row[b] for row in rows)


def lpt_by_stage(order: list[int], tokens: np.ndarray, stage_costs: np.ndarray, dp: int, m: int,
                 cap: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(rank, micro_batch)`` per sample, or None when some sample finds no room."""
    tok = tokens.tolist()
    sc = stage_costs.tolist()
    p = stage_costs.shape[1]
    busy = [[0.0] * p for _ in range(dp)]
    rows = [[[0.0] * p for _ in range(m)] for _ in range(dp)]
    used = [[0] * m for _ in range(dp)]
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
        bz = busy[r]
        b = max(range(p), key=bz.__getitem__)
        k = min((j for j in range(m) if used[r][j] + t <= cap), key=lambda j: rows[r][j][b])
        row = rows[r][k]
        for s in range(p):
            row[s] += c[s]
            bz[s] += c[s]
        used[r][k] += t
        rank[i], mb[i] = r, k
        heapq.heappush(heap, (_load(bz, rows[r]), r))
    return np.asarray(rank, dtype=np.int64), np.asarray(mb, dtype=np.int64)
