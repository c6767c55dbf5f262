"""What the scheduler's event loop spends per rank on consumption, measured alone.

The control-plane sweep (:mod:`benchmarks.control_plane`) reads the scheduler's whole CPU per
step with real trainers on two shared cores, where the per-rank slope is mostly trainer threads
starved of a CPU and messages that fail to merge. This measures the per-rank part on its own, on
the real scheduler of the same cluster: a job of ``ranks`` ranks (DP ``dp``), each rank leased by
the real attach, and for each of a few balanced steps one message carrying every rank's
consumption tell, as a hub sends it. Timed on the scheduler's event loop: reading the message
(``ConsumedRequest.from_msg`` of what Dask decoded) and taking it (``take_tells``: each rank's
lease and steps checked, the runtime's counters, the Planner events queued). The Planner's own
application of those events is not counted (it runs by DP group, in the planning thread).

Figure: ``control.consume_us_per_rank`` (median over the steps), with the world in its note.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

__all__ = ["consume_us_per_rank"]


async def _measure(dask_scheduler=None, job: str = "", ranks: int = 0, steps: int = 3,
                   timeout: float = 120.0) -> dict[str, Any]:
    """On the scheduler: lease every rank, then time one message of every rank's tell per step."""
    import asyncio

    from distributed.protocol import dumps, loads

    from mdata.wire.host_location import ConsumedRequest, ConsumedTell
    from mdata.wire.trainers import AttachRequest
    from scheduler_plugins.job_trainers import attach
    from scheduler_plugins.stream_tells import take_tells

    runtime = dask_scheduler.extensions["mdata"].jobs[job]
    leases: dict[int, tuple[str, int]] = {}
    for rank in range(ranks):
        token = f"consume-bench-{rank:06d}-{'0' * 16}"
        reply = await attach(runtime, AttachRequest(job=job, rank=rank, client="consume-bench",
                                                    token=token, host="bench", pid=1))
        leases[rank] = (token, reply.generation)
    deadline = time.monotonic() + timeout
    while runtime.view.balanced_step < steps:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {runtime.view.balanced_step} of {steps} steps balanced")
        await asyncio.sleep(0.05)
    seconds, errors = [], 0
    for step in range(steps):
        request = ConsumedRequest(job, tuple(
            ConsumedTell(rank=r, steps=(step,), token=token, generation=generation,
                         stalled_s=0.25 * step, waits=(0.01,), waited=(0.002,))
            for r, (token, generation) in leases.items()))
        wire = loads(dumps(request.to_msg()))  # as the handler gets it from Dask
        began = time.perf_counter()
        told = ConsumedRequest.from_msg(wire)
        errors += sum(e is not None for e in take_tells(runtime, told.tells))
        seconds.append(time.perf_counter() - began)
        await asyncio.sleep(0)  # the queued events go to the Planner
    return {"seconds": seconds, "errors": errors}


def consume_us_per_rank(address: str, sources, *, ranks: int, dp: int, job: str,
                        steps: int = 3) -> dict[str, Any]:
    """Register a job of ``ranks`` ranks (DP ``dp``) on the cluster at ``address`` and measure
    (see the module docstring); ``{"us_per_rank", "per_step_us", "ranks", "dp"}``."""
    from distributed import Client

    from benchmarks.control_job import job_plan
    from mdata.driver import JobHandle, submit_job

    with Client(address, set_as_default=False) as client:
        plan = job_plan(sources, dp, ranks // dp).window(steps + 1)
        submit_job(client, plan, job=job)
        try:
            out = client.run_on_scheduler(_measure, job=job, ranks=ranks, steps=steps)
        finally:
            JobHandle(client, job).close()
    if out["errors"]:
        raise RuntimeError(f"{out['errors']} tells were refused: the benchmark's leases are wrong")
    per_rank = [s / ranks * 1e6 for s in out["seconds"]]
    return {"us_per_rank": statistics.median(per_rank), "per_step_us": per_rank,
            "ranks": ranks, "dp": dp}


if __name__ == "__main__":  # pragma: no cover
    import sys

    from benchmarks.control_cluster import cluster
    from benchmarks.workload import corpus_dir
    from mdata.data.example import example_sources

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    corpus = corpus_dir()
    with cluster(corpus, constructors=1) as (_proc, address):
        for round_ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):
            print(consume_us_per_rank(address, example_sources(corpus), ranks=n, dp=16,
                                      job=f"consume-{round_}"))
