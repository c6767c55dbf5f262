"""Where a Planner step's time goes: per-phase timers around the PlannerState's collaborators.

Why its own module: ``benchmarks/planner.py`` reports the time per step, and a figure alone
does not say what to make faster. :class:`PhaseTimer` wraps the few calls that make up a step
(apportioning, chunk bookkeeping, selection, balancing, lineage, batch building, consumption,
chunk loads) on one :class:`~mdata.planner.PlannerState` and its modules, and charges each
call's time to its phase *exclusive* of the phases nested in it (``assign`` calls
``balance_step`` and ``record_step``: those count as balance and lineage, the rest as batches).
About a dozen calls per step are wrapped, so the timers cost microseconds, not milliseconds.
The module-level functions are patched for the timer's lifetime only (:meth:`close`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import mdata.planner.assign as _assign
import mdata.planner.state as _state
from mdata.planner import ChunkLoaded, PlannerState

#: Phases in the order a step meets them; "other" is handle()'s time outside every phase.
PHASES = ("apportion", "chunks", "select", "balance", "lineage", "batches", "consume", "loads",
          "other")


class PhaseTimer:
    """Exclusive time per phase of one PlannerState's handle() calls (see the module docstring)."""

    def __init__(self, state: PlannerState) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._stack: list[float] = []  # time spent in nested phases, per open call
        self._undo: list[Callable[[], None]] = []
        self._wrap_attr(state.provisioner, "plan", "apportion")
        self._wrap_attr(state.provisioner, "shift", "apportion")
        for name in ("need", "settle", "move", "release", "roll_windows"):
            self._wrap_attr(state.chunks, name, "chunks")
        self._wrap_attr(state.dgraph, "record_step", "lineage")
        self._wrap_attr(state.dgraph, "record_consumed_many", "lineage")
        self._wrap_attr(state.assigner, "assign", "batches")
        state._handlers[ChunkLoaded] = self._wrap(state._handlers[ChunkLoaded], "loads")
        self._wrap_module(_state, "select_samples", "select")
        self._wrap_module(_state, "consume_by_group", "consume")
        self._wrap_module(_assign, "balance_step", "balance")

    def _wrap(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        seconds, stack, clock = self.seconds, self._stack, time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = clock()
            stack.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                spent = clock() - began
                nested = stack.pop()
                seconds[phase] += spent - nested
                if stack:
                    stack[-1] += spent
        return timed

    def _wrap_attr(self, obj: Any, name: str, phase: str) -> None:
        setattr(obj, name, self._wrap(getattr(obj, name), phase))

    def _wrap_module(self, module: Any, name: str, phase: str) -> None:
        original = getattr(module, name)
        setattr(module, name, self._wrap(original, phase))
        self._undo.append(lambda: setattr(module, name, original))

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)

    def close(self) -> None:
        """Put the patched module functions back."""
        while self._undo:
            self._undo.pop()()


def split(before: dict[str, float], after: dict[str, float], total: float, steps: int) -> dict[str, float]:
    """ms per step of each phase between two snapshots; ``total`` (s) is handle()'s own time."""
    out = {p: (after[p] - before[p]) / steps * 1e3 for p in PHASES if p != "other"}
    out["other"] = total / steps * 1e3 - sum(out.values())
    return out
