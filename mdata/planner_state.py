"""The Planner's pure state machine: events in, instructions out, no I/O.

Modelled on distributed's ``worker_state_machine``: the Dask scheduler plugin (or ``simulate``, or
a test) feeds :class:`PlannerEvent` values to :meth:`PlannerState.handle` and carries out the
:class:`Instruction` values it returns. Every event carries a ``stimulus_id``; every instruction
repeats the id of the event that caused it, and a bounded log keeps ``(stimulus_id, event,
instructions)`` for questions after the fact. Same events in, same instructions out.

Life of a step ``s``:

1. **Apportioned** when it enters the window (``s < consumed_step + window``): the mixture gives
   its weights, :class:`~mdata.mixing.ExactApportioner` its per-source counts, and each source's
   order the provisional samples; chunks they live in that are not yet loaded get a
   :class:`LoadChunk` (backpressure: nothing is loaded further ahead than the window).
2. **Balanced** once every chunk it needs is loaded, strictly in step order: samples the loaders
   skipped (bad rows) are passed over deterministically, the cost model prices the rest, and
   :func:`~mdata.balance.balance_step` assigns them to DP ranks and micro-batches. Out come one
   :class:`ConstructBatch` per DP rank and a :class:`StepReady` summary; the DGraph records it.
3. **Consumed**: when every receiving rank of a DP group reports :class:`BatchConsumed`, the
   group's batch is released (:class:`ReleaseBatch`); when all groups have, the step is done and
   chunks no planned-but-unconsumed step needs are released (:class:`ReleaseChunk`).

The checkpoint of step ``s`` uses snapshots taken when ``s`` was planned (cursors, apportioner
carry, mixture decisions), so it reflects what trainers consumed, not what was prefetched.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mdata.balance import balance_step
from mdata.checkpoint import Checkpoint
from mdata.cost import evaluate_cost
from mdata.errors import CheckpointError, MdataError, TrainerError
from mdata.lineage import DGraph
from mdata.mixing import ExactApportioner, MetricsRecord
from mdata.order import ChunkRef, SourceOrder
from mdata.plan import Plan
from mdata.pool_demand import PoolSizer

__all__ = [
    # events
    "PlannerEvent", "Tick", "ChunkLoaded", "ChunkFailed", "WorkerLost", "BatchDelivered",
    "BatchConsumed", "RanksConsumed", "MetricsReported",
    # instructions
    "Instruction", "LoadChunk", "ReleaseChunk", "ConstructBatch", "ReleaseBatch", "StepReady",
    "JobFailed", "PoolTarget",
    # values
    "StepSamples", "StepSummary", "PlannerState", "row_counts_of", "coalesce_acknowledgements",
]

_SHIFT = 40  # int key of a chunk: source_index << 40 | chunk_id
_MASK = (1 << _SHIFT) - 1


# ------------------------------------------------------------------------------------------------
# events
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class PlannerEvent:
    """Base of every event; ``stimulus_id`` names what caused it (for logs and instructions)."""

    stimulus_id: str


@dataclass(frozen=True)
class Tick(PlannerEvent):
    """Time passes; ``now`` (seconds, monotonic) feeds step-rate measurement and pool sizing."""

    now: float | None = None


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
    """A load task raised (corrupt shard, schema mismatch, skip budget exceeded...)."""

    chunk: ChunkRef
    error: str


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


# ------------------------------------------------------------------------------------------------
# instructions
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Instruction:
    """Base of every instruction; ``stimulus_id`` is that of the event that caused it."""

    stimulus_id: str


@dataclass(frozen=True)
class LoadChunk(Instruction):
    """Load this chunk on its source's pool (task key ``chunk.key``)."""

    chunk: ChunkRef


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
    """Dashboard figures of one balanced step (arrays are per DP rank or per source)."""

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
        }

    def keys(self) -> list[str]:  # ``dict(summary)`` gives the JSON-safe form
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
    """The job cannot continue; ``reason`` names the source/shard/rows or setting at fault."""

    reason: str


@dataclass(frozen=True)
class PoolTarget(Instruction):
    """Run ``workers`` loader workers for ``source``'s pool; ``reason`` says why."""

    source: str
    workers: int
    reason: str
    demand: float = 0.0  # worker-equivalents of demand (headroom included) before rounding up


# ------------------------------------------------------------------------------------------------
# internal state
# ------------------------------------------------------------------------------------------------
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


def row_counts_of(listing: Any) -> np.ndarray:
    """Rows per shard from a SourceListing, SourceMetadata, or a plain sequence of counts."""
    if hasattr(listing, "shards"):
        return np.array([s.num_rows for s in listing.shards], dtype=np.int64)
    if hasattr(listing, "shard_rows"):
        return np.asarray(listing.shard_rows, dtype=np.int64)
    return np.asarray(listing, dtype=np.int64).reshape(-1)


class _Chunk:
    __slots__ = ("ref", "loaded", "slot", "needed_by", "worker")

    def __init__(self, ref: ChunkRef) -> None:
        self.ref = ref
        self.loaded = False
        self.slot = -1
        self.needed_by: dict[int, None] = {}
        self.worker: str | None = None


class _Store:
    """Cost features of loaded chunks, one fixed-width row ("slot") per chunk, reused when freed.

    ``index[slot, r - start]`` is the position of row ``r`` among the chunk's kept rows, or -1 if
    the loader skipped it; the per-step gather is then one vectorised lookup for all sources.
    """

    def __init__(self, width: int) -> None:
        self.width = width
        self.tokens = np.zeros((64, width), np.int32)
        self.patches = np.zeros((64, width), np.int32)
        self.index = np.full((64, width), -1, np.int32)
        self.free = list(range(63, -1, -1))

    def put(self, offsets: np.ndarray, tokens: np.ndarray, patches: np.ndarray) -> int:
        if not self.free:
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


class _Step:
    __slots__ = ("step", "weights", "counts", "prov_start", "taken", "pending", "chunks",
                 "cursors_before", "carry_before", "consumed", "groups_done", "balanced")

    def __init__(self, step: int, weights: np.ndarray, counts: np.ndarray, prov_start: np.ndarray,
                 carry_before: np.ndarray) -> None:
        self.step = step
        self.weights = weights
        self.counts = counts
        self.prov_start = prov_start
        self.carry_before = carry_before
        self.taken: tuple[np.ndarray, ...] = ()
        self.pending: dict[int, None] = {}
        self.chunks: dict[int, None] = {}
        self.cursors_before: np.ndarray | None = None
        self.consumed: dict[int, set[int]] = {}
        self.groups_done = 0
        self.balanced = False


class _NotReady(Exception):
    def __init__(self, missing: list[int]) -> None:
        self.missing = missing


# ------------------------------------------------------------------------------------------------
# the state machine
# ------------------------------------------------------------------------------------------------
class PlannerState:
    """Pure planning state of one job (see the module docstring).

    ``listings`` maps each source name to its rows per shard (a sequence of ints, a
    ``SourceListing`` or a ``SourceMetadata``): the planner never reads data itself.
    ``pool_sizer`` decides :class:`PoolTarget` instructions on :class:`Tick` events.
    """

    def __init__(
        self,
        plan: Plan,
        listings: Mapping[str, Any],
        *,
        job: str = "job",
        log_size: int = 10_000,
        pool_sizer: PoolSizer | None = None,
        record_lineage: bool = True,
        lineage_steps: int | None = None,
    ) -> None:
        plan.validate()
        self.plan = plan
        self.job = job
        self.names = plan.source_names
        missing = [n for n in self.names if n not in listings]
        if missing:
            raise MdataError(f"no listing (rows per shard) for sources {missing}; list their shards first")
        self.orders = [
            SourceOrder(row_counts_of(listings[n]), plan.chunk_rows(n), plan.seed_value, n,
                        plan.shuffle_chunks)
            for n in self.names
        ]
        self.schedule = copy.deepcopy(plan.mixture)  # stateful policies change; the plan must not
        spec = plan.balance_spec
        self.global_batch = spec.global_batch
        self.micro_batches = spec.micro_batches
        self.max_tokens = spec.max_tokens
        self.cost_model = plan.cost_model
        self.mesh = plan.mesh
        self.window = plan.window_steps
        self._pad = 2 * self.mesh.cp if self.mesh.cp > 1 else 1
        self._receivers = [frozenset(self.mesh.receivers(d, plan.broadcast)) for d in range(self.mesh.dp)]
        self._rank_dp = {r: d for d, rs in enumerate(self._receivers) for r in rs}
        S = len(self.names)
        self.apportioner = ExactApportioner(S, self.global_batch)
        self.history: deque[MetricsRecord] = deque(
            maxlen=getattr(self.schedule, "history_size", 0) if self.schedule.stateful else 0)
        self._pinned: dict[int, np.ndarray] = {}
        self._fcur = np.zeros(S, np.int64)  # cursor after the last balanced step
        self._pcur = np.zeros(S, np.int64)  # provisional cursor after the last apportioned step
        self.consumed_step = 0  # first step not consumed by every DP group
        self.balanced_step = 0  # first step not balanced
        self.planned_step = 0  # first step not apportioned
        self._steps: dict[int, _Step] = {}
        self._chunks: dict[int, _Chunk] = {}
        self._task_keys: dict[tuple, int] = {}
        self._worker_chunks: dict[str, dict[int, None]] = {}
        self._store = _Store(max(plan.chunk_rows(n) for n in self.names))
        # chunks no planned step needs but whose shuffle window the source has not left yet:
        # later steps will draw from them again, so they stay loaded (no reload churn)
        self._held: list[dict[int, None]] = [{} for _ in range(S)]
        self._win_end = np.zeros(S, np.int64)  # where each source's current window ends
        self._win_chunks: list[frozenset[int]] = [frozenset()] * S
        self.skipped = np.zeros(S, np.int64)
        self.truncated = 0
        self.failed: str | None = None
        self.pool_sizer = pool_sizer if pool_sizer is not None else PoolSizer(self.names)
        self._last_weights = np.zeros(S)
        self.log: deque[tuple[str, PlannerEvent, tuple[Instruction, ...]]] = deque(maxlen=log_size)
        self.record_lineage = record_lineage
        # keep the lineage of the last `lineage_steps` consumed steps (None: all of it)
        self.lineage_steps = None if lineage_steps is None else max(1, int(lineage_steps))
        self.dgraph = DGraph(self.names, group_ranks=lambda d: sorted(self._receivers[d]))

    # -- public API ----------------------------------------------------------------------------
    def handle(self, *events: PlannerEvent) -> list[Instruction]:
        """Apply events in order; returns the instructions they cause, in order."""
        out: list[Instruction] = []
        log = self.log.append
        for ev in events:
            if type(ev) is BatchConsumed and self._consumed_quietly(ev):
                log((ev.stimulus_id, ev, ()))
                continue
            if not isinstance(ev, PlannerEvent):
                raise TypeError(f"PlannerState.handle takes PlannerEvent values, got {ev!r}")
            instr = self._handle_one(ev)
            log((ev.stimulus_id, ev, tuple(instr)))
            out.extend(instr)
        return out

    def _consumed_quietly(self, ev: BatchConsumed) -> bool:
        """The common case of a consumption, applied inline: a rank of a group that other ranks
        of the group still have to consume (no release, no planning). At thousands of ranks this
        is nearly every event of a step. Returns False to take the general path instead."""
        return self.failed is None and self._consume_quietly(ev.step, ev.rank)

    def _consume_quietly(self, step: int, rank: int) -> bool:
        dp = self._rank_dp.get(rank)
        st = self._steps.get(step)
        if dp is None or st is None or not st.balanced:
            return False
        group = st.consumed.get(dp)
        if group is None or rank in group or len(group) + 1 >= len(self._receivers[dp]):
            return False
        group.add(rank)
        if self.record_lineage:
            self.dgraph.record_consumed(step, dp, rank)
        return True

    def _on_ranks_consumed(self, ev: RanksConsumed) -> list[Instruction]:
        """One :class:`BatchConsumed` per rank, in order, without an event object each."""
        out: list[Instruction] = []
        quietly = self._consume_quietly
        for rank in ev.ranks:
            if not quietly(ev.step, rank):
                out.extend(self._on_consumed(BatchConsumed(ev.step, rank, stimulus_id=ev.stimulus_id)))
        return out

    def story(self, stimulus_id: str) -> list[tuple[str, PlannerEvent, tuple[Instruction, ...]]]:
        """Log entries of one stimulus (events and what they caused)."""
        return [entry for entry in self.log if entry[0] == stimulus_id]

    @property
    def chunks_in_memory(self) -> int:
        return sum(1 for c in self._chunks.values() if c.loaded)

    def chunk_refs(self) -> list[ChunkRef]:
        """Chunks currently requested or loaded, in request order."""
        return [c.ref for c in self._chunks.values()]

    def checkpoint(self, step: int) -> Checkpoint:
        """The checkpoint as of having consumed every step before ``step``."""
        if not self.consumed_step <= step <= self.balanced_step:
            raise CheckpointError(
                f"can checkpoint steps {self.consumed_step}..{self.balanced_step} (consumed by "
                f"every group .. planned), not step {step}; checkpoint after consuming step-1"
            )
        if step < self.planned_step:
            st = self._steps[step]
            cursors, carry = st.cursors_before, st.carry_before
        else:
            cursors, carry = self._fcur, self.apportioner.carry
        if cursors is None:  # cannot happen while balanced_step >= step; kept as a typed error
            raise CheckpointError(f"no cursor snapshot for step {step}")
        mixture: dict[str, Any] = {}
        if self.schedule.stateful:
            pinned = {t: w for t, w in self._pinned.items() if t >= step}
            for t in range(step, self.planned_step):
                pinned[t] = self._steps[t].weights
            mixture = {
                "state": self.schedule.state_dict(),
                "history": [r.to_dict() for r in self.history],
                "pinned": {str(t): [float(x) for x in w] for t, w in sorted(pinned.items())},
            }
        return Checkpoint(
            fingerprint=self.plan.fingerprint(),
            step=int(step),
            sources=self.names,
            cursors={n: int(c) for n, c in zip(self.names, cursors)},
            epochs={n: int(c) // o.num_rows for n, c, o in zip(self.names, cursors, self.orders)},
            apportioner={"carry": [float(x) for x in carry]},
            seed=self.plan.seed_value,
            mixture=mixture,
        )

    @classmethod
    def from_checkpoint(
        cls, plan: Plan, listings: Mapping[str, Any], checkpoint: Checkpoint | Mapping[str, Any],
        **kwargs: Any,
    ) -> "PlannerState":
        """A fresh state that continues exactly where ``checkpoint`` left off."""
        ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint.from_dict(checkpoint)
        ckpt.check_plan(plan.fingerprint(), plan.source_names)
        state = cls(plan, listings, **kwargs)
        state.consumed_step = state.balanced_step = state.planned_step = ckpt.step
        cursors = np.array([ckpt.cursors[n] for n in state.names], np.int64)
        state._fcur = cursors.copy()
        state._pcur = cursors.copy()
        state.apportioner.load_state_dict(ckpt.apportioner)
        if state.schedule.stateful and ckpt.mixture:
            state.schedule.load_state_dict(ckpt.mixture.get("state", {}))
            state.history.extend(MetricsRecord.from_dict(r) for r in ckpt.mixture.get("history", []))
            state._pinned = {int(t): np.asarray(w, np.float64)
                             for t, w in ckpt.mixture.get("pinned", {}).items()}
        return state

    # -- dispatch ------------------------------------------------------------------------------
    def _handle_one(self, ev: PlannerEvent) -> list[Instruction]:
        if self.failed is not None:
            return []
        sid = ev.stimulus_id
        try:
            if type(ev) is BatchConsumed:  # thousands per step: skip planning unless it freed a step
                before = self.consumed_step
                out = self._on_consumed(ev)
                if self.consumed_step == before:
                    return out
            elif type(ev) is RanksConsumed:
                before = self.consumed_step
                out = self._on_ranks_consumed(ev)
                if self.consumed_step == before:
                    return out
            elif isinstance(ev, ChunkLoaded):
                out = self._on_chunk_loaded(ev)
            elif isinstance(ev, BatchConsumed):
                out = self._on_consumed(ev)
            elif isinstance(ev, Tick):
                out = self._on_tick(ev)
            elif isinstance(ev, MetricsReported):
                if self.schedule.stateful:
                    self.history.append(MetricsRecord(ev.step, ev.rank, dict(ev.metrics)))
                out = []
            elif isinstance(ev, BatchDelivered):
                if self.record_lineage:
                    self.dgraph.record_delivered(ev.step, ev.dp_rank, ev.ranks)
                out = []
            elif isinstance(ev, WorkerLost):
                out = self._on_worker_lost(ev)
            elif isinstance(ev, ChunkFailed):
                out = self._on_chunk_failed(ev)
            else:
                raise TypeError(f"unknown planner event {type(ev).__name__}")
            out.extend(self._advance(sid))
        except TrainerError:
            raise
        except MdataError as exc:  # a bad weight, cost or batch shape: the job cannot go on
            return [self._fail(f"step {self.balanced_step}: {exc}", sid)]
        return out

    def _fail(self, reason: str, sid: str) -> JobFailed:
        self.failed = reason
        return JobFailed(reason, stimulus_id=sid)

    # -- events --------------------------------------------------------------------------------
    def _on_chunk_loaded(self, ev: ChunkLoaded) -> list[Instruction]:
        ref = ev.chunk
        key = (ref.source_index << _SHIFT) | ref.chunk_id
        c = self._chunks.get(key)
        if c is None:
            return []  # released before its load finished: nothing needs it
        if c.worker is not None and c.worker != ev.worker:
            self._worker_chunks.get(c.worker, {}).pop(key, None)
        c.worker = ev.worker
        self._worker_chunks.setdefault(ev.worker, {})[key] = None
        rows = np.asarray(ev.rows, np.int64)
        if self.record_lineage:
            self.dgraph.record_load(ref.source_index, ref.chunk_id, ev.worker)
        self.pool_sizer.observe_load(ref.source_index, rows.size + len(ev.skipped_rows), ev.seconds)
        if c.loaded:
            return []  # a reload after a lost worker: same rows, same bytes
        tokens = np.asarray(ev.num_tokens)
        patches = np.zeros(rows.size, np.int32) if ev.num_patches is None else np.asarray(ev.num_patches)
        if tokens.shape != rows.shape or patches.shape != rows.shape or (
                rows.size and (rows[0] < ref.start or rows[-1] >= ref.stop)):
            raise MdataError(
                f"chunk {ref}: the load reported {rows.size} rows, {tokens.size} token counts and "
                f"{patches.size} patch counts, rows must lie in [{ref.start}, {ref.stop})")
        c.slot = self._store.put(rows - ref.start, tokens, patches)
        c.loaded = True
        for s in c.needed_by:
            st = self._steps.get(s)
            if st is not None:
                st.pending.pop(key, None)
        return []

    def _on_chunk_failed(self, ev: ChunkFailed) -> list[Instruction]:
        ref = ev.chunk
        if (ref.source_index << _SHIFT | ref.chunk_id) not in self._chunks:
            return []
        return [self._fail(
            f"loading source {ref.source!r}, shard {ref.shard}, rows {ref.start}-{ref.stop} "
            f"failed: {ev.error}. Fix or remove the shard, or raise the source's skip_tolerance "
            "if single samples are bad", ev.stimulus_id)]

    def _on_worker_lost(self, ev: WorkerLost) -> list[Instruction]:
        keys = dict(self._worker_chunks.pop(ev.worker, {}))
        for ch in ev.chunks:
            ref_key = ch.key if isinstance(ch, ChunkRef) else tuple(ch)
            k = self._task_keys.get(ref_key)
            if k is not None:
                keys[k] = None
        out: list[Instruction] = []
        for k in keys:
            c = self._chunks.get(k)
            if c is None or c.worker != ev.worker:
                continue  # released already, or its reload is under way elsewhere
            if not c.needed_by:  # only held for its window: forget it, a later step reloads it
                self._held[k >> _SHIFT].pop(k, None)
                out.extend(self._drop(k, c, ev.stimulus_id))
                continue
            c.worker = None
            # the cost features stay valid (a reload reads the same rows), so planning goes on;
            # the constructor waits on the reloaded task
            out.append(LoadChunk(c.ref, stimulus_id=ev.stimulus_id))
        return out

    def _on_consumed(self, ev: BatchConsumed) -> list[Instruction]:
        dp = self._rank_dp.get(ev.rank)
        if dp is None:
            if 0 <= ev.rank < self.mesh.world_size:
                return []  # a rank that gets its data by broadcast: nothing to release
            raise TrainerError(f"rank {ev.rank} is not in the mesh {self.mesh.describe()}")
        st = self._steps.get(ev.step)
        if st is None or not st.balanced:
            if ev.step < self.consumed_step:
                return []  # a late duplicate
            raise TrainerError(f"rank {ev.rank} reports consuming step {ev.step}, which is not planned yet")
        group = st.consumed.setdefault(dp, set())
        if ev.rank in group:
            return []
        group.add(ev.rank)
        if self.record_lineage:
            self.dgraph.record_consumed(ev.step, dp, ev.rank)
        if len(group) != len(self._receivers[dp]):
            return []  # the common case at thousands of ranks: the group is not complete yet
        st.groups_done += 1
        out: list[Instruction] = [ReleaseBatch(ev.step, dp, stimulus_id=ev.stimulus_id)]
        if st.groups_done != self.mesh.dp or ev.step != self.consumed_step:
            return out  # the window advances only when its oldest step is fully consumed
        done: list[_Step] = []
        while (st := self._steps.get(self.consumed_step)) is not None and st.groups_done == self.mesh.dp:
            done.append(self._steps.pop(self.consumed_step))
            self.consumed_step += 1
        if done and self.lineage_steps is not None:
            # forget old lineage in batches of a quarter of the retention (amortised copying)
            horizon = self.consumed_step - self.lineage_steps
            if horizon - self.dgraph.forgotten_before >= max(1, self.lineage_steps // 4):
                self.dgraph.forget_before(horizon)
        if done:
            # plan the steps that entered the window before releasing chunks, so a chunk the
            # next steps share with the finished ones stays loaded instead of being reloaded
            while self.planned_step < self.consumed_step + self.window:
                self._apportion(ev.stimulus_id, out)
            for st in done:
                for k in st.chunks:
                    out.extend(self._unneed(k, st.step, ev.stimulus_id))
        return out

    def _on_tick(self, ev: Tick) -> list[Instruction]:
        if ev.now is None:
            return []
        self.pool_sizer.observe_progress(ev.now, self.consumed_step)
        return [PoolTarget(d.source, d.workers, d.reason, d.demand, stimulus_id=ev.stimulus_id)
                for d in self.pool_sizer.decide(self._last_weights, self.global_batch)]

    # -- chunks --------------------------------------------------------------------------------
    def _need(self, key: int, step: int, sid: str, out: list[Instruction]) -> _Chunk:
        c = self._chunks.get(key)
        if c is None:
            i, cid = key >> _SHIFT, key & _MASK
            ref = self.orders[i].chunk_ref(cid, i, self.job)
            c = self._chunks[key] = _Chunk(ref)
            self._task_keys[ref.key] = key
            out.append(LoadChunk(ref, stimulus_id=sid))
        elif not c.needed_by:
            self._held[key >> _SHIFT].pop(key, None)
        c.needed_by[step] = None
        return c

    def _unneed(self, key: int, step: int, sid: str) -> list[Instruction]:
        c = self._chunks.get(key)
        if c is None:
            return []
        c.needed_by.pop(step, None)
        if c.needed_by:
            return []
        i = key >> _SHIFT
        if (key & _MASK) in self._win_chunks[i]:
            self._held[i][key] = None
            return []
        return self._drop(key, c, sid)

    def _drop(self, key: int, c: _Chunk, sid: str) -> list[Instruction]:
        del self._chunks[key]
        self._task_keys.pop(c.ref.key, None)
        if c.worker is not None:
            self._worker_chunks.get(c.worker, {}).pop(key, None)
        if c.loaded:
            self._store.release(c.slot)
        return [ReleaseChunk(c.ref, stimulus_id=sid)]

    def _register(self, st: _Step, keys: np.ndarray, sid: str, out: list[Instruction]) -> None:
        for key in np.unique(keys).tolist():
            c = self._need(key, st.step, sid, out)
            st.chunks[key] = None
            if not c.loaded:
                st.pending[key] = None

    # -- planning ------------------------------------------------------------------------------
    def _advance(self, sid: str) -> list[Instruction]:
        out: list[Instruction] = []
        while self.failed is None:
            if self.planned_step < self.consumed_step + self.window:
                self._apportion(sid, out)
                continue
            st = self._steps.get(self.balanced_step)
            if st is None or st.pending:
                break
            if not self._balance(st, sid, out):
                break
        return out

    def _take(self, starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, ...]:
        """Samples at ``starts[i] ..`` of every source: (src, shard, row, chunk, cursor) arrays."""
        nz = np.flatnonzero(counts)
        parts = [self.orders[i].take(int(starts[i]), int(counts[i])) for i in nz.tolist()]
        c = counts[nz]
        total = int(c.sum())
        src = np.repeat(nz, c)
        first = np.cumsum(c) - c
        cursor = np.repeat(starts[nz] - first, c) + np.arange(total)
        if not parts:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty, empty, empty
        shard = np.concatenate([p.shards for p in parts])
        row = np.concatenate([p.rows for p in parts])
        chunk = np.concatenate([p.chunk_ids for p in parts])
        return src, shard, row, chunk, cursor

    def _apportion(self, sid: str, out: list[Instruction]) -> None:
        s = self.planned_step
        pinned = self._pinned.pop(s, None)
        if pinned is not None:
            weights = pinned
        else:
            weights = self.schedule.weights_vector(s, self.names, tuple(self.history))
        carry_before = self.apportioner.carry.copy()
        counts = self.apportioner.counts(weights)
        st = _Step(s, weights, counts, self._pcur.copy(), carry_before)
        self._pcur += counts
        if s == self.balanced_step:
            st.cursors_before = self._fcur.copy()
        st.taken = self._take(st.prov_start, counts)
        self._steps[s] = st
        self.planned_step = s + 1
        self._last_weights = weights
        src, _, _, chunk, _ = st.taken
        self._register(st, (src << _SHIFT) | chunk, sid, out)
        self._roll_windows(sid, out)  # after registering: this step may still use the old window

    def _roll_windows(self, sid: str, out: list[Instruction]) -> None:
        """Sources whose planned cursor left its shuffle window let go of that window's chunks."""
        for i in np.flatnonzero(self._pcur >= self._win_end).tolist():
            _, end, chunks = self.orders[i].window_span(int(self._pcur[i]))
            self._win_end[i] = end
            self._win_chunks[i] = chunks
            held = self._held[i]
            for key in [k for k in held if (k & _MASK) not in chunks]:
                del held[key]
                out.extend(self._drop(key, self._chunks[key], sid))

    def _gather(self, src: np.ndarray, row: np.ndarray, chunk: np.ndarray):
        """Index within chunk, tokens, patches of samples whose chunks are all loaded."""
        keys = (src << _SHIFT) | chunk
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
            raise _NotReady(missing)
        sl, off = slots[inv], row - starts[inv]
        return keys, self._store.index[sl, off], self._store.tokens[sl, off], self._store.patches[sl, off]

    def _select(self, st: _Step):
        """Final samples of a step: the provisional ones unless skips moved the cursors."""
        src, shard, row, chunk, cursor = st.taken
        if np.array_equal(st.prov_start, self._fcur):
            keys, index, tokens, patches = self._gather(src, row, chunk)
            if index.size == 0 or index.min() >= 0:
                return (src, shard, row, chunk, cursor, keys, index, tokens, patches), \
                    self._fcur + st.counts, None
        # slow path: walk each source's order from its final cursor, passing over skipped rows
        cols: list[list[np.ndarray]] = [[] for _ in range(9)]
        skipped: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
        ends = self._fcur.copy()
        missing: list[int] = []
        for i in np.flatnonzero(st.counts).tolist():
            p, need = int(self._fcur[i]), int(st.counts[i])
            while need > 0:
                t = self.orders[i].take(p, need)
                s_ = np.full(t.rows.size, i, np.int64)
                try:
                    keys, index, tokens, patches = self._gather(s_, t.rows, t.chunk_ids)
                except _NotReady as exc:
                    missing.extend(exc.missing)
                    break
                cur = p + np.arange(t.rows.size)
                keep = index >= 0
                for col, arr in zip(cols, (s_, t.shards, t.rows, t.chunk_ids, cur, keys, index,
                                           tokens, patches)):
                    col.append(arr[keep])
                if not keep.all():
                    skipped.append((i, t.shards[~keep], t.rows[~keep], cur[~keep]))
                need -= int(keep.sum())
                p += t.rows.size
            ends[i] = p
        if missing:
            raise _NotReady(missing)
        return tuple(np.concatenate(c) if c else np.zeros(0, np.int64) for c in cols), ends, skipped

    def _balance(self, st: _Step, sid: str, out: list[Instruction]) -> bool:
        try:
            selected, ends, skipped = self._select(st)
        except _NotReady as exc:
            for key in exc.missing:  # skips moved the cursor into chunks not requested yet
                c = self._need(key, st.step, sid, out)
                st.chunks[key] = None
                if not c.loaded:
                    st.pending[key] = None
            return False
        src, shard, row, chunk, cursor, keys, index, tokens, patches = selected
        s = st.step
        # chunks the provisional plan needed but the final one does not (after skips)
        final = dict.fromkeys(np.unique(keys).tolist())
        for key in [k for k in st.chunks if k not in final]:
            del st.chunks[key]
            out.extend(self._unneed(key, s, sid))
        for key in final:
            if key not in st.chunks:
                self._need(key, s, sid, out)
                st.chunks[key] = None
        n_skipped = 0
        if skipped:
            for i, sh, rw, cur in skipped:
                self.skipped[i] += rw.size
                n_skipped += rw.size
                if self.record_lineage:
                    self.dgraph.record_skips(s, i, sh, rw, cur)
        trunc = np.minimum(tokens, self.max_tokens).astype(np.int32)
        n_trunc = int((tokens > self.max_tokens).sum())
        self.truncated += n_trunc
        costs = evaluate_cost(self.cost_model, trunc, patches)
        a = balance_step(trunc, costs, dp=self.mesh.dp, micro_batches=self.micro_batches,
                         max_tokens=self.max_tokens, seed=(self.plan.seed_value * 1_000_003 + s) % 2**32,
                         pad_multiple=self._pad)
        if self.record_lineage:
            ids = self.dgraph.record_step(
                s, source_index=src, shard=shard, row=row, chunk_id=chunk, cursor=cursor,
                dp_rank=a.rank, micro_batch=a.micro_batch, position=a.position, num_tokens=trunc)
        else:
            ids = np.full(src.size, -1, np.int64)
        order = np.lexsort((a.position, a.micro_batch, a.rank))
        bounds = np.searchsorted(a.rank[order], np.arange(self.mesh.dp + 1))
        src32, shard32 = src.astype(np.int32), shard.astype(np.int32)
        index32 = index.astype(np.int32)
        for d in range(self.mesh.dp):
            sel = order[bounds[d]:bounds[d + 1]]
            ukeys, local = np.unique(keys[sel], return_inverse=True)
            by_chunk = np.argsort(local, kind="stable")  # group by chunk, keep (mb, position) order
            sel, local = sel[by_chunk], local[by_chunk]
            samples = StepSamples(
                chunks=tuple(self._chunks[k].ref for k in ukeys.tolist()),
                chunk=local.astype(np.int32), index=index32[sel], micro_batch=a.micro_batch[sel],
                position=a.position[sel], num_tokens=trunc[sel], sample_ids=ids[sel],
                source_index=src32[sel], shard=shard32[sel], row=row[sel],
                num_micro_batches=a.num_micro_batches)
            out.append(ConstructBatch(s, d, samples, stimulus_id=sid))
        S = len(self.names)
        summary = StepSummary(
            step=s, per_rank_cost=a.per_rank_cost, lower_bound=float(a.lower_bound),
            max_over_mean=float(a.max_over_mean), max_over_lower_bound=float(a.max_over_lower_bound),
            num_micro_batches=int(a.num_micro_batches),
            counts=np.bincount(src, minlength=S).astype(np.int64),
            tokens=np.bincount(src, weights=trunc, minlength=S).astype(np.int64),
            target_weights=st.weights, truncated=n_trunc, skipped=n_skipped, names=self.names)
        out.append(StepReady(s, summary, stimulus_id=sid))
        st.balanced = True
        st.pending.clear()
        expected = self._fcur + st.counts
        self._fcur = ends
        self.balanced_step = s + 1
        shifted = np.flatnonzero(ends != expected)
        if shifted.size:
            self._reprovision(s + 1, ends - expected, sid, out)
        nxt = self._steps.get(s + 1)
        if nxt is not None:
            nxt.cursors_before = self._fcur.copy()
        return True

    def _reprovision(self, first: int, delta: np.ndarray, sid: str, out: list[Instruction]) -> None:
        """Skipped rows pushed sources' cursors forward: move later provisional samples too."""
        self._pcur += delta
        stale: list[tuple[int, int]] = []
        for t in range(first, self.planned_step):  # need the new chunks first, release after,
            st = self._steps[t]                     # so a chunk moving between steps stays loaded
            st.prov_start = st.prov_start + delta
            st.taken = self._take(st.prov_start, st.counts)
            src, _, _, chunk, _ = st.taken
            new = dict.fromkeys(np.unique((src << _SHIFT) | chunk).tolist())
            stale.extend((t, k) for k in st.chunks if k not in new)
            st.chunks = {}
            st.pending = {}
            self._register(st, np.fromiter(new, np.int64, len(new)), sid, out)
        for t, key in stale:
            out.extend(self._unneed(key, t, sid))
        self._roll_windows(sid, out)
