"""A trainer rank's stand-in for a Dask client, speaking to the scheduler through the host agent.

With ``mdata.trainer.host-agent`` on, a Loader given a scheduler address gets an
:class:`AgentClient` instead of its own ``distributed.Client``: the same few things the Loader
uses of a client (``sync``, ``scheduler.<handler>(...)``, ``rpc``, ``id``, ``status``), so the
rest of the trainer code is unchanged. ``scheduler.mdata_*`` calls go to the agent, which asks
the scheduler with the host's one client (:mod:`mdata.trainer.host_agent`); ``rpc`` is this
process' own connection pool, so batches come straight from constructors (:mod:`mdata.trainer.fetch`);
location asks, pushes and consumption go through :class:`~mdata.trainer.agent_proxy.AgentHub`.

**When the agent dies** (killed, crashed), the next call to it fails with a broken connection.
The rank then carries on alone: this object opens its own client to the scheduler (on its own
loop), leases again, with that client, every rank it had leased through the agent (same token,
no checkpoint: the lease moves, the job does not rewind), and from then on behaves as a plain
client: hubs are made on it, and the call that found the agent dead is made again directly.
Every request it may resend is one the Planner takes twice without harm (a long poll, a
consumption tell, a lease with the same token). The rank's samples are those of an
uninterrupted run: they are the Planner's, whoever asks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mdata.errors import TrainerError
from mdata.trainer.agent_lock import (
    AgentAddress, AgentLost, agent_paths, held_lock, read_address, write_spec,
)
from mdata.trainer.agent_proxy import AgentHub
from mdata.wire.codec import Handler
from mdata.wire.errors import error_from_msg

__all__ = ["AgentClient", "AgentLost", "connect_agent"]

logger = logging.getLogger("mdata.trainer")

HELLO_S = 10.0  # longest a hello to a listed agent may take before another agent is started
#: How long connecting to the agent may take before it counts as gone. The agent is on this host,
#: on loopback: a live one completes the handshake within milliseconds, while Dask retries a
#: refused connection (a killed agent's closed port) until its own connect timeout, 30 s by
#: default; every rank that needed a new connection to a killed agent stalled that long. A live
#: agent that misses this bound only costs the rank its share of the host's client.
AGENT_CONNECT_S = 2.0


def agent_error(error: dict[str, Any]) -> BaseException:
    """The exception of an agent's ``{"error": ...}`` answer (see :func:`host_agent.error_reply`)."""
    if "mdata" in error:
        return error_from_msg(error["mdata"])
    if "os" in error:  # the agent's client lost the scheduler: the Loader says so
        return OSError(f"via the host agent: {error['os']}")
    return TrainerError(f"host agent: {error.get('other', error)}")


class _Scheduler:
    """``client.scheduler`` of an :class:`AgentClient`: each ``mdata_*`` handler is a coroutine."""

    def __init__(self, owner: "AgentClient") -> None:
        self._owner = owner

    @property
    def address(self) -> str:
        return self._owner.scheduler_address

    def __getattr__(self, op: str):
        if not op.startswith("mdata_"):
            raise AttributeError(op)

        async def call(**msg: Any) -> Any:
            return await self._owner.ask(op, msg)

        call.__name__ = op
        return call


class AgentClient:
    """What a Loader uses of a Dask client, served through the host agent (module docstring)."""

    def __init__(self, scheduler: str, *, timeout: float, security: Any = None) -> None:
        from distributed.core import ConnectionPool
        from distributed.security import Security
        from distributed.utils import LoopRunner

        self.scheduler_address, self.timeout = scheduler, float(timeout)
        self.security = security if security is not None else Security()
        self._runner = LoopRunner(asynchronous=False)
        self._runner.start()
        self.loop = self._runner.loop
        self.rpc = ConnectionPool(connection_args=self.security.get_connection_args("client"))
        self._to_agent = ConnectionPool(limit=64, timeout=AGENT_CONNECT_S)
        self.sync(self.rpc.start)
        self.sync(self._to_agent.start)
        self.scheduler = _Scheduler(self)
        self.agent: AgentAddress | None = None
        self.session = 0
        self._agent_client = ""  # the agent's Dask client id
        self._agent_status = "running"  # and its status, as the agent's last answer said
        self.lost: str | None = None  # why the agent is no longer used
        self._fallback: Any = None  # this rank's own Dask client, once the agent is lost
        self._fallback_lock: asyncio.Lock | None = None
        self._leases: dict[tuple[str, int], dict[str, Any]] = {}  # attaches made via the agent

    # -- what the Loader uses of a Dask client ---------------------------------------------------
    def sync(self, func, *args: Any, callback_timeout: Any = None, **kwargs: Any) -> Any:
        """Run coroutine function ``func`` on this client's loop, from another thread."""
        from distributed.utils import sync

        return sync(self.loop, func, *args, callback_timeout=callback_timeout, **kwargs)

    @property
    def id(self) -> str:
        return str(self._fallback.id) if self._fallback is not None else self._agent_client

    @property
    def status(self) -> str:
        """The agent's client's status, as its last answer said (this rank's own, once lost)."""
        return self._agent_status if self._fallback is None else str(self._fallback.status)

    @property
    def scheduler_comm(self) -> Any:
        return None if self._fallback is None else self._fallback.scheduler_comm

    @property
    def _stream_handlers(self) -> dict:
        if self._fallback is None:  # no stream of its own: pushes reach the agent's client
            raise AttributeError("_stream_handlers")
        return self._fallback._stream_handlers

    def agent_hub(self, job: str):
        """The agent's hub for ``job`` (an :class:`~mdata.trainer.agent_proxy.AgentHub`), or
        None once the agent is lost (the caller then makes a hub on this client)."""
        try:
            joined = self.sync(self.call, "agent_join", job=job)
        except AgentLost:
            self.sync(self.direct)  # the hub made instead is on this rank's own client
            return None
        return AgentHub(self, job, bool(joined["pushes"]))

    # -- the agent ----------------------------------------------------------------------------
    async def hello(self, agent: AgentAddress) -> None:
        self.agent, self.lost = agent, None
        said = await asyncio.wait_for(self.call("agent_hello", pid=os.getpid()), HELLO_S)
        self.session, self._agent_client = int(said["session"]), str(said["client"])

    async def call(self, op: str, /, **kw: Any) -> Any:
        """``op`` on the agent; raises :class:`AgentLost` when it does not answer any more, and
        the error it answered otherwise."""
        if self.lost is not None or self.agent is None:
            raise AgentLost(self.lost or "no host agent")
        try:
            reply = await getattr(self._to_agent(self.agent.address), op)(
                token=self.agent.token, session=self.session, **kw)
        except OSError as exc:  # CommClosedError included: the agent's process is gone
            self._lose(f"{type(exc).__name__}: {exc}")
            raise AgentLost(self.lost) from exc
        if not isinstance(reply, dict) or ("ok" not in reply and "error" not in reply):
            raise TrainerError(f"host agent {self.agent.address}: unexpected answer {reply!r:.200}")
        self._agent_status = str(reply.get("status", self._agent_status))
        if "error" in reply:
            raise agent_error(reply["error"])
        return reply["ok"]

    def _lose(self, why: str) -> None:
        if self.lost is None:
            agent = self.agent
            self.lost = f"host agent (pid {agent.pid if agent else '?'}, " \
                        f"{agent.address if agent else '?'}) stopped answering: {why}"
            logger.warning("mdata: %s; this rank goes on with its own Dask client", self.lost)

    async def ask(self, op: str, msg: dict[str, Any]) -> Any:
        """Scheduler handler ``op`` with ``msg``: through the agent, or directly once it is lost."""
        if self.lost is None:
            try:
                raw = await self.call("agent_forward", handler=op, msg=msg)
            except AgentLost:
                pass
            else:
                self._noted(op, msg)
                return raw
        direct = await self.direct()
        if op == Handler.ATTACH.value:
            msg = {**msg, "client": str(direct.id)}
        raw = await getattr(direct.scheduler, op)(**msg)
        self._noted(op, msg)
        return raw

    def _noted(self, op: str, msg: dict[str, Any]) -> None:
        """Remember the leases made, to move them to this rank's own client if the agent dies."""
        if op == Handler.ATTACH.value:
            self._leases[(str(msg.get("job")), int(msg.get("rank", -1)))] = dict(msg)
        elif op == Handler.DETACH.value:
            self._leases.pop((str(msg.get("job")), int(msg.get("rank", -1))), None)

    async def direct(self) -> Any:
        """This rank's own Dask client (made, and the leases moved to it, on first use)."""
        from distributed import Client

        if self._fallback_lock is None:
            self._fallback_lock = asyncio.Lock()
        async with self._fallback_lock:
            if self._fallback is None:
                client = await Client(self.scheduler_address, asynchronous=True,
                                      direct_to_workers=True, timeout=self.timeout,
                                      set_as_default=False, security=self.security)
                for lease in list(self._leases.values()):  # same token: the rank's lease moves
                    moved = {**lease, "client": str(client.id), "checkpoint": None}
                    try:
                        await client.scheduler.mdata_attach(**moved)
                    except Exception as exc:  # noqa: BLE001 - its next request says why
                        logger.warning("mdata: rank %s could not move its lease off the host "
                                       "agent: %s", lease.get("rank"), exc)
                self._fallback = client
        return self._fallback

    def close(self) -> None:
        """Say goodbye to the agent (the last rank's goodbye ends it) and close everything."""
        async def closing() -> None:
            if self.lost is None and self.agent is not None:
                try:
                    await asyncio.wait_for(self.call("agent_bye"), 2.0)
                except (AgentLost, asyncio.TimeoutError, Exception):  # noqa: BLE001 - best effort
                    pass
            if self._fallback is not None:
                await self._fallback.close()
            await self._to_agent.close()
            await self.rpc.close()

        # never raises: a Loader closing after an error (a lost scheduler) must raise that one
        try:
            self.sync(closing, callback_timeout=10)
        except Exception as exc:  # noqa: BLE001 - the cluster or the agent may be gone
            logger.debug("mdata: closing the host agent's link: %s", exc)
        try:
            self._runner.stop(timeout=2)
        except Exception as exc:  # noqa: BLE001 - a loop stuck in a dead connection: a daemon thread
            logger.debug("mdata: the host agent link's loop did not stop: %s", exc)


def connect_agent(scheduler: str, *, timeout: float, security: Any = None) -> AgentClient:
    """An :class:`AgentClient` through this host's agent for ``scheduler``, starting the agent
    when none answers (under the lock: one agent per host, scheduler and user)."""
    lock, address_file = agent_paths(scheduler)
    client = AgentClient(scheduler, timeout=timeout, security=security)
    try:
        with held_lock(lock):
            found = read_address(address_file)
            if found is not None and found.scheduler == scheduler:
                try:
                    client.sync(client.hello, found)
                    return client
                except (AgentLost, asyncio.TimeoutError, OSError) as exc:
                    logger.warning("mdata: host agent pid %d does not answer (%s); starting "
                                   "another", found.pid, exc)
            found = _start_agent(scheduler, lock, address_file, timeout, security)
            client.sync(client.hello, found)
            return client
    except BaseException:
        client.close()
        raise


_started: list[subprocess.Popen] = []  # agents this process started (kept: reaped at exit)


def _start_agent(scheduler: str, lock: Path, address_file: Path, timeout: float,
                 security: Any) -> AgentAddress:
    """Start an agent for ``scheduler`` and wait for its address file (the caller holds the lock)."""
    import json

    import dask.config

    import mdata

    spec = {"scheduler": scheduler, "lock": str(lock), "address_file": str(address_file),
            "timeout": timeout, "security": _security_fields(security),
            "config": {"mdata": dask.config.get("mdata", default={})}}
    spec_file = lock.with_name(f"{lock.stem}.{os.getpid()}.spec")
    write_spec(spec_file, json.dumps(spec, default=str))
    log = lock.with_name(f"{lock.stem}.log")
    env = dict(os.environ)
    root = str(Path(mdata.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    with open(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "mdata.trainer.host_agent", str(spec_file)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                env=env, start_new_session=True, close_fds=True)
    _started.append(proc)
    deadline = time.monotonic() + max(timeout, 30.0)
    while time.monotonic() < deadline:
        found = read_address(address_file)
        if found is not None and found.pid == proc.pid:
            return found
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    if proc.poll() is None:
        proc.kill()
    raise TrainerError(f"the mdata host agent for {scheduler} did not start (pid {proc.pid}, "
                       f"exit {proc.poll()}); its log {log}:\n{tail}")


def _security_fields(security: Any) -> dict[str, Any] | None:
    """The TLS settings of ``security`` the agent's client needs (None: Dask's configuration)."""
    if security is None:
        return None
    fields = ("require_encryption", "tls_ca_file", "tls_client_cert", "tls_client_key",
              "tls_min_version", "tls_max_version")
    return {f: getattr(security, f) for f in fields if getattr(security, f, None) is not None}
