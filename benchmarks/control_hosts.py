"""One simulated trainer host of the control-plane benchmark: a process, one Dask client, R ranks.

On a real cluster each host runs 8 trainer processes; here a host is one process whose ranks are
threads sharing one client (so hundreds of ranks fit on a 2-core machine), each running the real
:class:`mdata.trainer.Loader` protocol against the real scheduler: attach and lease the rank,
long-poll where its batch is, pull its slice from the constructor, acknowledge consumption. There
is no training compute: the ranks go as fast as the data path lets them, so what the scheduler
spends per step is what the protocol costs it. As in training, where every step ends in a
collective (the gradients' all-reduce), the ranks of a host wait for each other at the end of
each step (a barrier; ranks of other hosts are not waited for), and each marks the step
consumed once it is through (as a training loop's next call for a batch would: after the step's
collective, so the ranks of a host note it within moments of each other).

Each rank records, per step, when it took the batch (wall clock, so the parent can line the steps
up with the scheduler's CPU samples), how long the training loop waited in the Loader for it, and
how long the consumption acknowledgement kept the loop (``Loader.mark_consumed``). The Loader's
own ``locate_seconds`` give the location round trips.
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["run_host"]


def _rank_loop(client, job: str, rank: int, world: int, steps: int, timeout: float,
               out: dict[int, Any], errors: list[str], step_barrier: threading.Barrier) -> None:
    from mdata.trainer import Loader

    taken: list[float] = []
    waits: list[float] = []
    acks: list[float] = []
    try:
        with Loader(client, job=job, rank=rank, world_size=world, steps=steps,
                    timeout=timeout, device=None) as loader:
            it = iter(loader)
            hub = None
            for _ in range(steps):
                began = time.perf_counter()
                next(it)
                hub = hub or loader._hub
                waits.append(time.perf_counter() - began)
                taken.append(time.time())
                step_barrier.wait(timeout)  # the step's collective: ranks train in lockstep
                began = time.perf_counter()
                # the step is done once its collective is (as a training loop's next() says it):
                # the host's ranks note consumption together; what it costs the loop
                loader.mark_consumed()
                acks.append(time.perf_counter() - began)
            out[rank] = {"taken": taken, "wait_s": waits, "ack_s": acks,
                         "locate_s": list(loader.locate_seconds),
                         "hub": None if hub is None else (hub.requests, hub.asks),
                         # ranks fed by broadcast: asks of theirs that went to the scheduler,
                         # and checkpoints they took from the hub instead
                         "fed": None if hub is None else (hub.fed_requests, hub.fed_asks,
                                                          hub.steps.served)}
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        step_barrier.abort()  # the others stop waiting for this rank
        errors.append(f"rank {rank}: {type(exc).__name__}: {exc}")


def run_host(address: str, job: str, ranks: list[int], world: int, steps: int,
             timeout: float, results, gather_s: float | None = None,
             push: bool | None = None, tells: bool | None = None) -> None:
    """Process body: run ``ranks`` of ``job`` for ``steps`` steps over one shared client and put
    ``{"ranks": {rank: record}, "errors": [...]}`` on the ``results`` queue. ``gather_s``:
    ``mdata.trainer.location-gather`` for this host (0: every rank asks alone, as before ranks
    of one client asked together); ``push``: ``mdata.trainer.location-push`` (False: ranks
    long-poll every step, as before the scheduler pushed locations; None: the default);
    ``tells``: ``mdata.trainer.stream-tells`` (False: consumption as ``mdata_consumed`` RPCs)."""
    import logging

    import dask
    from distributed import Client

    if gather_s is not None:
        dask.config.set({"mdata.trainer.location-gather": gather_s})
    if push is not None:
        dask.config.set({"mdata.trainer.location-push": bool(push)})
    if tells is not None:
        dask.config.set({"mdata.trainer.stream-tells": bool(tells)})
    logging.getLogger("distributed").setLevel(logging.ERROR)
    out: dict[int, Any] = {}
    errors: list[str] = []
    try:
        with Client(address, set_as_default=False, direct_to_workers=True,
                    timeout=timeout) as client:
            step_barrier = threading.Barrier(len(ranks))
            threads = [threading.Thread(target=_rank_loop, daemon=True,
                                        args=(client, job, r, world, steps, timeout, out, errors,
                                              step_barrier))
                       for r in ranks]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    except BaseException as exc:  # noqa: BLE001
        errors.append(f"host of ranks {ranks[0]}..{ranks[-1]}: {type(exc).__name__}: {exc}")
    # the host's hub (its ranks share it): requests sent and asks they carried, as last seen
    hub = max((r["hub"] for r in out.values() if r.get("hub") is not None), default=None)
    fed = max((r["fed"] for r in out.values() if r.get("fed") is not None), default=None)
    results.put({"ranks": out, "errors": errors, "hub": hub, "fed": fed})
