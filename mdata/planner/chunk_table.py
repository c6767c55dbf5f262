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
from mdata.planner.instructions import Instruction, LoadChunk, ReleaseChunk

__all__ = ["ChunkTable", "FeatureStore", "NotLoaded", "chunk_key", "SHIFT", "MASK"]

SHIFT = 40  # int key of a chunk: source_index << SHIFT | chunk_id
MASK = (1 << SHIFT) - 1


def chunk_key(source_index: int, chunk_id: int) -> int:
    """The table's int key of chunk ``chunk_id`` of source ``source_index``."""
    return (source_index << SHIFT) | chunk_id


class NotLoaded(Exception):
    """A lookup needs chunks that are not loaded (or not requested) yet; ``missing`` are their keys."""

    def __init__(self, missing: list[int]) -> None:
        super().__init__(f"{len(missing)} chunks are not loaded")
        self.missing = missing


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


class _Chunk:
    __slots__ = ("ref", "loaded", "slot", "needed_by", "worker")

    def __init__(self, ref: ChunkRef) -> None:
        self.ref = ref
        self.loaded = False
        self.slot = -1
        self.needed_by: dict[int, None] = {}  # planned steps that need it, in the order they came
        self.worker: str | None = None


class ChunkTable:
    """Chunks of one job, their references by planned steps, window holds and cost features.

    ``orders`` are the sources' :class:`~mdata.order.SourceOrder` (they name a chunk's rows and
    its shuffle window); ``width`` is the most rows a chunk may have (the store's row width).
    """

    def __init__(self, orders: Sequence[SourceOrder], job: str, width: int) -> None:
        S = len(orders)
        self.orders = orders
        self.job = job
        self.store = FeatureStore(width)
        self._chunks: dict[int, _Chunk] = {}  # requested or loaded, in request order
        self._loaded = 0  # how many of them are loaded
        self._by_task: dict[tuple, int] = {}  # Dask task key -> int key
        self._by_worker: dict[str, dict[int, None]] = {}
        self._step_chunks: dict[int, dict[int, None]] = {}  # step -> chunks it needs
        self._pending: dict[int, dict[int, None]] = {}  # step -> those of them not loaded yet
        # chunks no planned step needs but whose shuffle window the source has not left yet
        self._held: list[dict[int, None]] = [{} for _ in range(S)]
        self._win_end = np.zeros(S, np.int64)  # where each source's current window ends
        self._win_chunks: list[frozenset[int]] = [frozenset()] * S

    # -- queries -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._chunks)

    def __contains__(self, ref: ChunkRef) -> bool:
        return chunk_key(ref.source_index, ref.chunk_id) in self._chunks

    @property
    def in_memory(self) -> int:
        """How many chunks are loaded (requested ones still loading are not counted): a count
        kept as chunks load and go, since the runtime reads it after every batch of events (a
        walk over every chunk was 6 ms at 10,000 sources)."""
        return self._loaded

    def refs(self) -> list[ChunkRef]:
        """Chunks currently requested or loaded, in request order."""
        return [c.ref for c in self._chunks.values()]

    def refs_of(self, keys: Iterable[int]) -> list[ChunkRef]:
        """The refs of these chunk keys (each must be requested or loaded)."""
        chunks = self._chunks
        return [chunks[k].ref for k in keys]

    def chunks_of(self, step: int) -> list[int]:
        """Keys of the chunks ``step`` needs, in the order it first needed them."""
        return list(self._step_chunks.get(step, ()))

    def held(self) -> list[int]:
        """Keys of the chunks kept only for their shuffle window."""
        return [k for held in self._held for k in held]

    def waiting(self, step: int) -> bool:
        """Whether some chunk ``step`` needs is not loaded yet."""
        return bool(self._pending.get(step))

    # -- references by steps -------------------------------------------------------------------
    def need(self, step: int, keys: Iterable[int], sid: str, out: list[Instruction]) -> None:
        """``step`` needs these chunks: request the ones not requested yet, in this order."""
        keys = list(keys)
        pending = self._pending.setdefault(step, {})
        chunks = self._chunks
        for key in keys:  # _need inlined: ~1,700 keys a step at 10k sources, most needed already
            c = chunks.get(key)
            if c is None:
                c = self._request(key, sid, out)
            elif not c.needed_by:
                self._held[key >> SHIFT].pop(key, None)
            c.needed_by[step] = None
            if not c.loaded:
                pending[key] = None
        self._step_chunks.setdefault(step, {}).update(dict.fromkeys(keys))

    def settle(self, step: int, keys: Iterable[int], sid: str, out: list[Instruction]) -> None:
        """``step`` was balanced on these (loaded) chunks: let go of the ones its provisional
        samples needed and its final ones do not (skipped rows moved the cursor past them)."""
        final = dict.fromkeys(keys)
        held = self._step_chunks.setdefault(step, {})
        for key in [k for k in held if k not in final]:
            del held[key]
            self._unneed(key, step, sid, out)
        for key in final:
            if key not in held:
                self._need(key, step, sid, out)
                held[key] = None
        self._pending.pop(step, None)

    def move(self, moved: Sequence[tuple[int, list[int]]], sid: str, out: list[Instruction]) -> None:
        """Steps' provisional samples moved (``(step, new keys)`` each): need every new chunk
        first and release the stale ones after, so a chunk moving between steps stays loaded."""
        stale: list[tuple[int, int]] = []
        for step, keys in moved:
            new = dict.fromkeys(keys)
            stale.extend((step, k) for k in self._step_chunks.get(step, ()) if k not in new)
            self._step_chunks[step] = {}
            self._pending[step] = {}
            self.need(step, keys, sid, out)
        for step, key in stale:
            self._unneed(key, step, sid, out)

    def release(self, step: int, sid: str, out: list[Instruction]) -> None:
        """``step`` was consumed: it needs none of its chunks any more."""
        self._pending.pop(step, None)
        chunks = self._chunks
        for key in self._step_chunks.pop(step, ()):  # inlined _unneed: most stay needed by others
            c = chunks.get(key)
            if c is None:
                continue
            needed_by = c.needed_by
            needed_by.pop(step, None)
            if not needed_by:
                self._unneeded(key, c, sid, out)

    def roll_windows(self, cursors: np.ndarray, sid: str, out: list[Instruction]) -> None:
        """Sources whose planned cursor left its shuffle window let go of that window's chunks.

        Call it after the steps that moved the cursors needed their chunks: the last of them may
        still draw from the old window.
        """
        for i in np.flatnonzero(cursors >= self._win_end).tolist():
            _, end, chunks = self.orders[i].window_span(int(cursors[i]))
            self._win_end[i] = end
            self._win_chunks[i] = chunks
            held = self._held[i]
            for key in [k for k in held if (k & MASK) not in chunks]:
                del held[key]
                self._drop(key, self._chunks[key], sid, out)

    def _need(self, key: int, step: int, sid: str, out: list[Instruction]) -> _Chunk:
        c = self._chunks.get(key)
        if c is None:
            c = self._request(key, sid, out)
        elif not c.needed_by:
            self._held[key >> SHIFT].pop(key, None)
        c.needed_by[step] = None
        return c

    def _request(self, key: int, sid: str, out: list[Instruction]) -> _Chunk:
        """Chunk ``key`` is not requested yet: record it and request its load."""
        i, cid = key >> SHIFT, key & MASK
        ref = self.orders[i].chunk_ref(cid, i, self.job)
        c = self._chunks[key] = _Chunk(ref)
        self._by_task[ref.key] = key
        out.append(LoadChunk(ref, stimulus_id=sid))
        return c

    def _unneed(self, key: int, step: int, sid: str, out: list[Instruction]) -> None:
        c = self._chunks.get(key)
        if c is None:
            return
        c.needed_by.pop(step, None)
        if not c.needed_by:
            self._unneeded(key, c, sid, out)

    def _unneeded(self, key: int, c: _Chunk, sid: str, out: list[Instruction]) -> None:
        """No planned step needs chunk ``key`` any more: hold it for its window, or drop it."""
        i = key >> SHIFT
        if (key & MASK) in self._win_chunks[i]:
            self._held[i][key] = None
            return
        self._drop(key, c, sid, out)

    def _drop(self, key: int, c: _Chunk, sid: str, out: list[Instruction]) -> None:
        del self._chunks[key]
        self._by_task.pop(c.ref.key, None)
        if c.worker is not None:
            self._by_worker.get(c.worker, {}).pop(key, None)
        if c.loaded:
            self.store.release(c.slot)
            self._loaded -= 1
        out.append(ReleaseChunk(c.ref, stimulus_id=sid))

    # -- loads and workers ---------------------------------------------------------------------
    def placed(self, ref: ChunkRef, worker: str) -> _Chunk | None:
        """A load of ``ref`` finished on ``worker``: its record, or None if it was released
        before its load finished (nothing needs it)."""
        key = chunk_key(ref.source_index, ref.chunk_id)
        c = self._chunks.get(key)
        if c is None:
            return None
        if c.worker is not None and c.worker != worker:
            self._by_worker.get(c.worker, {}).pop(key, None)
        c.worker = worker
        self._by_worker.setdefault(worker, {})[key] = None
        return c

    def fill(self, c: _Chunk, rows: np.ndarray, num_tokens, num_patches) -> None:
        """Store a loaded chunk's cost features: ``rows`` are its kept rows (ascending int64).

        Raises :class:`~mdata.errors.MdataError` when the load's arrays disagree with the chunk.
        """
        ref = c.ref
        tokens = np.asarray(num_tokens)
        patches = np.zeros(rows.size, np.int32) if num_patches is None else np.asarray(num_patches)
        if tokens.shape != rows.shape or patches.shape != rows.shape or (
                rows.size and (rows[0] < ref.start or rows[-1] >= ref.stop)):
            raise MdataError(
                f"chunk {ref}: the load reported {rows.size} rows, {tokens.size} token counts and "
                f"{patches.size} patch counts, rows must lie in [{ref.start}, {ref.stop})")
        c.slot = self.store.put(rows - ref.start, tokens, patches)
        self._loaded += not c.loaded
        c.loaded = True
        key = chunk_key(ref.source_index, ref.chunk_id)
        for step in c.needed_by:
            pending = self._pending.get(step)
            if pending:
                pending.pop(key, None)

    def fill_empty(self, ref: ChunkRef) -> None:
        """A requested chunk none of whose rows can be used (quarantined): loaded, on no worker,
        with no kept row, so a step's walk passes over its rows like skipped ones."""
        c = self._chunks.get(chunk_key(ref.source_index, ref.chunk_id))
        if c is not None and not c.loaded:
            empty = np.zeros(0, np.int64)
            self.fill(c, empty, empty, empty)

    def worker_lost(self, worker: str, chunks: Iterable, sid: str, out: list[Instruction]) -> None:
        """``worker`` died with these chunks (refs or task keys) and those it reported loading:
        reload the ones a step needs, forget the ones only held for their window."""
        keys = dict(self._by_worker.pop(worker, {}))
        for ch in chunks:
            k = self._by_task.get(ch.key if isinstance(ch, ChunkRef) else tuple(ch))
            if k is not None:
                keys[k] = None
        for k in keys:
            c = self._chunks.get(k)
            if c is None or c.worker != worker:
                continue  # released already, or its reload is under way elsewhere
            if not c.needed_by:  # only held for its window: forget it, a later step reloads it
                self._held[k >> SHIFT].pop(k, None)
                self._drop(k, c, sid, out)
                continue
            c.worker = None
            # the cost features stay valid (a reload reads the same rows), so planning goes on;
            # the constructor waits on the reloaded task
            out.append(LoadChunk(c.ref, reload=True, stimulus_id=sid))

    # -- cost features -------------------------------------------------------------------------
    def gather(self, src: np.ndarray, row: np.ndarray, chunk: np.ndarray):
        """``(keys, index, tokens, patches)`` of samples (source index, row, chunk id arrays):
        each sample's chunk key, its position among the chunk's kept rows (-1: skipped by the
        loader) and its cost features. Raises :class:`NotLoaded` naming chunks not loaded."""
        keys = (src << SHIFT) | chunk
        uniq, inv = np.unique(keys, return_inverse=True)
        slots = np.empty(uniq.size, np.int64)
        starts = np.empty(uniq.size, np.int64)
        missing = []
        for j, key in enumerate(uniq.tolist()):
            c = self._chunks.get(key)
            if c is None or not c.loaded:
                missing.append(key)
                continue
            slots[j] = c.slot
            starts[j] = c.ref.start
        if missing:
            raise NotLoaded(missing)
        sl, off = slots[inv], row - starts[inv]
        store = self.store
        return keys, store.index[sl, off], store.tokens[sl, off], store.patches[sl, off]
