"""Messages of a trainer's lease on its rank: attach (claim the rank, maybe resume) and detach.

A Loader attaches once before iterating. It says who it is (its Dask client id, a token of its
own, host and pid, so an error about a second Loader can name both) and brings the checkpoint it
resumes from, if any. The reply says which *generation* of the job it joined and where it
starts; every later request of that Loader carries the token and generation, so the Planner can
tell a Loader of an older generation (the job was rewound since) to restart from its checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mdata.wire.codec import Handler, Message, Reader, Request, check_dict
from mdata.wire.jobs import OkReply, read_resume_flags, resume_flags_msg

__all__ = ["AttachRequest", "AttachReply", "DetachRequest"]


@dataclass(frozen=True)
class AttachReply(Message):
    """The generation of the job the Loader joined and the first step it receives.

    ``job_data`` is what every checkpoint of the job shares (``identity``, ``data``,
    ``schedule``, ``listings``; see mdata.checkpoint): the checkpoints that travel with batches
    leave it out to stay small, and the Loader adds it to the ones it hands out."""

    generation: int
    start_step: int
    job_data: Mapping[str, Any] | None = None

    def to_msg(self) -> dict[str, Any]:
        return {"generation": self.generation, "start_step": self.start_step,
                "job_data": None if self.job_data is None else dict(self.job_data)}

    @classmethod
    def from_msg(cls, msg: Any) -> "AttachReply":
        r = Reader(cls.__name__, msg)
        out = cls(r.int("generation"), r.int("start_step"), r.optional("job_data", check_dict))
        r.done()
        return out


@dataclass(frozen=True)
class AttachRequest(Request):
    """Lease ``rank`` of ``job`` to this Loader; ``checkpoint`` (a ``Checkpoint.to_dict()``):
    resume from it, rewinding the job if it runs elsewhere (see mdata.planner.roster), with the
    resume options ``accept_appended_shards`` / ``allow_mixture_change``."""

    handler = Handler.ATTACH
    reply = AttachReply

    job: str
    rank: int
    client: str
    token: str
    host: str
    pid: int
    checkpoint: Mapping[str, Any] | None = None
    accept_appended_shards: bool = False
    allow_mixture_change: bool = False

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "rank": self.rank, "client": self.client, "token": self.token,
                "host": self.host, "pid": self.pid,
                "checkpoint": None if self.checkpoint is None else dict(self.checkpoint),
                **resume_flags_msg(self)}

    @classmethod
    def from_msg(cls, msg: Any) -> "AttachRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), r.int("rank"), r.str("client"), r.str("token"), r.str("host"),
                  r.int("pid"), r.optional("checkpoint", check_dict), **read_resume_flags(r))
        r.done()
        return out


@dataclass(frozen=True)
class DetachRequest(Request):
    """The Loader holding ``rank`` with ``token`` closed: its lease ends now."""

    handler = Handler.DETACH
    reply = OkReply

    job: str
    rank: int
    token: str

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "rank": self.rank, "token": self.token}

    @classmethod
    def from_msg(cls, msg: Any) -> "DetachRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), r.int("rank"), r.str("token"))
        r.done()
        return out
