"""The dashboard's meters: exact backlog, windowed rates and per-step trainer waits."""

from __future__ import annotations

import numpy as np
import pytest

from mdata.observe.meters import SourceMeter, TrainerMeter


def test_backlog_counts_requested_minus_finished_loads():
    meter = SourceMeter(["chat", "books"], now=100.0)
    meter.requested("chat", 256)
    meter.requested("chat", 256)
    meter.requested("books", 10)
    meter.loaded("chat", rows=256, samples=250, seconds=0.5, now=101.0)
    meter.failed("books", rows=10)
    chat, books = meter.snapshot(now=101.0)
    assert (chat.source, chat.backlog_chunks, chat.backlog_rows) == ("chat", 1, 256)
    assert (chat.loaded_samples, chat.loaded_chunks, chat.load_seconds) == (250, 1, 0.5)
    assert (books.backlog_chunks, books.backlog_rows, books.failed_chunks) == (0, 0, 1)
    assert books.loaded_samples == 0


def test_backlog_never_goes_negative_on_a_repeated_report():
    meter = SourceMeter(["chat"], now=0.0)
    meter.requested("chat", 4)
    meter.loaded("chat", rows=4, samples=4, seconds=0.1, now=1.0)
    meter.loaded("chat", rows=4, samples=4, seconds=0.1, now=1.0)  # recomputed after a worker loss
    (chat,) = meter.snapshot(now=1.0)
    assert (chat.backlog_chunks, chat.backlog_rows, chat.loaded_samples) == (0, 0, 8)


def test_rate_uses_the_window_and_the_age_of_a_young_meter():
    meter = SourceMeter(["chat"], now=0.0, window_s=10.0)
    meter.requested("chat", 100)
    meter.loaded("chat", rows=100, samples=100, seconds=1.0, now=2.0)
    assert meter.snapshot(now=4.0)[0].samples_per_s == pytest.approx(25.0)  # 100 in 4 s of life
    meter.requested("chat", 50)
    meter.loaded("chat", rows=50, samples=50, seconds=1.0, now=15.0)
    # at t=20 the window is (10, 20]: the load at t=2 has left it, the one at t=15 counts
    assert meter.snapshot(now=20.0)[0].samples_per_s == pytest.approx(5.0)
    assert meter.snapshot(now=26.0)[0].samples_per_s == 0.0
    assert meter.snapshot(now=26.0)[0].loaded_samples == 150


def test_unknown_source_and_bad_window_are_named():
    meter = SourceMeter(["chat"], now=0.0)
    with pytest.raises(KeyError, match="'books' is not metered; sources: \\['chat'\\]"):
        meter.requested("books", 1)
    with pytest.raises(ValueError, match="window_s must be > 0 seconds, got 0"):
        SourceMeter(["chat"], now=0.0, window_s=0)


def test_trainer_waits_per_rank_and_step_and_steps_consumed():
    meter = TrainerMeter()
    meter.waited(1, 0, 0.5)
    meter.waited(1, 0, 0.25)  # a second long-poll for the same step adds up
    meter.waited(1, 1, 0.0)
    meter.waited(0, 0, 0.0)
    meter.consumed(1, 0)
    meter.consumed(1, 1)
    meter.consumed(0, 0)
    r0, r1 = meter.snapshot()
    assert r0.to_dict() == {"rank": 0, "wait_s": 0.0, "steps_consumed": 1, "last_step": 0,
                            "wait_by_step": {"0": 0.0}}
    assert (r1.rank, r1.wait_s, r1.steps_consumed, r1.last_step) == (1, 0.75, 2, 1)
    assert r1.wait_by_step == {0: 0.75, 1: 0.0}


def test_trainer_meter_keeps_only_the_newest_steps_but_the_whole_total():
    meter = TrainerMeter(keep_steps=2)
    for step in range(5):
        meter.waited(0, step, 1.0)
    (r0,) = meter.snapshot()
    assert r0.wait_by_step == {3: 1.0, 4: 1.0}
    assert r0.wait_s == 5.0
    assert r0.steps_consumed == 0 and r0.last_step == -1


def test_trainer_meter_trims_in_bulk_and_still_shows_the_newest_steps():
    """Kept steps are cut back only when they double (O(1) amortised per wait), and a snapshot
    shows the newest keep_steps at every moment in between."""
    meter = TrainerMeter(keep_steps=3)
    for step in range(20):
        meter.waited(0, step, 1.0)
        (r0,) = meter.snapshot()
        assert sorted(r0.wait_by_step) == list(range(max(0, step - 2), step + 1))
        assert len(meter._by_step[0]) <= 6
    assert meter.snapshot()[0].wait_s == 20.0


def test_load_history_gives_back_every_sample_whole_and_keeps_only_changes():
    from mdata.observe.meters import LoadHistory

    history = LoadHistory(4, keep=3)
    samples = [(10.0, [0, 0, 0, 0], [1, 0, 0, 0]), (11.0, [5, 0, 0, 0], [0, 0, 0, 0]),
               (12.0, [5, 0, 0, 0], [0, 0, 0, 0]), (13.0, [5, 7, 0, 0], [0, 1, 0, 0]),
               (14.0, [9, 7, 0, 3], [0, 0, 0, 2])]
    for n, (t, loaded, backlog) in enumerate(samples, 1):
        history.add(t, np.array(loaded), np.array(backlog))
        assert len(history) == min(n, 3)
        got = [(t, a.tolist(), b.tolist()) for t, a, b in history]
        assert got == [(t, list(l), list(b)) for t, l, b in samples[max(0, n - 3):n]]
    # a sample stores only the sources that changed since the one before
    assert [c[1].tolist() for c in history._changes] == [[1], [0, 1, 3]]
    assert [c[1].tolist() for c in LoadHistory(4)._changes] == []


def test_source_meter_totals_are_its_figures():
    meter = SourceMeter(["a", "b"], now=0.0)
    meter.requested("a", rows=10)
    meter.requested("b", rows=10)
    meter.loaded("b", rows=10, samples=8, seconds=0.1, now=1.0)
    loaded, backlog = meter.totals()
    figs = meter.snapshot(1.0)
    assert loaded.tolist() == [f.loaded_samples for f in figs] == [0, 8]
    assert backlog.tolist() == [f.backlog_chunks for f in figs] == [1, 0]


def test_trainer_meter_many_ranks_at_once_are_each_rank():
    one, many = TrainerMeter(keep_steps=2), TrainerMeter(keep_steps=2)
    for step in range(7):
        ranks, secs = [0, 1, 3], [0.5, 0.0, float(step)]
        for r, s in zip(ranks, secs):
            one.waited(r, step, s)
            one.consumed(r, step)
        many.waited_many(step, ranks, secs)
        many.consumed_many(step, ranks)
    assert [f.to_dict() for f in many.snapshot()] == [f.to_dict() for f in one.snapshot()]
