"""The waiting page's ledger: exposed waits per (rank, step), each blamed on a source.

The rule under test (mdata.observe.data_waits): a source of the step that waits on storage when the wait
is told, else the source whose chunks for that step were loaded last; short waits are
blamed on nobody; unknown inputs say so. Times are arguments, so no clock or sleep is involved.
"""

from __future__ import annotations

import pytest

from mdata.observe.data_waits import UNKNOWN, DataWaitLedger, attribute


def key(source: str, start: int) -> tuple:
    return ("mdata-load", "job", source, 0, start)


def test_attribute_blames_the_source_loaded_last():
    assert attribute({"chat": 10.0, "images": 12.5, "code": 11.0}) == "images"


def test_attribute_prefers_a_source_waiting_on_storage_over_the_last_loaded():
    loads = {"chat": 10.0, "images": 12.5, "code": 11.0}
    assert attribute(loads, storage_waiting={"code"}) == "code"
    # several waiting: the latest loaded of them; a waiting source the step does not read is no cause
    assert attribute(loads, storage_waiting={"code", "chat"}) == "code"
    assert attribute(loads, storage_waiting={"books"}) == "images"


def test_attribute_without_inputs_says_unknown():
    assert attribute({}) == UNKNOWN
    assert attribute({}, storage_waiting={"chat"}) == UNKNOWN


def test_a_late_batch_is_blamed_on_the_last_chunk_of_its_step_over_every_dp_rank():
    ledger = DataWaitLedger(min_wait_s=0.01)
    ledger.loaded(key("chat", 0), "chat", at=1.0)
    ledger.loaded(key("slow", 0), "slow", at=5.0)
    ledger.loaded(key("chat", 16), "chat", at=4.0)
    ledger.loaded(key("chat", 32), "chat", at=6.0)
    ledger.planned(3, [key("chat", 0), key("slow", 0)])  # DP rank 0 reads slow's chunk
    ledger.planned(3, [key("chat", 16)])  # DP rank 1 does not, but the step waited for it too
    ledger.planned(4, [key("chat", 32), key("slow", 0)])  # step 4: chat's new chunk came last
    assert ledger.inputs(3) == {"chat": 4.0, "slow": 5.0}
    a = ledger.waited(0, 3, 0.8, at=7.0)
    b = ledger.waited(2, 3, 0.3, at=7.1)
    c = ledger.waited(0, 4, 0.2, at=7.5)
    assert (a.source, b.source, c.source) == ("slow", "slow", "chat")
    assert (a.rank, a.step, a.wait_s, a.told_at) == (0, 3, 0.8, 7.0)
    assert ledger.by_source() == {"slow": pytest.approx(1.1), "chat": 0.2}
    assert ledger.by_rank() == {0: pytest.approx(1.0), 2: 0.3}
    assert [w.to_dict() for w in ledger.waits()] == [
        {"rank": 0, "step": 3, "wait_s": 0.8, "source": "slow", "told_at": 7.0},
        {"rank": 0, "step": 4, "wait_s": 0.2, "source": "chat", "told_at": 7.5},
        {"rank": 2, "step": 3, "wait_s": 0.3, "source": "slow", "told_at": 7.1}]


def test_short_waits_are_kept_but_blamed_on_no_source():
    ledger = DataWaitLedger(min_wait_s=0.01)
    ledger.loaded(key("chat", 0), "chat", at=1.0)
    ledger.planned(0, [key("chat", 0)])
    record = ledger.waited(0, 0, 0.002, at=2.0)
    assert record.source == "" and record.wait_s == 0.002
    assert ledger.by_source() == {} and ledger.by_rank() == {0: pytest.approx(0.002)}
    assert ledger.waited(1, 0, -0.5, at=2.0).wait_s == 0.0  # a clock step back is no wait


def test_a_reloaded_chunk_counts_at_its_reload_and_a_released_one_is_forgotten():
    ledger = DataWaitLedger()
    ledger.loaded(key("chat", 0), "chat", at=1.0)
    ledger.loaded(key("code", 0), "code", at=2.0)
    ledger.loaded(key("chat", 0), "chat", at=9.0)  # lost with its worker, loaded again
    ledger.planned(1, [key("chat", 0), key("code", 0)])
    assert ledger.waited(0, 1, 1.0, at=10.0).source == "chat"
    ledger.forget(key("chat", 0))
    ledger.planned(2, [key("chat", 0), key("code", 0)])
    assert ledger.inputs(2) == {"code": 2.0}
    assert ledger.waited(0, 5, 1.0, at=11.0).source == UNKNOWN  # step 5 was never planned here


def test_the_ledger_keeps_only_the_newest_steps_and_chunks():
    ledger = DataWaitLedger(keep_steps=3, keep_chunks=2)
    for i in range(4):
        ledger.loaded(key("chat", i), "chat", at=float(i))
    assert ledger.inputs(0) == {}
    ledger.planned(0, [key("chat", 0), key("chat", 3)])  # chunk 0 was let go: chunk 3 only
    assert ledger.inputs(0) == {"chat": 3.0}
    for step in range(5):
        ledger.planned(step, [key("chat", 3)])
        ledger.waited(0, step, 1.0, at=float(step))
    assert [w.step for w in ledger.waits()] == [2, 3, 4]
    # on a wide mesh the number of waits bounds the steps kept too
    wide = DataWaitLedger(keep_steps=100, keep_waits=5)
    for step in range(3):
        for rank in range(4):
            wide.waited(rank, step, 0.5, at=0.0)
    wide.waited(0, 2, 0.25, at=1.0)  # told again: replaced, not counted twice
    assert sorted({w.step for w in wide.waits()}) == [2] and len(wide.waits()) == 4
    assert wide.by_rank()[0] == 0.25
    assert ledger.inputs(1) == {} and ledger.inputs(4) == {"chat": 3.0}


def test_a_steps_blame_is_worked_out_once_and_follows_new_inputs_and_storage_waits():
    ledger = DataWaitLedger(min_wait_s=0.01)
    ledger.loaded(key("chat", 0), "chat", at=1.0)
    ledger.loaded(key("code", 0), "code", at=2.0)
    ledger.planned(3, [key("chat", 0), key("code", 0)])
    assert {ledger.waited(r, 3, 0.5, at=9.0).source for r in range(64)} == {"code"}
    assert len(ledger._blamed) == 1  # one answer for the step, not one per rank
    ledger.loaded(key("images", 0), "images", at=3.0)
    ledger.planned(3, [key("images", 0)])  # another DP rank's batch of the step: new inputs
    assert ledger.waited(64, 3, 0.5, at=9.0).source == "images"
    assert ledger.waited(65, 3, 0.5, at=9.0, storage_waiting={"chat"}).source == "chat"
    assert ledger.waited(66, 3, 0.5, at=9.0).source == "images"  # the outage is over


def test_waits_of_many_ranks_of_one_step_are_each_ranks_wait():
    """A message of every rank of a host is taken at once: the same records and trimming."""
    one, many = DataWaitLedger(keep_waits=5), DataWaitLedger(keep_waits=5)
    for ledger in (one, many):
        ledger.loaded("c1", "web", at=1.0)
        ledger.planned(3, ["c1"])
    for step, ranks, waits in [(3, [0, 1, 2], [0.5, 0.001, 0.0]), (4, [0, 1, 2], [0.2, 0.3, 0.0]),
                               (3, [1], [0.7])]:
        for r, w in zip(ranks, waits):
            one.waited(r, step, w, at=9.0, storage_waiting=())
        many.waited_many(step, ranks, waits, at=9.0, storage_waiting=())
    assert many.waits() == one.waits() and many._count == one._count
    assert many.by_source() == one.by_source() and many.by_rank() == one.by_rank()
