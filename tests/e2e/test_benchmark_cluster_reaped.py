"""A benchmark killed mid-run leaves no Dask process behind.

The control-plane benchmark deploys its cluster with the dask CLI, each process in a session of
its own (so a Ctrl-C aimed at the benchmark reaches the cluster only through its orderly stop).
When the benchmark itself is killed (a harness timeout, kill -9), nothing runs that stop: the
scheduler, the nannies and their worker processes used to stay on, holding ports and cores,
under init. Each CLI process now asks the kernel for SIGTERM when its parent dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]

HOLD = """
import sys, time
from pathlib import Path
from benchmarks.control_cluster import cluster
with cluster(Path(sys.argv[1]), 1) as (scheduler, address):
    print("ready", flush=True)
    time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_benchmark_takes_its_cluster_with_it(example_corpus):
    bench = subprocess.Popen([sys.executable, "-c", HOLD, str(example_corpus)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    family: list[psutil.Process] = []
    try:
        assert bench.stdout.readline().strip() == "ready"
        family = psutil.Process(bench.pid).children(recursive=True)
        assert len(family) >= 4  # the scheduler, and each dask worker CLI with its worker process
        os.kill(bench.pid, signal.SIGKILL)
        bench.wait()
        gone, alive = psutil.wait_procs(family, timeout=60)
        assert not alive, [(p.pid, p.cmdline()[:4]) for p in alive]
    finally:
        if bench.poll() is None:
            bench.kill()
        for proc in family:  # orphans (the failure this test finds) are not ours to wait for
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
