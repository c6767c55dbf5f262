"""Checkpoints of a :class:`~mdata.planner.state.PlannerState`: taking one, and resuming from one.

A checkpoint of step ``s`` describes what trainers consumed (every step before ``s``), never how
far ahead the Planner ran: it uses the snapshots taken when ``s`` was apportioned (the sources'
final cursors and the apportioner's carries before ``s``) and the weights a stateful mixture
already decided for steps from ``s`` on, so a resumed job plans exactly the same samples. The
format is :class:`~mdata.checkpoint.Checkpoint`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from mdata.checkpoint import Checkpoint
from mdata.errors import CheckpointError

if TYPE_CHECKING:  # pragma: no cover
    from mdata.planner.state import PlannerState

__all__ = ["take_checkpoint", "restore_checkpoint"]


def take_checkpoint(state: PlannerState, step: int) -> Checkpoint:
    """The checkpoint as of having consumed every step before ``step`` (see the module docstring)."""
    if not state.consumed_step <= step <= state.balanced_step:
        raise CheckpointError(
            f"can checkpoint steps {state.consumed_step}..{state.balanced_step} (consumed by "
            f"every group .. planned), not step {step}; checkpoint after consuming step-1"
        )
    if step < state.planned_step:
        st = state.steps[step]
        cursors, carry = st.cursors_before, st.carry_before
    else:
        cursors, carry = state.cursors, state.provisioner.apportioner.carry
    if cursors is None:  # cannot happen while balanced_step >= step; kept as a typed error
        raise CheckpointError(f"no cursor snapshot for step {step}")
    names, plan = state.names, state.plan
    planned = {t: state.steps[t].weights for t in range(step, state.planned_step)}
    return Checkpoint(
        fingerprint=plan.fingerprint(),
        step=int(step),
        sources=names,
        cursors={n: int(c) for n, c in zip(names, cursors)},
        epochs={n: int(c) // o.num_rows for n, c, o in zip(names, cursors, state.orders)},
        apportioner={"carry": [float(x) for x in carry]},
        seed=plan.seed_value,
        mixture=state.provisioner.mixture_state(step, planned),
    )


def restore_checkpoint(state: PlannerState, checkpoint: Checkpoint | Mapping[str, Any]) -> None:
    """Make a fresh ``state`` (nothing handled yet) continue exactly where ``checkpoint`` left off.

    Raises :class:`~mdata.errors.CheckpointError` if the checkpoint belongs to another plan.
    """
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint.from_dict(checkpoint)
    ckpt.check_plan(state.plan.fingerprint(), state.names)
    if state.planned_step or state.log:
        raise CheckpointError("restore a checkpoint into a fresh PlannerState, before any event")
    state.consumed_step = state.balanced_step = state.planned_step = ckpt.step
    state.cursors = np.array([ckpt.cursors[n] for n in state.names], np.int64)
    state.provisioner.restore(state.cursors, ckpt.apportioner, ckpt.mixture)
