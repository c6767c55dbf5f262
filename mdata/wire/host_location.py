"""One request for every rank of one process: the scheduler sees hosts, not ranks.

Ranks that share one Dask client (threads of one trainer process, a per-host JAX-style driver,
the control-plane benchmark's simulated hosts) ask where their batches are together: one
:class:`HostLocationRequest` per process and step carries each rank's :class:`LocationAsk` (its
lease, the step it received before, the steps its loop consumed), and one
:class:`HostLocationReply` answers each in the asks' order with the reply a lone
:class:`~mdata.wire.delivery.BatchLocationRequest` would have had. The step's checkpoint, the
same for every rank, travels once. Consumption that no location request carried goes the same
way: one :class:`ConsumedRequest` per process carries each rank's :class:`ConsumedTell`, and its
:class:`ConsumedReply` has each rank's error (a stale lease, a step not balanced) or none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mdata.wire.codec import (
    Handler, Message, Reader, Request, Status, check_bool, check_dict, check_float, check_int,
    check_list, check_str,
)
from mdata.errors import MdataError
from mdata.wire.delivery import BatchLocationReply, read_told, read_waits, told_msg
from mdata.wire.errors import error_from_msg, error_to_msg
from mdata.wire.packed_checkpoint import checkpoint_msg, unpacked

__all__ = ["LocationAsk", "HostLocationRequest", "HostLocationReply", "ConsumedTell",
           "ConsumedRequest", "ConsumedReply"]


@dataclass(frozen=True)
class LocationAsk(Message):
    """One rank's part of a :class:`HostLocationRequest`: the fields of a
    :class:`~mdata.wire.delivery.BatchLocationRequest` that belong to the rank."""

    rank: int
    token: str = ""
    generation: int = 0
    delivered: int | None = None
    consumed: tuple[int, ...] = ()
    stalled_s: float = -1.0
    waits: tuple[float, ...] = ()

    def to_msg(self) -> dict[str, Any]:
        return {"rank": self.rank, **told_msg(self)}

    @classmethod
    def from_msg(cls, msg: Any) -> "LocationAsk":
        r = Reader(cls.__name__, msg)
        out = cls(r.int("rank"), *read_told(r))
        r.done()
        return out


@dataclass(frozen=True)
class HostLocationReply(Message):
    """One :class:`~mdata.wire.delivery.BatchLocationReply` per ask, in the request's order."""

    answers: tuple[BatchLocationReply, ...]
    pushing: bool = False  # the scheduler pushes the asks' later locations (mdata.wire.location_push)
    tells: bool = False  # the scheduler takes consumption over the client's stream (mdata.wire.stream_tells)

    def to_msg(self) -> dict[str, Any]:
        shared = next((a.location.checkpoint for a in self.answers if a.location is not None), None)
        answers = []
        for answer in self.answers:
            out = answer.to_msg()
            mine = None if answer.location is None else answer.location.checkpoint
            if mine is not None and (mine is shared or mine == shared):
                del out["checkpoint"]  # sent once, below
            answers.append(out)
        out = {"answers": answers, "checkpoint": checkpoint_msg(shared)}
        if self.pushing:
            out["pushing"] = True
        if self.tells:
            out["tells"] = True
        return out

    @classmethod
    def from_msg(cls, msg: Any) -> "HostLocationReply":
        r = Reader(cls.__name__, msg)
        shared = unpacked(r.raw("checkpoint", None))
        if shared is not None:
            check_dict(shared, r, "checkpoint")

        def answer(value: Any, _r: Reader, _name: str) -> BatchLocationReply:
            if isinstance(value, dict) and value.get("status") == Status.OK.value \
                    and "checkpoint" not in value:
                value = {**value, "checkpoint": shared}
            return BatchLocationReply.from_msg(value)

        out = cls(r.list("answers", answer), check_bool(r.raw("pushing", False), r, "pushing"),
                  check_bool(r.raw("tells", False), r, "tells"))
        r.done()
        return out


@dataclass(frozen=True)
class HostLocationRequest(Request):
    """Long poll of several ranks of one process for the same ``step``: answered when their
    batches are built (the ones ready by then; the others ``TIMEOUT``, to ask again), within
    ``timeout`` seconds. Each ask is checked on its own: a bad or stale one is answered
    ``FAILED`` without failing the others. ``client``: the asking Dask client's id, to subscribe
    it to pushed locations of the asks' ranks (:mod:`mdata.wire.location_push`); empty: none."""

    handler = Handler.HOST_LOCATION
    reply = HostLocationReply

    job: str
    step: int
    timeout: float
    asks: tuple[LocationAsk, ...]
    client: str = ""

    def to_msg(self) -> dict[str, Any]:
        out = {"job": self.job, "step": self.step, "timeout": self.timeout,
               "asks": [ask.to_msg() for ask in self.asks]}
        if self.client:
            out["client"] = self.client
        return out

    @classmethod
    def from_msg(cls, msg: Any) -> "HostLocationRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), r.int("step"), r.float("timeout"),
                  r.list("asks", lambda value, _r, _name: LocationAsk.from_msg(value)),
                  check_str(r.raw("client", ""), r, "client"))
        r.done()
        return out


@dataclass(frozen=True)
class ConsumedTell(Message):
    """Rank ``rank``'s training loop consumed ``steps`` (ascending; each implies its delivery);
    ``token``/``generation``: its Loader's lease; ``stalled_s`` as in
    :class:`~mdata.wire.delivery.AckRequest`; ``waits`` as in
    :class:`~mdata.wire.delivery.BatchLocationRequest` (each step's exposed wait: the training
    loop's). ``waited``: per step of ``steps``, how long the rank's prefetcher waited for that
    step's pushed location (-1: it long-polled, and the scheduler measured the wait itself);
    empty: none told."""

    rank: int
    steps: tuple[int, ...]
    token: str = ""
    generation: int = 0
    stalled_s: float = -1.0
    waits: tuple[float, ...] = ()
    waited: tuple[float, ...] = ()

    def to_msg(self) -> dict[str, Any]:
        out = {"rank": self.rank, "steps": [int(s) for s in self.steps], "token": self.token,
               "generation": self.generation, "stalled_s": self.stalled_s}
        if self.waits:  # only when measured: a scheduler that predates it reads the rest
            out["waits"] = [float(w) for w in self.waits]
        if self.waited:
            out["waited"] = [float(w) for w in self.waited]
        return out

    @classmethod
    def from_msg(cls, msg: Any) -> "ConsumedTell":
        """Thousands arrive per step at scale (one per rank): a tell whose every field has its
        plain type is taken as it is; anything else goes through the checked reading below,
        which reads the same values or names the field at fault."""
        if type(msg) is dict and msg.keys() <= _TELL_FIELDS:
            rank, steps, token = msg.get("rank"), msg.get("steps"), msg.get("token", "")
            generation, stalled = msg.get("generation", 0), msg.get("stalled_s", -1.0)
            waits, waited = msg.get("waits", ()), msg.get("waited", ())
            if (type(rank) is int and type(token) is str and type(generation) is int
                    and type(stalled) is float and type(steps) in _SEQ and type(waits) in _SEQ
                    and type(waited) in _SEQ and all(type(s) is int for s in steps)
                    and all(type(w) is float for w in waits) and all(type(w) is float for w in waited)
                    and (not waits or len(waits) == len(steps))
                    and (not waited or len(waited) == len(steps))):
                return cls(rank, tuple(steps), token, generation, stalled, tuple(waits), tuple(waited))
        return cls._read(msg)

    @classmethod
    def _read(cls, msg: Any) -> "ConsumedTell":
        r = Reader(cls.__name__, msg)
        steps = r.list("steps", check_int)
        out = cls(r.int("rank"), steps,
                  check_str(r.raw("token", ""), r, "token"),
                  check_int(r.raw("generation", 0), r, "generation"),
                  check_float(r.raw("stalled_s", -1.0), r, "stalled_s"),
                  read_waits(r, steps, "steps"),
                  check_list(r.raw("waited", []), r, "waited", check_float))
        r.done()
        if out.waited and len(out.waited) != len(out.steps):
            raise r.fail("waited", f"has {len(out.waited)} entries for {len(out.steps)} steps")
        return out


def read_tells(r: Reader) -> tuple[ConsumedTell, ...]:
    """The ``tells`` of a message of several ranks' consumption (one per rank: no per-item
    field name is made, a bad tell's error names its own field)."""
    tells = r.raw("tells")
    if type(tells) not in _SEQ:
        return r.list("tells", lambda value, _r, _name: ConsumedTell.from_msg(value))  # its error
    return tuple(map(ConsumedTell.from_msg, tells))


#: A tell's fields, and the sequence types a decoded message has (Dask decodes lists as tuples).
_TELL_FIELDS = frozenset({"rank", "steps", "token", "generation", "stalled_s", "waits", "waited"})
_SEQ = (list, tuple)


@dataclass(frozen=True)
class ConsumedReply(Message):
    """Per tell, in the request's order: the error it met (typed), or None when it was taken."""

    errors: tuple[MdataError | None, ...]

    def to_msg(self) -> dict[str, Any]:
        return {"errors": [None if e is None else error_to_msg(e) for e in self.errors]}

    @classmethod
    def from_msg(cls, msg: Any) -> "ConsumedReply":
        r = Reader(cls.__name__, msg)
        out = cls(r.list("errors", lambda value, _r, _name: None if value is None
                         else error_from_msg(value)))
        r.done()
        return out


@dataclass(frozen=True)
class ConsumedRequest(Request):
    """What the training loops of several ranks of one process consumed, told together (the
    steps no location request carried in time). Each tell is checked on its own."""

    handler = Handler.CONSUMED
    reply = ConsumedReply

    job: str
    tells: tuple[ConsumedTell, ...]

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "tells": [tell.to_msg() for tell in self.tells]}

    @classmethod
    def from_msg(cls, msg: Any) -> "ConsumedRequest":
        r = Reader(cls.__name__, msg)
        out = cls(r.str("job"), read_tells(r))
        r.done()
        return out
