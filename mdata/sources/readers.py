"""Shard readers over fsspec + pyarrow, and the per-process reader cache.

A reader holds what is expensive to set up for one shard: an open file handle (an S3 connection, a
local descriptor) and the parsed footer or line index. Building that once per worker process, not
once per trainer rank and DataLoader worker, is where much of mdata's memory saving comes from, so
the :class:`ReaderCache` keeps at most one reader per (source, shard) per process, bounded by LRU.

Reads fetch only what is asked for: for Parquet, only the row groups that overlap ``[start, stop)``
and only the declared columns; for JSONL, only the byte range of those lines.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mdata.errors import CorruptShardError, SchemaError, SourceNotFoundError
from mdata.sources.fields import FieldKind, arrow_type_problem, bytes_child
from mdata.sources.spec import Format

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from mdata.sources.listing import ShardInfo, SourceListing
    from mdata.sources.spec import Source

__all__ = [
    "JsonlShardReader",
    "ParquetShardReader",
    "ReaderCache",
    "ReaderCacheStats",
    "ShardReader",
    "default_reader_cache",
    "reader_class",
]


class ShardReader(ABC):
    """Reads row ranges of one shard of one source; thread-safe; reopens itself after close()."""

    format: ClassVar[Format]

    def __init__(self, source: "Source", fs: "AbstractFileSystem", path: str, shard: "ShardInfo") -> None:
        self.source = source
        self.fs = fs
        self.path = path  # protocol-less, for fs
        self.shard = shard  # shard.path is the full URL, used in errors
        self.kinds: dict[str, FieldKind] = {f: FieldKind.ANY for f in source.fields}
        self.kinds.update(
            (name, FieldKind(kind)) for name, kind in source.transform.required_fields().items()
        )
        self._lock = threading.Lock()
        self._file: Any = None
        #: Row groups (Parquet) or lines (JSONL) read so far: shows that reads are range-bounded.
        self.units_read = 0
        with self._lock:
            self._open()

    @classmethod
    @abstractmethod
    def count_rows(cls, fs: "AbstractFileSystem", path: str, *, source: str, url: str) -> int:
        """Rows in the shard at ``path`` (footer or line count), for the listing."""

    @abstractmethod
    def _open(self) -> None:
        """Open the file and parse what the reads need; called under the lock."""

    @abstractmethod
    def _read(self, start: int, stop: int) -> dict[str, list[Any]]:
        """Rows ``[start, stop)`` as one Python list per field; called under the lock."""

    def read(self, start: int, stop: int) -> dict[str, list[Any]]:
        """Rows ``[start, stop)`` of the declared fields, as Python lists (what tokenizers take)."""
        with self._lock:
            if self._file is None:
                self._open()
            return self._read(start, stop)

    def close(self) -> None:
        """Release the file handle; a later read reopens it."""
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                finally:
                    self._file = None

    def _corrupt(self, message: str, exc: BaseException | None = None, row: int | None = None) -> CorruptShardError:
        detail = f"{message}: {type(exc).__name__}: {exc}" if exc is not None else message
        return CorruptShardError(
            detail,
            source=self.source.name,
            shard=self.shard.path,
            row=row,
            hint="the file is truncated or not valid; re-write it or remove it from the source",
        )

    def _open_file(self) -> Any:
        try:
            return self.fs.open(self.path, "rb")
        except FileNotFoundError as exc:
            raise SourceNotFoundError(
                "shard disappeared after it was listed",
                source=self.source.name,
                shard=self.shard.path,
                hint="shards must not change while a job runs; restart to re-list the source",
            ) from exc


class ParquetShardReader(ShardReader):
    """Parquet: footer parsed once; reads select overlapping row groups and declared columns."""

    format = Format.PARQUET

    @classmethod
    def count_rows(cls, fs: "AbstractFileSystem", path: str, *, source: str, url: str) -> int:
        try:
            with fs.open(path, "rb") as f:
                return pq.read_metadata(f).num_rows
        except FileNotFoundError:
            raise
        except Exception as exc:  # ArrowInvalid ("magic bytes not found"), OSError...
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
            self._pf = pq.ParquetFile(self._file, page_checksum_verification=True)
        except Exception as exc:
            self._file.close()
            self._file = None
            raise self._corrupt("cannot read the Parquet footer", exc) from exc
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
            table = self._pf.read_row_groups(groups, columns=fields, use_threads=False)
        except Exception as exc:  # corrupt page, checksum mismatch, truncated column chunk
            raise self._corrupt(
                f"cannot read rows [{start}, {stop}) (row groups {first}..{last})", exc, row=start
            ) from exc
        self.units_read += len(groups)
        table = table.slice(start - int(self._group_starts[first]), stop - start)
        out: dict[str, list[Any]] = {}
        for name in fields:
            column = table.column(name)
            child = bytes_child(column.type)
            if child is not None:  # Hugging Face image struct {bytes, path}: take the bytes
                column = pc.struct_field(column, [child])
            out[name] = column.to_pylist()
        return out


class JsonlShardReader(ShardReader):
    """JSON Lines: one object per line; a line index (byte offsets) is built once per open.

    Empty lines are ignored (not counted as rows). ``BYTES`` fields hold base64 strings.
    """

    format = Format.JSONL
    _BLOCK = 1 << 22

    @classmethod
    def _scan(cls, f: Any) -> tuple[np.ndarray, np.ndarray]:
        """Start offsets and lengths (without the newline) of the non-empty lines of ``f``."""
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        pos = 0
        line_start = 0
        while True:
            block = f.read(cls._BLOCK)
            if not block:
                break
            buf = np.frombuffer(block, dtype=np.uint8)
            nl = np.flatnonzero(buf == 10) + pos
            if nl.size:
                line_starts = np.concatenate([[line_start], nl[:-1] + 1])
                starts.append(line_starts)
                ends.append(nl)
                line_start = int(nl[-1]) + 1
            pos += len(block)
        if line_start < pos:  # last line without a trailing newline
            starts.append(np.array([line_start]))
            ends.append(np.array([pos]))
        s = np.concatenate(starts).astype(np.int64) if starts else np.zeros(0, np.int64)
        e = np.concatenate(ends).astype(np.int64) if ends else np.zeros(0, np.int64)
        keep = e > s
        return s[keep], (e - s)[keep]

    @classmethod
    def count_rows(cls, fs: "AbstractFileSystem", path: str, *, source: str, url: str) -> int:
        with fs.open(path, "rb") as f:
            return len(cls._scan(f)[0])

    def _open(self) -> None:
        self._file = self._open_file()
        self._starts, self._lengths = self._scan(self._file)
        if len(self._starts) != self.shard.num_rows:
            raise self._corrupt(
                f"shard has {len(self._starts)} lines but had {self.shard.num_rows} when listed"
            )

    def _read(self, start: int, stop: int) -> dict[str, list[Any]]:
        fields = self.kinds
        out: dict[str, list[Any]] = {f: [] for f in fields}
        if stop <= start:
            return out
        begin = int(self._starts[start])
        end = int(self._starts[stop - 1] + self._lengths[stop - 1])
        self._file.seek(begin)
        data = self._file.read(end - begin)
        self.units_read += stop - start
        for k in range(start, stop):
            a = int(self._starts[k]) - begin
            line = data[a : a + int(self._lengths[k])]
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise self._corrupt("line is not valid JSON", exc, row=k) from exc
            if not isinstance(obj, dict):
                raise self._corrupt(f"line is a JSON {type(obj).__name__}, not an object", row=k)
            for name, kind in fields.items():
                out[name].append(self._value(obj, name, kind, k))
        return out

    def _value(self, obj: dict, name: str, kind: FieldKind, row: int) -> Any:
        if name not in obj:
            raise SchemaError(
                f"field {name!r} is missing; the line has keys {sorted(obj)}",
                source=self.source.name, shard=self.shard.path, row=row,
                hint="fix the Source's fields or the transform's field names",
            )
        value = obj[name]
        if value is None or kind is FieldKind.ANY:
            return value  # nulls are the transform's call (a skippable sample error)
        if not isinstance(value, str):
            expected = "a string" if kind is FieldKind.TEXT else "a base64 string"
            raise SchemaError(
                f"field {name!r} is a JSON {type(value).__name__}, expected {expected}",
                source=self.source.name, shard=self.shard.path, row=row,
                hint="point the transform at a field of the right type, or convert the shard",
            )
        if kind is FieldKind.BYTES:
            try:
                return base64.b64decode(value, validate=True)
            except binascii.Error as exc:
                raise SchemaError(
                    f"field {name!r} is not valid base64 ({exc})",
                    source=self.source.name, shard=self.shard.path, row=row,
                    hint="binary fields in JSONL must be base64-encoded strings",
                ) from exc
        return value


_READERS: dict[Format, type[ShardReader]] = {
    Format.PARQUET: ParquetShardReader,
    Format.JSONL: JsonlShardReader,
}


def reader_class(fmt: Format) -> type[ShardReader]:
    """The reader for a format (every :class:`Format` member has one)."""
    return _READERS[Format(fmt)]


@dataclass(frozen=True)
class ReaderCacheStats:
    """Counters of a :class:`ReaderCache`: how often readers were opened, reused and evicted."""

    listings: int
    opens: int
    hits: int
    evictions: int
    open_readers: int


@dataclass
class _Listed:
    listing: "SourceListing"
    fs: "AbstractFileSystem"
    paths: list[str]


class ReaderCache:
    """At most one open reader per (source, shard) in this process, LRU-bounded; thread-safe.

    Also memoizes each source's listing, so the glob and the footers are read once per process.
    Readers evicted from the cache are closed; one still in use by another thread reopens its file
    on its next read, so eviction never breaks a running load.
    """

    def __init__(self, max_readers: int = 64) -> None:
        if not isinstance(max_readers, int) or max_readers < 1:
            raise ValueError(f"max_readers must be a positive int, got {max_readers!r}")
        self.max_readers = max_readers
        self._lock = threading.Lock()
        self._listings: dict[tuple, _Listed] = {}
        self._readers: OrderedDict[tuple, ShardReader] = OrderedDict()
        self._opening: dict[tuple, threading.Lock] = {}
        self._opens = self._hits = self._evictions = 0

    def _listed(self, source: "Source") -> _Listed:
        key = source.cache_key
        with self._lock:
            entry = self._listings.get(key)
            if entry is not None:
                return entry
            listing_lock = self._opening.setdefault(("listing",) + key, threading.Lock())
        with listing_lock:  # racing threads list a source once
            with self._lock:
                entry = self._listings.get(key)
            if entry is None:
                from mdata.sources.listing import list_shards_resolved

                entry = _Listed(*list_shards_resolved(source))
                with self._lock:
                    self._listings[key] = entry
        return entry

    def listing(self, source: "Source") -> "SourceListing":
        """The source's listing, computed on first use in this process."""
        return self._listed(source).listing

    def reader(self, source: "Source", shard: int) -> ShardReader:
        """The open reader of shard ``shard`` (index in the listing), opening it on first use."""
        listed = self._listed(source)
        info = listed.listing.shard(shard)
        shard = info.index
        key = (source.cache_key, shard)
        reader = self._hit(key)
        if reader is not None:
            return reader
        # Open outside the cache lock (a remote open takes tens of ms and must not block other
        # shards) but under a per-shard lock, so racing threads open the shard once, not twice.
        with self._lock:
            opening = self._opening.setdefault(key, threading.Lock())
        with opening:
            reader = self._hit(key)
            if reader is not None:
                return reader
            reader = reader_class(source.format)(source, listed.fs, listed.paths[shard], info)
            evicted: list[ShardReader] = []
            with self._lock:
                self._opens += 1
                self._readers[key] = reader
                while len(self._readers) > self.max_readers:
                    old_key, old = self._readers.popitem(last=False)
                    self._opening.pop(old_key, None)
                    evicted.append(old)
                    self._evictions += 1
        for r in evicted:
            r.close()
        return reader

    def _hit(self, key: tuple) -> ShardReader | None:
        with self._lock:
            reader = self._readers.get(key)
            if reader is not None:
                self._readers.move_to_end(key)
                self._hits += 1
            return reader

    def stats(self) -> ReaderCacheStats:
        """Current counters."""
        with self._lock:
            return ReaderCacheStats(
                listings=len(self._listings),
                opens=self._opens,
                hits=self._hits,
                evictions=self._evictions,
                open_readers=len(self._readers),
            )

    def clear(self) -> None:
        """Close every reader and forget every listing (e.g. after the files changed)."""
        with self._lock:
            readers = list(self._readers.values())
            self._readers.clear()
            self._opening.clear()
            self._listings.clear()
        for r in readers:
            r.close()


_default: ReaderCache | None = None
_default_lock = threading.Lock()


def default_reader_cache() -> ReaderCache:
    """The process-wide reader cache (what Dask load tasks use)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = ReaderCache()
    return _default


def _forget_after_fork() -> None:
    # File handles and S3 sessions must not be shared with a forked child: it starts afresh.
    global _default, _default_lock
    _default = None
    _default_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
