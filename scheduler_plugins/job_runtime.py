"""One job's adapter between the pure Planner state machine and Dask.

The decisions (what to load, how to balance, what to release, how big each pool should be) are made
by :class:`mdata.planner.PlannerState`, a pure state machine. This module only turns its
instructions into Dask actions (submit a load task restricted to a pool, submit a construct task
on a constructor, drop futures) and turns Dask outcomes (a chunk's summary arrived, a task failed, a
worker left) back into events. Planning runs in a thread so the scheduler's event loop stays
responsive; events are applied one batch at a time under a lock. What the loop may read of the
state meanwhile, and how, is the subject of :mod:`scheduler_plugins.planner_view`; the construct
task's spec is a typed message of :mod:`mdata.wire`; a failure keeps its
:class:`~mdata.errors.MdataError` so that trainers raise the same class with its fields.

The runtime holds what the trainers read and change (the roster of leases, the built batches,
what each rank consumed); what trainers ask of the job (attach, rewind, locate, consume) is
:mod:`scheduler_plugins.job_trainers`, built on this module, which never imports it.

Where this runs and how a step flows through it: docs/dev/architecture.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Any, TypeVar

from mdata import config
from mdata import planner as ps
from mdata.errors import MdataError
from mdata.observe.data_waits import DataWaitLedger
from mdata.observe.meters import LoadHistory, SourceMeter, TrainerMeter
from mdata.planner.roster import TrainerRoster
from mdata.planner.step_history import StepHistory
from mdata.sources import SourceStorageWait
from mdata.wire.messages import PoolDecision
from scheduler_plugins.built_batches import BuiltBatches
from scheduler_plugins.chunk_loads import ChunkLoads
from scheduler_plugins.construct_parts import (
    CONSTRUCTOR_RESOURCE, construct_settings, constructor_slots, part_of_step, split_groups,
)
from scheduler_plugins.job_tasks import release_job_tasks_settled
from scheduler_plugins.lineage_store import LineageStore
from scheduler_plugins.location_push import LocationPusher
from scheduler_plugins.planner_view import PlannerView
from scheduler_plugins.pool_inputs import PoolInputs, pool_workers
from scheduler_plugins.recoveries import RecoveryTally
from scheduler_plugins.told_steps import ToldSteps
from workers.constructor import construct_part_task

T = TypeVar("T")

logger = logging.getLogger("mdata.planner")


class JobRuntime:
    """Executes one job's plan on the cluster; owns the futures that keep chunks and batches alive."""

    #: per source, shards its listing quarantined (no rows: a corrupt footer, on_corrupt="skip")
    listed_quarantine: dict[str, list] = {}

    def __init__(self, scheduler, client, job: str, plan, state: "ps.PlannerState",
                 listings: dict[str, list] | None = None,
                 lineage_steps: int | None = None,
                 resume_options: "ps.ResumeOptions | None" = None) -> None:
        self.scheduler = scheduler
        self.listings = listings  # kept to rebuild the state when a trainer resumes (rewind)
        # what the job was registered to accept on resume; a rewind accepts it too
        self.resume_options = resume_options or ps.ResumeOptions()
        self.generation_options = ps.ResumeOptions()  # and what the last rewind accepted
        self.lineage_steps = lineage_steps
        # which Loader holds each rank, and which generation of the job it joined
        self.roster = TrainerRoster(plan.mesh.world_size, int(state.consumed_step))
        self.client, self.job, self.plan = client, job, plan
        # the plan's hash, told to every rank that attaches: worked out once, not per attach
        # (it hashes the whole plan; thousands of ranks attach at once)
        self.fingerprint = plan.fingerprint()
        self.state = state
        # lineage older than the DGraph's retention goes to files (scheduler_plugins.lineage_store)
        self.lineage = LineageStore.for_job(job, lineage_steps)
        if self.lineage is not None:
            state.lineage_sink = self.lineage.spill
        self.sources = {s.name: s for s in plan.sources if not isinstance(s, str)}
        self.lock = asyncio.Lock()
        # each DP group's batch of each step: its construct task (a part of the step's groups:
        # scheduler_plugins.construct_parts), whether it is built, why it could not be
        self.batches = BuiltBatches(scheduler, self._rebuild)
        # the Planner's latest decision per source, and every decision with the workers that
        # served the source then (the dashboard's sources page plots them over time)
        self.pool_targets: dict[str, PoolDecision] = {}
        self.pool_history: deque[tuple[PoolDecision, int]] = deque(maxlen=4000)
        self.scaler_status = None  # the autoscaler's last report (set by the Planner plugin)
        self.pool_inputs = PoolInputs(scheduler, plan.source_names)  # read once a second
        # (wall time, loaded samples, load tasks outstanding) per source, once a second, an hour
        self.source_history = LoadHistory(len(plan.source_names), keep=3600)
        self.failure: str | None = None
        self.failure_error: MdataError | None = None  # what failed the job, when typed
        self.failed = asyncio.Event()
        self.view = PlannerView.of(state)  # what the event loop reads (see planner_view)
        # Every instruction the Planner may give, and what carries it out; another is a bug.
        self._actions: dict[type, Callable[[Any], None]] = {
            ps.LoadChunk: self._load_chunk,
            ps.ConstructStep: self._construct_step,
            ps.ReleaseChunk: self._release_chunk,
            ps.ReleaseBatch: self._release_batch,
            ps.StepReady: self._step_ready,
            ps.PoolTarget: self._pool_target,
            ps.JobFailed: self._job_failed,
        }
        # rank -> (the Loader's lease token, the steps whose delivery it told, from the consumed
        # step on): a delivery arrives with a later location request or is implied by the
        # consumption, whichever is first, and is recorded once (scheduler_plugins.consumption).
        # Steps, not the last one: with pushed locations a later step's delivery may be told first
        self.delivered: dict[int, tuple[str, set[int]]] = {}
        self.wait_seconds: dict[int, float] = defaultdict(float)
        self.stalled_seconds: dict[int, float] = {}  # training loops' own waits (acks tell them)
        self.consumed_steps: dict[int, int] = {}
        self.rank_dp: list[int] = plan.mesh.coordinates().dp.tolist()  # each rank's DP group
        self.started = time.time()
        # What the dashboard shows (mdata.observe.meters): loads per source, trainer waits per step.
        self.source_meter = SourceMeter(tuple(plan.source_names), now=time.monotonic())
        self.trainer_meter = TrainerMeter()
        self.data_waits = DataWaitLedger()  # the loops' exposed waits, each blamed on a source
        # this job's sources waiting on storage, set by the Planner's poll (storage_poll.py)
        self.storage_waits: dict[str, SourceStorageWait] = {}
        self.recoveries = RecoveryTally()  # what faults cost the job: the status's recoveries
        # the chunks the Planner asked for, loaded on the pools' workers (scheduler_plugins.chunk_loads)
        self.loads = ChunkLoads(client, scheduler, self.sources, listings, meter=self.source_meter,
                                waits=self.data_waits, recoveries=self.recoveries, handle=self.handle,
                                spawn=self._spawn)
        self._tasks: set[asyncio.Task] = set()
        self.closed = False
        # built batches' locations, pushed to subscribed clients
        self.pusher = LocationPusher(job, scheduler, self.roster, plan.mesh, state.window, self.batches,
                                     self.failed, lambda step: self.view.checkpoint(step))
        # location requests served and the rank asks they carried; consumption told on its own
        # (mdata_consumed) and over streams
        self.location_requests = self.location_asks = 0
        self.consumed_requests = self.consumed_streamed = 0
        self.told = ToldSteps()  # each rank's steps told consumed: a resend counts once
        self._pending: list = []  # acknowledgements waiting for the Planner (see handle_coalesced)
        self._pending_done: asyncio.Future | None = None
        self.chunk_wait_s = config.seconds("constructor.chunk-wait")
        self.history_steps = max(1, int(config.get("planner.history-steps")))
        # step -> its summary's dict (expanded when read; kept compact: mdata.planner.step_history)
        self.step_summaries = StepHistory(state.names, self.history_steps)

    # -- events in -------------------------------------------------------------------------------
    async def handle(self, *events) -> None:
        """Apply events to the pure state (in a thread) and execute the resulting instructions."""
        if self.closed:
            return
        async with self.lock:
            await self._apply(events)

    async def _apply(self, events) -> None:
        """The body of :meth:`handle`; the caller holds ``self.lock``."""
        if self.closed:  # queued behind close(): a closed job submits nothing
            return
        try:
            if self.state.is_quiet(events):
                # acknowledgements that plan nothing (most of them) take microseconds: applying
                # them here saves the two thread wake-ups a hop costs (a fifth of the scheduler's
                # CPU went to them)
                instructions, view = self._plan(events)
            else:
                instructions, view = await asyncio.to_thread(self._plan, events)
            actions = [(self._action(ins), ins) for ins in instructions]
        except Exception as exc:  # a bug or bad plan must fail the job loudly, not hang trainers
            logger.exception("mdata planner failed on %s", events)
            self._fail(f"planner error: {exc!r}\n{traceback.format_exc()}", exc)
            return
        self.view = view
        self._carry_out(actions)

    def _carry_out(self, actions) -> None:
        """Carry out instructions in order; consecutive loads and constructions go to Dask together
        (:meth:`ChunkLoads.submit`, :meth:`_construct_batches`): one graph per run of them, not one
        ``update-graph`` message (pickled, sent to this scheduler over the planner client's comm,
        unpickled) per chunk and per DP group, a cost that grew with DP groups every step."""
        loads: list = []  # a run of each, sent when another instruction (or the end) comes
        constructs: list = []
        for action, ins in actions:
            kind = type(ins)
            if kind is ps.LoadChunk:
                loads.append(ins)
            elif kind is ps.ConstructStep:
                constructs.append(ins)
            else:
                self._submit(loads, constructs)
                action(ins)
        self._submit(loads, constructs)

    def _submit(self, loads: list, constructs: list) -> None:
        """The loads and constructions gathered so far, submitted; both lists emptied."""
        if loads:
            self.loads.submit(loads)
            loads.clear()
        if constructs:
            self._construct_batches(constructs)
            constructs.clear()

    def _plan(self, events) -> tuple[list, PlannerView]:
        """Runs in a thread, under ``self.lock``: apply the events, then snapshot the state."""
        instructions = self.state.handle(*events)
        balanced = [ins.step for ins in instructions if type(ins) is ps.StepReady]
        return instructions, PlannerView.of(self.state, self.view, balanced)

    def _action(self, ins) -> Callable[[Any], None]:
        try:
            return self._actions[type(ins)]
        except KeyError:
            raise TypeError(
                f"job {self.job!r}: the runtime has no action for the Planner's instruction "
                f"{type(ins).__name__} (known: {sorted(t.__name__ for t in self._actions)})"
            ) from None

    async def read_state(self, read: Callable[["ps.PlannerState"], T]) -> T:
        """``read(state)`` under the lock, on the event loop: for what the view does not hold
        (the DGraph, a checkpoint of any step); see :mod:`scheduler_plugins.planner_view`."""
        async with self.lock:
            return read(self.state)

    async def handle_coalesced(self, *events) -> None:
        """Like :meth:`handle`, but events arriving while the Planner is busy are applied
        together in one batch. At thousands of trainer ranks every step brings one acknowledgement
        per rank; one thread hop per batch instead of per rank keeps the event loop responsive.
        Returns once the batch holding these events has been applied."""
        if self.closed:
            return
        await asyncio.shield(self.enqueue(events))

    def enqueue(self, events) -> asyncio.Future:
        """The synchronous half of :meth:`handle_coalesced`: events queued in call order."""
        self._pending.extend(events)
        if self._pending_done is None:
            self._pending_done = asyncio.get_running_loop().create_future()
            self._spawn(self._flush_pending())
        return self._pending_done

    async def _flush_pending(self) -> None:
        async with self.lock:
            events, self._pending = self._pending, []
            done, self._pending_done = self._pending_done, None
            try:
                await self._apply(ps.coalesce_acknowledgements(events))
            finally:
                done.set_result(None)

    async def tick(self) -> None:
        if not self.lock.locked():
            now, inputs = time.monotonic(), self.pool_inputs  # the clock: step rate, pool sizing
            if inputs.refresh(now, self.stalled_seconds):  # the dashboard's loads over time, same pace
                self.source_history.add(time.time(), *self.source_meter.totals())
            await self.handle(ps.Tick(now=now, stimulus_id=f"tick-{now:.3f}", wall=time.time(),
                                      waited_s=inputs.waited, pool_threads=inputs.threads))

    def worker_lost(self, address: str) -> None:
        self.recoveries.worker_lost(self.scheduler, address, [f.key for f in self.batches.futures.values()])
        self._spawn(self.handle(ps.WorkerLost(worker=address, stimulus_id=f"lost-{address}")))

    # -- instructions out ------------------------------------------------------------------------
    def _load_chunk(self, ins: "ps.LoadChunk") -> None:
        self.loads.submit([ins])

    def _construct_step(self, ins: "ps.ConstructStep") -> None:
        self._construct_batches([ins])

    def _construct_batches(self, constructs: list) -> None:
        """Submit the construct tasks of these steps' DP groups, all in one graph: per step, one
        task per constructor slot, each building a part of the step's groups
        (:mod:`scheduler_plugins.construct_parts`)."""
        by_step: dict[int, "ps.ConstructStep"] = {int(ins.step): ins for ins in constructs}
        slots = constructor_slots(self.scheduler)
        parts = [(step, part) for step, ins in by_step.items()
                 for part in split_groups(ins.dp_ranks, slots)]
        settings = construct_settings(self.plan, self.chunk_wait_s)
        specs = [part_of_step(step, by_step[step].columns, part, self.batches.who_has, settings)
                 for step, part in parts]
        # the generation keeps a rewound job's batches apart from the ones it dropped; a part is
        # named by its step and first DP rank
        keys = [("mdata-construct", self.job, self.roster.generation, step, part[0])
                for step, part in parts]
        futs = self.client.map(construct_part_task, [spec.to_msg() for spec in specs],
                               key=keys, resources={CONSTRUCTOR_RESOURCE: 1}, pure=False)
        for (step, part), spec, fut in zip(parts, specs, futs):
            batches = [(step, dp) for dp in part]
            self.batches.add(fut, batches)
            self.data_waits.planned(step, spec.pull_keys)
            self._spawn(self._await_batches(batches, fut))

    async def _await_batches(self, batches: list[tuple[int, int]], fut) -> None:
        """Wait for a construct task without gathering its result (the batches stay on the
        worker); ``batches``: the (step, DP rank) of the groups it builds.

        If the constructor holding them dies, the scheduler recomputes the task (this runtime
        still holds its future) on another or the restarted constructor, pulling the same rows
        again: a long poll notices the batch has no holder and waits here again. A
        batch that cannot be built (the task erred, e.g. its workers kept dying) fails the job
        with that cause, so every trainer hears it; the error's notes name the group."""
        exc = await fut.exception()  # waits for the task; never gathers the batches themselves
        held = self.batches.held_by(batches, fut)
        if not held:
            return  # released, or dropped by a rewind, meanwhile
        if exc is not None or fut.status == "error":
            self._fail(self.batches.not_built(held, exc), exc)
        self.batches.mark_built(held)
        if not self.failed.is_set():
            for key in held:
                self.pusher.built(key)  # to the clients whose ranks will pull it

    def _release_chunk(self, ins: "ps.ReleaseChunk") -> None:
        self.loads.release(ins.chunk)

    def _release_batch(self, ins: "ps.ReleaseBatch") -> None:
        for dp in ins.dp_ranks:
            fut = self.batches.release((ins.step, dp))
            if fut is not None:
                fut.release()  # the last group of its part

    def _step_ready(self, ins: "ps.StepReady") -> None:
        self.step_summaries.add(ins.summary)  # compact; trimmed to the newest history-steps

    def _pool_target(self, ins: "ps.PoolTarget") -> None:
        decision = ins.decision
        self.pool_targets[decision.group] = decision
        self.pool_history.append((decision, pool_workers(self.scheduler, decision.group)))
        if decision.changed:
            logger.info("mdata job %s: pool of %s: %s", self.job, decision.group, decision.reason)

    def _job_failed(self, ins: "ps.JobFailed") -> None:
        self._fail(ins.reason, ins.error)  # the typed error that failed the job, when there is one

    def _fail(self, reason: str, error: BaseException | None = None) -> None:
        if self.failure is None:
            self.failure = reason
            self.failure_error = error if isinstance(error, MdataError) else None
            logger.error("mdata job %s failed: %s", self.job, reason)
        self.failed.set()
        self.batches.wake_all()
        self.pusher.reset()  # ranks waiting on a push ask, and hear the failure

    # -- queries -----------------------------------------------------------------------------------
    def _rebuild(self, held: list[tuple[int, int]], fut) -> None:
        """The built batches ``held`` (a part's groups) lost their only copy with their
        constructor: wait for Dask's recomputation of ``fut`` (:meth:`BuiltBatches.lost`)."""
        logger.warning("mdata job %s: batches of step %d, DP ranks %s were lost with their "
                       "constructor; rebuilding them", self.job, held[0][0], [dp for _, dp in held])
        self._spawn(self._await_batches(held, fut))

    async def rewind_to(self, state: "ps.PlannerState",
                        options: "ps.ResumeOptions | None" = None) -> None:
        """Drop everything planned and plan again from ``state``, built from a checkpoint by
        :func:`scheduler_plugins.rewind.resumed_state` with ``options``; the caller holds the
        lock. The new state replans exactly what the old one planned from that step (same plan,
        same listings, same cursors), so every rank sees the sequence it would have seen."""
        self.generation_options = options or ps.ResumeOptions()  # ranks joining accept it too
        if self.lineage is not None:  # the old generation's lineage stays told
            await asyncio.to_thread(self.lineage.rewound, self.state, state)
        for task in list(self._tasks):
            task.cancel()
        if self._pending_done is not None and not self._pending_done.done():
            self._pending_done.set_result(None)  # acknowledgements of the old generation
        self._pending, self._pending_done = [], None
        self.pusher.reset()  # the old generation's ranks ask, and hear of the rewind
        # every batch forgotten: long polls of the old generation wake up and see the rewind
        for fut in self.loads.clear() + self.batches.clear():
            fut.release()
        self.consumed_steps.clear()
        self.delivered.clear()
        self.told.clear()
        self.failure, self.failure_error = None, None
        self.failed.clear()
        self.state = state
        self.view = PlannerView.of(state)
        now = time.monotonic()
        await self._apply([ps.Tick(now=now, stimulus_id=f"rewind-{now:.3f}")])

    # -- lifecycle -------------------------------------------------------------------------------
    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self.closed = True
        self.pusher.close()
        if self._pending_done is not None and not self._pending_done.done():
            self._pending_done.set_result(None)  # acknowledgements of a closed job: nothing to do
        for task in list(self._tasks):
            task.cancel()
        async with self.lock:  # a planning step in flight submits first; none runs after
            for fut in self.loads.clear() + self.batches.clear():
                fut.release()
            # gone when close answers, also those still on the client's stream
            await release_job_tasks_settled(self.scheduler, self.client.id, self.job)
        if self.lineage is not None:
            await asyncio.to_thread(self.lineage.close)
