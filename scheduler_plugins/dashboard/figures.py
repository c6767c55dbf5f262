"""The figures behind every mdata dashboard panel and JSON route, as JSON-friendly columns.

Panels and routes both call these functions, so what a page draws and what ``/mdata/api/...``
answers are the same numbers. Each function reads one job's runtime (step summaries recorded from
the Planner's ``StepReady`` instructions, pool targets with their reasons, the meters of
:mod:`mdata.observe.meters`, the Planner's counters from its published ``view``) and the scheduler's
worker table; none of them changes anything. They run on the scheduler's event loop, where the
runtime's own bookkeeping runs, so they see it consistently; the Planner's state itself is written
by the planning thread, so only the story functions read it (its DGraph), with the runtime's lock
held or free (see :func:`story_rows` and :mod:`scheduler_plugins.planner_view`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from mdata.cost import cost_unit
from mdata.planner.quarantine import describe_quarantine
from mdata.sources import describe_storage_wait
from scheduler_plugins.job_status import quarantined as job_quarantined
from scheduler_plugins.pool_inputs import pool_workers
from scheduler_plugins.stories import story_query, story_sample

if TYPE_CHECKING:
    from scheduler_plugins.job_runtime import JobRuntime

__all__ = [
    "job_summary", "sources_figures", "pools_timeline", "mixture_figures", "balance_figures", "trainers_figures",
    "waiting_figures", "story_rows", "story_sample", "story_table", "STORY_COLUMNS",
]

NO_TARGET_REASON = "no target yet: the Planner sizes pools once it has measured load times and a step rate"


def _steps(runtime: "JobRuntime") -> list[dict]:
    return [runtime.step_summaries[s] for s in sorted(runtime.step_summaries)]


def job_summary(runtime: "JobRuntime") -> dict[str, Any]:
    """One line of ``/mdata/api/jobs``: identity, progress and health of a job."""
    view = runtime.view
    return {
        "job": runtime.job,
        "fingerprint": runtime.plan.fingerprint(),
        "sources": list(view.names),
        "world_size": runtime.plan.mesh.world_size,
        "dp": runtime.plan.mesh.dp,
        "uptime_s": time.time() - runtime.started,
        "planned_step": view.planned_step,
        "balanced_step": view.balanced_step,
        "consumed_step": view.consumed_step,
        "failure": runtime.failure,
    }


def sources_figures(runtime: "JobRuntime", *, now: float | None = None) -> dict[str, Any]:
    """Per source: samples/s (recent window), loaded samples, backlog, pool size and target, and
    whether its loads wait on unreachable storage: ``storage`` is the sentence the dashboard
    shows (empty while storage answers), ``storage_waits`` the figures behind it (since, waited_s,
    attempts, last_error, workers, targets) for the waiting sources only."""
    now = time.monotonic() if now is None else now
    wall = time.time()
    figures = runtime.source_meter.snapshot(now)
    waits = dict(runtime.storage_waits)
    cols: dict[str, list] = {k: [] for k in (
        "source", "samples_per_s", "loaded_samples", "loaded_chunks", "failed_chunks",
        "backlog_chunks", "backlog_rows", "pool_workers", "target_workers", "reason", "storage",
        "quarantined")}
    quarantined = job_quarantined(runtime)
    for f in figures:
        cols["quarantined"].append(describe_quarantine(quarantined.get(f.source, ())))
        wait = waits.get(f.source)
        cols["storage"].append("" if wait is None else
                               describe_storage_wait(wait.since, wait.attempts, wait.last_error))
        target = runtime.pool_targets.get(f.source)
        cols["source"].append(f.source)
        cols["samples_per_s"].append(f.samples_per_s)
        cols["loaded_samples"].append(f.loaded_samples)
        cols["loaded_chunks"].append(f.loaded_chunks)
        cols["failed_chunks"].append(f.failed_chunks)
        cols["backlog_chunks"].append(f.backlog_chunks)
        cols["backlog_rows"].append(f.backlog_rows)
        cols["pool_workers"].append(pool_workers(runtime.scheduler, f.source))
        cols["target_workers"].append(None if target is None else int(target.workers))
        cols["reason"].append(NO_TARGET_REASON if target is None else target.reason)
    return {"job": runtime.job, "window_s": runtime.source_meter.window_s, **cols,
            "storage_waits": {name: wait.to_dict(wall) for name, wait in waits.items()}}


def pools_timeline(runtime: "JobRuntime", *, smooth_s: float = 5.0) -> dict[str, Any]:
    """Per source over time (seconds since the job started): loaded samples/s (over the last
    ``smooth_s`` seconds), load tasks outstanding, and at every Planner decision the workers
    serving the source, the target and the demand in busy threads; ``decisions`` lists the
    decisions that changed a target (time, source, from, to, kind, reason)."""
    names = list(runtime.view.names)
    t0 = runtime.started
    hist = list(runtime.source_history)  # (wall time, loaded, outstanding) arrays per sample
    times = [t - t0 for t, _, _ in hist]
    rate: dict[str, list] = {n: [] for n in names}
    backlog: dict[str, list] = {n: [] for n in names}
    if hist:
        at = np.array([t for t, _, _ in hist])
        loaded = np.stack([h[1] for h in hist]).astype(np.float64)  # samples x sources
        waiting = np.stack([h[2] for h in hist])
        since = np.zeros(at.size, np.int64)  # per sample: the one smooth_s seconds before it
        j = 0
        for k in range(at.size):
            while j < k - 1 and at[j + 1] <= at[k] - smooth_s:
                j += 1
            since[k] = j
        span = at - at[since]
        per_s = (loaded - loaded[since]) / np.where(span > 0, span, 1.0)[:, None]
        per_s[span <= 0] = 0.0
        for i, n in enumerate(names):
            rate[n] = per_s[:, i].tolist()
            backlog[n] = waiting[:, i].tolist()
    pools = {n: {"time": [], "workers": [], "target": [], "demand": []} for n in names}
    decisions: dict[str, list] = {k: [] for k in ("time", "source", "current", "target", "kind",
                                                  "reason", "by")}
    for d, serving in list(runtime.pool_history):
        if d.group not in pools:
            continue
        p = pools[d.group]
        p["time"].append(d.time - t0)
        p["workers"].append(serving)
        p["target"].append(d.workers)
        p["demand"].append(d.demand)
        if d.changed:
            _decision(decisions, d, d.group, t0, "planner")
    scaler = runtime.scaler_status
    for d in () if scaler is None else scaler.applied:  # the pools' sizes the autoscaler set
        for source in d.sources:
            if source in pools and d.time >= t0:
                _decision(decisions, d, source, t0, f"autoscaler (pool {d.group})")
    return {"job": runtime.job, "sources": names, "time": times, "samples_per_s": rate,
            "backlog": backlog, "pools": pools, "decisions": decisions,
            "autoscaler": None if scaler is None else scaler.to_msg()}


def _decision(out: dict[str, list], d, source: str, t0: float, by: str) -> None:
    for key, value in (("time", d.time - t0), ("source", source), ("current", d.current),
                       ("target", d.workers), ("kind", d.kind), ("reason", d.reason), ("by", by)):
        out[key].append(value)


def mixture_figures(runtime: "JobRuntime", *, last: int | None = None) -> dict[str, Any]:
    """Per source and balanced step: target weight, realized weight, cumulative realized weight.

    The realized weight of a step is the source's share of the step's samples; the cumulative one
    is its share of all samples so far, which is what an exact mixture keeps on target. ``last``
    keeps only the newest steps (cumulative shares still count every step).
    """
    names = list(runtime.view.names)
    steps = _steps(runtime)
    out: dict[str, Any] = {"job": runtime.job, "sources": names,
                           "steps": [int(s["step"]) for s in steps]}
    target = {n: [] for n in names}
    realized = {n: [] for n in names}
    cumulative = {n: [] for n in names}
    counts = {n: [] for n in names}
    running = {n: 0 for n in names}
    running_total = 0
    for s in steps:
        total = sum(int(s["counts"][n]) for n in names)
        running_total += total
        for n in names:
            c = int(s["counts"][n])
            running[n] += c
            counts[n].append(c)
            target[n].append(float(s["target_weights"][n]))
            realized[n].append(c / total if total else 0.0)
            cumulative[n].append(running[n] / running_total if running_total else 0.0)
    out.update(target=target, realized=realized, cumulative=cumulative, counts=counts)
    if last is not None:
        out["steps"] = out["steps"][-last:] if last > 0 else []
        for table in (target, realized, cumulative, counts):
            for n in names:
                table[n] = table[n][-last:] if last > 0 else []
    return out


def balance_figures(runtime: "JobRuntime", *, last: int | None = None) -> dict[str, Any]:
    """Per balanced step: cost of each DP rank, the lower bound, and imbalance ratios; ``unit``:
    what the costs are in (``GPU-ms`` for a calibrated cost model, else ``relative cost``:
    :func:`mdata.cost.cost_unit`).

    ``measure``: what the per-rank figures are, ``cost`` (each rank's total) or ``1F1B
    makespan`` (a plan balanced by pipeline stage), from the newest step;
    ``scalar_makespan``: per step, the makespan scalar balancing would have given (None when
    not balanced by stage).

    ``last`` keeps only the newest steps.
    """
    steps = _steps(runtime)
    if last is not None:
        steps = steps[-last:] if last > 0 else []
    per_rank = [[float(c) for c in s["per_rank_cost"]] for s in steps]
    return {
        "job": runtime.job,
        "dp": runtime.plan.mesh.dp,
        "unit": cost_unit(runtime.plan.cost_model),
        "steps": [int(s["step"]) for s in steps],
        "per_rank_cost": per_rank,
        "lower_bound": [float(s["lower_bound"]) for s in steps],
        "max_cost": [max(c) for c in per_rank],
        "mean_cost": [sum(c) / len(c) for c in per_rank],
        "max_over_lower_bound": [float(s["max_over_lower_bound"]) for s in steps],
        "max_over_mean": [float(s["max_over_mean"]) for s in steps],
        "measure": str(steps[-1].get("measure", "cost")) if steps else "cost",
        "scalar_makespan": [s.get("scalar_makespan") for s in steps],
    }


def trainers_figures(runtime: "JobRuntime") -> dict[str, Any]:
    """Per trainer rank: total wait for batches, steps consumed, last step, wait per step.
    Ranks fed by broadcast (``broadcast``: the plan's axis) tell nothing per step, so only the
    receiving ranks have figures; ``fed_by_broadcast`` counts the others (each follows its
    group's receiver, whose figures stand for it)."""
    figures = runtime.trainer_meter.snapshot()
    mesh, broadcast = runtime.plan.mesh, runtime.plan.broadcast
    receiving = sum(len(group) for group in runtime.state.receivers)
    return {
        "job": runtime.job,
        "world_size": mesh.world_size,
        "broadcast": broadcast,
        "fed_by_broadcast": mesh.world_size - receiving,
        "rank": [f.rank for f in figures],
        "wait_s": [f.wait_s for f in figures],
        "steps_consumed": [f.steps_consumed for f in figures],
        "last_step": [f.last_step for f in figures],
        "wait_by_step": {str(f.rank): {str(k): v for k, v in f.wait_by_step.items()} for f in figures},
    }


def waiting_figures(runtime: "JobRuntime") -> dict[str, Any]:
    """Is training waiting on data, on which rank, on which source? Per rank, each step's exposed
    wait (the training loop blocked in the Loader), when it was told (seconds since the job
    started) and the source it is attributed to (:mod:`mdata.observe.data_waits`; ``""``: too short to
    blame); totals per rank and per source, and ``answer``: the question answered in a sentence."""
    ledger = runtime.data_waits
    offset = time.time() - time.monotonic() - runtime.started  # the ledger's clock is monotonic
    ranks: dict[str, dict[str, list]] = {}
    for w in ledger.waits():
        cols = ranks.setdefault(str(w.rank), {"step": [], "wait_s": [], "source": [], "time_s": []})
        cols["step"].append(w.step)
        cols["wait_s"].append(w.wait_s)
        cols["source"].append(w.source)
        cols["time_s"].append(w.told_at + offset)
    by_rank = {str(r): total for r, total in ledger.by_rank().items()}
    by_source = ledger.by_source()
    return {"job": runtime.job, "world_size": runtime.plan.mesh.world_size,
            "sources": list(runtime.view.names), "min_wait_s": ledger.min_wait_s, "ranks": ranks,
            "wait_by_rank": by_rank, "wait_by_source": by_source,
            "answer": waiting_answer(by_rank, by_source, ledger.min_wait_s)}


def waiting_answer(by_rank: dict[str, float], by_source: dict[str, float], min_wait_s: float) -> str:
    """One sentence: how long training waited on data, the rank that waited most, the source most
    of the wait is blamed on."""
    total = sum(by_rank.values())
    if not by_source:
        return (f"training is not waiting on data: no step's batch came later than {min_wait_s * 1e3:g} ms"
                if by_rank else "no trainer has told its waits yet")
    rank, rank_s = max(by_rank.items(), key=lambda kv: kv[1])
    source, source_s = next(iter(by_source.items()))
    return (f"training waited {total:.2f} s on data in all; most on rank {rank} ({rank_s:.2f} s); "
            f"{source_s:.2f} s of it is blamed on source {source!r}")


STORY_COLUMNS = ("lineage_id", "event", "step", "dp_rank", "micro_batch", "position",
                 "num_tokens", "cursor", "chunk", "worker", "ranks")


def _plain(value):
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def story_table(occurrences: Iterable[tuple[int, Iterable[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Rows with the keys of :data:`STORY_COLUMNS` (``None`` where an event has no such field)
    from ``(lineage id, events)`` pairs (:func:`scheduler_plugins.stories.story`)."""
    rows = []
    for lineage_id, events in occurrences:
        for event in events:
            row = {c: _plain(event.get(c)) for c in STORY_COLUMNS}
            row["lineage_id"] = int(lineage_id)
            rows.append(row)
    return rows


def story_rows(runtime: "JobRuntime", sample_id: str) -> list[dict[str, Any]]:
    """Every event of every occurrence (one per epoch) of ``source/shard/row`` over the whole
    run, in order, as :func:`story_table` rows; spilled lineage is read here, synchronously.

    Call it holding ``runtime.lock``, or on the event loop after checking that the lock is free:
    the planning thread appends to the DGraph while the lock is held, and reading it then could
    see a step half recorded. Callers on the event loop that may meet spilled lineage read it in
    a thread instead (:func:`scheduler_plugins.stories.story`).
    """
    return story_table(story_query(runtime, story_sample(runtime, sample_id)).run())
