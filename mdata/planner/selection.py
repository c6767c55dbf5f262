"""A step's final samples: its provisional ones, unless loaders skipped rows among them.

A step is balanced once the chunks of its provisional samples are loaded. If every earlier step
ended where it was expected to and no sample of this one was skipped by its loader, the
provisional samples are final (the fast path: one vectorised lookup). Otherwise each source's
order is walked from the source's *final* cursor, passing over skipped rows deterministically,
until the source's count is met; the cursor where each walk ends is where the next step starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from mdata.order import SourceOrder
from mdata.planner.apportion import PlannedStep
from mdata.planner.chunk_table import ChunkTable, NotLoaded

__all__ = ["Selection", "select_samples"]


class Selection(NamedTuple):
    """The final samples of a step, one entry per sample in every array.

    ``src, shard, row, chunk, cursor``: where each sample is; ``keys`` its chunk's key, ``index``
    its position among the chunk's kept rows, ``tokens``/``patches`` its cost features.
    ``ends`` are the source cursors after the step; ``skipped`` lists, per source that had any,
    ``(source index, shards, rows, cursors)`` of the rows passed over.
    """

    src: np.ndarray
    shard: np.ndarray
    row: np.ndarray
    chunk: np.ndarray
    cursor: np.ndarray
    keys: np.ndarray
    index: np.ndarray
    tokens: np.ndarray
    patches: np.ndarray
    ends: np.ndarray
    skipped: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]


def select_samples(st: PlannedStep, cursors: np.ndarray, orders: Sequence[SourceOrder],
                   table: ChunkTable) -> Selection:
    """The final samples of ``st`` when the sources' final cursors are ``cursors``.

    Raises :class:`~mdata.planner.chunk_table.NotLoaded` naming the chunks the walk reached that
    are not loaded yet (skips moved a cursor into chunks the step had not requested).
    """
    src, shard, row, chunk, cursor = st.taken
    if np.array_equal(st.prov_start, cursors):
        keys, index, tokens, patches = table.gather(src, row, chunk)
        if index.size == 0 or index.min() >= 0:
            return Selection(src, shard, row, chunk, cursor, keys, index, tokens, patches,
                             cursors + st.counts, [])
    # slow path: walk each source's order from its final cursor, passing over skipped rows
    cols: list[list[np.ndarray]] = [[] for _ in range(9)]
    skipped: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    ends = cursors.copy()
    missing: list[int] = []
    for i in np.flatnonzero(st.counts).tolist():
        p, need = int(cursors[i]), int(st.counts[i])
        while need > 0:
            t = orders[i].take(p, need)
            s_ = np.full(t.rows.size, i, np.int64)
            try:
                keys, index, tokens, patches = table.gather(s_, t.rows, t.chunk_ids)
            except NotLoaded as exc:
                missing.extend(exc.missing)
                break
            cur = p + np.arange(t.rows.size)
            keep = index >= 0
            for col, arr in zip(cols, (s_, t.shards, t.rows, t.chunk_ids, cur, keys, index,
                                       tokens, patches)):
                col.append(arr[keep])
            if not keep.all():
                skipped.append((i, t.shards[~keep], t.rows[~keep], cur[~keep]))
            need -= int(keep.sum())
            p += t.rows.size
        ends[i] = p
    if missing:
        raise NotLoaded(missing)
    arrays = (np.concatenate(c) if c else np.zeros(0, np.int64) for c in cols)
    return Selection(*arrays, ends, skipped)
