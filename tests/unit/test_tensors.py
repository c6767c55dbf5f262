"""Trainer-side tensor landing (mdata.trainer.tensors). CPU always; the CUDA paths run where CUDA exists."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from distributed.protocol import dumps, loads, to_serialize

import mdata.wire.frames  # noqa: F401  registers the wire format
from mdata.batch import Batch, MicroBatch, TensorField, build_dp_batch
from mdata.errors import TrainerError
from mdata.sources.chunk import SampleChunk
from mdata.trainer.tensors import (
    BatchLander,
    PinnedBufferPool,
    batch_to_torch,
    default_lander,
    field_to_tensor,
    stream_tensors,
)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")


def small_dp_batch(cp=1):
    chunk = SampleChunk.from_samples("web", 0, [0, 1, 2], [[1, 2, 3, 4], [5, 6], [7, 8, 9]])
    return build_dp_batch(
        5, 1, [chunk], [0, 1, 0], [0, 0, 1], [4, 2, 3], [[2, 0, 0], [2, 0, 1], [2, 0, 2]], 2,
        max_tokens=8, cp=cp,
    )


def test_cpu_tensors_share_memory_with_the_batch_arrays():
    batch = small_dp_batch().for_rank(0)
    out = batch_to_torch(batch)
    mb = out["micro_batches"][0]
    assert mb["input_ids"].tolist() == [1, 2, 3, 4, 7, 8, 9]
    assert mb["input_ids"].dtype == torch.int32 and mb["cu_seqlens"].tolist() == [0, 4, 7]
    mb["input_ids"][0] = 42
    assert batch.micro_batches[0]["input_ids"][0] == 42  # same memory, no copy
    assert out["step"] == 5 and out["dp_rank"] == 1 and out["cp_rank"] == 0
    assert out["seq_lens"] == [7, 2] and out["max_seqlens"] == [4, 2]
    assert out["sample_ids"].tolist() == [[2, 0, 0], [2, 0, 2], [2, 0, 1]]
    assert out["tokens_per_source"] == {"web": 9}
    assert batch_to_torch(batch)["micro_batches"][1]["labels"].tolist() == [6, -100]


def test_bfloat16_fields_match_torch_bit_for_bit():
    rng = np.random.default_rng(3)
    values = np.concatenate([
        rng.standard_normal(10_000).astype(np.float32) * 1e3,
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, 3.4e38, 1.00390625], np.float32),
    ])
    field = TensorField.bfloat16_from_float32(values)
    tensor = field_to_tensor(field)
    expected = torch.from_numpy(values).to(torch.bfloat16)
    assert tensor.dtype == torch.bfloat16 and tensor.shape == expected.shape
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(tensor), nan) and int(nan.sum()) == 1
    assert torch.equal(tensor.view(torch.int16)[~nan], expected.view(torch.int16)[~nan])
    assert tensor.data_ptr() == field.buffer.ctypes.data  # a reinterpretation, not a copy


def test_received_batch_becomes_tensors_without_warnings_even_from_read_only_frames():
    mb = MicroBatch(0, 3, [[0, 0, 1]], {
        "x": np.array([1, 2, 3], np.int64),
        "w": TensorField.bfloat16_from_float32(np.array([0.5, -1.0, 2.0], np.float32)),
    })
    frames = [bytes(f) for f in dumps(to_serialize(Batch(0, 0, 0, 1, (mb,))))]
    received = loads(frames)
    assert not received.micro_batches[0]["x"].flags.writeable  # bytes frames are read-only
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = batch_to_torch(received)["micro_batches"][0]
    assert out["x"].tolist() == [1, 2, 3]
    assert out["w"].float().tolist() == [0.5, -1.0, 2.0]


def test_middle_pipeline_stage_gets_only_metadata_tensors():
    batch = small_dp_batch(cp=2).for_rank(1, receives_tokens=False, receives_labels=False)
    mb = batch_to_torch(batch)["micro_batches"][0]
    assert sorted(mb) == ["cu_seqlens", "cu_seqlens_global", "sample_ids", "seqlens"]
    assert mb["cu_seqlens"].tolist() == [0, 2, 4] and mb["cu_seqlens_global"].tolist() == [0, 4, 8]


@no_cuda
def test_no_lander_without_cuda():
    with pytest.raises(TrainerError, match="default_lander needs a CUDA device, got 'cpu'"):
        default_lander("cpu")
    with pytest.raises(TrainerError, match=r"default_lander\('cuda'\) needs CUDA"):
        default_lander("cuda")


@no_cuda
def test_pinning_or_a_cuda_device_without_cuda_is_a_clear_error():
    batch = small_dp_batch().for_rank(0)
    with pytest.raises(TrainerError, match=r"pin=True needs CUDA.*use device=None"):
        batch_to_torch(batch, pin=True)
    with pytest.raises(TrainerError, match="device 'cuda' needs CUDA"):
        batch_to_torch(batch, device="cuda")
    with pytest.raises(TrainerError, match=r"PinnedBufferPool\(pin=True\) needs CUDA"):
        PinnedBufferPool(pin=True)
    assert PinnedBufferPool().pin is False


def test_unsupported_device_is_rejected():
    with pytest.raises(TrainerError, match="unsupported device 'meta'"):
        batch_to_torch(small_dp_batch().for_rank(0), device="meta")


def test_pool_rounds_sizes_and_reuses_released_buffers():
    pool = PinnedBufferPool(pin=False)
    assert [pool.size_class(n) for n in (0, 1, 4096, 4097, 10**6)] == [4096, 4096, 4096, 8192, 2**20]
    a = pool.acquire(5000)
    assert a.numel() == 8192 and a.dtype == torch.uint8
    pool.release(a)
    b = pool.acquire(6000)
    assert b.data_ptr() == a.data_ptr()
    assert (pool.allocations, pool.reuses) == (1, 1)
    c = pool.acquire(6000)  # the only free one is in use: a new allocation
    assert c.data_ptr() != b.data_ptr() and pool.allocations == 2


def test_pool_stages_fields_with_their_dtype_and_bounds_its_cache():
    pool = PinnedBufferPool(pin=False, max_cached_bytes=8192)
    values = np.arange(12, dtype=np.int64).reshape(3, 4)
    buffer, view = pool.stage(values)
    assert view.dtype == torch.int64 and view.tolist() == values.tolist()
    other, bf16 = pool.stage(TensorField.bfloat16_from_float32(np.array([1.5, -2.0], np.float32)))
    assert bf16.dtype == torch.bfloat16 and bf16.float().tolist() == [1.5, -2.0]
    pool.release(buffer)
    pool.release(other)
    assert pool.cached_bytes == 8192
    pool.release(pool.acquire(2**20))  # over the cache bound: dropped, not kept
    assert pool.cached_bytes == 8192 and pool.allocations == 3


def test_only_device_tensors_are_recorded_on_the_consumer_stream():
    """A landed micro-batch keeps ``sample_ids`` on the host; record_stream is CUDA-only, so the
    landing path must select the CUDA tensors and leave the host ones alone."""
    host = batch_to_torch(small_dp_batch(cp=2).for_rank(0))["micro_batches"]
    assert all(not t.is_cuda for mb in host for t in mb.values())
    assert stream_tensors(host) == []
    meta = [{"input_ids": torch.empty(4, device="meta"), "sample_ids": mb["sample_ids"]}
            for mb in host]
    assert stream_tensors(meta) == []  # not CUDA either: never recorded
    if torch.cuda.is_available():
        mixed = [{**mb, "input_ids": mb["input_ids"].cuda()} for mb in host]
        picked = stream_tensors(mixed)
        assert [t.data_ptr() for t in picked] == [mb["input_ids"].data_ptr() for mb in mixed]


@cuda
def test_lander_keeps_sample_ids_on_the_host_and_lands_everything_else():
    batch = small_dp_batch(cp=2).for_rank(1)
    for out in (BatchLander("cuda").submit(batch).wait(), batch_to_torch(batch, device="cuda")):
        torch.cuda.current_stream().synchronize()
        for mb, got in zip(batch.micro_batches, out["micro_batches"]):
            assert got["sample_ids"].device.type == "cpu"
            assert got["sample_ids"].tolist() == mb.sample_ids.tolist()
            assert all(got[name].is_cuda for name in mb.names)


@cuda
def test_lander_copies_on_a_side_stream_and_recycles_buffers_after_the_event():
    batch = small_dp_batch(cp=2).for_rank(0)
    lander = BatchLander("cuda")
    landed = lander.submit(batch)
    out = landed.wait()
    torch.cuda.current_stream().synchronize()
    for mb, got in zip(batch.micro_batches, out["micro_batches"]):
        for name in mb.names:
            assert got[name].device.type == "cuda"
            assert got[name].cpu().tolist() == mb[name].tolist()
    assert lander.pool.pin is True
    allocations = lander.pool.allocations
    lander.submit(batch).synchronize()
    assert lander.pool.allocations == allocations and lander.pool.reuses > 0


@cuda
def test_the_default_lander_counts_the_bytes_it_lands():
    batch = small_dp_batch(cp=2).for_rank(0)
    lander = default_lander("cuda")
    before = lander.copy_stats()
    batch_to_torch(batch, device="cuda")
    after = lander.copy_stats()
    assert after["bytes"] - before["bytes"] == sum(
        v.nbytes for mb in batch.micro_batches for v in mb.fields.values())
    assert after["seconds"] > before["seconds"] and after["gb_per_s"] > 0


@cuda
def test_batch_to_torch_on_cuda_and_pinned_cpu():
    batch = small_dp_batch().for_rank(0)
    out = batch_to_torch(batch, device="cuda")
    assert out["micro_batches"][0]["input_ids"].cpu().tolist() == [1, 2, 3, 4, 7, 8, 9]
    pinned = batch_to_torch(batch, pin=True)
    assert pinned["micro_batches"][0]["labels"].is_pinned()
