"""What a Loader stores and restores: its ``state_dict()`` and the Planner checkpoint inside it.

The checkpoint that travels with every batch is light: it names each source's shard listing by a
digest only, so it stays a few hundred bytes however many shards there are. The Loader learns the
job's listings once, when it attaches, and puts them into the checkpoint it hands out from
``state_dict()``, so a stored checkpoint can say which shard changed when it is refused (see
:mod:`mdata.planner.resume`).
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
    """The job's data as the attach reply described it: its data fingerprint and listings."""

    fingerprint: str | None = None
    listings: Mapping[str, Any] | None = None

    def complete(self, checkpoint: Mapping[str, Any] | None) -> dict | None:
        """``checkpoint`` with the job's listings, when it is a checkpoint of this data without
        them; anything else unchanged (a restored checkpoint of other data keeps its own)."""
        if checkpoint is None:
            return None
        out = dict(checkpoint)
        data = out.get("data")
        if (self.listings is not None and out.get("listings") is None and isinstance(data, Mapping)
                and data.get("fingerprint") == self.fingerprint):
            out["listings"] = {k: [list(e) for e in v] for k, v in self.listings.items()}
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
