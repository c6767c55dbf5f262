"""StepCheckpoints: a hub's step checkpoints, handed to its ranks fed by broadcast."""

from __future__ import annotations

import threading
import time

from mdata.trainer.fed_steps import StepCheckpoints


def always() -> bool:
    return True


def test_a_filed_step_is_handed_to_every_fed_rank_of_its_generation():
    steps = StepCheckpoints()
    steps.file(0, [(3, {"step": 4})])
    assert steps.take(3, 0, 0.0, always) == {"step": 4}
    assert steps.take(3, 0, 0.0, always) == {"step": 4}  # kept for the hub's other fed ranks
    assert steps.take(3, 1, 0.0, always) is None  # another generation's step 3 is not it
    assert steps.served == 2


def test_a_fed_rank_waits_for_its_step_and_wakes_when_it_is_filed():
    steps = StepCheckpoints()
    got = []
    waiter = threading.Thread(target=lambda: got.append(steps.take(5, 2, 10.0, always)))
    waiter.start()
    time.sleep(0.05)
    steps.file(2, [(5, {"step": 6}), (6, {"step": 7})])
    waiter.join(5)
    assert got == [{"step": 6}]


def test_no_receiving_rank_a_reset_or_stop_end_the_wait_at_once():
    steps = StepCheckpoints()
    began = time.monotonic()
    assert steps.take(0, 0, 10.0, lambda: False) is None  # nobody will bring it: ask
    stop = threading.Event()
    stop.set()
    assert steps.take(0, 0, 10.0, always, stop) is None
    assert time.monotonic() - began < 1.0
    got = []
    waiter = threading.Thread(target=lambda: got.append(steps.take(0, 0, 10.0, always)))
    waiter.start()
    time.sleep(0.05)
    steps.reset()  # the job failed or rewound: the waiting rank asks for itself
    waiter.join(5)
    assert got == [None]
    # until something is filed again, a fed rank asks at once instead of waiting
    assert steps.take(1, 0, 10.0, always) is None and time.monotonic() - began < 2.0
    steps.file(0, [(1, {"step": 2})])
    assert steps.take(1, 0, 0.0, always) == {"step": 2}


def test_only_the_newest_steps_are_kept():
    steps = StepCheckpoints(keep=4)
    steps.file(0, [(s, {"step": s + 1}) for s in range(10)])
    assert steps.take(5, 0, 0.0, always) is None  # far behind: it asks
    assert [steps.take(s, 0, 0.0, always)["step"] for s in range(6, 10)] == [7, 8, 9, 10]
