"""Loader memory at equal throughput: each system sized to feed the same trainers, then compared.

``benchmarks/memory.py`` compares peak memory at a chosen worker count (4 DataLoader workers per
rank against 4 mdata loaders), with no throughput either side must deliver. A user sizes a loader
to the smallest configuration that keeps the GPUs busy, so that is what this module compares:

1. **The trainers' pace.** Every rank sleeps for its batch's :class:`~mdata.cost.AttentionCost`
   times :func:`seconds_per_cost`: the training FLOPs of a stated model (``MODEL``: a 7B dense
   transformer, hidden 4096, 32 layers: ``6 x hidden x layers`` FLOPs per cost unit) on a stated
   GPU (an H100 SXM's 989 TFLOP/s at 40% MFU), the sequence split over the ``cp`` ranks of its
   group, made ``SLOWDOWN`` times slower on both sides (this 2-core machine cannot load for 16
   GPUs at an H100's pace; a slower pace needs fewer workers on both sides, which helps the
   baseline most, since its smallest configuration already has ``ranks`` worker processes).
2. **The smallest configuration that feeds them**, in steady state. A loader that mixes ``n``
   sources keeps a stream (an open file, a read buffer, a decoded batch) per source in every
   process that draws from it, and fills it on first use: a cold start spends its first minutes
   filling them. So each run first draws unpaced until every loader process has drawn from
   every source once in expectation (:func:`primed_samples`: per DataLoader worker on the
   baseline's side, per job on mdata's, whose sources each live on one loader), then paces
   ``WARM`` steps and measures ``STEPS``. A configuration feeds the trainers when the time
   ranks spend waiting for data is under ``STALL_GOAL`` (1%) of their wall time. The baseline
   tries 1, 2, 3, ... DataLoader workers per rank (``BASELINE_WORKERS``), measured with
   ``measured_ranks`` rank families of one CP group (every CP rank loads its group's samples,
   as Megatron-LM's CP ranks do); mdata tries 1, 2, 3, ... loader workers (``MDATA_LOADERS``)
   plus one constructor at the full shape. The first configuration under the goal is the
   answer. A small stall (under 5%) that one more worker does not lower (by a quarter, or 0.2
   points) is a floor no configuration removes (a DataLoader rank unpickles every batch its
   workers send, inside ``next``): the smaller configuration is then the answer, marked as a
   plateau, so neither side is sized up for what workers cannot fix (this favours the
   baseline, whose floor it is here). Otherwise the last one tried is reported with its stall,
   and the figure says the goal was not reached.
3. **Peak PSS per GPU** of that configuration, counted as :mod:`benchmarks.memory` counts it
   (:class:`~benchmarks.counting.PeakPss` through warm-up and measured steps; the baseline
   projected from its measured families to the full shape, shared libraries counted once).

Figures: ``memory.iso_ratio_<sources>`` (the baseline's PSS per GPU over mdata's, both at their
smallest feeding configuration) and ``memory.iso_workers_per_rank_<sources>`` (what the baseline
needed), with ``memory.iso_mdata_loaders_<sources>`` and each side's stall in the notes, for
5 / 64 / 306 / 1,024 sources over the production-shaped corpus (:mod:`benchmarks.workload`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np

from benchmarks.counting import PeakPss
from benchmarks.fleet import BaselineFleet, MdataFleet, RunStats
from benchmarks.harness import figure
from benchmarks.memory_shape import (LIMIT_MB, MAX_TOKENS, MICRO_BATCHES, plan_for,
                                     project_baseline, weights_of)
from benchmarks.workload import production_sources

__all__ = ["MODEL", "SLOWDOWN", "STALL_GOAL", "iso_figures", "primed_samples", "seconds_per_cost",
           "smallest_feeding"]

#: The trainer's model and GPU: a 7B dense transformer on an H100 SXM at 40% MFU.
MODEL = {"hidden": 4096, "layers": 32}
GPU_FLOPS, MFU = 989e12, 0.40
SLOWDOWN = 4.0
STALL_GOAL = 0.01
WARM, STEPS = 4, 12
WARM_CHUNK = 8  # unpaced steps per priming round
PRIME_DEADLINE_S = 900.0
FLOOR_UP_TO = 5.0  # a stall floor is small: a larger stall that one more worker barely lowers is
# a configuration far from fed, which the search keeps growing
BASELINE_WORKERS = (1, 2, 3, 4, 6, 8)
MDATA_LOADERS = (1, 2, 3, 4)


def seconds_per_cost(cp: int, slowdown: float = SLOWDOWN) -> float:
    """Seconds of one GPU per unit of the default :class:`~mdata.cost.AttentionCost` (forward
    FLOPs over ``2 x hidden x layers`` of a 4096-hidden model): training is 3 forward passes'
    FLOPs, so a unit is ``6 x hidden x layers`` FLOPs, split over the ``cp`` GPUs of a group."""
    if cp < 1 or slowdown <= 0:
        raise ValueError(f"seconds_per_cost needs cp >= 1 and slowdown > 0, got {cp}, {slowdown}")
    flops = 6.0 * MODEL["hidden"] * MODEL["layers"]
    return flops / (cp * GPU_FLOPS * MFU) * slowdown


def smallest_feeding(candidates, measure: Callable[[int], dict], goal: float = STALL_GOAL) -> dict:
    """The smallest of ``candidates`` that feeds the trainers, by ``measure(c)["stall"]``.

    The first candidate with a stall under ``goal`` is the answer (``fed``: True). A small stall
    (under ``FLOOR_UP_TO`` x ``goal``) that more workers do not lower (the next candidate removes
    less than a quarter of it, or less than 0.2 points) is a floor no configuration removes, such as the time a rank spends taking
    a batch from its workers: then the smaller of the two is the answer (``plateau``: True,
    ``fed``: False), so neither side is sized up for stall it cannot remove. If neither happens,
    the last candidate is returned (``fed``: False). ``tried`` lists every (candidate, stall).
    Pure: ``measure`` runs the fleet."""
    tried: list[tuple[int, float]] = []
    before: dict | None = None
    out: dict = {}
    for c in candidates:
        out = {**measure(c), "size": c}
        tried.append((c, round(float(out["stall"]), 4)))
        if out["stall"] < goal:
            return {**out, "tried": tried, "fed": True, "plateau": False}
        if (before is not None and before["stall"] < FLOOR_UP_TO * goal
                and before["stall"] - out["stall"] < max(0.002, 0.25 * before["stall"])):
            return {**before, "tried": tried, "fed": False, "plateau": True}
        before = out
    return {**out, "tried": tried, "fed": False, "plateau": False}


def primed_samples(num_sources: int) -> int:
    """Samples one loader process must draw, with equal weights, before it has drawn from every
    source once in expectation (the coupon collector: ``n (ln n + 1)``, rounded up): a loader in
    steady state holds a stream or buffer for every source it mixes, which a short run from a
    cold start never reaches."""
    n = int(num_sources)
    if n < 1:
        raise ValueError(f"primed_samples needs at least one source, got {n}")
    return int(np.ceil(n * (np.log(n) + 1.0)))


def _warm_then_paced(fleet, cp: int, slowdown: float, steps: tuple[int, int], warm_samples: int,
                     deadline_s: float) -> RunStats:
    """Unpaced steps until the fleet delivered ``warm_samples`` distinct samples (every loader
    process primed: :func:`primed_samples`), then ``steps[0]`` paced warm-up steps and
    ``steps[1]`` measured ones (module docstring). Priming that outlasts ``deadline_s`` fails."""
    began, seen = time.monotonic(), 0
    while seen < warm_samples:
        seen += fleet.run(WARM_CHUNK).samples
        if time.monotonic() - began > deadline_s:
            raise TimeoutError(f"priming took over {deadline_s:.0f} s ({seen} of {warm_samples} samples)")
    pace = seconds_per_cost(cp, slowdown)
    fleet.run(steps[0], pace)
    return fleet.run(steps[1], pace)


def measure_baseline(num_sources: int, row_group_mb: int, families: int, workers: int, cp: int,
                     slowdown: float, steps: tuple[int, int] = (WARM, STEPS)) -> dict:
    """``families`` ranks of one CP group, each with ``workers`` DataLoader workers, paced."""
    sources = production_sources(num_sources, row_group_mb)
    with BaselineFleet(sources, weights_of(sources), ranks=families, group=families, workers=workers,
                       max_tokens=MAX_TOKENS, micro_batches=MICRO_BATCHES, reader="stream") as fleet:
        with PeakPss(fleet.loader_pids, fleet.rank_pids, fleet.bare_pid) as pss:
            # every worker of a rank draws its own share of the group's samples
            stats = _warm_then_paced(fleet, cp, slowdown, steps, workers * primed_samples(num_sources),
                                     PRIME_DEADLINE_S)
        out = {"pss_mb": pss.peak_mb, **pss.at_peak, "stall": stats.stall_fraction,
               "measured_ranks": families, "library_mb": pss.library_mb,
               "samples_per_s": stats.samples / stats.wall_s,
               "compute_s_per_step": stats.compute_s / (families * steps[1])}
    _say(f"baseline {families} ranks x {workers} workers, {num_sources} sources", out)
    return out


def measure_mdata(num_sources: int, row_group_mb: int, ranks: int, cp: int, loaders: int,
                  slowdown: float, steps: tuple[int, int] = (WARM, STEPS)) -> dict:
    """The full shape: ``ranks`` ranks (dp x cp), ``loaders`` loader workers + 1 constructor."""
    sources = production_sources(num_sources, row_group_mb)
    with MdataFleet(sources, plan_for(sources, ranks, cp), loader_workers=loaders) as fleet:
        with PeakPss(fleet.loader_pids, fleet.rank_pids, fleet.bare_pid) as pss:
            # a source's samples all go to its one loader: the job's draw primes every loader
            stats = _warm_then_paced(fleet, cp, slowdown, steps, primed_samples(num_sources),
                                     PRIME_DEADLINE_S)
        out = {"pss_mb": pss.peak_mb, **pss.at_peak, "stall": stats.stall_fraction,
               "samples_per_s": stats.samples / stats.wall_s,
               "compute_s_per_step": stats.compute_s / (ranks * steps[1])}
    _say(f"mdata {ranks} ranks, {loaders} loaders, {num_sources} sources", out)
    return out


_BEGAN = time.monotonic()


def _say(what: str, out: dict) -> None:
    print(f"memory iso: {what}: stall {out['stall']:.4f}, peak {out['pss_mb']:.0f} MB, "
          f"{out['samples_per_s']:.1f} samples/s, compute {out['compute_s_per_step']:.3f} s/step at {time.monotonic() - _BEGAN:.0f} s",
          file=sys.stderr, flush=True)


class _Budget:
    """How many baseline rank families fit this machine's budget (``LIMIT_MB``) at a point: the
    configured number, 1, or 0 (the point is not measured). A worker's steady state grows with
    the sources it streams, so its memory at ``n`` sources is extrapolated along the steepest
    slope per source between the points measured so far (from one point only: in proportion
    to its sources, which overstates a point with a large fixed part)."""

    def __init__(self, limit_mb: float) -> None:
        self.limit_mb = limit_mb
        self.points: dict[int, float] = {}  # sources -> most MB per worker measured there

    def per_worker_mb(self, sources: int) -> float:
        if not self.points:
            return 0.0
        known = sorted(self.points.items())
        last_n, last_mb = known[-1]
        if len(known) == 1:
            return last_mb * max(1.0, sources / last_n)
        slope = max((b - a) / (m - n) for (n, a), (m, b) in zip(known, known[1:]))
        return last_mb + max(0.0, slope) * max(0, sources - last_n)

    def families(self, wanted: int, sources: int, workers: int) -> int:
        guess = self.per_worker_mb(sources) * workers
        for families in range(wanted, 0, -1):
            if guess * families + 500 <= self.limit_mb:
                return families
        return 0

    def learn(self, measured: dict, sources: int, workers: int) -> None:
        per = measured["pss_mb"] / measured["measured_ranks"] / workers
        self.points[sources] = max(self.points.get(sources, 0.0), per)


def _point(cfg: dict, n: int, budget: _Budget) -> dict[str, object]:
    rg, ranks, cp, slow = cfg["row_group_mb"], cfg["ranks"], cfg["cp"], cfg["slowdown"]
    steps = cfg["steps"]

    def baseline(workers: int) -> dict:
        families = budget.families(cfg["measured_ranks"], n, workers)
        if families == 0:
            raise _OverBudget(f"{workers} workers per rank at {n} sources would exceed this "
                              f"machine's {budget.limit_mb / 1024:.0f} GiB budget")
        out = measure_baseline(n, rg, families, workers, cp, slow, steps)
        budget.learn(out, n, workers)
        return out

    try:
        base = smallest_feeding(cfg["baseline_workers"], baseline)
    except _OverBudget as exc:
        base = {"error": str(exc)}
    ours = smallest_feeding(cfg["mdata_loaders"], lambda k: measure_mdata(
        n, rg, ranks, cp, k, slow, steps))
    ours_gpu = ours["pss_mb"] / ranks
    shape = (f"{n} sources, row groups {rg} MiB, {ranks} GPUs (dp {ranks // cp} x cp {cp}); trainers "
             f"paced at a 7B model on an H100 at 40% MFU, {slow:g}x slower here; fed = stall under "
             f"{STALL_GOAL:.0%} over {steps[1]} steps after {steps[0]}, every loader process primed")

    def fed(found: dict) -> str:
        if found["fed"]:
            return "fed"
        return ("a stall floor more workers did not lower" if found["plateau"]
                else "NOT fed: the most tried")

    mdata_note = (f"mdata {ours['size']} loaders + 1 constructor ({fed(ours)}; stall by loaders "
                  f"{ours['tried']}), {ours_gpu:.0f} MB/GPU")
    out: dict[str, object] = {
        f"memory.iso_mdata_loaders_{n}": figure(
            ours["size"], unit="loaders", note=f"mdata loader workers needed (+1 constructor); {shape}"),
    }
    if "error" in base:
        note = f"baseline not measured: {base['error']}; {mdata_note}; {shape}"
        out[f"memory.iso_ratio_{n}"] = figure(None, goal=">= 13.5" if n == 306 else "report", note=note)
        out[f"memory.iso_pss_mb_per_gpu_{n}"] = figure(ours_gpu, None, unit="MB", note=note)
        return out
    projected = project_baseline(base, ranks)
    base_gpu = projected["pss_mb"] / ranks
    out.update({
        f"memory.iso_ratio_{n}": figure(
            base_gpu / ours_gpu if ours_gpu > 0 else None, goal=">= 13.5" if n == 306 else "report",
            note=(f"baseline PSS per GPU (projected from {base['measured_ranks']} measured rank "
                  f"families) over mdata's, each at its smallest configuration feeding the "
                  f"trainers; baseline {base['size']} workers/rank ({fed(base)}; stall by workers "
                  f"{base['tried']}), {base_gpu:.0f} MB/GPU; {mdata_note}; {shape}")),
        f"memory.iso_workers_per_rank_{n}": figure(
            base["size"], unit="workers",
            note=f"DataLoader workers per rank the baseline needed (stall by workers {base['tried']}); {shape}"),
        f"memory.iso_pss_mb_per_gpu_{n}": figure(ours_gpu, base_gpu, unit="MB", note=shape),
    })
    return out


class _OverBudget(Exception):
    """A baseline configuration this machine cannot hold (see :class:`_Budget`)."""


def _config(quick: bool) -> dict:
    if quick:
        return dict(ranks=4, cp=2, row_group_mb=32, sources=(5,), measured_ranks=2,
                    baseline_workers=(1, 2), mdata_loaders=(1, 2), slowdown=SLOWDOWN, steps=(2, 6))
    return dict(ranks=16, cp=4, row_group_mb=64, sources=(5, 64, 306, 1024), measured_ranks=2,
                baseline_workers=BASELINE_WORKERS, mdata_loaders=MDATA_LOADERS, slowdown=SLOWDOWN,
                steps=(WARM, STEPS))


def iso_figures(quick: bool) -> dict[str, object]:
    """Every ``memory.iso_*`` figure (see the module docstring)."""
    cfg = _config(quick)
    out: dict[str, object] = {}
    budget = _Budget(LIMIT_MB)
    for n in cfg["sources"]:
        try:
            out.update(_point(cfg, n, budget))
        except Exception as exc:  # one point lost (a priming past its deadline): the others stand
            out[f"memory.iso_ratio_{n}"] = figure(
                None, goal=">= 13.5" if n == 306 else "report",
                note=f"not measured at {n} sources: {type(exc).__name__}: {exc}")
    return out


if __name__ == "__main__":  # some points, for a look: python -m benchmarks.memory_iso 5 306
    import json

    full = _config(False)
    picked = tuple(int(a) for a in sys.argv[1:]) or (5,)
    budget = _Budget(LIMIT_MB)
    print(json.dumps({k: v for n in picked for k, v in _point(full, n, budget).items()},
                     indent=1, default=str))
