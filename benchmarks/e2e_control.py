"""What mdata's scheduler costs a simulated step at thousands of GPUs, from measurement.

The at-scale simulation (:mod:`benchmarks.e2e_sim`) used to model mdata's control plane as free.
It is not: the scheduler's CPU per step grows with ranks and DP groups
(:mod:`benchmarks.control_plane`), and when it needs longer than the step, every trainer waits
for it. :class:`ControlCost` is that cost fitted from the control-plane benchmark's figures of the
same run (``control.*``, when it ran before the end-to-end benchmark) or, when it did not, from a
small sweep measured here (:func:`measure`: the real scheduler, Planner and ``Loader`` protocol).

A step of mdata then lasts at least :meth:`ControlCost.seconds` of the scheduler's CPU. This is
charged to every GPU as a rank (ranks fed by broadcast talk to the scheduler too, counted as if
they were receivers) and at the figures of this 2-core machine under load, which are upper
bounds: both choices favour the baselines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ControlCost", "from_figures", "measure"]


@dataclass(frozen=True)
class ControlCost:
    """The scheduler's CPU per step: ``fixed_ms`` plus ``per_rank_us`` per rank and
    ``per_group_us`` per DP group; ``source`` says where the fit came from."""

    fixed_ms: float
    per_rank_us: float
    per_group_us: float
    source: str

    def seconds(self, ranks: int, groups: int) -> float:
        """Scheduler CPU seconds per step for ``ranks`` ranks in ``groups`` DP groups."""
        return (self.fixed_ms * 1e-3 + max(0.0, self.per_rank_us) * 1e-6 * ranks
                + max(0.0, self.per_group_us) * 1e-6 * groups)

    def describe(self) -> str:
        return (f"scheduler {self.fixed_ms:.0f} ms + {self.per_rank_us:.0f} us/rank + "
                f"{self.per_group_us:.0f} us/DP group per step ({self.source})")


def _value(figures: Mapping[str, Any], name: str) -> float | None:
    value = figures.get(name)
    if isinstance(value, Mapping):
        value = value.get("mdata")
    return None if value is None else float(value)


def from_figures(figures: Mapping[str, Any]) -> ControlCost | None:
    """The fit from a run's ``control.*`` figures; None when the control benchmark did not run.
    The fixed part is the smallest world's CPU per step less its ranks' and groups' share."""
    per_rank = _value(figures, "control.scheduler_cpu_us_per_rank_step")
    per_group = _value(figures, "control.scheduler_cpu_us_per_group_step")
    smallest = sorted((int(k.rsplit("_", 1)[1]), k) for k in figures
                      if k.startswith("control.scheduler_cpu_ms_per_step_") and k.rsplit("_", 1)[1].isdigit())
    if per_rank is None or per_group is None or not smallest:
        return None
    n, key = smallest[0]
    base = _value(figures, key) or 0.0
    if per_rank <= 0:  # noise hid the slope: the largest world's whole CPU per rank (an upper bound)
        top, top_key = smallest[-1]
        return ControlCost(0.0, 1e3 * (_value(figures, top_key) or 0.0) / top, max(0.0, per_group),
                           "this run's control-plane figures; no per-rank slope showed, so all "
                           "of the largest world's CPU is charged per rank")
    dp = int(_value(figures, "control.fixed_dp") or 16)  # the sweep's DP size (quick runs: 8)
    fixed = max(0.0, base - (per_rank * n + max(0.0, per_group) * min(n, dp)) / 1e3)
    return ControlCost(fixed, per_rank, per_group, "this run's control-plane figures")


def measure(quick: bool) -> ControlCost:
    """A small sweep on the real scheduler (benchmarks.control_plane): two worlds at DP 16 for
    the per-rank slope, and DP = N at the larger one for what a group adds."""
    from benchmarks import control_plane as cp
    from benchmarks.workload import corpus_dir
    from mdata.data.example import example_sources

    corpus = corpus_dir()
    sources = example_sources(corpus)
    small, large = (16, 64)
    steps = cp.WARMUP + (2 if quick else 6)
    with cp._cluster(corpus, constructors=1 if quick else 2) as (proc, address):
        a = cp.sweep_point(address, proc.pid, sources, n=small, dp=16, steps=steps, job="e2e-control-a")
        b = cp.sweep_point(address, proc.pid, sources, n=large, dp=16, steps=steps, job="e2e-control-b")
        c = cp.sweep_point(address, proc.pid, sources, n=large, dp=large, steps=steps, job="e2e-control-c")
    per_rank_ms = (b["cpu_ms_per_step"] - a["cpu_ms_per_step"]) / (large - small)
    per_group_ms = max(0.0, (c["cpu_ms_per_step"] - b["cpu_ms_per_step"]) / (large - 16))
    how = f"measured here: {small} and {large} ranks at DP 16, {large} at DP {large}, {steps} steps"
    if per_rank_ms <= 0:  # noise hid the slope: charge the larger world's whole CPU to its ranks,
        # an upper bound (it favours the baselines)
        per_rank_ms = b["cpu_ms_per_step"] / large
        return ControlCost(0.0, 1e3 * per_rank_ms, 1e3 * per_group_ms,
                           how + "; no per-rank slope showed, so all of it is charged per rank")
    fixed = max(0.0, a["cpu_ms_per_step"] - per_rank_ms * small - per_group_ms * 16)
    return ControlCost(fixed, 1e3 * per_rank_ms, 1e3 * per_group_ms, how)
