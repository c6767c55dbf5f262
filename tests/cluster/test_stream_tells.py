"""Consumption tells travel over the client's batched stream, confirmed, and lose nothing.

With pushed locations the ranks of a client seldom send location requests, so what their
training loops consumed used to go as one ``mdata_consumed`` RPC per client and step. With
``mdata.trainer.stream-tells`` on (the tests' fixture; off by default) it goes as one message over the client's stream,
which the scheduler confirms over its stream to the client. Each test runs the real Loader on a
real cluster and reads the Planner's own counters: which path the tells took, how often a step
was told twice, what every rank consumed, and the lineage's exactly-once check.
"""

from __future__ import annotations

import threading
import time

import dask
import pytest

from benchmarks.lockstep import token_hash
from conftest import run_loaders
from mdata.cost import AttentionCost
from mdata.driver import JobHandle, submit_job
from mdata.errors import RankTakenError
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.trainer import Loader

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

STEPS = 8
RANKS = 4


@pytest.fixture(autouse=True)
def stream_tells():
    with dask.config.set({"mdata.trainer.stream-tells": True}):
        yield


def received(batch) -> tuple:
    return batch["step"], batch["sample_ids"].tolist(), token_hash(batch)


def plan_of(sources) -> Plan:
    text = [s for s in sources if s.name in ("chat", "code")]
    return (Plan(text).mix({"chat": 1.0, "code": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=4096, global_batch=8)
            .distribute(ClientPlaceTree(dp=2, tp=2)).seed(7).window(3))


def counters(client, job: str) -> dict:
    """On the scheduler: consumption RPCs and stream messages of ``job``, repeated steps, and
    each rank's consumed-step count."""
    def read(dask_scheduler=None, job=job):
        runtime = dask_scheduler.extensions["mdata"].jobs[job]
        return {"rpcs": runtime.consumed_requests, "streamed": runtime.consumed_streamed,
                "repeats": runtime.told.repeats,
                "steps_consumed": {f.rank: f.steps_consumed for f in runtime.trainer_meter.snapshot()}}

    return client.run_on_scheduler(read)


def settled(client, job: str) -> dict:
    """The job's status once its window moved past every step (the last tells are queued for
    the Planner when confirmed, applied a moment later)."""
    deadline = time.monotonic() + 15
    while True:
        status = JobHandle(client, job).status()
        if status["counters"]["consumed_step"] == STEPS or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def test_tells_over_the_stream_give_the_same_samples_without_consumption_rpcs(
        client, example_sources_small):
    plan = plan_of(example_sources_small)
    with dask.config.set({"mdata.trainer.stream-tells": False}):
        submit_job(client, plan, job="told-rpc")
        by_rpc = run_loaders(client, job="told-rpc", world_size=RANKS, steps=STEPS, keep=received)
    submit_job(client, plan, job="told-stream")
    by_stream = run_loaders(client, job="told-stream", world_size=RANKS, steps=STEPS, keep=received)
    assert by_stream == by_rpc
    assert all([b[0] for b in got] == list(range(STEPS)) for got in by_stream.values())
    for job in ("told-rpc", "told-stream"):
        assert settled(client, job)["counters"]["consumed_step"] == STEPS, job
    rpc, stream = counters(client, "told-rpc"), counters(client, "told-stream")
    assert rpc["streamed"] == 0 and rpc["rpcs"] >= 1, rpc
    # the first location is asked for; its reply says the scheduler takes tells on the stream,
    # before any step was consumed: no consumption RPC at all
    assert stream["rpcs"] == 0 and stream["streamed"] >= 1, stream
    assert stream["steps_consumed"] == {r: STEPS for r in range(RANKS)}, stream
    for job in ("told-rpc", "told-stream"):
        JobHandle(client, job).close()


def test_a_lost_confirmation_is_resent_and_counts_once(client, example_sources_small):
    """The client drops the first confirmation that arrives (the hub's test hook), as if it were
    lost; its teller resends the tells after the reply timeout. The scheduler took the steps
    twice: they count once, the window moves past every step, the lineage is exactly once, and
    the ranks got what a run without the loss got."""
    plan = plan_of(example_sources_small)
    submit_job(client, plan, job="reference")
    reference = run_loaders(client, job="reference", world_size=RANKS, steps=STEPS, keep=received)
    JobHandle(client, "reference").close()

    submit_job(client, plan, job="lossy")
    got: dict[int, list] = {}
    hubs: list = []
    errors: list[BaseException] = []

    def rank_loop(rank: int) -> None:
        try:
            with Loader(client, job="lossy", rank=rank, world_size=RANKS, steps=STEPS,
                        timeout=60) as loader:
                out = []
                for batch in loader:
                    if rank == 0 and not hubs:  # before step 0 is marked consumed
                        loader._hub.streamed.drop = 1
                        hubs.append(loader._hub)
                    out.append(received(batch))
                got[rank] = out
        except BaseException as exc:  # noqa: BLE001 - raised below
            errors.append(exc)

    with dask.config.set({"mdata.requests.timeout": "3s"}):  # the resend comes 3 s after
        threads = [threading.Thread(target=rank_loop, args=(r,)) for r in range(RANKS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors
    assert got == reference
    stream = hubs[0].streamed
    assert stream.drop == 0 and stream.resent >= 1, (stream.drop, stream.resent)
    status = settled(client, "lossy")
    assert status["counters"]["consumed_step"] == STEPS, status["counters"]
    seen = counters(client, "lossy")
    assert seen["repeats"] >= 1, seen  # the scheduler did take a step twice...
    assert seen["steps_consumed"] == {r: STEPS for r in range(RANKS)}, seen  # ...counted once
    assert seen["rpcs"] == 0, seen
    lineage = client.sync(client.scheduler.mdata_lineage, job="lossy", steps=STEPS)
    assert lineage["exactly_once"]["ok"], lineage["exactly_once"]
    JobHandle(client, "lossy").close()


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "rpc"])
def test_a_tell_with_a_bad_lease_reaches_the_training_loop_typed(client, example_sources_small,
                                                                  stream):
    job = f"forged-{'stream' if stream else 'rpc'}"
    with dask.config.set({"mdata.trainer.stream-tells": stream}):
        submit_job(client, plan_of(example_sources_small), job=job)
        loaders = [Loader(client, job=job, rank=r, world_size=RANKS, steps=STEPS, timeout=60)
                   for r in range(RANKS)]
        its = [iter(loader) for loader in loaders]
        for it in its:
            next(it)  # step 0 (its long poll subscribes the client)
        real = loaders[0]._token
        loaders[0]._token = "f" * 32  # rank 0's Loader now tells under a lease it does not hold
        try:
            next(its[0])  # marks step 0 consumed: the teller tells it with the forged token
            assert loaders[0]._teller.flush(30)  # the tell was answered: with the error
            with pytest.raises(RankTakenError, match="lost it"):
                next(its[0])  # marking step 1 consumed, the loop hears the teller's error
        finally:
            loaders[0]._token = real
            for loader in loaders:
                loader.close()
    seen = counters(client, job)
    if stream:
        assert seen["rpcs"] == 0 and seen["streamed"] >= 1, seen
    else:
        assert seen["streamed"] == 0 and seen["rpcs"] >= 1, seen
    JobHandle(client, job).close()


@pytest.mark.parametrize("push", [True, False], ids=["push", "long-poll"])
def test_closing_a_loader_waiting_for_a_batch_returns_at_once_and_tells_its_consumption(
        client, example_sources_small, push):
    """Rank 3 never consumes step 0, so the window (3 steps) holds every other rank's prefetcher
    in a wait for a step the Planner will not plan yet: the wait for a push, then a long poll
    of up to ``poll-interval`` (30 s here). Closing rank 0 then must not wait that out, and the
    step 0 it consumed still reaches the Planner."""
    job = f"closing-{'push' if push else 'poll'}"
    with dask.config.set({"mdata.trainer.location-push": push, "mdata.trainer.poll-interval": "30s"}):
        submit_job(client, plan_of(example_sources_small), job=job)
        loaders = [Loader(client, job=job, rank=r, world_size=RANKS, steps=STEPS, timeout=60)
                   for r in range(RANKS)]
        try:
            its = [iter(loader) for loader in loaders]
            for r, it in enumerate(its):
                next(it)  # step 0
                if r < RANKS - 1:
                    next(it)  # step 1: step 0 is consumed by ranks 0-2, never by rank 3
            deadline = time.monotonic() + 30
            while loaders[0]._queue.qsize() < 1:  # step 2 fetched: now it waits for step 3
                assert time.monotonic() < deadline, loaders[0]._queue.qsize()
                time.sleep(0.05)
            time.sleep(0.5)  # into the wait (a wait cut short by close() is what this test is about)
            assert loaders[0]._thread.is_alive()
            began = time.monotonic()
            loaders[0].close()
            closed_in = time.monotonic() - began
            assert not loaders[0]._thread.is_alive()
            assert closed_in < 3.0, closed_in
            assert counters(client, job)["steps_consumed"].get(0, 0) >= 1
        finally:
            for loader in loaders:
                loader.close()
    JobHandle(client, job).close()


def test_a_tell_waiting_when_the_clients_stream_drops_is_resent_on_the_new_one(
        mdata_cluster, example_sources_small):
    """Rank 0's client drops the confirmation of the step-0 tells (the hub's test hook), so a
    teller waits; then the client's connection to the scheduler is aborted and Dask reconnects
    it. The waiting tell goes again on the new stream (the reply timeout is far longer than the
    run, so only the new stream sent it), and the ranks get what an uninterrupted run got."""
    from distributed import Client

    plan = plan_of(example_sources_small)
    with dask.config.set({"mdata.requests.timeout": "120s"}), \
            Client(mdata_cluster.scheduler_address, set_as_default=False,
                   direct_to_workers=True) as client:
        submit_job(client, plan, job="steady")
        reference = run_loaders(client, job="steady", world_size=RANKS, steps=STEPS, keep=received)
        JobHandle(client, "steady").close()
        submit_job(client, plan, job="reconnect")
        loaders = [Loader(client, job="reconnect", rank=r, world_size=RANKS, steps=STEPS, timeout=60)
                   for r in range(RANKS)]
        its = [iter(loader) for loader in loaders]
        got = {r: [received(next(it))] for r, it in enumerate(its)}
        stream = loaders[0]._hub.streamed
        stream.drop = 1
        old = client.scheduler_comm
        for r, it in enumerate(its):
            got[r].append(received(next(it)))  # step 0 consumed: its tells go
        deadline = time.monotonic() + 30
        while not stream._waiting or stream.drop:  # a teller waits for what was dropped
            assert time.monotonic() < deadline, (stream.sent, stream.drop, stream._waiting)
            time.sleep(0.02)
        client.loop.add_callback(old.comm.abort)
        for _ in range(STEPS - 2):
            for r, it in enumerate(its):
                got[r].append(received(next(it)))
        for loader in loaders:
            loader.mark_consumed()
            loader.close()
        assert client.scheduler_comm is not old and stream.resent >= 1, stream.resent
        assert got == reference
        assert settled(client, "reconnect")["counters"]["consumed_step"] == STEPS
        seen = counters(client, "reconnect")
        assert seen["steps_consumed"] == {r: STEPS for r in range(RANKS)}, seen
        JobHandle(client, "reconnect").close()
