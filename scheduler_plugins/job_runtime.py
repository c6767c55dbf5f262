"""One job's adapter between the pure Planner state machine and Dask.

The decisions (what to load, how to balance, what to release, how big each pool should be) are made
by :class:`mdata.planner.PlannerState`, a pure state machine. This module only turns its
instructions into Dask actions (submit a load task restricted to a pool, submit a construct task
on a constructor, drop futures) and turns Dask outcomes (a chunk's summary arrived, a task failed, a
worker left, a trainer acknowledged a step) back into events. Planning runs in a thread so the
scheduler's event loop stays responsive; events are applied one batch at a time under a lock.
What the loop may read of the state meanwhile, and how, is the subject of
:mod:`scheduler_plugins.planner_view`. Replies and the construct task's spec are the typed messages
of :mod:`mdata.wire.messages`; a failure keeps its :class:`~mdata.errors.MdataError` so that
trainers raise the same class with its fields.

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

import numpy as np

from mdata import planner as ps
from mdata.observe.data_waits import DataWaitLedger
from mdata.errors import MdataError
from mdata.observe.meters import LoadHistory, SourceMeter, TrainerMeter
from mdata.sources import SourceStorageWait
from mdata.sources.shards import ListingExpectations
from mdata.wire.messages import (
    BatchLocationReply, PoolDecision, Status,
    StatusCounters, StatusReply, StorageWaitInfo,
)
from mdata.planner.roster import Holder, TrainerRoster
from mdata.planner.step_history import StepHistory
from mdata.wire.messages import AttachReply, AttachRequest
from mdata.wire.host_location import LocationAsk
from scheduler_plugins import rewind
from scheduler_plugins.batch_locations import locate_many
from scheduler_plugins.construct_parts import ConstructParts, part_of_step, split_groups
from scheduler_plugins.consumption import Told, consumption_events, delivery_events
from scheduler_plugins.job_tasks import release_job_tasks_settled
from scheduler_plugins.lineage_store import LineageStore
from scheduler_plugins.location_push import LocationPusher
from scheduler_plugins.planner_view import PlannerView
from scheduler_plugins.recoveries import RecoveryTally
from scheduler_plugins.told_steps import ToldSteps
from workers.constructor import construct_part_task
from workers.loader import chunk_summary_task, load_chunk_task

T = TypeVar("T")

logger = logging.getLogger("mdata.planner")

CONSTRUCTOR_RESOURCE = "mdata_constructor"


def pool_resource(source_name: str) -> str:
    """The Dask worker resource that marks a worker as a loader of ``source_name``."""
    return f"pool_{source_name}"


def pool_threads(workers, index: dict[str, int]) -> tuple[int, ...]:
    """Per source (``index``: its pool resource -> position), the loader threads of one worker
    of its pool (the largest amount of ``pool_<source>`` a worker holds; 0: no worker). One pass
    over the workers' resources, not one per source over every worker (10,000 sources times
    the workers, once a second)."""
    threads = [0] * len(index)
    for ws in workers:
        for name, amount in ws.resources.items():
            i = index.get(name)
            if i is not None and amount > threads[i]:
                threads[i] = int(amount)
    return tuple(threads)


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
        self.expected_shards = ListingExpectations(listings)  # loaders list again on a mismatch
        # what the job was registered to accept on resume; a rewind accepts it too
        self.resume_options = resume_options or ps.ResumeOptions()
        self.generation_options = ps.ResumeOptions()  # and what the last rewind accepted
        self.lineage_steps = lineage_steps
        # which Loader holds each rank, and which generation of the job it joined
        self.roster = TrainerRoster(plan.mesh.world_size, int(state.consumed_step))
        self.client = client
        self.job = job
        self.plan = plan
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
        self.chunk_futures: dict[Any, Any] = {}
        # (step, DP rank) -> the future of the construct task that builds the group's batch (a
        # part of the step's groups: scheduler_plugins.construct_parts), and what each part holds
        self.batch_futures: dict[tuple[int, int], Any] = {}
        self.parts = ConstructParts()
        self.batch_ready: dict[tuple[int, int], asyncio.Event] = defaultdict(asyncio.Event)
        # (reason, the typed error when it was an MdataError) per batch that could not be built
        self.batch_errors: dict[tuple[int, int], tuple[str, MdataError | None]] = {}
        # the Planner's latest decision per source, and every decision with the workers that
        # served the source then (the dashboard's sources page plots them over time)
        self.pool_targets: dict[str, PoolDecision] = {}
        self.pool_history: deque[tuple[PoolDecision, int]] = deque(maxlen=4000)
        self.scaler_status = None  # the autoscaler's last report (set by the Planner plugin)
        self._pool_inputs: tuple[float, tuple[int, ...], float] = (-1.0, (), 0.0)
        # (wall time, loaded samples, load tasks outstanding) per source, once a second, an hour
        self.source_history = LoadHistory(len(plan.source_names), keep=3600)
        self._pool_index = {pool_resource(n): i for i, n in enumerate(plan.source_names)}
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
        # consumption, whichever is first, and is recorded once (see _delivery). Steps, not the
        # last one: with pushed locations a later step's delivery may be told first
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
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self.pusher = LocationPusher(self)  # built batches' locations, pushed to subscribed clients
        self.location_requests = 0  # location requests served, and the rank asks they carried
        self.location_asks = 0
        self.consumed_requests = 0  # consumption told on its own (mdata_consumed), and over streams
        self.consumed_streamed = 0
        self.told = ToldSteps()  # each rank's steps told consumed: a resend counts once
        self._pending: list = []  # acknowledgements waiting for the Planner (see _handle_coalesced)
        self._pending_done: asyncio.Future | None = None
        from mdata import config

        self.chunk_wait_s = config.seconds("constructor.chunk-wait")
        self.history_steps = max(1, int(config.get("planner.history-steps")))
        # step -> its summary's dict (expanded when read; kept compact: mdata.planner.step_history)
        self.step_summaries = StepHistory(state.names, self.history_steps)

    # -- events in -------------------------------------------------------------------------------
    async def handle(self, *events) -> None:
        """Apply events to the pure state (in a thread) and execute the resulting instructions."""
        if self._closed:
            return
        async with self.lock:
            await self._apply(events)

    async def _apply(self, events) -> None:
        """The body of :meth:`handle`; the caller holds ``self.lock``."""
        if self._closed:  # queued behind close(): a closed job submits nothing
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
        (:meth:`_load_chunks`, :meth:`_construct_batches`): one graph per run of them, not one
        ``update-graph`` message (pickled, sent to this scheduler over the planner client's comm,
        unpickled) per chunk and per DP group, a cost that grew with DP groups every step."""
        loads: list = []
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
            self._load_chunks(loads)
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

    async def _handle_coalesced(self, *events) -> None:
        """Like :meth:`handle`, but events arriving while the Planner is busy are applied
        together in one batch. At thousands of trainer ranks every step brings one acknowledgement
        per rank; one thread hop per batch instead of per rank keeps the event loop responsive.
        Returns once the batch holding these events has been applied."""
        if self._closed:
            return
        await asyncio.shield(self._enqueue(events))

    def _enqueue(self, events) -> asyncio.Future:
        """The synchronous half of :meth:`_handle_coalesced`: events queued in call order."""
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
            now = time.monotonic()  # the clock feeds step-rate measurement and pool sizing
            threads, waited = self.pool_inputs(now)
            await self.handle(ps.Tick(now=now, stimulus_id=f"tick-{now:.3f}", wall=time.time(),
                                      waited_s=waited, pool_threads=threads))

    def pool_inputs(self, now: float) -> tuple[tuple[int, ...], float]:
        """What pool sizing reads besides the Planner's own state, refreshed once a second:
        loader threads per worker of each source's pool (0: no worker; a worker holds its thread
        count of ``pool_<source>``) and the mean stall of the ranks' training loops (the loops'
        own waits, not the prefetchers' long polls)."""
        then, threads, waited = self._pool_inputs
        if now - then >= 1.0:
            threads = pool_threads(self.scheduler.workers.values(), self._pool_index)
            stalls = self.stalled_seconds
            waited = sum(stalls.values()) / len(stalls) if stalls else 0.0
            self._pool_inputs = (now, threads, waited)
            # the dashboard's loads-over-time, same pace
            self.source_history.add(time.time(), *self.source_meter.totals())
        return threads, waited

    def pool_workers(self, source: str) -> int:
        """How many workers hold the source's pool resource right now."""
        resource = pool_resource(source)
        return sum(1 for ws in self.scheduler.workers.values() if ws.resources.get(resource, 0) > 0)

    def worker_lost(self, address: str) -> None:
        self.recoveries.worker_lost(self.scheduler, address, [f.key for f in self.batch_futures.values()])
        self._spawn(self.handle(ps.WorkerLost(worker=address, stimulus_id=f"lost-{address}")))

    # -- instructions out ------------------------------------------------------------------------
    def _load_chunk(self, ins: "ps.LoadChunk") -> None:
        self._load_chunks([ins])

    def _load_chunks(self, loads: list) -> None:
        """Submit each chunk's load task and the summary task the Planner hears from (one
        graph of each per source: a source's tasks need its pool's resource)."""
        by_source: dict[str, list] = {}
        for ins in loads:
            by_source.setdefault(ins.chunk.source, []).append(ins)
        for name, group in by_source.items():
            source, resources = self.sources[name], {pool_resource(name): 1}
            chunks = [ins.chunk for ins in group]
            for ins in group:
                if ins.reload:
                    self.recoveries.chunk_reloaded()
            futs = self.client.map(
                load_chunk_task, [source] * len(chunks), [c.shard for c in chunks],
                [c.start for c in chunks], [c.stop for c in chunks],
                [self.expected_shards.of(name, c.shard) for c in chunks],
                key=[c.key for c in chunks], resources=resources, pure=False)
            metas = self.client.map(
                chunk_summary_task, futs, key=[("mdata-summary",) + tuple(c.key[1:]) for c in chunks],
                resources=resources, pure=False)
            for chunk, fut, meta in zip(chunks, futs, metas):
                self.chunk_futures[chunk.key] = fut
                self.source_meter.requested(name, chunk.stop - chunk.start)
                self._spawn(self._await_summary(chunk, fut, meta))

    async def _await_summary(self, chunk, fut, meta) -> None:
        try:
            summary = await meta
        except Exception as exc:  # the load task raised: a typed SourceError naming the shard/row
            self.source_meter.failed(chunk.source, rows=chunk.stop - chunk.start)
            await self.handle(ps.ChunkFailed(chunk=chunk, error=exc, stimulus_id=f"failed-{chunk.key}"))
            return
        finally:
            meta.release()
        who = self.who_has(chunk.key)
        self.source_meter.loaded(chunk.source, rows=chunk.stop - chunk.start,
                                 samples=len(summary["rows"]), seconds=summary["seconds"],
                                 now=time.monotonic())
        self.data_waits.loaded(tuple(chunk.key), chunk.source, time.monotonic())
        await self.handle(
            ps.ChunkLoaded(
                chunk=chunk,
                rows=summary["rows"],
                num_tokens=summary["num_tokens"],
                num_patches=summary["num_patches"],
                skipped_rows=np.asarray([r for r, _ in summary["skipped"]], dtype=np.int64),
                worker=who[0] if who else "",
                seconds=summary["seconds"],
                stimulus_id=f"loaded-{chunk.key}",
            )
        )

    def _construct_step(self, ins: "ps.ConstructStep") -> None:
        self._construct_batches([ins])

    def _construct_batches(self, constructs: list) -> None:
        """Submit the construct tasks of these steps' DP groups, all in one graph: per step, one
        task per constructor slot, each building a part of the step's groups
        (:mod:`scheduler_plugins.construct_parts`)."""
        by_step: dict[int, "ps.ConstructStep"] = {int(ins.step): ins for ins in constructs}
        slots = self.constructor_slots()
        parts = [(step, part) for step, ins in by_step.items()
                 for part in split_groups(ins.dp_ranks, slots)]
        settings = self._construct_settings()
        specs = [part_of_step(step, by_step[step].columns, part, self.who_has, settings)
                 for step, part in parts]
        # the generation keeps a rewound job's batches apart from the ones it dropped; a part is
        # named by its step and first DP rank
        keys = [("mdata-construct", self.job, self.roster.generation, step, part[0])
                for step, part in parts]
        futs = self.client.map(construct_part_task, [spec.to_msg() for spec in specs],
                               key=keys, resources={CONSTRUCTOR_RESOURCE: 1}, pure=False)
        for (step, part), spec, fut in zip(parts, specs, futs):
            batches = [(step, dp) for dp in part]
            self.parts.add(fut.key, batches)
            for key in batches:
                self.batch_futures[key] = fut
            self.data_waits.planned(step, spec.pull_keys)
            self._spawn(self._await_batches(batches, fut))

    def constructor_slots(self) -> int:
        """Construct tasks the cluster's constructors run at once (their ``mdata_constructor``
        resource, one per thread); at least 1, so that a job planned before its constructors
        joined still has its batches queued."""
        total = sum(ws.resources.get(CONSTRUCTOR_RESOURCE, 0)
                    for ws in self.scheduler.workers.values())
        return max(1, int(total))

    def _construct_settings(self) -> dict[str, Any]:
        """The plan's batch settings every construct task carries (:func:`part_of_step`)."""
        image = self.plan.image_token_id
        return dict(max_tokens=int(self.plan.balance_spec.max_tokens), cp=int(self.plan.mesh.cp),
                    pad_id=int(self.plan.pad_id), image_token_id=None if image is None else int(image),
                    wait_s=float(self.chunk_wait_s))

    async def _await_batches(self, batches: list[tuple[int, int]], fut) -> None:
        """Wait for a construct task without gathering its result (the batches stay on the
        worker); ``batches``: the (step, DP rank) of the groups it builds.

        If the constructor holding them dies, the scheduler recomputes the task (this runtime
        still holds its future) on another or the restarted constructor, pulling the same rows
        again: :meth:`batch_location` notices the batch has no holder and waits here again. A
        batch that cannot be built (the task erred, e.g. its workers kept dying) fails the job
        with that cause, so every trainer hears it; the error's notes name the group."""
        exc = await fut.exception()  # waits for the task; never gathers the batches themselves
        held = [key for key in batches if self.batch_futures.get(key) is fut]
        if not held:
            return  # released, or dropped by a rewind, meanwhile
        if exc is not None or fut.status == "error":
            step, ranks = held[0][0], [dp for _, dp in held]
            notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))
            reason = (f"building step {step} for DP rank{'s' if len(ranks) > 1 else ''} "
                      f"{', '.join(map(str, ranks))} failed: {exc!r}{notes}")
            for key in held:
                self.batch_errors[key] = (reason, exc if isinstance(exc, MdataError) else None)
            self._fail(reason, exc)
        for key in held:
            self.batch_ready[key].set()
        if not self.failed.is_set():
            for key in held:
                self.pusher.built(key)  # to the clients whose ranks will pull it

    def _release_chunk(self, ins: "ps.ReleaseChunk") -> None:
        fut = self.chunk_futures.pop(ins.chunk.key, None)
        self.data_waits.forget(tuple(ins.chunk.key))
        if fut is not None:
            fut.release()

    def _release_batch(self, ins: "ps.ReleaseBatch") -> None:
        for dp in ins.dp_ranks:
            key = (ins.step, dp)
            fut = self.batch_futures.pop(key, None)
            self.batch_ready.pop(key, None)
            if fut is not None and self.parts.release(fut.key, key):
                fut.release()  # the last group of its part

    def _step_ready(self, ins: "ps.StepReady") -> None:
        self.step_summaries.add(ins.summary)  # compact; trimmed to the newest history-steps

    def _pool_target(self, ins: "ps.PoolTarget") -> None:
        decision = ins.decision
        self.pool_targets[decision.group] = decision
        self.pool_history.append((decision, self.pool_workers(decision.group)))
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
        for event in self.batch_ready.values():
            event.set()
        self.pusher.reset()  # ranks waiting on a push ask, and hear the failure

    # -- queries -----------------------------------------------------------------------------------
    def who_has(self, key) -> list[str]:
        ts = self.scheduler.tasks.get(key)
        return [ws.address for ws in ts.who_has] if ts is not None and ts.who_has else []

    def _ready(self, key: tuple[int, int]) -> bool:
        return self.failed.is_set() or (key in self.batch_futures and self.batch_ready[key].is_set())

    async def batch_location(self, rank: int, step: int, timeout: float, token: str = "",
                             generation: int = 0, delivered: int | None = None) -> BatchLocationReply:
        """Long-poll until the batch of ``step`` for ``rank``'s DP group is built (or fails)."""
        asks = [LocationAsk(rank, token, generation, delivered)]
        return (await locate_many(self, step, asks, timeout))[0]

    async def locate_many(self, step: int, asks, timeout: float) -> list[BatchLocationReply]:
        """:func:`scheduler_plugins.batch_locations.locate_many`: several ranks of one process."""
        return await locate_many(self, step, asks, timeout)

    def _stale(self, rank: int, token: str, generation: int) -> BatchLocationReply | None:
        """A FAILED reply for a Loader that lost its rank or whose generation is over."""
        try:
            self.roster.check(rank, token, generation)
        except MdataError as exc:
            return BatchLocationReply(Status.FAILED, reason=str(exc), error=exc)
        return None

    def _rebuilding(self, key: tuple[int, int], fut) -> None:
        """The batch under ``key`` lost its only copy, with the rest of its part: wait for the
        part's recomputation (once)."""
        event = self.batch_ready.get(key)
        if event is not None and event.is_set():
            held = [k for k in self.parts.members(fut.key) if self.batch_futures.get(k) is fut]
            for k in held:
                self.batch_ready[k].clear()
            logger.warning("mdata job %s: batches of step %d, DP ranks %s were lost with their "
                           "constructor; rebuilding them", self.job, key[0],
                           [dp for _, dp in held])
            self._spawn(self._await_batches(held, fut))

    async def acknowledge(self, rank: int, step: int, *, consumed: bool = True, token: str = "",
                          generation: int = 0, stalled_s: float = -1.0) -> None:
        """``rank`` consumed (its training loop took the next batch) or only received ``step``;
        ``stalled_s``: the rank's training loop's total wait for batches (-1: not told)."""
        if stalled_s >= 0:
            self.stalled_seconds[rank] = stalled_s
        if token:
            self.roster.check(rank, token, generation)  # a stale Loader hears it as an error
        if not consumed:
            delivery = self._delivery(rank, step, token)
            if delivery:
                await self._handle_coalesced(*delivery)
            return
        events, _ = consumption_events(self, [Told(rank, (step,), token)])
        await self._handle_coalesced(*events)

    def consumed_told(self, rank: int, steps: tuple[int, ...], token: str, stalled_s: float,
                      waits: tuple[float, ...] = ()) -> tuple[int, ...]:
        """``rank`` consumed ``steps``, told with its location request (checked by the handler):
        :meth:`consumed_many` for one rank. Returns the steps told first."""
        return self.consumed_many([Told(rank, tuple(steps), token, stalled_s, tuple(waits))])[0]

    def consumed_many(self, told) -> list[tuple[int, ...]]:
        """What several ranks consumed (:class:`~scheduler_plugins.consumption.Told` entries,
        checked by the handler), queued for the Planner now as a few events per step and DP
        group (:mod:`scheduler_plugins.consumption`), without waiting for them to be applied,
        so the message that carried them is answered at once. ``waits`` feed the dashboard's
        waiting page (:mod:`mdata.observe.data_waits`). Per entry, the steps told first."""
        events, firsts = consumption_events(self, told)
        if events:
            self._enqueue(events)
        return firsts

    def pushed_waits(self, rank: int, steps, waited) -> None:
        """How long ``rank``'s prefetcher waited for the pushed locations of ``steps`` (-1: it
        long-polled, measured in ``locate_many``), counted as a long poll's wait is."""
        for step, seconds in zip(steps, waited):
            if seconds >= 0:
                self.wait_seconds[rank] += seconds
                self.trainer_meter.waited(rank, step, seconds)

    def pushed_waits_many(self, step: int, ranks, waited) -> None:
        """:meth:`pushed_waits` of one ``step`` for several ranks (one message of many)."""
        kept = [(r, w) for r, w in zip(ranks, waited) if w >= 0]
        if kept:
            totals = self.wait_seconds
            for rank, seconds in kept:
                totals[rank] += seconds
            self.trainer_meter.waited_many(step, [r for r, _ in kept], [w for _, w in kept])

    def _delivery(self, rank: int, step: int, token: str) -> list:
        """The delivery of ``step`` to ``rank`` as an event, unless that Loader told it already
        (a rank that gets its batch by broadcast has none)."""
        return delivery_events(self, rank, step, token)

    # -- trainers: leases and resumes ---------------------------------------------------------------
    async def attach(self, req: AttachRequest) -> AttachReply:
        """Lease a rank to a Loader; a checkpoint from a rank that already ran in this generation
        (or that starts another step) rewinds the job to it (see mdata.planner.roster)."""
        holder = Holder(req.client, req.token, req.host, req.pid)
        step = None if req.checkpoint is None else int(req.checkpoint["step"])
        options = ps.ResumeOptions(req.accept_appended_shards, req.allow_mixture_change)
        async with self.lock:
            last = self.consumed_steps.get(self.progress_rank(req.rank))
            att = self.roster.decide(req.rank, holder, checkpoint_step=step, is_live=self._is_live,
                                     next_step=None if last is None else last + 1)
            # the checkpoint is checked (and the rewound state built) before the roster moves on:
            # one this job cannot restore fails its own rank only (scheduler_plugins.rewind)
            state = rewind.resumed_state(self, req.checkpoint, options) if att.rewind else None
            if step is not None and state is None:
                rewind.check_joining(self, req.checkpoint, options)
            self.roster.commit(att)
            if state is not None:
                await self._rewind(state, options)
            identity = self.state.identity
        logger.info("mdata job %s: rank %d attached (%s), generation %d from step %d%s", self.job,
                    req.rank, holder.describe(), att.generation, att.start_step,
                    ", rewound" if att.rewind else "")
        return AttachReply(att.generation, att.start_step, identity.job_data())

    def progress_rank(self, rank: int) -> int:
        """The rank whose consumption tells how far ``rank`` trained: itself, or for a rank fed
        by broadcast (which tells none: the Planner does not wait for it) the rank it gets its
        batch from, whose training loop it follows step by step."""
        source = self.plan.mesh.broadcast_source(rank, self.plan.broadcast)
        return rank if source is None else source

    async def rewind_for_driver(self, checkpoint: dict,
                                options: "ps.ResumeOptions | None" = None) -> None:
        """A driver registered this (live) job again with a checkpoint of another step."""
        async with self.lock:
            if int(checkpoint["step"]) != self.roster.start_step:
                state = rewind.resumed_state(self, checkpoint, options)  # before the roster moves
                self.roster.rewound_by_driver(int(checkpoint["step"]))
                await self._rewind(state, options)

    def detach(self, rank: int, token: str) -> None:
        self.roster.detach(rank, token)

    def _is_live(self, holder: Holder) -> bool:
        """A lease lives while its Loader's Dask client is connected (a killed trainer's client
        leaves the scheduler when its connection drops)."""
        return holder.client in self.scheduler.clients

    async def _rewind(self, state: "ps.PlannerState",
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
        for fut in list(self.chunk_futures.values()) + list(self.batch_futures.values()):
            fut.release()
        self.chunk_futures.clear()
        self.batch_futures.clear()
        self.parts.clear()
        for event in self.batch_ready.values():
            event.set()  # long polls of the old generation wake up and see the rewind
        self.batch_ready = defaultdict(asyncio.Event)
        self.batch_errors.clear()
        self.consumed_steps.clear()
        self.delivered.clear()
        self.told.clear()
        self.failure, self.failure_error = None, None
        self.failed.clear()
        self.state = state
        self.view = PlannerView.of(state)
        now = time.monotonic()
        await self._apply([ps.Tick(now=now, stimulus_id=f"rewind-{now:.3f}")])

    def status(self, max_steps: int = 10_000) -> StatusReply:
        """A snapshot for trainers, the demo summary and the dashboard (counters from the view)."""
        view = self.view
        return StatusReply(
            job=self.job,
            failure=self.failure,
            uptime_s=time.time() - self.started,
            steps={str(k): self.step_summaries[k] for k in self.step_summaries.newest(max_steps)},
            pool_targets=dict(self.pool_targets),
            chunks_in_memory=len(self.chunk_futures),
            batches_in_memory=len(self.batch_futures),
            trainer_wait_s={str(k): float(v) for k, v in self.wait_seconds.items()},
            trainer_stall_s={str(k): float(v) for k, v in self.stalled_seconds.items()},
            consumed_steps={str(k): int(v) for k, v in self.consumed_steps.items()},
            counters=StatusCounters(
                planned_step=view.planned_step,
                balanced_step=view.balanced_step,
                consumed_step=view.consumed_step,
                chunks_loaded=view.chunks_loaded,
                truncated=view.truncated,
                skipped=dict(view.skipped),
            ),
            storage_waits=self.storage_wait_infos(),
            **({} if self.scaler_status is None else {"autoscaler": self.scaler_status}),
            **({} if self.lineage is None else {"lineage": self.lineage.info()}),
            recoveries=self.recoveries.counts(),
            quarantined=self.quarantined(),
        )

    def storage_wait_infos(self) -> dict[str, StorageWaitInfo]:
        """The job's sources waiting on storage now, as the status and a late Loader's
        :class:`~mdata.wire.messages.JobStorageWaitsRequest` report them."""
        now = time.time()
        return {name: StorageWaitInfo.of(wait, now) for name, wait in self.storage_waits.items()}

    def quarantined(self) -> dict[str, list]:
        """Per source, what on_corrupt="skip" passed over: shards listed with no rows, then the
        chunks the Planner quarantined (:mod:`mdata.planner.quarantine`)."""
        out = {name: list(entries) for name, entries in self.listed_quarantine.items()}
        for name, entries in self.view.quarantined.items():
            out.setdefault(name, []).extend(entries)
        return out

    # -- lifecycle -------------------------------------------------------------------------------
    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self._closed = True
        self.pusher.reset()
        if self._pending_done is not None and not self._pending_done.done():
            self._pending_done.set_result(None)  # acknowledgements of a closed job: nothing to do
        for task in list(self._tasks):
            task.cancel()
        async with self.lock:  # a planning step in flight submits first; none runs after
            for fut in list(self.chunk_futures.values()) + list(self.batch_futures.values()):
                fut.release()
            self.chunk_futures.clear()
            self.batch_futures.clear()
            self.parts.clear()
            # gone when close answers, also those still on the client's stream
            await release_job_tasks_settled(self.scheduler, self.client.id, self.job)
        if self.lineage is not None:
            await asyncio.to_thread(self.lineage.close)
