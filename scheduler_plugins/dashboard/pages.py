"""The route table of mdata's dashboard pages, and their registration with distributed.

distributed builds its Bokeh dashboard from the module-level ``applications`` table of
``distributed.dashboard.scheduler`` when the scheduler starts its HTTP server, which happens after
preload modules are imported. Adding our pages to that table at import time of
``scheduler_plugins.planner`` therefore puts them on the dashboard, in its "More..." menu and in
``/individual-plots.json``, which dask-labextension lists (hence the ``individual-`` names).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping

from mdata.observe.dashboard_pages import PAGES as TABLE
from mdata.observe.dashboard_pages import ROUTES
from mdata.distribution import install_hint

logger = logging.getLogger("mdata.dashboard")

#: The routes of mdata's pages (their functions: :func:`page_functions`); the table with their
#: titles and purposes is :data:`mdata.observe.dashboard_pages.PAGES`, which the driver prints from.
PAGES = ROUTES


def page_functions() -> dict[str, Callable]:
    """Each route's page function. The panels import Bokeh, the ``dashboard`` extra, so this is
    called only where a dashboard is built."""
    from scheduler_plugins.dashboard.balance import balance_doc
    from scheduler_plugins.dashboard.lineage import lineage_doc
    from scheduler_plugins.dashboard.mixture import mixture_doc
    from scheduler_plugins.dashboard.sources import sources_doc
    from scheduler_plugins.dashboard.trainers import trainers_doc
    from scheduler_plugins.dashboard.waiting import waiting_doc

    docs = {"sources": sources_doc, "mixture": mixture_doc, "balance": balance_doc,
            "trainers": trainers_doc, "waiting": waiting_doc, "lineage": lineage_doc}
    return {page.route: docs[page.title] for page in TABLE}


def register_pages(applications: MutableMapping[str, Callable] | None = None) -> list[str]:
    """Add mdata's pages to distributed's dashboard table (idempotent); returns the routes added.

    With ``applications=None`` the table is distributed's own; if its dashboard or our pages
    cannot be imported (bokeh missing, or of a version distributed refuses) nothing is registered
    and a warning says why, since the JSON routes still serve the same figures.
    """
    try:
        if applications is None:
            from distributed.dashboard.scheduler import applications
        pages = page_functions()
    except ImportError as exc:
        logger.warning("mdata dashboard pages not registered: %s (%s); /mdata/api/ still works",
                       exc, install_hint("dashboard"))
        return []
    added = [route for route in PAGES if applications.get(route) is not pages[route]]
    applications.update(pages)
    return added
