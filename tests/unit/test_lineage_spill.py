"""Spilled lineage: segments taken out of the DGraph, written as Parquet, read back into stories
identical to the ones a DGraph that never forgot tells."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest

from mdata.lineage.dgraph import DGraph
from mdata.lineage.spill import SpilledLineage, SpillRange, StoryQuery
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.planner import PlannerState
from planner_driver import Driver, lognormal_metadata

STEPS = 40


def _meta():
    # code is small: its rows come back in later epochs (several occurrences per sample id)
    return {"web": lognormal_metadata("web", 4, 500, 6.0, seed=4, bad_every=37),
            "code": lognormal_metadata("code", 2, 90, 7.0, seed=5)}


def _plan():
    return (Plan(["web", "code"]).mix({"web": 3, "code": 1})
            .balance(micro_batches=2, max_tokens=8192, global_batch=32)
            .distribute(ClientPlaceTree(dp=4)).window(2))


class Sink:
    """What the runtime does with a segment, done at once: write it (or keep it pending)."""

    def __init__(self, url: str | None) -> None:
        self.spilled = SpilledLineage()
        self.fs, self.root = fsspec.core.url_to_fs(url) if url else (None, None)

    def __call__(self, segment) -> None:
        rng = SpillRange.of(len(self.spilled), segment)
        if self.fs is not None:
            rng.write(self.fs, self.root)
        self.spilled.add(rng)


def _runs(url: str | None, steps: int = STEPS):
    meta, plan = _meta(), _plan()
    sink = Sink(url)
    kept = PlannerState(plan, meta, lineage_steps=8, lineage_sink=sink)
    full = PlannerState(plan, meta)
    Driver(kept, meta).run(steps)
    Driver(full, meta).run(steps)
    return kept, full, sink


def _sample_ids(graph: DGraph, steps) -> list[tuple[int, int, int]]:
    t = graph.samples_table
    ids = np.concatenate([graph.samples(s) for s in steps]) - graph.first_id
    return sorted({(int(t.column("source_index")[i]), int(t.column("shard")[i]), int(t.column("row")[i]))
                   for i in ids})


def _full_story(full: DGraph, key) -> list:
    return [(int(i), full.story(int(i))) for i in full.find(*key)]


@pytest.mark.parametrize("written", [True, False], ids=["files", "pending"])
def test_spilled_stories_are_identical_to_a_dgraph_that_never_forgot(tmp_path, written):
    kept, full, sink = _runs(f"file://{tmp_path}/run" if written else None)
    graph = kept.dgraph
    assert graph.forgotten_before >= STEPS - 8 - 4 and len(sink.spilled) >= 3
    assert all(r.written == written for r in sink.spilled.ranges())
    keys = _sample_ids(full.dgraph, range(STEPS))
    checked = multi = 0
    for key in keys[::7] + _sample_ids(full.dgraph, [0]):  # across every range; step 0 whole
        want = _full_story(full.dgraph, key)
        got = StoryQuery.of(graph, sink.spilled.ranges(), *key).run()
        assert got == want, key
        checked += 1
        multi += len(want) > 1
    assert checked > 100 and multi > 5  # samples of several epochs, spilled and kept ones


def test_a_reader_finds_the_files_from_a_listing(tmp_path):
    url = f"file://{tmp_path}/run"
    kept, full, sink = _runs(url)
    names = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert len(names) == 4 * len(sink.spilled)
    assert names[0].startswith("000000-steps-000000000000-") and names[0].endswith(".loads.parquet")
    reopened = SpilledLineage.open(url)
    assert [(r.index, r.first_step, r.stop_step) for r in reopened.ranges()] == \
           [(r.index, r.first_step, r.stop_step) for r in sink.spilled.ranges()]
    assert [r.index for r in reopened.covering(0)] == [0]
    assert reopened.covering(kept.dgraph.forgotten_before) == ()
    for key in _sample_ids(full.dgraph, [0, 1]):
        assert StoryQuery.of(kept.dgraph, reopened.ranges(), *key).run() == _full_story(full.dgraph, key)
    (tmp_path / "run" / names[0]).unlink()  # an incomplete range is not read
    assert [r.index for r in SpilledLineage.open(url).ranges()] == [r.index for r in reopened.ranges()][1:]


def test_spilling_keeps_the_dgraph_flat_and_loses_nothing(tmp_path):
    meta, plan = _meta(), _plan()
    sink = Sink(f"file://{tmp_path}/run")
    kept = Driver(PlannerState(plan, meta, lineage_steps=8, lineage_sink=sink), meta)
    full = Driver(PlannerState(plan, meta), meta)
    sizes = []
    for steps in (100, 200, 300):
        kept.run(steps)
        full.run(steps)
        sizes.append(kept.state.dgraph.nbytes())
    assert sizes[0] == sizes[1] == sizes[2]  # flat: capacity reached early and never grown again
    graph = kept.state.dgraph
    assert len(graph) <= 16 * 32  # retention 8 + a batch of 2 + the window, 32 samples a step
    assert len(graph.loads) < len(full.state.dgraph.loads) / 10  # loads leave memory too
    spilled = sum(r.read("samples", {}).num_rows for r in sink.spilled.ranges())
    assert spilled + len(graph) == len(full.state.dgraph)  # every sample: in a file or in memory
    assert spilled == graph.first_id
    loads = sum(r.read("loads", {}).num_rows for r in sink.spilled.ranges())
    assert loads + len(graph.loads) == len(full.state.dgraph.loads)


def test_take_before_hands_out_what_forget_before_drops():
    g = DGraph(["web"], group_ranks=lambda d: [d])
    g.record_load(0, 5, "loader-1")
    for s in range(4):
        n = 3
        g.record_step(s, source_index=np.zeros(n), shard=np.zeros(n), row=np.arange(n) + 3 * s,
                      chunk_id=np.full(n, 5), cursor=np.arange(n) + 3 * s, dp_rank=np.zeros(n),
                      micro_batch=np.zeros(n), position=np.arange(n), num_tokens=np.full(n, 8))
        g.record_consumed(s, 0, 0)
    g.record_load(0, 6, "loader-2")
    seg = g.take_before(2)
    assert (seg.first_step, seg.stop_step, seg.first_id, seg.stop_id) == (0, 2, 0, 6)
    assert seg.samples["lineage_id"].tolist() == list(range(6))
    assert seg.samples["plan_seq"].tolist() == [2, 2, 2, 4, 4, 4]  # when steps 0 and 1 were planned
    assert seg.loads["worker"].tolist() == ["loader-1"] and seg.loads_before == 6
    assert seg.rank_events["step"].tolist() == [0, 1]
    assert g.first_id == 6 and g.forgotten_before == 2 and g.loads.column("seq").tolist() == [10]
    assert g.take_before(2) is None  # nothing older left
    rest = g.take_before(None)  # everything (a job rewound to a checkpoint)
    assert (rest.first_step, rest.stop_step, rest.first_id, rest.stop_id) == (2, 4, 6, 12)
    assert rest.loads["worker"].tolist() == ["loader-2"] and len(g) == 0
    after = DGraph(["web"])
    after.continue_after(g)
    assert after.next_id == 12 and after.loads_before == 11
    with pytest.raises(Exception, match="recorded lineage already"):
        g2 = DGraph(["web"])
        g2.record_load(0, 1, "w")
        g2.continue_after(g)


def test_a_rewound_job_keeps_the_stories_of_both_generations(tmp_path):
    """A job rewound to a checkpoint spills what its old DGraph held; the new one goes on with
    new lineage ids, so a replanned sample shows both occurrences."""
    meta, plan = _meta(), _plan()
    sink = Sink(f"file://{tmp_path}/run")
    first = PlannerState(plan, meta, lineage_steps=8, lineage_sink=sink)
    driver = Driver(first, meta).run(15)
    ckpt = first.checkpoint(15)
    driver.run(20)  # steps 15..19 consumed, then every trainer resumes from step 15
    sink(first.dgraph.take_before(None))
    second = PlannerState.from_checkpoint(plan, meta, ckpt, lineage_steps=8, lineage_sink=sink)
    second.dgraph.continue_after(first.dgraph)
    Driver(second, meta).run(30)
    full = Driver(PlannerState(plan, meta), meta).run(30).state.dgraph
    planned = lambda story: [e for _, events in story for e in events if e["event"] == "planned"]  # noqa: E731
    for step, times in ((0, 1), (16, 2)):  # step 16 was consumed, then replanned after the rewind
        for key in _sample_ids(full, [step]):
            got = StoryQuery.of(second.dgraph, sink.spilled.ranges(), *key).run()
            ids = [i for i, _ in got]
            assert len(set(ids)) == len(ids) and ids == sorted(ids)
            assert [e["step"] for e in planned(got)].count(step) == times
            assert all(e in planned(got) for e in planned(_full_story(full, key)))
            for _, events in got:  # steps both generations consumed: whole stories
                kinds = [e["event"] for e in events if e["event"] != "loaded"]
                if events[-1].get("step", 99) < 20:
                    assert kinds == ["planned", "consumed"], kinds
