"""Appended shards: an order whose listing grew keeps what it already decided and reads the new
shards after the known ones, from the epoch of the growth on."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from mdata.errors import PlanError
from mdata.order import SourceOrder

KNOWN = [10, 0, 7]
GROWN = KNOWN + [5, 8]


def ids(taken) -> list[tuple[int, int]]:
    return list(zip(taken.shards.tolist(), taken.rows.tolist()))


@pytest.mark.parametrize("epoch", [0, 2])
def test_the_epoch_of_the_growth_reads_the_known_chunks_first_then_the_new_ones(epoch):
    old = SourceOrder(KNOWN, 4, seed=5, name="web", window=2)
    new = SourceOrder(GROWN, 4, seed=5, name="web", window=2, appended=[(epoch, 3)])
    start = epoch * 17
    assert new.epoch_start(epoch) == start and new.epoch_rows(epoch) == 30
    assert ids(new.take(0, start + 17)) == ids(old.take(0, start + 17))  # nothing decided changes
    appended = ids(new.take(start + 17, 13))
    assert Counter(appended) == Counter((s, r) for s, n in ((3, 5), (4, 8)) for r in range(n))
    following = ids(new.take(start + 30, 30))  # the next epoch permutes every chunk
    assert new.epoch_of(start + 30) == epoch + 1
    assert Counter(following) == Counter((s, r) for s, n in enumerate(GROWN) for r in range(n))
    assert ids(new.take(start + 30, 30)) == ids(SourceOrder(GROWN, 4, 5, "web", 2).take(
        (epoch + 1) * 30, 30))
    lo, hi, chunks = new.window_span(start + 17)
    assert lo == start + 17 and all(new.chunk_shard[c] >= 3 for c in chunks)


def test_take_agrees_with_itself_across_the_growth_for_any_split():
    new = SourceOrder(GROWN, 3, seed=1, name="code", window=3, appended=[(1, 2), (1, 3), (3, 4)])
    whole = ids(new.take(0, 200))
    for cut in (1, 16, 17, 30, 47, 60, 101):
        assert ids(new.take(0, cut)) + ids(new.take(cut, 200 - cut)) == whole
    # epoch 1 grew twice (shards 0-1, then 2, then 3: 22 rows), epoch 3 once more (30 rows)
    assert [new.epoch_rows(e) for e in range(5)] == [10, 22, 22, 30, 30]
    assert new.epoch_of(10) == 1 and new.epoch_of(32) == 2 and new.epoch_start(3) == 54


def test_bad_growths_are_refused():
    with pytest.raises(PlanError, match="non-decreasing epochs and growing shard counts"):
        SourceOrder(GROWN, 4, seed=5, name="web", appended=[(2, 3), (1, 4)])
    with pytest.raises(PlanError, match="non-decreasing epochs and growing shard counts"):
        SourceOrder(GROWN, 4, seed=5, name="web", appended=[(0, 5)])
    with pytest.raises(PlanError, match="known before the first growth have no rows"):
        SourceOrder([0, 4], 4, seed=5, name="web", appended=[(0, 1)])
