"""Where mdata freezes long-lived objects out of Python's full garbage collections (mdata.gc_freeze).

Freezing pays off in a process that only serves, but would keep a driver's own cyclic garbage
alive for good, so ``auto`` must tell the two apart; these cases pin the decision, and that a
freeze does move the objects alive out of the collector's generations.
"""

from __future__ import annotations

import gc

import dask
import pytest

from mdata import gc_freeze


@pytest.fixture(autouse=True)
def _restore(monkeypatch):
    monkeypatch.setattr(gc_freeze, "_dedicated", False)
    yield
    gc.unfreeze()  # the test process is not one that only serves


def test_auto_leaves_a_driver_process_alone():
    # pytest's process is a driver: not marked, not a Nanny's child, not the dask CLI
    assert not gc_freeze._is_dedicated()
    assert gc_freeze.freeze_long_lived("test") == (0, 0.0)
    assert gc.get_freeze_count() == 0


def test_auto_freezes_a_process_that_only_serves():
    gc_freeze.dedicate_process()
    frozen, _ = gc_freeze.freeze_long_lived("test")
    # every module object alive here, at least; a frozen object freed since (another thread of
    # the test process) leaves the count, so it may have dropped a little, never grown
    assert frozen >= gc.get_freeze_count() > 1000
    assert len(gc.get_objects()) < frozen  # what full collections still walk is what came after


@pytest.mark.parametrize("setting, dedicated, freezes", [
    (True, False, True), ("true", False, True), (False, True, False), ("false", True, False),
    ("auto", True, True), ("auto", False, False)])
def test_the_setting_decides(setting, dedicated, freezes):
    if dedicated:
        gc_freeze.dedicate_process()
    with dask.config.set({"mdata.gc-freeze": setting}):
        frozen, _ = gc_freeze.freeze_long_lived("test")
    assert (frozen > 0) is freezes


def test_the_dask_cli_counts_as_a_process_that_only_serves(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/venv/bin/dask", "scheduler", "--preload", "scheduler_plugins.planner"])
    assert gc_freeze._is_dedicated()
    monkeypatch.setattr("sys.argv", ["/venv/bin/python", "train.py"])
    assert not gc_freeze._is_dedicated()
