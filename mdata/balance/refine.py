"""Refinement: moves and swaps between the most and least loaded ranks until the makespan is tight.

Why: LPT can leave the most loaded rank well above the lower bound (up to 4/3 of the optimum),
and on a synchronous step every rank waits for that one. Each round tries, against the most loaded
rank, the best single move and pairwise swap with its few least loaded partners (all pairs at once
with numpy) that keep every micro-batch within ``max_tokens``, and applies the one that lowers the
larger of the two loads most. It stops when nothing improves or the makespan reaches ``target``.
"""

from __future__ import annotations

import numpy as np

from mdata.balance.lpt import PackState

__all__ = ["refine"]

#: How many of the least-loaded ranks the refinement tries against the most loaded one per round.
_REFINE_PARTNERS = 4


def refine(st: PackState, tokens: np.ndarray, costs: np.ndarray, target: float) -> None:
    """Moves and swaps between the most loaded rank and the least loaded ones (in place)."""
    dp, cap = st.dp, st.cap
    if dp < 2:
        return
    rank_of = np.asarray(st.rank_of, dtype=np.int64)
    bin_of = np.asarray(st.bin_of, dtype=np.int64)
    bin_tokens = np.asarray(st.bin_tokens, dtype=np.int64)
    bin_cost = np.asarray(st.bin_cost, dtype=np.float64)
    rank_cost = np.asarray(st.rank_cost, dtype=np.float64)
    members: list[list[int]] = [[] for _ in range(dp)]
    for i, r in enumerate(st.rank_of):
        members[r].append(i)
    partners = min(_REFINE_PARTNERS, dp - 1)
    max_rounds = 4 * dp + 64
    for _ in range(max_rounds):
        r1 = int(np.argmax(rank_cost))
        c1 = float(rank_cost[r1])
        if c1 <= target:
            break
        low = np.argpartition(rank_cost, partners)[: partners + 1]
        low = low[low != r1][:partners]
        items1 = np.asarray(members[r1], dtype=np.int64)
        t1, k1, b1 = tokens[items1], costs[items1], bin_of[items1]
        free1 = cap - bin_tokens[r1, b1]  # free space in each item's own micro-batch
        best_value, best = c1 * (1 - 1e-12), None
        for r2 in low.tolist():
            c2 = float(rank_cost[r2])
            if c2 >= c1:
                continue
            # move one item of r1 to r2's micro-batch with the most room
            room2 = cap - int(bin_tokens[r2].min())
            value = np.maximum(c1 - k1, c2 + k1)
            value[t1 > room2] = np.inf
            j = int(np.argmin(value))
            if value[j] < best_value:
                best_value, best = float(value[j]), ("move", r2, int(items1[j]), -1)
            items2 = np.asarray(members[r2], dtype=np.int64)
            if items2.size == 0:
                continue
            t2, k2, b2 = tokens[items2], costs[items2], bin_of[items2]
            free2 = cap - bin_tokens[r2, b2]
            delta = k1[:, None] - k2[None, :]
            value = np.maximum(c1 - delta, c2 + delta)
            grow = t2[None, :] - t1[:, None]  # token change of r1's micro-batch
            ok = (delta > 0) & (grow <= free1[:, None]) & (-grow <= free2[None, :])
            value = np.where(ok, value, np.inf)
            flat = int(np.argmin(value))
            a, b = divmod(flat, items2.size)
            if value[a, b] < best_value:
                best_value, best = float(value[a, b]), ("swap", r2, int(items1[a]), int(items2[b]))
        if best is None:
            break
        kind, r2, x, y = best
        bx = int(bin_of[x])
        if kind == "move":
            fits = np.flatnonzero(bin_tokens[r2] + tokens[x] <= cap)
            by = int(fits[np.argmin(bin_cost[r2, fits])])
            _relocate(x, r1, bx, r2, by, tokens, costs, rank_of, bin_of, bin_tokens, bin_cost,
                      rank_cost, members)
        else:
            by = int(bin_of[y])
            _relocate(x, r1, bx, r2, by, tokens, costs, rank_of, bin_of, bin_tokens, bin_cost,
                      rank_cost, members)
            _relocate(y, r2, by, r1, bx, tokens, costs, rank_of, bin_of, bin_tokens, bin_cost,
                      rank_cost, members)
    st.rank_of = rank_of.tolist()
    st.bin_of = bin_of.tolist()
    st.bin_tokens = bin_tokens.tolist()
    st.bin_cost = bin_cost.tolist()
    st.rank_cost = rank_cost.tolist()


def _relocate(i, r_from, b_from, r_to, b_to, tokens, costs, rank_of, bin_of, bin_tokens,
              bin_cost, rank_cost, members) -> None:
    t, c = int(tokens[i]), float(costs[i])
    bin_tokens[r_from, b_from] -= t
    bin_tokens[r_to, b_to] += t
    bin_cost[r_from, b_from] -= c
    bin_cost[r_to, b_to] += c
    rank_cost[r_from] -= c
    rank_cost[r_to] += c
    rank_of[i] = r_to
    bin_of[i] = b_to
    members[r_from].remove(i)
    members[r_to].append(i)
