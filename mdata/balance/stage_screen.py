"""The refinement's swap screen: the least estimated swaps between two ranks, without every pair.

Why: balancing by stage (:mod:`mdata.balance.stage_balance`) screens the swaps of the slowest
rank's samples with a partner's on each rank's busiest stage, and keeps the ``k`` least
estimates. At DP 16 a rank holds ~530 samples of a 8.5k-sample step, so a partner's grid holds
~280k pairs; building it four times a round was most of the refinement's time. When both ranks'
busiest stage is the same stage ``b`` (nearly always: the vision encoder's stage 0, or the
language model's stages when they are even), a swap's estimate depends only on the cost it moves:

    ``max(L1 - u + v, L2 + u - v) = mid + |d - c|``, ``d = u - v``, ``c = (L1 - L2) / 2``

(``u``, ``v``: the two samples' cost on ``b``; ``L1``, ``L2``: the ranks' loads on it;
``mid = (L1 + L2) / 2``). So the least estimates are the pairs whose ``d`` lies nearest ``c``: with
the partner's costs sorted, each of the slowest rank's samples finds its band ``|d - c| <= delta``
by binary search, and only pairs in the band are estimated, with the same arithmetic as the whole
grid. ``delta`` starts at the ``k``-th least distance of a row's nearest pair and doubles until
``k`` feasible pairs in the band lie below what any pair outside it can reach, so the pairs kept
are those the whole grid keeps (among equal estimates, the lower flat index first). Different
busiest stages: the whole grid, as before.
"""

from __future__ import annotations

import numpy as np

__all__ = ["least_swaps"]

#: Slack for rounding (relative to the loads' and costs' magnitude) between the band's bound and
#: the estimates, which are computed in a different order of operations.
_ROUNDING = 1e-12


def least_swaps(load1: np.ndarray, load2: np.ndarray, sx: np.ndarray, sy: np.ndarray,
                tx: np.ndarray, ty: np.ndarray, free1: np.ndarray, free2: np.ndarray,
                k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``k`` least estimated feasible swaps of ``x`` (slowest rank) with ``y`` (its partner).

    ``load1``/``load2``: the ranks' per-stage busy times; ``sx``/``sy``: the samples' stage costs;
    ``tx``/``ty``: their tokens; ``free1``/``free2``: the free tokens of each sample's own
    micro-batch. A swap is feasible when both micro-batches keep within the token limit. Its
    estimate: the larger of the two ranks' busiest-stage loads after it. Returns ``(a, b, est)``:
    indices into ``x`` and ``y`` and the estimates, in increasing estimate (ties: ``a``, then
    ``b``); infeasible swaps are never returned.
    """
    if sx.shape[0] == 0 or sy.shape[0] == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, np.zeros(0)
    b1, b2 = int(np.argmax(load1)), int(np.argmax(load2))
    if b1 != b2:
        return _whole_grid(load1[b1], load2[b2], sx[:, b1], sy[:, b1], sx[:, b2], sy[:, b2],
                           tx, ty, free1, free2, k)
    u, v = sx[:, b1], sy[:, b1]
    l1, l2 = float(load1[b1]), float(load2[b2])
    c, mid = (l1 - l2) / 2.0, (l1 + l2) / 2.0
    tol = _ROUNDING * (abs(l1) + abs(l2) + float(np.abs(u).max()) + float(np.abs(v).max()))
    by_v = np.argsort(v, kind="stable")
    vs = v[by_v]
    target = u - c  # the partner's cost that balances the two loads exactly
    j = np.searchsorted(vs, target)
    nearest = np.minimum(np.abs(vs[np.minimum(j, vs.size - 1)] - target),
                         np.abs(vs[np.maximum(j - 1, 0)] - target))
    delta = float(np.partition(nearest, k - 1)[k - 1]) if nearest.size > k else float(nearest.max())
    delta = max(delta, tol)
    everything = u.size * v.size
    while True:
        lo = np.searchsorted(vs, target - delta - tol, side="left")
        hi = np.searchsorted(vs, target + delta + tol, side="right")
        count = hi - lo
        total = int(count.sum())
        a = np.repeat(np.arange(u.size), count)
        within = np.arange(total) - np.repeat(np.cumsum(count) - count, count)
        b = by_v[np.repeat(lo, count) + within]
        a, b, est = _estimated(a, b, l1, l2, u, v, u, v, tx, ty, free1, free2, k, v.size)
        if total == everything or (est.size == k and est[-1] < mid + delta - tol):
            return a, b, est
        delta = 2.0 * delta if delta > 0 else 1.0


def _whole_grid(l1: float, l2: float, u1: np.ndarray, v1: np.ndarray, u2: np.ndarray,
                v2: np.ndarray, tx: np.ndarray, ty: np.ndarray, free1: np.ndarray,
                free2: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair estimated (the ranks' busiest stages differ)."""
    a = np.repeat(np.arange(u1.size), v1.size)
    b = np.tile(np.arange(v1.size), u1.size)
    return _estimated(a, b, l1, l2, u1, v1, u2, v2, tx, ty, free1, free2, k, v1.size)


def _estimated(a: np.ndarray, b: np.ndarray, l1: float, l2: float, u1: np.ndarray,
               v1: np.ndarray, u2: np.ndarray, v2: np.ndarray, tx: np.ndarray, ty: np.ndarray,
               free1: np.ndarray, free2: np.ndarray, k: int,
               ny: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``k`` least estimates among the pairs ``(a, b)`` that are feasible, sorted."""
    grow = ty[b] - tx[a]  # token change of the slowest rank's micro-batch
    ok = (grow <= free1[a]) & (-grow <= free2[b])
    a, b = a[ok], b[ok]
    est = np.maximum(l1 - u1[a] + v1[b], l2 + u2[a] - v2[b])
    if est.size > k:
        keep = np.argpartition(est, k - 1)[:k]
        bound = est[keep].max()
        keep = np.flatnonzero(est <= bound)  # every tie of the k-th, so the order decides
        a, b, est = a[keep], b[keep], est[keep]
    first = np.lexsort((a * ny + b, est))[:k]
    return a[first], b[first], est[first]
