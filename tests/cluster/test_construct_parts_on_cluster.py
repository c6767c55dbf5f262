"""One construct task per constructor slot and step (scheduler_plugins.construct_parts) on a
real cluster: each rank gets its own group's batch out of a part, and a group that cannot be
built is named in the error the trainers would hear."""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import pytest

from conftest import run_loaders
from mdata.cost import AttentionCost
from mdata.driver import submit_job
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.wire.messages import ChunkPull, ConstructPart, ConstructSpec
from workers.constructor import ChunkReleasedError, construct_part_task

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

DP, STEPS, BATCH = 4, 3, 16


def _construct_keys(dask_scheduler, job: str) -> list:
    return [list(key) for key in dask_scheduler.tasks
            if isinstance(key, tuple) and key[:2] == ("mdata-construct", job)]


def test_each_rank_gets_its_own_groups_batch_out_of_a_part(client, example_sources_small):
    """DP 4 on 2 constructor slots: 2 construct tasks a step, each building 2 groups; every
    rank receives its own group's samples, no sample twice within a step."""
    plan = (Plan(example_sources_small).mix({s.name: 1.0 for s in example_sources_small})
            .cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=4096, global_batch=BATCH)
            .distribute(ClientPlaceTree(dp=DP)).special_tokens(image_token_id=100_277)
            .seed(4).window(2))
    submit_job(client, plan, job="parts")
    got = run_loaders(client, job="parts", world_size=DP, steps=STEPS,
                      keep=lambda b: (b["step"], b["dp_rank"], np.asarray(b["sample_ids"])))
    # the window's later steps are built and held: one task per slot, named by its first group
    # (the last consumed step's parts are left out: consumption is told without a round trip
    # on the training loop, so a part may still be held for a moment after the loaders return)
    held = client.run_on_scheduler(_construct_keys, job="parts")
    per_step = defaultdict(list)
    for key in held:
        if key[3] >= STEPS:
            per_step[key[3]].append(key[4])
    assert per_step and all(sorted(firsts) == [0, 2] for firsts in per_step.values()), held
    # ... and every consumed step's parts are released once the last tells arrive
    deadline = time.monotonic() + 20
    while any(key[3] < STEPS for key in held) and time.monotonic() < deadline:
        time.sleep(0.1)
        held = client.run_on_scheduler(_construct_keys, job="parts")
    assert not [key for key in held if key[3] < STEPS], held
    for step in range(STEPS):
        seen: list[tuple] = []
        for rank in range(DP):
            s, dp_rank, ids = got[rank][step]
            assert (s, dp_rank) == (step, rank)  # its own group, not a neighbour in the part
            seen += [tuple(row) for row in np.asarray(ids).reshape(-1, 3).tolist()]
        assert len(seen) == BATCH and len(set(seen)) == BATCH  # every sample once
    client.sync(client.scheduler.mdata_close_job, job="parts", client=client.id)


def test_a_group_that_cannot_be_built_is_named_in_its_parts_error(client):
    """A part whose group draws on a chunk no worker holds fails with that chunk's typed error,
    and the error that reaches the client notes the step and DP rank it was building."""
    lost = ("mdata-load", "gone-job", "chat", 0, 0, 8)
    spec = ConstructSpec(
        step=7, dp_rank=3, chunks=(ChunkPull(lost, (0,), ()),),
        micro_batch=np.zeros(1, np.int64), position=np.zeros(1, np.int64),
        lengths=np.ones(1, np.int64), sample_ids=np.zeros((1, 3), np.int64),
        num_micro_batches=1, max_tokens=64, cp=1, pad_id=0, image_token_id=None, wait_s=1.0)
    fut = client.submit(construct_part_task, ConstructPart.of([spec]).to_msg(), resources={"mdata_constructor": 1},
                        pure=False)
    with pytest.raises(ChunkReleasedError, match="released by its job") as info:
        fut.result(timeout=60)
    assert "while building the batch of step 7 for DP rank 3" in getattr(info.value, "__notes__", ())
