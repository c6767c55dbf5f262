"""Asking a handler over one connection already open, never over a pool that may reconnect.

A pooled call (``client.rpc(address).op(...)``) takes an idle connection from the pool and, when
the one it finds has just been closed, opens a new one with the pool's connect timeout: Dask's
30 s by default, retried against a refused port all that time. A caller that bounded its own
connect (a trainer fetching from a constructor that may have been killed) loses that bound
there: the pool noticed the peer's close between the connect and the call. :class:`OverComm`
sends the request on the connection the caller holds, so a closed one is an error at once.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OverComm"]


class OverComm:
    """A call target for :func:`mdata.wire.messages.ask` that sends on ``comm`` only.

    ``OverComm(comm).some_op(**msg)`` writes the message on ``comm`` and reads the reply
    (Dask's ``send_recv``, which aborts the comm on a communication error and closes it when the
    call is cancelled, so a half-read reply is never left for its next user)."""

    def __init__(self, comm: Any, address: str) -> None:
        self.comm, self.address = comm, address

    def __getattr__(self, op: str):
        if op.startswith("_"):
            raise AttributeError(op)

        async def call(**msg: Any) -> Any:
            from distributed.core import send_recv

            return await send_recv(self.comm, op=op, **msg)

        return call
