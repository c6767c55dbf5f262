"""One job's lineage beyond the DGraph's retention: spilled by a writer thread, read for stories.

The pure Planner keeps the lineage of its last ``mdata.planner.lineage-steps`` consumed steps in
memory and hands each older range of steps to :meth:`LineageStore.spill` (its ``lineage_sink``),
in the planning thread while the job's lock is held. The range is readable at once (pending, in
memory) and a background thread writes it as Parquet files at ``mdata.planner.lineage-spill``
(:mod:`mdata.lineage.spill`), after which only the files' footers stay in memory: the scheduler's
memory stays flat however long the run.

Nothing here grows without bound (decisions: :mod:`mdata.lineage.limits`): ranges waiting for
storage are capped in bytes (the oldest dropped first), a range is retried a bounded number of
times, and retention deletes the oldest files; what was let go is said in the job's status
(``status()["lineage"]``) and on the dashboard's lineage page. Training never waits on any of it.

Writing never waits on storage on the event loop: the writer is its own thread. Stories over
the whole run (the DGraph's part and the spilled files together) are
:mod:`scheduler_plugins.stories`. Where this runs: docs/dev/architecture.md.
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import time
import uuid
from collections import deque
from typing import Any

from mdata.lineage.events import LineageSegment
from mdata.lineage.limits import (
    PENDING_CAP, RETENTION, WRITE_FAILED, LineageGaps, SpillLimits, WrittenRange, format_bytes,
)
from mdata.lineage.spill import TABLES, SpilledLineage, SpillRange
from mdata.wire.lineage_status import LineageSpillInfo

__all__ = ["LineageStore", "spill_url"]

logger = logging.getLogger("mdata.planner")

AUTO = "auto"


def spill_url(setting: Any) -> tuple[str | None, bool]:
    """The folder a job's spill goes under, and whether it is scratch (deleted with the job):
    ``auto`` is ``mdata-lineage`` under Dask's ``temporary-directory`` (or the system's)."""
    if setting in (None, False, "", "null", "none"):
        return None, False
    if setting == AUTO:
        import dask.config

        base = dask.config.get("temporary-directory", default=None) or tempfile.gettempdir()
        return f"{str(base).rstrip('/')}/mdata-lineage", True
    return str(setting).rstrip("/"), False


class LineageStore:
    """The spilled ranges of one job and the thread that writes them (see the module docstring).

    ``url`` is this run's own folder (an fsspec URL; ``storage_options`` go to its filesystem, else
    fsspec's own configuration applies); ``scratch`` folders are deleted on close. ``limits``
    bound memory, retries and files (default: :class:`~mdata.lineage.limits.SpillLimits`).
    """

    def __init__(self, url: str, *, scratch: bool = False, limits: SpillLimits | None = None,
                 **storage_options: Any) -> None:
        import fsspec

        self.url = url
        self.scratch = scratch
        self.limits = limits or SpillLimits()
        self.fs, self.root = fsspec.core.url_to_fs(url, **storage_options)
        self.spilled = SpilledLineage()
        self.gaps = LineageGaps()  # what was let go, and why (said in status and on the dashboard)
        self.failures = 0  # failed write attempts, over all ranges
        self.last_error = ""
        self._next_index = 0  # file stems stay unique when ranges are let go
        self._queue: deque[SpillRange] = deque()  # pending, oldest first, not being written
        self._busy: SpillRange | None = None  # the range the writer writes now
        self._file_nbytes: dict[SpillRange, int] = {}  # written ranges whose files are kept
        self._cond = threading.Condition()  # guards the five above (planning thread vs writer)
        self._stopping = False
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._write_loop, name=f"mdata-lineage-{url}",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def for_job(cls, job: str, lineage_steps: int | None) -> "LineageStore | None":
        """The store configured by ``mdata.planner.lineage-spill``, in a folder of its own for
        this run of ``job``; None when lineage is not spilled (or never forgotten)."""
        from dask.utils import parse_bytes

        from mdata import config

        base, scratch = spill_url(config.get("planner.lineage-spill"))
        if base is None or lineage_steps is None:
            return None
        limits = SpillLimits.from_config(lambda key: config.get(f"planner.{key}"), parse_bytes)
        name = re.sub(r"[^A-Za-z0-9._-]", "_", job)
        run = f"{name}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        return cls(f"{base}/{run}", scratch=scratch, limits=limits)

    # -- the planning thread hands segments over -----------------------------------------------
    def spill(self, segment: LineageSegment) -> None:
        """Take ``segment`` (readable at once) and queue it for the writer; never blocks. When
        the ranges waiting for storage would pass the pending cap, the oldest are dropped."""
        with self._cond:
            rng = SpillRange.of(self._next_index, segment)
            self._next_index += 1
            if self._cap_pending(rng):  # it fits (maybe once older ones went): keep it
                self.spilled.add(rng)
                self._queue.append(rng)
                self._cond.notify()

    def _cap_pending(self, new: SpillRange | None = None) -> bool:
        """Drop the oldest pending ranges until memory fits the cap, with ``new`` counted as
        the newest (holding ``_cond``); whether ``new`` fits."""
        ranges = ([self._busy] if self._busy else []) + list(self._queue) + ([new] if new else [])
        pending = [(r, r.nbytes()) for r in ranges]
        total = sum(n for _, n in pending)
        detail = f"{format_bytes(total)} pending at {self.url}" + (
            f", last error {self.last_error}" if self.last_error else "")
        kept = True
        for rng in self.limits.over_pending(pending, busy=self._busy):
            if rng is new:
                kept = False
            else:
                self._queue.remove(rng)
            self._let_go(rng, PENDING_CAP, detail)
        return kept

    def _let_go(self, rng: SpillRange, reason: str, detail: str) -> None:
        """Forget ``rng`` and say which steps' lineage went (holding ``_cond``)."""
        first = not self.gaps
        self.spilled.remove(rng)
        self._file_nbytes.pop(rng, None)
        self.gaps.add(rng.first_step, rng.stop_step, reason, detail)
        log = logger.warning if first or reason != RETENTION else logger.info
        log("mdata: lineage of steps %d-%d (%s) let go: %s", rng.first_step, rng.stop_step - 1,
            reason, detail)
        if first:
            logger.warning("mdata: %s", self.note())

    def note(self) -> str:
        """The sentence status and dashboard show: which lineage is unavailable; "" if none."""
        with self._cond:
            return self.gaps.describe(self.limits)

    def info(self) -> LineageSpillInfo:
        """What the job's status says of its spilled lineage."""
        with self._cond:
            ranges = self.spilled.ranges()
            return LineageSpillInfo(
                url=self.url, written_ranges=sum(r.written for r in ranges),
                pending_ranges=sum(not r.written for r in ranges),
                pending_bytes=sum(r.nbytes() for r in ranges), pending_limit=self.limits.pending_bytes,
                file_bytes=sum(self._file_nbytes.values()), failures=self.failures,
                last_error=self.last_error, unavailable=self.gaps.gaps(),
                note=self.gaps.describe(self.limits))

    def rewound(self, old, new) -> None:
        """A job rewound to a checkpoint: spill all the old state's lineage (steps consumed
        before the rewind stay told, replanned ones get a second occurrence) and let the new
        state's DGraph go on with lineage ids after it and spill here too."""
        segment = old.dgraph.take_before(None)
        if segment is not None:
            self.spill(segment)
        new.dgraph.continue_after(old.dgraph)
        new.lineage_sink = self.spill

    def ranges(self) -> tuple[SpillRange, ...]:
        return self.spilled.ranges()

    def pending_nbytes(self) -> int:
        """Memory held by ranges not written yet (nothing once the writer caught up)."""
        with self._cond:
            return self.spilled.pending_nbytes()

    # -- the writer thread -----------------------------------------------------------------------
    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                rng = self._busy = self._queue.popleft()
            try:
                if self._write(rng):
                    self._retain(rng)
            finally:
                with self._cond:
                    self._busy = None

    def _write(self, rng: SpillRange) -> bool:
        """Write ``rng``, retrying as the limits say; False when it was let go instead."""
        failures = 0
        while True:
            try:
                rng.write(self.fs, self.root)
                return True
            except Exception as exc:  # storage down: keep the range in memory and try again
                failures += 1
                with self._cond:
                    self.failures += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    self._cap_pending()  # the range's tables were built: count them
                delay = self.limits.retry_delay(failures)
                if delay is None or self._closing.is_set():
                    self._remove_files(rng)
                    with self._cond:
                        self._let_go(rng, WRITE_FAILED, f"{self.url}: {self.last_error}")
                    return False
                logger.warning("mdata: writing lineage range %s to %s failed (%s); attempt %d, "
                               "next in %.1fs (it stays in memory until then)", rng.stem, self.url,
                               self.last_error, failures, delay)
                self._closing.wait(delay)

    def _retain(self, written: SpillRange) -> None:
        """Delete the files retention no longer keeps, oldest first (after each write)."""
        with self._cond:
            self._file_nbytes[written] = written.file_nbytes
            kept = [WrittenRange(r, r.first_step, r.stop_step, self._file_nbytes[r])
                    for r in self.spilled.ranges() if r in self._file_nbytes]
            expired = self.limits.expired(kept)
            for rng in expired:  # stories asked from now on skip it; ones reading it see it gone
                self._let_go(rng, RETENTION, "")
        for rng in expired:
            self._remove_files(rng)

    def _remove_files(self, rng: SpillRange) -> None:
        """Delete a range's files (written or partly written), as far as storage lets us."""
        for table in TABLES:
            try:
                path = rng.path(table, self.root)
                if self.fs.exists(path):
                    self.fs.rm(path)
            except Exception as exc:  # noqa: BLE001 - storage down: the files stay, say so
                logger.warning("mdata: could not delete lineage file %s at %s: %s", table, self.url, exc)
                return

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every range handed over so far is written and the writer is idle (the
        retention that follows a write has deleted what it expires); False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not (all(r.written for r in self.ranges()) and self._idle()):
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _idle(self) -> bool:
        with self._cond:
            return self._busy is None and not self._queue

    def close(self, timeout: float = 30.0) -> None:
        """Stop the writer (after what is queued, unless storage keeps failing) and delete a
        scratch folder: nobody can ask this job for stories any more."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)
        self._closing.set()
        if self.scratch:
            try:
                if self.fs.exists(self.root):
                    self.fs.rm(self.root, recursive=True)
            except OSError:
                logger.warning("mdata: could not remove scratch lineage folder %s", self.url)
