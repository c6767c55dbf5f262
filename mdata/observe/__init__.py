"""What the dashboard shows, worked out purely: counters, the ledger of data waits, the pages.

- :mod:`~mdata.observe.meters`: per-source loads, backlog and throughput (:class:`SourceMeter`,
  its history over a run :class:`LoadHistory`) and per-rank waits and consumption
  (:class:`TrainerMeter`), which the scheduler's job runtime feeds as it carries the plan out.
- :mod:`~mdata.observe.data_waits`: the training loops' exposed waits per rank and step, each
  blamed on a source (:class:`DataWaitLedger`).
- :mod:`~mdata.observe.dashboard_pages`: the table of mdata's dashboard pages (route, title,
  purpose) that the scheduler registers and the driver prints (:func:`page_urls`).

Nothing here decides anything the Planner does; each piece only watches, with the clock passed
in, so it is tested without a cluster. The scheduler's pages draw from them
(``scheduler_plugins/dashboard/``). Names are imported on first use.
"""

from typing import TYPE_CHECKING

from mdata.lazy_exports import lazy_exports

#: Where each public name lives (imported on first use, PEP 562).
_HOMES = {
    "SourceMeter": "meters",
    "SourceFigures": "meters",
    "LoadHistory": "meters",
    "TrainerMeter": "meters",
    "TrainerFigures": "meters",
    "DataWait": "data_waits",
    "DataWaitLedger": "data_waits",
    "DashboardPage": "dashboard_pages",
    "PAGES": "dashboard_pages",
    "page_urls": "dashboard_pages",
    "page_lines": "dashboard_pages",
}

if TYPE_CHECKING:
    from mdata.observe.dashboard_pages import PAGES, DashboardPage, page_lines, page_urls
    from mdata.observe.data_waits import DataWait, DataWaitLedger
    from mdata.observe.meters import LoadHistory, SourceFigures, SourceMeter, TrainerFigures, TrainerMeter


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)


__all__ = sorted(_HOMES)
