"""What the Planner hears: the events fed to :meth:`PlannerState.handle`.

Every event carries a ``stimulus_id`` naming what caused it; the instructions it causes repeat
that id, and the state's log keeps both, so a decision can be traced to its cause afterwards.
Events are plain values: the scheduler plugin, :func:`~mdata.planner.simulate` and tests build
them the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from mdata.order import ChunkRef

__all__ = [
    "PlannerEvent", "Tick", "ChunkLoaded", "ChunkFailed", "WorkerLost", "BatchDelivered",
    "BatchConsumed", "RanksConsumed", "MetricsReported", "coalesce_acknowledgements",
]


@dataclass(frozen=True, kw_only=True)
class PlannerEvent:
    """Base of every event; ``stimulus_id`` names what caused it (for logs and instructions)."""

    stimulus_id: str


@dataclass(frozen=True)
class Tick(PlannerEvent):
    """Time passes; ``now`` (seconds, monotonic) feeds step-rate measurement and pool sizing.

    ``waited_s``: how long trainer ranks waited for batches so far, in all (mean over ranks);
    ``pool_threads``: loader threads per worker of each source's pool (plan order; 0 or empty:
    not known); ``wall``: wall-clock seconds stamped on pool decisions.
    """

    now: float | None = None
    waited_s: float = 0.0
    pool_threads: tuple[int, ...] = ()
    wall: float = 0.0


@dataclass(frozen=True, eq=False)
class ChunkLoaded(PlannerEvent):
    """A load task finished: the kept ``rows`` (ascending) with their cost features.

    ``skipped_rows`` are rows the transform rejected under the source's skip tolerance;
    ``seconds`` is the task's wall time (it sizes the pools).
    """

    chunk: ChunkRef
    rows: np.ndarray
    num_tokens: np.ndarray
    num_patches: np.ndarray | None = None
    skipped_rows: Sequence[int] = ()
    worker: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class ChunkFailed(PlannerEvent):
    """A load task raised (corrupt shard, schema mismatch, skip budget exceeded...).

    ``error`` is the exception itself, typically a :class:`~mdata.errors.SourceError` naming the
    source, shard and row; the :class:`~mdata.planner.instructions.JobFailed` it causes carries it
    on, so whoever reports the failure keeps those fields instead of parsing a message.
    """

    chunk: ChunkRef
    error: BaseException


@dataclass(frozen=True)
class WorkerLost(PlannerEvent):
    """A loader worker died; ``chunks`` (refs or task keys) lived on it, as far as Dask knows."""

    worker: str
    chunks: tuple = ()


@dataclass(frozen=True)
class BatchDelivered(PlannerEvent):
    """The batch of ``(step, dp_rank)`` was handed to trainer ``ranks`` (lineage only)."""

    step: int
    dp_rank: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class BatchConsumed(PlannerEvent):
    """Trainer ``rank`` consumed its batch of ``step``."""

    step: int
    rank: int


@dataclass(frozen=True)
class RanksConsumed(PlannerEvent):
    """Trainer ``ranks`` consumed their batches of ``step``: the acknowledgements that arrived
    together, as one event (at thousands of ranks, one event per rank costs more than the
    planning itself). Same effect as one :class:`BatchConsumed` per rank."""

    step: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class MetricsReported(PlannerEvent):
    """Trainer ``rank`` reports metrics of ``step`` (fed to a metric-driven mixture policy)."""

    step: int
    rank: int
    metrics: Mapping[str, float] = field(default_factory=dict)


def coalesce_acknowledgements(events: Sequence[PlannerEvent]) -> list[PlannerEvent]:
    """Merge the acknowledgements of a batch of events: deliveries by (step, DP rank), then
    consumptions by step as :class:`RanksConsumed`, in step order, after any other events.

    The runtime applies trainers' acknowledgements in batches; merged, thousands of ranks cost a
    few events per step instead of two each. Deliveries go first so a sample's story shows it
    delivered before consumed.
    """
    others: list[PlannerEvent] = []
    delivered: dict[tuple[int, int], list[int]] = {}
    delivered_sid: dict[tuple[int, int], str] = {}
    consumed: dict[int, list[int]] = {}
    consumed_sid: dict[int, str] = {}
    for ev in events:
        if type(ev) is BatchDelivered:
            key = (ev.step, ev.dp_rank)
            delivered.setdefault(key, []).extend(ev.ranks)
            delivered_sid.setdefault(key, ev.stimulus_id)
        elif type(ev) is BatchConsumed:
            consumed.setdefault(ev.step, []).append(ev.rank)
            consumed_sid.setdefault(ev.step, ev.stimulus_id)
        elif type(ev) is RanksConsumed:
            consumed.setdefault(ev.step, []).extend(ev.ranks)
            consumed_sid.setdefault(ev.step, ev.stimulus_id)
        else:
            others.append(ev)
    out = list(others)
    out += [BatchDelivered(step, dp, tuple(ranks), stimulus_id=delivered_sid[(step, dp)])
            for (step, dp), ranks in sorted(delivered.items())]
    out += [RanksConsumed(step, tuple(ranks), stimulus_id=consumed_sid[step])
            for step, ranks in sorted(consumed.items())]
    return out
