"""The plan spec's schema version: written into every spec, checked when one is read.

Bump :data:`SCHEMA_VERSION` when a key changes meaning or a required key appears, and keep reading
the older versions (docs/plan-files.md lists what each version added).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mdata.errors import PlanError

__all__ = ["SCHEMA_KEY", "SCHEMA_VERSION", "check_version"]

#: The key that marks a mapping as an mdata plan spec, and holds its schema version.
SCHEMA_KEY = "mdata_plan"
SCHEMA_VERSION = 1


def check_version(spec: Mapping[str, Any]) -> int:
    """The spec's schema version (the current one when the key is left out of a hand-written
    file); PlanError for a version this mdata cannot read."""
    version = spec.get(SCHEMA_KEY, SCHEMA_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise PlanError(
            f"plan spec version {version!r} is not one this mdata reads (1..{SCHEMA_VERSION}); "
            "a newer mdata wrote it: upgrade mdata where the plan is read"
        )
    return version
