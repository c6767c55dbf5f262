"""``mdata cluster status ADDRESS``: what a running cluster does, in a few lines a person reads.

A user who started a cluster (``mdata cluster up``, the dask CLI, Kubernetes) and attached
trainers wants to know, without opening the dashboard: which workers serve which pools, which
jobs run, how far each got, whether trainers wait, and whether a source waits on storage. The
lines come from the Planner's own status of each job (``JobHandle.status()``) and the
scheduler's worker list; formatting is pure (:func:`describe_workers`, :func:`describe_job`), so
it is tested without a cluster.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from mdata.driver.progress import JobProgress

__all__ = ["cluster_status", "describe_job", "describe_workers"]


def describe_workers(workers: Mapping[str, Mapping[str, Any]]) -> str:
    """One line: how many workers, and what each kind serves (from their Dask resources)."""
    roles: Counter[str] = Counter()
    for info in workers.values():
        resources = info.get("resources") or {}
        names = sorted(k[len("pool_"):] for k, v in resources.items() if k.startswith("pool_") and v)
        if resources.get("mdata_constructor"):
            roles["constructor"] += 1
        elif names:
            roles["loader of " + "+".join(names)] += 1
        elif any(k.startswith("standby_") for k in resources):
            roles["standby"] += 1
        else:
            roles["other"] += 1
    kinds = ", ".join(f"{n} {role}" for role, n in sorted(roles.items()))
    return f"{len(workers)} workers" + (f": {kinds}" if kinds else "")


def describe_job(status: Mapping[str, Any], now: float | None = None) -> list[str]:
    """The lines of one job's ``JobHandle.status()``: progress, failure, trainers' waits (their
    prefetchers' and their training loops'), pool targets, sources waiting on storage."""
    now = time.time() if now is None else now
    c = status["counters"]
    progress = JobProgress.of(status)  # the figures `cluster up`'s live line shows too
    lines = [f"job {progress.job!r}: step {progress.step} consumed by every rank "
             f"(balanced up to {progress.balanced}, planned up to {progress.planned}), "
             f"up {progress.uptime_s:.0f}s"]
    if progress.failure:
        lines.append(f"  FAILED: {progress.failure}")
    waits, worst = progress.waits, JobProgress.worst(progress.waits)
    if worst is not None:
        lines.append(f"  trainers: {len(waits)} ranks attached; waited for data {sum(waits.values()):.1f}s "
                     f"in all, most rank {worst[0]} ({worst[1]:.1f}s)")
        stall = JobProgress.worst(progress.stalls)
        if stall is not None:
            lines.append(f"  training loops stalled on data: most rank {stall[0]} ({stall[1]:.1f}s)")
    else:
        lines.append("  trainers: none has asked for a batch yet")
    for source, target in sorted((status.get("pool_targets") or {}).items()):
        lines.append(f"  pool {source}: {target['workers']} workers wanted ({target['reason']})")
    storage = status.get("storage_waits") or {}
    if not storage:
        lines.append("  storage: no source is waiting")
    for source, wait in sorted(storage.items()):
        lines.append(f"  storage: source {source!r} waiting since {now - float(wait['since']):.0f}s ago, "
                     f"{wait['attempts']} attempts; last error: {wait['last_error']}")
    skipped = {s: n for s, n in (c.get("skipped") or {}).items() if n}
    if skipped:
        lines.append(f"  skipped samples: {skipped}")
    return lines


def cluster_status(client: Any) -> str:
    """Every line of ``mdata cluster status`` for the cluster ``client`` is connected to."""
    from mdata.driver.job import JobHandle

    info = client.scheduler_info()
    lines = [f"scheduler {info.get('address', client.scheduler.address)}: "
             + describe_workers(info.get("workers", {}))]
    jobs = JobHandle.jobs(client)
    if not jobs:
        lines.append("no job is registered (a plan registers one: `mdata cluster up --plan`, "
                     "submit_job, or the first Loader that brings plan=)")
    for job in jobs:
        lines += describe_job(JobHandle(client, job).status())
    return "\n".join(lines)
