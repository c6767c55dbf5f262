"""The host agent: one Dask client per host and scheduler, shared by that host's trainer processes.

torchrun starts one process per GPU; each Loader with its own client would cost the scheduler
one connection, heartbeat, push and consumption message per process. With
``mdata.trainer.host-agent`` on, the first local rank starts this process
(``python -m mdata.trainer.host_agent SPEC``, found again through :mod:`mdata.trainer.agent_lock`),
which holds one client (with the trainers' TLS settings) and one real
:class:`~mdata.trainer.location_hub.LocationHub` per job on it, so the local ranks' location
asks, pushes and consumption tells are gathered for the whole host. The ranks reach it over
Dask's comm on 127.0.0.1 (:mod:`mdata.trainer.agent_client`); every request carries the random
token of the 0600 address file. Batches do not pass here: ranks pull them from constructors.

The agent never unpickles what a rank sends (``deserialize=False``: a request is plain msgpack
data until its token is checked), forwards only mdata's scheduler handlers, and answers each
request with ``{"ok": value}`` or ``{"error": ...}`` (typed mdata errors stay typed; a broken
connection to the scheduler arrives as an ``OSError``, which the Loader reports as a lost
scheduler). A rank whose process is gone (checked every :data:`CHECK_S`) leaves its hubs and
its leases end (as its own client's leaving would have ended them), so a restarted trainer
takes its rank back. The agent exits when its last rank says goodbye or is gone, removing its
address file under the lock first.

A stuck host is diagnosed as a stuck rank is: ``kill -USR1 <agent pid>`` (the pid is in the
address file) writes every thread's stack to the agent's log, ``<key>.log`` beside its address
file, which is kept when it is not empty.
"""

from __future__ import annotations

import asyncio
import faulthandler
import hmac
import json
import logging
import os
import secrets
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from mdata.errors import MdataError, TrainerError
from mdata.trainer.agent_lock import (
    AgentAddress, held_lock, pid_alive, remove_address, remove_lock, write_address,
)
from mdata.wire.codec import SCHEDULER_HANDLERS, Handler
from mdata.wire.errors import error_to_msg
from mdata.wire.host_location import ConsumedTell, LocationAsk
from mdata.wire.delivery import BatchLocationReply
from mdata.wire.messages import Status

__all__ = ["HostAgent", "main", "error_reply"]

logger = logging.getLogger("mdata.trainer.host_agent")

CHECK_S = 0.5  # how often the agent looks for rank processes that are gone
FIRST_RANK_S = 60.0  # an agent no rank said hello to within this exits
FORWARDED = frozenset(h.value for h in SCHEDULER_HANDLERS)


def error_reply(exc: BaseException) -> dict[str, Any]:
    """``exc`` as the agent's error answer: typed for mdata errors, an OSError kept an OSError."""
    if isinstance(exc, MdataError):
        return {"error": {"mdata": error_to_msg(exc)}}
    kind = "os" if isinstance(exc, OSError) else "other"
    return {"error": {kind: f"{type(exc).__name__}: {exc}"}}


class _Session:
    """One rank-side link (one Loader's client): its process and the hubs it joined."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.hubs: dict[str, Any] = {}  # job -> LocationHub
        self.joins: dict[str, int] = {}  # job -> Loaders of this link in its hub
        self.ranks: dict[str, set[int]] = {}  # job -> ranks that asked through this link
        self.leases: dict[tuple[str, int], str] = {}  # (job, rank) -> token, leased through it


class HostAgent:
    """The agent's handlers over one Dask client on the agent's loop (see the module docstring)."""

    def __init__(self, client: Any, token: str) -> None:
        self.client, self.token = client, token
        self.sessions: dict[int, _Session] = {}
        self.had_sessions = False
        self._next = 0
        self._pool = ThreadPoolExecutor(max_workers=96, thread_name_prefix="mdata-agent")

    def handlers(self) -> dict[str, Callable]:
        names = ("hello", "bye", "join", "leave", "locate", "pushed", "pushed_waits", "tell",
                 "forward", "feed", "fed_checkpoint", "ask_fed")
        return {f"agent_{n}": self._guarded(getattr(self, f"_{n}")) for n in names}

    def _guarded(self, fn: Callable) -> Callable:
        # these need the scheduler
        asks = fn.__name__ in ("_locate", "_pushed", "_tell", "_forward", "_ask_fed")

        async def handler(comm: Any = None, token: Any = "", **kw: Any) -> dict[str, Any]:
            if not isinstance(token, str) or not hmac.compare_digest(token, self.token):
                return {"error": {"other": "PermissionError: wrong host agent token"}}
            try:
                if asks:
                    await self._connected()
                reply = {"ok": await fn(**kw)}
            except Exception as exc:  # noqa: BLE001 - every failure goes back to its rank
                reply = error_reply(exc)
            reply["status"] = self._status()  # the ranks' SchedulerWatch reads it
            return reply

        handler.__name__ = fn.__name__
        return handler

    def _status(self) -> str:
        return str(getattr(self.client, "status", "running"))

    async def _connected(self) -> None:
        """Return once the agent's client is connected; an OSError (the Loader's sign of a lost
        scheduler) when it stayed disconnected for GRACE_S, as a rank's own client would."""
        from mdata.trainer.scheduler_loss import GRACE_S, scheduler_address

        waited = time.monotonic() + GRACE_S
        while self._status() not in ("running", "newly-created"):
            if time.monotonic() > waited:
                raise OSError(f"the host agent's Dask client lost its connection to the "
                              f"scheduler at {scheduler_address(self.client)} (status "
                              f"{self._status()!r})")
            await asyncio.sleep(0.05)

    async def _blocking(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _session(self, session: Any) -> _Session:
        found = self.sessions.get(int(session))
        if found is None:
            raise TrainerError(f"host agent: no session {session} (it was ended)")
        return found

    def _hub(self, session: Any, job: Any) -> Any:
        hub = self._session(session).hubs.get(str(job))
        if hub is None:
            raise TrainerError(f"host agent: session {session} has not joined job {job!r}")
        return hub

    # -- handlers --------------------------------------------------------------------------------
    async def _hello(self, pid: Any = 0, session: Any = 0) -> dict[str, Any]:
        self._next += 1
        self.sessions[self._next] = _Session(int(pid))
        self.had_sessions = True
        return {"session": self._next, "client": str(self.client.id), "pid": os.getpid()}

    async def _bye(self, session: Any = 0) -> None:
        found = self.sessions.pop(int(session), None)
        if found is not None:
            await self._blocking(self._release_all, found)
            await self._detach_all(found)

    async def _detach_all(self, found: _Session) -> None:
        """End the leases a session still holds: its process died (a Loader that closed has
        detached). Without this they would live on with the agent's client, and a restarted
        trainer could not take its rank back."""
        for (job, rank), token in list(found.leases.items()):
            try:
                await self.client.scheduler.mdata_detach(job=job, rank=rank, token=token)
            except Exception as exc:  # noqa: BLE001 - the scheduler may be gone too
                logger.warning("mdata host agent: could not end rank %d's lease: %s", rank, exc)
        found.leases.clear()

    @staticmethod
    def _release_all(found: _Session) -> None:
        from mdata.trainer.location_hub import release

        for job, hub in found.hubs.items():
            for rank in found.ranks.get(job, ()):
                if hub.pushes is not None:
                    hub.pushes.forget(rank)
                hub.unfeed(rank)
            for _ in range(found.joins.get(job, 0)):
                release(hub)
        found.hubs.clear()
        found.joins.clear()

    async def _join(self, session: Any = 0, job: Any = "") -> dict[str, Any]:
        from mdata.trainer.location_hub import hub_for

        found = self._session(session)
        job = str(job)
        if job in found.hubs:  # another Loader of the same link: one more member
            found.hubs[job].join()
        else:
            found.hubs[job] = hub_for(self.client, job)
        found.joins[job] = found.joins.get(job, 0) + 1
        return {"pushes": found.hubs[job].pushes is not None}

    async def _leave(self, session: Any = 0, job: Any = "", rank: Any = None) -> None:
        from mdata.trainer.location_hub import release

        found, job = self._session(session), str(job)
        hub = found.hubs.get(job)
        if hub is not None:
            release(hub, None if rank is None else int(rank))
            found.ranks.get(job, set()).discard(rank)
            found.joins[job] -= 1
            if found.joins[job] <= 0:
                found.hubs.pop(job, None)
                found.joins.pop(job, None)

    async def _locate(self, session: Any = 0, job: Any = "", step: Any = 0, poll: Any = 0.0,
                      ask: Any = None) -> dict[str, Any]:
        hub = self._hub(session, job)
        request = LocationAsk.from_msg(ask)
        self._session(session).ranks.setdefault(str(job), set()).add(request.rank)
        reply = await self._blocking(hub.locate, int(step), float(poll), request)
        return reply.to_msg()

    async def _pushed(self, session: Any = 0, job: Any = "", step: Any = 0, rank: Any = 0,
                      generation: Any = 0, wait_s: Any = 0.0) -> dict[str, Any]:
        hub = self._hub(session, job)
        location, waited = await self._blocking(hub.pushed, int(step), int(rank), int(generation),
                                                float(wait_s))
        found = None if location is None else BatchLocationReply(Status.OK, location).to_msg()
        return {"location": found, "waited": float(waited)}

    async def _pushed_waits(self, session: Any = 0, job: Any = "", rank: Any = 0,
                            steps: Any = ()) -> list[float]:
        hub = self._hub(session, job)
        return list(hub.pushed_waits(int(rank), tuple(int(s) for s in steps)))

    async def _tell(self, session: Any = 0, job: Any = "", tell: Any = None) -> None:
        hub = self._hub(session, job)
        await self._blocking(hub.tell, ConsumedTell.from_msg(tell))

    async def _feed(self, session: Any = 0, job: Any = "", rank: Any = 0) -> None:
        hub = self._hub(session, job)
        self._session(session).ranks.setdefault(str(job), set()).add(int(rank))
        hub.feed(int(rank))

    async def _fed_checkpoint(self, session: Any = 0, job: Any = "", step: Any = 0,
                              generation: Any = 0, wait_s: Any = 0.0) -> Any:
        from mdata.wire.packed_checkpoint import checkpoint_msg

        hub = self._hub(session, job)
        found = await self._blocking(hub.fed_checkpoint, int(step), int(generation), float(wait_s))
        return None if found is None else checkpoint_msg(found)

    async def _ask_fed(self, session: Any = 0, job: Any = "", step: Any = 0, poll: Any = 0.0,
                       ask: Any = None) -> dict[str, Any]:
        hub = self._hub(session, job)
        reply = await self._blocking(hub.ask_fed, int(step), float(poll), LocationAsk.from_msg(ask))
        return reply.to_msg()

    async def _forward(self, handler: Any = "", msg: Any = None, session: Any = 0) -> Any:
        op = handler
        if op not in FORWARDED or not isinstance(msg, dict):
            raise TrainerError(f"host agent: {op!r} is not an mdata scheduler handler")
        raw = await getattr(self.client.scheduler, op)(**msg)  # on the client's own loop
        found = self.sessions.get(int(session))
        if found is not None and op in (Handler.ATTACH.value, Handler.DETACH.value):
            lease = (str(msg.get("job")), int(msg.get("rank", -1)))
            if op == Handler.ATTACH.value:
                found.leases[lease] = str(msg.get("token", ""))
            else:
                found.leases.pop(lease, None)
        return raw

    # -- life ------------------------------------------------------------------------------------
    def gone_sessions(self) -> list[int]:
        """Sessions whose rank process is gone (killed: it never said goodbye)."""
        return [s for s, found in self.sessions.items() if not pid_alive(found.pid)]

    def idle(self, started: float) -> bool:
        """No rank left: the last said goodbye or died, or none came at all."""
        if self.sessions:
            return False
        return self.had_sessions or time.monotonic() - started > FIRST_RANK_S


async def serve(spec: dict[str, Any]) -> None:
    """Run the agent of ``spec`` (what the spawning rank wrote) until its ranks are gone."""
    from distributed import Client
    from distributed.core import Server

    import dask.config

    import mdata.wire.frames  # noqa: F401

    dask.config.update(dask.config.config, spec.get("config") or {})  # the ranks' mdata settings
    security = None
    if spec.get("security"):
        from distributed.security import Security

        security = Security(**spec["security"])
    # asynchronous, on this loop: forwards need no thread, and the hubs' threads ask through
    # client.sync as from any thread
    client = await Client(spec["scheduler"], asynchronous=True, direct_to_workers=True,
                          timeout=float(spec.get("timeout", 60)), set_as_default=False,
                          security=security)
    agent = HostAgent(client, secrets.token_hex(32))
    server = Server({}, deserialize=False, needs_workdir=False)
    server.handlers = agent.handlers()  # nothing else: no identity, echo or state dumps
    await server.listen("tcp://127.0.0.1:0")
    lock, address_file = Path(spec["lock"]), Path(spec["address_file"])
    write_address(address_file, AgentAddress(server.address, agent.token, os.getpid(),
                                             spec["scheduler"]))
    started = time.monotonic()
    try:
        while True:
            await asyncio.sleep(CHECK_S)
            for session in agent.gone_sessions():
                await agent._bye(session)
            if agent.idle(started) and await _leave_if_idle(agent, started, lock, address_file):
                break
    finally:
        server.stop()
        await client.close()


async def _leave_if_idle(agent: HostAgent, started: float, lock: Path, address_file: Path) -> bool:
    """Under the lock (no rank is saying hello meanwhile): still idle? Then no more hellos."""
    def check() -> bool:
        with held_lock(lock):
            if agent.idle(started):
                remove_address(address_file, os.getpid())
                log = address_file.with_suffix(".log")
                if log.exists() and log.stat().st_size == 0:  # nothing went wrong: no trace
                    log.unlink(missing_ok=True)
                remove_lock(lock)  # the next rank to come makes it again
                return True
            return False

    return await asyncio.get_running_loop().run_in_executor(None, check)


def main(argv: list[str] | None = None) -> None:
    """``python -m mdata.trainer.host_agent SPEC``: SPEC is the 0600 JSON file the spawning rank
    wrote (scheduler, lock and address files, TLS settings); it is read and removed at once."""
    args = sys.argv[1:] if argv is None else argv
    spec_path = Path(args[0])
    spec = json.loads(spec_path.read_text())
    spec_path.unlink(missing_ok=True)
    logging.basicConfig(level=logging.WARNING)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks to the log (module docstring)
    asyncio.run(serve(spec))


if __name__ == "__main__":
    main()
