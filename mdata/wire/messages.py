"""Every message between mdata processes, by handler, and the two functions that use them.

=============================  =========================  ==========================================
handler (:class:`Handler`)     request                    reply
=============================  =========================  ==========================================
``mdata_register_job``         RegisterJobRequest         JobInfo
``mdata_job_info``             JobInfoRequest             JobInfo
``mdata_jobs``                 JobsRequest                JobsReply (a list of names)
``mdata_batch_location``       BatchLocationRequest       BatchLocationReply (OK/timeout/failed)
``mdata_host_location``        HostLocationRequest        HostLocationReply (one BatchLocationReply each)
``mdata_consumed``             ConsumedRequest            ConsumedReply (each tell's error, or none)
``mdata_ack``                  AckRequest                 OkReply
``mdata_report_metrics``       ReportMetricsRequest       OkReply
``mdata_checkpoint``           CheckpointRequest          CheckpointReply (``Checkpoint.to_dict()``)
``mdata_status``               StatusRequest              StatusReply
``mdata_job_storage_waits``    JobStorageWaitsRequest     JobStorageWaitsReply (sources waiting)
``mdata_story``                StoryRequest               StoryReply (a list of occurrences)
``mdata_lineage``              LineageRequest             LineageReply
``mdata_who_has``              WhoHasRequest              WhoHasReply
``mdata_close_job``            CloseJobRequest            OkReply
``mdata_take_rows``            TakeRowsRequest            TakeRowsReply (OK/missing), on loaders
``mdata_take_rows_many``       TakeRowsManyRequest        TakeRowsManyReply (one TakeRowsReply each)
``mdata_get_batch``            GetBatchRequest            GetBatchReply (OK/missing), on constructors
``mdata_storage_waits``        StorageWaitsRequest        StorageWaitsReply, on any mdata worker
``mdata_set_role``             SetRoleRequest             SetRoleReply (resources), on pool workers
(construct task argument)      ConstructPart              the task's result stays on the worker
=============================  =========================  ==========================================

Those down to ``mdata_close_job`` (and ``mdata_attach``, ``mdata_detach``, ``mdata_scaler_report``)
are served by the Planner on the scheduler, the rest by mdata's worker plugin. A request's ``to_msg()`` is the handler's keyword arguments, so the handlers still answer
plain calls (``client.scheduler.mdata_status(job=...)`` in a notebook) with the same data as ever.

The sender calls :func:`ask` (or :func:`ask_sync` from a thread that is not the client's loop);
the receiver registers :func:`serve` of its typed function. Both ends thus read and write the same
classes, and a field that is missing, misspelt or of the wrong type fails with a
:class:`~mdata.wire.errors.MessageError` naming the message and the field. Errors travel typed
(:mod:`mdata.wire.errors`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from mdata.wire.codec import Handler, Message, Request, Status
from mdata.wire.construct import (
    ChunkPull, ConstructPart, ConstructSpec, TakeRowsManyReply, TakeRowsManyRequest, TakeRowsReply,
    TakeRowsRequest, WhoHasReply, WhoHasRequest,
)
from mdata.wire.delivery import (
    AckRequest, BatchLocation, BatchLocationReply, BatchLocationRequest, GetBatchReply,
    GetBatchRequest, ReportMetricsRequest,
)
from mdata.wire.host_location import (
    ConsumedReply, ConsumedRequest, ConsumedTell, HostLocationReply, HostLocationRequest, LocationAsk,
)
from mdata.wire.errors import MessageError, NoHandlerError, error_from_msg, error_to_msg
from mdata.wire.location_push import PUSH_OP, LocationPush, PushedGroup
from mdata.wire.stream_tells import CONFIRM_OP, TELL_OP, StreamedTells, TellsConfirmed
from mdata.wire.timeouts import reply_timeout, within
from mdata.wire.inspection import (
    ExactlyOnce, JobStorageWaitsReply, JobStorageWaitsRequest, LineageReply, LineageRequest,
    StatusCounters, StatusReply, StatusRequest, StoryOccurrence, StoryReply, StoryRequest,
)
from mdata.wire.storage import (
    StorageWaitInfo, StorageWaitsReply, StorageWaitsRequest, WorkerStorageWait,
)
from mdata.wire.pools import (
    PoolDecision, ScalerReportRequest, ScalerStatus, SetRoleReply, SetRoleRequest,
)
from mdata.wire.trainers import AttachReply, AttachRequest, DetachRequest
from mdata.wire.jobs import (
    CheckpointReply, CheckpointRequest, CloseJobRequest, JobInfo, JobInfoRequest, JobsReply,
    JobsRequest, MeshShape, OkReply, RegisterJobRequest,
)

__all__ = [
    "Handler", "Status", "Message", "Request", "MessageError", "NoHandlerError", "error_to_msg",
    "error_from_msg",
    "CATALOGUE", "ask", "ask_sync", "serve", "reply_timeout", "within",
    # jobs
    "RegisterJobRequest", "JobInfoRequest", "JobInfo", "MeshShape", "JobsRequest", "JobsReply",
    "CloseJobRequest", "OkReply", "CheckpointRequest", "CheckpointReply",
    # inspection
    "StatusRequest", "StatusReply", "StatusCounters", "JobStorageWaitsRequest",
    "JobStorageWaitsReply", "StoryRequest", "StoryReply", "StoryOccurrence", "LineageRequest", "LineageReply", "ExactlyOnce",
    # delivery
    "BatchLocationRequest", "BatchLocation", "BatchLocationReply", "AckRequest",
    "ReportMetricsRequest", "GetBatchRequest", "GetBatchReply",
    "HostLocationRequest", "HostLocationReply", "LocationAsk", "ConsumedRequest", "ConsumedReply",
    "ConsumedTell",
    # pushed locations (the scheduler's stream to a client, no handler)
    "PUSH_OP", "LocationPush", "PushedGroup",
    # consumption tells over the client's stream, each confirmed (no handler)
    "TELL_OP", "CONFIRM_OP", "StreamedTells", "TellsConfirmed",
    # trainers' leases
    "AttachRequest", "AttachReply", "DetachRequest",
    # construct
    "WhoHasRequest", "WhoHasReply", "TakeRowsRequest", "TakeRowsReply", "TakeRowsManyRequest",
    "TakeRowsManyReply", "ChunkPull", "ConstructSpec", "ConstructPart",
    # storage waits
    "StorageWaitsRequest", "StorageWaitsReply", "WorkerStorageWait", "StorageWaitInfo",
    # loader pools' roles (standbys)
    "SetRoleRequest", "SetRoleReply",
    # pool sizing: one decision shape, the autoscaler's report
    "PoolDecision", "ScalerStatus", "ScalerReportRequest",
]

R = TypeVar("R", bound=Request)

#: Every handler's request class (its reply class is ``request.reply``).
CATALOGUE: dict[Handler, type[Request]] = {
    cls.handler: cls
    for cls in (
        RegisterJobRequest, JobInfoRequest, JobsRequest, BatchLocationRequest, HostLocationRequest,
        ConsumedRequest, AckRequest,
        ReportMetricsRequest, CheckpointRequest, StatusRequest, JobStorageWaitsRequest,
        StoryRequest, LineageRequest,
        WhoHasRequest, CloseJobRequest, TakeRowsRequest, TakeRowsManyRequest, GetBatchRequest,
        AttachRequest,
        DetachRequest, StorageWaitsRequest, SetRoleRequest, ScalerReportRequest,
    )
}
if set(CATALOGUE) != set(Handler):  # pragma: no cover - a handler added without its request class
    raise ImportError(f"handlers without a request class: {sorted(set(Handler) - set(CATALOGUE))}")


async def ask(target: Any, request: Request) -> Any:
    """Call ``request``'s handler on ``target`` (``client.scheduler``, ``worker.scheduler`` or an
    rpc to a worker) and return its reply, read by ``request.reply.from_msg``."""
    raw = await getattr(target, request.handler.value)(**request.to_msg())
    if raw is None:  # what Dask answers for an op it has no handler for
        raise NoHandlerError(f"{getattr(target, 'address', target)} has no {request.handler.value} handler "
                             "(a worker shutting down, or a process without mdata's plugin)")
    return request.reply.from_msg(raw)


def ask_sync(client: Any, request: Request, timeout: float | None = None) -> Any:
    """:func:`ask` the scheduler through ``client`` from a thread other than the client's loop,
    waiting at most ``timeout`` seconds (default: :func:`~mdata.wire.timeouts.reply_timeout`)
    before :class:`~mdata.errors.RequestTimeoutError`: a dead or stuck scheduler is an error."""
    limit = reply_timeout(request) if timeout is None else float(timeout)
    target = client.scheduler
    return client.sync(lambda: within(ask(target, request), request, getattr(target, "address", target), limit))


def serve(request_type: type[R], fn: Callable[[R], Message | Awaitable[Message]]):
    """A Dask handler for ``request_type.handler``: reads the request from the call's keyword
    arguments, calls ``fn`` (plain or async) and answers its reply's ``to_msg()``."""
    reply_type = request_type.reply

    async def handler(**msg: Any) -> Any:
        reply = fn(request_type.from_msg(msg))
        if inspect.isawaitable(reply):
            reply = await reply
        if not isinstance(reply, reply_type):
            raise TypeError(f"{fn!r} answered {type(reply).__name__} to {request_type.__name__}, "
                            f"not {reply_type.__name__}")
        return reply.to_msg()

    handler.__name__ = handler.__qualname__ = request_type.handler.value
    return handler
