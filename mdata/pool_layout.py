"""Compatibility alias: the offline pool layout lives in :mod:`mdata.pools.layout`. Kept so
that ``from mdata.pool_layout import layout_for_plan`` in existing scripts and notebooks keeps
working; new code imports from :mod:`mdata.pools`."""

from mdata.pools.layout import (
    LayoutPool, PoolLayout, amdahl_speedup, compute_layout, fit_layout, layout_for_plan, layout_table,
    peak_stage, source_cost_class,
)

__all__ = ["LayoutPool", "PoolLayout", "compute_layout", "fit_layout", "layout_for_plan", "peak_stage",
           "source_cost_class", "amdahl_speedup"]
