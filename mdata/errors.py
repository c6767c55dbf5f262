"""Typed errors of mdata.

Every error that concerns data names where it came from (source, shard, row) and says what to do
next, so a failure on a 1,000-GPU job can be traced to one file and one row. Errors are plain
exceptions that pickle cleanly, so they travel from Dask workers to the Planner and to trainers.
"""

from __future__ import annotations

__all__ = [
    "MdataError",
    "MessageError",
    "NoHandlerError",
    "InvalidRequestError",
    "SourceError",
    "SourceNotFoundError",
    "UnknownFormatError",
    "CorruptShardError",
    "StorageUnavailableError",
    "StorageEndpointError",
    "SchemaError",
    "SampleError",
    "ImageDecodeError",
    "VideoDecodeError",
    "VideoLimitError",
    "SkipBudgetExceededError",
    "InvalidSourceError",
    "UntrustedSourceError",
    "RowRangeError",
    "ListingChangedError",
    "RowTooLargeError",
    "TransformConfigError",
    "PlanError",
    "MeshError",
    "NoPoolError",
    "CheckpointError",
    "TrainerError",
    "TrainerTimeoutError",
    "SchedulerLostError",
    "RequestTimeoutError",
    "StaleGenerationError",
    "RankTakenError",
    "ResumeMismatchError",
    "CallerRefusedError",
    "BatchError",
    "ExampleDataError",
    "MaterialNotFoundError",
    "PackageShadowedError",
    "SampleNotPlannedError",
    "UnmixedSourceWarning",
]


class MdataError(Exception):
    """Base class of every error raised by mdata."""


class SourceError(MdataError):
    """A problem with one source's data; names the source and, when known, the shard and row.

    ``shard`` is the shard's path (or index when the path is unknown); ``row`` the row inside it.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str,
        shard: str | int | None = None,
        row: int | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.source = source
        self.shard = shard
        self.row = row
        self.hint = hint
        where = f"source {source!r}"
        if shard is not None:
            where += f", shard {shard!r}"
        if row is not None:
            where += f", row {row}"
        text = f"{where}: {message}"
        if hint:
            text += f" ({hint})"
        super().__init__(text)

    def __reduce__(self):  # keep keyword-only arguments across pickling
        return (
            _rebuild_source_error,
            (type(self), self.message, self.source, self.shard, self.row, self.hint),
            _notes(self),
        )


def _notes(exc: BaseException) -> dict | None:
    """The notes of ``exc`` as pickle state (restored by ``BaseException.__setstate__``): a
    worker's error reaches the scheduler pickled, with what was noted on the way, e.g. the DP
    group a construct task was building."""
    notes = getattr(exc, "__notes__", None)
    return {"__notes__": list(notes)} if notes else None


def _rebuild_source_error(cls, message, source, shard, row, hint):
    return cls(message, source=source, shard=shard, row=row, hint=hint)


class SourceNotFoundError(SourceError):
    """The source's URL or glob matched no file."""


class UnknownFormatError(SourceError):
    """The source declares a format mdata cannot read."""


class CorruptShardError(SourceError):
    """A shard cannot be parsed (truncated, not Parquet, bad JSON line...).

    Raised only when storage delivered the bytes and they do not parse: an unreachable or throttling
    store is waited out and, past the deadline, is a :class:`StorageUnavailableError` instead.
    """


class RowTooLargeError(CorruptShardError):
    """A row is larger than a reader hands to a transform: a JSONL line over
    ``mdata.sources.max-line-bytes`` or a cell over ``mdata.sources.max-cell-bytes``."""


class StorageUnavailableError(SourceError):
    """Storage stayed unreachable (refused, timed out, throttled, 5xx) past the retry deadline.

    The message names the shard (or the URL being listed), how long mdata waited, over how many
    attempts, and the last underlying error. The data is not at fault: check the endpoint, the
    network and the credentials, or raise ``mdata.storage.retry-deadline`` to wait out longer outages.
    """


class StorageEndpointError(SourceError):
    """A source's storage endpoint has never answered (nothing listens, no such host): a wrong
    ``endpoint_url`` or a server that is not running, so a configuration error, reported at
    registration within ``mdata.storage.first-contact-deadline`` instead of being waited out as an
    outage. ``endpoint`` names the endpoint mdata tried. An endpoint that answered once and then
    went away is an outage (:class:`StorageUnavailableError`, after the retry deadline).
    """

    def __init__(self, message: str, *, source: str, endpoint: str | None = None,
                 shard: str | int | None = None, row: int | None = None, hint: str | None = None) -> None:
        self.endpoint = endpoint
        super().__init__(message, source=source, shard=shard, row=row, hint=hint)

    def __reduce__(self):
        return (_rebuild_endpoint_error,
                (type(self), self.message, self.source, self.endpoint, self.shard, self.hint),
                _notes(self))


def _rebuild_endpoint_error(cls, message, source, endpoint, shard, hint):
    return cls(message, source=source, endpoint=endpoint, shard=shard, hint=hint)


class SchemaError(SourceError):
    """A declared field is missing from a shard or has the wrong type."""


class SampleError(SourceError):
    """A transform failed on one sample; may be skipped under the source's skip tolerance."""


class ImageDecodeError(SampleError):
    """An image could not be decoded, or exceeds the pixel limit."""


class VideoDecodeError(SampleError, CorruptShardError):
    """A video clip does not open or decode (truncated, not a container, no video stream).

    A sample error, so a source's ``skip_tolerance`` may skip it; raised (tolerance 0) it is a
    :class:`CorruptShardError`, so the source's ``on_corrupt="skip"`` quarantines its chunk."""


class VideoLimitError(VideoDecodeError):
    """A video clip is over one of its transform's bounds (bytes, seconds, pixels per frame,
    frames sampled), found from the container's header before any frame is decoded."""


class SkipBudgetExceededError(SourceError):
    """More samples failed than the source's skip tolerance allows."""


class InvalidSourceError(SourceError, ValueError):
    """A Source spec is invalid: bad name, chunk size, tolerance, fields, or a tokenizer not found."""


class UntrustedSourceError(InvalidSourceError):
    """A loader worker refused what a source of a plan names: a transform outside the workers'
    trust list, a URL protocol outside their allow-list, or a storage option that names local
    credentials (see ``mdata.workers.*`` and docs/deploying.md). ``field`` names the part of the
    source at fault (``transform``, ``url``, ``storage_options.profile``...)."""

    def __init__(self, message: str, *, source: str, field: str | None = None,
                 shard: str | int | None = None, row: int | None = None, hint: str | None = None) -> None:
        self.field = field
        super().__init__(message, source=source, shard=shard, row=row, hint=hint)

    def __reduce__(self):  # keep the field across pickling too
        return (_rebuild_untrusted, (type(self), self.message, self.source, self.field, self.hint),
                _notes(self))


def _rebuild_untrusted(cls, message, source, field, hint):
    return cls(message, source=source, field=field, hint=hint)


class RowRangeError(SourceError, IndexError):
    """A requested shard index or row range lies outside the source's listing."""


class ListingChangedError(SourceError):
    """A shard a job reads is no longer what the job listed (renamed, rewritten, removed, or a
    shard inserted before it): only shards appended after every known one may come while a job
    reads a source."""


class TransformConfigError(MdataError, ValueError):
    """A sample transform was configured with invalid arguments (checked at construction)."""


class PlanError(MdataError):
    """A plan is invalid: bad weights, unknown source, a mesh that does not divide the batch..."""


class UnmixedSourceWarning(UserWarning):
    """A plan lists a source its mixture never mentions: the source gets weight 0 and is never
    sampled. Give it a weight, or weight ``0`` to leave it out on purpose (which is silent);
    ``warnings.simplefilter("error", UnmixedSourceWarning)`` makes it an error."""


class MeshError(PlanError):
    """A device mesh or a rank coordinate is invalid for the world size."""


class NoPoolError(PlanError):
    """A plan's source has no loader worker: no worker holds its pool resource (``pool_<source>``,
    which a group's workers hold for each source of the group), so its listing and loads would
    wait forever. ``source`` and ``resource`` name what is missing."""

    def __init__(self, message: str, *, source: str | None = None, resource: str | None = None) -> None:
        self.source = source
        self.resource = resource
        super().__init__(message)


class SampleNotPlannedError(MdataError, LookupError):
    """A sample's story was asked for, but the job never planned it: it is not (yet) in any step
    the Planner apportioned, or its shard or row does not exist in the source's listing.
    ``job`` and ``sample_id`` (``source/shard/row``) name what was looked up."""

    def __init__(self, message: str, *, job: str | None = None, sample_id: str | None = None) -> None:
        self.job = job
        self.sample_id = sample_id
        super().__init__(message)


class CheckpointError(MdataError):
    """A checkpoint cannot be restored (other plan, other format version, corrupt)."""


class TrainerError(MdataError):
    """A trainer-side failure: the job failed, the rank is unknown, the cluster went away."""


class TrainerTimeoutError(TrainerError):
    """A trainer waited longer than its timeout for data."""


class SchedulerLostError(TrainerError):
    """The connection to the mdata scheduler (and the Planner in it) broke while the trainer ran;
    the message names the scheduler's address. The job's state went with it: once a cluster is
    back, restart every rank from its last checkpoint."""


class RequestTimeoutError(TrainerTimeoutError):
    """A request to the scheduler or a worker got no answer within its timeout
    (``mdata.requests.timeout``, longer for a long poll or a registration): the process is gone,
    unreachable or stuck. Names the request and the address asked."""


class StaleGenerationError(TrainerError):
    """The job was rewound (a rank resumed from a checkpoint) after this Loader attached:
    restart this rank from its checkpoint like the others."""


class RankTakenError(TrainerError):
    """Another live Loader holds this (job, rank): one rank has one Loader."""


class ResumeMismatchError(TrainerError):
    """Ranks resuming one job brought checkpoints of different steps."""


class CallerRefusedError(MdataError, PermissionError):
    """A job-changing request (``close_job``) from a client that is neither the job's driver nor
    one of its Loaders: refused, and the job runs on (mdata.planner.callers)."""


class BatchError(MdataError):
    """A batch cannot be built or split: the pieces, the assignment or the mesh disagree.

    Raised by the constructor side (``mdata.batch``) and the wire format; the message names the
    step, DP rank, micro-batch and sample at fault. It points at a Planner/constructor mismatch,
    not at bad input data, so it is never skipped.
    """


class ExampleDataError(MdataError):
    """The example corpus (``mdata data example``) cannot be built or read."""


class MaterialNotFoundError(ExampleDataError):
    """The raw material of the example corpus is missing; ``bash scripts/setup.sh`` downloads it."""


class PackageShadowedError(MdataError, ImportError):
    """Python would import another package in place of mdata's ``scheduler_plugins`` or
    ``workers`` (same name, found first); names both locations (see :mod:`mdata.distribution`)."""


class MessageError(MdataError):
    """A message between mdata processes is malformed; names the message and the field.

    It points at mismatched mdata versions between processes, or at a handler called by hand
    with wrong arguments, never at bad data.
    """


class NoHandlerError(MessageError):
    """The peer answered nothing: it has no such handler (a worker shutting down has dropped its
    handlers; a process without mdata's plugin never had them). Ask someone else."""


class InvalidRequestError(MdataError, ValueError):
    """A well-formed request whose values are out of range for its job (a rank outside the world,
    a negative step, a job that does not exist...). Raised by the handler that received it."""
