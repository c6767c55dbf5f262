"""SourceSpec: one source of a plan as plain data, buildable into a Source where it is read.

A :class:`~mdata.sources.Source` holds its transform as an object, so building one imports the
transform's module. The scheduler must not (it never imports a client's code), yet it plans with
each source's name and chunk size; loaders build the real Source from this spec when a load task
or the registration's listing reaches them. So a plan read on the scheduler keeps its sources as
SourceSpec values: the same fields as Source, with the transform as a reference
(:mod:`mdata.spec.refs`), checked here only as far as that is possible without importing it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mdata.errors import PlanError
from mdata.sources.spec import ON_CORRUPT, Format
from mdata.spec.refs import Trust, check_plain, encode, is_reference, resolve

__all__ = ["SOURCE_KEYS", "SourceSpec", "source_spec"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
SOURCE_KEYS = ("name", "url", "format", "fields", "transform", "storage_options", "chunk_rows",
         "skip_tolerance", "max_tokens", "on_corrupt")
_DEFAULT_TRANSFORM = {"type": "mdata.sources.transforms:TokenizeText", "args": {}}


@dataclass(frozen=True)
class SourceSpec:
    """A source as plain data (the fields of :class:`~mdata.sources.Source`, transform by name)."""

    name: str
    url: str
    format: str = "parquet"
    fields: tuple[str, ...] = ()
    transform: Mapping[str, Any] = field(default_factory=lambda: dict(_DEFAULT_TRANSFORM), hash=False)
    storage_options: Mapping[str, Any] | None = field(default=None, hash=False)
    chunk_rows: int = 256
    skip_tolerance: float = 0.0
    max_tokens: int | None = None
    on_corrupt: str = "fail"

    def __post_init__(self) -> None:
        where = f"source {self.name!r}"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise PlanError(f"source name {self.name!r} must be a lowercase identifier like 'web_text'")
        if not isinstance(self.url, str) or not self.url:
            raise PlanError(f"{where}: url must be a non-empty string, got {self.url!r}")
        formats = [f.value for f in Format]
        if not isinstance(self.format, str) or self.format not in formats:
            raise PlanError(f"{where}: unknown format {self.format!r}; formats: {', '.join(formats)}")
        fields = self.fields
        if isinstance(fields, str) or not isinstance(fields, (list, tuple)) or not all(
                isinstance(f, str) for f in fields):
            raise PlanError(f"{where}: fields must be a list of column names, got {fields!r}")
        object.__setattr__(self, "fields", tuple(fields))
        if not is_reference(self.transform) or "args" not in self.transform:
            raise PlanError(
                f"{where}: transform must be {{'type': 'module:Class', 'args': {{...}}}}, got "
                f"{self.transform!r:.120}")
        check_plain(self.transform, f"{where}.transform")
        if self.storage_options is not None:
            if not isinstance(self.storage_options, Mapping):
                raise PlanError(f"{where}: storage_options must be a mapping or null")
            check_plain(self.storage_options, f"{where}.storage_options")
        rows = self.chunk_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise PlanError(f"{where}: chunk_rows must be an int >= 1, got {rows!r}")
        tol = self.skip_tolerance
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0.0 <= tol < 1.0:
            raise PlanError(f"{where}: skip_tolerance must be a fraction in [0, 1), got {tol!r}")
        object.__setattr__(self, "skip_tolerance", float(tol))
        cap = self.max_tokens
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise PlanError(f"{where}: max_tokens must be a positive int or null, got {cap!r}")
        if self.on_corrupt not in ON_CORRUPT:
            raise PlanError(f"{where}: on_corrupt must be one of {list(ON_CORRUPT)}, "
                            f"got {self.on_corrupt!r}")

    @property
    def transform_type(self) -> str:
        """The transform's ``module:Class`` (what a table shows)."""
        return str(self.transform["type"])

    @property
    def pool_resource(self) -> str:
        return f"pool_{self.name}"

    def to_dict(self) -> dict[str, Any]:
        """Plain data (every key written, so a file shows every setting)."""
        return {
            "name": self.name, "url": self.url, "format": self.format, "fields": list(self.fields),
            "transform": _plain(self.transform),
            "storage_options": None if self.storage_options is None else _plain(self.storage_options),
            "chunk_rows": self.chunk_rows, "skip_tolerance": self.skip_tolerance,
            "max_tokens": self.max_tokens, "on_corrupt": self.on_corrupt,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "source") -> "SourceSpec":
        """Read a source from plain data (a plan file's entry), checking every key; ``where``
        names it in errors (``sources[2]``), so a bad file says which entry is wrong."""
        if not isinstance(data, Mapping):
            raise PlanError(f"{where} must be a mapping of source settings, got {data!r:.80}")
        unknown = sorted(set(map(str, data)) - set(SOURCE_KEYS))
        if unknown:
            raise PlanError(f"{where} has unknown keys {unknown}; a source has {list(SOURCE_KEYS)}")
        for key in ("name", "url"):
            if key not in data:
                raise PlanError(f"{where} has no {key!r}")
        kwargs = {k: data[k] for k in SOURCE_KEYS if k in data}
        if isinstance(kwargs.get("fields"), list):
            kwargs["fields"] = tuple(kwargs["fields"])
        return cls(**kwargs)

    def key(self) -> str:
        """A stable text identity (for caches of built Sources)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def build(self, trust: Trust | None = None):
        """The :class:`~mdata.sources.Source` this spec describes: imports its transform."""
        from mdata.sources.spec import Source

        transform = resolve(dict(self.transform), trust or Trust(), f"transform of source {self.name!r}")
        return Source(self.name, self.url, format=self.format, fields=self.fields, transform=transform,
                      storage_options=None if self.storage_options is None else dict(self.storage_options),
                      chunk_rows=self.chunk_rows, skip_tolerance=self.skip_tolerance,
                      max_tokens=self.max_tokens, on_corrupt=self.on_corrupt)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def source_spec(source: Any) -> SourceSpec:
    """The SourceSpec of a :class:`~mdata.sources.Source` (or a SourceSpec, as it is)."""
    if isinstance(source, SourceSpec):
        return source
    from mdata.sources.spec import Source

    if not isinstance(source, Source):
        raise PlanError(
            f"source {getattr(source, 'name', source)!r} is a {type(source).__name__}: a plan spec "
            "describes Source values (mdata.sources.Source) or source names only")
    where = f"source {source.name!r}"
    options = source.storage_options
    return SourceSpec(
        name=source.name, url=source.url, format=source.format.value, fields=tuple(source.fields),
        transform=encode(source.transform, f"{where}.transform"),
        storage_options=None if options is None else encode(dict(options), f"{where}.storage_options"),
        chunk_rows=source.chunk_rows, skip_tolerance=source.skip_tolerance,
        max_tokens=source.max_tokens, on_corrupt=source.on_corrupt,
    )
