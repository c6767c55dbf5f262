"""The value types of a listing: :class:`ShardInfo` and :class:`SourceListing`.

They sit below both the listing (which builds them) and the readers (which are handed a
:class:`ShardInfo`), so neither has to import the other for its types.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mdata.errors import RowRangeError

__all__ = ["ShardInfo", "SourceListing"]


@dataclass(frozen=True)
class ShardInfo:
    """One shard: its position in the sorted listing, its full URL, and its row count."""

    index: int
    path: str
    num_rows: int


@dataclass(frozen=True)
class SourceListing:
    """A source's shards in sorted path order, with row counts."""

    source: str
    shards: tuple[ShardInfo, ...]

    @property
    def num_rows(self) -> int:
        """Rows over all shards."""
        return sum(s.num_rows for s in self.shards)

    def __len__(self) -> int:
        return len(self.shards)

    def shard(self, index: int) -> ShardInfo:
        """The shard at ``index`` (an int or numpy integer); raises :class:`RowRangeError` if absent."""
        if isinstance(index, np.integer):
            index = int(index)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.shards):
            raise RowRangeError(
                f"shard index {index!r} is outside the listing of {len(self.shards)} shards",
                source=self.source,
                shard=index if isinstance(index, int) else None,
                hint=f"valid shard indices are 0..{len(self.shards) - 1}",
            )
        return self.shards[index]
