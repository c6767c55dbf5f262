"""The table of mdata's dashboard pages: route, title, purpose; and their full URLs.

One table serves both sides of the process split. The scheduler side
(``scheduler_plugins/dashboard/pages.py``) registers a Bokeh page per route and draws each page's
title and the links to the others from it; the driver side (``mdata cluster up``, ``mdata demo``,
:attr:`mdata.driver.MdataCluster.dashboard_links`) prints the URLs from it. The driver must not
import the scheduler's code (nor Bokeh, an optional extra), so the table lives here, pure.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DashboardPage", "PAGES", "ROUTES", "dashboard_base", "page_urls", "page_lines"]


@dataclass(frozen=True)
class DashboardPage:
    """One page: its route on the scheduler's dashboard, its title, what it answers."""

    route: str
    title: str
    purpose: str


#: Every mdata page, in the order the pages' navigation and the printed links list them.
PAGES: tuple[DashboardPage, ...] = (
    DashboardPage("/individual-mdata-sources", "sources",
                  "loads, backlog and pool sizes per source, and why each pool has its size"),
    DashboardPage("/individual-mdata-mixture", "mixture",
                  "each source's realized weight against its target, per step and cumulative"),
    DashboardPage("/individual-mdata-balance", "balance",
                  "each DP rank's cost per step against the lower bound"),
    DashboardPage("/individual-mdata-trainers", "trainers",
                  "steps consumed per rank and the prefetchers' waits for batches"),
    DashboardPage("/individual-mdata-waiting", "waiting",
                  "is training waiting on data, on which rank, on which source?"),
    DashboardPage("/individual-mdata-lineage", "lineage",
                  "one sample's story: loaded, planned, delivered, consumed"),
)

#: The routes alone, in table order.
ROUTES: tuple[str, ...] = tuple(page.route for page in PAGES)


def dashboard_base(dashboard_link: str) -> str:
    """The dashboard's root URL from the link Dask prints (``http://host:8787/status``); a link
    with a prefix (``.../dask/status``) keeps it, since the pages live under the same prefix."""
    return dashboard_link.rstrip("/").removesuffix("/status")


def page_urls(dashboard_link: str) -> dict[str, str]:
    """Each page's full URL by title, in table order."""
    base = dashboard_base(dashboard_link)
    return {page.title: base + page.route for page in PAGES}


def page_lines(dashboard_link: str | None) -> list[str]:
    """The lines that list the pages where a dashboard link is printed, one per page:
    ``mdata <title>: <url>  (<purpose>)``; none without a dashboard."""
    if not dashboard_link:
        return []
    urls = page_urls(dashboard_link)
    return [f"mdata {page.title}: {urls[page.title]}  ({page.purpose})" for page in PAGES]
