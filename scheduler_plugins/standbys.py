"""Carries out the standby decisions of :mod:`mdata.pools.standbys` on the scheduler.

The Planner plugin tells the :class:`StandbyKeeper` what the scheduler saw (a worker joined or
left, a job registered); the pure :class:`~mdata.pools.standbys.StandbyBook` decides, and this module
only executes:

* **promotion** (a loader died): the standby's own accounting first (``mdata_set_role``), then the
  scheduler's, then the tasks the loss left without a worker (``no-worker``: Dask recomputes a dead
  loader's chunks the jobs still hold futures for) are scheduled on it at once, on a warm process;
* **demotion** (a loader joined a pool that owes a standby, usually the dead loader restarted by its
  nanny): the scheduler's side first, synchronously inside ``add_worker`` before Dask schedules
  anything on the newcomer, then the worker's, then it is warmed;
* **warming**: a task pinned to the standby that opens the sources of every registered job its
  pool serves (:func:`workers.standby.warm_sources_task`).

The scheduler's view of a worker's resources is replaced exactly (a resource the worker gave up
disappears from ``scheduler_info()``, it is not left at 0), and what tasks hold stays accounted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from distributed.core import Status

from mdata.pools.standbys import Role, RoleChange, StandbyBook, Warm
from mdata.wire.messages import SetRoleRequest, ask

logger = logging.getLogger("mdata.planner")

ROLE_ATTEMPTS = 20  # a worker that just registered installs mdata's handlers a moment later
ROLE_TIMEOUT_S = 5.0  # a role change not answered by then failed (a hung or frozen worker)


class StandbyKeeper:
    """The pools' loaders and standbys on one scheduler (shared by every job)."""

    def __init__(self, scheduler, client: Callable[[], Awaitable[Any]]) -> None:
        self.scheduler = scheduler
        self.client = client  # the Planner's own asynchronous client (for warm tasks)
        self.book = StandbyBook()
        self.sources: dict[str, Any] = {}  # source name -> Source, from registered jobs
        # when, who replaced whom, how long the promotion took (logs, tests): the recent ones
        self.promotions: deque[dict[str, Any]] = deque(maxlen=1000)
        self._warming: dict[str, set[asyncio.Task]] = {}  # address -> warming under way
        self._tasks: set[asyncio.Task] = set()

    # -- what the scheduler saw --------------------------------------------------------------------
    def worker_added(self, address: str) -> None:
        ws = self.scheduler.workers.get(address)
        if ws is None:
            return
        self._carry_out(self.book.added(address, dict(ws.resources)))

    def worker_removed(self, address: str) -> None:
        if self.scheduler.status in (Status.closing, Status.closed):
            return  # the cluster is shutting down: nobody replaces anybody
        for task in self._warming.pop(address, ()):  # pinned to a dead worker, it would wait forever
            task.cancel()
        self._carry_out(self.book.removed(address, expected=_retired(self.scheduler, address)))

    def job_registered(self, plan) -> None:
        for source in plan.sources:
            if not isinstance(source, str):
                self.sources[source.name] = source
        self._carry_out(self.book.warm_for(plan.source_names))

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._warming.clear()

    # -- execution ---------------------------------------------------------------------------------
    def _carry_out(self, decisions: list[RoleChange | Warm]) -> None:
        for decision in decisions:
            if isinstance(decision, Warm):
                self._spawn(self._warm(decision), address=decision.address)
            elif decision.role is Role.STANDBY:
                # before add_worker returns to Dask's scheduling: no load task may land here now
                _set_scheduler_resources(self.scheduler, decision)
                self._spawn(self._tell_worker(decision))
            else:
                self._spawn(self._promote(decision))

    async def _promote(self, change: RoleChange) -> None:
        began = time.monotonic()
        if not (await self._tell_worker(change) and _set_scheduler_resources(self.scheduler, change)):
            # it died, hung or refused: a standby again, and the pool gets a loader another way
            # (mdata.pools.standbys.StandbyBook.promotion_failed)
            decisions = self.book.promotion_failed(change.address)
            logger.warning("mdata: promoting standby %s in place of %s failed; %s", change.address,
                           change.replaces, ", ".join(f"promoting {d.address} instead"
                                                      for d in decisions) or "no other standby")
            self._carry_out(decisions)
            return
        self.book.promoted(change.address)
        self.promotions.append({"time": time.time(), "standby": change.address,
                                "replaces": change.replaces, "seconds": time.monotonic() - began})
        logger.info("mdata: standby %s promoted to loader of %s in place of %s", change.address,
                    sorted(change.resources), change.replaces)
        ws = self.scheduler.workers[change.address]
        if ws in self.scheduler.running:  # (otherwise Dask does this when it runs again)
            # the dead loader's recomputed chunks wait in no-worker for a worker with the pool
            # resource: schedule them here now
            stimulus = f"mdata-promote-{change.address}-{time.time():.3f}"
            self.scheduler.transitions(
                self.scheduler.bulk_schedule_unrunnable_after_adding_worker(ws), stimulus)
            self.scheduler.stimulus_queue_slots_maybe_opened(stimulus_id=stimulus)

    async def _tell_worker(self, change: RoleChange) -> bool:
        request = SetRoleRequest(change.role.value, dict(change.resources), tuple(change.drop))
        for attempt in range(ROLE_ATTEMPTS):
            if change.address not in self.scheduler.workers:
                return False
            try:
                await asyncio.wait_for(ask(self.scheduler.rpc(change.address), request),
                                       ROLE_TIMEOUT_S)
                return True
            except (OSError, asyncio.TimeoutError) as exc:
                logger.warning("mdata: cannot reach %s to make it a %s: %s", change.address,
                               change.role, exc)
                return False
            except Exception as exc:  # no handler yet: mdata's worker plugin is being installed
                if attempt == ROLE_ATTEMPTS - 1:
                    logger.error("mdata: %s refused to become a %s: %r", change.address, change.role, exc)
                    return False
                await asyncio.sleep(0.1)
        return False

    async def _warm(self, warm: Warm) -> None:
        from workers.standby import warm_sources_task

        sources = [self.sources[name] for name in warm.sources if name in self.sources]
        if not sources or warm.address not in self.scheduler.workers:
            return  # no registered job reads them yet: the job's registration warms them
        client = await self.client()
        future = client.submit(warm_sources_task, sources, workers=[warm.address],
                               allow_other_workers=False, pure=False,
                               key=("mdata-warm", warm.address, time.time_ns()))
        try:
            report = await future
        except Exception as exc:  # the task failed: the real load task will say why
            logger.warning("mdata: warming %s on %s failed: %r", warm.sources, warm.address, exc)
            return
        finally:
            future.release()  # also when cancelled because the worker left (see worker_removed)
        self.book.warmed(warm.address, [name for name, r in report.items() if "error" not in r])
        logger.info("mdata: standby %s warm for %s", warm.address, report)

    def _spawn(self, coro, address: str | None = None) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        if address is not None:
            self._warming.setdefault(address, set()).add(task)
            task.add_done_callback(lambda t: self._warming.get(address, set()).discard(t))

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("mdata standby keeper failed", exc_info=task.exception())


def _set_scheduler_resources(scheduler, change: RoleChange) -> bool:
    """Replace the scheduler's view of the worker's mdata resources; False if it is gone.

    ``Scheduler.add_resources`` only adds (and resets what running tasks use), so the maps are
    edited directly: ``ws.resources`` and ``scheduler.resources[r][address]`` stay in step, as
    ``remove_resources`` expects; ``used_resources`` keeps its entries, so a task holding a
    dropped resource releases it cleanly."""
    ws = scheduler.workers.get(change.address)
    if ws is None:
        return False
    for resource in change.drop:
        if resource not in change.resources and resource in ws.resources:
            del ws.resources[resource]
            scheduler.resources.get(resource, {}).pop(change.address, None)
    for resource, amount in change.resources.items():
        ws.resources[resource] = amount
        ws.used_resources.setdefault(resource, 0)
        scheduler.resources.setdefault(resource, {})[change.address] = amount
    return True


def _retired(scheduler, address: str) -> bool:
    """Whether the scheduler removed ``address`` on purpose (``retire_workers``: a pool scaled
    down), as its last ``remove-worker`` event says; a crash or a lost connection is not."""
    try:
        events = scheduler.get_events(address)
    except Exception:  # no event topic for this worker: not retired
        return False
    for _, event in reversed(events):
        if isinstance(event, dict) and event.get("action") == "remove-worker":
            return bool(event.get("expected"))
    return False
