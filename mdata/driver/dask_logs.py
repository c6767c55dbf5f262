"""How much of Dask's own log a command that runs a cluster shows.

An embedded cluster's scheduler, nannies and workers log at INFO by default: dozens of lines for
every start and stop (workers registering, plugins loaded, comms closed), which bury what
``mdata demo`` and ``mdata cluster up`` print. Those commands keep Dask at WARNING unless asked
for more (``mdata cluster up -v`` / ``--log-level``); warnings and errors always show.
"""

from __future__ import annotations

import logging
import os

__all__ = ["LOG_LEVELS", "set_dask_log_level"]

LOG_LEVELS = ("debug", "info", "warning", "error")


def set_dask_log_level(level: str = "warning", *, force: bool = False) -> None:
    """Log Dask's ``distributed`` loggers (here and in the worker processes started from now on)
    and mdata's own at ``level``. Without ``force``, a ``DASK_LOGGING__DISTRIBUTED`` the user set
    wins; with it (a level asked for on the command line), ``level`` does."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r}: choose one of {list(LOG_LEVELS)}")
    import distributed  # noqa: F401  its import sets its loggers' levels: set ours after it
    if force:
        os.environ["DASK_LOGGING__DISTRIBUTED"] = level
    else:
        level = os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", level).lower()
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        return  # a level spelled in a way only Dask reads: leave this process to Dask's config
    logging.getLogger("distributed").setLevel(number)  # worker processes read the variable
    mdata = logging.getLogger("mdata")
    mdata.setLevel(number)
    if number < logging.WARNING and not mdata.handlers:  # INFO lines need a handler to show
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
        mdata.addHandler(handler)
