"""What the control plane costs the scheduler per training step, as the number of ranks grows.

The real scheduler with the Planner alone in its process, deployed with the dask CLI as at scale
(:mod:`benchmarks.control_cluster`: its CPU is read from /proc, and no worker's nanny shares it),
real loader and constructor workers in processes of their own, and N trainer ranks running the real
:class:`mdata.trainer.Loader` protocol as threads that share one Dask client per simulated host
(:mod:`benchmarks.control_hosts`). No training compute: ranks go as fast as the data path allows.

Three sweeps:

* **fixed DP** (DP groups held at ``FIXED_DP``, TP grown): the work that scales with *ranks*;
* **DP = N** (one rank per group): the work that scales with *groups*;
* **fixed DP under** ``broadcast_at("tp")`` (the same worlds, only TP rank 0 of each group
  receiving: what Megatron-style trainers run, loading on TP rank 0 and broadcasting), laid out
  as at scale, one TP group per simulated host (so ``FIXED_DP`` hosts at every N): the work left
  per rank when most ranks are fed by broadcast (:mod:`mdata.trainer.fed_steps`).

Figures (``control.*``):

* ``scheduler_cpu_ms_per_step_<n>`` (fixed DP) and ``scheduler_cpu_ms_per_step_dp<n>`` (DP = N):
  the scheduler process' CPU (user + system, every thread: event loop, Planner, lineage writer)
  over the steady steps, per step;
* ``scheduler_cpu_us_per_rank_step``: the slope of the fixed-DP sweep, per rank and step;
  ``scheduler_cpu_us_per_group_step``: what a DP group adds on top of its ranks;
* ``max_ranks_at_1_step_per_s``: the world size whose scheduler CPU per step reaches one second,
  extrapolated from the fitted fixed, per-rank and per-group costs at ``RANKS_PER_GROUP`` ranks per
  DP group (TP 8, the common shape at scale);
* ``locate_p50_ms`` / ``locate_p99_ms``: the location request that returned the batch's place
  (its long-poll wait included), at the largest fixed-DP world;
* ``ack_ms_on_loop``: median time the training loop spends in ``Loader.mark_consumed`` per step
  (``ack_ms_on_loop_p99`` too), at the largest fixed-DP world;
* ``loop_blocked_ms_p99``: the scheduler's event loop's longest blocked interval per step (a probe
  coroutine on the loop measures how late its 5 ms sleeps wake), p99 over steps, at the largest
  fixed-DP world; ``loop_held_ms_p99`` the same less the time the loop's thread sat in the run
  queue without a CPU (on this shared machine that is the trainers' and workers' processes, not
  the scheduler's own doing), and ``full_gc_max_ms`` the longest full garbage collection in the
  scheduler then (it holds the GIL, whichever thread ran it), ``full_gc_ms`` what one full
  collection on the scheduler takes after the run. ``--gc-freeze`` compares the
  scheduler with its long-lived objects frozen out of full collections (:mod:`mdata.gc_freeze`)
  against not, side by side;
* ``asks_per_request``: location asks per request at the largest fixed-DP world, long-polling (ranks that share
  a client ask together, :mod:`mdata.trainer.location_hub`); ``scheduler_cpu_ms_per_step_<n>_ranks_alone``:
  the same world with every rank long-polling alone (``mdata.trainer.location-gather`` 0 and
  ``location-push`` off, the protocol before), and ``host_requests_cpu_ratio`` the first over
  the long polls per host, all in the same run;
* pushed locations against long polls, in the same run: the fixed-DP sweep runs once with the
  default (the scheduler pushes built batches' locations, :mod:`scheduler_plugins.location_push`)
  and once with ``mdata.trainer.location-push`` off (every rank long-polls each step), the two
  interleaved point by point. ``scheduler_cpu_us_per_rank_step_poll`` and
  ``max_ranks_at_1_step_per_s_poll`` are the poll sweep's (with the push run's per-group cost),
  ``push_cpu_ratio`` is the poll run's scheduler CPU per step over the push run's at the largest
  world, and ``scheduler_messages_per_step_push`` / ``_poll`` count on the scheduler (the
  Planner's counters) the location requests, consumption requests and pushes it handled per
  step there;
* ``consume_us_per_rank``: the scheduler's loop per rank in reading and taking one message of
  every rank's consumption tell, at the largest fixed-DP world, measured alone on the same
  scheduler (:mod:`benchmarks.control_consume`): the per-rank work without the trainer threads
  that share this machine's cores;
* ``steps_per_s_<n>``: steps per second the ranks reached (bounded here by 2 shared cores, not by
  the protocol alone);
* ``scheduler_cpu_ms_per_step_<n>_bcast_tp`` (the broadcast sweep's points),
  ``scheduler_cpu_us_per_rank_step_bcast_tp`` (its slope: what a rank fed by broadcast costs, its
  hosts fixed), ``scheduler_messages_per_step_bcast_tp`` (at the largest world) and
  ``max_ranks_at_1_step_per_s_bcast_tp``: the world at one step per second at TP
  ``RANKS_PER_GROUP`` under ``broadcast_at("tp")``, one host per TP group (per DP group: the
  per-group cost, one receiving rank and one host; per other rank: the broadcast slope);
* what a host costs, measured directly: ``scheduler_cpu_us_per_host_step`` (a world of DP = N,
  TP 1, run with a host per rank and with every rank on one host, interleaved: the difference
  over N - 1 hosts, median over the worlds), ``dask_request_floor_us`` (what one trivial Dask
  request costs the same scheduler, :mod:`benchmarks.control_floor`), and both costs in that
  unit: ``host_cost_in_requests`` (a host's push and tell per step) and
  ``group_cost_in_requests_bcast_tp`` (a whole DP group at TP ``RANKS_PER_GROUP`` under
  broadcast, a host per TP group). Counted in Dask's floor, the costs carry over to a machine
  whose cores handle a message faster or slower than this one's.

Nothing is compared with a baseline: a per-rank loader has no control plane. The goal lives in the
figure's row: the scheduler's CPU per step must grow with DP groups, not with ranks.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from benchmarks.control_cluster import cluster as _cluster
from benchmarks.counting import cpu_seconds
from benchmarks.control_consume import consume_us_per_rank
from benchmarks.control_floor import request_floor_us
from benchmarks.control_job import job_plan
from benchmarks.harness import figure

__all__ = ["run", "sweep_point"]

REPO = Path(__file__).resolve().parent.parent
FIXED_DP = 16
RANKS_PER_GROUP = 8
MAX_RANKS_PER_HOST = 64
WARMUP = 3
TIMEOUT = 300.0


class _CpuSampler(threading.Thread):
    """Samples a process' CPU seconds against wall time every ``interval`` s."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples: list[tuple[float, float]] = []
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.samples.append((time.time(), cpu_seconds([self.pid])))
            time.sleep(self.interval)

    def stop(self) -> None:
        self._done.set()
        self.join()

    def at(self, t: float) -> float:
        """CPU seconds at wall time ``t``, interpolated between samples."""
        before = [s for s in self.samples if s[0] <= t] or self.samples[:1]
        after = [s for s in self.samples if s[0] >= t] or self.samples[-1:]
        (t0, c0), (t1, c1) = before[-1], after[0]
        return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)


def _install_loop_probe(dask_scheduler=None) -> None:
    """Runs on the scheduler: a coroutine that sleeps 5 ms at a time and records how late it woke,
    i.e. how long the event loop was held by something else, and how much of that the loop's
    thread spent runnable but without a CPU (its run-queue wait from /proc: on a shared machine
    other processes, not the scheduler, are then to blame); plus the length of every full
    garbage collection (a full collection holds the GIL, so it stalls the loop whatever thread
    triggered it)."""
    import asyncio
    import gc

    lags: list[tuple[float, float, float]] = []  # (wall time, late by, of which run-queue wait)
    pauses: list[tuple[float, float]] = []  # (wall time, seconds) of full collections
    dask_scheduler._mdata_bench_loop_lags = lags
    dask_scheduler._mdata_bench_gc_pauses = pauses
    # one descriptor kept open and read in place: opening the file for every read (twice per
    # 5 ms) was about a tenth of the scheduler's busy samples at 256 ranks, charged to mdata
    try:
        stat = os.open(f"/proc/self/task/{threading.get_native_id()}/schedstat", os.O_RDONLY)
    except OSError:
        stat = -1
    dask_scheduler._mdata_bench_schedstat = stat

    def waited() -> float:
        try:
            return int(os.pread(stat, 128, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0

    began_gc: list[float] = []

    def on_gc(phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            began_gc[:] = [time.perf_counter()]
        elif began_gc:
            pauses.append((time.time(), time.perf_counter() - began_gc[0]))

    gc.callbacks.append(on_gc)
    dask_scheduler._mdata_bench_gc_callback = on_gc

    async def probe() -> None:
        began, queued = time.monotonic(), waited()
        while len(lags) < 500_000:
            await asyncio.sleep(0.005)
            now, now_queued = time.monotonic(), waited()  # one read ends a wait and starts the next
            lags.append((time.time(), now - began - 0.005, now_queued - queued))
            began, queued = now, now_queued

    dask_scheduler._mdata_bench_loop_probe = asyncio.get_running_loop().create_task(probe())


def _remove_loop_probe(dask_scheduler=None) -> None:
    import gc

    dask_scheduler._mdata_bench_loop_probe.cancel()
    if getattr(dask_scheduler, "_mdata_bench_schedstat", -1) >= 0:
        os.close(dask_scheduler._mdata_bench_schedstat)
        dask_scheduler._mdata_bench_schedstat = -1
    callback = getattr(dask_scheduler, "_mdata_bench_gc_callback", None)
    if callback in gc.callbacks:
        gc.callbacks.remove(callback)


def _read_loop_lags(dask_scheduler=None) -> tuple[list, list]:
    return (list(getattr(dask_scheduler, "_mdata_bench_loop_lags", [])),
            list(getattr(dask_scheduler, "_mdata_bench_gc_pauses", [])))


def _timed_full_collection(dask_scheduler=None) -> float:
    """On the scheduler: seconds one full garbage collection takes now (what any full
    collection during a step would hold the loop for)."""
    import gc

    began = time.perf_counter()
    gc.collect()
    return time.perf_counter() - began


def _set_freeze(dask_scheduler=None, on: bool = True) -> int:
    """On the scheduler: freeze the objects alive now out of full collections (as
    :func:`mdata.gc_freeze.freeze_long_lived` does), or unfreeze them all; the frozen count."""
    import gc

    if on:
        gc.collect()
        gc.freeze()
    else:
        gc.unfreeze()
    return gc.get_freeze_count()


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))] if values else float("nan")


def _next_result(results, hosts, cluster_pid: int, deadline: float) -> dict:
    """The next host's records; fails at once when the cluster or a host died without any."""
    import queue

    while True:
        try:
            return results.get(timeout=2.0)
        except queue.Empty:
            if not Path(f"/proc/{cluster_pid}").exists():
                raise RuntimeError("the cluster process died during the run") from None
            dead = [h.exitcode for h in hosts if h.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a trainer host process died (exit codes {dead})") from None
            if time.monotonic() > deadline:
                raise RuntimeError("the trainer hosts did not finish in time") from None


def _read_messages(dask_scheduler=None, job: str = "") -> tuple[int, int, int, int]:
    """On the scheduler: location requests and consumption requests served, pushes sent and
    consumption messages taken from clients' streams, for ``job`` so far."""
    runtime = dask_scheduler.extensions["mdata"].jobs[job]
    return (runtime.location_requests, runtime.consumed_requests, runtime.pusher.messages,
            runtime.consumed_streamed)


def sweep_point(address: str, pid: int, sources, *, n: int, dp: int, steps: int, job: str,
                gather_s: float | None = None, push: bool | None = None,
                tells: bool | None = None, freeze: bool | None = None,
                broadcast: str | None = None, per_host: int | None = None) -> dict:
    """Run ``n`` ranks (DP ``dp``, TP ``n // dp``) for ``steps`` steps; what the scheduler spent.
    ``broadcast``: the plan's ``broadcast_at`` axis (None: every rank receives); ``per_host``:
    ranks per simulated host (None: ``MAX_RANKS_PER_HOST``).
    ``gather_s``: the hosts' ``mdata.trainer.location-gather`` (None: the default); ``push``:
    their ``mdata.trainer.location-push``, ``tells`` their ``mdata.trainer.stream-tells`` (None:
    the default); ``freeze``: freeze the scheduler's objects out of full collections after the
    job registered (True), or unfreeze them all (False; None: as ``mdata.gc-freeze`` left them)."""
    from distributed import Client

    from benchmarks.control_hosts import run_host
    from mdata.driver import JobHandle, submit_job

    with Client(address, set_as_default=False) as client:
        submit_job(client, job_plan(sources, dp, n // dp, broadcast), job=job)
        if freeze is not None:
            client.run_on_scheduler(_set_freeze, on=freeze)
        client.run_on_scheduler(_install_loop_probe)
        hosts = max(1, math.ceil(n / (per_host or MAX_RANKS_PER_HOST)))
        per_host = math.ceil(n / hosts)
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=run_host, daemon=True,
                             args=(address, job, list(range(h * per_host, min(n, (h + 1) * per_host))),
                                   n, steps, TIMEOUT, results, gather_s, push, tells))
                 for h in range(hosts)]
        sampler = _CpuSampler(pid)
        sampler.start()
        for p in procs:
            p.start()
        records: dict[int, dict] = {}
        errors: list[str] = []
        hubs: list[tuple[int, int]] = []  # (requests, asks) of each host's LocationHub
        fed: list[tuple[int, int, int]] = []  # its fed ranks' (requests, asks, checkpoints taken)
        deadline = time.monotonic() + TIMEOUT + 120
        for _ in procs:
            got = _next_result(results, procs, pid, deadline)
            records.update(got["ranks"])
            errors += got["errors"]
            if got.get("hub") is not None:
                hubs.append(tuple(got["hub"]))
            if got.get("fed") is not None:
                fed.append(tuple(got["fed"]))
        for p in procs:
            p.join(timeout=30)
        sampler.stop()
        lags, gc_pauses = client.run_on_scheduler(_read_loop_lags)
        full_gc_s = client.run_on_scheduler(_timed_full_collection)
        requests_seen, tells_seen, pushes, streamed = client.run_on_scheduler(_read_messages, job=job)
        client.run_on_scheduler(_remove_loop_probe)
        JobHandle(client, job).close()
    if errors or len(records) != n:
        raise RuntimeError(f"control plane at {n} ranks: {len(records)} of {n} ranks finished; "
                           + "; ".join(errors[:3]))
    # the steady window: from the last rank taking its first steady step to the first rank taking
    # its last step; steps counted as the median number of steps the ranks took inside it
    start = max(r["taken"][WARMUP] for r in records.values())
    end = min(r["taken"][-1] for r in records.values())
    inside = [sum(start < t <= end for t in r["taken"]) for r in records.values()]
    window_steps = statistics.median(inside)
    if window_steps < 1:  # ranks too far apart to overlap: count every step after the warm-up
        start = min(r["taken"][WARMUP - 1] for r in records.values())
        end = max(r["taken"][-1] for r in records.values())
        window_steps = steps - WARMUP
    cpu_ms = (sampler.at(end) - sampler.at(start)) * 1000.0 / window_steps
    # the loop's longest block per step: bins of the steady window's steps
    width = (end - start) / window_steps
    def worst(i: int, held: bool) -> float:
        inside = [(lag - queued if held else lag) for t, lag, queued in lags
                  if start + i * width <= t < start + (i + 1) * width]
        return max(inside, default=0.0)

    per_step = [worst(i, False) for i in range(int(window_steps))]
    per_step_held = [worst(i, True) for i in range(int(window_steps))]
    full_gcs = [d for t, d in gc_pauses if start <= t <= end]
    locate = [s for r in records.values() for s in r["locate_s"][WARMUP:]]
    acks = [s for r in records.values() for s in r["ack_s"][WARMUP:]]
    requests, asks = sum(h[0] for h in hubs), sum(h[1] for h in hubs)
    return {"asks_per_request": asks / requests if requests else float("nan"),
            "messages_per_step": (requests_seen + tells_seen + pushes + streamed) / steps,
            "requests_per_step": requests_seen / steps, "tells_per_step": tells_seen / steps,
            "streamed_tells_per_step": streamed / steps,
            "pushes_per_step": pushes / steps,
            # ranks fed by broadcast: their own location requests per step (a step none of their
            # host's receiving ranks brought) and the checkpoints they took from their hub
            "fed_requests_per_step": sum(f[0] for f in fed) / steps,
            "fed_asks_per_step": sum(f[1] for f in fed) / steps,
            "fed_from_hub_per_step": sum(f[2] for f in fed) / steps,
            "n": n, "dp": dp, "cpu_ms_per_step": cpu_ms, "steps_per_s": window_steps / (end - start),
            "locate_p50_ms": 1000 * _percentile(locate, 0.5), "locate_p99_ms": 1000 * _percentile(locate, 0.99),
            "ack_ms": 1000 * statistics.median(acks), "ack_p99_ms": 1000 * _percentile(acks, 0.99),
            "loop_blocked_p99_ms": 1000 * _percentile(per_step, 0.99),
            "loop_held_p99_ms": 1000 * _percentile(per_step_held, 0.99),
            "full_gcs_per_step": len(full_gcs) / window_steps,
            "full_gc_max_ms": 1000 * max(full_gcs, default=0.0),
            "full_gc_ms": 1000 * full_gc_s}


def _host_pairs(address: str, pid: int, sources, ns: tuple[int, ...], steps: int) -> list[dict]:
    """For each world ``n`` in ``ns`` (DP = N, TP 1): the scheduler's CPU per step with a host
    (a client) per rank and with all ranks on one host, the two run back to back, in turns
    first, so load on the machine hits both alike; their difference over ``n - 1`` hosts is what
    a host adds per step (its push and its tell), its groups' and ranks' work cancelling out."""
    pairs = []
    for i, n in enumerate(ns):
        layouts = (("apart", 1), ("together", MAX_RANKS_PER_HOST))
        cpu = {name: sweep_point(address, pid, sources, n=n, dp=n, steps=steps, per_host=per,
                                 job=f"control-hosts-{name}-{n}")["cpu_ms_per_step"]
               for name, per in (layouts if i % 2 == 0 else layouts[::-1])}
        pairs.append({"n": n, "apart_ms": cpu["apart"], "together_ms": cpu["together"],
                      "per_host_ms": max(0.0, (cpu["apart"] - cpu["together"]) / max(1, n - 1))})
    return pairs


def _slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares intercept and slope of ``(x, y)`` points."""
    xs, ys = zip(*points)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


def run(quick: bool) -> dict:
    from benchmarks.workload import corpus_dir
    from mdata.data.example import example_sources

    corpus = corpus_dir()
    sources = example_sources(corpus)
    if quick:
        fixed, per_group, dp, steps = (8, 24), (8, 24), 8, WARMUP + 2
        apart, floor_calls = (4,), 100  # enough requests to stand out of a silent phase's noise
    else:
        fixed, per_group, dp, steps = (16, 64, 256, 1024), (16, 64, 256), FIXED_DP, 12
        apart, floor_calls = (16, 32), 100
    with _cluster(corpus, constructors=1 if quick else 2) as (proc, address):
        points, polled = [], []  # pushed locations and long polls, point by point
        for n in fixed:
            points.append(sweep_point(address, proc.pid, sources, n=n, dp=dp, steps=steps,
                                      job=f"control-{n}"))
            polled.append(sweep_point(address, proc.pid, sources, n=n, dp=dp, steps=steps,
                                      job=f"control-{n}-poll", push=False))
        # a world of DP = N that the fixed-DP sweep measured already (N = its DP) is not rerun
        group_points = [points[fixed.index(n)] if n == dp and n in fixed else
                        sweep_point(address, proc.pid, sources, n=n, dp=n, steps=steps,
                                    job=f"control-dp{n}") for n in per_group]
        # the fixed-DP worlds under broadcast_at("tp"), only TP rank 0 of each group receiving,
        # one TP group per host as at scale: dp hosts whatever the TP
        bcast = [sweep_point(address, proc.pid, sources, n=n, dp=dp, steps=steps,
                             job=f"control-{n}-bcast-tp", broadcast="tp", per_host=n // dp)
                 for n in fixed]
        # the same largest world with every rank long-polling alone (the protocol before ranks
        # of one client asked together), measured in the same run
        alone = sweep_point(address, proc.pid, sources, n=fixed[-1], dp=dp, steps=steps,
                            job=f"control-{fixed[-1]}-alone", gather_s=0.0, push=False)
        # the per-rank part alone, on the same scheduler (benchmarks.control_consume)
        consume = consume_us_per_rank(address, sources, ranks=fixed[-1], dp=dp,
                                      job=f"control-{fixed[-1]}-consume")
        # what a host costs, measured directly: the same world (DP = N, TP 1) with every rank on
        # a host of its own and with all of them on one, interleaved; and Dask's own floor for
        # one request from as many hosts, on the same scheduler (benchmarks.control_floor)
        hosts = _host_pairs(address, proc.pid, sources, apart, steps)
        floor = request_floor_us(address, proc.pid, hosts=apart[-1], calls=floor_calls)
    base, per_rank = _slope([(p["n"], p["cpu_ms_per_step"]) for p in points])
    _, per_rank_and_group = _slope([(p["n"], p["cpu_ms_per_step"]) for p in group_points])
    per_group_ms = max(0.0, per_rank_and_group - per_rank)
    fixed_ms = max(0.0, base - dp * per_group_ms)  # the fixed-DP intercept holds its dp groups
    per_rank_at_scale = max(0.0, per_rank) + per_group_ms / RANKS_PER_GROUP
    max_ranks = (1000.0 - fixed_ms) / per_rank_at_scale if per_rank_at_scale > 0 else float("inf")
    _, per_rank_poll = _slope([(p["n"], p["cpu_ms_per_step"]) for p in polled])
    per_rank_poll_at_scale = max(0.0, per_rank_poll) + per_group_ms / RANKS_PER_GROUP
    max_ranks_poll = ((1000.0 - fixed_ms) / per_rank_poll_at_scale if per_rank_poll_at_scale > 0
                      else float("inf"))
    # under broadcast_at("tp") at TP RANKS_PER_GROUP, a host per TP group: per DP group its
    # cost, one receiving rank's and one host's; per other rank the broadcast sweep's slope (its
    # receivers and hosts are fixed: DP groups). A host's cost: the broadcast sweep's first
    # point (dp hosts of TP 1: nothing to broadcast) over the fixed-DP one (the same on 1 host)
    _, per_fed = _slope([(p["n"], p["cpu_ms_per_step"]) for p in bcast])
    per_host_ms = statistics.median(h["per_host_ms"] for h in hosts)
    group_bcast_ms = (per_group_ms + max(0.0, per_rank) + per_host_ms
                      + max(0.0, per_fed) * (RANKS_PER_GROUP - 1))
    per_rank_bcast = group_bcast_ms / RANKS_PER_GROUP
    max_ranks_bcast = (1000.0 - fixed_ms) / per_rank_bcast if per_rank_bcast > 0 else float("inf")
    top, top_poll, top_bcast = points[-1], polled[-1], bcast[-1]
    figures = {
        "control.scheduler_cpu_us_per_rank_step": figure(
            1000 * per_rank, unit="us", goal="flat in N at fixed DP (grows with groups, not ranks)",
            note=f"slope over N={list(fixed)} at DP {dp}"),
        "control.scheduler_cpu_us_per_group_step": figure(
            1000 * per_group_ms, unit="us", note=f"DP = N sweep over {list(per_group)}, less the per-rank slope"),
        "control.max_ranks_at_1_step_per_s": figure(
            max_ranks, goal=">= 16384 on one scheduler core",
            note=f"extrapolated at {RANKS_PER_GROUP} ranks per DP group"),
        "control.locate_p50_ms": figure(top["locate_p50_ms"], unit="ms", note=f"N={top['n']}, long-poll wait included"),
        "control.locate_p99_ms": figure(top["locate_p99_ms"], unit="ms", note=f"N={top['n']}"),
        "control.ack_ms_on_loop": figure(top["ack_ms"], unit="ms", goal="~0 (no round trip on the loop)",
                                         note=f"median, N={top['n']}"),
        "control.ack_ms_on_loop_p99": figure(top["ack_p99_ms"], unit="ms", note=f"N={top['n']}"),
        "control.loop_blocked_ms_p99": figure(top["loop_blocked_p99_ms"], unit="ms", note=f"N={top['n']}"),
        "control.loop_held_ms_p99": figure(top["loop_held_p99_ms"], unit="ms",
                                           note=f"N={top['n']}; lateness less the loop thread's run-queue wait"),
        "control.full_gc_max_ms": figure(top["full_gc_max_ms"], unit="ms", note=f"N={top['n']}"),
        "control.full_gc_ms": figure(top["full_gc_ms"], unit="ms",
                                     note=f"N={top['n']}; one full collection on the scheduler after the run"),
        "control.asks_per_request": figure(top_poll["asks_per_request"], note=(
            f"N={top['n']}, {MAX_RANKS_PER_HOST} ranks per host client, long polls: location asks "
            "per request")),
        f"control.scheduler_cpu_ms_per_step_{top['n']}_ranks_alone": figure(
            alone["cpu_ms_per_step"], unit="ms", note=f"DP {dp}, every rank asking alone (location-gather 0)"),
        "control.scheduler_cpu_us_per_rank_step_poll": figure(
            1000 * per_rank_poll, unit="us", note=f"as the default, ranks long-polling every step "
                                                  "(location-push off), same run"),
        "control.max_ranks_at_1_step_per_s_poll": figure(
            max_ranks_poll, note="as the default, ranks long-polling (the push run's per-group cost)"),
        "control.push_cpu_ratio": figure(
            top_poll["cpu_ms_per_step"] / top["cpu_ms_per_step"] if top["cpu_ms_per_step"] else float("nan"),
            goal="> 1", note=f"scheduler CPU per step at N={top['n']}: long polls / pushed locations"),
        "control.scheduler_messages_per_step_push": figure(
            top["messages_per_step"], note=f"N={top['n']}: location and consumption requests + pushes per step"),
        "control.scheduler_messages_per_step_poll": figure(
            top_poll["messages_per_step"], note=f"N={top['n']}: location and consumption requests per step, long polls"),
        "control.host_requests_cpu_ratio": figure(
            alone["cpu_ms_per_step"] / top_poll["cpu_ms_per_step"] if top_poll["cpu_ms_per_step"]
            else float("nan"),
            goal="> 1", note=f"scheduler CPU per step at N={top['n']}, long polls: ranks asking alone / per host"),
    }
    figures["control.consume_us_per_rank"] = figure(
        consume["us_per_rank"], unit="us",
        note=(f"the scheduler's loop reading and taking one message of every rank's consumption "
              f"tell, per rank, N={consume['ranks']} (DP {consume['dp']}), median of "
              f"{len(consume['per_step_us'])} steps; x 16,384 ranks = "
              f"{consume['us_per_rank'] * 16384 / 1e3:.0f} ms per step"))
    figures["control.scheduler_cpu_us_per_rank_step_bcast_tp"] = figure(
        1000 * per_fed, unit="us", goal="~0 (a rank fed by broadcast costs the scheduler nothing)",
        note=f"slope over N={list(fixed)} at DP {dp} under broadcast_at('tp'), one host per TP "
             f"group ({dp} hosts)")
    figures["control.scheduler_cpu_us_per_host_step"] = figure(
        1000 * per_host_ms, unit="us",
        note="DP = N = " + ", ".join(f"{h['n']}: {h['apart_ms']:.1f} ms with a host per rank, "
                                      f"{h['together_ms']:.1f} ms on one host" for h in hosts)
             + "; per host, median")
    floor_us = floor["us_per_request"]
    figures["control.dask_request_floor_us"] = figure(
        floor_us, unit="us", note=f"scheduler CPU per Dask echo request, {floor['hosts']} host "
                                  f"clients x {floor['calls']}, net of their silent CPU")
    figures["control.host_cost_in_requests"] = figure(
        1000 * per_host_ms / floor_us if floor_us > 0 else float("nan"),
        note="a host's cost per step in Dask's floor requests (one push and one tell per step)")
    figures["control.group_cost_in_requests_bcast_tp"] = figure(
        1000 * group_bcast_ms / floor_us if floor_us > 0 else float("nan"),
        note=f"a DP group at TP {RANKS_PER_GROUP} under broadcast_at('tp'), a host per TP group "
             "(its group, receiving rank, host and fed ranks), in Dask's floor requests per step")
    figures["control.max_ranks_at_1_step_per_s_bcast_tp"] = figure(
        max_ranks_bcast, goal=">= 16384 on one scheduler core",
        note=f"extrapolated at TP {RANKS_PER_GROUP} under broadcast_at('tp'), a host per TP group: "
             "per DP group its cost, one receiving rank and one host")
    figures["control.scheduler_messages_per_step_bcast_tp"] = figure(
        top_bcast["messages_per_step"],
        note=f"N={top_bcast['n']} under broadcast_at('tp'): location and consumption requests + pushes")
    for p in bcast:
        figures[f"control.scheduler_cpu_ms_per_step_{p['n']}_bcast_tp"] = figure(
            p["cpu_ms_per_step"], unit="ms", note=f"DP {dp}, broadcast_at('tp')")
    figures["control.fixed_dp"] = dp  # the DP size of the fixed-DP sweep (e2e fits its costs)
    for p in points:
        figures[f"control.scheduler_cpu_ms_per_step_{p['n']}"] = figure(p["cpu_ms_per_step"], unit="ms",
                                                                       note=f"DP {dp}")
        figures[f"control.steps_per_s_{p['n']}"] = p["steps_per_s"]
    for p in polled:
        figures[f"control.scheduler_cpu_ms_per_step_{p['n']}_poll"] = figure(
            p["cpu_ms_per_step"], unit="ms", note=f"DP {dp}, long polls")
    for p in group_points:
        figures[f"control.scheduler_cpu_ms_per_step_dp{p['n']}"] = figure(p["cpu_ms_per_step"], unit="ms",
                                                                         note="DP = N")
    return figures


def push_vs_poll(ns: tuple[int, ...], dp: int, steps: int, repeats: int,
                 tells: bool = False, gc_freeze: bool = False, broadcast: bool = False) -> dict:
    """Pushed locations against long polls side by side, in one cluster: for each world size in
    ``ns`` (DP ``dp``), ``repeats`` rounds of one push point and one poll point, interleaved so
    that load on the machine hits both alike; per mode the median scheduler CPU per step and
    messages per step, then the per-rank slopes and ``max_ranks_at_1_step_per_s`` of the medians
    (per-group cost left out: the DP is fixed). Run ``python -m benchmarks.control_plane
    --compare 64 256 --dp 16``; it prints the figures as JSON. ``tells`` (``--tells``): compare
    instead consumption told over the clients' streams (``stream``, the default) with the
    ``mdata_consumed`` RPCs (``rpc``, ``mdata.trainer.stream-tells`` off), both with push;
    ``gc_freeze`` (``--gc-freeze``): the scheduler's objects frozen out of full garbage
    collections (``frozen``, :mod:`mdata.gc_freeze`) against not (``unfrozen``), both with push;
    ``broadcast`` (``--broadcast``): the same worlds under ``broadcast_at("tp")`` (``bcast``)
    against every rank receiving (``receive``)."""
    from benchmarks.workload import corpus_dir
    from mdata.data.example import example_sources

    corpus = corpus_dir()
    sources = example_sources(corpus)
    runs: dict[tuple[str, int], list[dict]] = {}
    modes: tuple[tuple[str, dict], ...] = (
        (("stream", {"tells": True}), ("rpc", {"tells": False})) if tells
        else (("frozen", {"freeze": True}), ("unfrozen", {"freeze": False})) if gc_freeze
        else (("bcast", {"broadcast": "tp"}), ("receive", {})) if broadcast
        else (("push", {"push": None}), ("poll", {"push": False})))
    with _cluster(corpus, constructors=2) as (proc, address):
        for r in range(repeats):
            for n in ns:
                for mode, config in (modes if r % 2 == 0 else modes[::-1]):  # no order bias
                    point = sweep_point(address, proc.pid, sources, n=n, dp=dp, steps=steps,
                                        job=f"compare-{mode}-{n}-{r}", **config)
                    runs.setdefault((mode, n), []).append(point)
                    print(f"round {r} {mode} N={n}: {point['cpu_ms_per_step']:.1f} ms CPU, "
                          f"{point['messages_per_step']:.1f} messages per step, "
                          f"{point['steps_per_s']:.2f} steps/s, loop late p99 "
                          f"{point['loop_blocked_p99_ms']:.0f} ms (held {point['loop_held_p99_ms']:.0f}), "
                          f"{point['full_gcs_per_step']:.2f} full GCs/step, longest "
                          f"{point['full_gc_max_ms']:.0f} ms; one now {point['full_gc_ms']:.1f} ms",
                          file=sys.stderr,
                          flush=True)  # a run cut short still says what it measured
    out: dict = {"dp": dp, "steps": steps, "repeats": repeats}
    for mode, _ in modes:
        medians = [(n, statistics.median(p["cpu_ms_per_step"] for p in runs[(mode, n)])) for n in ns]
        base, slope = _slope(medians) if len(ns) > 1 else (medians[0][1], 0.0)
        out[mode] = {
            "cpu_ms_per_step": dict(medians),
            "cpu_ms_per_step_all": {n: [p["cpu_ms_per_step"] for p in runs[(mode, n)]] for n in ns},
            **{what: {n: statistics.median(p[what] for p in runs[(mode, n)]) for n in ns}
               for what in ("messages_per_step", "requests_per_step", "tells_per_step",
                            "streamed_tells_per_step", "pushes_per_step")},
            "steps_per_s": {n: statistics.median(p["steps_per_s"] for p in runs[(mode, n)]) for n in ns},
            **{what: {n: statistics.median(p[what] for p in runs[(mode, n)]) for n in ns}
               for what in ("loop_blocked_p99_ms", "loop_held_p99_ms", "full_gcs_per_step",
                            "full_gc_max_ms", "full_gc_ms")},
            "scheduler_cpu_us_per_rank_step": 1000 * slope,
            "max_ranks_at_1_step_per_s": (1000.0 - base) / slope if slope > 0 else float("inf"),
        }
    return out


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description="pushed locations against long polls, side by side")
    parser.add_argument("--compare", nargs="+", type=int, required=True, metavar="N")
    parser.add_argument("--dp", type=int, default=FIXED_DP)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tells", action="store_true",
                        help="compare consumption tells over the streams with mdata_consumed RPCs")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="compare the scheduler frozen out of full garbage collections with not")
    parser.add_argument("--broadcast", action="store_true",
                        help="compare the worlds under broadcast_at('tp') with every rank receiving")
    args = parser.parse_args()
    print(json.dumps(push_vs_poll(tuple(args.compare), args.dp, args.steps, args.repeats,
                                  args.tells, args.gc_freeze, args.broadcast), indent=1))
