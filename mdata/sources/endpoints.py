"""Storage endpoints: which one a source talks to, and whether it has ever answered.

A wrong ``endpoint_url`` (or a server that is not running) fails exactly like an outage: the
connection is refused. Waiting it out for ``mdata.storage.retry-deadline`` (minutes) would leave a
registering trainer with no answer, so a source's *first* contact is judged differently: while
its endpoint has never answered in this process and every attempt failed to connect, the listing
gives up after ``mdata.storage.first-contact-deadline`` with :class:`StorageEndpointError`, a
configuration error naming the source and the endpoint. Once an endpoint has answered, a later
refusal is an outage and is waited out in full (:mod:`mdata.sources.retry`).
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Mapping
from urllib.parse import urlsplit

from mdata.errors import StorageEndpointError

if TYPE_CHECKING:
    from mdata.sources.spec import Source

__all__ = ["endpoint_of", "has_answered", "mark_answered", "never_answered_error"]

_answered: set[str] = set()  # endpoints that answered at least once in this process
_lock = threading.Lock()


def endpoint_of(url: str, storage_options: Mapping[str, Any] | None) -> str:
    """The endpoint a source's storage calls go to, as a readable string: the ``endpoint_url``
    of its storage options (top level or under ``client_kwargs``), else the URL's host, else
    the protocol's default (``s3 (the default AWS endpoint)``)."""
    options = storage_options or {}
    client_kwargs = options.get("client_kwargs") or {}
    explicit = options.get("endpoint_url") or (client_kwargs.get("endpoint_url")
                                                if isinstance(client_kwargs, Mapping) else None)
    if explicit:
        return str(explicit)
    parts = urlsplit(url)
    protocol = parts.scheme or "file"
    if protocol in ("http", "https"):
        return f"{protocol}://{parts.netloc}"
    if protocol in ("s3", "s3a") and os.environ.get("AWS_ENDPOINT_URL"):
        return os.environ["AWS_ENDPOINT_URL"]
    return f"{protocol} (the default {protocol} endpoint)" if protocol != "file" else "local files"


def has_answered(endpoint: str) -> bool:
    """Whether ``endpoint`` has answered a storage call of this process before."""
    with _lock:
        return endpoint in _answered


def mark_answered(endpoint: str) -> None:
    """Note that ``endpoint`` answered: from now on its failures are outages to wait out."""
    with _lock:
        _answered.add(endpoint)


def never_answered_error(source: "Source", endpoint: str, exc: BaseException, waited: float,
                         attempts: int) -> StorageEndpointError:
    """The error of a source whose endpoint refused every connection since the first attempt."""
    detail = f"{type(exc).__name__}: {exc}"
    if len(detail) > 400:
        detail = detail[:397] + "..."
    return StorageEndpointError(
        f"storage endpoint {endpoint} has never answered while listing {source.url!r} "
        f"({attempts} attempt{'s' if attempts != 1 else ''} over {waited:.1f}s; last error: {detail})",
        source=source.name, endpoint=endpoint,
        hint="a configuration error, not an outage: check endpoint_url in the source's "
        "storage_options and that the storage server runs and is reachable from the loader workers; "
        "to wait longer for a first answer raise mdata.storage.first-contact-deadline",
    )
