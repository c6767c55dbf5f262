"""PlannerState: events in, exact instructions out."""

from __future__ import annotations

import numpy as np
import pytest

from mdata.errors import CorruptShardError, MdataError, TrainerError
from mdata.mesh import ClientPlaceTree
from mdata.order import SourceOrder
from mdata.plan import Plan
from mdata.planner import (
    BatchConsumed, BatchDelivered, ChunkFailed, ChunkLoaded, ConstructStep, JobFailed, LoadChunk,
    PlannerState, PoolTarget, RanksConsumed, ReleaseBatch, ReleaseChunk, StepReady, Tick, WorkerLost,
)
from mdata.pools.demand import PoolSizer

from planner_driver import Driver, lognormal_metadata


class Src:
    """A source spec as the plan sees it: a name and rows per chunk."""

    def __init__(self, name, chunk_rows):
        self.name, self.chunk_rows = name, chunk_rows


def tiny(window=1, dp=2, batch=2, tp=1, broadcast=None, max_tokens=100):
    plan = (Plan([Src("a", 3)]).mix({"a": 1}).balance(micro_batches=1, max_tokens=max_tokens,
                                                      global_batch=batch)
            .distribute(ClientPlaceTree(dp=dp, tp=tp)).broadcast_at(broadcast).window(window)
            .shuffle(1))
    return plan, PlannerState(plan, {"a": [6]}, job="j")


def order():
    return SourceOrder([6], 3, seed=0, name="a", window=1)


def loaded(ref, tokens=None, skipped=(), worker="w1", sid=None, duration=0.0):
    rows = np.array([r for r in range(ref.start, ref.stop) if r not in skipped], np.int64)
    tok = np.array([10 + r for r in rows] if tokens is None else tokens, np.int32)
    return ChunkLoaded(ref, rows, tok, None, list(skipped), worker, duration,
                       stimulus_id=sid or f"loaded-{ref.chunk_id}")


def test_first_tick_loads_exactly_the_chunks_of_the_window():
    _, state = tiny(window=1)
    out = state.handle(Tick(stimulus_id="t0"))
    o = order()
    first = o.take(0, 2)
    expected = [LoadChunk(o.chunk_ref(c, 0, "j"), stimulus_id="t0")
                for c in dict.fromkeys(sorted(first.chunk_ids.tolist()))]
    assert out == expected
    assert out[0].chunk.key == ("mdata-load", "j", "a", 0, out[0].chunk.start)


def test_loaded_chunk_makes_the_step_ready_with_exact_samples():
    _, state = tiny(window=1)
    (load,) = state.handle(Tick(stimulus_id="t0"))
    out = state.handle(loaded(load.chunk, sid="L"))
    assert [type(i) for i in out] == [ConstructStep, StepReady]
    construct = out[0]
    assert (construct.step, list(construct.dp_ranks), construct.stimulus_id) == (0, [0, 1], "L")
    groups = construct.groups()
    assert [g.dp_rank for g in groups] == [0, 1] and groups == [construct.samples(0), construct.samples(1)]
    taken = order().take(0, 2)
    got = sorted(groups[0].ids(["a"]) + groups[1].ids(["a"]))
    assert got == sorted(("a", 0, int(r)) for r in taken.rows)
    with pytest.raises(IndexError, match="2 DP groups"):
        construct.samples(2)
    for s in groups:
        assert len(s) == 1 and s.chunks == (load.chunk,)
        assert s.index.tolist() == [int(s.row[0]) - load.chunk.start]
        assert s.num_tokens.tolist() == [10 + int(s.row[0])]
    (key, indices), = groups[0].chunk_indices()
    assert key == load.chunk.key and indices.tolist() == groups[0].index.tolist()
    summary = out[1].summary
    assert summary.counts.tolist() == [2] and summary.tokens.tolist() == [20 + int(taken.rows.sum())]
    assert summary.per_rank_cost.shape == (2,)
    assert dict(summary)["counts"] == {"a": 2} and dict(summary)["step"] == 0


def test_same_events_give_the_same_instructions():
    def play():
        _, state = tiny(window=2)
        out = state.handle(Tick(stimulus_id="t"))
        for ins in list(out):
            out += state.handle(loaded(ins.chunk))
        return out

    a, b = play(), play()
    assert a == b and len(a) > 4


def test_backpressure_release_and_window_advance():
    _, state = tiny(window=1)
    (load,) = state.handle(Tick(stimulus_id="t0"))
    state.handle(loaded(load.chunk))
    assert state.planned_step == 1 and state.balanced_step == 1
    assert state.handle(Tick(stimulus_id="t1")) == []  # nothing beyond the window
    out = state.handle(BatchConsumed(0, 0, stimulus_id="c0"))
    assert out == [ReleaseBatch(0, (0,), stimulus_id="c0")]
    out = state.handle(BatchConsumed(0, 1, stimulus_id="c1"))
    # step 0 done: its chunk is released unless step 1 needs it, and step 1 is planned
    o = order()
    step1_chunks = set(o.take(2, 2).chunk_ids.tolist())
    assert out[0] == ReleaseBatch(0, (1,), stimulus_id="c1")
    released = [i.chunk.chunk_id for i in out if isinstance(i, ReleaseChunk)]
    loads = [i.chunk.chunk_id for i in out if isinstance(i, LoadChunk)]
    assert released == ([] if load.chunk.chunk_id in step1_chunks else [load.chunk.chunk_id])
    assert sorted(loads) == sorted(step1_chunks - {load.chunk.chunk_id})
    assert state.consumed_step == 1 and state.planned_step == 2


def test_quiet_acknowledgements_are_exactly_those_that_plan_nothing():
    """is_quiet() lets the scheduler apply a batch of events without its planning thread: it
    must say True only where handle() then balances and loads nothing."""
    _, state = tiny(window=1)
    (load,) = state.handle(Tick(stimulus_id="t0"))
    assert not state.is_quiet([loaded(load.chunk)]) and not state.is_quiet([Tick(stimulus_id="t")])
    assert not state.is_quiet([BatchConsumed(0, 0, stimulus_id="c")])  # step 0 not balanced yet
    state.handle(loaded(load.chunk))
    delivered = BatchDelivered(0, 0, (0,), stimulus_id="d0")
    assert state.is_quiet([delivered, BatchConsumed(0, 0, stimulus_id="c0")])
    assert not state.is_quiet([BatchConsumed(0, 0, stimulus_id="c0"), BatchConsumed(0, 1, stimulus_id="c1")])
    assert not state.is_quiet([RanksConsumed(0, (0, 1), stimulus_id="c01")])
    assert state.handle(delivered, BatchConsumed(0, 0, stimulus_id="c0")) == [
        ReleaseBatch(0, (0,), stimulus_id="c0")]  # a group released, nothing planned
    assert not state.is_quiet([BatchConsumed(0, 1, stimulus_id="c1")])  # would complete step 0
    out = state.handle(BatchConsumed(0, 1, stimulus_id="c1"))
    assert any(isinstance(i, (LoadChunk, ReleaseChunk)) for i in out) and state.consumed_step == 1
    assert not state.is_quiet([BatchConsumed(0, 1, stimulus_id="late")])  # a late duplicate


def test_broadcast_at_tp_releases_a_group_when_tp_rank_0_consumed():
    _, state = tiny(window=1, dp=1, batch=2, tp=2, broadcast="tp")
    (load,) = state.handle(Tick(stimulus_id="t0"))
    state.handle(loaded(load.chunk))
    assert state.handle(BatchConsumed(0, 1, stimulus_id="c1")) == []  # TP rank 1: broadcast
    out = state.handle(BatchConsumed(0, 0, stimulus_id="c0"))
    assert out[0] == ReleaseBatch(0, (0,), stimulus_id="c0") and state.consumed_step == 1


def test_unknown_rank_and_unplanned_step_are_trainer_errors():
    _, state = tiny(window=1)
    state.handle(Tick(stimulus_id="t0"))
    with pytest.raises(TrainerError, match="rank 9 is not in the mesh"):
        state.handle(BatchConsumed(0, 9, stimulus_id="x"))
    with pytest.raises(TrainerError, match="consuming step 0, which is not planned yet"):
        state.handle(BatchConsumed(0, 0, stimulus_id="x"))


def test_skipped_rows_are_passed_over_and_counted():
    _, state = tiny(window=1, dp=1, batch=2)
    o = order()
    (load,) = state.handle(Tick(stimulus_id="t0"))
    first = o.take(0, 2)
    bad = int(first.rows[0])  # the first sample in order is bad
    out = state.handle(loaded(load.chunk, skipped=(bad,)))
    extra = [i for i in out if isinstance(i, LoadChunk)]
    for ins in extra:  # the replacement may live in another chunk
        out += state.handle(loaded(ins.chunk))
    (construct,) = [i for i in out if isinstance(i, ConstructStep)]
    (batch,) = construct.groups()
    (ready,) = [i for i in out if isinstance(i, StepReady)]
    expected = [int(r) for r in o.take(0, 3).rows if int(r) != bad][:2]
    assert sorted(batch.row.tolist()) == sorted(expected)
    assert state.skipped.tolist() == [1] and ready.summary.skipped == 1
    rep = state.dgraph.verify_exactly_once(0, 1)
    assert rep.skipped == 1 and rep.samples == 2


def test_truncation_is_counted():
    _, state = tiny(window=1, dp=1, batch=2, max_tokens=12)
    (load,) = state.handle(Tick(stimulus_id="t0"))
    out = state.handle(loaded(load.chunk, tokens=[50, 5, 7][: load.chunk.num_rows]))
    (construct,) = [i for i in out if isinstance(i, ConstructStep)]
    (batch,) = construct.groups()
    assert batch.num_tokens.max() <= 12
    n_long = sum(1 for r in batch.row.tolist() if [50, 5, 7][r - load.chunk.start] > 12)
    assert state.truncated == n_long and out[-1].summary.truncated == n_long


def test_chunk_failure_fails_the_job_naming_the_rows():
    _, state = tiny(window=1)
    (load,) = state.handle(Tick(stimulus_id="t0"))
    error = CorruptShardError("bad footer", source="a", shard="a-0.parquet")
    (failed,) = state.handle(ChunkFailed(load.chunk, error, stimulus_id="f"))
    r = load.chunk
    assert failed == JobFailed(
        f"loading source 'a', shard 0, rows {r.start}-{r.stop} failed: source 'a', shard "
        "'a-0.parquet': bad footer. Fix or remove the shard, or raise the source's skip_tolerance "
        "if single samples are bad", error, stimulus_id="f")
    assert failed.error is error and failed.error.shard == "a-0.parquet"  # the typed error, kept
    assert state.handle(loaded(load.chunk)) == []  # a failed job plans nothing more


def test_an_untyped_load_failure_fails_the_job_without_a_typed_error():
    _, state = tiny(window=1)
    (load,) = state.handle(Tick(stimulus_id="t0"))
    (failed,) = state.handle(ChunkFailed(load.chunk, OSError("connection reset"), stimulus_id="f"))
    assert isinstance(failed, JobFailed) and failed.error is None
    assert "failed: connection reset." in failed.reason


def test_an_inconsistent_load_fails_the_job_with_its_typed_error():
    _, state = tiny(window=1)
    (load,) = state.handle(Tick(stimulus_id="t0"))
    ref = load.chunk
    bad = ChunkLoaded(ref, np.arange(ref.start, ref.stop), np.ones(1, np.int32), stimulus_id="l")
    (failed,) = state.handle(bad)
    assert isinstance(failed, JobFailed) and type(failed.error) is MdataError
    assert failed.reason == f"step 0: {failed.error}" and "token counts" in failed.reason
    assert state.failed == failed.reason


def test_worker_lost_reloads_only_needed_chunks():
    _, state = tiny(window=1)
    (load,) = state.handle(Tick(stimulus_id="t0"))
    state.handle(loaded(load.chunk, worker="w1"))
    out = state.handle(WorkerLost("w1", stimulus_id="lost"))
    assert out == [LoadChunk(load.chunk, reload=True, stimulus_id="lost")]
    # a second loss report while the reload is under way does not load it twice
    assert state.handle(WorkerLost("w2", (load.chunk,), stimulus_id="lost2")) == []
    state.handle(loaded(load.chunk, worker="w3"))
    state.handle(BatchConsumed(0, 0, stimulus_id="c0"), BatchConsumed(0, 1, stimulus_id="c1"))
    held = {c.key for c in state.chunk_refs()}
    out = state.handle(WorkerLost("w3", (load.chunk,), stimulus_id="lost3"))
    # only chunks a planned step still needs come back
    assert out == ([LoadChunk(load.chunk, reload=True, stimulus_id="lost3")] if load.chunk.key in held else [])


def test_tick_emits_pool_targets_from_measured_loads():
    _, state = tiny(window=1, dp=1)
    state.pool_sizer = PoolSizer(state.names, interval_s=0.0)
    out = state.handle(Tick(now=0.0, stimulus_id="t0"))
    for step in range(2):  # consume a step a second, loading each chunk asked for (100 ms/sample)
        for ins in out:
            if isinstance(ins, LoadChunk):
                state.handle(loaded(ins.chunk, duration=0.3, sid=f"l{step}"))
        out = state.handle(BatchConsumed(step, 0, stimulus_id=f"c{step}"))
        out += state.handle(Tick(now=1.0 + step, stimulus_id=f"t{step + 1}", pool_threads=(2,),
                                 wall=5.0))
    targets = [i for i in out if isinstance(i, PoolTarget)]
    # 1 step/s x 2 samples x 0.1 s = 0.2 busy threads x 1.25 / 2 threads -> 1 worker
    assert [(t.source, t.workers, t.decision.threads, t.decision.time) for t in targets] == [
        ("a", 1, 2, 5.0)]
    assert targets[0].decision.demand == pytest.approx(0.25)


def test_log_is_bounded_and_queryable():
    plan, _ = tiny(window=2)
    state = PlannerState(plan, {"a": [6]}, job="j", log_size=3)
    meta = {"a": lognormal_metadata("a", 1, 6, 3.0, seed=0)}
    Driver(state, meta).run(4)
    assert len(state.log) == 3
    sid, event, instructions = state.log[-1]
    assert state.story(sid)[-1] == (sid, event, instructions)


def test_the_log_describes_events_and_counts_instructions_without_keeping_them():
    """A log entry holds no event or instruction object (at DP 1,024 those held whole steps'
    arrays alive, 1.6 GB after 600 steps): the event described, instructions counted by kind."""
    plan, _ = tiny(window=2)
    state = PlannerState(plan, {"a": [6]}, job="j")
    meta = {"a": lognormal_metadata("a", 1, 6, 3.0, seed=0)}
    Driver(state, meta).run(4)
    entries = list(state.log)
    for entry in entries:
        assert isinstance(entry.event, str)
        assert all(isinstance(name, str) and isinstance(n, int) for name, n in entry.instructions)
    caused = [dict(e.instructions) for e in entries if "ConstructStep" in dict(e.instructions)]
    assert caused and all(c["ConstructStep"] >= 1 for c in caused)
    loaded = [e for e in entries if e.event.startswith("ChunkLoaded(")]
    assert loaded and "rows=<" in loaded[0].event and "worker=" in loaded[0].event


def test_an_event_description_names_its_scalars_and_sizes_its_sequences():
    from mdata.planner import RanksConsumed
    from mdata.planner.event_log import describe_event, log_entry

    ev = RanksConsumed(3, tuple(range(1024)), stimulus_id="c3")
    assert describe_event(ev) == "RanksConsumed(step=3, ranks=<1024 items>)"
    assert describe_event(RanksConsumed(3, (0, 1), stimulus_id="c3")) == "RanksConsumed(step=3, ranks=(0, 1))"
    assert log_entry(ev, [ev, ev, 1]) == ("c3", describe_event(ev), (("RanksConsumed", 2), ("int", 1)))


def _web_and_code_on_a_large_mesh():
    """Two sources (one with rows a loader skips) on a DP 8 x PP 2 x TP 2 mesh."""
    meta = {"web": lognormal_metadata("web", 4, 500, 6.0, seed=4, bad_every=13),
            "code": lognormal_metadata("code", 2, 90, 7.0, seed=5)}
    plan = (Plan(["web", "code"]).mix({"web": 3, "code": 1})
            .balance(micro_batches=2, max_tokens=8192, global_batch=64)
            .distribute(ClientPlaceTree(dp=8, pp=2, tp=2)).window(2))
    return meta, plan


def test_large_mesh_driver_run_is_exactly_once():
    meta, plan = _web_and_code_on_a_large_mesh()
    state = PlannerState(plan, meta)
    Driver(state, meta).run(12)
    rep = state.dgraph.verify_exactly_once(0, 12)
    assert rep.ok, rep.problems
    assert rep.samples == 12 * 64 and rep.skipped > 0
    whole = state.dgraph.verify_exactly_once(0, state.balanced_step, require_consumed=False)  # steps planned ahead too
    assert whole.ok and whole.skipped == int(state.skipped.sum())
    # every chunk still held is needed by a step not yet consumed
    assert state.chunks_in_memory <= len(state.chunk_refs())
    # the kept count is the chunks loaded (through loads, skips, releases and window holds)
    assert state.chunks_in_memory == state.chunks.count_loaded() > 0


def test_chunks_stay_loaded_while_their_shuffle_window_is_in_use():
    """Few samples per step from a window of several chunks: each chunk loads once per epoch,
    and is released once the source's cursor has left its window."""
    meta = {"web": lognormal_metadata("web", 2, 512, 6.0, seed=8),
            "code": lognormal_metadata("code", 1, 512, 6.0, seed=9)}
    plan = (Plan([Src("web", 32), Src("code", 32)]).mix({"web": 1, "code": 1})
            .balance(micro_batches=1, max_tokens=8192, global_batch=4)
            .distribute(ClientPlaceTree(dp=2)).window(2).shuffle(4))
    state = PlannerState(plan, meta)
    driver = Driver(state, meta).run(200)  # 400 samples per source: inside the first epoch
    loads = [i.chunk.key for i in driver.instructions if isinstance(i, LoadChunk)]
    releases = [i.chunk.key for i in driver.instructions if isinstance(i, ReleaseChunk)]
    assert len(loads) == len(set(loads))
    assert set(releases) <= set(loads) and len(releases) == len(set(releases))
    # at most the current window (4 chunks) plus the next per source is held
    assert state.chunks_in_memory <= 2 * 2 * 4
    assert state.chunks_in_memory == state.chunks.count_loaded()
    # 400 of 1024/512 rows consumed: web (2 shards x 16 chunks) and code (16 chunks) moved on
    assert len(releases) >= 8


def test_step_samples_are_grouped_by_chunk_for_the_constructor():
    meta = {"web": lognormal_metadata("web", 2, 400, 6.0, seed=6)}
    plan = (Plan([Src("web", 16)]).mix({"web": 1})
            .balance(micro_batches=3, max_tokens=8192, global_batch=40)
            .distribute(ClientPlaceTree(dp=2)).shuffle(4))
    state = PlannerState(plan, meta)
    driver = Driver(state, meta).run(3)
    for s in (g for i in driver.instructions if isinstance(i, ConstructStep) for g in i.groups()):
        assert np.all(np.diff(s.chunk) >= 0) and len(s.chunks) > 1
        pulled = np.concatenate([idx for _, idx in s.chunk_indices()])
        assert pulled.tolist() == s.index.tolist()
        rows = [s.chunks[c].start + 0 for c in s.chunk.tolist()]  # no skips: index = row - start
        assert (np.array(rows) + s.index).tolist() == s.row.tolist()
        # within a chunk, samples keep (micro_batch, position) order
        for j in range(len(s.chunks)):
            mb_pos = list(zip(s.micro_batch[s.chunk == j].tolist(), s.position[s.chunk == j].tolist()))
            assert mb_pos == sorted(mb_pos)


def test_lineage_retention_bounds_the_dgraph_of_a_long_run():
    meta = {"web": lognormal_metadata("web", 4, 500, 6.0, seed=4),
            "code": lognormal_metadata("code", 2, 90, 7.0, seed=5)}
    plan = (Plan(["web", "code"]).mix({"web": 3, "code": 1})
            .balance(micro_batches=2, max_tokens=8192, global_batch=32)
            .distribute(ClientPlaceTree(dp=4)).window(2))
    kept = PlannerState(plan, meta, lineage_steps=8)
    full = PlannerState(plan, meta)
    Driver(kept, meta).run(40)
    Driver(full, meta).run(40)
    assert 8 <= 40 - kept.dgraph.forgotten_before <= 8 + 2 + 2  # retention, batch of 8//4, window
    assert len(kept.dgraph) < len(full.dgraph) / 2
    # what is kept is identical to the full run's, and still verifiably exactly once
    for step in range(kept.dgraph.forgotten_before, 40):
        assert kept.dgraph.samples(step).tolist() == full.dgraph.samples(step).tolist()
    assert kept.dgraph.verify_exactly_once(kept.dgraph.forgotten_before, 40).ok


def test_acknowledgements_in_bulk_plan_exactly_what_one_event_per_rank_plans():
    meta, plan = _web_and_code_on_a_large_mesh()
    one = Driver(PlannerState(plan, meta), meta).run(12)
    bulk = Driver(PlannerState(plan, meta), meta, bulk=True).run(12)
    assert bulk.delivered == one.delivered
    assert bulk.state.dgraph.verify_exactly_once(0, 12).ok
    assert bulk.state.checkpoint(12).to_dict() == one.state.checkpoint(12).to_dict()
    kinds = lambda d: sorted(type(i).__name__ for i in d.instructions  # noqa: E731
                             if not isinstance(i, ReleaseBatch))
    assert kinds(bulk) == kinds(one)
    # the same groups released, in fewer instructions: one per event, naming every group it completed
    released = lambda d: sorted((i.step, dp) for i in d.instructions  # noqa: E731
                                if isinstance(i, ReleaseBatch) for dp in i.dp_ranks)
    assert released(bulk) == released(one) and len(set(released(one))) == len(released(one)) > plan.mesh.dp
    assert sum(isinstance(i, ReleaseBatch) for i in bulk.instructions) < len(released(bulk))


def test_coalescing_acknowledgements_merges_by_step_and_group():
    from mdata.planner import BatchDelivered, RanksConsumed, coalesce_acknowledgements

    events = [
        BatchDelivered(3, 0, (0,), stimulus_id="d0"), BatchConsumed(3, 0, stimulus_id="c0"),
        BatchDelivered(2, 1, (2,), stimulus_id="d2"), BatchConsumed(2, 2, stimulus_id="c2"),
        BatchDelivered(3, 0, (1,), stimulus_id="d1"), BatchConsumed(3, 1, stimulus_id="c1"),
        Tick(stimulus_id="t"),
    ]
    assert coalesce_acknowledgements(events) == [
        Tick(stimulus_id="t"),
        BatchDelivered(2, 1, (2,), stimulus_id="d2"),
        BatchDelivered(3, 0, (0, 1), stimulus_id="d0"),
        RanksConsumed(2, (2,), stimulus_id="c2"),
        RanksConsumed(3, (0, 1), stimulus_id="c0"),
    ]
