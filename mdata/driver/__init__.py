"""Driver side: code that starts clusters, submits jobs and watches them (scripts, notebooks, CLI).

``start_cluster`` runs an embedded cluster with one worker pool per source group,
``PoolAutoscaler`` resizes those pools from the Planner's decisions through ``WorkerGroups`` (on by
default in embedded clusters), ``submit_job`` registers a plan,
and ``JobHandle`` answers questions about a running job. The demo and ``mdata cluster up``
(:mod:`mdata.driver.cluster_up`, with its live lines: :mod:`mdata.driver.progress`) live here too.

Where this runs and how a step flows through it: docs/dev/architecture.md.
"""

from mdata.driver.autoscale import EmbeddedGroups, PoolAutoscaler, WorkerGroups
from mdata.driver.cluster import MdataCluster, PoolSpec, default_pools, layout_pools, start_cluster
from mdata.driver.cluster_up import cluster_up_cli
from mdata.driver.job import JobHandle, Occurrence, SampleStory
from mdata.driver.submit import submit_job

__all__ = ["MdataCluster", "PoolAutoscaler", "WorkerGroups", "EmbeddedGroups", "PoolSpec",
           "cluster_up_cli", "default_pools", "layout_pools", "start_cluster", "JobHandle",
           "Occurrence", "SampleStory", "submit_job"]
