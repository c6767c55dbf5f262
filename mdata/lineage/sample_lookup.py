"""Why a sample has no story: it does not exist in its source, or the job has not planned it.

A story lookup (``JobHandle.story``, the dashboard's lineage page, ``/mdata/api/<job>/story/...``)
finds every time a sample was planned. When it finds none, an empty table reads like "this sample
was never trained on", which is only true if the sample exists and the lineage of the steps that
could hold it is still kept. These functions say which case it is, so the lookup raises a
:class:`~mdata.errors.SampleNotPlannedError` with the reason instead of answering with no rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from mdata.errors import SampleNotPlannedError
from mdata.lineage.ids import SampleId

__all__ = ["check_sample_exists", "not_planned"]


def check_sample_exists(sid: SampleId, job: str, row_counts: Sequence[int]) -> None:
    """Raise :class:`SampleNotPlannedError` when ``sid``'s shard or row is not in its source's
    listing (``row_counts``: rows per shard, in the source's shard order)."""
    shards = len(row_counts)
    if not 0 <= sid.shard < shards:
        raise SampleNotPlannedError(
            f"job {job!r}: no sample {sid}: source {sid.source!r} has {shards} shard(s), "
            f"numbered 0..{shards - 1}", job=job, sample_id=str(sid))
    rows = int(row_counts[sid.shard])
    if not 0 <= sid.row < rows:
        raise SampleNotPlannedError(
            f"job {job!r}: no sample {sid}: shard {sid.shard} of source {sid.source!r} has "
            f"{rows} row(s)" + (f", numbered 0..{rows - 1}" if rows else ""),
            job=job, sample_id=str(sid))


def not_planned(sid: SampleId, job: str, planned_steps: int, *, forgotten_before: int = 0,
                lineage_note: str = "") -> SampleNotPlannedError:
    """The error of a sample that exists but has no occurrence in the job's lineage.

    ``planned_steps``: steps the Planner apportioned so far; ``forgotten_before``: steps before it
    are no longer kept in memory (``mdata.planner.lineage-steps`` without a spill); ``lineage_note``:
    the spilled lineage's own sentence on what is unavailable ("" when all of it is)."""
    if planned_steps <= 0:
        planned = "no step is planned yet"
    else:
        planned = f"not in steps 0..{planned_steps - 1}, planned so far"
    text = (f"job {job!r}: sample {sid} has not been planned ({planned}); a sample is planned "
            "when its source's shuffled order reaches it (a source of weight 0: never)")
    if forgotten_before > 0:
        text += (f"; lineage of steps before {forgotten_before} is no longer kept "
                 "(mdata.planner.lineage-steps), so an occurrence there would not show")
    if lineage_note:
        text += f"; {lineage_note}"
    return SampleNotPlannedError(text, job=job, sample_id=str(sid))
