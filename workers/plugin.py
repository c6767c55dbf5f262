"""The worker-side partner of the Planner: registers mdata's handlers on every worker.

The Planner plugin installs it on all current and future workers when it starts (as distributed's
shuffle extension does), so plain ``dask worker`` processes need no preload of their own: giving a
worker its pool resources (``--resources pool_<source>=N``) is enough to make it a loader.
"""

from __future__ import annotations

import logging

from distributed.diagnostics.plugin import WorkerPlugin

import mdata.wire.frames  # noqa: F401  registers the batch wire format on this worker
from mdata.distribution import shipped_object
from mdata.errors import MdataError
from mdata.gc_freeze import freeze_long_lived
from mdata.wire.messages import (
    GetBatchRequest, SetRoleRequest, StorageWaitsRequest, TakeRowsManyRequest, TakeRowsRequest,
    serve,
)
from workers.constructor import make_get_batch_handler
from workers.loader import make_take_rows_handler, make_take_rows_many_handler, storage_waits_handler
from workers.standby import make_set_role_handler

PLUGIN_NAME = "mdata-worker"
#: Log lines Dask writes with a traceback when a connection it was using has closed: a worker's
#: heartbeat in flight when the scheduler drops it, and the scheduler's stream to a worker that
#: closed first. Both are races in Dask's own shutdown.
CLOSED_COMM_LINES = ("Failed to communicate with scheduler during heartbeat", "Batched Comm Closed")


class ClosedCommTracebackFilter(logging.Filter):
    """Logs a closed connection's line once, with its exception's text, without the traceback.

    The failure is a closed connection (an ``OSError``), and its traceback says nothing more. It
    happens in cluster shutdowns, a race in Dask itself, and it printed a two-part traceback into
    the output of otherwise clean shutdowns. A real outage still logs the line each time.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, OSError) and str(record.msg).startswith(CLOSED_COMM_LINES):
            record.msg = f"{record.msg} ({type(exc).__name__}: {exc})"
            record.exc_info, record.exc_text = None, None
        return True


#: What Dask logs, with the traceback, when a handler raises ("Exception while handling op %s").
HANDLER_FAILED = "Exception while handling op"


class RefusedRequestFilter(logging.Filter):
    """An mdata handler that answers a request with a typed mdata error logs one INFO line.

    Such an error (a plan whose source path matches no file, a job name nobody registered, a
    sample never planned) is the answer: Dask sends it to the caller, who raises it. Dask also
    logs it as an ERROR with its traceback in the serving process, so one user's wrong path
    printed tracebacks into the scheduler's log (and into ``mdata cluster up``'s terminal). It
    stays one line, at INFO (shown when the logger is at INFO, as the dask CLI's default is);
    any other exception of a handler is a bug and keeps its traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        op = str(record.args[0]) if isinstance(record.args, tuple) and record.args else ""
        if not (isinstance(exc, MdataError) and op.startswith("mdata_")
                and str(record.msg).startswith(HANDLER_FAILED)):
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.INFO):
            return False
        record.msg, record.args = "%s answered its caller with %s: %s", (op, type(exc).__name__, exc)
        record.levelno, record.levelname = logging.INFO, "INFO"
        record.exc_info, record.exc_text = None, None
        return True


def install_closed_comm_filter(*loggers: str) -> None:
    """Add :class:`ClosedCommTracebackFilter` to Dask's ``loggers`` (once each)."""
    install_log_filter(ClosedCommTracebackFilter, *loggers)


def install_log_filter(kind: type[logging.Filter], *loggers: str) -> None:
    """Add a ``kind`` filter to each of ``loggers`` that has none yet."""
    for name in loggers:
        log = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in log.filters):
            log.addFilter(kind())


class MdataWorkerPlugin(WorkerPlugin):
    """Adds the row-serving (loader) and batch-serving (constructor) handlers to a worker, and
    the one that reports its sources waiting on storage."""

    idempotent = True
    name = PLUGIN_NAME

    def __reduce__(self):
        """Pickled as a call of :func:`mdata.distribution.shipped_object`: the worker that
        unpickles it checks that its ``workers`` is mdata's before importing this module, so a
        shadowing package fails there with a clear error instead of running."""
        return shipped_object, ("workers.plugin", "MdataWorkerPlugin")

    def setup(self, worker) -> None:
        install_closed_comm_filter("distributed.worker", "distributed.batched")
        install_log_filter(RefusedRequestFilter, "distributed.core")  # loaders' typed refusals
        worker.handlers[TakeRowsRequest.handler.value] = serve(TakeRowsRequest, make_take_rows_handler(worker))
        worker.handlers[TakeRowsManyRequest.handler.value] = serve(
            TakeRowsManyRequest, make_take_rows_many_handler(worker))
        worker.handlers[GetBatchRequest.handler.value] = serve(GetBatchRequest, make_get_batch_handler(worker))
        worker.handlers[StorageWaitsRequest.handler.value] = serve(StorageWaitsRequest, storage_waits_handler)
        worker.handlers[SetRoleRequest.handler.value] = serve(SetRoleRequest, make_set_role_handler(worker))
        freeze_long_lived("mdata's worker plugin set up")  # full collections stall the worker's loop

    def teardown(self, worker) -> None:
        from distributed.core import Status

        if worker.status in (Status.closing, Status.closing_gracefully, Status.closed):
            # The worker is shutting down but still answers comms until it has closed: a
            # constructor finishing a batch or the Planner's storage poll may still ask it, and a
            # handler removed now makes Dask log a KeyError traceback for each such request.
            # Its handlers go with the worker; only a plugin removed from a live worker drops them.
            return
        for request in (TakeRowsRequest, TakeRowsManyRequest, GetBatchRequest, StorageWaitsRequest,
                        SetRoleRequest):
            worker.handlers.pop(request.handler.value, None)
