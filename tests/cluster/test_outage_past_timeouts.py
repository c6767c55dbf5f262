"""Storage outages longer than the trainers' and constructors' own timeouts.

``mdata.trainer.timeout`` and ``mdata.constructor.chunk-wait`` are shorter than the loaders'
``mdata.storage.retry-deadline``, so an outage the loaders may still ride out must not end the job
at the shorter timeouts: trainers wait on while the Planner reports their sources waiting on
storage, and get ``StorageUnavailableError`` naming the source and shard only when the retry
deadline passes. Scaled down here: trainer timeout and chunk wait 3 s, retry deadline 14 s
(pauses up to 0.5 s), outages of 7 s; the
corpus is served by a real S3 server (SeaweedFS, :mod:`s3_server`) that is ``kill -9``'d and
started again with its data. Trainers are threads of this process; the loader and constructor
workers are processes (they get the short timings from Dask's configuration through their nannies).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import dask
import pytest

from chaos_scenario import chaos_plan, chaos_sources, s3_corpus  # noqa: F401  (fixture)
from fault_procs import constructor_worker, kill9, loader_holding_chunks, wait_for_workers
from mdata.driver import JobHandle, PoolSpec, start_cluster
from mdata.errors import StorageUnavailableError
from mdata.trainer import Loader
from test_recovery import close, received

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

TRAINER_TIMEOUT = 3.0
RETRY_DEADLINE = 14.0
OUTAGE_S = 7.0  # well past the trainers' timeout, well within the retry deadline
STEPS = 16
BEFORE_OUTAGE = 4
CONFIG = {
    "mdata.trainer.timeout": f"{TRAINER_TIMEOUT}s",
    "mdata.constructor.chunk-wait": f"{TRAINER_TIMEOUT}s",
    "mdata.storage.retry-deadline": f"{RETRY_DEADLINE}s",
    "mdata.storage.retry-initial": "0.05s",
    "mdata.storage.retry-max-interval": "0.5s",
    "mdata.planner.storage-poll-interval": "0.5s",
}


@pytest.fixture(scope="module")
def outage_cluster(s3_corpus) -> Iterator:  # noqa: F811
    """(the S3 server, the cluster, the sources on S3): one pool of two loaders, one constructor."""
    from mdata.data.example import example_sources

    logging.getLogger("distributed").setLevel(logging.ERROR)
    server, url = s3_corpus
    server.start()
    # botocore's own retries off and no read-ahead: each read goes to the server, each failure
    # reaches mdata's retry loop at once (it, not botocore, decides how long to wait)
    options = {**server.storage_options, "config_kwargs": {"retries": {"max_attempts": 0}},
               "default_cache_type": "none"}
    sources = chaos_sources(example_sources(url, storage_options=options))
    pools = [PoolSpec("text", tuple(s.name for s in sources), workers=2)]
    with dask.config.set(CONFIG), start_cluster(sources, pools=pools, constructors=1,
                                                constructor_threads=1, dashboard_address=None,
                                                autoscale=False) as cluster:
        yield server, cluster, sources


@pytest.fixture(autouse=True)
def storage_comes_back(outage_cluster):
    """A test that fails mid-outage must not leave the next one without storage."""
    yield
    outage_cluster[0].start()


@pytest.fixture(scope="module")
def reference_steps(outage_cluster):
    """What each rank receives from the plan without an outage."""
    server, cluster, sources = outage_cluster
    with cluster.client() as client:
        JobHandle.submit(client, chaos_plan(sources), job="reference")
        run = Ranks(client, "reference")
        run.finish()
        close(client, "reference")
    assert all(len(run.got[r]) == STEPS for r in range(2))
    return run.got


class Ranks:
    """Two trainer ranks as threads; each stops after BEFORE_OUTAGE steps until :meth:`go`."""

    def __init__(self, client, job: str, *, pause: bool = False) -> None:
        self.got: dict[int, list] = {0: [], 1: []}
        self.times: dict[int, list[float]] = {0: [], 1: []}
        self.errors: dict[int, BaseException] = {}
        self.failed_at: dict[int, float] = {}
        self.arrived = threading.Barrier(3) if pause else None
        self._go = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(client, job, r), name=f"rank-{r}")
                        for r in range(2)]
        for t in self.threads:
            t.start()
        if pause:
            self.arrived.wait(120)

    def _run(self, client, job: str, rank: int) -> None:
        try:
            with Loader(client, job=job, rank=rank, world_size=2, steps=STEPS,
                        timeout=TRAINER_TIMEOUT) as loader:
                for batch in loader:
                    self.times[rank].append(time.monotonic())
                    self.got[rank].append(received(batch))
                    if self.arrived is not None and len(self.got[rank]) == BEFORE_OUTAGE:
                        self.arrived.wait(60)
                        self._go.wait(60)
        except BaseException as exc:  # noqa: BLE001 - asserted on in the test thread
            self.failed_at[rank] = time.monotonic()
            self.errors[rank] = exc
            if self.arrived is not None:
                self.arrived.abort()

    def go(self) -> None:
        self._go.set()

    def stalled(self, quiet: float = 1.0, timeout: float = 30.0) -> bool:
        """Wait until no rank took a batch for ``quiet`` s; False if they finished first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(len(self.got[r]) == STEPS for r in range(2)):
                return False
            last = max(t[-1] for t in self.times.values())
            if time.monotonic() - last >= quiet:
                return True
            time.sleep(0.1)
        raise AssertionError(f"trainers kept going for {timeout}s")

    def longest_gap(self, rank: int) -> float:
        times = self.times[rank]
        return max(b - a for a, b in zip(times, times[1:]))

    def finish(self, timeout: float = 120.0) -> None:
        for t in self.threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in self.threads), "a trainer hangs"
        if self.errors:
            raise next(iter(self.errors.values()))


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        time.sleep(0.1)


def test_trainers_ride_out_an_outage_longer_than_their_timeout(outage_cluster, reference_steps):
    server, cluster, sources = outage_cluster
    with cluster.client() as client:
        job = JobHandle.submit(client, chaos_plan(sources), job="past-timeout")
        ranks = Ranks(client, "past-timeout", pause=True)
        server.kill()
        ranks.go()
        waits = wait_for(job.storage_waits, 20, "the Planner reports no source waiting on storage")
        began = time.monotonic()
        assert ranks.stalled(), "the trainers finished without needing storage"
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - began)))
        assert job.storage_waits(), "the outage ended before storage came back"
        assert not ranks.errors, ranks.errors  # before the fix: TrainerTimeoutError after 3 s
        server.start()
        ranks.finish()
        assert ranks.got == reference_steps  # same samples, same tokens, in order
        # the trainers really waited past their own timeout, on storage
        assert min(ranks.longest_gap(r) for r in range(2)) > OUTAGE_S - 1 > TRAINER_TIMEOUT
        assert any(s.startswith("s3://") for w in waits.values() for s in w["targets"])
        assert job.status()["failure"] is None
        close(client, "past-timeout")


@pytest.mark.slow  # outages past the timeouts by default: the other two tests here; a lost loader: test_shadow_loaders.py
def test_a_loader_lost_during_an_outage_does_not_fail_the_job_at_the_chunk_wait(
        outage_cluster, reference_steps):
    """kill -9 the loader holding the job's chunks and then the constructor while storage is
    down: the batches to rebuild need chunks that must be loaded again, from storage. The
    constructor waits for them past its chunk wait (3 s) while the source waits on storage."""
    server, cluster, sources = outage_cluster
    with cluster.client() as client:
        job = JobHandle.submit(client, chaos_plan(sources), job="lost-loader")
        ranks = Ranks(client, "lost-loader", pause=True)
        loader, loader_pid, chunks = loader_holding_chunks(client, "pool_chat", job="lost-loader")
        server.kill()
        kill9(loader_pid)
        constructor, constructor_pid = constructor_worker(client)
        kill9(constructor_pid)
        ranks.go()
        wait_for(job.storage_waits, 20, "the Planner reports no source waiting on storage")
        began = time.monotonic()
        assert ranks.stalled()
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - began)))
        failure = job.status()["failure"]
        assert failure is None, failure  # before the fix: ChunkUnavailableError after 3 s
        server.start()
        ranks.finish()
        wait_for_workers(client, "pool_chat", 2, exclude=[loader], timeout=60)
        assert chunks >= 1 and ranks.got == reference_steps
        assert min(ranks.longest_gap(r) for r in range(2)) > TRAINER_TIMEOUT
        close(client, "lost-loader")


def test_an_outage_past_the_retry_deadline_ends_in_the_storage_error(outage_cluster):
    server, cluster, sources = outage_cluster
    with cluster.client() as client:
        job = JobHandle.submit(client, chaos_plan(sources), job="past-deadline")
        ranks = Ranks(client, "past-deadline", pause=True)
        server.kill()
        down = time.monotonic()
        try:
            ranks.go()
            for t in ranks.threads:
                t.join(RETRY_DEADLINE + 60)
            assert not any(t.is_alive() for t in ranks.threads), "a trainer hangs"
        finally:
            server.start()
        assert set(ranks.errors) == {0, 1}
        names = {s.name for s in sources}
        for rank, error in ranks.errors.items():
            assert type(error) is StorageUnavailableError, repr(error)  # not TrainerTimeoutError
            # the shard's URL, or its index when a restarted loader had to list the source first
            assert error.source in names and error.shard is not None, error
            assert f"shard {error.shard!r}" in str(error) and "gave up after" in str(error)
            print(f"rank {rank}: {type(error).__name__} {ranks.failed_at[rank] - down:.1f}s after the "
                  "S3 server was killed")
            # the retry deadline, not the trainer's timeout, decided when
            assert RETRY_DEADLINE <= ranks.failed_at[rank] - down < RETRY_DEADLINE + 15
        assert "storage unreachable" in job.status()["failure"]
        close(client, "past-deadline")
