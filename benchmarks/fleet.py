"""Loader fleets in real processes, counted the same way: what each system adds to a trainer.

Both systems run here as they run beside a trainer: every trainer rank is its own process, started
fresh (``spawn``, as torchrun starts them) with a trainer's imports (torch, numpy), so nothing is
shared between ranks that would not be shared under torchrun. Beside each fleet runs one *bare
trainer* process with the same imports and no loader; :mod:`benchmarks.counting` subtracts it
from every rank to count what the loader adds.

* :class:`BaselineFleet` -- ``R`` rank processes, each driving its own ``DataLoader`` with ``W``
  worker processes (forked from the rank, the DataLoader's default on Linux;
  ``benchmarks/baseline.py``).
* :class:`MdataFleet` -- a *cluster host* process (the Dask scheduler with the Planner, and the
  nannies) started with :func:`mdata.driver.start_cluster`, its Dask worker processes (loader
  pools and constructors), and ``R`` rank processes, each with its own Dask client and
  :class:`mdata.trainer.Loader` (``Loader(address, rank=r, world_size=R)``, as a torchrun rank).

Each fleet takes the same commands: ``run(steps, compute_s_per_cost)`` makes every rank consume
``steps`` batches, sleeping for the batch's attention cost times ``compute_s_per_cost`` (a
stand-in for forward/backward) and meeting the other ranks at a barrier each step (a data-parallel
all-reduce), and returns per-rank wall, data-wait and compute seconds plus the distinct samples
delivered per DP group. Both expose ``rank_pids``, ``bare_pid`` and ``loader_pids()`` for
:class:`benchmarks.counting.PeakPss` and :func:`benchmarks.counting.added_cpu_seconds`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.baseline import MixingPackingDataset, make_loader
from benchmarks.counting import cpu_seconds, pss_mb
from mdata.cost import AttentionCost

__all__ = ["BaselineFleet", "MdataFleet", "RunStats", "cpu_seconds", "pss_mb", "trainer_imports"]

COST = AttentionCost()
MB = 1 << 20


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
    """The attention cost of the whole micro-batches a rank takes part in: an mdata rank under
    context parallelism receives its pieces of every document (``cu_seqlens`` local), and
    ``cu_seqlens_global`` gives the documents whole, as a baseline CP rank loads them, so both
    sides are paced on the same work (the pace divides it over the CP group)."""
    lengths = np.concatenate([np.diff(mb.get("cu_seqlens_global", mb["cu_seqlens"]).numpy())
                              for mb in micro_batches])
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


# -- processes common to both fleets ---------------------------------------------------------------

def trainer_imports() -> None:
    """What every trainer process imports and touches, loader or not (the bare trainer's work)."""
    import numpy  # noqa: F401
    import torch

    torch.ones(1).sum()


def _quiet_dask() -> None:
    """Keep Dask's INFO chatter out of the benchmark table (inherited by spawned workers)."""
    os.environ["DASK_LOGGING__DISTRIBUTED"] = "error"


def _bare_main(conn) -> None:
    trainer_imports()
    conn.send(("ready", os.getpid()))
    conn.recv()  # stop
    conn.send(("stopped", None))


def _serve(batches, barrier, conn) -> None:
    """A rank's command loop: ``run`` consumes steps, ``stop`` returns (the caller cleans up)."""
    while True:
        cmd, *args = conn.recv()
        if cmd == "stop":
            return
        try:
            conn.send(("done", _consume(batches, args[0], args[1], barrier)))
        except BaseException as exc:  # surface, never hang the driver or the other ranks
            barrier.abort()
            conn.send(("error", f"pid {os.getpid()}: {type(exc).__name__}: {exc}"))


class _Fleet:
    """Spawned rank processes (and the bare trainer), driven over pipes."""

    def __init__(self) -> None:
        self._procs: list = []
        self._rank_conns: list = []
        self._other_conns: list = []
        self.rank_pids: list[int] = []
        self.bare_pid = 0
        self.dp_of: list[int] = []

    def _spawn(self, target, *args, rank: bool):
        ctx = mp.get_context("spawn")  # fresh interpreters, as torchrun starts ranks
        here, there = ctx.Pipe()
        proc = ctx.Process(target=target, args=(*args, there))
        proc.start()
        self._procs.append(proc)
        (self._rank_conns if rank else self._other_conns).append(here)
        return here

    @staticmethod
    def _ready(conn, what: str, timeout: float = 300.0):
        if not conn.poll(timeout):
            raise TimeoutError(f"{what} did not start within {timeout:.0f} s")
        kind, value = conn.recv()
        if kind == "error":
            raise RuntimeError(f"{what}: {value}")
        return value

    def _start_ranks(self, target, per_rank_args: list[tuple]) -> None:
        barrier = mp.get_context("spawn").Barrier(len(per_rank_args))
        bare = self._spawn(_bare_main, rank=False)
        conns = [self._spawn(target, *args, barrier, rank=True) for args in per_rank_args]
        self.bare_pid = self._ready(bare, "the bare trainer")
        self.rank_pids = [self._ready(c, f"rank {r}") for r, c in enumerate(conns)]

    def loader_pids(self) -> list[int]:
        raise NotImplementedError

    def run(self, steps: int, compute_s_per_cost: float = 0.0) -> RunStats:
        began = time.perf_counter()
        for c in self._rank_conns:
            c.send(("run", steps, compute_s_per_cost))
        replies = [c.recv() for c in self._rank_conns]
        errors = [v for kind, v in replies if kind == "error"]
        if errors:
            raise RuntimeError(f"{type(self).__name__} ranks: " + "; ".join(errors))
        return _stats([v for _, v in replies], self.dp_of, time.perf_counter() - began)

    def _stop_all(self, conns, timeout: float) -> None:
        for c in conns:
            try:
                c.send(("stop",))
            except OSError:
                pass

    def __exit__(self, *exc) -> None:
        self._stop_all(self._rank_conns, 60)
        self._stop_all(self._other_conns, 60)
        for p in reversed(self._procs):
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()


# -- baseline --------------------------------------------------------------------------------------

def _rank_main(dataset: MixingPackingDataset, workers: int, barrier, conn) -> None:
    import warnings

    trainer_imports()
    # DataLoader warns when workers outnumber this machine's cores: here they do on purpose.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    loader = make_loader(dataset, workers)
    batches = iter(loader)
    conn.send(("ready", os.getpid()))
    _serve(batches, barrier, conn)
    del batches, loader  # shuts the workers down


class BaselineFleet(_Fleet):
    """``ranks`` trainer ranks, each its own process with a DataLoader of ``workers`` processes.

    ``group`` consecutive ranks form one DP group (their CP/TP peers) and load the same samples.
    ``reader``: ``"chunks"`` or ``"stream"`` (see :class:`benchmarks.baseline.MixingPackingDataset`).
    ``workers`` may be a list, one count per rank.
    """

    def __init__(self, sources: Sequence, weights: Mapping[str, float], *, ranks: int, group: int,
                 workers: int | Sequence[int], max_tokens: int, micro_batches: int, seed: int = 0,
                 reader: str = "chunks") -> None:
        super().__init__()
        if ranks % group:
            raise ValueError(f"{ranks} ranks do not split into DP groups of {group}")
        self.ranks, self.group = ranks, group
        self.workers = [workers] * ranks if isinstance(workers, int) else list(workers)
        if len(self.workers) != ranks:
            raise ValueError(f"{len(self.workers)} worker counts for {ranks} ranks")
        self.dp_of = [r // group for r in range(ranks)]
        self.datasets = [MixingPackingDataset(sources, weights, max_tokens=max_tokens,
                                              micro_batches=micro_batches, dp_rank=self.dp_of[r],
                                              dp_size=ranks // group, seed=seed, reader=reader)
                         for r in range(ranks)]

    def __enter__(self) -> "BaselineFleet":
        try:
            self._start_ranks(_rank_main, list(zip(self.datasets, self.workers)))
        except BaseException:
            self.__exit__()
            raise
        return self

    def families(self) -> dict[int, list[int]]:
        """Rank pid -> the DataLoader worker processes of that rank."""
        import psutil

        out: dict[int, list[int]] = {}
        for p in self.rank_pids:
            try:
                out[p] = [c.pid for c in psutil.Process(p).children(recursive=True)]
            except psutil.NoSuchProcess:
                out[p] = []
        return out

    def worker_pids(self) -> list[int]:
        """The DataLoader worker processes of every rank."""
        return [pid for children in self.families().values() for pid in children]

    loader_pids = worker_pids


# -- mdata -----------------------------------------------------------------------------------------

def _cluster_host_main(sources, plan, job: str, loader_workers: int, conn) -> None:
    _quiet_dask()
    from mdata.driver import PoolSpec, start_cluster, submit_job

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


def _mdata_rank_main(address: str, job: str, rank: int, world_size: int, barrier, conn) -> None:
    _quiet_dask()
    trainer_imports()
    from mdata.trainer import Loader

    try:
        loader = Loader(address, job=job, rank=rank, world_size=world_size, timeout=120.0)
        batches = iter(loader)
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    try:
        _serve(batches, barrier, conn)
    finally:
        loader.close()


class MdataFleet(_Fleet):
    """An mdata cluster (host + Dask workers) and ``R`` rank processes, each with its Loader."""

    def __init__(self, sources: Sequence, plan, *, loader_workers: int, job: str = "bench") -> None:
        super().__init__()
        self.sources, self.plan, self.job = list(sources), plan, job
        self.loader_workers = loader_workers
        self.mesh = plan.mesh
        self.dp_of = [self.mesh.coordinate(r).dp for r in range(self.mesh.world_size)]
        self.host_pid = 0
        self.worker_pids: list[int] = []

    def __enter__(self) -> "MdataFleet":
        try:
            host = self._spawn(_cluster_host_main, self.sources, self.plan, self.job,
                               self.loader_workers, rank=False)
            address, self.host_pid, self.worker_pids = self._ready(host, "the mdata cluster host")
            world = self.mesh.world_size
            self._start_ranks(_mdata_rank_main, [(address, self.job, r, world) for r in range(world)])
        except BaseException:
            self.__exit__()
            raise
        return self

    def loader_pids(self) -> list[int]:
        """The cluster host (scheduler, Planner, nannies) and every process it started: the Dask
        workers, and multiprocessing's resource tracker."""
        import psutil

        try:
            children = [c.pid for c in psutil.Process(self.host_pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            children = list(self.worker_pids)
        return [self.host_pid, *children]

    def __exit__(self, *exc) -> None:
        # ranks first (they detach from the cluster) and joined, then the bare trainer and the
        # cluster host: stopping them together left the ranks' clients reconnecting to a closed
        # scheduler for 30 s, and their long polls failing with CommClosedError
        self._stop_all(self._rank_conns, 60)
        for p in self._procs[len(self._other_conns):]:
            p.join(timeout=60)
        super().__exit__(*exc)
