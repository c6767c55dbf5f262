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
