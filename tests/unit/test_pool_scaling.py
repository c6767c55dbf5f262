"""Pool sizing, pure: the Planner's per-source demand (PoolSizer) and per-pool targets."""

import numpy as np
import pytest

from mdata.pools.demand import PoolSizer
from mdata.pools.scaling import PoolDecision, merge_jobs, pool_targets


def source(name: str, demand: float, workers: int = 1) -> PoolDecision:
    return PoolDecision(group=name, workers=workers, reason=f"{name} needs {demand} threads",
                        demand=demand, sources=(name,))


def test_a_pool_needs_the_sum_of_its_sources_within_bounds():
    targets = {"chat": source("chat", 0.4), "code": source("code", 1.6),
               "captions": source("captions", 4.9, 5)}
    pools = {"text": ("chat", "code"), "captions": ("captions",), "docs": ("docs",)}
    got = pool_targets(pools, targets, max_workers={"captions": 4}, current={"text": 1})
    assert got["text"] == PoolDecision(
        group="text", workers=2, demand=2.0, current=1, threads=1, kind="up", sources=("chat", "code"),
        reason="2 busy threads / 1 per worker = 2 worker(s) of demand (chat needs 0.4 threads; "
               "code needs 1.6 threads)")
    assert got["captions"].workers == 4 and got["captions"].reason.endswith("; capped at 4")
    assert got["captions"].kind == "start"  # no current size given
    assert "docs" not in got  # not sized yet: left alone


def test_the_minimum_holds_when_demand_is_zero():
    got = pool_targets({"text": ("chat",)}, {"chat": source("chat", 0.0, 0)}, min_workers=1,
                       current={"text": 1})
    assert got["text"].workers == 1 and got["text"].reason.endswith("; at least 1")
    assert got["text"].kind == "hold" and not got["text"].changed


def test_fractional_demands_are_added_before_rounding_up_and_threads_count():
    targets = {name: source(name, 0.3) for name in ("chat", "scenes", "code")}
    pools = {"text": ("chat", "scenes", "code")}
    assert pool_targets(pools, targets)["text"].workers == 1  # 0.9 threads, not 3 workers
    targets["code"] = source("code", 0.5)
    assert pool_targets(pools, targets)["text"].workers == 2
    # the same 1.1 busy threads fit on one worker of two threads
    assert pool_targets(pools, targets, threads={"text": 2})["text"].workers == 1


def test_jobs_reading_one_source_add_their_demands():
    merged = merge_jobs([{"chat": source("chat", 0.6)}, {"chat": source("chat", 0.7), "code": source("code", 1.0)}])
    assert merged["chat"].demand == pytest.approx(1.3) and merged["code"].demand == 1.0
    assert pool_targets({"text": ("chat",)}, merged)["text"].workers == 2
    # the status reply's dicts read the same
    assert merge_jobs([{"chat": merged["chat"].to_msg()}])["chat"] == merged["chat"]


def feed(sizer: PoolSizer, *, seconds: float, steps_per_s: float, tick: float = 0.05,
         waited_per_s: float = 0.0, start: float = 0.0, steps0: int = 0) -> tuple[float, int]:
    """Ticks every ``tick`` s for ``seconds``; trainers consume whole steps at ``steps_per_s``."""
    now, steps = start, steps0
    for k in range(int(round(seconds / tick)) + 1):
        now = start + k * tick
        steps = steps0 + int(now * steps_per_s) - int(start * steps_per_s)
        sizer.observe_progress(now, steps, waited_per_s * now)
    return now, steps


def test_steps_consumed_between_two_ticks_count():
    """A short job whose trainers consumed all of their steps between two ticks still has a
    rate (counted from the last tick before they started), so its pools get targets."""
    sizer = PoolSizer(("a",), rate_window_s=10.0, interval_s=0.0)
    sizer.observe_load(0, 10, 0.1)
    for k in range(20):
        sizer.observe_progress(k * 0.05, 0)
    for k in range(20, 60):
        sizer.observe_progress(k * 0.05, 3)
    rate = sizer.step_rate
    assert rate is not None and rate == pytest.approx(3 / (59 * 0.05 - 19 * 0.05))
    assert [d.kind for d in sizer.decide(3.0, np.array([1.0]), 4)] == ["start"]


def test_the_step_rate_counts_idle_ticks():
    """The bug behind '57.3 steps/s while trainers ran at 3.8': a 50 ms tick that saw one step
    read as 20 steps/s. The window's rate is consumed steps over elapsed time."""
    sizer = PoolSizer(("a",), rate_window_s=10.0)
    feed(sizer, seconds=20.0, steps_per_s=3.8)
    assert sizer.step_rate == pytest.approx(3.8, rel=0.05)


def test_start_up_before_the_first_step_is_not_the_trainers_pace():
    sizer = PoolSizer(("a",), rate_window_s=10.0)
    for k in range(60):  # 3 s of cold loads: nothing consumed
        sizer.observe_progress(k * 0.05, 0, k * 0.05)
    assert sizer.step_rate is None
    feed(sizer, seconds=4.0, steps_per_s=5.0, start=3.0)
    assert sizer.step_rate == pytest.approx(5.0, rel=0.1)


def test_demand_uses_the_measured_cost_threads_and_the_stall():
    sizer = PoolSizer(("img", "txt"), headroom=1.0, interval_s=0.0)
    sizer.observe_load(0, 10, 0.6)  # 60 ms per image
    sizer.observe_load(1, 100, 0.1)  # 1 ms per text row
    sizer.observe_threads(0, 2)
    now, _ = feed(sizer, seconds=10.0, steps_per_s=4.0)
    img, txt = sizer.decide(now, np.array([0.5, 0.5]), 16, wall=7.0)
    # 50% x 16 samples x 4 steps/s x 60 ms = 1.92 busy threads / 2 per worker -> 1 worker
    assert (img.group, img.workers, img.kind, img.threads, img.time) == ("img", 1, "start", 2, 7.0)
    assert img.demand == pytest.approx(1.92, rel=0.05)
    assert "thread(s) per worker -> start with 1 workers" in img.reason
    assert txt.workers == 1 and txt.demand == pytest.approx(0.032, rel=0.05)

    # trainers now wait half the time at 2 steps/s: they would run 4 steps/s with enough data
    starved = PoolSizer(("img",), headroom=1.0, interval_s=0.0)
    starved.observe_load(0, 10, 0.6)
    # 20 s: the 10 s window has slid past start-up, so the rate is whole steps over whole seconds
    now, _ = feed(starved, seconds=20.0, steps_per_s=2.0, waited_per_s=0.5)
    (d,) = starved.decide(now, np.array([1.0]), 16)
    assert d.demand == pytest.approx(16 * 4.0 * 0.06, rel=0.05) and d.workers == 4
    assert "trainers stalled 50% of it" in d.reason


def test_scale_up_at_once_down_after_agreeing_decisions_to_the_largest_want():
    sizer = PoolSizer(("a",), headroom=1.0, interval_s=2.0, down_after=2, down_margin=1.0)
    sizer.observe_load(0, 100, 1.0)  # 10 ms per sample
    now, steps = feed(sizer, seconds=10.0, steps_per_s=100.0)
    (first,) = sizer.decide(now, np.array([1.0]), 4)  # 4 x 100 x 10 ms = 4 threads
    assert (first.workers, first.kind) == (4, "start")
    assert sizer.decide(now + 0.5, np.array([1.0]), 4) == []  # within the interval: no decision
    (hold,) = sizer.decide(now + 2.0, np.array([0.5]), 4)
    assert (hold.workers, hold.kind) == (4, "hold") and "1 of 2 decisions agree" in hold.reason
    (down,) = sizer.decide(now + 4.0, np.array([0.75]), 4)
    assert (down.workers, down.kind, down.current) == (3, "down", 4)  # max of the wants 2 and 3
    (up,) = sizer.decide(now + 6.0, np.array([1.0]), 4)
    assert (up.workers, up.kind) == (4, "up") and "scale up from 3 to 4" in up.reason


def test_pools_grow_for_the_mixture_ahead_and_shrink_only_after_it_arrived():
    sizer = PoolSizer(("img", "txt"), headroom=1.0, interval_s=0.0, down_after=2, down_margin=1.0)
    sizer.observe_load(0, 10, 0.5)  # 50 ms
    sizer.observe_load(1, 10, 0.05)  # 5 ms
    now, _ = feed(sizer, seconds=10.0, steps_per_s=10.0)
    before, after = np.array([0.1, 0.9]), np.array([0.9, 0.1])
    img, txt = sizer.decide(now, before, 20)
    assert (img.workers, txt.workers) == (1, 1)
    img, txt = sizer.decide(now + 1, before, 20, ahead=after)  # the shift is coming
    assert img.workers == 9 and img.kind == "up" and "(weight 90.0% ahead)" in img.reason
    assert txt.kind == "hold"
    for t in (2, 3):  # the shift arrived; text holds one more decision, then shrinks
        img, txt = sizer.decide(now + t, after, 20, ahead=after)
    assert img.workers == 9 and txt.workers == 1


def test_no_decision_while_nothing_is_consumed():
    sizer = PoolSizer(("a",), interval_s=0.0, rate_window_s=2.0)
    sizer.observe_load(0, 10, 0.1)
    now, steps = feed(sizer, seconds=3.0, steps_per_s=5.0)
    assert len(sizer.decide(now, np.array([1.0]), 4)) == 1
    for k in range(1, 60):  # 3 s stalled: no step, trainers waiting all along
        sizer.observe_progress(now + k * 0.05, steps, 0.0 + k * 0.05)
    assert sizer.decide(now + 3.0, np.array([1.0]), 4) == []


def test_decisions_cross_the_wire_unchanged():
    sizer = PoolSizer(("a",), interval_s=0.0)
    sizer.observe_load(0, 10, 0.1)
    now, _ = feed(sizer, seconds=3.0, steps_per_s=5.0)
    (d,) = sizer.decide(now, np.array([1.0]), 4)
    assert PoolDecision.from_msg(d.to_msg()) == d and d["workers"] == d.workers


def test_pools_shrink_only_with_slack_and_while_data_is_ahead():
    sizer = PoolSizer(("a",), headroom=1.0, interval_s=0.0, down_after=1, down_margin=0.8)
    sizer.observe_load(0, 100, 1.0)  # 10 ms per sample
    now, _ = feed(sizer, seconds=10.0, steps_per_s=100.0)
    assert sizer.decide(now, np.array([1.0]), 4)[0].workers == 4  # 4 busy threads
    (d,) = sizer.decide(now + 1, np.array([0.45]), 4)  # 1.8 threads would fill 2 workers to 90%
    assert (d.kind, d.workers) == ("hold", 4) and "no scale-down" in d.reason
    (d,) = sizer.decide(now + 2, np.array([0.45]), 4, lead=1, window=8)  # starving: never shrink
    assert d.kind == "hold" and "data is not ahead of the trainers" in d.reason
    (d,) = sizer.decide(now + 3, np.array([0.35]), 4, lead=8, window=8)  # 1.4 of 2: 70%
    assert (d.kind, d.workers, d.current) == ("down", 2, 4)


def test_a_first_slow_load_does_not_size_the_pool():
    sizer = PoolSizer(("a",), headroom=1.0, interval_s=0.0)
    sizer.observe_load(0, 10, 5.0)  # 500 ms/sample: the worker opened its reader and tokenizer
    for _ in range(4):
        sizer.observe_load(0, 10, 0.1)
    assert sizer.sec_per_sample[0] == pytest.approx(0.01)


def test_every_sources_threads_at_once_are_each_sources_threads():
    """A tick passes every source's threads; 0 (no worker seen) keeps what was known."""
    one, each = PoolSizer(("a", "b", "c")), PoolSizer(("a", "b", "c"))
    for threads in [(2, 0, 3), (0, 4, 1)]:
        one.observe_all_threads(threads)
        for i, t in enumerate(threads):
            each.observe_threads(i, t)
        assert one.threads.tolist() == each.threads.tolist()
    assert one.threads.tolist() == [2, 4, 1]
    one.observe_all_threads(())  # no pools known yet
    assert one.threads.tolist() == [2, 4, 1]
