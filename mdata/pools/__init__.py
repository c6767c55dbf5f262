"""Loader pools: how they are laid out before a run, sized while it runs, and kept warm.

- **Offline layout.** :func:`profile_sources` measures what one sample of each source costs a
  loader (:mod:`~mdata.pools.profiling`; the result is a :class:`Profile`,
  :mod:`~mdata.pools.profile`, with its progress bar in :mod:`~mdata.pools.profile_progress`);
  :func:`layout_for_plan` lays out which sources share a pool and how many workers and threads
  each runs (:mod:`~mdata.pools.layout`); :func:`dask_worker_commands` and
  :func:`kubernetes_manifest` print a layout for deployments beyond one machine
  (:mod:`~mdata.pools.layout_text`).
- **Online sizing.** The Planner's :class:`PoolSizer` decides each source's workers from
  measured demand, with hysteresis (:mod:`~mdata.pools.demand`); :func:`pool_targets` adds the
  decisions up per pool for the driver's autoscaler (:mod:`~mdata.pools.scaling`).
- **Warm standbys.** :class:`StandbyBook` decides which worker of a pool is a loader and which a
  standby, and who steps in when a loader is lost (:mod:`~mdata.pools.standbys`).

All pure: no Dask, no torch. The scheduler (``scheduler_plugins/standbys.py``), the driver
(:mod:`mdata.driver.autoscale`, :mod:`mdata.driver.cluster`) and the CLI carry the decisions out.
Names are imported on first use, as in :mod:`mdata.sources`: a loader worker that needs the
standbys' roles does not import the layout's arithmetic.
"""

from typing import TYPE_CHECKING

from mdata.lazy_exports import lazy_exports

#: Where each public name lives (imported on first use, PEP 562).
_HOMES = {
    "Profile": "profile",
    "SourceProfile": "profile",
    "default_profile_path": "profile",
    "profile_source": "profiling",
    "profile_sources": "profiling",
    "LayoutPool": "layout",
    "PoolLayout": "layout",
    "compute_layout": "layout",
    "fit_layout": "layout",
    "layout_for_plan": "layout",
    "dask_worker_commands": "layout_text",
    "kubernetes_manifest": "layout_text",
    "PoolSizer": "demand",
    "pool_targets": "scaling",
    "StandbyBook": "standbys",
}

if TYPE_CHECKING:
    from mdata.pools.demand import PoolSizer
    from mdata.pools.layout import LayoutPool, PoolLayout, compute_layout, fit_layout, layout_for_plan
    from mdata.pools.layout_text import dask_worker_commands, kubernetes_manifest
    from mdata.pools.profile import Profile, SourceProfile, default_profile_path
    from mdata.pools.profiling import profile_source, profile_sources
    from mdata.pools.scaling import pool_targets
    from mdata.pools.standbys import StandbyBook


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)


__all__ = sorted(_HOMES)
