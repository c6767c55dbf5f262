"""report_metrics on a Loader that has not attached yet attaches first, instead of being refused
with a RankTakenError about a lease it never asked for; the rank then trains the same samples."""

from __future__ import annotations

import time

import pytest

from conftest import run_loaders
from mdata.driver import JobHandle, submit_job
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.trainer import Loader

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]


def _ids(batch) -> list:
    return sorted(map(tuple, batch["sample_ids"].tolist()))


def test_report_metrics_before_the_first_batch_attaches_the_loader(client, example_sources_small):
    sources = [s for s in example_sources_small if s.name in ("chat", "code")]
    plan = (Plan(sources).mix({"chat": 1, "code": 1}).balance(micro_batches=1, max_tokens=2048,
                                                              global_batch=4)
            .distribute(ClientPlaceTree(dp=1)).seed(5).window(2))
    submit_job(client, plan, job="reference-metrics")
    reference = run_loaders(client, job="reference-metrics", world_size=1, steps=3, keep=_ids)
    JobHandle(client, "reference-metrics").close()
    submit_job(client, plan, job="metrics-first")
    deadline = time.monotonic() + 60
    while JobHandle(client, "metrics-first").status()["counters"]["balanced_step"] < 1:
        assert time.monotonic() < deadline, "step 0 was never balanced"
        time.sleep(0.1)  # metrics are taken for a balanced step only
    with Loader(client, job="metrics-first", rank=0, world_size=1, steps=3, timeout=60) as loader:
        loader.report_metrics(0, {"loss/chat": 1.5})  # before iterating: attaches, not refused
        assert loader.info is not None and loader.info["start_step"] == 0
        got = [_ids(b) for b in loader]
    JobHandle(client, "metrics-first").close()
    assert got == reference[0]
