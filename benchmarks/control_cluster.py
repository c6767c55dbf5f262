"""The cluster the control-plane benchmark measures: the scheduler alone in its process.

At scale the scheduler runs on a host of its own (``dask scheduler --preload
scheduler_plugins.planner``, docs/deploying.md) and every worker, with its nanny, elsewhere. The
benchmark deploys it the same way, with the dask CLI on this machine: one process for the scheduler
and the Planner, and a ``dask worker`` process (each with its nanny in a parent process) per loader
pool worker and per constructor. The scheduler process' CPU, read from /proc, is then the
scheduler's and the Planner's alone.

An embedded cluster (``mdata cluster up``) would keep every worker's nanny in the scheduler's
process: their memory monitors (psutil, ten times a second each) and system monitors run on
wall-clock timers, so they add CPU in proportion to how long a step lasts. On a machine where a
thousand trainer threads share two cores, steps last longer as ranks grow, and that time-driven
CPU read as a cost per rank that the scheduler does not have.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["cluster", "start_cluster", "wait_for_line"]

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 120.0


def _die_with_parent() -> None:
    """In a child before it runs the dask CLI: SIGTERM it when the benchmark's process dies, so a
    benchmark killed mid-run (by a timeout, kill -9) leaves no scheduler or nanny behind; their
    own SIGTERM handling closes the nannies' worker processes. Linux only (elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "DASK_LOGGING__DISTRIBUTED": "error",
            "DASK_DISTRIBUTED__ADMIN__TICK__LIMIT": "1h"}


def wait_for_line(proc: subprocess.Popen, pattern: str, timeout: float = START_TIMEOUT_S,
                  log: Path | None = None) -> str:
    """The first group of the first line of ``proc``'s stderr that matches ``pattern`` (how the
    dask CLI tells its address); every line read is copied to ``log`` when given. A process that
    ends or stays silent past ``timeout`` is a RuntimeError quoting what it printed."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    with (log.open("w") if log is not None else open(os.devnull, "w")) as out:
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                if proc.poll() is not None:
                    break
                continue
            out.write(line)
            seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found.group(1)
    raise RuntimeError(f"no line matching {pattern!r}; output:\n{''.join(seen)[-3000:]}")


def _drain(proc: subprocess.Popen, log: Path) -> None:
    """Keep reading the scheduler's stderr into ``log`` so a full pipe never blocks it."""
    def run() -> None:
        with log.open("a") as out:
            for line in proc.stderr:
                out.write(line)
    threading.Thread(target=run, daemon=True).start()


def _worker_lines(corpus: Path, constructors: int) -> list[list[str]]:
    """``dask worker`` arguments: the corpus' default loader pools (as ``mdata cluster up``
    lays them out) and ``constructors`` constructors."""
    from mdata.data.example import example_sources
    from mdata.driver.cluster import default_pools

    lines = []
    for pool in default_pools(example_sources(corpus)):
        resources = " ".join(f"{k}={v}" for k, v in pool.resources.items())
        for i in range(max(1, pool.workers)):
            lines.append(["--nthreads", str(pool.threads), "--resources", resources,
                          "--name", f"{pool.name}-{i}"])
    for i in range(constructors):
        lines.append(["--nthreads", "1", "--resources", "mdata_constructor=1",
                      "--name", f"constructor-{i}"])
    return lines


def start_cluster(corpus: Path, constructors: int, log: Path) -> tuple[subprocess.Popen, str, list]:
    """The scheduler (with the Planner) and the workers, each in processes of their own. Returns
    the scheduler's process, its address and every worker process."""
    from distributed import Client

    env = _env()
    # the scheduler's address is an info line; its log goes to a file, not the benchmark's output
    scheduler = subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", "127.0.0.1:0", "--preload", "scheduler_plugins.planner"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=True,
        preexec_fn=_die_with_parent, env={**env, "DASK_LOGGING__DISTRIBUTED": "info"})
    workers: list[subprocess.Popen] = []
    try:
        address = wait_for_line(scheduler, r"Scheduler at:\s+(\S+)", log=log)
        _drain(scheduler, log)
        workers += [subprocess.Popen(
            [str(BIN / "dask"), "worker", address, "--host", "127.0.0.1", "--no-dashboard",
             "--memory-limit", "4GiB", "--death-timeout", "60", *line],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
            preexec_fn=_die_with_parent)
            for line in _worker_lines(corpus, constructors)]
        with Client(address, set_as_default=False, timeout=60) as client:
            client.wait_for_workers(len(workers), timeout=START_TIMEOUT_S)
    except BaseException:
        stop_processes([*workers, scheduler])
        raise
    return scheduler, address, workers


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """Terminate ``procs`` in order, then wait for each (killed if it has not ended in 30 s)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def cluster(corpus: Path, constructors: int) -> Iterator[tuple[subprocess.Popen, str]]:
    """:func:`start_cluster` for the length of a ``with``, yielding the scheduler's process and
    address: a failure inside quotes the end of the scheduler's log, and every process is stopped
    however the block ends (workers first, so none reconnects to a scheduler going away)."""
    folder = Path(tempfile.mkdtemp(prefix="mdata-control-"))
    log = folder / "scheduler.log"
    try:
        scheduler, address, workers = start_cluster(corpus, constructors, log)
        try:
            yield scheduler, address
        except Exception as exc:
            raise RuntimeError(f"{exc}; the scheduler's log ends: {log.read_text()[-1500:]}") from exc
        finally:
            stop_processes(workers)
            stop_processes([scheduler])
    finally:  # the log's end is quoted in the error above; a run leaves nothing in /tmp
        shutil.rmtree(folder, ignore_errors=True)
