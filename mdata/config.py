"""mdata's configuration: a section of Dask's own configuration.

Using Dask's config (rather than a settings object of our own) means one mechanism for every
setting of a deployment: YAML files, ``dask.config.set`` in code, and ``DASK_MDATA__...``
environment variables that reach scheduler, worker and trainer processes alike. Values are read
when an object is built and passed down explicitly from there (no global lookups deep inside).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import dask.config
import yaml
from dask.utils import parse_timedelta

_DEFAULTS = Path(__file__).with_name("mdata.yaml")
with _DEFAULTS.open() as _f:
    _TREE: dict[str, Any] = yaml.safe_load(_f)
dask.config.update_defaults(_TREE)


def _keys(tree: dict[str, Any], prefix: str = "") -> set[str]:
    """Every dotted key of ``tree`` (``"trainer.timeout"``), and each section's own."""
    out: set[str] = set()
    for name, value in tree.items():
        key = f"{prefix}{name}"
        out.add(key)
        if isinstance(value, dict):
            out |= _keys(value, f"{key}.")
    return out


_KEYS = _keys(_TREE["mdata"])
_MISSING = object()


def _restore_defaults() -> None:
    """Put mdata's defaults back where a key is missing, never over a value someone set."""
    dask.config.update(dask.config.config, copy.deepcopy(_TREE), priority="old")


def get(key: str, default: Any = None) -> Any:
    """A raw value under ``mdata.``, e.g. ``get("trainer.prefetch")``.

    ``with dask.config.set({"mdata.x": ...})`` entered before this module was imported restores
    the ``mdata`` section on exit to what it was before the block, which drops the defaults
    merged inside it: the whole section when there was none, or all but what the environment set
    (``DASK_MDATA__...`` variables make a partial section before mdata is imported). A default
    key found missing is put back, so it never reads as None."""
    value = dask.config.get(f"mdata.{key}", default=_MISSING)
    if value is _MISSING and key in _KEYS:
        _restore_defaults()
        value = dask.config.get(f"mdata.{key}", default=_MISSING)
    return default if value is _MISSING else value


def seconds(key: str) -> float:
    """A duration under ``mdata.`` in seconds (accepts ``"120s"``, ``"5 minutes"``, numbers)."""
    return float(parse_timedelta(get(key), default="s"))
