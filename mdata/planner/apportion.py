"""Apportioning: how many samples each source gives each step, and which ones, provisionally.

When a step enters the planning window the mixture gives its weights (or the weights a restored
checkpoint pinned for it), :class:`~mdata.mixing.ExactApportioner` turns them into whole counts
per source, and each source's :class:`~mdata.order.SourceOrder` hands out the samples from the
source's provisional cursor on. They are provisional because a loader may skip rows: when a step
is balanced on fewer usable rows than it took, the cursors move further, and every later step
planned so far takes its samples again from the moved cursors (:meth:`Provisioner.shift`).

The mixture's own state (a metric policy's history, the weights decided for steps planned ahead)
lives here too, so a checkpoint takes it from one place (:meth:`Provisioner.mixture_state`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mdata.errors import MdataError
from mdata.identity import listing_entries
from mdata.mixing import ExactApportioner, MetricsRecord, MixtureSchedule
from mdata.order import SourceOrder
from mdata.plan import Plan
from mdata.planner.chunk_table import SHIFT
from mdata.planner.window_pool import WindowPool

__all__ = ["PlannedStep", "Provisioner", "row_counts_of", "source_orders"]


def row_counts_of(listing: Any) -> np.ndarray:
    """Rows per shard from a SourceListing, SourceMetadata, ``[(shard name, rows), ...]`` or a
    plain sequence of counts."""
    if hasattr(listing, "shards"):
        return np.array([s.num_rows for s in listing.shards], dtype=np.int64)
    if hasattr(listing, "shard_rows"):
        return np.asarray(listing.shard_rows, dtype=np.int64)
    return np.array([rows for _, rows in listing_entries(listing)], dtype=np.int64)


def source_orders(plan: Plan, listings: Mapping[str, Any],
                  appended: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> list[SourceOrder]:
    """Each source's deterministic order, in plan order, from its rows per shard (and the
    growths of its listing a resume accepted, see :mod:`mdata.order`)."""
    names = plan.source_names
    missing = [n for n in names if n not in listings]
    if missing:
        raise MdataError(f"no listing (rows per shard) for sources {missing}; list their shards first")
    grown = appended or {}
    return [SourceOrder(row_counts_of(listings[n]), plan.chunk_rows(n), plan.seed_value, n,
                        plan.shuffle_chunks, appended=grown.get(n, ()))
            for n in names]


class PlannedStep:
    """One step from being apportioned until every DP group consumed it.

    ``prov_start`` are the source cursors its provisional samples start at, ``taken`` those
    samples (source index, shard, row, chunk id, cursor arrays); ``cursors_before`` and
    ``carry_before`` are what a checkpoint of this step stores. ``consumed`` maps each DP group to
    the ranks that consumed it; ``groups_done`` counts the complete groups.
    """

    __slots__ = ("step", "weights", "counts", "prov_start", "taken", "cursors_before",
                 "carry_before", "consumed", "groups_done", "balanced")

    def __init__(self, step: int, weights: np.ndarray, counts: np.ndarray, prov_start: np.ndarray,
                 carry_before: np.ndarray) -> None:
        self.step = step
        self.weights = weights
        self.counts = counts
        self.prov_start = prov_start
        self.carry_before = carry_before
        self.taken: tuple[np.ndarray, ...] = ()
        self.cursors_before: np.ndarray | None = None
        self.consumed: dict[int, set[int]] = {}
        self.groups_done = 0
        self.balanced = False

    def chunk_keys(self) -> np.ndarray:
        """Chunk keys (see :func:`~mdata.planner.chunk_table.chunk_key`) of its provisional
        samples, ascending: the order in which their loads are requested."""
        src, _, _, chunk, _ = self.taken
        return np.unique((src << SHIFT) | chunk)


class Provisioner:
    """Weights, per-source counts and provisional samples of each step, in step order.

    ``cursor`` is each source's provisional cursor after the last apportioned step.
    ``schedule`` is the job's own copy of the plan's mixture (stateful policies change it).
    """

    def __init__(self, orders: Sequence[SourceOrder], names: tuple[str, ...],
                 schedule: MixtureSchedule, global_batch: int) -> None:
        S = len(names)
        self.orders = orders
        self.names = names
        self.schedule = schedule
        self.apportioner = ExactApportioner(S, global_batch)
        self.history: deque[MetricsRecord] = deque(
            maxlen=getattr(schedule, "history_size", 0) if schedule.stateful else 0)
        self.pinned: dict[int, np.ndarray] = {}  # weights a checkpoint decided for later steps
        self.cursor = np.zeros(S, np.int64)
        self.last_weights = np.zeros(S)
        #: per source, the window its order read last, in flat arrays (see WindowPool)
        self._pool = WindowPool(orders)

    def observe(self, step: int, rank: int, metrics: Mapping[str, float]) -> None:
        """A trainer's metrics, for a metric-driven mixture policy (others ignore them)."""
        if self.schedule.stateful:
            self.history.append(MetricsRecord(step, rank, dict(metrics)))

    def plan(self, step: int) -> PlannedStep:
        """Apportion ``step`` (the one after the last apportioned) and take its samples."""
        pinned = self.pinned.pop(step, None)
        if pinned is not None:
            weights = pinned
        else:
            weights = self.schedule.weights_vector(step, self.names, tuple(self.history))
        carry_before = self.apportioner.carry.copy()
        counts = self.apportioner.counts(weights)
        st = PlannedStep(step, weights, counts, self.cursor.copy(), carry_before)
        self.cursor += counts
        st.taken = self.take(st.prov_start, counts)
        self.last_weights = weights
        return st

    def shift(self, steps: Sequence[PlannedStep], delta: np.ndarray) -> None:
        """Skipped rows pushed the sources' cursors forward by ``delta``: these later steps take
        their samples again from the moved cursors (their counts stay)."""
        self.cursor += delta
        for st in steps:
            st.prov_start = st.prov_start + delta
            st.taken = self.take(st.prov_start, st.counts)

    def take(self, starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, ...]:
        """Samples at ``starts[i] ..`` of every source: (src, shard, row, chunk, cursor) arrays.

        Most sources' samples lie inside the shuffle window their order read last: those are
        gathered from the pool of those windows at once (:class:`WindowPool`), and only a source
        that crosses into another window asks its order (a Python call per source and step was
        most of the apportioning time at thousands of sources).
        """
        nz = np.flatnonzero(counts)
        if not nz.size:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty, empty, empty
        c = counts[nz]
        p = starts[nz]
        total = int(c.sum())
        src = np.repeat(nz, c)
        first = np.cumsum(c) - c
        cursor = np.repeat(p - first, c) + np.arange(total)
        pool = self._pool
        inside = pool.inside(nz, p, c)
        if inside.all():
            shard, row, chunk = pool.gather(src, cursor)
            return src, shard, row, chunk, cursor
        mask = np.repeat(inside, c)
        shard = np.empty(total, np.int64)
        row = np.empty(total, np.int64)
        chunk = np.empty(total, np.int64)
        # gather first: the crossing sources below rewrite their own slots only
        shard[mask], row[mask], chunk[mask] = pool.gather(src[mask], cursor[mask])
        orders = self.orders
        for j in np.flatnonzero(~inside).tolist():
            i, a, n = int(nz[j]), int(first[j]), int(c[j])
            part = orders[i].take(int(p[j]), n)
            pool.put(i, *orders[i].last_window())
            shard[a:a + n] = part.shards
            row[a:a + n] = part.rows
            chunk[a:a + n] = part.chunk_ids
        return src, shard, row, chunk, cursor

    # -- checkpoints ---------------------------------------------------------------------------
    def mixture_state(self, step: int, planned: Mapping[int, np.ndarray]) -> dict[str, Any]:
        """The mixture part of a checkpoint of ``step``; ``planned`` are the weights of the steps
        from ``step`` on that are apportioned already (a restored job must reuse them)."""
        if not self.schedule.stateful:
            return {}
        pinned = {t: w for t, w in self.pinned.items() if t >= step}
        pinned.update(planned)
        return {
            "state": self.schedule.state_dict(),
            "history": [r.to_dict() for r in self.history],
            "pinned": {str(t): [float(x) for x in w] for t, w in sorted(pinned.items())},
        }

    def restore(self, cursors: np.ndarray, apportioner: Mapping[str, Any],
                mixture: Mapping[str, Any]) -> None:
        """Continue from a checkpoint's cursors, apportioner carries and mixture state."""
        self.cursor = cursors.copy()
        self.apportioner.load_state_dict(apportioner)
        if self.schedule.stateful and mixture:
            self.schedule.load_state_dict(mixture.get("state", {}))
            self.history.extend(MetricsRecord.from_dict(r) for r in mixture.get("history", []))
            self.pinned = {int(t): np.asarray(w, np.float64)
                           for t, w in mixture.get("pinned", {}).items()}
