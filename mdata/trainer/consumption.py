"""Telling the Planner what the training loop consumed, without a round trip on the loop.

A rank's consumption of step ``s`` is what lets the Planner release the step's batch and move its
window, but the training loop has nothing to wait for in the answer. So the loop only *notes*
the step here (a lock and a list append), and the step travels to the scheduler by whichever
comes first:

* the prefetch thread's next location request, which :meth:`ConsumptionTeller.take` lets carry
  every step noted so far (the common case when data is ahead of training: no message of its
  own), or
* the teller's own thread, which sends what is still noted after ``grace_s`` (data behind
  training: the prefetcher is long-polling and would carry it only at its next poll).

Nothing is lost: a step is dropped from the notes only once a message carrying it was answered
without error (a failed send puts it back first and the error reaches the training loop at its
next call); a rank that dies before telling is handled as before, by its lease ending.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["ConsumptionTeller", "StepWaits"]


class ConsumptionTeller:
    """Noted consumption steps of one Loader, sent off the training loop (see module docstring).

    ``send(steps)`` tells the Planner that ``steps`` (ascending) were consumed; it runs on the
    teller's thread and may raise, in which case the error is kept for :meth:`note` /
    :meth:`raise_failure` and the steps stay noted.
    """

    def __init__(self, send: Callable[[tuple[int, ...]], None], *, grace_s: float = 0.02,
                 name: str = "mdata-consumption") -> None:
        self._send = send
        self.grace_s = float(grace_s)
        self._noted: list[int] = []
        self._in_flight = 0  # messages carrying noted steps that have not been answered yet
        self._failure: BaseException | None = None
        self._closed = False
        #: steps told so far: ``carried`` by location requests, sent ``alone`` by this thread
        self.told = {"carried": 0, "alone": 0}
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- the training loop's side -----------------------------------------------------------------
    def note(self, step: int) -> None:
        """The loop consumed ``step``: returns at once (raises the error of an earlier send)."""
        with self._cond:
            self.raise_failure()
            self._noted.append(int(step))
            self._cond.notify_all()

    def raise_failure(self) -> None:
        """Raise (once) the error an earlier send met, so the loop hears of it."""
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    # -- the prefetch thread's side ----------------------------------------------------------------
    def take(self) -> tuple[int, ...]:
        """Every noted step, for a location request to carry; call :meth:`sent` with the
        outcome. Steps taken are not sent by the teller's thread meanwhile."""
        with self._cond:
            steps, self._noted = tuple(self._noted), []
            if steps:
                self._in_flight += 1
            return steps

    def sent(self, steps: tuple[int, ...], ok: bool) -> None:
        """The message carrying ``steps`` was answered (``ok``) or failed (they are noted again,
        ahead of newer ones, to be sent by the next carrier)."""
        if not steps:
            return
        with self._cond:
            self._in_flight -= 1
            if not ok:
                self._noted[:0] = steps
            elif threading.current_thread() is self._thread:
                self.told["alone"] += len(steps)
            else:
                self.told["carried"] += len(steps)
            self._cond.notify_all()

    # -- lifecycle -----------------------------------------------------------------------------------
    def flush(self, timeout: float) -> bool:
        """Wait until every noted step was sent and answered (True) or ``timeout`` passes."""
        with self._cond:
            self._cond.notify_all()
            return self._cond.wait_for(
                lambda: (not self._noted and not self._in_flight) or self._failure is not None
                or self._closed, timeout)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._noted or self._closed)
                if self._closed:
                    return
                # give the prefetcher's next location request the chance to carry them
                self._cond.wait_for(lambda: not self._noted or self._closed, self.grace_s)
                if self._closed:
                    return
                if not self._noted:
                    continue
            steps = self.take()
            try:
                self._send(steps)
            except BaseException as exc:  # noqa: BLE001 - handed to the training loop
                self.sent(steps, ok=False)
                with self._cond:
                    self._failure = exc
                    self._cond.notify_all()
                    # wait for the loop to hear of it before trying again
                    self._cond.wait_for(lambda: self._failure is None or self._closed)
            else:
                self.sent(steps, ok=True)


class StepWaits:
    """How long the training loop waited for each step's batch (the newest ``keep`` steps), told
    beside the step's consumption (``waits`` on the wire) so the Planner's dashboard can say which
    rank waited on data when, and blame a source (:mod:`mdata.observe.data_waits`). A step is told within
    a few steps of being taken, so a short memory suffices."""

    def __init__(self, keep: int = 256) -> None:
        self.keep = int(keep)
        self._waits: dict[int, float] = {}

    def add(self, step: int, seconds: float) -> None:
        """The loop waited ``seconds`` for ``step``'s batch (the training loop's thread)."""
        self._waits[int(step)] = float(seconds)
        while len(self._waits) > self.keep:
            del self._waits[next(iter(self._waits))]

    def of(self, steps: tuple[int, ...]) -> tuple[float, ...]:
        """The wait of each of ``steps``, -1 where not measured (any thread: reads only)."""
        waits = dict(self._waits)  # a copy: the loop's thread may add meanwhile
        return tuple(waits.get(s, -1.0) for s in steps)
