"""A plan file's own folder: where its relative paths are read from, and where a module it names
beside it is imported from.

A plan file is written beside its data and its code and then read from anywhere: ``mdata plan show
docs/examples/text.yaml`` from the repository root, a notebook in another folder, a launcher with a
working directory of its own. A relative ``url`` in it therefore means relative to the file, the
way a script's own folder is where its imports start, never to the directory its reader happened
to start in (which is what fsspec would make of it). Reading a plan file turns every relative
local url into an absolute path under the file's folder, so the spec that travels to the scheduler
and the loaders means the same on every process, and checks that something is there: a relative
url that matches nothing fails at once, naming the plan file, the source and the folder it looked
in, instead of at registration on some loader.

URLs with a protocol (``s3://``, ``file://``, chained ``a::b``) and paths starting with ``/`` or
``~`` are taken as written and checked when the sources are listed (they may exist on the
loaders' hosts only).

A reference such as ``my_job:QATemplate`` whose top-level module is a file or package beside the
plan file gets the plan's folder appended to ``sys.path`` (appended: an installed module of the
same name still wins), so ``job.yaml`` beside ``my_job.py`` imports wherever it is read from. The
embedded cluster ``mdata cluster up`` starts inherits that path; the loaders' own trust rule
(``mdata.workers.trusted-modules``) is unchanged.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from mdata.errors import SourceNotFoundError

__all__ = ["is_relative_path", "plan_relative_spec", "referenced_modules"]

_GLOB_CHARS = "*?["


def is_relative_path(url: str) -> bool:
    """True for a local path that is relative (no protocol, not absolute, not ``~``)."""
    return not ("://" in url or "::" in url or url.startswith(("/", "~")) or os.path.isabs(url))


def plan_relative_spec(spec: dict[str, Any], plan_file: str | os.PathLike[str]) -> dict[str, Any]:
    """``spec`` (read from ``plan_file``) with its relative source urls made absolute under the plan
    file's folder, after checking each matches something there; the folder goes on ``sys.path``
    when a module the spec names lies in it.

    Entries that are not well-formed sources are left as they are: the spec's own validation
    names what is wrong with them.
    """
    folder = Path(plan_file).resolve().parent
    sources = spec.get("sources")
    if isinstance(sources, list):
        spec = {**spec, "sources": [_resolved(entry, folder, plan_file) for entry in sources]}
    if any(_beside(name, folder) for name in referenced_modules(spec)) and str(folder) not in sys.path:
        sys.path.append(str(folder))
    return spec


def _resolved(entry: Any, folder: Path, plan_file: str | os.PathLike[str]) -> Any:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("url"), str) or not entry["url"]:
        return entry
    url = entry["url"]
    if not is_relative_path(url):
        return entry
    path = os.path.normpath(folder / url)
    if not _matches(path):
        looked_in = _fixed_folder(path)
        where = (f"which matches nothing in {looked_in}" if os.path.isdir(looked_in)
                 else f"and {looked_in} does not exist")
        raise SourceNotFoundError(
            f"plan file {str(plan_file)!r} names {url!r}, {where}",
            source=str(entry.get("name")),
            hint=f"a relative url is read from the plan file's folder, {folder}")
    return {**entry, "url": path}


def _matches(path: str) -> bool:
    if any(c in path for c in _GLOB_CHARS):
        return any(True for _ in glob.iglob(path, recursive=True))
    return os.path.exists(path)


def _fixed_folder(path: str) -> str:
    """The deepest folder of ``path`` before its first glob character (where a listing looks)."""
    parts = Path(path).parts
    for i, part in enumerate(parts):
        if any(c in part for c in _GLOB_CHARS):
            return str(Path(*parts[:i]))
    return str(Path(path).parent)


def referenced_modules(spec: Any) -> Iterator[str]:
    """The top-level module of every ``module:Name`` reference anywhere in ``spec``."""
    if isinstance(spec, Mapping):
        kind = spec.get("type")
        if isinstance(kind, str) and ":" in kind:
            yield kind.split(":", 1)[0].split(".", 1)[0]
        for value in spec.values():
            yield from referenced_modules(value)
    elif isinstance(spec, (list, tuple)):
        for value in spec:
            yield from referenced_modules(value)


def _beside(module: str, folder: Path) -> bool:
    return bool(module) and ((folder / f"{module}.py").is_file()
                             or (folder / module / "__init__.py").is_file())
