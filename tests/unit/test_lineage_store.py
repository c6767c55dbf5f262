"""The scheduler's lineage store: segments handed over by the Planner are written by a thread,
readable before and after, and stories over them match an unbounded DGraph's."""

from __future__ import annotations

import asyncio
import types
import uuid

import dask
import pytest

from mdata.lineage.limits import SpillLimits
from mdata.lineage.spill import SpilledLineage, StoryQuery
from mdata.planner import PlannerState
from planner_driver import Driver
from scheduler_plugins.lineage_store import LineageStore, spill_url
from scheduler_plugins.stories import story, story_query
from test_lineage_spill import _full_story, _meta, _plan, _sample_ids


def test_the_configured_url_names_a_folder_per_run(tmp_path):
    with dask.config.set({"temporary-directory": str(tmp_path)}):
        assert spill_url("auto") == (f"{tmp_path}/mdata-lineage", True)
    assert spill_url(None) == (None, False)
    assert spill_url("s3://bucket/lineage/") == ("s3://bucket/lineage", False)
    with dask.config.set({"mdata.planner.lineage-spill": f"file://{tmp_path}/spill"}):
        a, b = LineageStore.for_job("my job/1", 100), LineageStore.for_job("my job/1", 100)
        assert LineageStore.for_job("x", None) is None  # nothing is ever forgotten: no spill
    try:
        assert a.url != b.url and a.url.startswith(f"file://{tmp_path}/spill/my_job_1-")
        assert not a.scratch
    finally:
        a.close()
        b.close()
    with dask.config.set({"mdata.planner.lineage-spill": None}):
        assert LineageStore.for_job("x", 100) is None


def test_a_store_writes_in_its_thread_and_tells_whole_stories(tmp_path):
    store = LineageStore(f"file://{tmp_path}/run", scratch=True)
    meta, plan = _meta(), _plan()
    kept = PlannerState(plan, meta, lineage_steps=8, lineage_sink=store.spill)
    full = PlannerState(plan, meta)
    Driver(kept, meta).run(60)
    Driver(full, meta).run(60)
    assert store.flush(timeout=30)
    assert store.pending_nbytes() == 0 and store.failures == 0
    assert len(list((tmp_path / "run").iterdir())) == 4 * len(store.ranges()) > 0
    runtime = types.SimpleNamespace(state=kept, lineage=store, lock=asyncio.Lock())

    async def read_state(read):
        async with runtime.lock:
            return read(kept)

    runtime.read_state = read_state
    for key in _sample_ids(full.dgraph, [0, 59]):
        sid = types.SimpleNamespace(source=key[0], shard=key[1], row=key[2])
        want = _full_story(full.dgraph, key)
        assert story_query(runtime, sid).run() == want
        assert asyncio.run(story(runtime, sid)) == want
    store.close()
    assert not (tmp_path / "run").exists()  # scratch: deleted with the job


def test_a_failing_storage_keeps_the_range_in_memory_and_retries(tmp_path, monkeypatch):
    store = LineageStore(f"file://{tmp_path}/run", limits=SpillLimits(retry_initial_s=0.01, retry_max_s=0.05))
    meta, plan = _meta(), _plan()
    calls = {"n": 0}
    real_open = store.fs.open

    def flaky_open(path, mode="rb", **kw):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise OSError("storage unreachable")
        return real_open(path, mode, **kw)

    monkeypatch.setattr(store.fs, "open", flaky_open)
    kept = PlannerState(plan, meta, lineage_steps=8, lineage_sink=store.spill)
    Driver(kept, meta).run(20)
    assert store.flush(timeout=30)
    assert store.failures == 2 and all(r.written for r in store.ranges())
    assert store.info().note == "" and store.info().unavailable == ()  # retried, nothing lost
    store.close()
    assert (tmp_path / "run").exists()  # not scratch: the files stay


@pytest.mark.parametrize("kind", ["memory", "s3"])
def test_stories_read_back_from_remote_filesystems(kind, request):
    """Through fsspec filesystems other than local folders (pyarrow reads them via fsspec)."""
    options = {}
    if kind == "s3":
        import s3fs

        options = request.getfixturevalue("moto_s3")
        bucket = f"mdata-{uuid.uuid4().hex[:12]}"
        s3fs.S3FileSystem(**options).mkdir(bucket)
        url = f"s3://{bucket}/lineage/run"
    else:
        url = f"memory://mdata-lineage-{uuid.uuid4().hex}/run"
    store = LineageStore(url, **options)
    meta, plan = _meta(), _plan()
    kept = PlannerState(plan, meta, lineage_steps=8, lineage_sink=store.spill)
    full = PlannerState(plan, meta)
    Driver(kept, meta).run(30)
    Driver(full, meta).run(30)
    assert store.flush(timeout=60) and store.failures == 0
    reopened = SpilledLineage.open(url, **options)
    assert len(reopened) == len(store.ranges()) > 0
    # Each story reads a few row groups per range, one S3 GET apiece against moto (~5 ms each):
    # every 4th sample of step 0 still reads every range back through S3, in a quarter of the
    # time; every sample's story is compared on local files in test_lineage_spill.py.
    keys = _sample_ids(full.dgraph, [0])
    for key in keys[::4] if kind == "s3" else keys:
        want = _full_story(full.dgraph, key)
        assert StoryQuery.of(kept.dgraph, store.ranges(), *key).run() == want
        assert StoryQuery.of(kept.dgraph, reopened.ranges(), *key).run() == want
    store.close()
