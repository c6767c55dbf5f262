"""Chaos harness: a cluster and trainers as real processes, and the faults to inflict on them.

One import point for the chaos tests; the parts live in modules with one job each:

* :mod:`fault_procs`: :class:`ClusterProcess` (``start_cluster`` in a process group of its own, so
  the whole cluster can be lost at once), finding workers by role (:func:`loader_holding_chunks`,
  :func:`constructor_worker`) and :func:`kill9`.
* :mod:`fault_trainers`: :class:`TrainerGroup` (one :mod:`fault_trainer` process per rank; kill,
  restart from checkpoints, wait for steps) and the uninterrupted :func:`reference` run.
* :mod:`fault_sequences`: what each rank trained on, compared with the reference.
* :mod:`s3_server`: an S3 server (SeaweedFS) that can crash and come back with its data.
"""

from __future__ import annotations

from fault_procs import (  # noqa: F401
    ClusterProcess, HarnessError, close_job, constructor_worker, free_port, kill9, loader_holding_chunks,
    recoveries, subprocess_env, wait_for_workers, worker_pids, workers_with,
)
from fault_sequences import (  # noqa: F401
    Received, assert_exactly_once, assert_same_sequences, exactly_once_problems, merge_incarnations,
    read_log, sequence_problems,
)
from fault_trainers import Incarnation, TrainerGroup, reference, uninterrupted_run  # noqa: F401
