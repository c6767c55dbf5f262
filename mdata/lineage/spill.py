"""Lineage older than the DGraph's retention, in Parquet files reached through fsspec.

A long run keeps the lineage of its last ``mdata.planner.lineage-steps`` consumed steps in memory
(:class:`~mdata.lineage.dgraph.DGraph`); older ranges of steps leave it as
:class:`~mdata.lineage.events.LineageSegment` values and are written here, so the story of a
sample from the first step of a week-long run can still be told while the Planner's memory stays
flat. This module is pure (pyarrow and fsspec, no Dask): the scheduler's runtime decides when to
write (in a background thread) and asks the questions.

**Layout.** One folder per run; each segment is one :class:`SpillRange`, four Parquet files that
share a stem naming it, so a reader finds the files covering a step from a listing alone::

    <root>/000003-steps-000000000750-000000001000.samples.parquet   lineage_id, plan_seq, sample columns
    <root>/000003-steps-000000000750-000000001000.loads.parquet     source_index, chunk_id, worker, seq
    <root>/000003-steps-000000000750-000000001000.ranks.parquet     step, dp_rank, rank, kind, seq
    <root>/000003-steps-000000000750-000000001000.skips.parquet     source_index, shard, row, cursor, step

The first number orders the segments (a job rewound to a checkpoint spills the steps it drops
too, so step ranges of different segments may overlap; lineage ids never do). Samples are sorted
by ``(source_index, shard, row)`` and loads by ``(source_index, chunk_id)``, so the row groups'
statistics let a filtered read skip most of a file; a range reads each file's footer once and
keeps it (:meth:`SpillRange.metadata`).

**Stories.** :class:`StoryQuery` copies what a story needs from the DGraph in memory (taken
under the job's lock, cheap) and then reads the spilled ranges outside it; the events come from
the same builders as the DGraph's own (:mod:`mdata.lineage.events`), so a spilled story is
identical to the one an unbounded DGraph would tell.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from mdata.lineage.dgraph import DGraph
from mdata.lineage.events import (
    LOAD_COLUMNS, RANK_COLUMNS, SAMPLE_COLUMNS, SKIP_COLUMNS, Event, LineageSegment, occurrence_story,
    loaded_events, planned_event, rank_story, sample_info,
)

__all__ = ["SpillRange", "SpilledLineage", "StoryQuery", "TABLES"]

TABLES = ("samples", "loads", "ranks", "skips")
ROW_GROUP_ROWS = 1 << 16
_NAME = re.compile(r"^(\d{6,})-steps-(\d{12,})-(\d{12,})\.(samples|loads|ranks|skips)\.parquet$")
_CONVERTED = object()  # a pending range's segment once its tables were built (see SpillRange._tables)
_SORT = {"samples": ("source_index", "shard", "row"), "loads": ("source_index", "chunk_id"),
         "ranks": ("step", "dp_rank"), "skips": ("step",)}


def _schema(table: str) -> pa.Schema:
    cols = {"samples": {**SAMPLE_COLUMNS, "lineage_id": np.int64, "plan_seq": np.int64},
            "loads": LOAD_COLUMNS, "ranks": RANK_COLUMNS, "skips": SKIP_COLUMNS}[table]
    return pa.schema([(n, pa.string() if (table, n) == ("loads", "worker") else pa.from_numpy_dtype(t))
                      for n, t in cols.items()])


def _arrow_table(table: str, columns: Mapping[str, np.ndarray]) -> pa.Table:
    schema = _schema(table)
    out = pa.table({f.name: pa.array(np.asarray(columns[f.name]), type=f.type) for f in schema},
                   schema=schema)
    return out.sort_by([(c, "ascending") for c in _SORT[table]]) if out.num_rows > 1 else out


def _mask(keys: pa.Table, equal: Mapping[str, int], isin: tuple[str, Sequence[int]] | None):
    """The pyarrow predicate ``keys[c] == v for every (c, v)`` and ``keys[isin[0]] in isin[1]``."""
    mask = None
    for col, value in equal.items():
        term = pc.equal(keys[col], pa.scalar(value, keys.schema.field(col).type))
        mask = term if mask is None else pc.and_(mask, term)
    if isin is not None:
        term = pc.is_in(keys[isin[0]], value_set=pa.array(list(isin[1]), keys.schema.field(isin[0]).type))
        mask = term if mask is None else pc.and_(mask, term)
    return mask


def _may_hold(rg: pq.RowGroupMetaData, index: Mapping[str, int], equal: Mapping[str, int],
              isin: tuple[str, Sequence[int]] | None) -> bool:
    """Whether a row group's min/max statistics allow a row matching the predicates."""
    tests = [(c, (v,)) for c, v in equal.items()] + ([isin] if isin is not None else [])
    for col, values in tests:
        st = rg.column(index[col]).statistics
        if st is not None and st.has_min_max and not any(st.min <= v <= st.max for v in values):
            return False
    return True


def arrow_filesystem(fs: Any) -> pafs.FileSystem:
    """pyarrow's view of an fsspec filesystem (its own, faster, for local folders)."""
    from fsspec.implementations.local import LocalFileSystem

    if isinstance(fs, LocalFileSystem):
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


class SpillRange:
    """One spilled segment: in memory until it is written (``pending``), then its files.

    Reads work in either state; :meth:`write` swaps the tables for the files, whose footers are
    read once and cached. Immutable apart from that swap, so a reader may hold a range
    while another thread writes it. A range the store let go (:meth:`discard`: a bound of
    :mod:`mdata.lineage.limits` reached) frees its memory and reads as empty.
    """

    def __init__(self, index: int, first_step: int, stop_step: int, *,
                 segment: LineageSegment | None = None,
                 fs: Any = None, root: str | None = None) -> None:
        self.index, self.first_step, self.stop_step = int(index), int(first_step), int(stop_step)
        self._segment = segment
        self._converted: dict[str, pa.Table] | None = None
        self._fs, self._root = fs, root
        self._pa_fs: pafs.FileSystem | None = None
        self._metadata: dict[str, pq.FileMetaData] = {}
        self._lock = threading.Lock()
        self.discarded = False
        self.file_nbytes = 0

    @classmethod
    def of(cls, index: int, segment: LineageSegment) -> "SpillRange":
        """A pending range holding ``segment`` (cheap: its Arrow tables are built when first
        needed, by the writer or a reader, not by whoever hands the segment over)."""
        return cls(index, segment.first_step, segment.stop_step, segment=segment)

    @property
    def _tables(self) -> dict[str, pa.Table] | None:
        """The Arrow tables while pending (built once, sorted for the files), None once written."""
        with self._lock:
            if self._segment is None:
                return None
            if self._converted is None:
                seg = self._segment
                self._converted = {"samples": _arrow_table("samples", seg.samples),
                                   "loads": _arrow_table("loads", seg.loads),
                                   "ranks": _arrow_table("ranks", seg.rank_events),
                                   "skips": _arrow_table("skips", seg.skips)}
                # the tables hold it all now: let the segment's arrays go (memory once, not twice)
                self._segment = _CONVERTED
            return self._converted

    @property
    def stem(self) -> str:
        return f"{self.index:06d}-steps-{self.first_step:012d}-{self.stop_step:012d}"

    @property
    def written(self) -> bool:
        return self._segment is None and not self.discarded

    def path(self, table: str, root: str | None = None) -> str:
        return f"{(root or self._root).rstrip('/')}/{self.stem}.{table}.parquet"

    def covers(self, step: int) -> bool:
        return self.first_step <= int(step) < self.stop_step

    def write(self, fs: Any, root: str) -> None:
        """Write the four files under ``root`` (samples last: a complete stem has all four), then
        read from them and let the tables go."""
        tables = self._tables
        if tables is None:
            return
        fs.makedirs(root, exist_ok=True)
        size = 0
        for table in ("loads", "ranks", "skips", "samples"):
            with fs.open(self.path(table, root), "wb") as f:
                pq.write_table(tables[table], f, row_group_size=ROW_GROUP_ROWS, compression="zstd")
                size += f.tell()
        self.file_nbytes = size  # what retention's byte budget counts
        with self._lock:
            self._fs, self._root, self._segment, self._converted = fs, root, None, None

    @property
    def _arrow_fs(self) -> pafs.FileSystem:
        if self._pa_fs is None:
            self._pa_fs = arrow_filesystem(self._fs)
        return self._pa_fs

    def metadata(self, table: str) -> pq.FileMetaData:
        """The footer of one file, read once and kept (row-group statistics, schema)."""
        with self._lock:
            md = self._metadata.get(table)
            if md is None:
                with self._arrow_fs.open_input_file(self.path(table)) as f:
                    md = self._metadata[table] = pq.ParquetFile(f).metadata
            return md

    def discard(self) -> None:
        """Forget this range (dropped before it was written, or its files deleted by retention):
        its memory goes at once, even while a story holds the range, and it reads as empty."""
        with self._lock:
            self.discarded = True
            self._segment, self._converted, self._metadata = None, None, {}

    def read(self, table: str, equal: Mapping[str, int], isin: tuple[str, Sequence[int]] | None = None
             ) -> pa.Table:
        if self.discarded:
            return _schema(table).empty_table()
        try:
            return self._read(table, equal, isin)
        except OSError:
            if self.discarded:  # retention deleted the files while this story read them
                return _schema(table).empty_table()
            raise

    def _read(self, table: str, equal: Mapping[str, int], isin: tuple[str, Sequence[int]] | None = None
              ) -> pa.Table:
        """The rows of ``table`` whose columns equal ``equal`` (and whose ``isin[0]`` is one of
        ``isin[1]``). Row groups whose statistics exclude the values are not read; of the others
        only the key columns are, and the whole rows only where a predicate matched."""
        keys = list(equal) + ([isin[0]] if isin else [])
        tables = self._tables
        if tables is not None:
            t = tables[table]
            return t.filter(_mask(t.select(keys), equal, isin)) if keys else t
        if not keys:
            with self._arrow_fs.open_input_file(self.path(table)) as f:
                return pq.ParquetFile(f, metadata=self.metadata(table)).read()
        md = self.metadata(table)
        index = {md.schema.column(i).name: i for i in range(md.num_columns)}
        parts = []
        with self._arrow_fs.open_input_file(self.path(table)) as f:
            pf = pq.ParquetFile(f, metadata=md)
            for g in range(md.num_row_groups):
                if not _may_hold(md.row_group(g), index, equal, isin):
                    continue
                mask = _mask(pf.read_row_group(g, columns=keys), equal, isin)
                if pc.any(mask).as_py():
                    parts.append(pf.read_row_group(g).filter(mask))
        return pa.concat_tables(parts) if parts else _schema(table).empty_table()

    def nbytes(self) -> int:
        """Memory held: the segment, or its tables once built, while pending; 0 once written.

        Lock-free (the writer holds the range's lock while it builds the tables, a reader while it
        reads a footer from storage): callers on the event loop must not wait on either. The
        tables are set before the segment is let go, so any moment reads a sensible figure."""
        seg, tables = self._segment, self._converted
        if tables is not None:
            return sum(t.nbytes for t in tables.values())
        if seg is None or seg is _CONVERTED:  # written or discarded meanwhile
            return 0
        cols = [*seg.samples.values(), *seg.loads.values(), *seg.rank_events.values(), *seg.skips.values()]
        return sum(c.nbytes for c in cols)


class SpilledLineage:
    """The spilled ranges of one run, in spill order; thread-safe to add to and to read."""

    def __init__(self, ranges: Sequence[SpillRange] = ()) -> None:
        self._ranges = list(ranges)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, url: str, **storage_options: Any) -> "SpilledLineage":
        """The complete ranges found under ``url`` (an fsspec URL of one run's folder)."""
        import fsspec

        fs, root = fsspec.core.url_to_fs(url, **storage_options)
        stems: dict[tuple[int, int, int], set[str]] = {}
        for path in (fs.ls(root, detail=False) if fs.exists(root) else []):
            m = _NAME.match(path.rstrip("/").rsplit("/", 1)[-1])
            if m:
                stems.setdefault((int(m[1]), int(m[2]), int(m[3])), set()).add(m[4])
        return cls([SpillRange(i, a, b, fs=fs, root=root)
                    for (i, a, b), tables in sorted(stems.items()) if tables == set(TABLES)])

    def add(self, rng: SpillRange) -> None:
        with self._lock:
            self._ranges.append(rng)

    def remove(self, rng: SpillRange) -> None:
        """Let ``rng`` go (see :meth:`SpillRange.discard`); stories asked from now on skip it."""
        with self._lock:
            self._ranges = [r for r in self._ranges if r is not rng]
        rng.discard()

    def ranges(self) -> tuple[SpillRange, ...]:
        with self._lock:
            return tuple(self._ranges)

    def covering(self, step: int) -> tuple[SpillRange, ...]:
        """The ranges whose files hold lineage of ``step``."""
        return tuple(r for r in self.ranges() if r.covers(step))

    def pending_nbytes(self) -> int:
        return sum(r.nbytes() for r in self.ranges())

    def __len__(self) -> int:
        with self._lock:
            return len(self._ranges)


@dataclass(frozen=True)
class StoryQuery:
    """Every occurrence of one sample over the whole run: the DGraph's part, copied under the
    job's lock by :meth:`of`, and the spilled ranges known at that moment, read by :meth:`run`.

    A segment leaves the DGraph and joins the ranges in one step under the lock, so the copy and
    the ranges never share or miss an occurrence or a load.
    """

    sources: tuple[str, ...]
    source_index: int
    shard: int
    row: int
    memory: tuple[tuple[int, Mapping[str, Any], tuple[Event, ...]], ...]  # (id, sample, events)
    memory_loads: Mapping[str, np.ndarray]  # the source's loads in memory: chunk_id, worker, seq
    ranges: tuple[SpillRange, ...]

    @classmethod
    def of(cls, graph: DGraph, ranges: Sequence[SpillRange], source: str | int, shard: int,
           row: int) -> "StoryQuery":
        s = source if isinstance(source, int) else graph.sources.index(source)
        memory = tuple((int(i), graph.sample(int(i)), tuple(graph.story_events(int(i))))
                       for i in graph.find(s, shard, row))
        loads = graph.loads
        mask = loads.column("source_index") == s
        workers = np.asarray(graph.workers() or ("",), dtype=object)
        return cls(graph.sources, s, int(shard), int(row), memory, {
            "chunk_id": loads.column("chunk_id")[mask].copy(),
            "worker": workers[loads.column("worker")[mask]],
            "seq": loads.column("seq")[mask].copy(),
        }, tuple(ranges))

    def run(self) -> list[tuple[int, list[dict[str, Any]]]]:
        """``(lineage id, chronological events)`` of every occurrence, oldest first."""
        if not self.ranges:
            return [(i, occurrence_story(list(events))) for i, _, events in self.memory]
        where = {"source_index": self.source_index, "shard": self.shard, "row": self.row}
        spilled: list[tuple[int, SpillRange, dict[str, Any], int]] = []
        for rng in self.ranges:
            for rec in rng.read("samples", where).to_pylist():
                spilled.append((rec["lineage_id"], rng, sample_info(rec, self.sources), rec["plan_seq"]))
        chunks = {info["chunk_id"] for _, _, info, _ in spilled}
        chunks.update(info["chunk_id"] for _, info, _ in self.memory)
        loads = self._spilled_loads(chunks) if chunks else {}
        out = []
        for lineage_id, rng, info, plan_seq in sorted(spilled, key=lambda h: h[0]):
            ranks = rng.read("ranks", {"step": info["step"], "dp_rank": info["dp_rank"]})
            events = [*self._loads(info, loads, with_memory=True), planned_event(info, plan_seq),
                      *rank_story(info, ranks["kind"].to_numpy(), ranks["rank"].to_numpy(),
                                  ranks["seq"].to_numpy())]
            out.append((lineage_id, occurrence_story(events)))
        for lineage_id, info, events in self.memory:
            extra = self._loads(info, loads, with_memory=False)  # its own has the memory's loads
            out.append((lineage_id, occurrence_story([*extra, *events])))
        return out

    def _spilled_loads(self, chunks: set[int]) -> dict[int, list[tuple[str, int]]]:
        """Every spilled load of the sample's chunks: chunk id -> [(worker, seq)]."""
        out: dict[int, list[tuple[str, int]]] = {}
        for rng in self.ranges:
            t = rng.read("loads", {"source_index": self.source_index}, ("chunk_id", sorted(chunks)))
            for chunk, worker, seq in zip(t["chunk_id"].to_pylist(), t["worker"].to_pylist(),
                                          t["seq"].to_pylist()):
                out.setdefault(chunk, []).append((worker, seq))
        return out

    def _loads(self, info: Mapping[str, Any], spilled: Mapping[int, list[tuple[str, int]]],
               with_memory: bool) -> list[Event]:
        """``loaded`` events of the chunk of ``info``: spilled ones, and with ``with_memory``
        the ones the DGraph still holds."""
        rows = list(spilled.get(info["chunk_id"], ()))
        if with_memory:
            m = self.memory_loads["chunk_id"] == info["chunk_id"]
            rows += list(zip(self.memory_loads["worker"][m], self.memory_loads["seq"][m].tolist()))
        return loaded_events(info, [w for w, _ in rows], np.asarray([q for _, q in rows], np.int64))
