"""Parquet shards: the footer is parsed once; reads fetch only overlapping row groups and columns.

Reads stream: the file is read through a buffered stream of :data:`READ_BUFFER` bytes per column
(never a whole column chunk at once, no pre-buffering of the row group) and decoded ``stop -
start`` rows at a time, stopping at ``stop``. Production writers cut row groups of 32-128 MB; a
chunk of a few hundred rows then costs one chunk's worth of decoded memory, not a row group's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mdata.errors import CorruptShardError, SchemaError
from mdata.sources.faults import Fault, classify, is_transient
from mdata.sources.fields import arrow_type_problem, bytes_child
from mdata.sources.shard_reader import ShardReader
from mdata.sources.spec import Format

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

__all__ = ["ParquetShardReader", "READ_BUFFER"]

#: Bytes of the buffered stream per column chunk (pyarrow's ``buffer_size``).
READ_BUFFER = 1 << 20


def _release_arrow_memory() -> None:
    """Hand the decoded batches' pages back to the OS once a chunk is Python values.

    Arrow's default pool (mimalloc or jemalloc) keeps freed pages for reuse: after the first
    chunks of 32-128 MB row groups a loader process held its peak decode footprint (35-70 MB in
    the memory benchmark) for good, on top of the chunks it serves. Loads are a few per second,
    each decoding MBs, so releasing costs little next to the decode itself."""
    pa.default_memory_pool().release_unused()


class ParquetShardReader(ShardReader):
    """Parquet: footer parsed once; reads select overlapping row groups and declared columns."""

    format = Format.PARQUET

    @classmethod
    def count_rows(cls, fs: "AbstractFileSystem", path: str, *, source: str, url: str) -> int:
        # Failures to open, and storage failures while reading (unreachable, missing, denied), are
        # the store's, not the file's: they propagate for the listing to retry or report.
        with fs.open(path, "rb") as f:
            try:
                return pq.read_metadata(f).num_rows
            except Exception as exc:
                if classify(exc) is not Fault.OTHER:
                    raise
                # ArrowInvalid ("magic bytes not found"), OSError("Couldn't deserialize thrift")...
                raise CorruptShardError(
                    f"cannot read the Parquet footer: {type(exc).__name__}: {exc}",
                    source=source,
                    shard=url,
                    hint="the file is truncated or not Parquet; re-write it or remove it from the source",
                ) from exc

    def _open(self) -> None:
        self._file = self._open_file()
        try:
            # Page checksums are verified when the writer stored them: corruption inside a data
            # page then fails loudly instead of yielding wrong tokens.
            self._pf = pq.ParquetFile(self._file, page_checksum_verification=True,
                                      buffer_size=READ_BUFFER, pre_buffer=False)
        except Exception as exc:
            self._file.close()
            self._file = None
            if is_transient(exc):
                raise
            raise self._failure("cannot read the Parquet footer", exc, action="reading the Parquet footer") from exc
        meta = self._pf.metadata
        if meta.num_rows != self.shard.num_rows:
            raise self._corrupt(
                f"shard has {meta.num_rows} rows but had {self.shard.num_rows} when listed"
            )
        self._check_schema(self._pf.schema_arrow)
        sizes = np.array([meta.row_group(i).num_rows for i in range(meta.num_row_groups)], dtype=np.int64)
        self._group_starts = np.concatenate([[0], np.cumsum(sizes)])

    def _check_schema(self, schema: pa.Schema) -> None:
        for name, kind in self.kinds.items():
            index = schema.get_field_index(name)
            if index < 0:
                raise SchemaError(
                    f"field {name!r} is missing; the shard has columns {schema.names}",
                    source=self.source.name,
                    shard=self.shard.path,
                    hint="fix the Source's fields or the transform's field names",
                )
            problem = arrow_type_problem(kind, schema.field(index).type)
            if problem:
                raise SchemaError(
                    f"field {name!r} {problem}",
                    source=self.source.name,
                    shard=self.shard.path,
                    hint="point the transform at a column of the right type, or convert the shard",
                )

    def _read(self, start: int, stop: int) -> dict[str, list[Any]]:
        fields = list(self.kinds)
        if stop <= start:
            return {f: [] for f in fields}
        first = int(np.searchsorted(self._group_starts, start, side="right")) - 1
        last = int(np.searchsorted(self._group_starts, stop, side="left")) - 1
        groups = list(range(first, last + 1))
        try:
            table = self._stream(groups, start, stop, fields)
        except Exception as exc:  # corrupt page, checksum mismatch, truncated column chunk; or storage
            if is_transient(exc):
                raise
            raise self._failure(
                f"cannot read rows [{start}, {stop}) (row groups {first}..{last})", exc,
                action=f"reading rows [{start}, {stop})", row=start,
            ) from exc
        self.units_read += len(groups)
        out: dict[str, list[Any]] = {}
        for name in fields:
            column = table.column(name)
            child = bytes_child(column.type)
            if child is not None:  # Hugging Face image struct {bytes, path}: take the bytes
                column = pc.struct_field(column, [child])
            out[name] = column.to_pylist()
        del table, column
        _release_arrow_memory()
        return self._check_cells(out, start)

    def _stream(self, groups: list[int], start: int, stop: int, fields: list[str]) -> pa.Table:
        """Rows ``[start, stop)`` of ``groups``, decoded ``stop - start`` rows at a time; batches
        before ``start`` are decoded and dropped (Parquet pages have no row index to seek by)."""
        position = int(self._group_starts[groups[0]])
        kept = []
        for batch in self._pf.iter_batches(batch_size=stop - start, row_groups=groups,
                                           columns=fields, use_threads=False):
            end = position + batch.num_rows
            if end > start:
                kept.append(batch.slice(max(0, start - position), min(end, stop) - max(start, position)))
            position = end
            if position >= stop:
                break
        return pa.Table.from_batches(kept)  # start < stop <= num_rows: at least one batch
