"""``submit_job``: a driver registers a plan as a job (or resumes it from a checkpoint)."""

from __future__ import annotations

from mdata.trainer.checkpoints import checkpoint_of
from mdata.trainer.registration import register_plan

__all__ = ["submit_job"]


def submit_job(client, plan, *, job: str = "default", checkpoint: dict | None = None,
               accept_appended_shards: bool = False, allow_mixture_change: bool = False) -> dict:
    """Register ``plan`` as ``job`` with the cluster's Planner (idempotent for the same plan),
    optionally resuming from ``checkpoint``: the plan's placement may differ from the writer's,
    its data may not, except for shards appended to a source (``accept_appended_shards``); its
    mixture only with ``allow_mixture_change`` (docs/concepts.md, "Checkpoint and resume").

    Returns the job's info: fingerprint, mesh, and the first step trainers will receive.
    """
    return register_plan(client, plan, job=job, checkpoint=checkpoint_of(checkpoint),
                         accept_appended_shards=accept_appended_shards,
                         allow_mixture_change=allow_mixture_change).to_msg()

