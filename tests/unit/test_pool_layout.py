"""Offline pool layout (mdata.pools.layout): who shares a pool, workers and threads per pool, the
core-budget fit, the mixture's peak stage, the printed forms, and default pools without a profile."""

from __future__ import annotations

import math

import pytest
import yaml

from mdata.errors import PlanError
from mdata.mixing import LinearRamp, StagedMixture
from mdata.pools.layout import (
    PoolLayout, amdahl_speedup, compute_layout, fit_layout, layout_for_plan, peak_stage, source_cost_class,
)
from mdata.pools.layout_text import dask_worker_commands, kubernetes_manifest
from mdata.pools.profile import Profile, SourceProfile


def prof(name: str, ms: float, *, chunk_rows: int = 16, speedup: float = 1.0, threads: int = 2) -> SourceProfile:
    rate = 1e3 / ms
    return SourceProfile(name=name, samples=64, seconds_per_sample=ms / 1e3, cpu_seconds_per_sample=ms / 1e3,
                         bytes_per_sample=1000.0, reader_bytes=10_000, chunk_rows=chunk_rows, threads=threads,
                         samples_per_s_1=rate, samples_per_s_n=rate * speedup)


# an image-heavy job: native-size wallpapers (60 ms a sample, 16-row chunks: ~1 s tasks), small
# caption crops (2 ms), and two kinds of short text (0.05 ms and 0.1 ms, 64-row chunks)
PROFILE = Profile((prof("wallpapers", 60.0), prof("captions", 2.0), prof("chat", 0.05, chunk_rows=64),
                   prof("code", 0.1, chunk_rows=64)))
WEIGHTS = {"wallpapers": 0.25, "captions": 0.25, "chat": 0.25, "code": 0.25}


def test_expensive_sources_get_their_own_pool_and_cheap_ones_share():
    layout = compute_layout(PROFILE, WEIGHTS, samples_per_step=32, rate=2.0)
    # wallpapers: 0.25 x 32 x 2 x 0.060 = 0.96 busy threads, x1.25 = 1.2 -> its own pool, 2 workers
    wall = layout.pool_of("wallpapers")
    assert wall.sources == ("wallpapers",) and wall.workers == 2 and wall.threads == 1
    assert wall.demand == pytest.approx(0.96)
    # captions (32 ms tasks), chat (3.2 ms), code (6.4 ms): all under half a step (250 ms) -> one pool
    shared = layout.pool_of("chat")
    assert set(shared.sources) == {"chat", "code", "captions"} and shared.workers == 1
    assert len(layout.pools) == 2 and layout.cores == 3
    assert "fills a worker by itself" in wall.reason and "cheap" in shared.reason


def test_no_busy_pool_mixes_task_costs_beyond_the_ratio():
    # captions' 32 ms tasks are 10x chat's 3.2 ms and 5x code's 6.4 ms; at 600 steps/s of 8 samples
    # chat and code keep a pool busy 55% of the time (headroom included), captions would add 30%
    weights = {"captions": 0.02, "chat": 0.49, "code": 0.49}
    layout = compute_layout(PROFILE, weights, samples_per_step=8, rate=600.0,
                            names=("captions", "chat", "code"), short_task_s=0.005)
    assert {p.sources for p in layout.pools} == {("chat", "code"), ("captions",)}
    for p in layout.pools:  # within every pool, task durations stay within max_ratio (8)
        tasks = [PROFILE[s].cost() * PROFILE[s].chunk_rows for s in p.sources]
        assert max(tasks) <= 8 * min(tasks)
    # a looser ratio lets them share
    loose = compute_layout(PROFILE, weights, samples_per_step=8, rate=600.0,
                           names=("captions", "chat", "code"), short_task_s=0.005, max_ratio=20)
    assert len(loose.pools) == 1
    # a pool busy under half the time mixes any tasks: a pool of its own would idle a whole core
    idle = compute_layout(PROFILE, weights, samples_per_step=8, rate=20.0,
                          names=("captions", "chat", "code"), short_task_s=0.005)
    assert len(idle.pools) == 1 and "busy under 50% of the time" in idle.pools[0].reason


def test_a_source_unused_at_the_peak_stage_still_gets_a_pool():
    layout = compute_layout(PROFILE, StagedMixture([(0, {"chat": 1.0}), (10, {"wallpapers": 1.0})]),
                            samples_per_step=32, rate=2.0, names=("wallpapers", "chat"))
    assert layout.stage == "stage from step 10" and layout.pool_of("chat").demand == 0.0


def test_workers_follow_demand_and_rate():
    slow = compute_layout(PROFILE, WEIGHTS, samples_per_step=32, rate=1.0)
    fast = compute_layout(PROFILE, WEIGHTS, samples_per_step=32, rate=8.0)
    # 0.25 x 32 x 8 x 0.06 = 3.84 busy threads x 1.25 = 4.8 -> 5 workers
    assert fast.pool_of("wallpapers").workers == 5
    assert slow.pool_of("wallpapers").workers == 1  # 0.48 x 1.25 = 0.6 < 1: cheap at this rate
    assert fast.cores >= slow.cores


def test_threads_only_where_the_gil_is_released():
    gil_free = Profile((prof("images", 50.0, speedup=1.95),))   # p ~ 0.97
    gil_bound = Profile((prof("images", 50.0, speedup=1.02),))  # p ~ 0.04
    a = compute_layout(gil_free, {"images": 1.0}, samples_per_step=16, rate=4.0, max_threads=4)
    b = compute_layout(gil_bound, {"images": 1.0}, samples_per_step=16, rate=4.0, max_threads=4)
    need = 16 * 4 * 0.05 * 1.25  # 4.0 busy threads
    assert b.pools[0].threads == 1 and b.pools[0].workers == math.ceil(need)
    pa = a.pools[0]  # 4 cores either way; threads where they scale: fewer processes
    assert pa.threads == 4 and pa.workers == 1 and pa.cores == b.pools[0].cores
    assert amdahl_speedup(1.0, 4) == pytest.approx(4.0) and amdahl_speedup(0.0, 4) == pytest.approx(1.0)


def test_cost_basis_cpu_or_wall():
    """CPU time by default (a busy profiling machine inflates wall time, not CPU time); wall time
    on request (a remote source's thread also waits on storage)."""
    from dataclasses import replace

    remote = Profile((replace(prof("remote", 2.0), seconds_per_sample=0.040),))
    cpu = compute_layout(remote, {"remote": 1.0}, samples_per_step=32, rate=4.0)
    wall = compute_layout(remote, {"remote": 1.0}, samples_per_step=32, rate=4.0, basis="wall")
    assert cpu.pools[0].demand == pytest.approx(32 * 4 * 0.002) and cpu.pools[0].workers == 1
    assert wall.pools[0].demand == pytest.approx(32 * 4 * 0.040) and wall.pools[0].workers == 7
    with pytest.raises(PlanError, match="cost basis"):
        compute_layout(remote, {"remote": 1.0}, samples_per_step=32, rate=4.0, basis="gpu")


def test_fit_layout_finds_the_fastest_rate_within_the_core_budget():
    layout = fit_layout(PROFILE, WEIGHTS, samples_per_step=32, cores=6)
    assert layout.cores <= 6
    faster = compute_layout(PROFILE, WEIGHTS, samples_per_step=32, rate=layout.rate * 1.01)
    assert faster.cores > 6
    with pytest.raises(PlanError, match="smallest layout needs"):
        fit_layout(PROFILE, WEIGHTS, samples_per_step=32, cores=1, max_ratio=1, short_task_s=0.0, idle_share=0.0)


def test_peak_stage_is_the_most_demanding_one():
    cost = {"wallpapers": 0.06, "chat": 0.0001}
    label, weights = peak_stage(StagedMixture([(0, {"chat": 1.0}), (100, {"chat": 1, "wallpapers": 1}),
                                               (200, {"chat": 3, "wallpapers": 1})]), ["wallpapers", "chat"], cost)
    assert label == "stage from step 100" and weights == {"wallpapers": 0.5, "chat": 0.5}
    label, weights = peak_stage(LinearRamp(0, 10, {"chat": 1.0}, {"wallpapers": 1.0, "chat": 3.0}),
                                ["wallpapers", "chat"], cost)
    assert label == "ramp end (step 10)" and weights["wallpapers"] == 0.25
    layout = compute_layout(PROFILE, LinearRamp(0, 10, {"chat": 1.0}, {"wallpapers": 1.0}),
                            samples_per_step=32, rate=1.0, names=("wallpapers", "chat"))
    assert layout.pool_of("wallpapers").workers == 3  # 32 x 1 x 0.06 x 1.25 = 2.4 at the ramp's end


def test_layout_for_plan_and_round_trip():
    from mdata.plan import Plan

    plan = (Plan(["wallpapers", "captions", "chat", "code"]).mix(WEIGHTS)
            .balance(micro_batches=1, max_tokens=4096, global_batch=32))
    layout = layout_for_plan(plan, PROFILE, rate=2.0)
    assert layout.samples_per_step == 32 and layout == compute_layout(PROFILE, WEIGHTS, samples_per_step=32, rate=2.0)
    assert PoolLayout.from_dict(layout.to_dict()) == layout
    with pytest.raises(PlanError, match="either a target rate"):
        layout_for_plan(plan, PROFILE)
    with pytest.raises(PlanError, match="no profile for source"):
        compute_layout(PROFILE, {"other": 1.0}, samples_per_step=4, rate=1.0, names=("other",))


def test_printed_forms_start_exactly_the_layout():
    layout = compute_layout(PROFILE, WEIGHTS, samples_per_step=32, rate=2.0)
    lines = dask_worker_commands(layout, "tcp://10.0.0.1:8786", constructors=3)
    assert lines[0] == "dask scheduler --preload scheduler_plugins.planner"
    assert ('dask worker tcp://10.0.0.1:8786 --nworkers 2 --nthreads 1 --memory-limit 4GiB '
            '--resources "pool_wallpapers=1" --name wallpapers') in lines
    assert any('--resources "pool_chat=1 pool_code=1 pool_captions=1"' in line for line in lines)
    assert lines[-1].startswith("dask worker tcp://10.0.0.1:8786 --nworkers 3 ")
    docs = list(yaml.safe_load_all(kubernetes_manifest(layout, image="me/mdata:1")))
    assert [d["kind"] for d in docs] == ["DaskCluster"] + ["DaskWorkerGroup"] * len(layout.pools)
    for doc, pool in zip(docs[1:], layout.pools):
        worker = doc["spec"]["worker"]
        args = worker["spec"]["containers"][0]["args"]
        assert worker["replicas"] == pool.workers and doc["spec"]["cluster"] == "mdata"
        assert args[args.index("--resources") + 1] == " ".join(f"pool_{s}={pool.threads}" for s in pool.sources)
    text = str(layout)
    assert "2 pools, 3 workers, 3 cores" in text and "wallpapers" in text


def test_default_pools_give_image_sources_their_own_pool(tmp_path):
    """The image source used to land in the text pool: DecodeImageCaption had no ``kind``."""
    from mdata.driver import default_pools
    from mdata.sources import DecodeImageCaption, SampleTransform, Source, TokenizeText
    from mdata.spec import SourceSpec

    class Thumbnails(SampleTransform):  # a user transform that says nothing but makes images
        produces_images = True

    sources = [Source("fortunes", str(tmp_path), transform=TokenizeText()),
               Source("wallpapers", str(tmp_path), transform=DecodeImageCaption()),
               Source("thumbs", str(tmp_path), format="jsonl", transform=Thumbnails())]
    pools = {p.name: p.sources for p in default_pools(sources)}
    assert pools == {"wallpapers": ("wallpapers",), "thumbs": ("thumbs",), "text0": ("fortunes",)}
    # plan-file sources (transforms by reference, as `mdata cluster up --plan` reads them)
    specs = [SourceSpec("fortunes", "/d", transform={"type": "mdata.sources.transforms:TokenizeText", "args": {}}),
             SourceSpec("wallpapers", "/d", transform={"type": "mdata.sources.transforms:DecodeImageCaption",
                                                      "args": {}}),
             SourceSpec("qa", "/d", transform={"type": "my_job:QATemplate", "args": {}})]
    assert [source_cost_class(s) for s in specs] == ["cheap", "expensive", "unknown"]
    pools = {p.name: p.sources for p in default_pools(specs)}
    assert pools == {"wallpapers": ("wallpapers",), "qa": ("qa",), "text0": ("fortunes",)}


def test_plan_layout_command_prints_the_layout_of_a_plan_file(tmp_path, capsys):
    from mdata.cli import main
    from mdata.plan import Plan

    plan = (Plan(["wallpapers", "captions", "chat", "code"]).mix(WEIGHTS)
            .balance(micro_batches=1, max_tokens=4096, global_batch=32))
    plan_file = plan.to_file(tmp_path / "job.yaml")
    PROFILE.save(tmp_path / "job.profile.json")
    args = ["plan", "layout", str(plan_file), "--profile", str(tmp_path / "job.profile.json")]
    assert main(args + ["--rate", "2", "--kubernetes"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pool layout for 2 steps/s x 32 samples/step (static): 2 pools, 3 workers, 3 cores")
    assert '--nworkers 2 --nthreads 1 --memory-limit 4GiB --resources "pool_wallpapers=1"' in out
    assert out.count("kind: DaskWorkerGroup") == 2
    assert main(args + ["--cores", "6"]) == 0
    assert ", 6 cores" in capsys.readouterr().out.splitlines()[0]
    assert main(args[:-1] + [str(tmp_path / "missing.json"), "--rate", "2"]) == 2
    assert "cannot read profile" in capsys.readouterr().err
