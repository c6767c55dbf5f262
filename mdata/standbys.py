"""Compatibility alias: warm standby decisions live in :mod:`mdata.pools.standbys`. Kept so
that ``from mdata.standbys import StandbyBook`` keeps working; new code imports from
:mod:`mdata.pools`."""

from mdata.pools.standbys import (
    POOL_PREFIX, STANDBY_PREFIX, Role, RoleChange, StandbyBook, Warm, pool_resource, role_of,
    standby_resource,
)

__all__ = ["POOL_PREFIX", "STANDBY_PREFIX", "Role", "RoleChange", "Warm", "StandbyBook", "role_of",
           "pool_resource", "standby_resource"]
