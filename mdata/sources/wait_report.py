"""Storage waits of a whole pool: merge what each loader worker reports, and say it in one line.

Each loader worker knows only its own waits (:func:`mdata.sources.storage_waits`). An operator asks
about a source: is it waiting on storage, since when, how hard has it tried, what went wrong last,
and on which workers. :func:`merge_storage_waits` answers that from the per-worker reports the
Planner collects (see ``scheduler_plugins/storage_poll.py``): per source, the earliest ``since``
(the outage began with the first worker that noticed it), the attempts of every worker summed, the
most recent worker's last error, and the workers and targets involved. :func:`describe_storage_wait`
is the sentence the dashboard and the trainers' log print.

Pure: plain values in, plain values out; the caller passes the clock where one is needed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mdata.sources.waits import StorageWait

__all__ = ["SourceStorageWait", "merge_storage_waits", "describe_storage_wait"]

#: Longest last error a description quotes (a botocore message with its URL fits).
ERROR_CHARS = 200


@dataclass(frozen=True)
class SourceStorageWait:
    """One source waiting on storage, over every worker that reported it.

    Attributes:
        source: the source's name.
        since: wall-clock time (``time.time()``) of the earliest ongoing wait of any worker.
        attempts: failed attempts so far, summed over the workers.
        last_error: the most recent error of any worker (the latest ``last_failed``).
        last_failed: wall-clock time of that error.
        workers: the workers reporting the wait, sorted.
        targets: shard URLs (or the source's URL while listing) waited on, sorted.
    """

    source: str
    since: float
    attempts: int
    last_error: str
    workers: tuple[str, ...]
    targets: tuple[str, ...]
    last_failed: float = 0.0

    def waited_s(self, now: float | None = None) -> float:
        """Seconds from :attr:`since` to ``now`` (wall clock; default: now)."""
        return max(0.0, (time.time() if now is None else float(now)) - self.since)

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        """Plain values (for JSON and status replies), with ``waited_s`` as of ``now``."""
        return {
            "source": self.source,
            "since": self.since,
            "waited_s": self.waited_s(now),
            "attempts": self.attempts,
            "last_error": self.last_error,
            "workers": list(self.workers),
            "targets": list(self.targets),
            "last_failed": self.last_failed,
        }


def merge_storage_waits(
    by_worker: Mapping[str, Iterable[StorageWait] | Mapping[str, StorageWait]],
) -> dict[str, SourceStorageWait]:
    """Merge per-worker storage waits into one wait per source, sorted by source name.

    ``by_worker`` maps a worker's address to its waits (a list of :class:`StorageWait`, or the
    dict :func:`~mdata.sources.storage_waits` returns). A worker that reports nothing adds
    nothing; a source no worker waits for is absent.

    ``last_error`` is the error of the most recent failed attempt of any worker (wall clocks of
    one cluster agree well enough for that); ties go to the larger address, so the result never
    depends on dict order.
    """
    grouped: dict[str, list[tuple[str, StorageWait]]] = {}
    for worker, waits in by_worker.items():
        for wait in (waits.values() if isinstance(waits, Mapping) else waits):
            grouped.setdefault(wait.source, []).append((str(worker), wait))
    out: dict[str, SourceStorageWait] = {}
    for source in sorted(grouped):
        entries = grouped[source]
        _, latest = max(entries, key=lambda e: (e[1].last_failed, e[0]))
        out[source] = SourceStorageWait(
            source=source,
            since=min(w.since for _, w in entries),
            attempts=sum(int(w.attempts) for _, w in entries),
            last_error=latest.last_error,
            last_failed=latest.last_failed,
            workers=tuple(sorted({worker for worker, _ in entries})),
            targets=tuple(sorted({t for _, w in entries for t in w.targets})),
        )
    return out


def describe_storage_wait(since: float, attempts: int, last_error: str, *,
                          local_time: bool = True) -> str:
    """``"waiting on storage since 14:03:07 (12 attempts, last error EndpointConnectionError: ...)"``.

    ``since`` is a wall-clock time, shown as local time (UTC when ``local_time`` is false); the
    error is cut to :data:`ERROR_CHARS` characters.
    """
    clock = time.strftime("%H:%M:%S", time.localtime(since) if local_time else time.gmtime(since))
    error = last_error if len(last_error) <= ERROR_CHARS else last_error[: ERROR_CHARS - 3] + "..."
    plural = "" if attempts == 1 else "s"
    return f"waiting on storage since {clock} ({attempts} attempt{plural}, last error {error})"
