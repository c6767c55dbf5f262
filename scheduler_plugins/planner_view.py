"""What the scheduler's event loop may read of a job's Planner state, and how.

:class:`~scheduler_plugins.job_runtime.JobRuntime` applies events to the pure ``PlannerState`` in
a thread (``asyncio.to_thread``) while it holds the job's ``asyncio.Lock``; the state changes
throughout. Handlers and dashboard pages run on the event loop at the same time, so each read
follows one of two rules, chosen by what the reader needs:

* **Small, frequent reads come from a snapshot.** A :class:`PlannerView` is built in the planning
  thread right after each ``handle``, still under the lock, and published on the loop by replacing
  one attribute (``JobRuntime.view``). Counters (status, the dashboard's progress line, a job's
  start step) and the checkpoint every batch-location reply carries are read from it, so a
  trainer's long poll never queues behind a planning step, and the checkpoint of step ``s + 1`` is
  computed once, when step ``s`` is balanced, instead of once per trainer rank (a thousand ranks:
  a thousand fewer per step, and every rank of a step gets the identical checkpoint).
* **The DGraph and arbitrary checkpoints are read under the lock.** The lineage graph (stories,
  lineage, the dashboard's lineage panel) is large and grows every step: copying it after each
  ``handle`` would cost more than the planning itself, and it is read rarely. Those reads take the
  lock (``JobRuntime.read_state``), or run synchronously on the loop after checking that the lock
  is free (nothing can take it before a synchronous read ends). So does a checkpoint of any step
  the view does not hold (``mdata_checkpoint``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from mdata.errors import CheckpointError
from mdata.wire.packed_checkpoint import PackedCheckpoint

__all__ = ["PlannerView"]


@dataclass(frozen=True)
class PlannerView:
    """An immutable snapshot of one job's Planner after a ``handle`` (see the module docstring).

    ``checkpoints`` maps step ``s + 1`` to the checkpoint dict (``Checkpoint.to_dict()``, the light
    form: the Loader adds the job's data) of having consumed step ``s``, for every balanced step
    ``s`` not yet consumed by every group. The dicts are shared by every reply that carries them
    and never modified.
    """

    names: tuple[str, ...]
    planned_step: int
    balanced_step: int
    consumed_step: int
    chunks_loaded: int
    truncated: int
    skipped: Mapping[str, int]
    checkpoints: Mapping[int, Mapping[str, Any]]
    #: chunks quarantined by sources with on_corrupt="skip" (mdata.planner.quarantine)
    quarantined: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, state: Any, previous: "PlannerView | None" = None,
           balanced: Iterable[int] = ()) -> "PlannerView":
        """The view of ``state`` now; ``balanced`` are the steps this ``handle`` balanced (their
        ``StepReady``). Call it where the state cannot change: in the planning thread or under the
        lock."""
        consumed = int(state.consumed_step)
        kept = {} if previous is None else {
            s: c for s, c in previous.checkpoints.items() if s > consumed
        }
        for step in balanced:
            try:
                kept[int(step) + 1] = PackedCheckpoint(  # packed once for every message
                    state.checkpoint(int(step) + 1, light=True).to_dict())
            except CheckpointError:  # consumed already in this same batch of events: not needed
                pass
        names = tuple(state.names)
        return cls(
            names=names,
            planned_step=int(state.planned_step),
            balanced_step=int(state.balanced_step),
            consumed_step=consumed,
            chunks_loaded=int(state.chunks_in_memory),
            truncated=int(state.truncated),
            skipped=_skipped(state, names, previous),
            checkpoints=MappingProxyType(kept),
            quarantined=_quarantined(state, previous),
        )

    def checkpoint(self, step: int) -> Mapping[str, Any] | None:
        """The checkpoint dict of having consumed every step before ``step``, if the view has it."""
        return self.checkpoints.get(int(step))


def _skipped(state: Any, names: tuple[str, ...], previous: "PlannerView | None") -> Mapping[str, int]:
    """Rows the loaders skipped, by source; the previous view's while no count moved (a view
    is built after every batch of events, and a mapping of 10,000 sources each time was most of
    its cost)."""
    counts = state.skipped.tolist()
    if previous is not None and previous.names == names and list(previous.skipped.values()) == counts:
        return previous.skipped
    return MappingProxyType(dict(zip(names, counts)))


def _quarantined(state: Any, previous: "PlannerView | None") -> Mapping[str, Any]:
    """The state's quarantined chunks by source; the previous view's while none was added."""
    chunks = state.quarantine.chunks
    if previous is not None and sum(map(len, previous.quarantined.values())) == len(chunks):
        return previous.quarantined
    return MappingProxyType({k: tuple(v) for k, v in state.quarantine.by_source().items()})
