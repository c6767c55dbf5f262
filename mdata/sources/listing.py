"""Shard listing: expand a source's URL into sorted shards with their row counts.

The listing is the source's coordinate system: shard ``i`` is the ``i``-th path in sorted order, so
sample ids ``(source, shard, row)`` mean the same thing in every process and every run (as long as
the files do not change). Row counts come from Parquet footers (a few KB per file, read in parallel
threads, since remote footers are latency-bound), never from reading data pages. JSONL has no
footer: its rows are counted by scanning the file for line breaks, which reads the whole file.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import fsspec

from mdata.errors import SourceError, SourceNotFoundError
from mdata.sources.readers import reader_class
from mdata.sources.shards import ShardInfo, SourceListing

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from mdata.sources.spec import Source

__all__ = ["ShardInfo", "SourceListing", "list_shards", "list_shards_resolved", "resolve_shard_paths"]

#: Threads reading footers / counting lines at once (remote stores are latency-bound).
_LIST_THREADS = 16


def _has_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def resolve_shard_paths(source: "Source") -> tuple["AbstractFileSystem", list[str]]:
    """The filesystem and the sorted (protocol-less) paths of the source's shards.

    Raises :class:`SourceNotFoundError` when nothing matches.
    """
    hint = (
        "check the URL and storage_options; a glob looks like "
        f"'s3://bucket/prefix/*{source.format.suffixes[0]}'"
    )
    try:
        fs, path = fsspec.core.url_to_fs(source.url, **dict(source.storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise SourceError(
            f"cannot open URL {source.url!r}: {exc}", source=source.name, hint=hint
        ) from exc
    try:
        if _has_glob(path):
            paths = [p for p in fs.glob(path) if not fs.isdir(p)]
        elif fs.isdir(path):
            paths = [p for p in fs.find(path) if p.endswith(source.format.suffixes)]
        elif fs.exists(path):
            paths = [path]
        else:
            paths = []
    except FileNotFoundError:
        paths = []
    except PermissionError as exc:
        raise SourceError(
            f"access denied listing {source.url!r}: {exc}",
            source=source.name,
            hint="check credentials in storage_options or the environment",
        ) from exc
    if not paths:
        raise SourceNotFoundError(
            f"no {source.format.value} files match {source.url!r}", source=source.name, hint=hint
        )
    return fs, sorted(paths)


def list_shards(source: "Source") -> SourceListing:
    """List ``source``'s shards sorted by path, with row counts from footers (or line counts)."""
    return list_shards_resolved(source)[0]


def list_shards_resolved(
    source: "Source",
) -> tuple[SourceListing, "AbstractFileSystem", list[str]]:
    """:func:`list_shards` plus the filesystem and protocol-less paths that readers open."""
    fs, paths = resolve_shard_paths(source)
    count = reader_class(source.format).count_rows

    def one(path: str) -> int:
        url = fs.unstrip_protocol(path)
        try:
            return count(fs, path, source=source.name, url=url)
        except FileNotFoundError as exc:
            raise SourceNotFoundError(
                "shard disappeared while the source was being listed",
                source=source.name, shard=url, hint="list again once the files stop changing",
            ) from exc

    if len(paths) == 1:
        counts = [one(paths[0])]
    else:
        with ThreadPoolExecutor(min(_LIST_THREADS, len(paths)), thread_name_prefix="mdata-list") as ex:
            counts = list(ex.map(one, paths))
    shards = tuple(
        ShardInfo(index=i, path=fs.unstrip_protocol(p), num_rows=n)
        for i, (p, n) in enumerate(zip(paths, counts))
    )
    return SourceListing(source=source.name, shards=shards), fs, paths
