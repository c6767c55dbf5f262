"""Shared pytest fixtures for the whole suite."""

from fixtures_corpus import example_corpus  # noqa: F401  (the small example corpus, built once per session)
from fixtures_sources import moto_s3, store  # noqa: F401  (sources: real text, images, 4 stores)


def pytest_collection_modifyitems(config, items):
    """Cases marked ``slow`` run only when asked for (``pytest -m slow``): the default run, which
    CI makes, stays within its time budget and free of cases that need more of the machine."""
    import pytest

    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with `pytest -m slow`")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    """Ctrl-C reaches the processes the tests start. A suite started in the background by a
    non-interactive shell (``cmd &``, ``nohup``, some CI runners) inherits SIGINT *ignored*, and
    every ``mdata cluster up`` it starts inherits that too, so the tests' Ctrl-C (how a user
    stops it) never arrived and each such test waited out its minute. With a handler here, a
    child starts with SIGINT at its default again (an exec resets handled signals, never ignored
    ones), as from a terminal."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
