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
