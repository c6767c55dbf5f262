"""The shard reader contract: what every format's reader does, and what it holds open.

A reader holds what is expensive to set up for one shard: an open file handle (an S3 connection, a
local descriptor) and the parsed footer or line index. The per-process
:class:`~mdata.sources.cache.ReaderCache` keeps one per (source, shard); the formats' readers live
in :mod:`mdata.sources.parquet_reader` and :mod:`mdata.sources.jsonl_reader`.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

from mdata.errors import CorruptShardError, SourceError, SourceNotFoundError
from mdata.sources.faults import Fault, classify, is_transient, storage_failure
from mdata.sources.fields import FieldKind
from mdata.sources.limits import ReadLimits
from mdata.sources.spec import Format

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from mdata.sources.shards import ShardInfo
    from mdata.sources.spec import Source

__all__ = ["ShardReader"]


class ShardReader(ABC):
    """Reads row ranges of one shard of one source; thread-safe; reopens itself after close().

    Failures that may heal by themselves (storage unreachable, timed out, throttled: see
    :func:`~mdata.sources.faults.is_transient`) propagate unchanged, for the caller's retry loop
    (:class:`~mdata.sources.cache.ReaderCache` drops the reader and opens a fresh one); every other
    failure is an :class:`~mdata.errors.MdataError` naming the source and shard.
    """

    format: ClassVar[Format]

    def __init__(self, source: "Source", fs: "AbstractFileSystem", path: str, shard: "ShardInfo",
                 limits: ReadLimits | None = None) -> None:
        self.source = source
        self.limits = limits if limits is not None else ReadLimits.from_config()
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

    def _check_cells(self, out: dict[str, list[Any]], start: int) -> dict[str, list[Any]]:
        """``out`` (rows from ``start``), once no value of it is over ``limits.max_cell_bytes``."""
        for name, values in out.items():
            self.limits.check_cells(name, values, source=self.source.name, shard=self.shard.path,
                                    first_row=start)
        return out

    def close(self) -> None:
        """Release the file handle; a later read reopens it."""
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                finally:
                    self._file = None

    def _failure(
        self, message: str, exc: BaseException, *, action: str, row: int | None = None, parsing: bool = True
    ) -> SourceError:
        """The mdata error for ``exc``, caught while ``action``, when it is not transient.

        ``message`` is the corrupt-file message (``"cannot read the Parquet footer"``), ``action``
        what was being done (``"reading the Parquet footer"``) for storage's own failures. With
        ``parsing=False`` (no bytes were parsed, e.g. opening) nothing is blamed on the file.

        Callers re-raise transient failures unchanged first (``if is_transient(exc): raise``): the
        retry loop above waits those out. A missing file means the shard changed after listing, a
        denied or failed request is storage's answer, and only the rest blames the file's bytes.
        """
        fault = classify(exc)
        if fault is Fault.NOT_FOUND:
            return SourceNotFoundError(
                f"shard disappeared after it was listed ({type(exc).__name__}: {exc})",
                source=self.source.name,
                shard=self.shard.path,
                row=row,
                hint="shards must not change while a job runs; restart to re-list the source",
            )
        if fault is not Fault.OTHER or not parsing:
            return storage_failure(exc, source=self.source.name, shard=self.shard.path, action=action)
        return self._corrupt(message, exc, row=row)

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
        except Exception as exc:
            if is_transient(exc):
                raise
            raise self._failure("cannot open the shard", exc, action="opening the shard", parsing=False) from exc
