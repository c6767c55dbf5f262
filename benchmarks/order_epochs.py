"""Tiny sources: what starting an epoch costs the Planner's source orders.

The ``sources306`` regime (``benchmarks/e2e_many_sources.py``) cuts five sources into 306
pieces of 4-5 rows; each piece starts an epoch every 4-5 draws, about 3,100 epochs a step at
8,192 GPUs (~14k draws), and every epoch permutes its chunks and shuffles its window with a
generator seeded by ``(seed, crc32(name), epoch, ...)`` (:mod:`mdata.order`). Here 306 sources of
4-5 rows are read as the Planner's apportioning reads them (``take``, ``last_window`` and
``window_span`` of every source drawn, Zipf weights, 14,000 draws a step) and ``SourceOrder`` is
timed alone, CPU seconds, median over steps:

* **mdata**: the orders as they are (:mod:`mdata.seeded_perm`: seeds without ``SeedSequence``,
  batched over consecutive epochs; a one-chunk source's epoch built once);
* **baseline**: the same orders with every permutation drawn by numpy's own seeded generator,
  ``Generator(PCG64(entropy)).permutation(n)``, as every permutation was drawn before
  2026-12-07 (the epoch built once stays: this isolates the seeding).

Both sides run interleaved, step by step, and must draw the same rows (checked).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from benchmarks.harness import figure
from mdata.order import SourceOrder

__all__ = ["order_figures"]


class _NumpySeeded:
    """A permutation source as :class:`mdata.seeded_perm.EpochPermutations` is called, drawing
    from a freshly seeded numpy generator every time."""

    def __call__(self, entropy: tuple[int, ...], at: int, n: int) -> np.ndarray:
        return np.random.Generator(np.random.PCG64(list(entropy))).permutation(n)


def _orders(rows: np.ndarray, numpy_seeded: bool) -> list[SourceOrder]:
    orders = [SourceOrder([int(r)], 64, 0, f"piece.{i:03d}", 4) for i, r in enumerate(rows)]
    if numpy_seeded:
        for order in orders:
            order._chunk_perms = order._row_perms = _NumpySeeded()
    return orders


def _step(orders: list[SourceOrder], cursors: np.ndarray, counts: np.ndarray) -> tuple[float, bytes]:
    began = time.process_time()
    drawn = []
    for i in np.flatnonzero(counts).tolist():
        taken = orders[i].take(int(cursors[i]), int(counts[i]))
        orders[i].last_window()
        orders[i].window_span(int(cursors[i] + counts[i]))
        drawn.append(taken.rows)
    spent = time.process_time() - began
    return spent, np.concatenate(drawn).tobytes()


def order_figures(quick: bool) -> dict[str, object]:
    """``planner.order_tiny_sources_ms_per_step``: ``SourceOrder`` time per step, both sides."""
    rng = np.random.default_rng(0)
    sources, draws, steps = 306, 14_000, 6 if quick else 20
    rows = rng.integers(4, 6, sources)
    weights = 1.0 / (1 + rng.permutation(sources))
    weights /= weights.sum()
    ours, base = _orders(rows, False), _orders(rows, True)
    cursors = np.zeros(sources, np.int64)
    mine, theirs, epochs = [], [], 0
    for _ in range(steps):
        counts = rng.multinomial(draws, weights)
        a, got = _step(ours, cursors, counts)
        b, want = _step(base, cursors, counts)
        if got != want:
            raise AssertionError("the orders drew different rows than numpy-seeded ones")
        mine.append(a)
        theirs.append(b)
        epochs += int((((cursors + counts) // rows) - cursors // rows).sum())
        cursors += counts
    skip = 2  # the first steps start every source's first epochs
    ms, base_ms = (1e3 * statistics.median(x[skip:]) for x in (mine, theirs))
    return {"planner.order_tiny_sources_ms_per_step": figure(
        ms, base_ms, unit="ms", goal="cheap next to a step's balancing",
        note=(f"{sources} sources of 4-5 rows, {draws:,} Zipf-weighted draws a step (about "
              f"{epochs // steps:,} epochs a step), SourceOrder alone, CPU, median of "
              f"{steps - skip} steps; baseline: every permutation from numpy's own seeded "
              f"generator (as before 2026-12-07), the same rows"))}
