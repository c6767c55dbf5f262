"""The shuffle window each source read last, for all sources in flat arrays.

Why: a step draws from ~1,500 of 10k sources, and most of them take their samples from inside
the window their :class:`~mdata.order.SourceOrder` read last. Slicing each source's window in a
Python loop cost ~6 ms per step there; with every current window in one flat array, the samples
of all those sources are one gather (:meth:`WindowPool.gather`), and only a source that crosses
into another window asks its order (:meth:`WindowPool.put` then stores the new window).

Memory: a source gets a slot of ``window chunks x chunk rows`` entries (the most a window can
hold, so a slot never moves) the first time it is drawn. A slot stores a sample's row and
chunk id (int32 where every source's values fit); its shard is looked up from the chunk id, so
the pool holds 8 bytes per sample of a source's current window against the 24 of the order's
own cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mdata.order import SourceOrder, Taken

__all__ = ["WindowPool"]


class WindowPool:
    """Per source ``i``: the window ``[lo[i], hi[i])`` (absolute cursors) it read last, stored at
    ``off[i]`` of the flat ``rows``/``chunks`` arrays (``off[i] < 0``: no slot yet)."""

    def __init__(self, orders: Sequence[SourceOrder]) -> None:
        S = len(orders)
        self.orders = orders
        self.lo = np.zeros(S, np.int64)
        self.hi = np.zeros(S, np.int64)
        self.off = np.full(S, -1, np.int64)
        self._cap = [min(o.window * o.chunk_rows, o.num_rows) for o in orders]
        big = max((max(int(o.row_counts.max()), o.num_chunks) for o in orders), default=0)
        dtype = np.int32 if big < np.iinfo(np.int32).max else np.int64
        sizes = np.array([o.num_chunks for o in orders], np.int64)
        #: where source i's chunk ids start in ``_shard_of`` (the shard of every chunk, flat)
        self._chunk_base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self._shard_of = (np.concatenate([o.chunk_shard for o in orders]).astype(dtype)
                          if S else np.zeros(0, dtype))
        self.rows = np.zeros(0, dtype)
        self.chunks = np.zeros(0, dtype)
        self._used = 0
        for i, order in enumerate(orders):
            lo, hi, win = order.last_window()
            if hi > lo:
                self.put(i, lo, hi, win)

    def put(self, i: int, lo: int, hi: int, win: Taken) -> None:
        """Source ``i`` read the window ``[lo, hi)`` with these samples last: store it."""
        n = hi - lo
        if n > self._cap[i]:  # cannot happen for a SourceOrder's windows; kept as a guard
            raise ValueError(f"window of {n} samples exceeds source {i}'s slot of {self._cap[i]}")
        if self.off[i] < 0:
            self.off[i] = self._alloc(self._cap[i])
        a = int(self.off[i])
        self.rows[a:a + n] = win.rows
        self.chunks[a:a + n] = win.chunk_ids
        self.lo[i], self.hi[i] = lo, hi

    def _alloc(self, n: int) -> int:
        at = self._used
        if at + n > self.rows.size:  # grow by doubling: slots are added as sources are drawn
            size = max(2 * self.rows.size, at + n, 1 << 16)
            for name in ("rows", "chunks"):
                old = getattr(self, name)
                new = np.zeros(size, old.dtype)
                new[:at] = old[:at]
                setattr(self, name, new)
        self._used = at + n
        return at

    def inside(self, src: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Whether ``counts[j]`` samples from ``starts[j]`` of source ``src[j]`` lie in its window."""
        return (self.lo[src] <= starts) & (starts + counts <= self.hi[src])

    def gather(self, src: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Shard, row and chunk id (int64) of the samples at cursors ``pos`` of sources ``src``
        (each inside its source's window)."""
        at = self.off[src] + (pos - self.lo[src])
        rows = self.rows[at].astype(np.int64)
        chunks = self.chunks[at].astype(np.int64)
        shards = self._shard_of[self._chunk_base[src] + chunks].astype(np.int64)
        return shards, rows, chunks
