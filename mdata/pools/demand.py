"""How many loader workers each source's pool needs, from measured demand, with hysteresis.

Pure decisions, no processes (the idea of distributed's ``adaptive_core``): the Planner feeds
measurements in and gets :class:`~mdata.wire.pools.PoolDecision` values out; the Dask side applies
them. The measurements:

* **seconds per sample** of each source, from finished loads (the load task's time on one worker
  thread, read plus transform, measured on the worker; the median of the recent loads);
* **steps trainers consumed** over a sliding window of ``rate_window_s`` seconds, and how long they
  **waited** for batches in that window. The step rate is consumed steps over the window's span,
  idle ticks included. (It used to be averaged per 50 ms tick over the ticks that saw progress
  only, so one step in one tick read as 20 steps/s: a job running 3.8 steps/s was sized for 20-57.)
  Trainers that waited a fraction ``f`` of the window would have run ``1 / (1 - f)`` times faster
  with enough data, so demand uses ``rate / (1 - f)`` (at most ``max_boost`` times the rate):
  a starved job asks for the pools that stop the starving instead of for what it gets;
* **threads per worker** of each source's pool, as the cluster runs them.

Demand of source ``i`` in busy worker threads is

    weight_i x samples_per_step x steps_per_second x seconds_per_sample_i

with ``weight_i`` the larger of the weight being planned now and the weight ``ahead`` (the
mixture further on, when the schedule can be read ahead): pools grow *before* a mixture shift
reaches the trainers. The target is demand x headroom / threads per worker, rounded up. Decisions
come every ``interval_s``; scaling up happens at once (a starving trainer costs every GPU),
scaling down only after ``down_after`` consecutive decisions agree, to the largest of their
wants, only while data is ahead of the trainers, and only to a size the demand fills to at most
``down_margin``: retiring a loader drops the chunks it holds (they load again elsewhere), so a
pool shrinks when it clearly can, and a short dip does not make it flap. Every decision carries a
sentence saying why.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import numpy as np

from mdata.wire.pools import PoolDecision

__all__ = ["PoolDecision", "PoolSizer"]


class PoolSizer:
    """Per-source pool targets from demand (see the module docstring)."""

    def __init__(
        self,
        names: tuple[str, ...],
        *,
        headroom: float = 1.25,
        threads_per_worker: int = 1,
        min_workers: int = 1,
        max_workers: int | None = None,
        interval_s: float = 2.0,
        down_after: int = 2,
        rate_window_s: float = 10.0,
        cost_loads: int = 15,
        down_margin: float = 0.8,
        max_boost: float = 4.0,
        lead_s: float = 8.0,
    ) -> None:
        if interval_s < 0 or rate_window_s <= 0 or down_after < 1 or max_boost < 1:
            raise ValueError("PoolSizer: interval_s >= 0, rate_window_s > 0, down_after >= 1 and "
                             "max_boost >= 1 are required")
        self.names = tuple(names)
        self.headroom = float(headroom)
        self.threads = np.full(len(self.names), max(1, int(threads_per_worker)), np.int64)
        self.min_workers = int(min_workers)
        self.max_workers = max_workers
        self.interval_s = float(interval_s)
        self.down_after = int(down_after)
        self.rate_window_s = float(rate_window_s)
        self.max_boost = float(max_boost)
        self.down_margin = float(down_margin)  # shrink only to a size demand fills to this
        self._starved = False
        self.lead_s = float(lead_s)  # how far ahead the Planner reads the mixture for ``ahead``
        self.sec_per_sample = np.full(len(self.names), np.nan)
        self._loads: list[deque[float]] = [deque(maxlen=cost_loads) for _ in self.names]
        self.current: list[int | None] = [None] * len(self.names)
        self._down_wants: list[list[int]] = [[] for _ in self.names]
        self._progress: deque[tuple[float, int, float]] = deque()  # (now, consumed, waited_s)
        self._base: int | None = None  # consumed steps at the first observation
        self._idle: tuple[float, int, float] | None = None  # the last tick before consumption
        self._last_decision: float | None = None

    @classmethod
    def from_config(cls, names: tuple[str, ...]) -> "PoolSizer":
        """A sizer with the ``mdata.pools.*`` settings (docs/configuration.md)."""
        from mdata import config

        return cls(names, headroom=float(config.get("pools.headroom")),
                   interval_s=config.seconds("pools.interval"),
                   down_after=int(config.get("pools.down-after")),
                   rate_window_s=config.seconds("pools.rate-window"),
                   lead_s=config.seconds("pools.lead"))

    # -- measurements ------------------------------------------------------------------------------
    def observe_load(self, source_index: int, samples: int, seconds: float) -> None:
        """A load of ``samples`` rows of a source took ``seconds`` of one worker thread. The
        cost is the median of the last ``cost_loads`` loads: a worker's first load also opens
        its reader and sets its transform up, and one such outlier must not size a pool."""
        if samples <= 0 or not seconds > 0:
            return
        recent = self._loads[source_index]
        recent.append(seconds / samples)
        # statistics.median: a few dozen floats, ~20x cheaper than np.median's array set-up,
        # and this runs once per loaded chunk on the scheduler
        self.sec_per_sample[source_index] = float(statistics.median(recent))

    def observe_threads(self, source_index: int, threads: int) -> None:
        """The workers of the source's pool run ``threads`` loader threads each (0: unknown)."""
        if threads >= 1:
            self.threads[source_index] = int(threads)

    def observe_all_threads(self, threads) -> None:
        """:meth:`observe_threads` for every source at once (``threads`` in source order): one
        array operation per Planner tick, not a call per source (10,000 sources, 20 ticks a
        second)."""
        t = np.asarray(threads, dtype=np.int64)
        if t.size:
            known = t >= 1
            self.threads[: t.size][known] = t[known]

    def observe_progress(self, now: float, consumed_steps: int, waited_s: float = 0.0) -> None:
        """By ``now`` (seconds, any monotonic clock) trainers consumed ``consumed_steps`` steps
        and each waited ``waited_s`` seconds for batches in all (the mean over ranks)."""
        if self._base is None:
            self._base = int(consumed_steps)
        if consumed_steps <= self._base and not self._progress:
            # nothing consumed yet: start-up (cold loads) is not the trainers' pace; the last
            # such tick is kept for a job whose first ticks saw every step it ran (see pace)
            self._idle = (float(now), int(consumed_steps), float(waited_s))
            return
        if self._progress and now <= self._progress[-1][0]:
            return
        self._progress.append((float(now), int(consumed_steps), float(waited_s)))
        horizon = now - self.rate_window_s
        while len(self._progress) > 2 and self._progress[1][0] <= horizon:
            self._progress.popleft()
            self._idle = None  # the window has slid past the start

    def pace(self) -> tuple[float, float, float] | None:
        """``(consumed steps/s, fraction of the time trainers waited, span in s)`` over the
        window, or None before trainers consumed for at least a second."""
        if not self._progress:
            return None
        (t0, c0, w0), (t1, c1, w1) = self._progress[0], self._progress[-1]
        if c1 == c0 and self._idle is not None:
            # every step so far was consumed by the first tick that saw progress (a short job,
            # fast trainers): count them from the last tick before, not as no progress at all
            t0, c0, w0 = self._idle
        span = t1 - t0
        if span < min(1.0, self.rate_window_s):
            return None
        return (c1 - c0) / span, min(1.0, max(0.0, (w1 - w0) / span)), span

    @property
    def step_rate(self) -> float | None:
        """Steps per second trainers consumed over the window (None before it is measured)."""
        pace = self.pace()
        return None if pace is None else pace[0]

    # -- decisions ---------------------------------------------------------------------------------
    def decide(self, now: float, weights: np.ndarray, samples_per_step: int, *,
               ahead: np.ndarray | None = None, wall: float = 0.0,
               lead: int | None = None, window: int | None = None) -> list[PoolDecision]:
        """One decision per measured source every ``interval_s`` (``kind`` ``hold`` when the
        target stays), none in between or before the step rate is known. ``weights``: the
        mixture being planned; ``ahead``: the mixture further on (None: not known); ``wall``:
        the wall-clock time stamped on the decisions; ``lead``: steps built ahead of the
        trainers, of at most ``window``: while it is under a quarter of the window, data is not
        ahead of the trainers and no pool shrinks (a rank stuck in one wait reports its stall
        only when its batch comes, so the lead sees starving first)."""
        pace = self.pace()
        if pace is None:
            return []
        if self._last_decision is not None and now - self._last_decision < self.interval_s:
            return []
        self._last_decision = now
        rate, waited, span = pace
        if rate == 0.0:
            # nothing consumed in the window: trainers are stuck waiting (a rank stuck in one
            # wait reports it only when the batch comes) or paused; neither is a reason to resize
            return []
        boost = 1.0 / max(1.0 - waited, 1.0 / self.max_boost)
        demand_rate = rate * boost
        weights = np.asarray(weights, float)
        use = weights if ahead is None else np.maximum(weights, np.asarray(ahead, float))
        pace_text = (f"{demand_rate:.3g} steps/s ({rate:.3g} consumed/s over {span:.0f} s, "
                     f"trainers stalled {waited:.0%} of it)")
        self._starved = lead is not None and window is not None and lead < max(1, window // 4)
        if self._starved:
            pace_text += f", {lead} of {window} steps built ahead"
        out: list[PoolDecision] = []
        for i, name in enumerate(self.names):
            spp = self.sec_per_sample[i]
            if np.isnan(spp):
                continue
            busy = float(use[i]) * samples_per_step * demand_rate * spp
            threads = int(self.threads[i])
            need = busy * self.headroom
            want = max(self.min_workers, math.ceil(need / threads - 1e-9))
            if self.max_workers is not None:
                want = min(want, self.max_workers)
            later = "" if ahead is None or use[i] <= weights[i] else f" (weight {use[i]:.1%} ahead)"
            why = (f"{name}: {use[i]:.1%}{later} of {samples_per_step} samples/step x {pace_text} "
                   f"x {spp * 1e3:.3g} ms/sample = {busy:.3g} busy threads; x{self.headroom:g} "
                   f"headroom / {threads} thread(s) per worker")
            out.append(self._settle(i, name, want, need, threads, why, wall))
        return out

    def _settle(self, i: int, name: str, want: int, need: float, threads: int, why: str,
                wall: float) -> PoolDecision:
        cur = self.current[i]
        kind, text = "hold", f"{why} -> keep {cur} workers"
        if cur is None or want > cur:
            self._down_wants[i] = []
            self.current[i] = want
            kind = "start" if cur is None else "up"
            text = f"{why} -> " + ("start with" if cur is None else f"scale up from {cur} to") + \
                f" {want} workers"
        elif want < cur and (self._starved or need / threads > want * self.down_margin + 1e-9):
            self._down_wants[i] = []
            why = "data is not ahead of the trainers" if self._starved else (
                f"{need / threads:.2g} workers of demand would fill {want} to more than "
                f"{self.down_margin:.0%}")
            text = f"{text} ({why}: no scale-down)"
        elif want < cur:
            wants = self._down_wants[i]
            wants.append(want)
            if len(wants) >= self.down_after:
                target = max(wants)
                self._down_wants[i] = []
                self.current[i] = target
                kind = "down"
                text = (f"{why} -> scale down from {cur} to {target} workers (demand stayed "
                        f"lower for {self.down_after} decisions)")
            else:
                text = (f"{why} -> keep {cur} workers ({len(wants)} of {self.down_after} "
                        f"decisions agree on fewer)")
        else:
            self._down_wants[i] = []
        return PoolDecision(group=name, workers=int(self.current[i]), reason=text, demand=float(need),
                            current=-1 if cur is None else cur, threads=threads, kind=kind,
                            time=wall, sources=(name,))
