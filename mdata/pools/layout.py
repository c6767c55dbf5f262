"""Offline pool layout: which sources share a loader pool, and how many workers and threads each
pool runs, from measured per-sample costs (:mod:`mdata.pools.profile`), the mixture and a step rate.

Demand of source ``i`` in busy loader threads is, as the Planner's online sizing has it,

    weight_i x samples_per_step x steps_per_second x seconds_per_sample_i

with the profile's CPU seconds per sample (``basis="cpu"``, the default: robust to a busy
profiling machine) or its wall seconds (``basis="wall"``: also counts waiting on storage; use it
for remote sources profiled on a quiet machine, from where the loaders will read)

taken at the *most demanding stage* of the mixture (the stage whose samples cost the most per
step: a curriculum that ends image-heavy is laid out for its end). Then:

1. **Who shares.** A source whose demand (with headroom) fills a worker by itself is *expensive*
   and gets a pool of its own. The others are *cheap*; they share pools, cheapest first, as long
   as no pool mixes load tasks whose durations differ by more than ``max_ratio``: a worker thread
   busy with a 1 s image chunk makes a 3 ms text chunk behind it wait, and a pool mixing them
   starves its cheap source while holding cores. Tasks shorter than ``short_task_s`` (default:
   half a step at the target rate, at least 50 ms) mix freely: such a wait delays no step, since
   the Planner loads several steps ahead. So do the tasks of a pool busy less than
   ``idle_share`` of the time (its summed demand with headroom): a task then rarely finds the
   thread taken, and a pool of its own would hold a whole core for a sliver of work.
2. **Cores, threads, workers.** A pool holds ``ceil(demand x headroom)`` cores. Extra threads in
   one worker help only where the transform releases the GIL, which the profile measures (its
   parallel fraction ``p``): a thread count ``T`` qualifies when Amdahl's efficiency
   ``S(T) / T`` is at least ``min_efficiency`` (0.8 = 1 / the default headroom, so the loss comes
   out of the headroom). Of those, the pool takes the one needing the fewest cores
   (``workers x T``), then the fewest worker processes (less reader and tokenizer memory).

:func:`fit_layout` inverts this for a core budget: the highest step rate whose layout fits. The
result is a :class:`PoolLayout`; ``start_cluster(sources, layout=...)`` and ``mdata cluster up
--profile`` run it, :mod:`mdata.pools.layout_text` prints it as ``dask worker`` lines and a
Kubernetes worker-group manifest.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mdata.errors import PlanError
from mdata.mixing import MixtureSchedule, as_schedule
from mdata.pools.profile import Profile, SourceProfile

__all__ = ["LayoutPool", "PoolLayout", "compute_layout", "fit_layout", "layout_for_plan",
           "layout_table", "peak_stage", "source_cost_class", "amdahl_speedup"]

LAYOUT_VERSION = 1


def amdahl_speedup(p: float, threads: int) -> float:
    """Throughput of ``threads`` threads over one, for a parallel fraction ``p``."""
    return 1.0 / ((1.0 - p) + p / threads)


@dataclass(frozen=True)
class LayoutPool:
    """One pool of a layout: its sources, workers, threads per worker, and why."""

    name: str
    sources: tuple[str, ...]
    workers: int
    threads: int
    demand: float  # busy loader threads at the layout's rate, before headroom
    reason: str = ""

    @property
    def cores(self) -> int:
        return self.workers * self.threads

    @property
    def resources(self) -> dict[str, int]:
        """What each worker of the pool declares: every source's pool resource, one per thread."""
        return {f"pool_{s}": self.threads for s in self.sources}


@dataclass(frozen=True)
class PoolLayout:
    """Pools for a plan's sources at a step rate (see the module docstring)."""

    pools: tuple[LayoutPool, ...]
    rate: float
    samples_per_step: int
    weights: Mapping[str, float] = field(default_factory=dict)
    stage: str = ""
    headroom: float = 1.25

    @property
    def cores(self) -> int:
        """Loader cores the layout holds (workers x threads over all pools)."""
        return sum(p.cores for p in self.pools)

    @property
    def workers(self) -> int:
        return sum(p.workers for p in self.pools)

    def pool_of(self, source: str) -> LayoutPool:
        """The pool that serves ``source`` (KeyError when none does)."""
        for p in self.pools:
            if source in p.sources:
                return p
        raise KeyError(f"no pool serves source {source!r}")

    def to_dict(self) -> dict[str, Any]:
        """The layout as versioned JSON-safe data (what :meth:`from_dict` reads back)."""
        return {"mdata_layout": LAYOUT_VERSION, "rate": self.rate, "samples_per_step": self.samples_per_step,
                "weights": dict(self.weights), "stage": self.stage, "headroom": self.headroom,
                "pools": [{"name": p.name, "sources": list(p.sources), "workers": p.workers,
                           "threads": p.threads, "demand": p.demand, "reason": p.reason}
                          for p in self.pools]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PoolLayout":
        """The layout :meth:`to_dict` wrote; PlanError for another version or no layout."""
        if data.get("mdata_layout") != LAYOUT_VERSION:
            raise PlanError(f"not an mdata layout of version {LAYOUT_VERSION}: {data.get('mdata_layout')!r}")
        pools = tuple(LayoutPool(p["name"], tuple(p["sources"]), int(p["workers"]), int(p["threads"]),
                                 float(p["demand"]), str(p.get("reason", ""))) for p in data["pools"])
        return cls(pools, float(data["rate"]), int(data["samples_per_step"]), dict(data["weights"]),
                   str(data.get("stage", "")), float(data.get("headroom", 1.25)))

    def __str__(self) -> str:
        return layout_table(self)


def layout_table(layout: PoolLayout) -> str:
    """One line per pool: sources, workers x threads, demand, and the reason."""
    lines = [f"pool layout for {layout.rate:.3g} steps/s x {layout.samples_per_step} samples/step "
             f"({layout.stage}): {len(layout.pools)} pools, {layout.workers} workers, {layout.cores} cores"]
    width = max([len(p.name) for p in layout.pools] + [4])
    for p in layout.pools:
        lines.append(f"  {p.name.ljust(width)}  {p.workers} x {p.threads} thr  "
                     f"demand {p.demand:7.3g}  sources {', '.join(p.sources)}")
    for p in layout.pools:
        lines.append(f"  {p.name}: {p.reason}")
    return "\n".join(lines)


def source_cost_class(source: Any) -> str:
    """``"cheap"``, ``"expensive"`` or, for a plan-file source whose transform is not one of
    mdata's, ``"unknown"`` (reading its class would import the user's code in this process).

    Used where no profile exists: default pools give expensive and unknown sources a pool each.
    """
    from mdata.sources.transforms import cost_class

    transform = getattr(source, "transform", None)
    if transform is None:
        return "cheap"  # a name-only source: the default transform tokenizes text
    if isinstance(transform, Mapping):  # a SourceSpec: the transform by reference
        module, _, name = str(transform.get("type", "")).partition(":")
        if module == "mdata" or module.startswith("mdata."):
            cls = getattr(importlib.import_module(module), name, None)
            if cls is not None:
                return cost_class(cls)
        return "unknown"
    return cost_class(transform)


def peak_stage(mixture: MixtureSchedule | Mapping[str, float], names: Sequence[str],
               seconds_per_sample: Mapping[str, float]) -> tuple[str, dict[str, float]]:
    """The mixture's most demanding stage: ``(label, normalised weights)`` maximising the
    seconds of loading per sample. Static mixtures have one stage; staged ones each of theirs;
    a linear ramp its two ends (demand is linear in between); any other schedule its weights at
    step 0."""
    schedule = as_schedule(mixture)
    config = schedule.config()
    kind = config.get("class")
    if kind == "StagedMixture":
        stages = [(f"stage from step {s}", _normalised(w, names)) for s, w in config["stages"]]
    elif kind == "LinearRamp":
        stages = [(f"ramp start (step {config['start']})", _normalised(config["from"], names)),
                  (f"ramp end (step {config['end']})", _normalised(config["to"], names))]
    else:  # static: its one stage; any other schedule: its weights at step 0
        stages = [("static" if kind == "StaticMixture" else "step 0",
                   list(schedule.weights_vector(0, names)))]
    best: tuple[float, str, dict[str, float]] | None = None
    for label, vector in stages:
        weights = {n: float(w) for n, w in zip(names, vector)}
        cost = sum(weights[n] * seconds_per_sample[n] for n in names)
        if best is None or cost > best[0]:
            best = (cost, label, weights)
    assert best is not None
    return best[1], best[2]


def _normalised(raw: Mapping[str, float], names: Sequence[str]) -> list[float]:
    from mdata.mixing import validate_weights

    return list(validate_weights(raw, names))


def _threads(p: float, demand: float, need: float, max_threads: int,
             min_efficiency: float) -> tuple[int, int, float]:
    """(threads, workers, speedup) for a pool of ``demand`` busy threads, ``need`` with headroom.

    The pool holds ``ceil(need)`` cores; a thread count ``T`` qualifies when its efficiency
    ``S(T) / T`` is at least ``min_efficiency`` (what it loses comes out of the headroom, never
    below ``demand``). Of those, the fewest cores, then the fewest worker processes."""
    cores = max(1, math.ceil(need - 1e-9))
    best: tuple[int, int, int, float] | None = None  # cores, workers, threads, speedup
    for t in range(1, min(max_threads, cores) + 1):
        s = amdahl_speedup(p, t)
        if t > 1 and s / t < min_efficiency:
            continue
        w = max(1, math.ceil(cores / t - 1e-9), math.ceil(demand / s - 1e-9))
        cand = (w * t, w, t, s)
        if best is None or cand[:2] < best[:2]:
            best = cand
    assert best is not None
    return best[2], best[1], best[3]


def _pool_name(sources: Sequence[str], taken: set[str], index: int) -> str:
    name = sources[0] if len(sources) == 1 else "_".join(sources)
    if len(sources) > 3 or len(name) > 40:
        name = f"shared{index}"
    while name in taken:
        name += "_pool"
    return name


def compute_layout(profile: Profile, mixture: MixtureSchedule | Mapping[str, float], *,
                   samples_per_step: int, rate: float, headroom: float = 1.25, max_ratio: float = 8.0,
                   short_task_s: float | None = None, max_threads: int = 4, min_efficiency: float = 0.8,
                   idle_share: float = 0.5, basis: str = "cpu",
                   names: Sequence[str] | None = None) -> PoolLayout:
    """Pools for ``rate`` steps/s of ``samples_per_step`` samples (see the module docstring).

    ``names`` are the sources to lay out (default: the profiled ones); each must be profiled.
    """
    names = tuple(names) if names is not None else profile.names
    missing = [n for n in names if n not in profile]
    if missing:
        raise PlanError(f"no profile for source(s) {missing}; run `mdata profile` on this plan")
    if not rate > 0 or samples_per_step < 1:
        raise PlanError(f"rate must be > 0 and samples_per_step >= 1, got {rate!r}, {samples_per_step!r}")
    if max_ratio < 1 or max_threads < 1 or not 0 < min_efficiency <= 1 or headroom < 1:
        raise PlanError("max_ratio >= 1, max_threads >= 1, 0 < min_efficiency <= 1 and headroom >= 1")
    prof: dict[str, SourceProfile] = {n: profile[n] for n in names}
    if short_task_s is None:
        short_task_s = max(0.05, 0.5 / rate)
    cost = {n: prof[n].cost(basis) for n in names}
    stage, weights = peak_stage(mixture, names, cost)
    demand = {n: weights[n] * samples_per_step * rate * cost[n] for n in names}
    task = {n: cost[n] * prof[n].chunk_rows for n in names}  # how long a load task holds a thread

    groups: list[tuple[list[str], str]] = []
    cheap = []
    for n in names:  # a source unused at the peak stage still needs a pool: it is cheap there
        if demand[n] * headroom >= 1.0:
            groups.append(([n], f"{n} fills a worker by itself ({demand[n] * headroom:.2f} busy "
                                "threads with headroom): its own pool"))
        else:
            cheap.append(n)
    cheap.sort(key=lambda n: (task[n], n))
    current: list[str] = []
    for n in cheap:
        lo = task[current[0]] if current else 0.0  # the group's shortest task; task[n] >= lo
        similar = task[n] <= short_task_s or task[n] <= max_ratio * max(lo, 1e-12)
        idle = (sum(demand[c] for c in current) + demand[n]) * headroom <= idle_share
        if current and (similar or idle):
            current.append(n)
            continue
        if current:
            groups.append((current, ""))
        current = [n]
    if current:
        groups.append((current, ""))

    pools: list[LayoutPool] = []
    taken: set[str] = set()
    for index, (sources, why) in enumerate(groups):
        need = sum(demand[s] for s in sources) * headroom
        p = sum(demand[s] * prof[s].parallel_fraction for s in sources) / max(sum(demand[s] for s in sources), 1e-12)
        threads, workers, speedup = _threads(p, sum(demand[s] for s in sources), need, max_threads,
                                             min_efficiency)
        name = _pool_name(sources, taken, index)
        taken.add(name)
        if not why:
            tasks = ", ".join(f"{s} {task[s] * 1e3:.3g} ms" for s in sources)
            why = (f"cheap: no source fills a worker (load tasks {tasks}; a pool mixes tasks within "
                   f"x{max_ratio:g} of each other, all under {short_task_s * 1e3:.3g} ms, or any "
                   f"while it is busy under {idle_share:.0%} of the time)")
        why += (f"; {need:.2f} busy threads with x{headroom:g} headroom, parallel fraction {p:.0%}: "
                f"{workers} worker(s) x {threads} thread(s) (speedup {speedup:.2f})")
        pools.append(LayoutPool(name, tuple(sources), workers, threads,
                                sum(demand[s] for s in sources), why))
    return PoolLayout(tuple(pools), float(rate), int(samples_per_step), weights, stage, float(headroom))


def fit_layout(profile: Profile, mixture: MixtureSchedule | Mapping[str, float], *,
               samples_per_step: int, cores: int, **options: Any) -> PoolLayout:
    """The layout of the highest step rate that fits in ``cores`` loader cores (workers x
    threads over all pools), found by bisection on the rate."""
    names = options.get("names") or profile.names
    if cores < 1:
        raise PlanError(f"cores must be >= 1, got {cores}")
    lowest = compute_layout(profile, mixture, samples_per_step=samples_per_step, rate=1e-9, **options)
    if lowest.cores > cores:
        raise PlanError(f"even the smallest layout needs {lowest.cores} cores ({len(lowest.pools)} "
                        f"pools of at least one worker) but the budget is {cores}; raise the budget "
                        "or max_ratio (fewer, larger pools)")
    # Above this rate even the cheapest source alone would need more than `cores` threads.
    cheapest = min(profile[n].cost(options.get("basis", "cpu")) for n in names)
    lo, hi = 1e-9, 2.0 * cores / max(samples_per_step * cheapest, 1e-12)
    best = lowest
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        layout = compute_layout(profile, mixture, samples_per_step=samples_per_step, rate=mid, **options)
        if layout.cores <= cores:
            lo, best = mid, layout
        else:
            hi = mid
        if hi / lo < 1.0 + 1e-4:
            break
    return best


def layout_for_plan(plan: Any, profile: Profile, *, rate: float | None = None, cores: int | None = None,
                    **options: Any) -> PoolLayout:
    """The layout of a :class:`~mdata.plan.Plan`'s sources: its mixture, its global batch as
    samples per step, and either a target ``rate`` (steps/s) or a ``cores`` budget."""
    if (rate is None) == (cores is None):
        raise PlanError("give either a target rate (steps/s) or a core budget, not both or neither")
    kwargs = dict(samples_per_step=plan.balance_spec.global_batch, names=plan.source_names, **options)
    if rate is not None:
        return compute_layout(profile, plan.mixture, rate=rate, **kwargs)
    return fit_layout(profile, plan.mixture, cores=cores, **kwargs)
