"""The micro-batch value type: named numpy arrays plus the ids of their samples.

Also :class:`TensorField` (dtypes numpy lacks, such as bfloat16, kept as raw bits) and the names of
the fields each pipeline stage reads. Numpy only; the layout conventions are in :mod:`mdata.batch`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Union

import numpy as np

__all__ = [
    "RAW_DTYPES",
    "TOKEN_FIELDS",
    "LABEL_FIELDS",
    "IMAGE_FIELDS",
    "TensorField",
    "FieldValue",
    "MicroBatch",
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
