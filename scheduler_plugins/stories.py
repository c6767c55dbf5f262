"""Stories over the whole run: every time a sample was planned, from the DGraph and the spill.

A story lookup (``JobHandle.story``, the dashboard's lineage page, ``/mdata/api/<job>/story/...``)
reads the lineage the Planner still holds in its DGraph and the ranges the job's
:class:`~scheduler_plugins.lineage_store.LineageStore` spilled to files, and tells them as one
chronological story per occurrence. Neither waits on storage on the event loop: a story copies the
DGraph's part under the job's lock (:class:`~mdata.lineage.spill.StoryQuery`, cheap) and reads the
spilled files in a thread (:func:`story`), or, on the dashboard's page, in an executor whose
result the next refresh shows (:func:`submit`). A lookup that finds nothing says why
(:func:`never_planned`); a sample id that names no sample of the job is refused first
(:func:`story_sample`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

from mdata.errors import MdataError, SampleNotPlannedError
from mdata.lineage.ids import SampleId
from mdata.lineage.sample_lookup import check_sample_exists, not_planned
from mdata.lineage.spill import StoryQuery
from scheduler_plugins.job_runtime import JobRuntime

__all__ = ["never_planned", "story", "story_query", "story_sample", "submit"]

_executor: concurrent.futures.ThreadPoolExecutor | None = None


def story_sample(runtime: JobRuntime, sample_id: str) -> SampleId:
    """The sample id a page, a route or ``JobHandle.story`` asks about, checked against the job:
    an MdataError for a malformed id or an unknown source, a SampleNotPlannedError for a shard or
    row its source does not have (read from the job's listings, which never change)."""
    try:
        sid = SampleId.parse(sample_id)
    except ValueError as exc:
        raise MdataError(f"job {runtime.job!r}: {exc}") from None
    names = list(runtime.view.names)
    if sid.source not in names:
        raise MdataError(
            f"job {runtime.job!r}: unknown source {sid.source!r} in sample id {sample_id!r}; "
            f"sources: {names}"
        )
    check_sample_exists(sid, runtime.job, runtime.state.orders[names.index(sid.source)].row_counts)
    return sid


def never_planned(runtime: JobRuntime, sid: SampleId) -> SampleNotPlannedError:
    """What a story lookup that found no occurrence of ``sid`` answers: not planned so far, and
    which lineage is no longer there to tell (:func:`mdata.lineage.sample_lookup.not_planned`)."""
    store = getattr(runtime, "lineage", None)
    return not_planned(sid, runtime.job, runtime.view.planned_step,
                       forgotten_before=int(runtime.state.dgraph.forgotten_before) if store is None else 0,
                       lineage_note=store.note() if store is not None else "")


def story_query(runtime: JobRuntime, sid: SampleId) -> StoryQuery:
    """What the story of ``sid`` needs: call it holding ``runtime.lock`` (or with it free, on the
    loop), as the DGraph is copied from and the ranges spilled under that lock."""
    store = getattr(runtime, "lineage", None)
    ranges = store.ranges() if store is not None else ()
    return StoryQuery.of(runtime.state.dgraph, ranges, sid.source, sid.shard, sid.row)


async def story(runtime: JobRuntime, sid: SampleId) -> list[tuple[int, list[dict[str, Any]]]]:
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
