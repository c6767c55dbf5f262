"""Lineage over a whole long run: the scheduler's memory stays flat, old stories stay quick.

A run of many small steps (two sources, DP 4, 32 samples a step) drives the pure Planner
(``PlannerState``) directly, as the scheduler's runtime does: chunk loads, deliveries and every
rank's consumption. It keeps ``lineage-steps`` consumed steps of lineage in memory and hands older
ranges to the scheduler's :class:`~scheduler_plugins.lineage_store.LineageStore`, whose thread
writes them as Parquet files in a temporary folder.

- ``lineage.scheduler_bytes_per_step``: the slope (least squares, bytes per consumed step) of the
  DGraph's in-memory bytes (``DGraph.nbytes()``: its columns' allocated capacity, buffered rows
  and indexes) once the retention is full; about 0 means flat. ``lineage.unbounded_bytes_per_step``
  is the same slope for a DGraph that keeps everything (a fifth of the run suffices to see it).
  ``lineage.scheduler_bytes.step_<n>`` are the in-memory bytes after ``n`` steps.
- ``lineage.story_ms``: the median time of the story of a sample planned at step 0 (every
  occurrence over the whole run; its first is in the oldest spilled files), as the story handler
  runs it: copy the DGraph's part, then read the spilled ranges.

``--quick`` runs 2,000 steps with a retention of 200 instead of 10,000 with 1,000 (the default).
"""

from __future__ import annotations

import statistics
import tempfile
import time
import types
from collections import deque

import numpy as np

from mdata.mesh import ClientPlaceTree
from mdata.metadata import SourceMetadata
from mdata.plan import Plan
from mdata.planner import (
    BatchDelivered, ChunkLoaded, ConstructStep, LoadChunk, PlannerState, RanksConsumed, StepReady,
    Tick,
)

DP = 4
GLOBAL_BATCH = 32


def _metadata() -> dict[str, SourceMetadata]:
    rng = np.random.default_rng(0)
    out = {}
    for name, rows in (("web", 4000), ("code", 1500)):
        tokens = [np.clip(rng.lognormal(6.0, 1.0, rows), 1, 8000).astype(np.int32) for _ in range(4)]
        out[name] = SourceMetadata.from_arrays(name, tokens)
    return out


def _plan() -> Plan:
    return (Plan(["web", "code"]).mix({"web": 3, "code": 1})
            .balance(micro_batches=2, max_tokens=8192, global_batch=GLOBAL_BATCH)
            .distribute(ClientPlaceTree(dp=DP)).window(2))


def _drive(state: PlannerState, meta, steps: int, every: int, on_sample=None) -> dict[int, int]:
    """Run ``steps`` steps; returns the DGraph's bytes after every ``every`` consumed steps."""
    queue = deque(state.handle(Tick(stimulus_id="start")))
    sizes: dict[int, int] = {}
    ranks = tuple(range(DP))
    while state.consumed_step < steps:
        ins = queue.popleft()
        if isinstance(ins, LoadChunk):
            ref = ins.chunk
            rows, tok, pat, bad = meta[ref.source].rows_of(ref.shard, ref.start, ref.stop)
            queue.extend(state.handle(ChunkLoaded(ref, rows, tok, pat, bad.tolist(), f"loader-{ref.source}",
                                                  stimulus_id=f"l{ref.chunk_id}")))
        elif isinstance(ins, ConstructStep):
            queue.extend(state.handle(*(BatchDelivered(ins.step, dp, (dp,), stimulus_id=f"d{ins.step}-{dp}")
                                        for dp in ins.dp_ranks)))
        elif isinstance(ins, StepReady):
            queue.extend(state.handle(RanksConsumed(ins.step, ranks, stimulus_id=f"c{ins.step}")))
            done = ins.step + 1
            if done % every == 0:
                sizes[done] = state.dgraph.nbytes()
    return sizes


def _slope(sizes: dict[int, int], after: int) -> float:
    xs = np.array([s for s in sizes if s >= after], dtype=float)
    ys = np.array([sizes[s] for s in sizes if s >= after], dtype=float)
    return float(np.polyfit(xs, ys, 1)[0]) if xs.size >= 2 else float("nan")


def run(quick: bool) -> dict:
    from benchmarks.harness import figure
    from scheduler_plugins.lineage_store import LineageStore
    from scheduler_plugins.stories import story_query

    steps, retention = (2000, 200) if quick else (10_000, 1000)
    marks = (steps // 10, steps // 2, steps)
    every = max(1, steps // 100)
    meta, plan = _metadata(), _plan()
    with tempfile.TemporaryDirectory(prefix="mdata-lineage-bench-") as tmp:
        store = LineageStore(f"file://{tmp}/run", scratch=True)
        state = PlannerState(plan, meta, job="bench", log_size=1000, lineage_steps=retention,
                             lineage_sink=store.spill)
        began = time.perf_counter()
        sizes = _drive(state, meta, steps, every)
        run_s = time.perf_counter() - began
        store.flush(timeout=120)
        # the story handler's work for a sample of step 0: its first occurrence is in the oldest files
        first = store.ranges()[0].read("samples", {"step": 0, "dp_rank": 0}).slice(0, 1).to_pylist()[0]
        sid = types.SimpleNamespace(source=int(first["source_index"]), shard=first["shard"], row=first["row"])
        runtime = types.SimpleNamespace(state=state, lineage=store)
        story = story_query(runtime, sid).run()
        kinds = [(e["event"], e.get("step")) for e in story[0][1]]
        assert kinds == [("loaded", None), ("planned", 0), ("delivered", 0), ("consumed", 0)], story[0]
        times = []
        for _ in range(7):
            t = time.perf_counter()
            story_query(runtime, sid).run()
            times.append((time.perf_counter() - t) * 1e3)
        files = 4 * len(store.ranges())
        pending = store.pending_nbytes()
        store.close()

    unbounded = PlannerState(plan, meta, job="bench", log_size=1000)
    full_sizes = _drive(unbounded, meta, steps // 5, every)  # its growth shows in a fifth of the run
    slope = _slope(sizes, after=2 * retention)
    full_slope = _slope(full_sizes, after=every)
    at = {m: sizes[max(s for s in sizes if s <= m)] for m in marks}
    out = {
        "lineage.scheduler_bytes_per_step": figure(
            round(slope, 3), unit="B/step", goal="~0: flat however long the run",
            note=("DGraph in memory: " + ", ".join(f"{v / 1e6:.2f} MB at step {m}" for m, v in at.items())
                  + f"; retention {retention} steps, {GLOBAL_BATCH} samples a step; {pending} B "
                  f"pending at the end; an unbounded DGraph grows {full_slope:.0f} B/step")),
        "lineage.unbounded_bytes_per_step": figure(round(full_slope, 1), unit="B/step",
                                                   note="the same run keeping all lineage in memory"),
        "lineage.story_ms": figure(
            float(statistics.median(times)), unit="ms", goal="interactive (< 100 ms)",
            note=f"sample of step 0 ({len(story)} occurrence(s)), {files} spilled files, "
                 f"{steps} steps in {run_s:.1f}s"),
    }
    out.update({f"lineage.scheduler_bytes.step_{m}": v for m, v in at.items()})
    return out


if __name__ == "__main__":  # pragma: no cover
    import sys

    from benchmarks.harness import render_table

    print(render_table(run(quick="--quick" in sys.argv)))
