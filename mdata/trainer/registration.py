"""Registering a plan with the cluster's Planner: one request, shared by drivers and Loaders.

A driver registers with :func:`mdata.driver.submit_job`; a Loader given ``plan=`` registers
itself on attach (``by_loader=True``: its attach, not the registration, decides a rewind, so
ranks bringing different steps get a mismatch instead of bouncing each other). Both send the
plan's spec, never a pickle, and the client's id, which makes the caller a driver of the job.
"""

from __future__ import annotations

from mdata.wire.messages import JobInfo, RegisterJobRequest, ask_sync

__all__ = ["register_plan"]


def register_plan(client, plan, *, job: str, checkpoint: dict | None, by_loader: bool = False,
                  **resume_options: bool) -> JobInfo:
    """Validate ``plan`` for delivery and register it as ``job`` (idempotent for the same plan)."""
    import mdata.wire.frames  # noqa: F401  the wire format must be known before batches arrive

    plan.validate_for_delivery()
    return ask_sync(client, RegisterJobRequest(job=job, plan=plan.to_spec(), checkpoint=checkpoint,
                                               by_loader=by_loader, client=str(client.id),
                                               **resume_options))
