"""Every request has a reply deadline: how long it is, and what the sender gets past it."""

from __future__ import annotations

import asyncio

import dask
import pytest

import mdata.config  # noqa: F401  (defaults loaded before any dask.config.set below)
from mdata.errors import RequestTimeoutError, TrainerTimeoutError
from mdata.wire.messages import BatchLocationRequest, JobsRequest, RegisterJobRequest, reply_timeout, within


def test_a_plain_request_waits_requests_timeout_and_a_long_poll_adds_its_own():
    assert reply_timeout(JobsRequest()) == 60.0
    assert reply_timeout(BatchLocationRequest(job="j", rank=0, step=3, timeout=5.0)) == 65.0
    with dask.config.set({"mdata.requests.timeout": "2s"}):
        assert reply_timeout(JobsRequest()) == 2.0
        assert reply_timeout(BatchLocationRequest(job="j", rank=0, step=3, timeout=0.5)) == 2.5


def test_a_registration_waits_for_the_pools_and_the_listing_too():
    request = RegisterJobRequest(job="j", plan={})
    assert reply_timeout(request) == 60.0 + 10.0 + 360.0
    with dask.config.set({"mdata.planner.listing-timeout": "20s", "mdata.planner.pool-wait": 1}):
        assert reply_timeout(request) == 60.0 + 1.0 + 20.0


def test_no_answer_within_the_deadline_is_a_request_timeout_naming_handler_and_address():
    async def never() -> None:
        await asyncio.Event().wait()  # a peer that never answers

    async def answered() -> str:
        return "ok"

    with pytest.raises(RequestTimeoutError) as info:
        asyncio.run(within(never(), JobsRequest(), "tcp://10.0.0.1:8786", 0.05))
    assert str(info.value).startswith("no answer to mdata_jobs from tcp://10.0.0.1:8786 within 0.05s")
    assert isinstance(info.value, TrainerTimeoutError)
    assert asyncio.run(within(answered(), JobsRequest(), "tcp://10.0.0.1:8786", 5)) == "ok"


def test_a_timeout_raised_by_the_call_itself_passes_unchanged():
    async def refused() -> None:
        raise TimeoutError("connect timed out")

    with pytest.raises(TimeoutError, match="connect timed out") as info:
        asyncio.run(within(refused(), JobsRequest(), "tcp://10.0.0.1:8786", 5))
    assert not isinstance(info.value, RequestTimeoutError)
