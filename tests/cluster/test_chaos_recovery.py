"""Chaos scenarios that need mdata's recovery: a constructor killed, a trainer killed and every
rank resumed on the live cluster, the S3 server killed and restarted, and all of them in one run.

Each compares what every rank trained on with the uninterrupted reference, exactly as
``test_chaos.py`` does: identical sample ids and token hashes at every step, nothing lost or
repeated; and asserts that the recovery happened (the job's status counts the batches rebuilt,
the chunks reloaded and the storage outages ridden through; a rewind shows in what the restarted
trainers received), so a fault that landed too late or nowhere cannot pass for one ridden through.
"""

from __future__ import annotations

import time

import pytest

from chaos_scenario import (  # noqa: F401  (fixtures)
    CHECKPOINT_EVERY, END_STEP, GLOBAL_BATCH, STEP_SLEEP, TRAINER_TIMEOUT, chaos_cluster, chaos_plan,
    local_sources, reference_run, s3_corpus, s3_sources,
)
from fault_sequences import assert_exactly_once, assert_same_sequences
from faults import (
    TrainerGroup, close_job, constructor_worker, kill9, loader_holding_chunks, recoveries, wait_for_workers,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

# how long the S3 server stays down once trainers starve: several of mdata's retries (botocore's
# own are off, see s3_sources)
OUTAGE_S = 6.0


def faulted_group(tmp_path, job: str, plan) -> TrainerGroup:
    return TrainerGroup(tmp_path, job=job, world_size=2, end_step=END_STEP, plan=plan,
                        checkpoint_every=CHECKPOINT_EVERY, step_sleep=STEP_SLEEP, timeout=TRAINER_TIMEOUT)


def last_step(group: TrainerGroup) -> int:
    return max(group.current(r).log().last_step for r in range(group.world_size))


def kill_a_loader(cluster, group: TrainerGroup) -> str:
    client = cluster.client()
    address, pid, _ = loader_holding_chunks(client, "pool_chat", job=group.job)
    kill9(pid)
    return address


def kill_the_constructor(cluster) -> str:
    address, pid = constructor_worker(cluster.client())
    kill9(pid)
    return address


def storage_outage(server, group: TrainerGroup) -> None:
    """Crash the S3 server, wait until the trainers starve for data, keep it down OUTAGE_S longer
    (mdata's retry loop sees the failures at once: botocore's own retries are off), then bring it back."""
    server.kill()
    assert not server.answers()
    stalled = group.wait_until_stalled()
    assert stalled, "the trainers finished without needing storage: start the outage earlier"
    time.sleep(OUTAGE_S)
    server.start()


def check(group: TrainerGroup, reference, plan, what: str) -> None:
    got = group.received()
    assert_same_sequences(reference, got, what=what)
    assert_exactly_once(got, plan.mesh, global_batch=GLOBAL_BATCH)


def assert_recovered(cluster, group: TrainerGroup, **at_least: int) -> None:
    """The job's status counts at least these recoveries (``batches_rebuilt=1``...)."""
    counts = recoveries(cluster.client(), group.job)
    short = {k: (counts[k], n) for k, n in at_least.items() if counts[k] < n}
    assert not short, f"recoveries (counted, wanted at least) {short}; all counts {counts}"


def assert_rewound(group: TrainerGroup, resume: int) -> None:
    """Every rank's restarted process was served from step ``resume`` on (a Planner that kept
    its own position instead of rewinding would have served it from there)."""
    for rank in range(group.world_size):
        restarted = group.current(rank).log()
        assert [b.step for b in restarted.batches] == list(range(resume, END_STEP)), (rank, resume)


@pytest.mark.slow  # one fault of test_chaos_all_faults_in_one_run, which runs by default
def test_constructor_kill_loses_nothing(chaos_cluster, local_sources, reference_run, tmp_path):
    """kill -9 the only constructor mid-run: the batches it held (built, not yet pulled) are
    built again on its replacement and the trainers see the same sequence."""
    plan = chaos_plan(local_sources)
    group = faulted_group(tmp_path, "constructor-kill", plan)
    try:
        group.start(chaos_cluster.address)
        group.wait_for_step(5)
        address = kill_the_constructor(chaos_cluster)
        assert last_step(group) < END_STEP - 1
        wait_for_workers(chaos_cluster.client(), "mdata_constructor", 1, exclude=[address])
        group.wait_done(timeout=120)
    finally:
        group.kill_all()
    check(group, reference_run, plan, f"the run that lost constructor {address}")
    assert_recovered(chaos_cluster, group, batches_rebuilt=1)
    close_job(chaos_cluster.client(), group.job, plan)


@pytest.mark.slow  # one fault of test_chaos_all_faults_in_one_run, which runs by default
def test_trainer_kill_and_live_resume(chaos_cluster, local_sources, reference_run, tmp_path):
    """kill -9 one trainer at step ~12; the others are stopped, and every rank restarts from the
    last checkpoint all ranks saved, on the same live cluster and job: the job rewinds to that
    step and the sequence equals the uninterrupted one."""
    plan = chaos_plan(local_sources)
    group = faulted_group(tmp_path, "live-resume", plan)
    try:
        group.start(chaos_cluster.address)
        group.wait_for_step(12)
        group.kill9(1)
        resume = group.restart_from_last_common_checkpoint(chaos_cluster.address)
        assert resume >= 2 * CHECKPOINT_EVERY
        group.wait_done(timeout=120)
    finally:
        group.kill_all()
    check(group, reference_run, plan, f"the run resumed live at step {resume}")
    assert_rewound(group, resume)
    close_job(chaos_cluster.client(), group.job, plan)


@pytest.mark.slow  # one fault of test_chaos_all_faults_in_one_run, which runs by default
def test_storage_outage_is_waited_out(chaos_cluster, s3_sources, s3_corpus, reference_run, tmp_path):
    """The S3 server holding the shards crashes (kill -9) mid-run and stays down until the
    trainers starve, then OUTAGE_S more, and comes back with its data: loads fail meanwhile and
    are retried, trainers wait, nothing is lost."""
    server, _ = s3_corpus
    plan = chaos_plan(s3_sources)
    group = faulted_group(tmp_path, "storage-outage", plan)
    try:
        group.start(chaos_cluster.address)
        group.wait_for_step(5)
        storage_outage(server, group)
        group.wait_done(timeout=120)
    finally:
        group.kill_all()
        server.start()
    check(group, reference_run, plan, "the run through a storage outage")
    # counted from the loaders' cumulative counts of waits begun, even when no poll of the
    # Planner fell inside the wait itself
    assert_recovered(chaos_cluster, group, storage_outages=1)
    close_job(chaos_cluster.client(), group.job, plan)


def test_chaos_all_faults_in_one_run(chaos_cluster, s3_sources, s3_corpus, reference_run, tmp_path):
    """One run, every fault in turn: a loader, then the constructor, then the storage, then a
    trainer (all ranks resumed live from their checkpoints). Same sequence as without faults."""
    server, _ = s3_corpus
    plan = chaos_plan(s3_sources)
    group = faulted_group(tmp_path, "all-faults", plan)
    try:
        group.start(chaos_cluster.address)
        group.wait_for_step(3)
        kill_a_loader(chaos_cluster, group)
        group.wait_for_step(6)
        kill_the_constructor(chaos_cluster)
        group.wait_for_step(9)
        storage_outage(server, group)
        group.wait_for_step(14)
        group.kill9(1)
        resume = group.restart_from_last_common_checkpoint(chaos_cluster.address)
        group.wait_done(timeout=120)
    finally:
        group.kill_all()
        server.start()
    check(group, reference_run, plan, f"the run through every fault (resumed at step {resume})")
    assert_recovered(chaos_cluster, group, chunks_reloaded=1, batches_rebuilt=1, storage_outages=1)
    assert_rewound(group, resume)
    close_job(chaos_cluster.client(), group.job, plan)
