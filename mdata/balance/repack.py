"""Per-rank micro-batch re-pack: even out one rank's micro-batches under ``max_tokens``.

Why: refinement balances ranks, but its moves and swaps can leave one micro-batch of a rank much
costlier than its others, and with pipeline parallelism the slowest micro-batch paces the rank.
Each rank's samples are re-packed LPT-style over its micro-batches, kept only where that lowers
its most expensive micro-batch (and every sample still fits).
"""

from __future__ import annotations

from mdata.balance.lpt import PackState

__all__ = ["repack_micro_batches"]


def repack_micro_batches(
    st: PackState, order: list[int], tok: list[int], cost: list[float]
) -> None:
    """Re-pack each rank's samples LPT-style over its micro-batches where that evens them out."""
    dp, m, cap = st.dp, st.m, st.cap
    if m == 1:
        return
    new_tokens = [[0] * m for _ in range(dp)]
    new_cost = [[0.0] * m for _ in range(dp)]
    new_bin = [0] * len(tok)
    failed = [False] * dp
    rank_of = st.rank_of
    for i in order:
        r = rank_of[i]
        if failed[r]:
            continue
        bt, bc = new_tokens[r], new_cost[r]
        limit = cap - tok[i]
        b, best = -1, float("inf")
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
