"""The trainer side: attach to an mdata cluster and iterate over this rank's batches.

A trainer process (one per GPU) attaches to the cluster as a Dask client. It learns its place in the
device mesh from the torch.distributed environment (``RANK``, ``WORLD_SIZE``) or an explicit rank,
asks the Planner where its next batch is, and pulls its own slice straight from the constructor
worker that built it (``direct_to_workers``: bulk data never passes through the scheduler). A
background thread prefetches a few steps ahead; tensors land in pinned host memory and move to the
GPU on a side stream when CUDA is available. ``state_dict()`` records the checkpoint that travelled
with the last batch the *caller* consumed, never how far prefetching ran.

What counts is consumption, not prefetch: a step is acknowledged as consumed when the training
loop asks for the next batch (or calls :meth:`Loader.mark_consumed`), never when the prefetch
thread fetched it, so the Planner's "consumed" step is what trainers really trained on. Telling it
costs the loop no round trip: the step is noted and travels with the next location request, or
on its own a moment later (:mod:`mdata.trainer.consumption`). Loaders that share one Dask client ask
together, and the scheduler then pushes them the later steps' locations (:mod:`mdata.trainer.location_hub`).
A rank fed by broadcast (``Plan.broadcast_at``) costs the scheduler nothing per step when its
client holds a receiving rank: it takes each step's checkpoint from the locations those got,
and tells no consumption, which the Planner does not wait for (:mod:`mdata.trainer.fed_wait`).

Each Loader leases its rank (one rank, one Loader) and joins a *generation* of the job: a
Loader that brings a checkpoint for a job that runs already rewinds the job to it, and every rank
must bring the same step (see ``mdata.planner.roster``). A batch whose constructor died is rebuilt
and located again; the Loader follows it instead of failing. Every call is a typed message of :mod:`mdata.wire.messages`. When the job fails, the Loader raises
the error that failed it, as its own class with its fields (a corrupt shard arrives as a
``CorruptShardError`` with ``source``, ``shard`` and ``row``), noted with this rank and step.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from typing import Any

from mdata.errors import MeshError, RankTakenError, TrainerError, TrainerTimeoutError
from mdata.trainer.checkpoints import JobData, checkpoint_of, loader_state
from mdata.trainer.consumption import ConsumptionTeller, StepWaits
from mdata.trainer.registration import register_plan
from mdata.trainer.patience import Patience
from mdata.trainer.scheduler_loss import detach_quietly
from mdata.trainer.environment import default_device, rank_from_env, world_size_mismatch
from mdata.trainer.fed_wait import fed_checkpoint
from mdata.trainer.fetch import BatchMoved, fetch_slice
from mdata.trainer.job_wait import wait_for_job
from mdata.trainer.location_hub import LocationHub, hub_for, release as release_hub
from mdata.trainer.reach import connect_client
from mdata.wire.messages import (
    AckRequest, AttachRequest, BatchLocation, ConsumedTell, DetachRequest, JobInfo, LocationAsk,
    ReportMetricsRequest, Status, ask_sync,
)

__all__ = ["Loader", "default_device"]


class Loader:
    """Iterate over the batches of one trainer rank; torch-friendly, checkpointable, bounded.

    Each item is a dict: ``step``, ``micro_batches`` (list of dicts of torch tensors: ``input_ids``,
    ``labels``, ``position_ids``, ``cu_seqlens``... as the rank's role requires), ``sample_ids``;
    every field is described in docs/batch.md.
    ``checkpoint`` resumes (under a plan whose mesh or batch may differ from the writer's);
    ``accept_appended_shards`` and ``allow_mixture_change`` as for :func:`submit_job`.
    """

    def __init__(
        self,
        cluster,
        *,
        job: str = "default",
        plan=None,
        rank: int | None = None,
        world_size: int | None = None,
        steps: int | None = None,
        prefetch: int | None = None,
        timeout: float | None = None,
        device=None,
        checkpoint: dict | None = None,
        security=None,
        accept_appended_shards: bool = False,
        allow_mixture_change: bool = False,
    ) -> None:
        import mdata.wire.frames  # noqa: F401

        if rank is None or world_size is None:
            env_rank, env_world = rank_from_env()
            rank = env_rank if rank is None else rank
            world_size = env_world if world_size is None else world_size
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.job = job
        self.steps = steps
        from mdata import config

        self.prefetch = max(1, int(config.get("trainer.prefetch") if prefetch is None else prefetch))
        self.timeout = float(config.seconds("trainer.timeout") if timeout is None else timeout)
        self.poll_interval = config.seconds("trainer.poll-interval")
        self.device = default_device() if device is None else device
        self.plan = plan
        self.client, self._owns_client = connect_client(cluster, self.timeout, security)
        self.info: dict | None = None  # the job's info (JobInfo.to_msg()), once attached
        self.broadcast_source: int | None = None
        self._delivery = None  # what the constructor sends this rank (mdata.mesh.Delivery)
        self._restore: dict | None = checkpoint_of(checkpoint)
        # what a resume may accept (mdata.planner.resume); the job's data, learnt on attach
        self._resume_options = {"accept_appended_shards": bool(accept_appended_shards),
                                "allow_mixture_change": bool(allow_mixture_change)}
        self._data = JobData()
        self._next_step = 0
        self._consumed_checkpoint: dict | None = self._restore
        self._token = uuid.uuid4().hex  # this Loader's lease on its rank
        self._generation = 0
        self._taken: int | None = None  # the last step the caller took and has not acknowledged
        self._queue: queue.Queue = queue.Queue(maxsize=self.prefetch)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.wait_seconds = 0.0
        self.step_waits = StepWaits()  # the loop's wait per step, told with its consumption
        self.fetch_seconds = 0.0
        self._patience = Patience(self.client, job, self.rank, timeout=self.timeout,
                                  poll_interval=self.poll_interval)
        # seconds of each location request that returned a location (includes its long-poll wait
        # when the batch was not ready yet): what the control plane costs a rank, kept bounded
        self.locate_seconds: deque[float] = deque(maxlen=4096)
        self._teller: ConsumptionTeller | None = None  # consumption, told off the loop (on attach)
        self._hub: LocationHub | None = None  # location requests, with this client's other ranks

    @property
    def timeout(self) -> float:
        """Longest wait for one batch (seconds); may be changed while the Loader runs."""
        return self._timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._timeout = float(value)
        if getattr(self, "_patience", None) is not None:
            self._patience.set_timeout(value)

    def attach(self) -> dict:
        """Register (or find) the job, check this rank against its mesh and lease the rank;
        done on first use. A checkpoint brought here resumes the job from it, even while the
        job runs (it rewinds it; every rank must bring the same step)."""
        if self.info is None:
            if self.plan is not None:
                info = register_plan(self.client, self.plan, job=self.job, checkpoint=self._restore,
                                 by_loader=True, **self._resume_options)  # attach decides a rewind
            else:
                info = self._wait_for_job(self.job)
            self._validate_mesh(info)
            lease = self._lease()
            self._generation = lease.generation
            mesh = info.mesh.place_tree()
            # Under broadcast_at(axis) only the axis' first rank receives, and it receives all its
            # group needs (the whole sequence for "cp"); the others get the batch from it over the
            # GPU interconnect, so this Loader yields only who to receive from.
            self.broadcast_source = mesh.broadcast_source(self.rank, info.broadcast)
            self._delivery = mesh.delivery(self.rank, info.broadcast)
            if self._hub is None:  # ranks sharing this client ask where their batches are together
                self._hub = hub_for(self.client, self.job)
            if self.broadcast_source is not None:
                # fed by broadcast: the Planner does not wait for this rank's consumption (it is
                # never told), and the step's checkpoint comes with the locations its hub gets
                # for its receiving ranks (mdata.trainer.fed_steps)
                self._hub.feed(self.rank)
            elif self._teller is None:
                self._teller = ConsumptionTeller(self._tell_consumed, name=f"mdata-consumed-{self.rank}")
            self._data = JobData(lease.job_data)
            self._next_step = lease.start_step
            self.info = {**info.to_msg(), "start_step": lease.start_step}
        return self.info

    def _lease(self):
        """Claim this rank; a previous holder on its way out (its process just died) gets a few
        seconds to leave before the claim fails naming both Loaders."""
        request = AttachRequest(job=self.job, rank=self.rank, client=str(self.client.id),
                                token=self._token, host=socket.gethostname(), pid=os.getpid(),
                                checkpoint=self._restore, **self._resume_options)
        deadline = time.monotonic() + min(self.timeout, 10.0)
        while True:
            try:
                return ask_sync(self.client, request)
            except RankTakenError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.25)

    def _wait_for_job(self, job: str) -> JobInfo:
        return wait_for_job(self.client, job, self.rank, self.timeout)  # says which jobs exist

    def _validate_mesh(self, info: JobInfo) -> None:
        if info.world_size != self.world_size:
            raise world_size_mismatch(self.job, info.mesh, self.world_size)  # says what to do
        if not 0 <= self.rank < self.world_size:
            raise MeshError(f"rank {self.rank} is outside the world of {self.world_size} ranks")

    # -- iteration -----------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.attach()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._prefetch_loop, name=f"mdata-prefetch-{self.rank}", daemon=True
            )
            self._thread.start()
        delivered = 0
        while self.steps is None or delivered < self.steps:
            began = time.monotonic()
            try:
                item = self._patience.take(self._queue)
            except queue.Empty:
                raise TrainerTimeoutError(
                    f"rank {self.rank}: no batch for step {self._next_step} within {self.timeout:.0f}s; "
                    "check the Planner's dashboard for a stalled source pool"
                ) from None
            waited = time.monotonic() - began
            self.wait_seconds += waited
            if isinstance(item, BaseException):
                raise item
            step, batch, checkpoint = item
            self.step_waits.add(step, waited)
            self._next_step = step + 1
            self._consumed_checkpoint = checkpoint
            self._taken = step
            delivered += 1
            yield batch
            self.mark_consumed()  # the caller asks for the next batch: it is done with this one
        # (a caller that breaks out of the loop has not said it finished the last batch)

    def mark_consumed(self) -> None:
        """Mark the last batch taken as consumed (iteration does it when the caller asks for the
        next batch). The Planner hears it within a moment, without a round trip on the caller's
        loop; ``close()`` waits until it has. It releases a step once every rank consumed it."""
        step, self._taken = self._taken, None
        if step is not None and self._teller is not None:
            self._teller.note(step)  # returns at once; an earlier telling's error is raised here

    def _tell_consumed(self, steps: tuple[int, ...]) -> None:
        """The teller's thread: consumption no location request carried in time, told alone
        (with the other ranks of this client that have some to tell)."""
        hub = self._hub
        if hub is None:  # closed meanwhile: the steps stay noted (close() flushed what it could)
            raise TrainerError("loader closed")
        waited = hub.pushed_waits(self.rank, tuple(steps))  # told once, even if this tell fails
        with self._patience.scheduler.calls():  # a lost scheduler: say so, at once
            hub.tell(ConsumedTell(rank=self.rank, steps=tuple(steps), token=self._token,
                                  generation=self._generation, stalled_s=self.wait_seconds,
                                  waits=self.step_waits.of(steps), waited=waited))

    def _prefetch_loop(self) -> None:
        from mdata.trainer.tensors import batch_to_torch

        step = self._next_step
        end = None if self.steps is None else step + self.steps
        delivered = None  # the step received and not told yet: told with the next location
        try:
            while not self._stop.is_set() and (end is None or step < end):
                began = time.monotonic()
                if self.broadcast_source is not None:
                    # nothing to fetch, but the step's checkpoint makes this rank resumable too
                    item = (step, {"step": step, "micro_batches": None,
                                   "broadcast_from": self.broadcast_source},
                            dict(self._fed_checkpoint(step)))
                else:
                    location, batch = self._locate_and_fetch(step, delivered)
                    delivered = step
                    tensors = batch_to_torch(batch, device=self.device)
                    item = (step, {"step": step, **tensors}, dict(location.checkpoint))
                self.fetch_seconds += time.monotonic() - began
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                step += 1
            if delivered is not None:  # the last one (steps= reached, or closing)
                self._tell_delivered(delivered)
        except BaseException as exc:  # surface every failure to the consumer, never hang it
            if not self._stop.is_set():  # closed: nobody reads, and a full queue would block
                self._queue.put(self._patience.scheduler.explain(exc))

    def _tell_delivered(self, step: int) -> None:
        try:
            ask_sync(self.client, AckRequest(job=self.job, rank=self.rank, step=step,
                                             consumed=False, token=self._token,
                                             generation=self._generation))
        except Exception:
            if not self._stop.is_set():
                raise
            # closing: the cluster may be gone, and nobody reads the queue any more

    def _locate_and_fetch(self, step: int, delivered: int | None = None):
        """Where the batch is, then the batch; a batch whose constructor died is rebuilt by the
        cluster, so the Loader asks again where it is until its timeout. ``delivered``: the
        step received before, told to the Planner with the location request."""
        deadline = None  # counted from the first miss: the wait for the batch has its own
        while True:  # a moved batch is asked for: the long poll has the scheduler rebuild it
            location = self._locate(step, delivered, pushed=deadline is None)
            try:
                return location, fetch_slice(self.client, location, self._delivery)
            except BatchMoved as exc:
                if deadline is None:
                    deadline = time.monotonic() + self.timeout
                elif time.monotonic() > deadline:
                    raise TrainerError(
                        f"rank {self.rank}: batch of step {step} ({list(location.key)}) could not "
                        f"be fetched within {self.timeout:.0f}s: {exc}"
                    ) from None
                time.sleep(0.1)

    def _locate(self, step: int, delivered: int | None = None, pushed: bool = True) -> BatchLocation:
        wait = self._patience.begin()  # the timeout, stretched while storage is waited out
        push = self._hub.pushes is not None
        while True:
            if self._stop.is_set():  # closing: no new long poll
                raise TrainerError("loader closed")
            poll = self._patience.poll_s(wait, self.poll_interval)
            asked = time.monotonic()
            if push and pushed:  # pushed to this client: no round trip (none came: ask below)
                location, waited = self._hub.pushed(step, self.rank, self._generation, poll, self._stop)
                if location is not None:
                    self.locate_seconds.append(waited)
                    return location
                if self._stop.is_set():  # the wait for the push ended because of close()
                    raise TrainerError("loader closed")
            # with push, consumption is told alone (with the waits for the pushes)
            consumed = self._teller.take() if self._teller is not None and not push else ()
            try:
                reply = self._hub.locate(step, poll, LocationAsk(
                    rank=self.rank, token=self._token, generation=self._generation,
                    delivered=delivered, consumed=consumed, stalled_s=self.wait_seconds,
                    waits=self.step_waits.of(consumed)), self._stop)
            except BaseException:
                self._teller is None or self._teller.sent(consumed, ok=False)
                raise
            if self._teller is not None:
                self._teller.sent(consumed, ok=True)
            if reply.status is Status.OK:
                self.locate_seconds.append(time.monotonic() - asked)
                return reply.location
            if reply.status is Status.FAILED:
                # the error that failed the job, as its own class (a CorruptShardError...)
                raise reply.failure(f"rank {self.rank}, step {step}")
            if not self._patience.keep_waiting(wait, step):
                raise TrainerTimeoutError(
                    f"rank {self.rank}: the batch of step {step} was not ready within "
                    f"{self.timeout:.0f}s; check the Planner's dashboard for a stalled source pool"
                )

    def _fed_checkpoint(self, step: int) -> Any:  # a rank fed by broadcast: mdata.trainer.fed_wait
        ask = LocationAsk(rank=self.rank, token=self._token, generation=self._generation)
        return fed_checkpoint(self._hub, self._patience, self._stop, step=step, ask=ask,
                              poll_interval=self.poll_interval, timeout=self.timeout,
                              source=self.broadcast_source, locate_seconds=self.locate_seconds)

    # -- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What this rank consumed: restore it with ``load_state_dict`` or ``Loader(checkpoint=...)``
        (on a mesh of another shape too; docs/concepts.md, "Checkpoint and resume")."""
        return loader_state(self.job, self.rank, self._next_step, self._consumed_checkpoint,
                            self._data)

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state_dict()`` (the same object ``Loader(checkpoint=...)`` takes); call
        before iterating, on every rank of the job, all from the same step."""
        if self.info is not None:
            raise TrainerError("load_state_dict must be called before the Loader starts iterating")
        self._restore = checkpoint_of(state)
        self._consumed_checkpoint = self._restore

    def report_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Send training metrics (e.g. per-source loss) to metric-driven mixture policies; a
        Loader that has not attached yet attaches first (the Planner takes metrics from a rank's
        lease holder only)."""
        self.attach()
        ask_sync(self.client, ReportMetricsRequest(
            job=self.job, rank=self.rank, step=int(step),
            metrics={k: float(v) for k, v in metrics.items()},
            token=self._token, generation=self._generation,
        ))

    def close(self) -> None:
        """Stop prefetching, tell the Planner what the loop consumed, and end the rank's lease."""
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        thread = getattr(self, "_thread", None)
        if thread is not None:
            thread.join(timeout=0.2 if self._patience.scheduler.disconnected() else 5)
        teller = getattr(self, "_teller", None)
        if teller is not None:  # what the loop consumed reaches the Planner before the lease ends
            if not self._patience.scheduler.disconnected():
                teller.flush(timeout=2.0)
            teller.close()
        hub, self._hub = getattr(self, "_hub", None), None
        if hub is not None:
            release_hub(hub, self.rank)
        if getattr(self, "info", None) is not None and getattr(self, "client", None) is not None:
            # end the lease now, so another Loader may take the rank over at once (in 2 s at most)
            detach_quietly(self.client, DetachRequest(job=self.job, rank=self.rank, token=self._token))
        if getattr(self, "_owns_client", False):
            self.client.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def __getattr__(name: str):
    if name == "submit_job":  # it lived here; a driver function, now in mdata.driver.submit
        from mdata.driver.submit import submit_job

        return submit_job
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
