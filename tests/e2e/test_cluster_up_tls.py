"""User story: `mdata cluster up --tls-auto` runs the cluster on TLS with a throwaway CA and prints
how trainers attach; the documented trainer attaches with only what it printed, and a peer
without the certificates is refused."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mdata.cost import AttentionCost
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cluster_up_tls_auto_serves_a_trainer_that_uses_only_what_it_printed(tmp_path):
    from distributed import Client

    from mdata.sources import Source, TokenizeText

    data = tmp_path / "notes"
    data.mkdir()
    (data / "part-0.jsonl").write_text("".join(json.dumps({"body": f"note {i} " + "w " * (i % 5 + 1)}) + "\n"
                                               for i in range(40)))
    plan = (Plan([Source("notes", str(data), format="jsonl", chunk_rows=16, transform=TokenizeText(field="body"))])
            .mix({"notes": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=512, global_batch=4)
            .distribute(ClientPlaceTree(dp=1)).seed(3))
    path = plan.to_file(tmp_path / "notes.yaml")
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("mdata")), "cluster", "up", "--plan", str(path), "--job", "notes",
         "--tls-auto", "--port", "0", "--dashboard-address", ":0"],
        stdout=subprocess.PIPE, stderr=log, text=True, cwd=tmp_path)
    try:
        printed = []
        for line in proc.stdout:
            printed.append(line.rstrip("\n"))
            if line.startswith("press Ctrl-C"):
                break
        lines = dict(line.partition(": ")[::2] for line in printed if ": " in line)
        address = lines["scheduler"]
        assert address.startswith("tls://127.0.0.1:"), printed
        assert lines["tls"].startswith(str(tmp_path / ".mdata-tls"))
        env = dict(line[len("export "):].partition("=")[::2] for line in printed if line.startswith("export "))
        assert set(env) >= {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE", "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT",
                            "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY"}

        # the documented trainer, under torchrun, with the printed environment and nothing else
        examples = Path(__file__).resolve().parents[2] / "docs" / "examples"
        run_env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_DISTRIBUTED__COMM")}
        run_env.update(env, PYTHONPATH=os.pathsep.join([str(examples), str(examples.parents[1])]))
        train = subprocess.run(
            [str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", "1",
             "--master-port", str(_free_port()), str(examples / "train.py"),
             "--scheduler", address, "--job", "notes", "--steps", "3"],
            capture_output=True, text=True, timeout=180, env=run_env)
        assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
        for step in range(3):
            assert f"rank 0 step {step}:" in train.stdout
        assert "rank 0 resumes at step 3" in train.stdout

        # every process of the cluster speaks TLS: workers and their nannies
        from distributed.security import Security

        sec = Security(tls_ca_file=env["DASK_DISTRIBUTED__COMM__TLS__CA_FILE"],
                       tls_client_cert=env["DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT"],
                       tls_client_key=env["DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY"], require_encryption=True)
        with Client(address, security=sec, set_as_default=False, timeout=30) as client:
            workers = client.scheduler_info(n_workers=-1)["workers"]
        assert len(workers) >= 2
        assert all(a.startswith("tls://") and w["nanny"].startswith("tls://") for a, w in workers.items())

        # a plain-TCP client, and a TLS client without the CA's certificates, are refused
        host_port = address[len("tls://"):]
        with pytest.raises((OSError, TimeoutError)):
            Client(f"tcp://{host_port}", set_as_default=False, timeout=5)
        with pytest.raises((OSError, TimeoutError)):
            Client(address, security=Security.temporary(), set_as_default=False, timeout=5)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        log.seek(0)
        assert "Traceback" not in log.read()
