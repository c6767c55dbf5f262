"""Off the happy path on a live cluster: resume rewinds the job, one Loader per rank, and a lost
constructor's batches are rebuilt. Each test compares what trainers received with an
uninterrupted run of the same plan (sample ids and a hash of the tokens), never with lineage alone.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from benchmarks.lockstep import token_hash
from conftest import run_loaders
from mdata.driver import submit_job
from mdata.errors import RankTakenError, ResumeMismatchError, StaleGenerationError
from mdata.trainer import Loader
from test_failures import plan_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def received(batch) -> tuple:
    """What a trainer got at one step: step, sample ids and a hash of every token it received."""
    return batch["step"], batch["sample_ids"].tolist(), token_hash(batch)


def close(client, *jobs: str) -> None:
    for job in jobs:
        client.sync(client.scheduler.mdata_close_job, job=job, client=client.id)


def test_resuming_on_the_live_cluster_rewinds_the_job_for_every_rank(client, example_sources_small):
    """Ranks trained to step 7, checkpointed after step 3, and restart from that checkpoint while
    the job still runs: they receive steps 4.. again, identical to the uninterrupted run."""
    plan = plan_for(example_sources_small[:4])
    submit_job(client, plan, job="reference")
    reference = run_loaders(client, job="reference", world_size=2, steps=10, keep=received)

    submit_job(client, plan, job="live")
    states: dict[int, dict] = {}
    run_loaders(client, job="live", world_size=2, steps=4, keep=received, states=states)
    assert all(s["next_step"] == 4 for s in states.values())
    past = run_loaders(client, job="live", world_size=2, steps=4, keep=received)  # steps 4..7
    assert [b[0] for b in past[0]] == [4, 5, 6, 7]

    resumed = run_loaders(client, job="live", world_size=2, steps=6, keep=received,
                          checkpoints=states)
    for rank in range(2):
        assert [b[0] for b in resumed[rank]] == list(range(4, 10))
        assert resumed[rank] == reference[rank][4:10]
    close(client, "reference", "live")


def test_ranks_resuming_from_different_steps_get_an_error_naming_them(client, example_sources_small):
    plan = plan_for(example_sources_small[:4])
    submit_job(client, plan, job="mixed")
    early: dict[int, dict] = {}
    run_loaders(client, job="mixed", world_size=2, steps=2, states=early)
    late: dict[int, dict] = {}
    run_loaders(client, job="mixed", world_size=2, steps=2, states=late)
    with Loader(client, job="mixed", rank=0, world_size=2, checkpoint=late[0], timeout=30) as l0:
        l0.attach()  # rank 0 resumes from step 4
        with Loader(client, job="mixed", rank=1, world_size=2, checkpoint=early[1],
                    timeout=30) as l1:
            with pytest.raises(ResumeMismatchError, match=r"step 2.*started at step 4"):
                l1.attach()
    close(client, "mixed")


def test_a_second_loader_for_a_live_rank_is_refused_and_a_closed_one_is_taken_over(
        client, example_sources_small):
    plan = plan_for(example_sources_small[:4])
    submit_job(client, plan, job="lease")
    first = Loader(client.scheduler.address, job="lease", rank=0, world_size=2, timeout=3)
    first.attach()
    try:
        second = Loader(client.scheduler.address, job="lease", rank=0, world_size=2, timeout=3)
        with pytest.raises(RankTakenError, match="already served by Loader") as err:
            second.attach()
        assert first._token[:8] in str(err.value) and second._token[:8] in str(err.value)
        second.close()
    finally:
        first.close()
    third = Loader(client.scheduler.address, job="lease", rank=0, world_size=2, timeout=3)
    assert third.attach()["start_step"] == 0  # the closed Loader's rank is free again
    third.close()
    close(client, "lease")


def test_a_loader_of_a_rewound_generation_is_told_to_restart(client, example_sources_small):
    plan = plan_for(example_sources_small[:4])
    submit_job(client, plan, job="stale")
    states: dict[int, dict] = {}
    run_loaders(client, job="stale", world_size=2, steps=2, states=states)
    old = Loader(client, job="stale", rank=1, world_size=2, timeout=30)
    old.attach()
    with Loader(client, job="stale", rank=0, world_size=2, checkpoint=states[0], timeout=30) as new:
        new.attach()  # rank 0 joined generation 0 before: its resume starts generation 1
        with pytest.raises(StaleGenerationError, match="rewound to step 2"):
            next(iter(old))
    old.close()
    close(client, "stale")


@pytest.fixture
def constructor_cluster(example_sources_small):
    from mdata.driver import PoolSpec, start_cluster

    sources = example_sources_small[:4]
    pools = [PoolSpec("text", tuple(s.name for s in sources), workers=1, threads=2)]
    with start_cluster(sources, pools=pools, constructors=1, constructor_threads=1,
                       autoscale=False) as cluster:
        with cluster.client() as c:
            yield c


def kill_the_constructor(client, job: str, step: int) -> None:
    """kill -9 the constructor once the batches of ``step`` are planned (and built or building)."""
    deadline = time.monotonic() + 60
    while client.sync(client.scheduler.mdata_status, job=job)["counters"]["balanced_step"] < step + 1:
        assert time.monotonic() < deadline, "the job did not plan ahead"
        time.sleep(0.05)
    workers = [a for a, w in client.scheduler_info()["workers"].items()
               if "mdata_constructor" in w.get("resources", {})]
    pid = client.run(os.getpid, workers=workers)[workers[0]]
    os.kill(pid, signal.SIGKILL)


@pytest.mark.slow  # a constructor's kill -9: test_group_faults.py[constructor-tp], test_chaos_all_faults_in_one_run
def test_losing_the_constructor_loses_no_sample(constructor_cluster, example_sources_small):
    """kill -9 the constructor worker mid-run: the nanny restarts it, the batches it held are
    rebuilt, trainers locate them again and receive exactly the uninterrupted sequence."""
    client = constructor_cluster
    plan = plan_for(example_sources_small[:4])
    steps = 8
    submit_job(client, plan, job="reference")
    reference = run_loaders(client, job="reference", world_size=2, steps=steps, keep=received)
    close(client, "reference")

    submit_job(client, plan, job="crash")
    got: dict[int, list] = {0: [], 1: []}
    with Loader(client, job="crash", rank=0, world_size=2, timeout=90) as l0, \
         Loader(client, job="crash", rank=1, world_size=2, timeout=90) as l1:
        it0, it1 = iter(l0), iter(l1)
        for step in range(steps):
            if step in (0, 4):  # first while the window's batches wait unfetched, then mid-run
                kill_the_constructor(client, "crash", step)
            got[0].append(received(next(it0)))
            got[1].append(received(next(it1)))
        l0.mark_consumed()
        l1.mark_consumed()
    assert got == {r: reference[r] for r in range(2)}
    status = client.sync(client.scheduler.mdata_status, job="crash")
    assert status["failure"] is None
    # the recovery happened: both kills lost built batches (the window's, not yet fetched or
    # not yet consumed), and each was built again
    assert status["recoveries"]["batches_rebuilt"] >= 2, status["recoveries"]
    close(client, "crash")
