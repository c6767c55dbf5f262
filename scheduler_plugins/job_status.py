"""What one job tells about itself: its status, which of its sources wait on storage, and what
``on_corrupt="skip"`` passed over.

Read by the ``mdata_status``, ``mdata_job_storage_waits`` and ``mdata_lineage`` handlers
(:mod:`scheduler_plugins.planner`), by ``JobHandle.status`` and the demo through them, and by the
dashboard. Everything comes from the runtime's counters and the Planner's published view
(:mod:`scheduler_plugins.planner_view`), never from the Planner's state itself, so a status is
answered on the event loop without waiting for the job's lock.
"""

from __future__ import annotations

import time

from mdata.wire.messages import StatusCounters, StatusReply, StorageWaitInfo
from scheduler_plugins.job_runtime import JobRuntime

__all__ = ["job_status", "quarantined", "storage_wait_infos"]


def job_status(runtime: JobRuntime, max_steps: int = 10_000) -> StatusReply:
    """A snapshot for trainers, the demo summary and the dashboard (counters from the view);
    ``max_steps``: the newest steps' summaries it carries."""
    view = runtime.view
    summaries = runtime.step_summaries
    return StatusReply(
        job=runtime.job,
        failure=runtime.failure,
        uptime_s=time.time() - runtime.started,
        steps={str(k): summaries[k] for k in summaries.newest(max_steps)},
        pool_targets=dict(runtime.pool_targets),
        chunks_in_memory=len(runtime.loads),
        batches_in_memory=len(runtime.batches),
        trainer_wait_s={str(k): float(v) for k, v in runtime.wait_seconds.items()},
        trainer_stall_s={str(k): float(v) for k, v in runtime.stalled_seconds.items()},
        consumed_steps={str(k): int(v) for k, v in runtime.consumed_steps.items()},
        counters=StatusCounters(
            planned_step=view.planned_step,
            balanced_step=view.balanced_step,
            consumed_step=view.consumed_step,
            chunks_loaded=view.chunks_loaded,
            truncated=view.truncated,
            skipped=dict(view.skipped),
        ),
        storage_waits=storage_wait_infos(runtime),
        **({} if runtime.scaler_status is None else {"autoscaler": runtime.scaler_status}),
        **({} if runtime.lineage is None else {"lineage": runtime.lineage.info()}),
        recoveries=runtime.recoveries.counts(),
        quarantined=quarantined(runtime),
    )


def storage_wait_infos(runtime: JobRuntime) -> dict[str, StorageWaitInfo]:
    """The job's sources waiting on storage now, as the status and a late Loader's
    :class:`~mdata.wire.messages.JobStorageWaitsRequest` report them."""
    now = time.time()
    return {name: StorageWaitInfo.of(wait, now) for name, wait in runtime.storage_waits.items()}


def quarantined(runtime: JobRuntime) -> dict[str, list]:
    """Per source, what on_corrupt="skip" passed over: shards listed with no rows, then the
    chunks the Planner quarantined (:mod:`mdata.planner.quarantine`)."""
    out = {name: list(entries) for name, entries in runtime.listed_quarantine.items()}
    for name, entries in runtime.view.quarantined.items():
        out.setdefault(name, []).extend(entries)
    return out
