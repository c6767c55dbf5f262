"""Every import path the documentation gives users keeps working, moved modules included.

The flat ``mdata/`` modules of the pools, the lineage and the dashboard's meters moved into the
packages ``mdata.pools``, ``mdata.lineage`` and ``mdata.observe``. The paths README.md, docs/ and
the notebooks named before (and the API reference listed) stay as thin aliases of the new homes,
so scripts written against them run unchanged; the plan's modules (``mdata.plan``, ``mdata.mesh``,
``mdata.cost``...) stayed flat, since their class paths are written into plan specs and plan
fingerprints. ``tests/unit/test_docs_names.py`` checks that every name the pages mention today
resolves; this test pins the paths themselves, old and new, and that an alias hands out the very
objects of its new home (not copies that ``isinstance`` would tell apart).
"""

from __future__ import annotations

import importlib

import pytest

#: (documented module, names a user imports from it): README.md, docs/getting-started.md,
#: docs/recipes.md, docs/deploying.md, docs/dashboard.md, docs/concepts.md, notebooks/.
DOCUMENTED = [
    ("mdata", ("SampleId", "MdataError")),
    ("mdata.plan", ("Plan",)),
    ("mdata.mesh", ("ClientPlaceTree",)),
    ("mdata.cost", ("AttentionCost", "ImagePatchCost", "VideoCost", "CombinedCost")),
    ("mdata.module_cost", ("ModuleCost",)),
    ("mdata.mixing", ("LinearRamp", "StagedMixture")),
    ("mdata.metadata", ("SourceMetadata", "read_metadata")),
    ("mdata.errors", ("MdataError",)),
    ("mdata.config", ()),
    ("mdata.checkpoint", ("Checkpoint",)),
    ("mdata.sources", ("Source", "TokenizeText", "list_shards", "load_chunk", "RetryPolicy")),
    ("mdata.trainer", ("Loader",)),
    ("mdata.driver", ("start_cluster", "PoolSpec", "PoolAutoscaler", "JobHandle", "submit_job")),
    ("mdata.planner", ("simulate", "PlannerState")),
    ("mdata.balance", ("balance_step", "greedy_pack_baseline")),
    ("mdata.pools", ("Profile", "profile_sources", "layout_for_plan", "dask_worker_commands",
                     "kubernetes_manifest", "pool_targets", "StandbyBook", "PoolSizer")),
    ("mdata.lineage", ("SampleId", "DGraph", "LineageSegment", "ColumnTable")),
    ("mdata.observe", ("SourceMeter", "TrainerMeter", "LoadHistory", "DataWaitLedger", "page_urls")),
    # compatibility aliases of earlier homes
    ("mdata.client", ("Loader", "submit_job")),
    ("mdata.cluster", ("start_cluster", "PoolSpec", "PoolAutoscaler")),
]

#: (old path, its new home, the names it still exports): the aliases kept for moved modules.
MOVED = [
    ("mdata.pool_layout", "mdata.pools.layout",
     ("LayoutPool", "PoolLayout", "compute_layout", "fit_layout", "layout_for_plan", "peak_stage",
      "source_cost_class", "amdahl_speedup")),
    ("mdata.pool_layout_text", "mdata.pools.layout_text",
     ("dask_worker_commands", "kubernetes_manifest", "tls_options", "TLS_MOUNT")),
    ("mdata.pool_layout_text", "mdata.pools.layout", ("layout_table",)),
    ("mdata.profile", "mdata.pools.profile",
     ("PROFILE_VERSION", "Profile", "SourceProfile", "default_profile_path", "parallel_fraction")),
    ("mdata.profile", "mdata.pools.profiling", ("profile_source", "profile_sources")),
    ("mdata.pool_scaling", "mdata.pools.scaling",
     ("PoolDecision", "pool_targets", "merge_jobs", "as_decision")),
    ("mdata.standbys", "mdata.pools.standbys",
     ("POOL_PREFIX", "STANDBY_PREFIX", "Role", "RoleChange", "Warm", "StandbyBook", "role_of",
      "pool_resource", "standby_resource")),
    ("mdata.ids", "mdata.lineage.ids", ("SampleId",)),
    ("mdata.dashboard_pages", "mdata.observe.dashboard_pages",
     ("DashboardPage", "PAGES", "ROUTES", "dashboard_base", "page_urls", "page_lines")),
    ("mdata.observe", "mdata.observe.meters",
     ("SourceMeter", "SourceFigures", "LoadHistory", "TrainerMeter", "TrainerFigures")),
    ("mdata.lineage", "mdata.lineage.dgraph", ("DGraph", "ExactlyOnceReport")),
]


@pytest.mark.parametrize("module, names", DOCUMENTED, ids=[m for m, _ in DOCUMENTED])
def test_a_documented_import_works(module: str, names: tuple[str, ...]) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in names if not hasattr(imported, name)]
    assert not missing, f"from {module} import {', '.join(missing)} fails"


@pytest.mark.parametrize("old, new, names", MOVED, ids=[f"{o}->{n}" for o, n, _ in MOVED])
def test_an_old_path_hands_out_the_objects_of_its_new_home(old: str, new: str,
                                                           names: tuple[str, ...]) -> None:
    before, home = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(before, name) is getattr(home, name), f"{old}.{name} is not {new}.{name}"
    assert set(names) <= set(getattr(before, "__all__", names)), f"{old}.__all__ lost a name"


def test_submit_job_still_answers_where_it_lived_before_the_driver_had_it() -> None:
    """``submit_job`` moved from the trainer's loader module to :mod:`mdata.driver.submit`; the old
    module answers the name lazily (a trainer process never imports the driver for it)."""
    from mdata.driver import submit_job
    from mdata.trainer import loader

    assert loader.submit_job is submit_job


def test_the_plan_value_classes_keep_the_paths_plan_specs_name() -> None:
    """A plan spec names its cost model by ``module:Class`` and a plan's fingerprint hashes those
    paths: they must not move (docs/plan-files.md shows ``mdata.cost:AttentionCost``)."""
    from mdata.spec.refs import BUILTIN_REFERENCES

    for reference in BUILTIN_REFERENCES:
        module, _, name = reference.partition(":")
        obj = getattr(importlib.import_module(module), name)
        assert (obj.__module__, obj.__qualname__) == (module, name), reference
