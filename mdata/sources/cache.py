"""The per-process reader cache: one open reader per (source, shard), and each source's listing.

Building a reader once per worker process, not once per trainer rank and DataLoader worker, is where
much of mdata's memory saving comes from, so the :class:`ReaderCache` keeps at most one reader per
(source, shard) per process, bounded by LRU.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mdata.errors import ListingChangedError, StorageUnavailableError
from mdata.sources.listing import list_shards_resolved, shard_names
from mdata.sources.readers import reader_class
from mdata.sources.retry import RetryPolicy, naming_shard, retry_storage
from mdata.sources.shard_reader import ShardReader
from mdata.sources.shards import ShardInfo, SourceListing, listing_digest

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from mdata.sources.spec import Source

__all__ = ["ReaderCache", "ReaderCacheStats", "default_reader_cache"]

logger = logging.getLogger("mdata.sources")


@dataclass(frozen=True)
class ReaderCacheStats:
    """Counters of a :class:`ReaderCache`: how often readers were opened, reused, evicted, dropped."""

    listings: int
    opens: int
    hits: int
    evictions: int
    open_readers: int
    #: Readers dropped because storage failed under them (reopened by the next attempt).
    dropped: int = 0
    #: Listings made again because a load task carried another listing's digest.
    relistings: int = 0


@dataclass
class _Listed:
    listing: "SourceListing"
    fs: "AbstractFileSystem"
    paths: list[str]
    names: list[str] = field(default_factory=list)  # relative to the URL, as registration reports
    digest: str = ""
    #: digests already listed again for and still not matched (an older job's, on a grown source)
    unmatched: set[str] = field(default_factory=set)

    @staticmethod
    def of(source: "Source", listing: "SourceListing", fs: "AbstractFileSystem",
           paths: list[str]) -> "_Listed":
        names = shard_names(fs, source.url, paths)
        digest = listing_digest(zip(names, (s.num_rows for s in listing.shards)))
        return _Listed(listing, fs, paths, names, digest)


class ReaderCache:
    """At most one open reader per (source, shard) in this process, LRU-bounded; thread-safe.

    Also memoizes each source's listing, so the glob and the footers are read once per process.
    Readers evicted from the cache are closed; one still in use by another thread reopens its file
    on its next read, so eviction never breaks a running load.

    Storage outages are waited out under ``retry`` (``mdata.storage.*`` when the cache is built): a
    read that fails because storage is unreachable drops its reader (its connection may be broken)
    and tries again with a freshly opened one, until the deadline passes.
    """

    def __init__(self, max_readers: int = 64, *, retry: RetryPolicy | None = None) -> None:
        if not isinstance(max_readers, int) or max_readers < 1:
            raise ValueError(f"max_readers must be a positive int, got {max_readers!r}")
        self.max_readers = max_readers
        self.retry = retry if retry is not None else RetryPolicy.from_config()
        self._lock = threading.Lock()
        self._listings: dict[tuple, _Listed] = {}
        self._readers: OrderedDict[tuple, ShardReader] = OrderedDict()
        self._opening: dict[tuple, threading.Lock] = {}
        self._opens = self._hits = self._evictions = self._dropped = self._relistings = 0

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
                entry = _Listed.of(source, *list_shards_resolved(source, retry=self.retry))
                with self._lock:
                    self._listings[key] = entry
        return entry

    def check_listing(self, source: "Source", shard: int, expected: tuple[str, str, int]) -> None:
        """Make sure shard ``shard`` means what a job's listing says it means: ``expected`` is
        ``(digest of that listing, the shard's name, its rows)``
        (:class:`~mdata.sources.shards.ListingExpectations`).

        A process keeps the first listing it made of a source; when a job's listing differs (shards
        appended since, accepted on resume), the source is listed again, once per such digest.
        A listing that still differs is accepted only when this shard is the same (an older job
        reading a source that grew since); otherwise :class:`ListingChangedError` names the shard.
        """
        digest, name, rows = expected
        try:
            entry = self._listed(source)
            if entry.digest != digest and digest not in entry.unmatched:
                entry = self._relist(source, entry)
                if entry.digest != digest:
                    entry.unmatched.add(digest)
        except StorageUnavailableError as exc:  # a restarted loader lists first: name the shard
            named = naming_shard(exc, shard)
            if named is exc:
                raise
            raise named from exc.__cause__
        if entry.digest == digest:
            return
        index = int(shard)
        if 0 <= index < len(entry.names) and entry.names[index] == name \
                and entry.listing.shards[index].num_rows == rows:
            return
        now = (f"{entry.names[index]!r} with {entry.listing.shards[index].num_rows} rows"
               if 0 <= index < len(entry.names) else f"absent (the source has {len(entry.names)} shards)")
        raise ListingChangedError(
            f"shard {index} was {name!r} with {rows} rows when the job listed the source, "
            f"and is now {now}",
            source=source.name, shard=name,
            hint="shards may only be appended (names sorting after every known one) while a job "
                 "reads a source; restart the job to read the source as it is now",
        )

    def _relist(self, source: "Source", seen: _Listed) -> _Listed:
        """List ``source`` again (unless another thread just did) and drop the readers of shards
        whose path or rows changed."""
        key = source.cache_key
        with self._lock:
            listing_lock = self._opening.setdefault(("listing",) + key, threading.Lock())
        with listing_lock:
            with self._lock:
                current = self._listings.get(key)
            if current is not None and current is not seen:
                return current  # another thread listed again meanwhile
            entry = _Listed.of(source, *list_shards_resolved(source, retry=self.retry))
            stale: list[ShardReader] = []
            with self._lock:
                self._listings[key] = entry
                self._relistings += 1
                for reader_key in [k for k in self._readers if k[0] == key]:
                    index = reader_key[1]
                    if index >= len(entry.listing) or entry.listing.shards[index] != self._readers[reader_key].shard:
                        stale.append(self._readers.pop(reader_key))
        for reader in stale:
            reader.close()
        logger.info("source %r listed again: %d shards (was %d)", source.name, len(entry.listing),
                    len(seen.listing))
        return entry

    def listing(self, source: "Source") -> "SourceListing":
        """The source's listing, computed on first use in this process."""
        return self._listed(source).listing

    def reader(self, source: "Source", shard: int) -> ShardReader:
        """The open reader of shard ``shard`` (index in the listing), opening it on first use."""
        listed = self._listed(source)
        info = listed.listing.shard(shard)
        return retry_storage(
            lambda: self._get_or_open(source, listed, info),
            source=source.name, shard=info.path, action="opening the shard", policy=self.retry,
        )

    def read(self, source: "Source", shard: int, start: int, stop: int) -> dict[str, list[Any]]:
        """Rows ``[start, stop)`` of shard ``shard`` through its cached reader, outages waited out.

        Each attempt takes the cached reader (or opens one) and reads; a transient failure drops
        that reader, so the next attempt reopens the file over a fresh connection.
        """
        listed = self._listed(source)
        info = listed.listing.shard(shard)
        key = (source.cache_key, info.index)
        used: list[ShardReader] = []

        def attempt() -> dict[str, list[Any]]:
            used.clear()
            reader = self._get_or_open(source, listed, info)
            used.append(reader)
            return reader.read(start, stop)

        def broken(exc: BaseException) -> None:
            if used:
                self._drop(key, used[0])

        return retry_storage(
            attempt, source=source.name, shard=info.path, action=f"reading rows [{start}, {stop})",
            policy=self.retry, on_failure=broken,
        )

    def _get_or_open(self, source: "Source", listed: _Listed, info: ShardInfo) -> ShardReader:
        key = (source.cache_key, info.index)
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
            reader = reader_class(source.format)(source, listed.fs, listed.paths[info.index], info)
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

    def _drop(self, key: tuple, reader: ShardReader) -> None:
        """Forget ``reader`` (if it is still the cached one) and close it: its connection broke."""
        with self._lock:
            if self._readers.get(key) is not reader:
                return  # another thread already dropped it, or it was evicted
            del self._readers[key]
            self._dropped += 1
        try:
            reader.close()
        except Exception:  # closing a broken handle may fail too; the reader is gone either way
            logger.debug("closing a dropped reader of %s failed", reader.shard.path, exc_info=True)

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
                dropped=self._dropped,
                relistings=self._relistings,
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
