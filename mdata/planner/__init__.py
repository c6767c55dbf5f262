"""The Planner: a pure state machine that turns events into instructions (no I/O, no Dask).

Modules, in the order a step goes through them:

* :mod:`~mdata.planner.events` and :mod:`~mdata.planner.instructions`: the vocabulary;
* :mod:`~mdata.planner.state`: :class:`PlannerState`, which dispatches events and composes
* :mod:`~mdata.planner.apportion` (per-source counts and provisional samples of each step),
  :mod:`~mdata.planner.chunk_table` (chunk requests, references, window holds, cost features),
  :mod:`~mdata.planner.selection` (final samples after skipped rows) and
  :mod:`~mdata.planner.assign` (pricing and balancing over DP ranks);
* :mod:`~mdata.planner.checkpoints` (taking and restoring checkpoints) and
  :mod:`~mdata.planner.resume` (what may change on resume: placement freely, the mixture when
  asked, the data never, but for shards appended when asked);
* :mod:`~mdata.planner.simulate`: the same state machine run on sample metadata, no cluster.

Where this runs and how a step flows through it: docs/dev/architecture.md.
"""

from mdata.planner.apportion import row_counts_of
from mdata.planner.events import (
    BatchConsumed, BatchDelivered, ChunkFailed, ChunkLoaded, MetricsReported, PlannerEvent,
    RanksConsumed, Tick, WorkerLost, coalesce_acknowledgements,
)
from mdata.planner.instructions import (
    ConstructStep, Instruction, JobFailed, LoadChunk, PoolTarget, ReleaseBatch, ReleaseChunk,
    StepColumns, StepReady, StepSamples, StepSummary,
)
from mdata.planner.resume import Resume, ResumeOptions
from mdata.planner.simulate import SimulationResult, simulate
from mdata.planner.state import PlannerState

__all__ = [
    # events
    "PlannerEvent", "Tick", "ChunkLoaded", "ChunkFailed", "WorkerLost", "BatchDelivered",
    "BatchConsumed", "RanksConsumed", "MetricsReported", "coalesce_acknowledgements",
    # instructions
    "Instruction", "LoadChunk", "ReleaseChunk", "ConstructStep", "ReleaseBatch", "StepReady",
    "JobFailed", "PoolTarget",
    # values
    "StepColumns", "StepSamples", "StepSummary", "row_counts_of",
    # the state machine, its resumes and its offline run
    "PlannerState", "ResumeOptions", "Resume", "simulate", "SimulationResult",
]
