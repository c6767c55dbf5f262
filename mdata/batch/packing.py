"""Packing: one DP group's pulled samples become micro-batches (the layout of :mod:`mdata.batch`).

:func:`build_dp_batch` checks the Planner's assignment against the rows actually pulled (a mismatch
fails loudly instead of training on the wrong rows), then packs each micro-batch: documents in
position order, truncated, image placeholders before captions (or, in interleaved documents, each
clip's at its place: :mod:`mdata.batch.documents`), shifted labels, per-document
position ids and, with context parallelism, per-document padding for the zigzag split.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mdata.batch.batches import DPBatch
from mdata.batch.documents import lay_out_document
from mdata.batch.micro import FieldValue, MicroBatch
from mdata.errors import BatchError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mdata.sources.chunk import SampleChunk

__all__ = ["build_dp_batch"]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _as_column(name: str, values: Any, n: int, where: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise BatchError(
            f"{where}: {name} must have one entry per pulled sample ({n}), got shape {arr.shape}"
        )
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise BatchError(f"{where}: {name} must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def build_dp_batch(
    step: int,
    dp_rank: int,
    pieces: Sequence["SampleChunk"],
    micro_batch: Any,
    position: Any,
    lengths: Any,
    sample_ids: Any,
    num_micro_batches: int,
    *,
    max_tokens: int,
    cp: int = 1,
    pad_id: int = 0,
    ignore_index: int = -100,
    pad_to_multiple: int | None = None,
    image_token_id: int | None = None,
) -> DPBatch:
    """Pack one DP group's samples for one step into micro-batches (layout: :mod:`mdata.batch`).

    ``pieces`` are the ``SampleChunk.take(...)`` results pulled from loaders; samples are taken in
    piece order, and ``micro_batch``, ``position``, ``lengths`` (truncated token counts, image
    tokens included) and ``sample_ids`` (int64 ``[n, 3]``) give the Planner's assignment for each
    of them in that order. Every sample id is checked against the piece row it labels, so a
    Planner/constructor mismatch fails loudly instead of training on the wrong rows.
    """
    where = f"step {step}, dp rank {dp_rank}"
    for name, value, low in (
        ("num_micro_batches", num_micro_batches, 1),
        ("max_tokens", max_tokens, 1),
        ("cp", cp, 1),
    ):
        if int(value) < low:
            raise BatchError(f"{where}: {name} must be >= {low}, got {value}")
    if pad_to_multiple is not None and int(pad_to_multiple) < 1:
        raise BatchError(f"{where}: pad_to_multiple must be >= 1 or None, got {pad_to_multiple}")
    multiple = math.lcm(2 * cp if cp > 1 else 1, int(pad_to_multiple or 1))

    sizes = np.array([len(p) for p in pieces], dtype=np.int64)
    n = int(sizes.sum())
    mb_col = _as_column("micro_batch", micro_batch, n, where)
    pos_col = _as_column("position", position, n, where)
    len_col = _as_column("lengths", lengths, n, where)
    ids = np.asarray(sample_ids, dtype=np.int64)
    if n == 0:
        ids = ids.reshape(0, 3)
    if ids.shape != (n, 3):
        raise BatchError(
            f"{where}: sample_ids must be [n, 3] (source_index, shard, row) with n={n}, got "
            f"shape {ids.shape}"
        )

    # Which piece, and which row of it, each sample is.
    piece_of = np.repeat(np.arange(len(pieces)), sizes)
    local = np.arange(n) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    source_names = _source_names(pieces, piece_of, ids, where)
    _check_ids_match_pieces(pieces, piece_of, local, ids, source_names, where)

    num_tokens = _concat([p.num_tokens for p in pieces], np.int64)
    num_patches = _concat([p.num_patches for p in pieces], np.int64)
    text_lengths = _concat([np.diff(p.token_offsets) for p in pieces], np.int64)

    def sample_label(j: int) -> str:
        return (
            f"{where}: sample {j} ({source_names[int(ids[j, 0])]}/{ids[j, 1]}/{ids[j, 2]}, "
            f"micro-batch {mb_col[j]})"
        )

    bad = np.flatnonzero((mb_col < 0) | (mb_col >= num_micro_batches))
    if bad.size:
        j = int(bad[0])
        raise BatchError(
            f"{sample_label(j)}: micro-batch index out of range [0, {num_micro_batches})"
        )
    bad = np.flatnonzero(text_lengths + num_patches != num_tokens)
    if bad.size:
        j = int(bad[0])
        raise BatchError(
            f"{sample_label(j)}: the chunk holds {text_lengths[j]} text tokens and "
            f"{num_patches[j]} image patches but num_tokens={num_tokens[j]}; the convention is "
            "num_tokens = text tokens + num_patches (image placeholders are not stored in the chunk)"
        )
    bad = np.flatnonzero((len_col < 1) | (len_col > num_tokens) | (len_col > max_tokens))
    if bad.size:
        j = int(bad[0])
        raise BatchError(
            f"{sample_label(j)}: planned length {len_col[j]} must be in [1, min(num_tokens="
            f"{num_tokens[j]}, max_tokens={max_tokens})]"
        )
    bad = np.flatnonzero((num_patches > 0) & (len_col < num_patches))
    if bad.size:
        j = int(bad[0])
        raise BatchError(
            f"{sample_label(j)}: planned length {len_col[j]} would cut into the image's "
            f"{num_patches[j]} tokens; an image sample must keep all its image tokens"
        )
    has_images = any(p.pixels is not None for p in pieces) or bool((num_patches > 0).any())
    if has_images and image_token_id is None:
        raise BatchError(
            f"{where}: the batch has image samples but no image_token_id; pass the tokenizer's "
            "reserved image placeholder id"
        )
    for j in np.flatnonzero(num_patches > 0):
        if pieces[piece_of[j]].pixels is None:
            raise BatchError(
                f"{sample_label(int(j))}: has {num_patches[j]} image patches but its chunk holds "
                "no pixels"
            )

    micro_batches = []
    for m in range(int(num_micro_batches)):
        members = np.flatnonzero(mb_col == m)
        order = members[np.argsort(pos_col[members], kind="stable")]
        if not np.array_equal(pos_col[order], np.arange(len(order))):
            raise BatchError(
                f"{where}, micro-batch {m}: positions {sorted(pos_col[members].tolist())} are not "
                f"0..{len(order) - 1}; each position in a micro-batch must be used exactly once"
            )
        used = int(len_col[order].sum())
        if used > max_tokens:
            raise BatchError(
                f"{where}, micro-batch {m}: {used} tokens exceed max_tokens={max_tokens}; the "
                "Planner must respect the micro-batch token capacity"
            )
        micro_batches.append(
            _pack_micro_batch(
                m, order, pieces, piece_of, local, len_col, num_patches, ids,
                cp=cp, multiple=multiple, pad_id=pad_id, ignore_index=ignore_index,
                image_token_id=image_token_id, has_images=has_images,
            )
        )

    tokens: dict[str, int] = {}
    for s in np.unique(ids[:, 0]):
        tokens[source_names[int(s)]] = int(len_col[ids[:, 0] == s].sum())
    return DPBatch(step, dp_rank, cp, tuple(micro_batches), tokens)


def _concat(arrays: Sequence[np.ndarray], dtype: Any) -> np.ndarray:
    if not arrays:
        return np.zeros(0, dtype=dtype)
    return np.concatenate([np.asarray(a, dtype=dtype) for a in arrays])


def _source_names(
    pieces: Sequence["SampleChunk"], piece_of: np.ndarray, ids: np.ndarray, where: str
) -> dict[int, str]:
    """Map each source_index in ``ids`` to the one source name its pieces carry."""
    names: dict[int, str] = {}
    for j in range(len(piece_of)):
        s, name = int(ids[j, 0]), pieces[piece_of[j]].source
        known = names.setdefault(s, name)
        if known != name:
            raise BatchError(
                f"{where}: source_index {s} labels samples of two sources ({known!r} and "
                f"{name!r}); sample ids and pulled pieces disagree"
            )
    return names


def _check_ids_match_pieces(
    pieces: Sequence["SampleChunk"],
    piece_of: np.ndarray,
    local: np.ndarray,
    ids: np.ndarray,
    source_names: Mapping[int, str],
    where: str,
) -> None:
    if len(piece_of) == 0:
        return
    shards = np.array([int(p.shard) for p in pieces], dtype=np.int64)[piece_of]
    rows = _concat([p.rows for p in pieces], np.int64)
    bad = np.flatnonzero((ids[:, 1] != shards) | (ids[:, 2] != rows))
    if bad.size:
        j = int(bad[0])
        p = pieces[piece_of[j]]
        raise BatchError(
            f"{where}: sample {j} is labelled {source_names[int(ids[j, 0])]}/{ids[j, 1]}/"
            f"{ids[j, 2]} but the pulled row is {p.source}/{p.shard}/{rows[j]} (piece "
            f"{piece_of[j]}, index {local[j]}); the assignment must list samples in piece order"
        )


def _pack_micro_batch(
    m: int,
    order: np.ndarray,
    pieces: Sequence["SampleChunk"],
    piece_of: np.ndarray,
    local: np.ndarray,
    lengths: np.ndarray,
    num_patches: np.ndarray,
    ids: np.ndarray,
    *,
    cp: int,
    multiple: int,
    pad_id: int,
    ignore_index: int,
    image_token_id: int | None,
    has_images: bool,
) -> MicroBatch:
    real = lengths[order]
    padded = np.array([_round_up(int(x), 2 * cp) for x in real], dtype=np.int64) if cp > 1 else real
    cu = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(padded, out=cu[1:])
    seq_len = _round_up(int(cu[-1]), multiple)

    input_ids = np.full(seq_len, pad_id, dtype=np.int32)
    labels = np.full(seq_len, ignore_index, dtype=np.int32)
    # Positions restart per document; the trailing padding run is one more "document".
    bounds = np.append(cu, seq_len)
    position_ids = (np.arange(seq_len, dtype=np.int64) - np.repeat(bounds[:-1], np.diff(bounds)))
    pixels, shapes, counts = [], [], []

    for d, j in enumerate(order):
        piece, row = pieces[piece_of[j]], int(local[j])
        start, length, patches = int(cu[d]), int(real[d]), int(num_patches[j])
        lo, hi = int(piece.token_offsets[row]), int(piece.token_offsets[row + 1])
        text = np.asarray(piece.token_ids[lo:hi])[: length - patches]
        media = lay_out_document(
            input_ids[start : start + length], labels[start : start + length], text,
            piece.media_spans(row), patches, image_token_id, ignore_index)
        if media:
            po = piece.pixel_offsets
            image = np.asarray(piece.pixels[int(po[row]) : int(po[row + 1])], np.uint8)
            shape = np.asarray(piece.image_shapes[row], dtype=np.int32)
            row_bytes = int(shape[1]) * int(shape[2])
            first = 0
            for rows, count in media:  # each medium an image of its own: its rows of the stack
                rows = int(shape[0]) if rows < 0 else rows
                pixels.append(image[first * row_bytes : (first + rows) * row_bytes])
                shapes.append(np.array([rows, shape[1], shape[2]], dtype=np.int32))
                counts.append(count)
                first += rows

    fields: dict[str, FieldValue] = {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": position_ids.astype(np.int32),
        "cu_seqlens": cu.astype(np.int32),
        "seqlens": real.astype(np.int32),
    }
    if has_images:
        fields["pixels"] = np.concatenate(pixels) if pixels else np.zeros(0, np.uint8)
        fields["image_shapes"] = (
            np.stack(shapes).astype(np.int32) if shapes else np.zeros((0, 3), np.int32)
        )
        fields["image_token_counts"] = np.asarray(counts, dtype=np.int32)
    return MicroBatch(m, seq_len, ids[order], fields)
