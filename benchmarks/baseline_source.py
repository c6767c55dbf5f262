"""What one worker of the baseline reads: a seeded stream of each source's samples, and the
weighted choice of the next sample's source.

:class:`SourceStream` reads chunks through :func:`mdata.sources.load_chunk` (the same code and
transform as mdata's loader tasks); ``benchmarks/baseline_stream.py`` streams row groups instead,
as a subclass. Both :mod:`benchmarks.baseline` (the per-rank DataLoader) and
:mod:`benchmarks.mixture` (the mixture figure, without torch) build on these pure parts, so they
live apart from the DataLoader that imports both streams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from mdata.sources import ReaderCache, SampleChunk, Source, load_chunk

__all__ = ["Sample", "SourceStream", "WeightedChooser"]


@dataclass(frozen=True, eq=False)
class Sample:
    """One transformed sample and its lineage id ``(source_index, shard, row)``."""

    source_index: int
    shard: int
    row: int
    tokens: np.ndarray  # int32 text tokens
    num_tokens: int  # text + image tokens (the cost feature, as in SampleChunk)
    num_patches: int
    image: np.ndarray | None


class WeightedChooser:
    """Seeded random choice of a source per sample, by weight: right only in expectation."""

    def __init__(self, weights: Sequence[float], seed: int | Sequence[int]) -> None:
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or w.size == 0 or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"weights must be non-negative with a positive sum, got {weights!r}")
        self.p = w / w.sum()
        self.rng = np.random.default_rng(seed)

    def choose(self, n: int) -> np.ndarray:
        """The sources of the next ``n`` samples (int64 indices)."""
        return self.rng.choice(self.p.size, size=n, p=self.p)


class SourceStream:
    """An endless, seeded stream of one source's samples for one of ``num_streams`` readers.

    The chunks of every epoch are permuted with a seed derived from ``(seed, source_index,
    epoch)``; stream ``index`` takes chunks ``index, index + num_streams, ...`` of the endless
    sequence (wrapping into later epochs, so a small source still feeds every worker).
    ``load`` is :func:`~mdata.sources.load_chunk` unless a study replays cached cost features.
    """

    def __init__(self, source: Source, source_index: int, *, index: int, num_streams: int,
                 seed: int, cache: ReaderCache,
                 load: Callable[..., SampleChunk] = load_chunk) -> None:
        self.source = source
        self.source_index = source_index
        self.index = index
        self.num_streams = num_streams
        self.seed = seed
        self.cache = cache
        self.load = load
        self._chunks: list[tuple[int, int, int]] | None = None
        self._position = index
        self._rng = np.random.default_rng((seed, source_index, index, 1))
        self._buffer: list[Sample] = []

    def open(self) -> None:
        """List the source and open its first shard's reader (what a worker does at start)."""
        listing = self.cache.listing(self.source)
        self._chunks = [
            (shard.index, start, min(shard.num_rows, start + self.source.chunk_rows))
            for shard in listing.shards
            for start in range(0, shard.num_rows, self.source.chunk_rows)
        ]
        if not self._chunks:
            raise ValueError(f"source {self.source.name!r} has no rows to stream")
        self.cache.reader(self.source, listing.shards[0].index)

    def _chunk_at(self, position: int) -> tuple[int, int, int]:
        if self._chunks is None:
            self.open()
        epoch, k = divmod(position, len(self._chunks))
        order = np.random.default_rng((self.seed, self.source_index, epoch)).permutation(len(self._chunks))
        return self._chunks[int(order[k])]

    def _refill(self) -> None:
        shard, start, stop = self._chunk_at(self._position)
        self._position += self.num_streams
        self._fill(self.load(self.source, shard, start, stop, cache=self.cache))

    def _fill(self, chunk: SampleChunk) -> None:
        """Buffer a chunk's samples in a seeded random order."""
        order = self._rng.permutation(len(chunk))
        self._buffer = [
            Sample(self.source_index, chunk.shard, int(chunk.rows[i]), chunk.tokens(int(i)),
                   int(chunk.num_tokens[i]), int(chunk.num_patches[i]), chunk.image(int(i)))
            for i in order[::-1]  # popped from the end: the permutation's order
        ]

    def next(self) -> Sample:
        while not self._buffer:
            self._refill()
        return self._buffer.pop()

    def __iter__(self) -> Iterator[Sample]:
        while True:
            yield self.next()
