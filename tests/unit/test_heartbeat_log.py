"""A failed worker heartbeat logs one line with the error's text, not a traceback; so does an mdata
handler that answers with a typed error (at INFO), while a handler's bug keeps its traceback."""

from __future__ import annotations

import io
import logging

from distributed.comm.core import CommClosedError

from mdata.errors import PlanError, SourceNotFoundError
from workers.plugin import ClosedCommTracebackFilter, RefusedRequestFilter


def _log_through_filter(message: str, exc: BaseException) -> str:
    out = io.StringIO()
    logger = logging.getLogger(f"test-heartbeat-{id(out)}")
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    logger.addFilter(ClosedCommTracebackFilter())
    logger.propagate = False
    try:
        raise exc
    except type(exc):
        logger.exception(message)
    return out.getvalue()


def test_a_failed_heartbeat_keeps_its_line_and_error_but_not_the_traceback():
    text = _log_through_filter("Failed to communicate with scheduler during heartbeat.",
                               OSError("in <TCP (closed)>: Stream is closed"))
    assert "Traceback" not in text
    assert "Failed to communicate with scheduler during heartbeat." in text
    assert "OSError: in <TCP (closed)>: Stream is closed" in text


def test_a_closed_batched_stream_keeps_its_line_but_not_the_traceback():
    text = _log_through_filter("Batched Comm Closed <TCP (closed) Scheduler connection to worker>",
                               CommClosedError("Stream is closed"))
    assert "Traceback" not in text and "CommClosedError: Stream is closed" in text


def test_other_errors_keep_their_traceback():
    text = _log_through_filter("Unexpected exception during heartbeat. Closing worker.",
                               ValueError("boom"))
    assert "Traceback" in text and "ValueError: boom" in text


def _handler_failure_through_filter(exc: BaseException, op: str, level: int) -> str:
    """What Dask's ``distributed.core`` logs when handler ``op`` raises ``exc``, through the
    filter, on a logger at ``level``."""
    out = io.StringIO()
    logger = logging.getLogger(f"test-refused-{id(out)}")
    logger.addHandler(logging.StreamHandler(out))
    logger.addFilter(RefusedRequestFilter())
    logger.setLevel(level)
    logger.propagate = False
    try:
        raise exc
    except type(exc):
        logger.exception("Exception while handling op %s", op)  # Dask's own words
    return out.getvalue()


def test_a_typed_answer_of_an_mdata_handler_is_one_info_line_and_nothing_at_warning():
    error = SourceNotFoundError("no jsonl files match '/data/nope/*.jsonl'", source="notes")
    text = _handler_failure_through_filter(error, "mdata_register_job", logging.INFO)
    assert text == ("mdata_register_job answered its caller with SourceNotFoundError: source "
                    "'notes': no jsonl files match '/data/nope/*.jsonl'\n")
    assert _handler_failure_through_filter(error, "mdata_register_job", logging.WARNING) == ""


def test_a_bug_in_a_handler_keeps_its_traceback():
    text = _handler_failure_through_filter(KeyError("oops"), "mdata_register_job", logging.WARNING)
    assert "Traceback" in text and "KeyError: 'oops'" in text
    text = _handler_failure_through_filter(PlanError("x"), "gather", logging.WARNING)
    assert "Traceback" in text  # not an mdata handler: Dask's business
