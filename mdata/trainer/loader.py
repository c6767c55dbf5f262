"""The trainer side: attach to an mdata cluster and iterate over this rank's batches.

A trainer process (one per GPU) attaches to the cluster as a Dask client. It learns its place in the
device mesh from the torch.distributed environment (``RANK``, ``WORLD_SIZE``) or an explicit rank,
asks the Planner where its next batch is, and pulls its own slice straight from the constructor
worker that built it (``direct_to_workers``: bulk data never passes through the scheduler). A
background thread prefetches a few steps ahead; tensors land in pinned host memory and move to the
GPU on a side stream when CUDA is available. ``state_dict()`` records the checkpoint that travelled
with the last batch the *caller* consumed, never how far prefetching ran.

Every call is a typed message of :mod:`mdata.wire.messages`. When the job fails, the Loader raises
the error that failed it, as its own class with its fields (a corrupt shard arrives as a
``CorruptShardError`` with ``source``, ``shard`` and ``row``), noted with this rank and step.
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from mdata.errors import MeshError, TrainerError, TrainerTimeoutError
from mdata.wire.messages import (
    AckRequest, BatchLocation, BatchLocationRequest, GetBatchRequest, JobInfo, JobInfoRequest,
    JobsRequest, NoHandlerError, RegisterJobRequest, ReportMetricsRequest, Status, ask, ask_sync,
)

__all__ = ["Loader", "submit_job", "default_device"]

_LOADER_STATE_VERSION = 1


def _connect(address_or_client, timeout: float, security=None):
    from distributed import Client

    if hasattr(address_or_client, "scheduler") and hasattr(address_or_client, "sync"):
        return address_or_client, False
    try:
        client = Client(address_or_client, direct_to_workers=True, timeout=timeout,
                        set_as_default=False, security=security)
    except OSError as exc:
        raise TrainerError(
            f"cannot reach the mdata scheduler at {address_or_client!r} within {timeout:.0f}s: {exc}; "
            "check the address printed by `mdata cluster up` (or your dask scheduler) and that "
            "this host can reach it"
        ) from exc
    return client, True


def submit_job(client, plan, *, job: str = "default", checkpoint: dict | None = None) -> dict:
    """Register ``plan`` as ``job`` with the cluster's Planner (idempotent for the same plan).

    Returns the job's info: fingerprint, mesh, and the first step trainers will receive.
    """
    return _register(client, plan, job=job, checkpoint=checkpoint).to_msg()


def _register(client, plan, *, job: str, checkpoint: dict | None) -> JobInfo:
    import mdata.wire.frames  # noqa: F401  the wire format must be known before batches arrive

    plan.validate_for_delivery()
    return ask_sync(client, RegisterJobRequest(job=job, plan=pickle.dumps(plan), checkpoint=checkpoint))


def default_device():
    """Where batches land: this process's GPU when CUDA is available (``cuda:LOCAL_RANK``, as
    torchrun sets it), else ``None`` (plain CPU tensors)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def _rank_from_env() -> tuple[int, int]:
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except KeyError:
        raise TrainerError(
            "cannot tell this trainer's rank: set RANK and WORLD_SIZE (torchrun does) or pass "
            "rank= and world_size= to mdata.trainer.Loader"
        ) from None


class Loader:
    """Iterate over the batches of one trainer rank; torch-friendly, checkpointable, bounded.

    Each item is a dict: ``step``, ``micro_batches`` (list of dicts of torch tensors: ``input_ids``,
    ``labels``, ``position_ids``, ``cu_seqlens``... as the rank's role requires), ``sample_ids``.
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
    ) -> None:
        import mdata.wire.frames  # noqa: F401

        if rank is None or world_size is None:
            env_rank, env_world = _rank_from_env()
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
        self.client, self._owns_client = _connect(cluster, self.timeout, security)
        self.info: dict | None = None  # the job's info (JobInfo.to_msg()), once attached
        self.broadcast_source: int | None = None
        self._delivery = None  # what the constructor sends this rank (mdata.mesh.Delivery)
        self._restore: dict | None = checkpoint
        self._next_step = 0
        self._consumed_checkpoint: dict | None = checkpoint
        self._queue: queue.Queue = queue.Queue(maxsize=self.prefetch)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.wait_seconds = 0.0
        self.fetch_seconds = 0.0

    def attach(self) -> dict:
        """Register (or find) the job and check this rank against its mesh; done on first use."""
        if self.info is None:
            if self.plan is not None:
                info = _register(self.client, self.plan, job=self.job, checkpoint=self._restore)
            else:
                info = self._wait_for_job(self.job)
            self._validate_mesh(info)
            self.info = info.to_msg()
            self._next_step = info.start_step
            mesh = info.mesh.place_tree()
            # Under broadcast_at(axis) only the axis' first rank receives, and it receives all its
            # group needs (the whole sequence for "cp"); the others get the batch from it over the
            # GPU interconnect, so this Loader yields only who to receive from.
            self.broadcast_source = mesh.broadcast_source(self.rank, info.broadcast)
            self._delivery = mesh.delivery(self.rank, info.broadcast)
        return self.info

    def _wait_for_job(self, job: str) -> JobInfo:
        deadline = time.monotonic() + self.timeout
        while True:
            if job in ask_sync(self.client, JobsRequest()).jobs:
                return ask_sync(self.client, JobInfoRequest(job))
            if time.monotonic() > deadline:
                raise TrainerTimeoutError(
                    f"rank {self.rank}: job {job!r} was not registered within {self.timeout:.0f}s; "
                    "pass plan= to the Loader or call mdata.driver.submit_job first"
                )
            time.sleep(0.2)

    def _validate_mesh(self, info: JobInfo) -> None:
        if info.world_size != self.world_size:
            m = info.mesh
            raise MeshError(
                f"job {self.job!r} plans for mesh dp={m.dp} pp={m.pp} cp={m.cp} tp={m.tp} "
                f"(world size {info.world_size}), but this trainer says WORLD_SIZE={self.world_size}"
            )
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
                item = self._queue.get(timeout=self.timeout)
            except queue.Empty:
                raise TrainerTimeoutError(
                    f"rank {self.rank}: no batch for step {self._next_step} within {self.timeout:.0f}s; "
                    "check the Planner's dashboard for a stalled source pool"
                ) from None
            self.wait_seconds += time.monotonic() - began
            if isinstance(item, BaseException):
                raise item
            step, batch, checkpoint = item
            self._next_step = step + 1
            self._consumed_checkpoint = checkpoint
            delivered += 1
            yield batch

    def _prefetch_loop(self) -> None:
        from mdata.trainer.tensors import batch_to_torch

        step = self._next_step
        end = None if self.steps is None else step + self.steps
        try:
            while not self._stop.is_set() and (end is None or step < end):
                began = time.monotonic()
                if self.broadcast_source is not None:
                    item = (step, {"step": step, "micro_batches": None,
                                   "broadcast_from": self.broadcast_source}, None)
                    self._queue.put(item)
                    step += 1
                    continue
                location = self._locate(step)
                batch = self._fetch(location)
                ask_sync(self.client, AckRequest(job=self.job, rank=self.rank, step=step))
                tensors = batch_to_torch(batch, device=self.device)
                self.fetch_seconds += time.monotonic() - began
                item = (step, {"step": step, **tensors}, dict(location.checkpoint))
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                step += 1
        except BaseException as exc:  # surface every failure to the consumer, never hang it
            self._queue.put(exc)

    def _locate(self, step: int) -> BatchLocation:
        deadline = time.monotonic() + self.timeout
        while True:
            poll = max(0.1, min(self.poll_interval, deadline - time.monotonic()))
            reply = ask_sync(self.client, BatchLocationRequest(
                job=self.job, rank=self.rank, step=step, timeout=poll))
            if reply.status is Status.OK:
                return reply.location
            if reply.status is Status.FAILED:
                # the error that failed the job, as its own class (a CorruptShardError...)
                raise reply.failure(f"rank {self.rank}, step {step}")
            if self._stop.is_set():
                raise TrainerError("loader closed")
            if time.monotonic() > deadline:
                raise TrainerTimeoutError(
                    f"rank {self.rank}: the batch of step {step} was not ready within "
                    f"{self.timeout:.0f}s; check the Planner's dashboard for a stalled source pool"
                )

    def _fetch(self, location: BatchLocation):
        delivery = self._delivery  # what this rank receives under the plan's broadcast axis
        request = GetBatchRequest(key=location.key, cp_rank=delivery.cp_rank,
                                  receives_tokens=delivery.receives_tokens,
                                  receives_labels=delivery.receives_labels)

        async def pull():
            last_error: object = None
            for address in location.who_has:
                try:
                    reply = await ask(self.client.rpc(address), request)
                except (OSError, NoHandlerError) as exc:  # gone, or shutting down
                    last_error = exc
                    continue
                if reply.status is Status.OK:
                    return reply.batch
                last_error = f"{address} answered {reply.status.value} for {list(reply.key)}"
            raise TrainerError(
                f"rank {self.rank}: batch {list(location.key)} is on no reachable constructor "
                f"({list(location.who_has)}): {last_error}"
            )

        return self.client.sync(pull)

    # -- checkpointing ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What this rank consumed: restore it with ``load_state_dict`` or ``Loader(checkpoint=...)``."""
        return {
            "version": _LOADER_STATE_VERSION,
            "job": self.job,
            "rank": self.rank,
            "next_step": self._next_step,
            "checkpoint": self._consumed_checkpoint,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from ``state_dict()``; call before iterating (every rank of the job does)."""
        if self.info is not None:
            raise TrainerError("load_state_dict must be called before the Loader starts iterating")
        if state.get("version") != _LOADER_STATE_VERSION:
            raise TrainerError(f"unknown Loader state version {state.get('version')!r}")
        self._restore = state["checkpoint"]
        self._consumed_checkpoint = state["checkpoint"]

    def report_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Send training metrics (e.g. per-source loss) to metric-driven mixture policies."""
        ask_sync(self.client, ReportMetricsRequest(
            job=self.job, rank=self.rank, step=int(step),
            metrics={k: float(v) for k, v in metrics.items()},
        ))

    def close(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        thread = getattr(self, "_thread", None)
        if thread is not None:
            thread.join(timeout=5)
        if getattr(self, "_owns_client", False):
            self.client.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
