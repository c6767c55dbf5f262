"""A closed job holds no task: none of its loads, summaries or batches stay on the scheduler once
``close_job`` answers, and a cluster closed after its jobs loses no computed task at shutdown.

Before, a job released its futures through the Planner client's batched stream, which the
scheduler read a little later: the scheduler still held the chunks and the batches planned ahead
when ``close_job`` answered, and a cluster closed right then logged "caused the cluster to lose
already computed task(s)" for them (scheduler_plugins.job_tasks).
"""

from __future__ import annotations

import logging

import pytest

from conftest import run_loaders
from mdata.cost import AttentionCost
from mdata.driver import JobHandle, submit_job
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.wire.messages import CloseJobRequest

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def _plan(sources) -> Plan:
    return (Plan(sources).mix({s.name: 1.0 for s in sources})
            .cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=2048, global_batch=8)
            .distribute(ClientPlaceTree(dp=2)).seed(5).window(4))


def _job_keys(tasks, job: str) -> list:
    return sorted(str(k) for k in tasks if isinstance(k, tuple) and len(k) > 1
                  and str(k[0]).startswith("mdata-") and k[1] == job)


async def _close_and_look(dask_scheduler, job: str, client_id: str) -> dict:
    """Close ``job`` through the Planner's real handler, and read the scheduler's tasks the moment
    it answers (nothing else runs on the scheduler's loop in between)."""
    before = _job_keys(dask_scheduler.tasks, job)
    await dask_scheduler.handlers["mdata_close_job"](**CloseJobRequest(job, client=client_id).to_msg())
    return {"before": before, "after": _job_keys(dask_scheduler.tasks, job)}


def test_closing_a_job_leaves_none_of_its_tasks_on_the_scheduler(client, example_sources_small):
    plan = _plan([s for s in example_sources_small if s.name in ("chat", "code", "books")])
    for i in range(3):
        job = f"closing-{i}"
        submit_job(client, plan, job=job)
        run_loaders(client, job=job, world_size=2, steps=2)  # steps 2..5 planned ahead, in memory
        seen = client.run_on_scheduler(_close_and_look, job=job, client_id=str(client.id))
        assert any("mdata-construct" in k for k in seen["before"]), seen["before"]
        assert any("mdata-load" in k for k in seen["before"]), seen["before"]
        assert seen["after"] == [], f"{len(seen['after'])} tasks of closed job {job}: {seen['after'][:6]}"
        assert job not in JobHandle.jobs(client)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_cluster_closed_right_after_its_jobs_loses_no_computed_task(example_sources_small):
    """``MdataCluster.close`` closes the jobs (one closed by its driver first, one still open, its
    trainers gone), then the workers and the scheduler; the scheduler's log says the workers
    left and never that it lost a computed task."""
    from distributed import Client

    from mdata.driver import start_cluster

    sources = [s for s in example_sources_small if s.name in ("chat", "code", "books")]
    plan = _plan(sources)
    scheduler_log = logging.getLogger("distributed.scheduler")
    capture, level = _Lines(), scheduler_log.level
    with start_cluster(sources, constructors=2, constructor_threads=1, autoscale=False,
                       dashboard_address=":0") as cluster:
        with Client(cluster.scheduler_address, set_as_default=False) as client:
            for job in ("open", "closed"):
                submit_job(client, plan, job=job)
                run_loaders(client, job=job, world_size=2, steps=2)
            JobHandle(client, "closed").close()
            held = client.run_on_scheduler(lambda dask_scheduler: _job_keys(dask_scheduler.tasks, "open"))
            assert any("mdata-construct" in k for k in held), held  # the open job holds batches
        scheduler_log.addHandler(capture)
        scheduler_log.setLevel(logging.INFO)
    scheduler_log.removeHandler(capture)
    scheduler_log.setLevel(level)
    assert any("Remove worker" in line for line in capture.lines), capture.lines[-20:]
    lost = [line for line in capture.lines if "lose already computed task" in line]
    assert lost == [], lost
