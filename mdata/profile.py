"""Compatibility alias: source profiles live in :mod:`mdata.pools.profile`, profiling in
:mod:`mdata.pools.profiling`. Kept so that ``from mdata.profile import profile_sources`` in
existing scripts and notebooks keeps working; new code imports from :mod:`mdata.pools`."""

from mdata.pools.profile import (
    PROFILE_VERSION, Profile, SourceProfile, default_profile_path, parallel_fraction,
)
from mdata.pools.profiling import profile_source, profile_sources

__all__ = ["PROFILE_VERSION", "Profile", "SourceProfile", "default_profile_path", "profile_source",
           "profile_sources", "parallel_fraction"]
