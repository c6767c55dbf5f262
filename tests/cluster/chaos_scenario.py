"""The chaos tests' shared scenario: which sources, which plan, how long a run, and the fixtures.

Sized for a 2-core CI machine: three text sources of the example corpus in small chunks, shuffled
within one chunk (so each source loads a new chunk every few steps and a fault, storage outages
included, always finds loads in flight and to come), a global batch of 8 over two
data-parallel ranks, 24 steps, a checkpoint every 4. Faulted runs sleep a little per step so that
faults land mid-run; the reference run does not (its timing cannot change what it receives).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from faults import ClusterProcess, reference
from mdata.cost import AttentionCost
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

SOURCES = ("chat", "scenes", "code")
CHUNK_ROWS = 16
GLOBAL_BATCH = 8
DP = 2
END_STEP = 24
CHECKPOINT_EVERY = 4
STEP_SLEEP = 0.15  # simulated compute per step in faulted runs
TRAINER_TIMEOUT = 60.0  # a trainer's longest wait for one batch: a stuck run fails, never hangs


def chaos_sources(all_sources) -> list:
    """The scenario's sources out of the example corpus's, in small chunks."""
    by_name = {s.name: s for s in all_sources}
    return [dataclasses.replace(by_name[n], chunk_rows=CHUNK_ROWS) for n in SOURCES]


def chaos_plan(sources, *, seed: int = 11) -> Plan:
    return (
        Plan(sources)
        .mix({s.name: 1.0 for s in sources})
        .cost(AttentionCost(a=1.0, b=2048.0))
        .balance(micro_batches=2, max_tokens=4096, global_batch=GLOBAL_BATCH)
        .distribute(ClientPlaceTree(dp=DP))
        .seed(seed)
        .window(2)
        .shuffle(1)  # shuffle within one chunk: a chunk is loaded a few steps before it is needed
    )


def chaos_pools(sources) -> list:
    """One text pool with two workers: killing one loader leaves the pool serving."""
    from mdata.driver import PoolSpec

    return [PoolSpec("text", tuple(s.name for s in sources), workers=2)]


def start_chaos_cluster(workdir: Path, sources) -> ClusterProcess:
    return ClusterProcess(workdir, sources, chaos_pools(sources), constructors=1).start()


@pytest.fixture(scope="module")
def local_sources(example_corpus) -> list:
    from mdata.data.example import example_sources

    return chaos_sources(example_sources(example_corpus))


@pytest.fixture
def chaos_cluster(tmp_path, local_sources) -> Iterator[ClusterProcess]:
    """A fresh cluster (in its own process group) for one test; closed, or killed, after it."""
    logging.getLogger("distributed").setLevel(logging.WARNING)
    cluster = start_chaos_cluster(tmp_path / "cluster", local_sources)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def reference_run(chaos_cluster, local_sources, tmp_path):
    """The uninterrupted sequence of the scenario's plan (computed once per session)."""
    return reference(chaos_cluster.address, chaos_plan(local_sources), tmp_path / "reference",
                     end_step=END_STEP)


@pytest.fixture(scope="module")
def s3_corpus(example_corpus, tmp_path_factory) -> Iterator:
    """A SeaweedFS S3 server holding a copy of the example corpus; yields ``(server, url)``.

    Fails, saying why, when the ``weed`` binary cannot run on this machine (skips only where
    ``MDATA_TESTS_ALLOW_NO_S3_SERVER=1`` allows it: :func:`s3_server.require_weed`)."""
    from s3_server import SeaweedS3, require_weed

    require_weed()
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed")).start()
    try:
        url = server.upload(example_corpus, "corpus", "example")
        yield server, url
    finally:
        server.kill()


@pytest.fixture
def s3_sources(s3_corpus) -> list:
    """The scenario's sources read from the S3 server (which is running when the test starts)."""
    from mdata.data.example import example_sources

    server, url = s3_corpus
    server.start()  # a previous test may have left it down
    # botocore's own retries off: an outage shorter than them (up to ~15 s, drawn at random) would
    # never reach mdata's retry loop, and so never be counted in the job's recoveries
    options = {**server.storage_options, "config_kwargs": {"retries": {"max_attempts": 0}}}
    return chaos_sources(example_sources(url, storage_options=options))
