"""How long a sender waits for the answer to one request, and the call that enforces it.

A request to a scheduler that died, a worker that hangs or a handler stuck behind a lock would
otherwise leave a trainer or a driver waiting forever with no error. Every request therefore has
a reply deadline: ``mdata.requests.timeout``, plus the request's own long-poll timeout for one
that long-polls (``batch_location``), plus ``planner.pool-wait`` and ``planner.listing-timeout``
for a registration (the Planner lists every source on its loaders before it answers). Past it the
sender gets :class:`~mdata.errors.RequestTimeoutError` naming the request and the address asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from mdata.errors import RequestTimeoutError
from mdata.wire.codec import Handler, Request

__all__ = ["reply_timeout", "within"]

T = TypeVar("T")


def reply_timeout(request: Request) -> float:
    """Seconds to wait for ``request``'s answer under the current configuration."""
    from mdata import config

    limit = config.seconds("requests.timeout")
    if request.handler is Handler.REGISTER_JOB:
        limit += config.seconds("planner.pool-wait") + config.seconds("planner.listing-timeout")
    poll = getattr(request, "timeout", None)  # a long poll answers by its own timeout
    if isinstance(poll, (int, float)) and not isinstance(poll, bool):
        limit += max(0.0, float(poll))
    return limit


async def within(call: Awaitable[T], request: Request, address: Any, timeout: float) -> T:
    """``await call``, or :class:`RequestTimeoutError` after ``timeout`` seconds (the call is
    cancelled). A timeout raised *by* the call (e.g. a connect timeout) passes unchanged."""
    task = asyncio.ensure_future(call)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if task in done:
        return task.result()
    task.cancel()
    raise RequestTimeoutError(
        f"no answer to {request.handler.value} from {address} within {timeout:g}s: the process "
        "is gone, unreachable or stuck (raise mdata.requests.timeout if it is only slow)"
    )
