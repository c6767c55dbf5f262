"""What one trivial Dask request costs the scheduler on this machine: the unit a host's messages cost.

The control-plane sweep finds that a trainer host adds a fixed cost per step (one pushed location
and one consumption tell). Whether that cost is mdata's handlers or Dask's own handling of a
message (reading the frames, decoding them, dispatching the handler, writing the reply, the
event loop's wake-up) decides what can lower it: faster handlers, or fewer messages. This measures
the second part alone, on the real scheduler of the same cluster: ``hosts`` processes, each one
Dask client as a trainer host has, send ``calls`` ``echo`` requests (Dask's built-in handler,
which does nothing but reply) at a training loop's pace, and then stay connected and silent for
as long again. The scheduler process' CPU over the silent phase (heartbeats, Dask's monitors) is
taken from that over the asking phase, and what is left, per request, is Dask's floor for a
request on this machine's cores.

Figure: ``control.dask_request_floor_us`` (:func:`request_floor_us`).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

__all__ = ["request_floor_us"]


def _host(address: str, calls: int, pace_s: float, barrier, results) -> None:
    """Process body: one client; wait for the start, ask ``calls`` times, wait, stay silent."""
    import logging

    from distributed import Client

    logging.getLogger("distributed").setLevel(logging.ERROR)
    with Client(address, set_as_default=False, timeout=60) as client:
        barrier.wait()  # every host connected: the asking phase starts
        began = time.perf_counter()
        for _ in range(calls):
            client.sync(client.scheduler.echo, data=b"x")
            time.sleep(pace_s)
        results.put(time.perf_counter() - began)
        barrier.wait()  # every host done asking: the silent phase starts
        barrier.wait()  # the silent phase is over: disconnect


def request_floor_us(address: str, pid: int, *, hosts: int, calls: int,
                     pace_s: float = 0.02) -> dict[str, Any]:
    """Scheduler CPU per ``echo`` request from ``hosts`` clients at the cluster at ``address``
    (scheduler process ``pid``), net of what the connected clients cost it when silent:
    ``{"us_per_request", "asking_s", "silent_cpu_s", "hosts", "calls"}``."""
    from benchmarks.counting import cpu_seconds

    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(hosts + 1), ctx.Queue()
    procs = [ctx.Process(target=_host, args=(address, calls, pace_s, barrier, results), daemon=True)
             for _ in range(hosts)]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=180)
        cpu0, t0 = cpu_seconds([pid]), time.monotonic()
        barrier.wait(timeout=600)
        cpu1, t1 = cpu_seconds([pid]), time.monotonic()
        time.sleep(t1 - t0)  # silent, as long as the asking took
        cpu2 = cpu_seconds([pid])
        barrier.wait(timeout=60)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    asking = [results.get(timeout=5) for _ in procs]
    busy = (cpu1 - cpu0) - (cpu2 - cpu1)
    return {"us_per_request": max(0.0, busy) * 1e6 / (hosts * calls), "asking_s": max(asking),
            "silent_cpu_s": cpu2 - cpu1, "hosts": hosts, "calls": calls}


if __name__ == "__main__":  # pragma: no cover
    import sys

    from benchmarks.control_cluster import cluster
    from benchmarks.workload import corpus_dir

    with cluster(corpus_dir(), constructors=1) as (proc, address):
        for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 1):
            print(request_floor_us(address, proc.pid, hosts=int(sys.argv[1]) if len(sys.argv) > 1
                                   else 16, calls=100))
