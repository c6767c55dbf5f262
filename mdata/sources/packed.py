"""PackedChunk: a loaded chunk as a loader holds it, each sample's payload compressed on its own.

A loader keeps every chunk of a source's current shuffle window in memory until the window's
samples are drawn (:mod:`mdata.order`): at many sources that is most of a loader's memory (at 306
sources of the production-shaped corpus, 4 chunks x ~5.6 MB decoded per source: ~1.7 GB for the
job), and each sample is read once, when a constructor takes it. So the loader keeps each
sample's token ids and pixels compressed (zstd, level 1, one frame per sample; images
up-filtered first), or a photo as its stored bytes (:mod:`mdata.sources.encoded_images`), and
decompresses only the samples a constructor takes. Packing is lossless and per sample, so
:meth:`PackedChunk.take` returns exactly what :meth:`SampleChunk.take` of the unpacked chunk
returns, byte for byte: which samples are delivered, in which order, is untouched, and a take
costs a few decompressions, never the whole chunk. Measured: docs/benchmarks-memory.md.

The summary the Planner reads (``rows``, ``num_tokens``, ``num_patches``, ``skipped``,
``load_seconds``, ``nbytes``) and every other per-sample field stay as they are, in a shell chunk
with empty payloads. pyarrow (the codec) is imported on first use, so processes that only import
this module for its type (constructors) never load it.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from mdata.sources.chunk import SampleChunk
from mdata.sources.encoded_images import EncodedImages

__all__ = ["PackedChunk", "PackedRows", "pack_chunk"]

#: Segments shorter than this (bytes) are kept as they are: a zstd frame costs ~10 bytes of
#: header and a short run of token ids barely compresses (a chat turn: x1.2 at best).
MIN_PACK_BYTES = 128
#: zstd's fastest level: loads decode MBs per chunk, and level 3 gained only 5-15% more here.
LEVEL = 1

_local = threading.local()


def _codec() -> Any:
    """This thread's zstd codec (pyarrow's; one per thread, as loaders run tasks in threads)."""
    codec = getattr(_local, "codec", None)
    if codec is None:
        import pyarrow as pa

        codec = _local.codec = pa.Codec("zstd", compression_level=LEVEL)
    return codec


def _segment_offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


@dataclass(eq=False)
class PackedRows:
    """The CSR segments of one flat array (token ids or pixels), each compressed on its own.

    Segment ``i`` had ``lengths[i]`` elements of ``dtype``; its stored bytes are
    ``data[starts[i]:starts[i + 1]]``, zstd-compressed where ``packed[i]``, else raw (short
    segments, and those that compression would not shrink). With ``row_bytes`` (images), segment
    ``i`` is an image of rows ``row_bytes[i]`` bytes long, stored as each row's difference from
    the row above (modulo 256, PNG's "up" filter): photos then compress 2.1x instead of 1.4x,
    video frames 2.5x instead of 2.1x, and a running sum gives the pixels back exactly.
    """

    dtype: str
    lengths: np.ndarray  # int64[n], elements per segment
    starts: np.ndarray  # int64[n + 1], into data
    packed: np.ndarray  # bool[n]
    data: np.ndarray  # uint8
    row_bytes: np.ndarray | None = None  # int64[n]: uint8 images, stored up-filtered

    @classmethod
    def pack(cls, flat: np.ndarray, offsets: np.ndarray,
             row_bytes: np.ndarray | None = None) -> "PackedRows":
        """Compress each segment ``flat[offsets[i]:offsets[i + 1]]`` on its own (``row_bytes``:
        each segment is a uint8 image with rows that long, up-filtered first)."""
        codec, item = _codec(), flat.dtype.itemsize
        if row_bytes is not None and flat.dtype != np.uint8:
            raise ValueError(f"row_bytes needs uint8 segments, got {flat.dtype}")
        raw = memoryview(np.ascontiguousarray(flat)).cast("B")
        blobs: list[bytes | memoryview] = []
        n = len(offsets) - 1
        packed = np.zeros(n, dtype=bool)
        for i, (a, b) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
            segment = raw[a * item: b * item]
            if row_bytes is not None and b > a:
                segment = memoryview(_up_filter(flat[a:b], int(row_bytes[i]))).cast("B")
            if len(segment) >= MIN_PACK_BYTES:
                small = codec.compress(segment, asbytes=True)
                if len(small) < len(segment):
                    blobs.append(small)
                    packed[i] = True
                    continue
            blobs.append(segment)
        sizes = np.fromiter((len(x) for x in blobs), dtype=np.int64, count=n)
        data = np.frombuffer(b"".join(blobs), dtype=np.uint8) if n else np.zeros(0, np.uint8)
        return cls(flat.dtype.str, np.diff(offsets).astype(np.int64), _segment_offsets(sizes),
                   packed, data, None if row_bytes is None else np.asarray(row_bytes, np.int64))

    def gather(self, idx: np.ndarray) -> np.ndarray:
        """Segments ``idx`` (in that order), decompressed and concatenated into one flat array."""
        dtype = np.dtype(self.dtype)
        lengths = self.lengths[idx]
        out = np.empty(int(lengths.sum()), dtype=dtype)
        if not out.size:
            return out
        codec, item = _codec(), dtype.itemsize
        view = memoryview(out).cast("B")
        pos = 0
        for i, length in zip(idx.tolist(), lengths.tolist()):
            nbytes = length * item
            stored = self.data[self.starts[i]: self.starts[i + 1]]
            if self.packed[i]:
                buf = codec.decompress(stored, decompressed_size=nbytes, asbytes=False)
                view[pos: pos + nbytes] = memoryview(buf).cast("B")
            else:
                view[pos: pos + nbytes] = memoryview(stored).cast("B")
            if self.row_bytes is not None and nbytes:
                _up_unfilter(out[pos: pos + nbytes], int(self.row_bytes[i]))
            pos += nbytes
        return out

    @property
    def nbytes(self) -> int:
        arrays = (self.lengths, self.starts, self.packed, self.data, self.row_bytes)
        return sum(a.nbytes for a in arrays if a is not None)


def _up_filter(image: np.ndarray, row: int) -> np.ndarray:
    """Each row of a flat uint8 image minus the row above it (modulo 256); the first row kept."""
    if row <= 0 or image.size % row:
        raise ValueError(f"an image of {image.size} bytes has no rows of {row} bytes")
    rows = image.reshape(-1, row)
    out = np.empty_like(rows)
    out[:1] = rows[:1]
    np.subtract(rows[1:], rows[:-1], out=out[1:])  # uint8 arithmetic wraps: exact
    return out.reshape(-1)


def _up_unfilter(flat: np.ndarray, row: int) -> None:
    """Undo :func:`_up_filter` in place: a running sum down each column, modulo 256, added a
    row at a time (contiguous adds: 2.6x faster than ``np.cumsum(axis=0)``, which strides)."""
    rows = flat.reshape(-1, row)
    for r in range(1, rows.shape[0]):
        np.add(rows[r], rows[r - 1], out=rows[r])


@dataclass(eq=False)
class PackedChunk:
    """A :class:`SampleChunk` whose token ids and pixels are compressed sample by sample.

    Everything else stays in ``shell``: the chunk itself with empty payloads (no token, no pixel,
    zero image shapes), so its ``rows``, ``num_tokens``, ``num_patches``, ``skipped`` and any
    other per-sample field are sliced by :meth:`SampleChunk.take` itself; :meth:`take` then puts
    the decompressed payloads of the taken samples back in. The result equals the original's
    ``take`` (see the module docstring).
    """

    shell: SampleChunk
    tokens: PackedRows
    pixels: "PackedRows | EncodedImages | None" = None
    image_shapes: np.ndarray | None = None

    @classmethod
    def pack(cls, chunk: SampleChunk, *, decode: Callable[[bytes], np.ndarray] | None = None,
             cells: Sequence[bytes] | None = None) -> "PackedChunk":
        """``chunk`` with each sample's token ids and pixels compressed (lossless); with
        ``decode`` and each kept sample's stored image ``cells``, its images kept as those
        cells instead (:mod:`mdata.sources.encoded_images`)."""
        n = len(chunk)
        pixels: PackedRows | EncodedImages | None = None
        shell_pixels = None
        if chunk.pixels is not None:
            if decode is not None and cells is not None:
                pixels = EncodedImages.of(decode, cells, chunk.pixels, chunk.pixel_offsets, chunk.source)
            else:
                row_bytes = chunk.image_shapes[:, 1].astype(np.int64) * chunk.image_shapes[:, 2]
                pixels = PackedRows.pack(chunk.pixels, chunk.pixel_offsets, row_bytes)
            shell_pixels = dict(pixels=np.empty(0, chunk.pixels.dtype), pixel_offsets=np.zeros(n + 1, np.int64),
                                image_shapes=np.zeros_like(chunk.image_shapes))
        # new empty arrays, not ``[:0]`` views: a view would keep the decoded payload alive
        shell = replace(chunk, token_ids=np.empty(0, chunk.token_ids.dtype),
                        token_offsets=np.zeros(n + 1, np.int64), **(shell_pixels or {}))
        shell.load_seconds = chunk.load_seconds
        return cls(shell, PackedRows.pack(chunk.token_ids, chunk.token_offsets), pixels,
                   chunk.image_shapes)

    # the summary the Planner reads (workers.loader.chunk_summary_task), as a SampleChunk has it
    source = property(lambda self: self.shell.source)
    shard = property(lambda self: self.shell.shard)
    rows = property(lambda self: self.shell.rows)
    num_tokens = property(lambda self: self.shell.num_tokens)
    num_patches = property(lambda self: self.shell.num_patches)
    skipped = property(lambda self: self.shell.skipped)

    @property
    def load_seconds(self) -> float:
        return self.shell.load_seconds

    @load_seconds.setter
    def load_seconds(self, value: float) -> None:
        self.shell.load_seconds = value

    def __len__(self) -> int:
        return len(self.shell)

    def take(self, indices: Sequence[int] | np.ndarray) -> SampleChunk:
        """A :class:`SampleChunk` with the samples at positions ``indices`` (in that order),
        decompressed: equal to ``SampleChunk.take`` of the chunk this was packed from."""
        part = self.shell.take(indices)  # checks the indices; slices every field but payloads
        n = len(self)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        idx = idx % n if n else idx
        payload: dict[str, np.ndarray] = dict(
            token_ids=self.tokens.gather(idx), token_offsets=_segment_offsets(self.tokens.lengths[idx]))
        if self.pixels is not None:
            shapes = self.image_shapes[idx]
            pixels = (self.pixels.gather(idx, shapes, part.rows) if isinstance(self.pixels, EncodedImages)
                      else self.pixels.gather(idx))
            payload.update(pixels=pixels, image_shapes=shapes,
                           pixel_offsets=_segment_offsets(shapes.prod(axis=1, dtype=np.int64)))
        return replace(part, **payload)

    def unpack(self) -> SampleChunk:
        """The whole chunk, decompressed (its ``skipped`` and ``load_seconds`` kept)."""
        whole = self.take(np.arange(len(self), dtype=np.int64))
        whole.skipped, whole.load_seconds = self.skipped, self.load_seconds
        return whole

    @property
    def nbytes(self) -> int:
        """Bytes held (compressed payloads, and the shell's arrays)."""
        held = self.shell.nbytes + self.tokens.nbytes
        if self.pixels is not None:
            held += self.pixels.nbytes + self.image_shapes.nbytes
        return held

    def __sizeof__(self) -> int:
        # dask.sizeof falls back to sys.getsizeof: report the buffers (as SampleChunk does)
        return object.__sizeof__(self) + self.nbytes + sum(sys.getsizeof(s.reason) for s in self.skipped)


def pack_chunk(chunk: SampleChunk) -> PackedChunk:
    """:meth:`PackedChunk.pack`, as a function."""
    return PackedChunk.pack(chunk)
