"""A packed chunk's images kept as their stored bytes, decoded again when a constructor takes them.

A decoded photo is ~10x its JPEG: at 306 production-shaped sources the caption sources' decoded
windows were 16 MB each, 7.4 MB packed (:mod:`mdata.sources.packed`), ~1.6 MB as stored bytes. So
for a transform whose image is a pure function of one stored cell (:func:`image_decoder`: mdata's
:class:`~mdata.sources.DecodeImageCaption`, ``decode_image(cell, patch_size, max_patches,
max_pixels)``), a loader keeps the cell and decodes it again when the sample is taken. Which rows
are kept and their cost features still come from the load's own decode; every take checks the
image against the digest of the one the load produced, so a decoder that gave other pixels fails
loudly (:class:`~mdata.errors.SourceError`) instead of delivering other bytes. Each sample is
taken once, so the decode is paid twice per delivered image (1-2 ms each here).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from mdata.errors import SourceError

__all__ = ["EncodedImages", "image_decoder"]

_DIGEST = 16  # bytes of blake2b per image


def image_decoder(transform: Any) -> tuple[str, Callable[[bytes], np.ndarray]] | None:
    """``(image field, decode)`` when ``transform``'s image is ``decode(cell of that field)``,
    else None. Only mdata's own :class:`DecodeImageCaption` (exactly that class: a subclass may
    change how it decodes) qualifies."""
    from mdata.sources.transforms import DecodeImageCaption

    if type(transform) is not DecodeImageCaption:
        return None
    from mdata.sources.images import decode_image

    return transform.image_field, partial(decode_image, patch_size=transform.patch_size,
                                          max_patches=transform.max_patches,
                                          max_pixels=transform.max_pixels)


def _digest(pixels: np.ndarray | memoryview) -> bytes:
    return hashlib.blake2b(pixels, digest_size=_DIGEST).digest()


@dataclass(eq=False)
class EncodedImages:
    """Each sample's image as its stored cell (``cells[starts[i]:starts[i + 1]]``), the decoder
    that made it, and the digest of the pixels the load decoded (``digests[i]``)."""

    decode: Callable[[bytes], np.ndarray]
    cells: np.ndarray  # uint8, every sample's stored bytes
    starts: np.ndarray  # int64[n + 1]
    digests: np.ndarray  # uint8[n, 16]
    source: str = ""

    @classmethod
    def of(cls, decode: Callable[[bytes], np.ndarray], cells: Sequence[bytes], pixels: np.ndarray,
           pixel_offsets: np.ndarray, source: str = "") -> "EncodedImages":
        """The stored ``cells`` of a chunk's samples, with the digests of their decoded ``pixels``."""
        sizes = np.fromiter((len(c) for c in cells), dtype=np.int64, count=len(cells))
        starts = np.zeros(len(cells) + 1, dtype=np.int64)
        np.cumsum(sizes, out=starts[1:])
        flat = np.frombuffer(b"".join(bytes(c) for c in cells), dtype=np.uint8) if len(cells) \
            else np.zeros(0, np.uint8)
        raw = memoryview(np.ascontiguousarray(pixels)).cast("B")
        digests = np.array([np.frombuffer(_digest(raw[a:b]), np.uint8) for a, b in
                            zip(pixel_offsets[:-1].tolist(), pixel_offsets[1:].tolist())],
                           dtype=np.uint8).reshape(-1, _DIGEST)
        return cls(decode, flat, starts, digests, source)

    def gather(self, idx: np.ndarray, shapes: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The images of samples ``idx`` decoded again, concatenated (``shapes``: each one's
        ``(h, w, 3)``; ``rows``: their shard rows, for errors)."""
        sizes = shapes.prod(axis=1, dtype=np.int64)
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        pos = 0
        for k, i in enumerate(idx.tolist()):
            image = self.decode(self.cells[self.starts[i]: self.starts[i + 1]].tobytes())
            size = int(sizes[k])
            if image.shape != tuple(int(v) for v in shapes[k]) or image.dtype != np.uint8 \
                    or _digest(np.ascontiguousarray(image)) != self.digests[i].tobytes():
                raise SourceError(
                    "decoding the image again gave other pixels than its load did",
                    source=self.source, row=int(rows[k]),
                    hint="the image decoder is not deterministic here; set "
                         "mdata.sources.pack-held to false on the loaders")
            out[pos: pos + size] = image.reshape(-1)
            pos += size
        return out

    @property
    def nbytes(self) -> int:
        return self.cells.nbytes + self.starts.nbytes + self.digests.nbytes
