"""Delivered samples per loader core, and how long a trainer stalls waiting for data.

Both systems read the example corpus's sources (real tokenizer, real image decode: the same
transforms through :func:`mdata.sources.load_chunk`) and feed the same ranks
(:mod:`benchmarks.fleet`):

* ``throughput.samples_per_core_ratio``: distinct samples delivered (once per DP group) per CPU
  second of everything each system adds, measured over a window after warm-up with the trainers
  consuming as fast as they can. Every rank is its own process on both sides (spawned, as under
  torchrun) and CPU is counted as :func:`benchmarks.counting.added_cpu_seconds` does, the same
  way as the memory figure: baseline, the DataLoader workers plus the rank processes (their
  iterators: unpickling, collation) less a bare trainer; mdata, the cluster host (scheduler +
  Planner + nannies), every Dask worker, plus the rank processes (client, Loader threads) less
  a bare trainer. Both systems run in this one call, one after the other, on the same data.
* ``throughput.trainer_stall_fraction``: each rank sleeps for its batch's
  :class:`~mdata.cost.AttentionCost` times a fixed seconds-per-cost (a forward/backward stand-in)
  and meets the other ranks every step; stall = time blocked on the next batch / rank wall time.
  The cost is of whole documents on both sides (an mdata rank under CP holds pieces of them and
  is paced from ``cu_seqlens_global``; until 2026-12-07 it was paced on its pieces, so its
  trainers ran faster than the baseline's on the same work).

On this 2-core machine every process of both systems shares the same two cores with the
simulated trainers, so absolute rates are indicative; the ratio is measured within one run.
"""

from __future__ import annotations

import sys

from benchmarks.baseline import IMAGE_TOKEN_ID
from benchmarks.counting import added_cpu_seconds
from benchmarks.fleet import BaselineFleet, MdataFleet
from benchmarks.harness import figure
from benchmarks.mixture import WEIGHTS
from benchmarks.workload import corpus_dir
from mdata.cost import AttentionCost
from mdata.data.example import example_sources
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

__all__ = ["run"]

MAX_TOKENS = 4096
MICRO_BATCHES = 2
SECONDS_PER_COST = 2e-10  # ~0.1 s of simulated compute for 2 x 4k tokens of long documents


def _config(quick: bool) -> dict:
    if quick:
        return dict(ranks=4, cp=2, workers=2, loader_workers=2, warm=4, steps=24)
    return dict(ranks=8, cp=2, workers=4, loader_workers=2, warm=6, steps=64)


def _sources_and_weights():
    sources = example_sources(corpus_dir())
    return sources, {s.name: WEIGHTS.get(s.name, 1.0) for s in sources}


def _baseline(cfg: dict) -> dict[str, float]:
    sources, weights = _sources_and_weights()
    with BaselineFleet(sources, weights, ranks=cfg["ranks"], group=cfg["cp"], workers=cfg["workers"],
                       max_tokens=MAX_TOKENS, micro_batches=MICRO_BATCHES) as fleet:
        return _measure(fleet, cfg)


def _mdata(cfg: dict) -> dict[str, float]:
    sources, weights = _sources_and_weights()
    dp = cfg["ranks"] // cfg["cp"]
    plan = (Plan(sources).mix(weights).cost(AttentionCost())
            .balance(micro_batches=MICRO_BATCHES, max_tokens=MAX_TOKENS, global_batch=dp * 8)
            .distribute(ClientPlaceTree(dp=dp, cp=cfg["cp"])).seed(0)
            .special_tokens(image_token_id=IMAGE_TOKEN_ID))
    with MdataFleet(sources, plan, loader_workers=cfg["loader_workers"]) as fleet:
        return _measure(fleet, cfg)


def _measure(fleet, cfg: dict) -> dict[str, float]:
    """The same protocol for both systems: warm up, then a fast run for samples per CPU-second
    of what the system adds, then a paced run (simulated compute) for the stall fraction."""
    fleet.run(cfg["warm"])
    cpu0 = added_cpu_seconds(fleet)
    fast = fleet.run(cfg["steps"])
    cpu = added_cpu_seconds(fleet) - cpu0
    paced = fleet.run(cfg["steps"], SECONDS_PER_COST)
    return {"samples_per_core_s": fast.samples / max(cpu, 1e-9), "samples_per_s": fast.samples / fast.wall_s,
            "stall": paced.stall_fraction, "cpu_s": cpu, "samples": fast.samples}


def run(quick: bool) -> dict[str, object]:
    cfg = _config(quick)
    base = _baseline(cfg)
    try:
        ours, why = _mdata(cfg), ""
    except Exception as exc:  # the runtime may not run here yet: say so, never invent a number
        print(f"throughput: mdata failed: {exc}", file=sys.stderr)
        ours, why = None, f"; mdata not measured: {type(exc).__name__}: {exc}"
    setup = (f"{cfg['ranks']} ranks (cp={cfg['cp']}), baseline {cfg['workers']} workers/rank, mdata "
             f"{cfg['loader_workers']} loader workers + 1 constructor; {cfg['steps']} steps of "
             f"{MICRO_BATCHES} x {MAX_TOKENS} tokens")
    per_core = None if ours is None else ours["samples_per_core_s"]
    return {
        "throughput.samples_per_core": figure(
            per_core, base["samples_per_core_s"], unit="samples/cpu-s", goal="higher is better",
            note=f"{setup}; CPU of everything each system adds (ranks each a process, less a bare trainer){why}"),
        "throughput.samples_per_core_ratio": figure(
            None if ours is None else per_core / base["samples_per_core_s"], goal="> 1",
            note=f"mdata / baseline samples per CPU-second each system adds{why}"),
        "throughput.samples_per_s": figure(
            None if ours is None else ours["samples_per_s"], base["samples_per_s"],
            unit="samples/s", goal="indicative (2 shared cores)", note=f"{setup}{why}"),
        "throughput.trainer_stall_fraction": figure(
            None if ours is None else ours["stall"], base["stall"],
            ratio=None if ours is None or ours["stall"] <= 0 else base["stall"] / ours["stall"],
            goal="lower is better",
            note=f"wait for data / rank wall time, compute = AttentionCost x {SECONDS_PER_COST:g} s; {setup}{why}"),
    }
