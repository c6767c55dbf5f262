"""Messages about sources waiting on storage: what a loader worker reports, what a status shows.

* Planner -> loader worker: :class:`StorageWaitsRequest` (``mdata_storage_waits``), answered with
  the worker's current waits (:func:`mdata.sources.storage_waits`) and its cumulative count of waits
  begun per source (:func:`mdata.sources.storage_waits_begun`) as a :class:`StorageWaitsReply`;
* inside a job's status (:class:`~mdata.wire.inspection.StatusReply`): one
  :class:`StorageWaitInfo` per source, merged over the workers that reported it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mdata.sources.wait_report import SourceStorageWait
from mdata.sources.waits import StorageWait
from mdata.wire.codec import Handler, Message, Reader, Request, check_int, check_str

__all__ = ["WorkerStorageWait", "StorageWaitsRequest", "StorageWaitsReply", "StorageWaitInfo"]


@dataclass(frozen=True)
class WorkerStorageWait(Message):
    """One source waiting on storage in one worker (a :class:`~mdata.sources.StorageWait`)."""

    source: str
    since: float
    attempts: int
    last_error: str
    targets: tuple[str, ...]
    last_failed: float

    @classmethod
    def of(cls, wait: StorageWait) -> "WorkerStorageWait":
        return cls(wait.source, float(wait.since), int(wait.attempts), wait.last_error,
                   tuple(wait.targets), float(wait.last_failed))

    def wait(self) -> StorageWait:
        """The pure value again (what :func:`~mdata.sources.merge_storage_waits` reads)."""
        return StorageWait(self.source, self.since, self.attempts, self.last_error, self.targets,
                           self.last_failed)

    def to_msg(self) -> dict[str, Any]:
        return {"source": self.source, "since": self.since, "attempts": self.attempts,
                "last_error": self.last_error, "targets": list(self.targets),
                "last_failed": self.last_failed}

    @classmethod
    def from_msg(cls, msg: Any) -> "WorkerStorageWait":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("source"), r.float("since"), r.int("attempts"), r.str("last_error"),
                  r.list("targets", check_str), r.float("last_failed"))
        r.done()
        return out


@dataclass(frozen=True)
class StorageWaitsReply(Message):
    """A worker's sources waiting on storage now, sorted by source, and how many wait periods each
    source has begun in that worker so far (``begun``: cumulative, so that a poller also counts the
    outages that began and ended between two of its polls)."""

    waits: tuple[WorkerStorageWait, ...]
    begun: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, waits: dict[str, StorageWait],
           begun: dict[str, int] | None = None) -> "StorageWaitsReply":
        return cls(tuple(WorkerStorageWait.of(waits[name]) for name in sorted(waits)),
                   tuple(sorted((begun or {}).items())))

    def begun_by_source(self) -> dict[str, int]:
        return dict(self.begun)

    def to_msg(self) -> dict[str, Any]:
        return {"waits": [w.to_msg() for w in self.waits], "begun": dict(self.begun)}

    @classmethod
    def from_msg(cls, msg: Any) -> "StorageWaitsReply":
        r = Reader(cls.__name__, msg)
        out = cls(r.list("waits", lambda v, _r, _f: WorkerStorageWait.from_msg(v)),
                  tuple(sorted(r.mapping("begun", check_int).items())))
        r.done()
        return out


@dataclass(frozen=True)
class StorageWaitsRequest(Request):
    """Which sources of this worker wait on storage now (served by every mdata worker)."""

    handler = Handler.STORAGE_WAITS
    reply = StorageWaitsReply

    def to_msg(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_msg(cls, msg: Any) -> "StorageWaitsRequest":
        Reader(cls.__name__, msg).done()
        return cls()


@dataclass(frozen=True)
class StorageWaitInfo(Message):
    """A source of a job waiting on storage, as a status reports it: since when (wall clock),
    how long so far, failed attempts over every worker, the latest error, and where."""

    since: float
    waited_s: float
    attempts: int
    last_error: str
    workers: tuple[str, ...]
    targets: tuple[str, ...]

    @classmethod
    def of(cls, wait: SourceStorageWait, now: float | None = None) -> "StorageWaitInfo":
        """``wait`` with ``waited_s`` as of ``now`` (wall clock; default: now)."""
        return cls(float(wait.since), float(wait.waited_s(now)), int(wait.attempts), wait.last_error,
                   tuple(wait.workers), tuple(wait.targets))

    def to_msg(self) -> dict[str, Any]:
        return {"since": self.since, "waited_s": self.waited_s, "attempts": self.attempts,
                "last_error": self.last_error, "workers": list(self.workers),
                "targets": list(self.targets)}

    @classmethod
    def from_msg(cls, msg: Any) -> "StorageWaitInfo":
        r = Reader(cls.__name__, msg)
        out = cls(r.float("since"), r.float("waited_s"), r.int("attempts"), r.str("last_error"),
                  r.list("workers", check_str), r.list("targets", check_str))
        r.done()
        return out


def read_storage_wait(value: Any, r: Reader, name: str) -> StorageWaitInfo:
    """An item reader for a status's ``storage_waits`` mapping."""
    return StorageWaitInfo.from_msg(value)
