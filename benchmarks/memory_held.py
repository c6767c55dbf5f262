"""What a loader holds per source at many sources: each source's first shuffle window, as loaded.

A loader keeps every chunk of a source's current shuffle window (``Plan.shuffle``, 4 chunks by
default) until the window's samples are drawn (:mod:`mdata.order`). With many sources and a few
samples per step each, a window lasts hundreds of steps, so in steady state a loader holds about
one window per source it serves: that, not the readers, is what grows with sources. This module
measures it directly, without a cluster: one fresh process per way of holding (``decoded``: the
``SampleChunk`` a load produces, as loaders held it before; ``packed``: the
:class:`~mdata.sources.packed.PackedChunk` they hold now) loads the first window of every source of
:func:`~benchmarks.workload.production_sources` through ``workers.loader.load_chunk_task`` (the
very task body a loader runs, reader cache included) and keeps the results, as Dask keeps a load
task's result. It reports the process's PSS growth, the bytes the held objects report (what Dask
counts), Arrow's allocator bytes, and the held bytes per source kind.

``python -m benchmarks.memory_held 306 [decoded|packed]`` (sources, default 306, row groups of
64 MiB; both ways unless one is named).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time

__all__ = ["held_window_memory"]

MODES = ("decoded", "packed")


def _pss_mb() -> float:
    import psutil

    return psutil.Process().memory_full_info().pss / 2**20


def _hold(mode: str, num_sources: int, row_group_mb: int, conn) -> None:
    """Child: load every source's first shuffle window and keep it; report what is held."""
    os.environ["DASK_MDATA__SOURCES__PACK_HELD"] = "true" if mode == "packed" else "false"
    import numpy as np
    import pyarrow as pa

    from benchmarks.workload import production_sources
    from mdata.order import SourceOrder
    from mdata.sources import ReaderCache
    from workers.loader import load_chunk_task

    sources = production_sources(num_sources, row_group_mb)
    cache = ReaderCache()
    orders = {s.name: SourceOrder([sh.num_rows for sh in cache.listing(s).shards], s.chunk_rows, 0,
                                  s.name, 4) for s in sources}
    for s in sources[:6]:  # one chunk of each kind first: tokenizer, decoders and imports loaded
        load_chunk_task(s, 0, 0, 1)
    pa.default_memory_pool().release_unused()
    before, began = _pss_mb(), time.perf_counter()
    held, by_kind = [], {}
    for s in sources:
        _, _, chunk_ids = orders[s.name].window_span(0)
        for c in sorted(chunk_ids):
            ref = orders[s.name].chunk_ref(c)
            chunk = load_chunk_task(s, ref.shard, ref.start, ref.stop)
            held.append(chunk)
            kind = s.name.rsplit("_", 1)[0]
            by_kind[kind] = by_kind.get(kind, 0) + chunk.nbytes
    seconds = time.perf_counter() - began
    pa.default_memory_pool().release_unused()
    kinds = {k: sum(1 for s in sources if s.name.rsplit("_", 1)[0] == k) for k in by_kind}
    conn.send({
        "mode": mode, "sources": num_sources, "chunks": len(held),
        "pss_growth_mb": round(_pss_mb() - before, 1),
        "held_mb": round(sum(c.nbytes for c in held) / 2**20, 1),
        "arrow_mb": round(pa.total_allocated_bytes() / 2**20, 1),
        "held_mb_per_source_by_kind": {k: round(v / kinds[k] / 2**20, 2) for k, v in sorted(by_kind.items())},
        "load_seconds": round(seconds, 1),
        "type": type(held[0]).__name__, "rows": int(np.sum([len(c) for c in held])),
    })


def held_window_memory(num_sources: int = 306, row_group_mb: int = 64,
                       modes: tuple[str, ...] = MODES) -> dict[str, dict]:
    """Each mode's figures (see the module docstring), from a fresh spawned process each."""
    ctx = mp.get_context("spawn")
    out = {}
    for mode in modes:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_hold, args=(mode, num_sources, row_group_mb, child))
        proc.start()
        out[mode] = parent.recv()
        proc.join(60)
        print(f"memory held: {json.dumps(out[mode])}", file=sys.stderr, flush=True)
    return out


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 306
    figures = held_window_memory(n, modes=tuple(a for a in sys.argv[2:] if a in MODES) or MODES)
    if len(figures) == 2:
        d, p = figures["decoded"], figures["packed"]
        figures.update(pss_ratio=round(d["pss_growth_mb"] / max(p["pss_growth_mb"], 1e-9), 2),
                       held_ratio=round(d["held_mb"] / p["held_mb"], 2))
    print(json.dumps(figures, indent=1))
