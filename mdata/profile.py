"""Per-source cost profiles: what one sample costs a loader, measured on the loader's own code path.

Pools are laid out offline (:mod:`mdata.pool_layout`) from measured costs, not from what a
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

The result is a :class:`Profile`, saved as versioned JSON (``mdata profile PLAN`` writes one).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mdata.errors import PlanError

__all__ = ["PROFILE_VERSION", "Profile", "SourceProfile", "default_profile_path", "profile_source",
           "profile_sources", "parallel_fraction"]

#: Version of the profile file; a newer file than this reader understands is refused.
PROFILE_VERSION = 1


def default_profile_path(plan_file: str | os.PathLike[str]) -> Path:
    """Where ``mdata profile PLAN`` writes its profile unless told (``--out``): ``PLAN_STEM.profile.json``
    beside the plan file, whatever the current directory, so the plan's profile is found where
    the plan is (``mdata cluster up --plan P --profile``, the docs' commands)."""
    plan_file = Path(plan_file)
    return plan_file.with_name(plan_file.stem + ".profile.json")


def parallel_fraction(speedup: float, threads: int) -> float:
    """Amdahl's parallel fraction ``p`` from a measured ``speedup`` on ``threads`` threads.

    ``speedup = 1 / ((1 - p) + p / threads)``; a transform that holds the GIL throughout has
    ``p = 0``, one that releases it throughout ``p = 1``. Clamped to [0, 1] (noise can push a
    measured speedup below 1 or above ``threads``).
    """
    if threads <= 1 or not speedup > 0:
        return 0.0
    p = (1.0 - 1.0 / speedup) / (1.0 - 1.0 / threads)
    return min(1.0, max(0.0, p))


@dataclass(frozen=True)
class SourceProfile:
    """What one sample of one source costs a loader (see the module docstring)."""

    name: str
    samples: int
    seconds_per_sample: float
    cpu_seconds_per_sample: float
    bytes_per_sample: float
    reader_bytes: int
    chunk_rows: int
    threads: int
    samples_per_s_1: float
    samples_per_s_n: float
    produces_images: bool = False
    decoder_bytes: int = 0

    def cost(self, basis: str = "cpu") -> float:
        """Seconds a loader thread spends per sample: ``"cpu"`` (process CPU time, unmoved by
        other programs competing for the cores) or ``"wall"`` (elapsed time, which also counts
        waiting on storage, and on the CPU when the profiling machine was busy)."""
        if basis == "cpu":
            return self.cpu_seconds_per_sample
        if basis == "wall":
            return self.seconds_per_sample
        raise PlanError(f"cost basis must be 'cpu' or 'wall', got {basis!r}")

    @property
    def task_seconds(self) -> float:
        """How long one load task (a chunk of ``chunk_rows`` samples) holds a loader thread."""
        return self.seconds_per_sample * self.chunk_rows

    @property
    def speedup(self) -> float:
        """Throughput with ``threads`` threads over one thread (1.0 when not measured)."""
        if self.threads <= 1 or not self.samples_per_s_1 > 0:
            return 1.0
        return self.samples_per_s_n / self.samples_per_s_1

    @property
    def parallel_fraction(self) -> float:
        """Amdahl's parallel fraction from :attr:`speedup` (0: the GIL serialises every thread)."""
        return parallel_fraction(self.speedup, self.threads)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SourceProfile":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Profile:
    """The profiles of a plan's sources, with where and when they were measured."""

    sources: tuple[SourceProfile, ...]
    host: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise PlanError(f"profile lists a source twice: {names}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sources)

    def __getitem__(self, name: str) -> SourceProfile:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(f"no profile for source {name!r}; profiled: {list(self.names)}")

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def to_dict(self) -> dict[str, Any]:
        return {"mdata_profile": PROFILE_VERSION, "host": dict(self.host),
                "sources": [s.to_dict() for s in self.sources]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Profile":
        version = data.get("mdata_profile")
        if not isinstance(version, int) or version < 1:
            raise PlanError(f"not an mdata profile (mdata_profile is {version!r}); write one with "
                            "`mdata profile PLAN`")
        if version > PROFILE_VERSION:
            raise PlanError(f"profile version {version} is newer than this mdata reads "
                            f"({PROFILE_VERSION}); upgrade mdata")
        return cls(tuple(SourceProfile.from_dict(s) for s in data["sources"]), dict(data.get("host", {})))

    def save(self, path: str | os.PathLike[str]) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Profile":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PlanError(f"cannot read profile {str(path)!r}: {type(exc).__name__}: {exc}") from None

    def table(self) -> str:
        """A plain-text table, one row per source."""
        from mdata.profile_report import profile_table

        return profile_table(self)


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
    from mdata.profile_report import Progress

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
