"""SampleChunk: the columnar result of one load task.

A load task turns a contiguous row range of one shard into samples. Keeping the result as a few flat
numpy arrays (not a list of per-sample objects) is what makes it cheap to hold in Dask worker memory,
to pickle between workers (a handful of buffers, no per-object overhead) and to slice when a
constructor pulls exactly the rows one DP group needs (:meth:`SampleChunk.take`).

Variable-length data (token ids, pixels) is stored CSR-style: one flat buffer plus ``offsets`` of
length ``n + 1``, so sample ``i`` is ``buffer[offsets[i]:offsets[i + 1]]``.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

__all__ = ["SampleChunk", "SkippedSample"]


@dataclass(frozen=True)
class SkippedSample:
    """A row that failed its transform and was dropped under the source's skip tolerance.

    ``reason`` is the failure's message (error class and text) so skips are visible and countable
    on the Planner and the dashboard without shipping the exception objects around.
    """

    row: int
    reason: str


#: Mean segment length (elements) from which :func:`_gather` copies slice by slice.
_SLICE_COPY_MIN = 256


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


@dataclass(eq=False)
class SampleChunk:
    """Samples of rows ``rows`` of shard ``shard`` of source ``source``, columnar, numpy only.

    Attributes:
        source: the source's name.
        shard: the shard's index in the source's sorted listing.
        rows: int64[n], the rows kept (ascending); skipped rows are absent.
        token_ids: int32[sum of lengths], the text tokens of every sample, concatenated.
        token_offsets: int64[n + 1], sample ``i``'s tokens are ``token_ids[offsets[i]:offsets[i+1]]``.
        num_tokens: int32[n], text tokens + image tokens: the cost feature the Planner balances on.
        num_patches: int32[n], image tokens (patches) per sample; zeros for text-only sources.
        pixels: uint8[sum of h*w*3] or None, every sample's RGB image, flattened and concatenated.
        pixel_offsets: int64[n + 1] or None, like ``token_offsets`` for ``pixels``.
        image_shapes: int32[n, 3] or None, ``(height, width, 3)`` of each image.
        span_offsets: int64[n + 1] or None: sample ``i``'s media spans are
            ``spans[span_offsets[i]:span_offsets[i + 1]]``; set for interleaved documents only.
        spans: int32[m, 3] or None, ``(at, patches, rows)`` of each medium of each sample, in order
            (:mod:`mdata.sources.spans`): where its placeholders go, and its rows of the image.
        skipped: the rows dropped under the skip tolerance, with their reasons.
        load_seconds: wall time the load task took (set by :func:`load_chunk`); feeds pool sizing.
    """

    source: str
    shard: int
    rows: np.ndarray
    token_ids: np.ndarray
    token_offsets: np.ndarray
    num_tokens: np.ndarray
    num_patches: np.ndarray
    pixels: np.ndarray | None = None
    pixel_offsets: np.ndarray | None = None
    image_shapes: np.ndarray | None = None
    skipped: tuple[SkippedSample, ...] = ()
    span_offsets: np.ndarray | None = None
    spans: np.ndarray | None = None
    load_seconds: float = field(default=0.0)

    def __post_init__(self) -> None:
        # Internal consistency, not user input: a chunk built wrongly would silently misalign
        # samples and their lineage, so it fails here, loudly, with the shapes involved.
        n = len(self.rows)
        problems = []
        if self.token_offsets.shape != (n + 1,):
            problems.append(f"token_offsets has shape {self.token_offsets.shape}, want ({n + 1},)")
        elif self.token_offsets[-1] != len(self.token_ids):
            problems.append(
                f"token_offsets ends at {self.token_offsets[-1]}, token_ids has {len(self.token_ids)}"
            )
        for name in ("num_tokens", "num_patches"):
            if getattr(self, name).shape != (n,):
                problems.append(f"{name} has shape {getattr(self, name).shape}, want ({n},)")
        has_images = [x is not None for x in (self.pixels, self.pixel_offsets, self.image_shapes)]
        if any(has_images) and not all(has_images):
            problems.append("pixels, pixel_offsets and image_shapes must be all set or all None")
        elif all(has_images):
            if self.pixel_offsets.shape != (n + 1,) or self.image_shapes.shape != (n, 3):
                problems.append(
                    f"pixel_offsets {self.pixel_offsets.shape} / image_shapes "
                    f"{self.image_shapes.shape} do not match {n} rows"
                )
            elif self.pixel_offsets[-1] != len(self.pixels):
                problems.append("pixel_offsets does not end at len(pixels)")
        problems += self._span_problems(n)
        if problems:
            raise ValueError(f"inconsistent SampleChunk for {self.source}/{self.shard}: " + "; ".join(problems))

    def _span_problems(self, n: int) -> list[str]:
        if self.spans is None and self.span_offsets is None:
            return []
        if self.spans is None or self.span_offsets is None or self.pixels is None:
            return ["spans and span_offsets must be both set (with pixels) or both None"]
        if self.span_offsets.shape != (n + 1,) or self.spans.ndim != 2 or self.spans.shape[1:] != (3,) \
                or self.span_offsets[-1] != len(self.spans):
            return [f"span_offsets {self.span_offsets.shape} / spans {self.spans.shape} do not match {n} rows"]
        summed = np.zeros(len(self.spans) + 1, dtype=np.int64)
        np.cumsum(self.spans[:, 1], out=summed[1:])
        per_sample = summed[self.span_offsets[1:]] - summed[self.span_offsets[:-1]]
        if not np.array_equal(per_sample, self.num_patches):
            return ["the spans' patches do not add up to num_patches"]
        return []

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_samples(
        cls,
        source: str,
        shard: int,
        rows: Sequence[int] | np.ndarray,
        tokens: Sequence[Sequence[int] | np.ndarray],
        *,
        num_patches: Sequence[int] | np.ndarray | None = None,
        images: Sequence[np.ndarray] | None = None,
        skipped: Sequence[SkippedSample] = (),
        spans: Sequence[np.ndarray | None] | None = None,
    ) -> "SampleChunk":
        """Build a chunk from per-sample token lists (and optionally ``(h, w, 3)`` uint8 images).

        ``num_tokens`` is derived as ``len(tokens[i]) + num_patches[i]``, so the cost feature can
        never disagree with the data. ``spans`` (with ``images``) gives each sample's media spans;
        a None entry is one medium before the text (or none, for a sample without patches).
        """
        n = len(rows)
        lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=n)
        total = int(lengths.sum())
        if all(isinstance(t, list) for t in tokens):  # tokenizer output: one pass, no temporaries
            token_ids = np.fromiter(itertools.chain.from_iterable(tokens), dtype=np.int32, count=total)
        else:
            token_ids = np.empty(total, dtype=np.int32)
            pos = 0
            for t, length in zip(tokens, lengths):
                token_ids[pos : pos + length] = t
                pos += length
        patches = (
            np.zeros(n, dtype=np.int32)
            if num_patches is None
            else np.asarray(num_patches, dtype=np.int32).reshape(n)
        )
        pixels = pixel_offsets = shapes = None
        if images is not None:
            shapes = np.zeros((n, 3), dtype=np.int32)
            for i, im in enumerate(images):
                shapes[i] = im.shape
            pixel_offsets = _offsets(shapes.prod(axis=1, dtype=np.int64))
            pixels = np.empty(int(pixel_offsets[-1]), dtype=np.uint8)
            for i, im in enumerate(images):
                pixels[pixel_offsets[i] : pixel_offsets[i + 1]] = im.reshape(-1)
        span_offsets = span_rows = None
        if spans is not None:
            if images is None:
                raise ValueError(f"SampleChunk {source}/{shard}: spans need images")
            each = [np.asarray(sp, dtype=np.int32).reshape(-1, 3) if sp is not None
                    else np.array([[0, patches[i], shapes[i][0]]] if patches[i] else [], np.int32).reshape(-1, 3)
                    for i, sp in enumerate(spans)]
            span_offsets = _offsets(np.array([len(sp) for sp in each], dtype=np.int64))
            span_rows = np.concatenate(each) if each else np.zeros((0, 3), np.int32)
        return cls(
            source=source,
            shard=shard,
            rows=np.asarray(rows, dtype=np.int64).reshape(n),
            token_ids=token_ids,
            token_offsets=_offsets(lengths),
            num_tokens=(lengths + patches).astype(np.int32),
            num_patches=patches,
            pixels=pixels,
            pixel_offsets=pixel_offsets,
            image_shapes=shapes,
            skipped=tuple(skipped),
            span_offsets=span_offsets,
            spans=span_rows,
        )

    # -- access --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    def tokens(self, i: int) -> np.ndarray:
        """Token ids of the ``i``-th sample of this chunk (a view, int32)."""
        return self.token_ids[self.token_offsets[i] : self.token_offsets[i + 1]]

    def image(self, i: int) -> np.ndarray | None:
        """RGB pixels of the ``i``-th sample as an ``(h, w, 3)`` uint8 view, or None for text."""
        if self.pixels is None:
            return None
        shape = tuple(int(x) for x in self.image_shapes[i])
        return self.pixels[self.pixel_offsets[i] : self.pixel_offsets[i + 1]].reshape(shape)

    def take(self, indices: Sequence[int] | np.ndarray) -> "SampleChunk":
        """A new chunk with the samples at positions ``indices`` (in that order), data copied.

        Constructors use this to pull only the rows one DP group needs; ``skipped`` is not carried
        over because the skips were already reported with the whole chunk.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"take({idx.tolist()}) out of range for a chunk of {n} samples")
        idx = idx % n if n else idx
        token_ids = _gather(self.token_ids, self.token_offsets, idx)
        lengths = (self.token_offsets[idx + 1] - self.token_offsets[idx]) if n else idx
        pixels = pixel_offsets = shapes = None
        if self.pixels is not None:
            pixels = _gather(self.pixels, self.pixel_offsets, idx)
            shapes = self.image_shapes[idx]
            pixel_offsets = _offsets(shapes.prod(axis=1, dtype=np.int64))
        span_offsets = spans = None
        if self.spans is not None:
            spans = _gather(self.spans.reshape(-1), self.span_offsets * 3, idx).reshape(-1, 3)
            span_offsets = _offsets(np.diff(self.span_offsets)[idx] if n else idx)
        return SampleChunk(
            source=self.source,
            shard=self.shard,
            rows=self.rows[idx],
            token_ids=token_ids,
            token_offsets=_offsets(lengths),
            num_tokens=self.num_tokens[idx],
            num_patches=self.num_patches[idx],
            pixels=pixels,
            pixel_offsets=pixel_offsets,
            image_shapes=shapes,
            span_offsets=span_offsets,
            spans=spans,
        )

    def media_spans(self, i: int) -> np.ndarray | None:
        """The ``(at, patches, rows)`` spans of the ``i``-th sample, or None when the chunk has
        none (each image sample is then one medium before its text)."""
        if self.spans is None:
            return None
        return self.spans[self.span_offsets[i] : self.span_offsets[i + 1]]

    @property
    def nbytes(self) -> int:
        """Bytes held by the chunk's arrays (what Dask should count for memory management)."""
        arrays = (
            self.rows, self.token_ids, self.token_offsets, self.num_tokens, self.num_patches,
            self.pixels, self.pixel_offsets, self.image_shapes, self.span_offsets, self.spans,
        )
        return sum(a.nbytes for a in arrays if a is not None)

    def __sizeof__(self) -> int:
        # dask.sizeof falls back to sys.getsizeof, which calls this: report the buffers, not the
        # few hundred bytes of the Python object, so worker memory limits see the real size.
        return object.__sizeof__(self) + self.nbytes + sum(sys.getsizeof(s.reason) for s in self.skipped)


def _gather(flat: np.ndarray, offsets: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Concatenate the CSR segments ``idx`` of ``flat``.

    Long segments (images: ~100 KB each) are copied slice by slice, one ``memcpy`` per sample;
    building an index per element instead costs 8 bytes of int64 per byte copied and made this
    the loaders' largest CPU cost. Short segments (token ids: tens of elements) are gathered in
    one vectorised index, which beats a Python loop over many tiny slices."""
    if idx.size == 0:
        return flat[:0].copy()
    starts = offsets[idx]
    lengths = offsets[idx + 1] - starts
    total = int(lengths.sum())
    if total == 0:
        return flat[:0].copy()
    if total >= _SLICE_COPY_MIN * idx.size:
        out = np.empty(total, dtype=flat.dtype)
        pos = 0
        for start, length in zip(starts.tolist(), lengths.tolist()):
            out[pos : pos + length] = flat[start : start + length]
            pos += length
        return out
    # Position j of the output reads flat[starts[k] + (j - out_start[k])] for the segment k holding j.
    out_start = np.cumsum(lengths) - lengths
    positions = np.arange(total, dtype=np.int64) + np.repeat(starts - out_start, lengths)
    return flat[positions]
