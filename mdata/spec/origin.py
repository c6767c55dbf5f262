"""Where a plan spec came from, so that what is wrong in it is said where the user can fix it.

A spec that crossed the wire was written by ``Plan.to_spec()``: its errors name the source or the
setting. A spec read from a plan file was written by a person: its errors and warnings also name
the file and, for YAML, the line of the key at fault (``plan file 'job.yaml', line 7``).
:class:`SpecOrigin` holds both; :func:`yaml_lines` reads the lines from the YAML node tree
(``yaml.safe_load`` keeps none).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import yaml

from mdata.errors import MeshError, PlanError

__all__ = ["SpecOrigin", "yaml_lines"]

Path = tuple[Any, ...]  # keys and list indices from the spec's top: ("sources", 1, "chunk_rows")


@dataclass(frozen=True)
class SpecOrigin:
    """The file a spec was read from (None: built in memory or received) and, for YAML, the line
    (1-based) of every key and list item, by its path from the spec's top."""

    path: str | None = None
    lines: Mapping[Path, int] = field(default_factory=dict)

    def at(self, *keys: Any) -> str:
        """``plan file 'job.yaml', line 7`` for the nearest line of ``keys`` known (the key
        itself, else its closest parent); ``plan file 'job.yaml'`` without lines; "" in memory."""
        if self.path is None:
            return ""
        for end in range(len(keys), 0, -1):
            line = self.lines.get(tuple(keys[:end]))
            if line is not None:
                return f"plan file {self.path!r}, line {line}"
        return f"plan file {self.path!r}"

    def prefix(self, *keys: Any) -> str:
        """:meth:`at` followed by ``": "``, or "" in memory: what a message starts with."""
        where = self.at(*keys)
        return f"{where}: " if where else ""

    @contextmanager
    def about(self, *keys: Any) -> Iterator[None]:
        """Errors raised inside, by reading the setting at ``keys``, name this file and line.

        Only plain :class:`PlanError` and :class:`MeshError` are re-raised with the place: other
        errors carry fields (a source, a shard) that a new message must not lose."""
        try:
            yield
        except (PlanError, MeshError) as exc:
            if self.path is None or type(exc) not in (PlanError, MeshError) or str(exc).startswith("plan file "):
                raise
            raise type(exc)(f"{self.prefix(*keys)}{exc}") from None


def yaml_lines(text: str) -> dict[Path, int]:
    """The 1-based line of every mapping key and sequence item of the YAML document ``text``;
    {} when it does not compose (the loader's own error then says why)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    lines: dict[Path, int] = {}
    _walk(root, (), lines, depth=0)
    return lines


def _walk(node: Any, path: Path, lines: dict[Path, int], depth: int) -> None:
    if depth > 8:  # a plan's keys are shallow; transforms' arguments need no lines
        return
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                here = (*path, key.value)
                lines.setdefault(here, key.start_mark.line + 1)
                _walk(value, here, lines, depth + 1)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.setdefault((*path, i), item.start_mark.line + 1)
            _walk(item, (*path, i), lines, depth + 1)
