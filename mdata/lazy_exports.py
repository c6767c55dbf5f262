"""Package ``__init__`` modules that name their public objects without importing every module.

``import mdata.sources`` (or ``mdata.pools``, ``mdata.lineage``, ``mdata.observe``) should cost
only what the caller uses: a loader worker that reads Parquet never loads the video decoder, a
trainer never loads the pools' profiler. Each such package keeps a table of where each public name
lives and hands it to :func:`lazy_exports`, which gives the module-level ``__getattr__`` and
``__dir__`` of PEP 562: a name is imported from its home on first use, then cached on the package.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: Mapping[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose public names live in the submodules
    ``homes`` names (``{"DGraph": "dgraph"}``: ``package.dgraph.DGraph``)."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(f"{package}.{home}"), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes})

    return __getattr__, __dir__
