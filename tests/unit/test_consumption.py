"""Consumption by DP group (mdata.planner.consumption) and its bulk lineage rows."""

from __future__ import annotations

import numpy as np

from mdata.lineage.dgraph import DGraph
from mdata.planner.consumption import consume_by_group

# two groups of two receiving ranks (0, 1) and (2, 3); ranks 4 and 5 get theirs by broadcast
RECEIVERS = [frozenset({0, 1}), frozenset({2, 3})]
RANK_DP = np.array([0, 0, 1, 1, -1, -1])


def test_a_group_completes_once_and_duplicates_count_once():
    consumed: dict[int, set[int]] = {}
    done, dps, ranks = consume_by_group(consumed, RECEIVERS, RANK_DP, np.array([3, 0, 0, 4]))
    assert done == [] and dps.tolist() == [0, 1] and ranks.tolist() == [0, 3]
    done, dps, ranks = consume_by_group(consumed, RECEIVERS, RANK_DP, np.array([1, 2, 1, 5, 3]))
    assert done == [0, 1]
    assert list(zip(dps.tolist(), ranks.tolist())) == [(0, 1), (1, 2)]
    # told again after completion: nothing new, nothing completed twice
    done, dps, ranks = consume_by_group(consumed, RECEIVERS, RANK_DP, np.array([0, 1, 2, 3]))
    assert done == [] and ranks.size == 0
    assert consumed == {0: {0, 1}, 1: {2, 3}}


def test_broadcast_only_ranks_change_nothing():
    consumed: dict[int, set[int]] = {}
    done, dps, ranks = consume_by_group(consumed, RECEIVERS, RANK_DP, np.array([4, 5]))
    assert done == [] and ranks.size == 0 and consumed == {}


def test_bulk_lineage_rows_match_one_row_per_rank():
    one, bulk = DGraph(["a"]), DGraph(["a"])
    one.record_delivered(0, 0, [0, 1])
    bulk.record_delivered(0, 0, [0, 1])
    for dp, rank in [(0, 0), (0, 1), (1, 2)]:
        one.record_consumed(0, dp, rank)
    bulk.record_consumed_many(0, np.array([0, 0, 1]), np.array([0, 1, 2]))
    a, b = one.rank_events, bulk.rank_events
    for name in ("step", "dp_rank", "rank", "kind", "seq"):
        assert a.column(name).tolist() == b.column(name).tolist(), name
