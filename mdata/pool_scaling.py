"""Per-pool worker targets from the Planner's per-source targets (pure).

The Planner sizes each *source's* demand (``mdata.pool_demand``); a deployment runs *pools*, each
serving one source or a group of cheap ones. A pool needs the sum of its sources' demands, within
its bounds. Every target keeps the sources' reasons, so the dashboard and logs say why a pool grew
or shrank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["PoolScale", "pool_targets"]


@dataclass(frozen=True)
class PoolScale:
    """Run ``workers`` workers in ``pool``; ``reason`` says why."""

    pool: str
    workers: int
    reason: str


def pool_targets(
    pools: Mapping[str, Sequence[str]],
    source_targets: Mapping[str, Mapping[str, object]],
    *,
    min_workers: int = 1,
    max_workers: Mapping[str, int] | int | None = None,
) -> dict[str, PoolScale]:
    """Targets for the pools whose sources all have a Planner target.

    ``source_targets`` maps a source to ``{"workers": n, "reason": text}`` and, when the Planner
    measured it, ``"demand"``: worker-equivalents before rounding up. A pool adds its sources'
    fractional demands before rounding (three sources needing 0.1 worker each share one worker,
    not three). A pool with a source the Planner has not sized yet is left out: scaling on half
    the information would shrink a pool that is about to be needed.
    """
    out: dict[str, PoolScale] = {}
    for pool, sources in pools.items():
        if not sources or any(s not in source_targets for s in sources):
            continue
        if all(float(source_targets[s].get("demand") or 0.0) > 0 for s in sources):
            demand = math.ceil(sum(float(source_targets[s]["demand"]) for s in sources) - 1e-9)
        else:
            demand = sum(int(source_targets[s]["workers"]) for s in sources)
        cap = max_workers.get(pool) if isinstance(max_workers, Mapping) else max_workers
        workers = max(min_workers, demand)
        bound = ""
        if cap is not None and workers > cap:
            workers, bound = int(cap), f"; capped at {cap}"
        elif workers > demand:
            bound = f"; at least {min_workers}"
        reasons = "; ".join(f"{s}: {source_targets[s]['reason']}" for s in sources)
        out[pool] = PoolScale(pool, workers, f"{demand} worker(s) of demand ({reasons}){bound}")
    return out
