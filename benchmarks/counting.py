"""What a loader adds to a training job, counted the same way for every system: memory and CPU.

A fleet (:mod:`benchmarks.fleet`) has three kinds of processes:

* **rank processes**: one per trainer rank, as under torchrun, each with the imports a trainer
  has (torch, numpy) *and* its loader (baseline: the DataLoader iterator, its prefetched batches,
  pin/unpickle work; mdata: a Dask client and a :class:`mdata.trainer.Loader` with its threads and
  buffers);
* **loader processes**: everything the system runs besides the ranks (baseline: the DataLoader
  workers; mdata: the cluster host with the scheduler and Planner, and every Dask worker);
* one **bare trainer**: a process with the same trainer imports and no loader at all, started
  beside them.

What a system adds is then ``loader processes + sum over ranks of (rank - bare)``, by PSS (and,
for projections, the same sum by USS, the pages no other process maps): the bare
trainer's PSS is subtracted from every rank, sampled at the same moment (shared library pages are
split among all processes that map them, so bare and rank carry the same share of them). CPU is
counted alike: loader processes plus rank processes, less the bare trainer's CPU per rank.

:class:`PeakPss` samples that sum every ``interval`` seconds through a run and keeps its maximum,
so a transient (a row group decoded, a burst of prefetch) counts, not only a calm moment.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

__all__ = ["PeakPss", "added_cpu_seconds", "cpu_seconds", "library_pss_mb", "pss_mb"]

MB = 1 << 20


def _pss_uss(pid: int) -> tuple[int, int]:
    import psutil

    try:
        info = psutil.Process(pid).memory_full_info()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return 0, 0  # gone between listing and reading: it holds nothing any more
    return info.pss, info.uss


def _pss(pid: int) -> int:
    return _pss_uss(pid)[0]


def pss_mb(pids: Sequence[int]) -> float:
    """Sum of proportional set sizes (Linux ``memory_full_info().pss``) of ``pids``, in MiB."""
    return sum(_pss(p) for p in pids) / MB


def _library_pss(pid: int) -> int:
    """PSS in bytes of ``pid``'s mappings of shared libraries and executables (``.so`` files,
    the interpreter): pages every process of a fleet shares, whatever its role."""
    total = 0
    library = False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    path = line.split()[-1] if len(line.split()) >= 6 else ""
                    library = ".so" in path or path.endswith("python") or "/bin/python" in path
                elif library and line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


def library_pss_mb(pids: Sequence[int]) -> float:
    """Sum of the PSS of shared-library mappings of ``pids``, in MiB (see :func:`_library_pss`)."""
    return sum(_library_pss(p) for p in pids) / MB


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds consumed so far by ``pids`` (children not included)."""
    import psutil

    total = 0.0
    for p in pids:
        try:
            t = psutil.Process(p).cpu_times()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        total += t.user + t.system
    return total


def added_cpu_seconds(fleet) -> float:
    """CPU seconds so far of what ``fleet`` adds: its loader and rank processes, less one bare
    trainer's CPU per rank (take differences of two calls for a window)."""
    ranks = list(fleet.rank_pids)
    return (cpu_seconds([*fleet.loader_pids(), *ranks])
            - len(ranks) * cpu_seconds([fleet.bare_pid]))


class PeakPss:
    """Samples what a fleet adds (see the module docstring) every ``interval`` s; keeps the peak.

    ``loader_pids`` is called at every sample (DataLoader workers come and go with iterators).
    Use as a context manager around the run; :attr:`peak_mb` and :attr:`at_peak` after it.
    """

    def __init__(self, loader_pids: Callable[[], Sequence[int]], rank_pids: Sequence[int],
                 bare_pid: int, *, interval: float = 0.15) -> None:
        self.loader_pids = loader_pids
        self.rank_pids = list(rank_pids)
        self.bare_pid = bare_pid
        self.interval = float(interval)
        self.peak_mb = 0.0
        self.at_peak: dict[str, float] = {}
        self.samples = 0
        self.last: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> dict[str, float]:
        """One sample, in MiB: ``total_mb`` (loader processes + ranks over bare, by PSS), the same
        by USS (``unique_mb``: pages no other process maps) and the rest (``shared_mb``)."""
        loaders = list(self.loader_pids())
        bare_pss, bare_uss = (x / MB for x in _pss_uss(self.bare_pid))
        pss = uss = ranks = 0.0
        for pid in loaders:
            p, u = _pss_uss(pid)
            pss, uss = pss + p / MB, uss + u / MB
        loader = pss
        for pid in self.rank_pids:
            p, u = _pss_uss(pid)
            pss, uss = pss + p / MB - bare_pss, uss + u / MB - bare_uss
            ranks += p / MB - bare_pss
        out = {"total_mb": pss, "unique_mb": uss, "shared_mb": pss - uss,
               "loader_processes_mb": loader, "ranks_over_bare_mb": ranks,
               "bare_trainer_mb": bare_pss, "loader_processes": len(loaders),
               "ranks": len(self.rank_pids)}
        self.samples += 1
        self.last = out
        if out["total_mb"] > self.peak_mb:
            self.peak_mb, self.at_peak = out["total_mb"], out
        return out

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.sample()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def __enter__(self) -> "PeakPss":
        self._thread = threading.Thread(target=self._loop, name="pss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()  # the state after the last delivered step counts too
        bare = library_pss_mb([self.bare_pid])
        #: library pages in the counted sum (loader processes + ranks over bare), read at the end
        self.library_mb = (library_pss_mb(list(self.loader_pids()))
                           + sum(library_pss_mb([p]) - bare for p in self.rank_pids))
