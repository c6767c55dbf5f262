"""Messages that manage jobs: register, info, list, checkpoint, close. Drivers and trainers send
them to the Planner (see :mod:`mdata.wire.messages` for the whole catalogue).

Replies keep the shapes the handlers always answered with (job info is a dict with ``mesh``, a
checkpoint its ``Checkpoint.to_dict()``...), so a notebook calling a handler by hand reads the same
data as :class:`~mdata.driver.JobHandle`, which goes through these classes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mdata.checkpoint import Checkpoint
from mdata.errors import CheckpointError
from mdata.mesh import ClientPlaceTree
from mdata.wire.codec import (
    Handler, Message, Reader, Request, Status, check_bool, check_dict, check_str, plain,
)
from mdata.wire.packed_checkpoint import unpacked

__all__ = [
    "OkReply", "RegisterJobRequest", "JobInfoRequest", "JobInfo", "MeshShape", "JobsRequest",
    "JobsReply", "CloseJobRequest", "CheckpointRequest", "CheckpointReply", "JobRequest",
    "read_checkpoint", "resume_flags_msg", "read_resume_flags",
]


@dataclass(frozen=True)
class OkReply(Message):
    """The answer of a handler that only confirms (ack, metrics, close job)."""

    def to_msg(self) -> dict[str, Any]:
        return {"status": Status.OK.value}

    @classmethod
    def from_msg(cls, msg: Any) -> "OkReply":
        r = Reader(cls.__name__, msg)
        status = r.enum("status", Status)
        r.done()
        if status is not Status.OK:
            raise r.fail("status", f"must be {Status.OK.value!r}, got {status.value!r}")
        return cls()


def resume_flags_msg(request: Any) -> dict[str, bool]:
    """The resume options a request carries (register, attach), as message fields."""
    return {"accept_appended_shards": bool(request.accept_appended_shards),
            "allow_mixture_change": bool(request.allow_mixture_change)}


def read_resume_flags(r: Reader) -> dict[str, bool]:
    """The resume options of a request; absent ones are False (older senders)."""
    return {name: check_bool(r.raw(name, False), r, name)
            for name in ("accept_appended_shards", "allow_mixture_change")}


def read_checkpoint(value: Any, r: Reader, name: str) -> Checkpoint:
    """A checkpoint dict inside a reply, checked by :meth:`Checkpoint.from_dict`."""
    try:
        return Checkpoint.from_dict(check_dict(unpacked(value), r, name))
    except CheckpointError as exc:
        raise r.fail(name, f"is not a checkpoint: {exc}") from None


# -- register, info, list ------------------------------------------------------------------------
@dataclass(frozen=True)
class MeshShape(Message):
    """A job's device mesh as trainers learn it (enough to rebuild the ClientPlaceTree)."""

    dp: int
    pp: int
    cp: int
    tp: int
    order: str

    @classmethod
    def of(cls, mesh: ClientPlaceTree) -> "MeshShape":
        return cls(int(mesh.dp), int(mesh.pp), int(mesh.cp), int(mesh.tp), str(mesh.order))

    def place_tree(self) -> ClientPlaceTree:
        return ClientPlaceTree(dp=self.dp, pp=self.pp, cp=self.cp, tp=self.tp, order=self.order)

    def to_msg(self) -> dict[str, Any]:
        return {"dp": self.dp, "pp": self.pp, "cp": self.cp, "tp": self.tp, "order": self.order}

    @classmethod
    def from_msg(cls, msg: Any) -> "MeshShape":
        r = Reader(cls.__name__, msg)
        out = cls(r.int("dp"), r.int("pp"), r.int("cp"), r.int("tp"), r.str("order"))
        r.done()
        return out


@dataclass(frozen=True)
class JobInfo(Message):
    """Identity of a registered job: plan fingerprint, mesh, and the first step trainers get."""

    job: str
    fingerprint: str
    start_step: int
    broadcast: str | None
    mesh: MeshShape
    world_size: int

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "fingerprint": self.fingerprint, "start_step": self.start_step,
                "broadcast": self.broadcast, "mesh": self.mesh.to_msg(), "world_size": self.world_size}

    @classmethod
    def from_msg(cls, msg: Any) -> "JobInfo":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), r.str("fingerprint"), r.int("start_step"),
                  r.optional("broadcast", check_str, required=True), MeshShape.from_msg(r.raw("mesh")),
                  r.int("world_size"))
        r.done()
        return out


@dataclass(frozen=True)
class RegisterJobRequest(Request):
    """Register ``plan`` as ``job`` (idempotent for the same plan); optionally resume from
    ``checkpoint`` (a ``Checkpoint.to_dict()``; the Planner checks it and raises CheckpointError).

    ``plan`` is the plan's spec, ``Plan.to_spec()``: plain data (docs/plan-files.md). The Planner
    never unpickles what a client sends, so pickled bytes here are refused where they are read.
    ``accept_appended_shards`` / ``allow_mixture_change``: what the resume from ``checkpoint``
    may accept beyond the data and mixture it was written with (see mdata.planner.resume).
    ``by_loader``: a Loader registers before it attaches; its checkpoint then creates a job that
    does not run yet, and never rewinds one that runs: its attach decides, with every rank's step
    in view (mdata.planner.roster), where a driver's registration would rewind at once.
    """

    handler = Handler.REGISTER_JOB
    reply = JobInfo

    job: str
    plan: Mapping[str, Any]
    checkpoint: Mapping[str, Any] | None = None
    accept_appended_shards: bool = False
    allow_mixture_change: bool = False
    by_loader: bool = False
    client: str = ""  # the registering Dask client's id: it becomes a driver of the job

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "plan": plain(self.plan),
                "checkpoint": None if self.checkpoint is None else dict(self.checkpoint),
                **resume_flags_msg(self), "by_loader": bool(self.by_loader), "client": self.client}

    @classmethod
    def from_msg(cls, msg: Any) -> "RegisterJobRequest":
        r = Reader(cls.__name__, msg)
        if isinstance(r.raw("plan", None), (bytes, bytearray, memoryview)):
            raise r.fail("plan", "is bytes (a pickled Plan?): mdata never unpickles what a client "
                                 "sends; send the plan's spec, Plan.to_spec(), which submit_job and "
                                 "Loader(plan=...) do")
        by_loader = check_bool(r.raw("by_loader", False), r, "by_loader")  # absent: a driver
        out = cls(r.str("job"), r.dict("plan"), r.optional("checkpoint", check_dict),
                  **read_resume_flags(r), by_loader=by_loader,
                  client=check_str(r.raw("client", ""), r, "client"))
        r.done()
        return out


@dataclass(frozen=True)
class JobRequest(Request):
    """A request about one job, named by ``job``."""

    job: str

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job}

    @classmethod
    def from_msg(cls, msg: Any):
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"))
        r.done()
        return out


@dataclass(frozen=True)
class JobInfoRequest(JobRequest):
    handler = Handler.JOB_INFO
    reply = JobInfo


@dataclass(frozen=True)
class JobsReply(Message):
    """Names of the registered jobs, sorted (on the wire: a plain list)."""

    jobs: tuple[str, ...]

    def to_msg(self) -> list[str]:
        return list(self.jobs)

    @classmethod
    def from_msg(cls, msg: Any) -> "JobsReply":
        r = Reader(cls.__name__, {"jobs": msg})
        return cls(r.list("jobs", check_str))


@dataclass(frozen=True)
class JobsRequest(Request):
    handler = Handler.JOBS
    reply = JobsReply

    def to_msg(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_msg(cls, msg: Any) -> "JobsRequest":
        Reader(cls.__name__, msg).done()
        return cls()


@dataclass(frozen=True)
class CloseJobRequest(JobRequest):
    """Close the job: its chunks and batches are released (idempotent). ``client``: the
    caller's Dask client id; only the job's driver or one of its Loaders may close it
    (mdata.planner.callers)."""

    handler = Handler.CLOSE_JOB
    reply = OkReply

    client: str = field(default="", kw_only=True)

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "client": self.client}

    @classmethod
    def from_msg(cls, msg: Any) -> "CloseJobRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), client=check_str(r.raw("client", ""), r, "client"))
        r.done()
        return out


# -- checkpoint ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointReply(Message):
    """The job's checkpoint (on the wire: ``Checkpoint.to_dict()`` itself)."""

    checkpoint: Checkpoint

    def to_msg(self) -> dict[str, Any]:
        return self.checkpoint.to_dict()

    @classmethod
    def from_msg(cls, msg: Any) -> "CheckpointReply":
        return cls(read_checkpoint(msg, Reader(cls.__name__, {}), "checkpoint"))


@dataclass(frozen=True)
class CheckpointRequest(JobRequest):
    """The checkpoint as of having consumed every step before ``step``."""

    handler = Handler.CHECKPOINT
    reply = CheckpointReply

    step: int = field(kw_only=True)

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "step": self.step}

    @classmethod
    def from_msg(cls, msg: Any) -> "CheckpointRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), step=r.int("step"))
        r.done()
        return out
