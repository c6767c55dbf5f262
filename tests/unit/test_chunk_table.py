"""ChunkTable: chunk requests, references by steps, shuffle-window holds and cost features."""

from __future__ import annotations

import numpy as np
import pytest

from mdata.errors import MdataError
from mdata.order import SourceOrder
from mdata.planner.chunk_arrays import MASK, SHIFT, ChunkRecords
from mdata.planner.chunk_table import ChunkTable, FeatureStore, NotLoaded, chunk_key
from mdata.planner.instructions import LoadChunk, ReleaseChunk


def table(window: int = 1) -> ChunkTable:
    """Two sources: "a" with 3 chunks of 4 rows (the last one of 2), "b" with 2 chunks of 4."""
    orders = [SourceOrder([10], 4, seed=0, name="a", window=window),
              SourceOrder([4, 4], 4, seed=0, name="b", window=window)]
    return ChunkTable(orders, job="j", width=4)


A0, A1, A2 = (chunk_key(0, c) for c in range(3))
B0, B1 = (chunk_key(1, c) for c in range(2))


def kinds(out):
    """``(instruction type name, source, chunk id)`` of each instruction."""
    return [(type(i).__name__, i.chunk.source, i.chunk.chunk_id) for i in out]


def fill(t: ChunkTable, key: int, skipped=()) -> None:
    """Load chunk ``key`` with tokens 10*row (rows in ``skipped`` rejected by the loader)."""
    (ref,) = t.refs_of([key])
    rows = np.array([r for r in range(ref.start, ref.stop) if r not in skipped], np.int64)
    t.fill(t.placed(ref, "w1"), rows, rows.astype(np.int32) * 10, None)


def test_chunk_keys_pack_the_source_above_the_chunk_id():
    assert chunk_key(0, 5) == 5 and chunk_key(3, 5) == (3 << 40) | 5
    assert chunk_key(1, 0) > chunk_key(0, (1 << 40) - 1)


def test_each_chunk_is_requested_once_in_the_order_steps_need_them():
    t = table()
    out = []
    t.need(0, [A1, B0], "s0", out)
    t.need(1, [B0, A0], "s1", out)
    assert kinds(out) == [("LoadChunk", "a", 1), ("LoadChunk", "b", 0), ("LoadChunk", "a", 0)]
    assert [i.stimulus_id for i in out] == ["s0", "s0", "s1"]
    ref = out[0].chunk
    assert (ref.source_index, ref.shard, ref.start, ref.stop, ref.job) == (0, 0, 4, 8, "j")
    assert [r.chunk_id for r in t.refs()] == [1, 0, 0] and len(t) == 3
    assert t.chunks_of(1) == [B0, A0]
    assert t.in_memory == 0 and t.waiting(0) and t.waiting(1)


def test_a_step_waits_until_every_chunk_it_needs_is_loaded():
    t = table()
    t.need(0, [A0, B0], "s", [])
    t.need(1, [B0], "s", [])
    fill(t, B0)
    assert t.waiting(0) and not t.waiting(1)
    fill(t, A0)
    assert not t.waiting(0) and t.in_memory == 2
    out = []
    t.need(2, [A0], "s", out)  # already loaded: neither requested again nor waited for
    assert out == [] and not t.waiting(2)


def test_a_chunk_is_released_when_the_last_step_needing_it_is_consumed():
    t = table()
    t.need(0, [A0, B0], "s", [])
    t.need(1, [A0], "s", [])
    fill(t, A0)
    out = []
    t.release(0, "r0", out)
    assert kinds(out) == [("ReleaseChunk", "b", 0)]  # A0 is still needed by step 1
    out = []
    t.release(1, "r1", out)
    assert kinds(out) == [("ReleaseChunk", "a", 0)] and out[0].stimulus_id == "r1"
    assert len(t) == 0 and t.in_memory == 0
    out = []
    t.need(2, [A0], "s", out)  # released chunks are requested afresh
    assert kinds(out) == [("LoadChunk", "a", 0)]


def test_chunks_of_the_current_shuffle_window_stay_held_until_the_cursor_leaves_it():
    t = table(window=1)
    start, end, window = t.orders[0].window_span(0)
    (cid,) = window  # one chunk per window: the first chunk of epoch 0's permutation
    key = chunk_key(0, cid)
    t.need(0, [key], "s", [])
    fill(t, key)
    out = []
    t.roll_windows(np.array([start, 0]), "s", out)  # both sources enter their first window
    out = []
    t.release(0, "r", out)
    assert out == [] and t.held() == [key] and t.in_memory == 1  # later steps draw from it again
    out = []
    t.need(1, [key], "s", out)  # needed again: no reload, no longer merely held
    assert out == [] and t.held() == [] and not t.waiting(1)
    t.release(1, "r", out)
    assert t.held() == [key]
    t.roll_windows(np.array([end - 1, 0]), "s", out)  # still inside the window
    assert out == []
    t.roll_windows(np.array([end, 0]), "leave", out)
    assert kinds(out) == [("ReleaseChunk", "a", cid)] and out[0].stimulus_id == "leave"
    assert t.held() == [] and len(t) == 0


def test_settle_keeps_the_final_chunks_of_a_step_and_lets_go_of_the_rest():
    t = table()
    t.need(0, [A0, A1], "s", [])
    t.need(1, [A2], "s", [])
    for key in (A0, A1, A2):
        fill(t, key)
    out = []
    t.settle(0, [A1, A2], "settle", out)  # skips moved step 0 past A0 and into A2
    assert kinds(out) == [("ReleaseChunk", "a", 0)]
    assert t.chunks_of(0) == [A1, A2]
    out = []
    t.release(1, "r", out)
    assert out == []  # step 0 needs A2 now
    t.release(0, "r", out)
    assert kinds(out) == [("ReleaseChunk", "a", 1), ("ReleaseChunk", "a", 2)]


def test_moving_a_chunk_between_steps_keeps_it_loaded():
    t = table()
    t.need(1, [A0, A1], "s", [])
    t.need(2, [A2], "s", [])
    fill(t, A1)
    out = []
    t.move([(1, [A1, A2]), (2, [B0])], "move", out)  # A2 moves from step 2 to step 1
    assert kinds(out) == [("LoadChunk", "b", 0), ("ReleaseChunk", "a", 0)]
    assert t.chunks_of(1) == [A1, A2] and t.chunks_of(2) == [B0]
    assert t.waiting(1)  # A2 is still loading
    fill(t, A2)
    assert not t.waiting(1) and t.waiting(2)


def test_a_load_that_disagrees_with_its_chunk_is_a_typed_error():
    t = table()
    t.need(0, [A0], "s", [])
    (ref,) = t.refs_of([A0])
    c = t.placed(ref, "w1")
    with pytest.raises(MdataError, match=r"the load reported 4 rows, 3 token counts"):
        t.fill(c, np.arange(4), np.ones(3, np.int32), None)
    with pytest.raises(MdataError, match=r"rows must lie in \[0, 4\)"):
        t.fill(c, np.arange(1, 5), np.ones(4, np.int32), None)
    assert not t.loaded(c) and t.waiting(0)


def test_a_load_of_a_released_chunk_is_ignored():
    t = table()
    t.need(0, [B1], "s", [])
    (ref,) = t.refs_of([B1])
    t.release(0, "r", [])
    assert t.placed(ref, "w1") is None and ref not in t


def test_gather_finds_each_samples_features_and_marks_skipped_rows():
    t = table()
    t.need(0, [A1, B1], "s", [])
    fill(t, A1, skipped={5})
    fill(t, B1)
    src = np.array([1, 0, 0, 0], np.int64)
    row = np.array([2, 4, 5, 7], np.int64)  # b: shard 1 row 2; a: rows 4, 5 (skipped), 7
    chunk = np.array([1, 1, 1, 1], np.int64)
    keys, index, tokens, patches = t.gather(src, row, chunk)
    assert keys.tolist() == [B1, A1, A1, A1]
    assert index.tolist() == [2, 0, -1, 2]  # position among the chunk's kept rows
    assert tokens[index >= 0].tolist() == [20, 40, 70] and patches.tolist() == [0, 0, 0, 0]
    with pytest.raises(NotLoaded) as exc:
        t.gather(np.array([0, 0, 1]), np.array([0, 4, 0]), np.array([0, 1, 0]))
    assert exc.value.missing == [A0, B0]  # A0 never requested, B0 not loaded


def test_a_lost_worker_reloads_needed_chunks_and_forgets_held_ones():
    t = table(window=1)
    _, _, window = t.orders[1].window_span(0)
    (held_id,) = window
    held, needed = chunk_key(1, held_id), chunk_key(1, 1 - held_id)
    t.need(0, [held], "s", [])
    t.need(1, [needed], "s", [])
    fill(t, held)
    fill(t, needed)  # both on w1
    t.roll_windows(np.array([0, 0]), "s", [])
    t.release(0, "r", [])
    assert t.held() == [held]
    (needed_ref,) = t.refs_of([needed])
    t.placed(needed_ref, "w2")  # a second load of it finished on w2
    out = []
    t.worker_lost("w1", (), "lost", out)
    assert kinds(out) == [("ReleaseChunk", "b", held_id)]  # only held: forgotten, not reloaded
    assert t.held() == [] and t.refs() == [needed_ref]
    t.worker_lost("w2", (), "lost2", out)  # needed by step 1: reloaded
    assert kinds(out[1:]) == [("LoadChunk", "b", 1 - held_id)] and out[1].stimulus_id == "lost2"
    assert not t.waiting(1) and t.in_memory == 1  # its cost features stay valid meanwhile
    out = []
    t.worker_lost("w2", (), "again", out)  # its reload is not placed on w2: nothing more to do
    assert out == []


def test_a_lost_worker_ignores_reported_chunks_that_live_elsewhere():
    t = table()
    t.need(0, [A1], "s", [])
    fill(t, A1)  # on w1
    (ref,) = t.refs_of([A1])
    out = []
    t.worker_lost("w9", (ref, ref.key), "lost", out)  # by ref and by task key
    assert out == [] and t.in_memory == 1
    t.worker_lost("w1", (ref,), "lost", out)
    assert kinds(out) == [("LoadChunk", "a", 1)]


def test_the_feature_store_grows_and_reuses_freed_slots():
    store = FeatureStore(width=3, capacity=2)
    slots = [store.put(np.array([0, 2]), np.array([5, 6]), np.array([1, 1])) for _ in range(3)]
    assert sorted(slots) == [0, 1, 2] and store.tokens.shape == (4, 3)
    assert store.index[slots[2]].tolist() == [0, -1, 1]
    assert store.tokens[slots[2]].tolist() == [5, 0, 6]
    store.release(slots[0])
    again = store.put(np.array([1]), np.array([9]), np.array([0]))
    assert again == slots[0] and store.index[again].tolist() == [-1, 0, -1]
    assert store.tokens.shape == (4, 3)


def test_records_find_keys_added_in_any_order_and_forget_removed_ones():
    recs = ChunkRecords(capacity=4)
    keys = np.array([chunk_key(2, 7), chunk_key(0, 3), chunk_key(2, 1), chunk_key(1, 0)] * 1)
    made = np.array([recs.take() for _ in keys])
    recs.index(keys, made)
    more = np.array([chunk_key(0, 1), chunk_key(3, 0)])
    more_made = np.array([recs.take() for _ in more])  # past the first capacity: grows
    recs.index(more, more_made)
    assert recs.key.size == 8 and len(set(made.tolist() + more_made.tolist())) == 6
    found_recs, found = recs.lookup(np.array([chunk_key(2, 1), chunk_key(2, 2), chunk_key(3, 0)]))
    assert found.tolist() == [True, False, True]
    assert found_recs[[0, 2]].tolist() == [made[2], more_made[1]]
    assert recs.of_source(2).tolist() == [made[2], made[0]]  # by chunk id
    recs.unindex(np.array([chunk_key(2, 1), chunk_key(0, 3)]))
    assert recs.lookup(np.array([chunk_key(2, 1), chunk_key(2, 7)]))[1].tolist() == [False, True]
    assert recs.of_source(0).tolist() == [more_made[0]]
    assert recs.find(chunk_key(2, 7)) == made[0] and recs.find(chunk_key(2, 1)) is None
    assert recs.find(chunk_key(9, 0)) is None  # past every key
    assert ChunkRecords().lookup(np.array([5]))[1].tolist() == [False]
    assert ChunkRecords().find(5) is None


def test_random_steps_keep_requests_holds_and_releases_consistent():
    """Random needs, settles, moves, loads, releases and window rolls against a model of which
    steps need which chunk: every chunk present is needed or held in its source's current
    window, each key's loads and releases alternate, and a step waits exactly while one of its
    chunks is not loaded."""
    rng = np.random.default_rng(7)
    orders = [SourceOrder([40], 4, seed=i, name=f"s{i}", window=2) for i in range(3)]
    t = ChunkTable(orders, job="j", width=4)
    needs: dict[int, set[int]] = {}
    cursors = np.zeros(3, np.int64)
    out: list = []
    last: dict[int, str] = {}

    def some_keys():
        return [chunk_key(int(i), int(c)) for i, c in
                zip(rng.integers(0, 3, 5), rng.integers(0, 10, 5))]

    for op in range(600):
        kind = rng.integers(0, 6)
        live = sorted(needs)
        if kind == 0 or not live:
            step = (live[-1] + 1) if live else 0
            keys = some_keys()
            t.need(step, keys, "n", out)
            needs[step] = set(keys)
        elif kind == 1:
            step = live[rng.integers(len(live))]
            keys = some_keys()
            t.need(step, keys, "n", out)  # more chunks for a step already planned
            needs[step] |= set(keys)
        elif kind == 2:
            step = live[rng.integers(len(live))]
            ready = sorted(k for k in needs[step] | set(some_keys())
                           if last.get(k) == "L" and t.loaded(t.record_of(k)))  # balanced on loaded ones
            final = rng.permutation(ready)[:3].tolist()
            t.settle(step, final, "s", out)
            needs[step] = set(final)
        elif kind == 3:
            moved = [(s, some_keys()) for s in live[-2:]]
            t.move(moved, "m", out)
            needs.update({s: set(k) for s, k in moved})
        elif kind == 4:
            t.release(live[0], "r", out)
            del needs[live[0]]
        else:
            cursors += rng.integers(0, 6, 3)
            t.roll_windows(cursors, "w", out)
        for ins in out:
            key = chunk_key(ins.chunk.source_index, ins.chunk.chunk_id)
            now = "L" if isinstance(ins, LoadChunk) else "R"
            assert last.get(key, "R") != now, (op, ins)  # loads and releases alternate
            last[key] = now
        out.clear()
        if rng.random() < 0.5:  # some requested chunks finish loading
            for ref in t.refs():
                if rng.random() < 0.5 and t.placed(ref, "w") is not None and not t.loaded(t.placed(ref, "w")):
                    rows = np.arange(ref.start, ref.stop)
                    t.fill(t.placed(ref, "w"), rows, rows.astype(np.int32), None)
        present = {chunk_key(r.source_index, r.chunk_id) for r in t.refs()}
        needed = set().union(*needs.values()) if needs else set()
        held = set(t.held())
        assert present == {k for k, v in last.items() if v == "L"}
        assert needed <= present and held == present - needed
        for key in held:  # held only inside its source's current window
            i = key >> SHIFT
            assert (key & MASK) in orders[i].window_span(int(cursors[i]))[2]
        loaded = {k for k in present if t.loaded(t.record_of(k))}
        assert t.in_memory == len(loaded) == t.count_loaded()
        for step, keys in needs.items():
            assert set(t.chunks_of(step)) == keys and len(t.chunks_of(step)) == len(keys)
            assert t.waiting(step) == bool(keys - loaded), (op, step)
