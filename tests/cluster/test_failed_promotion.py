"""A standby whose promotion fails leaves its pool with a loader (mdata.pools.standbys promotion_failed).

A text pool of one loader and one standby. The standby's process is frozen (SIGSTOP) and the
loader is killed with SIGKILL: the Planner promotes the standby, whose role call never answers.
Its nanny restarts the loader meanwhile, and the book, which counted the standby as loader, demotes
the restart to pay the pool's debt: before the rollback the pool had no loader for as long as the
standby stayed frozen. Now the call times out, the standby is a standby again and the restart is
promoted back; a job reads the pool's sources while the standby is still frozen, and after the
standby is killed with SIGKILL too the pool keeps its loader.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from conftest import run_loaders
from mdata.driver import JobHandle, submit_job
from test_failures import plan_for
from test_shadow_loaders import book, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


@pytest.fixture
def frozen_standby_cluster(example_sources_small):
    import dask
    import distributed  # noqa: F401  its configuration defaults, before dask.config.set
    from mdata.driver import PoolSpec, start_cluster
    from mdata.sources import TokenizeText

    sources = [s for s in example_sources_small if isinstance(s.transform, TokenizeText)][:2]
    pools = [PoolSpec("text", tuple(s.name for s in sources), workers=1, standbys=1)]
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1 hour"}), \
            start_cluster(sources, pools=pools, constructors=1, constructor_threads=1,
                          dashboard_address=None, autoscale=False) as cluster, \
            cluster.client() as client:
        client.wait_for_workers(3, timeout=120)
        yield client, sources


def _loaders_on_scheduler(client, resource: str) -> list[str]:
    return [a for a, w in client.scheduler_info()["workers"].items()
            if w.get("resources", {}).get(resource, 0) > 0]


def test_a_failed_promotion_is_rolled_back_and_the_pool_keeps_a_loader(frozen_standby_cluster):
    client, sources = frozen_standby_cluster
    pool = f"pool_{sources[0].name}"
    (loader,) = _loaders_on_scheduler(client, pool)
    (standby,) = [a for a, w in book(client)["workers"].items() if w["role"] == "standby"]
    pids = client.run(os.getpid)
    os.kill(pids[standby], signal.SIGSTOP)  # alive for the scheduler, answers nothing
    try:
        killed = time.monotonic()
        os.kill(pids[loader], signal.SIGKILL)
        # the restarted loader joins and ends up the loader; the frozen standby stays a standby
        restarted = wait_for(lambda: [a for a in _loaders_on_scheduler(client, pool)
                                      if a not in (loader, standby)],
                             "a loader on the scheduler while the standby is frozen", timeout=90)
        recovered_s = time.monotonic() - killed
        snap = book(client)["workers"]
        assert snap[standby]["role"] == "standby" and snap[restarted[0]]["role"] == "loader", snap
        assert _loaders_on_scheduler(client, f"standby_{sources[0].name}") == [standby] or \
            standby not in _loaders_on_scheduler(client, pool)
        # the pool serves: a job reads its sources while the standby is still frozen
        plan = plan_for(sources, global_batch=8)
        submit_job(client, plan, job="after-rollback")
        got = run_loaders(client, job="after-rollback", world_size=2, steps=2, timeout=60)
        assert [len(got[r]) for r in (0, 1)] == [2, 2]
        JobHandle(client, "after-rollback").close()
    finally:
        os.kill(pids[standby], signal.SIGKILL)  # its promotion can never complete now
    # the frozen standby's loss takes nothing from the pool: its loader stays
    wait_for(lambda: standby not in client.scheduler_info()["workers"], "the standby's removal")
    assert restarted[0] in _loaders_on_scheduler(client, pool)
    print(f"pool had a loader again {recovered_s:.1f}s after the loader was killed")
