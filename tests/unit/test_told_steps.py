"""A rank's step told consumed twice (a resent tell) counts once in the runtime's counters."""

from __future__ import annotations

from scheduler_plugins.told_steps import ToldSteps


def test_a_repeated_step_is_not_first_and_another_loader_starts_anew():
    told = ToldSteps()
    assert [told.first(0, s, "a") for s in (0, 1, 2)] == [True, True, True]
    assert told.first(0, 1, "a") is False  # resent
    assert told.first(1, 1, "b") is True  # another rank
    assert told.first(0, 4, "a") and told.first(0, 3, "a")  # a step told late, out of order
    assert told.first(0, 1, "c") is True  # a new Loader of rank 0 (another lease token)
    assert told.repeats == 1
    told.clear()  # a rewind: the steps are consumed again
    assert told.first(1, 1, "b") is True


def test_steps_older_than_those_kept_count_as_told():
    told = ToldSteps(keep=3)
    assert all(told.first(0, s, "a") for s in range(7))  # 7 > 2 x 3: cut back to 4, 5, 6
    assert told.first(0, 0, "a") is False and told.first(0, 3, "a") is False  # below the floor
    assert told.first(0, 5, "a") is False and told.first(0, 7, "a") is True
    assert told.repeats == 3


def test_a_long_run_keeps_a_bounded_set_per_rank():
    told = ToldSteps(keep=16)
    assert all(told.first(0, s, "a") for s in range(10_000))
    _, steps, floor = told._by_rank[0]
    assert 16 <= len(steps) <= 32 and min(steps) == floor[0] and max(steps) == 9_999
    assert not told.first(0, floor[0] - 1, "a") and not told.first(0, 9_999, "a")


def test_first_many_is_first_of_each_rank():
    one, many = ToldSteps(keep=4), ToldSteps(keep=4)
    for step, ranks, tokens in [(0, [0, 1, 2], ["a", "b", "c"]), (0, [1, 2], ["b", "z"]),
                                (1, [0, 1], ["a", "b"])]:
        assert many.first_many(step, ranks, tokens) == [one.first(r, step, t) for r, t in zip(ranks, tokens)]
    assert many.repeats == one.repeats == 1
