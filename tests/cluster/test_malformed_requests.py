"""A wrong request fails alone: its sender gets a typed error, the job's healthy ranks train on.

Each request below is sent by another real Dask client through the wire messages, while the two
ranks of a job are mid-run; before these checks, the first two (an ack for a step not yet
balanced) failed every rank, and the NaN metric made the metric-driven mixture fail the job. The
ranks' samples are compared with an uninterrupted run of the same plan.
"""

from __future__ import annotations

import math

import dask
import pytest

from conftest import run_loaders
from mdata.cost import AttentionCost
from mdata.driver import JobHandle, submit_job
from mdata.errors import CallerRefusedError, RankTakenError
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.trainer import Loader
from mdata.wire.errors import InvalidRequestError
from mdata.wire.messages import (
    AckRequest, BatchLocationRequest, CloseJobRequest, HostLocationRequest, LocationAsk,
    ReportMetricsRequest, Status, ask_sync,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

STEPS = 6
TRUST = {"mdata.planner.trusted-modules": ["policies"]}  # FollowTheLoss, read by the scheduler


def _plan(sources) -> Plan:
    from policies import FollowTheLoss

    return (Plan(sources).mix(FollowTheLoss([s.name for s in sources]))
            .cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=2048, global_batch=8)
            .distribute(ClientPlaceTree(dp=2)).seed(11).window(2))


def _ids(batch) -> list:
    return sorted(map(tuple, batch["sample_ids"].tolist()))


def _malformed(intruder, job: str, lease: Loader, balanced: int) -> dict[str, BaseException]:
    """Every wrong request, sent by ``intruder``; returns the error each got, by name."""
    token, gen = lease._token, lease._generation
    ahead = balanced + 3  # a step the Planner has not balanced
    requests = {
        "token-less ack ahead": AckRequest(job=job, rank=0, step=ahead),
        "ack ahead": AckRequest(job=job, rank=0, step=ahead, token=token, generation=gen),
        "delivery ahead": AckRequest(job=job, rank=0, step=ahead, consumed=False, token=token,
                                     generation=gen),
        "forged token": AckRequest(job=job, rank=0, step=0, token="f" * 32, generation=gen),
        "token-less location": BatchLocationRequest(job=job, rank=1, step=balanced, timeout=0.5),
        "location, delivered ahead": BatchLocationRequest(
            job=job, rank=0, step=balanced, timeout=0.5, token=token, generation=gen,
            delivered=ahead),
        "token-less metrics": ReportMetricsRequest(job=job, rank=0, step=0,
                                                   metrics={"loss/chat": 1.0}),
        "NaN metric": ReportMetricsRequest(job=job, rank=0, step=0, token=token, generation=gen,
                                           metrics={"loss/chat": math.nan, "loss/code": 1.0}),
        "inf metric": ReportMetricsRequest(job=job, rank=0, step=0, token=token, generation=gen,
                                           metrics={"loss/code": math.inf}),
        "metrics ahead": ReportMetricsRequest(job=job, rank=0, step=ahead, token=token,
                                              generation=gen, metrics={"loss/code": 1.0}),
        "close by a stranger": CloseJobRequest(job, client=str(intruder.id)),
        "close by nobody": CloseJobRequest(job),
    }
    errors = {}
    for name, request in requests.items():
        try:
            ask_sync(intruder, request)
        except Exception as exc:  # noqa: BLE001 - each is checked by the caller
            errors[name] = exc
    # AckRequest never sends a negative or NaN stall; a hand-made message can
    raw = {**AckRequest(job=job, rank=0, step=0, token=token, generation=gen).to_msg(),
           "stalled_s": math.nan}
    try:
        intruder.sync(intruder.scheduler.mdata_ack, **raw)
    except Exception as exc:  # noqa: BLE001
        errors["NaN stall"] = exc
    # several ranks' asks in one request: each wrong one is answered with its own error
    host = ask_sync(intruder, HostLocationRequest(job=job, step=balanced, timeout=0.5, asks=(
        LocationAsk(rank=1),
        LocationAsk(rank=0, token=token, generation=gen, delivered=ahead),
        LocationAsk(rank=99, token=token, generation=gen))))
    for name, answer in zip(("host: token-less", "host: delivered ahead", "host: rank outside"),
                            host.answers):
        errors[name] = (answer.failure(name) if answer.status is Status.FAILED
                        else AssertionError(f"answered {answer.status.value}"))
    return errors


def test_malformed_requests_get_typed_errors_and_the_job_runs_on(mdata_cluster, client,
                                                                 example_sources_small):
    from distributed import Client

    sources = [s for s in example_sources_small if s.name in ("chat", "code")]
    plan = _plan(sources)
    with dask.config.set(TRUST):
        submit_job(client, plan, job="reference-mr")
        reference = run_loaders(client, job="reference-mr", world_size=2, steps=STEPS,
                                keep=_ids)
        JobHandle(client, "reference-mr").close()
        submit_job(client, plan, job="malformed")
    got: dict[int, list] = {0: [], 1: []}
    with Loader(client, job="malformed", rank=0, world_size=2, timeout=60) as l0, \
            Loader(client, job="malformed", rank=1, world_size=2, timeout=60) as l1, \
            Client(mdata_cluster.scheduler_address, set_as_default=False) as intruder:
        its = {0: iter(l0), 1: iter(l1)}
        errors = {}
        for step in range(STEPS):
            for rank, it in its.items():
                got[rank].append(_ids(next(it)))
            if step == 2:  # mid-run: both ranks hold step 2, steps ahead are being planned
                balanced = JobHandle(client, "malformed").status()["counters"]["balanced_step"]
                errors = _malformed(intruder, "malformed", l0, balanced)
        l0.mark_consumed()
        l1.mark_consumed()
    status = JobHandle(client, "malformed").status()  # closing the Loaders told their last step

    def expect(name: str, cls: type, pattern: str) -> None:
        assert isinstance(errors.get(name), cls), (name, errors.get(name))
        assert pattern in str(errors[name]), (name, str(errors[name]))

    expect("token-less ack ahead", InvalidRequestError, "mdata_ack: rank 0: the request carries no lease token")
    expect("ack ahead", InvalidRequestError, "is not balanced yet")
    expect("delivery ahead", InvalidRequestError, "is not balanced yet")
    expect("forged token", RankTakenError, "lost it")
    expect("NaN stall", InvalidRequestError, "stalled_s nan")
    expect("token-less location", InvalidRequestError, "mdata_batch_location: rank 1: the request carries no lease token")
    expect("location, delivered ahead", InvalidRequestError, "delivered")
    expect("token-less metrics", InvalidRequestError, "mdata_report_metrics: rank 0: the request carries no lease token")
    expect("NaN metric", InvalidRequestError, "metrics ['loss/chat'] are not finite")
    expect("inf metric", InvalidRequestError, "metrics ['loss/code'] are not finite")
    expect("metrics ahead", InvalidRequestError, "is not balanced yet")
    expect("close by a stranger", CallerRefusedError, "was not registered by client")
    expect("close by nobody", CallerRefusedError, "names no client")
    expect("host: token-less", InvalidRequestError, "mdata_host_location: rank 1: the request carries no lease token")
    expect("host: delivered ahead", InvalidRequestError, "delivered")
    expect("host: rank outside", InvalidRequestError, "rank 99 is outside the job's world of 2 ranks")
    # the healthy ranks saw nothing of it: the job never failed, and every rank received
    # exactly the samples of the uninterrupted run, step by step
    assert status["failure"] is None, status["failure"]
    assert status["counters"]["consumed_step"] == STEPS
    assert got == reference
    JobHandle(client, "malformed").close()  # its driver may
    assert "malformed" not in JobHandle.jobs(client)


def test_a_job_is_closed_by_its_driver_or_loaders_only(mdata_cluster, client, example_sources_small):
    """A second client that only looked at the job cannot close it; registering the same plan
    (idempotent) makes it a driver, which can."""
    from distributed import Client

    sources = [s for s in example_sources_small if s.name in ("chat", "code")]
    plan = _plan(sources)
    with dask.config.set(TRUST):
        submit_job(client, plan, job="owned")
    with Client(mdata_cluster.scheduler_address, set_as_default=False) as other:
        with pytest.raises(CallerRefusedError, match=r"mdata_close_job: job 'owned' was not "
                                                     r"registered by client"):
            JobHandle.attach(other, "owned").close()
        assert "owned" in JobHandle.jobs(other)
        # a Loader's client may close its job: the holder of a rank
        with Loader(other, job="owned", rank=0, world_size=2, timeout=60) as loader:
            loader.attach()
            JobHandle(other, "owned").close()
        assert "owned" not in JobHandle.jobs(other)
        with dask.config.set(TRUST):
            submit_job(client, plan, job="owned")
            submit_job(other, plan, job="owned")  # the same plan: now a driver too
        JobHandle(other, "owned").close()
        assert "owned" not in JobHandle.jobs(client)
