"""Finding this host's agent for a scheduler, or starting it: a lock file and an address file.

The ranks of one host (torchrun's local ranks) share one agent per scheduler address, user and
PID namespace (:mod:`mdata.trainer.host_agent`; the agent sees whether its ranks still run by
their pids, which mean something only in its own namespace, so containers that share ``/tmp``
get one agent each). They find it through two files in a private directory
(``$XDG_RUNTIME_DIR/mdata-agents``, else ``/tmp/mdata-agents-<uid>``, mode 0700, refused when it
belongs to someone else or others may enter it), both named by a hash of the three:

- ``<key>.lock``: an exclusive ``flock`` held while a rank looks for the agent, starts one when
  none answers, and says hello to it; the agent holds it too while it decides to exit, so a rank
  never connects to an agent that is on its way out, and only one agent starts per key. An agent
  that leaves removes it (the next rank makes it again), so idle hosts keep no files behind.
- ``<key>.json`` (mode 0600): the agent's address (``tcp://127.0.0.1:port``), its pid and a random
  token every request must carry, so another user of the host who finds the port cannot use it.

Everything here is plain files and processes (no Dask), so the discovery rules are unit-tested
on their own.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import hashlib
import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from mdata.errors import TrainerError

__all__ = ["AgentLost", "AgentAddress", "agent_dir", "agent_key", "agent_paths", "held_lock",
           "pid_namespace", "read_address", "write_address", "remove_address", "remove_lock", "pid_alive",
           "write_spec"]


class AgentLost(Exception):
    """The host agent stopped answering (its process is gone): the rank carries on without it."""


@dataclass(frozen=True)
class AgentAddress:
    """Where a host agent listens, for whom, and the token its requests need."""

    address: str
    token: str
    pid: int
    scheduler: str


def agent_dir(base: str | None = None) -> Path:
    """The private directory of this user's agents (made 0700 when missing); a directory that
    another user owns or that others may enter is refused: its files could be someone else's."""
    root = base or os.environ.get("XDG_RUNTIME_DIR") or ""
    path = Path(root) / "mdata-agents" if root and os.path.isdir(root) else \
        Path("/tmp") / f"mdata-agents-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise TrainerError(f"cannot make the host agent's directory {path}: {exc}") from exc
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise TrainerError(
            f"the host agent's directory {path} is not a private directory of this user (owner "
            f"uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}); remove it or set "
            "XDG_RUNTIME_DIR, or turn mdata.trainer.host-agent off")
    return path


def pid_namespace() -> str:
    """This process' PID namespace (``"pid:[4026531836]"``); empty where the system has none."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def agent_key(scheduler: str, user: str | None = None, pidns: str | None = None) -> str:
    """The name of the agent files of ``scheduler`` for ``user`` (default: this user) in PID
    namespace ``pidns`` (default: this process'). An agent watches its ranks' pids, so ranks in
    another namespace (containers sharing ``/tmp``) get an agent of their own, never this one."""
    who = user if user is not None else getpass.getuser()
    space = pid_namespace() if pidns is None else pidns
    return hashlib.sha256(f"{who}\0{scheduler}\0{space}".encode()).hexdigest()[:24]


def agent_paths(scheduler: str, base: str | None = None) -> tuple[Path, Path]:
    """``(lock file, address file)`` of ``scheduler``'s agent on this host."""
    folder, key = agent_dir(base), agent_key(scheduler)
    return folder / f"{key}.lock", folder / f"{key}.json"


@contextlib.contextmanager
def held_lock(path: Path) -> Iterator[None]:
    """Hold the exclusive lock ``path`` (created 0600) for the ``with`` block.

    The holder may remove the file (:func:`remove_lock`, an agent leaving), so a lock taken on a
    file that is no longer the one at ``path`` is dropped and taken again on the current one:
    otherwise a rank that opened the file before its removal would hold a lock nobody else sees."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.stat(path).st_ino
            except FileNotFoundError:
                current = None
        except BaseException:
            os.close(fd)
            raise
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)  # removed (or replaced) while this process waited: lock the current file
    try:
        yield
    finally:
        os.close(fd)  # closing releases the lock


def remove_lock(path: Path) -> None:
    """Remove the lock file ``path``; call it holding the lock (see :func:`held_lock`)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not reaped yet, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return True  # no /proc: os.kill said it exists


def read_address(path: Path) -> AgentAddress | None:
    """The agent address in ``path``; None when there is none, it is not this user's private
    file, it does not parse, or its agent process is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        with os.fdopen(fd, "r") as f:
            fd = -1
            data = json.load(f)
        found = AgentAddress(str(data["address"]), str(data["token"]), int(data["pid"]),
                             str(data["scheduler"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    return found if pid_alive(found.pid) else None


def write_address(path: Path, found: AgentAddress) -> None:
    """Write ``found`` to ``path`` (0600 from its creation, replaced atomically)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(found), f)
    os.replace(tmp, path)


def remove_address(path: Path, pid: int) -> None:
    """Remove ``path`` if it still names agent ``pid`` (a successor's file stays)."""
    try:
        with open(path) as f:
            named = int(json.load(f).get("pid", -1))
    except (OSError, ValueError, TypeError, AttributeError):
        return
    if named == pid:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def write_spec(path: Path, text: str) -> None:
    """Write an agent's start file (it may hold TLS keys): 0600 from its creation."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
