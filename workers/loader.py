"""Source loaders: the tasks and handlers that run inside a source pool's Dask workers.

A load task reads one chunk (a contiguous row range of one shard) through the worker's reader cache
(one open reader per source shard per worker process, never one per trainer rank), applies the
source's sample transform and keeps the resulting columnar ``SampleChunk`` in worker memory as the
task's result, each sample's token ids and pixels compressed on their own (a ``PackedChunk``,
``mdata.sources.pack-held``): a chunk stays held until its shuffle window is drawn, which at
hundreds of sources is most of a loader's memory. The Planner receives only a small summary
(sample ids and cost features), never the payload. Constructors later pull exactly the rows they
need through :func:`take_rows_handler`, decompressed (the same bytes the chunk was loaded with).

Where this runs and how a step flows through it: docs/dev/architecture.md.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from mdata.errors import MdataError, PlanError, SourceError, UntrustedSourceError
# Light modules only: the readers (pyarrow, fsspec) are imported by the first load or listing, so
# the scheduler and constructors, which import this module for its names, never load them.
from mdata.sources.chunk import SampleChunk
from mdata.sources.packed import PackedChunk
from mdata.sources.spec import Source
from mdata.sources.waits import storage_waits, storage_waits_begun
from mdata.spec import SourceSpec
from mdata.spec.worker_trust import worker_trust
from mdata.wire.errors import InvalidRequestError, error_to_msg
from mdata.wire.messages import (
    Status, StorageWaitsReply, StorageWaitsRequest, TakeRowsManyReply, TakeRowsManyRequest,
    TakeRowsReply, TakeRowsRequest,
)

_built: dict[str, Source] = {}  # SourceSpec.key() -> the Source built from it in this process
_built_lock = threading.Lock()


def build_source(source: Source | SourceSpec) -> Source:
    """The Source of a load task's spec, built once per process: this is where a source's
    transform is imported (on the loaders that run it, never on the scheduler), under this
    worker's own rule for transforms, URLs and storage options (``mdata.workers.*``,
    :mod:`mdata.spec.worker_trust`), checked on every task before anything is imported or opened."""
    trust = worker_trust()
    trust.check(source)  # UntrustedSourceError naming the source and the field
    if isinstance(source, Source):
        return source
    key = source.key()
    built = _built.get(key)
    if built is None:
        with _built_lock:
            built = _built.get(key)
            if built is None:
                built = _built[key] = source.build(trust.transforms(source.name))
    return built


def _portable(exc: BaseException, source: str) -> BaseException:
    """An error the scheduler can read without importing a client's code.

    Dask hands a task's exception to the Planner's client pickled; unpickling a class defined in a
    user module (a transform's own error) would import that module inside the scheduler. So such
    errors travel as a :class:`SourceError` naming the original class."""
    module = type(exc).__module__.split(".")[0]
    if module in ("builtins", "mdata"):
        return exc
    fields = {k: getattr(exc, k, None) for k in ("shard", "row", "hint")} if isinstance(exc, SourceError) else {}
    return SourceError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}", source=source, **fields)


def load_chunk_task(source: Source | SourceSpec, shard: int, start: int, stop: int,
                    listing: tuple[str, str, int] | None = None) -> SampleChunk | PackedChunk:
    """Dask task body: read and transform rows ``[start, stop)`` of one shard of ``source``;
    packed (:class:`PackedChunk`) unless ``mdata.sources.pack-held`` is off.

    ``listing`` is ``(digest of the job's listing, the shard's name, its rows)``: this process
    lists the source again when its own listing is another (shards appended since it listed)."""
    from mdata import config
    from mdata.sources.cache import default_reader_cache
    from mdata.sources.load import load_chunk_and_columns

    began = time.perf_counter()
    try:
        built, cache = build_source(source), default_reader_cache()
        if listing is not None:
            cache.check_listing(built, shard, listing)
        chunk, columns = load_chunk_and_columns(built, shard, start, stop, cache=cache)
    except Exception as exc:
        portable = _portable(exc, source.name)
        if portable is exc:
            raise
        raise portable from None
    held: SampleChunk | PackedChunk = (_packed(built, chunk, columns, start)
                                       if config.get("sources.pack-held") else chunk)
    del columns  # the read columns go as soon as the chunk is built (or packed)
    held.load_seconds = time.perf_counter() - began  # measured cost (packing too), feeds pool sizing
    return held


def _packed(source: Source, chunk: SampleChunk, columns: dict[str, list[Any]],
            start: int) -> PackedChunk:
    """``chunk`` packed; images that a decoder makes again from their stored cell (mdata's
    ``DecodeImageCaption``) are kept as those cells (from ``columns``, the rows read from
    ``start`` on) and decoded when taken."""
    from mdata.sources.encoded_images import image_decoder

    found = image_decoder(source.transform) if chunk.pixels is not None and len(chunk) else None
    if found is None:
        return PackedChunk.pack(chunk)
    field, decode = found
    cells = columns[field]
    return PackedChunk.pack(chunk, decode=decode, cells=[cells[r - start] for r in chunk.rows.tolist()])


def list_shards_task(source: Source | SourceSpec) -> dict[str, Any]:
    """Dask task body of registration, on a loader of the source's pool: build the Source (the
    import check of its transform, named with this worker when it fails), then list its shards.
    Returns ``shards``, ``[[shard name, rows], ...]`` (names relative to the source's URL, so the
    listing says what the data is and the URL where it lives: a checkpoint names either change),
    and whether the transform yields images.

    A typed mdata error (no file matches the URL, an untrusted transform) is the registration's
    answer, not a failure of this worker: it comes back as ``error`` (:func:`error_to_msg`), which
    the registration raises as the same error, so the worker logs no traceback for a user's wrong
    path."""
    try:
        return _list_source(source)
    except MdataError as exc:
        return {"error": error_to_msg(exc)}


def _list_source(source: Source | SourceSpec) -> dict[str, Any]:
    try:
        built = build_source(source)
    except UntrustedSourceError as exc:  # typed, to the trainer or driver that registers the plan
        raise UntrustedSourceError(f"{exc.message} (refused on worker {_worker_address()})",
                                   source=exc.source, field=exc.field, hint=exc.hint) from None
    except Exception as exc:
        raise PlanError(f"source {source.name!r} cannot be built on worker {_worker_address()}: "
                        f"{type(exc).__name__}: {exc}") from None
    from mdata.sources.listing import list_shards_resolved, shard_names

    try:
        listing, fs, paths = list_shards_resolved(built)
    except Exception as exc:
        portable = _portable(exc, source.name)
        if portable is exc:
            raise
        raise portable from None
    names = shard_names(fs, built.url, paths)
    return {"shards": [[name, int(shard.num_rows)] for name, shard in zip(names, listing.shards)],
            "produces_images": bool(getattr(built.transform, "produces_images", False)),
            "quarantined": [{"shard": i, "path": listing.shards[i].path, "rows": [0, 0], "step": 0,
                             "reason": f"at listing: {reason}"} for i, reason in listing.quarantined]}


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return "(not in a Dask worker)"


def chunk_summary_task(chunk: SampleChunk | PackedChunk) -> dict[str, Any]:
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
        if not isinstance(chunk, (SampleChunk, PackedChunk)):
            raise InvalidRequestError(f"mdata_take_rows: {req.key!r} is not a loaded chunk")
        indices = np.asarray(req.indices, dtype=np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(chunk)):
            raise InvalidRequestError(
                f"mdata_take_rows: indices must be in 0..{len(chunk) - 1} for chunk {req.key!r}, "
                f"got {int(indices.min())}..{int(indices.max())}")
        return TakeRowsReply(Status.OK, req.key, chunk.take(indices))

    return take_rows


def make_take_rows_many_handler(worker):
    """Build the function behind ``mdata_take_rows_many``: :func:`make_take_rows_handler`'s
    answer for each of several chunks, in one message (a constructor asks each loader once per
    batch instead of once per chunk)."""
    take_rows = make_take_rows_handler(worker)

    def take_rows_many(req: TakeRowsManyRequest) -> TakeRowsManyReply:
        return TakeRowsManyReply(tuple(take_rows(pull) for pull in req.pulls))

    return take_rows_many


def storage_waits_handler(req: StorageWaitsRequest) -> StorageWaitsReply:
    """The function behind ``mdata_storage_waits``: the sources of this worker process whose
    loads (or listings) are waiting out unreachable storage right now. The Planner polls it to
    tell operators which source waits and since when (``scheduler_plugins/storage_poll.py``), and
    counts the outages from the cumulative ``begun`` figures."""
    return StorageWaitsReply.of(storage_waits(), storage_waits_begun())
