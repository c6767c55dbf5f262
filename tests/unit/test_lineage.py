"""DGraph: columnar lineage tables, stories, lookups, exactly-once checks."""

from __future__ import annotations

import numpy as np
import pytest

from mdata.errors import PlanError
from mdata.lineage.column_table import ColumnTable
from mdata.lineage.dgraph import DGraph


def record(g: DGraph, step: int, cursors, dp_rank, source_index=0, chunk=5):
    n = len(cursors)
    return g.record_step(
        step, source_index=np.full(n, source_index), shard=np.full(n, 2),
        row=np.asarray(cursors) + 100, chunk_id=np.full(n, chunk), cursor=np.asarray(cursors),
        dp_rank=np.asarray(dp_rank), micro_batch=np.zeros(n), position=np.arange(n),
        num_tokens=np.full(n, 64))


def test_column_table_grows_and_keeps_rows():
    t = ColumnTable({"a": np.int64, "b": np.int32}, capacity=2)
    assert t.append(a=np.arange(3), b=7) == (0, 3)
    assert t.append(a=np.arange(5), b=np.arange(5)) == (3, 8)
    assert t.column("a").tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert t.column("b").tolist() == [7, 7, 7, 0, 1, 2, 3, 4]
    assert t.nbytes == 8 * 12
    with pytest.raises(ValueError, match="expected columns"):
        t.append(a=1)


def test_samples_by_step_and_rank_and_story():
    g = DGraph(["web", "code"], group_ranks=lambda d: [2 * d, 2 * d + 1])
    g.record_load(0, 5, "loader-1")
    ids = record(g, 0, [0, 1, 2, 3], dp_rank=[0, 1, 0, 1])
    assert ids.tolist() == [0, 1, 2, 3]
    assert g.samples(0, dp_rank=1).tolist() == [1, 3]
    g.record_delivered(0, 1, [2, 3])
    g.record_consumed(0, 1, 3)
    g.record_consumed(0, 1, 2)
    assert g.story(3) == [
        {"event": "loaded", "source": "web", "shard": 2, "row": 103, "chunk": 5, "worker": "loader-1"},
        {"event": "planned", "step": 0, "dp_rank": 1, "micro_batch": 0, "position": 3,
         "num_tokens": 64, "cursor": 3},
        {"event": "delivered", "step": 0, "dp_rank": 1, "ranks": [2, 3]},
        {"event": "consumed", "step": 0, "dp_rank": 1, "ranks": [2, 3]},
    ]
    with pytest.raises(PlanError, match="lineage id 9 is unknown"):
        g.story(9)


def test_find_every_occurrence_of_a_sample_id():
    g = DGraph(["web", "code"])
    record(g, 0, [0, 1], dp_rank=[0, 0])
    record(g, 1, [7, 0], dp_rank=[0, 0], source_index=1)
    record(g, 2, [0], dp_rank=[0])  # web row 100 again (next epoch in a tiny source)
    assert g.find("web", 2, 100).tolist() == [0, 4]
    assert g.find(1, 2, 100).tolist() == [3]
    assert g.find("code", 2, 999).tolist() == []
    assert g.bytes_per_sample() == 56.0


def test_verify_exactly_once_finds_gaps_repeats_and_missing_consumers():
    g = DGraph(["web"], group_ranks=lambda d: [d])
    record(g, 0, [0, 1, 2], dp_rank=[0, 0, 0])
    record(g, 1, [4, 4], dp_rank=[0, 0])
    g.record_consumed(0, 0, 0)
    rep = g.verify_exactly_once(0, 3)
    assert not rep.ok
    assert rep.problems == [
        "steps [2] were never planned",
        "source 'web': order positions [4] planned more than once",
        "source 'web': order positions [3] were passed over without being planned or skipped",
        "step 1, DP rank 0: ranks [0] never consumed the batch",
    ]
    g2 = DGraph(["web"], group_ranks=lambda d: [d])
    record(g2, 0, [0, 2], dp_rank=[0, 0])
    g2.record_skips(0, 0, np.array([2]), np.array([101]), np.array([1]))
    g2.record_consumed(0, 0, 0)
    assert g2.verify_exactly_once(0, 1).ok


def test_recording_a_step_twice_is_refused():
    g = DGraph(["web"])
    record(g, 0, [0], dp_rank=[0])
    with pytest.raises(PlanError, match="step 0 was already recorded"):
        record(g, 0, [1], dp_rank=[0])


def test_forgetting_old_steps_keeps_ids_stories_and_checks_of_the_rest():
    g = DGraph(["web"], group_ranks=lambda d: [d])
    g.record_load(0, 5, "loader-1")
    ids = {s: record(g, s, [4 * s + i for i in range(4)], dp_rank=[0, 0, 1, 1]) for s in range(6)}
    for s in range(6):
        for rank in (0, 1):
            g.record_delivered(s, rank, [rank])
            g.record_consumed(s, rank, rank)
    story = g.story(int(ids[4][2]))
    assert g.forget_before(3) == 12  # steps 0, 1, 2: 4 samples each
    assert len(g) == 12 and g.forgotten_before == 3
    assert g.samples(2).tolist() == []
    assert g.samples(4, dp_rank=1).tolist() == ids[4][2:].tolist()  # ids do not move
    assert g.story(int(ids[4][2])) == story
    assert g.find("web", 2, 100 + 13).tolist() == [13]
    assert g.find("web", 2, 100 + 1).tolist() == []  # a forgotten occurrence
    with pytest.raises(PlanError, match=r"lineage id 1 is unknown \(forgotten: lineage retention\)"):
        g.story(1)
    assert g.verify_exactly_once(3, 6).ok
    with pytest.raises(PlanError, match="steps before 3 were forgotten"):
        g.verify_exactly_once(0, 6)
    assert set(g.rank_events.column("step").tolist()) == {3, 4, 5}
    assert g.forget_before(2) == 0  # never backwards


def test_each_occurrence_tells_the_loads_that_served_it():
    """The same chunk is loaded once per epoch (and again after a lost worker): each occurrence
    of a sample lists the load before it was planned and reloads until it was consumed, not the
    loads of other epochs."""
    g = DGraph(["web"], group_ranks=lambda d: [d])
    g.record_load(0, 5, "loader-1")
    first = record(g, 0, [0], dp_rank=[0])
    g.record_load(0, 5, "loader-2")  # the worker holding it died: reloaded before consumption
    g.record_consumed(0, 0, 0)
    g.record_load(0, 5, "loader-3")  # next epoch
    second = record(g, 1, [0], dp_rank=[0])
    g.record_consumed(1, 0, 0)
    assert [e.get("worker") for e in g.story(int(first[0]))] == ["loader-1", None, "loader-2", None]
    assert [(e["event"], e.get("worker")) for e in g.story(int(second[0]))] == [
        ("loaded", "loader-3"), ("planned", None), ("consumed", None)]
