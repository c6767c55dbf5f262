"""Messages that inspect a running job: its status, the story of one sample, the lineage of steps.

Drivers, notebooks and the demo send them to the Planner (see :mod:`mdata.wire.messages`). Replies
keep the shapes the handlers always answered with (a status is a dict with ``counters``, a story a
list of occurrences, lineage a dict of steps), so a notebook calling
``client.scheduler.mdata_status(job=...)`` by hand reads the same data as
:class:`~mdata.driver.JobHandle`, which goes through these classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mdata.wire.codec import (
    Handler, Message, Reader, check_dict, check_float, check_int, check_mapping, check_str, list_of,
)
from mdata.wire.jobs import JobRequest
from mdata.wire.lineage_status import LineageSpillInfo
from mdata.wire.pools import PoolDecision, ScalerStatus, read_decision, read_scaler
from mdata.wire.storage import StorageWaitInfo, read_storage_wait

__all__ = [
    "StatusRequest", "StatusReply", "StatusCounters", "JobStorageWaitsRequest",
    "JobStorageWaitsReply", "StoryRequest",
    "StoryReply", "StoryOccurrence", "LineageRequest", "LineageReply", "ExactlyOnce",
]


# -- status --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StatusCounters(Message):
    """How far the Planner got: first step not apportioned / balanced / consumed by every group."""

    planned_step: int
    balanced_step: int
    consumed_step: int
    chunks_loaded: int
    truncated: int
    skipped: Mapping[str, int]

    def to_msg(self) -> dict[str, Any]:
        return {"planned_step": self.planned_step, "balanced_step": self.balanced_step,
                "consumed_step": self.consumed_step, "chunks_loaded": self.chunks_loaded,
                "truncated": self.truncated, "skipped": dict(self.skipped)}

    @classmethod
    def from_msg(cls, msg: Any) -> "StatusCounters":
        r = Reader(cls.__name__, msg)
        out = cls(r.int("planned_step"), r.int("balanced_step"), r.int("consumed_step"),
                  r.int("chunks_loaded"), r.int("truncated"), r.mapping("skipped", check_int))
        r.done()
        return out


@dataclass(frozen=True)
class StatusReply(Message):
    """A snapshot of one job: per-step summaries (``steps``, keyed by the step as a string),
    counters, pool targets, per-rank consumption and wait, ``failure`` (None while healthy),
    ``storage_waits``: the job's sources whose loads wait on unreachable storage right now (empty
    while storage answers), as the Planner last heard from the loader workers,
    ``autoscaler``: the cluster's pool autoscaler as it last reported (``running`` False and no
    errors when none runs); ``lineage``: the spilled lineage, and which steps' lineage is
    unavailable (:class:`~mdata.wire.lineage_status.LineageSpillInfo`);
    ``recoveries``: what faults cost the job so far, so a recovery
    can be seen and not only inferred from its output (``chunks_reloaded``: chunks loaded again
    because their loader was lost while a step still needed them; ``batches_rebuilt``: built
    batches lost with their constructor and built again);
    ``quarantined``: per source whose ``on_corrupt`` is ``"skip"``, the
    chunks passed over because they cannot be parsed (shard index and path, rows, the step the
    Planner was at, the reason)."""

    job: str
    failure: str | None
    uptime_s: float
    steps: Mapping[str, Mapping[str, Any]]
    pool_targets: Mapping[str, PoolDecision]
    chunks_in_memory: int
    batches_in_memory: int
    trainer_wait_s: Mapping[str, float]
    consumed_steps: Mapping[str, int]
    counters: StatusCounters
    storage_waits: Mapping[str, StorageWaitInfo] = field(default_factory=dict)
    autoscaler: ScalerStatus = field(default_factory=ScalerStatus)
    lineage: LineageSpillInfo = field(default_factory=LineageSpillInfo)
    recoveries: Mapping[str, int] = field(default_factory=dict)
    quarantined: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)
    #: per rank, the seconds its training loop waited for batches (the stall the GPU saw), as its
    #: Loader last told; ``trainer_wait_s`` is the prefetcher's long polls, overlapped with compute
    trainer_stall_s: Mapping[str, float] = field(default_factory=dict)

    def to_msg(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "failure": self.failure,
            "uptime_s": self.uptime_s,
            "steps": {k: dict(v) for k, v in self.steps.items()},
            "pool_targets": {k: v.to_msg() for k, v in self.pool_targets.items()},
            "chunks_in_memory": self.chunks_in_memory,
            "batches_in_memory": self.batches_in_memory,
            "trainer_wait_s": dict(self.trainer_wait_s),
            "consumed_steps": dict(self.consumed_steps),
            "counters": self.counters.to_msg(),
            "storage_waits": {k: v.to_msg() for k, v in self.storage_waits.items()},
            "autoscaler": self.autoscaler.to_msg(),
            "lineage": self.lineage.to_msg(),
            "recoveries": dict(self.recoveries),
            "quarantined": {k: [dict(q) for q in v] for k, v in self.quarantined.items()},
            "trainer_stall_s": dict(self.trainer_stall_s),
        }

    @classmethod
    def from_msg(cls, msg: Any) -> "StatusReply":
        r = Reader(cls.__name__, msg)
        out = cls(
            job=r.str("job"),
            failure=r.optional("failure", check_str, required=True),
            uptime_s=r.float("uptime_s"),
            steps=r.mapping("steps", check_dict),
            pool_targets=r.mapping("pool_targets", read_decision),
            chunks_in_memory=r.int("chunks_in_memory"),
            batches_in_memory=r.int("batches_in_memory"),
            trainer_wait_s=r.mapping("trainer_wait_s", check_float),
            consumed_steps=r.mapping("consumed_steps", check_int),
            counters=StatusCounters.from_msg(r.raw("counters")),
            storage_waits=r.mapping("storage_waits", read_storage_wait),
            autoscaler=read_scaler(r.raw("autoscaler", ScalerStatus().to_msg()), r, "autoscaler"),
            lineage=LineageSpillInfo.from_msg(r.raw("lineage", LineageSpillInfo().to_msg())),
            recoveries=check_mapping(r.raw("recoveries", {}), r, "recoveries", check_int),
            quarantined=check_mapping(r.raw("quarantined", {}), r, "quarantined", list_of(check_dict)),
            trainer_stall_s=check_mapping(r.raw("trainer_stall_s", {}), r, "trainer_stall_s", check_float),
        )
        r.done()
        return out


@dataclass(frozen=True)
class StatusRequest(JobRequest):
    """``max_steps``: the newest step summaries to include (None: all kept; the autoscaler,
    which reads pool targets every interval, asks for none)."""

    handler = Handler.STATUS
    reply = StatusReply

    max_steps: int | None = None

    def to_msg(self) -> dict[str, Any]:
        out = {"job": self.job}
        if self.max_steps is not None:
            out["max_steps"] = self.max_steps
        return out

    @classmethod
    def from_msg(cls, msg: Any) -> "StatusRequest":
        r = Reader(cls.__name__, msg)
        raw = r.raw("max_steps", None)
        out = cls(r.str("job"), None if raw is None else check_int(raw, r, "max_steps"))
        r.done()
        return out


@dataclass(frozen=True)
class JobStorageWaitsReply(Message):
    """The job's sources that wait on storage now (empty: none), as a status reports them."""

    storage_waits: Mapping[str, StorageWaitInfo] = field(default_factory=dict)

    def to_msg(self) -> dict[str, Any]:
        return {"storage_waits": {k: v.to_msg() for k, v in self.storage_waits.items()}}

    @classmethod
    def from_msg(cls, msg: Any) -> "JobStorageWaitsReply":
        r = Reader(cls.__name__, msg)
        out = cls(r.mapping("storage_waits", read_storage_wait))
        r.done()
        return out


@dataclass(frozen=True)
class JobStorageWaitsRequest(JobRequest):
    """Whether ``job`` waits on storage: what a Loader whose batch is late asks (every few
    seconds while it waits), so it can let a storage outage extend its timeout and say why it
    waits. A whole :class:`StatusRequest` would answer it too, but a status carries a figure per
    rank: asked by every late rank of a large world at once (a job's first step, any data
    stall), it cost the scheduler ranks x ranks work; this answer is as large as the sources that
    wait."""

    handler = Handler.JOB_STORAGE_WAITS
    reply = JobStorageWaitsReply


# -- story and lineage ---------------------------------------------------------------------------
@dataclass(frozen=True)
class StoryOccurrence(Message):
    """One occurrence of a sample (one per epoch): its lineage id and events, in order."""

    lineage_id: int
    events: tuple[Mapping[str, Any], ...]

    def to_msg(self) -> dict[str, Any]:
        return {"lineage_id": self.lineage_id, "events": [dict(e) for e in self.events]}

    @classmethod
    def from_msg(cls, msg: Any) -> "StoryOccurrence":
        r = Reader(cls.__name__, msg)
        out = cls(r.int("lineage_id"), r.list("events", check_dict))
        r.done()
        return out


@dataclass(frozen=True)
class StoryReply(Message):
    """Every occurrence of one sample (on the wire: a plain list)."""

    occurrences: tuple[StoryOccurrence, ...]

    def to_msg(self) -> list[dict[str, Any]]:
        return [o.to_msg() for o in self.occurrences]

    @classmethod
    def from_msg(cls, msg: Any) -> "StoryReply":
        r = Reader(cls.__name__, {"occurrences": msg})
        return cls(r.list("occurrences", lambda v, _r, _f: StoryOccurrence.from_msg(v)))


@dataclass(frozen=True)
class StoryRequest(JobRequest):
    """The story of ``sample_id`` (``source/shard/row``): loaded, planned, delivered, consumed."""

    handler = Handler.STORY
    reply = StoryReply

    sample_id: str = field(kw_only=True)

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "sample_id": self.sample_id}

    @classmethod
    def from_msg(cls, msg: Any) -> "StoryRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), sample_id=r.str("sample_id"))
        r.done()
        return out


@dataclass(frozen=True)
class ExactlyOnce(Message):
    """The DGraph's exactly-once report over the steps it still keeps."""

    ok: bool
    samples: int
    skipped: int
    problems: tuple[str, ...]

    def to_msg(self) -> dict[str, Any]:
        return {"ok": self.ok, "samples": self.samples, "skipped": self.skipped,
                "problems": list(self.problems)}

    @classmethod
    def from_msg(cls, msg: Any) -> "ExactlyOnce":
        r = Reader(cls.__name__, msg)
        out = cls(r.bool("ok"), r.int("samples"), r.int("skipped"), r.list("problems", check_str))
        r.done()
        return out


def _id_rows(value: Any, r: Reader, name: str) -> list[list[int]]:
    """Sample ids of one (step, DP rank) as ``[[source_index, shard, row], ...]``."""
    if not isinstance(value, (list, tuple)):
        raise r.fail(name, f"must be a list of [source_index, shard, row], got {value!r:.80}")
    try:
        rows = np.asarray(value, dtype=np.int64).reshape(len(value), 3) if value else np.zeros((0, 3))
    except (TypeError, ValueError):
        raise r.fail(name, f"must be a list of [source_index, shard, row] integers, got {value!r:.80}") from None
    return rows.astype(np.int64).tolist()


@dataclass(frozen=True)
class LineageReply(Message):
    """Planned sample ids per step (``samples[str(step)][str(dp_rank)]``), the first step the
    DGraph still keeps, and the exactly-once report over what it keeps. ``quarantined``: why
    rows were passed over besides a transform's skips (as :class:`StatusReply`'s)."""

    samples: Mapping[str, Mapping[str, list[list[int]]]]
    forgotten_before: int
    exactly_once: ExactlyOnce
    quarantined: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)

    def to_msg(self) -> dict[str, Any]:
        return {"samples": {s: dict(by_dp) for s, by_dp in self.samples.items()},
                "forgotten_before": self.forgotten_before,
                "exactly_once": self.exactly_once.to_msg(),
                "quarantined": {k: [dict(q) for q in v] for k, v in self.quarantined.items()}}

    @classmethod
    def from_msg(cls, msg: Any) -> "LineageReply":
        r = Reader(cls.__name__, msg)
        out = cls(r.mapping("samples", lambda v, rr, f: check_mapping(v, rr, f, _id_rows)),
                  r.int("forgotten_before"), ExactlyOnce.from_msg(r.raw("exactly_once")),
                  check_mapping(r.raw("quarantined", {}), r, "quarantined", list_of(check_dict)))
        r.done()
        return out


@dataclass(frozen=True)
class LineageRequest(JobRequest):
    """Lineage of steps ``[0, steps)``."""

    handler = Handler.LINEAGE
    reply = LineageReply

    steps: int = field(kw_only=True)

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "steps": self.steps}

    @classmethod
    def from_msg(cls, msg: Any) -> "LineageRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), steps=r.int("steps"))
        r.done()
        return out
