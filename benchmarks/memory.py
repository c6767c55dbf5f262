"""Loader-side CPU memory at production shape: what each system adds to a training job, at peak.

**Counting** (:mod:`benchmarks.counting`, the same for both systems). Every trainer rank is its own
process (spawned, as torchrun starts ranks) with a trainer's imports; one *bare trainer* with the
same imports and no loader runs beside it. A system's memory is the sum of the PSS of its loader
processes plus, for every rank, the rank's PSS less the bare trainer's, sampled every 150 ms
through the run; the figure is the **peak** of that sum over a run of the same number of delivered
steps on both sides (``STEPS``).

* **Baseline** (:class:`~benchmarks.fleet.BaselineFleet`, ``reader="stream"``): each rank runs a
  ``DataLoader`` of ``W`` forked workers; every worker opens every source and streams its row
  groups with pyarrow's best streaming settings (``benchmarks/baseline_stream.py``: buffered
  reads of 1 MiB, no pre-buffering, ``iter_batches`` of one chunk's rows, declared columns only).
  Counted: workers, and the ranks' DataLoader iterators and in-flight batches (rank over bare).
* **mdata** (:class:`~benchmarks.fleet.MdataFleet`): the cluster host (scheduler with the
  Planner, nannies), every Dask worker (``LOADER_WORKERS`` loader pools with the sources dealt
  round-robin, one constructor), and each rank's client and Loader (rank over bare). mdata's
  Parquet reader streams the same way (``mdata/sources/parquet_reader.py``).

**Data** (:func:`benchmarks.workload.production_corpus`): the example corpus re-written with row
groups of 32-128 MiB of decoded data, one file per kind; ``S`` sources are views over these files
(several sources share a file, each with its own readers and buffers in every process that opens
it). Chunk rows per kind give a few MiB per chunk on both sides.

**Measured and projected.** mdata runs at the full shape. The baseline at 16 ranks x 4 workers
would hold far more than this shared machine may use (``LIMIT_MB``), so it is measured with one
rank and one, then two DataLoader workers, and projected linearly: every further worker costs
what the second cost, every further rank what the first rank cost without its worker (marginal
costs leave out pages shared by all processes, so the projection errs low: towards the
baseline). The projection is checked against a direct measurement at a shape that fits
(``memory.baseline_projection_check``). Figures say which values are projections.

**Limits the baseline meets**: open file descriptors and memory maps per worker are read from
``/proc`` at the end of each baseline run and set against the usual soft limit (``ulimit -n``
1024), this machine's limits and ``vm.max_map_count``; RAM against a DGX H100 node (8 GPUs, 2 TiB).
"""

from __future__ import annotations

import resource
import sys

from benchmarks.baseline import IMAGE_TOKEN_ID
from benchmarks.counting import PeakPss
from benchmarks.fleet import BaselineFleet, MdataFleet
from benchmarks.harness import figure
from benchmarks.workload import production_sources
from mdata.cost import AttentionCost
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

__all__ = ["LIMIT_MB", "measure_baseline", "measure_mdata", "run"]

LIMIT_MB = 10 * 1024  # no single measured fleet may project above this (the machine is shared)
MAX_TOKENS = 4096
MICRO_BATCHES = 2
STEPS = 8  # delivered steps per rank, the same on both sides
LOADER_WORKERS = 4
NODE_GPUS, NODE_RAM_MB = 8, 2 * 1024 * 1024  # DGX H100: 8 GPUs, 2 TiB


def _weights(sources) -> dict[str, float]:
    return {s.name: 1.0 for s in sources}


def _plan(sources, ranks: int, cp: int):
    dp = ranks // cp
    return (Plan(sources).mix(_weights(sources)).cost(AttentionCost())
            .balance(micro_batches=MICRO_BATCHES, max_tokens=MAX_TOKENS, global_batch=dp * 8)
            .distribute(ClientPlaceTree(dp=dp, cp=cp)).seed(0)
            .special_tokens(image_token_id=IMAGE_TOKEN_ID))


def _limits_of(pids) -> dict[str, float]:
    """Most open file descriptors and memory maps of any of ``pids`` (read from /proc)."""
    import psutil

    fds = maps = 0
    for p in pids:
        try:
            fds = max(fds, psutil.Process(p).num_fds())
            with open(f"/proc/{p}/maps") as f:
                maps = max(maps, sum(1 for _ in f))
        except (OSError, psutil.Error):
            continue
    return {"fds": fds, "maps": maps}


def measure_baseline(num_sources: int, row_group_mb: int, ranks: int, workers: int,
                     cp: int = 1) -> dict[str, float]:
    """Peak PSS the baseline adds with ``ranks`` x ``workers``, and its workers' fds and maps."""
    sources = production_sources(num_sources, row_group_mb)
    with BaselineFleet(sources, _weights(sources), ranks=ranks, group=min(cp, ranks),
                       workers=workers, max_tokens=MAX_TOKENS, micro_batches=MICRO_BATCHES,
                       reader="stream") as fleet:
        with PeakPss(fleet.loader_pids, fleet.rank_pids, fleet.bare_pid) as pss:
            fleet.run(STEPS)
        return {"pss_mb": pss.peak_mb, **pss.at_peak, **_limits_of(fleet.worker_pids()),
                "samples": pss.samples}


def measure_mdata(num_sources: int, row_group_mb: int, ranks: int, cp: int) -> dict[str, float]:
    """Peak PSS mdata adds: cluster host, Dask workers, and every rank's client and Loader."""
    sources = production_sources(num_sources, row_group_mb)
    with MdataFleet(sources, _plan(sources, ranks, cp), loader_workers=LOADER_WORKERS) as fleet:
        with PeakPss(fleet.loader_pids, fleet.rank_pids, fleet.bare_pid) as pss:
            fleet.run(STEPS)
        return {"pss_mb": pss.peak_mb, **pss.at_peak, "samples": pss.samples}


def project_baseline(one: dict, two: dict, ranks: int, workers: int) -> dict[str, float]:
    """Baseline at ``ranks`` x ``workers`` from runs with one rank and 1 (``one``), 2 (``two``)
    workers: each further worker costs what the second did, each further rank the first's cost
    without its worker."""
    per_worker = max(0.0, two["pss_mb"] - one["pss_mb"])
    per_rank = max(0.0, one["pss_mb"] - per_worker)  # the rank's iterator and batches
    total = two["pss_mb"] + (ranks * workers - 2) * per_worker + (ranks - 1) * per_rank
    return {"pss_mb": total, "per_worker_mb": per_worker, "per_rank_mb": per_rank}


def _fits(estimate_mb: float) -> bool:
    return estimate_mb <= LIMIT_MB


def _baseline_pair(num_sources: int, row_group_mb: int, guess_worker_mb: float) -> dict | None:
    """The two small baseline runs a projection needs, or None when even they would not fit."""
    if not _fits(2 * guess_worker_mb + 2 * 250):
        return None
    one = measure_baseline(num_sources, row_group_mb, 1, 1)
    two = measure_baseline(num_sources, row_group_mb, 1, 2)
    return {"one": one, "two": two}


def _point(cfg: dict, num_sources: int, row_group_mb: int, guess_worker_mb: float) -> dict:
    """Both systems at one (sources, row-group size): mdata measured, the baseline projected."""
    out: dict = {}
    pair = _baseline_pair(num_sources, row_group_mb, guess_worker_mb)
    if pair is not None:
        out["pair"] = pair
        out["baseline"] = project_baseline(pair["one"], pair["two"], cfg["ranks"], cfg["workers"])
    try:
        out["mdata"] = measure_mdata(num_sources, row_group_mb, cfg["ranks"], cfg["cp"])
    except Exception as exc:  # the runtime may fail here: say so, never invent a number
        print(f"memory: mdata at {num_sources} sources failed: {exc}", file=sys.stderr)
        out["mdata_error"] = f"{type(exc).__name__}: {exc}"
    return out


def _config(quick: bool) -> dict:
    if quick:
        return dict(ranks=4, cp=2, workers=2, row_group_mb=32, sources=(8, 16), row_groups=(32,),
                    headline_sources=16, check=dict(ranks=2, workers=2))
    return dict(ranks=16, cp=4, workers=4, row_group_mb=64, sources=(8, 64, 256, 1024),
                row_groups=(32, 64, 128), headline_sources=64, check=dict(ranks=2, workers=4))


def _shape(cfg: dict) -> str:
    return (f"{cfg['ranks']} ranks (cp={cfg['cp']}) x {cfg['workers']} DataLoader workers; mdata "
            f"{LOADER_WORKERS} loader workers + 1 constructor; peak over {STEPS} delivered steps")


def _note(point: dict) -> str:
    parts = []
    if "baseline" in point:
        b = point["baseline"]
        parts.append(f"baseline PROJECTED from 1 rank x 1 and x 2 workers ({b['per_worker_mb']:.0f} MB "
                     f"per worker, {b['per_rank_mb']:.0f} MB per rank)")
    else:
        parts.append("baseline not run: even one rank with one worker would exceed this machine's budget")
    if "mdata" in point:
        m = point["mdata"]
        parts.append(f"mdata measured: {m['loader_processes']:.0f} processes {m['loader_processes_mb']:.0f} MB"
                     f" + ranks over bare {m['ranks_over_bare_mb']:.0f} MB")
    else:
        parts.append(f"mdata not measured: {point.get('mdata_error')}")
    return "; ".join(parts)


def _fig(point: dict, note: str) -> dict:
    ours = point.get("mdata", {}).get("pss_mb")
    base = point.get("baseline", {}).get("pss_mb")
    return figure(ours, base, unit="MB", goal="ratio >= 13.5", note=f"{note}; {_note(point)}")


def run(quick: bool) -> dict[str, object]:
    cfg = _config(quick)
    figures: dict[str, object] = {}
    points: dict[tuple[int, int], dict] = {}
    guess = 300.0  # MB per baseline worker, refined from each measured point

    def point(n: int, rg: int) -> dict:
        nonlocal guess
        if (n, rg) not in points:
            # a worker's per-source buffers grow with n: scale the last per-worker figure
            points[(n, rg)] = p = _point(cfg, n, rg, guess)
            if "baseline" in p:
                guess = max(guess, p["baseline"]["per_worker_mb"])
        return points[(n, rg)]

    for n in cfg["sources"]:
        known = [(k, p["baseline"]["per_worker_mb"]) for (k, rg), p in points.items() if "baseline" in p]
        if known:
            k, w = max(known)
            guess = w * max(1.0, n / k) ** 0.8
        p = point(n, cfg["row_group_mb"])
        figures[f"memory.loader_pss_mb_{n}_sources"] = _fig(
            p, f"{n} sources, row groups {cfg['row_group_mb']} MiB; {_shape(cfg)}")
        if "pair" in p:
            lim = p["pair"]["two"]
            figures[f"memory.baseline_fds_per_worker_{n}_sources"] = figure(
                lim["fds"], unit="fds",
                note=(f"most open file descriptors of one baseline worker (measured); soft limit "
                      f"here {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}, common default 1024; "
                      f"maps per worker {lim['maps']} of vm.max_map_count"))
    for rg in cfg["row_groups"]:
        p = point(cfg["headline_sources"], rg)
        figures[f"memory.loader_pss_mb_rg{rg}"] = _fig(
            p, f"{cfg['headline_sources']} sources, row groups {rg} MiB; {_shape(cfg)}")

    head = point(cfg["headline_sources"], cfg["row_group_mb"])
    desc = f"{cfg['headline_sources']} sources x {_shape(cfg)}, row groups {cfg['row_group_mb']} MiB"
    figures["memory.loader_pss_mb"] = _fig(head, desc)
    ours = head.get("mdata", {}).get("pss_mb")
    base = head.get("baseline", {}).get("pss_mb")
    figures["memory.loader_pss_ratio"] = figure(
        base / ours if ours and base else None, goal=">= 13.5",
        note=f"baseline (projected) / mdata (measured) peak PSS added; {desc}")
    if ours:
        figures["memory.mdata_per_rank_mb"] = figure(
            head["mdata"]["ranks_over_bare_mb"] / cfg["ranks"], unit="MB",
            note="what one rank's client + Loader add over a bare trainer, at mdata's peak")

    # The projection against a direct measurement of the baseline at a shape that fits.
    chk = cfg["check"]
    if "pair" in head:
        direct = measure_baseline(cfg["headline_sources"], cfg["row_group_mb"], chk["ranks"],
                                  chk["workers"], cp=chk["ranks"])
        projected = project_baseline(head["pair"]["one"], head["pair"]["two"], chk["ranks"],
                                     chk["workers"])["pss_mb"]
        figures["memory.baseline_projection_check"] = figure(
            projected / direct["pss_mb"], goal="~1 (< 1: the projection favours the baseline)",
            note=(f"projected {projected:.0f} MB / measured {direct['pss_mb']:.0f} MB at "
                  f"{chk['ranks']} ranks x {chk['workers']} workers, {cfg['headline_sources']} sources"))
    if base:
        per_node = base / cfg["ranks"] * NODE_GPUS
        figures["memory.baseline_node_mb"] = figure(
            per_node, unit="MB", note=(f"PROJECTED baseline loader memory per {NODE_GPUS}-GPU node at "
                                       f"{cfg['headline_sources']} sources; a DGX H100 has "
                                       f"{NODE_RAM_MB // 1024} GiB"))
    return figures
