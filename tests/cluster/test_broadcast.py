"""broadcast_at on a real embedded cluster: the receiving ranks get every planned token.

The same plan runs three times (no broadcast, ``broadcast_at("tp")``, ``broadcast_at("cp")``); the
plan is deterministic, so every run packs the same samples. Without broadcast each rank receives
its own view; under a broadcast the receivers must hold everything their groups would have pulled
(the TP receiver its TP group's identical copy, the CP receiver the whole sequence), which is
checked token for token against the run without broadcast and against the planned samples.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from conftest import run_loaders
from mdata.batch import zigzag_indices
from mdata.cost import AttentionCost
from mdata.driver import submit_job
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

MESH = ClientPlaceTree(dp=2, cp=2, tp=2)
STEPS = 3


def make_plan(sources) -> Plan:
    return (
        Plan(sources)
        .mix({s.name: 1.0 for s in sources})
        .cost(AttentionCost(a=1.0, b=2048.0))
        .balance(micro_batches=2, max_tokens=2048, global_batch=8)
        .distribute(MESH)
        .special_tokens(pad_id=0, image_token_id=100_277)
        .seed(3)
        .window(2)
    )


def keep(batch: dict) -> dict:
    """The numpy content of one received item (None where the rank receives by broadcast)."""
    if batch["micro_batches"] is None:
        return {"step": batch["step"], "broadcast_from": batch["broadcast_from"]}
    return {
        "step": batch["step"],
        "cp_rank": batch["cp_rank"],
        "sample_ids": batch["sample_ids"].numpy().copy(),
        "micro_batches": [
            {name: mb[name].numpy().copy()
             for name in ("input_ids", "labels", "cu_seqlens_global", "sample_ids")}
            for mb in batch["micro_batches"]
        ],
    }


def run(client, plan: Plan, job: str) -> dict[int, list[dict]]:
    submit_job(client, plan, job=job)
    got = run_loaders(client, job=job, world_size=MESH.world_size, steps=STEPS, keep=keep)
    graph = client.sync(client.scheduler.mdata_lineage, job=job, steps=STEPS)
    assert graph["exactly_once"]["ok"], graph["exactly_once"]["problems"]
    got["planned"] = graph["samples"]
    client.sync(client.scheduler.mdata_close_job, job=job, client=client.id)
    return got


def digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def whole_sequences(got, step: int, dp: int, tp: int) -> list[dict[str, np.ndarray]]:
    """Each micro-batch's whole sequence of a DP group, reassembled from its CP ranks' slices."""
    ranks = [got[MESH.rank((dp, 0, c, tp))][step] for c in range(MESH.cp)]
    out = []
    for m, first in enumerate(ranks[0]["micro_batches"]):
        cu = first["cu_seqlens_global"]
        seq_len = sum(len(r["micro_batches"][m]["input_ids"]) for r in ranks)
        full = {}
        for name in ("input_ids", "labels"):
            array = np.full(seq_len, -(2**31), dtype=np.int64)
            for c, r in enumerate(ranks):
                array[zigzag_indices(cu, seq_len, MESH.cp, c)] = r["micro_batches"][m][name]
            assert (array != -(2**31)).all()
            full[name] = array
        out.append(full)
    return out


@pytest.fixture(scope="module")
def runs(mdata_cluster, example_sources_small):
    from distributed import Client

    plan = make_plan(example_sources_small)
    with Client(mdata_cluster.scheduler_address, set_as_default=False,
                direct_to_workers=True) as client:
        return {axis: run(client, plan.broadcast_at(axis), f"bcast-{axis}")
                for axis in (None, "tp", "cp")}


def test_the_three_runs_plan_the_same_samples(runs):
    assert runs["tp"]["planned"] == runs[None]["planned"] == runs["cp"]["planned"]


def test_broadcast_at_cp_receivers_get_whole_sequences_of_every_planned_token(runs):
    base, cp = runs[None], runs["cp"]
    for rank in range(MESH.world_size):
        coord = MESH.coordinate(rank)
        source = MESH.rank((coord.dp, coord.pp, 0, coord.tp))
        for step in range(STEPS):
            item = cp[rank][step]
            if coord.cp != 0:
                assert item == {"step": step, "broadcast_from": source}
                continue
            planned = sorted(map(tuple, base["planned"][str(step)][str(coord.dp)]))
            assert item["cp_rank"] is None
            assert sorted(map(tuple, item["sample_ids"].tolist())) == planned
            expected = whole_sequences(base, step, coord.dp, coord.tp)
            for m, (mb, full) in enumerate(zip(item["micro_batches"], expected, strict=True)):
                assert digest(mb["input_ids"], mb["labels"]) == digest(
                    full["input_ids"].astype(np.int32), full["labels"].astype(np.int32))
                # and each CP rank cuts from it exactly what it pulled without broadcast
                cu, seq_len = mb["cu_seqlens_global"], len(mb["input_ids"])
                for c in range(MESH.cp):
                    mine = base[MESH.rank((coord.dp, 0, c, coord.tp))][step]["micro_batches"]
                    index = zigzag_indices(cu, seq_len, MESH.cp, c)
                    assert np.array_equal(mb["input_ids"][index], mine[m]["input_ids"])
                    assert np.array_equal(mb["labels"][index], mine[m]["labels"])


def test_broadcast_at_tp_receivers_get_what_their_tp_group_needs(runs):
    base, tp = runs[None], runs["tp"]
    for rank in range(MESH.world_size):
        coord = MESH.coordinate(rank)
        for step in range(STEPS):
            item = tp[rank][step]
            if coord.tp != 0:
                assert item == {"step": step, "broadcast_from": MESH.rank(coord._replace(tp=0))}
                continue
            assert item["cp_rank"] == coord.cp
            planned = sorted(map(tuple, base["planned"][str(step)][str(coord.dp)]))
            assert sorted(map(tuple, item["sample_ids"].tolist())) == planned
            for group_rank in (MESH.rank(coord._replace(tp=t)) for t in range(MESH.tp)):
                theirs = base[group_rank][step]["micro_batches"]
                for mb, other in zip(item["micro_batches"], theirs, strict=True):
                    assert digest(*mb.values()) == digest(*other.values())
    # the TP receivers' CP slices reassemble every planned token of their DP group
    for dp in range(MESH.dp):
        for step in range(STEPS):
            got = whole_sequences(tp, step, dp, 0)
            want = whole_sequences(base, step, dp, 0)
            assert [digest(*g.values()) for g in got] == [digest(*w.values()) for w in want]


PP_MESH = ClientPlaceTree(dp=2, pp=2)


def keep_present(batch: dict) -> dict:
    """Like :func:`keep`, for pipeline meshes: each stage holds only the fields it needs."""
    if batch["micro_batches"] is None:
        return {"step": batch["step"], "broadcast_from": batch["broadcast_from"]}
    return {"step": batch["step"], "sample_ids": batch["sample_ids"].numpy().copy(),
            "micro_batches": [{n: mb[n].numpy().copy() for n in ("input_ids", "labels") if n in mb}
                              for mb in batch["micro_batches"]]}


def test_broadcast_at_pp_first_stage_gets_inputs_and_labels_of_its_pipeline(
        mdata_cluster, example_sources_small):
    """Under broadcast_at("pp") only the first stage receives, and it holds what every stage of its
    pipeline needs: the first stage's input_ids and the last stage's labels, token for token."""
    from distributed import Client

    plan = make_plan(example_sources_small).distribute(PP_MESH)
    got = {}
    with Client(mdata_cluster.scheduler_address, set_as_default=False,
                direct_to_workers=True) as client:
        for axis in (None, "pp"):
            job = f"bcast-pipeline-{axis}"
            submit_job(client, plan.broadcast_at(axis), job=job)
            got[axis] = run_loaders(client, job=job, world_size=PP_MESH.world_size, steps=STEPS,
                                    keep=keep_present)
            client.sync(client.scheduler.mdata_close_job, job=job, client=client.id)
    for rank in range(PP_MESH.world_size):
        coord = PP_MESH.coordinate(rank)
        for step in range(STEPS):
            item = got["pp"][rank][step]
            if coord.pp != 0:
                assert item == {"step": step, "broadcast_from": PP_MESH.rank(coord._replace(pp=0))}
                continue
            first = got[None][rank][step]
            last = got[None][PP_MESH.rank(coord._replace(pp=PP_MESH.pp - 1))][step]
            assert np.array_equal(item["sample_ids"], first["sample_ids"])
            for mb, f, la in zip(item["micro_batches"], first["micro_batches"],
                                 last["micro_batches"], strict=True):
                assert np.array_equal(mb["input_ids"], f["input_ids"])
                assert np.array_equal(mb["labels"], la["labels"])
