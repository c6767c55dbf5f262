"""What the Planner says: the instructions :meth:`PlannerState.handle` returns, and their values.

The scheduler plugin carries instructions out (submit a load, release a chunk, build a batch,
resize a pool); :func:`~mdata.planner.simulate` answers them in memory. Each repeats the
``stimulus_id`` of the event that caused it. :class:`StepSamples` and :class:`StepSummary` are the
columnar values a :class:`ConstructStep` and a :class:`StepReady` carry.
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
    "Instruction", "LoadChunk", "ReleaseChunk", "ConstructStep", "ReleaseBatch", "StepReady",
    "JobFailed", "PoolTarget", "StepColumns", "StepSamples", "StepSummary",
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
    """Every receiving rank of each of DP groups ``dp_ranks`` consumed ``step``: the constructor
    may drop their batches. One instruction for the groups one event completes (a message of a
    host's ranks completes many at once), not one per group."""

    step: int
    dp_ranks: tuple[int, ...]


class StepColumns:
    """Every DP rank's samples of one step in one set of columns, sorted by (rank, chunk,
    micro_batch, position): what :class:`StepSamples` views one rank of.

    Why one set per step and a view per rank: a step at 16k GPUs has 1,024 DP groups of two
    samples each, and slicing nine arrays and building a frozen object per group cost the
    Planner about 6 ms a step, most of it never read (the runtime reads each group's columns
    once). A view costs one small object; its columns are sliced when read.

    ``refs`` are the step's (rank, chunk) runs in order; ``chunk`` numbers each sample's run among
    its rank's; ``sample_bounds[d]:sample_bounds[d + 1]`` are rank ``d``'s samples and
    ``run_bounds[d]:run_bounds[d + 1]`` its runs (plain lists: read once per view).
    """

    __slots__ = ("refs", "chunk", "index", "micro_batch", "position", "num_tokens", "sample_ids",
                 "source_index", "shard", "row", "num_micro_batches", "sample_bounds", "run_bounds")

    def __init__(self, refs: Sequence[ChunkRef], chunk: np.ndarray, index: np.ndarray,
                 micro_batch: np.ndarray, position: np.ndarray, num_tokens: np.ndarray,
                 sample_ids: np.ndarray, source_index: np.ndarray, shard: np.ndarray,
                 row: np.ndarray, num_micro_batches: int, sample_bounds: Sequence[int],
                 run_bounds: Sequence[int]) -> None:
        self.refs = tuple(refs)
        self.chunk, self.index, self.micro_batch, self.position = chunk, index, micro_batch, position
        self.num_tokens, self.sample_ids = num_tokens, sample_ids
        self.source_index, self.shard, self.row = source_index, shard, row
        self.num_micro_batches = int(num_micro_batches)
        self.sample_bounds = list(sample_bounds)
        self.run_bounds = list(run_bounds)

    def ranks(self) -> int:
        """How many DP ranks the columns hold."""
        return len(self.sample_bounds) - 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepColumns):
            return NotImplemented
        return (self.refs == other.refs and self.num_micro_batches == other.num_micro_batches
                and self.sample_bounds == other.sample_bounds and self.run_bounds == other.run_bounds
                and all(np.array_equal(getattr(self, a), getattr(other, a)) for a in StepSamples._ARRAYS))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"StepColumns(ranks={self.ranks()}, samples={self.chunk.size}, "
                f"chunk_runs={len(self.refs)})")


class StepSamples:
    """What one DP rank gets in one step, columnar, grouped by chunk, then by (micro_batch,
    position) within a chunk: a view of rank ``dp_rank`` in its step's :class:`StepColumns`.

    ``chunks`` are the chunks the rank's samples come from; sample ``i`` is row ``index[i]`` of
    the *kept* rows of ``chunks[chunk[i]]`` (so the constructor can slice the loaded chunk). The
    grouping means that pulling :meth:`chunk_indices` chunk after chunk and concatenating the rows
    yields the samples in this order, aligned with every per-sample array.
    ``num_tokens`` is already truncated to the plan's ``max_tokens``. ``sample_ids`` are lineage
    ids in the DGraph; ``source_index``, ``shard``, ``row`` are the stable sample ids.
    """

    __slots__ = ("columns", "dp_rank")

    _ARRAYS = ("chunk", "index", "micro_batch", "position", "num_tokens", "sample_ids",
               "source_index", "shard", "row")

    def __init__(self, columns: StepColumns, dp_rank: int = 0) -> None:
        self.columns = columns
        self.dp_rank = dp_rank

    @classmethod
    def of(cls, chunks: Sequence[ChunkRef], chunk: np.ndarray, index: np.ndarray,
           micro_batch: np.ndarray, position: np.ndarray, num_tokens: np.ndarray,
           sample_ids: np.ndarray, source_index: np.ndarray, shard: np.ndarray, row: np.ndarray,
           num_micro_batches: int) -> "StepSamples":
        """One rank's samples from its own columns (a step of one group)."""
        return cls(StepColumns(chunks, chunk, index, micro_batch, position, num_tokens, sample_ids,
                               source_index, shard, row, num_micro_batches,
                               (0, int(np.asarray(chunk).size)), (0, len(chunks))))

    def _slice(self, name: str) -> np.ndarray:
        c, d = self.columns, self.dp_rank
        return getattr(c, name)[c.sample_bounds[d]:c.sample_bounds[d + 1]]

    @property
    def chunks(self) -> tuple[ChunkRef, ...]:
        c, d = self.columns, self.dp_rank
        return c.refs[c.run_bounds[d]:c.run_bounds[d + 1]]

    chunk = property(lambda self: self._slice("chunk"))
    index = property(lambda self: self._slice("index"))
    micro_batch = property(lambda self: self._slice("micro_batch"))
    position = property(lambda self: self._slice("position"))
    num_tokens = property(lambda self: self._slice("num_tokens"))
    sample_ids = property(lambda self: self._slice("sample_ids"))
    source_index = property(lambda self: self._slice("source_index"))
    shard = property(lambda self: self._slice("shard"))
    row = property(lambda self: self._slice("row"))

    @property
    def num_micro_batches(self) -> int:
        return self.columns.num_micro_batches

    def __len__(self) -> int:
        c, d = self.columns, self.dp_rank
        return c.sample_bounds[d + 1] - c.sample_bounds[d]

    def chunk_indices(self) -> list[tuple[tuple, np.ndarray]]:
        """``(chunk task key, indices among its kept rows)`` per chunk, in sample order."""
        chunks = self.chunks
        bounds = np.searchsorted(self.chunk, np.arange(len(chunks) + 1)).tolist()
        index = self.index
        return [(ref.key, index[bounds[j]:bounds[j + 1]]) for j, ref in enumerate(chunks)]

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

    def __repr__(self) -> str:
        return f"StepSamples(dp_rank={self.dp_rank}, samples={len(self)}, chunks={len(self.chunks)})"


@dataclass(frozen=True)
class ConstructStep(Instruction):
    """Build the batch of every DP group of ``step`` and serve each to its group: group ``d``'s
    samples are :meth:`samples` ``(d)``. One instruction per step, not per group: at 16k GPUs a
    step has 1,024 groups, and an instruction each was objects the Planner made, the runtime
    read once and the collector walked."""

    step: int
    columns: StepColumns

    @property
    def dp_ranks(self) -> range:
        """The DP groups the step is built for."""
        return range(self.columns.ranks())

    def samples(self, dp_rank: int) -> StepSamples:
        """What DP group ``dp_rank`` gets."""
        if not 0 <= dp_rank < self.columns.ranks():
            raise IndexError(f"step {self.step} has {self.columns.ranks()} DP groups, not {dp_rank}")
        return StepSamples(self.columns, dp_rank)

    def groups(self) -> list[StepSamples]:
        """Every group's samples, by DP rank."""
        return [StepSamples(self.columns, d) for d in self.dp_ranks]


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
