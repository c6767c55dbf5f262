"""What a plan is, written down canonically: its fingerprint, and the data identity of a job.

A fingerprint must mean the same thing in every process and every run, so it is a hash of a
canonical, JSON-safe description, never of ``repr()`` (a plain function's repr holds its memory
address). :func:`describe` writes any value that way: numbers, strings and containers as they are,
callables and classes by import path ``module:qualname``, dataclasses and objects by their class
path and fields, mixture schedules by their ``config()``.

The description of a plan has parts that a checkpoint treats differently (docs/concepts.md,
"Checkpoint and resume"):

- **data** (:class:`DataIdentity`): each source's name, URL, chunk rows and shard listing (names
  and row counts), the seed and the shuffle window. It decides which sample every cursor position
  names, so a checkpoint restores only onto the same data.
- **mixture**: the schedule's ``config()``; it may change on resume only when asked for.
- **placement**: batch shape, mesh, broadcast axis, cost model, special tokens; and **reading**:
  each source's format, fields and transform. They decide where samples go and what they hold,
  never which samples a step takes, so they may change on resume.

``Plan.fingerprint()`` hashes the whole description without listings (it works offline, in a
notebook); ``Plan.fingerprint(listings)`` is the job's full fingerprint, with them.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mdata.spec.sources import source_spec

__all__ = [
    "describe", "digest", "callable_path", "listing_entries", "SourceData", "DataIdentity",
    "plan_description", "plan_fingerprint",
]

_DEPTH = 8  # nesting followed by describe(); deeper values are named by their class only


def callable_path(obj: Any) -> str:
    """``module:qualname`` of a function, class or method (the same in every process)."""
    target = obj if isinstance(obj, type) or hasattr(obj, "__qualname__") else type(obj)
    module = getattr(target, "__module__", None) or "?"
    return f"{module}:{getattr(target, '__qualname__', type(target).__name__)}"


def describe(value: Any, _depth: int = 0) -> Any:
    """A canonical JSON-safe description of ``value``, with no memory addresses in it."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else repr(f)
    if isinstance(value, enum.Enum):
        return describe(value.value, _depth)
    if _depth >= _DEPTH:
        return {"type": callable_path(type(value))}
    deeper = _depth + 1
    if isinstance(value, Mapping):
        return {str(k): describe(v, deeper) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [describe(v, deeper) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((describe(v, deeper) for v in value), key=lambda d: json.dumps(d, sort_keys=True))
    if isinstance(value, np.ndarray):
        return describe(value.tolist(), deeper)
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return callable_path(value)  # functions, builtins, classes, bound methods
    func = getattr(value, "func", None)  # functools.partial
    if func is not None and hasattr(value, "args") and hasattr(value, "keywords"):
        return {"partial": describe(func, deeper), "args": describe(value.args, deeper),
                "keywords": describe(value.keywords, deeper)}
    config = getattr(value, "config", None)
    if callable(config) and not isinstance(value, type):
        try:
            return {"type": callable_path(type(value)), "config": describe(config(), deeper)}
        except Exception:  # noqa: BLE001 - a config() that needs arguments: describe the fields
            pass
    if dataclasses.is_dataclass(value):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {"type": callable_path(type(value)), "fields": describe(fields, deeper)}
    state = getattr(value, "__dict__", None)
    if isinstance(state, dict):
        public = {k: v for k, v in state.items() if not k.startswith("_")}
        return {"type": callable_path(type(value)), "fields": describe(public, deeper)}
    return {"type": callable_path(type(value))}


def digest(value: Any) -> str:
    """16 hex digits of the SHA-256 of ``value``'s canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def listing_entries(listing: Any) -> tuple[tuple[str, int], ...]:
    """``(shard name, rows)`` per shard from a listing in any of the shapes the Planner takes:
    ``[(name, rows), ...]`` (what the scheduler lists), a ``SourceListing`` (its paths), a
    ``SourceMetadata`` or plain row counts (shards named by position: ``#0``, ``#1``...)."""
    if hasattr(listing, "shards") and not isinstance(listing, Mapping):
        return tuple((str(s.path), int(s.num_rows)) for s in listing.shards)
    if hasattr(listing, "shard_rows"):
        return tuple((f"#{i}", int(n)) for i, n in enumerate(listing.shard_rows))
    items = list(listing.tolist() if isinstance(listing, np.ndarray) else listing)
    if items and isinstance(items[0], (list, tuple)):
        return tuple((str(name), int(rows)) for name, rows in items)
    return tuple((f"#{i}", int(n)) for i, n in enumerate(items))


@dataclass(frozen=True)
class SourceData:
    """One source's part of the data identity. ``listing`` is the digest of its ``(shard name,
    rows)`` entries, ``shards``/``rows`` their count and sum (all None offline, without a listing);
    ``appended``: the growths of its listing a resume accepted (see :mod:`mdata.order`)."""

    name: str
    url: str | None
    chunk_rows: int
    shards: int | None = None
    rows: int | None = None
    listing: str | None = None
    appended: tuple[tuple[int, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe; a URL (None for a source given by name only) and growths only when set."""
        out: dict[str, Any] = {"chunk_rows": self.chunk_rows, "shards": self.shards,
                               "rows": self.rows, "listing": self.listing}
        if self.url is not None:
            out["url"] = self.url
        if self.appended:
            out["appended"] = [list(a) for a in self.appended]
        return out

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> "SourceData":
        def opt_int(key: str) -> int | None:
            return None if data.get(key) is None else int(data[key])

        return cls(str(name), None if data.get("url") is None else str(data["url"]),
                   int(data["chunk_rows"]), opt_int("shards"), opt_int("rows"),
                   None if data.get("listing") is None else str(data["listing"]),
                   tuple((int(e), int(s)) for e, s in data.get("appended", ())))


@dataclass(frozen=True)
class DataIdentity:
    """What decides which sample each cursor position names (see the module docstring)."""

    sources: tuple[SourceData, ...]
    seed: int
    shuffle_chunks: int

    @classmethod
    def of(cls, plan: Any, listings: Mapping[str, Any] | None = None,
           appended: Mapping[str, Sequence[tuple[int, int]]] | None = None) -> "DataIdentity":
        """The data identity of ``plan`` (with ``listings``: the job's; without: offline)."""
        out = []
        for name, src in zip(plan.source_names, plan.sources):
            url = None if isinstance(src, str) else str(getattr(src, "url", None) or "") or None
            entry = SourceData(name, url, int(plan.chunk_rows(name)),
                               appended=tuple(tuple(a) for a in (appended or {}).get(name, ())))
            if listings is not None:
                entries = listing_entries(listings[name])
                entry = dataclasses.replace(entry, shards=len(entries),
                                            rows=sum(r for _, r in entries),
                                            listing=digest([list(e) for e in entries]))
            out.append(entry)
        return cls(tuple(out), int(plan.seed_value), int(plan.shuffle_chunks))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sources)

    def source(self, name: str) -> SourceData | None:
        return next((s for s in self.sources if s.name == name), None)

    def fingerprint(self) -> str:
        """16 hex digits over everything here, the order of the sources included."""
        return digest({"order": list(self.names), **self.to_dict(with_fingerprint=False)})

    def to_dict(self, *, with_fingerprint: bool = True) -> dict[str, Any]:
        """JSON-safe; the sources' order is not kept (a checkpoint lists it already)."""
        out: dict[str, Any] = {
            "seed": self.seed, "shuffle_chunks": self.shuffle_chunks,
            "sources": {s.name: s.to_dict() for s in self.sources},
        }
        if with_fingerprint:
            out["fingerprint"] = self.fingerprint()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], order: Sequence[str]) -> "DataIdentity":
        """Rebuild from :meth:`to_dict`, sources in ``order``."""
        sources = data["sources"]
        return cls(tuple(SourceData.from_dict(n, sources[n]) for n in order),
                   int(data["seed"]), int(data["shuffle_chunks"]))


def plan_description(plan: Any) -> dict[str, Any]:
    """The canonical description of ``plan`` (see the module docstring), listings left out."""
    from mdata.errors import PlanError

    try:
        mixture = describe(plan.mixture.config())
    except PlanError:
        mixture = None
    try:
        b = plan.balance_spec
        balance: Any = [b.micro_batches, b.max_tokens, b.global_batch]
    except PlanError:
        balance = None
    mesh = plan.mesh
    reading = {name: _reading(src) for name, src in zip(plan.source_names, plan.sources)
               if not isinstance(src, str)}
    return {
        "data": DataIdentity.of(plan).to_dict(with_fingerprint=False),
        "mixture": mixture,
        "placement": {
            "balance": balance,
            "mesh": [mesh.dp, mesh.pp, mesh.cp, mesh.tp, mesh.order],
            "broadcast": plan.broadcast,
            "cost": describe(plan.cost_model),
            "special_tokens": [plan.pad_id, plan.image_token_id],
        },
        "reading": reading,
    }


def _reading(src: Any) -> dict[str, Any]:
    """How a source is read, described through its spec (mdata.spec), so that a client's
    ``Source`` and the scheduler's ``SourceSpec`` of it (transform as a reference) agree."""
    from mdata.errors import PlanError

    try:
        spec = source_spec(src).to_dict()
    except PlanError:  # a transform no spec can name (a lambda...): such a plan is never sent
        spec = {k: getattr(src, k, None) for k in ("format", "fields", "transform", "max_tokens",
                                                  "skip_tolerance")}
    return {k: describe(spec[k]) for k in ("format", "fields", "transform", "max_tokens",
                                           "skip_tolerance")}


def plan_fingerprint(plan: Any, listings: Mapping[str, Any] | None = None) -> str:
    """16 hex digits: the plan's description, plus each source's listing when given."""
    description = plan_description(plan)
    if listings is not None:
        description["listings"] = DataIdentity.of(plan, listings).fingerprint()
    return digest(description)
