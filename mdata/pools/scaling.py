"""Per-pool worker targets from the Planner's per-source decisions (pure).

The Planner sizes each *source's* demand (:mod:`mdata.pools.demand`); a deployment runs *pools*,
each serving one source or a group of cheap ones. A pool needs the sum of its sources' demands in
busy threads, divided by its threads per worker, within its bounds. Pool targets are the same
:class:`~mdata.wire.pools.PoolDecision` as the sources' (``group`` is the pool), and keep the
sources' reasons, so the dashboard and logs say why a pool grew or shrank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mdata.wire.pools import PoolDecision

__all__ = ["PoolDecision", "pool_targets", "merge_jobs", "as_decision"]


def as_decision(group: str, value: PoolDecision | Mapping[str, Any]) -> PoolDecision:
    """A decision from a decision or its ``to_msg()`` dict (older fields tolerated: a dict with
    only ``workers``, ``reason`` and maybe ``demand`` in threads)."""
    if isinstance(value, PoolDecision):
        return value
    workers = int(value["workers"])
    threads = int(value.get("threads", 1))
    demand = float(value.get("demand") or 0.0) or float(workers * threads)
    return PoolDecision(group=str(value.get("group", group)), workers=workers,
                        reason=str(value["reason"]), demand=demand,
                        current=int(value.get("current", -1)), threads=threads,
                        kind=str(value.get("kind", "hold")), time=float(value.get("time", 0.0)),
                        sources=tuple(value.get("sources", (group,))))


def merge_jobs(per_job: Iterable[Mapping[str, PoolDecision | Mapping[str, Any]]]
               ) -> dict[str, PoolDecision]:
    """One decision per source from several jobs' decisions: jobs reading the same source load
    it separately, so their demands add up (reasons joined)."""
    out: dict[str, PoolDecision] = {}
    for targets in per_job:
        for source, value in targets.items():
            d = as_decision(source, value)
            if source in out:
                old = out[source]
                d = PoolDecision(source, max(old.workers, d.workers), f"{old.reason} + {d.reason}",
                                 old.demand + d.demand, old.current, d.threads, d.kind,
                                 max(old.time, d.time), (source,))
            out[source] = d
    return out


def pool_targets(
    pools: Mapping[str, Sequence[str]],
    source_targets: Mapping[str, PoolDecision | Mapping[str, Any]],
    *,
    threads: Mapping[str, int] | int = 1,
    current: Mapping[str, int] | None = None,
    min_workers: int = 1,
    max_workers: Mapping[str, int] | int | None = None,
    wall: float = 0.0,
) -> dict[str, PoolDecision]:
    """Targets for the pools whose sources all have a Planner decision.

    A pool adds its sources' demands in busy threads (headroom included) before dividing by its
    ``threads`` per worker and rounding up: three sources needing 0.1 thread each share one
    worker, not three; and never fewer than one source's own target (its threads converted to
    the pool's), which keeps that source's hysteresis. ``current`` (workers each pool runs now)
    sets each target's ``kind``. A
    pool with a source the Planner has not sized yet is left out: scaling on half the information
    would shrink a pool that is about to be needed.
    """
    out: dict[str, PoolDecision] = {}
    for pool, sources in pools.items():
        if not sources or any(s not in source_targets for s in sources):
            continue
        decisions = [as_decision(s, source_targets[s]) for s in sources]
        per_worker = max(1, int(threads.get(pool, 1) if isinstance(threads, Mapping) else threads))
        demand = float(sum(d.demand for d in decisions))
        # no fewer than any one source's own target: a source's target keeps its hysteresis
        held = max(math.ceil(d.workers * d.threads / per_worker - 1e-9) for d in decisions)
        need = max(math.ceil(demand / per_worker - 1e-9), held)
        cap = max_workers.get(pool) if isinstance(max_workers, Mapping) else max_workers
        workers = max(min_workers, need)
        bound = ""
        if cap is not None and workers > cap:
            workers, bound = int(cap), f"; capped at {cap}"
        elif workers > need:
            bound = f"; at least {min_workers}"
        now = -1 if current is None else int(current.get(pool, -1))
        kind = ("start" if now < 0 else "up" if workers > now else "down" if workers < now
                else "hold")
        reasons = "; ".join(d.reason for d in decisions)
        out[pool] = PoolDecision(
            group=pool, workers=workers, demand=demand, current=now, threads=per_worker, kind=kind,
            time=wall, sources=tuple(sources),
            reason=(f"{demand:.3g} busy threads / {per_worker} per worker = {need} worker(s) of "
                    f"demand ({reasons}){bound}"))
    return out
