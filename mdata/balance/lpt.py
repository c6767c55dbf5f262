"""LPT with token room: the first, greedy assignment of a step's samples to ranks and micro-batches.

Why: longest-processing-time-first is within ``4/3`` of the optimal makespan when tokens do not
bind, and with a heap over rank loads it is ``O(n log dp)``, so it gives refinement a near-optimal
start at the size of a 4096-GPU step. Each sample also goes to its rank's cheapest micro-batch
with room, so a rank's micro-batches come out balanced too (pipeline parallelism needs that).
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = ["PackState", "lpt_assign", "min_micro_batches"]

#: Up to this many micro-batches per rank the cheapest one with room is found by a scan; above
#: it, by a heap per rank.
_SCAN_UP_TO = 8


def min_micro_batches(tokens: np.ndarray, dp: int, requested: int, max_tokens: int) -> int:
    """The fewest micro-batches per rank that could possibly hold the samples' tokens."""
    if tokens.size == 0:
        return requested
    by_volume = -(-int(tokens.sum()) // (dp * max_tokens))
    # samples longer than half a micro-batch can never share one
    halves = int(np.count_nonzero(2 * tokens > max_tokens))
    by_large = -(-halves // dp)
    return max(requested, by_volume, by_large)


class PackState:
    """Mutable working state of one balancing run (plain lists: faster than numpy per item).

    Per sample: ``rank_of``, ``bin_of`` (its micro-batch); per rank and micro-batch:
    ``bin_tokens``, ``bin_cost``; per rank: ``rank_cost``. The LPT pass fills it, refinement and
    the re-pack improve it in place.
    """

    def __init__(self, n: int, dp: int, m: int, max_tokens: int) -> None:
        self.dp, self.m, self.cap = dp, m, max_tokens
        self.rank_of = [0] * n
        self.bin_of = [0] * n
        self.bin_tokens = [[0] * m for _ in range(dp)]
        self.bin_cost = [[0.0] * m for _ in range(dp)]
        self.rank_cost = [0.0] * dp


def lpt_assign(
    order: list[int], tok: list[int], cost: list[float], dp: int, m: int, cap: int,
    spread: float = 0.0,
) -> PackState | None:
    """LPT over ranks with micro-batch room; LPT over a rank's micro-batches. None if stuck.

    A rank's load is its cost plus ``spread`` times its most expensive micro-batch: with
    pipeline parallelism over ``p`` stages, ``spread = p - 1`` makes it the rank's estimated
    1F1B makespan (:func:`~mdata.balance.pipeline.pipeline_cost`, times ``p``).
    """
    st = PackState(len(tok), dp, m, cap)
    rank_of, bin_of, bin_tokens, bin_cost, rank_cost = (
        st.rank_of, st.bin_of, st.bin_tokens, st.bin_cost, st.rank_cost
    )
    room = [cap] * dp  # largest free space among each rank's micro-batches
    top = [0.0] * dp  # each rank's most expensive micro-batch
    heap = [(0.0, r) for r in range(dp)]
    # Ranks without room for the current sample wait here, largest room first, until a sample
    # small enough comes; their load and room cannot change meanwhile. This keeps a near-full
    # batch O(n log dp) instead of rescanning full ranks for every sample.
    parked: list[tuple[int, float, int]] = []
    pop, push = heapq.heappop, heapq.heappush
    # many micro-batches: each rank's as a heap of (cost, index), popped until one has room (the
    # same choice as a scan for the cheapest with room, ties to the lowest index, in O(log m))
    bins = [[(0.0, k) for k in range(m)] for _ in range(dp)] if m > _SCAN_UP_TO else None
    aside: list[tuple[float, int]] = []
    for i in order:
        t = tok[i]
        while parked and -parked[0][0] >= t:
            _, load, r = pop(parked)
            push(heap, (load, r))
        while True:
            if not heap:
                return None  # no rank has a micro-batch with room for this sample
            load, r = pop(heap)
            if room[r] >= t:
                break
            push(parked, (-room[r], load, r))
        bt = bin_tokens[r]
        if m == 1:
            b = 0
        elif bins is not None:
            heap_r, limit = bins[r], cap - t
            while True:
                entry = pop(heap_r)
                if bt[entry[1]] <= limit:
                    break
                aside.append(entry)
            b = entry[1]
            for entry in aside:
                push(heap_r, entry)
            aside.clear()
            push(heap_r, (bin_cost[r][b] + cost[i], b))
        else:
            bc = bin_cost[r]
            limit = cap - t
            b = -1
            best = float("inf")
            for k in range(m):
                if bt[k] <= limit and bc[k] < best:
                    best = bc[k]
                    b = k
        c = cost[i]
        filled_least = bt[b] == cap - room[r]  # the rank's emptiest micro-batch: its room shrinks
        bt[b] += t
        bin_cost[r][b] += c
        rank_cost[r] += c
        if filled_least:
            room[r] = cap - min(bt)
        if bin_cost[r][b] > top[r]:
            top[r] = bin_cost[r][b]
        push(heap, (rank_cost[r] + spread * top[r], r))
        rank_of[i] = r
        bin_of[i] = b
    return st
