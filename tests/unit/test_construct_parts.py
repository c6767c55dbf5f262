"""One construct task per constructor slot: how a step's DP groups are split into parts, and
when a part may be released (scheduler_plugins.construct_parts; pure, no cluster)."""

from __future__ import annotations

import pytest

from scheduler_plugins.construct_parts import ConstructParts, split_groups


@pytest.mark.parametrize("groups, slots", [(16, 4), (17, 4), (3, 8), (2048, 24), (5, 1), (1, 1)])
def test_parts_cover_every_group_once_in_runs_of_consecutive_ranks(groups, slots):
    ranks = list(range(groups))[::-1]  # the order the groups came in does not matter
    parts = split_groups(ranks, slots)
    assert len(parts) == min(groups, slots)
    assert [dp for part in parts for dp in part] == sorted(ranks)  # each once, in order
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1  # the slots get equal shares (the Planner balanced groups)
    for part in parts:
        assert part == list(range(part[0], part[0] + len(part)))


def test_no_groups_no_parts_and_no_slots_still_one_part():
    assert split_groups([], 4) == []
    assert split_groups([3, 1, 2], 0) == [[1, 2, 3]]  # no constructor yet: queued as one task


def test_a_part_is_released_with_its_last_group_only():
    parts = ConstructParts()
    parts.add("task-a", [(5, 0), (5, 1), (5, 2)])
    parts.add("task-b", [(5, 3)])
    assert parts.members("task-a") == [(5, 0), (5, 1), (5, 2)]
    assert not parts.release("task-a", (5, 1))
    assert not parts.release("task-a", (5, 1))  # told twice: counted once
    assert not parts.release("task-a", (5, 0))
    assert parts.release("task-b", (5, 3))
    assert parts.members("task-a") == [(5, 2)]
    assert parts.release("task-a", (5, 2))
    assert len(parts) == 0 and parts.members("task-a") == []
    assert parts.release("task-a", (5, 2))  # unknown (e.g. after a rewind cleared it): release


def test_clear_forgets_every_part():
    parts = ConstructParts()
    parts.add("task-a", [(1, 0)])
    parts.clear()
    assert len(parts) == 0


def test_a_part_built_from_a_step_s_columns_gives_each_group_the_spec_of_its_own_view():
    """The runtime builds a construct task's argument from the Planner's step columns directly
    (``part_of_step``); each group's spec must be what its own samples view says."""
    import numpy as np

    from mdata.mesh import ClientPlaceTree
    from mdata.plan import Plan
    from mdata.planner import ConstructStep, PlannerState
    from mdata.wire.construct import ChunkPull, ConstructSpec
    from planner_driver import Driver, lognormal_metadata
    from scheduler_plugins.construct_parts import part_of_step

    meta = {"web": lognormal_metadata("web", 4, 500, 6.0, seed=4),
            "code": lognormal_metadata("code", 2, 90, 7.0, seed=5)}
    plan = (Plan(["web", "code"]).mix({"web": 3, "code": 1})
            .balance(micro_batches=2, max_tokens=8192, global_batch=40)
            .distribute(ClientPlaceTree(dp=8)).shuffle(4))
    driver = Driver(PlannerState(plan, meta), meta).run(3)
    settings = dict(max_tokens=8192, cp=1, pad_id=0, image_token_id=None, wait_s=30.0)
    holders = lambda key: (f"tcp://holder-of-{key[2]}:{key[4]}",)  # noqa: E731
    steps = [i for i in driver.instructions if isinstance(i, ConstructStep)]
    assert steps
    for ins in steps:
        for part in split_groups(ins.dp_ranks, 3):
            got = part_of_step(ins.step, ins.columns, part, holders, settings).specs()
            want = []
            for dp in part:
                s = ins.samples(dp)
                want.append(ConstructSpec(
                    step=ins.step, dp_rank=dp,
                    chunks=tuple(ChunkPull(key, tuple(idx.tolist()), holders(key))
                                 for key, idx in s.chunk_indices()),
                    micro_batch=s.micro_batch, position=s.position, lengths=s.num_tokens,
                    sample_ids=np.stack([s.source_index, s.shard, s.row], axis=1),
                    num_micro_batches=s.num_micro_batches, **settings))
            assert got == want
            assert sum(len(spec.lengths) for spec in got) == sum(len(ins.samples(dp)) for dp in part)
    with pytest.raises(ValueError, match="consecutive"):
        part_of_step(steps[0].step, steps[0].columns, [0, 2], holders, settings)
