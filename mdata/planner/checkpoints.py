"""Checkpoints of a :class:`~mdata.planner.state.PlannerState`: taking one, and resuming from one.

A checkpoint of step ``s`` describes what trainers consumed (every step before ``s``), never how
far ahead the Planner ran: it uses the snapshots taken when ``s`` was apportioned (the sources'
final cursors and the apportioner's carries before ``s``) and the weights a stateful mixture
already decided for steps from ``s`` on, so a resumed job plans exactly the same samples. It
records the job's data identity and mixture too, which a resume checks
(:mod:`mdata.planner.resume` says what may change). The format is
:class:`~mdata.checkpoint.Checkpoint`'s.

The state passes the parts a checkpoint reads or restores (its progress, cursors, planned steps
and :class:`~mdata.planner.apportion.Provisioner`), not itself: this module sits below the state
that uses it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mdata.checkpoint import Checkpoint
from mdata.errors import CheckpointError
from mdata.identity import DataIdentity, listing_entries
from mdata.planner.apportion import PlannedStep, Provisioner
from mdata.planner.resume import Resume, identity_digest, schedule_description

__all__ = ["JobIdentity", "take_checkpoint", "restore_checkpoint", "as_checkpoint"]


@dataclass(frozen=True, eq=False)
class JobIdentity:
    """What every checkpoint of a job records about the job, computed once: the plan's
    fingerprint, the data identity (listings and their growths included), the mixture's config,
    each source's ``(shard name, rows)`` entries, and the digest a light checkpoint keeps."""

    plan_fingerprint: str
    data: DataIdentity
    data_dict: Mapping[str, Any]
    schedule: Any
    entries: Mapping[str, tuple[tuple[str, int], ...]]
    digest: str

    @classmethod
    def of(cls, plan: Any, listings: Mapping[str, Any],
           appended: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> "JobIdentity":
        entries = {n: listing_entries(listings[n]) for n in plan.source_names}
        data = DataIdentity.of(plan, entries, appended)
        schedule = schedule_description(plan)
        return cls(plan.fingerprint(), data, data.to_dict(), schedule, entries,
                   identity_digest(data, schedule))

    def job_data(self) -> dict[str, Any]:
        """What a Loader adds to the light checkpoints of this job (see :mod:`mdata.checkpoint`)."""
        return {"identity": self.digest, "data": dict(self.data_dict), "schedule": self.schedule,
                "listings": self.listings()}

    def listings(self) -> dict[str, list[list[Any]]]:
        """``{source: [[shard name, rows], ...]}``: what a stored checkpoint carries."""
        return {n: [[name, rows] for name, rows in e] for n, e in self.entries.items()}


def as_checkpoint(checkpoint: Checkpoint | Mapping[str, Any]) -> Checkpoint:
    return checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint.from_dict(checkpoint)


def take_checkpoint(step: int, *, identity: JobIdentity, provisioner: Provisioner,
                    steps: Mapping[int, PlannedStep], cursors: np.ndarray, consumed: int,
                    balanced: int, planned: int, seed: Any, with_listings: bool = False,
                    light: bool = False) -> Checkpoint:
    """The checkpoint as of having consumed every step before ``step`` (see the module docstring);
    ``with_listings``: add every shard's name and row count (what a stored checkpoint needs to
    name a changed shard); ``light``: the form that travels with batches, without what is the same
    for every step of the job (see :mod:`mdata.checkpoint`).

    The job's parts: its ``identity``, ``provisioner``, planned ``steps``, ``cursors`` after the
    last balanced step, its progress (``consumed``, ``balanced``, ``planned``: the first step not
    consumed, balanced, apportioned) and the plan's ``seed``."""
    if not consumed <= step <= balanced:
        raise CheckpointError(
            f"can checkpoint steps {consumed}..{balanced} (consumed by "
            f"every group .. planned), not step {step}; checkpoint after consuming step-1"
        )
    if step < planned:
        st = steps[step]
        cursors, carry = st.cursors_before, st.carry_before
    else:
        carry = provisioner.apportioner.carry
    if cursors is None:  # cannot happen while balanced_step >= step; kept as a typed error
        raise CheckpointError(f"no cursor snapshot for step {step}")
    names = provisioner.names
    weights = {t: steps[t].weights for t in range(step, planned)}
    # a checkpoint is built for every balanced step, with figures per source: whole arrays at
    # once (at 10,000 sources a value at a time was most of its cost), the same numbers
    at = [int(c) for c in cursors] if not isinstance(cursors, np.ndarray) else cursors.astype(np.int64).tolist()
    ckpt = Checkpoint(
        fingerprint=identity.plan_fingerprint,
        step=int(step),
        sources=names,
        cursors=dict(zip(names, at)),
        epochs=dict(zip(names, _epochs(provisioner.orders, at))),
        apportioner={"carry": np.asarray(carry, dtype=np.float64).tolist()},
        seed=seed,
        mixture=provisioner.mixture_state(step, weights),
        data=identity.data_dict,
        schedule=identity.schedule,
        listings=identity.listings() if with_listings else None,
        identity=identity.digest,
    )
    return ckpt.light() if light else ckpt


def _epochs(orders, cursors: list[int]) -> list[int]:
    """Each source's epoch at its cursor (``SourceOrder.epoch_of``), by one division for all
    when no source had shards appended (then an epoch is ``num_rows`` positions)."""
    if any(o.appended for o in orders):
        return [o.epoch_of(c) for o, c in zip(orders, cursors)]
    rows = np.fromiter((o.num_rows for o in orders), np.int64, len(orders))
    if not rows.all():  # an empty source: as epoch_of answers it
        return [o.epoch_of(c) for o, c in zip(orders, cursors)]
    return (np.asarray(cursors, np.int64) // rows).tolist()


def restore_checkpoint(provisioner: Provisioner, checkpoint: Checkpoint | Mapping[str, Any],
                       resume: Resume | None = None) -> tuple[int, np.ndarray]:
    """Make a fresh job's ``provisioner`` continue where ``checkpoint`` left off; returns the
    step the job continues from (consumed, balanced and apportioned up to it) and each source's
    cursor there.

    ``resume`` is what :func:`~mdata.planner.resume.plan_resume` decided (the job must have
    been built with its listing growths); with a changed mixture the apportioner starts afresh
    and the old mixture's state is dropped, so the new weights hold exactly from the first step.
    """
    ckpt = as_checkpoint(checkpoint)
    resume = resume if resume is not None else Resume()
    names = provisioner.names
    if tuple(ckpt.sources) != tuple(names):
        raise CheckpointError(
            f"checkpoint sources {list(ckpt.sources)} differ from the plan's {list(names)}")
    cursors = np.array([ckpt.cursors[n] for n in names], np.int64)
    if resume.mixture_changed:
        provisioner.restore(cursors, {"carry": [0.0] * len(names)}, {})
    else:
        provisioner.restore(cursors, ckpt.apportioner, ckpt.mixture)
    return ckpt.step, cursors
