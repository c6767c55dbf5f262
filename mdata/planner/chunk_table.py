"""The Planner's chunk table: which chunks are requested or loaded, which planned steps need each
one, which stay held for their shuffle window, and the cost features of the loaded ones.

A chunk is keyed by one int, ``source_index << 40 | chunk_id`` (:func:`chunk_key`), so a step's
chunks are one vectorised expression over its samples. The table counts references per step:

* a chunk is requested (:class:`LoadChunk`) when the first planned step needs it;
* when the last step that needs it is consumed it is released (:class:`ReleaseChunk`), unless its
  source's planned cursor is still inside the chunk's shuffle window: later steps will draw from
  it again, so it stays *held* until the cursor leaves the window (no reload churn);
* a lost worker's chunks are reloaded if a step still needs them, forgotten if only held.

The table emits those instructions itself, tagged with the caller's stimulus id, into the
caller's ``out`` list, so the state machine's order of instructions is the order of its calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from mdata.errors import MdataError
from mdata.order import ChunkRef, SourceOrder
from mdata.planner.chunk_arrays import MASK, SHIFT, ChunkRecords, FeatureStore, chunk_key
from mdata.planner.instructions import Instruction, LoadChunk, ReleaseChunk

__all__ = ["ChunkTable", "FeatureStore", "NotLoaded", "chunk_key", "SHIFT", "MASK"]


class NotLoaded(Exception):
    """A lookup needs chunks that are not loaded (or not requested) yet; ``missing`` are their keys."""

    def __init__(self, missing: list[int]) -> None:
        super().__init__(f"{len(missing)} chunks are not loaded")
        self.missing = missing


_NO_KEYS = np.zeros(0, np.int64)


def _distinct(keys) -> np.ndarray:
    """``keys`` as an int64 array without repeats, in the order they first appear."""
    keys = np.asarray(keys, np.int64).ravel()
    if keys.size < 2 or bool((keys[1:] > keys[:-1]).all()):  # ascending already: the usual case
        return keys
    _, first = np.unique(keys, return_index=True)
    return keys[np.sort(first)]


class ChunkTable:
    """Chunks of one job, their references by planned steps, window holds and cost features.

    ``orders`` are the sources' :class:`~mdata.order.SourceOrder` (they name a chunk's rows and
    its shuffle window); ``width`` is the most rows a chunk may have (the store's row width).

    A chunk's record counts the planned steps that need it; a chunk no step needs is *held*
    while its chunk id is inside its source's current window, and dropped otherwise. Records
    are arrays (:class:`~mdata.planner.chunk_arrays.ChunkRecords`); a loaded chunk's handle
    for :meth:`fill` is its record number.
    """

    def __init__(self, orders: Sequence[SourceOrder], job: str, width: int) -> None:
        S = len(orders)
        self.orders = orders
        self.job = job
        self.store = FeatureStore(width)
        self._r = ChunkRecords()
        self._loaded = 0  # how many chunks are loaded
        self._clock = 0  # orders requests and holds
        self._by_task: dict[tuple, int] = {}  # Dask task key -> int key
        self._by_worker: dict[str, dict[int, None]] = {}
        self._step_chunks: dict[int, np.ndarray] = {}  # step -> keys it needs, in need order
        self._pending: dict[int, dict[int, None]] = {}  # step -> those of them not loaded yet
        self._win_end = np.zeros(S, np.int64)  # where each source's current window ends
        self._win_chunks: list[frozenset[int]] = [frozenset()] * S

    # -- queries -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._r.sorted_keys.size)

    def __contains__(self, ref: ChunkRef) -> bool:
        return self.record_of(chunk_key(ref.source_index, ref.chunk_id)) is not None

    @property
    def in_memory(self) -> int:
        """How many chunks are loaded (requested ones still loading are not counted): a count
        kept as chunks load and go, since the runtime reads it after every batch of events (a
        walk over every chunk was 6 ms at 10,000 sources)."""
        return self._loaded

    def count_loaded(self) -> int:
        """How many chunks are loaded, counted afresh over every record (a check of
        :attr:`in_memory`)."""
        return int(self._r.loaded[self._r.sorted_recs].sum())

    def record_of(self, key: int) -> int | None:
        """The record of chunk ``key``, or None when it is not requested or loaded."""
        return self._r.find(key)

    def loaded(self, rec: int) -> bool:
        """Whether the chunk of record ``rec`` (from :meth:`placed`) has its features."""
        return bool(self._r.loaded[rec])

    def refs(self) -> list[ChunkRef]:
        """Chunks currently requested or loaded, in request order."""
        recs = self._r.sorted_recs
        return self._r.ref[recs[np.argsort(self._r.requested[recs], kind="stable")]].tolist()

    def refs_of(self, keys) -> list[ChunkRef]:
        """The refs of these chunk keys (each must be requested or loaded)."""
        keys = np.asarray(keys, np.int64)
        recs, found = self._r.lookup(keys)
        if not found.all():
            raise KeyError(keys[~found][0].item())
        return self._r.ref[recs].tolist()

    def chunks_of(self, step: int) -> list[int]:
        """Keys of the chunks ``step`` needs, in the order it first needed them."""
        return self._step_chunks.get(step, _NO_KEYS).tolist()

    def held(self) -> list[int]:
        """Keys of the chunks kept only for their shuffle window (by source, then by when)."""
        r = self._r
        recs = r.sorted_recs[r.refs[r.sorted_recs] == 0]
        keys = r.key[recs]
        return keys[np.lexsort((r.held_since[recs], keys >> SHIFT))].tolist()

    def waiting(self, step: int) -> bool:
        """Whether some chunk ``step`` needs is not loaded yet."""
        return bool(self._pending.get(step))

    # -- references by steps -------------------------------------------------------------------
    def need(self, step: int, keys, sid: str, out: list[Instruction]) -> None:
        """``step`` needs these chunks: request the ones not requested yet, in this order."""
        keys = _distinct(keys)
        have = self._step_chunks.get(step)
        if have is not None and have.size:
            keys = keys[~np.isin(keys, have)]
        recs = self._ensure(keys, sid, out)
        self._r.refs[recs] += 1
        pending = self._pending.setdefault(step, {})
        waiting = keys[~self._r.loaded[recs]]
        if waiting.size:
            pending.update(dict.fromkeys(waiting.tolist()))
        self._step_chunks[step] = keys if have is None else np.concatenate([have, keys])

    def settle(self, step: int, keys, sid: str, out: list[Instruction]) -> None:
        """``step`` was balanced on these (loaded) chunks: let go of the ones its provisional
        samples needed and its final ones do not (skipped rows moved the cursor past them)."""
        final = _distinct(keys)
        have = self._step_chunks.get(step, _NO_KEYS)
        stale = ~np.isin(have, final)
        self._unneed(have[stale], sid, out)
        new = final[~np.isin(final, have)]
        self._r.refs[self._ensure(new, sid, out)] += 1
        self._step_chunks[step] = np.concatenate([have[~stale], new])
        self._pending.pop(step, None)

    def move(self, moved: Sequence[tuple[int, Sequence[int]]], sid: str,
             out: list[Instruction]) -> None:
        """Steps' provisional samples moved (``(step, new keys)`` each): need every new chunk
        first and release the stale ones after, so a chunk moving between steps stays loaded."""
        stale: list[np.ndarray] = []
        r = self._r
        for step, keys in moved:
            new = _distinct(keys)
            have = self._step_chunks.get(step, _NO_KEYS)
            stale.append(have[~np.isin(have, new)])
            r.refs[self._ensure(new[~np.isin(new, have)], sid, out)] += 1
            recs, _ = r.lookup(new)
            self._pending[step] = dict.fromkeys(new[~r.loaded[recs]].tolist())
            self._step_chunks[step] = new
        for keys in stale:
            self._unneed(keys, sid, out)

    def release(self, step: int, sid: str, out: list[Instruction]) -> None:
        """``step`` was consumed: it needs none of its chunks any more."""
        self._pending.pop(step, None)
        keys = self._step_chunks.pop(step, None)
        if keys is not None and keys.size:
            self._unneed(keys, sid, out)

    def roll_windows(self, cursors: np.ndarray, sid: str, out: list[Instruction]) -> None:
        """Sources whose planned cursor left its shuffle window let go of that window's chunks.

        Call it after the steps that moved the cursors needed their chunks: the last of them may
        still draw from the old window.
        """
        r = self._r
        for i in np.flatnonzero(cursors >= self._win_end).tolist():
            _, end, chunks = self.orders[i].window_span(int(cursors[i]))
            self._win_end[i] = end
            self._win_chunks[i] = chunks
            recs = r.of_source(i)
            if not recs.size:
                continue
            ids = np.fromiter(chunks, np.int64, len(chunks))
            inside = np.isin(r.key[recs] & MASK, ids)
            r.in_window[recs] = inside
            gone = recs[(r.refs[recs] == 0) & ~inside]  # held for the window just left
            if gone.size:
                self._drop(gone[np.argsort(r.held_since[gone], kind="stable")], sid, out)

    def _ensure(self, keys: np.ndarray, sid: str, out: list[Instruction]) -> np.ndarray:
        """Records of these distinct keys, requesting the ones not requested yet, in order."""
        recs, found = self._r.lookup(keys)
        if not found.all():
            new = np.flatnonzero(~found)
            made = np.array([self._request(k, sid, out) for k in keys[new].tolist()], np.int64)
            recs[new] = made
            self._r.index(keys[new], made)
        return recs

    def _request(self, key: int, sid: str, out: list[Instruction]) -> int:
        """Chunk ``key`` is not requested yet: record it and request its load."""
        i, cid = key >> SHIFT, key & MASK
        ref = self.orders[i].chunk_ref(cid, i, self.job)
        r = self._r
        rec = r.take()
        r.key[rec], r.refs[rec], r.loaded[rec] = key, 0, False
        r.start[rec], r.ref[rec], r.worker[rec] = ref.start, ref, None
        r.in_window[rec] = cid in self._win_chunks[i]
        r.requested[rec] = self._clock
        self._clock += 1
        self._by_task[ref.key] = key
        out.append(LoadChunk(ref, stimulus_id=sid))
        return rec

    def _unneed(self, keys: np.ndarray, sid: str, out: list[Instruction]) -> None:
        """A step no longer needs these (distinct) chunks: the ones no step needs now are held
        for their window, or dropped (in this order)."""
        r = self._r
        recs, found = r.lookup(keys)
        recs = recs[found]
        r.refs[recs] -= 1
        idle = recs[r.refs[recs] == 0]
        if not idle.size:
            return
        inside = r.in_window[idle]
        held = idle[inside]
        r.held_since[held] = np.arange(self._clock, self._clock + held.size)
        self._clock += held.size
        if not inside.all():
            self._drop(idle[~inside], sid, out)

    def _drop(self, recs: np.ndarray, sid: str, out: list[Instruction]) -> None:
        """Forget these chunks (in this order) and release them."""
        r = self._r
        for rec in recs.tolist():
            key, ref, worker = int(r.key[rec]), r.ref[rec], r.worker[rec]
            self._by_task.pop(ref.key, None)
            if worker is not None:
                self._by_worker.get(worker, {}).pop(key, None)
            if r.loaded[rec]:
                self.store.release(int(r.slot[rec]))
                self._loaded -= 1
            r.loaded[rec], r.refs[rec], r.ref[rec], r.worker[rec] = False, 0, None, None
            r.free.append(rec)
            out.append(ReleaseChunk(ref, stimulus_id=sid))
        r.unindex(r.key[recs])

    # -- loads and workers ---------------------------------------------------------------------
    def placed(self, ref: ChunkRef, worker: str) -> int | None:
        """A load of ``ref`` finished on ``worker``: its record, or None if it was released
        before its load finished (nothing needs it)."""
        key = chunk_key(ref.source_index, ref.chunk_id)
        rec = self.record_of(key)
        if rec is None:
            return None
        was = self._r.worker[rec]
        if was is not None and was != worker:
            self._by_worker.get(was, {}).pop(key, None)
        self._r.worker[rec] = worker
        self._by_worker.setdefault(worker, {})[key] = None
        return rec

    def fill(self, rec: int, rows: np.ndarray, num_tokens, num_patches) -> None:
        """Store a loaded chunk's cost features: ``rows`` are its kept rows (ascending int64).

        Raises :class:`~mdata.errors.MdataError` when the load's arrays disagree with the chunk.
        """
        r = self._r
        ref = r.ref[rec]
        tokens = np.asarray(num_tokens)
        patches = np.zeros(rows.size, np.int32) if num_patches is None else np.asarray(num_patches)
        if tokens.shape != rows.shape or patches.shape != rows.shape or (
                rows.size and (rows[0] < ref.start or rows[-1] >= ref.stop)):
            raise MdataError(
                f"chunk {ref}: the load reported {rows.size} rows, {tokens.size} token counts and "
                f"{patches.size} patch counts, rows must lie in [{ref.start}, {ref.stop})")
        r.slot[rec] = self.store.put(rows - ref.start, tokens, patches)
        self._loaded += not r.loaded[rec]
        r.loaded[rec] = True
        key = int(r.key[rec])
        for pending in self._pending.values():  # the steps in flight: a handful
            pending.pop(key, None)

    def fill_empty(self, ref: ChunkRef) -> None:
        """A requested chunk none of whose rows can be used (quarantined): loaded, on no worker,
        with no kept row, so a step's walk passes over its rows like skipped ones."""
        rec = self.record_of(chunk_key(ref.source_index, ref.chunk_id))
        if rec is not None and not self._r.loaded[rec]:
            empty = np.zeros(0, np.int64)
            self.fill(rec, empty, empty, empty)

    def worker_lost(self, worker: str, chunks: Iterable, sid: str, out: list[Instruction]) -> None:
        """``worker`` died with these chunks (refs or task keys) and those it reported loading:
        reload the ones a step needs, forget the ones only held for their window."""
        keys = dict(self._by_worker.pop(worker, {}))
        for ch in chunks:
            k = self._by_task.get(ch.key if isinstance(ch, ChunkRef) else tuple(ch))
            if k is not None:
                keys[k] = None
        r = self._r
        for k in keys:
            rec = self.record_of(k)
            if rec is None or r.worker[rec] != worker:
                continue  # released already, or its reload is under way elsewhere
            if not r.refs[rec]:  # only held for its window: forget it, a later step reloads it
                self._drop(np.array([rec], np.int64), sid, out)
                continue
            r.worker[rec] = None
            # the cost features stay valid (a reload reads the same rows), so planning goes on;
            # the constructor waits on the reloaded task
            out.append(LoadChunk(r.ref[rec], reload=True, stimulus_id=sid))

    # -- cost features -------------------------------------------------------------------------
    def gather(self, src: np.ndarray, row: np.ndarray, chunk: np.ndarray):
        """``(keys, index, tokens, patches)`` of samples (source index, row, chunk id arrays):
        each sample's chunk key, its position among the chunk's kept rows (-1: skipped by the
        loader) and its cost features. Raises :class:`NotLoaded` naming chunks not loaded."""
        keys = (src << SHIFT) | chunk
        uniq, inv = np.unique(keys, return_inverse=True)
        r = self._r
        recs, found = r.lookup(uniq)
        ok = found & r.loaded[recs]
        if not ok.all():
            raise NotLoaded(uniq[~ok].tolist())
        sl, off = r.slot[recs][inv], row - r.start[recs][inv]
        store = self.store
        return keys, store.index[sl, off], store.tokens[sl, off], store.patches[sl, off]
