"""DGraph: the lineage of every sample, in columnar numpy tables.

For every planned sample the DGraph answers where it came from and where it went: which chunk
(and so which source, shard and row) it was loaded in and by which worker, which step, DP rank,
micro-batch and position it was planned into, which trainer ranks received the batch and which
consumed it. One Python object per sample would cost hundreds of bytes and dominate the Planner's
time at thousands of GPUs, so the tables are parallel numpy columns that grow by doubling
(amortised O(1) appends, vectorised per step, :mod:`mdata.lineage.column_table`) and a sample's
*lineage id* is its row in the samples table (plus the ids a long run forgot or spilled before it).

``story(sample_id)`` turns one row back into readable, chronological events, modelled on
distributed's ``_stories``; ``verify_exactly_once`` checks that no sample was lost or duplicated.
A long run keeps a bounded window of steps in memory: ``forget_before`` drops older lineage,
``take_before`` hands it out as a :class:`~mdata.lineage.events.LineageSegment` to be spilled to
files (:mod:`mdata.lineage.spill`), whose stories then read the same as the DGraph's own.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mdata.errors import PlanError
from mdata.lineage.column_table import ColumnTable
from mdata.lineage.events import (
    CONSUMED as _CONSUMED, DELIVERED as _DELIVERED, LOAD_COLUMNS as _LOAD_COLUMNS,
    RANK_COLUMNS as _RANK_COLUMNS, SAMPLE_COLUMNS as _SAMPLE_COLUMNS, SKIP_COLUMNS as _SKIP_COLUMNS,
    Event, LineageSegment, loaded_events, occurrence_story, planned_event, rank_story, sample_info,
)

__all__ = ["DGraph", "ExactlyOnceReport", "LineageSegment"]

# rank rows buffered as tuples before they become columns: flushed at this many (bounded memory)
_RANK_BUFFER_ROWS = 1 << 16
_ALL_STEPS = 1 << 62


@dataclass
class ExactlyOnceReport:
    """Result of :meth:`DGraph.verify_exactly_once`: ``ok`` and, if not, what went wrong."""

    start: int
    stop: int
    samples: int
    skipped: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def __bool__(self) -> bool:
        return self.ok


class DGraph:
    """The lineage tables of one job (see the module docstring).

    ``sources`` are the plan's source names in plan order (``source_index`` refers to them).
    ``group_ranks(dp_rank)`` returns the trainer ranks of a DP group; :meth:`verify_exactly_once`
    uses it to check that every rank of a group consumed the group's batch.
    """

    def __init__(self, sources: Sequence[str], group_ranks=None) -> None:
        self.sources = tuple(sources)
        self._group_ranks = group_ranks
        self.samples_table = ColumnTable(_SAMPLE_COLUMNS, capacity=4096)
        self.loads = ColumnTable(_LOAD_COLUMNS)
        self._rank_events = ColumnTable(_RANK_COLUMNS)
        # thousands of ranks report every step: buffer those rows in lists, flush on query
        self._rank_buffer: list[tuple[int, int, int, int, int]] = []
        self.skips = ColumnTable(_SKIP_COLUMNS)
        self._workers: list[str] = []
        self._worker_index: dict[str, int] = {}
        self._step_ranges: dict[int, tuple[int, int]] = {}
        self._step_seq: dict[int, int] = {}  # when each step was planned, to order stories
        self._seq = 0
        self._id_index: tuple[int, np.ndarray, np.ndarray] | None = None
        # lineage ids stay global when old steps are forgotten: row = id - _base
        self._base = 0
        self.forgotten_before = 0  # steps before this one were dropped (retention)
        self.loads_before = 0  # loads with a smaller seq were taken out (take_before)

    def __len__(self) -> int:
        return len(self.samples_table)

    @property
    def first_id(self) -> int:
        """The smallest lineage id still in memory (ids below it were forgotten or taken)."""
        return self._base

    @property
    def next_id(self) -> int:
        """The lineage id the next planned sample gets."""
        return self._base + len(self.samples_table)

    def continue_after(self, previous: "DGraph") -> None:
        """Go on numbering lineage ids and events after ``previous`` (a job rewound to a
        checkpoint builds a new DGraph): ids stay unique over the whole run, events ordered."""
        if len(self.samples_table) or len(self.loads) or self._rank_buffer or len(self._rank_events):
            raise PlanError("DGraph.continue_after: this DGraph has recorded lineage already")
        self._base = previous.next_id
        self._seq = max(self._seq, previous._seq)
        self.loads_before = self._seq + 1

    def forget_before(self, step: int) -> int:
        """Drop the lineage of steps before ``step`` (a long run keeps a bounded window);
        lineage ids of the steps kept do not change. Returns how many samples were dropped."""
        step = int(step)
        if step <= self.forgotten_before:
            return 0
        gone = [s for s in self._step_ranges if s < step]
        drop = max((self._step_ranges[s][1] for s in gone), default=self._base) - self._base
        if drop:
            keep = np.ones(len(self.samples_table), dtype=bool)
            keep[:drop] = False
            self.samples_table.keep(keep)
            self._base += drop
        for s in gone:
            del self._step_ranges[s]
            self._step_seq.pop(s, None)
        events = self.rank_events
        events.keep(events.column("step") >= step)
        self.skips.keep(self.skips.column("step") >= step)
        self._id_index = None
        self.forgotten_before = step
        return drop

    def take_before(self, step: int | None = None) -> LineageSegment | None:
        """Like :meth:`forget_before`, but hand the lineage out instead of dropping it: the
        samples, rank and skip rows of steps before ``step`` (every step when None) and the loads
        recorded before the first step kept was planned. None when there is nothing to take."""
        limit = _ALL_STEPS if step is None else int(step)
        if limit <= self.forgotten_before:
            return None
        events = self.rank_events  # flushes the buffered rank rows
        gone = sorted(s for s in self._step_ranges if s < limit)
        first_step = gone[0] if gone else self.forgotten_before  # a rewound job starts later
        first_id = self._base
        stop_id = max((self._step_ranges[s][1] for s in gone), default=first_id)
        samples = self.samples_table.copy_rows(slice(0, stop_id - first_id))
        samples["lineage_id"] = np.arange(first_id, stop_id, dtype=np.int64)
        samples["plan_seq"] = np.repeat(
            np.array([self._step_seq[s] for s in gone], dtype=np.int64),
            [self._step_ranges[s][1] - self._step_ranges[s][0] for s in gone])
        kept_seq = [q for s, q in self._step_seq.items() if s >= limit]
        loads_before = max(self.loads_before, min(kept_seq) if kept_seq else self._seq + 1)
        load_mask = self.loads.column("seq") < loads_before
        loads = self.loads.copy_rows(load_mask)
        loads["worker"] = np.array(self._workers, dtype=object)[loads["worker"]].astype(str) \
            if len(loads["worker"]) else np.array([], dtype=str)
        ranks = events.copy_rows(events.column("step") < limit)
        skips = self.skips.copy_rows(self.skips.column("step") < limit)
        stop_step = limit if step is not None else max(
            [first_step, *(s + 1 for s in gone), *(int(x) + 1 for x in ranks["step"])])
        segment = LineageSegment(self.sources, first_step, max(first_step, stop_step), first_id,
                                 stop_id, loads_before, samples, loads, ranks, skips)
        self.forget_before(limit)
        self.loads.keep(~load_mask)
        self.loads_before = loads_before
        return None if segment.empty else segment

    # -- recording ------------------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def record_load(self, source_index: int, chunk_id: int, worker: str) -> None:
        """Chunk ``chunk_id`` of source ``source_index`` was loaded by ``worker``."""
        w = self._worker_index.get(worker)
        if w is None:
            w = self._worker_index[worker] = len(self._workers)
            self._workers.append(worker)
        self.loads.append_row(source_index, chunk_id, w, self._next_seq())  # LOAD_COLUMNS' order

    def record_step(
        self,
        step: int,
        *,
        source_index: np.ndarray,
        shard: np.ndarray,
        row: np.ndarray,
        chunk_id: np.ndarray,
        cursor: np.ndarray,
        dp_rank: np.ndarray,
        micro_batch: np.ndarray,
        position: np.ndarray,
        num_tokens: np.ndarray,
    ) -> np.ndarray:
        """Record the planned samples of one step; returns their lineage ids (int64)."""
        if step in self._step_ranges:
            raise PlanError(f"DGraph: step {step} was already recorded")
        start, stop = self.samples_table.append(
            source_index=source_index, shard=shard, row=row, chunk_id=chunk_id, cursor=cursor,
            step=step, dp_rank=dp_rank, micro_batch=micro_batch, position=position,
            num_tokens=num_tokens,
        )
        start, stop = start + self._base, stop + self._base  # global lineage ids
        self._step_ranges[int(step)] = (start, stop)
        self._step_seq[int(step)] = self._next_seq()
        return np.arange(start, stop, dtype=np.int64)

    def record_skips(self, step: int, source_index: int, shards, rows, cursors) -> None:
        """Positions of the order passed over while planning ``step`` (rows a loader skipped)."""
        self.skips.append(source_index=source_index, shard=shards, row=rows, cursor=cursors, step=step)

    def record_delivered(self, step: int, dp_rank: int, ranks: Sequence[int]) -> None:
        """The batch of ``(step, dp_rank)`` was handed to trainer ``ranks``."""
        seq = self._next_seq()
        self._rank_buffer.extend((step, dp_rank, int(r), _DELIVERED, seq) for r in ranks)
        if len(self._rank_buffer) >= _RANK_BUFFER_ROWS:
            self.rank_events  # noqa: B018 - flushes the tuples into columns (bounded memory)

    def record_consumed(self, step: int, dp_rank: int, rank: int) -> None:
        """Trainer ``rank`` (of DP group ``dp_rank``) consumed its batch of ``step``."""
        self._seq += 1
        self._rank_buffer.append((step, dp_rank, rank, _CONSUMED, self._seq))
        if len(self._rank_buffer) >= _RANK_BUFFER_ROWS:
            self.rank_events  # noqa: B018 - flushes the tuples into columns (bounded memory)

    def record_consumed_many(self, step: int, dp_ranks: np.ndarray, ranks: np.ndarray) -> None:
        """Trainer ``ranks[i]`` (of DP group ``dp_ranks[i]``) consumed its batch of ``step``:
        :meth:`record_consumed` for each, in order, as one block of columns (a step of thousands
        of ranks arrives as one coalesced event; a tuple per rank was a tenth of its cost)."""
        n = len(ranks)
        if n == 0:
            return
        self.rank_events  # noqa: B018 - flush the buffered rows first, so events stay in order
        seq = np.arange(self._seq + 1, self._seq + 1 + n, dtype=np.int64)
        self._seq += n
        self._rank_events.append(step=int(step), dp_rank=np.asarray(dp_ranks, np.int64),
                                 rank=np.asarray(ranks, np.int64), kind=_CONSUMED, seq=seq)

    @property
    def rank_events(self) -> ColumnTable:
        """Delivery and consumption rows: step, dp_rank, rank, kind (0 delivered, 1 consumed), seq."""
        if self._rank_buffer:
            cols = np.array(self._rank_buffer, dtype=np.int64).T
            self._rank_buffer = []
            self._rank_events.append(step=cols[0], dp_rank=cols[1], rank=cols[2], kind=cols[3],
                                     seq=cols[4])
        return self._rank_events

    # -- queries --------------------------------------------------------------------------------
    def samples(self, step: int, dp_rank: int | None = None) -> np.ndarray:
        """Lineage ids of the samples of ``step`` (of one DP rank if given), in planning order."""
        start, stop = self._step_ranges.get(int(step), (0, 0))
        ids = np.arange(start, stop, dtype=np.int64)
        if dp_rank is None:
            return ids
        b = self._base
        return ids[self.samples_table.column("dp_rank")[start - b:stop - b] == dp_rank]

    def sample(self, sample_id: int) -> dict[str, Any]:
        """The row of one lineage id, with the source's name."""
        self._check_id(sample_id)
        return sample_info(self.samples_table.row(int(sample_id) - self._base), self.sources)

    def find(self, source: str | int, shard: int, row: int) -> np.ndarray:
        """Lineage ids of every occurrence (one per epoch it was planned in) of a sample id."""
        s = source if isinstance(source, int) else self.sources.index(source)
        n = len(self.samples_table)
        if self._id_index is None or self._id_index[0] != n:
            t = self.samples_table
            order = np.lexsort((t.column("row"), t.column("shard"), t.column("source_index")))
            keys = np.stack([t.column("source_index")[order].astype(np.int64),
                             t.column("shard")[order].astype(np.int64), t.column("row")[order]], 1)
            self._id_index = (n, order, keys)
        _, order, keys = self._id_index
        target = np.array([s, shard, row], dtype=np.int64)
        lo = _search(keys, target, "left")
        hi = _search(keys, target, "right")
        return np.sort(order[lo:hi]).astype(np.int64) + self._base

    def workers(self) -> tuple[str, ...]:
        return tuple(self._workers)

    def bytes_per_sample(self) -> float:
        """Bytes the samples table holds per planned sample (the DGraph's dominant cost)."""
        return float(self.samples_table.row_nbytes)

    def nbytes(self) -> int:
        """Bytes the DGraph holds in memory: its tables' columns (allocated capacity included),
        the rank rows still buffered as tuples, and the per-step and per-worker indexes."""
        tables = (self.samples_table, self.loads, self._rank_events, self.skips)
        buffered = len(self._rank_buffer) * (sys.getsizeof((0,) * 5) + 8)  # + the list's pointer
        index = (sys.getsizeof(self._step_ranges) + sys.getsizeof(self._step_seq)
                 + len(self._step_ranges) * 2 * sys.getsizeof((0, 0)))
        if self._id_index is not None:
            index += self._id_index[1].nbytes + self._id_index[2].nbytes
        workers = sum(sys.getsizeof(w) for w in self._workers)
        return sum(t.allocated_nbytes for t in tables) + buffered + index + workers

    def story(self, sample_id: int) -> list[dict[str, Any]]:
        """What happened to one sample, in order: loaded, planned, delivered, consumed."""
        return occurrence_story(self.story_events(sample_id))

    def story_events(self, sample_id: int) -> list[Event]:
        """The events of :meth:`story`, each with its sequence number (to merge with spilled ones)."""
        info = self.sample(sample_id)
        return [*self.load_events(info), planned_event(info, self._step_seq[info["step"]]),
                *self.rank_events_of(info)]

    def load_events(self, info: dict[str, Any]) -> list[Event]:
        """The loads in memory of the chunk of ``info`` (a sample's row, see :meth:`sample`)."""
        loads = self.loads
        idx = np.flatnonzero((loads.column("source_index") == info["source_index"])
                             & (loads.column("chunk_id") == info["chunk_id"]))
        workers = [self._workers[int(w)] for w in loads.column("worker")[idx]]
        return loaded_events(info, workers, loads.column("seq")[idx])

    def rank_events_of(self, info: dict[str, Any]) -> list[Event]:
        """Delivery and consumption of the step and DP rank of ``info``, from memory."""
        ev = self.rank_events
        idx = np.flatnonzero((ev.column("step") == info["step"]) & (ev.column("dp_rank") == info["dp_rank"]))
        return rank_story(info, ev.column("kind")[idx], ev.column("rank")[idx], ev.column("seq")[idx])

    def verify_exactly_once(
        self, start: int, stop: int, *, require_consumed: bool = True
    ) -> ExactlyOnceReport:
        """Check steps ``[start, stop)``: per source, the planned and skipped order positions form
        one gap-free run without repeats, and (with ``require_consumed``) every rank of each DP
        group consumed its batch."""
        t = self.samples_table
        ranges = [self._step_ranges[s] for s in range(start, stop) if s in self._step_ranges]
        missing = [s for s in range(max(start, self.forgotten_before), stop)
                   if s not in self._step_ranges]
        if start < self.forgotten_before:
            raise PlanError(
                f"DGraph: steps before {self.forgotten_before} were forgotten (lineage retention); "
                f"verify steps {self.forgotten_before} and later, or keep more steps")
        report = ExactlyOnceReport(start, stop, sum(b - a for a, b in ranges), 0)
        if missing:
            report.problems.append(f"steps {missing[:10]} were never planned")
        if not ranges:
            return report
        ids = np.concatenate([np.arange(a, b) for a, b in ranges]) - self._base
        skip_mask = (self.skips.column("step") >= start) & (self.skips.column("step") < stop)
        report.skipped = int(skip_mask.sum())
        for s, name in enumerate(self.sources):
            cur = t.column("cursor")[ids][t.column("source_index")[ids] == s]
            cur = np.concatenate([cur, self.skips.column("cursor")[
                skip_mask & (self.skips.column("source_index") == s)]])
            if cur.size == 0:
                continue
            cur = np.sort(cur)
            dup = cur[1:][np.diff(cur) == 0]
            if dup.size:
                report.problems.append(
                    f"source {name!r}: order positions {dup[:5].tolist()} planned more than once")
            gaps = np.flatnonzero(np.diff(cur) > 1)
            if gaps.size:
                report.problems.append(
                    f"source {name!r}: order positions {(cur[gaps] + 1)[:5].tolist()} were "
                    "passed over without being planned or skipped")
        if require_consumed and self._group_ranks is not None:
            ev = self.rank_events
            consumed = ev.column("kind") == _CONSUMED
            seen = set(zip(ev.column("step")[consumed].tolist(), ev.column("rank")[consumed].tolist()))
            for s in range(start, stop):
                if s not in self._step_ranges:
                    continue
                a, b = (x - self._base for x in self._step_ranges[s])
                for dp in np.unique(t.column("dp_rank")[a:b]).tolist():
                    lacking = [r for r in self._group_ranks(dp) if (s, r) not in seen]
                    if lacking:
                        report.problems.append(
                            f"step {s}, DP rank {dp}: ranks {lacking[:8]} never consumed the batch")
        return report

    # -- helpers --------------------------------------------------------------------------------
    def _check_id(self, sample_id: int) -> None:
        first, end = self._base, self._base + len(self.samples_table)
        if not first <= int(sample_id) < end:
            why = " (forgotten: lineage retention)" if 0 <= int(sample_id) < first else ""
            raise PlanError(
                f"DGraph holds lineage ids {first}..{end - 1}; lineage id {sample_id} is unknown{why}")


def _search(keys: np.ndarray, target: np.ndarray, side: str) -> int:
    """Binary search of a row in lexicographically sorted rows of ``keys``."""
    lo, hi = 0, keys.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        row = tuple(keys[mid])
        t = tuple(target)
        if row < t or (side == "right" and row == t):
            lo = mid + 1
        else:
            hi = mid
    return lo
