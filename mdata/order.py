"""Deterministic sample order of one source, independent of the cluster's shape.

Each source's samples form one infinite sequence, epoch after epoch. A *cursor* is a position in
that sequence; the Planner keeps one cursor per source, and a checkpoint stores only those cursors,
because everything else follows from ``(seed, source name, row counts, chunk_rows, window)``:

1. The source's rows are cut into *chunks* of ``chunk_rows`` consecutive rows of one shard (the last
   chunk of a shard may be shorter; a chunk never crosses shards). A chunk is what one Dask task
   loads.
2. Epoch ``e`` visits the chunks in a permutation drawn from ``numpy.random.Generator(PCG64)``
   seeded with ``(seed, crc32(name), e)``; ``crc32`` is stable across processes, unlike ``hash``.
3. Rows are shuffled inside a *shuffle window* of ``window`` consecutive chunks of that permutation
   (seeded with ``(seed, crc32(name), e, window index)``). Larger windows mix better; smaller ones
   keep fewer chunks in memory at once.

Nothing depends on how many loaders, constructors or trainers exist, so the order survives
rescaling and restarts (the idea mosaicml/streaming calls elastic determinism).

**Appended shards.** A job may resume onto a source whose listing grew at its end (shards sorted
after every known one; see ``accept_appended_shards`` in docs/concepts.md). ``appended`` records
each such growth as ``(epoch, shards_before)``: the epoch the cursor was in, and how many shards
the source had until then. Epoch ``e`` then visits, in this order, the permutation of the chunks
known when it began (exactly the permutation the job was following, so its cursor keeps its
meaning and nothing read before is read again), then the chunks of each growth recorded at ``e``,
permuted with their own seed ``(seed, crc32(name), e, j, APPEND_TAG)`` and cut into their own
shuffle windows. Later epochs permute every chunk as usual. Epochs before a growth keep the row
count they had, so absolute cursors stay valid across the growth.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from mdata.errors import PlanError
from mdata.seeded_perm import EpochPermutations, permutation

__all__ = ["ChunkRef", "SourceOrder", "Taken", "stable_name_hash", "chunk_key", "APPEND_TAG"]

#: Last word of the seed of an appended segment's permutation (keeps it apart from window seeds).
APPEND_TAG = 0xA99E


def stable_name_hash(name: str) -> int:
    """A hash of a source name that is the same in every process (``hash()`` is salted)."""
    return zlib.crc32(name.encode("utf-8"))


def chunk_key(job: str, source: str, shard: int, start: int) -> tuple[str, str, str, int, int]:
    """The Dask key of the load task of one chunk; it names the chunk's lineage."""
    return ("mdata-load", job, source, int(shard), int(start))


@dataclass(frozen=True)
class ChunkRef:
    """One chunk of one source: rows ``[start, stop)`` of shard ``shard``.

    ``chunk_id`` is the chunk's index in the source's shard-major chunk list; ``source_index`` is
    the source's position in the plan. ``key`` is the Dask task key of its load, so the task graph
    and the dashboard show which source and shard every load came from.
    """

    source: str
    source_index: int
    shard: int
    start: int
    stop: int
    chunk_id: int
    job: str = "job"

    @property
    def key(self) -> tuple[str, str, str, int, int]:
        return chunk_key(self.job, self.source, self.shard, self.start)

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    def __str__(self) -> str:
        return f"{self.source}/shard {self.shard}/rows {self.start}-{self.stop}"


class Taken(NamedTuple):
    """Samples at consecutive cursor positions: shard, row and chunk id of each (int64 arrays)."""

    shards: np.ndarray
    rows: np.ndarray
    chunk_ids: np.ndarray


class _Epoch(NamedTuple):
    perm: np.ndarray  # chunk ids in visiting order
    starts: np.ndarray  # epoch position where each shuffle window starts, then the epoch's rows
    bounds: np.ndarray  # index into perm where each window starts, then len(perm)


class _Window(NamedTuple):
    lo: int  # first epoch position of the window
    hi: int  # one past its last position
    shards: np.ndarray
    rows: np.ndarray
    chunk_ids: np.ndarray


class SourceOrder:
    """The deterministic, infinite sample sequence of one source (see the module docstring).

    ``row_counts`` are the rows per shard, in the source's shard order (empty shards are allowed
    and simply have no chunks). ``appended``: the growths of the listing, ``(epoch,
    shards_before)`` each, in order (see the module docstring); empty for a listing that never
    grew. Epoch permutations and shuffle windows are computed on demand and cached (a few of
    each), so memory stays at a few windows however large the source is.
    """

    def __init__(
        self,
        row_counts: Sequence[int] | np.ndarray,
        chunk_rows: int,
        seed: int,
        name: str,
        window: int = 4,
        appended: Sequence[tuple[int, int]] = (),
    ) -> None:
        counts = np.asarray(row_counts, dtype=np.int64).reshape(-1)
        if counts.size == 0 or (counts < 0).any() or counts.sum() == 0:
            raise PlanError(
                f"source {name!r}: no rows to read (row counts per shard {counts.tolist()[:8]}); "
                "check the source's URL and that its shards are not empty"
            )
        if int(chunk_rows) < 1:
            raise PlanError(f"source {name!r}: chunk_rows must be >= 1, got {chunk_rows}")
        if int(window) < 1:
            raise PlanError(f"source {name!r}: shuffle window must be >= 1 chunk, got {window}")
        self.name = name
        self.seed = int(seed)
        self.chunk_rows = int(chunk_rows)
        self.window = int(window)
        self.row_counts = counts
        self.num_rows = int(counts.sum())
        per_shard = -(-counts // self.chunk_rows)  # ceil division
        self.num_chunks = int(per_shard.sum())
        self.chunk_shard = np.repeat(np.arange(counts.size, dtype=np.int64), per_shard)
        first_chunk = np.concatenate([[0], np.cumsum(per_shard)[:-1]]).astype(np.int64)
        self._first_chunk = first_chunk
        within = np.arange(self.num_chunks, dtype=np.int64) - first_chunk[self.chunk_shard]
        self.chunk_start = within * self.chunk_rows
        self.chunk_stop = np.minimum(self.chunk_start + self.chunk_rows, counts[self.chunk_shard])
        self.chunk_len = self.chunk_stop - self.chunk_start
        self._name_hash = stable_name_hash(name)
        self._chunk_cum = np.concatenate([[0], np.cumsum(per_shard)]).astype(np.int64)
        self._row_cum = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.appended = _check_appended(name, appended, self._row_cum)
        self._eras = self._layout()
        self._epochs: OrderedDict[int, _Epoch] = OrderedDict()
        self._windows: OrderedDict[tuple[int, int], _Window] = OrderedDict()
        self._last: tuple[int, _Window] | None = None  # (epoch, window): the fast path of take
        # a source of one chunk that never grew (a tiny source) has the same epoch every time,
        # its one window the same rows before their shuffle: built once
        self._single: _Epoch | None = None
        self._single_rows: tuple[np.ndarray, np.ndarray] | None = None
        # the permutations' generators, seeded in batches while epochs follow one another
        self._chunk_perms = EpochPermutations()
        self._row_perms = EpochPermutations()

    # -- chunks ---------------------------------------------------------------------------------
    def chunk_ref(self, chunk_id: int, source_index: int = 0, job: str = "job") -> ChunkRef:
        """The :class:`ChunkRef` of chunk ``chunk_id``."""
        c = int(chunk_id)
        if not 0 <= c < self.num_chunks:
            raise PlanError(f"source {self.name!r} has {self.num_chunks} chunks, not chunk {c}")
        return ChunkRef(self.name, int(source_index), int(self.chunk_shard[c]),
                        int(self.chunk_start[c]), int(self.chunk_stop[c]), c, job)

    def chunk_of(self, shard: int, row: int) -> int:
        """The chunk id holding ``row`` of ``shard``."""
        if not (0 <= shard < self.row_counts.size and 0 <= row < self.row_counts[shard]):
            raise PlanError(f"source {self.name!r} has no row {row} in shard {shard}")
        return int(self._first_chunk[shard] + row // self.chunk_rows)

    # -- epochs and windows ---------------------------------------------------------------------
    def _layout(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Eras of equal-sized epochs: first epoch, first cursor and rows per epoch of each."""
        firsts = sorted({0} | {e for e, _ in self.appended})
        cursors, rows = [], []
        cursor = 0
        for i, e in enumerate(firsts):
            cursors.append(cursor)
            rows.append(self.epoch_rows(e))
            if i + 1 < len(firsts):
                cursor += (firsts[i + 1] - e) * rows[-1]
        return (np.array(firsts, np.int64), np.array(cursors, np.int64), np.array(rows, np.int64))

    def _shards_after(self, epoch: int, inclusive: bool) -> int:
        """Shards known at the start (``inclusive=False``) or the end of ``epoch``."""
        for e, before in self.appended:
            if e > epoch or (e == epoch and not inclusive):
                return before
        return int(self.row_counts.size)

    def epoch_rows(self, epoch: int) -> int:
        """Rows of ``epoch`` (every epoch has ``num_rows`` unless the listing grew)."""
        if not self.appended:
            return self.num_rows
        return int(self._row_cum[self._shards_after(int(epoch), inclusive=True)])

    def _locate(self, cursor: int) -> tuple[int, int]:
        """``(epoch, position in the epoch)`` of an absolute cursor."""
        if not self.appended:
            return divmod(cursor, self.num_rows)
        firsts, cursors, rows = self._eras
        i = int(np.searchsorted(cursors, cursor, side="right")) - 1
        epochs, pos = divmod(cursor - int(cursors[i]), int(rows[i]))
        return int(firsts[i]) + epochs, pos

    def epoch_of(self, cursor: int) -> int:
        if not self.appended:  # the common case, once per source in every checkpoint
            return int(cursor) // self.num_rows
        return self._locate(int(cursor))[0]

    def epoch_start(self, epoch: int) -> int:
        """The absolute cursor of the first position of ``epoch``."""
        firsts, cursors, rows = self._eras
        i = int(np.searchsorted(firsts, int(epoch), side="right")) - 1
        return int(cursors[i]) + (int(epoch) - int(firsts[i])) * int(rows[i])

    def _epoch(self, epoch: int) -> _Epoch:
        """Chunk permutation of ``epoch`` and where its shuffle windows start."""
        if self._single is not None:  # one chunk and no growth: every epoch is the same
            return self._single
        cached = self._epochs.get(epoch)
        if cached is not None:
            return cached
        known = int(self._chunk_cum[self._shards_after(epoch, inclusive=False)])
        parts = [self._chunk_perms((self.seed, self._name_hash, epoch), 2, known)]
        bounds = [np.arange(0, known, self.window)]
        offset = known
        for j, (e, before) in enumerate(self.appended):
            if e != epoch:
                continue
            lo = int(self._chunk_cum[before])
            hi = int(self._chunk_cum[self._shards_after_growth(j)])
            parts.append(lo + permutation((self.seed, self._name_hash, epoch, j, APPEND_TAG),
                                          hi - lo))
            bounds.append(offset + np.arange(0, hi - lo, self.window))
            offset += hi - lo
        perm = np.concatenate(parts).astype(np.int64)
        bound = np.append(np.concatenate(bounds), perm.size).astype(np.int64)
        rows = np.concatenate([[0], np.cumsum(self.chunk_len[perm])]).astype(np.int64)
        cached = _Epoch(perm, rows[bound], bound)
        if self.num_chunks == 1 and not self.appended:
            self._single = cached
            return cached
        self._epochs[epoch] = cached
        if len(self._epochs) > 3:
            self._epochs.popitem(last=False)
        return cached

    def _shards_after_growth(self, j: int) -> int:
        return self.appended[j + 1][1] if j + 1 < len(self.appended) else int(self.row_counts.size)

    def _window_index(self, ep: _Epoch, pos: int) -> int:
        if ep is self._single:  # one window
            return 0
        return int(np.searchsorted(ep.starts, pos, side="right")) - 1

    def _window_at(self, epoch: int, w: int) -> _Window:
        cached = self._windows.get((epoch, w))
        if cached is not None:
            return cached
        ep = self._epoch(epoch)
        if ep is self._single and self._single_rows is not None:  # the same rows every epoch
            chunk_ids, rows = self._single_rows
        else:
            chunks = ep.perm[ep.bounds[w]: ep.bounds[w + 1]]
            lengths = self.chunk_len[chunks]
            chunk_ids = np.repeat(chunks, lengths)
            offsets = np.arange(chunk_ids.size, dtype=np.int64) - np.repeat(
                np.cumsum(lengths) - lengths, lengths)
            rows = self.chunk_start[chunk_ids] + offsets
            if ep is self._single:
                self._single_rows = chunk_ids, rows
        shuffle = self._row_perms((self.seed, self._name_hash, epoch, w), 2, rows.size)
        chunk_ids = chunk_ids[shuffle]
        shards, rows = self.chunk_shard[chunk_ids], rows[shuffle]
        for array in (shards, rows, chunk_ids):
            array.flags.writeable = False  # take() hands out views: nobody may change the cache
        win = _Window(int(ep.starts[w]), int(ep.starts[w + 1]), shards, rows, chunk_ids)
        self._windows[(epoch, w)] = win
        if len(self._windows) > 4:
            self._windows.popitem(last=False)
        return win

    # -- samples --------------------------------------------------------------------------------
    def take(self, cursor: int, n: int) -> Taken:
        """The ``n`` samples at positions ``cursor, cursor+1, ...`` (across epoch boundaries)."""
        cursor, n = int(cursor), int(n)
        if cursor < 0 or n < 0:
            raise PlanError(f"source {self.name!r}: cursor {cursor} and count {n} must be >= 0")
        epoch, pos = self._locate(cursor)
        last = self._last
        if last is not None and last[0] == epoch and last[1].lo <= pos and pos + n <= last[1].hi:
            win = last[1]
            a, b = pos - win.lo, pos - win.lo + n
            return Taken(win.shards[a:b], win.rows[a:b], win.chunk_ids[a:b])
        parts: list[Taken] = []
        while n > 0:
            w = self._window_index(self._epoch(epoch), pos)
            win = self._window_at(epoch, w)
            self._last = (epoch, win)
            a = pos - win.lo
            b = min(win.hi - win.lo, a + n)
            parts.append(Taken(win.shards[a:b], win.rows[a:b], win.chunk_ids[a:b]))
            n -= b - a
            pos += b - a
            if pos >= self.epoch_rows(epoch):
                epoch, pos = epoch + 1, 0
        if len(parts) == 1:
            return parts[0]
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return Taken(empty, empty, empty)
        return Taken(*(np.concatenate(cols) for cols in zip(*parts)))

    def last_window(self) -> tuple[int, int, Taken]:
        """The window :meth:`take` read last: its first and one-past-last absolute cursors and
        its samples (read-only views), so a caller taking many sources at once can slice it
        itself while its cursor stays inside (``(0, 0, empty)`` before any take)."""
        if self._last is None:
            empty = np.zeros(0, dtype=np.int64)
            return 0, 0, Taken(empty, empty, empty)
        epoch, win = self._last
        base = self.epoch_start(epoch)
        return base + win.lo, base + win.hi, Taken(win.shards, win.rows, win.chunk_ids)

    def window_span(self, cursor: int) -> tuple[int, int, frozenset[int]]:
        """The shuffle window holding ``cursor``: its first and one-past-last cursor positions
        (absolute, in the infinite sequence) and the ids of its chunks.

        Samples keep coming from these chunks until the cursor leaves the window, so the Planner
        holds them loaded that long instead of reloading them for every step.
        """
        epoch, pos = self._locate(int(cursor))
        ep = self._epoch(epoch)
        w = self._window_index(ep, pos)
        base = self.epoch_start(epoch)
        chunks = frozenset(ep.perm[ep.bounds[w]: ep.bounds[w + 1]].tolist())
        return base + int(ep.starts[w]), base + int(ep.starts[w + 1]), chunks

    def sample_at(self, cursor: int) -> tuple[int, int]:
        """``(shard, row)`` of the sample at ``cursor``."""
        taken = self.take(cursor, 1)
        return int(taken.shards[0]), int(taken.rows[0])

    def chunks_for(self, cursor: int, n: int) -> np.ndarray:
        """Ids of the chunks that hold the ``n`` samples from ``cursor`` on, in first-use order."""
        ids = self.take(cursor, n).chunk_ids
        _, first = np.unique(ids, return_index=True)
        return ids[np.sort(first)]


def _check_appended(name: str, appended: Sequence[tuple[int, int]],
                    row_cum: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Growths in order: epochs never decrease, shard counts grow, and the source had rows."""
    out: list[tuple[int, int]] = []
    shards = row_cum.size - 1
    for item in appended:
        try:
            epoch, before = (int(v) for v in item)
        except (TypeError, ValueError):
            raise PlanError(f"source {name!r}: appended growth {item!r} is not (epoch, shards_before)") from None
        prev_epoch, prev_before = out[-1] if out else (0, 0)
        if epoch < prev_epoch or not prev_before < before < shards:
            raise PlanError(
                f"source {name!r}: appended growths {list(appended)} must have non-decreasing "
                f"epochs and growing shard counts below the listing's {shards} shards"
            )
        if not out and row_cum[before] <= 0:
            raise PlanError(f"source {name!r}: the shards known before the first growth have no rows")
        out.append((epoch, before))
    return tuple(out)
