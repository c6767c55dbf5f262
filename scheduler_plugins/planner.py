"""The Planner: mdata's Dask scheduler plugin.

Load it with ``dask scheduler --preload scheduler_plugins.planner`` (the embedded cluster does the
same). It registers named scheduler handlers (``mdata_*``) through which drivers register jobs and
trainers attach, ask where their next batch is, acknowledge consumption, report metrics and ask for
checkpoints and sample stories; each reads and answers the typed messages of
:mod:`mdata.wire.messages`. It installs mdata's worker plugin on every worker, and runs a
periodic tick that keeps each job's window of steps in flight. The decisions themselves are made by
the pure :mod:`mdata.planner`; :mod:`scheduler_plugins.job_runtime` executes them.

This module keeps the plugin's life (start, close, workers and clients coming and going, the tick)
and the jobs' (register, close); the trainers' handlers are
:mod:`scheduler_plugins.trainer_handlers`, the questions about a job
:mod:`scheduler_plugins.job_questions`.

Where this runs and how a step flows through it: docs/dev/architecture.md.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from distributed.core import Status
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.protocol.pickle import dumps as pickle_dumps
from tornado.ioloop import PeriodicCallback

from mdata import planner as ps
from mdata.checkpoint import Checkpoint
from mdata.errors import PlanError
from mdata.gc_freeze import freeze_long_lived
from mdata.plan import Plan
from mdata.planner.callers import JobCallers
from mdata.pools.standbys import pool_resource
from mdata.spec import scheduler_trust
from mdata.wire import messages as msg
from scheduler_plugins.dashboard.pages import register_pages
from scheduler_plugins.dashboard.routes import register_routes
from scheduler_plugins.job_questions import JobQuestions
from scheduler_plugins.job_runtime import JobRuntime
from scheduler_plugins.job_trainers import rewind_for_driver
from scheduler_plugins.registration import JobLocks, list_sources, wait_for_pools
from scheduler_plugins.request_checks import check_job_name, known_job
from scheduler_plugins.standbys import StandbyKeeper
from scheduler_plugins.storage_poll import StoragePoller
from scheduler_plugins.stream_tells import StreamTells
from scheduler_plugins.trainer_handlers import TrainerHandlers
from workers.loader import as_key
from workers.plugin import (
    PLUGIN_NAME, MdataWorkerPlugin, RefusedRequestFilter, install_closed_comm_filter, install_log_filter,
)

logger = logging.getLogger("mdata.planner")

PLUGIN = "mdata-planner"

# A preload module is imported before the scheduler builds its dashboard and HTTP routes, so
# registering mdata's pages and JSON routes here puts them on it.
register_pages()
register_routes()


class PlannerPlugin(SchedulerPlugin):
    """Holds every job's Planner state and adapts it to the scheduler."""

    name = PLUGIN
    idempotent = True

    def __init__(self, tick_ms: int | None = None) -> None:
        from mdata import config

        self.tick_ms = tick_ms if tick_ms is not None else 1000 * config.seconds("planner.tick-interval")
        self.jobs: dict[str, JobRuntime] = {}
        self.scheduler = None
        self._client = None
        self._client_lock: asyncio.Lock | None = None
        self._periodic: PeriodicCallback | None = None
        self._handlers: dict[str, Any] = {}  # handler name -> the function Dask calls
        self.storage_poll_s = config.seconds("planner.storage-poll-interval")
        self.storage: StoragePoller | None = None  # which sources wait on storage (storage_poll)
        self.standbys: StandbyKeeper | None = None  # the pools' warm standbys (scheduler_plugins.standbys)
        self.scaler_status: msg.ScalerStatus | None = None  # the pool autoscaler's last report
        self.callers = JobCallers()  # who may change each job (mdata.planner.callers)
        self.tells: StreamTells | None = None  # consumption told over clients' streams

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        install_closed_comm_filter("distributed.batched")  # the scheduler's streams to workers
        install_log_filter(RefusedRequestFilter, "distributed.core")  # typed answers: one line
        self._client_lock = asyncio.Lock()
        self.standbys = StandbyKeeper(scheduler, self.client)
        for address in list(scheduler.workers):  # workers that registered before the Planner
            self.standbys.worker_added(address)
        self._register_locks = JobLocks()  # Loaders of every rank may register at once
        trainers, questions = TrainerHandlers(self.jobs), JobQuestions(self.jobs)
        served = {
            msg.RegisterJobRequest: self.register_job,
            msg.BatchLocationRequest: trainers.batch_location,
            msg.HostLocationRequest: trainers.host_location,
            msg.ConsumedRequest: trainers.consumed,
            msg.AckRequest: trainers.ack,
            msg.ReportMetricsRequest: trainers.report_metrics,
            msg.CheckpointRequest: questions.checkpoint,
            msg.StoryRequest: questions.story,
            msg.LineageRequest: questions.lineage,
            msg.StatusRequest: questions.status,
            msg.JobStorageWaitsRequest: questions.job_storage_waits,
            msg.JobsRequest: self.list_jobs,
            msg.JobInfoRequest: self.job_info,
            msg.WhoHasRequest: self.who_has,
            msg.CloseJobRequest: self.close_job,
            msg.AttachRequest: trainers.attach,
            msg.DetachRequest: trainers.detach,
            msg.ScalerReportRequest: self.scaler_report,
        }
        self._handlers = {cls.handler.value: msg.serve(cls, fn) for cls, fn in served.items()}
        scheduler.handlers.update(self._handlers)
        self.tells = StreamTells(scheduler, lambda: self.jobs)  # consumption over clients' streams
        await scheduler.register_worker_plugin(
            None, pickle_dumps(MdataWorkerPlugin()), name=PLUGIN_NAME, idempotent=True
        )
        self.storage = StoragePoller(scheduler, interval=self.storage_poll_s)
        self._periodic = PeriodicCallback(self._tick, self.tick_ms)
        self._periodic.start()
        scheduler.extensions["mdata"] = self  # dashboard pages find the Planner here
        freeze_long_lived("the Planner started")  # full collections would stall the loop (gc_freeze)

    async def close(self) -> None:
        if self._periodic is not None:
            self._periodic.stop()
        if self.storage is not None:
            self.storage.close()
        if self.standbys is not None:
            self.standbys.close()
        await self.close_jobs()
        if self.scheduler is not None:
            for name in self._handlers:
                self.scheduler.handlers.pop(name, None)
            if self.tells is not None:
                self.tells.close()
            self.scheduler.extensions.pop("mdata", None)
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def close_jobs(self) -> None:
        """Close every job (the scheduler closes, or the process that runs it shuts down)."""
        for name in list(self.jobs):
            runtime = self.jobs.pop(name, None)
            self.callers.forget(name)
            if runtime is not None:
                await runtime.close()

    def add_worker(self, scheduler, worker: str) -> None:
        # synchronous on purpose: a returning loader that becomes a standby must lose its pool
        # resources before Dask schedules anything on it (see scheduler_plugins.standbys)
        if self.standbys is not None:
            self.standbys.worker_added(worker)

    def remove_worker(self, scheduler, worker: str, **kwargs) -> None:
        if self.standbys is not None:  # first: a standby takes over the dead loader's chunks
            self.standbys.worker_removed(worker)
        for job in self.jobs.values():
            job.worker_lost(worker)

    def remove_client(self, scheduler, client: str) -> None:
        for job in self.jobs.values():  # its ranks' pushed locations end with its stream
            job.pusher.client_gone(client)

    async def _tick(self) -> None:
        if self.scheduler is None or self.scheduler.status != Status.running:
            return  # closing: no new tasks (their client is going away)
        if self.storage is not None:
            self.storage.tick(self.jobs)  # starts a poll now and then; never waits for it
        for job in list(self.jobs.values()):
            await job.tick()

    async def client(self):
        """An asynchronous Dask client on the scheduler's own loop, created on first use."""
        async with self._client_lock:
            if self._client is None:
                from distributed import Client

                self._client = await Client(
                    self.scheduler.address,
                    asynchronous=True,
                    name="mdata-planner",
                    security=_client_security(self.scheduler.security),
                    set_as_default=False,
                )
            return self._client

    # -- handlers ----------------------------------------------------------------------------------
    async def register_job(self, req: msg.RegisterJobRequest) -> msg.JobInfo:
        """Register ``job`` with a plan spec; idempotent for the same plan. A checkpoint for a
        job that runs already rewinds it to the checkpoint's step (never silently ignored)."""
        check_job_name(req.handler.value, req.job)
        async with self._register_locks.of(req.job):  # one job's listing never blocks another
            info = await self._register(req)
            self.callers.registered(req.job, req.client)  # a driver of the job from now on
            return info

    async def _register(self, req: msg.RegisterJobRequest) -> msg.JobInfo:
        job, checkpoint = req.job, req.checkpoint
        options = ps.ResumeOptions(req.accept_appended_shards, req.allow_mixture_change)
        plan_obj = _plan_of(req.plan)
        if checkpoint is not None:
            Checkpoint.from_dict(checkpoint)  # a CheckpointError naming what is wrong
        fingerprint = plan_obj.fingerprint()
        existing = self.jobs.get(job)
        if existing is not None:
            if existing.fingerprint != fingerprint:
                raise PlanError(
                    f"job {job!r} is already running another plan (fingerprint "
                    f"{existing.fingerprint} vs {fingerprint}); use another job name or close it"
                )
            if checkpoint is not None and not req.by_loader:  # a Loader's attach decides
                await rewind_for_driver(existing, dict(checkpoint), options)
            return self._job_info(existing)
        from mdata import config

        await wait_for_pools(self.scheduler, plan_obj, pool_resource, config.seconds("planner.pool-wait"))
        client = await self.client()
        listings, with_images, quarantined = await list_sources(
            client, self.scheduler, plan_obj, pool_resource, config.seconds("planner.listing-timeout"))
        plan_obj.check_image_token(with_images)

        lineage_steps = config.get("planner.lineage-steps")
        if checkpoint is not None:
            state = ps.PlannerState.from_checkpoint(
                plan_obj, listings, Checkpoint.from_dict(checkpoint), job=job,
                lineage_steps=lineage_steps, options=options,
            )
            _log_resume(job, state)
        else:
            state = ps.PlannerState(plan_obj, listings, job=job, lineage_steps=lineage_steps)
        runtime = JobRuntime(self.scheduler, client, job, plan_obj, state, listings, lineage_steps,
                             resume_options=options)
        runtime.scaler_status = self.scaler_status
        runtime.listed_quarantine = quarantined  # shards listed with no rows (on_corrupt="skip")
        self.jobs[job] = runtime
        self.standbys.job_registered(plan_obj)  # the pools' standbys open the job's sources
        await runtime.tick()
        freeze_long_lived(f"job {job!r} registered")  # its plan and listings live as long as it
        logger.info("mdata job %s registered: %s", job, plan_obj)
        return self._job_info(runtime)

    def _job_info(self, runtime: JobRuntime) -> msg.JobInfo:
        mesh = runtime.plan.mesh
        return msg.JobInfo(
            job=runtime.job,
            fingerprint=runtime.fingerprint,
            start_step=runtime.view.consumed_step,
            broadcast=runtime.plan.broadcast,
            mesh=msg.MeshShape.of(mesh),
            world_size=int(mesh.world_size),
        )

    def job_info(self, req: msg.JobInfoRequest) -> msg.JobInfo:
        return self._job_info(known_job(self.jobs, req.job))

    def list_jobs(self, req: msg.JobsRequest) -> msg.JobsReply:
        return msg.JobsReply(tuple(sorted(self.jobs)))

    def who_has(self, req: msg.WhoHasRequest) -> msg.WhoHasReply:
        tasks = self.scheduler.tasks
        out = []
        for key in req.keys:
            ts = tasks.get(as_key(key))
            # None: the scheduler forgot the chunk (its job released it), so nobody will load it
            # again and a constructor waiting for it should give up now, not at its deadline.
            out.append(None if ts is None else tuple(ws.address for ws in ts.who_has or ()))
        return msg.WhoHasReply(tuple(out))

    def scaler_report(self, req: msg.ScalerReportRequest) -> msg.OkReply:
        """A pool autoscaler's status: every job's status and the dashboard show it."""
        self.scaler_status = req.status
        for runtime in self.jobs.values():
            runtime.scaler_status = req.status
        return msg.OkReply()

    async def close_job(self, req: msg.CloseJobRequest) -> msg.OkReply:
        runtime = self.jobs.get(req.job)
        if runtime is not None:  # only its driver or one of its Loaders (mdata.planner.callers)
            self.callers.check(req.handler.value, req.job, req.client,
                               [h.client for h in runtime.roster.holders().values()])
            if self.jobs.pop(req.job, None) is runtime:
                self.callers.forget(req.job)
                self._register_locks.forget(req.job)
                await runtime.close()
        return msg.OkReply()


def _log_resume(job: str, state) -> None:
    resume = state.resume
    if resume.grown or resume.mixture_changed:
        logger.warning("mdata job %s resumed at step %d with %s", job, state.consumed_step, ", ".join(
            [f"{n} shards appended to source {s!r}" for s, n in resume.grown.items()]
            + (["a new mixture (its carries restart)"] if resume.mixture_changed else [])))


def _plan_of(spec) -> Plan:
    """The Plan of a registration, read without importing any client code: sources stay specs
    (their transforms are imported on the loaders), cost models and mixtures are resolved only
    from mdata's built-ins and the modules this scheduler trusts (docs/plan-files.md)."""
    plan = Plan.from_spec(spec, build_sources=False, trust=scheduler_trust()).validate()
    names_only = [s for s in plan.sources if isinstance(s, str)]
    if names_only:
        raise PlanError(
            f"sources {names_only} are given by name only; a job needs each source's url, format "
            "and transform (pass mdata.sources.Source values to the Plan)")
    return plan


def _client_security(security):
    """The Planner's own client speaks TLS with the scheduler's identity.

    ``dask scheduler --tls-cert/--tls-key`` gives the scheduler a server certificate only, but
    Dask's TLS is mutual: a client must present one too. The scheduler's certificate is the
    natural identity for a client that runs inside the scheduler.
    """
    if security is None or getattr(security, "tls_client_cert", None) or not getattr(
        security, "tls_scheduler_cert", None
    ):
        return security
    from distributed.security import Security

    return Security(
        tls_ca_file=security.tls_ca_file,
        tls_client_cert=security.tls_scheduler_cert,
        tls_client_key=security.tls_scheduler_key,
        tls_ciphers=security.tls_ciphers,
        require_encryption=security.require_encryption,
    )


async def dask_setup(scheduler) -> None:
    """Preload entry point: ``dask scheduler --preload scheduler_plugins.planner``."""
    scheduler.add_plugin(PlannerPlugin(), name=PLUGIN)
