"""What mdata's scheduler costs a simulated step at thousands of GPUs, from measurement.

The at-scale simulation (:mod:`benchmarks.e2e_sim`) used to model mdata's control plane as free.
It is not: the scheduler's CPU per step grows with ranks and DP groups
(:mod:`benchmarks.control_plane`), and when it needs longer than the step, every trainer waits
for it. :class:`ControlCost` is that cost fitted from the control-plane benchmark's figures of the
same run (``control.*``, when it ran before the end-to-end benchmark) or, when it did not, from a
small sweep measured here (:func:`measure`: the real scheduler, Planner and ``Loader`` protocol).

A step of mdata then lasts at least :meth:`ControlCost.step_seconds` of the scheduler's CPU, at
the figures of this 2-core machine under load (upper bounds, which favour the baselines), for
mdata deployed as docs/deploying.md says to at scale: ``broadcast_at("tp")`` (TP rank 0 of each
TP group receives, as Megatron-LM's own data path loads on TP rank 0 and broadcasts) with the
host agent (one client per node). The scheduler then works per DP group, per receiving rank
(``dp x pp x cp`` of them: every pipeline stage and CP rank of a group takes its part), per node
(its push and consumption message) and per fed rank (nothing measurable). A fit without those
figures (the control benchmark's quick run) charges every GPU as a receiving rank, as before
ranks fed by broadcast stopped talking to the scheduler: more, which favours the baselines too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ControlCost", "from_figures", "measure"]


@dataclass(frozen=True)
class ControlCost:
    """The scheduler's CPU per step: ``fixed_ms`` plus ``per_rank_us`` per receiving rank and
    ``per_group_us`` per DP group; under ``broadcast_at("tp")`` with a client per node,
    ``per_host_us`` per node and ``per_fed_us`` per rank fed by broadcast (both None: not
    measured, and every GPU is charged as a receiving rank). ``source``: where the fit came from."""

    fixed_ms: float
    per_rank_us: float
    per_group_us: float
    source: str
    per_host_us: float | None = None
    per_fed_us: float | None = None

    @property
    def broadcast(self) -> bool:
        """Whether the fit holds the broadcast deployment's per-node and per-fed-rank costs."""
        return self.per_host_us is not None and self.per_fed_us is not None

    def seconds(self, ranks: int, groups: int, hosts: int = 0, fed: int = 0) -> float:
        """Scheduler CPU seconds per step for ``ranks`` receiving ranks in ``groups`` DP groups,
        ``hosts`` clients (nodes) and ``fed`` ranks fed by broadcast."""
        return (self.fixed_ms * 1e-3 + max(0.0, self.per_rank_us) * 1e-6 * ranks
                + max(0.0, self.per_group_us) * 1e-6 * groups
                + max(0.0, self.per_host_us or 0.0) * 1e-6 * hosts
                + max(0.0, self.per_fed_us or 0.0) * 1e-6 * fed)

    def step_seconds(self, gpus: int, dp: int, tp: int, gpus_per_node: int) -> float:
        """Scheduler CPU seconds per step for a job of ``gpus`` GPUs in ``dp`` DP groups at TP
        ``tp``: under ``broadcast_at("tp")`` with a client per node when the fit allows it (the
        module docstring), else every GPU a receiving rank."""
        if not self.broadcast or tp <= 1:
            return self.seconds(gpus, dp)
        receivers = gpus // tp
        return self.seconds(receivers, dp, hosts=max(1, gpus // max(1, gpus_per_node)),
                            fed=gpus - receivers)

    def describe(self) -> str:
        deployed = (f" + {self.per_host_us:.0f} us/node + {self.per_fed_us:.0f} us/rank fed by "
                    "broadcast, under broadcast_at('tp') with a client per node" if self.broadcast
                    else ", every GPU a receiving rank")
        return (f"scheduler {self.fixed_ms:.0f} ms + {self.per_rank_us:.0f} us/receiving rank + "
                f"{self.per_group_us:.0f} us/DP group{deployed} per step ({self.source})")


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
    per_host = _value(figures, "control.scheduler_cpu_us_per_host_step")
    per_fed = _value(figures, "control.scheduler_cpu_us_per_rank_step_bcast_tp")
    return ControlCost(fixed, per_rank, per_group, "this run's control-plane figures",
                       per_host_us=per_host, per_fed_us=None if per_fed is None else max(0.0, per_fed))


def measure(quick: bool) -> ControlCost:
    """A small sweep on the real scheduler (benchmarks.control_plane): two worlds at DP 16 for
    the per-rank slope, and DP = N at the larger one for what a group adds; full runs also the
    broadcast deployment's costs: the two DP-16 worlds under ``broadcast_at("tp")`` with a host
    per TP group (what a fed rank adds) and a host per rank against one host (what a node adds).
    Quick runs leave those out and charge every GPU as a receiving rank (more)."""
    from benchmarks import control_plane as cp
    from benchmarks.workload import corpus_dir
    from mdata.data.example import example_sources

    corpus = corpus_dir()
    sources = example_sources(corpus)
    small, large = (16, 64)
    steps = cp.WARMUP + (2 if quick else 6)
    per_host_us = per_fed_us = None
    with cp._cluster(corpus, constructors=1 if quick else 2) as (proc, address):
        a = cp.sweep_point(address, proc.pid, sources, n=small, dp=16, steps=steps, job="e2e-control-a")
        b = cp.sweep_point(address, proc.pid, sources, n=large, dp=16, steps=steps, job="e2e-control-b")
        c = cp.sweep_point(address, proc.pid, sources, n=large, dp=large, steps=steps, job="e2e-control-c")
        if not quick:
            fed = [cp.sweep_point(address, proc.pid, sources, n=n, dp=16, steps=steps,
                                  job=f"e2e-control-bcast-{n}", broadcast="tp", per_host=n // 16)
                   for n in (small, large)]
            per_fed_us = max(0.0, 1e3 * (fed[1]["cpu_ms_per_step"] - fed[0]["cpu_ms_per_step"])
                             / (large - small))
            per_host_us = 1e3 * cp._host_pairs(address, proc.pid, sources, (small,), steps)[0]["per_host_ms"]
    per_rank_ms = (b["cpu_ms_per_step"] - a["cpu_ms_per_step"]) / (large - small)
    per_group_ms = max(0.0, (c["cpu_ms_per_step"] - b["cpu_ms_per_step"]) / (large - 16))
    how = f"measured here: {small} and {large} ranks at DP 16, {large} at DP {large}, {steps} steps"
    if per_host_us is not None:
        how += f"; under broadcast_at('tp') at {small} and {large}, hosts apart and together at {small}"
    if per_rank_ms <= 0:  # noise hid the slope: charge the larger world's whole CPU to its ranks,
        # an upper bound (it favours the baselines)
        per_rank_ms = b["cpu_ms_per_step"] / large
        return ControlCost(0.0, 1e3 * per_rank_ms, 1e3 * per_group_ms,
                           how + "; no per-rank slope showed, so all of it is charged per rank",
                           per_host_us=per_host_us, per_fed_us=per_fed_us)
    fixed = max(0.0, a["cpu_ms_per_step"] - per_rank_ms * small - per_group_ms * 16)
    return ControlCost(fixed, 1e3 * per_rank_ms, 1e3 * per_group_ms, how,
                       per_host_us=per_host_us, per_fed_us=per_fed_us)
