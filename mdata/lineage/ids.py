"""Sample identity: the lineage root of every sample.

A sample is named by ``(source, shard, row)``: the source's name, the index of the shard in the
source's sorted shard listing, and the row inside that shard. The id is stable across runs,
processes and cluster sizes, so lineage, checkpoints and error messages can all refer to it.

Columnar code (chunks, the DGraph, batches) stores ids as three parallel integer columns
(``source_index``, ``shard``, ``row``) where ``source_index`` is the position of the source in the
plan; :class:`SampleId` is the readable, hashable form used at the edges (errors, ``story``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SampleId"]


@dataclass(frozen=True, order=True)
class SampleId:
    """One sample's stable identity: ``source`` name, ``shard`` index, ``row`` inside the shard."""

    source: str
    shard: int
    row: int

    def __str__(self) -> str:
        return f"{self.source}/{self.shard}/{self.row}"

    @classmethod
    def parse(cls, text: str) -> "SampleId":
        """Parse the ``source/shard/row`` form printed by ``str(sample_id)``."""
        try:
            source, shard, row = text.rsplit("/", 2)
            return cls(source, int(shard), int(row))
        except ValueError:
            raise ValueError(
                f"not a sample id: {text!r}; expected 'source/shard/row', e.g. 'books/3/120'"
            ) from None
