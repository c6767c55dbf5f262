"""Shard listing: expand a source's URL into sorted shards with their row counts.

The listing is the source's coordinate system: shard ``i`` is the ``i``-th path in sorted order, so
sample ids ``(source, shard, row)`` mean the same thing in every process and every run (as long as
the files do not change). Row counts come from Parquet footers (a few KB per file, read in parallel
threads, since remote footers are latency-bound), never from reading data pages. JSONL has no
footer: its rows are counted by scanning the file for line breaks, which reads the whole file.

Listing is the first storage touch of a job (at registration), so every failure here becomes an
:class:`~mdata.errors.MdataError` naming the source and its URL or shard, and an unreachable store
is waited out (:mod:`mdata.sources.retry`) before it is reported as
:class:`~mdata.errors.StorageUnavailableError`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Mapping

import fsspec

from mdata.distribution import install_hint
from mdata.errors import CorruptShardError, MdataError, SourceError, SourceNotFoundError
from mdata.sources.endpoints import endpoint_of, has_answered, mark_answered, never_answered_error
from mdata.sources.faults import storage_failure
from mdata.sources.readers import reader_class
from mdata.sources.retry import RetryPolicy, retry_storage
from mdata.sources.shards import ShardInfo, SourceListing
from mdata.sources.spec import Format

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from mdata.sources.spec import Source

__all__ = ["ShardInfo", "SourceListing", "list_shards", "list_shards_resolved", "resolve_shard_paths",
           "shard_names"]

#: Threads reading footers / counting lines at once (remote stores are latency-bound).
_LIST_THREADS = 16


def _has_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def _copy_options(value: Any) -> Any:
    """A copy of the storage options' dicts and lists (leaves shared): clients mutate what they get.

    botocore rewrites ``config_kwargs={"retries": {...}}`` in place; the Source's own mapping must
    stay as written, since it is part of the source's identity (``Source.cache_key``).
    """
    if isinstance(value, Mapping):
        return {k: _copy_options(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_options(v) for v in value]
    return value


def resolve_shard_paths(
    source: "Source", *, retry: RetryPolicy | None = None
) -> tuple["AbstractFileSystem", list[str]]:
    """The filesystem and the sorted (protocol-less) paths of the source's shards.

    Raises :class:`SourceNotFoundError` when nothing matches, :class:`StorageUnavailableError` when
    the store stays unreachable past ``retry``'s deadline (``mdata.storage.*`` by default), and
    :class:`StorageEndpointError` when an endpoint that never answered in this process refuses
    every connection for ``retry.first_contact`` (:mod:`mdata.sources.endpoints`).
    """
    retry = retry if retry is not None else RetryPolicy.from_config()
    hint = (
        "check the URL and storage_options; a glob looks like "
        f"'s3://bucket/prefix/*{source.format.suffixes[0]}'"
    )
    try:
        fs, path = fsspec.core.url_to_fs(source.url, **_copy_options(source.storage_options or {}))
    except Exception as exc:  # unknown protocol, missing package, bad storage_options
        if isinstance(exc, ImportError) and source.url.startswith(("s3://", "s3a://")):
            hint = f"s3:// needs s3fs, the s3 extra: {install_hint('s3')}"
        raise SourceError(
            f"cannot open URL {source.url!r}: {type(exc).__name__}: {exc}", source=source.name, hint=hint
        ) from exc

    def expand() -> list[str]:
        try:
            if _has_glob(path):
                return [p for p in fs.glob(path) if not fs.isdir(p)]
            if fs.isdir(path):
                return [p for p in fs.find(path) if p.endswith(source.format.suffixes)]
            return [path] if fs.exists(path) else []
        except FileNotFoundError:
            return []

    action = f"listing {source.url!r}"
    endpoint = endpoint_of(source.url, source.storage_options)
    first = None  # a first contact: an endpoint that never answers is a configuration error
    if not has_answered(endpoint):
        def first(exc: BaseException, waited: float, attempts: int) -> Exception:
            return never_answered_error(source, endpoint, exc, waited, attempts)
    try:
        paths = retry_storage(expand, source=source.name, shard=None, action=action, policy=retry,
                              never_answered=first)
        mark_answered(endpoint)
    except MdataError:
        raise
    except Exception as exc:  # denied, or a permanent answer of the store: never raw botocore
        raise storage_failure(exc, source=source.name, shard=None, action=action) from exc
    if not paths:
        raise SourceNotFoundError(
            f"no {source.format.value} files match {source.url!r}", source=source.name, hint=hint
        )
    return fs, sorted(paths)


def list_shards(source: "Source", *, retry: RetryPolicy | None = None) -> SourceListing:
    """List ``source``'s shards sorted by path, with row counts from footers (or line counts).

    Storage outages are waited out under ``retry`` (``mdata.storage.*`` by default); every failure
    is an :class:`~mdata.errors.MdataError` naming the source and its URL or shard.
    """
    return list_shards_resolved(source, retry=retry)[0]


def list_shards_resolved(
    source: "Source", *, retry: RetryPolicy | None = None
) -> tuple[SourceListing, "AbstractFileSystem", list[str]]:
    """:func:`list_shards` plus the filesystem and protocol-less paths that readers open."""
    retry = retry if retry is not None else RetryPolicy.from_config()
    try:
        return _list(source, retry)
    except MdataError:
        raise
    except Exception as exc:  # a failure no branch below foresaw: still name the source and URL
        raise SourceError(
            f"cannot list {source.url!r}: {type(exc).__name__}: {exc}", source=source.name,
            hint="check the URL and storage_options",
        ) from exc


def _list(source: "Source", retry: RetryPolicy) -> tuple[SourceListing, "AbstractFileSystem", list[str]]:
    fs, paths = resolve_shard_paths(source, retry=retry)
    count = reader_class(source.format).count_rows
    quarantined: dict[str, str] = {}

    def one(path: str) -> int:
        try:
            return counted(path)
        except CorruptShardError as exc:
            if getattr(source, "on_corrupt", "fail") != "skip":
                raise
            quarantined[path] = f"{type(exc).__name__}: {exc.message}"
            return 0  # on_corrupt="skip": listed with no rows, so no step ever reads it

    def counted(path: str) -> int:
        url = fs.unstrip_protocol(path)
        action = {Format.PARQUET: "reading the Parquet footer", Format.JSONL: "counting the lines"}.get(
            source.format, "listing the clip file")
        try:
            return retry_storage(
                lambda: count(fs, path, source=source.name, url=url),
                source=source.name, shard=url, action=action, policy=retry,
            )
        except MdataError:
            raise
        except FileNotFoundError as exc:
            raise SourceNotFoundError(
                "shard disappeared while the source was being listed",
                source=source.name, shard=url, hint="list again once the files stop changing",
            ) from exc
        except Exception as exc:
            raise storage_failure(exc, source=source.name, shard=url, action=action) from exc

    if len(paths) == 1:
        counts = [one(paths[0])]
    else:
        pool = ThreadPoolExecutor(min(_LIST_THREADS, len(paths)), thread_name_prefix="mdata-list")
        try:
            counts = list(pool.map(one, paths))
        finally:  # on a failure, shards not yet started are not counted (nor waited for)
            pool.shutdown(wait=True, cancel_futures=True)
    shards = tuple(
        ShardInfo(index=i, path=fs.unstrip_protocol(p), num_rows=n)
        for i, (p, n) in enumerate(zip(paths, counts))
    )
    skipped = tuple((i, quarantined[p]) for i, p in enumerate(paths) if p in quarantined)
    return SourceListing(source=source.name, shards=shards, quarantined=skipped), fs, paths


def shard_names(fs: "AbstractFileSystem", url: str, paths: list[str]) -> list[str]:
    """The shards' names relative to the source's URL (a glob's fixed prefix, a folder, a file's
    folder): what registration reports, so a listing says what the data is and the URL where it
    lives, and a checkpoint names either change."""
    root = _listing_root(fs._strip_protocol(url), paths)
    return [_relative(path, root) for path in paths]


def _listing_root(url_path: str, paths: list[str]) -> str:
    glob = min((i for i, c in enumerate(url_path) if c in "*?["), default=None)
    if glob is not None:
        return url_path[:glob].rsplit("/", 1)[0]
    if paths == [url_path]:
        return url_path.rsplit("/", 1)[0]
    return url_path.rstrip("/")


def _relative(path: str, root: str) -> str:
    return path[len(root):].lstrip("/") if root and path.startswith(root + "/") else path
