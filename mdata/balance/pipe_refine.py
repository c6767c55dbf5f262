"""Pipeline refinement: moves and swaps between DP ranks that even out their 1F1B makespans.

Why: with pipeline parallelism a rank's step is its 1F1B makespan, about ``(W + (p - 1) x top)
/ p`` for a rank of total cost ``W`` whose most expensive micro-batch costs ``top``
(:func:`~mdata.balance.pipeline.pipeline_cost`). A rank holding one very expensive sample (a
whole book at full context: one micro-batch by itself) has a large ``top`` whatever else it
holds, so equal rank totals leave it the slowest pipeline by far. Balancing ``W + (p - 1) top``
instead gives such a rank less other work and its neighbours more, which is what shortens the
step. Like :func:`~mdata.balance.refine.refine`, each round tries the best single move and
pairwise swap between the rank of the largest load and its few least loaded partners (all
candidates at once with numpy), keeping every micro-batch within ``max_tokens``, and applies the
one that lowers the larger of the two loads most.
"""

from __future__ import annotations

import numpy as np

from mdata.balance.lpt import PackState
from mdata.balance.pipeline import one_f_one_b_makespan, order_micro_batches

__all__ = ["pipeline_lower_bound", "refine_pipeline"]

#: How many of the least-loaded ranks each round tries against the most loaded one.
_PARTNERS = 4


def pipeline_lower_bound(costs: np.ndarray, dp: int, stages: int) -> float:
    """No assignment's slowest 1F1B makespan is below this (in cost units).

    Some rank does ``total / dp`` of work spread over ``stages`` stages; the most expensive
    sample passes every stage forward and backward, one after the other.
    """
    costs = np.asarray(costs, dtype=np.float64)
    if costs.size == 0:
        return 0.0
    return float(max(costs.sum() / (dp * stages), costs.max()))


def _top_without(bins: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Per index in ``k``: the largest of ``bins`` (one rank's micro-batch costs) except ``k``."""
    if bins.size == 1:
        return np.zeros(k.shape)
    two = np.argsort(bins)[-2:]
    return np.where(k == two[1], bins[two[0]], bins[two[1]])


def _spans(bin_cost: np.ndarray, stages: int) -> np.ndarray:
    """Each row's 1F1B makespan in its best (insertion) order."""
    order = order_micro_batches(bin_cost, stages)
    return one_f_one_b_makespan(np.take_along_axis(bin_cost, order, axis=1), stages)


def refine_pipeline(st: PackState, tokens: np.ndarray, costs: np.ndarray, stages: int,
                    target: float) -> None:
    """Lower the largest ordered 1F1B makespan of a rank by moves and swaps (in place).

    Candidates are ranked by the estimate ``rank cost + (p - 1) x most expensive micro-batch``;
    the best one is applied only if the two ranks' exact makespans (in their best order) both
    end below the slowest rank's, so the result is never slower than the start.
    """
    dp, cap, m = st.dp, st.cap, st.m
    if dp < 2 or stages < 2 or m < 2:
        return
    spread = float(stages - 1)
    rank_of = np.asarray(st.rank_of, dtype=np.int64)
    bin_of = np.asarray(st.bin_of, dtype=np.int64)
    bin_tokens = np.asarray(st.bin_tokens, dtype=np.int64)
    bin_cost = np.asarray(st.bin_cost, dtype=np.float64)
    rank_cost = bin_cost.sum(axis=1)
    load = _spans(bin_cost, stages)
    members: list[list[int]] = [[] for _ in range(dp)]
    for i, r in enumerate(st.rank_of):
        members[r].append(i)
    partners = min(_PARTNERS, dp - 1)
    for _ in range(dp + 16):
        r1 = int(np.argmax(load))
        l1 = float(load[r1])
        if l1 <= target:
            break
        low = np.argpartition(load, partners)[: partners + 1]
        low = low[low != r1][:partners]
        items1 = np.asarray(members[r1], dtype=np.int64)
        t1, k1, b1 = tokens[items1], costs[items1], bin_of[items1]
        free1 = cap - bin_tokens[r1, b1]
        w1 = rank_cost[r1] - k1  # r1's cost without each item
        own1 = bin_cost[r1, b1] - k1  # each item's micro-batch without it
        rest1 = _top_without(bin_cost[r1], b1)  # r1's top among its other micro-batches
        best_value, best = (rank_cost[r1] + spread * bin_cost[r1].max()) * (1 - 1e-12), None
        for r2 in low.tolist():
            if load[r2] >= l1:
                continue
            c2 = bin_cost[r2]
            # move: each item into r2's cheapest micro-batch with room for it
            fits = bin_tokens[r2][None, :] + t1[:, None] <= cap
            dest = np.argmin(np.where(fits, c2[None, :], np.inf), axis=1)
            grown = np.maximum(c2.max(), c2[dest] + k1)
            value = np.maximum(w1 + spread * np.maximum(own1, rest1),
                               rank_cost[r2] + k1 + spread * grown)
            value[~fits.any(axis=1)] = np.inf
            j = int(np.argmin(value))
            if value[j] < best_value:
                best_value, best = float(value[j]), (r2, int(items1[j]), -1, int(dest[j]))
            items2 = np.asarray(members[r2], dtype=np.int64)
            if items2.size == 0:
                continue
            t2, k2, b2 = tokens[items2], costs[items2], bin_of[items2]
            free2 = cap - bin_tokens[r2, b2]
            delta = k1[:, None] - k2[None, :]  # cost leaving r1
            new1 = np.maximum(own1[:, None] + k2[None, :], rest1[:, None])
            new2 = np.maximum((c2[b2] - k2)[None, :] + k1[:, None], _top_without(c2, b2)[None, :])
            value = np.maximum(rank_cost[r1] - delta + spread * new1,
                               rank_cost[r2] + delta + spread * new2)
            grow = t2[None, :] - t1[:, None]  # token change of r1's micro-batch
            ok = (grow <= free1[:, None]) & (-grow <= free2[None, :])
            value = np.where(ok, value, np.inf)
            flat = int(np.argmin(value))
            a, b = divmod(flat, items2.size)
            if value[a, b] < best_value:
                best_value, best = float(value[a, b]), (r2, int(items1[a]), int(items2[b]), -1)
        if best is None:
            break
        r2, x, y, dest = best
        bx = int(bin_of[x])
        by = dest if y < 0 else int(bin_of[y])
        moves = [(x, r1, bx, r2, by)] + ([] if y < 0 else [(y, r2, by, r1, bx)])
        trial = bin_cost[[r1, r2]].copy()
        for i, r_from, b_from, r_to, b_to in moves:
            trial[0 if r_from == r1 else 1, b_from] -= costs[i]
            trial[0 if r_to == r1 else 1, b_to] += costs[i]
        spans = _spans(trial, stages)
        if spans.max() >= l1 * (1 - 1e-12):
            break
        for i, r_from, b_from, r_to, b_to in moves:
            t, c = int(tokens[i]), float(costs[i])
            bin_tokens[r_from, b_from] -= t
            bin_tokens[r_to, b_to] += t
            bin_cost[r_from, b_from] -= c
            bin_cost[r_to, b_to] += c
            rank_of[i], bin_of[i] = r_to, b_to
            members[r_from].remove(i)
            members[r_to].append(i)
        rank_cost[[r1, r2]] = bin_cost[[r1, r2]].sum(axis=1)
        load[[r1, r2]] = spans
    st.rank_of = rank_of.tolist()
    st.bin_of = bin_of.tolist()
    st.bin_tokens = bin_tokens.tolist()
    st.bin_cost = bin_cost.tolist()
    st.rank_cost = rank_cost.tolist()
