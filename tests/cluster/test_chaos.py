"""Chaos: faults never stop training and never lose or repeat a sample.

Each test runs the scenario of :mod:`chaos_scenario` with real processes (cluster, workers,
trainers), inflicts one fault with ``kill -9`` and compares what every rank trained on with an
uninterrupted run of the same plan: same steps, same sample ids, same tokens. The faults that need
mdata's own recovery (constructor loss, live resume, storage outage, all in one run) are in
``test_chaos_recovery.py``.
"""

from __future__ import annotations

import pytest

from chaos_scenario import (  # noqa: F401  (fixtures)
    CHECKPOINT_EVERY, END_STEP, GLOBAL_BATCH, STEP_SLEEP, TRAINER_TIMEOUT, chaos_cluster, chaos_plan,
    local_sources, reference_run, s3_corpus, s3_sources, start_chaos_cluster,
)
from fault_sequences import assert_exactly_once, assert_same_sequences
from faults import (
    TrainerGroup, close_job, kill9, loader_holding_chunks, recoveries, reference, uninterrupted_run,
    wait_for_workers,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


@pytest.mark.slow  # every fault test compares with the reference run, which would fail if it were not deterministic
def test_reference_runs_are_identical(chaos_cluster, local_sources, tmp_path):
    """Two uninterrupted runs of one plan as fresh jobs (at the same time, on one cluster) give
    the same sequence on every rank: the comparison the chaos tests rest on is sound."""
    plan = chaos_plan(local_sources)
    first = reference(chaos_cluster.address, plan, tmp_path, end_step=END_STEP)  # kept for later tests
    second = uninterrupted_run(chaos_cluster.address, plan, tmp_path, job="second", end_step=END_STEP)
    assert [r.step for r in first[0]] == list(range(END_STEP))
    assert_same_sequences(first, second, what="the second uninterrupted run")
    assert_exactly_once(first, plan.mesh, global_batch=GLOBAL_BATCH)


@pytest.mark.slow  # a loader's kill -9: test_chaos_all_faults_in_one_run, test_failures.py, test_group_faults.py[loader-cp]
def test_loader_kill_loses_nothing(chaos_cluster, local_sources, reference_run, tmp_path):
    """kill -9 the text loader holding the most chunks of the job (chunks upcoming steps still
    need) mid-run: the Planner has them loaded again (its status counts the reloads), the
    trainers see the same sequence."""
    plan = chaos_plan(local_sources)
    client = chaos_cluster.client()
    group = TrainerGroup(tmp_path, job="loader-kill", world_size=2, end_step=END_STEP, plan=plan,
                         checkpoint_every=CHECKPOINT_EVERY, step_sleep=STEP_SLEEP,
                         timeout=TRAINER_TIMEOUT)
    try:
        group.start(chaos_cluster.address)
        group.wait_for_step(5)
        address, pid, chunks = loader_holding_chunks(client, "pool_chat", job="loader-kill")
        kill9(pid)
        assert max(group.current(r).log().last_step for r in range(2)) < END_STEP - 1  # mid-run
        # the fault landed: the worker left the scheduler and its nanny started a fresh one
        wait_for_workers(client, "pool_chat", 2, exclude=[address], timeout=60)
        group.wait_done(timeout=120)
    finally:
        group.kill_all()
    got = group.received()
    assert_same_sequences(reference_run, got, what=f"the run that lost loader {address} ({chunks} chunks)")
    assert_exactly_once(got, plan.mesh, global_batch=GLOBAL_BATCH)
    # the recovery happened: chunks the dead loader held were loaded again for upcoming steps
    assert recoveries(client, "loader-kill")["chunks_reloaded"] >= 1, \
        f"loader {address} held {chunks} chunks of the job, none was reloaded"
    close_job(client, "loader-kill", plan)


def test_whole_cluster_loss_resumes_from_trainer_checkpoints(chaos_cluster, local_sources,
                                                             reference_run, tmp_path):
    """Lose the whole cluster (scheduler, Planner and every worker, kill -9) mid-run; on a fresh
    cluster every trainer resumes from the last checkpoint all ranks saved: the sequence of what
    they trained on equals the uninterrupted one."""
    plan = chaos_plan(local_sources)
    group = TrainerGroup(tmp_path, job="cluster-loss", world_size=2, end_step=END_STEP, plan=plan,
                         checkpoint_every=CHECKPOINT_EVERY, step_sleep=STEP_SLEEP,
                         timeout=TRAINER_TIMEOUT)
    fresh = None
    try:
        group.start(chaos_cluster.address)
        group.wait_for_step(10)
        chaos_cluster.kill()
        group.kill_all()  # trainers of a lost cluster are restarted too (they would time out)
        resume = group.last_common_checkpoint()
        assert resume >= CHECKPOINT_EVERY
        fresh = start_chaos_cluster(tmp_path / "fresh-cluster", local_sources)
        group.start(fresh.address, resume_step=resume)
        group.wait_done(timeout=120)
    finally:
        group.kill_all()
        if fresh is not None:
            fresh.close()
    # the resumed processes were served from the checkpoint's step by the fresh cluster (a
    # Planner that ignored the checkpoint would have started them at step 0)
    for r in range(2):
        _, second = (inc.log() for inc in group.incarnations[r])
        assert [b.step for b in second.batches] == list(range(resume, END_STEP)), (r, resume)
    got = group.received()
    assert_same_sequences(reference_run, got, what=f"the run resumed at step {resume} on a fresh cluster")
    assert_exactly_once(got, plan.mesh, global_batch=GLOBAL_BATCH)


@pytest.mark.slow  # storage outages: test_storage_outage.py, test_outage_past_timeouts.py, test_chaos_all_faults_in_one_run
def test_s3_server_comes_back_with_its_data_and_serves_the_reference(chaos_cluster, s3_sources,
                                                                     s3_corpus, reference_run,
                                                                     example_corpus, tmp_path):
    """The harness's S3 server: a run reading the corpus from it receives the reference sequence
    (the same sequence from another storage), and after kill -9 and a restart on the same port and
    folder it serves the same bytes again. The storage-outage tests rest on both."""
    server, url = s3_corpus
    plan = chaos_plan(s3_sources)
    got = uninterrupted_run(chaos_cluster.address, plan, tmp_path, job="s3", end_step=END_STEP)
    assert_same_sequences(reference_run, got, what="the run reading from S3")

    shard = "chat/part-00000.parquet"
    server.kill()
    assert not server.answers()  # down: nothing listens on its port
    server.start()
    assert server.filesystem().cat_file(f"{url}/{shard}") == (example_corpus / shard).read_bytes()
