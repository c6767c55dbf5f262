"""Registration never hangs: a source without a pool, a listing that hangs, a wrong endpoint.

A real embedded cluster with two pools (``remote`` serves ``chat``, ``disk`` serves ``code``) and
real storage faults: a source no worker serves, an S3 endpoint that accepts connections and never
answers (a local socket that reads nothing: the listing hangs on the loader), and an S3 endpoint
on a local port nobody listens on (a wrong ``endpoint_url``). Each registration ends in a typed
error naming the source, in bounded time, and one job's hanging listing blocks no other job.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time

import dask
import pytest

from conftest import run_loaders
from fixtures_faults import closed_port
from fixtures_s3 import AWS_TEST_ENV
from mdata.driver import PoolSpec, start_cluster, submit_job
from mdata.errors import NoPoolError, RequestTimeoutError, SourceError, StorageEndpointError
from mdata.trainer import Loader
from mdata.wire.messages import RegisterJobRequest, ask_sync
from test_failures import plan_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

# The bounds under test, scaled down from the product's defaults (10 s, 360 s, 15 s) so that each
# case waits a few seconds for its bound instead of tens: what is checked is that the bound, not a
# hang or another timeout, ends the wait.
POOL_WAIT = 3.0
LISTING_TIMEOUT = 12.0
FIRST_CONTACT = 5.0


class SilentServer:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers a byte."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture(scope="module")
def cluster(example_sources_small):
    with pytest.MonkeyPatch.context() as mp:
        for name, value in AWS_TEST_ENV.items():
            mp.setenv(name, value)  # inherited by the worker processes
        pools = [PoolSpec("remote", ("chat",), threads=4), PoolSpec("disk", ("code",))]
        # bounds how long a hung listing keeps a loader thread busy after the Planner gave up on it
        # mdata's defaults must be in Dask's config before the set below, or leaving it would
        # remove the whole `mdata` section it inserted (and every later test's defaults with it)
        import mdata.config  # noqa: F401

        served = [s for s in example_sources_small if s.name in ("chat", "code")]
        # the workers take first-contact-deadline from Dask's config through their nannies
        with dask.config.set({"mdata.storage.retry-deadline": "60s",
                              "mdata.storage.first-contact-deadline": f"{FIRST_CONTACT}s"}), start_cluster(
                served, pools=pools, constructors=1, constructor_threads=1,
                dashboard_address=":0", autoscale=False) as c:
            yield c


@pytest.fixture
def client(cluster):
    from distributed import Client

    with Client(cluster.scheduler_address, set_as_default=False, direct_to_workers=True) as c:
        yield c


def by_name(sources):
    return {s.name: s for s in sources}


def on_s3(source, endpoint: str, **config_kwargs):
    options = {"client_kwargs": {"endpoint_url": endpoint}}
    if config_kwargs:
        options["config_kwargs"] = config_kwargs
    return dataclasses.replace(source, url="s3://corpus/chat/*.parquet", storage_options=options)


def in_thread(fn):
    """Run ``fn`` in a thread; returns (thread, outcome: {'value'|'error', 'seconds'})."""
    outcome: dict = {}

    def run() -> None:
        began = time.monotonic()
        try:
            outcome["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - judged by the test
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - began

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_source_no_worker_serves_fails_the_registering_trainer_quickly(client, example_sources_small):
    code = by_name(example_sources_small)["code"]
    typo = dataclasses.replace(code, name="codes")  # its pool resource would be pool_codes
    plan = plan_for([code, typo])

    def attach():
        with Loader(client, job="no-pool", plan=plan, rank=0, world_size=2, timeout=60) as loader:
            return loader.attach()

    with dask.config.set({"mdata.planner.pool-wait": f"{POOL_WAIT}s"}):  # the Planner is in-process
        thread, outcome = in_thread(attach)
        thread.join(60)
    assert not thread.is_alive(), "the trainer got no answer within 60s"
    print(f"\nno pool: NoPoolError after {outcome['seconds']:.1f}s")
    err = outcome.get("error")
    assert isinstance(err, NoPoolError), repr(outcome)
    assert err.source == "codes" and err.resource == "pool_codes"
    assert "source 'codes' has no loader worker" in str(err) and "'pool_codes'" in str(err)
    assert "pool_code=1" in str(err) and "pool_chat=4" in str(err)  # what the cluster has
    assert outcome["seconds"] < POOL_WAIT + 15  # planner.pool-wait, then the answer


@pytest.mark.slow  # registration by default: the other tests of this file
def test_a_second_job_registers_while_the_first_ones_listing_hangs(client, example_sources_small):
    sources = by_name(example_sources_small)
    silent = SilentServer()
    try:
        hung = on_s3(sources["chat"], f"http://127.0.0.1:{silent.port}",
                     read_timeout=2, connect_timeout=2, retries={"max_attempts": 0})
        with dask.config.set({"mdata.planner.listing-timeout": f"{LISTING_TIMEOUT:g}s"}):  # in-process Planner
            first, first_out = in_thread(lambda: submit_job(client, plan_for([hung]), job="hangs"))
            deadline = time.monotonic() + 30
            while not silent.accepted:  # the listing reached the endpoint and waits for an answer
                assert time.monotonic() < deadline, "the listing never reached the silent endpoint"
                time.sleep(0.05)

            other, other_out = in_thread(lambda: submit_job(client, plan_for([sources["code"]]), job="other"))
            other.join(30)
            assert not other.is_alive(), "a second job's registration waited for the first one's listing"
            assert "error" not in other_out, repr(other_out)
            assert first.is_alive(), "the first listing should still hang"
            print(f"\nsecond job registered in {other_out['seconds']:.1f}s while the first listing hung")
            got = run_loaders(client, job="other", world_size=2, steps=2, timeout=60)
            assert sorted(got) == [0, 1] and all(len(batches) == 2 for batches in got.values())

            # the same job registered again waits on its own lock: a bounded request says so
            began = time.monotonic()
            with pytest.raises(RequestTimeoutError, match=r"no answer to mdata_register_job from .* within 3s"):
                ask_sync(client, RegisterJobRequest(job="hangs", plan=plan_for([hung]).to_spec()), timeout=3)
            assert time.monotonic() - began < 10

            first.join(60)
        assert not first.is_alive(), "the hung listing never ended in an error"
        print(f"hung listing: SourceError after {first_out['seconds']:.1f}s")
        err = first_out.get("error")
        assert isinstance(err, SourceError) and err.source == "chat", repr(first_out)
        assert f"listing did not finish within {LISTING_TIMEOUT:g}s (on worker tcp://" in str(err)
        assert LISTING_TIMEOUT <= first_out["seconds"] < LISTING_TIMEOUT + 20
    finally:
        silent.close()


def test_a_wrong_endpoint_url_fails_the_registering_trainer_within_30s(client, example_sources_small):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    wrong = on_s3(by_name(example_sources_small)["chat"], endpoint)  # botocore's default retries
    plan = plan_for([wrong, by_name(example_sources_small)["code"]])

    def attach():
        with Loader(client, job="wrong-endpoint", plan=plan, rank=0, world_size=2, timeout=120) as loader:
            return loader.attach()

    thread, outcome = in_thread(attach)
    thread.join(90)
    assert not thread.is_alive(), "the trainer got no answer within 90s"
    print(f"\nwrong endpoint_url: {type(outcome.get('error')).__name__} after {outcome['seconds']:.1f}s")
    err = outcome.get("error")
    assert isinstance(err, StorageEndpointError), repr(outcome)
    assert err.source == "chat" and err.endpoint == endpoint
    assert f"storage endpoint {endpoint} has never answered" in str(err)
    assert outcome["seconds"] < 30  # first-contact-deadline (5 s here) and botocore's own retries


def test_a_stopped_constructor_holding_the_batch_leaves_no_trainer_thread_hanging(
        cluster, client, example_sources_small):
    """The batch of step 0 is built, then its constructor is frozen (SIGSTOP: its sockets stay
    open, it answers nothing, the scheduler still lists it). The trainer gets an error within its
    timeout, and its prefetch thread, whose fetch has no answer, gives up too instead of hanging
    on the frozen constructor for good."""
    import os
    import signal

    from mdata.errors import TrainerTimeoutError

    scheduler = cluster.cluster.scheduler
    submit_job(client, plan_for([by_name(example_sources_small)["code"]]), job="frozen")
    deadline = time.monotonic() + 60
    while not [k for k, ts in scheduler.tasks.items() if isinstance(k, tuple) and k[:2] == (
            "mdata-construct", "frozen") and k[3] == 0 and ts.state == "memory"]:
        assert time.monotonic() < deadline, "the batch of step 0 was never built"
        time.sleep(0.05)
    pids = [ws.pid for ws in scheduler.workers.values() if "mdata_constructor" in ws.resources]
    assert len(pids) == 1
    before = set(threading.enumerate())
    os.kill(pids[0], signal.SIGSTOP)
    try:
        def take_one():
            with dask.config.set({"mdata.requests.timeout": "3s"}), Loader(
                    client, job="frozen", rank=0, world_size=2, steps=1, timeout=5) as loader:
                return next(iter(loader))

        thread, outcome = in_thread(take_one)
        thread.join(60)
        assert not thread.is_alive(), "the trainer hangs on a frozen constructor"
        err = outcome.get("error")
        assert isinstance(err, TrainerTimeoutError), repr(outcome)
        assert outcome["seconds"] < 5 + 30  # its timeout, after attaching on a loaded machine
        prefetchers = [t for t in threading.enumerate() if t.name == "mdata-prefetch-0" and t not in before]
        for t in prefetchers:
            t.join(20)  # its fetch times out after 3s, its own deadline after 5s
        stuck = [t for t in prefetchers if t.is_alive()]
        assert not stuck, "the prefetch thread still waits for the frozen constructor"
        print(f"\nfrozen constructor: {type(err).__name__} after {outcome['seconds']:.1f}s, "
              f"prefetch thread ended")
    finally:
        os.kill(pids[0], signal.SIGCONT)
