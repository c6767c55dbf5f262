"""The TCP addresses real processes listen on, read from the kernel (psutil reads /proc/net/tcp
and each process's open sockets), for tests that check what a cluster exposes."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import psutil

__all__ = ["listening", "process_tree", "not_loopback"]


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (an mdata cluster's workers are children of its nannies'
    process)."""
    root = psutil.Process(pid)
    return [root.pid, *(child.pid for child in root.children(recursive=True))]


def listening(pids: Iterable[int]) -> dict[int, list[tuple[str, int]]]:
    """pid -> the (ip, port) of every TCP socket that process listens on (IPv4 and IPv6)."""
    out: dict[int, list[tuple[str, int]]] = {}
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.NoSuchProcess:
            continue
        out[pid] = sorted({(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN})
    return out


def not_loopback(sockets: dict[int, list[tuple[str, int]]]) -> dict[int, list[tuple[str, int]]]:
    """The listening sockets of ``sockets`` bound beyond loopback (0.0.0.0, ::, a real address)."""
    def loopback(ip: str) -> bool:
        return ipaddress.ip_address(ip.split("%")[0]).is_loopback

    bad = {pid: [a for a in addrs if not loopback(a[0])] for pid, addrs in sockets.items()}
    return {pid: addrs for pid, addrs in bad.items() if addrs}
