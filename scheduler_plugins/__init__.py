"""What runs inside the Dask scheduler: the Planner plugin, dashboard pages, JSON routes.

Installed beside ``mdata`` by the distribution mdata-orchestrator. ``scheduler_plugins`` and
``workers`` are generic names, so importing this package checks that both are the ones shipped
with the ``mdata`` in use: where they come from before ``workers`` runs, then that what ran is
mdata's (:mod:`mdata.distribution` says why and how).
"""

__shipped_with_mdata__ = True  # mdata.distribution.MARKER: this is mdata's `scheduler_plugins`

from mdata.distribution import check_runtime_packages  # noqa: E402  (the marker comes first)

check_runtime_packages("scheduler_plugins", "workers")
import workers  # noqa: E402,F401  the Planner's tasks and worker plugin live there

check_runtime_packages("workers")  # its files, not only its folder, are mdata's
