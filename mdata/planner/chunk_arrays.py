"""The chunk table's arrays: cost features of loaded chunks (:class:`FeatureStore`) and the
chunks' own records (:class:`ChunkRecords`), so the Planner's per-step bookkeeping over the
~1,700 chunks a step touches at 10,000 sources is vectorised, not a dict operation per chunk.

A chunk is keyed by one int, ``source_index << SHIFT | chunk_id`` (:func:`chunk_key`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["ChunkRecords", "FeatureStore", "MASK", "SHIFT", "chunk_key"]

SHIFT = 40  # int key of a chunk: source_index << SHIFT | chunk_id
MASK = (1 << SHIFT) - 1


def chunk_key(source_index: int, chunk_id: int) -> int:
    """The table's int key of chunk ``chunk_id`` of source ``source_index``."""
    return (source_index << SHIFT) | chunk_id


class FeatureStore:
    """Cost features of loaded chunks, one fixed-width row ("slot") per chunk, reused when freed.

    ``index[slot, r - start]`` is the position of row ``r`` among the chunk's kept rows, or -1 if
    the loader skipped it; the per-step gather is then one vectorised lookup for all sources.
    """

    def __init__(self, width: int, capacity: int = 64) -> None:
        self.width = width
        self.tokens = np.zeros((capacity, width), np.int32)
        self.patches = np.zeros((capacity, width), np.int32)
        self.index = np.full((capacity, width), -1, np.int32)
        self.free = list(range(capacity - 1, -1, -1))

    def put(self, offsets: np.ndarray, tokens: np.ndarray, patches: np.ndarray) -> int:
        """Store a chunk's kept rows (``offsets`` from its start) and features; returns its slot."""
        if not self.free:  # double the capacity
            n = self.tokens.shape[0]
            self.tokens = np.vstack([self.tokens, np.zeros((n, self.width), np.int32)])
            self.patches = np.vstack([self.patches, np.zeros((n, self.width), np.int32)])
            self.index = np.vstack([self.index, np.full((n, self.width), -1, np.int32)])
            self.free = list(range(2 * n - 1, n - 1, -1))
        slot = self.free.pop()
        self.index[slot] = -1
        self.index[slot, offsets] = np.arange(offsets.size, dtype=np.int32)
        self.tokens[slot, offsets] = tokens
        self.patches[slot, offsets] = patches
        return slot

    def release(self, slot: int) -> None:
        self.free.append(slot)


class ChunkRecords:
    """The table's chunks as parallel arrays indexed by a record number (reused when a chunk
    goes), so a step's bookkeeping over its ~1,700 chunks (10k sources) is a few vectorised
    expressions rather than a dict operation per chunk; a sorted copy of the keys answers
    key -> record lookups for a whole step at once (``np.searchsorted``)."""

    def __init__(self, capacity: int = 64) -> None:
        self.key = np.zeros(capacity, np.int64)
        self.refs = np.zeros(capacity, np.int32)  # planned steps that need the chunk
        self.loaded = np.zeros(capacity, bool)
        self.slot = np.full(capacity, -1, np.int32)  # its row in the feature store
        self.start = np.zeros(capacity, np.int64)  # its first row
        self.in_window = np.zeros(capacity, bool)  # inside its source's current shuffle window
        self.held_since = np.zeros(capacity, np.int64)  # when it became merely held (ordering)
        self.requested = np.zeros(capacity, np.int64)  # when it was requested (ordering)
        self.ref = np.empty(capacity, object)  # its ChunkRef
        self.worker: list[str | None] = [None] * capacity
        self.free = list(range(capacity - 1, -1, -1))
        self.sorted_keys = np.zeros(0, np.int64)
        self.sorted_recs = np.zeros(0, np.int64)

    def take(self) -> int:
        if not self.free:  # double the capacity
            n = self.key.size
            for name in ("key", "refs", "loaded", "slot", "start", "in_window", "held_since",
                         "requested", "ref"):
                old = getattr(self, name)
                new = np.empty(2 * n, old.dtype) if old.dtype == object else np.zeros(2 * n, old.dtype)
                new[:n] = old
                setattr(self, name, new)
            self.slot[n:] = -1
            self.worker.extend([None] * n)
            self.free = list(range(2 * n - 1, n - 1, -1))
        return self.free.pop()

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(recs, found)`` of these keys: ``recs`` is meaningful where ``found``."""
        sk = self.sorted_keys
        if sk.size == 0:
            return np.zeros(keys.size, np.int64), np.zeros(keys.size, bool)
        pos = np.minimum(np.searchsorted(sk, keys), sk.size - 1)
        return self.sorted_recs[pos], sk[pos] == keys

    def find(self, key: int) -> int | None:
        """The record of one key, or None when it is not indexed."""
        sk = self.sorted_keys
        pos = int(np.searchsorted(sk, key))
        return int(self.sorted_recs[pos]) if pos < sk.size and sk[pos] == key else None

    def index(self, keys: np.ndarray, recs: np.ndarray) -> None:
        """Add new (absent, distinct) keys to the sorted index."""
        order = np.argsort(keys, kind="stable")
        keys, recs = keys[order], recs[order]
        pos = np.searchsorted(self.sorted_keys, keys)
        self.sorted_keys = np.insert(self.sorted_keys, pos, keys)
        self.sorted_recs = np.insert(self.sorted_recs, pos, recs)

    def unindex(self, keys: np.ndarray) -> None:
        pos = np.searchsorted(self.sorted_keys, keys)
        self.sorted_keys = np.delete(self.sorted_keys, pos)
        self.sorted_recs = np.delete(self.sorted_recs, pos)

    def of_source(self, i: int) -> np.ndarray:
        """Records of source ``i``'s chunks, by chunk id."""
        lo, hi = np.searchsorted(self.sorted_keys, [i << SHIFT, (i + 1) << SHIFT])
        return self.sorted_recs[lo:hi]
