"""Messages a trainer sends: where is my batch, I consumed it, my metrics, give me my slice.

* trainer -> Planner: :class:`BatchLocationRequest` (a long poll), :class:`AckRequest`,
  :class:`ReportMetricsRequest`;
* trainer -> constructor: :class:`GetBatchRequest`, answered with the rank's
  :class:`~mdata.batch.Batch` as a ``to_serialize`` object (its own frames, :mod:`mdata.wire.frames`),
  as it always travelled.

A failed batch-location reply carries the typed error that failed the job
(:mod:`mdata.wire.errors`), so the trainer raises the same class with the same fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mdata.batch import Batch
from mdata.errors import MdataError, TrainerError
from mdata.wire.codec import (
    Handler, Message, Reader, Request, Status, check_bool, check_float, check_int, check_list, check_str,
    held_msg, key_msg, key_of, read_held,
)
from mdata.wire.errors import bad_field, error_from_msg, error_to_msg
from mdata.wire.jobs import OkReply, read_checkpoint
from mdata.wire.packed_checkpoint import checkpoint_msg

__all__ = [
    "BatchLocationRequest", "BatchLocation", "BatchLocationReply", "AckRequest",
    "ReportMetricsRequest", "GetBatchRequest", "GetBatchReply",
]


# -- trainer -> Planner --------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchLocation(Message):
    """Where the batch of a step is (task ``key`` on the constructors ``who_has``), this rank's
    slice of it, and the checkpoint of having consumed that step (``Checkpoint.to_dict()``).
    ``dp_rank``: the rank's DP group within the task's result, when one construct task built the
    batches of several groups (:func:`workers.constructor.construct_part_task`); None when the
    task's result is the group's batch itself."""

    key: tuple
    who_has: tuple[str, ...]
    cp_rank: int
    receives_tokens: bool
    receives_labels: bool
    checkpoint: Mapping[str, Any]
    dp_rank: int | None = None

    def to_msg(self) -> dict[str, Any]:
        return {"key": key_msg(self.key), "who_has": list(self.who_has), "cp_rank": self.cp_rank,
                "receives_tokens": self.receives_tokens, "receives_labels": self.receives_labels,
                "checkpoint": checkpoint_msg(self.checkpoint), "dp_rank": self.dp_rank}

    @classmethod
    def read(cls, r: Reader) -> "BatchLocation":
        key = key_of(r.raw("key"), r, "key")
        who_has = r.list("who_has", check_str)
        cp_rank, tokens, labels = r.int("cp_rank"), r.bool("receives_tokens"), r.bool("receives_labels")
        checkpoint = read_checkpoint(r.raw("checkpoint"), r, "checkpoint")
        return cls(key, who_has, cp_rank, tokens, labels, checkpoint.to_dict(),
                   r.optional("dp_rank", check_int))


@dataclass(frozen=True)
class BatchLocationReply(Message):
    """``OK`` with a :class:`BatchLocation`; ``TIMEOUT`` (ask again); or ``FAILED`` with the
    ``reason`` (text) and, when the failure was an :class:`MdataError`, that ``error`` itself, so
    the trainer raises the same class with the same fields (:mod:`mdata.wire.errors`)."""

    status: Status
    location: BatchLocation | None = None
    reason: str | None = None
    error: MdataError | None = None

    def __post_init__(self) -> None:
        name = type(self).__name__
        if (self.status is Status.OK) != (self.location is not None):
            raise bad_field(name, "location", f"is required with status OK and only then (status {self.status.value})")
        if (self.status is Status.FAILED) != (self.reason is not None):
            raise bad_field(name, "reason", f"is required with status failed and only then (status {self.status.value})")
        if self.status not in (Status.OK, Status.FAILED, Status.TIMEOUT):
            raise bad_field(name, "status", f"must be OK, failed or timeout, got {self.status.value}")

    def to_msg(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"status": self.status.value}
        if self.location is not None:
            msg.update(self.location.to_msg())
        if self.status is Status.FAILED:
            msg["reason"] = self.reason
            msg["error"] = None if self.error is None else error_to_msg(self.error)
        return msg

    @classmethod
    def from_msg(cls, msg: Any) -> "BatchLocationReply":
        r = Reader(cls.__name__, msg)
        status = r.enum("status", Status)
        location = reason = error = None
        if status is Status.OK:
            location = BatchLocation.read(r)
        elif status is Status.FAILED:
            reason = r.str("reason")
            raw_error = r.raw("error", None)
            error = None if raw_error is None else error_from_msg(raw_error)
        r.done()
        return cls(status, location, reason, error)

    def failure(self, context: str) -> MdataError:
        """The error a trainer raises for a ``FAILED`` reply: the typed error that failed the job
        (with ``context: reason`` added as a note; call it once per reply), else a TrainerError
        saying the same."""
        if self.error is not None:
            self.error.add_note(f"{context}: {self.reason}")
            return self.error
        return TrainerError(f"{context}: {self.reason}")


@dataclass(frozen=True)
class BatchLocationRequest(Request):
    """Long poll: where is the batch of ``step`` for trainer ``rank``? Answered within ``timeout``
    seconds (``TIMEOUT`` then). ``token``/``generation``: the asking Loader's lease (from its
    attach; empty for a caller without one, e.g. a notebook looking around). ``delivered``: a
    step whose batch this Loader received and has not acknowledged yet (the one before), so
    that the delivery needs no :class:`AckRequest` of its own: one message fewer per rank and
    step, the scheduler's most frequent. ``consumed``: steps the rank's training loop consumed
    and has not told yet (ascending), carried here instead of an :class:`AckRequest` each, with
    ``stalled_s`` as in that request and ``waits``: the loop's exposed wait for each of those
    steps' batches, in seconds (same order; -1 where not measured; empty from Loaders that
    predate it), which the dashboard's waiting page reads; applied before the long poll waits."""

    handler = Handler.BATCH_LOCATION
    reply = BatchLocationReply

    job: str
    rank: int
    step: int
    timeout: float
    token: str = ""
    generation: int = 0
    delivered: int | None = None
    consumed: tuple[int, ...] = ()
    stalled_s: float = -1.0
    waits: tuple[float, ...] = ()

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "rank": self.rank, "step": self.step, "timeout": self.timeout,
                **told_msg(self)}

    @classmethod
    def from_msg(cls, msg: Any) -> "BatchLocationRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), r.int("rank"), r.int("step"), r.float("timeout"), *read_told(r))
        r.done()
        return out


def told_msg(req: Any) -> dict[str, Any]:
    """The fields a location ask carries besides its rank and step (``token``, ``generation``,
    ``delivered``, and ``consumed`` with ``stalled_s`` and ``waits`` when there is any): shared
    by :class:`BatchLocationRequest` and :class:`~mdata.wire.host_location.LocationAsk`.
    ``waits`` is sent only when measured, so a scheduler that predates it still reads the rest."""
    out = {"token": req.token, "generation": req.generation, "delivered": req.delivered}
    if req.consumed:
        out["consumed"] = [int(s) for s in req.consumed]
        out["stalled_s"] = req.stalled_s
        if req.waits:
            out["waits"] = [float(w) for w in req.waits]
    return out


def read_told(r: Reader) -> tuple:
    """``(token, generation, delivered, consumed, stalled_s, waits)`` as :func:`told_msg` wrote
    them (``waits`` empty when absent: a Loader that predates it)."""
    consumed = check_list(r.raw("consumed", []), r, "consumed", check_int)
    return (check_str(r.raw("token", ""), r, "token"),
            check_int(r.raw("generation", 0), r, "generation"),
            r.optional("delivered", check_int),
            consumed,
            check_float(r.raw("stalled_s", -1.0), r, "stalled_s"),
            read_waits(r, consumed, "consumed"))


def read_waits(r: Reader, steps: tuple[int, ...], steps_field: str) -> tuple[float, ...]:
    """The optional ``waits`` beside ``steps``: one per step when present, else empty."""
    waits = check_list(r.raw("waits", []), r, "waits", check_float)
    if waits and len(waits) != len(steps):
        raise r.fail("waits", f"has {len(waits)} values for the {len(steps)} steps of {steps_field!r}")
    return waits


@dataclass(frozen=True)
class AckRequest(Request):
    """Trainer ``rank`` consumed its batch of ``step`` (its training loop took the next one, or
    said so), which implies it was delivered; with ``consumed=False``: the batch was only
    delivered (fetched by the prefetcher; usually told with the next BatchLocationRequest).
    ``token``/``generation``: the Loader's lease, as in :class:`BatchLocationRequest`.
    ``stalled_s``: how long the rank's training loop has waited for batches in all (not its
    prefetcher: the loop's own stall), which pool sizing reads; -1 when not told."""

    handler = Handler.ACK
    reply = OkReply

    job: str
    rank: int
    step: int
    consumed: bool = True
    token: str = ""
    generation: int = 0
    stalled_s: float = -1.0

    def to_msg(self) -> dict[str, Any]:
        out = {"job": self.job, "rank": self.rank, "step": self.step, "consumed": self.consumed,
               "token": self.token, "generation": self.generation}
        if self.stalled_s >= 0:
            out["stalled_s"] = self.stalled_s
        return out

    @classmethod
    def from_msg(cls, msg: Any) -> "AckRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), r.int("rank"), r.int("step"),
                  check_bool(r.raw("consumed", True), r, "consumed"),
                  check_str(r.raw("token", ""), r, "token"),
                  check_int(r.raw("generation", 0), r, "generation"),
                  check_float(r.raw("stalled_s", -1.0), r, "stalled_s"))
        r.done()
        return out


@dataclass(frozen=True)
class ReportMetricsRequest(Request):
    """Training metrics of ``step`` from ``rank`` (e.g. per-source loss) for metric-driven
    mixtures; ``token``/``generation``: the Loader's lease, as in :class:`BatchLocationRequest`
    (the Planner refuses metrics without one)."""

    handler = Handler.REPORT_METRICS
    reply = OkReply

    job: str
    rank: int
    step: int
    metrics: Mapping[str, float]
    token: str = ""
    generation: int = 0

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "rank": self.rank, "step": self.step,
                "metrics": {k: float(v) for k, v in self.metrics.items()},
                "token": self.token, "generation": self.generation}

    @classmethod
    def from_msg(cls, msg: Any) -> "ReportMetricsRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), r.int("rank"), r.int("step"), r.mapping("metrics", check_float),
                  check_str(r.raw("token", ""), r, "token"),
                  check_int(r.raw("generation", 0), r, "generation"))
        r.done()
        return out


@dataclass(frozen=True)
class GetBatchReply(Message):
    """``OK`` with this rank's :class:`~mdata.batch.Batch`, or ``MISSING`` with the ``key``."""

    status: Status
    key: tuple
    batch: Batch | None = None

    def to_msg(self) -> dict[str, Any]:
        return held_msg(self.status, self.key, "batch", self.batch)

    @classmethod
    def from_msg(cls, msg: Any) -> "GetBatchReply":
        r = Reader(cls.__name__, msg)
        out = cls(*read_held(r, "batch", Batch))
        r.done()
        return out


@dataclass(frozen=True)
class GetBatchRequest(Request):
    """This rank's slice of the batch held under ``key`` (of DP group ``dp_rank`` when the task
    under ``key`` built several groups' batches): its CP piece, and tokens / labels only where
    its pipeline stage needs them."""

    handler = Handler.GET_BATCH
    reply = GetBatchReply

    key: tuple
    cp_rank: int | None  # None: the whole sequence (the receiver under broadcast_at("cp"))
    receives_tokens: bool
    receives_labels: bool
    dp_rank: int | None = None

    def to_msg(self) -> dict[str, Any]:
        return {"key": key_msg(self.key), "cp_rank": self.cp_rank,
                "receives_tokens": self.receives_tokens, "receives_labels": self.receives_labels,
                "dp_rank": self.dp_rank}

    @classmethod
    def from_msg(cls, msg: Any) -> "GetBatchRequest":
        r = Reader(cls.__name__, msg)
        out = cls(key_of(r.raw("key"), r, "key"), r.optional("cp_rank", check_int, required=True),
                  r.bool("receives_tokens"),
                  r.bool("receives_labels"), r.optional("dp_rank", check_int))
        r.done()
        return out
