"""The step checkpoints a client's hub has seen, for its ranks that get their batch by broadcast.

Under ``Plan.broadcast_at(axis)`` only the axis' first rank of each group receives the batch
from the constructor; the others get it from that rank over the GPU interconnect, and the
Planner neither waits for their consumption nor tells them where a batch is (they are not its
*receivers*). What such a *fed* rank still needs each step is the step's checkpoint, so that its
``state_dict()`` and a resume give the step its peers give, and a pace: it yields a step once the
step's batch is built, and hears when the job fails.

A step's checkpoint is the same for every rank of the job, and the client's hub
(:class:`~mdata.trainer.location_hub.LocationHub`) already receives it for its receiving ranks:
in every location the scheduler pushes or answers. :class:`StepCheckpoints` keeps the newest of
them (by generation and step) and hands them to the hub's fed ranks, so a fed rank whose host
holds a receiving rank of the job (its TP group's, in a real job) sends the scheduler nothing
per step. A fed rank with no receiving rank in its hub, one whose step came to none of them
within a poll, or one waiting when the job was reset (failed, rewound, closed) asks for the
step's location itself, as a receiving rank would, but without subscribing to pushes
(:meth:`~mdata.trainer.location_hub.LocationHub.ask_fed`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["KEEP_STEPS", "StepCheckpoints"]

#: Steps whose checkpoint is kept (the newest): a fed rank further behind its hub's receivers
#: asks for its step instead (prefetch keeps ranks within a few steps of each other).
KEEP_STEPS = 64

#: How often a fed rank waiting for its step looks at its Loader's stop event.
CHECK_S = 0.1


class StepCheckpoints:
    """Step checkpoints seen by one hub, for its fed ranks (see the module docstring)."""

    def __init__(self, keep: int = KEEP_STEPS) -> None:
        self.keep = int(keep)
        self.fed: set[int] = set()  # the hub's ranks that get their batch by broadcast
        self.served = 0  # checkpoints handed to fed ranks (no message of theirs), and asked for
        self._cond = threading.Condition()
        self._by_step: dict[tuple[int, int], Mapping[str, Any]] = {}  # (generation, step) ->
        # a reset (the job failed, rewound or closed) and nothing filed since: waiting is futile
        self._reset = False
        self._resets = 0

    def file(self, generation: int, items: Iterable[tuple[int, Mapping[str, Any]]]) -> None:
        """``(step, checkpoint)`` pairs of ``generation`` that reached the hub (a push, a reply)."""
        with self._cond:
            by_step, filed = self._by_step, False
            for step, checkpoint in items:
                key = (int(generation), int(step))
                if key not in by_step:
                    by_step[key] = checkpoint
                    filed = True
            if not filed:
                return
            while len(by_step) > self.keep:
                del by_step[min(by_step)]
            self._reset = False
            self._cond.notify_all()

    def reset(self) -> None:
        """The job failed, rewound or closed (a reset push, a failed answer): what was kept is
        dropped, and fed ranks ask for their steps until a location reaches the hub again."""
        with self._cond:
            self._by_step.clear()
            self._reset = True
            self._resets += 1
            self._cond.notify_all()

    def wake(self) -> None:
        """Something a waiting fed rank checks changed (a member left the hub)."""
        with self._cond:
            self._cond.notify_all()

    def take(self, step: int, generation: int, wait_s: float, receiving: Callable[[], bool],
             stop: threading.Event | None = None) -> Mapping[str, Any] | None:
        """The checkpoint of ``step`` in ``generation``, waiting up to ``wait_s`` for it; None
        at once when ``receiving()`` says the hub has no receiving rank, and as soon as it says
        so, a reset comes or ``stop`` is set while waiting."""
        key = (int(generation), int(step))
        deadline = time.monotonic() + wait_s
        with self._cond:
            resets = self._resets
            while True:
                found = self._by_step.get(key)
                if found is not None:
                    self.served += 1
                    return found
                now = time.monotonic()
                if (self._reset or self._resets != resets or now >= deadline or not receiving()
                        or (stop is not None and stop.is_set())):
                    return None
                self._cond.wait(min(CHECK_S, deadline - now))
