"""JSON Lines shards: a line index (byte offsets) is built once per open; reads fetch a byte range."""

from __future__ import annotations

import base64
import binascii
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from mdata.errors import SchemaError
from mdata.sources.faults import is_transient
from mdata.sources.fields import FieldKind
from mdata.sources.shard_reader import ShardReader
from mdata.sources.spec import Format

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

__all__ = ["JsonlShardReader"]


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
        try:
            self._starts, self._lengths = self._scan(self._file)
        except Exception as exc:  # only reading can fail here: storage, not the file's content
            self._file.close()
            self._file = None
            if is_transient(exc):
                raise
            raise self._failure("cannot index the lines", exc, action="indexing the lines") from exc
        if len(self._starts) != self.shard.num_rows:
            raise self._corrupt(
                f"shard has {len(self._starts)} lines but had {self.shard.num_rows} when listed"
            )

    def _read(self, start: int, stop: int) -> dict[str, list[Any]]:
        fields = self.kinds
        out: dict[str, list[Any]] = {f: [] for f in fields}
        if stop <= start:
            return out
        over = np.flatnonzero(self._lengths[start:stop] > self.limits.max_line_bytes)
        if over.size:  # checked on the index, before a byte of the range is read
            row = start + int(over[0])
            self.limits.check_line(int(self._lengths[row]), source=self.source.name,
                                   shard=self.shard.path, row=row)
        begin = int(self._starts[start])
        end = int(self._starts[stop - 1] + self._lengths[stop - 1])
        try:
            self._file.seek(begin)
            data = self._file.read(end - begin)
        except Exception as exc:
            if is_transient(exc):
                raise
            raise self._failure(
                f"cannot read rows [{start}, {stop})", exc, action=f"reading rows [{start}, {stop})", row=start
            ) from exc
        self.units_read += stop - start
        for k in range(start, stop):
            a = int(self._starts[k]) - begin
            line = data[a : a + int(self._lengths[k])]
            try:
                obj = json.loads(line)
            except ValueError as exc:
                raise self._corrupt("line is not valid JSON", exc, row=k) from exc
            except RecursionError:  # "[[[[..." deeper than the parser's stack
                raise self._corrupt("line nests JSON values too deeply to parse", row=k) from None
            if not isinstance(obj, dict):
                raise self._corrupt(f"line is a JSON {type(obj).__name__}, not an object", row=k)
            for name, kind in fields.items():
                out[name].append(self._value(obj, name, kind, k))
        return self._check_cells(out, start)

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
