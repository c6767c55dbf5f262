"""mdata's dashboard pages in a real headless Chromium while a job runs.

Four trainer threads (DP 2 x CP 2) consume steps with a short simulated compute time; meanwhile
the browser opens every ``/individual-mdata-*`` page, waits for Bokeh to render it, saves a
screenshot, and reads the page's data sources through the Bokeh document (``Bokeh.documents``) to
check that the plots hold the job's data, not only that the page answered. On the lineage page it
types a sample id into the input and waits for the story table to fill.

Needs Debian's ``chromium`` and ``chromium-driver`` (``bash scripts/setup.sh`` installs them when
run as root); the test is skipped, saying so, where they are missing.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time

import pytest

from mdata.driver import submit_job
from mdata.trainer import Loader
from mdata.driver.demo import demo_plan

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

JOB = "browser"
DP, CP = 2, 2
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--window-size=1400,1000")

# Column lengths of every named ColumnDataSource in the page's Bokeh document, and a few columns
# the checks read. BokehJS stores a source's data as a Map in recent versions, a plain object before.
READ_SOURCES = """
const doc = (window.Bokeh && Bokeh.documents.length) ? Bokeh.documents[0] : null;
if (doc === null) return null;
const out = {};
for (const model of doc.all_models) {
  if (!model.name || !model.name.startsWith("mdata-") || !("data" in model)) continue;
  const data = model.data;
  const get = (k) => data instanceof Map ? data.get(k) : data[k];
  const keys = data instanceof Map ? Array.from(data.keys()) : Object.keys(data);
  const columns = {};
  const plain = (v) => typeof v === "object" && v !== null ? Array.from(v) : v;
  for (const k of keys) columns[k] = Array.from(get(k) ?? [], plain);
  out[model.name] = {length: model.get_length() ?? 0, columns: columns};
}
return out;
"""

# The text input of the lineage page lives inside nested shadow roots of Bokeh's layout views.
FIND_INPUT = """
function find(root) {
  for (const el of root.querySelectorAll("*")) {
    if (el.tagName === "INPUT" && el.type === "text") return el;
    if (el.shadowRoot) { const hit = find(el.shadowRoot); if (hit) return hit; }
  }
  return null;
}
return find(document);
"""


# The page's header (title, purpose, links to the other pages) as its Bokeh Div holds it.
READ_HEADER = """
const doc = (window.Bokeh && Bokeh.documents.length) ? Bokeh.documents[0] : null;
if (doc === null) return null;
for (const model of doc.all_models) if (model.name === "mdata-page-header") return model.text;
return null;
"""

# The rendered link to another page, inside the nested shadow roots of Bokeh's layout views.
FIND_LINK = """
const href = arguments[0];
function find(root) {
  for (const el of root.querySelectorAll("*")) {
    if (el.tagName === "A" && el.getAttribute("href") === href) return el;
    if (el.shadowRoot) { const hit = find(el.shadowRoot); if (hit) return hit; }
  }
  return null;
}
return find(document);
"""


def _binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("chromium and chromedriver are not installed: run `bash scripts/setup.sh` as root "
                    "(it installs Debian's chromium and chromium-driver) to run the browser test")
    return chromium, driver


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = _binaries()
    options = Options()
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.binary_location = chromium
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def running_job(example_corpus):
    """An embedded cluster with a job whose four trainer ranks keep consuming until stopped."""
    from distributed import Client

    from mdata.driver import start_cluster
    from mdata.data.example import example_sources

    logging.getLogger("distributed").setLevel(logging.WARNING)
    sources = example_sources(example_corpus)
    plan = demo_plan(sources, dp=DP, cp=CP, global_batch=16, max_tokens=4096)
    stop = threading.Event()
    consumed: dict[int, int] = {}
    errors: list[BaseException] = []
    with start_cluster(sources, dashboard_address=":0") as cluster:
        with Client(cluster.scheduler_address, set_as_default=False) as client:
            submit_job(client, plan, job=JOB)

        def trainer(rank: int) -> None:
            try:
                with Loader(cluster.scheduler_address, job=JOB, rank=rank, world_size=DP * CP,
                            timeout=60) as loader:
                    for batch in loader:
                        consumed[rank] = batch["step"] + 1
                        if stop.wait(0.15):  # simulated compute; the job runs until told to stop
                            return
            except BaseException as exc:  # noqa: BLE001 - reported by the test below
                errors.append(exc)

        threads = [threading.Thread(target=trainer, args=(r,), daemon=True) for r in range(DP * CP)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while min(consumed.values(), default=0) < 2 and not errors and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            yield {"cluster": cluster, "names": [s.name for s in sources], "consumed": consumed,
                   "errors": errors}
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    assert not errors, errors


def wait_for_sources(browser, ready, what: str, timeout: float = 30.0) -> dict:
    """Poll the page's Bokeh document until ``ready(sources)`` holds; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    sources = None
    while time.monotonic() < deadline:
        sources = browser.execute_script(READ_SOURCES)
        if sources and ready(sources):
            return sources
        time.sleep(0.25)
    pytest.fail(f"{what}: the Bokeh document never held the job's data; last seen: {sources}")


def screenshot(browser, shots, name: str) -> None:
    time.sleep(0.5)  # let the canvas paint what the sources hold
    path = shots / f"{name}.png"
    assert browser.save_screenshot(str(path)) and path.stat().st_size > 10_000


def open_page(browser, running_job, route: str, ready, shots) -> dict:
    """Open ``route``, wait until its data is there, screenshot it, return its sources."""
    base = running_job["cluster"].dashboard_link.rsplit("/", 1)[0]
    browser.get(base + route)
    sources = wait_for_sources(browser, ready, route)
    screenshot(browser, shots, route.strip("/"))
    assert not running_job["errors"], running_job["errors"]
    return sources


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    return tmp_path_factory.mktemp("dashboard-screenshots")


def test_sources_page_plots_every_source(browser, running_job, shots):
    names = running_job["names"]
    data = open_page(browser, running_job, "/individual-mdata-sources",
                     lambda s: s.get("mdata-sources", {}).get("length") == len(names)
                     and all(len(xs) >= 2 for xs in s.get("mdata-sources-rate", {})
                             .get("columns", {}).get("xs", [[]]))
                     and s.get("mdata-sources-demand", {}).get("length") == len(names), shots)
    columns = data["mdata-sources"]["columns"]
    assert columns["source"] == names
    assert all(n > 0 for n in columns["loaded_samples"])
    assert all(w >= 1 for w in columns["pool_workers"])  # the autoscaler sizes the default pools
    # the plots are time series with a line per source that holds loads, not an empty 0-1 axis
    rate = data["mdata-sources-rate"]["columns"]
    assert rate["source_name"] == names
    assert any(y > 0 for ys in rate["ys"] for y in ys)
    assert data["mdata-sources-workers"]["columns"]["source_name"] == names


def test_mixture_page_plots_target_and_realized_lines(browser, running_job, shots):
    names = running_job["names"]
    data = open_page(browser, running_job, "/individual-mdata-mixture",
                     lambda s: s.get("mdata-mixture-lines", {}).get("length") == 3 * len(names)
                     and len(s["mdata-mixture-lines"]["columns"]["xs"][0]) >= 2, shots)
    columns = data["mdata-mixture-lines"]["columns"]
    assert columns["kind"] == ["target", "realized", "cumulative"] * len(names)
    assert columns["source_name"] == [n for n in names for _ in range(3)]
    for xs, ys in zip(columns["xs"], columns["ys"]):
        assert xs == list(range(len(xs))) and len(ys) == len(xs)
        assert all(0.0 <= y <= 1.0 for y in ys)


def test_balance_page_plots_every_rank_and_the_lower_bound(browser, running_job, shots):
    data = open_page(browser, running_job, "/individual-mdata-balance",
                     lambda s: s.get("mdata-balance-steps", {}).get("length", 0) >= 2, shots)
    steps = data["mdata-balance-steps"]
    ranks = data["mdata-balance-ranks"]
    assert ranks["length"] == DP * steps["length"]
    assert ranks["columns"]["rank"] == [0, 1] * steps["length"]
    assert all(r >= 1.0 for r in steps["columns"]["max_over_lower_bound"])


def test_trainers_page_plots_every_rank(browser, running_job, shots):
    data = open_page(browser, running_job, "/individual-mdata-trainers",
                     lambda s: s.get("mdata-trainers", {}).get("length") == DP * CP
                     and min(s["mdata-trainers"]["columns"]["steps_consumed"]) >= 2, shots)
    columns = data["mdata-trainers"]["columns"]
    assert columns["rank"] == ["0", "1", "2", "3"]
    assert data["mdata-trainers-steps"]["length"] == DP * CP


def test_every_page_has_its_title_and_links_to_every_other_page(browser, running_job, shots):
    """Each page says which it is and links to every other: following the links from the first
    page visits them all, each titled (the browser's tab and the page's own header)."""
    from mdata.observe.dashboard_pages import PAGES

    base = running_job["cluster"].dashboard_link.rsplit("/", 1)[0]
    browser.get(base + PAGES[0].route)
    for page, following in zip(PAGES, (*PAGES[1:], None)):
        deadline = time.monotonic() + 30
        text = None
        while text is None and time.monotonic() < deadline:
            text = browser.execute_script(READ_HEADER)
            time.sleep(0.2)
        assert browser.current_url == base + page.route
        assert browser.title == f"mdata: {page.title}"
        assert text is not None and f"mdata: {page.title}</div>" in text, text
        for other in PAGES:
            assert (f'href="{other.route.lstrip("/")}"' in text) == (other is not page), other
        if following is not None:  # click through to the next page, as a user would
            link = browser.execute_script(FIND_LINK, following.route.lstrip("/"))
            assert link is not None, f"no link to {following.title} on {page.title}"
            link.click()
            deadline = time.monotonic() + 30
            while browser.current_url != base + following.route and time.monotonic() < deadline:
                time.sleep(0.1)


def test_waiting_page_plots_every_ranks_waits_and_their_sources(browser, running_job, shots):
    names = running_job["names"]
    data = open_page(browser, running_job, "/individual-mdata-waiting",
                     lambda s: s.get("mdata-waiting-ranks", {}).get("length") == DP * CP
                     and min(len(xs) for xs in s["mdata-waiting-ranks"]["columns"]["xs"]) >= 2, shots)
    ranks = data["mdata-waiting-ranks"]["columns"]
    assert ranks["rank"] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert all(y >= 0 for ys in ranks["ys"] for y in ys)
    blamed = set(data["mdata-waiting-waits"]["columns"]["source_name"])
    assert blamed <= {*names, "(too short to blame)", "(unknown)"}, blamed


def test_lineage_page_tells_a_typed_sample_story(browser, running_job, shots):
    from selenium.webdriver.common.keys import Keys

    from distributed import Client

    with Client(running_job["cluster"].scheduler_address, set_as_default=False) as client:
        lineage = client.sync(client.scheduler.mdata_lineage, job=JOB, steps=1)
    source_index, shard, row = lineage["samples"]["0"]["0"][0]  # step 0 is consumed: a full story
    sample_id = f"{running_job['names'][source_index]}/{shard}/{row}"
    open_page(browser, running_job, "/individual-mdata-lineage",
              lambda s: "mdata-lineage-story" in s, shots)
    box = browser.execute_script(FIND_INPUT)
    assert box is not None
    # the page fills the example on a refresh when the Planner is not mid-step (it reads lineage)
    deadline = time.monotonic() + 20
    while not box.get_attribute("placeholder").startswith("e.g. ") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert box.get_attribute("placeholder").startswith("e.g. ")
    box.send_keys(sample_id + Keys.ENTER)
    data = wait_for_sources(browser, lambda s: s["mdata-lineage-story"]["length"] >= 4,
                            f"the story of {sample_id}")
    columns = data["mdata-lineage-story"]["columns"]
    assert columns["event"][0] == "loaded"
    assert columns["event"][-3:] == ["planned", "delivered", "consumed"]
    planned = columns["event"].index("planned")
    assert (columns["step"][planned], columns["dp_rank"][planned]) == ("0", "0")
    assert columns["ranks"][-1] == "0, 1"  # DP rank 0 = ranks 0 and 1 with CP 2
    screenshot(browser, shots, "individual-mdata-lineage-story")
