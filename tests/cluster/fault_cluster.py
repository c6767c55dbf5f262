"""Cluster process body for the chaos tests: ``mdata.driver.start_cluster`` in a process of its own.

The embedded cluster's scheduler (and the Planner in it) runs inside the process that calls
``start_cluster``. Losing the *whole* cluster, scheduler included, must not take the test down, so
the chaos harness starts the cluster here, in a new session (process group), and ``kill -9``'s the
group: scheduler, nannies and workers die at once, as when the cluster's machines go away.

Usage: ``python fault_cluster.py SPEC.pkl ADDRESS_FILE``. ``SPEC.pkl`` holds a dict with
``sources`` (Source objects), ``pools`` (PoolSpec objects) and ``constructors``; the scheduler's
address is written to ``ADDRESS_FILE`` (atomically) once every worker has joined. SIGTERM closes
the cluster gracefully. Should the test process die without closing it (a hard timeout), the group
kills itself within a second instead of outliving the test.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
import time
from pathlib import Path


def _die_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.killpg(0, signal.SIGKILL)  # this process's group: the scheduler and every worker


def main(spec_path: str, address_file: str) -> int:
    from distributed import Client

    from mdata.driver import start_cluster

    logging.getLogger("distributed").setLevel(logging.ERROR)
    threading.Thread(target=_die_with_parent, args=(os.getppid(),), daemon=True).start()
    spec = pickle.loads(Path(spec_path).read_bytes())
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with start_cluster(spec["sources"], pools=spec["pools"], constructors=spec["constructors"],
                       constructor_threads=spec.get("constructor_threads", 1),
                       dashboard_address=None, autoscale=False) as cluster:
        workers = sum(p.workers for p in spec["pools"]) + spec["constructors"]
        with Client(cluster.scheduler_address, set_as_default=False) as client:
            client.wait_for_workers(workers, timeout=120)
        tmp = f"{address_file}.tmp"
        Path(tmp).write_text(cluster.scheduler_address)
        os.replace(tmp, address_file)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
