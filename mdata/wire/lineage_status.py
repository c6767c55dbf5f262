"""What a job's status says of its spilled lineage (``status()["lineage"]``).

Lineage older than the DGraph's retention is written to files by the scheduler; when storage
fails for long, or retention deletes old files, some of it is let go (:mod:`mdata.lineage.limits`).
:class:`LineageSpillInfo` carries how much waits in memory and which steps' lineage is gone, so
an operator reads it from ``JobHandle.status()`` as the dashboard's lineage page shows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mdata.lineage.limits import LineageGap
from mdata.wire.codec import Message, Reader, check_int

__all__ = ["LineageSpillInfo"]


def _read_gap(value: Any, r: Reader, field: str) -> LineageGap:
    g = Reader(f"{r.name}.{field}", value)
    out = LineageGap(g.int("first_step"), g.int("stop_step"), g.str("reason"), g.str("detail"))
    g.done()
    return out


@dataclass(frozen=True)
class LineageSpillInfo(Message):
    """``url``: this run's spill folder ("" when lineage is not spilled); ranges written and
    pending; ``pending_bytes`` held in memory for the writer, under ``pending_limit`` (None:
    unbounded); ``file_bytes`` of the files kept; failed write attempts and the last error;
    ``unavailable``: the steps whose lineage was let go and why; ``note``: the sentence ("" when
    every spilled step is told)."""

    url: str = ""
    written_ranges: int = 0
    pending_ranges: int = 0
    pending_bytes: int = 0
    pending_limit: int | None = None
    file_bytes: int = 0
    failures: int = 0
    last_error: str = ""
    unavailable: tuple[LineageGap, ...] = ()
    note: str = ""

    def to_msg(self) -> dict[str, Any]:
        return {"url": self.url, "written_ranges": self.written_ranges,
                "pending_ranges": self.pending_ranges, "pending_bytes": self.pending_bytes,
                "pending_limit": self.pending_limit, "file_bytes": self.file_bytes,
                "failures": self.failures, "last_error": self.last_error,
                "unavailable": [g.to_dict() for g in self.unavailable], "note": self.note}

    @classmethod
    def from_msg(cls, msg: Any) -> "LineageSpillInfo":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("url"), r.int("written_ranges"), r.int("pending_ranges"),
                  r.int("pending_bytes"), r.optional("pending_limit", check_int, required=True),
                  r.int("file_bytes"), r.int("failures"), r.str("last_error"),
                  r.list("unavailable", _read_gap), r.str("note"))
        r.done()
        return out

