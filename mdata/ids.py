"""Compatibility alias: :class:`SampleId` lives in :mod:`mdata.lineage.ids` (and is
``mdata.SampleId``). Kept so that ``from mdata.ids import SampleId``, the path the API reference
listed, keeps working; new code imports from :mod:`mdata.lineage` or ``mdata``."""

from mdata.lineage.ids import SampleId

__all__ = ["SampleId"]
