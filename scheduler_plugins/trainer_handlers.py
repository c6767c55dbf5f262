"""The Planner's handlers for trainer ranks: leases, where a batch is, what a rank consumed.

Each handler checks its request against the job first (:mod:`scheduler_plugins.request_checks`:
rank in the world, step, timeout; :mod:`scheduler_plugins.rank_checks`: the rank's lease, steps
already balanced, finite metrics), so a wrong request fails alone, and then hands it to the job's
trainer-facing half (:mod:`scheduler_plugins.job_trainers`). The consumption that reaches the
scheduler over clients' streams instead of requests is :mod:`scheduler_plugins.stream_tells`,
with the same checks.

The plugin (:mod:`scheduler_plugins.planner`) registers these with the scheduler; the handlers for
drivers and the dashboard's questions are :mod:`scheduler_plugins.job_questions`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mdata import planner as ps
from mdata.checkpoint import Checkpoint
from mdata.errors import MdataError
from mdata.wire import messages as msg
from scheduler_plugins import job_trainers
from scheduler_plugins.batch_locations import locate_many
from scheduler_plugins.job_runtime import JobRuntime
from scheduler_plugins.rank_checks import (
    check_lease, check_metrics, check_received, check_stall, lease_is_current,
)
from scheduler_plugins.request_checks import check_rank, check_step, check_timeout, known_job
from scheduler_plugins.stream_tells import take_tells

__all__ = ["TrainerHandlers"]


class TrainerHandlers:
    """The handlers a Loader calls, over the Planner's ``jobs`` (see the module docstring)."""

    def __init__(self, jobs: Mapping[str, JobRuntime]) -> None:
        self.jobs = jobs

    def _ranked(self, req: Any) -> JobRuntime:
        """The job of a request from one trainer rank about one step, after checking both."""
        runtime = known_job(self.jobs, req.job)
        check_rank(req.handler.value, req.rank, runtime.plan.mesh.world_size)
        check_step(req.handler.value, req.step)
        check_lease(req.handler.value, req.rank, req.token)  # (rank_checks)
        return runtime

    async def batch_location(self, req: msg.BatchLocationRequest) -> msg.BatchLocationReply:
        """Where the batch of ``req.step`` for ``req.rank`` is (a long poll)."""
        check_timeout(req.handler.value, req.timeout)
        runtime = self._ranked(req)
        _take_told(runtime, req.handler.value, req)
        return await job_trainers.batch_location(runtime, req.rank, req.step, req.timeout,
                                                 req.token, req.generation, req.delivered)

    async def host_location(self, req: msg.HostLocationRequest) -> msg.HostLocationReply:
        """``batch_location`` for several ranks of one process; a bad or stale ask is answered
        FAILED on its own (each rank raises its error), the others are served."""
        handler = req.handler.value
        check_timeout(handler, req.timeout)
        check_step(handler, req.step)
        runtime = known_job(self.jobs, req.job)
        answers: list[msg.BatchLocationReply | None] = [None] * len(req.asks)
        asking: list[int] = []
        for i, ask in enumerate(req.asks):
            try:
                check_rank(handler, ask.rank, runtime.plan.mesh.world_size)
                check_lease(handler, ask.rank, ask.token)
                _take_told(runtime, handler, ask)
            except MdataError as exc:
                answers[i] = msg.BatchLocationReply(msg.Status.FAILED, reason=str(exc), error=exc)
                continue
            asking.append(i)
        asks = [req.asks[i] for i in asking]
        # subscribed before the long poll waits: no batch built meanwhile goes unpushed
        pushing = bool(req.client) and runtime.pusher.subscribe(req.client, req.step, asks)
        located = await locate_many(runtime, req.step, asks, req.timeout)
        for i, reply in zip(asking, located):
            answers[i] = reply
        return msg.HostLocationReply(tuple(answers), pushing=pushing, tells=pushing)

    async def consumed(self, req: msg.ConsumedRequest) -> msg.ConsumedReply:
        """What several ranks' training loops consumed (the steps no location request carried);
        each tell is checked as an ack is, and a wrong one gets its own error back. The same
        tells come over clients' streams too (scheduler_plugins.stream_tells)."""
        runtime = known_job(self.jobs, req.job)
        runtime.consumed_requests += 1
        return msg.ConsumedReply(take_tells(runtime, req.tells, req.handler.value))

    async def ack(self, req: msg.AckRequest) -> msg.OkReply:
        """``req.rank`` received (or consumed) ``req.step``."""
        runtime = self._ranked(req)
        check_lease(req.handler.value, req.rank, req.token, runtime.roster, req.generation)
        check_received(req.handler.value, runtime.view, req.rank, req.step)
        await job_trainers.acknowledge(
            runtime, req.rank, req.step, consumed=req.consumed, token=req.token,
            generation=req.generation, stalled_s=check_stall(req.handler.value, req.rank, req.stalled_s))
        return msg.OkReply()

    async def attach(self, req: msg.AttachRequest) -> msg.AttachReply:
        """Lease ``req.rank`` to the asking Loader (its checkpoint may rewind the job)."""
        runtime = known_job(self.jobs, req.job)
        check_rank(req.handler.value, req.rank, runtime.plan.mesh.world_size)
        if req.checkpoint is not None:
            Checkpoint.from_dict(req.checkpoint)  # a CheckpointError naming what is wrong
        return await job_trainers.attach(runtime, req)

    def detach(self, req: msg.DetachRequest) -> msg.OkReply:
        """The Loader of ``req.rank`` leaves: its lease ends."""
        runtime = self.jobs.get(req.job)
        if runtime is not None:  # a job closed meanwhile has no lease to end
            check_rank(req.handler.value, req.rank, runtime.plan.mesh.world_size)
            runtime.roster.detach(req.rank, req.token)
        return msg.OkReply()

    async def report_metrics(self, req: msg.ReportMetricsRequest) -> msg.OkReply:
        """Training metrics of a step, for a mixture that follows them."""
        runtime = self._ranked(req)
        check_lease(req.handler.value, req.rank, req.token, runtime.roster, req.generation)
        check_received(req.handler.value, runtime.view, req.rank, req.step)
        check_metrics(req.handler.value, req.rank, req.step, req.metrics)
        await runtime.handle(
            ps.MetricsReported(step=req.step, rank=req.rank, metrics=dict(req.metrics),
                               stimulus_id=f"metrics-{req.rank}-{req.step}")
        )
        return msg.OkReply()


def _take_told(runtime: JobRuntime, handler: str, req: Any) -> None:
    """What a location request tells besides asking: the step its rank received before and
    the steps its loop consumed (``req``: a BatchLocationRequest or a LocationAsk), checked
    and queued for the Planner, when it comes from the rank's current lease holder."""
    if (req.delivered is not None or req.consumed) and lease_is_current(runtime.roster, req):
        if req.delivered is not None:
            check_received(handler, runtime.view, req.rank,
                           check_step(handler, req.delivered, "delivered"), "delivered")
        for step in req.consumed:  # the training loop's consumption, told with this request
            check_received(handler, runtime.view, req.rank, check_step(handler, step, "consumed"),
                           "consumed")
        if req.consumed:
            job_trainers.consumed_told(runtime, req.rank, req.consumed, req.token,
                                       check_stall(handler, req.rank, req.stalled_s), req.waits)
