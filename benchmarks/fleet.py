"""Loader fleets in real processes, measured the same way: PSS, CPU time, samples, trainer waits.

Both systems run here as they would beside a trainer, in separate processes whose memory and CPU
are read with psutil:

* :class:`BaselineFleet` — ``R`` rank processes (forked from this one, so they share its imported
  torch pages: that lowers the baseline's numbers, the conservative direction), each driving its
  own ``DataLoader`` with ``W`` worker processes (``benchmarks/baseline.py``).
* :class:`MdataFleet` — a *cluster host* process (the Dask scheduler with the Planner, and the
  nannies) started with :func:`mdata.driver.start_cluster`, its Dask worker processes (loader
  pools and constructors), and a *trainer host* process holding the ``R`` trainer-side
  :class:`mdata.trainer.Loader` objects (one thread per rank).

Each fleet takes the same commands: ``run(steps, compute_s_per_cost)`` makes every rank consume
``steps`` batches, sleeping for the batch's attention cost times ``compute_s_per_cost`` (a
stand-in for forward/backward) and meeting the other ranks at a barrier each step (a data-parallel
all-reduce), and returns per-rank wall, data-wait and compute seconds plus the distinct samples
delivered per DP group.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.baseline import MixingPackingDataset, make_loader
from mdata.cost import AttentionCost

__all__ = ["BaselineFleet", "MdataFleet", "RunStats", "cpu_seconds", "pss_mb"]

COST = AttentionCost()
MB = 1 << 20


def pss_mb(pids: Sequence[int]) -> float:
    """Sum of proportional set sizes (Linux ``memory_full_info().pss``) of ``pids``, in MiB."""
    import psutil

    return sum(psutil.Process(p).memory_full_info().pss for p in pids) / MB


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds consumed so far by ``pids`` (children not included)."""
    import psutil

    total = 0.0
    for p in pids:
        t = psutil.Process(p).cpu_times()
        total += t.user + t.system
    return total


@dataclass(frozen=True)
class RunStats:
    """What the ranks saw over one :meth:`run`: seconds summed over ranks, samples per DP group."""

    wall_s: float  # wall time of the whole run (every rank ran concurrently)
    rank_wall_s: float  # sum over ranks
    wait_s: float  # sum over ranks: time blocked waiting for the next batch
    compute_s: float  # sum over ranks: simulated forward/backward
    samples: int  # distinct samples delivered, counted once per DP group
    batch_bytes: float  # mean bytes of one rank's batch (tensors)

    @property
    def stall_fraction(self) -> float:
        return self.wait_s / self.rank_wall_s if self.rank_wall_s > 0 else float("nan")


def _batch_cost(micro_batches: list[dict]) -> float:
    lengths = np.concatenate([np.diff(mb["cu_seqlens"].numpy()) for mb in micro_batches])
    lengths = lengths[lengths > 0].astype(np.float64)
    return float(COST(lengths, np.zeros_like(lengths)).sum())


def _consume(batches, steps: int, compute_s_per_cost: float, barrier) -> dict[str, Any]:
    """One rank: take ``steps`` batches, simulate compute, meet the others every step."""
    wait = compute = 0.0
    ids: list[np.ndarray] = []
    nbytes = 0
    began = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        batch = next(batches)
        wait += time.perf_counter() - t0
        mbs = batch["micro_batches"]
        if "sample_ids" in batch:  # mdata: the batch's lineage ids; baseline: per micro-batch
            ids.append(batch["sample_ids"].numpy().reshape(-1, 3))
        else:
            ids.extend(mb["sample_ids"].numpy() for mb in mbs)
        nbytes += sum(t.numel() * t.element_size() for mb in mbs for t in mb.values()
                      if hasattr(t, "element_size"))
        t0 = time.perf_counter()
        time.sleep(_batch_cost(mbs) * compute_s_per_cost)
        compute += time.perf_counter() - t0
        if barrier is not None:
            barrier.wait()
    return {"wall": time.perf_counter() - began, "wait": wait, "compute": compute,
            "ids": np.concatenate(ids) if ids else np.zeros((0, 3), np.int64),
            "bytes": nbytes / max(1, steps)}


def _stats(results: list[dict], dp_of: Sequence[int], wall: float) -> RunStats:
    per_group: dict[int, set] = {}
    for res, dp in zip(results, dp_of):
        per_group.setdefault(dp, set()).update(map(tuple, res["ids"].tolist()))
    return RunStats(
        wall_s=wall, rank_wall_s=sum(r["wall"] for r in results),
        wait_s=sum(r["wait"] for r in results), compute_s=sum(r["compute"] for r in results),
        samples=sum(len(s) for s in per_group.values()),
        batch_bytes=float(np.mean([r["bytes"] for r in results])),
    )


# -- baseline --------------------------------------------------------------------------------------

def _rank_main(dataset: MixingPackingDataset, workers: int, conn, barrier) -> None:
    loader = make_loader(dataset, workers)
    batches = iter(loader)
    conn.send(("ready", os.getpid()))
    while True:
        cmd, *args = conn.recv()
        if cmd == "run":
            conn.send(("done", _consume(batches, args[0], args[1], barrier)))
        elif cmd == "stop":
            del batches, loader  # shuts the workers down
            conn.send(("stopped", None))
            return


class BaselineFleet:
    """``ranks`` trainer ranks, each with its own DataLoader of ``workers`` processes.

    ``group`` consecutive ranks form one DP group (their CP/TP peers) and load the same samples.
    """

    def __init__(self, sources: Sequence, weights: Mapping[str, float], *, ranks: int, group: int,
                 workers: int, max_tokens: int, micro_batches: int, seed: int = 0) -> None:
        if ranks % group:
            raise ValueError(f"{ranks} ranks do not split into DP groups of {group}")
        self.ranks, self.group, self.workers = ranks, group, workers
        self.dp_of = [r // group for r in range(ranks)]
        self.datasets = [MixingPackingDataset(sources, weights, max_tokens=max_tokens,
                                              micro_batches=micro_batches, dp_rank=self.dp_of[r],
                                              dp_size=ranks // group, seed=seed)
                         for r in range(ranks)]
        self._procs: list = []
        self._conns: list = []
        self.rank_pids: list[int] = []

    def __enter__(self) -> "BaselineFleet":
        ctx = mp.get_context("fork")
        barrier = ctx.Barrier(self.ranks)
        for ds in self.datasets:
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_rank_main, args=(ds, self.workers, there, barrier), daemon=False)
            proc.start()
            self._procs.append(proc)
            self._conns.append(here)
        self.rank_pids = [c.recv()[1] for c in self._conns]
        return self

    def worker_pids(self) -> list[int]:
        import psutil

        return [c.pid for p in self.rank_pids for c in psutil.Process(p).children(recursive=True)]

    def run(self, steps: int, compute_s_per_cost: float = 0.0) -> RunStats:
        began = time.perf_counter()
        for c in self._conns:
            c.send(("run", steps, compute_s_per_cost))
        results = [c.recv()[1] for c in self._conns]
        return _stats(results, self.dp_of, time.perf_counter() - began)

    def __exit__(self, *exc) -> None:
        for c in self._conns:
            try:
                c.send(("stop",))
            except OSError:
                pass
        for p in self._procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()


# -- mdata -----------------------------------------------------------------------------------------

def _quiet_dask() -> None:
    """Keep Dask's INFO chatter out of the benchmark table (inherited by spawned workers)."""
    os.environ["DASK_LOGGING__DISTRIBUTED"] = "error"


def _cluster_host_main(sources, plan, job: str, loader_workers: int, conn) -> None:
    _quiet_dask()
    from mdata.driver import submit_job
    from mdata.driver import PoolSpec, start_cluster

    names = [s.name for s in sources]
    groups = [tuple(names[i::loader_workers]) for i in range(min(loader_workers, len(names)))]
    pools = [PoolSpec(name=f"loaders{i}", sources=g) for i, g in enumerate(groups)]
    try:
        with start_cluster(sources, pools=pools, constructors=1, autoscale=False) as cluster, \
                cluster.client(set_as_default=False) as client:
            client.wait_for_workers(len(pools) + 1, timeout=120)
            submit_job(client, plan, job=job)
            pids = list(client.run(os.getpid).values())
            conn.send(("ready", (cluster.scheduler_address, os.getpid(), pids)))
            conn.recv()  # stop
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _trainer_host_main(address: str, job: str, ranks: int, conn) -> None:
    _quiet_dask()
    from distributed import Client

    from mdata.trainer import Loader

    with Client(address, direct_to_workers=True, set_as_default=False) as client:
        loaders = [Loader(client, job=job, rank=r, world_size=ranks, timeout=120.0) for r in range(ranks)]
        iters = [iter(ld) for ld in loaders]
        conn.send(("ready", os.getpid()))
        while True:
            cmd, *args = conn.recv()
            if cmd == "stop":
                for ld in loaders:
                    ld.close()
                conn.send(("stopped", None))
                return
            barrier = threading.Barrier(ranks)
            results: list = [None] * ranks
            errors: list = []

            def one(r: int) -> None:
                try:
                    results[r] = _consume(iters[r], args[0], args[1], barrier)
                except BaseException as exc:  # surface, never hang the driver
                    errors.append(f"rank {r}: {type(exc).__name__}: {exc}")
                    barrier.abort()

            threads = [threading.Thread(target=one, args=(r,)) for r in range(ranks)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            conn.send(("error", "; ".join(errors)) if errors else ("done", results))


class MdataFleet:
    """An mdata cluster (host + Dask workers) and a trainer host with ``ranks`` Loaders."""

    def __init__(self, sources: Sequence, plan, *, loader_workers: int, job: str = "bench") -> None:
        self.sources, self.plan, self.job = list(sources), plan, job
        self.loader_workers = loader_workers
        self.mesh = plan.mesh
        self.dp_of = [self.mesh.coordinate(r).dp for r in range(self.mesh.world_size)]
        self._procs: list = []
        self._conns: list = []
        self.host_pid = self.trainer_pid = 0
        self.worker_pids: list[int] = []

    def _start(self, target, *args):
        ctx = mp.get_context("spawn")  # no Dask threads ever live in this (forking) process
        here, there = ctx.Pipe()
        proc = ctx.Process(target=target, args=(*args, there))
        proc.start()
        self._procs.append(proc)
        self._conns.append(here)
        if not here.poll(300):
            raise TimeoutError(f"{target.__name__} did not start within 300 s")
        kind, value = here.recv()
        if kind == "error":
            raise RuntimeError(f"mdata {target.__name__}: {value}")
        return value

    def __enter__(self) -> "MdataFleet":
        try:
            address, self.host_pid, self.worker_pids = self._start(
                _cluster_host_main, self.sources, self.plan, self.job, self.loader_workers)
            self.trainer_pid = self._start(_trainer_host_main, address, self.job, self.mesh.world_size)
        except BaseException:
            self.__exit__()
            raise
        return self

    def run(self, steps: int, compute_s_per_cost: float = 0.0) -> RunStats:
        began = time.perf_counter()
        conn = self._conns[1]
        conn.send(("run", steps, compute_s_per_cost))
        kind, value = conn.recv()
        if kind == "error":
            raise RuntimeError(f"mdata trainers: {value}")
        return _stats(value, self.dp_of, time.perf_counter() - began)

    def __exit__(self, *exc) -> None:
        # Shutdown order: the trainer host (its Loaders and client) goes first and is gone before
        # the cluster closes. Stopping both at once left the trainers' client reconnecting to a
        # closed scheduler for 30 s, and their long polls failing with CommClosedError.
        for c, p in reversed(list(zip(self._conns, self._procs))):
            try:
                c.send(("stop",))
            except OSError:
                pass
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
