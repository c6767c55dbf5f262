"""Per-rank views of a micro-batch: the context-parallel zigzag split and the pipeline-stage cut.

A constructor holds one DP group's whole micro-batches; each trainer rank receives a view of them
(:meth:`mdata.batch.DPBatch.for_rank`), and a rank that received the whole sequence under
``broadcast_at("cp")`` cuts its own slice locally the same way (:meth:`mdata.batch.Batch.cp_slice`).
Both go through :func:`rank_view`, so the two paths cannot disagree.

Zigzag: each document (and the trailing padding) is cut into ``2 * cp`` equal chunks; CP rank
``i`` gets chunks ``i`` and ``2 * cp - 1 - i`` of every document, in document order, so every
rank gets the same causal-attention work (the rule of TransformerEngine's THD layout and
ring-flash-attention's zigzag varlen kernels).
"""

from __future__ import annotations

import numpy as np

from mdata.batch.micro import IMAGE_FIELDS, LABEL_FIELDS, TOKEN_FIELDS, FieldValue, MicroBatch
from mdata.errors import BatchError

__all__ = ["zigzag_indices", "rank_view"]


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(s, s + n)`` for each (s, n), vectorized."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(np.asarray(starts, dtype=np.int64) - ends + lengths, lengths)
    return shift + np.arange(total, dtype=np.int64)


def zigzag_indices(cu_seqlens: np.ndarray, seq_len: int, cp: int, cp_rank: int) -> np.ndarray:
    """Indices into a packed sequence of the tokens CP rank ``cp_rank`` holds, in local order.

    With ``cp > 1`` every segment (each document ``[cu[d], cu[d+1])``, then the trailing padding
    ``[cu[-1], seq_len)``) must have a length divisible by ``2 * cp``; it is cut into ``2 * cp``
    equal chunks and the rank takes chunks ``cp_rank`` and ``2 * cp - 1 - cp_rank``.
    ``np.argsort`` of the concatenation over ranks restores the original order.
    """
    if cp < 1 or not 0 <= cp_rank < cp:
        raise BatchError(f"cp rank {cp_rank} is out of range for cp={cp}")
    if cp == 1:  # nothing to split: the one rank holds the sequence as is
        return np.arange(int(seq_len), dtype=np.int64)
    bounds = np.append(np.asarray(cu_seqlens, dtype=np.int64), np.int64(seq_len))
    starts, lengths = bounds[:-1], np.diff(bounds)
    bad = np.flatnonzero((lengths % (2 * cp)) != 0)
    if bad.size or (lengths < 0).any():
        seg = int(bad[0]) if bad.size else int(np.flatnonzero(lengths < 0)[0])
        what = "trailing padding" if seg == len(starts) - 1 else f"document {seg}"
        raise BatchError(
            f"{what} has length {int(lengths[seg])}, not a multiple of 2*cp={2 * cp}; build the "
            f"batch with cp={cp} so documents are padded for the zigzag split"
        )
    chunk = lengths // (2 * cp)
    first = starts + cp_rank * chunk
    second = starts + (2 * cp - 1 - cp_rank) * chunk
    interleaved_starts = np.stack([first, second], axis=1).reshape(-1)
    interleaved_lengths = np.repeat(chunk, 2)
    return _ranges(interleaved_starts, interleaved_lengths)


def rank_view(
    mb: MicroBatch,
    cp: int,
    cp_rank: int | None,
    *,
    receives_tokens: bool = True,
    receives_labels: bool = True,
) -> MicroBatch:
    """What one rank receives of a whole micro-batch (``mb["cu_seqlens"]`` are the global ones).

    ``cp_rank`` selects the zigzag slice; ``None`` keeps the whole sequence (the receiver under
    ``broadcast_at("cp")``, which hands it to its CP group). Token and image fields go only where
    ``receives_tokens``, labels only where ``receives_labels``; metadata (``cu_seqlens`` local to
    the view, ``cu_seqlens_global``, ``seqlens``) goes everywhere. Without a split the arrays are
    views of ``mb``'s (no copy). Raises :class:`BatchError` if the documents are not padded for
    ``cp``.
    """
    cu = mb["cu_seqlens"]
    if cp == 1 or cp_rank is None:
        if cp_rank is not None and cp_rank != 0:
            raise BatchError(f"cp rank {cp_rank} is out of range for cp={cp}")
        index: np.ndarray | slice = slice(None)
        local_len, local_cu = mb.seq_len, cu
    else:
        index = zigzag_indices(cu, mb.seq_len, cp, cp_rank)
        local_len, local_cu = mb.seq_len // cp, (cu // cp).astype(np.int32)
    fields: dict[str, FieldValue] = {}
    if receives_tokens:
        for name in TOKEN_FIELDS:
            fields[name] = mb[name][index]
        for name in IMAGE_FIELDS:
            if name in mb:
                fields[name] = mb[name]
    if receives_labels:
        for name in LABEL_FIELDS:
            fields[name] = mb[name][index]
    fields["cu_seqlens"] = local_cu
    fields["cu_seqlens_global"] = cu
    fields["seqlens"] = mb["seqlens"]
    return MicroBatch(mb.index, local_len, mb.sample_ids, fields)
