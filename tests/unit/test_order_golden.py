"""Every source order is bit for bit what it was before its epochs got cheap (2026-12-07).

The order is part of exact resume: a checkpoint stores only cursors, and a resumed job must draw
the same rows. These digests were computed by ``mdata/order.py`` at commit df52482, before
tiny sources' epochs were built once and their generators seeded without ``SeedSequence``
(:mod:`mdata.seeded_perm`): sources of one row to a few thousand, one chunk or many, windows of
1 to 4 chunks, listings that grew, reads in order across dozens of epochs and at random.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from mdata.order import SourceOrder

#: (row counts, chunk_rows, seed, name, window, appended) -> digest before the change
GOLDEN = {
    ((4,), 64, 0, "piece-0", 4, ()): "e399605dfe710049bc484636",
    ((5,), 64, 7, "captions-17", 4, ()): "13605305033e01c5464c751f",
    ((5,), 2, 3, "tiny-chunks", 1, ()): "454df83f2a870e824f54e107",
    ((3, 0, 2), 1, 11, "one-row-chunks", 2, ()): "ce64f7d9d659b3ec8fce62b9",
    ((1,), 8, 5, "single", 4, ()): "cc54101d393fcbf980682f9b",
    ((1000, 37), 100, 42, "large", 4, ()): "064216c0a50cff5c8fabcdb3",
    ((4, 5, 3), 2, 9, "grown", 2, ((2, 1), (5, 2))): "e9e617867d167765cc5b5b65",
    ((2, 3), 4, 1, "grown-tiny", 4, ((1, 1),)): "b97ca9cc8321c862a08530ec",
}


def _digest(counts, chunk_rows, seed, name, window, appended) -> str:
    order = SourceOrder(list(counts), chunk_rows, seed, name, window, appended)
    h = hashlib.sha256()
    total = order.num_rows
    cursor = 0
    rng = np.random.default_rng(0)
    for n in rng.integers(0, 3 * total + 3, 60).tolist():  # in order, across epochs
        for column in order.take(cursor, n):
            h.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
        cursor += n
    fresh = SourceOrder(list(counts), chunk_rows, seed, name, window, appended)
    for c in rng.integers(0, 40 * total, 30).tolist():  # at random, as a resume reads
        for column in fresh.take(c, 7):
            h.update(np.ascontiguousarray(column, dtype=np.int64).tobytes())
        lo, hi, chunks = fresh.window_span(c)
        h.update(np.array([lo, hi] + sorted(chunks), dtype=np.int64).tobytes())
        h.update(fresh.chunks_for(c, 11).astype(np.int64).tobytes())
    return h.hexdigest()[:24]


@pytest.mark.parametrize("case", sorted(GOLDEN, key=lambda c: c[3]), ids=lambda c: c[3])
def test_orders_are_those_of_before(case) -> None:
    assert _digest(*case) == GOLDEN[case]


def test_a_tiny_source_draws_the_rows_it_drew_before() -> None:
    order = SourceOrder([4], 64, 0, "piece-0", 4)
    assert order.take(0, 24).rows.tolist() == [3, 2, 0, 1, 2, 3, 0, 1, 0, 2, 3, 1, 2, 0, 1, 3, 0,
                                               2, 1, 3, 0, 3, 1, 2]
    order = SourceOrder([5], 2, 3, "tiny-chunks", 1)
    taken = order.take(0, 15)
    assert taken.rows.tolist() == [4, 0, 1, 3, 2, 3, 2, 0, 1, 4, 4, 3, 2, 0, 1]
    assert taken.chunk_ids.tolist() == [2, 0, 0, 1, 1, 1, 1, 0, 0, 2, 2, 1, 1, 0, 0]


def test_a_tiny_source_read_at_random_agrees_with_one_read_in_order() -> None:
    """Its epochs are built once and its seeds come in batches while epochs follow each other;
    reading backwards and jumping around must give the same rows."""
    ahead = SourceOrder([5], 64, 3, "piece-9", 4).take(0, 5 * 300)
    jumpy = SourceOrder([5], 64, 3, "piece-9", 4)
    for c in np.random.default_rng(1).integers(0, 5 * 300 - 9, 200).tolist():
        np.testing.assert_array_equal(jumpy.take(c, 9).rows, ahead.rows[c:c + 9])
