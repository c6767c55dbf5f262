"""What a Loader stores and restores: its ``state_dict()`` and the Planner checkpoint inside it.

The checkpoint that travels with every batch is light: of what is the same for every step of the
job (its data identity, its mixture and every shard's listing) it keeps a digest only, so it stays
as small as the per-step state however many sources and shards there are. The Loader learns the
job's data once, when it attaches, and puts it into the checkpoint it hands out from
``state_dict()``: a stored checkpoint can then resume under another plan and say what changed when
it is refused (see :mod:`mdata.planner.resume`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mdata.errors import TrainerError

__all__ = ["LOADER_STATE_VERSION", "JobData", "checkpoint_of", "loader_state"]

LOADER_STATE_VERSION = 1


def checkpoint_of(state: dict | None) -> dict | None:
    """The Planner checkpoint inside what :meth:`Loader.state_dict` returned (the one shape
    ``Loader(checkpoint=...)`` and ``load_state_dict`` take); a bare checkpoint dict (as
    ``JobHandle.checkpoint()`` returns) is taken as it is."""
    if state is None:
        return None
    if not isinstance(state, dict):
        raise TrainerError(f"a Loader checkpoint is the dict state_dict() returned, got {type(state).__name__}")
    if "cursors" in state and "fingerprint" in state:
        return state
    if "checkpoint" not in state or "version" not in state:
        raise TrainerError(
            f"not a Loader state (keys {sorted(state)}): pass what Loader.state_dict() returned"
        )
    if state["version"] != LOADER_STATE_VERSION:
        raise TrainerError(f"unknown Loader state version {state['version']!r}")
    return state["checkpoint"]


@dataclass(frozen=True)
class JobData:
    """What every checkpoint of the job shares, as the attach reply gave it (``identity``,
    ``data``, ``schedule``, ``listings``); empty before the Loader attached."""

    shared: Mapping[str, Any] | None = None

    def complete(self, checkpoint: Mapping[str, Any] | None) -> dict | None:
        """``checkpoint`` in its full form when it is a light checkpoint of this job; anything
        else unchanged (a restored checkpoint keeps its own data)."""
        if checkpoint is None:
            return None
        out = dict(checkpoint)
        shared = self.shared
        if (shared is not None and out.get("data") is None and out.get("identity") is not None
                and out["identity"] == shared.get("identity")):
            for key in ("data", "schedule", "listings"):
                out[key] = shared.get(key)
        return out


def loader_state(job: str, rank: int, next_step: int, checkpoint: dict | None,
                 data: JobData) -> dict:
    """What :meth:`Loader.state_dict` returns."""
    return {
        "version": LOADER_STATE_VERSION,
        "job": job,
        "rank": rank,
        "next_step": next_step,
        "checkpoint": data.complete(checkpoint),
    }
