"""One job's chunks on its loaders: the load tasks the Planner asked for, and what each one's
summary tells the Planner.

For every chunk (a run of rows of one shard) the Planner wants loaded, the runtime submits a load
task restricted to the source's pool (``pool_<source>``: :func:`workers.loader.load_chunk_task`,
which keeps the chunk in the loader's memory) and a summary task beside it
(:func:`workers.loader.chunk_summary_task`: kept rows, token and patch counts, skipped rows), and
only the summary comes back to the scheduler, as a :class:`~mdata.planner.ChunkLoaded` event (or
:class:`~mdata.planner.ChunkFailed` with the loader's typed error). The future of the load task
keeps the chunk alive until the Planner releases it. A job's loads go to Dask as one graph per
source per batch of instructions, not one message per chunk.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np

from mdata import planner as ps
from mdata.observe.data_waits import DataWaitLedger
from mdata.observe.meters import SourceMeter
from mdata.pools.standbys import pool_resource
from mdata.sources.shards import ListingExpectations
from scheduler_plugins.job_tasks import task_holders
from scheduler_plugins.recoveries import RecoveryTally
from workers.loader import chunk_summary_task, load_chunk_task

__all__ = ["ChunkLoads"]


class ChunkLoads:
    """The load tasks of one job (see the module docstring); ``futures``: chunk key -> the future
    that keeps the chunk in its loader's memory.

    The parts of the job it uses: the Planner's ``client`` and the ``scheduler``; the job's
    ``sources`` (by name) and ``listings`` (loaders list a shard again when it changed); the
    meters it feeds (``meter``: loads per source, ``waits``: when each chunk loaded, ``recoveries``:
    reloads); ``handle``, which applies the Planner events of a summary, and ``spawn``, which runs
    a coroutine as one of the job's tasks.
    """

    def __init__(self, client: Any, scheduler: Any, sources: Mapping[str, Any],
                 listings: Mapping[str, Any] | None, *, meter: SourceMeter, waits: DataWaitLedger,
                 recoveries: RecoveryTally, handle: Callable[..., Awaitable[None]],
                 spawn: Callable[[Awaitable[None]], None]) -> None:
        self.client, self.scheduler, self.sources = client, scheduler, sources
        self.expected_shards = ListingExpectations(listings)  # loaders list again on a mismatch
        self.meter, self.waits, self.recoveries = meter, waits, recoveries
        self.handle, self.spawn = handle, spawn
        self.futures: dict[Any, Any] = {}

    def __len__(self) -> int:
        return len(self.futures)

    def submit(self, loads: list) -> None:
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
                self.futures[chunk.key] = fut
                self.meter.requested(name, chunk.stop - chunk.start)
                self.spawn(self._await_summary(chunk, meta))

    async def _await_summary(self, chunk: Any, meta: Any) -> None:
        try:
            summary = await meta
        except Exception as exc:  # the load task raised: a typed SourceError naming the shard/row
            self.meter.failed(chunk.source, rows=chunk.stop - chunk.start)
            await self.handle(ps.ChunkFailed(chunk=chunk, error=exc, stimulus_id=f"failed-{chunk.key}"))
            return
        finally:
            meta.release()
        who = task_holders(self.scheduler, chunk.key)
        self.meter.loaded(chunk.source, rows=chunk.stop - chunk.start, samples=len(summary["rows"]),
                          seconds=summary["seconds"], now=time.monotonic())
        self.waits.loaded(tuple(chunk.key), chunk.source, time.monotonic())
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

    def release(self, chunk: Any) -> None:
        """The Planner released ``chunk``: its loader may drop it."""
        fut = self.futures.pop(chunk.key, None)
        self.waits.forget(tuple(chunk.key))
        if fut is not None:
            fut.release()

    def clear(self) -> list[Any]:
        """Forget every chunk (a rewind or a close); returns the futures to release."""
        futures = list(self.futures.values())
        self.futures.clear()
        return futures
