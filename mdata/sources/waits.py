"""Which sources of this process are waiting on storage right now, since when, and why.

While a storage outage is waited out (:mod:`mdata.sources.retry`), the loads of a source stall
without failing; without a record of it, a stalled job looks the same as a slow one. The retry loop
records each wait here when its first attempt fails, counts the following failures, and removes the
wait when a retry succeeds or the deadline passes. :func:`storage_waits` is the read side, for
status reports: one :class:`StorageWait` per waiting source, merged over its concurrent waits (e.g.
several shards of one bucket).

:func:`storage_waits_begun` counts, per source, the wait periods this process has begun (a period
begins when a source with no ongoing wait starts one). A reader that polls :func:`storage_waits` sees
only the waits ongoing at its poll, and misses a short outage entirely; the count is cumulative, so
the difference between two polls says how many began in between, however short they were.

The registry is per process (a loader worker) and thread-safe; a forked child starts empty.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["StorageWait", "storage_waits", "storage_waits_begun"]


@dataclass(frozen=True)
class StorageWait:
    """A source waiting on storage in this process.

    Attributes:
        source: the source's name.
        since: wall-clock time (``time.time()``) of the first failed attempt of its oldest
            ongoing wait.
        attempts: failed attempts so far, summed over its ongoing waits.
        last_error: the most recent failure, as ``"TypeName: message"``.
        targets: what is being waited on, sorted: shard URLs, or the source's URL while listing.
        last_failed: wall-clock time of the most recent failed attempt (the one ``last_error``
            describes), so that waits reported by several workers can tell whose error is newest.
    """

    source: str
    since: float
    attempts: int
    last_error: str
    targets: tuple[str, ...]
    last_failed: float = 0.0

    @property
    def waited_s(self) -> float:
        """Seconds since :attr:`since`."""
        return max(0.0, time.time() - self.since)

    def to_dict(self) -> dict[str, Any]:
        """Plain values (for JSON, msgpack, status reports)."""
        return {
            "source": self.source,
            "since": self.since,
            "waited_s": self.waited_s,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "targets": list(self.targets),
            "last_failed": self.last_failed,
        }


@dataclass
class _Wait:
    source: str
    target: str
    since: float
    attempts: int
    last_error: str
    last_at: float


class _Registry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waits: dict[int, _Wait] = {}
        self._tokens = itertools.count(1)
        self._begun: dict[str, int] = {}

    def begin(self, source: str, target: str, error: str, since: float | None) -> int:
        now = time.time()
        with self._lock:
            token = next(self._tokens)
            if not any(w.source == source for w in self._waits.values()):
                self._begun[source] = self._begun.get(source, 0) + 1
            self._waits[token] = _Wait(source, target, now if since is None else since, 1, error, now)
        return token

    def failed(self, token: int, error: str) -> None:
        with self._lock:
            wait = self._waits.get(token)
            if wait is not None:
                wait.attempts += 1
                wait.last_error = error
                wait.last_at = time.time()

    def end(self, token: int) -> None:
        with self._lock:
            self._waits.pop(token, None)

    def begun(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self._begun.items()))

    def snapshot(self) -> dict[str, StorageWait]:
        with self._lock:
            waits = list(self._waits.values())
        by_source: dict[str, list[_Wait]] = {}
        for wait in waits:
            by_source.setdefault(wait.source, []).append(wait)
        out = {}
        for name, group in sorted(by_source.items()):
            latest = max(group, key=lambda w: w.last_at)
            out[name] = StorageWait(
                source=name,
                since=min(w.since for w in group),
                attempts=sum(w.attempts for w in group),
                last_error=latest.last_error,
                targets=tuple(sorted({w.target for w in group})),
                last_failed=latest.last_at,
            )
        return out


_registry = _Registry()


def storage_waits() -> dict[str, StorageWait]:
    """The sources of this process now waiting on storage, by name; empty when none is.

    A snapshot: safe to call from any thread; the values do not change afterwards.
    """
    return _registry.snapshot()


def storage_waits_begun() -> dict[str, int]:
    """Wait periods begun in this process so far, by source (cumulative; see the module docstring)."""
    return _registry.begun()


def wait_began(source: str, target: str, error: str, since: float | None = None) -> int:
    """Record that ``source`` started waiting on ``target`` at ``since`` (wall clock; default now).

    Returns the token for the calls below.
    """
    return _registry.begin(source, target, error, since)


def wait_failed_again(token: int, error: str) -> None:
    """Count one more failed attempt of the wait ``token``."""
    _registry.failed(token, error)


def wait_ended(token: int) -> None:
    """The wait ``token`` is over (a retry succeeded, or the deadline passed)."""
    _registry.end(token)


def _forget_after_fork() -> None:
    global _registry
    _registry = _Registry()


os.register_at_fork(after_in_child=_forget_after_fork)
