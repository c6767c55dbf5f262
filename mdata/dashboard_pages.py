"""Compatibility alias: the table of dashboard pages lives in
:mod:`mdata.observe.dashboard_pages`. Kept so that ``mdata.dashboard_pages.page_urls(link)`` in
existing scripts keeps working; new code imports from :mod:`mdata.observe`."""

from mdata.observe.dashboard_pages import PAGES, ROUTES, DashboardPage, dashboard_base, page_lines, page_urls

__all__ = ["DashboardPage", "PAGES", "ROUTES", "dashboard_base", "page_urls", "page_lines"]
