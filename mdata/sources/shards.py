"""The value types of a listing: :class:`ShardInfo` and :class:`SourceListing`.

They sit below both the listing (which builds them) and the readers (which are handed a
:class:`ShardInfo`), so neither has to import the other for its types.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from mdata.errors import RowRangeError

__all__ = ["ListingExpectations", "ShardInfo", "SourceListing", "listing_digest"]


def listing_digest(entries: Iterable[Sequence]) -> str:
    """A short digest of a listing as ``[[shard name, rows], ...]`` (names relative to the
    source's URL, as registration reports them).

    The Planner lists a source once per job, while each loader process keeps the listing it made
    first; a load task carries the digest of its job's listing so a loader whose listing is older
    (shards appended since, then accepted by a resume) notices and lists again.
    """
    text = json.dumps([[str(name), int(rows)] for name, rows in entries], separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


class ListingExpectations:
    """What each load task of a job expects of its shard: ``(digest of the job's listing of the
    source, the shard's name, its rows)``, from the listings registration made (digests computed
    once per source). ``None`` for a source without a listing (a state built without one)."""

    def __init__(self, listings: dict[str, list] | None) -> None:
        self._listings = listings or {}
        self._digests: dict[str, str] = {}

    def of(self, source: str, shard: int) -> tuple[str, str, int] | None:
        entries = self._listings.get(source)
        if entries is None:
            return None
        digest = self._digests.get(source)
        if digest is None:
            digest = self._digests[source] = listing_digest(entries)
        name, rows = entries[int(shard)]
        return digest, str(name), int(rows)


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
    #: ``(shard index, reason)`` of shards listed with no rows because their row count could not
    #: be read (a corrupt Parquet footer) and the source's ``on_corrupt`` is ``"skip"``
    quarantined: tuple[tuple[int, str], ...] = ()

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
