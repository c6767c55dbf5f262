"""Which trainer process holds each rank of a job, and which *generation* of the job it joined.

Two rules keep delivery exactly-once when trainers die and come back while the cluster lives on:

- **One rank, one Loader.** A rank is leased to one holder (a Dask client plus a token per
  Loader). A second Loader for a rank whose holder is still live gets a :class:`TrainerError`
  naming both; once the holder is gone (its process died, so its client left the scheduler, or
  it closed) another may take the rank over.
- **Resume rewinds the job, for every rank alike.** A Loader that brings a checkpoint for a job
  that exists starts a new generation at the checkpoint's step (the Planner rebuilds its state
  from the checkpoint and replans identically), unless it is joining the generation that another
  rank just started with the same step. A rank that brings a different step gets an error naming
  the ranks and steps that differ; a Loader still running in an older generation gets an error
  telling it to restart from its checkpoint, instead of waiting on steps that will never come.
- **A mismatch ends the resume for every rank.** When the generation is a resume (a rank of it
  brought a checkpoint) and a rank brings another step, the ranks cannot all continue together:
  the refused rank and every rank of the generation get the same :class:`ResumeMismatchError`
  naming the ranks and their steps. A rank that brings a checkpoint afterwards starts a new
  generation; nobody joins the failed one.
- **A rewind is decided, then committed.** :meth:`TrainerRoster.decide` says what an attach
  would do without changing anything; the caller builds and checks the new state from the
  checkpoint, and only then commits it (:meth:`TrainerRoster.commit`). A checkpoint the job cannot
  restore is refused to its rank alone, and every other rank keeps training in its generation.

The roster is pure bookkeeping: liveness is asked of a callable the runtime passes in (the
scheduler knows which clients are connected), and rewinding is left to the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mdata.errors import (
    RankTakenError,
    ResumeMismatchError,
    StaleGenerationError,
    TrainerError,
)

__all__ = ["Holder", "Attachment", "TrainerRoster", "StaleGenerationError", "RankTakenError",
           "ResumeMismatchError"]


@dataclass(frozen=True)
class Holder:
    """Who holds a rank: the Dask client id, a token unique to the Loader, and where it runs."""

    client: str
    token: str
    host: str = ""
    pid: int = 0

    def describe(self) -> str:
        where = f"{self.host}:{self.pid}" if self.host or self.pid else "unknown process"
        return f"Loader {self.token[:8]} in {where} (client {self.client})"


@dataclass(frozen=True)
class Attachment:
    """The roster's answer to an attach: where the rank starts, and whether the job must rewind
    to ``start_step`` first (``rewind``: rebuild the Planner from the checkpoint).

    ``rank``, ``holder``, ``brought`` (the checkpoint step the Loader brought, None for none) and
    ``based_on`` (the generation it was decided in) are what :meth:`TrainerRoster.commit` needs."""

    generation: int
    start_step: int
    rewind: bool
    rank: int = -1
    holder: Holder | None = None
    brought: int | None = None
    based_on: int = -1


@dataclass
class _Generation:
    number: int
    start_step: int
    joined: dict[int, int | None] = field(default_factory=dict)  # rank -> checkpoint step brought
    mismatch: str | None = None  # why this resume cannot continue (ranks brought other steps)

    def is_resume(self) -> bool:
        return any(step is not None for step in self.joined.values())


class TrainerRoster:
    """Leases and generations of one job's ranks (see the module docstring)."""

    def __init__(self, world_size: int, start_step: int) -> None:
        self.world_size = int(world_size)
        self._gen = _Generation(0, int(start_step))
        self._leases: dict[int, Holder] = {}
        #: counts every change to the leases or the generation: a reader that checked some
        #: leases at one version knows they still hold while the version is the same
        self.version = 0

    @property
    def generation(self) -> int:
        return self._gen.number

    @property
    def start_step(self) -> int:
        return self._gen.start_step

    def holders(self) -> dict[int, Holder]:
        return dict(self._leases)

    def attach(
        self,
        rank: int,
        holder: Holder,
        *,
        checkpoint_step: int | None,
        is_live: Callable[[Holder], bool],
        next_step: int | None = None,
    ) -> Attachment:
        """:meth:`decide`, then :meth:`commit` at once (for attaches that need no new state
        built first, and for tests)."""
        att = self.decide(rank, holder, checkpoint_step=checkpoint_step, is_live=is_live,
                          next_step=next_step)
        self.commit(att)
        return att

    def decide(
        self,
        rank: int,
        holder: Holder,
        *,
        checkpoint_step: int | None,
        is_live: Callable[[Holder], bool],
        next_step: int | None = None,
    ) -> Attachment:
        """What leasing ``rank`` to ``holder`` would do; changes nothing but a mismatch.

        ``checkpoint_step``: the step of the checkpoint the Loader brings (None: none).
        ``next_step``: where the rank would continue without a checkpoint (its first step not
        yet consumed, as the runtime saw it); defaults to the generation's start.
        Raises :class:`RankTakenError` (nothing changes) or :class:`ResumeMismatchError` (which
        ends a resume generation for every rank: see the module docstring).
        """
        self._check_rank(rank)
        current = self._leases.get(rank)
        if current is not None and current.token != holder.token and is_live(current):
            raise RankTakenError(
                f"rank {rank} of this job is already served by {current.describe()}; "
                f"{holder.describe()} cannot take it too. Close the other Loader (or let its "
                "process exit) first; one rank has one Loader"
            )
        gen = self._gen
        here = dict(rank=rank, holder=holder, brought=checkpoint_step, based_on=gen.number)
        if checkpoint_step is None:
            if gen.mismatch is not None:
                raise ResumeMismatchError(gen.mismatch)
            start = gen.start_step if next_step is None else max(gen.start_step, int(next_step))
            return Attachment(gen.number, start, rewind=False, **here)
        step = int(checkpoint_step)
        if gen.mismatch is None and rank not in gen.joined and step == gen.start_step:
            return Attachment(gen.number, step, rewind=False, **here)  # joining a resume under way
        if gen.mismatch is None and rank not in gen.joined and gen.joined:
            brought = {r: s for r, s in sorted(gen.joined.items())}
            message = (
                f"rank {rank} resumes from a checkpoint of step {step}, but generation "
                f"{gen.number} of this job started at step {gen.start_step} "
                f"(ranks and the steps they brought, None for none: {brought}); every rank must "
                "resume from the same step: restore all ranks from checkpoints saved together"
            )
            if gen.is_resume():  # its ranks cannot continue without this one: all of them stop
                gen.mismatch = message
                self.version += 1
            raise ResumeMismatchError(message)
        # a rank that already joined this generation (its process restarted), the first rank of a
        # resume to another step, or a resume after a failed one: a new generation at that step
        return Attachment(gen.number + 1, step, rewind=True, **here)

    def commit(self, att: Attachment) -> None:
        """Apply what :meth:`decide` said (after the caller built the rewound state)."""
        if att.holder is None or att.based_on != self._gen.number:
            raise TrainerError(
                f"rank {att.rank}: the roster moved to generation {self._gen.number} since this "
                f"attach was decided in generation {att.based_on}; attach again"
            )
        self._leases[att.rank] = att.holder
        self.version += 1
        if att.rewind:
            self._gen = _Generation(att.generation, att.start_step, {att.rank: att.brought})
        elif att.brought is None:
            self._gen.joined.setdefault(att.rank, None)
        else:
            self._gen.joined[att.rank] = att.brought

    def rewound_by_driver(self, step: int) -> int:
        """A driver re-registered the job from a checkpoint: a new generation nobody joined yet."""
        self._gen = _Generation(self._gen.number + 1, int(step))
        self.version += 1
        return self._gen.number

    def check(self, rank: int, token: str, generation: int) -> None:
        """Raise unless ``token`` holds ``rank`` in the current generation."""
        self._check_rank(rank)
        if generation == self._gen.number and self._gen.mismatch is not None:
            raise ResumeMismatchError(self._gen.mismatch)
        if generation != self._gen.number:
            raise StaleGenerationError(
                f"rank {rank}: this job was rewound to step {self._gen.start_step} (generation "
                f"{self._gen.number}) after this Loader attached (generation {generation}); "
                "restart this rank from its checkpoint like the others"
            )
        holder = self._leases.get(rank)
        if holder is None or holder.token != token:
            other = holder.describe() if holder is not None else "no Loader"
            raise RankTakenError(
                f"rank {rank} is now held by {other}; this Loader ({token[:8]}) lost it"
            )

    def holds_all(self, ranks: Sequence[int], tokens: Sequence[str], generations: Sequence[int]) -> bool:
        """Whether :meth:`check` passes for every ``(rank, token, generation)``: one pass for a
        message of many ranks (False: check them one by one to learn which fails, and why)."""
        gen = self._gen
        if gen.mismatch is not None:
            return False
        number, leases, world = gen.number, self._leases, self.world_size
        for rank, token, generation in zip(ranks, tokens, generations):
            holder = leases.get(rank)
            if generation != number or holder is None or holder.token != token \
                    or not 0 <= rank < world:
                return False
        return True

    def detach(self, rank: int, token: str) -> None:
        """A Loader closed: its lease ends at once (another may take the rank over)."""
        holder = self._leases.get(rank)
        if holder is not None and holder.token == token:
            del self._leases[rank]
            self.version += 1

    def release_client(self, client: str) -> list[int]:
        """A client left the scheduler: every rank it held is free. Returns those ranks."""
        freed = [r for r, h in self._leases.items() if h.client == client]
        for r in freed:
            del self._leases[r]
        self.version += bool(freed)
        return freed

    def _check_rank(self, rank: int) -> None:
        if not 0 <= int(rank) < self.world_size:
            raise TrainerError(f"rank {rank} is outside the job's world of {self.world_size} ranks")
