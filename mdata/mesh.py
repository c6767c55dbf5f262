"""ClientPlaceTree: the trainers' device mesh (DP x PP x CP x TP) as a pure value object.

The Planner must know, for every trainer rank, which slice of a step's data it needs: all ranks of
one data-parallel (DP) index consume the same DP shard, but only the first pipeline (PP) stage needs
token ids, only the last needs labels, middle stages need only metadata (sequence lengths), each
context-parallel (CP) rank needs its own part of every sequence, and tensor-parallel (TP) ranks need
identical copies (or none but TP rank 0, when the trainer broadcasts on the GPU).

Ranks are laid out like Megatron-Core's default: the axis named first in ``order`` varies fastest.
With the default ``"tp-cp-dp-pp"``::

    rank = tp + TP * (cp + CP * (dp + DP * pp))

Everything here is integer arithmetic (and numpy for the vectorised forms), so a 16,384-rank mesh is
handled in one process in microseconds; no per-rank objects are created unless asked for.
"""

# No postponed annotations here: the constructors NamedTuple generates carry these field types,
# and tools that read them (the API reference, scripts/build_docs.py) cannot resolve ``np`` there.
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np

from mdata.errors import MeshError

__all__ = [
    "AXES",
    "BroadcastAxis",
    "ClientPlaceTree",
    "Delivery",
    "MeshCoordinate",
    "MeshCoordinates",
    "RankRole",
]

#: The four mesh axes, in the order of :class:`MeshCoordinate`'s fields.
AXES: tuple[str, ...] = ("dp", "pp", "cp", "tp")

#: Where the trainer broadcasts on the GPU instead of receiving from the constructor:
#: ``"tp"`` (only TP rank 0 of each group receives), ``"cp"`` (only CP rank 0 receives whole
#: sequences and broadcasts them; each CP rank cuts its slice), ``"pp"`` (only the first
#: pipeline stage receives, with the labels of the last), or ``None`` (every rank receives its
#: own copy).
BroadcastAxis = Literal["tp", "cp", "pp"] | None

_BROADCAST_AXES = ("tp", "cp", "pp")


class MeshCoordinate(NamedTuple):
    """One rank's position on the mesh: data-parallel index, pipeline stage, CP rank, TP rank."""

    dp: int
    pp: int
    cp: int
    tp: int


class MeshCoordinates(NamedTuple):
    """Coordinates of many ranks at once: one int64 array per axis, aligned with the ranks asked."""

    dp: np.ndarray
    pp: np.ndarray
    cp: np.ndarray
    tp: np.ndarray


class Delivery(NamedTuple):
    """What the constructor sends one receiving rank each step: the arguments of
    :meth:`mdata.batch.DPBatch.for_rank`.

    ``cp_rank`` is the zigzag slice to send, or ``None`` for the whole unsplit sequence (the
    receiver under ``broadcast_at("cp")`` gets its whole CP group's data).
    """

    cp_rank: int | None
    receives_tokens: bool
    receives_labels: bool


@dataclass(frozen=True)
class RankRole:
    """What one trainer rank needs from a step's batch.

    ``receives_tokens`` is true on the first pipeline stage (it embeds token ids);
    ``receives_labels`` on the last (it computes the loss); a middle stage is ``metadata_only``: it
    needs sequence lengths / ``cu_seqlens`` for attention but no token payload. With ``pp == 1`` the
    single stage is both first and last.
    """

    rank: int
    coordinate: MeshCoordinate
    pp_size: int
    cp_size: int
    tp_size: int

    @property
    def dp_rank(self) -> int:
        return self.coordinate.dp

    @property
    def pp_stage(self) -> int:
        return self.coordinate.pp

    @property
    def cp_rank(self) -> int:
        return self.coordinate.cp

    @property
    def tp_rank(self) -> int:
        return self.coordinate.tp

    @property
    def receives_tokens(self) -> bool:
        return self.coordinate.pp == 0

    @property
    def receives_labels(self) -> bool:
        return self.coordinate.pp == self.pp_size - 1

    @property
    def metadata_only(self) -> bool:
        return not (self.receives_tokens or self.receives_labels)

    def is_broadcast_source(self, axis: BroadcastAxis) -> bool:
        """Whether this rank receives data from the constructor when broadcasting at ``axis``.

        With ``axis=None`` every rank receives its own copy. With ``"tp"`` only TP rank 0 of each
        TP group receives and the trainer broadcasts to the other TP ranks on the GPU (one copy over
        the network per TP group instead of ``tp``); ``"cp"`` likewise for CP rank 0, ``"pp"`` for
        the first pipeline stage.
        """
        _check_broadcast_axis(axis)
        if axis is None:
            return True
        return getattr(self.coordinate, axis) == 0

    def delivery(self, axis: BroadcastAxis) -> Delivery | None:
        """What this rank receives from the constructor under ``broadcast_at(axis)``; ``None``
        when it receives nothing (it gets the batch by broadcast on the GPU).

        A receiver gets everything the ranks it broadcasts to need: under ``"tp"`` its TP group
        needs one identical copy (its own CP slice, its stage's fields); under ``"cp"`` its CP group
        needs every slice, so it gets the whole sequence (``cp_rank=None``); under ``"pp"`` its
        pipeline group needs the first stage's inputs and the last stage's labels, so it gets both.
        """
        if not self.is_broadcast_source(axis):
            return None
        whole_pipeline = axis == "pp"
        return Delivery(
            cp_rank=None if axis == "cp" else self.cp_rank,
            receives_tokens=self.receives_tokens or whole_pipeline,
            receives_labels=self.receives_labels or whole_pipeline,
        )


def _check_broadcast_axis(axis: object) -> None:
    if axis is not None and axis not in _BROADCAST_AXES:
        raise MeshError(
            f"broadcast_at={axis!r} is not a mesh axis the trainer can broadcast over; "
            f"use one of {_BROADCAST_AXES} or None (every rank receives)"
        )


def _check_size(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise MeshError(f"mesh {name} must be an int >= 1, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise MeshError(f"mesh {name} must be >= 1, got {value}")
    return int(value)


def _parse_order(order: object) -> tuple[str, ...]:
    if not isinstance(order, str):
        raise MeshError(f"mesh order must be a string like 'tp-cp-dp-pp', got {order!r}")
    axes = tuple(order.split("-"))
    if sorted(axes) != sorted(AXES):
        raise MeshError(
            f"mesh order {order!r} must name each of dp, pp, cp, tp exactly once, separated by "
            f"'-', fastest-varying first (Megatron-Core default: 'tp-cp-dp-pp')"
        )
    return axes


@dataclass(frozen=True)
class ClientPlaceTree:
    """The trainers' mesh shape and the rank <-> coordinate mapping.

    ``order`` names the axes fastest-varying first; the default ``"tp-cp-dp-pp"`` matches
    Megatron-Core (TP ranks are adjacent so they share a node's NVLink, PP stages are farthest
    apart). A frozen, hashable, picklable value: the plan stores it and the Planner and trainers
    derive everything from it.
    """

    dp: int
    pp: int = 1
    cp: int = 1
    tp: int = 1
    order: str = "tp-cp-dp-pp"
    _strides: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in AXES:
            object.__setattr__(self, name, _check_size(name, getattr(self, name)))
        axes = _parse_order(self.order)
        strides: dict[str, int] = {}
        stride = 1
        for axis in axes:
            strides[axis] = stride
            stride *= getattr(self, axis)
        object.__setattr__(self, "_strides", strides)

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def from_world_size(
        cls, world_size: int, *, pp: int = 1, cp: int = 1, tp: int = 1, order: str = "tp-cp-dp-pp"
    ) -> "ClientPlaceTree":
        """The mesh with the given PP/CP/TP sizes whose DP size fills ``world_size``."""
        world_size = _check_size("world size", world_size)
        model_parallel = _check_size("pp", pp) * _check_size("cp", cp) * _check_size("tp", tp)
        if world_size % model_parallel:
            raise MeshError(
                f"world size {world_size} is not divisible by pp*cp*tp = {pp}*{cp}*{tp} = "
                f"{model_parallel}; choose sizes whose product divides the number of trainer ranks"
            )
        return cls(world_size // model_parallel, pp=pp, cp=cp, tp=tp, order=order)

    # -- shape -------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.cp * self.tp

    @property
    def shape(self) -> dict[str, int]:
        return {axis: getattr(self, axis) for axis in AXES}

    def validate_world_size(self, n: int) -> None:
        """Raise :class:`MeshError` unless exactly ``n`` trainer ranks fill this mesh."""
        if n != self.world_size:
            raise MeshError(
                f"mesh dp={self.dp} pp={self.pp} cp={self.cp} tp={self.tp} needs world size "
                f"{self.world_size}, got {n}; change the mesh or the number of trainer ranks"
            )

    # -- scalar mapping ----------------------------------------------------------------------

    def _check_rank(self, rank: int) -> int:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise MeshError(f"rank must be an int, got {rank!r}")
        if not 0 <= rank < self.world_size:
            raise MeshError(
                f"rank {rank} is outside the mesh dp={self.dp} pp={self.pp} cp={self.cp} "
                f"tp={self.tp} (ranks 0..{self.world_size - 1})"
            )
        return int(rank)

    def coordinate(self, rank: int) -> MeshCoordinate:
        """The mesh coordinate of ``rank``."""
        rank = self._check_rank(rank)
        s = self._strides
        return MeshCoordinate(
            dp=(rank // s["dp"]) % self.dp,
            pp=(rank // s["pp"]) % self.pp,
            cp=(rank // s["cp"]) % self.cp,
            tp=(rank // s["tp"]) % self.tp,
        )

    def rank(self, coord: MeshCoordinate | tuple[int, int, int, int]) -> int:
        """The rank at ``coord`` (a :class:`MeshCoordinate` or a ``(dp, pp, cp, tp)`` tuple)."""
        if len(coord) != 4:
            raise MeshError(f"a mesh coordinate has 4 fields (dp, pp, cp, tp), got {coord!r}")
        coord = MeshCoordinate(*coord)
        rank = 0
        for axis, value in zip(AXES, coord):
            size = getattr(self, axis)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise MeshError(f"coordinate {axis}={value!r} must be an int")
            if not 0 <= value < size:
                raise MeshError(
                    f"coordinate {axis}={value} is outside the mesh ({axis} size {size}); "
                    f"valid values are 0..{size - 1}"
                )
            rank += int(value) * self._strides[axis]
        return rank

    # -- vectorised mapping ------------------------------------------------------------------

    def coordinates(self, ranks: np.ndarray | None = None) -> MeshCoordinates:
        """Coordinates of ``ranks`` (default: every rank, in rank order) as int64 arrays."""
        r = np.arange(self.world_size, dtype=np.int64) if ranks is None else np.asarray(ranks)
        if r.size and (r.dtype.kind not in "iu" or r.min() < 0 or r.max() >= self.world_size):
            raise MeshError(
                f"ranks must be integers in 0..{self.world_size - 1} for this mesh; "
                f"got dtype {r.dtype} with range [{r.min()}, {r.max()}]"
            )
        r = r.astype(np.int64, copy=False)
        s = self._strides
        return MeshCoordinates(
            dp=(r // s["dp"]) % self.dp,
            pp=(r // s["pp"]) % self.pp,
            cp=(r // s["cp"]) % self.cp,
            tp=(r // s["tp"]) % self.tp,
        )

    def ranks(self, dp, pp, cp, tp) -> np.ndarray:
        """Vectorised inverse of :meth:`coordinates`: int64 ranks of broadcastable coordinate arrays."""
        arrays = [np.asarray(v, dtype=np.int64) for v in (dp, pp, cp, tp)]
        for axis, values in zip(AXES, arrays):
            size = getattr(self, axis)
            if values.size and (values.min() < 0 or values.max() >= size):
                raise MeshError(f"coordinates on axis {axis} must lie in 0..{size - 1}")
        return sum(values * self._strides[axis] for axis, values in zip(AXES, arrays))

    # -- who needs what ----------------------------------------------------------------------

    def _check_dp_rank(self, dp_rank: int) -> int:
        if isinstance(dp_rank, bool) or not isinstance(dp_rank, (int, np.integer)):
            raise MeshError(f"dp rank must be an int, got {dp_rank!r}")
        if not 0 <= dp_rank < self.dp:
            raise MeshError(f"dp rank {dp_rank} is outside 0..{self.dp - 1} (mesh dp={self.dp})")
        return int(dp_rank)

    def _group_ranks(self, dp_rank: int, pp, cp, tp) -> tuple[int, ...]:
        grid = np.meshgrid(pp, cp, tp, indexing="ij")
        ranks = self.ranks(dp_rank, *grid).ravel()
        return tuple(int(r) for r in np.sort(ranks))

    def dp_group(self, dp_rank: int) -> tuple[int, ...]:
        """All ranks (sorted) that consume the DP shard ``dp_rank``: every PP/CP/TP rank of it."""
        dp_rank = self._check_dp_rank(dp_rank)
        return self._group_ranks(
            dp_rank, np.arange(self.pp), np.arange(self.cp), np.arange(self.tp)
        )

    def role(self, rank: int) -> RankRole:
        """What ``rank`` needs from each step (see :class:`RankRole`)."""
        coord = self.coordinate(rank)
        return RankRole(int(rank), coord, pp_size=self.pp, cp_size=self.cp, tp_size=self.tp)

    def receivers(self, dp_rank: int, broadcast_at: BroadcastAxis = None) -> tuple[int, ...]:
        """Ranks (sorted) of DP group ``dp_rank`` that the constructor sends data to.

        Middle PP stages are included: they receive metadata. With ``broadcast_at="tp"`` only TP
        rank 0 of each TP group receives; with ``"cp"`` only CP rank 0; with ``"pp"`` only the
        first pipeline stage.
        """
        _check_broadcast_axis(broadcast_at)
        dp_rank = self._check_dp_rank(dp_rank)
        pp = np.arange(1 if broadcast_at == "pp" else self.pp)
        cp = np.arange(1 if broadcast_at == "cp" else self.cp)
        tp = np.arange(1 if broadcast_at == "tp" else self.tp)
        return self._group_ranks(dp_rank, pp, cp, tp)

    def delivery(self, rank: int, broadcast_at: BroadcastAxis = None) -> Delivery | None:
        """What ``rank`` receives from the constructor (see :meth:`RankRole.delivery`)."""
        return self.role(rank).delivery(broadcast_at)

    def broadcast_source(self, rank: int, broadcast_at: BroadcastAxis = None) -> int | None:
        """The rank that ``rank`` receives its batch from over the GPU interconnect, or ``None``
        when it receives from the constructor itself.

        That is rank 0 along the broadcast axis with ``rank``'s other coordinates: the receiver of
        its TP group (``"tp"``), of its CP group (``"cp"``) or of its pipeline (``"pp"``).
        """
        _check_broadcast_axis(broadcast_at)
        coord = self.coordinate(rank)
        if broadcast_at is None or getattr(coord, broadcast_at) == 0:
            return None
        return self.rank(coord._replace(**{broadcast_at: 0}))

    def describe(self) -> str:
        """One line with every axis and the world size, for logs and error messages."""
        return (
            f"ClientPlaceTree(dp={self.dp}, pp={self.pp}, cp={self.cp}, tp={self.tp}, "
            f"order={self.order!r}, world_size={self.world_size})"
        )
