"""A waiter's timeout that does not run out while storage is waited out (mdata.sources.outage_deadline).

A trainer's timeout (120 s) is shorter than the loaders' storage retry deadline (300 s); these pin
down the arithmetic that lets a trainer or a constructor ride out an outage the loaders still may
save, and give up on time otherwise. Pure: the clock is passed in.
"""

from __future__ import annotations

import pytest

from mdata.sources.outage_deadline import OutageDeadline


def test_without_an_outage_the_timeout_runs_from_the_start():
    wait = OutageDeadline(10.0, 100.0, check_every=2.0)
    assert not wait.check_due(101.9) and wait.check_due(102.0)
    wait.observe(102.0, waiting_on_storage=False)
    assert not wait.check_due(103.9) and wait.check_due(104.0)
    assert not wait.expired(110.0) and wait.expired(110.01)
    assert wait.remaining(105.0) == 5.0 and wait.remaining(111.0) == 0.0
    assert wait.outage_seen is None


def test_an_outage_restarts_the_timeout_from_its_last_sign():
    wait = OutageDeadline(10.0, 100.0, check_every=2.0)
    for now in range(102, 150, 2):  # an outage of ~50 s, five times the timeout
        assert not wait.expired(float(now))
        wait.observe(float(now), waiting_on_storage=True)
    assert wait.outage_seen == 148.0
    wait.observe(150.0, waiting_on_storage=False)  # storage answers again (or the loads failed)
    assert not wait.expired(158.0) and wait.expired(158.01)  # the full timeout after the last sign
    assert wait.waited(158.0) == 58.0


def test_an_early_outage_never_shortens_the_timeout():
    wait = OutageDeadline(10.0, 100.0, check_every=2.0)
    wait.observe(100.5, waiting_on_storage=True)
    assert wait.expires == 110.5
    wait = OutageDeadline(10.0, 100.0, check_every=20.0)
    assert wait.check_every == 5.0  # checks at least twice per timeout: an outage is noticed in time


@pytest.mark.parametrize("timeout, every", [(-1.0, 1.0), (1.0, 0.0)])
def test_nonsense_is_refused(timeout, every):
    with pytest.raises(ValueError, match="OutageDeadline"):
        OutageDeadline(timeout, 0.0, check_every=every)
