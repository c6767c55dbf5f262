"""The baseline's streaming Parquet reader: what a competent per-rank loader does with big row groups.

:class:`~benchmarks.baseline_source.SourceStream` reads chunks through :func:`mdata.sources.load_chunk`,
which decodes every row group a chunk overlaps. With production row groups (32-128 MiB decoded)
that would hold a whole row group per source in every worker, which no careful loader does. This
stream reads the way pyarrow streams best:

* ``pq.ParquetFile(path, buffer_size=READ_BUFFER, pre_buffer=False)``: column chunks are read
  through a buffered stream of ``READ_BUFFER`` bytes, never a whole column chunk at once, and no
  coalesced pre-buffering of the row group;
* ``iter_batches(batch_size=chunk_rows, row_groups=[g], columns=fields, use_threads=False)``:
  only the declared columns, ``chunk_rows`` rows decoded at a time, one row group after the other;
* a source whose transform makes images keeps the batch's rows as stored (JPEG bytes) in a
  seeded random order and decodes a row only when it is drawn: a worker that mixes hundreds of
  sources keeps one stream per source, and a batch of 32 photos decoded to pixels at native
  resolution would hold tens of MB per source in every worker. Text is transformed a batch at a
  time (its tokens take about the room of its text, and tokenizing row by row costs up to 10x
  the CPU for short rows);
* Arrow's pool hands freed pages back after every batch (``release_unused``), as mdata's reader does;
* the stream's unit of work is one row group: ``(shard, row group)`` units are permuted per epoch
  (seeded) and dealt round-robin over the ``R x W`` streams of a DP group, as sharded streaming
  loaders deal shards; rows are shuffled within each batch.

Each batch goes through the source's own transform (the same code as mdata's loader tasks), so
both systems hold the same samples; what differs is only where and how often that state exists.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from benchmarks.baseline_source import SourceStream
from mdata.sources import ChunkContext, ReaderCache, SampleChunk, SampleOutput, Source
from mdata.sources.fields import bytes_child

__all__ = ["READ_BUFFER", "StreamingSourceStream", "transform_columns"]

#: Bytes of the buffered stream per column chunk (pyarrow's ``buffer_size``): 1 MiB.
READ_BUFFER = 1 << 20


def _local(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def transform_columns(source: Source, shard: int, path: str, rows: np.ndarray,
                      columns: dict[str, list]) -> SampleChunk:
    """Run ``source``'s transform on decoded ``columns`` as :func:`mdata.sources.load_chunk` does
    (failing samples are dropped here: the example corpus has none)."""
    transform = source.transform
    transform.setup()
    results = transform(columns, context=ChunkContext(source=source.name, shard=shard,
                                                      shard_path=path, rows=rows))
    kept = [i for i, r in enumerate(results) if isinstance(r, SampleOutput)]
    outputs = [results[i] for i in kept]
    tokens = [o.tokens for o in outputs]
    patches = [o.num_patches for o in outputs]
    if source.max_tokens is not None:
        tokens = [t[: max(0, source.max_tokens - p)] for t, p in zip(tokens, patches)]
    images = [o.image for o in outputs] if transform.produces_images else None
    return SampleChunk.from_samples(source.name, shard, rows[kept], tokens, num_patches=patches,
                                    images=images)


class StreamingSourceStream(SourceStream):
    """Drop-in for :class:`~benchmarks.baseline_source.SourceStream` that streams row groups."""

    def __init__(self, source: Source, source_index: int, *, index: int, num_streams: int,
                 seed: int, cache: ReaderCache, load: Callable | None = None) -> None:
        super().__init__(source, source_index, index=index, num_streams=num_streams, seed=seed,
                         cache=cache)
        self._rng = np.random.default_rng((seed, source_index, index, 2))
        self._units: list[tuple[int, str, int, int]] | None = None  # shard, path, group, first row
        self._batches = None  # the open iterator over the current row group
        self._file = None
        self._row = 0
        self._unit: tuple[int, str, int, int] | None = None
        #: the current batch as stored: shard, path, rows, columns, and the rows not drawn yet
        #: (popped from the end: a seeded permutation)
        self._raw: tuple[int, str, np.ndarray, dict[str, list], list[int]] | None = None

    def open(self) -> None:
        """List the source, read its footers and open the first row group's stream."""
        import pyarrow.parquet as pq

        listing = self.cache.listing(self.source)
        units = []
        for shard in listing.shards:
            path = _local(shard.path)
            meta = pq.read_metadata(path)
            first = 0
            for g in range(meta.num_row_groups):
                units.append((shard.index, path, g, first))
                first += meta.row_group(g).num_rows
        if not units:
            raise ValueError(f"source {self.source.name!r} has no row groups to stream")
        self._units = units
        self._next_unit()

    def _next_unit(self) -> None:
        import pyarrow.parquet as pq

        epoch, k = divmod(self._position, len(self._units))
        order = np.random.default_rng((self.seed, self.source_index, epoch, 2)).permutation(len(self._units))
        self._position += self.num_streams
        shard, path, group, first = self._unit = self._units[int(order[k])]
        if self._file is None or self._file_path != path:
            if self._file is not None:
                self._file.close()
            self._file = pq.ParquetFile(path, buffer_size=READ_BUFFER, pre_buffer=False)
            self._file_path = path
        self._batches = self._file.iter_batches(batch_size=self.source.chunk_rows, row_groups=[group],
                                                columns=list(self.source.fields), use_threads=False)
        self._row = first

    def _refill(self) -> None:
        if self._units is None:
            self.open()
        while True:
            batch = next(self._batches, None)
            if batch is not None:
                break
            self._next_unit()
        shard, path = self._unit[0], self._unit[1]
        columns = {}
        for name in self.source.fields:
            column = batch.column(name)
            child = bytes_child(column.type)
            if child is not None:  # image struct {bytes, path}: the bytes
                column = column.field(child) if hasattr(column, "field") else column
            columns[name] = column.to_pylist()
        rows = np.arange(self._row, self._row + batch.num_rows, dtype=np.int64)
        self._row += batch.num_rows
        del batch, column
        # As mdata's reader does (mdata/sources/parquet_reader.py): hand freed Arrow pages back
        # to the OS once the batch is Python values, instead of keeping the pool's peak for good.
        import pyarrow as pa

        pa.default_memory_pool().release_unused()
        if not self.source.transform.produces_images:
            self._fill(transform_columns(self.source, shard, path, rows, columns))
            return
        order = self._rng.permutation(len(rows))
        self._raw = (shard, path, rows, columns, [int(i) for i in order[::-1]])

    def next(self):
        """The next sample: a text batch's next, or an image row decoded now (a row the
        transform drops is skipped)."""
        while True:
            if self._buffer:
                return self._buffer.pop()
            if self._raw is None or not self._raw[4]:
                self._refill()
                continue
            shard, path, rows, columns, left = self._raw
            i = left.pop()
            self._fill(transform_columns(self.source, shard, path, rows[i:i + 1],
                                         {name: values[i:i + 1] for name, values in columns.items()}))
