"""A step's DP groups, built by one construct task per constructor slot, not one per group.

Every Dask task costs the scheduler about the same whatever it computes: the graph message, the
task's transitions, its worker's task-finished message, the future's release. With one construct
task per DP group that cost grew with DP groups every step (at 16k GPUs with TP 8, 2,048 tasks a
step). The runtime therefore splits a step's groups into *parts*, one per constructor slot (the
``mdata_constructor`` resource the constructors hold, one per thread), and submits one task per
part (:func:`workers.constructor.construct_part_task`), whose result maps each group's DP rank to
its batch. As many tasks run at once as before, so a step is built as fast; only their number
no longer grows with the groups.

A part's groups are consecutive DP ranks: the ranks of one host sit in neighbouring groups, so
they tend to be built by one task, finish together and travel in one location push. A part is
released when the last of its groups is (the Planner releases a step's groups as their ranks
consume it); the trainers ask for their group within the part (``GetBatchRequest.dp_rank``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["split_groups", "ConstructParts"]


def split_groups(dp_ranks: Sequence[int], slots: int) -> list[list[int]]:
    """``dp_ranks`` (sorted here) in ``min(slots, len)`` runs of consecutive ranks whose sizes
    differ by at most one; at least one run when there are ranks."""
    ranks = sorted(dp_ranks)
    if not ranks:
        return []
    parts = max(1, min(int(slots), len(ranks)))
    size, extra = divmod(len(ranks), parts)
    out, at = [], 0
    for i in range(parts):
        n = size + (1 if i < extra else 0)
        out.append(ranks[at:at + n])
        at += n
    return out


class ConstructParts:
    """Which (step, DP rank) batches each construct task (by its key) still holds for the job."""

    def __init__(self) -> None:
        self._members: dict[Any, set[tuple[int, int]]] = {}

    def add(self, task_key: Any, batches: Iterable[tuple[int, int]]) -> None:
        self._members.setdefault(task_key, set()).update(batches)

    def members(self, task_key: Any) -> list[tuple[int, int]]:
        """The batches the task still holds (not yet released), in order."""
        return sorted(self._members.get(task_key, ()))

    def release(self, task_key: Any, batch: tuple[int, int]) -> bool:
        """``batch`` is released; True when it was the task's last (release the task then)."""
        members = self._members.get(task_key)
        if members is None:
            return True
        members.discard(batch)
        if members:
            return False
        del self._members[task_key]
        return True

    def clear(self) -> None:
        self._members.clear()

    def __len__(self) -> int:
        return len(self._members)
