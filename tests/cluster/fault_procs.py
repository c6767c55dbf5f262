"""Chaos harness, processes: the cluster in a process group of its own, and workers found by role.

* :class:`ClusterProcess` runs ``mdata.driver.start_cluster`` in its own process group
  (:mod:`fault_cluster`), so the whole cluster, scheduler and Planner included, can be lost at once
  (:meth:`ClusterProcess.kill`) while the test process lives on.
* :func:`loader_holding_chunks` and :func:`constructor_worker` find the worker (address and pid)
  to kill by its role; :func:`kill9` kills it. The worker's nanny (in the cluster process) starts
  a fresh, empty worker in its place, as a restarted pod would.

Every wait is bounded and raises :class:`HarnessError`, never hangs.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import mdata

HERE = Path(__file__).resolve().parent
ROOT = Path(mdata.__file__).resolve().parents[1]  # the checkout whose mdata this test imports
CONSTRUCTOR_RESOURCE = "mdata_constructor"

__all__ = ["HarnessError", "ClusterProcess", "subprocess_env", "free_port", "kill9", "close_job", "recoveries",
           "worker_pids", "workers_with", "wait_for_workers", "loader_holding_chunks",
           "constructor_worker"]

class HarnessError(AssertionError):
    """A bounded wait ran out or a process the harness started died unexpectedly."""


def subprocess_env() -> dict[str, str]:
    """The environment of every process the harness starts: this checkout's mdata, workers and
    scheduler_plugins first on ``PYTHONPATH``, then this folder (for the process bodies)."""
    paths = [str(ROOT), str(HERE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), "PYTHONUNBUFFERED": "1"}


def kill_group(proc: "subprocess.Popen | None") -> None:
    """SIGKILL a process started in its own session, with everything it started; returns None
    (what the caller's handle becomes)."""
    if proc is None:
        return None
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill9(pid: int) -> None:
    """SIGKILL one process: a crash, with no chance to clean up or say goodbye."""
    os.kill(pid, signal.SIGKILL)


def tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except FileNotFoundError:
        return ""


# -- the cluster -------------------------------------------------------------------------------------
class ClusterProcess:
    """An embedded mdata cluster in a process group of its own; ``with`` closes it."""

    def __init__(self, workdir: Path, sources: Sequence, pools: Sequence, *, constructors: int = 1) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.spec = {"sources": list(sources), "pools": list(pools), "constructors": constructors}
        self.proc: subprocess.Popen | None = None
        self.address: str | None = None
        self._client = None
        self._starts = 0

    def start(self, timeout: float = 120.0) -> "ClusterProcess":
        self._starts += 1
        spec = self.workdir / "cluster-spec.pkl"
        spec.write_bytes(pickle.dumps(self.spec))
        address_file = self.workdir / f"address-{self._starts}"
        address_file.unlink(missing_ok=True)  # a workdir used before must not give a stale address
        self.log = self.workdir / f"cluster-{self._starts}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "fault_cluster.py"), str(spec), str(address_file)],
                stdout=log, stderr=subprocess.STDOUT, env=subprocess_env(), start_new_session=True)
        deadline = time.monotonic() + timeout
        while not address_file.exists():
            if self.proc.poll() is not None:
                raise HarnessError(f"the cluster process exited ({self.proc.returncode}):\n{tail(self.log)}")
            if time.monotonic() > deadline:
                self.kill()
                raise HarnessError(f"the cluster did not start within {timeout:.0f}s:\n{tail(self.log)}")
            time.sleep(0.1)
        self.address = address_file.read_text().strip()
        return self

    def client(self):
        """A Dask client of this cluster, for finding workers and asking the Planner."""
        if self._client is None:
            from distributed import Client

            self._client = Client(self.address, set_as_default=False, timeout=30)
        return self._client

    def _drop_client(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            try:
                client.close(timeout=5)
            except Exception:  # noqa: BLE001 - the scheduler may already be gone
                pass

    def kill(self) -> None:
        """Lose the whole cluster at once: SIGKILL to scheduler, nannies and workers."""
        self._drop_client()  # first, or it would try to reconnect to the dead scheduler
        self.proc = kill_group(self.proc)

    def close(self) -> None:
        """Shut down gracefully (SIGTERM), and SIGKILL whatever is left after 30 s."""
        self._drop_client()
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers of the group, if any
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        self.proc = None

    def __enter__(self) -> "ClusterProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.close()


def close_job(client, job: str, plan=None) -> None:
    """Close ``job`` as its driver: with ``plan``, this client registers it first (idempotent),
    for a job its trainers registered (only a driver or a Loader may close a job)."""
    if plan is not None:
        from mdata.driver import submit_job

        submit_job(client, plan, job=job)
    client.sync(client.scheduler.mdata_close_job, job=job, client=client.id)


def recoveries(client, job: str) -> dict[str, int]:
    """The job's ``recoveries`` in its status: what its faults cost (chunks reloaded, batches
    rebuilt, storage outages); a fault test asserts its recovery happened from these."""
    return client.sync(client.scheduler.mdata_status, job=job)["recoveries"]


# -- finding workers by role -------------------------------------------------------------------------
def worker_pids(client, workers: Sequence[str] | None = None) -> dict[str, int]:
    """Address -> pid of each worker process (of ``workers``, or all of them)."""
    return client.run(os.getpid, workers=list(workers) if workers is not None else None)


def workers_with(client, resource: str) -> list[str]:
    return sorted(addr for addr, w in client.scheduler_info(n_workers=-1)["workers"].items()
                  if resource in w.get("resources", {}))


def wait_for_workers(client, resource: str, count: int, *, timeout: float = 60.0,
                     exclude: Sequence[str] = ()) -> list[str]:
    """Wait until ``count`` workers with ``resource`` (none of ``exclude``) are connected."""
    deadline = time.monotonic() + timeout
    while True:
        found = [a for a in workers_with(client, resource) if a not in exclude]
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            raise HarnessError(f"only {found} of {count} workers with {resource} after {timeout:.0f}s")
        time.sleep(0.2)


def loader_holding_chunks(client, resource: str, *, job: str | None = None,
                          timeout: float = 30.0) -> tuple[str, int, int]:
    """The loader (with ``resource``) holding the most ``mdata-load`` chunks of ``job`` now.

    The Planner releases a chunk once every step that takes rows from it is built, so the chunks a
    loader holds are the ones upcoming steps still need: killing this worker loses exactly those.
    Returns ``(address, pid, number of chunks held)``.
    """
    deadline = time.monotonic() + timeout
    loaders = set(workers_with(client, resource))
    while True:
        held = {addr: [k for k in keys if _is_chunk(k, job)]
                for addr, keys in client.has_what().items() if addr in loaders}
        best = max(held, key=lambda a: len(held[a]), default=None)
        if best is not None and held[best]:
            return best, worker_pids(client, [best])[best], len(held[best])
        if time.monotonic() > deadline:
            raise HarnessError(f"no loader with {resource} held a chunk of job {job!r} within {timeout:.0f}s")
        time.sleep(0.05)


def _is_chunk(key, job: str | None) -> bool:
    return (isinstance(key, tuple) and len(key) > 1 and key[0] == "mdata-load"
            and (job is None or key[1] == job))


def constructor_worker(client) -> tuple[str, int]:
    """``(address, pid)`` of the constructor worker (the one with ``mdata_constructor``)."""
    found = workers_with(client, CONSTRUCTOR_RESOURCE)
    if len(found) != 1:
        raise HarnessError(f"expected one constructor worker, found {found}")
    return found[0], worker_pids(client, found)[found[0]]
