"""mdata's configuration: a section of Dask's own configuration.

Using Dask's config (rather than a settings object of our own) means one mechanism for every
setting of a deployment: YAML files, ``dask.config.set`` in code, and ``DASK_MDATA__...``
environment variables that reach scheduler, worker and trainer processes alike. Values are read
when an object is built and passed down explicitly from there (no global lookups deep inside).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dask.config
import yaml
from dask.utils import parse_timedelta

_DEFAULTS = Path(__file__).with_name("mdata.yaml")

def _load_defaults() -> None:
    with _DEFAULTS.open() as f:
        dask.config.update_defaults(yaml.safe_load(f))


_load_defaults()


def get(key: str, default: Any = None) -> Any:
    """A raw value under ``mdata.``, e.g. ``get("trainer.prefetch")``."""
    if "mdata" not in dask.config.config:
        # ``with dask.config.set({"mdata.x": ...})`` entered before this module was imported
        # deletes the whole ``mdata`` section on exit, defaults included: merge them back
        _load_defaults()
    return dask.config.get(f"mdata.{key}", default=default)


def seconds(key: str) -> float:
    """A duration under ``mdata.`` in seconds (accepts ``"120s"``, ``"5 minutes"``, numbers)."""
    return float(parse_timedelta(get(key), default="s"))
