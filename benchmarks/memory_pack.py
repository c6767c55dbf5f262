"""mdata's side of the equal-throughput memory figure, with loaders holding chunks decoded and packed.

``mdata.sources.pack-held`` decides how a loader holds the chunks of each source's shuffle window
until they are drawn: decoded (``SampleChunk``, as before 2026-12-07) or packed (each sample's
token ids and pixels compressed on their own: :mod:`mdata.sources.packed`). This runs
:func:`benchmarks.memory_iso.measure_mdata` (the full shape: 16 ranks, dp 4 x cp 4, paced as a 7B
model on an H100 at 40% MFU, 4x slower; every loader primed first, then 4 paced steps and 12
measured) once each way per loader count, alternating, in one run, so both see the same machine.
The setting reaches the loaders through the environment (``DASK_MDATA__SOURCES__PACK_HELD``),
which the spawned cluster host and its workers inherit.

``python -m benchmarks.memory_pack SOURCES LOADERS... [--only decoded|packed]`` (e.g. ``306 4 2``).
"""

from __future__ import annotations

import json
import os
import sys

from benchmarks.memory_iso import SLOWDOWN, measure_mdata

__all__ = ["compare"]


def compare(num_sources: int, loaders: list[int], row_group_mb: int = 64, ranks: int = 16,
            cp: int = 4, modes: tuple[str, ...] = ("decoded", "packed")) -> list[dict]:
    """One decoded and one packed run per loader count; each run's peak, stall and breakdown."""
    out = []
    for k in loaders:
        for mode in modes:
            os.environ["DASK_MDATA__SOURCES__PACK_HELD"] = "true" if mode == "packed" else "false"
            got = measure_mdata(num_sources, row_group_mb, ranks, cp, k, SLOWDOWN)
            row = {"sources": num_sources, "loaders": k, "held": mode,
                   "pss_mb": round(got["pss_mb"], 1), "pss_mb_per_gpu": round(got["pss_mb"] / ranks, 1),
                   "stall": round(got["stall"], 4),
                   "loader_processes_mb": round(got.get("loader_processes_mb", 0.0), 1),
                   "ranks_over_bare_mb": round(got.get("ranks_over_bare_mb", 0.0), 1),
                   "samples_per_s": round(got["samples_per_s"], 1)}
            out.append(row)
            print(f"memory pack: {json.dumps(row)}", file=sys.stderr, flush=True)
    os.environ.pop("DASK_MDATA__SOURCES__PACK_HELD", None)
    return out


if __name__ == "__main__":
    argv = sys.argv[1:]
    only = argv[argv.index("--only") + 1] if "--only" in argv else None
    args = [int(a) for a in argv if a.isdigit()] or [306, 4]
    print(json.dumps(compare(args[0], args[1:] or [4], modes=(only,) if only else ("decoded", "packed")),
                     indent=1))
