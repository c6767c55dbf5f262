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

from scheduler_plugins.dashboard.balance import balance_doc
from scheduler_plugins.dashboard.lineage import lineage_doc
from scheduler_plugins.dashboard.mixture import mixture_doc
from scheduler_plugins.dashboard.sources import sources_doc
from scheduler_plugins.dashboard.trainers import trainers_doc

logger = logging.getLogger("mdata.dashboard")

PAGES: dict[str, Callable] = {
    "/individual-mdata-sources": sources_doc,
    "/individual-mdata-mixture": mixture_doc,
    "/individual-mdata-balance": balance_doc,
    "/individual-mdata-trainers": trainers_doc,
    "/individual-mdata-lineage": lineage_doc,
}


def register_pages(applications: MutableMapping[str, Callable] | None = None) -> list[str]:
    """Add mdata's pages to distributed's dashboard table (idempotent); returns the routes added.

    With ``applications=None`` the table is distributed's own; if its dashboard cannot be imported
    (bokeh missing or of a version distributed refuses) nothing is registered and a warning says
    why, since the JSON routes still serve the same figures.
    """
    if applications is None:
        try:
            from distributed.dashboard.scheduler import applications
        except ImportError as exc:
            logger.warning("mdata dashboard pages not registered: %s; /mdata/api/ still works", exc)
            return []
    added = [route for route in PAGES if applications.get(route) is not PAGES[route]]
    applications.update(PAGES)
    return added
