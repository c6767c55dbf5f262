"""Video decoding for video-text sources: bounds from the container, a seeded clip window, frames.

A video sample costs 10-100x an image sample to decode, so the decoder works in the order that
bounds that cost, as the image decoder does: reject a clip over ``max_bytes`` before opening it,
read the container's header and reject a clip over ``max_seconds`` or ``max_pixels`` per frame
before decoding a frame, then seek to the keyframe before the clip window and decode only up to
the window's last sampled frame. Each sampled frame is converted to RGB at the encoder's
resolution by FFmpeg's scaler (one pass, no full-size RGB copy).

The window is drawn from the sample's seed (:func:`sample_seed`: the transform's seed, the source
name, the shard index and the row), never from a global random state, so the same sample gives
the same frames in every process and on every run: a recomputed chunk and a resumed job see
exactly the frames the first load saw.

Frames are emitted the way images are: one ``(frames * height, width, 3)`` uint8 array, the
frames stacked top to bottom. A ViT cutting that array into ``patch_size`` patches gets exactly
the patches of each frame in turn, so packing, the context-parallel split and the cost model see
a video sample as an image sample with ``frames * patches_per_frame`` image tokens.

Decoder state (the container and its codec context) lives for one sample: it is opened and
closed by :func:`decode_clip`, so a worker holds at most one per loader thread.
:func:`decoder_stats` reports how much memory decodes held (the process's peak), which
``mdata profile`` records per source. PyAV is the ``video`` extra, imported on first decode.
"""

from __future__ import annotations

import io
import math
import threading
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from mdata.distribution import install_hint

__all__ = ["ClipWindow", "DecoderStats", "VideoLimits", "VideoProblem", "clip_window",
           "decode_clip", "decoder_stats", "frame_times", "pyav", "record_held", "reset_decoder_peaks",
           "sample_seed"]


def pyav() -> Any:
    """The ``av`` module; an ``ImportError`` that says which extra installs it when missing."""
    try:
        import av
    except ImportError:
        raise ImportError(f"decoding video needs PyAV, which is not installed: {install_hint('video')}") from None
    return av


class VideoProblem(ValueError):
    """A clip cannot be used; carries a hint. ``limit`` is True when the clip is over a bound
    (the transform raises :class:`~mdata.errors.VideoLimitError`), False when it does not decode
    (:class:`~mdata.errors.VideoDecodeError`)."""

    def __init__(self, message: str, hint: str, *, limit: bool = False) -> None:
        super().__init__(message)
        self.hint = hint
        self.limit = limit


@dataclass(frozen=True)
class VideoLimits:
    """Bounds of one clip: encoded bytes, duration (seconds), source pixels per frame, and frames
    sampled from it. All are checked before any frame is decoded."""

    max_bytes: int = 256 << 20
    max_seconds: float = 600.0
    max_pixels: int = 3840 * 2160
    max_frames: int = 64

    def check_bytes(self, size: int) -> None:
        if size > self.max_bytes:
            raise VideoProblem(f"clip is {size:,} bytes, over max_bytes={self.max_bytes:,}",
                               "raise max_bytes if such clips are expected, or cut the clip", limit=True)

    def check_header(self, seconds: float, width: int, height: int) -> None:
        if seconds > self.max_seconds:
            raise VideoProblem(f"clip lasts {seconds:.1f} s, over max_seconds={self.max_seconds:g}",
                               "raise max_seconds, or cut long videos into clips", limit=True)
        if width * height > self.max_pixels:
            raise VideoProblem(
                f"frames are {width}x{height} = {width * height:,} pixels, over max_pixels={self.max_pixels:,}",
                "raise max_pixels if such clips are expected, or downscale them", limit=True)

    def check_frames(self, frames: int) -> None:
        if frames > self.max_frames:
            raise VideoProblem(f"the clip window samples {frames} frames, over max_frames={self.max_frames}",
                               "lower fps or clip_seconds, or raise max_frames", limit=True)


@dataclass(frozen=True)
class ClipWindow:
    """Where a sample's frames come from: ``start`` and ``length`` in seconds from the clip's
    first frame, and the sampled ``times`` (seconds, ascending) inside it."""

    start: float
    length: float
    times: tuple[float, ...]


def sample_seed(seed: int, source: str, shard: int, row: int) -> list[int]:
    """The seed of one sample's clip window: the same in every process and run (no global state,
    no salted ``hash``), different for every (source, shard, row)."""
    return [int(seed) & 0xFFFFFFFF, zlib.crc32(source.encode("utf-8")), int(shard), int(row)]


def frame_times(start: float, length: float, *, num_frames: int | None, fps: float | None) -> tuple[float, ...]:
    """Times to sample in ``[start, start + length)``: ``num_frames`` evenly spaced (each at the
    middle of its slice), or every ``1 / fps`` seconds from ``start`` (at least one frame)."""
    if num_frames is not None:
        step = length / num_frames
        return tuple(start + (i + 0.5) * step for i in range(num_frames))
    assert fps is not None
    count = max(1, int(math.floor(length * fps + 1e-9)))
    return tuple(start + i / fps for i in range(count))


def clip_window(duration: float, seed: list[int], *, clip_seconds: float | None,
                num_frames: int | None, fps: float | None) -> ClipWindow:
    """The sample's window: ``clip_seconds`` long (the whole clip when None or longer), its start
    drawn uniformly from the seed."""
    duration = max(0.0, float(duration))
    length = duration if clip_seconds is None else min(float(clip_seconds), duration)
    slack = duration - length
    start = float(np.random.default_rng(seed).uniform(0.0, slack)) if slack > 0 else 0.0
    if length <= 0.0:  # a one-frame clip (or a broken duration): sample its first frame
        return ClipWindow(0.0, 0.0, (0.0,) * (num_frames or 1))
    return ClipWindow(start, length, frame_times(start, length, num_frames=num_frames, fps=fps))


@dataclass(frozen=True)
class DecoderStats:
    """A process's video decodes: how many ran, how many containers are open now (at most one per
    loader thread), and the most memory one decode held: encoded bytes, the codec's frame pool
    (estimated from the frame size and the reorder depth) and the RGB frames it emitted."""

    decodes: int
    open_containers: int
    peak_open_containers: int
    peak_decode_bytes: int


_stats_lock = threading.Lock()
_stats = {"decodes": 0, "open": 0, "peak_open": 0, "peak_bytes": 0}


def decoder_stats() -> DecoderStats:
    """This process's :class:`DecoderStats` so far."""
    with _stats_lock:
        return DecoderStats(_stats["decodes"], _stats["open"], _stats["peak_open"], _stats["peak_bytes"])


def reset_decoder_peaks() -> None:
    """Start the peaks of :func:`decoder_stats` over from what is open now (``mdata profile``
    measures each source's decodes on their own)."""
    with _stats_lock:
        _stats["peak_open"] = _stats["open"]
        _stats["peak_bytes"] = 0


def _opened(delta: int) -> None:
    with _stats_lock:
        _stats["open"] += delta
        _stats["peak_open"] = max(_stats["peak_open"], _stats["open"])
        if delta < 0:
            _stats["decodes"] += 1


def _held(nbytes: int) -> None:
    with _stats_lock:
        _stats["peak_bytes"] = max(_stats["peak_bytes"], int(nbytes))


def record_held(nbytes: int) -> None:
    """Count ``nbytes`` held by one sample's decodes together in :func:`decoder_stats`' peak: a
    document's clips keep their frames while the next clip decodes, more than any one decode."""
    _held(nbytes)


def stream_duration(container: Any, stream: Any) -> float:
    """The video stream's duration in seconds: the stream's own, else the container's (WebM
    stores only the latter), else frames / rate; 0.0 when nothing says."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000
    rate = stream.average_rate or stream.guessed_rate
    return float(stream.frames / rate) if stream.frames and rate else 0.0


def open_container(data: Any) -> Any:
    """Open encoded ``data`` (bytes or a binary file object) as a PyAV container."""
    av = pyav()
    source = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    try:
        return av.open(source, mode="r")
    except Exception as exc:  # av.error.InvalidDataError, EOFError, ...
        raise VideoProblem(f"cannot open the clip's container ({type(exc).__name__}: {exc})",
                           "the bytes are truncated or not a video container (mp4, webm, mkv)") from None


def video_stream(container: Any) -> Any:
    if not container.streams.video:
        raise VideoProblem("the container holds no video stream", "store clips with a video track")
    return container.streams.video[0]


def decode_clip(data: bytes, *, seed: list[int], frame_size: tuple[int, int], limits: VideoLimits,
                clip_seconds: float | None = None, num_frames: int | None = None,
                fps: float | None = None, threads: int = 1) -> tuple[np.ndarray, ClipWindow]:
    """Decode a clip's window into ``(frames * height, width, 3)`` uint8 RGB, frames stacked top to
    bottom at ``frame_size = (height, width)``; returns the array and the window it came from.

    Raises :class:`VideoProblem` for clips over ``limits`` (checked before decoding) and for clips
    that do not open or decode.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise VideoProblem(f"video value is {type(data).__name__}, not bytes",
                           "store encoded clip bytes (mp4, webm, mkv) in the video column")
    limits.check_bytes(len(data))
    height, width = frame_size
    container = open_container(data)
    _opened(+1)
    try:
        stream = video_stream(container)
        ctx = stream.codec_context
        duration = stream_duration(container, stream)
        limits.check_header(duration, int(ctx.width or 0), int(ctx.height or 0))
        window = clip_window(duration, seed, clip_seconds=clip_seconds, num_frames=num_frames, fps=fps)
        limits.check_frames(len(window.times))
        ctx.thread_count = threads
        pool = int(ctx.width or 0) * int(ctx.height or 0) * 3 // 2 * (int(ctx.has_b_frames or 0) + threads + 2)
        out = np.empty((len(window.times), height, width, 3), dtype=np.uint8)
        _held(len(data) + pool + out.nbytes)
        filled = _decode_window(container, stream, window, out)
    except VideoProblem:
        raise
    except Exception as exc:  # FFmpeg errors mid-stream: corrupt packets, a truncated file
        raise VideoProblem(f"cannot decode the clip ({type(exc).__name__}: {exc})",
                           "the clip is truncated or corrupt; re-encode or drop it") from None
    finally:
        container.close()
        _opened(-1)
    if filled == 0:
        raise VideoProblem("the clip decoded to no frames", "the clip is truncated or corrupt; re-encode or drop it")
    return out.reshape(len(window.times) * height, width, 3), window


def _decode_window(container: Any, stream: Any, window: ClipWindow, out: np.ndarray) -> int:
    """Seek before the window, decode until every sampled time has its frame; returns frames filled.

    A time gets the last frame that starts at or before it (the frame on screen then), or the
    first frame when none does. A stream that ends more than two frame periods before a sampled
    time, inside the duration its header declares, was cut short (a truncated WebM still opens
    and decodes its first part): that is a :class:`VideoProblem`, not a clip of repeated frames. Frames are converted to RGB only when sampled: decoding from the
    keyframe to the window is the codec's cost, converting every one of them would double it."""
    origin = float(stream.start_time * stream.time_base) if stream.start_time is not None else 0.0
    if window.start > 0:
        container.seek(int((origin + window.start) / stream.time_base), stream=stream, backward=True)
    height, width = out.shape[1:3]
    times, k, previous, last = window.times, 0, None, 0.0
    converted: tuple[Any, np.ndarray] | None = None

    def rgb(frame: Any) -> np.ndarray:
        nonlocal converted
        if converted is None or converted[0] is not frame:
            converted = (frame, frame.to_ndarray(format="rgb24", width=width, height=height,
                                                 interpolation="BILINEAR"))
        return converted[1]

    for frame in container.decode(stream):
        t = (frame.time - origin) if frame.time is not None else 0.0
        while k < len(times) and t > times[k] + 1e-6:
            out[k] = rgb(previous if previous is not None else frame)
            k += 1
        if k >= len(times):
            break
        previous, last = frame, t
    rate = stream.average_rate or stream.guessed_rate
    period = float(1 / rate) if rate else 0.5
    if previous is not None and k < len(times) and times[k] - last > 2 * period:
        raise VideoProblem(
            f"the clip's frames stop at {last:.2f} s, short of the frame sampled at {times[k]:.2f} s "
            "(its header declares a longer clip)",
            "the clip is truncated; re-encode or drop it")
    while previous is not None and k < len(times):  # the stream ended: later times show its last frame
        out[k] = rgb(previous)
        k += 1
    return k
