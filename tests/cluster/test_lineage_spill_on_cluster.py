"""Lineage for the whole run on a real cluster: with a retention of 4 steps, the lineage of step 0
is spilled to Parquet files long before the run ends, and its story is still told, the same by
``JobHandle.story``, the JSON route and the dashboard's lineage page."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import dask
import pytest
from distributed.utils import sync

import mdata.config  # noqa: F401 - mdata's defaults loaded before dask.config.set below (else
# leaving the set would drop the whole `mdata` section it did not see, as dask restores only what it saw)
from conftest import run_loaders
from mdata.cost import AttentionCost
from mdata.data.example import example_sources
from mdata.driver import JobHandle, start_cluster
from mdata.lineage.ids import SampleId
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from scheduler_plugins.dashboard.lineage import LineagePanel

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

JOB = "spill"
STEPS = 14
RETENTION = 4


@pytest.fixture(scope="module")
def run(example_corpus, tmp_path_factory):
    """A cluster whose Planner keeps 4 steps of lineage and spills the rest to a folder."""
    folder = tmp_path_factory.mktemp("lineage")
    sources = [s for s in example_sources(example_corpus) if s.name in ("chat", "code")]
    plan = (Plan(sources).mix({"chat": 1.0, "code": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=2048, global_batch=8)
            .distribute(ClientPlaceTree(dp=2)).window(2))
    config = {"mdata.planner.lineage-steps": RETENTION, "mdata.planner.lineage-spill": f"file://{folder}"}
    with dask.config.set(config), start_cluster(sources, dashboard_address=":0") as cluster, \
            cluster.client(set_as_default=False) as client:
        handle = JobHandle.submit(client, plan, job=JOB)
        received = run_loaders(client, job=JOB, world_size=2, steps=STEPS, timeout=120,
                               keep=lambda b: (b["step"], b["sample_ids"].numpy().tolist()))
        yield {"cluster": cluster, "handle": handle, "received": received, "folder": folder,
               "names": plan.source_names}
        handle.close()


def _step0_sample(run, rank: int) -> SampleId:
    step, ids = run["received"][rank][0]
    assert step == 0
    source_index, shard, row = ids[0]
    return SampleId(run["names"][source_index], shard, row)


def test_step_0_was_spilled_and_its_story_is_whole(run):
    handle = run["handle"]
    lineage = handle.lineage(STEPS)
    assert lineage["forgotten_before"] >= STEPS - RETENTION - 1  # step 0 left the DGraph
    assert lineage["samples"]["0"] == {"0": [], "1": []}
    files = [p for p in run["folder"].rglob("*.parquet")]
    assert any(p.name.startswith("000000-steps-000000000000-") for p in files)
    for rank in (0, 1):
        sid = _step0_sample(run, rank)
        story = handle.story(sid)
        first = story.occurrences[0]
        assert [e["event"] for e in first.events] == ["loaded", "planned", "delivered", "consumed"]
        loaded, planned, delivered, consumed = first.events
        assert (loaded["source"], loaded["shard"], loaded["row"]) == (sid.source, sid.shard, sid.row)
        assert (planned["step"], planned["dp_rank"]) == (0, rank)
        assert delivered["ranks"] == [rank] and consumed["ranks"] == [rank]
        assert f"consumed at step 0 by trainer ranks [{rank}]" in str(story)


def test_the_route_and_the_page_tell_the_same_spilled_story(run):
    cluster, handle = run["cluster"], run["handle"]
    sid = _step0_sample(run, 1)
    story = handle.story(sid)
    base = cluster.dashboard_link.rsplit("/", 1)[0]
    with urllib.request.urlopen(f"{base}/mdata/api/{JOB}/story/{sid}", timeout=30) as reply:
        api = json.loads(reply.read())
    events = [e for occ in story.occurrences for e in occ.events]
    assert [r["event"] for r in api["rows"]] == [e["event"] for e in events]
    assert [r["lineage_id"] for r in api["rows"]] == [o.lineage_id for o in story.occurrences
                                                      for _ in o.events]
    assert api["rows"][1]["step"] == 0 and api["rows"][1]["dp_rank"] == 1

    scheduler = cluster.cluster.scheduler

    async def page():
        panel = LineagePanel(scheduler, job=JOB, sample_id=str(sid))
        texts = []
        for _ in range(500):  # the spilled part is read in a thread; a later refresh shows it
            while panel.jobs.current().lock.locked():
                await asyncio.sleep(0.01)
            panel.update()
            texts.append(panel.result.text)
            if list(panel.source.data["event"]):
                assert "reading lineage spilled in" in texts[0], texts
                return panel
            await asyncio.sleep(0.02)
        raise AssertionError(f"the lineage page never showed the story: {panel.result.text}")

    panel = sync(cluster.cluster.loop, page)
    assert list(panel.source.data["event"]) == [r["event"] for r in api["rows"]]
    assert list(panel.source.data["step"]) == ["" if r["step"] is None else str(r["step"]) for r in api["rows"]]
    assert panel.result.text.startswith(f"{sid}: {len(story.occurrences)} occurrence(s)")
