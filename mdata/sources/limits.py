"""Size limits of what a reader hands to a transform: one JSONL line, one cell.

A shard is outside input: a 2 GB line (a dump gone wrong), a 500 MB cell, or a line nesting
arrays a hundred thousand deep must fail as a typed error naming source, shard and row, not as a
loader killed for memory or a ``RecursionError`` escaping the reader. The limits are read from
``mdata.sources.*`` when a reader opens; a value over them is a :class:`RowTooLargeError`, a
:class:`~mdata.errors.CorruptShardError` (so a source's ``on_corrupt`` policy applies to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mdata.errors import RowTooLargeError

__all__ = ["ReadLimits"]


@dataclass(frozen=True)
class ReadLimits:
    """``max_line_bytes``: longest JSONL line; ``max_cell_bytes``: longest string or bytes value
    of a declared field, any format (strings counted in UTF-8 bytes; checked after decoding)."""

    max_line_bytes: int = 64 << 20
    max_cell_bytes: int = 32 << 20

    def __post_init__(self) -> None:
        for name in ("max_line_bytes", "max_cell_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ReadLimits.{name} must be a positive int, got {value!r}")

    @classmethod
    def from_config(cls) -> "ReadLimits":
        """The limits under ``mdata.sources.*`` in Dask's configuration."""
        from dask.utils import parse_bytes

        from mdata import config

        return cls(max_line_bytes=int(parse_bytes(config.get("sources.max-line-bytes"))),
                   max_cell_bytes=int(parse_bytes(config.get("sources.max-cell-bytes"))))

    def check_line(self, length: int, *, source: str, shard: str, row: int) -> None:
        """Raise :class:`RowTooLargeError` when a line of ``length`` bytes is over the limit."""
        if length > self.max_line_bytes:
            raise RowTooLargeError(
                f"line is {length} bytes, over mdata.sources.max-line-bytes={self.max_line_bytes}",
                source=source, shard=shard, row=row,
                hint="split or drop the row, or raise mdata.sources.max-line-bytes on the loaders",
            )

    def check_cells(self, name: str, values: list[Any], *, source: str, shard: str, first_row: int) -> None:
        """Raise :class:`RowTooLargeError` naming the first value of field ``name`` over the limit
        (``values[i]`` is row ``first_row + i``)."""
        cap = self.max_cell_bytes
        for i, value in enumerate(values):
            if isinstance(value, (bytes, bytearray, memoryview)):
                size = len(value)
            elif isinstance(value, str):
                if len(value) * 4 <= cap:  # a UTF-8 character is at most 4 bytes: surely fits
                    continue
                size = len(value.encode("utf-8", "surrogatepass"))
            else:
                continue
            if size > cap:
                raise RowTooLargeError(
                    f"field {name!r} holds {size} bytes, over mdata.sources.max-cell-bytes={cap}",
                    source=source, shard=shard, row=first_row + i,
                    hint="split or drop the row, or raise mdata.sources.max-cell-bytes on the loaders",
                )
