"""Fail fast, in one line, when nothing listens at the scheduler's address.

Dask's ``Client`` retries a refused connection until its timeout (the Loader's, 120 s by default),
logging as it goes; a wrong port or a cluster that is not up then costs every rank two minutes and
a screen of tracebacks. Before connecting, the Loader opens a plain TCP connection to the address:
refused for :data:`REFUSED_FOR_S` seconds (a scheduler still starting gets that long), it raises a
:class:`~mdata.errors.TrainerError` naming the address. An address that does answer, or one this
check cannot read (not ``tcp://`` or ``tls://``), is left to Dask's own connect and its timeout.
"""

from __future__ import annotations

import logging
import socket
import time

from mdata.errors import TrainerError
from mdata.trainer.environment import wants_host_agent

__all__ = ["check_listening", "connect_client", "REFUSED_FOR_S"]

logger = logging.getLogger("mdata.trainer")

REFUSED_FOR_S = 5.0  # keep trying a refused address this long (a scheduler still starting)


def _host_port(address: str) -> tuple[str, int] | None:
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    if scheme not in ("tcp", "tls"):
        return None
    host, _, port = rest.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return None
    return host, int(port)


def check_listening(address: str, refused_for: float = REFUSED_FOR_S) -> None:
    """Raise :class:`TrainerError` when ``address`` refuses connections for ``refused_for`` s."""
    hp = _host_port(address)
    if hp is None:
        return
    deadline = time.monotonic() + refused_for
    while True:
        try:
            with socket.create_connection(hp, timeout=min(5.0, max(refused_for, 0.5))):
                return
        except ConnectionRefusedError as exc:
            if time.monotonic() >= deadline:
                raise TrainerError(
                    f"cannot reach the mdata scheduler at {address!r}: nothing listens there "
                    f"(connection refused for {refused_for:.0f}s); check the address `mdata "
                    "cluster up` printed (or your dask scheduler's) and that the cluster is up"
                ) from None
        except OSError:  # unreachable host, DNS, a timeout: Dask's connect reports it with its timeout
            return
        time.sleep(0.25)


def connect_client(address_or_client, timeout: float, security=None):
    """A Dask client for a Loader: ``address_or_client`` itself when it is one (returned with
    False: the Loader must not close it), else a new client to that address (True), after
    :func:`check_listening` so that a wrong address fails in one line; with
    ``mdata.trainer.host-agent`` on (or ``auto`` at scale: :func:`wants_host_agent`), that
    client is the host agent's
    (:class:`~mdata.trainer.agent_client.AgentClient`)."""
    from distributed import Client

    if hasattr(address_or_client, "scheduler") and hasattr(address_or_client, "sync"):
        return address_or_client, False
    check_listening(str(address_or_client))  # nothing there: one line in seconds, not the timeout
    from mdata import config

    if isinstance(address_or_client, str) and wants_host_agent(config.get("trainer.host-agent")):
        from mdata.trainer.agent_client import connect_agent  # one client per host and scheduler

        try:
            return connect_agent(address_or_client, timeout=timeout, security=security), True
        except TrainerError as exc:  # no agent (it could not start): this rank goes on alone
            logger.warning("mdata: no host agent (%s); this rank uses its own Dask client", exc)
    try:
        client = Client(address_or_client, direct_to_workers=True, timeout=timeout,
                        set_as_default=False, security=security)
    except OSError as exc:
        raise TrainerError(
            f"cannot reach the mdata scheduler at {address_or_client!r} within {timeout:.0f}s: {exc}; "
            "check the address printed by `mdata cluster up` (or your dask scheduler) and that "
            "this host can reach it"
        ) from exc
    return client, True
