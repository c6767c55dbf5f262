"""User story: beyond one machine with plain Dask — `dask scheduler --preload`, `dask worker
--resources pool_<source>=N`, trainers attaching by address — in the clear and over TLS with
certificates made here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.control_cluster import stop_processes, wait_for_line
from mdata.driver import submit_job
from mdata.driver.tls import make_certificates
from mdata.trainer import Loader
from mdata.cost import AttentionCost
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

DASK = str(Path(sys.executable).with_name("dask"))


@pytest.mark.parametrize("protocol", [pytest.param("tcp", marks=pytest.mark.slow), "tls"])  # tls runs the same lines
def test_dask_cli_cluster_serves_trainers(protocol, example_corpus, tmp_path):
    from distributed import Client
    from distributed.security import Security

    from mdata.data.example import example_sources

    sources = [s for s in example_sources(example_corpus) if s.name in ("chat", "code")]
    tls_args: list[str] = []
    security = None
    if protocol == "tls":
        certs = make_certificates(tmp_path, ["127.0.0.1"], client=False)  # the product's CA maker
        tls_args = ["--tls-ca-file", certs.ca_file, "--tls-cert", certs.cert, "--tls-key", certs.key]
        security = Security(tls_ca_file=certs.ca_file, tls_client_cert=certs.cert,
                            tls_client_key=certs.key, require_encryption=True)
    env = {**os.environ, "DASK_LOGGING__DISTRIBUTED": "info"}
    procs: list[subprocess.Popen] = []
    try:
        scheduler = subprocess.Popen(
            [DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--protocol", protocol,
             "--dashboard-address", "127.0.0.1:0", "--preload", "scheduler_plugins.planner", *tls_args],
            stderr=subprocess.PIPE, text=True, env=env)
        procs.append(scheduler)
        address = wait_for_line(scheduler, r"Scheduler at:\s+(\S+)")
        assert address.startswith(f"{protocol}://127.0.0.1:")
        worker_args = [
            ["--resources", "pool_chat=1 pool_code=1", "--name", "loader-text"],
            ["--resources", "mdata_constructor=1", "--name", "constructor"],
        ]
        for extra in worker_args:
            procs.append(subprocess.Popen(
                [DASK, "worker", address, "--nthreads", "1", "--host", "127.0.0.1",
                 "--no-dashboard", *extra, *tls_args],
                stderr=subprocess.DEVNULL, env=env))
        with Client(address, security=security, set_as_default=False, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
            plan = (Plan(sources).mix({"chat": 1.0, "code": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
                    .balance(micro_batches=1, max_tokens=2048, global_batch=8)
                    .distribute(ClientPlaceTree(dp=1)).seed(5))
            info = submit_job(client, plan, job="cli")
            assert info["mesh"]["dp"] == 1
        # a trainer attaches by address alone, as on another machine
        with Loader(address, job="cli", rank=0, world_size=1, steps=3, timeout=60,
                    security=security) as loader:
            batches = list(loader)
        assert [b["step"] for b in batches] == [0, 1, 2]
        assert all(len(b["sample_ids"]) == 8 for b in batches)
        names = {int(s) for b in batches for s in b["sample_ids"][:, 0].tolist()}
        assert names == {0, 1}  # both sources, through the one text pool
    finally:
        stop_processes(list(reversed(procs)))  # workers first, the scheduler last
