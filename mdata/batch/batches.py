"""The two batch value types: a DP group's whole batch (``DPBatch``) and one rank's view (``Batch``).

A constructor holds a :class:`DPBatch`; each trainer rank receives a :class:`Batch`, cut by
:func:`mdata.batch.views.rank_view`. Numpy only: turning a batch into torch tensors is the
trainer's job (:func:`mdata.trainer.tensors.batch_to_torch`), so these types never import their
consumers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from mdata.batch.micro import MicroBatch
from mdata.batch.views import rank_view
from mdata.errors import BatchError

__all__ = ["Batch", "DPBatch"]


def _total_nbytes(micro_batches: Sequence[MicroBatch]) -> int:
    return sum(mb.nbytes for mb in micro_batches)


def _normalize_batch_fields(batch) -> None:
    """Frozen batches hold a tuple of micro-batches and a plain ``{source: tokens}`` dict, whatever
    sequence or mapping (numpy ints included) they were built from."""
    object.__setattr__(batch, "micro_batches", tuple(batch.micro_batches))
    object.__setattr__(
        batch, "tokens_per_source", {str(k): int(v) for k, v in batch.tokens_per_source.items()}
    )


def _views(
    where: str,
    micro_batches: Sequence[MicroBatch],
    cp: int,
    cp_rank: int | None,
    receives_tokens: bool,
    receives_labels: bool,
) -> tuple[MicroBatch, ...]:
    out = []
    for mb in micro_batches:
        try:
            out.append(rank_view(mb, cp, cp_rank, receives_tokens=receives_tokens,
                                 receives_labels=receives_labels))
        except BatchError as err:
            raise BatchError(f"{where}, micro-batch {mb.index}: {err}") from None
    return tuple(out)


@dataclass(frozen=True, eq=False)
class Batch:
    """What one trainer rank receives for one step: its view of its DP group's micro-batches.

    ``cp_rank`` is the CP rank whose zigzag slice this is, or ``None`` for the whole (unsplit)
    sequence: what the receiving rank gets under ``broadcast_at("cp")``; it hands the batch to its
    CP group, and each member cuts its slice with :meth:`cp_slice`. ``cp`` is the DP group's CP
    size either way. ``tokens_per_source`` counts the tokens (after truncation, image tokens
    included) each source contributed to the whole DP batch, for per-source loss and throughput
    accounting.
    """

    step: int
    dp_rank: int
    cp_rank: int | None
    cp: int
    micro_batches: tuple[MicroBatch, ...]
    tokens_per_source: Mapping[str, int] = field(default_factory=dict)
    receives_tokens: bool = True
    receives_labels: bool = True

    def __post_init__(self) -> None:
        _normalize_batch_fields(self)

    @property
    def is_whole(self) -> bool:
        """Whether this batch holds whole sequences (``cp_rank is None``), not one CP slice."""
        return self.cp_rank is None

    @property
    def nbytes(self) -> int:
        """Bytes of array data held (what crosses the wire, headers aside)."""
        return _total_nbytes(self.micro_batches)

    @property
    def sample_ids(self) -> np.ndarray:
        """All sample ids of the batch, micro-batch by micro-batch, int64 ``[n, 3]``."""
        if not self.micro_batches:
            return np.zeros((0, 3), dtype=np.int64)
        return np.concatenate([mb.sample_ids for mb in self.micro_batches])

    def cp_slice(self, cp_rank: int) -> "Batch":
        """The slice CP rank ``cp_rank`` would have received, cut from a whole batch.

        Equal to ``DPBatch.for_rank(cp_rank, ...)`` with this batch's pipeline role, so a CP group
        fed by one receiver (``broadcast_at("cp")``) trains on exactly the tokens it would have
        pulled itself.
        """
        where = f"step {self.step}, dp rank {self.dp_rank}"
        if not self.is_whole:
            raise BatchError(
                f"{where}: this batch is already CP rank {self.cp_rank}'s slice; only a whole "
                "batch (cp_rank=None, the broadcast_at('cp') receiver's) can be cut again"
            )
        if not 0 <= cp_rank < self.cp:
            raise BatchError(
                f"{where}: cp rank {cp_rank} is out of range for cp={self.cp}; pass a rank in "
                f"[0, {self.cp})"
            )
        return Batch(
            step=self.step,
            dp_rank=self.dp_rank,
            cp_rank=cp_rank,
            cp=self.cp,
            micro_batches=_views(where, self.micro_batches, self.cp, cp_rank,
                                 self.receives_tokens, self.receives_labels),
            tokens_per_source=self.tokens_per_source,
            receives_tokens=self.receives_tokens,
            receives_labels=self.receives_labels,
        )


@dataclass(frozen=True, eq=False)
class DPBatch:
    """One step's batch for one DP group, before the CP split: what a constructor holds.

    Micro-batch fields: ``input_ids``, ``labels``, ``position_ids`` (int32 ``[seq_len]``),
    ``cu_seqlens`` (int32 ``[docs+1]``, padded boundaries), ``seqlens`` (int32 ``[docs]``), and
    when the batch has images ``pixels``, ``image_shapes``, ``image_token_counts``.
    """

    step: int
    dp_rank: int
    cp: int
    micro_batches: tuple[MicroBatch, ...]
    tokens_per_source: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if int(self.cp) < 1:
            raise BatchError(f"step {self.step}, dp rank {self.dp_rank}: cp must be >= 1")
        _normalize_batch_fields(self)

    @property
    def nbytes(self) -> int:
        return _total_nbytes(self.micro_batches)

    def for_rank(
        self, cp_rank: int | None, *, receives_tokens: bool = True, receives_labels: bool = True
    ) -> Batch:
        """The view CP rank ``cp_rank`` of this DP group receives (see :mod:`mdata.batch`).

        ``cp_rank=None``: the whole sequence, unsplit (the receiver under ``broadcast_at("cp")``).
        With ``cp == 1`` or ``cp_rank=None`` the arrays are views of this batch's (no copy).
        """
        if cp_rank is not None and not 0 <= cp_rank < self.cp:
            raise BatchError(
                f"step {self.step}, dp rank {self.dp_rank}: cp rank {cp_rank} is out of range "
                f"for cp={self.cp}; pass a rank in [0, {self.cp}) or None for the whole sequence"
            )
        where = f"step {self.step}, dp rank {self.dp_rank}"
        return Batch(
            step=self.step,
            dp_rank=self.dp_rank,
            cp_rank=cp_rank,
            cp=self.cp,
            micro_batches=_views(where, self.micro_batches, self.cp, cp_rank,
                                 receives_tokens, receives_labels),
            tokens_per_source=self.tokens_per_source,
            receives_tokens=receives_tokens,
            receives_labels=receives_labels,
        )
