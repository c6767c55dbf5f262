"""Resize loader pools from the Planner's decisions, through one small interface.

The Planner decides per source (:mod:`mdata.pools.demand`, with hysteresis and a reason for every
decision); :class:`PoolAutoscaler` reads those decisions of every job (or one) each ``interval``,
adds them up per pool (:func:`mdata.pools.scaling.pool_targets`) and applies the changes through a
:class:`WorkerGroups`: anything that can count and resize groups of workers. The embedded
``SpecCluster`` is one (:class:`EmbeddedGroups`); dask-jobqueue or dask-kubernetes worker groups
are others (docs/deploying.md, "Autoscaling pools"). It never dies of an error: it logs it, counts
it in :meth:`PoolAutoscaler.status` and tries again next interval; it reports its status and what
it applied to the Planner, so job status and the dashboard's sources page say it too.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from mdata.pools.scaling import merge_jobs, pool_targets
from mdata.wire.messages import (
    JobsRequest, PoolDecision, ScalerReportRequest, ScalerStatus, StatusRequest, ask, ask_sync,
    reply_timeout, within,
)

__all__ = ["WorkerGroups", "EmbeddedGroups", "PoolAutoscaler"]

logger = logging.getLogger("mdata.autoscale")


@runtime_checkable
class WorkerGroups(Protocol):
    """Groups of loader workers that can be counted and resized, one group per pool."""

    def groups(self) -> Mapping[str, tuple[str, ...]]:
        """Each group's name and the sources its workers load (``pool_<source>`` resources)."""

    def threads(self, group: str) -> int:
        """Loader threads per worker of ``group``."""

    def workers(self, group: str) -> int:
        """Workers ``group`` runs (or was last asked to run)."""

    def scale(self, group: str, n: int) -> None:
        """Run ``n`` workers in ``group``; retiring loaders is safe (their chunks load again)."""


class EmbeddedGroups:
    """:class:`WorkerGroups` of an embedded cluster (:func:`mdata.driver.start_cluster`)."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster

    def groups(self) -> dict[str, tuple[str, ...]]:
        """Each pool's name and the sources its workers load."""
        return {name: spec.sources for name, spec in self.cluster.pools.items()}

    def threads(self, group: str) -> int:
        """Loader threads per worker of pool ``group``."""
        return self.cluster.pools[group].threads

    def workers(self, group: str) -> int:
        """Workers pool ``group`` was last asked to run."""
        return self.cluster.pools[group].workers

    def scale(self, group: str, n: int) -> None:
        """Run ``n`` workers in pool ``group`` (:meth:`MdataCluster.scale_pool`)."""
        self.cluster.scale_pool(group, n)


class PoolAutoscaler:
    """Applies the Planner's pool decisions to :class:`WorkerGroups` every ``interval`` seconds.

    ``target`` is a :class:`WorkerGroups` or an embedded ``MdataCluster``; ``client`` a
    synchronous Dask client of the cluster (None for an embedded cluster: its own connection to
    the scheduler is used). ``job``: follow one job (None: every job on the cluster; jobs that
    read the same source add their demands). ``min_workers`` / ``max_workers`` bound every pool
    (``max_workers`` may map pool names to bounds; None: the machine's cores for an embedded
    cluster, no bound otherwise).
    """

    def __init__(self, target, client=None, job: str | None = None, *, interval: float | None = None,
                 min_workers: int = 1, max_workers: Mapping[str, int] | int | None = None,
                 history: int = 1000) -> None:
        from mdata import config

        embedded = not isinstance(target, WorkerGroups)
        self.groups: WorkerGroups = EmbeddedGroups(target) if embedded else target
        self._ask = _asker(target, client)
        self.job = job
        self.interval = config.seconds("pools.interval") if interval is None else float(interval)
        self.min_workers = int(min_workers)
        # an embedded cluster runs on one machine: more loaders per pool than cores only contend
        self.max_workers = (os.cpu_count() or 1) if max_workers is None and embedded else max_workers
        self.down_after = int(config.get("pools.down-after"))
        self._down: dict[str, list[int]] = {}  # pool -> lower targets of consecutive rounds
        #: every decision applied, oldest first (``current`` is the size it changed from)
        self.history: deque[PoolDecision] = deque(maxlen=history)
        self.errors = 0
        self.last_error = ""
        self.last_run = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- one round -------------------------------------------------------------------------------
    def step(self) -> list[PoolDecision]:
        """Read the jobs' decisions once, apply the pool changes they imply, report; returns the
        decisions applied."""
        jobs = [self.job] if self.job is not None else list(self._ask(JobsRequest()).jobs)
        per_job = [self._ask(StatusRequest(job, max_steps=0)).pool_targets for job in jobs]
        groups = self.groups.groups()
        current = {g: self.groups.workers(g) for g in groups}
        decisions = pool_targets(
            groups, merge_jobs(per_job), threads={g: self.groups.threads(g) for g in groups},
            current=current, min_workers=self.min_workers, max_workers=self.max_workers,
            wall=time.time())
        applied = []
        for pool, decision in decisions.items():
            if decision.workers < current[pool]:  # a shared pool shrinks after agreeing rounds
                wants = self._down.setdefault(pool, [])
                wants.append(decision.workers)
                if len(wants) < self.down_after:
                    continue
                decision = dataclasses.replace(
                    decision, workers=max(wants), reason=f"{decision.reason}; lower for "
                    f"{self.down_after} rounds")
            self._down.pop(pool, None)
            if decision.workers != current[pool]:
                self.groups.scale(pool, decision.workers)
                logger.info("mdata autoscaler: pool %s %d -> %d: %s", pool, current[pool],
                            decision.workers, decision.reason)
                self.history.append(decision)
                applied.append(decision)
        self.last_run = time.time()
        self._report()
        return applied

    def status(self) -> ScalerStatus:
        """Running or not, errors survived (and the last one), last run, workers per group, the
        newest decisions applied."""
        groups = self.groups.groups()
        try:
            workers = {g: self.groups.workers(g) for g in groups}
        except Exception:  # noqa: BLE001 - a closing cluster: the status still answers
            workers = {}
        return ScalerStatus(running=self._thread is not None and self._thread.is_alive()
                            and not self._stop.is_set(), errors=self.errors,
                            last_error=self.last_error, last_run=self.last_run, workers=workers,
                            applied=tuple(list(self.history)[-20:]))

    def _report(self) -> None:
        self._ask(ScalerReportRequest(self.status()))

    # -- the loop ----------------------------------------------------------------------------------
    def start(self) -> "PoolAutoscaler":
        """Run :meth:`step` every ``interval`` seconds in a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return self
        self._thread = threading.Thread(target=self._loop, name="mdata-autoscale", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - scaling is best effort; say so, go on
                if self._stop.is_set():
                    return
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.warning("mdata autoscaler: error %d (it keeps going): %s\n%s", self.errors,
                               self.last_error, traceback.format_exc())
                try:
                    self._report()
                except Exception:  # noqa: BLE001 - the scheduler may be the trouble
                    pass

    def stop(self) -> None:
        """Stop the loop (the pools keep their size)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 10)


def _asker(target, client) -> Callable[[Any], Any]:
    """How requests reach the scheduler: through ``client``, else the embedded cluster's own
    connection (``SpecCluster.scheduler_comm``, no extra client)."""
    if client is not None:
        return lambda request: ask_sync(client, request)
    spec = getattr(target, "cluster", None)
    if spec is None or not hasattr(spec, "scheduler_comm"):
        raise TypeError("PoolAutoscaler needs a client unless it scales an embedded MdataCluster")
    return lambda request: spec.sync(lambda: within(ask(spec.scheduler_comm, request), request,
                                                    spec.scheduler_comm.address, reply_timeout(request)))
