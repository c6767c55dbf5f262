"""Hosts made of Linux network namespaces for tests/e2e/test_many_hosts.py.

One bridge that the test creates; per host a namespace, a veth pair (host end on the bridge, the
other end ``eth0`` in the namespace, with an address of a private /24 on that bridge only) and lo
up. Every process of a host runs in its namespace with a private /tmp (the host's own folder bound
over /tmp in a mount namespace of its own) and HOME=/tmp, so no process can read another host's
files. :meth:`Network.close` kills every process group it started, then whatever else is left in
the namespaces, and deletes the namespaces, veths and the bridge, even after a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

SUBNET = "10.213.7"


def netns_unusable_reason() -> str | None:
    """Why namespaced hosts cannot be made here; None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs this test as root)"
    for what, path in (("the checkout", Path(__file__).resolve().parents[2]),
                       ("the Python environment", Path(sys.prefix))):
        if path == Path("/tmp") or Path("/tmp") in path.parents:
            return (f"{what} lies under /tmp ({path}), which every namespaced host replaces with a "
                    f"private one, so its processes could not start: run the test from a checkout "
                    f"and environment outside /tmp")
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "`ip` (iproute2) or `unshare` (util-linux) is not installed"
    probe = f"mdprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()[:300]}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


class Host:
    """One namespace with its address, its private /tmp folder and the processes started in it."""

    def __init__(self, network: "Network", name: str, index: int) -> None:
        self.network = network
        self.name = name
        self.ns = f"{network.tag}-{name}"
        self.veth = f"{network.tag}v{index}"  # the end on the bridge (15 characters at most)
        self.ip = f"{SUBNET}.{index}"
        self.tmp = network.root / name
        self.tmp.mkdir(parents=True)
        self.procs: list[subprocess.Popen] = []

    def path(self, inside: str) -> Path:
        """Where the test sees the host's file ``/tmp/...``."""
        return self.tmp / Path(inside).relative_to("/tmp")

    def spawn(self, argv: list[str], *, log: str, env: dict | None = None,
              cwd: str | None = None) -> subprocess.Popen:
        """Start ``argv`` on this host (own process group), output to ``/tmp/<log>`` there."""
        wrapped = ["ip", "netns", "exec", self.ns, "unshare", "--mount", "--propagation", "private",
                   "sh", "-c", 'mount --bind "$0" /tmp && exec "$@"', str(self.tmp), *argv]
        full_env = {**os.environ, **(env or {}), "HOME": "/tmp", "TMPDIR": "/tmp"}
        with open(self.path(f"/tmp/{log}"), "wb") as out:  # a fresh log per start
            proc = subprocess.Popen(wrapped, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                    cwd=cwd, start_new_session=True)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.path(f"/tmp/{name}")
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for_log(self, name: str, pattern: str, *, timeout: float, count: int = 1) -> str:
        """Wait (at most ``timeout`` s) until ``/tmp/<name>`` holds ``count`` lines matching."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.findall(pattern, self.log(name))
            if len(found) >= count:
                return found[-1]
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {count} x {pattern!r} in {name} within "
                                     f"{timeout:.0f}s:\n{self.log(name)[-3000:]}")
            time.sleep(0.2)

    def cut(self, seconds: float) -> None:
        """Take the host's link down for ``seconds``, then up again."""
        _ip("link", "set", self.veth, "down")
        try:
            time.sleep(seconds)
        finally:
            _ip("link", "set", self.veth, "up")

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs.clear()


class Network:
    """A bridge and the hosts on it; use as a context manager (or call :meth:`close`)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.tag = f"md{os.getpid() % 100000}"
        self.bridge = f"{self.tag}br"
        self.hosts: list[Host] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")

    def add(self, name: str) -> Host:
        host = Host(self, name, len(self.hosts) + 10)
        self.hosts.append(host)
        _ip("netns", "add", host.ns)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", f"{host.veth}p")
        _ip("link", "set", host.veth, "master", self.bridge)
        _ip("link", "set", host.veth, "up")
        _ip("link", "set", f"{host.veth}p", "netns", host.ns)
        for args in (("link", "set", f"{host.veth}p", "name", "eth0"),
                     ("addr", "add", f"{host.ip}/24", "dev", "eth0"),
                     ("link", "set", "eth0", "up"), ("link", "set", "lo", "up")):
            _ip("-n", host.ns, *args)
        return host

    def close(self) -> None:
        for host in self.hosts:
            host.kill()
        for host in self.hosts:  # anything a process left behind in the namespace
            pids = _ip("netns", "pids", host.ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", host.ns, check=False)
            _ip("link", "del", host.veth, check=False)
        _ip("link", "del", self.bridge, check=False)
        self.hosts.clear()

    def __enter__(self) -> "Network":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
