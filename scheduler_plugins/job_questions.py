"""The Planner's handlers for questions about a job: its checkpoints, status, storage waits, the
stories of its samples and its lineage.

Drivers (``JobHandle``), the dashboard's routes and late Loaders ask these; none changes the job.
What the Planner's published view holds (status, storage waits) is answered on the event loop;
what needs the Planner's own state (a checkpoint of any step, the DGraph) is read under the job's
lock (:meth:`~scheduler_plugins.job_runtime.JobRuntime.read_state`). The plugin
(:mod:`scheduler_plugins.planner`) registers these with the scheduler beside the trainers'
handlers (:mod:`scheduler_plugins.trainer_handlers`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mdata.wire import messages as msg
from scheduler_plugins import stories
from scheduler_plugins.job_runtime import JobRuntime
from scheduler_plugins.job_status import job_status, quarantined, storage_wait_infos
from scheduler_plugins.request_checks import check_count, check_step, known_job

__all__ = ["JobQuestions"]


class JobQuestions:
    """The handlers that answer questions about the Planner's ``jobs`` (see the module docstring)."""

    def __init__(self, jobs: Mapping[str, JobRuntime]) -> None:
        self.jobs = jobs

    async def checkpoint(self, req: msg.CheckpointRequest) -> msg.CheckpointReply:
        """The checkpoint of ``req.step``, with the shard listings (one to store)."""
        runtime = known_job(self.jobs, req.job)
        check_step(req.handler.value, req.step)
        # a checkpoint asked for is one to store: with the listings, to name a changed shard
        return msg.CheckpointReply(await runtime.read_state(
            lambda state: state.checkpoint(req.step, with_listings=True)))

    async def story(self, req: msg.StoryRequest) -> msg.StoryReply:
        """Every occurrence (one per epoch) of ``source/shard/row`` over the whole run, spilled
        lineage included (scheduler_plugins.stories): loaded, planned, delivered...; a
        SampleNotPlannedError saying why when there is none (no such sample, not planned yet)."""
        runtime = known_job(self.jobs, req.job)
        sid = stories.story_sample(runtime, req.sample_id)
        occurrences = await stories.story(runtime, sid)
        if not occurrences:
            raise stories.never_planned(runtime, sid)
        return msg.StoryReply(tuple(
            msg.StoryOccurrence(int(i), tuple(_jsonable(events))) for i, events in occurrences))

    async def lineage(self, req: msg.LineageRequest) -> msg.LineageReply:
        """Planned sample ids per step and DP rank, from the DGraph (for exactly-once checks)."""
        runtime = known_job(self.jobs, req.job)
        steps, dp = req.steps, runtime.plan.mesh.dp
        check_count(req.handler.value, steps, runtime.view.planned_step, "steps (how many planned steps)")

        def read(state) -> msg.LineageReply:
            graph = state.dgraph
            table = graph.samples_table
            cols = [table.column(c) for c in ("source_index", "shard", "row")]
            out: dict[str, dict[str, list]] = {}
            for step in range(steps):
                out[str(step)] = {}
                for rank in range(dp):
                    rows = graph.samples(step, rank) - graph.first_id  # ids are global, rows not
                    out[str(step)][str(rank)] = np.stack([c[rows] for c in cols], axis=1).tolist()
            # lineage retention may have forgotten the oldest steps: check what is kept
            report = graph.verify_exactly_once(graph.forgotten_before, max(steps, graph.forgotten_before),
                                               require_consumed=True)
            return msg.LineageReply(
                samples=out,
                forgotten_before=int(graph.forgotten_before),
                exactly_once=msg.ExactlyOnce(bool(report.ok), int(report.samples),
                                             int(report.skipped), tuple(report.problems)),
                quarantined=quarantined(runtime),  # which shards were passed over, and why
            )

        return await runtime.read_state(read)

    def status(self, req: msg.StatusRequest) -> msg.StatusReply:
        """The job's status (:func:`scheduler_plugins.job_status.job_status`)."""
        runtime = known_job(self.jobs, req.job)
        return job_status(runtime) if req.max_steps is None else job_status(runtime, req.max_steps)

    def job_storage_waits(self, req: msg.JobStorageWaitsRequest) -> msg.JobStorageWaitsReply:
        """Which of the job's sources wait on storage now (a late Loader asks every few seconds)."""
        return msg.JobStorageWaitsReply(storage_wait_infos(known_job(self.jobs, req.job)))


def _jsonable(value: Any) -> Any:
    """Numpy scalars and arrays inside handler replies become plain Python values."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
