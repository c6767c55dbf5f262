"""A constructor lost halfway through a DP group's delivery, on a mesh of several ranks per group.

The mesh is dp 2 x cp 2 x tp 2 (eight trainer ranks, each with its own Loader in a thread of this
process): the two CP ranks of a group pull different slices of one batch, TP ranks pull identical
copies, and under a broadcast axis only that axis' rank 0 pulls while the others only locate the
step. A hook holds one receiving rank of DP group 0 (with the ranks it broadcasts to) attached but
not fetching, while every other rank takes steps 0 and 1: the constructor then holds batches that
some ranks of group 0 pulled their slice of and others did not. Then the constructor (or the
only loader) is killed (kill -9 of the real worker process), its nanny starts an empty one, the
held ranks are let go, and every rank must receive exactly what an uninterrupted run of the same
plan gives it (step, sample ids and a hash of its tokens, or the rank it gets the batch from by
broadcast), while the job's status counts the recovery (batches built again, chunks reloaded).
The same mesh resumed live from a checkpoint (every rank restarted) is checked the same way.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from benchmarks.lockstep import token_hash
from mdata.cost import AttentionCost
from mdata.driver import submit_job
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.trainer import Loader

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

MESH = ClientPlaceTree(dp=2, cp=2, tp=2)
STEPS = 5
FETCHED = 1  # the ranks not held take steps 0..FETCHED before the kill
TIMEOUT = 60.0


def held_ranks(broadcast) -> tuple[int, ...]:
    """The last rank of DP group 0 that pulls from the constructor, and the ranks it broadcasts
    to: held, they leave that rank's slices of group 0's batches unpulled while the group's other
    receivers pull theirs (a held rank that pulls nothing would not keep the batch waiting)."""
    receiver = MESH.receivers(0, broadcast)[-1]
    return tuple(r for r in range(MESH.world_size)
                 if r == receiver or MESH.broadcast_source(r, broadcast) == receiver)


def make_plan(sources, broadcast) -> Plan:
    return (
        Plan(sources)
        .mix({s.name: 1.0 for s in sources})
        .cost(AttentionCost(a=1.0, b=2048.0))
        .balance(micro_batches=2, max_tokens=2048, global_batch=8)
        .distribute(MESH)
        .broadcast_at(broadcast)
        .seed(5)
        .window(2)
    )


def received(batch) -> tuple:
    """What one rank got at one step: ids and token hash, or whom it gets the batch from."""
    if batch["micro_batches"] is None:
        return batch["step"], "broadcast from", batch["broadcast_from"]
    return batch["step"], batch["sample_ids"].tolist(), token_hash(batch)


@pytest.fixture(scope="module")
def group_cluster(example_sources_small):
    import dask
    import distributed  # noqa: F401  its configuration defaults, before dask.config.set

    from mdata.driver import PoolSpec, start_cluster
    from mdata.sources import TokenizeText

    sources = [s for s in example_sources_small if isinstance(s.transform, TokenizeText)][:3]
    pools = [PoolSpec("text", tuple(s.name for s in sources), workers=1, threads=2)]
    # the nanny restarts the killed constructor; SpecCluster must not close it meanwhile
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1 hour"}), \
            start_cluster(sources, pools=pools, constructors=1, constructor_threads=2,
                          dashboard_address=None, autoscale=False) as cluster, \
            cluster.client() as client:
        client.wait_for_workers(2, timeout=120)
        yield client, sources


class Ranks:
    """Every rank of one job in a thread; a rank in ``held`` attaches, then waits for
    :meth:`release` before it asks for its first batch (the hook between attach and fetch).
    ``checkpoints`` (rank -> state_dict) resumes the ranks; ``save_at``: each rank's
    ``state_dict()`` once it took that many batches goes to ``states``."""

    def __init__(self, client, job: str, held=(), *, steps: int = STEPS,
                 checkpoints: dict | None = None, save_at: int | None = None) -> None:
        self.got: dict[int, list] = {r: [] for r in range(MESH.world_size)}
        self.steps, self.checkpoints, self.save_at = steps, checkpoints, save_at
        self.states: dict[int, dict] = {}
        self.errors: list[BaseException] = []
        self.go = threading.Event()
        self.attached = threading.Barrier(MESH.world_size + 1)
        self.threads = [threading.Thread(target=self._run, args=(client, job, r, r in held))
                        for r in range(MESH.world_size)]
        for t in self.threads:
            t.start()
        try:
            self.attached.wait(TIMEOUT)
        except threading.BrokenBarrierError:
            self.join()  # raises the rank's own error
            raise

    def _run(self, client, job: str, rank: int, held: bool) -> None:
        try:
            checkpoint = None if self.checkpoints is None else self.checkpoints[rank]
            with Loader(client, job=job, rank=rank, world_size=MESH.world_size, steps=self.steps,
                        timeout=TIMEOUT, checkpoint=checkpoint) as loader:
                loader.attach()
                self.attached.wait(TIMEOUT)
                if held and not self.go.wait(TIMEOUT):
                    raise AssertionError(f"rank {rank} was never released")
                for batch in loader:
                    self.got[rank].append(received(batch))
                    if len(self.got[rank]) == self.save_at:
                        loader.mark_consumed()  # the training step is done before it checkpoints
                        self.states[rank] = loader.state_dict()
                loader.mark_consumed()
        except BaseException as exc:  # noqa: BLE001 - raised in the test thread by join()
            self.errors.append(exc)
            self.attached.abort()

    def wait_for(self, ranks, step: int) -> None:
        deadline = time.monotonic() + TIMEOUT
        while any(len(self.got[r]) <= step for r in ranks):
            if self.errors:
                raise self.errors[0]
            assert time.monotonic() < deadline, {r: len(self.got[r]) for r in ranks}
            time.sleep(0.02)

    def release(self) -> None:
        self.go.set()

    def join(self) -> dict[int, list]:
        self.release()
        for t in self.threads:
            t.join(TIMEOUT * 2)
        if self.errors:
            raise self.errors[0]
        assert not any(t.is_alive() for t in self.threads), "a rank never finished"
        return self.got


def kill_worker_with(client, resource: str) -> str:
    """kill -9 the one worker holding ``resource``; returns its address."""
    (address,) = [a for a, w in client.scheduler_info()["workers"].items()
                  if resource in w.get("resources", {})]
    pid = client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGKILL)
    return address


#: what is killed, the resource that finds it, and the recovery the status must count
FAULTS = {"constructor": ("mdata_constructor", "batches_rebuilt"),
          "loader": ("pool_chat", "chunks_reloaded")}


@pytest.mark.parametrize("fault, broadcast", [
    ("constructor", "tp"),
    pytest.param("constructor", None, marks=pytest.mark.slow),  # [constructor-tp] kills the same way
    ("loader", "cp")])
def test_a_worker_killed_between_the_ranks_of_a_group_loses_and_repeats_nothing(
        group_cluster, fault, broadcast):
    """The constructor (or the only loader) is killed while the batches of steps 0..FETCHED are
    pulled by some ranks of DP group 0 and not by others."""
    client, sources = group_cluster
    resource, recovery = FAULTS[fault]
    plan = make_plan(sources, broadcast)
    ref_job, job = f"group-ref-{broadcast}", f"group-{fault}-{broadcast}"
    held = held_ranks(broadcast)
    assert 0 < len(held) < len(MESH.receivers(0)) and MESH.receivers(0, broadcast)[0] not in held
    client.wait_for_workers(2, timeout=60)  # a worker killed by the previous case is back
    submit_job(client, plan, job=ref_job)
    reference = Ranks(client, ref_job).join()
    # without a fault nothing is counted: the counts below tell a recovery from a quiet run
    assert set(client.sync(client.scheduler.mdata_status, job=ref_job)["recoveries"].values()) == {0}
    client.sync(client.scheduler.mdata_close_job, job=ref_job, client=client.id)
    assert all(len(reference[r]) == STEPS for r in reference)

    submit_job(client, plan, job=job)
    ranks = Ranks(client, job, held=held)
    try:
        ranks.wait_for([r for r in range(MESH.world_size) if r not in held], FETCHED)
        # group 0's batches of steps 0..FETCHED: some ranks pulled their slice, others did not
        assert all(ranks.got[r] == [] for r in held)
        address = kill_worker_with(client, resource)
    finally:
        got = ranks.join()

    for rank in range(MESH.world_size):
        assert got[rank] == reference[rank], (
            f"rank {rank} {MESH.coordinate(rank)} after {fault} {address} was killed: "
            f"got {got[rank]}, uninterrupted {reference[rank]}")
    status = client.sync(client.scheduler.mdata_status, job=job)
    assert status["failure"] is None
    # the recovery happened: a lost constructor held group 0's built batches of steps
    # 0..FETCHED, which the held ranks had not pulled, and they were built again; a lost loader
    # held the chunks of those steps (group 0 has not consumed them), and they were loaded again
    assert status["recoveries"][recovery] >= (FETCHED + 1 if fault == "constructor" else 1), \
        status["recoveries"]
    client.sync(client.scheduler.mdata_close_job, job=job, client=client.id)


def test_every_rank_of_the_mesh_resumed_live_from_a_checkpoint_gets_the_uninterrupted_sequence(
        group_cluster):
    """Every rank (receivers and broadcast ranks alike) checkpoints after step 1, trains on to
    step 3, and all restart from that checkpoint on the live job: the job rewinds to step 2 and
    each rank's sequence (checkpointed steps, then the restarted ones) is the uninterrupted one."""
    client, sources = group_cluster
    plan = make_plan(sources, "tp")
    client.wait_for_workers(2, timeout=60)
    submit_job(client, plan, job="group-resume-ref")
    reference = Ranks(client, "group-resume-ref").join()
    client.sync(client.scheduler.mdata_close_job, job="group-resume-ref", client=client.id)

    submit_job(client, plan, job="group-resume")
    first = Ranks(client, "group-resume", steps=4, save_at=2)
    before = first.join()
    assert set(first.states) == set(range(MESH.world_size))
    assert {s["next_step"] for s in first.states.values()} == {2}
    resumed = Ranks(client, "group-resume", steps=STEPS - 2, checkpoints=first.states).join()
    for rank in range(MESH.world_size):
        assert [r[0] for r in before[rank]] == [0, 1, 2, 3]
        # the rewind happened: steps 2 and 3 were served again, from the checkpoint's step on
        assert [r[0] for r in resumed[rank]] == list(range(2, STEPS)), rank
        assert before[rank][:2] + resumed[rank] == reference[rank], (rank, MESH.coordinate(rank))
    assert client.sync(client.scheduler.mdata_status, job="group-resume")["failure"] is None
    client.sync(client.scheduler.mdata_close_job, job="group-resume", client=client.id)
