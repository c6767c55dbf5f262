"""Storage faults: tell an outage (wait it out) from a missing, forbidden or corrupt file (report it).

A storage client raises many exception types for the same few situations. s3fs over aiobotocore
raises botocore's ``EndpointConnectionError`` when nothing listens at the endpoint,
``ConnectTimeoutError`` / ``ReadTimeoutError`` on timeouts, ``ConnectionClosedError`` when the
server drops a connection; it turns S3 error responses into Python ones (``NoSuchKey`` ->
``FileNotFoundError``, ``AccessDenied`` -> ``PermissionError``, ``SlowDown`` / 503 ->
``OSError(EBUSY)``, 500 -> ``OSError(EREMOTEIO)``) with the botocore ``ClientError`` as the cause.
fsspec's HTTP filesystem raises aiohttp's errors; local and NFS files raise ``OSError`` with an
errno; pyarrow passes a Python file's exception through unchanged. :func:`classify` maps all of
them to a :class:`Fault`, walking the exception's cause chain, so that the retry loop
(:mod:`mdata.sources.retry`) retries only what can heal by itself, and readers blame a file's bytes
(``CorruptShardError``) only when storage answered fine.

Optional libraries are looked up in ``sys.modules`` instead of being imported: an exception of
botocore's can only exist once botocore is loaded, and classifying never pays for an import.
"""

from __future__ import annotations

import errno
import socket
import sys
from enum import Enum
from typing import Any, Iterator

from mdata.errors import MdataError, SourceError, SourceNotFoundError

__all__ = ["Fault", "classify", "is_transient", "is_unreached", "storage_failure"]


class Fault(str, Enum):
    """What a storage exception means for the caller."""

    #: Unreachable, timed out, dropped or throttled (5xx, 429, SlowDown): wait and try again.
    TRANSIENT = "transient"
    #: The file, key or bucket does not exist.
    NOT_FOUND = "not_found"
    #: Access denied or no usable credentials.
    DENIED = "denied"
    #: The store answered with a permanent error (bad request, TLS/certificate, an I/O error).
    STORAGE = "storage"
    #: Not a storage failure at all: for a reader, the bytes it got do not parse (or a bug).
    OTHER = "other"


#: errno values of network and remote-filesystem failures that heal by themselves.
TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "ETIMEDOUT", "EHOSTUNREACH", "ENETUNREACH",
        "ENETDOWN", "ENETRESET", "EHOSTDOWN", "EPIPE", "EAGAIN",
    )
    if hasattr(errno, name)
)

#: Error codes of S3-compatible services that mean "slow down" or "try again" (botocore's own
#: retry handler's throttled and transient lists, plus the 5xx codes S3 documents).
RETRYABLE_CODES = frozenset({
    "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "RequestTimeoutException",
    "PriorRequestNotComplete", "Throttling", "ThrottlingException", "ThrottledException",
    "RequestThrottled", "RequestThrottledException", "TooManyRequestsException",
    "RequestLimitExceeded", "BandwidthLimitExceeded", "ProvisionedThroughputExceededException",
    "TransactionInProgressException", "EC2ThrottledException", "500", "502", "503", "504", "429",
})
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NoSuchVersion", "NotFound", "404"})
DENIED_CODES = frozenset({
    "AccessDenied", "AllAccessDisabled", "InvalidAccessKeyId", "SignatureDoesNotMatch",
    "ExpiredToken", "InvalidToken", "AccountProblem", "403", "401",
})
#: HTTP statuses worth waiting for: request timeout, too many requests, and server-side 5xx.
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its cause (or implicit context), and so on; each exception once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def _by_status(code: Any, status: Any) -> Fault:
    code = str(code) if code is not None else ""
    if code in RETRYABLE_CODES or status in RETRYABLE_STATUSES:
        return Fault.TRANSIENT
    if code in NOT_FOUND_CODES or status == 404:
        return Fault.NOT_FOUND
    if code in DENIED_CODES or status in (401, 403):
        return Fault.DENIED
    return Fault.STORAGE


def _botocore(exc: BaseException) -> Fault | None:
    mod = sys.modules.get("botocore.exceptions")
    if mod is None:
        return None
    if isinstance(exc, mod.ClientError):
        response = getattr(exc, "response", None) or {}
        return _by_status(
            response.get("Error", {}).get("Code"),
            response.get("ResponseMetadata", {}).get("HTTPStatusCode"),
        )
    if isinstance(exc, mod.SSLError):
        return Fault.STORAGE
    # EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError (ConnectionError);
    # ConnectionClosedError, ReadTimeoutError, ResponseStreamingError (HTTPClientError).
    if isinstance(exc, (mod.ConnectionError, mod.HTTPClientError, mod.IncompleteReadError)):
        return Fault.TRANSIENT
    if isinstance(exc, (mod.NoCredentialsError, mod.PartialCredentialsError, mod.CredentialRetrievalError)):
        return Fault.DENIED
    if isinstance(exc, mod.BotoCoreError):
        return Fault.STORAGE
    parsers = sys.modules.get("botocore.parsers")
    if parsers is not None and isinstance(exc, parsers.ResponseParserError):
        return Fault.TRANSIENT  # throttling responses sometimes carry invalid XML (s3fs retries these too)
    return None


def _aiohttp(exc: BaseException) -> Fault | None:
    mod = sys.modules.get("aiohttp")
    if mod is None:
        return None
    if isinstance(exc, (mod.ClientSSLError, mod.ServerFingerprintMismatch)):
        return Fault.STORAGE
    if isinstance(exc, (mod.ClientConnectionError, mod.ClientPayloadError)):
        return Fault.TRANSIENT
    if isinstance(exc, mod.ClientResponseError):
        return _by_status(None, exc.status)
    return None


def _urllib3(exc: BaseException) -> Fault | None:
    mod = sys.modules.get("urllib3.exceptions")
    if mod is None:
        return None
    if isinstance(exc, mod.SSLError):
        return Fault.STORAGE
    if isinstance(exc, (mod.ProtocolError, mod.TimeoutError, mod.IncompleteRead, mod.InvalidChunkLength)):
        return Fault.TRANSIENT
    if isinstance(exc, mod.MaxRetryError) and isinstance(exc.reason, BaseException):
        return classify(exc.reason)
    return None


def _files(exc: BaseException) -> Fault | None:
    if isinstance(exc, MdataError):
        return Fault.OTHER  # already explained by mdata (e.g. a StorageUnavailableError): never retried again
    if isinstance(exc, FileNotFoundError):
        return Fault.NOT_FOUND
    if isinstance(exc, PermissionError):
        return Fault.DENIED
    return None


def _network(exc: BaseException) -> Fault | None:
    # ConnectionRefusedError/ResetError/AbortedError, BrokenPipeError; socket.timeout, asyncio's and
    # fsspec's timeouts are TimeoutError; socket.gaierror is a failed DNS lookup.
    if isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror)):
        return Fault.TRANSIENT
    if isinstance(exc, OSError) and exc.errno is not None:
        return Fault.TRANSIENT if exc.errno in TRANSIENT_ERRNOS else None
    return None


def _one(exc: BaseException) -> Fault | None:
    # Library checks come before the generic errno test: aiohttp's TLS failures are OSErrors too.
    for check in (_files, _botocore, _aiohttp, _urllib3, _network):
        fault = check(exc)
        if fault is not None:
            return fault
    return None


def classify(exc: BaseException) -> Fault:
    """What ``exc`` means: the first decisive exception along its cause chain decides.

    s3fs re-raises S3 errors as plain ``OSError``s caused by botocore's ``ClientError``, so a generic
    ``OSError`` defers to its cause. An ``OSError`` carrying a non-network errno (e.g. ``EIO`` from a
    disk) is a permanent :attr:`Fault.STORAGE`; one without errno (what pyarrow raises for thrift it
    cannot decode) is :attr:`Fault.OTHER`.
    """
    fallback = Fault.OTHER
    for link in _chain(exc):
        fault = _one(link)
        if fault is not None:
            return fault
        if isinstance(link, OSError) and link.errno is not None and fallback is Fault.OTHER:
            fallback = Fault.STORAGE
    return fallback


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is an outage worth waiting out (see :attr:`Fault.TRANSIENT`)."""
    return classify(exc) is Fault.TRANSIENT


#: errno values that mean no connection was ever made (nothing listens, no route to the host).
UNREACHED_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "EHOSTDOWN", "ENETDOWN")
    if hasattr(errno, name)
)


def _unreached_one(exc: BaseException) -> bool:
    boto = sys.modules.get("botocore.exceptions")
    # EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError: no connection was made
    if boto is not None and isinstance(exc, boto.ConnectionError):
        return True
    aio = sys.modules.get("aiohttp")
    if aio is not None and isinstance(exc, aio.ClientConnectorError) and not isinstance(exc, aio.ClientSSLError):
        return True
    if isinstance(exc, (ConnectionRefusedError, socket.gaierror)):
        return True
    return isinstance(exc, OSError) and exc.errno in UNREACHED_ERRNOS


def is_unreached(exc: BaseException) -> bool:
    """Whether ``exc`` says the storage endpoint was never reached: refused, not resolved, no
    route, connect timed out. Such a failure cannot tell a wrong endpoint from one that is down;
    dropped connections, read timeouts and 5xx answers all prove that something answered."""
    return any(_unreached_one(link) for link in _chain(exc))


def storage_failure(exc: BaseException, *, source: str, shard: str | None, action: str) -> SourceError:
    """The mdata error for a storage exception that waiting will not fix.

    ``action`` says what was being done, e.g. ``"listing 's3://bucket/web/*.parquet'"``.
    """
    detail = f"{type(exc).__name__}: {exc}"
    fault = classify(exc)
    if fault is Fault.NOT_FOUND:
        return SourceNotFoundError(
            f"not found while {action}: {detail}", source=source, shard=shard,
            hint="check the URL; shards must not change while a job runs",
        )
    if fault is Fault.DENIED:
        return SourceError(
            f"access denied while {action}: {detail}", source=source, shard=shard,
            hint="check the credentials in storage_options or the workers' environment",
        )
    return SourceError(
        f"storage error while {action}: {detail}", source=source, shard=shard,
        hint="check the URL, the storage_options and the storage service",
    )
