"""Consumption tells over the client's batched stream, each confirmed by the scheduler.

A :class:`~mdata.wire.host_location.ConsumedRequest` is an RPC: the scheduler pays a comm read,
a dispatch through ``handle_comm`` and a reply write for each one, and with pushed locations
(:mod:`mdata.wire.location_push`) ranks seldom send the location requests that would otherwise
carry their consumption, so those RPCs became the largest per-client message cost. Instead, the
ranks of one client send their tells as one :class:`StreamedTells` over the client's existing
batched stream to the scheduler (op :data:`TELL_OP`), and the scheduler answers with one
:class:`TellsConfirmed` over its stream to the client (op :data:`CONFIRM_OP`), which Dask
batches with the pushes already going there. The confirmation carries the message's sequence
number and each tell's error, as the RPC's reply did.

A stream message has no reply deadline of its own, so the sender keeps it until confirmed: one
not confirmed within the usual reply timeout, or sent on a stream that was replaced since (a
reconnect), goes again with the same sequence number. The scheduler therefore takes a repeated
tell of a step as harmless (the runtime counts each rank's step once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mdata.errors import MdataError
from mdata.wire.codec import Message, Reader
from mdata.wire.errors import error_from_msg, error_to_msg
from mdata.wire.host_location import ConsumedTell, read_tells

__all__ = ["TELL_OP", "CONFIRM_OP", "StreamedTells", "TellsConfirmed"]

#: The op of a tell on the client's batched stream to the scheduler (``scheduler.stream_handlers``).
TELL_OP = "mdata-consumed"
#: The op of a confirmation on the scheduler's stream to the client (``client._stream_handlers``).
CONFIRM_OP = "mdata-consumed-confirm"


@dataclass(frozen=True)
class StreamedTells(Message):
    """What several ranks of one client consumed, told over its stream: the tells of a
    ``ConsumedRequest`` and ``seq``, this client's number for the message (a resend repeats it)."""

    job: str
    seq: int
    tells: tuple[ConsumedTell, ...]

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "seq": self.seq, "tells": [t.to_msg() for t in self.tells]}

    @classmethod
    def from_msg(cls, msg: Any) -> "StreamedTells":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), r.int("seq"),
                  read_tells(r))
        r.done()
        return out


@dataclass(frozen=True)
class TellsConfirmed(Message):
    """The scheduler took :class:`StreamedTells` ``seq`` of ``job``: per tell, in its order, the
    error it met (typed) or None; ``error``: the message as a whole was refused (no such job, a
    malformed message), every tell fails with it (``errors`` is then empty)."""

    job: str
    seq: int
    errors: tuple[MdataError | None, ...] = ()
    error: MdataError | None = None

    def to_msg(self) -> dict[str, Any]:
        out: dict[str, Any] = {"job": self.job, "seq": self.seq,
                               "errors": [None if e is None else error_to_msg(e) for e in self.errors]}
        if self.error is not None:
            out["error"] = error_to_msg(self.error)
        return out

    @classmethod
    def from_msg(cls, msg: Any) -> "TellsConfirmed":
        r = Reader(cls.__name__, msg)
        job, seq = r.str("job"), r.int("seq")
        errors = r.list("errors", lambda value, _r, _name: None if value is None
                        else error_from_msg(value))
        error = r.raw("error", None)
        r.done()
        return cls(job, seq, errors, None if error is None else error_from_msg(error))

    def per_tell(self, count: int) -> tuple[MdataError | None, ...]:
        """Each of ``count`` tells' error (the whole message's error for each, when refused)."""
        return (self.error,) * count if self.error is not None else self.errors
