"""Compatibility alias: per-pool worker targets live in :mod:`mdata.pools.scaling`. Kept so
that ``mdata.pool_scaling.pool_targets`` in existing driver code keeps working; new code imports
from :mod:`mdata.pools`."""

from mdata.pools.scaling import PoolDecision, as_decision, merge_jobs, pool_targets

__all__ = ["PoolDecision", "pool_targets", "merge_jobs", "as_decision"]
