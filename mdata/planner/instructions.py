"""What the Planner says: the instructions :meth:`PlannerState.handle` returns, and their values.

The scheduler plugin carries instructions out (submit a load, release a chunk, build a batch,
resize a pool); :func:`~mdata.planner.simulate` answers them in memory. Each repeats the
``stimulus_id`` of the event that caused it. :class:`StepSamples` and :class:`StepSummary` are the
columnar values a :class:`ConstructBatch` and a :class:`StepReady` carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mdata.errors import MdataError
from mdata.order import ChunkRef
from mdata.wire.pools import PoolDecision

__all__ = [
    "Instruction", "LoadChunk", "ReleaseChunk", "ConstructBatch", "ReleaseBatch", "StepReady",
    "JobFailed", "PoolTarget", "StepSamples", "StepSummary",
]


@dataclass(frozen=True, kw_only=True)
class Instruction:
    """Base of every instruction; ``stimulus_id`` is that of the event that caused it."""

    stimulus_id: str


@dataclass(frozen=True)
class LoadChunk(Instruction):
    """Load this chunk on its source's pool (task key ``chunk.key``); ``reload``: again, because
    the worker holding it was lost and a planned step still needs it (counted in the status)."""

    chunk: ChunkRef
    reload: bool = False


@dataclass(frozen=True)
class ReleaseChunk(Instruction):
    """No planned-but-unconsumed step needs this chunk any more: drop it (or cancel its load)."""

    chunk: ChunkRef


@dataclass(frozen=True)
class ReleaseBatch(Instruction):
    """Every receiving rank of DP group ``dp_rank`` consumed ``step``: the constructor may drop it."""

    step: int
    dp_rank: int


@dataclass(frozen=True, eq=False)
class StepSamples:
    """What one DP rank gets in one step, columnar, grouped by chunk, then by (micro_batch,
    position) within a chunk.

    ``chunks`` are the chunks the rank's samples come from; sample ``i`` is row ``index[i]`` of
    the *kept* rows of ``chunks[chunk[i]]`` (so the constructor can slice the loaded chunk). The
    grouping means that pulling :meth:`chunk_indices` chunk after chunk and concatenating the rows
    yields the samples in this order, aligned with every per-sample array.
    ``num_tokens`` is already truncated to the plan's ``max_tokens``. ``sample_ids`` are lineage
    ids in the DGraph; ``source_index``, ``shard``, ``row`` are the stable sample ids.
    """

    chunks: tuple[ChunkRef, ...]
    chunk: np.ndarray
    index: np.ndarray
    micro_batch: np.ndarray
    position: np.ndarray
    num_tokens: np.ndarray
    sample_ids: np.ndarray
    source_index: np.ndarray
    shard: np.ndarray
    row: np.ndarray
    num_micro_batches: int

    _ARRAYS = ("chunk", "index", "micro_batch", "position", "num_tokens", "sample_ids",
               "source_index", "shard", "row")

    def __len__(self) -> int:
        return int(self.chunk.size)

    def chunk_indices(self) -> list[tuple[tuple, np.ndarray]]:
        """``(chunk task key, indices among its kept rows)`` per chunk, in sample order."""
        bounds = np.searchsorted(self.chunk, np.arange(len(self.chunks) + 1))
        return [(ref.key, self.index[bounds[j]:bounds[j + 1]]) for j, ref in enumerate(self.chunks)]

    @property
    def chunk_keys(self) -> tuple[tuple, ...]:
        return tuple(c.key for c in self.chunks)

    def ids(self, names: Sequence[str]) -> list[tuple[str, int, int]]:
        """``(source, shard, row)`` of every sample, in order."""
        return [(names[s], sh, r) for s, sh, r in
                zip(self.source_index.tolist(), self.shard.tolist(), self.row.tolist())]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepSamples):
            return NotImplemented
        return (self.chunks == other.chunks and self.num_micro_batches == other.num_micro_batches
                and all(np.array_equal(getattr(self, a), getattr(other, a)) for a in self._ARRAYS))

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class ConstructBatch(Instruction):
    """Build the batch of ``(step, dp_rank)`` from these samples and serve it to the group."""

    step: int
    dp_rank: int
    samples: StepSamples


@dataclass(frozen=True, eq=False)
class StepSummary:
    """Dashboard figures of one balanced step (arrays are per DP rank or per source).

    ``measure`` says what ``per_rank_cost`` and ``lower_bound`` are: ``"cost"`` (each rank's
    total cost: the step takes as long as the largest) or ``"1F1B makespan"`` (a plan balanced by
    pipeline stage, :mod:`mdata.balance.stage_balance`: each rank's makespan through its
    pipeline, against the stage lower bound); ``scalar_makespan`` is then the makespan the scalar
    balancer's assignment would have had, so ``scalar_makespan / max(per_rank_cost)`` is what
    balancing by stage gained on this step."""

    step: int
    per_rank_cost: np.ndarray
    lower_bound: float
    max_over_mean: float
    max_over_lower_bound: float
    num_micro_batches: int
    counts: np.ndarray
    tokens: np.ndarray
    target_weights: np.ndarray
    truncated: int
    skipped: int
    names: tuple[str, ...] = ()
    measure: str = "cost"
    scalar_makespan: float | None = None

    def to_dict(self, names: Sequence[str] | None = None) -> dict[str, Any]:
        """JSON-safe form; per-source figures are keyed by source name."""
        names = names or self.names or [str(i) for i in range(self.counts.size)]
        return {
            "step": self.step,
            "per_rank_cost": self.per_rank_cost.tolist(),
            "lower_bound": self.lower_bound,
            "max_over_mean": self.max_over_mean,
            "max_over_lower_bound": self.max_over_lower_bound,
            "num_micro_batches": self.num_micro_batches,
            "counts": dict(zip(names, self.counts.tolist())),
            "tokens": dict(zip(names, self.tokens.tolist())),
            "target_weights": dict(zip(names, self.target_weights.tolist())),
            "truncated": self.truncated,
            "skipped": self.skipped,
            "measure": self.measure,
            "scalar_makespan": self.scalar_makespan,
        }

    def keys(self) -> list[str]:
        """The summary's field names, so ``dict(summary)`` gives its JSON-safe form."""
        return list(self.to_dict())

    def __getitem__(self, name: str) -> Any:
        return self.to_dict()[name]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepSummary):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class StepReady(Instruction):
    """Step ``step`` is balanced and its batches are being built; ``summary`` is for dashboards."""

    step: int
    summary: StepSummary


@dataclass(frozen=True)
class JobFailed(Instruction):
    """The job cannot continue; ``reason`` names the source/shard/rows or setting at fault.

    ``error`` is the typed error behind the failure when there is one (a chunk that failed with a
    :class:`~mdata.errors.SourceError`, a bad weight's :class:`~mdata.errors.PlanError`...), so
    callers can raise or report it with its fields; ``reason`` stays the readable sentence.
    """

    reason: str
    error: MdataError | None = None


@dataclass(frozen=True)
class PoolTarget(Instruction):
    """The Planner's sizing of one source's pool: a :class:`~mdata.wire.pools.PoolDecision`
    (target workers, demand, reason), also when it holds the target (``kind == "hold"``)."""

    decision: PoolDecision

    @property
    def source(self) -> str:
        return self.decision.group

    @property
    def workers(self) -> int:
        return self.decision.workers
