"""The refinement's swap screen: the least estimated swaps between two ranks, without every pair.

Why: balancing by stage (:mod:`mdata.balance.stage_balance`) screens the swaps of the slowest
rank's samples with a partner's on each rank's busiest stage and keeps the ``k`` least
estimates. At DP 16 a rank holds ~530 samples of a 8.5k-sample step, so a partner's grid holds
~280k pairs; building it four times a round was most of the refinement's time. When both ranks'
busiest stage is the same stage ``b`` (nearly always: the vision encoder's stage 0, or the
language model's stages), a swap's estimate depends only on the cost it moves:

    ``max(L1 - u + v, L2 + u - v) = mid + |d - c|``, ``d = u - v``, ``c = (L1 - L2) / 2``

(``u``, ``v``: the two samples' cost on ``b``; ``L1``, ``L2``: the ranks' loads on it;
``mid = (L1 + L2) / 2``). So the least estimates are the pairs whose ``d`` lies nearest ``c``:
with the partner's costs sorted, each of the slowest rank's samples finds its band
``|d - c| <= delta`` by binary search, and only pairs in the band are estimated (the same
arithmetic as the whole grid). ``delta`` doubles until ``k`` rows have a feasible pair in the
band below what any pair outside it can reach. Then the screen's bound, the ``k``-th least row
minimum (:func:`_least`), is known exactly, every pair under it lies in the band, and the pairs
kept, and their order among equal estimates, are those :func:`_least` keeps over the whole grid:
the same plans, bit for bit. Different busiest stages, few rows, or a band over a fifth of
the pairs: the whole grid, as before.
"""

from __future__ import annotations

import numpy as np

__all__ = ["least_swaps"]

#: Above this share of all pairs a band is not gathered: the whole grid (broadcast, no index
#: arrays) costs less, with the same result.
_BAND_SHARE = 0.2

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
    indices into ``x`` and ``y`` and the estimates, in increasing estimate, as the whole grid's
    screen orders them; infeasible swaps are never returned.
    """
    nx, ny = sx.shape[0], sy.shape[0]
    if nx == 0 or ny == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, np.zeros(0)
    b1, b2 = int(np.argmax(load1)), int(np.argmax(load2))
    if b1 != b2 or nx <= k:
        return _whole_grid(load1, load2, b1, b2, sx, sy, tx, ty, free1, free2, k)
    u, v = sx[:, b1], sy[:, b1]
    l1, l2 = float(load1[b1]), float(load2[b2])
    c, mid = (l1 - l2) / 2.0, (l1 + l2) / 2.0
    tol = _ROUNDING * (abs(l1) + abs(l2) + float(np.abs(u).max()) + float(np.abs(v).max()))
    by_v = np.argsort(v, kind="stable")
    vs = v[by_v]
    target = u - c  # the partner's cost that balances the two loads exactly
    j = np.searchsorted(vs, target)
    nearest = np.minimum(np.abs(vs[np.minimum(j, ny - 1)] - target),
                         np.abs(vs[np.maximum(j - 1, 0)] - target))
    delta = max(float(np.partition(nearest, k - 1)[k - 1]), tol)
    while True:
        lo = np.searchsorted(vs, target - delta - tol, side="left")
        hi = np.searchsorted(vs, target + delta + tol, side="right")
        count = hi - lo
        total = int(count.sum())
        if total > _BAND_SHARE * nx * ny:  # gathering the band costs more than the grid
            return _whole_grid(load1, load2, b1, b2, sx, sy, tx, ty, free1, free2, k)
        first = np.cumsum(count) - count  # where each row's pairs start (rows are contiguous)
        a = np.repeat(np.arange(nx), count)
        b = by_v[np.repeat(lo, count) + np.arange(total) - np.repeat(first, count)]
        est = np.maximum(l1 - u[a] + v[b], l2 + u[a] - v[b])
        grow = ty[b] - tx[a]
        est[~((grow <= free1[a]) & (-grow <= free2[b]))] = np.inf
        row_min = np.full(nx, np.inf)
        some = count > 0
        if total:
            row_min[some] = np.minimum.reduceat(est, first[some])
        exact = row_min[row_min < mid + delta - tol]  # no pair outside the band is lower
        if exact.size >= k:
            bound = np.partition(exact, k - 1)[k - 1]  # _least's: the k-th least row minimum
            flat = a * ny + b
            under = np.flatnonzero(est <= bound)
            near = under[np.argsort(flat[under])]  # every pair under the bound, in flat order
            return _ordered(_pick(flat[near], est[near], k, nx * ny), est, flat, near, ny)
        delta = 2.0 * delta if delta > 0 else 1.0  # (0 only if every load and cost is 0)


def _pick(flat_near: np.ndarray, est_near: np.ndarray, k: int,
          size: int) -> np.ndarray:
    """Positions (into the ``near`` pairs) that :func:`_least` keeps given those pairs."""
    if flat_near.size < size and flat_near.size > k:
        return np.argpartition(est_near, k)[:k]
    return np.arange(flat_near.size)


def _ordered(keep: np.ndarray, est: np.ndarray, flat: np.ndarray, near: np.ndarray,
             ny: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kept pairs by estimate, ties in the order kept (as the screen sorts them stably)."""
    chosen = near[keep]
    chosen = chosen[np.argsort(est[chosen], kind="stable")]
    a, b = np.divmod(flat[chosen], ny)
    return a, b, est[chosen]


def _whole_grid(load1: np.ndarray, load2: np.ndarray, b1: int, b2: int, sx: np.ndarray,
                sy: np.ndarray, tx: np.ndarray, ty: np.ndarray, free1: np.ndarray,
                free2: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pair estimated (different busiest stages, few rows, or a band that grew to all)."""
    est = np.maximum(load1[b1] - sx[:, b1, None] + sy[None, :, b1],
                     load2[b2] + sx[:, b2, None] - sy[None, :, b2])
    grow = ty[None, :] - tx[:, None]
    est = np.where((grow <= free1[:, None]) & (-grow <= free2[None, :]), est, np.inf)
    flat = _least(est, k)
    est = est.ravel()
    flat = flat[np.argsort(est[flat], kind="stable")]
    flat = flat[np.isfinite(est[flat])]
    a, b = np.divmod(flat, sy.shape[0])
    return a, b, est[flat]


def _least(grid: np.ndarray, k: int) -> np.ndarray:
    """Flat indices of the ``k`` least values of ``grid`` (rows x columns), as ``argpartition``
    over the whole grid finds them, without partitioning it all: the ``k``-th least row
    minimum bounds the ``k``-th least value (those rows' minima are ``k`` distinct values), so
    only values up to it can be among them; usually a small share of a rank pair's swaps."""
    flat = grid.ravel()
    if flat.size <= k:
        return np.arange(flat.size)
    if grid.shape[0] > k:
        bound = np.partition(grid.min(axis=1), k - 1)[k - 1]
        near = np.flatnonzero(flat <= bound)
        if near.size < flat.size:
            return near[np.argpartition(flat[near], k)[:k]] if near.size > k else near
    return np.argpartition(flat, k)[:k]
