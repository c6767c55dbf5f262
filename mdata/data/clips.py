"""Make short real video clips out of the corpus's photographs: pans and zooms, H.264 and VP9.

A video source needs clips whose decode cost is real: every frame different (a still image
encodes to almost nothing and decodes in no time), keyframes a second apart so a clip window
really seeks, and several codecs and resolutions. The material holds no video, so each clip is
a camera move over a real photograph (a pan across it, a zoom into it), rendered frame by frame
from the photograph's pixels and encoded with libx264 (MP4) or libvpx-vp9 (WebM) by the FFmpeg
that PyAV's wheel ships. Nothing is downloaded; the caption says which photograph, which move,
and the codec, size and length ("Chelsea the cat, pan left to right, h264 256x192, 1.5 s").

Encoding is single-threaded with fixed settings, so the same photograph gives the same bytes on
every build (the corpus's shards are byte-for-byte repeatable).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mdata.sources.images import pillow
from mdata.sources.video import pyav

if TYPE_CHECKING:
    import pyarrow as pa
    from PIL import Image

__all__ = ["CODECS", "ClipSpec", "RenderedClip", "clip_table", "plan_clips", "render_clip"]

#: codec -> (PyAV encoder, container format, file suffix, encoder options). Options pin every
#: choice that could depend on the machine (threads) so that builds repeat byte for byte.
CODECS = {
    "h264": ("libx264", "mp4", ".mp4", {"preset": "veryfast", "crf": "30", "threads": "1",
                                         "x264-params": "keyint=12:min-keyint=12:scenecut=0"}),
    "vp9": ("libvpx-vp9", "webm", ".webm", {"deadline": "realtime", "cpu-used": "8", "crf": "40",
                                            "b": "0", "threads": "1", "g": "12", "row-mt": "0"}),
}
#: Camera moves: name -> (start box, end box) as fractions (left, top, right, bottom) of the photo.
_MOVES = (
    ("pan left to right", (0.0, 0.15, 0.6, 0.85), (0.4, 0.15, 1.0, 0.85)),
    ("zoom into the centre", (0.0, 0.0, 1.0, 1.0), (0.3, 0.3, 0.7, 0.7)),
    ("pan top to bottom", (0.2, 0.0, 0.8, 0.6), (0.2, 0.4, 0.8, 1.0)),
    ("zoom out from the upper left", (0.05, 0.05, 0.45, 0.45), (0.0, 0.0, 1.0, 1.0)),
)
#: Output sizes (width, height), even and small: the demo decodes hundreds of them in seconds.
_SIZES = ((160, 120), (256, 192), (320, 240), (224, 224))


@dataclass(frozen=True)
class ClipSpec:
    """One clip to render: the camera move, codec, output size, length and frame rate."""

    move: str
    start: tuple[float, float, float, float]
    end: tuple[float, float, float, float]
    codec: str
    size: tuple[int, int]  # width, height
    seconds: float
    fps: int


@dataclass(frozen=True)
class RenderedClip:
    """One encoded clip with its caption and what it is (for the manifest and the tests)."""

    data: bytes
    caption: str
    codec: str
    suffix: str
    width: int
    height: int
    seconds: float
    fps: int
    frames: int


def plan_clips(index: int, count: int, *, seconds: float = 1.5, fps: int = 12) -> list[ClipSpec]:
    """``count`` clips of the ``index``-th photograph, cycling moves, codecs and sizes so that a
    few photographs already give every combination."""
    specs = []
    codecs = sorted(CODECS)
    for i in range(count):
        k = index * count + i
        move, start, end = _MOVES[k % len(_MOVES)]
        specs.append(ClipSpec(move, start, end, codecs[(index + i) % len(codecs)],
                              _SIZES[k % len(_SIZES)], seconds, fps))
    return specs


def _box(photo_size: tuple[int, int], spec: ClipSpec, u: float) -> tuple[float, float, float, float]:
    width, height = photo_size
    f = [a + (b - a) * u for a, b in zip(spec.start, spec.end)]
    return (f[0] * width, f[1] * height, f[2] * width, f[3] * height)


def _yuv420(rgb: np.ndarray) -> np.ndarray:
    """BT.601 limited-range YUV 4:2:0 planes of an RGB frame, stacked as FFmpeg's ``yuv420p``.

    Converted here rather than by the encoder's scaler, whose state made a clip's bytes depend on
    what the process had encoded before."""
    x = rgb.astype(np.float32)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    y = 16 + 0.257 * r + 0.504 * g + 0.098 * b
    u = 128 - 0.148 * r - 0.291 * g + 0.439 * b
    v = 128 + 0.439 * r - 0.368 * g - 0.071 * b
    h, w = y.shape

    def half(c: np.ndarray) -> np.ndarray:
        return c.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3)).reshape(h // 4, w)

    planes = np.concatenate([y, half(u), half(v)])
    return np.clip(np.rint(planes), 0, 255).astype(np.uint8)


def render_clip(photo: Image.Image, spec: ClipSpec, subject: str) -> RenderedClip:
    """Render and encode one clip of a decoded RGB photograph."""
    av, Image = pyav(), pillow()
    encoder, container_format, suffix, options = CODECS[spec.codec]
    frames = max(1, round(spec.seconds * spec.fps))
    width, height = spec.size
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format,
                 options={"fflags": "+bitexact"}) as container:
        stream = container.add_stream(encoder, rate=spec.fps, options=dict(options))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.flags |= int(av.codec.context.Flags.bitexact)
        for i in range(frames):
            box = _box(photo.size, spec, i / max(1, frames - 1))
            view = photo.resize((width, height), Image.Resampling.BILINEAR, box=box)
            frame = av.VideoFrame.from_ndarray(_yuv420(np.asarray(view, dtype=np.uint8)), format="yuv420p")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    caption = f"{subject}, {spec.move}, {spec.codec} {width}x{height}, {frames / spec.fps:g} s"
    return RenderedClip(buffer.getvalue(), caption, spec.codec, suffix, width, height,
                        frames / spec.fps, spec.fps, frames)


def clip_table(photos: Sequence[Any], *, clips_per_photo: int, photos_cap: int | None,
               seconds: float, fps: int) -> "pa.Table":
    """The rows of the example corpus's video source: ``clips_per_photo`` clips of each of
    ``photos_cap`` photographs spread over ``photos`` (the material's, sorted by origin)."""
    import pyarrow as pa

    from mdata.data.crops import decode_rgb

    n = len(photos)
    chosen = photos if photos_cap is None or photos_cap >= n else [photos[i * n // photos_cap]
                                                                    for i in range(photos_cap)]
    names = ("video", "caption", "codec", "width", "height", "seconds", "frames", "origin", "license")
    columns: dict[str, list[Any]] = {k: [] for k in names}
    for index, photo in enumerate(chosen):
        rgb = decode_rgb(photo.data)
        for spec in plan_clips(index, clips_per_photo, seconds=seconds, fps=fps):
            clip = render_clip(rgb, spec, photo.subject)
            for key, value in (("video", clip.data), ("caption", clip.caption), ("codec", clip.codec),
                               ("width", clip.width), ("height", clip.height),
                               ("seconds", clip.seconds), ("frames", clip.frames),
                               ("origin", photo.origin), ("license", photo.license)):
                columns[key].append(value)
    types = {"video": pa.binary(), "width": pa.int32(), "height": pa.int32(),
             "seconds": pa.float64(), "frames": pa.int32()}
    schema = pa.schema([pa.field(k, types.get(k, pa.string()), nullable=False) for k in names])
    return pa.table(columns, schema=schema)
