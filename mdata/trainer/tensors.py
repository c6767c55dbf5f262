"""Trainer side: a received :class:`~mdata.batch.Batch` becomes torch tensors.

This is the only mdata module that imports torch; loader and constructor workers never load it
(torch costs ~180 MB per process, see docs/dev/architecture.md), so batches stay numpy until they
reach a trainer.

* **CPU** (``device=None`` or ``"cpu"``): ``torch.from_numpy`` over the received buffers, no copy.
  bfloat16 fields arrive as raw ``uint16`` bits and are reinterpreted (``.view(torch.bfloat16)``),
  again without a copy. A read-only buffer (an in-process message that was never on a socket) is
  copied once, because torch tensors are writable and must not alias read-only memory.
* **CUDA**: a :class:`BatchLander` copies each field into a reusable page-locked host buffer from
  a :class:`PinnedBufferPool` (one host memcpy; the socket buffers are not pinned), then issues
  ``.to(device, non_blocking=True)`` on a side :class:`torch.cuda.Stream` and records an event.
  The consumer's stream waits on that event, so the copy overlaps the previous step's compute; a
  pinned buffer goes back to the pool only once its copy event has completed. ``sample_ids`` stay
  on the host (they are for accounting, not kernels), so a landed micro-batch mixes CPU and CUDA
  tensors; only the CUDA ones are recorded on the consumer's stream (:func:`stream_tensors`).

Pinned memory needs CUDA (``pin_memory()`` raises on CPU-only builds), so pinning is gated on
``torch.cuda.is_available()`` and asking for it without CUDA is a clear :class:`TrainerError`.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from mdata.batch import Batch, FieldValue, MicroBatch, TensorField
from mdata.errors import TrainerError

__all__ = [
    "field_to_tensor",
    "micro_batch_to_torch",
    "batch_to_torch",
    "PinnedBufferPool",
    "BatchLander",
    "LandedBatch",
    "stream_tensors",
    "default_lander",
]

#: torch dtypes of the raw-bits fields (see mdata.batch.RAW_DTYPES).
_RAW_TORCH_DTYPES = {"bfloat16": torch.bfloat16}
_MIN_BUFFER = 4096


def _torch_dtype(value: FieldValue) -> torch.dtype:
    if isinstance(value, TensorField):
        return _RAW_TORCH_DTYPES[value.dtype_name]
    return torch.from_numpy(np.zeros(0, dtype=value.dtype)).dtype


def field_to_tensor(value: FieldValue) -> torch.Tensor:
    """A CPU tensor over the field's memory (zero-copy unless the memory is read-only)."""
    array = value.buffer if isinstance(value, TensorField) else value
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.ascontiguousarray(array).copy()
    tensor = torch.from_numpy(array)
    if isinstance(value, TensorField):
        tensor = tensor.view(_RAW_TORCH_DTYPES[value.dtype_name])
    return tensor


def micro_batch_to_torch(micro_batch: MicroBatch) -> dict[str, torch.Tensor]:
    """CPU tensors of one micro-batch's fields, by name (zero-copy), plus its ``sample_ids``
    (int64 ``[docs, 3]``: source index, shard, row of each packed document, in packing order), so a
    trainer can attribute per-document loss to its source."""
    out = {name: field_to_tensor(value) for name, value in micro_batch.fields.items()}
    out["sample_ids"] = field_to_tensor(np.asarray(micro_batch.sample_ids, dtype=np.int64))
    return out


def _envelope(batch: Batch, micro_batches: list[dict[str, torch.Tensor]]) -> dict[str, Any]:
    return {
        "step": batch.step,
        "dp_rank": batch.dp_rank,
        "cp_rank": batch.cp_rank,
        "micro_batches": micro_batches,
        "seq_lens": [mb.seq_len for mb in batch.micro_batches],
        "max_seqlens": [mb.max_seqlen for mb in batch.micro_batches],
        "sample_ids": torch.from_numpy(np.array(batch.sample_ids, dtype=np.int64)),
        "tokens_per_source": dict(batch.tokens_per_source),
    }


def _require_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise TrainerError(
            f"{what} needs CUDA, but torch.cuda.is_available() is False on this machine; use "
            "device=None (CPU tensors) and pin=False"
        )


def batch_to_torch(batch: Batch, device: Any = None, pin: bool | None = None) -> dict[str, Any]:
    """Turn one rank's batch into torch tensors.

    Returns ``{"step", "dp_rank", "cp_rank", "micro_batches": [dict name -> tensor, ...],
    "seq_lens": [int], "max_seqlens": [int], "sample_ids": int64 tensor [n, 3] (on the CPU),
    "tokens_per_source": {source: tokens}}``. ``max_seqlens`` are host ints, ready for attention
    kernels that would otherwise sync to read them from the GPU.

    ``device=None``/``"cpu"``: zero-copy CPU tensors; ``pin=True`` pins them (needs CUDA).
    A CUDA ``device``: tensors on that device, copied from pinned buffers on a side stream
    (``pin=None``/``True``) and ready when this returns; the call blocks only the calling
    thread (the Loader's prefetch thread), not the GPU. For explicit stream control use
    :class:`BatchLander`.
    """
    target = torch.device("cpu") if device is None else torch.device(device)
    if target.type == "cpu":
        if pin:
            _require_cuda("pin=True")
        tensors = [micro_batch_to_torch(mb) for mb in batch.micro_batches]
        if pin:
            tensors = [{k: v.pin_memory() for k, v in mb.items()} for mb in tensors]
        return _envelope(batch, tensors)
    if target.type != "cuda":
        raise TrainerError(f"unsupported device {device!r}; use None, 'cpu' or a CUDA device")
    _require_cuda(f"device {device!r}")
    if pin is False:
        tensors = [
            {k: v.to(target) for k, v in micro_batch_to_torch(mb).items()}
            for mb in batch.micro_batches
        ]
        return _envelope(batch, tensors)
    return default_lander(target).submit(batch).synchronize()


class PinnedBufferPool:
    """Reusable host staging buffers, page-locked when CUDA is present.

    Allocating pinned memory is slow (a driver call that maps pages) and fragments the host, so
    buffers are kept and reused across steps. Sizes are rounded up to a power of two (at least
    4 KiB) so that batches whose sequence lengths vary a little still reuse the same buffers.
    A buffer handed back with a CUDA event waits in ``pending`` until that event has completed,
    because the device may still be reading it.

    ``pin=None`` pins when ``torch.cuda.is_available()``; ``pin=True`` without CUDA raises.
    ``max_cached_bytes`` bounds the bytes kept idle in the pool. Thread-safe.
    """

    def __init__(self, *, pin: bool | None = None, max_cached_bytes: int = 4 * 2**30) -> None:
        if pin is None:
            pin = torch.cuda.is_available()
        elif pin:
            _require_cuda("PinnedBufferPool(pin=True)")
        self.pin = bool(pin)
        self.max_cached_bytes = int(max_cached_bytes)
        self._free: dict[int, list[torch.Tensor]] = defaultdict(list)
        self._pending: list[tuple[torch.Tensor, Any]] = []
        self._lock = threading.Lock()
        self.allocations = 0
        self.reuses = 0

    @staticmethod
    def size_class(nbytes: int) -> int:
        """The capacity of the buffer that serves a request of ``nbytes``."""
        return max(_MIN_BUFFER, 1 << max(int(nbytes) - 1, 0).bit_length())

    @property
    def cached_bytes(self) -> int:
        with self._lock:
            return sum(size * len(bufs) for size, bufs in self._free.items())

    def _collect(self) -> None:
        still = []
        for buffer, event in self._pending:
            if event.query():
                self._put(buffer)
            else:
                still.append((buffer, event))
        self._pending = still

    def _put(self, buffer: torch.Tensor) -> None:
        cached = sum(size * len(bufs) for size, bufs in self._free.items())
        if cached + buffer.numel() <= self.max_cached_bytes:
            self._free[buffer.numel()].append(buffer)

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A uint8 buffer of ``size_class(nbytes)`` bytes (reused when one is free)."""
        size = self.size_class(nbytes)
        with self._lock:
            self._collect()
            if self._free[size]:
                self.reuses += 1
                return self._free[size].pop()
            self.allocations += 1
        return torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)

    def release(self, buffer: torch.Tensor, after: Any = None) -> None:
        """Give a buffer back; with ``after`` (a CUDA event) only once that event completed."""
        with self._lock:
            if after is not None and not after.query():
                self._pending.append((buffer, after))
            else:
                self._put(buffer)

    def stage(self, value: FieldValue) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy a field into a pool buffer; returns (buffer, tensor view of the field's dtype)."""
        array = np.ascontiguousarray(value.buffer if isinstance(value, TensorField) else value)
        buffer = self.acquire(array.nbytes)
        if array.nbytes:
            buffer[: array.nbytes].numpy()[:] = array.reshape(-1).view(np.uint8)
        dtype = _torch_dtype(value)
        view = buffer[: array.nbytes].view(dtype).reshape(array.shape)
        return buffer, view


def stream_tensors(micro_batches: list[dict[str, torch.Tensor]]) -> list[torch.Tensor]:
    """The tensors of landed micro-batches that live on a CUDA device, in order.

    Only these may be recorded on a stream (``Tensor.record_stream`` is a CUDA-only op; calling it
    on the host-side ``sample_ids`` raises), and only these are read by the consumer's kernels.
    """
    return [tensor for mb in micro_batches for tensor in mb.values() if tensor.is_cuda]


class LandedBatch:
    """Tensors of one batch whose host-to-device copies were issued on a side stream."""

    def __init__(self, envelope: dict[str, Any], event: Any, device: torch.device) -> None:
        self._envelope = envelope
        self.event = event
        self.device = device

    def _tensors(self) -> list[torch.Tensor]:
        return stream_tensors(self._envelope["micro_batches"])

    def wait(self, stream: Any = None) -> dict[str, Any]:
        """Make ``stream`` (default: the current one) wait for the copies; no host sync.

        The tensors are recorded on that stream, so the caching allocator does not hand their
        memory to the side stream while the consumer's kernels still read it.
        """
        stream = stream if stream is not None else torch.cuda.current_stream(self.device)
        stream.wait_event(self.event)
        for tensor in self._tensors():
            tensor.record_stream(stream)
        return self._envelope

    def synchronize(self) -> dict[str, Any]:
        """Block the calling thread until the copies are done; the tensors are then usable on
        any stream (they are recorded on the current one for the allocator's sake)."""
        self.event.synchronize()
        stream = torch.cuda.current_stream(self.device)
        for tensor in self._tensors():
            tensor.record_stream(stream)
        return self._envelope


class BatchLander:
    """Moves batches to one CUDA device through pinned buffers on a side stream.

    ``submit(batch)`` returns at once with a :class:`LandedBatch`; call ``.wait()`` on the stream
    that consumes it (typically right before the step that uses it), so the copy of step s+1
    overlaps the compute of step s. :meth:`copy_stats` reports the bytes landed and the side
    stream's time spent landing them (CUDA events around each batch's copies).
    """

    def __init__(self, device: Any, *, pool: PinnedBufferPool | None = None, stream: Any = None):
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise TrainerError(f"BatchLander needs a CUDA device, got {device!r}")
        _require_cuda(f"BatchLander({device!r})")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.pool = pool if pool is not None else PinnedBufferPool(pin=True)
        self.stream = stream if stream is not None else torch.cuda.Stream(self.device)
        self._timing_lock = threading.Lock()
        self._timed: list[tuple[Any, Any, int]] = []  # (start event, end event, bytes) in flight
        self.landed_bytes = 0
        self.landing_seconds = 0.0

    def _settle(self, wait: bool) -> None:
        """Fold the timings of finished landings into the totals (all of them with ``wait``)."""
        with self._timing_lock:
            still = []
            for start, end, nbytes in self._timed:
                if wait:
                    end.synchronize()
                elif not end.query():
                    still.append((start, end, nbytes))
                    continue
                self.landed_bytes += nbytes
                self.landing_seconds += start.elapsed_time(end) / 1000.0
            self._timed = still

    def copy_stats(self) -> dict[str, float]:
        """``{"bytes", "seconds", "gb_per_s"}`` of every batch landed so far (waits for the copies
        in flight). The seconds are side-stream time from a batch's first copy to its last, host
        staging into pinned buffers included: the host-to-device rate a trainer actually gets."""
        self._settle(wait=True)
        seconds = self.landing_seconds
        return {
            "bytes": float(self.landed_bytes),
            "seconds": seconds,
            "gb_per_s": self.landed_bytes / seconds / 1e9 if seconds > 0 else 0.0,
        }

    def submit(self, batch: Batch) -> LandedBatch:
        """Issue the copies of ``batch`` on the side stream and return at once."""
        staged: list[torch.Tensor] = []
        micro_batches = []
        nbytes = 0
        with torch.cuda.stream(self.stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            for mb in batch.micro_batches:
                out = {}
                for name, value in mb.fields.items():
                    buffer, host = self.pool.stage(value)
                    staged.append(buffer)
                    out[name] = host.to(self.device, non_blocking=True)
                    nbytes += host.numel() * host.element_size()
                out["sample_ids"] = field_to_tensor(np.asarray(mb.sample_ids, dtype=np.int64))
                micro_batches.append(out)
            event = torch.cuda.Event(enable_timing=True)
            event.record(self.stream)
        for buffer in staged:
            self.pool.release(buffer, after=event)
        with self._timing_lock:
            self._timed.append((start, event, nbytes))
        self._settle(wait=False)
        return LandedBatch(_envelope(batch, micro_batches), event, self.device)


_landers: dict[torch.device, BatchLander] = {}
_landers_lock = threading.Lock()


def default_lander(device: Any) -> BatchLander:
    """The process-wide lander of ``device`` (what ``batch_to_torch`` and the Loader use), e.g.
    to read its :meth:`BatchLander.copy_stats`."""
    device = torch.device(device)
    if device.type != "cuda":
        raise TrainerError(f"default_lander needs a CUDA device, got {str(device)!r}")
    _require_cuda(f"default_lander({str(device)!r})")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _landers_lock:
        lander = _landers.get(device)
        if lander is None:
            lander = _landers[device] = BatchLander(device)
        return lander
