"""The Loader tells consumption without a round trip on the training loop, and loses none of it.

Consumption is what moves the Planner's window; if a told step were lost, the job would stall at
its window and the counters would say so. Steps the training loop consumed travel with the
prefetcher's next location request when one goes out within a moment, else on their own; the
last ones are sent when the Loader closes. With pushed locations (the default) the
prefetcher seldom asks, so these tests turn ``mdata.trainer.location-push`` off to see the
location requests carry consumption; tests/cluster/test_location_push.py covers the push.
"""

from __future__ import annotations

import threading
import time

import dask
import pytest

from mdata.cost import AttentionCost
from mdata.driver import JobHandle, submit_job
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.trainer import Loader

pytestmark = pytest.mark.cluster

STEPS = 10


@pytest.fixture(autouse=True)
def long_polls():
    with dask.config.set({"mdata.trainer.location-push": False}):
        yield


def test_every_consumed_step_reaches_the_planner_mostly_with_location_requests(
        mdata_cluster, client, example_sources_small):
    text = [s for s in example_sources_small if s.name in ("chat", "code")]
    plan = (Plan(text).mix({"chat": 1.0, "code": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=4096, global_batch=8)
            .distribute(ClientPlaceTree(dp=2, tp=2)).seed(5).window(2))
    submit_job(client, plan, job="told")
    told: dict[int, dict] = {}
    hubs: dict[int, object] = {}
    errors: list[BaseException] = []

    def rank_loop(rank: int) -> None:
        try:
            with Loader(client, job="told", rank=rank, world_size=4, steps=STEPS, timeout=60) as loader:
                for _ in loader:
                    hubs[rank] = loader._hub
                    loader.mark_consumed()  # returns without waiting for the scheduler
                loader.close()  # sends what no location request carried: nothing is lost
                told[rank] = dict(loader._teller.told)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=rank_loop, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    # every rank told every step: the window moved past all of them. A told step is answered
    # once queued for the Planner, not once applied (the long poll carrying it goes on at once),
    # so the last ones reach the counters a moment after the Loaders closed
    deadline = time.monotonic() + 15
    while True:
        status = JobHandle(client, "told").status()
        if status["counters"]["consumed_step"] == STEPS or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status["counters"]["consumed_step"] == STEPS, status["counters"]
    for rank, counts in told.items():
        assert counts["carried"] + counts["alone"] == STEPS, (rank, counts)
    # location requests carried some (how many depends on whether data or the loop is ahead:
    # the last steps, after the prefetcher's last request, always go alone)
    assert sum(c["carried"] for c in told.values()) >= 1, told
    # the four ranks share one client, so they asked where their batches are together: one
    # hub, fewer requests than asks (each rank asked at least once per step)
    assert len({id(hub) for hub in hubs.values()}) == 1
    hub = next(iter(hubs.values()))
    assert hub.asks >= 4 * STEPS and hub.requests < hub.asks, (hub.requests, hub.asks)
    JobHandle(client, "told").close()
