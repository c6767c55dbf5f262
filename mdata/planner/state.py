"""The Planner's pure state machine: events in, instructions out, no I/O.

Modelled on distributed's ``worker_state_machine``: the Dask scheduler plugin (or
:func:`~mdata.planner.simulate`, or a test) feeds :mod:`~mdata.planner.events` to
:meth:`PlannerState.handle` and carries out the :mod:`~mdata.planner.instructions` it returns.
Every instruction repeats the ``stimulus_id`` of the event that caused it, and a bounded log keeps
each event described with the count of instructions of each kind it caused, for questions after
the fact (:mod:`~mdata.planner.event_log`: never the objects, which held whole steps alive).
Same events in, same instructions out.

Life of a step ``s`` (each stage is one collaborator, called from here in this order):

1. **Apportioned** when it enters the window (``s < consumed_step + window``):
   :class:`~mdata.planner.apportion.Provisioner` gives its weights, per-source counts and
   provisional samples; the :class:`~mdata.planner.chunk_table.ChunkTable` requests the chunks
   they live in (backpressure: nothing is loaded further ahead than the window).
2. **Balanced** once every chunk it needs is loaded, strictly in step order:
   :func:`~mdata.planner.selection.select_samples` passes over rows the loaders skipped, and
   :class:`~mdata.planner.assign.StepAssigner` prices the rest and assigns them to DP ranks and
   micro-batches. Out come one ``ConstructStep`` (every DP rank's samples) and a ``StepReady`` summary; if
   skips moved the cursors, later steps take their samples again (re-provisioning).
3. **Consumed**: when every receiving rank of a DP group reports ``BatchConsumed``, the group's
   batch is released (``ReleaseBatch``); when all groups have, the step is done, the window moves
   on and the chunk table releases chunks no planned-but-unconsumed step needs.

The checkpoint of step ``s`` uses snapshots taken when ``s`` was planned (cursors, apportioner
carry, mixture decisions), so it reflects what trainers consumed, not what was prefetched.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mdata.checkpoint import Checkpoint
from mdata.errors import MdataError, TrainerError
from mdata.lineage.dgraph import DGraph, LineageSegment
from mdata.mixing import MixtureSchedule
from mdata.order import ChunkRef, SourceOrder
from mdata.plan import Plan
from mdata.planner.apportion import PlannedStep, Provisioner, source_orders
from mdata.planner.assign import StepAssigner
from mdata.planner.checkpoints import JobIdentity, as_checkpoint, restore_checkpoint, take_checkpoint
from mdata.planner.chunk_table import ChunkTable, NotLoaded
from mdata.planner.consumption import consume_by_group
from mdata.planner.event_log import LogEntry, log_entry
from mdata.planner.events import (
    BatchConsumed, BatchDelivered, ChunkFailed, ChunkLoaded, MetricsReported, PlannerEvent,
    RanksConsumed, Tick, WorkerLost,
)
from mdata.planner.failure_hints import chunk_failure_hint
from mdata.planner.instructions import Instruction, JobFailed, ReleaseBatch, StepReady
from mdata.planner.pool_ticks import pool_targets_on_tick
from mdata.planner.quarantine import Quarantine
from mdata.planner.resume import Resume, ResumeOptions, plan_resume
from mdata.planner.selection import select_samples
from mdata.pools.demand import PoolSizer

__all__ = ["PlannerState"]

# acknowledgements arrive by the thousand per step: planning follows only when they free a step
_ACKNOWLEDGEMENTS = (BatchConsumed, RanksConsumed)


class PlannerState:
    """Pure planning state of one job (see the module docstring).

    ``listings`` maps each source name to its rows per shard (a sequence of ints, a
    ``SourceListing`` or a ``SourceMetadata``): the planner never reads data itself.
    ``pool_sizer`` decides :class:`PoolTarget` instructions on :class:`Tick` events.
    ``lineage_steps`` keeps the lineage of that many consumed steps (None: all of it);
    ``lineage_sink``, when given, receives each older range of lineage as a
    :class:`~mdata.lineage.events.LineageSegment` instead of it being forgotten (the runtime spills it
    to files, :mod:`mdata.lineage.spill`). It is called while events are handled: it must only
    hand the segment over, not write it.
    ``appended``: growths of sources' listings a resume accepted (see :mod:`mdata.order`).
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
        lineage_sink: Callable[[LineageSegment], None] | None = None,
        appended: Mapping[str, Sequence[tuple[int, int]]] | None = None,
    ) -> None:
        plan.validate()
        self.plan = plan
        self.job = job
        self.names = plan.source_names
        self.mesh = plan.mesh
        self.window = plan.window_steps
        self.global_batch = plan.balance_spec.global_batch
        #: ranks that receive each DP group's batch (others get it by broadcast)
        self.receivers = [frozenset(self.mesh.receivers(d, plan.broadcast)) for d in range(self.mesh.dp)]
        self._rank_dp = {r: d for d, rs in enumerate(self.receivers) for r in rs}
        self._rank_dp_table = np.full(self.mesh.world_size, -1, np.int64)  # -1: gets it by broadcast
        self._rank_dp_table[list(self._rank_dp)] = list(self._rank_dp.values())
        self._receiving = sum(map(len, self.receivers))  # acknowledgements that complete a step

        # the collaborators, built here and nowhere else
        orders = source_orders(plan, listings, appended)
        self.identity = JobIdentity.of(plan, listings, appended)  # what its checkpoints record
        self.resume = Resume()  # how it resumed from a checkpoint, if it did
        self.provisioner = Provisioner(orders, self.names, copy.deepcopy(plan.mixture),
                                       self.global_batch)  # a copy: stateful policies change
        self.chunks = ChunkTable(orders, job, width=max(plan.chunk_rows(n) for n in self.names))
        self.assigner = StepAssigner(plan)
        self.quarantine = Quarantine(plan.sources, self.chunks)  # on_corrupt="skip"
        self.pool_sizer = pool_sizer if pool_sizer is not None else PoolSizer.from_config(self.names)
        self.dgraph = DGraph(self.names, group_ranks=lambda d: sorted(self.receivers[d]))
        self.record_lineage = record_lineage
        self.lineage_steps = None if lineage_steps is None else max(1, int(lineage_steps))
        self.lineage_sink = lineage_sink

        # progress: steps [consumed_step, planned_step) are in flight
        S = len(self.names)
        self.steps: dict[int, PlannedStep] = {}
        self.cursors = np.zeros(S, np.int64)  # each source's cursor after the last balanced step
        self.consumed_step = 0  # first step not consumed by every DP group
        self.balanced_step = 0  # first step not balanced
        self.planned_step = 0  # first step not apportioned
        self.skipped = np.zeros(S, np.int64)  # rows the loaders skipped, per source
        self.truncated = 0  # samples cut to max_tokens
        self.failed: str | None = None
        self.log: deque[LogEntry] = deque(maxlen=log_size)

        # event type -> handler; planning (self._advance) follows every handler
        self._handlers: dict[type, Callable[[Any], list[Instruction]]] = {
            Tick: self._on_tick,
            ChunkLoaded: self._on_chunk_loaded,
            ChunkFailed: self._on_chunk_failed,
            WorkerLost: self._on_worker_lost,
            BatchDelivered: self._on_delivered,
            BatchConsumed: self._on_consumed,
            RanksConsumed: self._on_ranks_consumed,
            MetricsReported: self._on_metrics,
        }

    # -- public API ----------------------------------------------------------------------------
    def handle(self, *events: PlannerEvent) -> list[Instruction]:
        """Apply events in order; returns the instructions they cause, in order."""
        out: list[Instruction] = []
        log = self.log.append
        for ev in events:
            if not isinstance(ev, PlannerEvent):
                raise TypeError(f"PlannerState.handle takes PlannerEvent values, got {ev!r}")
            instr = self._handle_one(ev)
            log(log_entry(ev, instr))
            out.extend(instr)
        return out

    def is_quiet(self, events: Sequence[PlannerEvent]) -> bool:
        """Whether ``handle(*events)`` plans nothing (deliveries, consumptions too few to complete
        a step): the scheduler applies most batches so, without a hop to its planning thread."""
        acks: dict[int, int] = {}
        for ev in events:
            kind = type(ev)
            if kind is BatchConsumed or kind is RanksConsumed:
                acks[ev.step] = acks.get(ev.step, 0) + (1 if kind is BatchConsumed else len(ev.ranks))
            elif kind is not BatchDelivered:
                return False
        for step, n in acks.items():
            st = self.steps.get(step)
            if st is None or not st.balanced or n >= self._receiving - sum(map(len, st.consumed.values())):
                return False
        return self.failed is None

    def story(self, stimulus_id: str) -> list[LogEntry]:
        """Log entries of one stimulus (events and what they caused)."""
        return [entry for entry in self.log if entry[0] == stimulus_id]

    @property
    def chunks_in_memory(self) -> int:
        return self.chunks.in_memory

    def chunk_refs(self) -> list[ChunkRef]:
        """Chunks currently requested or loaded, in request order."""
        return self.chunks.refs()

    @property
    def orders(self) -> list[SourceOrder]:
        return self.provisioner.orders

    @property
    def schedule(self) -> MixtureSchedule:
        """The job's mixture (its own copy: a stateful policy's state is the job's)."""
        return self.provisioner.schedule

    def checkpoint(self, step: int, *, with_listings: bool = False, light: bool = False) -> Checkpoint:
        """The checkpoint as of having consumed every step before ``step`` (``with_listings``,
        ``light``: see :func:`~mdata.planner.checkpoints.take_checkpoint`)."""
        return take_checkpoint(
            step, identity=self.identity, provisioner=self.provisioner, steps=self.steps,
            cursors=self.cursors, consumed=self.consumed_step, balanced=self.balanced_step,
            planned=self.planned_step, seed=self.plan.seed_value, with_listings=with_listings,
            light=light)

    @classmethod
    def from_checkpoint(
        cls, plan: Plan, listings: Mapping[str, Any], checkpoint: Checkpoint | Mapping[str, Any],
        *, options: ResumeOptions | None = None, **kwargs: Any,
    ) -> "PlannerState":
        """A fresh state that continues where ``checkpoint`` left off, under ``plan`` (which may
        differ from the writer's in what :mod:`mdata.planner.resume` allows)."""
        ckpt = as_checkpoint(checkpoint)
        resume = plan_resume(ckpt, plan, listings, options or ResumeOptions())  # before building
        state = cls(plan, listings, appended=resume.appended, **kwargs)
        step, state.cursors = restore_checkpoint(state.provisioner, ckpt, resume)
        state.consumed_step = state.balanced_step = state.planned_step = step
        state.resume = resume
        return state

    # -- dispatch ------------------------------------------------------------------------------
    def _handle_one(self, ev: PlannerEvent) -> list[Instruction]:
        if self.failed is not None:
            return []
        handler = self._handlers.get(type(ev)) or self._handler_for(type(ev))
        before = self.consumed_step
        try:
            out = handler(ev)
            if self.consumed_step != before or not isinstance(ev, _ACKNOWLEDGEMENTS):
                self._advance(ev.stimulus_id, out)
        except TrainerError:
            raise
        except MdataError as exc:  # a bad weight, cost or batch shape: the job cannot go on
            return [self._fail(f"step {self.balanced_step}: {exc}", ev.stimulus_id, exc)]
        return out

    def _handler_for(self, cls: type) -> Callable[[Any], list[Instruction]]:
        """The handler of a subclass of a known event is its base's."""
        for base in cls.__mro__[1:]:
            if base in self._handlers:
                return self._handlers[base]
        raise TypeError(f"unknown planner event {cls.__name__}")

    def _fail(self, reason: str, sid: str, error: MdataError | None = None) -> JobFailed:
        self.failed = reason
        return JobFailed(reason, error, stimulus_id=sid)

    # -- events --------------------------------------------------------------------------------
    def _on_tick(self, ev: Tick) -> list[Instruction]:
        return pool_targets_on_tick(ev, self.pool_sizer, self.provisioner, self.global_batch, self.window,
                                    (self.consumed_step, self.balanced_step, self.planned_step))

    def _on_chunk_loaded(self, ev: ChunkLoaded) -> list[Instruction]:
        ref = ev.chunk
        c = self.chunks.placed(ref, ev.worker)
        if c is None:
            return []  # released before its load finished: nothing needs it
        rows = np.asarray(ev.rows, np.int64)
        if self.record_lineage:
            self.dgraph.record_load(ref.source_index, ref.chunk_id, ev.worker)
        self.pool_sizer.observe_load(ref.source_index, rows.size + len(ev.skipped_rows), ev.seconds)
        if not self.chunks.loaded(c):  # else a reload after a lost worker: same rows, same bytes
            self.chunks.fill(c, rows, ev.num_tokens, ev.num_patches)
        return []

    def _on_chunk_failed(self, ev: ChunkFailed) -> list[Instruction]:
        ref = ev.chunk
        if ref not in self.chunks or self.quarantine.passed_over(ref, ev.error, self.balanced_step):
            return []  # released already, or quarantined (on_corrupt="skip"): the job goes on
        error = ev.error if isinstance(ev.error, MdataError) else None
        return [self._fail(
            f"loading source {ref.source!r}, shard {ref.shard}, rows {ref.start}-{ref.stop} "
            f"failed: {ev.error}. {chunk_failure_hint(ev.error)}", ev.stimulus_id, error)]

    def _on_worker_lost(self, ev: WorkerLost) -> list[Instruction]:
        out: list[Instruction] = []
        self.chunks.worker_lost(ev.worker, ev.chunks, ev.stimulus_id, out)
        return out

    def _on_delivered(self, ev: BatchDelivered) -> list[Instruction]:
        if self.record_lineage:
            self.dgraph.record_delivered(ev.step, ev.dp_rank, ev.ranks)
        return []

    def _on_metrics(self, ev: MetricsReported) -> list[Instruction]:
        self.provisioner.observe(ev.step, ev.rank, ev.metrics)
        return []

    def _on_ranks_consumed(self, ev: RanksConsumed) -> list[Instruction]:
        """One :class:`BatchConsumed` per rank, in order, without an event object each: by DP
        group, with set and array operations, when the step is balanced and every rank is in
        the mesh (the common case at any scale); otherwise rank by rank."""
        st = self.steps.get(ev.step)
        ranks = np.fromiter(ev.ranks, np.int64, len(ev.ranks))
        if st is None or not st.balanced or not ranks.size or ranks.min() < 0 \
                or ranks.max() >= self.mesh.world_size:
            return self._ranks_consumed_one_by_one(ev)
        done, dps, fresh = consume_by_group(st.consumed, self.receivers, self._rank_dp_table, ranks)
        if self.record_lineage:
            self.dgraph.record_consumed_many(ev.step, dps, fresh)
        out: list[Instruction] = [ReleaseBatch(ev.step, tuple(done), stimulus_id=ev.stimulus_id)] if done else []
        st.groups_done += len(done)
        if done and st.groups_done == self.mesh.dp and ev.step == self.consumed_step:
            self._move_window(ev.stimulus_id, out)  # its oldest step is fully consumed
        return out

    def _ranks_consumed_one_by_one(self, ev: RanksConsumed) -> list[Instruction]:
        return [ins for rank in ev.ranks
                for ins in self._on_consumed(BatchConsumed(ev.step, rank, stimulus_id=ev.stimulus_id))]

    def _on_consumed(self, ev: BatchConsumed) -> list[Instruction]:
        dp = self._rank_dp.get(ev.rank)
        if dp is None:
            if 0 <= ev.rank < self.mesh.world_size:
                return []  # a rank that gets its data by broadcast: nothing to release
            raise TrainerError(f"rank {ev.rank} is not in the mesh {self.mesh.describe()}")
        st = self.steps.get(ev.step)
        if st is None or not st.balanced:
            if ev.step < self.consumed_step:
                return []  # a late duplicate
            raise TrainerError(
                f"rank {ev.rank} reports consuming step {ev.step}, which is not planned yet")
        group = st.consumed.setdefault(dp, set())
        if ev.rank in group:
            return []
        group.add(ev.rank)
        if self.record_lineage:
            self.dgraph.record_consumed(ev.step, dp, ev.rank)
        if len(group) != len(self.receivers[dp]):
            return []  # the group is not complete yet
        st.groups_done += 1
        out: list[Instruction] = [ReleaseBatch(ev.step, (dp,), stimulus_id=ev.stimulus_id)]
        if st.groups_done == self.mesh.dp and ev.step == self.consumed_step:
            self._move_window(ev.stimulus_id, out)  # its oldest step is fully consumed
        return out

    # -- the window ----------------------------------------------------------------------------
    def _move_window(self, sid: str, out: list[Instruction]) -> None:
        """Retire the fully consumed steps at the window's start and plan the steps that enter
        it before releasing chunks, so a chunk the next steps share with the retired ones stays
        loaded instead of being reloaded."""
        done: list[int] = []
        while (st := self.steps.get(self.consumed_step)) is not None and st.groups_done == self.mesh.dp:
            del self.steps[self.consumed_step]
            done.append(self.consumed_step)
            self.consumed_step += 1
        if self.lineage_steps is not None:
            # forget old lineage in batches of a quarter of the retention (amortised copying)
            horizon = self.consumed_step - self.lineage_steps
            if horizon - self.dgraph.forgotten_before >= max(1, self.lineage_steps // 4):
                if self.lineage_sink is None:
                    self.dgraph.forget_before(horizon)
                elif (segment := self.dgraph.take_before(horizon)) is not None:
                    self.lineage_sink(segment)
        while self.planned_step < self.consumed_step + self.window:
            self._plan_next(sid, out)
        for step in done:
            self.chunks.release(step, sid, out)

    def _advance(self, sid: str, out: list[Instruction]) -> None:
        """Apportion what the window allows, then balance ready steps strictly in step order."""
        while self.failed is None:
            if self.planned_step < self.consumed_step + self.window:
                self._plan_next(sid, out)
                continue
            st = self.steps.get(self.balanced_step)
            if st is None or self.chunks.waiting(st.step) or not self._balance(st, sid, out):
                break

    def _plan_next(self, sid: str, out: list[Instruction]) -> None:
        """Apportion the next step and request the chunks its provisional samples live in."""
        s = self.planned_step
        st = self.provisioner.plan(s)
        if s == self.balanced_step:
            st.cursors_before = self.cursors.copy()
        self.steps[s] = st
        self.planned_step = s + 1
        self.chunks.need(s, st.chunk_keys(), sid, out)
        # after needing: this step may still draw from the window the cursor just left
        self.chunks.roll_windows(self.provisioner.cursor, sid, out)

    def _balance(self, st: PlannedStep, sid: str, out: list[Instruction]) -> bool:
        """Select, price and assign the samples of ``st`` (the oldest unbalanced step); False if
        skipped rows moved its samples into chunks that are not loaded yet."""
        s = st.step
        try:
            sel = select_samples(st, self.cursors, self.orders, self.chunks)
        except NotLoaded as exc:  # skips moved the cursor into chunks not requested yet
            self.chunks.need(s, exc.missing, sid, out)
            return False
        self.chunks.settle(s, np.unique(sel.keys), sid, out)
        for i, shards, rows, cursors in sel.skipped:
            self.skipped[i] += rows.size
            if self.record_lineage:
                self.dgraph.record_skips(s, i, shards, rows, cursors)
        construct, summary = self.assigner.assign(
            s, st.weights, sel, self.chunks.refs_of, self.dgraph if self.record_lineage else None, sid)
        out.append(construct)
        out.append(StepReady(s, summary, stimulus_id=sid))
        self.truncated += summary.truncated
        st.balanced = True
        expected = self.cursors + st.counts
        self.cursors = sel.ends
        self.balanced_step = s + 1
        if not np.array_equal(sel.ends, expected):
            self._reprovision(s + 1, sel.ends - expected, sid, out)
        nxt = self.steps.get(s + 1)
        if nxt is not None:
            nxt.cursors_before = self.cursors.copy()
        return True

    def _reprovision(self, first: int, delta: np.ndarray, sid: str, out: list[Instruction]) -> None:
        """Skipped rows pushed sources' cursors forward: the steps planned after ``first - 1``
        take their samples again, and their chunks follow."""
        later = [self.steps[t] for t in range(first, self.planned_step)]
        self.provisioner.shift(later, delta)
        self.chunks.move([(st.step, st.chunk_keys()) for st in later], sid, out)
        self.chunks.roll_windows(self.provisioner.cursor, sid, out)
