"""What runs inside mdata's Dask workers: load tasks, row and batch serving, batch construction.

Installed beside ``mdata`` by the distribution mdata-orchestrator. ``workers`` is a generic name,
so importing it checks that this package and the ``mdata`` it imports belong together
(:mod:`mdata.distribution` says why and how).
"""

__shipped_with_mdata__ = True  # mdata.distribution.MARKER: this is mdata's `workers`

from mdata.distribution import check_runtime_packages  # noqa: E402  (the marker comes first)

check_runtime_packages("workers")
