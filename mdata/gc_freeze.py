"""Keeping Python's full garbage collections off the event loops of the scheduler and workers.

A full (generation 2) collection walks every object the collector tracks, holding the GIL the
whole time, in whichever thread happened to trigger it: the event loop stops serving trainers
for as long as it takes. In a scheduler process that is mostly objects that live as long as the
process: the modules Dask, Bokeh, pandas and pyarrow import, the Planner's handlers, each job's
plan, listings and metadata. Measured on the embedded cluster's scheduler (157k tracked objects):
one full collection took 80-95 ms; after :func:`freeze_long_lived`, 0.3 ms. Full collections come
every few tens of thousands of surviving allocations, so without this every few seconds of a
busy scheduler one step of every rank waits that long.

:func:`freeze_long_lived` collects once (so what is garbage already is freed) and then moves every
object that survives into the collector's permanent generation (:func:`gc.freeze`), which later
collections do not walk. The Planner calls it when it starts and when a job has registered,
the two moments after which the objects alive are mostly the long-lived ones; mdata's worker
plugin when it is set up on a loader or constructor (whose event loop serves rows and batches). The price: a
frozen object that later becomes part of an unreachable *cycle* is never freed (objects freed by
their reference count, most of them, are freed as usual); at two calls per job that is bounded
by what was alive at those moments.

That price is only worth paying in a process that serves and nothing else. A driver that embeds
its cluster (the demo, a notebook, a test) runs the scheduler in its own process, beside the
user's objects, whose cycles must stay collectable. So ``mdata.gc-freeze: auto`` (the default)
freezes only in a dedicated process: one marked with :func:`dedicate_process` (``mdata cluster
up`` does), one the ``dask`` CLI started (``dask scheduler``, ``dask worker``), or a worker a
Nanny spawned. ``true`` freezes wherever it is called, ``false`` nowhere.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import sys
import time

__all__ = ["dedicate_process", "freeze_long_lived"]

logger = logging.getLogger("mdata")

_dedicated = False


def dedicate_process() -> None:
    """Say that this process only serves the cluster (no user objects beside it)."""
    global _dedicated
    _dedicated = True


def _is_dedicated() -> bool:
    if _dedicated or multiprocessing.parent_process() is not None:  # marked, or a Nanny's worker
        return True
    command = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return command in ("dask", "dask-scheduler", "dask-worker")


def freeze_long_lived(why: str) -> tuple[int, float]:
    """Collect, then freeze what survives (see the module docstring); returns the objects now
    frozen and the seconds it took; (0, 0.0) where ``mdata.gc-freeze`` says not to freeze here."""
    from mdata import config

    setting = config.get("gc-freeze")
    if setting is False or setting in ("false", "off") or (
            setting not in (True, "true", "on") and not _is_dedicated()):
        return 0, 0.0
    began = time.perf_counter()
    gc.collect()
    gc.freeze()
    spent = time.perf_counter() - began
    frozen = gc.get_freeze_count()
    logger.debug("mdata: %s: %d long-lived objects moved out of the collector's full "
                 "collections in %.0f ms", why, frozen, 1000 * spent)
    return frozen, spent
