"""A failed worker heartbeat logs one line with the error's text, not a traceback."""

from __future__ import annotations

import io
import logging

from workers.plugin import HeartbeatTracebackFilter


def _log_through_filter(message: str, exc: BaseException) -> str:
    out = io.StringIO()
    logger = logging.getLogger(f"test-heartbeat-{id(out)}")
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    logger.addFilter(HeartbeatTracebackFilter())
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


def test_other_errors_keep_their_traceback():
    text = _log_through_filter("Unexpected exception during heartbeat. Closing worker.",
                               ValueError("boom"))
    assert "Traceback" in text and "ValueError: boom" in text
