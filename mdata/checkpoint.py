"""The trainer-side checkpoint: tiny, versioned, and enough to replay the exact sample sequence.

Because every source's order is a pure function of the plan (see :mod:`mdata.order`) and the
mixture's counts come from a deterministic apportioner, the state of a job at step ``s`` is a
handful of numbers: each source's cursor, the apportioner's carries, the mixture policy's state
(and the weights it already decided for steps planned ahead), all tied to the plan's fingerprint.
The checkpoint describes what the trainers *consumed* (everything before ``step``), never how far
ahead loading ran, so restoring it on a fresh cluster yields the same samples from ``step`` on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mdata.errors import CheckpointError

__all__ = ["Checkpoint", "FORMAT_VERSION"]

#: Bump when the meaning of a field changes; :meth:`Checkpoint.from_dict` refuses other versions.
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    """State of a job as of having consumed every step before ``step``.

    ``cursors``/``epochs``: per source, the position in its order and the epoch it is in.
    ``apportioner``: the carries of :class:`~mdata.mixing.ExactApportioner` before ``step``.
    ``mixture``: the schedule's ``state_dict``, the metrics history a metric policy sees, and the
    weights already decided for steps from ``step`` on (``pinned``, step -> weights in source
    order); empty for schedules that depend on the step alone.
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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (``json.dumps`` works on it as is)."""
        return {
            "version": self.version,
            "fingerprint": self.fingerprint,
            "step": int(self.step),
            "sources": list(self.sources),
            "cursors": {k: int(v) for k, v in self.cursors.items()},
            "epochs": {k: int(v) for k, v in self.epochs.items()},
            "apportioner": _jsonable(self.apportioner),
            "seed": int(self.seed),
            "mixture": _jsonable(self.mixture),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Checkpoint":
        """Rebuild from :meth:`to_dict`; raises :class:`CheckpointError` on another format."""
        if not isinstance(data, Mapping):
            raise CheckpointError(f"a checkpoint is a dict, got {type(data).__name__}")
        version = data.get("version")
        if version != FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint format version {version!r} is not supported (this mdata reads version "
                f"{FORMAT_VERSION}); restore it with the mdata release that wrote it"
            )
        try:
            sources = tuple(str(s) for s in data["sources"])
            cursors = {str(k): int(v) for k, v in data["cursors"].items()}
            if set(cursors) != set(sources):
                raise CheckpointError(
                    f"checkpoint lists sources {list(sources)} but has cursors for {sorted(cursors)}"
                )
            return cls(
                fingerprint=str(data["fingerprint"]),
                step=int(data["step"]),
                sources=sources,
                cursors=cursors,
                epochs={str(k): int(v) for k, v in data["epochs"].items()},
                apportioner=dict(data["apportioner"]),
                seed=int(data["seed"]),
                mixture=dict(data.get("mixture", {})),
                version=int(version),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(
                f"checkpoint is corrupt or incomplete ({type(exc).__name__}: {exc}); it must come "
                "from Checkpoint.to_dict()"
            ) from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Checkpoint":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"checkpoint is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def check_plan(self, fingerprint: str, sources: tuple[str, ...]) -> None:
        """Raise :class:`CheckpointError` unless this checkpoint was written for that plan."""
        if self.fingerprint != fingerprint:
            raise CheckpointError(
                f"checkpoint at step {self.step} was written by plan {self.fingerprint}, not by this "
                f"plan {fingerprint}; sources, mixture, cost, batch shape, mesh, broadcast, seed or "
                "shuffle differ. Restore it with the plan that wrote it"
            )
        if tuple(self.sources) != tuple(sources):
            raise CheckpointError(
                f"checkpoint sources {list(self.sources)} differ from the plan's {list(sources)}"
            )

    def nbytes(self) -> int:
        """Size of the JSON form: what a trainer stores next to its model checkpoint."""
        return len(self.to_json().encode("utf-8"))


def _jsonable(value: Any) -> Any:
    """Round-trip through JSON so the stored form never shares mutable state with the caller."""
    return json.loads(json.dumps(value))
