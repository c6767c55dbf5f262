"""How many loader workers each source's pool needs, from measured demand, with hysteresis.

Pure decisions, no processes (the idea of distributed's ``adaptive_core``): the Planner feeds
measurements in (seconds per sample from finished loads, consumed steps over time) and gets
targets out; the Dask side applies them. Demand of source ``i`` in busy cores is

    weight_i x samples_per_step x steps_per_second x seconds_per_sample_i

and its target is that times a headroom factor, rounded up. Scaling up happens at once (a
starving trainer costs every GPU); scaling down waits until ``down_after`` consecutive decisions
agree, so a short dip does not make pools flap. Every target carries a sentence saying why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["PoolDecision", "PoolSizer"]


@dataclass(frozen=True)
class PoolDecision:
    """A new target for one source's pool and the reason for it."""

    source: str
    workers: int
    reason: str
    demand: float = 0.0  # worker-equivalents needed, headroom included, before rounding up


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
        down_after: int = 3,
        smoothing: float = 0.3,
    ) -> None:
        self.names = names
        self.headroom = float(headroom)
        self.threads = int(threads_per_worker)
        self.min_workers = int(min_workers)
        self.max_workers = max_workers
        self.down_after = int(down_after)
        self.smoothing = float(smoothing)
        self.sec_per_sample = np.full(len(names), np.nan)
        self.step_rate: float | None = None
        self.current: list[int | None] = [None] * len(names)
        self._down_votes = [0] * len(names)
        self._last_tick: tuple[float, int] | None = None

    def observe_load(self, source_index: int, samples: int, seconds: float) -> None:
        """A load of ``samples`` rows of a source took ``seconds`` of one worker thread."""
        if samples <= 0 or not seconds > 0:
            return
        value = seconds / samples
        old = self.sec_per_sample[source_index]
        self.sec_per_sample[source_index] = (
            value if np.isnan(old) else (1 - self.smoothing) * old + self.smoothing * value
        )

    def observe_progress(self, now: float, consumed_steps: int) -> None:
        """``consumed_steps`` steps were fully consumed by ``now`` (seconds, any monotonic clock)."""
        if self._last_tick is not None:
            then, steps = self._last_tick
            if now > then and consumed_steps > steps:
                rate = (consumed_steps - steps) / (now - then)
                self.step_rate = rate if self.step_rate is None else (
                    (1 - self.smoothing) * self.step_rate + self.smoothing * rate)
            elif now > then:
                # no progress in this interval: keep the last rate, since idle trainers may just
                # be waiting for data and shrinking pools then would make it worse
                pass
        if self._last_tick is None or now > self._last_tick[0]:
            self._last_tick = (now, consumed_steps)

    def decide(self, weights: np.ndarray, samples_per_step: int) -> list[PoolDecision]:
        """Targets that changed, one per source whose demand is measured."""
        if self.step_rate is None:
            return []
        out: list[PoolDecision] = []
        for i, name in enumerate(self.names):
            spp = self.sec_per_sample[i]
            if np.isnan(spp):
                continue
            demand = float(weights[i]) * samples_per_step * self.step_rate * spp
            need = demand * self.headroom / self.threads
            want = max(self.min_workers, math.ceil(need - 1e-9))
            if self.max_workers is not None:
                want = min(want, self.max_workers)
            why = (f"{name}: {weights[i]:.1%} of {samples_per_step} samples/step x "
                   f"{self.step_rate:.3g} steps/s x {spp * 1e3:.3g} ms/sample = {demand:.3g} busy "
                   f"threads; x{self.headroom:g} headroom / {self.threads} threads per worker")
            cur = self.current[i]
            if cur is None or want > cur:
                self._down_votes[i] = 0
                if want != cur:
                    self.current[i] = want
                    verb = "start with" if cur is None else f"scale up from {cur} to"
                    out.append(PoolDecision(name, want, f"{why} -> {verb} {want} workers", need))
            elif want < cur:
                self._down_votes[i] += 1
                if self._down_votes[i] >= self.down_after:
                    self._down_votes[i] = 0
                    self.current[i] = want
                    out.append(PoolDecision(
                        name, want, f"{why} -> scale down from {cur} to {want} workers "
                        f"(demand stayed lower for {self.down_after} decisions)", need))
            else:
                self._down_votes[i] = 0
        return out
