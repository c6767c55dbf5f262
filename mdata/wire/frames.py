"""The wire format of batches: a small msgpack header plus raw array frames.

Importing this module registers it with ``distributed``'s "dask" serializer family for
:class:`~mdata.batch.Batch` and :class:`~mdata.batch.DPBatch`, and registers ``dask.sizeof`` for
them (and for :class:`~mdata.sources.chunk.SampleChunk`). Both the sending worker and the receiving
trainer must import it (``mdata.trainer`` and the worker plugin do); registering twice is harmless.

Why not pickle or distributed's torch/numpy serializers: batches stay numpy on the Dask side (no
torch in loader/constructor processes), bfloat16 has no numpy dtype (distributed's torch
serializer fails on it), and we want exact control over frames:

* **One frame per large array** (its raw bytes, a memoryview: no copy on send). distributed's TCP
  comm reads each large uncompressed frame into its own fresh buffer, so on receive every large
  array is ``np.frombuffer`` over that buffer: no copy, and the buffers are freed independently.
* **Small arrays share frame 0** (each at most 64 KiB, at 8-byte aligned offsets, copied once).
  distributed spends ~10 µs on every frame (a compression probe, a split check, metering
  contexts), more than copying a few KiB costs; a batch's token ids, labels, positions and
  offsets were twenty frames, and that overhead was most of a constructor's serialization CPU.
* **Frames of at most 64 MiB** (or the cluster's ``distributed.comm.shard`` if smaller). A larger
  array is cut into several frames here, and joined with one copy on receive; distributed would
  otherwise split it itself and join it with a copy too, so nothing is lost by doing it here.
* A received array that lands misaligned for its dtype (small frames packed behind the header in
  one buffer) is copied to an aligned one, so that torch and numpy kernels see aligned memory.
* The header holds only dtype strings, shapes, frame indices and small ints (msgpack-able); a
  bfloat16 :class:`~mdata.batch.TensorField` is shipped as its ``uint16`` bits plus its dtype name,
  so values arrive bit-identical.
* ``dask.sizeof`` reports the bytes of the arrays (Dask's default would count ~100 bytes for a
  50 MB batch, and worker memory limits would never see it).

Compression is left to the cluster's ``distributed.comm.compression`` setting (off by default).
"""

from __future__ import annotations

import sys
from typing import Any

import dask
import numpy as np
from dask.sizeof import sizeof
from dask.utils import parse_bytes
from distributed.protocol import dask_deserialize, dask_serialize

from mdata.batch import Batch, DPBatch, FieldValue, MicroBatch, TensorField
from mdata.errors import BatchError

__all__ = ["FORMAT_VERSION", "MAX_FRAME_BYTES", "frame_limit", "register", "dumps_batch", "loads_batch"]

#: Version of the header layout; a receiver refuses headers of another version.
FORMAT_VERSION = 2
#: Largest frame this format emits (distributed's own default shard size).
MAX_FRAME_BYTES = 64 * 2**20
#: Largest array copied into the shared frame 0 instead of a frame of its own.
SMALL_ARRAY_BYTES = 64 * 2**10
#: Offsets of arrays in frame 0 are multiples of this (the largest item size of a batch's dtypes).
_ALIGN = 8
#: Rough per-array Python overhead counted by ``sizeof`` on top of the array bytes.
_ARRAY_OVERHEAD = 112


def frame_limit() -> int:
    """The frame size cap in bytes: 64 MiB, or ``distributed.comm.shard`` if smaller."""
    configured = dask.config.get("distributed.comm.shard", None)
    limit = MAX_FRAME_BYTES
    if configured:
        limit = min(limit, int(parse_bytes(configured)))
    return max(limit, 1)


# -- encode ------------------------------------------------------------------------------------


class _Frames:
    """The frames of one batch being written: frame 0 holds the small arrays, packed; each large
    array follows in frames of its own."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.small = min(SMALL_ARRAY_BYTES, limit)
        self.frames: list = [None]
        self.packed: list[tuple[int, memoryview]] = []
        self.packed_bytes = 0

    def append(self, data: memoryview) -> None:
        self.frames.append(data)

    def extend(self, parts) -> None:
        self.frames.extend(parts)

    def __len__(self) -> int:
        return len(self.frames)

    def pack(self, data: memoryview) -> int | None:
        """Frame 0's offset of ``data``, or None when it is too large to share a frame."""
        start = -(-self.packed_bytes // _ALIGN) * _ALIGN
        if data.nbytes > self.small or start + data.nbytes > self.limit:
            return None
        self.packed.append((start, data))
        self.packed_bytes = start + data.nbytes
        return start

    def done(self) -> list:
        buffer = bytearray(self.packed_bytes)  # writable: arrays over it may be handed to torch
        for start, data in self.packed:
            buffer[start : start + data.nbytes] = data
        self.frames[0] = memoryview(buffer)
        return self.frames


def _encode_array(array: np.ndarray, frames: _Frames, limit: int) -> dict[str, Any]:
    array = np.ascontiguousarray(array)
    if array.dtype.hasobject:
        raise TypeError(f"cannot serialize an object array of shape {array.shape}")
    data = memoryview(array.reshape(-1)).cast("B") if array.size else memoryview(b"")
    spec: dict[str, Any] = {"dtype": array.dtype.str, "shape": list(array.shape)}
    start = frames.pack(data)
    if start is not None:
        spec["packed"] = [start, data.nbytes]
        return spec
    step = max(limit - limit % array.dtype.itemsize, array.dtype.itemsize)
    first = len(frames)
    if data.nbytes <= limit:
        frames.append(data)
    else:
        frames.extend(data[i : i + step] for i in range(0, data.nbytes, step))
    spec["frames"] = [first, len(frames) - first]
    return spec


def _encode_field(value: FieldValue, frames: _Frames, limit: int) -> dict[str, Any]:
    if isinstance(value, TensorField):
        spec = _encode_array(value.buffer, frames, limit)
        spec["raw"] = value.dtype_name
        return spec
    return _encode_array(value, frames, limit)


def _encode_micro_batches(micro_batches, frames: _Frames, limit: int) -> list[dict[str, Any]]:
    return [
        {
            "index": int(mb.index),
            "seq_len": int(mb.seq_len),
            "sample_ids": _encode_array(mb.sample_ids, frames, limit),
            "fields": [[name, _encode_field(v, frames, limit)] for name, v in mb.fields.items()],
        }
        for mb in micro_batches
    ]


def _serialize(batch: Batch | DPBatch) -> tuple[dict[str, Any], list[memoryview]]:
    limit = frame_limit()
    frames = _Frames(limit)
    header: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "kind": type(batch).__name__,
        "step": int(batch.step),
        "dp_rank": int(batch.dp_rank),
        "cp": int(batch.cp),
        "tokens_per_source": dict(batch.tokens_per_source),
        "micro_batches": _encode_micro_batches(batch.micro_batches, frames, limit),
    }
    if isinstance(batch, Batch):
        header["cp_rank"] = None if batch.cp_rank is None else int(batch.cp_rank)
        header["receives_tokens"] = bool(batch.receives_tokens)
        header["receives_labels"] = bool(batch.receives_labels)
    return header, frames.done()


# -- decode ------------------------------------------------------------------------------------


def _decode_array(spec: dict[str, Any], frames: list) -> np.ndarray:
    dtype = np.dtype(spec["dtype"])
    shape = tuple(spec["shape"])
    if "packed" in spec:
        start, nbytes = spec["packed"]
        array = np.frombuffer(frames[0], dtype=np.uint8)[start : start + nbytes]
        first = count = 0
    else:
        first, count = spec["frames"]
    parts = frames[first : first + count]
    if count == 0:
        pass  # packed in frame 0
    elif count == 1:
        array = np.frombuffer(parts[0], dtype=np.uint8)
    else:  # one array cut into several frames: join them (one copy, unavoidable)
        array = np.empty(sum(memoryview(p).nbytes for p in parts), dtype=np.uint8)
        offset = 0
        for part in parts:
            view = np.frombuffer(part, dtype=np.uint8)
            array[offset : offset + view.size] = view
            offset += view.size
    if array.size % dtype.itemsize:
        raise BatchError(
            f"a batch frame holds {array.size} bytes, not a multiple of {dtype} items; the "
            "message was truncated or sender and receiver disagree on the format"
        )
    typed = array.view(dtype)
    if not typed.flags.aligned:
        typed = typed.copy()
    return typed.reshape(shape)


def _decode_field(spec: dict[str, Any], frames: list) -> FieldValue:
    array = _decode_array(spec, frames)
    raw = spec.get("raw")
    if raw is None:
        return array
    return TensorField(raw, tuple(spec["shape"]), array)


def _deserialize(header: dict[str, Any], frames: list) -> Batch | DPBatch:
    version = header.get("format")
    if version != FORMAT_VERSION:
        raise BatchError(
            f"batch of step {header.get('step')}, dp rank {header.get('dp_rank')} uses wire "
            f"format {version}, this process reads format {FORMAT_VERSION}; run the same mdata "
            "version on constructors and trainers"
        )
    micro_batches = tuple(
        MicroBatch(
            mb["index"],
            mb["seq_len"],
            _decode_array(mb["sample_ids"], frames),
            {name: _decode_field(spec, frames) for name, spec in mb["fields"]},
        )
        for mb in header["micro_batches"]
    )
    common = dict(
        step=header["step"],
        dp_rank=header["dp_rank"],
        cp=header["cp"],
        micro_batches=micro_batches,
        tokens_per_source=header["tokens_per_source"],
    )
    if header["kind"] == "DPBatch":
        return DPBatch(**common)
    return Batch(
        cp_rank=header["cp_rank"],
        receives_tokens=header["receives_tokens"],
        receives_labels=header["receives_labels"],
        **common,
    )


def dumps_batch(batch: Batch | DPBatch) -> tuple[dict[str, Any], list[memoryview]]:
    """Header and frames of a batch (what distributed sends); frames are views, not copies."""
    return _serialize(batch)


def loads_batch(header: dict[str, Any], frames: list) -> Batch | DPBatch:
    """Rebuild a batch from :func:`dumps_batch` output; arrays are views of ``frames``."""
    return _deserialize(header, frames)


# -- sizeof ------------------------------------------------------------------------------------


def _sizeof_batch(batch: Batch | DPBatch) -> int:
    arrays = sum(1 + len(mb.fields) for mb in batch.micro_batches)
    return int(batch.nbytes) + _ARRAY_OVERHEAD * arrays + sys.getsizeof(batch)


def _sizeof_chunk(chunk: Any) -> int:
    return int(chunk.nbytes) + _ARRAY_OVERHEAD * 8 + sys.getsizeof(chunk.skipped)


_registered = False


def register() -> None:
    """Register the serializers and sizeof entries (done on import; idempotent)."""
    global _registered
    if _registered:
        return
    for cls in (Batch, DPBatch):
        dask_serialize.register(cls)(_serialize)
        dask_deserialize.register(cls)(_deserialize)
        sizeof.register(cls)(_sizeof_batch)
    try:
        from mdata.sources.chunk import SampleChunk
    except ImportError:  # pragma: no cover - sources are part of mdata; kept optional on purpose
        pass
    else:
        sizeof.register(SampleChunk)(_sizeof_chunk)
    _registered = True


register()
