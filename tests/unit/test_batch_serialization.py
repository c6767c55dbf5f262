"""The batch wire format (mdata.wire.frames) through distributed's real protocol code."""

from __future__ import annotations

import dask
import numpy as np
import pytest
from dask.sizeof import sizeof
from distributed.protocol import deserialize, dumps, loads, serialize, to_serialize

import mdata.wire.frames as wire
from mdata.batch import Batch, DPBatch, MicroBatch, TensorField, build_dp_batch
from mdata.errors import BatchError
from mdata.sources.chunk import SampleChunk


def image_text_batch(seed=0, tokens=2000):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(1, 100_000, size=n) for n in (tokens // 2, tokens // 4, tokens // 4)]
    text = SampleChunk.from_samples("web", 1, [3, 4, 5], docs)
    image = rng.integers(0, 256, size=(32, 48, 3), dtype=np.uint8)
    caps = SampleChunk.from_samples("caps", 0, [9], [[5, 6, 7]], num_patches=[24], images=[image])
    return build_dp_batch(
        11, 2, [text, caps], [0, 1, 1, 0], [0, 0, 1, 1], [tokens // 2, tokens // 4, tokens // 4, 27],
        [[0, 1, 3], [0, 1, 4], [0, 1, 5], [1, 0, 9]], 2,
        max_tokens=tokens, cp=2, image_token_id=7, pad_to_multiple=64,
    )


def with_bf16(batch: Batch) -> Batch:
    mbs = tuple(
        mb.with_fields(
            loss_weights=TensorField.bfloat16_from_float32(
                np.linspace(-3.0, 3.0, mb.seq_len, dtype=np.float32) / 7.0
            )
        )
        for mb in batch.micro_batches
    )
    return Batch(batch.step, batch.dp_rank, batch.cp_rank, batch.cp, mbs, batch.tokens_per_source,
                 batch.receives_tokens, batch.receives_labels)


def assert_same_batch(a, b):
    assert type(a) is type(b)
    assert (a.step, a.dp_rank, a.cp, dict(a.tokens_per_source)) == (
        b.step, b.dp_rank, b.cp, dict(b.tokens_per_source))
    if isinstance(a, Batch):
        assert (a.cp_rank, a.receives_tokens, a.receives_labels) == (
            b.cp_rank, b.receives_tokens, b.receives_labels)
    assert len(a.micro_batches) == len(b.micro_batches)
    for x, y in zip(a.micro_batches, b.micro_batches):
        assert (x.index, x.seq_len, x.names) == (y.index, y.seq_len, y.names)
        assert np.array_equal(x.sample_ids, y.sample_ids)
        for name in x.names:
            u, v = x[name], y[name]
            if isinstance(u, TensorField):
                assert isinstance(v, TensorField)
                assert (u.dtype_name, u.shape) == (v.dtype_name, v.shape)
                assert u.buffer.tobytes() == v.buffer.tobytes()
            else:
                assert u.dtype == v.dtype and u.shape == v.shape and np.array_equal(u, v), name


def test_batch_round_trips_through_serialize_without_copying_large_arrays():
    batch = with_bf16(image_text_batch(tokens=160_000).for_rank(1))  # over 64 KiB per array
    header, frames = serialize(batch, serializers=["dask"])
    assert header["serializer"] == "dask"
    out = deserialize(header, frames)
    assert_same_batch(batch, out)
    for x, y in zip(batch.micro_batches, out.micro_batches):
        assert np.shares_memory(x["input_ids"], y["input_ids"])
        assert np.shares_memory(x["loss_weights"].buffer, y["loss_weights"].buffer)


def test_small_arrays_share_one_aligned_writable_frame():
    """Every frame costs distributed a fixed overhead: a small batch travels in a few frames, its
    arrays at aligned offsets of frame 0, and arrive writable (torch takes them as they are)."""
    batch = with_bf16(image_text_batch().for_rank(1))
    header, frames = wire.dumps_batch(batch)
    arrays = sum(1 + len(mb.fields) for mb in batch.micro_batches)
    assert len(frames) < arrays / 4
    out = wire.loads_batch(header, frames)
    assert_same_batch(batch, out)
    for mb in out.micro_batches:
        for name in mb.names:
            value = mb[name].buffer if isinstance(mb[name], TensorField) else mb[name]
            assert value.flags.aligned and value.flags.writeable, name


def test_dp_batch_and_every_pipeline_role_round_trip_through_dumps_loads():
    dp = image_text_batch()
    messages = [dp] + [
        dp.for_rank(r, receives_tokens=t, receives_labels=l)
        for r in range(2) for t in (True, False) for l in (True, False)
    ]
    for original in messages:
        frames = dumps({"op": "batch", "batch": to_serialize(original)})
        received = loads(frames)
        assert received["op"] == "batch"
        assert_same_batch(original, received["batch"])


def test_bfloat16_bits_arrive_identical_including_nan_and_negative_zero():
    bits = np.array([0x0000, 0x8000, 0x7FC0, 0xFFC1, 0x7F80, 0x3F80, 0x0001], dtype=np.uint16)
    mb = MicroBatch(0, 7, np.zeros((0, 3)), {"w": TensorField("bfloat16", (7,), bits)})
    frames = dumps(to_serialize(Batch(0, 0, 0, 1, (mb,))))
    received = loads(frames)
    field = received.micro_batches[0]["w"]
    assert field.dtype_name == "bfloat16"
    assert field.buffer.tolist() == bits.tolist()


def test_header_is_small_and_frames_are_the_array_bytes():
    batch = image_text_batch().for_rank(0)
    header, frames = wire.dumps_batch(batch)
    arrays = sum(1 + len(mb.fields) for mb in batch.micro_batches)
    assert batch.nbytes <= sum(f.nbytes for f in frames) <= batch.nbytes + 8 * arrays  # + alignment
    assert len(dumps(header)[0]) < 4096  # msgpack-able, a few hundred bytes per micro-batch


def test_arrays_over_64_mib_are_split_into_frames_of_at_most_64_mib_and_rejoined():
    big = np.arange(64 * 2**20 + 1001, dtype=np.int64) % 251
    mb = MicroBatch(0, 0, np.zeros((0, 3)), {"pixels": big.astype(np.uint8)})
    batch = Batch(0, 0, 0, 1, (mb,))
    header, frames = wire.dumps_batch(batch)
    assert [f.nbytes for f in frames] == [0, 64 * 2**20, 1001]  # small ones (none), two parts
    out = deserialize(*serialize(batch, serializers=["dask"]))
    assert np.array_equal(out.micro_batches[0]["pixels"], mb["pixels"])


def test_frame_limit_follows_a_smaller_cluster_shard_size_and_keeps_whole_items():
    values = np.arange(1000, dtype=np.int32)
    small = np.arange(100, dtype=np.int64)
    batch = Batch(0, 0, 0, 1, (MicroBatch(0, 1000, np.zeros((0, 3)), {"x": values, "y": small}),))
    with dask.config.set({"distributed.comm.shard": "1001 B"}):
        assert wire.frame_limit() == 1001
        header, frames = wire.dumps_batch(batch)
    assert [f.nbytes for f in frames] == [800, 1000, 1000, 1000, 1000]  # y shares frame 0
    out = wire.loads_batch(header, frames)
    assert np.array_equal(out.micro_batches[0]["x"], values)
    assert np.array_equal(out.micro_batches[0]["y"], small)


def test_misaligned_frames_are_copied_to_aligned_arrays():
    values = np.arange(10_000, dtype=np.int64)  # a frame of its own
    small = np.arange(10, dtype=np.int64)  # in frame 0
    batch = Batch(0, 0, 0, 1, (MicroBatch(0, 10, np.zeros((0, 3)), {"x": values, "y": small}),))
    header, frames = wire.dumps_batch(batch)
    misaligned = []
    for frame in frames:
        arena = bytearray(1 + frame.nbytes)
        arena[1:] = frame
        misaligned.append(memoryview(arena)[1:])
    out = wire.loads_batch(header, misaligned)
    x, y = out.micro_batches[0]["x"], out.micro_batches[0]["y"]
    assert x.flags.aligned and x.tolist() == list(range(10_000))
    assert y.flags.aligned and y.tolist() == list(range(10))


def test_other_format_version_is_refused_with_a_clear_message():
    header, frames = wire.dumps_batch(image_text_batch().for_rank(0))
    header["format"] = 99
    with pytest.raises(BatchError, match="batch of step 11, dp rank 2 uses wire format 99"):
        wire.loads_batch(header, frames)


def test_sizeof_counts_the_arrays_within_five_percent():
    dp = image_text_batch(tokens=20_000)
    for obj in (dp, dp.for_rank(0), dp.for_rank(1, receives_tokens=False)):
        assert obj.nbytes > 20_000
        assert obj.nbytes <= sizeof(obj) <= 1.05 * obj.nbytes
    chunk = SampleChunk.from_samples("web", 0, np.arange(100), [np.arange(500)] * 100)
    assert chunk.nbytes <= sizeof(chunk) <= 1.05 * chunk.nbytes


def test_register_is_idempotent():
    wire.register()
    wire.register()
    batch = image_text_batch().for_rank(0)
    assert_same_batch(batch, loads(dumps(to_serialize(batch))))
    assert isinstance(loads(dumps(to_serialize(image_text_batch()))), DPBatch)
