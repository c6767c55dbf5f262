"""Loader-side CPU memory at production shape: what each system adds to a training job, at peak.

**Counting** (:mod:`benchmarks.counting`, the same for both systems). Every trainer rank is its own
process (spawned, as torchrun starts ranks) with a trainer's imports; one *bare trainer* with the
same imports and no loader runs beside it. A system's memory is the sum of the PSS of its loader
processes plus, for every rank, the rank's PSS less the bare trainer's, sampled every 150 ms
through the run; the figure is the **peak** of that sum over a run of the same number of delivered
steps on both sides (``STEPS``). The headline point is the median of 3 runs of each side (full
run); sweep points are single runs.

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
would hold far more than this shared machine may use (``LIMIT_MB``), so it runs with
``measured_ranks`` = 2 rank families of the full shape (a rank and its ``W`` workers) and is
projected to ``R`` ranks: everything scales with the number of families except the pages of
shared libraries (``.so`` files and the interpreter, read from ``/proc/PID/smaps``), which every
further family would share and which are counted once. The upper bound, everything scaled, is in
the notes and in ``memory.loader_pss_ratio_upper``. ``memory.baseline_projection_check`` projects one family to
the measured two and compares. Figures say which values are projections.

**Limits the baseline meets**: open file descriptors and memory maps per worker are read from
``/proc`` at the end of each baseline run and set against the usual soft limit (``ulimit -n``
1024), this machine's limits and ``vm.max_map_count``; RAM against a DGX H100 node (8 GPUs, 2 TiB).

**At equal throughput** (``memory.iso_*``, :mod:`benchmarks.memory_iso`): the same comparison with
each system sized to the smallest configuration that keeps paced trainers fed (stall under 1%),
the baseline's workers per rank found by measurement, over 5 / 64 / 306 / 1,024 sources.
"""

from __future__ import annotations

import resource
import sys
import time

from benchmarks.counting import PeakPss
from benchmarks.fleet import BaselineFleet, MdataFleet
from benchmarks.harness import figure
from benchmarks.memory_shape import (LIMIT_MB, MAX_TOKENS, MICRO_BATCHES, plan_for,
                                     project_baseline, weights_of)
from benchmarks.workload import production_sources

__all__ = ["LIMIT_MB", "measure_baseline", "measure_mdata", "project_baseline", "run"]

STEPS = 8  # delivered steps per rank, the same on both sides
LOADER_WORKERS = 4
NODE_GPUS, NODE_RAM_MB = 8, 2 * 1024 * 1024  # DGX H100: 8 GPUs, 2 TiB

_BEGAN = time.monotonic()


def _progress(what: str, out: dict) -> None:
    print(f"memory: {what}: peak {out['pss_mb']:.0f} MB ({out['samples']} samples) at "
          f"{time.monotonic() - _BEGAN:.0f} s", file=sys.stderr, flush=True)


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


def measure_baseline(num_sources: int, row_group_mb: int, ranks: int, workers: int) -> dict[str, float]:
    """Peak PSS the baseline adds with ``ranks`` x ``workers``, and its workers' fds and maps."""
    sources = production_sources(num_sources, row_group_mb)
    with BaselineFleet(sources, weights_of(sources), ranks=ranks, group=1, workers=workers,
                       max_tokens=MAX_TOKENS, micro_batches=MICRO_BATCHES, reader="stream") as fleet:
        with PeakPss(fleet.loader_pids, fleet.rank_pids, fleet.bare_pid) as pss:
            fleet.run(STEPS)
        out = {"pss_mb": pss.peak_mb, **pss.at_peak, **_limits_of(fleet.worker_pids()),
               "samples": pss.samples, "measured_ranks": ranks, "library_mb": pss.library_mb}
    _progress(f"baseline {ranks}x{workers}, {num_sources} sources, rg {row_group_mb}", out)
    return out


def measure_mdata(num_sources: int, row_group_mb: int, ranks: int, cp: int) -> dict[str, float]:
    """Peak PSS mdata adds: cluster host, Dask workers, and every rank's client and Loader."""
    sources = production_sources(num_sources, row_group_mb)
    with MdataFleet(sources, plan_for(sources, ranks, cp), loader_workers=LOADER_WORKERS) as fleet:
        with PeakPss(fleet.loader_pids, fleet.rank_pids, fleet.bare_pid) as pss:
            fleet.run(STEPS)
        out = {"pss_mb": pss.peak_mb, **pss.at_peak, "samples": pss.samples}
    _progress(f"mdata {ranks} ranks, {num_sources} sources, rg {row_group_mb}", out)
    return out


def _median_run(measure, repeats: int) -> dict:
    """The run with the median peak of ``repeats`` runs of ``measure()`` (its breakdown intact)."""
    runs = sorted((measure() for _ in range(max(1, repeats))), key=lambda r: r["pss_mb"])
    out = dict(runs[len(runs) // 2])
    out["repeats"] = [round(r["pss_mb"]) for r in runs]
    return out


def _point(cfg: dict, num_sources: int, row_group_mb: int, guess_family_mb: float,
           repeats: int = 1) -> dict:
    """Both systems at one (sources, row-group size): mdata measured, the baseline projected;
    each the median of ``repeats`` runs."""
    out: dict = {}
    measured_ranks = cfg["measured_ranks"]
    if guess_family_mb * measured_ranks + 500 <= LIMIT_MB:
        out["measured"] = _median_run(lambda: measure_baseline(
            num_sources, row_group_mb, measured_ranks, cfg["workers"]), repeats)
        out["baseline"] = project_baseline(out["measured"], cfg["ranks"])
    try:
        out["mdata"] = _median_run(lambda: measure_mdata(
            num_sources, row_group_mb, cfg["ranks"], cfg["cp"]), repeats)
    except Exception as exc:  # the runtime may fail here: say so, never invent a number
        print(f"memory: mdata at {num_sources} sources failed: {exc}", file=sys.stderr)
        out["mdata_error"] = f"{type(exc).__name__}: {exc}"
    return out


def _config(quick: bool) -> dict:
    if quick:
        return dict(ranks=4, cp=2, workers=2, row_group_mb=32, sources=(16,), row_groups=(32,),
                    headline_sources=16, measured_ranks=2, repeats=1)
    return dict(ranks=16, cp=4, workers=4, row_group_mb=64, sources=(8, 64, 256, 1024),
                row_groups=(32, 64, 128), headline_sources=64, measured_ranks=2, repeats=3)


def _shape(cfg: dict) -> str:
    return (f"{cfg['ranks']} ranks (cp={cfg['cp']}) x {cfg['workers']} DataLoader workers; mdata "
            f"{LOADER_WORKERS} loader workers + 1 constructor; peak over {STEPS} delivered steps")


def _note(point: dict) -> str:
    parts = []
    if "baseline" in point:
        b, m = point["baseline"], point["measured"]
        parts.append(f"baseline PROJECTED from {m['measured_ranks']} measured rank families "
                     f"({b['per_family_mb']:.0f} MB each; shared libraries' {m['library_mb']:.0f} MB "
                     f"counted once; all scaled: {b['upper_mb']:.0f} MB)")
    else:
        parts.append("baseline not run: its measured fleet would exceed this machine's budget")
    if "mdata" in point:
        m = point["mdata"]
        parts.append(f"mdata measured: {m['loader_processes']:.0f} processes {m['loader_processes_mb']:.0f} MB"
                     f" + ranks over bare {m['ranks_over_bare_mb']:.0f} MB")
        if len(m.get("repeats", ())) > 1:
            parts.append(f"median of {len(m['repeats'])} runs (mdata {m['repeats']} MB, baseline "
                         f"families {point.get('measured', {}).get('repeats')} MB)")
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
    family = 250.0 + cfg["workers"] * 300.0  # MB per baseline rank family, refined as measured

    def point(n: int, rg: int) -> dict:
        nonlocal family
        if (n, rg) not in points:
            headline = (n, rg) == (cfg["headline_sources"], cfg["row_group_mb"])
            points[(n, rg)] = p = _point(cfg, n, rg, family, cfg["repeats"] if headline else 1)
            if "baseline" in p:
                family = max(family, p["baseline"]["per_family_mb"])
        return points[(n, rg)]

    for n in cfg["sources"]:
        p = point(n, cfg["row_group_mb"])
        figures[f"memory.loader_pss_mb_{n}_sources"] = _fig(
            p, f"{n} sources, row groups {cfg['row_group_mb']} MiB; {_shape(cfg)}")
        if "measured" in p:
            lim = p["measured"]
            figures[f"memory.baseline_fds_per_worker_{n}_sources"] = figure(
                lim["fds"], unit="fds",
                note=(f"most open file descriptors of one baseline worker (measured); soft limit "
                      f"here {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}, common default 1024; "
                      f"memory maps per worker {lim['maps']} (vm.max_map_count 65530)"))
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
    if ours and base:
        figures["memory.loader_pss_ratio_upper"] = figure(
            head["baseline"]["upper_mb"] / ours,
            note="the same with the baseline's measured families scaled whole (upper bound)")
    if ours:
        figures["memory.mdata_per_rank_mb"] = figure(
            head["mdata"]["ranks_over_bare_mb"] / cfg["ranks"], unit="MB",
            note="what one rank's client + Loader add over a bare trainer, at mdata's peak")

    # The projection checked: from one rank family to the measured fleet of measured_ranks.
    if "measured" in head:
        one = measure_baseline(cfg["headline_sources"], cfg["row_group_mb"], 1, cfg["workers"])
        projected = project_baseline(one, cfg["measured_ranks"])
        measured = head["measured"]["pss_mb"]
        figures["memory.baseline_projection_check"] = figure(
            projected["pss_mb"] / measured, goal="~1 (< 1: the projection favours the baseline)",
            note=(f"projected from 1 rank family {projected['pss_mb']:.0f} MB (all scaled "
                  f"{projected['upper_mb']:.0f} MB) / measured {measured:.0f} MB at "
                  f"{cfg['measured_ranks']} ranks x {cfg['workers']} workers, {cfg['headline_sources']} sources"))
    # Memory at equal throughput: each system at the smallest configuration feeding the trainers.
    from benchmarks.memory_iso import iso_figures

    figures.update(iso_figures(quick))
    if base:
        per_node = base / cfg["ranks"] * NODE_GPUS
        figures["memory.baseline_node_mb"] = figure(
            per_node, unit="MB", note=(f"PROJECTED baseline loader memory per {NODE_GPUS}-GPU node at "
                                       f"{cfg['headline_sources']} sources; a DGX H100 has "
                                       f"{NODE_RAM_MB // 1024} GiB"))
    return figures
