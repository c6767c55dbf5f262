"""One job's batches as the scheduler holds them: which construct task builds each DP group's batch
of each step, whether it is built, and what went wrong with one that could not be.

Three parts of a job read this: the runtime, which submits the construct tasks, waits for them
and releases them (:mod:`scheduler_plugins.job_runtime`); the long polls, which answer a rank
once its group's batch is built (:mod:`scheduler_plugins.batch_locations`); and the pushes,
which tell subscribed clients where built batches are (:mod:`scheduler_plugins.location_push`).
They share this object, not the runtime: the pusher is created by the runtime, and a pusher
that read the whole runtime made the two modules import each other.

A batch is keyed ``(step, DP rank)``. Its future is its construct task's, which builds a *part*
of the step's groups (:mod:`scheduler_plugins.construct_parts`), so several keys share one future
and the future is released with the last of them. A batch whose holder died is rebuilt by Dask
(the future is still held); :meth:`BuiltBatches.lost` marks every group of its part not built
again and hands them to the runtime's ``rebuild``, which waits for the recomputation.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from mdata.errors import MdataError
from scheduler_plugins.construct_parts import ConstructParts
from scheduler_plugins.job_tasks import task_holders

__all__ = ["BatchKey", "BuiltBatches"]

#: ``(step, DP rank)``: one DP group's batch of one step.
BatchKey = tuple[int, int]


class BuiltBatches:
    """The construct tasks of one job and what they built (see the module docstring).

    ``rebuild(keys, future)`` is called once for the groups of a part whose holder was lost
    after it had been built: the runtime waits for Dask's recomputation and marks them built.
    """

    def __init__(self, scheduler: Any, rebuild: Callable[[list[BatchKey], Any], None]) -> None:
        self.scheduler = scheduler
        self.rebuild = rebuild
        #: (step, DP rank) -> the future of the construct task that builds the group's batch
        self.futures: dict[BatchKey, Any] = {}
        self.parts = ConstructParts()  # which groups each construct task builds
        self.ready: defaultdict[BatchKey, asyncio.Event] = defaultdict(asyncio.Event)
        #: (reason, the typed error when it was an MdataError) per batch that could not be built
        self.errors: dict[BatchKey, tuple[str, MdataError | None]] = {}

    def __len__(self) -> int:
        return len(self.futures)

    def add(self, future: Any, keys: list[BatchKey]) -> None:
        """A construct task was submitted for the groups ``keys`` of one step."""
        self.parts.add(future.key, keys)
        for key in keys:
            self.futures[key] = future

    def held_by(self, keys: list[BatchKey], future: Any) -> list[BatchKey]:
        """Those of ``keys`` still built by ``future`` (not released or rewound meanwhile)."""
        return [key for key in keys if self.futures.get(key) is future]

    def is_built(self, key: BatchKey) -> bool:
        """Whether the batch of ``key`` is built (its construct task finished, or failed)."""
        return key in self.futures and self.ready[key].is_set()

    def built_already(self, key: BatchKey) -> bool:
        """Like :meth:`is_built`, without creating a waiting event for a key never asked about."""
        return key in self.futures and key in self.ready and self.ready[key].is_set()

    def mark_built(self, keys: list[BatchKey]) -> None:
        """The construct task of ``keys`` finished (built them, or failed): wake their waiters."""
        for key in keys:
            self.ready[key].set()

    def not_built(self, keys: list[BatchKey], exc: BaseException | None) -> str:
        """The construct task of ``keys`` (groups of one step) failed with ``exc``: each keeps
        why, typed when it was an MdataError, for its ranks' long polls; returns the reason."""
        step, ranks = keys[0][0], [dp for _, dp in keys]
        notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))
        reason = (f"building step {step} for DP rank{'s' if len(ranks) > 1 else ''} "
                  f"{', '.join(map(str, ranks))} failed: {exc!r}{notes}")
        for key in keys:
            self.errors[key] = (reason, exc if isinstance(exc, MdataError) else None)
        return reason

    def who_has(self, task_key: Any) -> list[str]:
        """The workers holding the construct task ``task_key``'s result now."""
        return task_holders(self.scheduler, task_key)

    def lost(self, key: BatchKey, future: Any) -> None:
        """The batch of ``key`` lost its only copy with the rest of its part: every group of the
        part waits for Dask's recomputation again (handed to ``rebuild`` once)."""
        event = self.ready.get(key)
        if event is not None and event.is_set():
            held = self.held_by(self.parts.members(future.key), future)
            for k in held:
                self.ready[k].clear()
            self.rebuild(held, future)

    def release(self, key: BatchKey) -> Any:
        """Forget the batch of ``key``; returns its future when it was the last group of its
        part (the caller releases it), else None."""
        future = self.futures.pop(key, None)
        self.ready.pop(key, None)
        if future is not None and self.parts.release(future.key, key):
            return future
        return None

    def wake_all(self) -> None:
        """Wake every waiter (the job failed, or is rewound): each sees why."""
        for event in self.ready.values():
            event.set()

    def clear(self) -> list[Any]:
        """Forget every batch (a rewind or a close); returns the futures to release. Waiters
        are woken first; a later wait starts on a fresh event."""
        futures = list(self.futures.values())
        self.futures.clear()
        self.parts.clear()
        self.wake_all()
        self.ready = defaultdict(asyncio.Event)
        self.errors.clear()
        return futures
