"""The trainer-side checkpoint: tiny, versioned, and enough to replay the exact sample sequence.

Because every source's order is a pure function of the plan (see :mod:`mdata.order`) and the
mixture's counts come from a deterministic apportioner, the state of a job at step ``s`` is a
handful of numbers: each source's cursor, the apportioner's carries, the mixture policy's state
(and the weights it already decided for steps planned ahead), all tied to the plan's fingerprint.
The checkpoint describes what the trainers *consumed* (everything before ``step``), never how far
ahead loading ran, so restoring it on a fresh cluster yields the same samples from ``step`` on.

Version 2 adds what a resume checks (see :mod:`mdata.planner.resume`): ``data``, the job's
:class:`~mdata.identity.DataIdentity` (per source its URL, chunk rows and a digest of its shard
listing; the seed and shuffle window), ``schedule``, the mixture's ``config()``, and
``listings``, every shard's name and row count, so that a refusal can name the shard that
changed. Those are the same for every step of a job, so the checkpoint that travels with every
batch is the **light** form: it keeps of them only ``identity``, a digest of the data identity and
the mixture, and stays as small as the per-step state. The Loader learns the job's data once,
when it attaches, and hands out the full form from ``state_dict()``; ``JobHandle.checkpoint()``
returns the full form too. Version 1 checkpoints (no ``data``) are still read; they restore only
under the plan that wrote them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from mdata.errors import CheckpointError
from mdata.identity import DataIdentity, digest, listing_entries

__all__ = ["Checkpoint", "FORMAT_VERSION", "READABLE_VERSIONS"]

#: Bump when the meaning of a field changes; :meth:`Checkpoint.from_dict` refuses other versions.
FORMAT_VERSION = 2
#: Versions this mdata restores (1: no data identity; it restores under the same plan only).
READABLE_VERSIONS = (1, 2)


@dataclass(frozen=True)
class Checkpoint:
    """State of a job as of having consumed every step before ``step``.

    ``cursors``/``epochs``: per source, the position in its order and the epoch it is in.
    ``apportioner``: the carries of :class:`~mdata.mixing.ExactApportioner` before ``step``.
    ``mixture``: the schedule's ``state_dict``, the metrics history a metric policy sees, and the
    weights already decided for steps from ``step`` on (``pinned``, step -> weights in source
    order); empty for schedules that depend on the step alone.
    ``data``: the :class:`~mdata.identity.DataIdentity` as a dict; ``schedule``: the mixture's
    ``config()``; ``listings``: ``{source: [[shard name, rows], ...]}``; ``identity``: a digest of
    the data identity and the mixture (all four None in version 1; only ``identity`` is set in
    the light form, see the module docstring).
    """

    fingerprint: str
    step: int
    sources: tuple[str, ...]
    cursors: Mapping[str, int]
    epochs: Mapping[str, int]
    apportioner: Mapping[str, Any]
    seed: int
    mixture: Mapping[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION
    data: Mapping[str, Any] | None = None
    schedule: Mapping[str, Any] | None = None
    listings: Mapping[str, Any] | None = None
    identity: str | None = None

    @property
    def data_identity(self) -> DataIdentity | None:
        """The data the checkpoint was written for (None for version 1 and the light form)."""
        return None if self.data is None else DataIdentity.from_dict(self.data, self.sources)

    @property
    def is_light(self) -> bool:
        """True for the form that travels with batches (the job's data left out)."""
        return self.identity is not None and self.data is None

    def light(self) -> "Checkpoint":
        """The same checkpoint without what is the same for every step of the job."""
        return replace(self, data=None, schedule=None, listings=None)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (``json.dumps`` works on it as is)."""
        out = {
            "version": self.version,
            "fingerprint": self.fingerprint,
            "step": int(self.step),
            "sources": list(self.sources),
            "cursors": dict(zip(self.cursors, map(int, self.cursors.values()))),
            "epochs": dict(zip(self.epochs, map(int, self.epochs.values()))),
            "apportioner": _jsonable(self.apportioner),
            "seed": int(self.seed),
            "mixture": _jsonable(self.mixture),
        }
        for name in ("data", "schedule", "listings", "identity"):
            value = getattr(self, name)
            if value is not None:
                out[name] = _jsonable(value)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Checkpoint":
        """Rebuild from :meth:`to_dict`; raises :class:`CheckpointError` on another format."""
        if not isinstance(data, Mapping):
            raise CheckpointError(f"a checkpoint is a dict, got {type(data).__name__}")
        version = data.get("version")
        if version not in READABLE_VERSIONS:
            raise CheckpointError(
                f"checkpoint format version {version!r} is not supported (this mdata reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}); restore it with the mdata release that "
                "wrote it"
            )
        try:
            sources = tuple(str(s) for s in data["sources"])
            cursors = {str(k): int(v) for k, v in data["cursors"].items()}
            if set(cursors) != set(sources):
                raise CheckpointError(
                    f"checkpoint lists sources {list(sources)} but has cursors for {sorted(cursors)}"
                )
            ckpt = cls(
                fingerprint=str(data["fingerprint"]),
                step=int(data["step"]),
                sources=sources,
                cursors=cursors,
                epochs={str(k): int(v) for k, v in data["epochs"].items()},
                apportioner=dict(data["apportioner"]),
                seed=int(data["seed"]),
                mixture=dict(data.get("mixture", {})),
                version=int(version),
                data=None if data.get("data") is None else _jsonable(data["data"]),
                schedule=None if data.get("schedule") is None else _jsonable(data["schedule"]),
                listings=None if data.get("listings") is None else _jsonable(data["listings"]),
                identity=None if data.get("identity") is None else str(data["identity"]),
            )
            ckpt._check_data()
            return ckpt
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(
                f"checkpoint is corrupt or incomplete ({type(exc).__name__}: {exc}); it must come "
                "from Checkpoint.to_dict()"
            ) from None

    def to_json(self) -> str:
        """The checkpoint as JSON text (sorted keys: the same checkpoint, the same text)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Checkpoint":
        """Read what :meth:`to_json` wrote; text that is not a checkpoint is a CheckpointError."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"checkpoint is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def _check_data(self) -> None:
        """The data section names the checkpoint's sources, and listings match their digests."""
        if self.data is None:
            return  # version 1, or hand-made: it restores under the plan that wrote it only
        if set(self.data["sources"]) != set(self.sources):
            raise CheckpointError(
                f"checkpoint lists sources {list(self.sources)} but its data section describes "
                f"{sorted(self.data['sources'])}"
            )
        identity = self.data_identity  # KeyError/TypeError on a malformed section
        for name, entries in (self.listings or {}).items():
            src = identity.source(name)
            listing = [list(e) for e in listing_entries(entries)]
            if src is None or src.listing != digest(listing):
                raise CheckpointError(
                    f"the shard listing of source {name!r} in this checkpoint does not match the "
                    "digest it was written with; the checkpoint was edited or is corrupt"
                )

    def nbytes(self) -> int:
        """Size of the JSON form: what a trainer stores next to its model checkpoint."""
        return len(self.to_json().encode("utf-8"))


def _jsonable(value: Any) -> Any:
    """Round-trip through JSON so the stored form never shares mutable state with the caller.

    A checkpoint is built for every step the trainers may stop at, and its apportioner holds a
    float per source: values of plain JSON types (string keys; lists, tuples, str, int, float,
    bool, None) are copied as the round trip would give them, the rest goes through JSON."""
    plain = _plain_copy(value)
    return json.loads(json.dumps(value)) if plain is _NOT_PLAIN else plain


_NOT_PLAIN = object()
_SCALARS = (str, int, float, bool, type(None))


def _plain_copy(value: Any) -> Any:
    """A copy of ``value`` as ``json.loads(json.dumps(value))`` gives it, or ``_NOT_PLAIN``."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list or kind is tuple:
        if all(type(v) in _SCALARS for v in value):
            return list(value)
        out = [_plain_copy(v) for v in value]
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in out) else out
    if kind is dict:
        if not all(type(k) is str for k in value):
            return _NOT_PLAIN  # JSON turns other keys into strings
        out = {k: _plain_copy(v) for k, v in value.items()}
        return _NOT_PLAIN if any(v is _NOT_PLAIN for v in out.values()) else out
    return _NOT_PLAIN
