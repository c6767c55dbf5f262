"""Compatibility alias: a layout's deployment texts live in :mod:`mdata.pools.layout_text`
(its table in :mod:`mdata.pools.layout`). Kept so that
``from mdata.pool_layout_text import dask_worker_commands`` in existing scripts keeps working;
new code imports from :mod:`mdata.pools`."""

from mdata.pools.layout import layout_table
from mdata.pools.layout_text import TLS_MOUNT, dask_worker_commands, kubernetes_manifest, tls_options

__all__ = ["layout_table", "dask_worker_commands", "kubernetes_manifest", "tls_options", "TLS_MOUNT"]
