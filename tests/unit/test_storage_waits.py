"""Which sources wait on storage, over a pool: the pure merge, the sentence, the worker handler and
the Planner's poll of real Dask workers (in-process scheduler and workers, real TCP)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest

from mdata.sources import (StorageWait, describe_storage_wait, merge_storage_waits, storage_waits,
                           storage_waits_begun)
from mdata.sources.waits import wait_began, wait_ended, wait_failed_again
from mdata.wire import messages as m
from scheduler_plugins.recoveries import RecoveryTally

REFUSED = "EndpointConnectionError: Could not connect to the endpoint URL: \"http://127.0.0.1:9/b/a\""
RESET = "ConnectionClosedError: Connection was closed before we received a valid response"


def wait(source: str, since: float, attempts: int, error: str, targets=("s3://b/a",),
         last_failed: float | None = None) -> StorageWait:
    return StorageWait(source, since, attempts, error, tuple(targets),
                       since + attempts if last_failed is None else last_failed)


def test_merge_takes_the_earliest_since_sums_attempts_and_keeps_the_newest_error():
    by_worker = {
        "tcp://w2:1": {"web": wait("web", 100.0, 4, RESET, ("s3://b/web/b",), last_failed=130.0),
                       "code": wait("code", 120.0, 1, REFUSED)},
        "tcp://w1:1": [wait("web", 90.0, 6, REFUSED, ("s3://b/web/a",), last_failed=125.0)],
        "tcp://w3:1": {},
    }
    merged = merge_storage_waits(by_worker)
    assert list(merged) == ["code", "web"]
    web = merged["web"]
    assert web.since == 90.0  # the outage began with the first worker that noticed it
    assert web.attempts == 10
    assert web.last_error == RESET and web.last_failed == 130.0  # w2 failed last
    assert web.workers == ("tcp://w1:1", "tcp://w2:1")
    assert web.targets == ("s3://b/web/a", "s3://b/web/b")
    assert merged["code"].workers == ("tcp://w2:1",) and merged["code"].attempts == 1
    assert web.waited_s(now=100.0) == 10.0 and web.waited_s(now=50.0) == 0.0
    assert web.to_dict(now=95.0) == {
        "source": "web", "since": 90.0, "waited_s": 5.0, "attempts": 10, "last_error": RESET,
        "workers": ["tcp://w1:1", "tcp://w2:1"], "targets": ["s3://b/web/a", "s3://b/web/b"],
        "last_failed": 130.0,
    }


def test_merge_of_nothing_is_empty_and_ties_never_depend_on_order():
    assert merge_storage_waits({}) == {} and merge_storage_waits({"tcp://w:1": []}) == {}
    a = wait("web", 10.0, 1, "A", last_failed=20.0)
    b = wait("web", 10.0, 1, "B", last_failed=20.0)
    one = merge_storage_waits({"tcp://a:1": [a], "tcp://b:1": [b]})
    other = merge_storage_waits({"tcp://b:1": [b], "tcp://a:1": [a]})
    assert one == other and one["web"].last_error == "B"  # the larger address wins a tie


def test_the_sentence_says_since_when_how_often_and_why():
    since = 1_700_000_000.0  # 22:13:20 UTC
    assert describe_storage_wait(since, 12, REFUSED, local_time=False) == (
        f"waiting on storage since 22:13:20 (12 attempts, last error {REFUSED})")
    assert "(1 attempt, last error" in describe_storage_wait(since, 1, "x")
    long = describe_storage_wait(since, 2, "E: " + "x" * 500)
    assert long.endswith("...)") and len(long) < 300
    local = time.strftime("%H:%M:%S", time.localtime(since))
    assert describe_storage_wait(since, 2, "x").startswith(f"waiting on storage since {local} ")


def test_the_worker_reply_carries_the_registry_and_survives_the_wire():
    token = wait_began("web", "s3://b/web/a.parquet", REFUSED, since=time.time() - 3)
    try:
        wait_failed_again(token, RESET)
        waits = storage_waits()
        reply = m.StorageWaitsReply.of(waits, storage_waits_begun())
        again = m.StorageWaitsReply.from_msg(reply.to_msg())
        assert again == reply
        (got,) = [w.wait() for w in again.waits]
        assert got == waits["web"] and got.attempts == 2 and got.last_error == RESET
        assert got.last_failed >= got.since
        assert again.begun_by_source()["web"] >= 1
    finally:
        wait_ended(token)
    assert m.StorageWaitsReply.of(storage_waits()).to_msg() == {"waits": [], "begun": {}}


def test_waits_begun_count_periods_per_source_not_concurrent_shards():
    """Two shards of one source waiting at once are one period; a new wait after both ended is a
    second one. The count never goes down, so a poller can tell how many began between polls."""
    before = storage_waits_begun().get("books", 0)
    a = wait_began("books", "file:///b/0.parquet", REFUSED)
    b = wait_began("books", "file:///b/1.parquet", REFUSED)
    wait_ended(a)
    c = wait_began("books", "file:///b/2.parquet", REFUSED)  # b still waits: the same period
    wait_ended(b)
    wait_ended(c)
    assert storage_waits_begun()["books"] == before + 1 and "books" not in storage_waits()
    wait_ended(wait_began("books", "file:///b/0.parquet", REFUSED))
    assert storage_waits_begun()["books"] == before + 2


@dataclass
class Job:
    """What the poller reads and writes of a job runtime: its sources and its storage waits."""

    sources: dict
    storage_waits: dict = field(default_factory=dict)
    recoveries: RecoveryTally = field(default_factory=RecoveryTally)


def test_the_planner_poll_asks_the_loader_workers_and_gives_each_job_its_sources():
    """A real scheduler and three workers over TCP: a loader of ``web`` with mdata's plugin, a
    loader of ``code`` without it (it cannot answer: ignored) and a constructor (not asked)."""
    from distributed import Scheduler, Worker

    from scheduler_plugins.storage_poll import StoragePoller, loader_workers
    from workers.plugin import MdataWorkerPlugin

    async def main():
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address=":0") as s, \
                Worker(s.address, resources={"pool_web": 1}, nthreads=1) as web, \
                Worker(s.address, resources={"pool_code": 1}, nthreads=1) as code, \
                Worker(s.address, resources={"mdata_constructor": 1}, nthreads=1):
            MdataWorkerPlugin().setup(web)
            assert loader_workers(s, ["web", "code"]) == sorted([web.address, code.address])
            assert loader_workers(s, ["web"]) == [web.address]
            jobs = {"a": Job({"web": None, "code": None}), "b": Job({"code": None})}
            poller = StoragePoller(s, interval=0.2, timeout=2.0)

            assert await poller.poll(jobs) == {}
            # the registry is this process's (the worker runs in it): earlier tests' waits of
            # ``web`` count on the first poll, so the counts below are taken from here on
            base = jobs["a"].recoveries.storage_outages
            token = wait_began("web", "s3://b/web/a.parquet", REFUSED, since=time.time() - 5)
            try:
                merged = await poller.poll(jobs)
                assert list(merged) == ["web"]
                assert merged["web"].workers == (web.address,)  # the one that answered
                assert list(jobs["a"].storage_waits) == ["web"] and jobs["b"].storage_waits == {}
                assert jobs["a"].storage_waits["web"].waited_s() >= 5
                await poller.poll(jobs)  # the same wait, heard again: still one outage
                assert [j.recoveries.storage_outages for j in jobs.values()] == [base + 1, 0]

                # from the tick: at most one poll at a time, and not before the interval
                poller.tick(jobs, now=1000.0)
                first = poller._task
                poller.tick(jobs, now=1000.5)
                assert poller._task is first
                await first
            finally:
                wait_ended(token)
            poller.tick(jobs, now=1000.1)
            assert poller._task is first  # too early
            poller.tick(jobs, now=1001.0)
            await poller._task
            assert jobs["a"].storage_waits == {} and poller.merged == {}
            assert jobs["a"].recoveries.counts()["storage_outages"] == base + 1  # ridden through

            # a wait that begins and ends between two polls is never seen ongoing, yet counted
            wait_ended(wait_began("web", "s3://b/web/b.parquet", REFUSED))
            assert await poller.poll(jobs) == {}
            assert [j.recoveries.storage_outages for j in jobs.values()] == [base + 2, 0]
            poller.close()

    asyncio.run(main())


def test_a_status_reply_shows_the_waits_under_storage_waits():
    info = m.StorageWaitInfo(since=100.0, waited_s=5.0, attempts=3, last_error=REFUSED,
                             workers=("tcp://w:1",), targets=("s3://b/a",))
    status = m.StatusReply(
        job="j", failure=None, uptime_s=1.0, steps={}, pool_targets={}, chunks_in_memory=0,
        batches_in_memory=0, trainer_wait_s={}, consumed_steps={},
        counters=m.StatusCounters(0, 0, 0, 0, 0, {}), storage_waits={"web": info})
    msg = status.to_msg()
    assert msg["storage_waits"] == {"web": {"since": 100.0, "waited_s": 5.0, "attempts": 3,
                                            "last_error": REFUSED, "workers": ["tcp://w:1"],
                                            "targets": ["s3://b/a"]}}
    assert m.StatusReply.from_msg(msg) == status
    with pytest.raises(m.MessageError, match="StorageWaitInfo.*'attempts' must be an integer"):
        m.StatusReply.from_msg({**msg, "storage_waits": {"web": {**msg["storage_waits"]["web"],
                                                                 "attempts": "3"}}})
