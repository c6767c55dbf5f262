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

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from mdata.planner.instructions import StepColumns
from mdata.wire.construct import ConstructPart

__all__ = ["CONSTRUCTOR_RESOURCE", "ConstructParts", "construct_settings", "constructor_slots",
           "part_of_step", "split_groups"]

#: The Dask worker resource of constructor threads: one construct task runs per unit of it.
CONSTRUCTOR_RESOURCE = "mdata_constructor"


def constructor_slots(scheduler: Any) -> int:
    """Construct tasks the cluster's constructors run at once (their ``mdata_constructor``
    resource, one per thread); at least 1, so that a job planned before its constructors
    joined still has its batches queued."""
    total = sum(ws.resources.get(CONSTRUCTOR_RESOURCE, 0) for ws in scheduler.workers.values())
    return max(1, int(total))


def construct_settings(plan: Any, wait_s: float) -> dict[str, Any]:
    """The plan's batch settings every construct task of its job carries (:func:`part_of_step`);
    ``wait_s``: how long a constructor waits for a chunk to be loaded
    (``mdata.constructor.chunk-wait``)."""
    image = plan.image_token_id
    return dict(max_tokens=int(plan.balance_spec.max_tokens), cp=int(plan.mesh.cp),
                pad_id=int(plan.pad_id), image_token_id=None if image is None else int(image),
                wait_s=float(wait_s))


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


def part_of_step(step: int, columns: StepColumns, dp_ranks: Sequence[int],
                 who_has: Callable[[tuple], Sequence[str]], settings: Mapping[str, Any]) -> ConstructPart:
    """The construct task argument of DP groups ``dp_ranks`` (consecutive, ascending) of a step
    planned as ``columns``: slices of the step's columns and one lookup of the holders per chunk
    pull, no object per group. ``settings``: the plan's ``num_micro_batches`` (taken from the
    columns when absent), ``max_tokens``, ``cp``, ``pad_id``, ``image_token_id`` and ``wait_s``."""
    d0, d1 = int(dp_ranks[0]), int(dp_ranks[-1]) + 1
    if list(dp_ranks) != list(range(d0, d1)):
        raise ValueError(f"a part's DP ranks must be consecutive, got {list(dp_ranks)[:8]}")
    sb = np.asarray(columns.sample_bounds[d0:d1 + 1], np.int64)
    rb = np.asarray(columns.run_bounds[d0:d1 + 1], np.int64)
    lo, hi, r0, r1 = int(sb[0]), int(sb[-1]), int(rb[0]), int(rb[-1])
    # each sample's pull: its group's first run plus its run among the group's (``chunk``)
    group_of = np.repeat(np.arange(d1 - d0), np.diff(sb))
    pull_of = rb[group_of] - r0 + columns.chunk[lo:hi]
    keys = tuple(ref.key for ref in columns.refs[r0:r1])
    return ConstructPart(
        step=int(step), dp_ranks=tuple(range(d0, d1)), sample_bounds=sb - lo, pull_bounds=rb - r0,
        pull_keys=keys, pull_sizes=np.bincount(pull_of, minlength=r1 - r0).astype(np.int64),
        holders=tuple(tuple(who_has(key)) for key in keys),
        indices=columns.index[lo:hi].astype(np.int64), micro_batch=columns.micro_batch[lo:hi],
        position=columns.position[lo:hi], lengths=columns.num_tokens[lo:hi],
        sample_ids=np.stack([columns.source_index[lo:hi], columns.shard[lo:hi], columns.row[lo:hi]],
                            axis=1),
        num_micro_batches=int(settings.get("num_micro_batches", columns.num_micro_batches)),
        **{f: settings[f] for f in ("max_tokens", "cp", "pad_id", "image_token_id", "wait_s")})


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
