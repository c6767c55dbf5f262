"""Cost features of video samples from container metadata: frames and patches without decoding.

The Planner balances on each sample's token and patch counts. For an image the patch count needs
the header; for a video it needs the header too: duration, frame size and rate say how many frames
the clip window samples, and frames times patches per frame is the sample's image tokens. Reading
that costs a container open (a few hundred microseconds), where decoding costs tens of
milliseconds, so :func:`load_cost_features` gives a source's features at a fraction of a load,
and a :class:`FeatureCache` keeps them per process, keyed by what determines them (the source's
files, the shard, the row and the transform), as the Planner keeps token counts of loaded chunks.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mdata.errors import SampleError, SourceError
from mdata.sources.video import VideoLimits, VideoProblem, clip_window, open_container, stream_duration, video_stream

if TYPE_CHECKING:
    from mdata.sources.cache import ReaderCache
    from mdata.sources.spec import Source

__all__ = ["ClipInfo", "FeatureCache", "frames_sampled", "load_cost_features", "probe_clip"]


@dataclass(frozen=True)
class ClipInfo:
    """What a clip's container says about its video stream (no frame decoded)."""

    seconds: float
    width: int
    height: int
    fps: float
    frames: int  # as the container declares it; 0 when it does not (WebM)
    codec: str


def probe_clip(data: Any, limits: VideoLimits | None = None) -> ClipInfo:
    """The :class:`ClipInfo` of encoded ``data``, checked against ``limits`` when given.

    Raises :class:`~mdata.sources.video.VideoProblem` as the decoder would: for a clip over a
    bound, or whose container or stream header cannot be read."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise VideoProblem(f"video value is {type(data).__name__}, not bytes",
                           "store encoded clip bytes (mp4, webm, mkv) in the video column")
    if limits is not None:
        limits.check_bytes(len(data))
    container = open_container(data)
    try:
        stream = video_stream(container)
        ctx = stream.codec_context
        rate = stream.average_rate or stream.guessed_rate
        info = ClipInfo(stream_duration(container, stream), int(ctx.width or 0), int(ctx.height or 0),
                        float(rate) if rate else 0.0, int(stream.frames or 0), ctx.name)
    finally:
        container.close()
    if limits is not None:
        limits.check_header(info.seconds, info.width, info.height)
    return info


def frames_sampled(info: ClipInfo, transform: Any) -> int:
    """Frames ``transform`` (a :class:`~mdata.sources.video_transform.DecodeVideoCaption`) samples
    from a clip: the count depends on the duration only, never on where the window starts."""
    window = clip_window(info.seconds, [0], clip_seconds=transform.clip_seconds,
                         num_frames=transform.num_frames, fps=transform.fps)
    frames = len(window.times)
    transform.limits.check_frames(frames)
    return frames


class FeatureCache:
    """Per-process LRU of rows' ``(num_tokens, num_patches)``, or the row's error, bounded by
    ``max_rows``; keyed by (source files, transform, shard, row)."""

    def __init__(self, max_rows: int = 1 << 20) -> None:
        self.max_rows = max_rows
        self._rows: OrderedDict[tuple, tuple[int, int] | SampleError] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: tuple) -> tuple[int, int] | SampleError | None:
        with self._lock:
            value = self._rows.get(key)
            if value is None:
                self.misses += 1
                return None
            self._rows.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: tuple, value: tuple[int, int] | SampleError) -> None:
        with self._lock:
            self._rows[key] = value
            self._rows.move_to_end(key)
            while len(self._rows) > self.max_rows:
                self._rows.popitem(last=False)

    def __len__(self) -> int:
        return len(self._rows)


_default = FeatureCache()


def load_cost_features(source: "Source", shard: int, start: int, stop: int, *,
                       cache: "ReaderCache | None" = None,
                       features: FeatureCache | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[SampleError]]:
    """Rows ``[start, stop)`` of a shard whose transform has ``cost_features``: the kept rows,
    their ``num_tokens`` (caption tokens + patches) and ``num_patches``, and the rows' errors.

    Rows already in ``features`` (the process's cache by default) are not read again; the rest are
    read through ``cache`` (the process's reader cache) and probed, not decoded."""
    from mdata.sources.cache import default_reader_cache
    from mdata.sources.transforms import ChunkContext

    cache = cache if cache is not None else default_reader_cache()
    features = features if features is not None else _default
    transform = source.transform
    if not hasattr(transform, "cost_features"):
        raise SourceError(f"transform {transform!r} has no cost_features", source=source.name,
                          hint="metadata-only features exist for video sources (DecodeVideoCaption)")
    info = cache.listing(source).shard(shard)
    keys = [(source.cache_key, transform, info.path, row) for row in range(start, stop)]
    values = [features.get(k) for k in keys]
    missing = [i for i, v in enumerate(values) if v is None]
    if missing:
        lo, hi = start + missing[0], start + missing[-1] + 1
        transform.setup()
        columns = cache.read(source, info.index, lo, hi)
        rows = np.arange(lo, hi, dtype=np.int64)
        context = ChunkContext(source=source.name, shard=info.index, shard_path=info.path, rows=rows)
        for j, result in enumerate(transform.cost_features(columns, context=context)):
            if isinstance(result, SampleError):
                value: tuple[int, int] | SampleError = result
            else:  # as load_chunk truncates text next to the patches under source.max_tokens
                text, p = len(result.tokens), int(result.num_patches)
                if source.max_tokens is not None:
                    text = min(text, max(0, source.max_tokens - p))
                value = (text + p, p)
            features.put(keys[lo - start + j], value)
            values[lo - start + j] = value
    kept = [i for i, v in enumerate(values) if not isinstance(v, SampleError)]
    errors = [v for v in values if isinstance(v, SampleError)]
    tokens = np.array([values[i][0] for i in kept], dtype=np.int32)
    patches = np.array([values[i][1] for i in kept], dtype=np.int32)
    return np.arange(start, stop, dtype=np.int64)[kept], tokens, patches, errors
