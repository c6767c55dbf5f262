"""Loader-side CPU memory: sum of PSS of every loader process, mdata beside the per-rank baseline.

**Baseline** (``benchmarks/baseline.py`` in :class:`~benchmarks.fleet.BaselineFleet`): ``R`` rank
processes, each with a ``DataLoader`` of ``W`` workers, every worker holding its own reader state
for all ``S`` sources. Counted: the PSS of every DataLoader worker process after each has opened
every source and produced batches. *Not* counted: the rank processes' own loader share (the
DataLoader's in-flight batches, its iterator), which cannot be separated from the trainer's
torch; and the rank processes are forked from one parent, so the torch pages they share are split
among them. Both choices lower the baseline's number.

**mdata** (:class:`~benchmarks.fleet.MdataFleet`): the cluster host (Dask scheduler with the
Planner, and the nannies), every Dask worker process (loader pools and the constructor), and the
trainer-side Loader buffers (prefetch depth x the bytes of one rank's batch, for every rank),
delivering the same steps to the same ``R`` ranks (mesh ``dp = R / cp``, ``cp`` ranks per DP group).
Loader pools: ``L`` workers, the sources dealt round-robin over them (several cheap sources share
one pool rather than each holding workers of its own).

Many sources come from :func:`benchmarks.workload.many_sources`: each source reads one shard file
of the example corpus, so several sources share underlying files (each still has its own reader,
listing and buffers in every process that opens it, which is what is measured).

Peak memory of the run is kept under ``LIMIT_MB``: a configuration whose projected baseline size
exceeds it is skipped and listed as not run, and the largest configuration that ran is reported.
"""

from __future__ import annotations

import sys

from benchmarks.baseline import IMAGE_TOKEN_ID
from benchmarks.fleet import BaselineFleet, MdataFleet, pss_mb
from benchmarks.harness import figure
from benchmarks.workload import many_sources
from mdata.cost import AttentionCost
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

__all__ = ["LIMIT_MB", "measure", "run"]

LIMIT_MB = 12 * 1024
MAX_TOKENS = 4096
MICRO_BATCHES = 2
PREFETCH = 2  # mdata.trainer.Loader's default prefetch depth


def _weights(sources) -> dict[str, float]:
    return {s.name: 1.0 for s in sources}


def _plan(sources, ranks: int, cp: int):
    dp = ranks // cp
    return (Plan(sources).mix(_weights(sources)).cost(AttentionCost())
            .balance(micro_batches=MICRO_BATCHES, max_tokens=MAX_TOKENS, global_batch=dp * 8)
            .distribute(ClientPlaceTree(dp=dp, cp=cp)).seed(0)
            .special_tokens(image_token_id=IMAGE_TOKEN_ID))


def measure_baseline(num_sources: int, ranks: int, cp: int, workers: int) -> dict[str, float]:
    """PSS of the baseline's DataLoader workers after each produced a few batches."""
    sources = many_sources(num_sources)
    with BaselineFleet(sources, _weights(sources), ranks=ranks, group=cp, workers=workers,
                       max_tokens=MAX_TOKENS, micro_batches=MICRO_BATCHES) as fleet:
        fleet.run(2 * workers)  # every worker has produced >= 2 batches (and prefetched more)
        pids = fleet.worker_pids()
        return {"pss_mb": pss_mb(pids), "processes": len(pids),
                "rank_pss_mb": pss_mb(fleet.rank_pids)}


def measure_mdata(num_sources: int, ranks: int, cp: int, loader_workers: int) -> dict[str, float]:
    """PSS of mdata's cluster host and Dask workers plus the trainers' Loader buffers."""
    sources = many_sources(num_sources)
    with MdataFleet(sources, _plan(sources, ranks, cp), loader_workers=loader_workers) as fleet:
        stats = fleet.run(4)
        pids = [fleet.host_pid, *fleet.worker_pids]
        buffers = PREFETCH * stats.batch_bytes * ranks / (1 << 20)
        return {"pss_mb": pss_mb(pids) + buffers, "processes": len(pids), "buffers_mb": buffers}


def measure(num_sources: int, ranks: int, cp: int, workers: int, loader_workers: int,
            per_worker_mb: float | None = None) -> dict[str, object]:
    """Both systems at one configuration; ``skipped`` when the baseline would not fit."""
    if per_worker_mb is not None and _projected(per_worker_mb, ranks, workers) > LIMIT_MB:
        return {"skipped": f"projected {_projected(per_worker_mb, ranks, workers):.0f} MB > "
                           f"{LIMIT_MB} MB on this machine"}
    out: dict[str, object] = {"baseline": measure_baseline(num_sources, ranks, cp, workers)}
    try:
        out["mdata"] = measure_mdata(num_sources, ranks, cp, loader_workers)
    except Exception as exc:  # the runtime may not run here yet: say so, never invent a number
        print(f"memory: mdata at {num_sources} sources failed: {exc}", file=sys.stderr)
        out["mdata_error"] = f"{type(exc).__name__}: {exc}"
    return out


def _projected(per_worker_mb: float, ranks: int, workers: int) -> float:
    """Baseline footprint: workers plus ~per_worker/2 for each rank process (measured ~0.45x)."""
    return per_worker_mb * (ranks * workers + ranks / 2)


def _describe(cfg: dict) -> str:
    return (f"{cfg['num_sources']} sources x {cfg['ranks']} ranks (cp={cfg['cp']}) x "
            f"{cfg['workers']} workers; mdata: {cfg['loader_workers']} loader workers + 1 constructor")


def run(quick: bool) -> dict[str, object]:
    if quick:
        wanted = [dict(num_sources=16, ranks=4, cp=2, workers=2, loader_workers=2)]
        sweep, sweep_cfg = (8, 16), dict(ranks=4, cp=2, workers=2, loader_workers=2)
    else:
        # The target configuration first, then smaller ones if it cannot fit under LIMIT_MB here.
        wanted = [dict(num_sources=64, ranks=r, cp=4, workers=w, loader_workers=4)
                  for r, w in ((16, 4), (16, 2), (8, 4), (8, 2))]
        sweep, sweep_cfg = (8, 32, 64, 128, 256), dict(ranks=4, cp=2, workers=4, loader_workers=4)
    figures: dict[str, object] = {}

    per_worker: dict[int, float] = {}
    done: dict[tuple, dict] = {}
    for n in sweep:
        cfg = dict(num_sources=n, **sweep_cfg)
        known = [v for k, v in per_worker.items() if k <= n]
        res = measure(**cfg, per_worker_mb=1.5 * max(known) if known else None)
        done[tuple(sorted(cfg.items()))] = res
        key = f"memory.loader_pss_mb_{n}_sources"
        if "skipped" in res:
            figures[key] = figure(None, None, unit="MB", note=f"not run: {res['skipped']}; {_describe(cfg)}")
            continue
        base = res["baseline"]
        per_worker[n] = base["pss_mb"] / base["processes"]
        ours = res.get("mdata", {}).get("pss_mb")
        figures[key] = figure(ours, base["pss_mb"], unit="MB", goal="ratio >= 13.5",
                              note=_describe(cfg) + (f"; mdata not measured: {res['mdata_error']}"
                                                     if "mdata_error" in res else ""))

    estimate = max([v for k, v in per_worker.items() if k <= 64] or [0.0]) * 1.1 or None
    skipped = []
    for cfg in wanted:
        if estimate and _projected(estimate, cfg["ranks"], cfg["workers"]) > LIMIT_MB:
            skipped.append(f"{cfg['ranks']} ranks x {cfg['workers']} workers (projected "
                           f"{_projected(estimate, cfg['ranks'], cfg['workers']):.0f} MB)")
            continue
        break
    else:
        raise RuntimeError(f"no memory configuration fits under {LIMIT_MB} MB: {skipped}")
    res = done.get(tuple(sorted(cfg.items()))) or measure(**cfg)  # quick: the sweep's last point
    base = res["baseline"]["pss_mb"]
    ours = res.get("mdata", {}).get("pss_mb")
    note = _describe(cfg) + ("" if ours is not None else f"; mdata not measured: {res['mdata_error']}")
    note += (f"; baseline: {res['baseline']['processes']} worker processes (rank processes' "
             f"{res['baseline']['rank_pss_mb']:.0f} MB not counted)")
    if ours is not None:
        note += (f"; mdata: {res['mdata']['processes']} processes + "
                 f"{res['mdata']['buffers_mb']:.1f} MB Loader buffers")
    if skipped:
        note += "; did not fit here: " + ", ".join(skipped)
    figures["memory.loader_pss_mb"] = figure(ours, base, unit="MB", goal="ratio >= 13.5", note=note)
    figures["memory.loader_pss_ratio"] = figure(
        base / ours if ours else None, goal=">= 13.5",
        note="baseline PSS / mdata PSS" + ("" if ours else "; mdata not measured"))
    return figures
