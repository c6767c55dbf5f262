"""What the host agent saves the scheduler, and what it costs a rank: 8 trainer processes, one host.

The real scheduler with the Planner (``mdata cluster up`` in its own process), real loaders and
constructors, and 8 trainer *processes* (spawned, one rank each, as torchrun starts them on an
8-GPU host) running the real :class:`mdata.trainer.Loader`, in lockstep (a barrier across the
processes stands for the step's all-reduce), with ``mdata.trainer.host-agent`` on (one Dask
client for the 8, held by the agent) and off (one client each), the two interleaved run by run.

Per run: the Dask clients the scheduler had while the ranks ran (beyond those it had before),
the Planner's location requests, consumption requests and pushes per step (as
:mod:`benchmarks.control_plane` counts them), the ranks' location time per step
(``Loader.locate_seconds``: a pushed location's wait, or a long poll's round trip), the training
loop's wait per step, and the round trip of one small scheduler request (``JobInfoRequest``,
20 per rank after the run) through the agent or direct. Medians over the ranks' steady steps,
then over runs. Each run is followed by one of a single rank alone on the cluster, whose 200
round trips are the agent's own cost per request, without 8 processes sharing 2 cores. ``python -m benchmarks.host_agent --runs 3 --steps 30`` prints JSON.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import threading
import time

__all__ = ["run"]

RANKS = 8
WARMUP = 3


def _rank(address: str, job: str, rank: int, world: int, steps: int, agent: bool, barrier, out,
          rtts_n: int) -> None:
    import logging

    import dask

    from mdata.trainer import Loader
    from mdata.wire.messages import JobInfoRequest, ask_sync

    logging.getLogger("distributed").setLevel(logging.ERROR)
    dask.config.set({"mdata.trainer.host-agent": agent})
    try:
        waits = []
        with Loader(address, job=job, rank=rank, world_size=world, steps=steps,
                    timeout=300) as loader:
            it = iter(loader)
            for _ in range(steps):
                began = time.perf_counter()
                next(it)
                waits.append(time.perf_counter() - began)
                barrier.wait(300)  # the step's collective
            rtts = []
            for _ in range(rtts_n):
                began = time.perf_counter()
                ask_sync(loader.client, JobInfoRequest(job=job))
                rtts.append(time.perf_counter() - began)
            out.put({"rank": rank, "wait_s": waits, "locate_s": list(loader.locate_seconds),
                     "rtt_s": rtts})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        barrier.abort()
        out.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"})


def _clients(client) -> set[str]:
    return set(client.run_on_scheduler(lambda dask_scheduler=None: list(dask_scheduler.clients)))


def one_run(address: str, sources, *, job: str, agent: bool, steps: int, ranks: int = RANKS,
            rtts_n: int = 20) -> dict:
    from distributed import Client

    from benchmarks.control_job import job_plan
    from benchmarks.control_plane import _read_messages
    from mdata.driver import JobHandle, submit_job

    with Client(address, set_as_default=False) as client:
        dp = 2 if ranks > 1 else 1
        submit_job(client, job_plan(sources, dp, ranks // dp), job=job)
        before, seen, stop = _clients(client), [], threading.Event()

        def watch() -> None:
            while not stop.is_set():
                seen.append(len(_clients(client) - before))
                stop.wait(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        ctx = mp.get_context("spawn")
        out, barrier = ctx.Queue(), ctx.Barrier(ranks)
        procs = [ctx.Process(target=_rank, args=(address, job, r, ranks, steps, agent, barrier, out,
                                                 rtts_n))
                 for r in range(ranks)]
        for p in procs:
            p.start()
        records = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        stop.set()
        watcher.join()
        requests, tells, pushes = client.run_on_scheduler(_read_messages, job=job)
        JobHandle(client, job).close()
    errors = [r["error"] for r in records if "error" in r]
    if errors:
        raise RuntimeError(f"host agent run {job}: " + "; ".join(errors[:3]))
    steady = lambda key: [s for r in records for s in (r[key][WARMUP:] or r[key])]  # noqa: E731
    return {"clients": max(seen, default=0), "requests_per_step": requests / steps,
            "tells_per_step": tells / steps, "pushes_per_step": pushes / steps,
            "messages_per_step": (requests + tells + pushes) / steps,
            "locate_ms_p50": 1000 * statistics.median(steady("locate_s")),
            "wait_ms_p50": 1000 * statistics.median(steady("wait_s")),
            "rtt_ms_p50": 1000 * statistics.median(s for r in records for s in r["rtt_s"])}


def run(runs: int = 3, steps: int = 30) -> dict:
    """``runs`` rounds of one agent-on and one agent-off run, interleaved; medians per mode."""
    from benchmarks.control_plane import _cluster
    from benchmarks.workload import corpus_dir
    from mdata.data.example import example_sources

    corpus = corpus_dir()
    sources = example_sources(corpus)
    results: dict[str, list[dict]] = {"on": [], "off": []}
    alone: dict[str, list[float]] = {"on": [], "off": []}  # one rank, nothing else running
    with _cluster(corpus, constructors=2) as (_proc, address):
        for r in range(runs):
            for mode in (("on", "off") if r % 2 == 0 else ("off", "on")):
                results[mode].append(one_run(address, sources, job=f"agent-{mode}-{r}",
                                             agent=mode == "on", steps=steps))
                alone[mode].append(one_run(address, sources, job=f"alone-{mode}-{r}",
                                           agent=mode == "on", steps=5, ranks=1,
                                           rtts_n=200)["rtt_ms_p50"])
    out: dict = {"ranks": RANKS, "steps": steps, "runs": runs, "all": results}
    for mode, points in results.items():
        out[mode] = {k: statistics.median(p[k] for p in points) for k in points[0]}
    on, off = out["on"], out["off"]
    out["messages_ratio_off_over_on"] = off["messages_per_step"] / on["messages_per_step"]
    out["extra_locate_ms_p50"] = on["locate_ms_p50"] - off["locate_ms_p50"]
    out["extra_rtt_ms_p50"] = on["rtt_ms_p50"] - off["rtt_ms_p50"]
    out["alone_rtt_ms"] = alone
    out["alone_extra_rtt_ms_p50"] = statistics.median(alone["on"]) - statistics.median(alone["off"])
    return out


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    print(json.dumps(run(args.runs, args.steps), indent=1, default=str))
