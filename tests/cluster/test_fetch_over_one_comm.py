"""A trainer's fetch asks over the connection it opened, never over a pool that may reconnect.

The bug this guards: the fetch bounded its connect to a constructor (1 s), handed the connection
back to the client's pool and asked through the pool. When the pool noticed the constructor's
close in between (it was killed -9), it opened a new connection with its own connect timeout,
Dask's 30 s, retried against the refused port all that time: a 30 s stall instead of moving on.
Here a real Dask server plays the holder and is closed between the connect and the call.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from distributed.core import ConnectionPool, Server

from mdata.wire.construct import WhoHasReply, WhoHasRequest
from mdata.wire.messages import ask, serve
from mdata.wire.one_comm import OverComm

pytestmark = pytest.mark.cluster

POOL_CONNECT_S = 3.0  # the pool's own connect timeout (Dask's default is 30 s)


async def _holder_and_pooled_comm():
    server = Server({WhoHasRequest.handler.value: serve(WhoHasRequest, lambda r: WhoHasReply(((),) * len(r.keys)))})
    await server.listen("tcp://127.0.0.1:0")
    pool = ConnectionPool(timeout=POOL_CONNECT_S)
    await pool.start()
    comm = await pool.connect(server.address, timeout=1.0)
    return server, pool, comm


def test_a_call_over_the_open_comm_answers():
    async def run():
        server, pool, comm = await _holder_and_pooled_comm()
        try:
            reply = await ask(OverComm(comm, server.address), WhoHasRequest((("k", 1),)))
            assert reply.who_has == ((),)
            pool.reuse(server.address, comm)
            assert not comm.closed()  # still usable: back in the pool
        finally:
            await pool.close()
            await server.close()

    asyncio.run(run())


def test_a_holder_gone_after_the_connect_fails_the_call_at_once():
    async def run():
        server, pool, comm = await _holder_and_pooled_comm()
        address = server.address
        try:
            await server.close()  # the holder dies between the connect and the call
            began = time.monotonic()
            with pytest.raises(OSError):
                await ask(OverComm(comm, address), WhoHasRequest((("k", 1),)))
            over_comm_s = time.monotonic() - began

            # the pooled call the fetch used to make: the pool finds its comm closed and
            # reconnects to the refused port until its own connect timeout
            pool.reuse(address, comm)
            began = time.monotonic()
            with pytest.raises(OSError):
                await ask(pool(address), WhoHasRequest((("k", 1),)))
            pooled_s = time.monotonic() - began
        finally:
            await pool.close()
        assert over_comm_s < 1.0 < POOL_CONNECT_S * 0.5 <= pooled_s, (over_comm_s, pooled_s)

    asyncio.run(run())
