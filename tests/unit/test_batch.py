"""Batch construction and the CP/PP split (mdata.batch), on real SampleChunks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdata.batch import (
    Batch,
    DPBatch,
    MicroBatch,
    TensorField,
    build_dp_batch,
    zigzag_indices,
)
from mdata.errors import BatchError
from mdata.sources.chunk import SampleChunk

IMG = 99  # image placeholder id used in these tests


def text_chunk(source="web", shard=2):
    # rows 5, 6, 7 with 3, 2 and 4 tokens
    return SampleChunk.from_samples(source, shard, [5, 6, 7], [[1, 2, 3], [4, 5], [6, 7, 8, 9]])


def image_chunk():
    img = np.arange(2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 3)
    return SampleChunk.from_samples(
        "caps", 0, [1], [[11, 12, 13]], num_patches=[3], images=[img]
    )


def two_source_batch(**kwargs):
    pieces = [text_chunk().take([2, 0]), image_chunk()]
    # samples in piece order: web/2/7 (4 tok), web/2/5 (3 tok), caps/0/1 (3 patches + 3 text)
    defaults = dict(max_tokens=10, image_token_id=IMG)
    defaults.update(kwargs)
    return build_dp_batch(
        7, 1, pieces,
        micro_batch=[0, 1, 0],
        position=[1, 0, 0],
        lengths=[4, 3, 5],
        sample_ids=[[0, 2, 7], [0, 2, 5], [1, 0, 1]],
        num_micro_batches=2,
        **defaults,
    )


def test_packs_documents_in_position_order_with_shifted_labels_and_restarting_positions():
    dp = two_source_batch()
    assert (dp.step, dp.dp_rank, dp.cp) == (7, 1, 1)
    mb0, mb1 = dp.micro_batches
    # micro-batch 0: the image sample (3 placeholders + 2 of its 3 caption tokens), then web/2/7
    assert mb0.seq_len == 9
    assert mb0["input_ids"].tolist() == [IMG, IMG, IMG, 11, 12, 6, 7, 8, 9]
    assert mb0["labels"].tolist() == [-100, -100, 11, 12, -100, 7, 8, 9, -100]
    assert mb0["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]
    assert mb0["cu_seqlens"].tolist() == [0, 5, 9]
    assert mb0["seqlens"].tolist() == [5, 4]
    assert mb0.sample_ids.tolist() == [[1, 0, 1], [0, 2, 7]]
    assert mb0.max_seqlen == 5
    assert mb0["input_ids"].dtype == np.int32 and mb0["cu_seqlens"].dtype == np.int32
    assert mb1["input_ids"].tolist() == [1, 2, 3]
    assert mb1["labels"].tolist() == [2, 3, -100]
    assert mb1.sample_ids.tolist() == [[0, 2, 5]]
    assert dp.tokens_per_source == {"web": 7, "caps": 5}


def test_image_fields_follow_document_order():
    dp = two_source_batch()
    mb0, mb1 = dp.micro_batches
    assert mb0["pixels"].tolist() == list(range(12))
    assert mb0["image_shapes"].tolist() == [[2, 2, 3]]
    assert mb0["image_token_counts"].tolist() == [3]
    # a micro-batch without images still has the (empty) image fields, with the right shapes
    assert mb1["pixels"].shape == (0,) and mb1["image_shapes"].shape == (0, 3)
    assert mb1["image_token_counts"].shape == (0,)


def test_text_only_batch_has_no_image_fields_and_needs_no_image_token():
    dp = build_dp_batch(
        0, 0, [text_chunk()], [0, 0, 0], [0, 1, 2], [3, 2, 4],
        [[0, 2, 5], [0, 2, 6], [0, 2, 7]], 1, max_tokens=9,
    )
    (mb,) = dp.micro_batches
    assert mb.names == ("input_ids", "labels", "position_ids", "cu_seqlens", "seqlens")
    assert mb["input_ids"].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_pad_to_multiple_pads_the_tail_with_pad_id_and_ignored_labels():
    dp = build_dp_batch(
        0, 0, [text_chunk()], [0, 0, 0], [0, 1, 2], [3, 2, 4],
        [[0, 2, 5], [0, 2, 6], [0, 2, 7]], 1, max_tokens=9, pad_to_multiple=8, pad_id=-1,
        ignore_index=-7,
    )
    (mb,) = dp.micro_batches
    assert mb.seq_len == 16
    assert mb["input_ids"].tolist()[9:] == [-1] * 7
    assert mb["labels"].tolist() == [2, 3, -7, 5, -7, 7, 8, 9, -7] + [-7] * 7
    assert mb["position_ids"].tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3] + list(range(7))
    assert mb["cu_seqlens"].tolist() == [0, 3, 5, 9]  # the tail belongs to no document


def test_context_parallel_pads_each_document_to_twice_cp():
    dp = build_dp_batch(
        0, 0, [text_chunk()], [0, 0, 0], [0, 1, 2], [3, 2, 4],
        [[0, 2, 5], [0, 2, 6], [0, 2, 7]], 1, max_tokens=9, cp=2,
    )
    (mb,) = dp.micro_batches
    assert mb["cu_seqlens"].tolist() == [0, 4, 8, 12]
    assert mb["seqlens"].tolist() == [3, 2, 4]
    assert mb["input_ids"].tolist() == [1, 2, 3, 0, 4, 5, 0, 0, 6, 7, 8, 9]
    assert mb["labels"].tolist() == [2, 3, -100, -100, 5, -100, -100, -100, 7, 8, 9, -100]


def test_zigzag_split_gives_rank_i_chunks_i_and_mirror():
    dp = build_dp_batch(
        0, 0, [text_chunk()], [0, 0, 0], [0, 1, 2], [3, 2, 4],
        [[0, 2, 5], [0, 2, 6], [0, 2, 7]], 1, max_tokens=9, cp=2,
    )
    r0, r1 = dp.for_rank(0), dp.for_rank(1)
    # each padded document of 4 is cut into chunks of 1: rank 0 gets chunks 0 and 3
    assert r0.micro_batches[0]["input_ids"].tolist() == [1, 0, 4, 0, 6, 9]
    assert r1.micro_batches[0]["input_ids"].tolist() == [2, 3, 5, 0, 7, 8]
    assert r1.micro_batches[0]["position_ids"].tolist() == [1, 2, 1, 2, 1, 2]
    assert r1.micro_batches[0]["cu_seqlens"].tolist() == [0, 2, 4, 6]
    assert r1.micro_batches[0]["cu_seqlens_global"].tolist() == [0, 4, 8, 12]
    assert r1.micro_batches[0].seq_len == 6 and r1.micro_batches[0].max_seqlen == 2
    assert (r1.cp_rank, r1.cp, r1.step, r1.dp_rank) == (1, 2, 0, 0)


@st.composite
def packed_batches(draw):
    cp = draw(st.integers(1, 4))
    docs = draw(st.lists(st.integers(1, 40), min_size=1, max_size=8))
    pad = draw(st.sampled_from([None, 1, 3, 16]))
    micro = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    tokens = [rng.integers(1, 50_000, size=n) for n in docs]
    chunk = SampleChunk.from_samples("books", 4, np.arange(len(docs)) * 3, tokens)
    mb = rng.integers(0, micro, size=len(docs))
    position = np.zeros(len(docs), dtype=np.int64)
    for m in range(micro):
        members = np.flatnonzero(mb == m)
        position[members] = rng.permutation(len(members))
    ids = np.stack([np.zeros(len(docs)), np.full(len(docs), 4), np.arange(len(docs)) * 3], 1)
    dp = build_dp_batch(
        3, 0, [chunk], mb, position, docs, ids.astype(np.int64), micro,
        max_tokens=400, cp=cp, pad_to_multiple=pad,
    )
    return dp


@settings(max_examples=60, deadline=None)
@given(packed_batches())
def test_cp_ranks_reassemble_the_full_sequence_and_share_causal_work_evenly(dp):
    ranks = [dp.for_rank(r) for r in range(dp.cp)]
    for m, full in enumerate(dp.micro_batches):
        pieces = [rank.micro_batches[m] for rank in ranks]
        assert {p.seq_len for p in pieces} == {full.seq_len // dp.cp}
        order = np.concatenate(
            [zigzag_indices(full["cu_seqlens"], full.seq_len, dp.cp, r) for r in range(dp.cp)]
        )
        assert sorted(order.tolist()) == list(range(full.seq_len))
        for name in ("input_ids", "labels", "position_ids"):
            rebuilt = np.empty(full.seq_len, dtype=np.int32)
            rebuilt[order] = np.concatenate([p[name] for p in pieces])
            assert np.array_equal(rebuilt, full[name]), name
        for p in pieces:
            assert np.array_equal(p["cu_seqlens"] * dp.cp, full["cu_seqlens"])
            assert np.array_equal(p["seqlens"], full["seqlens"])
        # causal work: a token at in-document position q attends to q + 1 keys
        work = {int((p["position_ids"].astype(np.int64) + 1).sum()) for p in pieces}
        assert len(work) == 1


def test_zigzag_rejects_documents_not_padded_for_cp():
    with pytest.raises(BatchError, match="document 1 has length 3, not a multiple of 2\\*cp=4"):
        zigzag_indices(np.array([0, 4, 7]), 8, 2, 0)


def test_pipeline_roles_get_only_what_they_read():
    dp = two_source_batch()
    first = dp.for_rank(0, receives_tokens=True, receives_labels=False)
    last = dp.for_rank(0, receives_tokens=False, receives_labels=True)
    middle = dp.for_rank(0, receives_tokens=False, receives_labels=False)
    meta = {"cu_seqlens", "cu_seqlens_global", "seqlens"}
    assert set(middle.micro_batches[0].names) == meta
    assert set(first.micro_batches[0].names) == meta | {
        "input_ids", "position_ids", "pixels", "image_shapes", "image_token_counts"
    }
    assert set(last.micro_batches[0].names) == meta | {"labels"}
    assert middle.micro_batches[0].seq_len == 9
    assert middle.sample_ids.tolist() == [[1, 0, 1], [0, 2, 7], [0, 2, 5]]
    assert middle.nbytes < first.nbytes
    with pytest.raises(KeyError, match="no field 'labels'"):
        first.micro_batches[0]["labels"]


def test_cp1_split_shares_memory_with_the_constructor_batch():
    dp = two_source_batch()
    batch = dp.for_rank(0)
    assert np.shares_memory(batch.micro_batches[0]["input_ids"], dp.micro_batches[0]["input_ids"])


def test_nbytes_counts_every_array():
    dp = two_source_batch()
    expected = sum(
        mb.sample_ids.nbytes + sum(v.nbytes for v in mb.fields.values())
        for mb in dp.micro_batches
    )
    assert dp.nbytes == expected
    # 9 + 3 tokens x 3 int32 arrays, cu_seqlens 3 + 2, seqlens 2 + 1, 12 pixels, one image's
    # shape (3) and token count (1), 3 sample ids x 3 int64
    assert expected == 12 * 3 * 4 + 5 * 4 + 3 * 4 + 12 + 4 * 4 + 9 * 8


def test_empty_micro_batch_is_allowed():
    dp = build_dp_batch(
        0, 0, [text_chunk()], [0, 0, 0], [0, 1, 2], [3, 2, 4],
        [[0, 2, 5], [0, 2, 6], [0, 2, 7]], 2, max_tokens=9, cp=2,
    )
    empty = dp.micro_batches[1]
    assert empty.seq_len == 0 and empty.num_samples == 0
    assert empty["cu_seqlens"].tolist() == [0]
    assert dp.for_rank(1).micro_batches[1]["input_ids"].shape == (0,)


# -- errors -------------------------------------------------------------------------------------


def build_text(**overrides):
    args = dict(
        micro_batch=[0, 0, 0], position=[0, 1, 2], lengths=[3, 2, 4],
        sample_ids=[[0, 2, 5], [0, 2, 6], [0, 2, 7]],
    )
    args.update(overrides)
    return build_dp_batch(4, 3, [text_chunk()], num_micro_batches=1, max_tokens=9, **args)


def test_sample_id_that_does_not_match_the_pulled_row_is_rejected():
    with pytest.raises(
        BatchError,
        match=r"step 4, dp rank 3: sample 1 is labelled web/2/9 but the pulled row is web/2/6",
    ):
        build_text(sample_ids=[[0, 2, 5], [0, 2, 9], [0, 2, 7]])


def test_duplicate_positions_are_rejected():
    with pytest.raises(BatchError, match=r"micro-batch 0: positions \[0, 1, 1\] are not 0..2"):
        build_text(position=[0, 1, 1])


def test_overfull_micro_batch_is_rejected():
    with pytest.raises(BatchError, match="10 tokens exceed max_tokens=9"):
        build_dp_batch(
            0, 0, [text_chunk(), text_chunk(shard=3).take([1])], [0, 0, 0, 0], [0, 1, 2, 3],
            [3, 2, 4, 1], [[0, 2, 5], [0, 2, 6], [0, 2, 7], [0, 3, 6]], 1, max_tokens=9,
        )


def test_length_longer_than_the_sample_is_rejected():
    with pytest.raises(BatchError, match=r"sample 1 \(web/2/6, micro-batch 0\): planned length 3"):
        build_text(lengths=[3, 3, 3])


def test_truncation_into_an_image_is_rejected():
    with pytest.raises(BatchError, match="would cut into the image's 3 tokens"):
        build_dp_batch(
            0, 0, [image_chunk()], [0], [0], [2], [[1, 0, 1]], 1, max_tokens=9,
            image_token_id=IMG,
        )


def test_image_batch_without_image_token_id_is_rejected():
    with pytest.raises(BatchError, match="no image_token_id"):
        build_dp_batch(0, 0, [image_chunk()], [0], [0], [4], [[1, 0, 1]], 1, max_tokens=9)


def test_micro_batch_out_of_range_and_bad_column_shapes_are_rejected():
    with pytest.raises(BatchError, match=r"micro-batch index out of range \[0, 1\)"):
        build_text(micro_batch=[0, 1, 0])
    with pytest.raises(BatchError, match=r"lengths must have one entry per pulled sample \(3\)"):
        build_text(lengths=[3, 2])


def test_cp_rank_out_of_range_is_rejected():
    dp = build_text()
    with pytest.raises(BatchError, match=r"cp rank 1 is out of range for cp=1"):
        dp.for_rank(1)


# -- fields ------------------------------------------------------------------------------------


def test_bfloat16_rounds_to_nearest_even_and_widens_exactly():
    values = np.array([1.0, -2.5, 1.00390625, 1.01171875, np.inf, np.nan], dtype=np.float32)
    field = TensorField.bfloat16_from_float32(values)
    # 1 + 2^-8 is a tie: rounds down to even (1.0); 1 + 3*2^-8 ties up to 1 + 2^-6
    assert field.buffer.tolist() == [0x3F80, 0xC020, 0x3F80, 0x3F82, 0x7F80, 0x7FC0]
    assert field.shape == (6,) and field.nbytes == 12
    widened = field.to_float32()
    assert widened[:5].tolist() == [1.0, -2.5, 1.0, 1.015625, np.inf] and np.isnan(widened[5])


def test_tensor_field_validates_its_buffer():
    with pytest.raises(TypeError, match="dtype 'float8' is not supported"):
        TensorField("float8", (2,), np.zeros(2, np.uint8))
    with pytest.raises(TypeError, match="needs a uint16 buffer"):
        TensorField("bfloat16", (2,), np.zeros(2, np.float32))
    with pytest.raises(ValueError, match=r"shape \(3,\) needs 3"):
        TensorField("bfloat16", (3,), np.zeros(2, np.uint16))


def test_micro_batch_rejects_object_arrays_and_batches_concatenate_ids():
    with pytest.raises(TypeError, match="field 'x' has object dtype"):
        MicroBatch(0, 1, np.zeros((0, 3)), {"x": np.array([None])})
    mb = MicroBatch(0, 2, [[0, 1, 2]], {"w": TensorField.bfloat16_from_float32(np.ones(2))})
    batch = Batch(1, 0, 0, 1, (mb, mb.with_fields(y=np.arange(2))), {"a": 3})
    assert batch.sample_ids.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert batch.micro_batches[1].names == ("w", "y")
    assert batch.nbytes == 2 * (24 + 4) + 16
    assert isinstance(DPBatch(0, 0, 1, ()).for_rank(0), Batch)


@pytest.mark.parametrize("length,cp", [(1, 2), (7, 2), (16, 4), (37, 3), (100, 8)])
def test_zigzag_split_agrees_with_the_planners_cp_slices(length, cp):
    from mdata.balance import cp_zigzag_slices

    chunk = SampleChunk.from_samples("web", 0, [0], [np.arange(1, length + 1)])
    dp = build_dp_batch(0, 0, [chunk], [0], [0], [length], [[0, 0, 0]], 1, max_tokens=length, cp=cp)
    for rank, expected in enumerate(cp_zigzag_slices(length, cp)):
        local = dp.for_rank(rank).micro_batches[0]["input_ids"]
        real = local[local != 0] - 1  # token value t sits at position t - 1; 0 is padding
        assert real.tolist() == expected.tolist()
