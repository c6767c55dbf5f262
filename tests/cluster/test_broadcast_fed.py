"""Ranks fed by broadcast cost the scheduler nothing per step, and still checkpoint and resume.

Under ``broadcast_at("tp")`` only TP rank 0 of each group receives the batch; the others get it
over the GPU interconnect, and the Planner neither waits for their consumption nor places their
batch. Their Loaders take each step's checkpoint from the locations their client's hub got for
its receiving ranks (:mod:`mdata.trainer.fed_steps`) and tell nothing. The scheduler's handlers
are wrapped here to count, per rank, what reaches it per step (location asks, consumption tells,
acks, and the rank locations it pushes): a fed rank sharing a client with receiving ranks must
have none, every step yielding the right ``broadcast_from`` and its source's checkpoint. A fed
rank alone on its client (no receiving rank to learn from) asks for each step itself, without
subscribing to pushes, and gets the same. Resuming every rank from its ``state_dict()`` gives
fed ranks the step and the checkpoints their peers get, and the samples of an uninterrupted run.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from mdata.cost import AttentionCost
from mdata.driver import submit_job
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.trainer import Loader

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

MESH = ClientPlaceTree(dp=2, tp=4)
STEPS = 8
SAVE = 4  # ranks save their state_dict() once they took this many batches
ALONE = 7  # a fed rank given a client of its own
FED = [r for r in range(MESH.world_size) if MESH.coordinate(r).tp != 0]
#: the scheduler handlers a rank reaches per step, and how its rank is read from a request
PER_STEP = ("mdata_host_location", "mdata_batch_location", "mdata_consumed", "mdata_ack")


def make_plan(sources) -> Plan:
    text = [s for s in sources if s.name in ("chat", "code")]
    return (Plan(text).mix({"chat": 1.0, "code": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=4096, global_batch=8)
            .distribute(MESH).broadcast_at("tp").seed(5).window(3))


def count_per_rank(client, job: str) -> None:
    """Wrap, on the scheduler, every handler a rank reaches per step (and the pushes it is sent)
    to count per rank what concerns ``job``; :func:`counted` reads the counts and unwraps."""
    def install(dask_scheduler=None, job=job, per_step=PER_STEP):
        from mdata.wire.stream_tells import TELL_OP

        counts: Counter = Counter()
        originals = {op: dask_scheduler.handlers[op] for op in per_step}

        def ranks_of(msg):
            if "asks" in msg:
                return [a["rank"] for a in msg["asks"]]
            if "tells" in msg:
                return [t["rank"] for t in msg["tells"]]
            return [msg["rank"]]

        def wrap(op, handler):
            async def counting(**msg):
                if msg.get("job") == job:
                    for rank in ranks_of(msg):
                        counts[(op, int(rank))] += 1
                return await handler(**msg)

            counting.__name__ = op
            return counting

        for op, handler in originals.items():
            dask_scheduler.handlers[op] = wrap(op, handler)
        on_tell = dask_scheduler.stream_handlers.get(TELL_OP)
        if on_tell is not None:
            def counting_tell(tells=None, **rest):
                if isinstance(tells, dict) and tells.get("job") == job:
                    for tell in tells.get("tells", ()):
                        counts[("stream_tell", int(tell["rank"]))] += 1
                return on_tell(tells=tells, **rest)

            dask_scheduler.stream_handlers[TELL_OP] = counting_tell
        pusher = dask_scheduler.extensions["mdata"].jobs[job].pusher
        send = pusher._send

        def counting_send(client_id, push):
            for group in push.groups:
                for entry in group.ranks:
                    counts[("pushed", int(entry[0]))] += 1
            return send(client_id, push)

        pusher._send = counting_send
        dask_scheduler._mdata_fed_test = (counts, originals, on_tell)

    client.run_on_scheduler(install)


def counted(client) -> dict[int, dict[str, int]]:
    """The counts of :func:`count_per_rank`, per rank and what; the handlers unwrapped."""
    def read(dask_scheduler=None):
        from mdata.wire.stream_tells import TELL_OP

        counts, originals, on_tell = dask_scheduler._mdata_fed_test
        dask_scheduler.handlers.update(originals)
        if on_tell is not None:
            dask_scheduler.stream_handlers[TELL_OP] = on_tell
        del dask_scheduler._mdata_fed_test
        return [(what, rank, n) for (what, rank), n in counts.items()]

    out: dict[int, dict[str, int]] = {}
    for what, rank, n in client.run_on_scheduler(read):
        out.setdefault(rank, {})[what] = n
    return out


def run_ranks(clients: dict[int, object], job: str, steps: int, *, plan=None,
              checkpoints: dict | None = None) -> tuple[dict, dict, dict]:
    """Every rank in a thread on its client (``clients``: rank -> client), all attached before
    any iterates (so no fed rank starts before its hub's receiving ranks joined it). Per rank:
    ``(step, ids or broadcast_from, checkpoint)`` of each batch (the checkpoint its
    ``state_dict()`` gives once it took it), its ``state_dict()`` after SAVE batches (when it
    took that many), and its Loader's counts of checkpoints taken from its hub and asked for."""
    got: dict[int, list] = {r: [] for r in clients}
    saved: dict[int, dict] = {}
    hubs: dict[int, tuple] = {}
    errors: list[BaseException] = []
    attached = threading.Barrier(len(clients))

    def run(rank: int) -> None:
        try:
            with Loader(clients[rank], job=job, rank=rank, world_size=MESH.world_size, steps=steps,
                        timeout=90, plan=plan,
                        checkpoint=None if checkpoints is None else checkpoints[rank]) as loader:
                loader.attach()
                attached.wait(120)
                for batch in loader:
                    what = (batch["broadcast_from"] if batch["micro_batches"] is None
                            else batch["sample_ids"].tolist())
                    state = loader.state_dict()
                    got[rank].append((batch["step"], what, state["checkpoint"]))
                    if len(got[rank]) == SAVE:
                        saved[rank] = state
                hub = loader._hub
                hubs[rank] = (getattr(getattr(hub, "steps", None), "served", 0),
                              getattr(hub, "fed_asks", 0))
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            attached.abort()
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    if errors:
        raise errors[0]
    return got, saved, hubs


@pytest.fixture(scope="module")
def uninterrupted(mdata_cluster, example_sources_small):
    """The broadcast job run STEPS steps: ranks 0-6 share a client, rank 7 (fed) has its own."""
    from distributed import Client

    address = mdata_cluster.scheduler_address
    with Client(address, set_as_default=False, direct_to_workers=True) as shared, \
            Client(address, set_as_default=False, direct_to_workers=True) as alone:
        job = "fed-uninterrupted"
        submit_job(shared, make_plan(example_sources_small), job=job)
        count_per_rank(shared, job)
        clients = {r: alone if r == ALONE else shared for r in range(MESH.world_size)}
        got, saved, hubs = run_ranks(clients, job, STEPS)
        counts = counted(shared)
        # a fed rank restarted without a checkpoint goes on from its source's consumption
        with Loader(alone, job=job, rank=ALONE, world_size=MESH.world_size, timeout=60) as again:
            restarted_at = again.attach()["start_step"]
        status = shared.sync(shared.scheduler.mdata_status, job=job)
        shared.sync(shared.scheduler.mdata_close_job, job=job, client=shared.id)
    return {"got": got, "saved": saved, "hubs": hubs, "counts": counts,
            "restarted_at": restarted_at, "status": status}


def test_fed_ranks_get_their_source_and_its_checkpoint_every_step(uninterrupted):
    got = uninterrupted["got"]
    for rank in range(MESH.world_size):
        assert [step for step, *_ in got[rank]] == list(range(STEPS)), rank
        source = MESH.rank(MESH.coordinate(rank)._replace(tp=0))
        if rank in FED:
            assert [what for _, what, _ in got[rank]] == [source] * STEPS, rank
            # the checkpoint of every step, as its source (and every rank) got it
            assert [c for *_, c in got[rank]] == [c for *_, c in got[source]], rank
            assert [c["step"] for *_, c in got[rank]] == list(range(1, STEPS + 1)), rank
        else:
            assert all(isinstance(what, list) and what for _, what, _ in got[rank]), rank
    saved = uninterrupted["saved"]
    assert {s["next_step"] for s in saved.values()} == {SAVE}
    assert len({repr(s["checkpoint"]) for s in saved.values()}) == 1  # one state for all ranks


def test_the_scheduler_hears_nothing_per_step_from_fed_ranks_that_share_a_client(uninterrupted):
    counts = uninterrupted["counts"]
    for rank in FED:
        if rank != ALONE:
            assert counts.get(rank, {}) == {}, (rank, counts)
    # the receiving ranks tell their consumption (the Planner releases a step on it) and take
    # their locations as before; the fed ranks sharing their client took every step's
    # checkpoint from their hub
    for rank in range(MESH.world_size):
        if rank not in FED:
            assert sum(counts[rank].get(w, 0) for w in ("mdata_consumed", "stream_tell",
                                                        "mdata_host_location")) >= 1, counts
    hubs = uninterrupted["hubs"]
    assert all(hubs[r][0] >= STEPS for r in FED if r != ALONE), hubs


def test_a_fed_rank_alone_on_its_client_asks_for_its_steps_without_subscribing(uninterrupted):
    """No receiving rank shares its client: it asks each step itself (so it is paced by the
    build and hears a failure), but never subscribes to pushes and never tells consumption."""
    mine = uninterrupted["counts"].get(ALONE, {})
    assert mine.get("mdata_host_location", 0) >= STEPS, mine
    assert set(mine) == {"mdata_host_location"}, mine
    assert uninterrupted["hubs"][ALONE][1] >= STEPS


def test_a_fed_rank_restarted_without_a_checkpoint_goes_on_from_its_source(uninterrupted):
    """Its own consumption is never told: the scheduler takes its source's instead."""
    source = MESH.rank(MESH.coordinate(ALONE)._replace(tp=0))
    assert uninterrupted["status"]["consumed_steps"][str(source)] == STEPS - 1
    assert str(ALONE) not in uninterrupted["status"]["consumed_steps"]
    assert uninterrupted["restarted_at"] == STEPS


def test_fed_ranks_resume_from_their_state_dict_with_their_peers(mdata_cluster, client,
                                                                 example_sources_small,
                                                                 uninterrupted):
    """Every rank restores the state_dict() it saved after SAVE batches, as a new job: the fed
    ranks start at SAVE with their peers, get the uninterrupted run's checkpoints, and the
    receiving ranks its samples."""
    job = "fed-resumed"
    clients = {r: client for r in range(MESH.world_size)}
    got, _, _ = run_ranks(clients, job, STEPS - SAVE, plan=make_plan(example_sources_small),
                          checkpoints=uninterrupted["saved"])
    client.sync(client.scheduler.mdata_close_job, job=job, client=client.id)
    before = uninterrupted["got"]
    for rank in range(MESH.world_size):
        assert [step for step, *_ in got[rank]] == list(range(SAVE, STEPS)), rank
        assert [what for _, what, _ in got[rank]] == [what for _, what, _ in before[rank][SAVE:]]
        assert [c["step"] for *_, c in got[rank]] == list(range(SAVE + 1, STEPS + 1)), rank
        assert [c["cursors"] for *_, c in got[rank]] == \
            [c["cursors"] for *_, c in before[rank][SAVE:]], rank
