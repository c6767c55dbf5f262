"""Plan files: the plan spec as YAML (or JSON), for ``mdata plan``, ``mdata cluster up --plan`` and
for keeping a job's plan beside its code. The schema is docs/plan-files.md.

YAML is read with ``yaml.safe_load``, which builds plain data only; the spec's references are
imported afterwards by :func:`~mdata.spec.plan_spec.plan_from_spec`, so a plan file names code to
import just like a Python script would: read plan files you trust.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from mdata.errors import PlanError
from mdata.spec.origin import SpecOrigin, yaml_lines
from mdata.spec.plan_paths import plan_relative_spec

__all__ = ["read_plan_file", "read_spec", "write_spec"]

_HEADER = ("# An mdata plan (schema: docs/plan-files.md). Load it with Plan.from_file(path),\n"
           "# `mdata plan show PATH`, or serve it with `mdata cluster up --plan PATH`.\n")


def _is_json(path: Path) -> bool:
    return path.suffix.lower() == ".json"


def write_spec(spec: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write ``spec`` to ``path``: JSON for a ``.json`` name, YAML otherwise."""
    path = Path(path)
    if _is_json(path):
        text = json.dumps(spec, indent=2) + "\n"
    else:
        text = _HEADER + yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, width=100)
    path.write_text(text, encoding="utf-8")
    return path


def read_spec(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The spec in the YAML or JSON file at ``path`` (PlanError naming the file when it is not one),
    its relative source urls made absolute under the file's folder (a SourceNotFoundError naming
    the file and that folder when one matches nothing there)."""
    return read_plan_file(path)[0]


def read_plan_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any], SpecOrigin]:
    """:func:`read_spec`'s spec and where it came from: the file, and for YAML the line of each
    key, so that what is wrong in it is reported at its line (``Plan.from_spec(spec, origin=origin)``)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"cannot read plan file {str(path)!r}: {exc}") from None
    try:
        data = json.loads(text) if _is_json(path) else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise PlanError(f"plan file {str(path)!r} is not valid {'JSON' if _is_json(path) else 'YAML'}: "
                        f"{exc}") from None
    if not isinstance(data, dict):
        raise PlanError(f"plan file {str(path)!r} holds a {type(data).__name__}, not a plan mapping")
    return plan_relative_spec(data, path), SpecOrigin(str(path), {} if _is_json(path) else yaml_lines(text))
