"""One job's lineage beyond the DGraph's retention: spilled by a writer thread, read for stories.

The pure Planner keeps the lineage of its last ``mdata.planner.lineage-steps`` consumed steps in
memory and hands each older range of steps to :meth:`LineageStore.spill` (its ``lineage_sink``),
in the planning thread while the job's lock is held. The range is readable at once (pending, in
memory) and a background thread writes it as Parquet files at ``mdata.planner.lineage-spill``
(:mod:`mdata.lineage_spill`), after which only the files' footers stay in memory: the scheduler's
memory stays flat however long the run.

Neither writing nor reading waits on storage on the event loop: the writer is its own thread,
and a story copies the DGraph's part under the lock (:class:`~mdata.lineage_spill.StoryQuery`,
cheap) and reads the spilled files in a thread (:func:`story`), or on the dashboard's page, in
an executor whose result the next refresh shows (:func:`submit`). Where this runs:
docs/dev/architecture.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import re
import tempfile
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

from mdata.ids import SampleId
from mdata.lineage import LineageSegment
from mdata.lineage_spill import SpilledLineage, SpillRange, StoryQuery

if TYPE_CHECKING:
    from scheduler_plugins.job_runtime import JobRuntime

__all__ = ["LineageStore", "story", "story_query", "submit"]

logger = logging.getLogger("mdata.planner")

AUTO = "auto"
_RETRY_MAX_S = 30.0
_executor: concurrent.futures.ThreadPoolExecutor | None = None


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
    fsspec's own configuration applies); ``scratch`` folders are deleted on close.
    """

    def __init__(self, url: str, *, scratch: bool = False, **storage_options: Any) -> None:
        import fsspec

        self.url = url
        self.scratch = scratch
        self.fs, self.root = fsspec.core.url_to_fs(url, **storage_options)
        self.spilled = SpilledLineage()
        self.failures = 0  # failed writes (retried until they succeed or the job closes)
        self._queue: queue.Queue[SpillRange | None] = queue.Queue()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._write_loop, name=f"mdata-lineage-{url}",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def for_job(cls, job: str, lineage_steps: int | None) -> "LineageStore | None":
        """The store configured by ``mdata.planner.lineage-spill``, in a folder of its own for
        this run of ``job``; None when lineage is not spilled (or never forgotten)."""
        from mdata import config

        base, scratch = spill_url(config.get("planner.lineage-spill"))
        if base is None or lineage_steps is None:
            return None
        name = re.sub(r"[^A-Za-z0-9._-]", "_", job)
        run = f"{name}-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        return cls(f"{base}/{run}", scratch=scratch)

    # -- the planning thread hands segments over -----------------------------------------------
    def spill(self, segment: LineageSegment) -> None:
        """Take ``segment`` (readable at once) and queue it for the writer; never blocks."""
        rng = SpillRange.of(len(self.spilled), segment)
        self.spilled.add(rng)
        self._queue.put(rng)

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
        return self.spilled.pending_nbytes()

    # -- the writer thread -----------------------------------------------------------------------
    def _write_loop(self) -> None:
        while (rng := self._queue.get()) is not None:
            delay = 0.5
            while not self._closing.is_set():
                try:
                    rng.write(self.fs, self.root)
                    break
                except Exception:  # storage down: keep the range in memory and try again
                    self.failures += 1
                    logger.exception("mdata: writing lineage range %s to %s failed; retrying in "
                                     "%.1fs (it stays in memory until then)", rng.stem, self.url, delay)
                    self._closing.wait(delay)
                    delay = min(2 * delay, _RETRY_MAX_S)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every range handed over so far is written; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not all(r.written for r in self.ranges()):
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Stop the writer (after what is queued, unless storage keeps failing) and delete a
        scratch folder: nobody can ask this job for stories any more."""
        self._queue.put(None)
        self._thread.join(timeout)
        self._closing.set()
        if self.scratch:
            try:
                if self.fs.exists(self.root):
                    self.fs.rm(self.root, recursive=True)
            except OSError:
                logger.warning("mdata: could not remove scratch lineage folder %s", self.url)


# -- stories over the whole run ------------------------------------------------------------------
def story_query(runtime: "JobRuntime", sid: SampleId) -> StoryQuery:
    """What the story of ``sid`` needs: call it holding ``runtime.lock`` (or with it free, on the
    loop), as the DGraph is copied from and the ranges spilled under that lock."""
    store = getattr(runtime, "lineage", None)
    ranges = store.ranges() if store is not None else ()
    return StoryQuery.of(runtime.state.dgraph, ranges, sid.source, sid.shard, sid.row)


async def story(runtime: "JobRuntime", sid: SampleId) -> list[tuple[int, list[dict[str, Any]]]]:
    """Every occurrence of ``sid`` over the whole run; spilled files are read in a thread."""
    query = await runtime.read_state(lambda state: story_query(runtime, sid))
    if not query.ranges:
        return query.run()  # all in memory: nothing to read
    return await asyncio.to_thread(query.run)


def submit(query: StoryQuery) -> concurrent.futures.Future:
    """Run ``query`` in mdata's story thread (for callers that cannot await, like a page)."""
    global _executor
    if _executor is None:
        _executor = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="mdata-story")
    return _executor.submit(query.run)
