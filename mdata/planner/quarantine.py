"""Quarantined chunks: what a source with ``on_corrupt="skip"`` does with a shard it cannot parse.

A load that fails with :class:`~mdata.errors.CorruptShardError` (a line that is not JSON, a
corrupt Parquet page, a row over the readers' size limits...) fails the job under the default
``on_corrupt="fail"``. Under ``"skip"`` the Planner instead records the chunk as loaded with no
usable row: every row of it is *passed over* like a row the transform skipped, so the source's
cursor walks on and the next rows of the source's order take the quarantined rows' places
(:mod:`mdata.planner.selection`). Steps keep their sizes; nothing is duplicated.

The decision depends on the shard's bytes alone (the same chunk fails the same way in every
process and every run), never on timing or on what the Planner saw before, so a job resumed from
any checkpoint, before or after the quarantine, meets the same failure at the same position and
takes exactly the samples of the uninterrupted run, without the checkpoint recording anything.
A shard whose every chunk fails (a truncated file) is skipped whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mdata.errors import CorruptShardError
from mdata.order import ChunkRef
from mdata.planner.chunk_table import ChunkTable

__all__ = ["QuarantinedChunk", "Quarantine", "describe_quarantine"]


@dataclass(frozen=True)
class QuarantinedChunk:
    """Rows ``[start, stop)`` of shard ``shard`` (its index; ``path`` as the error named it) of
    ``source``, quarantined while the Planner was at ``step``, because of ``reason``."""

    source: str
    shard: int
    path: str
    start: int
    stop: int
    step: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "path": self.path, "rows": [self.start, self.stop],
                "step": self.step, "reason": self.reason}


class Quarantine:
    """Which sources skip corrupt chunks, and the chunks quarantined so far (each once)."""

    def __init__(self, sources: Sequence[Any], table: ChunkTable) -> None:
        self.table = table
        self.skipping = frozenset(getattr(s, "name", s) for s in sources
                                  if getattr(s, "on_corrupt", "fail") == "skip")
        self.chunks: dict[tuple[str, int, int], QuarantinedChunk] = {}

    def passed_over(self, ref: ChunkRef, error: BaseException, step: int) -> bool:
        """Whether the failed load of ``ref`` is quarantined (see :meth:`decide`); if so, the
        chunk table holds it as loaded with no usable row, so steps walk past its rows."""
        if self.decide(ref, error, step) is None:
            return False
        self.table.fill_empty(ref)
        return True

    def decide(self, ref: ChunkRef, error: BaseException, step: int) -> QuarantinedChunk | None:
        """The quarantine of ``ref`` when its load failed with ``error``, or None when the job
        must fail (another error, or a source whose policy is ``"fail"``)."""
        if ref.source not in self.skipping or not isinstance(error, CorruptShardError):
            return None
        key = (ref.source, ref.shard, ref.start)
        known = self.chunks.get(key)
        if known is not None:  # a reload in a later epoch fails the same way
            return known
        path = str(error.shard) if error.shard is not None else str(ref.shard)
        row = "" if error.row is None else f" (row {error.row})"
        entry = QuarantinedChunk(ref.source, int(ref.shard), path, int(ref.start), int(ref.stop),
                                 int(step), f"{type(error).__name__}{row}: {error.message}")
        self.chunks[key] = entry
        return entry

    def by_source(self) -> dict[str, list[dict[str, Any]]]:
        """``{source: [chunk as a dict, ...]}`` in the order they were quarantined (status)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for entry in self.chunks.values():
            out.setdefault(entry.source, []).append(entry.to_dict())
        return out


def describe_quarantine(entries: Sequence[Any]) -> str:
    """One line about a source's quarantined chunks (``QuarantinedChunk.to_dict()`` each): which
    shards, which rows, why (the first reason); empty when none (the dashboard's sources table)."""
    if not entries:
        return ""
    shards = list(dict.fromkeys(str(e["path"]) for e in entries))
    rows = sum(int(e["rows"][1]) - int(e["rows"][0]) for e in entries)
    named = ", ".join(shards[:3]) + (f" and {len(shards) - 3} more" if len(shards) > 3 else "")
    return (f"{len(entries)} chunk(s), {rows} rows of {len(shards)} shard(s) quarantined since step "
            f"{min(int(e['step']) for e in entries)}: {named} ({entries[0]['reason']})")
