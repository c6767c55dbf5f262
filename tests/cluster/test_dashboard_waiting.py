"""User story: "is training waiting on data, on which rank, on which source?" on a real cluster.

Two sources of the same small JSONL text; ``slow``'s transform sleeps a while per chunk, so every
step's batch waits for ``slow``'s next chunk. Two trainer ranks (DP 2) consume without compute
time, so their training loops wait on data. The waiting page (its panel, built on the scheduler's
event loop as the Bokeh server does) and ``/mdata/api/<job>/waiting`` must show each rank's waits
step by step and blame them on ``slow``, and say so in their sentence.

The slow transform lives in a module that only this test's processes can import (a folder put on
the workers' ``sys.path`` by a preload, and on this process's), trusted by the workers.
"""

from __future__ import annotations

import html
import json
import sys
import textwrap
import urllib.request
import uuid

import dask
import distributed  # noqa: F401  its config defaults must exist before dask.config.set below
import pytest

import mdata.config  # noqa: F401  the same for mdata's (mdata.workers.trusted-modules below)
from conftest import run_loaders
from mdata.cost import AttentionCost
from mdata.driver import PoolSpec, start_cluster, submit_job
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

JOB = "waits"
STEPS = 10
DP = 2
DELAY_S = 0.3
MODULE = f"mdata_slow_transform_{uuid.uuid4().hex[:8]}"
CODE = f'''
"""TokenizeText that sleeps per chunk: a source made slow on purpose."""
import time
from dataclasses import dataclass

from mdata.sources import TokenizeText


@dataclass(frozen=True)
class SlowText(TokenizeText):
    def __call__(self, columns, *, context, **kwargs):
        time.sleep({DELAY_S})
        return super().__call__(columns, context=context, **kwargs)
'''


@pytest.fixture(scope="module")
def waited(tmp_path_factory):
    """Run the job to the end; the scheduler's figures and the waiting panel after it."""
    from mdata.sources import Source, TokenizeText
    from distributed.utils import sync

    from scheduler_plugins.dashboard.waiting import WaitingPanel

    tmp = tmp_path_factory.mktemp("slow-source")
    (tmp / f"{MODULE}.py").write_text(textwrap.dedent(CODE))
    sys.path.insert(0, str(tmp))
    slow_text = getattr(__import__(MODULE), "SlowText")
    sources = []
    for name, transform in (("fast", TokenizeText(field="body")), ("slow", slow_text(field="body"))):
        data = tmp / name
        data.mkdir()
        rows = [json.dumps({"body": f"{name} note {i}: " + "words " * (i % 7 + 1)}) for i in range(400)]
        (data / "part-0.jsonl").write_text("\n".join(rows) + "\n")
        sources.append(Source(name, str(data), format="jsonl", chunk_rows=8, transform=transform))
    plan = (Plan(sources).mix({"fast": 1.0, "slow": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=1024, global_batch=8 * DP)
            .distribute(ClientPlaceTree(dp=DP)).seed(5))
    preload = f"import sys; sys.path.insert(0, {str(tmp)!r})"
    try:
        with dask.config.set({"distributed.worker.preload": [preload],
                              "mdata.workers.trusted-modules": [MODULE]}):
            with start_cluster(sources, pools=[PoolSpec("fast", ("fast",)), PoolSpec("slow", ("slow",))],
                               constructors=1, constructor_threads=1, autoscale=False,
                               dashboard_address=":0") as cluster:
                with cluster.client(set_as_default=False) as client:
                    submit_job(client, plan, job=JOB)
                    run_loaders(client, job=JOB, world_size=DP, steps=STEPS, keep=lambda b: b["step"])
                base = cluster.dashboard_links["waiting"].rsplit("/", 1)[0]
                with urllib.request.urlopen(f"{base}/mdata/api/{JOB}/waiting", timeout=10) as reply:
                    api = json.loads(reply.read())

                async def build():  # on the scheduler's event loop, as the Bokeh server does
                    panel = WaitingPanel(cluster.cluster.scheduler)
                    panel.update()
                    return panel

                panel = sync(cluster.cluster.loop, build)
                yield {"api": api, "panel": panel}
    finally:
        sys.path.remove(str(tmp))


def test_every_rank_tells_the_wait_of_every_step(waited):
    api = waited["api"]
    assert api["job"] == JOB and api["world_size"] == DP and api["sources"] == ["fast", "slow"]
    assert sorted(api["ranks"]) == ["0", "1"]
    for rank, cols in api["ranks"].items():
        assert cols["step"] == list(range(STEPS)), rank
        assert all(w >= 0 for w in cols["wait_s"]) and len(cols["source"]) == STEPS
        # told as they were consumed (two messages may overtake each other), on the job's clock
        assert all(0 <= t < 120 for t in cols["time_s"]), cols["time_s"]
    # the loops had no compute: they waited about as long as the slow source took to load
    assert sum(api["wait_by_rank"].values()) > DELAY_S


def test_the_waits_are_blamed_on_the_slow_source(waited):
    api = waited["api"]
    blamed = api["wait_by_source"]
    assert list(blamed)[0] == "slow", blamed
    assert blamed["slow"] >= 0.8 * sum(blamed.values()), blamed
    for rank, cols in api["ranks"].items():  # every long wait of every rank: slow's chunk
        long = [source for source, wait in zip(cols["source"], cols["wait_s"]) if wait > DELAY_S / 3]
        assert long and set(long) == {"slow"}, (rank, cols)
    assert "blamed on source 'slow'" in api["answer"], api["answer"]


def test_the_waiting_panel_draws_what_the_route_answers(waited):
    api, panel = waited["api"], waited["panel"]
    lines = panel.lines.data
    assert list(lines["rank"]) == ["rank 0", "rank 1"]
    assert [list(xs) for xs in lines["xs"]] == [list(range(STEPS))] * DP
    for ys, rank in zip(lines["ys"], ("0", "1")):
        assert list(ys) == api["ranks"][rank]["wait_s"]
    dots = panel.dots.data
    assert len(dots["step"]) == DP * STEPS
    assert {s for s in dots["source_name"]} <= {"fast", "slow", "(too short to blame)"}
    totals = panel.totals.data
    assert list(totals["source_name"])[0] == "slow"
    assert html.escape("blamed on source 'slow'") in panel.answer.text
