"""DGraph: the lineage of every sample, in columnar numpy tables.

For every planned sample the DGraph answers where it came from and where it went: which chunk
(and so which source, shard and row) it was loaded in and by which worker, which step, DP rank,
micro-batch and position it was planned into, which trainer ranks received the batch and which
consumed it. One Python object per sample would cost hundreds of bytes and dominate the Planner's
time at thousands of GPUs, so the tables are parallel numpy columns that grow by doubling
(amortised O(1) appends, vectorised per step) and a sample's *lineage id* is its row in the
samples table.

``story(sample_id)`` turns one row back into readable, chronological events, modelled on
distributed's ``_stories``; ``verify_exactly_once`` checks that no sample was lost or duplicated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mdata.errors import PlanError

__all__ = ["ColumnTable", "DGraph", "ExactlyOnceReport"]


class ColumnTable:
    """Append-only table of fixed-dtype numpy columns with amortised growth."""

    def __init__(self, dtypes: Mapping[str, Any], capacity: int = 1024) -> None:
        self._dtypes = dict(dtypes)
        self._cols = {name: np.empty(capacity, dtype=dt) for name, dt in self._dtypes.items()}
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def append(self, **columns: np.ndarray | int) -> tuple[int, int]:
        """Append rows (arrays of equal length; scalars broadcast); returns their ``[start, stop)``."""
        lengths = {np.size(v) for v in columns.values() if np.ndim(v) > 0}
        if len(lengths) > 1:
            raise ValueError(f"columns of different lengths {sorted(lengths)}")
        if set(columns) != set(self._dtypes):
            raise ValueError(f"expected columns {sorted(self._dtypes)}, got {sorted(columns)}")
        k = lengths.pop() if lengths else 1
        start, stop = self._n, self._n + k
        capacity = next(iter(self._cols.values())).size
        if stop > capacity:
            new = max(stop, 2 * capacity)
            for name, col in self._cols.items():
                grown = np.empty(new, dtype=col.dtype)
                grown[:start] = col[:start]
                self._cols[name] = grown
        for name, value in columns.items():
            self._cols[name][start:stop] = value
        self._n = stop
        return start, stop

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the rows where ``mask`` is true (in place, order preserved)."""
        kept = int(np.count_nonzero(mask))
        for name, col in self._cols.items():
            col[:kept] = col[: self._n][mask]
        self._n = kept

    def column(self, name: str) -> np.ndarray:
        """A read-only view of the filled part of column ``name``."""
        view = self._cols[name][: self._n]
        view.flags.writeable = False
        return view

    def row(self, i: int) -> dict[str, int]:
        return {name: col[i].item() for name, col in self._cols.items()}

    @property
    def nbytes(self) -> int:
        """Bytes held by the filled rows (capacity beyond them is at most as much again)."""
        return sum(col.dtype.itemsize for col in self._cols.values()) * self._n

    @property
    def row_nbytes(self) -> int:
        return sum(col.dtype.itemsize for col in self._cols.values())


_SAMPLE_COLUMNS = {
    "source_index": np.int32,
    "shard": np.int32,
    "row": np.int64,
    "chunk_id": np.int64,
    "cursor": np.int64,  # position in the source's infinite order: gaps and repeats show here
    "step": np.int64,
    "dp_rank": np.int32,
    "micro_batch": np.int32,
    "position": np.int32,
    "num_tokens": np.int32,
}
_LOAD_COLUMNS = {"source_index": np.int32, "chunk_id": np.int64, "worker": np.int32, "seq": np.int64}
_RANK_COLUMNS = {"step": np.int64, "dp_rank": np.int32, "rank": np.int32, "kind": np.int8, "seq": np.int64}
_SKIP_COLUMNS = {"source_index": np.int32, "shard": np.int32, "row": np.int64, "cursor": np.int64,
                 "step": np.int64}
_DELIVERED, _CONSUMED = 0, 1


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

    def __len__(self) -> int:
        return len(self.samples_table)

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
        self.loads.append(source_index=source_index, chunk_id=chunk_id, worker=w, seq=self._next_seq())

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

    def record_consumed(self, step: int, dp_rank: int, rank: int) -> None:
        """Trainer ``rank`` (of DP group ``dp_rank``) consumed its batch of ``step``."""
        self._seq += 1
        self._rank_buffer.append((step, dp_rank, rank, _CONSUMED, self._seq))

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
        row = self.samples_table.row(int(sample_id) - self._base)
        row["source"] = self.sources[row["source_index"]]
        return row

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
        return (self.samples_table.nbytes + self.loads.nbytes + self.rank_events.nbytes
                + self.skips.nbytes)

    def story(self, sample_id: int) -> list[dict[str, Any]]:
        """What happened to one sample, in order: loaded, planned, delivered, consumed."""
        info = self.sample(sample_id)
        plan_seq = self._step_seq[info["step"]]
        events: list[tuple[int, dict[str, Any]]] = []
        loads = self.loads
        mask = ((loads.column("source_index") == info["source_index"])
                & (loads.column("chunk_id") == info["chunk_id"]))
        for i in np.flatnonzero(mask):
            events.append((int(loads.column("seq")[i]), {
                "event": "loaded", "source": info["source"], "shard": info["shard"],
                "row": info["row"], "chunk": info["chunk_id"],
                "worker": self._workers[int(loads.column("worker")[i])],
            }))
        events.append((plan_seq, {
            "event": "planned", "step": info["step"], "dp_rank": info["dp_rank"],
            "micro_batch": info["micro_batch"], "position": info["position"],
            "num_tokens": info["num_tokens"], "cursor": info["cursor"],
        }))
        ev = self.rank_events
        mask = (ev.column("step") == info["step"]) & (ev.column("dp_rank") == info["dp_rank"])
        for kind, label in ((_DELIVERED, "delivered"), (_CONSUMED, "consumed")):
            idx = np.flatnonzero(mask & (ev.column("kind") == kind))
            if idx.size:
                events.append((int(ev.column("seq")[idx].min()), {
                    "event": label, "step": info["step"], "dp_rank": info["dp_rank"],
                    "ranks": sorted({int(r) for r in ev.column("rank")[idx]}),
                }))
        events.sort(key=lambda e: e[0])
        return [e for _, e in events]

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
