"""Tell the training log when a long wait for a batch is a storage outage.

A trainer whose batch is late cannot tell a slow pool from unreachable storage; the Planner can
(``status()["storage_waits"]``, see ``scheduler_plugins/storage_poll.py``). When one wait for a
batch has lasted :data:`AFTER_S`, the Loader asks the job's status and, if sources are waiting on
storage, logs a warning naming them, at most once every :data:`EVERY_S` per Loader. The training
loop keeps waiting (its timeout does not run while storage is waited out: ``mdata.trainer.patience``,
whose checks pass what they learnt to :meth:`StorageNotice.tell`); when storage answers again it
goes on with nothing lost or repeated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from mdata.sources import describe_storage_wait
from mdata.wire.messages import JobStorageWaitsRequest, ask_sync

__all__ = ["StorageNotice"]

logger = logging.getLogger("mdata.trainer")

AFTER_S = 10.0  # a wait for one batch this long is worth explaining
EVERY_S = 30.0  # at most one warning this often per Loader


class StorageNotice:
    """Warns, at most every ``every_s``, that ``job`` waits on storage (see the module docstring)."""

    def __init__(self, client: Any, job: str, rank: int, *, after_s: float = AFTER_S,
                 every_s: float = EVERY_S) -> None:
        self.client = client
        self.job = job
        self.rank = rank
        self.after_s = after_s
        self.every_s = every_s
        self._last = float("-inf")

    def waiting(self, step: int, waited_s: float) -> str | None:
        """The Loader has waited ``waited_s`` for ``step``; returns the warning if it logged one."""
        now = time.monotonic()
        if waited_s < self.after_s or now - self._last < self.every_s:
            return None
        try:
            waits = ask_sync(self.client, JobStorageWaitsRequest(self.job)).storage_waits
        except Exception:  # noqa: BLE001 - a notice must never break the wait it explains
            return None
        return self.tell(step, waited_s, waits, now)

    def tell(self, step: int, waited_s: float, waits: Mapping[str, Any] | None,
             now: float | None = None) -> str | None:
        """Log the warning for ``waits`` (a status's ``storage_waits``, already asked for) under
        the same rules as :meth:`waiting`; returns it if logged."""
        now = time.monotonic() if now is None else now
        if not waits or waited_s < self.after_s or now - self._last < self.every_s:
            return None
        self._last = now
        text = (f"rank {self.rank} has waited {waited_s:.0f}s for step {step} of job {self.job!r}: "
                + "; ".join(f"source {name!r} is "
                            + describe_storage_wait(w.since, w.attempts, w.last_error)
                            for name, w in sorted(waits.items())))
        logger.warning(text)
        return text
