"""Source loaders: the tasks and handlers that run inside a source pool's Dask workers.

A load task reads one chunk (a contiguous row range of one shard) through the worker's reader cache
(one open reader per source shard per worker process, never one per trainer rank), applies the
source's sample transform and keeps the resulting columnar ``SampleChunk`` in worker memory as the
task's result. The Planner receives only a small summary (sample ids and cost features), never the
payload. Constructors later pull exactly the rows they need through :func:`take_rows_handler`.

Where this runs and how a step flows through it: docs/dev/architecture.md.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mdata.sources import Source, SampleChunk, default_reader_cache, load_chunk, storage_waits
from mdata.wire.messages import (
    Status, StorageWaitsReply, StorageWaitsRequest, TakeRowsReply, TakeRowsRequest,
)


def load_chunk_task(source: Source, shard: int, start: int, stop: int) -> SampleChunk:
    """Dask task body: read and transform rows ``[start, stop)`` of one shard of ``source``."""
    began = time.perf_counter()
    chunk = load_chunk(source, shard, start, stop, cache=default_reader_cache())
    chunk.load_seconds = time.perf_counter() - began  # measured cost, feeds pool sizing
    return chunk


def chunk_summary_task(chunk: SampleChunk) -> dict[str, Any]:
    """Dask task body: the lineage and cost summary the Planner needs; runs where the chunk lives."""
    return {
        "rows": np.asarray(chunk.rows, dtype=np.int64),
        "num_tokens": np.asarray(chunk.num_tokens, dtype=np.int64),
        "num_patches": np.asarray(chunk.num_patches, dtype=np.int64),
        "skipped": [(int(s.row), str(s.reason)) for s in chunk.skipped],
        "nbytes": int(chunk.nbytes),
        "seconds": float(getattr(chunk, "load_seconds", 0.0)),
    }


def as_key(key: Any) -> Any:
    """Task keys travel over msgpack as lists; Dask keys are tuples."""
    return tuple(as_key(k) for k in key) if isinstance(key, (list, tuple)) else key


def make_take_rows_handler(worker):
    """Build the function behind ``mdata_take_rows``: exact rows of a chunk held in this worker's
    memory (register it with :func:`mdata.wire.messages.serve`)."""

    def take_rows(req: TakeRowsRequest) -> TakeRowsReply:
        try:
            chunk = worker.data[req.key]
        except KeyError:
            return TakeRowsReply(Status.MISSING, req.key)
        return TakeRowsReply(Status.OK, req.key, chunk.take(np.asarray(req.indices, dtype=np.int64)))

    return take_rows


def storage_waits_handler(req: StorageWaitsRequest) -> StorageWaitsReply:
    """The function behind ``mdata_storage_waits``: the sources of this worker process whose
    loads (or listings) are waiting out unreachable storage right now. The Planner polls it to
    tell operators which source waits and since when (``scheduler_plugins/storage_poll.py``)."""
    return StorageWaitsReply.of(storage_waits())
