"""Provisioner.take slices sources' samples from their last-read windows: it must hand out exactly
what each source's own SourceOrder.take gives, across window and epoch boundaries."""

from __future__ import annotations

import numpy as np

from mdata.mixing import StaticMixture
from mdata.order import SourceOrder
from mdata.planner.apportion import Provisioner


def _orders(seed: int) -> list[SourceOrder]:
    rng = np.random.default_rng(seed)
    return [SourceOrder(rng.integers(1, 90, size=int(rng.integers(1, 4))), int(rng.integers(3, 17)),
                        seed, f"s{i}", window=int(rng.integers(1, 4))) for i in range(6)]


def test_take_matches_each_sources_own_order_over_many_steps():
    orders, fresh = _orders(3), _orders(3)  # ``fresh``: the same orders, read one source at a time
    names = tuple(o.name for o in orders)
    prov = Provisioner(orders, names, StaticMixture(dict.fromkeys(names, 1.0)), 40)
    rng = np.random.default_rng(11)
    cursors = np.zeros(len(orders), np.int64)
    for _ in range(300):  # several epochs of every source
        counts = rng.integers(0, 9, len(orders)) * (rng.random(len(orders)) < 0.7)
        src, shard, row, chunk, cursor = prov.take(cursors, counts)
        parts = [(i, fresh[i].take(int(cursors[i]), int(counts[i])))
                 for i in range(len(orders)) if counts[i]]
        want_src = np.concatenate([np.full(t.rows.size, i) for i, t in parts]) if parts else src
        assert src.tolist() == want_src.tolist()
        for got, col in ((shard, "shards"), (row, "rows"), (chunk, "chunk_ids")):
            want = np.concatenate([getattr(t, col) for _, t in parts]) if parts else got
            assert got.dtype == np.int64 and got.tolist() == want.tolist()
        assert cursor.tolist() == [int(cursors[i]) + k for i, t in parts for k in range(t.rows.size)]
        cursors = cursors + counts


def test_take_starts_from_windows_the_orders_read_before_the_provisioner():
    """A Provisioner built on orders read already (a restore reads them) seeds its window pool
    from their last windows: takes inside those windows and across them still match."""
    orders, fresh = _orders(5), _orders(5)
    for o in orders:
        o.take(7, 3)  # each order's last window is now the one holding cursor 7
    names = tuple(o.name for o in orders)
    prov = Provisioner(orders, names, StaticMixture(dict.fromkeys(names, 1.0)), 40)
    for start, n in ((7, 2), (8, 5), (0, 30), (50, 4)):
        starts = np.full(len(orders), start, np.int64)
        counts = np.full(len(orders), n, np.int64)
        _, shard, row, chunk, _ = prov.take(starts, counts)
        want = [fresh[i].take(start, n) for i in range(len(orders))]
        assert shard.tolist() == np.concatenate([t.shards for t in want]).tolist()
        assert row.tolist() == np.concatenate([t.rows for t in want]).tolist()
        assert chunk.tolist() == np.concatenate([t.chunk_ids for t in want]).tolist()
