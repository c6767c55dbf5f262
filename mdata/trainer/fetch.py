"""Pulling one rank's slice of a built batch straight from a constructor that holds it.

Bulk data never passes through the scheduler: the Planner says which constructors hold the DP
group's batch (``who_has``) and the rank asks them in turn for its slice (CP piece, tokens and
labels as its role needs). A constructor that is gone, closing or stuck past the request
timeout counts as not holding it; when none serves it, :class:`BatchMoved` tells the Loader to
ask the Planner again (the batch is being rebuilt elsewhere).
"""

from __future__ import annotations

from typing import Any

from mdata.errors import RequestTimeoutError
from mdata.wire.one_comm import OverComm
from mdata.wire.messages import (
    BatchLocation, GetBatchRequest, NoHandlerError, Status, ask, reply_timeout, within,
)

__all__ = ["BatchMoved", "fetch_slice"]

#: How long connecting to a constructor may take before it counts as gone. Dask retries a refused
#: connection (a constructor killed with its port closed) until its own connect timeout, 30 s by
#: default; a live constructor completes the handshake within milliseconds. A location pushed
#: before its constructor died still names it, so this bound is what keeps that stall short; a
#: live but slow constructor only costs a long poll, which names it again.
CONNECT_S = 1.0


class BatchMoved(Exception):
    """No constructor served the batch where the Planner said it was: ask again."""


def fetch_slice(client: Any, location: BatchLocation, delivery: Any):
    """This rank's slice of the batch at ``location`` (``delivery``: what the rank receives
    under the plan's broadcast axis, :meth:`mdata.mesh.ClientPlaceTree.delivery`)."""
    request = GetBatchRequest(key=location.key, cp_rank=delivery.cp_rank,
                              receives_tokens=delivery.receives_tokens,
                              receives_labels=delivery.receives_labels,
                              dp_rank=location.dp_rank)
    limit = reply_timeout(request)  # a stuck constructor counts as gone: ask the next one

    async def pull():
        import asyncio

        last_error: object = None
        for address in location.who_has:
            try:
                comm = await asyncio.wait_for(client.rpc.connect(address, timeout=CONNECT_S),
                                              CONNECT_S + 0.5)
            except (OSError, asyncio.TimeoutError) as exc:  # gone
                last_error = exc
                continue
            try:  # on this connection only: a pooled call would reconnect for Dask's 30 s
                reply = await within(ask(OverComm(comm, address), request), request, address, limit)
            except (OSError, asyncio.TimeoutError, NoHandlerError, RequestTimeoutError) as exc:  # gone, closing, stuck
                comm.abort()  # a timed-out call may still be reading: the comm is done for
                last_error = exc
                continue
            finally:
                client.rpc.reuse(address, comm)  # back to the pool (dropped there when closed)
            if reply.status is Status.OK:
                return reply.batch
            last_error = f"{address} answered {reply.status.value} for {list(reply.key)}"
        raise BatchMoved(f"no constructor of {list(location.who_has)} served it: {last_error}")

    return client.sync(pull)
