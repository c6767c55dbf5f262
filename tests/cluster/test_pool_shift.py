"""Loader pools follow the mixture on a real cluster, and the autoscaler survives errors.

The shift: an expensive image source (large JPEGs the benchmark module writes, decoded by
``DecodeImageCaption``) and a text source of long documents; a staged mixture moves from 90% text
to 90% images mid-run while one trainer consumes a step every 0.25 s. The pools start as a
layout for the first stage would (text 2 workers, images 1). The image pool must grow and the
text pool shrink within two planner intervals of the shift, and the trainer's loop must wait for
batches less than 1% of the time around it. The scenario is ``benchmarks.pools_shift``, which
also reports its figures. Both pools' demands fit the 2-core CI machine only with a headroom of 2
(set through ``mdata.pools.headroom``): with less, one worker per pool would do all along.
"""

from __future__ import annotations

import time

import pytest

from benchmarks.pools_shift import run_shift
from conftest import run_loaders
from mdata.driver import EmbeddedGroups, JobHandle, PoolAutoscaler, PoolSpec, start_cluster, submit_job
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.mark.slow  # pools following the Planner's targets: test_failures.py::test_pools_scale_one_by_one_and_follow_the_planners_targets
def test_pools_follow_a_mixture_shift_without_stalling_the_trainer(tmp_path):
    out = run_shift(steps=130, shift_step=60, step_s=0.25, interval=1.0, data_dir=tmp_path)
    assert out["scaler_errors"] == 0
    assert out["start_sizes"] == {"text": 2, "images": 1}
    assert out["final_sizes"]["images"] > 1, out["decisions"]
    # the text pool needed more than one worker in the first stage and shrank after the shift
    assert out["sizes_at_shift"]["text"] > out["final_sizes"]["text"] == 1, out["decisions"]
    assert out["converge_intervals"] <= 2.0, out["decisions"]
    assert out["stall_fraction_during_shift"] < 0.01, out
    for *_, reason in out["decisions"]:  # every change says why, with the numbers behind it
        assert "busy threads" in reason and "ms/sample" in reason and "steps/s" in reason


class QuotaGroups(EmbeddedGroups):
    """The embedded cluster's pools, behind a platform whose first resize calls fail (as a cloud
    quota or an API outage would): what the autoscaler must live through."""

    def __init__(self, cluster, failures: int) -> None:
        super().__init__(cluster)
        self.failures = failures

    def scale(self, group: str, n: int) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError(f"quota exceeded: cannot resize {group} to {n} workers")
        super().scale(group, n)


def test_the_autoscaler_survives_errors_and_says_so(example_sources_small):
    from distributed import Client

    sources = [s for s in example_sources_small if s.name in ("chat", "code")]
    pools = [PoolSpec("text", ("chat", "code"), workers=2)]
    with start_cluster(sources, pools=pools, constructors=1, constructor_threads=1,
                       dashboard_address=None, autoscale=False) as cluster, \
            Client(cluster.scheduler_address, set_as_default=False) as client:
        client.wait_for_workers(3, timeout=60)
        plan = (Plan(sources).mix({"chat": 1.0, "code": 1.0})
                .balance(micro_batches=1, max_tokens=4096, global_batch=16)
                .distribute(ClientPlaceTree(dp=2)).window(2))
        submit_job(client, plan, job="quota")
        scaler = PoolAutoscaler(QuotaGroups(cluster, failures=2), client, job="quota", interval=0.3)
        scaler.start()
        try:
            run_loaders(client, job="quota", world_size=2, steps=12)
            deadline = time.monotonic() + 60
            while not scaler.status().applied and time.monotonic() < deadline:
                time.sleep(0.2)  # a light job: the text pool shrinks once the platform lets it
            status = scaler.status()
            assert cluster.pools["text"].workers == 1, status
            assert status.running and status.errors == 2
            assert status.last_error == "RuntimeError: quota exceeded: cannot resize text to 1 workers"
            assert [(d.group, d.current, d.workers) for d in status.applied] == [("text", 2, 1)]
            # job status says it too (the autoscaler reports to the Planner every round)
            deadline = time.monotonic() + 10
            while JobHandle(client, "quota").status()["autoscaler"]["last_run"] < status.last_run:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            reported = JobHandle(client, "quota").status()["autoscaler"]
            assert reported["errors"] == 2 and reported["running"]
            assert reported["applied"][-1]["workers"] == 1 and "quota" in reported["last_error"]
        finally:
            scaler.stop()
        assert not scaler.status().running


def test_the_video_pool_follows_a_mixture_shift_toward_video(tmp_path, example_corpus):
    # the same shift toward the example corpus's real clips (PyAV decodes a seeded window of
    # frames per sample): the video pool grows from its first size and the text pool shrinks
    out = run_shift(steps=64, shift_step=24, step_s=0.25, interval=1.0, data_dir=tmp_path,
                    media="videos", corpus=example_corpus)
    assert out["scaler_errors"] == 0
    assert out["start_sizes"] == {"text": 2, "videos": 1}
    assert out["final_sizes"]["videos"] > 1, out["decisions"]
    assert out["final_sizes"]["text"] < out["sizes_at_shift"]["text"], out["decisions"]
    assert out["converge_intervals"] <= 3.0, out["decisions"]
    video_reasons = [reason for _, group, *_, reason in out["decisions"] if group == "videos"]
    assert video_reasons and all("ms/sample" in r for r in video_reasons), out["decisions"]
