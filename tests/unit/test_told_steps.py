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
    assert all(told.first(0, s, "a") for s in range(5))  # keeps 2, 3, 4
    assert told.first(0, 0, "a") is False and told.first(0, 1, "a") is False
    assert told.first(0, 3, "a") is False and told.first(0, 5, "a") is True
    assert told.repeats == 3
