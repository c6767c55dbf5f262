"""Batches: what a constructor builds for one DP group and what each trainer rank receives.

This module is numpy only (no torch, no dask), so constructor workers stay lean (DESIGN.md 9:
torch adds ~180 MB per process); trainers turn batches into tensors with :mod:`mdata.trainer.tensors`.

Layout of one micro-batch (the conventions every consumer relies on)
--------------------------------------------------------------------
* **Packing.** A micro-batch is one sequence: its documents (samples) concatenated in the order
  of their planned ``position``, each truncated to its planned length.
* **Image samples.** An image-text sample contributes ``num_patches`` copies of a reserved
  ``image_token_id`` *before* its caption tokens. A ``SampleChunk`` holds only the caption's token
  ids; its ``num_tokens`` (the cost feature) counts both, so ``len(caption) + num_patches ==
  num_tokens`` for every sample. Truncation cuts the caption's tail, never into the image run.
  The micro-batch carries the images' raw pixels concatenated (``pixels``, uint8, flat),
  ``image_shapes`` (int32 ``[k, 3]``, H x W x C) and ``image_token_counts`` (int32 ``[k]``), in
  document order; the j-th run of placeholders belongs to the j-th image.
* **Labels** are next-token targets, already shifted: ``labels[t] = input_ids[t + 1]`` inside a
  document. The last token of every document, padding, and every position whose target is an
  image placeholder get ``ignore_index`` (image tokens are inputs, never predictions).
* **Position ids** restart at 0 for every document (and for the trailing padding run).
* **Padding.** With context parallelism (``cp > 1``) every document is padded at its end to a
  multiple of ``2 * cp`` so it splits into ``2 * cp`` equal chunks (the zigzag split below; the same
  rule as TransformerEngine's THD layout and ring-flash-attention's zigzag varlen kernels). The
  sequence is then padded at its end to a multiple of ``lcm(2 * cp, pad_to_multiple)``.
  Padding uses ``pad_id`` and ``ignore_index`` labels.
* **cu_seqlens** (int32 ``[docs + 1]``) are the cumulative *padded* document lengths; with
  ``cp == 1`` there is no per-document padding, so they are the usual real-token boundaries.
  ``seqlens`` (int32 ``[docs]``) keeps the real (unpadded) lengths. Trailing padding lies after
  ``cu_seqlens[-1]`` and belongs to no document.

Context-parallel split (``DPBatch.for_rank``)
---------------------------------------------
Each document (and the trailing padding) is cut into ``2 * cp`` equal chunks; CP rank ``i`` gets
chunks ``i`` and ``2 * cp - 1 - i`` of every document, in document order. Under a causal mask the
early chunk is cheap and the late one expensive, so every rank gets the same attention work
(load-balanced ring attention). A rank's ``cu_seqlens`` are the global ones divided by ``cp`` (the
boundaries of its local document pieces); ``cu_seqlens_global`` and ``seqlens`` describe the
whole sequence; ``position_ids`` are each local token's position inside its document.

Pipeline stages: the first stage receives tokens (``input_ids``, ``position_ids``, images), the
last receives ``labels``, middle stages only metadata (``cu_seqlens*``, ``seqlens``, sample ids,
``seq_len``): bytes go only where a stage reads them.

Dtypes: numpy has no bfloat16, so such fields travel as :class:`TensorField` (a dtype name, a
shape and a raw ``uint16`` buffer) and become ``torch.bfloat16`` on the trainer without a copy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from mdata.errors import BatchError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mdata.sources.chunk import SampleChunk

__all__ = [
    "TensorField",
    "FieldValue",
    "MicroBatch",
    "Batch",
    "DPBatch",
    "RAW_DTYPES",
    "TOKEN_FIELDS",
    "LABEL_FIELDS",
    "IMAGE_FIELDS",
    "zigzag_indices",
    "build_dp_batch",
]

#: Dtypes numpy cannot represent, mapped to the numpy dtype of their raw storage.
RAW_DTYPES: Mapping[str, np.dtype] = {"bfloat16": np.dtype(np.uint16)}

#: Fields that only ranks receiving tokens (the first pipeline stage) get.
TOKEN_FIELDS = ("input_ids", "position_ids")
#: Fields that only ranks receiving labels (the last pipeline stage) get.
LABEL_FIELDS = ("labels",)
#: Image fields; they go with the tokens.
IMAGE_FIELDS = ("pixels", "image_shapes", "image_token_counts")


@dataclass(frozen=True, eq=False)
class TensorField:
    """An array of a dtype numpy lacks (bfloat16), kept as its raw bit pattern.

    ``buffer`` is a C-contiguous array of the storage dtype (``RAW_DTYPES[dtype_name]``) with
    ``prod(shape)`` elements; the wire format ships it byte for byte and the trainer reinterprets
    it (``torch.bfloat16``) without converting, so values arrive bit-identical.
    """

    dtype_name: str
    shape: tuple[int, ...]
    buffer: np.ndarray

    def __post_init__(self) -> None:
        storage = RAW_DTYPES.get(self.dtype_name)
        if storage is None:
            raise TypeError(
                f"TensorField dtype {self.dtype_name!r} is not supported; known raw dtypes: "
                f"{sorted(RAW_DTYPES)} (use a plain numpy array for numpy dtypes)"
            )
        shape = tuple(int(s) for s in self.shape)
        object.__setattr__(self, "shape", shape)
        buffer = np.ascontiguousarray(self.buffer)
        if buffer.dtype != storage:
            raise TypeError(
                f"TensorField {self.dtype_name} needs a {storage} buffer, got {buffer.dtype}"
            )
        if buffer.size != math.prod(shape):
            raise ValueError(
                f"TensorField buffer has {buffer.size} elements but shape {shape} needs "
                f"{math.prod(shape)}"
            )
        object.__setattr__(self, "buffer", buffer.reshape(shape))

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)

    @classmethod
    def bfloat16_from_float32(cls, values: np.ndarray) -> "TensorField":
        """Round float32 values to bfloat16 (round to nearest even, NaN kept as quiet NaN).

        Matches ``torch.tensor(values).to(torch.bfloat16)`` bit for bit on every non-NaN value,
        so a constructor can produce bf16 fields without importing torch (torch's NaN bit pattern
        varies with its kernel; here a NaN becomes the canonical quiet NaN ``0x7FC0``, signed).
        """
        f32 = np.ascontiguousarray(values, dtype=np.float32)
        bits = f32.view(np.uint32)
        rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
        rounded = ((bits + rounding) >> 16).astype(np.uint16)
        nan = np.isnan(f32)
        if nan.any():
            sign = ((bits >> 16) & 0x8000).astype(np.uint16)
            rounded[nan] = sign[nan] | np.uint16(0x7FC0)
        return cls("bfloat16", f32.shape, rounded)

    def to_float32(self) -> np.ndarray:
        """Widen to float32 (exact: every bfloat16 value is a float32 value)."""
        if self.dtype_name != "bfloat16":  # pragma: no cover - only bfloat16 is registered
            raise TypeError(f"no float32 view for {self.dtype_name}")
        return (self.buffer.astype(np.uint32) << 16).view(np.float32)


FieldValue = Union[np.ndarray, TensorField]


def _field_nbytes(value: FieldValue) -> int:
    return int(value.nbytes)


@dataclass(frozen=True, eq=False)
class MicroBatch:
    """One micro-batch as one rank holds it: named arrays plus the ids of its samples.

    ``seq_len`` is the length of this rank's token arrays (also known to ranks that receive no
    tokens, so they can size activations). ``sample_ids`` is int64 ``[k, 3]`` of
    ``(source_index, shard, row)`` in document order. Access fields as ``mb["input_ids"]``.
    """

    index: int
    seq_len: int
    sample_ids: np.ndarray
    fields: Mapping[str, FieldValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ids = np.asarray(self.sample_ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[1] != 3:
            ids = ids.reshape(-1, 3) if ids.size == 0 else ids
            if ids.ndim != 2 or ids.shape[1] != 3:
                raise ValueError(
                    f"micro-batch {self.index}: sample_ids must be [k, 3] (source_index, shard, "
                    f"row), got shape {np.shape(self.sample_ids)}"
                )
        object.__setattr__(self, "sample_ids", ids)
        for name, value in self.fields.items():
            if isinstance(value, TensorField):
                continue
            if not isinstance(value, np.ndarray):
                raise TypeError(
                    f"micro-batch {self.index}: field {name!r} must be a numpy array or a "
                    f"TensorField, got {type(value).__name__}"
                )
            if value.dtype.hasobject:
                raise TypeError(
                    f"micro-batch {self.index}: field {name!r} has object dtype; batches carry "
                    "plain numeric arrays only"
                )
        object.__setattr__(self, "fields", dict(self.fields))

    def __getitem__(self, name: str) -> FieldValue:
        try:
            return self.fields[name]
        except KeyError:
            raise KeyError(
                f"micro-batch {self.index} has no field {name!r}; it has {sorted(self.fields)} "
                "(token and label fields go only to the pipeline stages that read them)"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self.fields

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.fields)

    @property
    def num_samples(self) -> int:
        return int(self.sample_ids.shape[0])

    @property
    def max_seqlen(self) -> int:
        """Longest local document piece (from ``cu_seqlens``), computed on the host.

        Attention kernels take it as a Python int; reading it from a GPU tensor would sync.
        """
        cu = self.fields.get("cu_seqlens")
        if cu is None or len(cu) < 2:
            return 0
        return int(np.diff(cu).max())

    @property
    def nbytes(self) -> int:
        return int(self.sample_ids.nbytes) + sum(_field_nbytes(v) for v in self.fields.values())

    def with_fields(self, **fields: FieldValue) -> "MicroBatch":
        """A copy with fields added or replaced (e.g. bf16 loss weights computed downstream)."""
        return MicroBatch(self.index, self.seq_len, self.sample_ids, {**self.fields, **fields})


def _total_nbytes(micro_batches: Sequence[MicroBatch]) -> int:
    return sum(mb.nbytes for mb in micro_batches)


def _normalize_batch_fields(batch) -> None:
    """Frozen batches hold a tuple of micro-batches and a plain ``{source: tokens}`` dict, whatever
    sequence or mapping (numpy ints included) they were built from."""
    object.__setattr__(batch, "micro_batches", tuple(batch.micro_batches))
    object.__setattr__(
        batch, "tokens_per_source", {str(k): int(v) for k, v in batch.tokens_per_source.items()}
    )


@dataclass(frozen=True, eq=False)
class Batch:
    """What one trainer rank receives for one step: its CP slice of its DP group's micro-batches.

    ``tokens_per_source`` counts the tokens (after truncation, image tokens included) each source
    contributed to the whole DP batch, for per-source loss and throughput accounting.
    """

    step: int
    dp_rank: int
    cp_rank: int
    cp: int
    micro_batches: tuple[MicroBatch, ...]
    tokens_per_source: Mapping[str, int] = field(default_factory=dict)
    receives_tokens: bool = True
    receives_labels: bool = True

    def __post_init__(self) -> None:
        _normalize_batch_fields(self)

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

    def to_torch(self, device: Any = None, pin: bool | None = None) -> list[dict[str, Any]]:
        """Torch tensors per micro-batch; see :func:`mdata.trainer.tensors.batch_to_torch` (imports torch)."""
        from mdata.trainer.tensors import batch_to_torch

        return batch_to_torch(self, device=device, pin=pin)


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
        self, cp_rank: int, *, receives_tokens: bool = True, receives_labels: bool = True
    ) -> Batch:
        """The slice CP rank ``cp_rank`` of this DP group receives (see the module docstring).

        With ``cp == 1`` the arrays are views of this batch's arrays (no copy).
        """
        if not 0 <= cp_rank < self.cp:
            raise BatchError(
                f"step {self.step}, dp rank {self.dp_rank}: cp rank {cp_rank} is out of range "
                f"for cp={self.cp}; pass a rank in [0, {self.cp})"
            )
        out = []
        for mb in self.micro_batches:
            cu = mb["cu_seqlens"]
            if self.cp == 1:
                index: np.ndarray | slice = slice(None)
                local_len = mb.seq_len
            else:
                try:
                    index = zigzag_indices(cu, mb.seq_len, self.cp, cp_rank)
                except BatchError as err:
                    raise BatchError(
                        f"step {self.step}, dp rank {self.dp_rank}, micro-batch {mb.index}: {err}"
                    ) from None
                local_len = mb.seq_len // self.cp
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
            fields["cu_seqlens"] = cu if self.cp == 1 else (cu // self.cp).astype(np.int32)
            fields["cu_seqlens_global"] = cu
            fields["seqlens"] = mb["seqlens"]
            out.append(MicroBatch(mb.index, local_len, mb.sample_ids, fields))
        return Batch(
            step=self.step,
            dp_rank=self.dp_rank,
            cp_rank=cp_rank,
            cp=self.cp,
            micro_batches=tuple(out),
            tokens_per_source=self.tokens_per_source,
            receives_tokens=receives_tokens,
            receives_labels=receives_labels,
        )


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


# --------------------------------------------------------------------------------------------
# Construction
# --------------------------------------------------------------------------------------------


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
    """Pack one DP group's samples for one step into micro-batches (layout: module docstring).

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
        doc = input_ids[start : start + length]
        if patches:
            doc[:patches] = image_token_id
        doc[patches:] = text
        target = labels[start : start + length]
        target[: length - 1] = doc[1:]
        target[: max(patches - 1, 0)] = ignore_index  # targets that are image placeholders
        if patches:
            po = piece.pixel_offsets
            pixels.append(np.asarray(piece.pixels[int(po[row]) : int(po[row + 1])], np.uint8))
            shapes.append(np.asarray(piece.image_shapes[row], dtype=np.int32))
            counts.append(patches)

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
