"""mdata's dashboard panels and JSON routes against a live Planner running a small job.

One job (DP 2 x CP 2, four trainer threads, three steps) runs on the module's embedded cluster;
the panels are built and updated on the scheduler's event loop, as the Bokeh server does, and their
data sources are checked against the job (steps, ranks, lineage from the DGraph) and against the
JSON routes served by the same scheduler.
"""

from __future__ import annotations

import asyncio
import html
import json
import urllib.error
import urllib.request

import pytest
from distributed.utils import sync

from conftest import run_loaders
from mdata.driver import submit_job
from mdata.driver.demo import demo_plan
from scheduler_plugins.dashboard.balance import BalancePanel
from mdata.observe.dashboard_pages import PAGES as TABLE
from scheduler_plugins.dashboard.common import HEADER_NAME, LATEST
from scheduler_plugins.dashboard.figures import STORY_COLUMNS
from scheduler_plugins.dashboard.lineage import LineagePanel
from scheduler_plugins.dashboard.mixture import MixturePanel
from scheduler_plugins.dashboard.pages import PAGES, page_functions
from scheduler_plugins.dashboard.sources import SourcesPanel
from scheduler_plugins.dashboard.trainers import TrainersPanel

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]

JOB = "dash"
STEPS = 3
DP, CP = 2, 2
GLOBAL_BATCH = 16


def on_loop(mdata_cluster, fn):
    """Run ``fn`` on the scheduler's event loop once no job is planning (its lock is free)."""
    scheduler = mdata_cluster.cluster.scheduler

    async def call():
        plugin = scheduler.extensions["mdata"]
        while any(job.lock.locked() for job in plugin.jobs.values()):
            await asyncio.sleep(0.01)
        return fn(scheduler)

    return sync(mdata_cluster.cluster.loop, call)


def get_json(mdata_cluster, path: str) -> tuple[int, dict]:
    base = mdata_cluster.dashboard_link.rsplit("/", 1)[0]
    try:
        with urllib.request.urlopen(f"{base}/{path}", timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _settled(scheduler):
    """What must stop changing before exact checks: backlog, planning, the pools' targets."""
    runtime = scheduler.extensions["mdata"].jobs[JOB]
    state = runtime.state
    backlog = sum(f.backlog_chunks for f in runtime.source_meter.snapshot(0.0))
    targets = {name: t["workers"] for name, t in runtime.pool_targets.items()}
    quiet = backlog == 0 and state.balanced_step == state.planned_step and len(targets) == len(state.names)
    return quiet, (int(state.planned_step), sorted(targets.items()))


@pytest.fixture(scope="module")
def job(mdata_cluster, example_sources_small):
    """Register the job, run three steps on four trainer ranks, wait until the Planner is idle."""
    from distributed import Client

    plan = demo_plan(example_sources_small, dp=DP, cp=CP, global_batch=GLOBAL_BATCH, max_tokens=4096)
    with Client(mdata_cluster.scheduler_address, set_as_default=False, direct_to_workers=True) as client:
        submit_job(client, plan, job=JOB)
        run_loaders(client, job=JOB, world_size=DP * CP, steps=STEPS, keep=lambda b: b["step"])
        lineage = client.sync(client.scheduler.mdata_lineage, job=JOB, steps=STEPS)
    # Settled: quiet and unchanged for 20 checks in a row (over ten Planner ticks), so that a pool
    # scale-down waiting for its votes has happened before the figures are compared.
    last, same = None, 0
    for _ in range(1000):
        quiet, figures = on_loop(mdata_cluster, _settled)
        same = same + 1 if quiet and figures == last else 0
        last = figures
        if same == 20:
            break
        sync(mdata_cluster.cluster.loop, asyncio.sleep, 0.03)
    else:
        pytest.fail(f"the Planner did not settle (backlog, planning, pool targets): {last}")
    return {"plan": plan, "lineage": lineage, "names": [s.name for s in example_sources_small]}


def build(mdata_cluster, cls, **kwargs):
    def make(scheduler):
        panel = cls(scheduler, **kwargs)
        panel.update()
        return panel

    return on_loop(mdata_cluster, make)


def test_pages_are_on_the_dashboard_and_listed_for_labextension(mdata_cluster):
    status, plots = get_json(mdata_cluster, "individual-plots.json")
    assert status == 200
    listed = {title: url for title, url in plots.items() if "mdata" in url}
    assert listed == {
        "Individual Mdata Sources": "/individual-mdata-sources",
        "Individual Mdata Mixture": "/individual-mdata-mixture",
        "Individual Mdata Balance": "/individual-mdata-balance",
        "Individual Mdata Trainers": "/individual-mdata-trainers",
        "Individual Mdata Waiting": "/individual-mdata-waiting",
        "Individual Mdata Lineage": "/individual-mdata-lineage",
    }
    assert set(listed.values()) == set(PAGES)
    # the links MdataCluster gives are the pages the dashboard serves, each with its title
    assert list(mdata_cluster.dashboard_links.values()) == [
        mdata_cluster.dashboard_link.rsplit("/", 1)[0] + route for route in PAGES]
    for page in TABLE:
        with urllib.request.urlopen(mdata_cluster.dashboard_links[page.title], timeout=30) as reply:
            assert reply.status == 200
            text = reply.read().decode()
            assert "bokeh" in text.lower()
            assert f"<title>mdata: {page.title}</title>" in text


def test_every_page_has_its_title_and_links_to_every_other_page(mdata_cluster, job):
    """Each page's Bokeh document, as the dashboard builds it, starts with a header naming the
    page and linking every other mdata page (relative links: they survive a proxy's prefix)."""
    from bokeh.document import Document

    def render(scheduler):
        docs = {}
        for route, make in page_functions().items():
            doc = Document()
            make(scheduler, {}, doc)
            docs[route] = doc
        return docs

    docs = on_loop(mdata_cluster, render)
    assert list(docs) == list(PAGES)
    for page in TABLE:
        doc = docs[page.route]
        assert doc.title == f"mdata: {page.title}"
        header = doc.roots[0].children[0]
        assert header.name == HEADER_NAME
        assert f"mdata: {page.title}</div>" in header.text and html.escape(page.purpose) in header.text
        for other in TABLE:
            link = f'<a href="{other.route.lstrip("/")}">{other.title}</a>'
            assert (link in header.text) == (other is not page), (page.title, other.title)
        assert '<a href="status">' in header.text
        for callback in list(doc.session_callbacks):  # stop the pages' refreshes
            doc.remove_periodic_callback(callback)


def test_trainers_panel_counts_every_rank_and_step(mdata_cluster, job):
    panel = build(mdata_cluster, TrainersPanel)
    data = panel.source.data
    assert list(data["rank"]) == ["0", "1", "2", "3"]
    assert list(data["steps_consumed"]) == [STEPS] * 4
    assert list(data["last_step"]) == [STEPS - 1] * 4
    assert all(w >= 0.0 for w in data["wait_s"])
    lines = panel.steps_source.data
    assert list(lines["rank"]) == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert [list(xs) for xs in lines["xs"]] == [list(range(STEPS))] * 4
    for total, per_step in zip(data["wait_s"], lines["ys"]):
        assert sum(per_step) == pytest.approx(total)
    assert "job <b>dash</b>" in panel.message.text

    status, api = get_json(mdata_cluster, f"mdata/api/{JOB}/trainers")
    assert status == 200
    assert api["rank"] == [0, 1, 2, 3]
    assert api["steps_consumed"] == list(data["steps_consumed"])
    assert api["last_step"] == list(data["last_step"])
    assert api["wait_s"] == pytest.approx(list(data["wait_s"]))
    assert api["wait_by_step"]["3"] == pytest.approx(
        {str(s): y for s, y in zip(range(STEPS), lines["ys"][3])})


def test_waiting_route_and_panel_hold_every_ranks_exposed_wait_per_step(mdata_cluster, job):
    from scheduler_plugins.dashboard.waiting import WaitingPanel

    status, api = get_json(mdata_cluster, f"mdata/api/{JOB}/waiting")
    assert status == 200 and api["world_size"] == DP * CP
    assert sorted(api["ranks"]) == ["0", "1", "2", "3"]
    for rank, cols in api["ranks"].items():
        assert cols["step"] == list(range(STEPS)), rank
        assert all(w >= 0 for w in cols["wait_s"])
        # a wait is blamed on one of the job's sources, or on none when too short to matter
        assert all(s in job["names"] or (s == "" and w < api["min_wait_s"])
                   for s, w in zip(cols["source"], cols["wait_s"])), cols
    assert api["wait_by_rank"] == pytest.approx(
        {r: sum(c["wait_s"]) for r, c in api["ranks"].items()})
    assert api["answer"]
    panel = build(mdata_cluster, WaitingPanel)
    assert list(panel.lines.data["rank"]) == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert [list(ys) for ys in panel.lines.data["ys"]] == [api["ranks"][r]["wait_s"] for r in "0123"]
    assert panel.per_rank.legend[0].click_policy == "hide"


def test_mixture_panel_matches_the_lineage_of_each_step(mdata_cluster, job):
    panel = build(mdata_cluster, MixturePanel)
    data = panel.source.data
    names = job["names"]
    assert list(data["source_name"]) == [n for n in names for _ in range(3)]
    assert list(data["kind"]) == ["target", "realized", "cumulative"] * len(names)
    status, api = get_json(mdata_cluster, f"mdata/api/{JOB}/mixture")
    assert status == 200
    steps = api["steps"]
    assert steps == list(range(len(steps))) and len(steps) >= STEPS
    assert all(list(xs) == steps for xs in data["xs"])

    # counts per source and step, independently from the DGraph's planned sample ids
    for step in range(STEPS):
        ids = [tuple(i) for dp in range(DP) for i in job["lineage"]["samples"][str(step)][str(dp)]]
        assert len(ids) == GLOBAL_BATCH
        for si, name in enumerate(names):
            assert api["counts"][name][step] == sum(1 for i in ids if i[0] == si)
    weights = {"chat": 3.0, "scenes": 2.0, "books": 1.0, "code": 2.0, "captions": 1.5,
               "videos": 1.0}  # the demo plan's weights (mdata/driver/demo.py)
    total = sum(weights[n] for n in names)
    for i, name in enumerate(names):
        target, realized, cumulative = (list(data["ys"][3 * i + k]) for k in range(3))
        assert target == pytest.approx([weights[name] / total] * len(steps))
        assert realized == pytest.approx([c / GLOBAL_BATCH for c in api["counts"][name]])
        running = [sum(api["counts"][name][: k + 1]) / (GLOBAL_BATCH * (k + 1)) for k in range(len(steps))]
        assert cumulative == pytest.approx(running)
        assert (target, realized, cumulative) == (api["target"][name], api["realized"][name],
                                                  api["cumulative"][name])


def test_balance_panel_holds_every_rank_cost_and_the_lower_bound(mdata_cluster, job):
    panel = build(mdata_cluster, BalancePanel)
    status, api = get_json(mdata_cluster, f"mdata/api/{JOB}/balance")
    assert status == 200
    n = len(api["steps"])
    assert n >= STEPS and api["dp"] == DP
    data = panel.source.data
    assert list(data["step"]) == [s for s in api["steps"] for _ in range(DP)]
    assert list(data["rank"]) == [0, 1] * n
    assert list(data["cost"]) == [c for costs in api["per_rank_cost"] for c in costs]
    steps = panel.step_source.data
    assert list(steps["step"]) == api["steps"]
    assert list(steps["lower_bound"]) == api["lower_bound"]
    for costs, lb, mx, ratio in zip(api["per_rank_cost"], api["lower_bound"], api["max_cost"],
                                    api["max_over_lower_bound"]):
        assert mx == max(costs) >= lb >= sum(costs) / DP
        assert ratio == pytest.approx(mx / lb)
    assert list(steps["max_over_lower_bound"]) == api["max_over_lower_bound"]
    # AttentionCost's coefficients fix ratios only: the axis says so rather than pretend a unit
    assert api["unit"] == "relative cost"
    assert panel.cost.yaxis[0].axis_label == "cost (relative cost)"
    assert list(data["rank_label"]) == ["DP rank 0", "DP rank 1"] * n  # the legend's entries
    assert panel.cost.legend[0].click_policy == "hide"


def test_sources_panel_shows_loads_backlog_and_pool_targets(mdata_cluster, job):
    panel = build(mdata_cluster, SourcesPanel)
    data = panel.source.data
    names = job["names"]
    assert list(data["source"]) == names
    assert list(data["backlog_chunks"]) == [0] * len(names)
    assert list(data["backlog_rows"]) == [0] * len(names)
    assert list(data["failed_chunks"]) == [0] * len(names)
    assert all(w >= 1 for w in data["pool_workers"])  # default pools, sized by the autoscaler
    planned = {n: 0 for n in names}
    for step in range(STEPS):
        for dp in range(DP):
            for si, _, _ in job["lineage"]["samples"][str(step)][str(dp)]:
                planned[names[si]] += 1
    for name, loaded in zip(names, data["loaded_samples"]):
        assert loaded >= planned[name] > 0  # a sample is planned only once its chunk loaded
    for name, target, reason in zip(names, data["target"], data["reason"]):
        assert int(target) >= 1
        assert reason.startswith(f"{name}: ")
        assert (reason.endswith(f"start with {target} workers") or f" to {target} workers" in reason
                or f"keep {target} workers" in reason)

    # the plots are time series: one line per source in each, on the job's clock
    for key in ("rate", "backlog", "workers", "target", "demand"):
        lines = panel.lines[key].data
        assert list(lines["source_name"]) == names, key
        assert all(len(xs) == len(ys) for xs, ys in zip(lines["xs"], lines["ys"])), key
    rate = panel.lines["rate"].data
    assert len(rate["xs"][0]) >= 1 and all(x >= 0 for x in rate["xs"][0])
    assert all(y >= 0 for ys in rate["ys"] for y in ys)
    demand = panel.lines["demand"].data
    # a decision each, the first from the steps consumed (later ones fall to 0: the job stopped)
    assert all(len(ys) >= 1 and ys[0] > 0 and min(ys) >= 0 for ys in demand["ys"])
    decisions = panel.decisions.data  # every source's first decision is a start
    assert {n for n, k in zip(decisions["source_name"], decisions["kind"]) if k == "start"} == set(names)
    # no column is narrower than its title, and the table keeps those widths (no squeezing)
    assert panel.table.autosize_mode == "none"
    for col in panel.table.columns:
        assert col.width >= 8 * len(col.title) + 12, (col.title, col.width)
    wrapped = {c.field for c in panel.table.columns if "white-space: normal" in
               getattr(c.formatter, "template", "")}
    assert wrapped == {"reason", "storage", "quarantined"}
    # the table redraws when its values change (Bokeh's DataTable ignores same-length updates)
    header = panel.table.index_header
    panel.source.data = {**panel.source.data, "samples_per_s": [-1.0] * len(names)}
    on_loop(mdata_cluster, lambda scheduler: panel.update())
    assert panel.table.index_header != header

    status, api = get_json(mdata_cluster, f"mdata/api/{JOB}/sources")
    assert status == 200
    data = panel.source.data
    for column in ("source", "loaded_samples", "backlog_chunks", "backlog_rows", "failed_chunks",
                   "pool_workers", "reason"):
        assert api[column] == list(data[column]), column
    assert [str(t) for t in api["target_workers"]] == list(data["target"])
    status, pools = get_json(mdata_cluster, f"mdata/api/{JOB}/pools")
    assert status == 200 and pools["sources"] == names
    assert set(pools["pools"]) == set(names) and all(pools["pools"][n]["demand"][0] > 0 for n in names)
    # loads over time: one figure per source per second sampled, the job's loads seen in them
    assert pools["time"] and all(len(pools["samples_per_s"][n]) == len(pools["time"]) and
                                 len(pools["backlog"][n]) == len(pools["time"]) for n in names)
    assert any(rate > 0 for n in names for rate in pools["samples_per_s"][n])


def test_lineage_panel_and_route_tell_the_same_story(mdata_cluster, job):
    source_index, shard, row = job["lineage"]["samples"]["1"]["1"][0]  # step 1, DP rank 1
    sample_id = f"{job['names'][source_index]}/{shard}/{row}"
    panel = build(mdata_cluster, LineagePanel, sample_id=sample_id)
    data = panel.source.data
    events = list(data["event"])
    assert events[:1] == ["loaded"] and events[-3:] == ["planned", "delivered", "consumed"]
    planned = events.index("planned")
    assert (data["step"][planned], data["dp_rank"][planned]) == ("1", "1")
    assert data["ranks"][events.index("consumed")] == "2, 3"  # DP rank 1 = ranks 2 and 3 with CP 2
    assert panel.result.text == f"{sample_id}: 1 occurrence(s), {len(events)} event(s)"
    assert panel.input.placeholder.startswith("e.g. ")

    status, api = get_json(mdata_cluster, f"mdata/api/{JOB}/story/{sample_id}")
    assert status == 200
    assert api["columns"] == list(STORY_COLUMNS)
    for column in STORY_COLUMNS:
        cells = ["" if r[column] is None else
                 ", ".join(map(str, r[column])) if isinstance(r[column], list) else str(r[column])
                 for r in api["rows"]]
        assert cells == list(data[column]), column


def test_unknown_names_answer_with_what_exists(mdata_cluster, job):
    panel = build(mdata_cluster, LineagePanel, sample_id="nosuch/0/1")
    assert list(panel.source.data["event"]) == []
    assert "unknown source 'nosuch' in sample id 'nosuch/0/1'" in panel.result.text
    status, api = get_json(mdata_cluster, f"mdata/api/{JOB}/story/nosuch/0/1")
    assert status == 404 and "unknown source 'nosuch'" in api["error"]
    missing = f"{job['names'][0]}/0/100000"  # a row its shard does not have: said, not no rows
    panel = build(mdata_cluster, LineagePanel, sample_id=missing)
    assert list(panel.source.data["event"]) == [] and f"no sample {missing}: shard 0" in panel.result.text
    status, api = get_json(mdata_cluster, f"mdata/api/{JOB}/story/{missing}")
    assert status == 404 and api["error"].startswith(f"job {JOB!r}: no sample {missing}: shard 0 of source")
    status, api = get_json(mdata_cluster, "mdata/api/nojob/balance")
    assert (status, api["error"]) == (404, "no mdata job named 'nojob'; jobs: ['dash']")
    status, api = get_json(mdata_cluster, f"mdata/api/{JOB}/costs")
    assert status == 404
    assert api["error"] == ("no mdata figures named 'costs'; "
                            "choose one of ['balance', 'mixture', 'pools', 'sources', 'trainers', 'waiting']")


def test_jobs_route_and_selector_follow_the_latest_job_unless_one_is_picked(mdata_cluster, job,
                                                                           example_sources_small):
    from distributed import Client

    pinned = build(mdata_cluster, TrainersPanel)
    pinned.jobs.widget.value = JOB  # as a user picking it in the browser would
    plan = demo_plan(example_sources_small, dp=1, cp=1, global_batch=4, max_tokens=4096)
    with Client(mdata_cluster.scheduler_address, set_as_default=False) as client:
        submit_job(client, plan, job="second")
        try:
            status, api = get_json(mdata_cluster, "mdata/api/jobs")
            assert status == 200
            assert [j["job"] for j in api["jobs"]] == [JOB, "second"] and api["latest"] == "second"
            assert api["jobs"][0]["consumed_step"] == STEPS and api["jobs"][1]["world_size"] == 1
            follower = build(mdata_cluster, TrainersPanel)
            assert follower.jobs.widget.value == LATEST
            assert list(follower.jobs.widget.options) == [LATEST, JOB, "second"]
            assert "job <b>second</b>" in follower.message.text
            assert list(follower.source.data["rank"]) == []  # no trainer of 'second' ran
            on_loop(mdata_cluster, lambda s: pinned.update())
            assert pinned.jobs.widget.value == JOB
            assert list(pinned.source.data["steps_consumed"]) == [STEPS] * 4
            pinned.jobs.widget.value = "second"
            on_loop(mdata_cluster, lambda s: pinned.update())
            assert list(pinned.source.data["rank"]) == []
        finally:
            client.sync(client.scheduler.mdata_close_job, job="second", client=client.id)
    on_loop(mdata_cluster, lambda s: pinned.update())  # a closed pinned job falls back to the latest
    assert (pinned.jobs.widget.value, list(pinned.jobs.widget.options)) == (LATEST, [LATEST, JOB])
    assert list(pinned.source.data["steps_consumed"]) == [STEPS] * 4


def test_last_keeps_the_newest_steps_with_cumulative_shares_over_all(mdata_cluster, job):
    _, full = get_json(mdata_cluster, f"mdata/api/{JOB}/mixture")
    status, tail = get_json(mdata_cluster, f"mdata/api/{JOB}/mixture?last=2")
    assert status == 200
    assert tail["steps"] == full["steps"][-2:]
    for name in job["names"]:
        for kind in ("target", "realized", "cumulative", "counts"):
            assert tail[kind][name] == full[kind][name][-2:]
    _, full = get_json(mdata_cluster, f"mdata/api/{JOB}/balance")
    _, tail = get_json(mdata_cluster, f"mdata/api/{JOB}/balance?last=1")
    assert (tail["steps"], tail["per_rank_cost"]) == (full["steps"][-1:], full["per_rank_cost"][-1:])
    panel = build(mdata_cluster, BalancePanel, last_steps=1)
    assert list(panel.step_source.data["step"]) == full["steps"][-1:]
    assert len(panel.source.data["cost"]) == DP
    status, api = get_json(mdata_cluster, f"mdata/api/{JOB}/trainers?last=2")
    assert (status, api["error"]) == (
        400, "?last= takes a number of steps and applies to mixture and balance, not 'trainers' with '2'")
