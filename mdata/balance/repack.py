"""Per-rank micro-batch re-pack: even out one rank's micro-batches under ``max_tokens``.

Why: refinement balances ranks, but its moves and swaps can leave one micro-batch of a rank much
costlier than its others, and with pipeline parallelism the slowest micro-batch paces the rank.
Each rank's samples are re-packed LPT-style over its micro-batches, kept only where that lowers
its most expensive micro-batch (and every sample still fits).

Then no micro-batch is left empty where its rank holds enough samples to fill every one
(:func:`fill_empty_micro_batches`): refinement's moves can take the only sample out of one, and an
empty micro-batch is a pass that data-parallel and pipeline schedules must still run in lockstep
(trainers would pad it). Moving a rank's cheapest sample out of its costliest micro-batch that
holds two or more into an empty one never raises the rank's costliest micro-batch nor changes its
total, and an empty micro-batch always has room for one sample.
"""

from __future__ import annotations

from heapq import heappop, heappush

from mdata.balance.lpt import _SCAN_UP_TO, PackState

__all__ = ["repack_micro_batches", "fill_empty_micro_batches"]


def repack_micro_batches(
    st: PackState, order: list[int], tok: list[int], cost: list[float]
) -> None:
    """Re-pack each rank's samples LPT-style over its micro-batches where that evens them out."""
    dp, m, cap = st.dp, st.m, st.cap
    if m == 1:
        return
    _repack(st, order, tok, cost)
    fill_empty_micro_batches(st, tok, cost)


def _repack(st: PackState, order: list[int], tok: list[int], cost: list[float]) -> None:
    dp, m, cap = st.dp, st.m, st.cap
    new_tokens = [[0] * m for _ in range(dp)]
    new_cost = [[0.0] * m for _ in range(dp)]
    new_bin = [0] * len(tok)
    failed = [False] * dp
    rank_of = st.rank_of
    # many micro-batches: a heap of (cost, index) per rank, as in lpt_assign (the same choices)
    bins = [[(0.0, k) for k in range(m)] for _ in range(dp)] if m > _SCAN_UP_TO else None
    aside: list[tuple[float, int]] = []
    for i in order:
        r = rank_of[i]
        if failed[r]:
            continue
        bt, bc = new_tokens[r], new_cost[r]
        limit = cap - tok[i]
        b, best = -1, float("inf")
        if bins is not None:
            heap_r = bins[r]
            while heap_r:
                entry = heappop(heap_r)
                if bt[entry[1]] <= limit:
                    b = entry[1]
                    heappush(heap_r, (bc[b] + cost[i], b))
                    break
                aside.append(entry)
            for entry in aside:
                heappush(heap_r, entry)
            aside.clear()
        else:
            for k in range(m):
                if bt[k] <= limit and bc[k] < best:
                    best, b = bc[k], k
        if b < 0:
            failed[r] = True
            continue
        bt[b] += tok[i]
        bc[b] += cost[i]
        new_bin[i] = b
    better = [
        not failed[r] and max(new_cost[r]) < max(st.bin_cost[r]) for r in range(dp)
    ]
    for i, r in enumerate(rank_of):
        if better[r]:
            st.bin_of[i] = new_bin[i]
    for r in range(dp):
        if better[r]:
            st.bin_tokens[r] = new_tokens[r]
            st.bin_cost[r] = new_cost[r]


def fill_empty_micro_batches(st: PackState, tok: list[int], cost: list[float]) -> None:
    """Give every empty micro-batch one sample from its own rank, where the rank has one to spare.

    The donor is the rank's costliest micro-batch holding two or more samples, the sample moved its
    cheapest (ties: the lowest sample index, so the result stays a pure function of the inputs).
    Ranks with fewer samples than micro-batches keep ``m - samples`` empty ones.
    """
    m = st.m
    # an empty micro-batch holds no tokens: only ranks with a zero-token one need a look (rare)
    suspects = {r for r in range(st.dp) if 0 in st.bin_tokens[r]}
    if not suspects:
        return
    members: dict[tuple[int, int], list[int]] = {}
    for i, (r, b) in enumerate(zip(st.rank_of, st.bin_of)):
        if r in suspects:
            members.setdefault((r, b), []).append(i)
    for r in sorted(suspects):
        empty = [b for b in range(m) if (r, b) not in members]
        for e in empty:
            donors = [b for b in range(m) if len(members.get((r, b), ())) >= 2]
            if not donors:
                break
            d = max(donors, key=lambda b: (st.bin_cost[r][b], -b))
            i = min(members[(r, d)], key=lambda j: (cost[j], j))
            members[(r, d)].remove(i)
            members[(r, e)] = [i]
            st.bin_of[i] = e
            st.bin_tokens[r][d] -= tok[i]
            st.bin_cost[r][d] -= cost[i]
            st.bin_tokens[r][e] = tok[i]
            st.bin_cost[r][e] = cost[i]
