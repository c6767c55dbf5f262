"""The one table of mdata's dashboard pages, and the links printed from it.

The driver prints from ``mdata.observe.dashboard_pages`` and the scheduler registers and links its pages
from the same table; these tests pin the URLs a user is shown and that both sides list the same
pages (the scheduler side's route table is checked without Bokeh: it is the table's routes).
"""

from __future__ import annotations

from mdata.observe.dashboard_pages import PAGES, ROUTES, dashboard_base, page_lines, page_urls
from mdata.driver.cluster_up import MDATA_PAGES, dashboard_lines


def test_every_page_has_a_route_title_and_purpose_and_the_waiting_page_is_one():
    assert len({p.route for p in PAGES}) == len({p.title for p in PAGES}) == len(PAGES)
    assert all(p.route == f"/individual-mdata-{p.title}" and p.purpose for p in PAGES)
    assert "/individual-mdata-waiting" in ROUTES
    assert ROUTES == tuple(p.route for p in PAGES)


def test_page_urls_from_the_link_dask_prints_keep_host_and_prefix():
    assert dashboard_base("http://127.0.0.1:8787/status") == "http://127.0.0.1:8787"
    assert dashboard_base("https://proxy/dask/status") == "https://proxy/dask"
    urls = page_urls("http://127.0.0.1:8787/status")
    assert list(urls) == [p.title for p in PAGES]
    assert urls["waiting"] == "http://127.0.0.1:8787/individual-mdata-waiting"


def test_cluster_up_prints_a_line_per_page_after_the_dashboard():
    lines = dashboard_lines("tcp://127.0.0.1:8786", "http://127.0.0.1:8787/status")
    assert lines[:2] == ["scheduler: tcp://127.0.0.1:8786", "dashboard: http://127.0.0.1:8787/status"]
    assert lines[2:] == page_lines("http://127.0.0.1:8787/status")
    for line, page in zip(lines[2:], PAGES):
        key, _, rest = line.partition(": ")
        assert key == f"mdata {page.title}"
        assert rest == f"http://127.0.0.1:8787{page.route}  ({page.purpose})"
    assert MDATA_PAGES == tuple(p.title for p in PAGES)
    assert dashboard_lines("tcp://h:1", None) == ["scheduler: tcp://h:1"]
