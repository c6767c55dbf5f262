"""What mdata is installed as: its distribution's name, its extras, and the two Dask-side
packages that come with it, checked to be the ones this ``mdata`` shipped with.

mdata installs from the distribution ``mdata-orchestrator`` (``mdata`` on the public package index
is another project) as three top-level import packages side by side: ``mdata`` (the user API and
the pure core), ``scheduler_plugins`` (the Planner, which ``dask scheduler --preload
scheduler_plugins.planner`` imports) and ``workers`` (what Dask workers run: mdata's worker plugin
and task functions, which reach them pickled by reference, as ``workers.loader.load_chunk_task``).

Those two names are generic: an unrelated distribution called ``workers`` exists on the index, and
any project may have a ``workers/`` folder on ``sys.path`` (the current directory of ``python -m``,
a ``PYTHONPATH`` entry). Python imports the first ``workers`` it finds, and an editable install
resolves its packages only after everything on ``sys.path``. A foreign package imported in their
place would fail far from its cause (``No module named 'workers.loader'`` in a worker's log), or
run someone else's code.

So every entry into them checks, and fails with :class:`~mdata.errors.PackageShadowedError`
naming both locations: ``scheduler_plugins`` and ``workers`` check on import that they and their
sibling lie beside the ``mdata`` they import (before the sibling's code runs) and, once imported,
carry :data:`MARKER` (a distribution installed over them replaces their ``__init__``); the driver
checks before it starts a cluster; and the worker plugin travels pickled as a call to
:func:`shipped_object`, which checks on the worker before anything imports ``workers`` there.

Why a check and not mdata-specific import names (``package-dir`` mapping, say ``mdata_workers``
for the ``workers/`` folder): a mapped name exists only in an install, so a checkout run from its
source tree (``PYTHONPATH=$PWD``, as the suite and every worktree run) would import the mapped
packages of whatever other copy is installed, silently. Why not pin our copy whatever is on
``sys.path`` (a finder of our own): it would change which module a plain ``import workers`` gives
every other library in the process. Failing clearly, before running foreign code, keeps Python's
import rules and tells the user which folder or distribution to move.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from mdata.errors import PackageShadowedError

__all__ = ["DISTRIBUTION", "EXTRAS", "RUNTIME_PACKAGES", "MARKER", "install_hint",
           "check_runtime_packages", "shipped_object"]

#: The distribution's name on a package index (``pip install mdata-orchestrator``).
DISTRIBUTION = "mdata-orchestrator"

#: The extras a user may install, and what each brings (docs/getting-started.md, "Install").
EXTRAS = {
    "s3": "s3:// sources and lineage spill (s3fs)",
    "images": "image-caption sources and the example corpus's photos (Pillow)",
    "video": "the decoder video sources will use (PyAV); video sources are not built yet",
    "plots": "`mdata plan simulate --plots DIR` (matplotlib)",
    "dashboard": "mdata's pages on the Dask dashboard (Bokeh)",
    "dev": "the test suite's tools, and every extra above but video",
}

#: The Dask-side top-level packages installed beside ``mdata`` by the same distribution.
RUNTIME_PACKAGES = ("scheduler_plugins", "workers")

#: The module attribute by which ``scheduler_plugins`` and ``workers`` say they are mdata's.
MARKER = "__shipped_with_mdata__"


def install_hint(extra: str) -> str:
    """The command that installs one extra, for error messages: ``pip install 'mdata-orchestrator[s3]'``."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; mdata's extras are {sorted(EXTRAS)}")
    return f"pip install '{DISTRIBUTION}[{extra}]'"


def _home() -> Path:
    """The folder that holds the ``mdata`` package in use (site-packages, or a checkout)."""
    return Path(sys.modules["mdata"].__file__).resolve().parent.parent


def _found_at(name: str) -> tuple[Path | None, bool | None]:
    """Where ``import name`` takes (or took) the package from, without importing it, and whether
    it carries :data:`MARKER` (``None`` when not imported yet: its code has not run)."""
    module = sys.modules.get(name)
    if module is not None:
        origin = getattr(module, "__file__", None)
        return (Path(origin).resolve() if origin else None), getattr(module, MARKER, False) is True
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin in (None, "namespace"):
        return None, None
    return Path(spec.origin).resolve(), None


def check_runtime_packages(*names: str) -> None:
    """Fail with :class:`PackageShadowedError` unless each of ``names`` (default: both runtime
    packages) is, or will be, imported from the folder beside this ``mdata`` and is mdata's own.

    Imports nothing itself: a package not imported yet is located with ``find_spec``.
    """
    home = _home()
    for name in names or RUNTIME_PACKAGES:
        if name not in RUNTIME_PACKAGES:
            raise ValueError(f"{name!r} is not one of mdata's runtime packages {RUNTIME_PACKAGES}")
        expected = home / name / "__init__.py"
        found, marked = _found_at(name)
        if found == expected and marked is not False:
            continue
        if found is None:
            what, fix = "is not importable", f"reinstall {DISTRIBUTION}"
        elif found != expected:
            what = f"is found at {found} first"
            fix = (f"take the folder that holds that {name!r} off sys.path or PYTHONPATH, or "
                   f"uninstall the distribution that installed it")
        else:
            what = f"at {found} is not mdata's: another distribution replaced its files"
            fix = f"uninstall the other distribution that installs {name!r}, then reinstall {DISTRIBUTION}"
        raise PackageShadowedError(
            f"the package {name!r} {what}, but the mdata in use ({home / 'mdata'}) ships its "
            f"own at {expected}, and mdata runs only with its own ({fix})",
            name=name, path=str(found) if found else None,
        )


def shipped_object(module: str, attribute: str, *args: Any) -> Any:
    """``module.attribute(*args)`` after :func:`check_runtime_packages` on its top-level package.

    A pickled object reduced to a call of this function (the worker plugin is) checks where its
    code comes from on the process that unpickles it, before that process imports the module.
    """
    top = module.partition(".")[0]
    if top in RUNTIME_PACKAGES:
        check_runtime_packages(top)  # where it comes from, before its code runs
    imported = importlib.import_module(module)
    if top in RUNTIME_PACKAGES:
        check_runtime_packages(top)  # and that the package that ran is mdata's own
    return getattr(imported, attribute)(*args)
