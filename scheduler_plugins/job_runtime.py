"""One job's adapter between the pure Planner state machine and Dask.

The decisions (what to load, how to balance, what to release, how big each pool should be) are made
by :class:`mdata.planner.PlannerState`, a pure state machine. This module only turns its
instructions into Dask actions (submit a load task restricted to a pool, submit a construct task
on a constructor, drop futures) and turns Dask outcomes (a chunk's summary arrived, a task failed, a
worker left, a trainer acknowledged a step) back into events. Planning runs in a thread so the
scheduler's event loop stays responsive; events are applied one batch at a time under a lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections import defaultdict
from typing import Any

import numpy as np

from mdata import planner as ps
from mdata.observe import SourceMeter, TrainerMeter
from workers.constructor import construct_task
from workers.loader import chunk_summary_task, load_chunk_task

logger = logging.getLogger("mdata.planner")

CONSTRUCTOR_RESOURCE = "mdata_constructor"


def pool_resource(source_name: str) -> str:
    """The Dask worker resource that marks a worker as a loader of ``source_name``."""
    return f"pool_{source_name}"


class JobRuntime:
    """Executes one job's plan on the cluster; owns the futures that keep chunks and batches alive."""

    def __init__(self, scheduler, client, job: str, plan, state: "ps.PlannerState") -> None:
        self.scheduler = scheduler
        self.client = client
        self.job = job
        self.plan = plan
        self.state = state
        self.sources = {s.name: s for s in plan.sources if not isinstance(s, str)}
        self.lock = asyncio.Lock()
        self.chunk_futures: dict[Any, Any] = {}
        self.batch_futures: dict[tuple[int, int], Any] = {}
        self.batch_ready: dict[tuple[int, int], asyncio.Event] = defaultdict(asyncio.Event)
        self.batch_errors: dict[tuple[int, int], str] = {}
        self.step_summaries: dict[int, dict] = {}
        self.pool_targets: dict[str, dict] = {}
        self.failure: str | None = None
        self.failed = asyncio.Event()
        self.delivered: dict[int, set[int]] = defaultdict(set)
        self.wait_seconds: dict[int, float] = defaultdict(float)
        self.consumed_steps: dict[int, int] = {}
        self.started = time.time()
        # What the dashboard shows (mdata.observe): loads per source, trainer waits per step.
        self.source_meter = SourceMeter(tuple(state.names), now=time.monotonic())
        self.trainer_meter = TrainerMeter()
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        self._pending: list = []  # acknowledgements waiting for the Planner (see _handle_coalesced)
        self._pending_done: asyncio.Future | None = None
        from mdata import config

        self.chunk_wait_s = config.seconds("constructor.chunk-wait")
        self.history_steps = max(1, int(config.get("planner.history-steps")))

    # -- events in -------------------------------------------------------------------------------
    async def handle(self, *events) -> None:
        """Apply events to the pure state (in a thread) and execute the resulting instructions."""
        if self._closed:
            return
        async with self.lock:
            await self._apply(events)

    async def _apply(self, events) -> None:
        """The body of :meth:`handle`; the caller holds ``self.lock``."""
        try:
            instructions = await asyncio.to_thread(self.state.handle, *events)
        except Exception as exc:  # a bug or bad plan must fail the job loudly, not hang trainers
            logger.exception("mdata planner failed on %s", events)
            self._fail(f"planner error: {exc!r}\n{traceback.format_exc()}")
            return
        self._execute(instructions)

    async def _handle_coalesced(self, *events) -> None:
        """Like :meth:`handle`, but events arriving while the Planner is busy are applied
        together in one batch. At thousands of trainer ranks every step brings one acknowledgement
        per rank; one thread hop per batch instead of per rank keeps the event loop responsive.
        Returns once the batch holding these events has been applied."""
        if self._closed:
            return
        self._pending.extend(events)
        if self._pending_done is None:
            self._pending_done = asyncio.get_running_loop().create_future()
            self._spawn(self._flush_pending())
        await asyncio.shield(self._pending_done)

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
            await self.handle(ps.Tick(now=now, stimulus_id=f"tick-{now:.3f}"))

    def worker_lost(self, address: str) -> None:
        self._spawn(self.handle(ps.WorkerLost(worker=address, stimulus_id=f"lost-{address}")))

    # -- instructions out ------------------------------------------------------------------------
    def _execute(self, instructions) -> None:
        for ins in instructions:
            kind = type(ins).__name__
            handler = getattr(self, f"_do_{kind}", None)
            if handler is None:
                logger.debug("mdata planner: no runtime action for %s", kind)
                continue
            handler(ins)

    def _do_LoadChunk(self, ins) -> None:
        chunk = ins.chunk
        source = self.sources[chunk.source]
        resources = {pool_resource(chunk.source): 1}
        fut = self.client.submit(
            load_chunk_task, source, chunk.shard, chunk.start, chunk.stop,
            key=chunk.key, resources=resources, pure=False,
        )
        meta_key = ("mdata-summary",) + tuple(chunk.key[1:])
        meta = self.client.submit(chunk_summary_task, fut, key=meta_key, resources=resources, pure=False)
        self.chunk_futures[chunk.key] = fut
        self.source_meter.requested(chunk.source, chunk.stop - chunk.start)
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

    def _do_ConstructBatch(self, ins) -> None:
        samples = ins.samples
        chunks = []
        for key, indices in samples.chunk_indices():
            chunks.append((list(key), [int(i) for i in indices], self.who_has(key)))
        spec = {
            "step": ins.step,
            "dp_rank": ins.dp_rank,
            "chunks": chunks,
            "micro_batch": samples.micro_batch,
            "position": samples.position,
            "lengths": samples.num_tokens,
            "sample_ids": np.stack([samples.source_index, samples.shard, samples.row], axis=1),
            "num_micro_batches": samples.num_micro_batches,
            "max_tokens": self.plan.balance_spec.max_tokens,
            "cp": self.plan.mesh.cp,
            "pad_id": self.plan.pad_id,
            "image_token_id": self.plan.image_token_id,
            "wait_s": self.chunk_wait_s,
        }
        key = ("mdata-construct", self.job, ins.step, ins.dp_rank)
        fut = self.client.submit(
            construct_task, spec, key=key, resources={CONSTRUCTOR_RESOURCE: 1}, pure=False
        )
        self.batch_futures[(ins.step, ins.dp_rank)] = fut
        self._spawn(self._await_batch(ins.step, ins.dp_rank, fut))

    async def _await_batch(self, step: int, dp_rank: int, fut) -> None:
        """Wait for a construct task without gathering its result (the batch stays on the worker)."""
        exc = await fut.exception()  # waits for the task; never gathers the batch itself
        if exc is not None or fut.status == "error":
            self.batch_errors[(step, dp_rank)] = (
                f"building step {step} for DP rank {dp_rank} failed: {exc}"
            )
        self.batch_ready[(step, dp_rank)].set()

    def _do_ReleaseChunk(self, ins) -> None:
        fut = self.chunk_futures.pop(ins.chunk.key, None)
        if fut is not None:
            fut.release()

    def _do_ReleaseBatch(self, ins) -> None:
        fut = self.batch_futures.pop((ins.step, ins.dp_rank), None)
        self.batch_ready.pop((ins.step, ins.dp_rank), None)
        if fut is not None:
            fut.release()

    def _do_StepReady(self, ins) -> None:
        self.step_summaries[ins.step] = ins.summary.to_dict(self.state.names)
        # a long run plans millions of steps: keep the recent ones (steps arrive in order)
        while len(self.step_summaries) > self.history_steps:
            self.step_summaries.pop(next(iter(self.step_summaries)))

    def _do_PoolTarget(self, ins) -> None:
        self.pool_targets[ins.source] = {"workers": ins.workers, "reason": ins.reason,
                                       "demand": float(ins.demand), "time": time.time()}

    def _do_JobFailed(self, ins) -> None:
        self._fail(ins.reason)

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            logger.error("mdata job %s failed: %s", self.job, reason)
        self.failed.set()
        for event in self.batch_ready.values():
            event.set()

    # -- queries -----------------------------------------------------------------------------------
    def who_has(self, key) -> list[str]:
        ts = self.scheduler.tasks.get(key)
        return [ws.address for ws in ts.who_has] if ts is not None and ts.who_has else []

    def _ready(self, key: tuple[int, int]) -> bool:
        return self.failed.is_set() or (key in self.batch_futures and self.batch_ready[key].is_set())

    async def batch_location(self, rank: int, step: int, timeout: float) -> dict:
        """Long-poll until the batch of ``step`` for ``rank``'s DP group is built (or fails)."""
        key = (step, self.plan.mesh.coordinate(rank).dp)
        if not self._ready(key):
            began = time.monotonic()
            try:
                await asyncio.wait_for(self._wait_ready(key), timeout)
            except asyncio.TimeoutError:
                return {"status": "timeout"}
            finally:
                self.wait_seconds[rank] += time.monotonic() - began
                self.trainer_meter.waited(rank, step, time.monotonic() - began)
        else:
            self.trainer_meter.waited(rank, step, 0.0)
        if self.failure is not None:
            return {"status": "failed", "error": self.failure}
        if key in self.batch_errors:
            return {"status": "failed", "error": self.batch_errors[key]}
        fut = self.batch_futures[key]
        role = self.plan.mesh.role(rank)
        return {
            "status": "OK",
            "key": list(fut.key),
            "who_has": self.who_has(fut.key),
            "cp_rank": int(role.cp_rank),
            "receives_tokens": bool(role.receives_tokens),
            "receives_labels": bool(role.receives_labels),
            "checkpoint": self.state.checkpoint(step + 1).to_dict(),
        }

    async def _wait_ready(self, key) -> None:
        while not self._ready(key):
            waiters = {
                asyncio.ensure_future(self.batch_ready[key].wait()),
                asyncio.ensure_future(self.failed.wait()),
            }
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:  # also when the long-poll itself is cancelled (timeout, trainer gone)
                for waiter in waiters:
                    waiter.cancel()

    async def acknowledge(self, rank: int, step: int, wait_s: float = 0.0) -> None:
        self.consumed_steps[rank] = max(self.consumed_steps.get(rank, -1), step)
        self.trainer_meter.consumed(rank, step)
        dp_rank = self.plan.mesh.coordinate(rank).dp
        await self._handle_coalesced(
            ps.BatchDelivered(step=step, dp_rank=dp_rank, ranks=(rank,), stimulus_id=f"delivered-{rank}-{step}"),
            ps.BatchConsumed(step=step, rank=rank, stimulus_id=f"ack-{rank}-{step}"),
        )

    def status(self, max_steps: int = 10_000) -> dict:
        """A JSON-friendly snapshot for trainers, the demo summary and the dashboard."""
        return {
            "job": self.job,
            "failure": self.failure,
            "uptime_s": time.time() - self.started,
            "steps": {str(k): v for k, v in sorted(self.step_summaries.items())[-max_steps:]},
            "pool_targets": dict(self.pool_targets),
            "chunks_in_memory": len(self.chunk_futures),
            "batches_in_memory": len(self.batch_futures),
            "trainer_wait_s": {str(k): float(v) for k, v in self.wait_seconds.items()},
            "consumed_steps": {str(k): int(v) for k, v in self.consumed_steps.items()},
            "counters": {
                "planned_step": int(self.state.planned_step),
                "balanced_step": int(self.state.balanced_step),
                "consumed_step": int(self.state.consumed_step),
                "chunks_loaded": int(self.state.chunks_in_memory),
                "truncated": int(self.state.truncated),
                "skipped": dict(zip(self.state.names, map(int, self.state.skipped))),
            },
        }

    # -- lifecycle -------------------------------------------------------------------------------
    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        self._closed = True
        if self._pending_done is not None and not self._pending_done.done():
            self._pending_done.set_result(None)  # acknowledgements of a closed job: nothing to do
        for task in list(self._tasks):
            task.cancel()
        for fut in list(self.chunk_futures.values()) + list(self.batch_futures.values()):
            fut.release()
        self.chunk_futures.clear()
        self.batch_futures.clear()
