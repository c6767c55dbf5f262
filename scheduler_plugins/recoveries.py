"""What faults cost one job so far: the ``recoveries`` of its status.

A job that rides through a lost worker or a storage outage delivers the same samples as one that
met no fault, so its output alone cannot tell that a recovery happened (or that a test's fault
landed at all). :class:`RecoveryTally` counts the recoveries as the runtime carries them out:

* ``chunks_reloaded``: load tasks the Planner issued again because the loader holding a chunk was
  lost while a planned step still needed it (``LoadChunk.reload``);
* ``batches_rebuilt``: built batches of the job that were lost with their constructor, which Dask
  builds again because the runtime still holds their futures. Dask's own record of the loss (the
  scheduler's ``remove-worker`` event, ``lost-computed-tasks``) says which ones: counting them when
  a trainer next asks would miss every batch rebuilt before it asked;
* ``storage_outages``: times one of the job's sources began waiting on unreachable storage, from
  the loader workers' cumulative counts of waits begun, which the Planner polls (``storage_poll.py``).

The tally lives as long as the job's runtime, across rewinds (a resume keeps what came before).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

__all__ = ["RecoveryTally", "lost_computed_tasks"]


def lost_computed_tasks(scheduler: Any, worker: str) -> set:
    """Keys of the results that were lost with ``worker`` and that Dask computes again (from
    the scheduler's last ``remove-worker`` event of that worker; empty when there is none)."""
    for _, msg in reversed(scheduler.get_events(worker)):
        if isinstance(msg, dict) and msg.get("action") == "remove-worker":
            return {_key(k) for k in msg.get("lost-computed-tasks", ())}
    return set()


def _key(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


class RecoveryTally:
    """The counts of one job (see the module docstring); :meth:`counts` is the status's field."""

    def __init__(self) -> None:
        self.chunks_reloaded = 0
        self.batches_rebuilt = 0
        self.storage_outages = 0

    def chunk_reloaded(self) -> None:
        self.chunks_reloaded += 1

    def worker_lost(self, scheduler: Any, worker: str, batch_keys: Collection) -> int:
        """Count the job's batches (task keys ``batch_keys``) lost with ``worker``; returns them."""
        lost = lost_computed_tasks(scheduler, worker)
        rebuilt = sum(1 for key in batch_keys if key in lost)
        self.batches_rebuilt += rebuilt
        return rebuilt

    def storage_outages_began(self, count: int) -> None:
        """``count`` more waits on storage began for the job's sources (since the last poll)."""
        self.storage_outages += int(count)

    def counts(self) -> dict[str, int]:
        return {"chunks_reloaded": self.chunks_reloaded, "batches_rebuilt": self.batches_rebuilt,
                "storage_outages": self.storage_outages}
