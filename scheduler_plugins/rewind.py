"""A resume on a live job, built and checked before anything of the job changes.

A Loader that brings a checkpoint may rewind the whole job (:mod:`mdata.planner.roster` decides).
The new Planner state is built here from the checkpoint first: a checkpoint this job cannot
restore (other data, another mixture, a corrupt one) raises :class:`~mdata.errors.CheckpointError`
to the Loader that brought it, while the roster, the state and every other rank's generation are
untouched. Only a state that was built is handed to :meth:`JobRuntime.rewind_to`. A Loader that
joins a resume under way has its checkpoint checked against the job the same way, so a rank cannot
join with a checkpoint of other data just because its step matches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mdata import planner as ps
from mdata.checkpoint import Checkpoint
from mdata.planner.resume import plan_resume

__all__ = ["resumed_state", "check_joining"]


def _options(runtime: Any, options: "ps.ResumeOptions | None") -> "ps.ResumeOptions":
    """What the job was registered to accept on resume, and what this resume asks for."""
    return runtime.resume_options | (options or ps.ResumeOptions())


def resumed_state(runtime: Any, checkpoint: Mapping[str, Any],
                  options: "ps.ResumeOptions | None" = None) -> "ps.PlannerState":
    """The job's state continued from ``checkpoint`` (same plan, listings and cursors, so it
    replans exactly what the old state planned from that step); raises CheckpointError and
    changes nothing when the job cannot restore it."""
    return ps.PlannerState.from_checkpoint(
        runtime.plan, runtime.listings, checkpoint, job=runtime.job,
        lineage_steps=runtime.lineage_steps, options=_options(runtime, options))


def check_joining(runtime: Any, checkpoint: Mapping[str, Any],
                  options: "ps.ResumeOptions | None" = None) -> None:
    """Raise CheckpointError unless the job could restore ``checkpoint`` (a rank joining the
    generation another rank started at the same step), accepting what that start accepted."""
    plan_resume(Checkpoint.from_dict(dict(checkpoint)), runtime.plan, runtime.listings,
                _options(runtime, options) | runtime.generation_options)
