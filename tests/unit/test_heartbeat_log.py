"""A failed worker heartbeat logs one line with the error's text, not a traceback."""

from __future__ import annotations

import io
import logging

from distributed.comm.core import CommClosedError

from workers.plugin import ClosedCommTracebackFilter


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
