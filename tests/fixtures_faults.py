"""Storage faults for the tests: a real refused connection, and a local filesystem that suffers them.

:func:`refused` makes a genuine ``ConnectionRefusedError`` by connecting to a port nobody listens
on. :class:`FlakyFileSystem` is fsspec's local filesystem under the protocol ``flaky://``; an
:class:`Outage` passed in its storage options makes its listings, opens and reads fail the way a
network filesystem fails when its server goes away (they try the connection and are refused), for
the next N calls of a kind or until the outage ends.
"""

from __future__ import annotations

import socket
import threading
from collections import Counter
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

__all__ = ["FlakyFileSystem", "Outage", "closed_port", "refused"]

KINDS = ("list", "open", "read")


def closed_port() -> int:
    """A port on 127.0.0.1 that nobody listens on (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refused(port: int | None = None) -> ConnectionRefusedError:
    """The ConnectionRefusedError of a real connection attempt to a closed port."""
    try:
        socket.create_connection(("127.0.0.1", port or closed_port()), timeout=1.0).close()
    except ConnectionRefusedError as exc:
        return exc
    raise AssertionError("something listens on the port that should be closed")


class Outage:
    """What fails and how often; thread-safe; counts the failures it caused per kind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: Counter[str] = Counter()
        self._errors: dict[str, type[BaseException] | None] = {}
        self._down = False
        self._port = closed_port()
        self.caused: Counter[str] = Counter()

    def fail_next(self, kind: str, n: int, error: type[BaseException] | None = None) -> None:
        """The next ``n`` calls of ``kind`` fail: refused, or with ``error`` (e.g. PermissionError)."""
        assert kind in KINDS
        with self._lock:
            self._next[kind] = n
            self._errors[kind] = error

    def down(self) -> None:
        """Every call fails (refused) until :meth:`up`."""
        with self._lock:
            self._down = True

    def up(self) -> None:
        with self._lock:
            self._down = False

    def check(self, kind: str, path: str) -> None:
        with self._lock:
            error = None
            if self._next[kind] > 0:
                self._next[kind] -= 1
                error = self._errors.get(kind)
            elif not self._down:
                return
            self.caused[kind] += 1
        if error is not None:
            raise error(f"injected {error.__name__} on {kind} of {path}")
        raise refused(self._port)


class _FlakyFile:
    """A local file whose reads go through the outage first."""

    def __init__(self, f: Any, outage: Outage, path: str) -> None:
        self._f, self._outage, self._path = f, outage, path

    def read(self, n: int = -1) -> bytes:
        self._outage.check("read", self._path)
        return self._f.read(n)

    def readinto(self, buf: Any) -> int:
        self._outage.check("read", self._path)
        return self._f.readinto(buf)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> "_FlakyFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._f.close()


class FlakyFileSystem(LocalFileSystem):
    """``flaky:///abs/path``: the local filesystem, failing whenever its :class:`Outage` says."""

    protocol = ("flaky",)
    cachable = False

    def __init__(self, outage: Outage | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.outage = outage or Outage()

    def ls(self, path, detail=False, **kwargs):
        self.outage.check("list", path)
        return super().ls(path, detail=detail, **kwargs)

    def info(self, path, **kwargs):
        self.outage.check("list", str(path))
        return super().info(path, **kwargs)

    def isdir(self, path):
        self.outage.check("list", path)
        return super().isdir(path)

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        self.outage.check("open", path)
        f = super()._open(path, mode, block_size=block_size, **kwargs)
        return _FlakyFile(f, self.outage, path) if "r" in mode else f


fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)
