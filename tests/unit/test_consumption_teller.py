"""The Loader's consumption teller: the loop never waits, nothing is lost, errors reach the loop."""

from __future__ import annotations

import threading

import pytest

from mdata.trainer.consumption import ConsumptionTeller


class Recorder:
    def __init__(self, fail_first: int = 0) -> None:
        self.sent: list[tuple[int, ...]] = []
        self.fail_first = fail_first
        self.release = threading.Event()
        self.release.set()

    def __call__(self, steps: tuple[int, ...]) -> None:
        assert self.release.wait(10)
        if self.fail_first:
            self.fail_first -= 1
            raise ConnectionError("scheduler gone")
        self.sent.append(steps)


def test_noting_does_not_wait_for_the_send_and_every_step_arrives_in_order():
    rec = Recorder()
    rec.release.clear()  # the scheduler is slow: sends block
    teller = ConsumptionTeller(rec, grace_s=0.0)
    try:
        for step in range(5):
            teller.note(step)  # returns although no send has finished
        assert rec.sent == []
        rec.release.set()
        assert teller.flush(timeout=10)
        assert [s for steps in rec.sent for s in steps] == [0, 1, 2, 3, 4]
        assert teller.told == {"carried": 0, "alone": 5}
    finally:
        teller.close()


def test_a_location_request_carries_the_noted_steps_instead_of_a_message_of_their_own():
    rec = Recorder()
    teller = ConsumptionTeller(rec, grace_s=60.0)  # the teller's thread would wait a minute
    try:
        teller.note(7)
        teller.note(8)
        carried = teller.take()
        assert carried == (7, 8) and teller.take() == ()
        teller.sent(carried, ok=True)
        assert teller.flush(timeout=10)
        assert rec.sent == []  # no message of their own
        assert teller.told == {"carried": 2, "alone": 0}
    finally:
        teller.close()


def test_steps_of_a_failed_carrier_are_sent_again_before_newer_ones():
    rec = Recorder()
    teller = ConsumptionTeller(rec, grace_s=0.0)
    try:
        teller.note(1)
        carried = teller.take()
        teller.note(2)
        teller.sent(carried, ok=False)  # the location request failed: 1 is noted again, first
        assert teller.flush(timeout=10)
        assert [s for steps in rec.sent for s in steps] == [1, 2]
    finally:
        teller.close()


def test_a_failed_send_reaches_the_training_loop_and_keeps_the_steps():
    rec = Recorder(fail_first=1)
    teller = ConsumptionTeller(rec, grace_s=0.0)
    try:
        teller.note(3)
        assert teller.flush(timeout=10)  # returns on the failure
        with pytest.raises(ConnectionError, match="scheduler gone"):
            teller.note(4)
        teller.note(4)  # heard once; the teller tries again with both steps
        assert teller.flush(timeout=10)
        assert [s for steps in rec.sent for s in steps] == [3, 4]
    finally:
        teller.close()
