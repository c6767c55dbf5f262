"""Lineage: where every sample came from and where it went, kept in memory and spilled to files.

- :class:`SampleId` (:mod:`~mdata.lineage.ids`): a sample's name, ``(source, shard, row)``,
  stable across runs, processes and cluster sizes.
- :class:`DGraph` (:mod:`~mdata.lineage.dgraph`): the lineage of every planned sample in columnar
  numpy tables (:class:`ColumnTable`, :mod:`~mdata.lineage.column_table`), its stories and the
  exactly-once check; :mod:`~mdata.lineage.events` builds a story's events from rows, for the
  DGraph and for spilled files alike.
- :mod:`~mdata.lineage.spill`: lineage older than the DGraph's retention, in Parquet files read
  back into the same stories; :mod:`~mdata.lineage.limits`: how much of it a job may hold, and
  what it says when some had to go.
- :mod:`~mdata.lineage.sample_lookup`: why a sample has no story (it does not exist, or it was
  not planned yet).

All pure (the spilled files are written by ``scheduler_plugins/lineage_store.py``, a thread on
the scheduler). Names are imported on first use: ``import mdata`` needs :class:`SampleId` only,
and the spill's pyarrow stays out of processes that never read lineage files.
"""

from typing import TYPE_CHECKING

from mdata.lazy_exports import lazy_exports

#: Where each public name lives (imported on first use, PEP 562).
_HOMES = {
    "SampleId": "ids",
    "ColumnTable": "column_table",
    "DGraph": "dgraph",
    "ExactlyOnceReport": "dgraph",
    "LineageSegment": "events",
}

if TYPE_CHECKING:
    from mdata.lineage.column_table import ColumnTable
    from mdata.lineage.dgraph import DGraph, ExactlyOnceReport
    from mdata.lineage.events import LineageSegment
    from mdata.lineage.ids import SampleId


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)


__all__ = sorted(_HOMES)
