"""Locations the scheduler pushes to a client, so that its ranks need not ask for them.

A client whose ranks long-polled with :class:`~mdata.wire.host_location.HostLocationRequest`
naming the client (``client``: its Dask id) is *subscribed* for those ranks: from then on, when
a DP group's batch of a later step is built, the Planner sends one :class:`LocationPush` over
the client's existing batched stream (op :data:`PUSH_OP`; no round trip, no reply) with where
the batch is and each subscribed rank's slice of it. Groups built within a moment of each other
travel together, and a step's checkpoint travels once for all its groups.

A push is a hint, never the authority: a rank that has none for its step (nothing arrived
within its wait, the client reconnected, the batch moved because its constructor died) long-polls
as before, and the lease and generation checks of every later message stand. A push with
``reset`` says the job failed, rewound or closed: the client drops what it holds for the job and
its ranks ask again (and hear why).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mdata.wire.codec import (
    Message, Reader, check_bool, check_int, check_list, check_str, key_msg, key_of,
)
from mdata.wire.delivery import BatchLocation
from mdata.wire.jobs import read_checkpoint
from mdata.wire.packed_checkpoint import checkpoint_msg

__all__ = ["PUSH_OP", "PushedGroup", "LocationPush"]

#: The op of a push on the client's batched stream (``client._stream_handlers``).
PUSH_OP = "mdata-locations"


@dataclass(frozen=True)
class PushedGroup(Message):
    """The batch of DP group ``dp_rank`` for ``step`` (task ``key`` on ``who_has``) and, per
    subscribed rank of the client in that group, ``(rank, cp_rank, receives_tokens,
    receives_labels)``: the fields of a :class:`~mdata.wire.delivery.BatchLocation` less the
    step's checkpoint."""

    step: int
    dp_rank: int
    key: tuple
    who_has: tuple[str, ...]
    ranks: tuple[tuple[int, int, bool, bool], ...]

    def to_msg(self) -> dict[str, Any]:
        return {"step": self.step, "dp_rank": self.dp_rank, "key": key_msg(self.key),
                "who_has": list(self.who_has), "ranks": [list(r) for r in self.ranks]}

    @classmethod
    def from_msg(cls, msg: Any) -> "PushedGroup":
        r = Reader(cls.__name__, msg)

        def rank(value: Any, r: Reader, field: str) -> tuple[int, int, bool, bool]:
            if not isinstance(value, (list, tuple)) or len(value) != 4:
                raise r.fail(field, f"entries must be [rank, cp_rank, receives_tokens, "
                                    f"receives_labels], got {value!r:.100}")
            return (check_int(value[0], r, field), check_int(value[1], r, field),
                    check_bool(value[2], r, field), check_bool(value[3], r, field))

        out = cls(r.int("step"), r.int("dp_rank"), key_of(r.raw("key"), r, "key"),
                  r.list("who_has", check_str), r.list("ranks", rank))
        r.done()
        return out


@dataclass(frozen=True)
class LocationPush(Message):
    """Built batches of ``job``'s generation ``generation`` for one client's subscribed ranks;
    ``checkpoints``: per step of ``groups``, the checkpoint of having consumed it
    (``Checkpoint.to_dict()``). ``reset``: the job failed, rewound or closed (no groups)."""

    job: str
    generation: int
    groups: tuple[PushedGroup, ...] = ()
    checkpoints: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    reset: bool = False

    def to_msg(self) -> dict[str, Any]:
        return {"job": self.job, "generation": self.generation,
                "groups": [g.to_msg() for g in self.groups],
                "checkpoints": [[int(s), checkpoint_msg(c)] for s, c in self.checkpoints.items()],
                "reset": self.reset}

    @classmethod
    def from_msg(cls, msg: Any) -> "LocationPush":
        r = Reader(cls.__name__, msg)
        job, generation = r.str("job"), r.int("generation")
        groups = r.list("groups", lambda value, _r, _name: PushedGroup.from_msg(value))

        def step_checkpoint(value: Any, r: Reader, field: str) -> tuple[int, dict]:
            pair = check_list(value, r, field, lambda v, _r, _f: v)
            if len(pair) != 2:
                raise r.fail(field, f"entries must be [step, checkpoint], got {value!r:.100}")
            # read (checked) once per step, shared by every rank's location of the step
            return check_int(pair[0], r, field), read_checkpoint(pair[1], r, field).to_dict()

        checkpoints = dict(r.list("checkpoints", step_checkpoint))
        reset = check_bool(r.raw("reset", False), r, "reset")
        r.done()
        missing = {g.step for g in groups} - set(checkpoints)
        if missing:
            raise r.fail("checkpoints", f"has none for step(s) {sorted(missing)} of its groups")
        return cls(job, generation, groups, checkpoints, reset)

    def locations(self) -> Iterator[tuple[int, int, BatchLocation]]:
        """``(step, rank, location)`` for every rank of every group, as a location request
        would have answered it."""
        for g in self.groups:
            checkpoint = self.checkpoints[g.step]
            for rank, cp_rank, tokens, labels in g.ranks:
                yield g.step, rank, BatchLocation(g.key, g.who_has, cp_rank, tokens, labels,
                                                  checkpoint, g.dp_rank)
