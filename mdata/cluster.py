"""Compatibility alias: cluster start-up and pool scaling live in :mod:`mdata.driver`. Kept so
that ``from mdata.cluster import start_cluster`` in existing driver scripts keeps working."""

from mdata.driver import MdataCluster, PoolAutoscaler, PoolSpec, default_pools, start_cluster

__all__ = ["MdataCluster", "PoolAutoscaler", "PoolSpec", "default_pools", "start_cluster"]
