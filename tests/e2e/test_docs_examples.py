"""User story: the getting-started flow as docs/getting-started.md tells it — serve.py starts a
cluster and submits a job over the user's own sources, torchrun starts two trainer ranks."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_and_torchrun_trainers_as_documented(tmp_path):
    bin_dir = Path(sys.executable).parent
    port = _free_port()
    # the examples, then this checkout's mdata (not whichever mdata the environment installed)
    paths = [str(EXAMPLES), str(EXAMPLES.parents[1])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "DASK_LOGGING__DISTRIBUTED": "warning"}
    serve = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "serve.py"), "--data", str(tmp_path / "quickstart"),
         "--port", str(port), "--dp", "2", "--steps", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        address = None
        for line in serve.stdout:
            match = re.search(r"scheduler (tcp://\S+)", line)
            if match:
                address = match.group(1)
                break
        assert address == f"tcp://127.0.0.1:{port}", "serve.py did not print the scheduler address"
        train = subprocess.run(
            [str(bin_dir / "torchrun"), "--nproc-per-node", "2", "--master-port", str(_free_port()),
             str(EXAMPLES / "train.py"), "--scheduler", address, "--steps", "3"],
            capture_output=True, text=True, timeout=180, env=env)
        assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
        for rank in (0, 1):
            assert f"rank {rank} step 2:" in train.stdout
            assert f"rank {rank} resumes at step 3" in train.stdout
        rest, _ = serve.communicate(timeout=120)
        assert serve.returncode == 0, rest[-3000:]
    finally:
        if serve.poll() is None:
            serve.kill()
