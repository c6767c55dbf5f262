"""Pools that size themselves: the offline layout against simple layouts, and a mixture shift.

Two halves, each its own module so it can run alone (``python benchmarks/pools_partition.py``,
``python benchmarks/pools_shift.py``):

* :mod:`benchmarks.pools_partition`: ``pools.partition_vs_best``, steps/s at equal loader cores of
  the layout computed from a profile (``mdata.pools.layout``) over the best of one pool per source
  and all sources in one pool, on native-size wallpapers mixed with cheap text.
* :mod:`benchmarks.pools_shift`: a schedule moving from text-heavy to image-heavy mid-run on an
  embedded cluster with autoscaling on: ``pools.converge_intervals``,
  ``pools.stall_fraction_during_shift`` and ``pools.cores_over_demand``.
"""

from __future__ import annotations

from benchmarks import pools_partition, pools_shift

__all__ = ["run"]


def run(quick: bool) -> dict:
    figures = dict(pools_partition.run(quick=quick))
    figures.update(pools_shift.run(quick=quick))
    return figures
