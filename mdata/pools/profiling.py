"""Profiling sources: what one sample costs a loader, measured on the loader's own code path.

Pools are laid out offline (:mod:`mdata.pools.layout`) from measured costs, not from what a
transform's name suggests: a short-caption image source can be cheaper than a source of long
documents, and a native-size photo costs a hundred times a chat turn. So :func:`profile_sources`
reads a sample of rows from every source exactly as a load task does (:func:`mdata.sources.load_chunk`
through a :class:`~mdata.sources.ReaderCache`, chunk by chunk) and records, per source:

- ``seconds_per_sample``: wall time of one loader thread per sample (read + transform), what the
  Planner's pool sizing measures on live workers too, and ``cpu_seconds_per_sample`` beside it
  (the process's CPU time: Arrow decodes Parquet pages in its own threads), which is what a
  layout uses by default because other programs on the profiling machine do not move it;
- ``bytes_per_sample``: the loaded sample's size in worker memory (tokens, image pixels);
- ``reader_bytes``: memory of one open reader (Python objects by tracemalloc, plus Arrow's pool),
  which every worker of the source's pool holds per open shard;
- ``decoder_bytes``: for video sources, the most memory one sample's decoder state held (the
  encoded clip, the codec's frame pool, the frames it emitted; FFmpeg's, out of tracemalloc's
  sight, so counted by :func:`mdata.sources.video.decoder_stats`), which every loader thread of
  the pool holds while it decodes (decoder state lives for one sample);
- ``samples_per_s_1`` and ``samples_per_s_n``: throughput with one thread and with ``threads``
  threads of one process, which tells whether the transform releases the GIL (image decoding and
  tiktoken do, in part) and so whether threads per worker help at all.

The result is a :class:`~mdata.pools.profile.Profile`, saved as versioned JSON (``mdata profile
PLAN`` writes one).
"""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from mdata.errors import PlanError
from mdata.pools.profile import Profile, SourceProfile
from mdata.pools.profile_progress import Progress

__all__ = ["host_info", "profile_source", "profile_sources"]


def _ranges(shards: Sequence[tuple[int, int]], chunk_rows: int, rows: int) -> list[tuple[int, int, int]]:
    """Chunk-shaped row ranges ``(shard, start, stop)`` adding up to at most ``rows`` rows, taken
    round-robin over the shards (their first chunks first), so a sample is not one shard's head."""
    out: list[tuple[int, int, int]] = []
    taken = 0
    offsets = [0] * len(shards)
    while taken < rows:
        progressed = False
        for k, (index, num_rows) in enumerate(shards):
            if taken >= rows or offsets[k] >= num_rows:
                continue
            stop = min(offsets[k] + chunk_rows, num_rows, offsets[k] + rows - taken)
            out.append((index, offsets[k], stop))
            taken += stop - offsets[k]
            offsets[k] = stop
            progressed = True
        if not progressed:
            break
    return out


def _reader_memory(open_reader: Callable[[], None]) -> int:
    """Bytes that ``open_reader`` leaves allocated: Python objects (tracemalloc) plus Arrow's
    memory pool (Parquet buffers live there, out of tracemalloc's sight)."""
    import pyarrow as pa

    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        before, arrow_before = tracemalloc.get_traced_memory()[0], pa.total_allocated_bytes()
        open_reader()
        after, arrow_after = tracemalloc.get_traced_memory()[0], pa.total_allocated_bytes()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return max(0, after - before) + max(0, arrow_after - arrow_before)


def _load_all(source: Any, ranges: Sequence[tuple[int, int, int]], cache: Any) -> tuple[int, int]:
    """Load every range as a load task would; returns (samples kept, bytes of the chunks)."""
    from mdata.sources import load_chunk

    samples = nbytes = 0
    for shard, start, stop in ranges:
        chunk = load_chunk(source, shard, start, stop, cache=cache)
        samples += len(chunk)
        nbytes += int(chunk.nbytes)
    return samples, nbytes


def profile_source(source: Any, *, rows: int = 64, threads: int | None = None,
                   on_phase: Callable[[str], None] | None = None) -> SourceProfile:
    """Profile one built :class:`~mdata.sources.Source` on up to ``rows`` of its rows.

    One untimed chunk first warms the process (the transform's setup, codec plugins, the page
    cache); then the rows are loaded once on one thread (timed: wall and process CPU), then by
    ``threads`` threads at once, each loading the same rows, through one shared reader cache as
    a worker's threads share theirs. ``threads`` defaults to ``min(4, CPUs)``; 1 skips the
    scaling measurement.
    """
    from mdata.sources import ReaderCache, load_chunk

    if not isinstance(rows, int) or rows < 1:
        raise PlanError(f"rows must be an int >= 1, got {rows!r}")
    threads = min(4, os.cpu_count() or 1) if threads is None else int(threads)
    if threads < 1:
        raise PlanError(f"threads must be >= 1, got {threads}")
    note = on_phase or (lambda phase: None)
    cache = ReaderCache()
    listing = cache.listing(source)
    shards = [(s.index, s.num_rows) for s in listing.shards if s.num_rows > 0]
    if not shards:
        raise PlanError(f"source {source.name!r} has no rows to profile")
    ranges = _ranges(shards, source.chunk_rows, rows)
    note("opening a reader")
    source.transform.setup()  # per-process state (a tokenizer), not the reader's
    shard, start, _ = ranges[0]
    # The first one-row load opens the shard (Parquet opens its file and footer lazily) and warms
    # the codecs; what it leaves allocated once its chunk is dropped is the reader's state.
    reader_bytes = _reader_memory(lambda: load_chunk(source, shard, start, start + 1, cache=cache) and None)

    video = sys.modules.get("mdata.sources.video")  # imported by video transforms only
    if video is not None:
        video.reset_decoder_peaks()
    note("one thread")
    wall0, cpu0 = time.perf_counter(), time.process_time()  # process: Arrow decodes in its pool
    samples, nbytes = _load_all(source, ranges, cache)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if samples == 0:
        raise PlanError(f"source {source.name!r}: every profiled row was skipped by its transform")
    rate_1 = samples / max(wall, 1e-9)
    rate_n = rate_1
    if threads > 1:
        note(f"{threads} threads")
        errors: list[BaseException] = []

        def work() -> None:
            try:
                _load_all(source, ranges, cache)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)

        pool = [threading.Thread(target=work, name=f"mdata-profile-{i}") for i in range(threads)]
        began = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if errors:
            raise errors[0]
        rate_n = threads * samples / max(time.perf_counter() - began, 1e-9)
    return SourceProfile(
        name=source.name, samples=samples, seconds_per_sample=wall / samples,
        cpu_seconds_per_sample=cpu / samples, bytes_per_sample=nbytes / samples,
        reader_bytes=int(reader_bytes), chunk_rows=int(source.chunk_rows), threads=threads,
        samples_per_s_1=rate_1, samples_per_s_n=rate_n,
        produces_images=bool(getattr(source.transform, "produces_images", False)),
        decoder_bytes=_decoder_bytes(),
    )


def _decoder_bytes() -> int:
    video = sys.modules.get("mdata.sources.video")
    return int(video.decoder_stats().peak_decode_bytes) if video is not None else 0


def host_info() -> dict[str, Any]:
    """Where a profile was measured: costs are this machine's, so the file says which."""
    return {"hostname": platform.node(), "cpus": os.cpu_count(), "machine": platform.machine(),
            "python": sys.version.split()[0], "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def profile_sources(sources: Iterable[Any], *, rows: int = 64, threads: int | None = None,
                    progress: bool | None = None) -> Profile:
    """Profile every source (see :func:`profile_source`); ``progress`` draws a bar on stderr
    (default: when stderr is a terminal; otherwise one line per finished source)."""
    sources = list(sources)
    names_only = [s for s in sources if isinstance(s, str)]
    if names_only:
        raise PlanError(f"sources {names_only} are names only: profiling reads each source's rows, "
                        "so every source needs its url and transform")
    bar = Progress(len(sources), enabled=progress)
    out = []
    for source in sources:
        bar.start(source.name)
        out.append(profile_source(source, rows=rows, threads=threads, on_phase=bar.phase))
        bar.done(out[-1])
    bar.close()
    return Profile(tuple(out), host_info())
