"""The runtime on a real LocalCluster-style embedded cluster (processes): Planner plugin, loader
pools, constructors and trainers, checked against lineage and the pure simulation."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time

import numpy as np
import pytest

from conftest import run_loaders
from mdata.driver import submit_job
from mdata.trainer import Loader
from mdata.cost import AttentionCost
from mdata.errors import MeshError, TrainerError
from mdata.mesh import ClientPlaceTree
from mdata.metadata import SourceMetadata
from mdata.plan import Plan
from mdata.planner import simulate
from mdata.sources import list_shards, load_chunk

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

WEIGHTS = {"chat": 3.0, "scenes": 2.0, "books": 1.0, "code": 2.0, "captions": 1.0}
IMAGE_TOKEN = 100_277


def make_plan(sources, mesh: ClientPlaceTree, *, global_batch: int = 16, max_tokens: int = 2048,
              seed: int = 1, window: int = 3) -> Plan:
    return (
        Plan(sources)
        .mix({s.name: WEIGHTS.get(s.name, 1.0) for s in sources})
        .cost(AttentionCost(a=1.0, b=2048.0))
        .balance(micro_batches=2, max_tokens=max_tokens, global_batch=global_batch)
        .distribute(mesh)
        .special_tokens(pad_id=0, image_token_id=IMAGE_TOKEN)
        .seed(seed)
        .window(window)
    )


def lineage(client, job: str, steps: int) -> dict:
    return client.sync(client.scheduler.mdata_lineage, job=job, steps=steps)


def status(client, job: str) -> dict:
    return client.sync(client.scheduler.mdata_status, job=job)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_trainer_processes_receive_every_planned_sample_exactly_once(mdata_cluster, client,
                                                                     example_sources_small):
    """DP 2 x CP 2 trainer processes in a gloo group; CP ranks of a group get the same samples."""
    from trainer_proc import trainer

    mesh = ClientPlaceTree(dp=2, cp=2)
    plan = make_plan(example_sources_small, mesh)
    submit_job(client, plan, job="procs")
    steps = 4
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=trainer, args=(r, 4, mdata_cluster.scheduler_address, port, "procs",
                                               steps, out)) for r in range(4)]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        item = out.get(timeout=180)
        results[item["rank"]] = item
    for p in procs:
        p.join(timeout=30)
    assert all("error" not in r for r in results.values()), [r.get("error") for r in results.values()]

    graph = lineage(client, "procs", steps)
    assert graph["exactly_once"]["ok"], graph["exactly_once"]["problems"]
    for rank in range(4):
        coord = mesh.coordinate(rank)
        got = results[rank]["received"]
        assert [rec["step"] for rec in got] == list(range(steps))
        for rec in got:
            planned = sorted(map(tuple, graph["samples"][str(rec["step"])][str(coord.dp)]))
            assert sorted(map(tuple, rec["sample_ids"])) == planned
        # the checkpoint reflects what the rank consumed: the next step is `steps`
        assert results[rank]["state"]["next_step"] == steps
        assert results[rank]["state"]["checkpoint"]["step"] == steps
    # CP ranks of one DP group: same documents, each rank half of every (padded) document
    for dp in range(2):
        r0, r1 = (mesh.rank((dp, 0, cp, 0)) for cp in (0, 1))
        for a, b in zip(results[r0]["received"], results[r1]["received"]):
            assert a["sample_ids"] == b["sample_ids"] and a["seqlens"] == b["seqlens"]
            for ids_a, ids_b in zip(a["input_ids"], b["input_ids"]):
                assert len(ids_a) == len(ids_b)
    client.sync(client.scheduler.mdata_close_job, job="procs", client=client.id)


def test_cp_split_reassembles_the_real_tokens(client, example_sources_small):
    """Zigzag CP pieces put back together equal the tokens read straight from the source."""
    from mdata.batch import zigzag_indices

    mesh = ClientPlaceTree(dp=1, cp=2)
    plan = make_plan(example_sources_small, mesh, global_batch=8)
    submit_job(client, plan, job="cp")
    got = run_loaders(client, job="cp", world_size=2, steps=2)
    by_name = {s.name: s for s in example_sources_small}
    names = plan.source_names
    for step in range(2):
        b0, b1 = got[0][step], got[1][step]
        for mb0, mb1 in zip(b0["micro_batches"], b1["micro_batches"]):
            cu = mb0["cu_seqlens_global"].numpy()
            total = int(cu[-1])
            full = np.full(total, -1, dtype=np.int64)
            for cp_rank, mb in ((0, mb0), (1, mb1)):
                full[zigzag_indices(cu, total, 2, cp_rank)] = mb["input_ids"].numpy()
            assert (full >= 0).all()
            # the first document of the micro-batch equals the real tokens of its sample
            sid = mb0["sample_ids"].numpy()[0]
            src = by_name[names[int(sid[0])]]
            chunk = load_chunk(src, int(sid[1]), int(sid[2]), int(sid[2]) + 1)
            length = int(mb0["seqlens"].numpy()[0])
            expected = chunk.tokens(0)[:length] if chunk.num_patches[0] == 0 else None
            if expected is not None:
                assert full[:length].tolist() == expected.tolist()
    client.sync(client.scheduler.mdata_close_job, job="cp", client=client.id)


def test_roles_tp_identical_pp_stages(client, example_sources_small):
    """TP ranks of a group get identical data; middle PP stages get no tokens; last gets labels."""
    mesh = ClientPlaceTree(dp=2, pp=3, tp=2)
    plan = make_plan(example_sources_small, mesh, global_batch=8)
    submit_job(client, plan, job="roles")
    got = run_loaders(client, job="roles", world_size=mesh.world_size, steps=2)
    for rank in range(mesh.world_size):
        coord = mesh.coordinate(rank)
        role = mesh.role(rank)
        twin = mesh.rank((coord.dp, coord.pp, coord.cp, 1 - coord.tp))
        for mine, theirs in zip(got[rank], got[twin]):
            assert mine["sample_ids"].tolist() == theirs["sample_ids"].tolist()
            for mb, other in zip(mine["micro_batches"], theirs["micro_batches"]):
                assert set(mb) == set(other)
                for name in mb:
                    assert mb[name].tolist() == other[name].tolist()
            for mb in mine["micro_batches"]:
                assert ("input_ids" in mb) == role.receives_tokens
                assert ("labels" in mb) == role.receives_labels
                assert "seqlens" in mb  # every stage knows the shapes
        if role.metadata_only:
            assert coord.pp == 1
    client.sync(client.scheduler.mdata_close_job, job="roles", client=client.id)


def test_per_rank_costs_and_mixture_equal_the_pure_simulation(client, example_sources_small):
    """The cluster plans exactly what mdata.planner.simulate plans for the same seed and data."""
    mesh = ClientPlaceTree(dp=2)
    plan = make_plan(example_sources_small, mesh, global_batch=16, seed=7)
    submit_job(client, plan, job="sim")
    steps = 4
    run_loaders(client, job="sim", world_size=2, steps=steps)
    live = status(client, "sim")["steps"]

    metadata = {}
    for src in example_sources_small:
        chunks = []
        for shard in list_shards(src).shards:
            for start in range(0, shard.num_rows, src.chunk_rows):
                chunks.append(load_chunk(src, shard.index, start, min(start + src.chunk_rows, shard.num_rows)))
        metadata[src.name] = SourceMetadata.from_chunks(chunks)
    sim = simulate(plan, steps, metadata)
    for step in range(steps):
        summary = live[str(step)]
        np.testing.assert_allclose(summary["per_rank_cost"], sim.per_rank_cost[step], rtol=1e-9)
        assert summary["counts"] == dict(zip(sim.names, sim.counts[step].tolist()))
        # exact mixture: counts are the largest-remainder apportionment of the global batch
        assert sum(summary["counts"].values()) == 16
    client.sync(client.scheduler.mdata_close_job, job="sim", client=client.id)


def test_a_stalled_trainer_keeps_memory_bounded(client, example_sources_small):
    """One DP group stops consuming: the window stops advancing, chunks and batches stop growing."""
    mesh = ClientPlaceTree(dp=2)
    plan = make_plan(example_sources_small, mesh, window=2)
    submit_job(client, plan, job="stall")
    # rank 0 may run ahead of the stalled rank 1 by the planning window, and no further
    window = plan.window_steps
    with Loader(client, job="stall", rank=0, world_size=2, timeout=60) as loader:
        batches = iter(loader)
        assert [next(batches)["step"] for _ in range(window)] == list(range(window))
        loader.timeout = 2.0
        with pytest.raises(TrainerError, match=f"no batch for step {window} within 2s"):
            next(batches)
    first = status(client, "stall")
    time.sleep(1.0)  # let the Planner tick many times while rank 1 consumes nothing
    later = status(client, "stall")
    for snap in (first, later):
        counters = snap["counters"]
        assert counters["consumed_step"] == 0
        assert counters["planned_step"] - counters["consumed_step"] <= plan.window_steps
        assert snap["batches_in_memory"] <= plan.window_steps * mesh.dp
    assert later["chunks_in_memory"] == first["chunks_in_memory"]
    assert later["counters"]["planned_step"] == first["counters"]["planned_step"]
    client.sync(client.scheduler.mdata_close_job, job="stall", client=client.id)


def test_wrong_world_size_or_rank_is_a_clear_error(client, example_sources_small):
    plan = make_plan(example_sources_small, ClientPlaceTree(dp=2, cp=2))
    submit_job(client, plan, job="mesh")
    with pytest.raises(MeshError, match=r"dp=2 pp=1 cp=2 tp=1 \(world size 4\).*WORLD_SIZE=3"):
        with Loader(client, job="mesh", rank=0, world_size=3, timeout=10) as loader:
            next(iter(loader))
    with pytest.raises(MeshError, match="rank 7 is outside the world of 4 ranks"):
        with Loader(client, job="mesh", rank=7, world_size=4, timeout=10) as loader:
            next(iter(loader))
    with pytest.raises(TrainerError, match="no mdata job named 'nope'|job 'nope' was not registered"):
        with Loader(client, job="nope", rank=0, world_size=4, timeout=1) as loader:
            next(iter(loader))
    client.sync(client.scheduler.mdata_close_job, job="mesh", client=client.id)


def test_bf16_batches_round_trip_through_the_cluster(client):
    """A batch with a bfloat16 field crosses real Dask comms bit for bit, with an honest sizeof."""
    import torch
    from dask.sizeof import sizeof

    from mdata.batch import Batch, MicroBatch, TensorField

    values = np.linspace(-3, 3, 4096, dtype=np.float32)
    field = TensorField.bfloat16_from_float32(values)

    def make():
        mb = MicroBatch(0, 4096, np.zeros((1, 3), dtype=np.int64),
                        {"input_ids": np.arange(4096, dtype=np.int32), "loss_weight": field})
        return Batch(step=0, dp_rank=0, cp_rank=0, cp=1, micro_batches=(mb,))

    import mdata.wire.frames  # noqa: F401

    fut = client.submit(lambda: make(), pure=False)
    batch = fut.result()
    got = batch.micro_batches[0]["loss_weight"]
    assert isinstance(got, TensorField) and got.dtype_name == "bfloat16"
    assert bytes(got.buffer) == bytes(field.buffer)
    from mdata.trainer.tensors import field_to_tensor

    tensor = field_to_tensor(got)
    assert tensor.dtype == torch.bfloat16
    assert torch.equal(tensor, torch.from_numpy(values).to(torch.bfloat16))
    assert abs(sizeof(batch) - batch.nbytes) <= 0.05 * batch.nbytes


def test_broadcast_at_tp_only_tp_rank_zero_pulls_data(client, example_sources_small):
    """Under broadcast_at("tp") the other TP ranks are told whom to receive from, and the step
    is released once the receiving ranks consumed it."""
    mesh = ClientPlaceTree(dp=2, tp=2)
    plan = make_plan(example_sources_small, mesh).broadcast_at("tp")
    submit_job(client, plan, job="bcast")
    got = run_loaders(client, job="bcast", world_size=4, steps=3)
    for rank in range(4):
        coord = mesh.coordinate(rank)
        for step, batch in enumerate(got[rank]):
            assert batch["step"] == step
            if coord.tp == 0:
                assert batch["micro_batches"] and "broadcast_from" not in batch
            else:
                assert batch["micro_batches"] is None
                assert batch["broadcast_from"] == mesh.rank((coord.dp, coord.pp, coord.cp, 0))
    graph = lineage(client, "bcast", 3)
    assert graph["exactly_once"]["ok"], graph["exactly_once"]["problems"]
    client.sync(client.scheduler.mdata_close_job, job="bcast", client=client.id)


def test_an_unreachable_scheduler_is_a_trainer_error():
    port = _free_port()  # nothing listens there
    with pytest.raises(TrainerError, match=f"cannot reach the mdata scheduler at 'tcp://127.0.0.1:{port}'"):
        Loader(f"tcp://127.0.0.1:{port}", job="x", rank=0, world_size=1, timeout=2)


def test_step_history_is_bounded_by_configuration(example_sources_small):
    """A long run must not grow the scheduler's memory with per-step summaries."""
    import dask
    from distributed import Client

    from mdata.driver import start_cluster

    sources = [s for s in example_sources_small if s.name in ("chat", "code")]
    with dask.config.set({"mdata.planner.history-steps": 3}):
        with start_cluster(sources, constructors=1, constructor_threads=1) as cluster, \
                Client(cluster.scheduler_address, set_as_default=False) as c:
            submit_job(c, make_plan(sources, ClientPlaceTree(dp=1), global_batch=4), job="hist")
            run_loaders(c, job="hist", world_size=1, steps=8)
            steps = sorted(int(s) for s in status(c, "hist")["steps"])
    assert len(steps) == 3 and steps == list(range(steps[0], steps[0] + 3)) and steps[0] >= 5


def test_metrics_reported_by_trainers_steer_a_metric_driven_mixture(client, example_sources_small):
    """Trainers report per-source loss; the policy moves all weight to 'code'; steps planned after
    the report contain only code, steps planned before it keep the first mixture."""
    from policies import FollowTheLoss

    sources = [s for s in example_sources_small if s.name in ("chat", "code")]
    plan = (Plan(sources).mix(FollowTheLoss(["chat", "code"]))
            .cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=2048, global_batch=8)
            .distribute(ClientPlaceTree(dp=1)).seed(4).window(2))
    import dask

    with dask.config.set({"mdata.planner.trusted-modules": ["policies"]}):  # read by the scheduler
        submit_job(client, plan, job="metrics")
    with Loader(client, job="metrics", rank=0, world_size=1, steps=8, timeout=60) as loader:
        counts = []
        for batch in loader:
            counts.append(sorted({int(s) for s in batch["sample_ids"][:, 0].tolist()}))
            if batch["step"] == 1:
                loader.report_metrics(1, {"loss/chat": 0.0, "loss/code": 2.5})
    summaries = status(client, "metrics")["steps"]
    assert counts[0] == [0, 1]  # equal weights before any report
    assert counts[-1] == [1]  # only code once the report steered the mixture
    assert summaries["7"]["target_weights"] == {"chat": 0.0, "code": 1.0}
    assert summaries["7"]["counts"] == {"chat": 0, "code": 8}
    ckpt = client.sync(client.scheduler.mdata_checkpoint, job="metrics", step=8)
    assert ckpt["mixture"]["history"][-1]["metrics"] == {"loss/chat": 0.0, "loss/code": 2.5}
    client.sync(client.scheduler.mdata_close_job, job="metrics", client=client.id)
