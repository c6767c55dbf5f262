"""Deterministic per-source order: chunks, epochs, shuffle windows, cursors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from mdata.errors import PlanError
from mdata.order import ChunkRef, SourceOrder, stable_name_hash

COUNTS = [10, 0, 7, 25]  # an empty shard in the middle and a short tail chunk per shard


def make(seed=1, window=2, name="web"):
    return SourceOrder(COUNTS, 4, seed=seed, name=name, window=window)


def test_chunks_never_cross_shards_and_cover_every_row():
    o = make()
    assert o.num_rows == 42 and o.num_chunks == 3 + 0 + 2 + 7
    refs = [o.chunk_ref(c, source_index=2, job="j") for c in range(o.num_chunks)]
    assert [(r.shard, r.start, r.stop) for r in refs[:5]] == [
        (0, 0, 4), (0, 4, 8), (0, 8, 10), (2, 0, 4), (2, 4, 7)]
    assert refs[0].key == ("mdata-load", "j", "web", 0, 0)
    assert sum(r.num_rows for r in refs) == 42
    assert o.chunk_of(3, 13) == 8 and refs[8] == ChunkRef("web", 2, 3, 12, 16, 8, "j")


def test_each_epoch_is_a_permutation_of_all_rows():
    o = make()
    t = o.take(0, 3 * 42)
    all_rows = {(s, r) for s, n in enumerate(COUNTS) for r in range(n)}
    for e in range(3):
        ids = list(zip(t.shards[e * 42:(e + 1) * 42].tolist(), t.rows[e * 42:(e + 1) * 42].tolist()))
        assert len(set(ids)) == 42 and set(ids) == all_rows
    # epochs differ
    assert t.rows[:42].tolist() != t.rows[42:84].tolist()
    # chunk ids agree with shard/row
    assert all(o.chunk_of(s, r) == c for s, r, c in zip(t.shards.tolist(), t.rows.tolist(),
                                                         t.chunk_ids.tolist()))


def test_rows_stay_within_their_shuffle_window():
    o = make(window=2)
    t = o.take(0, 42)
    seen = list(dict.fromkeys(t.chunk_ids.tolist()))
    # chunks come in blocks of `window`: every row of the first two chunks precedes the others,
    # and the rows of those two are interleaved (shuffled together), not one chunk after another
    first_two = set(seen[:2])
    n_first = sum(int(o.chunk_len[c]) for c in first_two)
    assert set(t.chunk_ids[:n_first].tolist()) == first_two
    assert not set(t.chunk_ids[n_first:].tolist()) & first_two
    head = t.chunk_ids[:n_first].tolist()
    assert head != sorted(head, key=lambda c: seen.index(c))


def test_take_is_consistent_for_any_split_and_cursor():
    o = make()
    whole = o.take(5, 100)
    pieces = [o.take(5 + k, 1) for k in range(100)]
    assert whole.rows.tolist() == [int(p.rows[0]) for p in pieces]
    assert whole.shards.tolist() == [int(p.shards[0]) for p in pieces]
    split = [make().take(5, 37), make().take(42, 63)]
    assert np.concatenate([s.rows for s in split]).tolist() == whole.rows.tolist()
    assert o.sample_at(5 + 99) == (int(whole.shards[-1]), int(whole.rows[-1]))


def test_order_depends_on_seed_and_name_only():
    base = make().take(0, 42).rows.tolist()
    assert make().take(0, 42).rows.tolist() == base
    assert make(seed=2).take(0, 42).rows.tolist() != base
    assert make(name="code").take(0, 42).rows.tolist() != base


def test_order_is_the_same_in_another_process():
    code = ("from mdata.order import SourceOrder;"
            "print(SourceOrder([10,0,7,25],4,seed=1,name='web',window=2).take(30,40).rows.tolist())")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123"})
    assert res.stdout.strip() == str(make().take(30, 40).rows.tolist())
    assert stable_name_hash("web") == 365508689  # zlib.crc32, not the salted hash()


def test_chunks_for_lists_chunks_in_first_use_order():
    o = make()
    t = o.take(3, 9)
    expected = list(dict.fromkeys(t.chunk_ids.tolist()))
    assert o.chunks_for(3, 9).tolist() == expected


def test_taken_arrays_are_read_only():
    t = make().take(0, 5)
    with pytest.raises(ValueError):
        t.rows[0] = 7


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(row_counts=[0, 0]), "no rows to read"),
        (dict(chunk_rows=0), "chunk_rows must be >= 1"),
        (dict(window=0), "shuffle window must be >= 1"),
    ],
)
def test_invalid_order_config(kwargs, message):
    args = dict(row_counts=COUNTS, chunk_rows=4, seed=0, name="web", window=4) | kwargs
    with pytest.raises(PlanError, match=message):
        SourceOrder(**args)


def test_invalid_lookups():
    o = make()
    with pytest.raises(PlanError, match="has 12 chunks, not chunk 12"):
        o.chunk_ref(12)
    with pytest.raises(PlanError, match="no row 7 in shard 2"):
        o.chunk_of(2, 7)
    with pytest.raises(PlanError, match="must be >= 0"):
        o.take(-1, 3)
