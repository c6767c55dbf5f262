"""SampleChunk: columnar layout, take(), sizes."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest

from mdata.sources import SampleChunk, SkippedSample


def image(h: int, w: int, value: int) -> np.ndarray:
    return np.full((h, w, 3), value, dtype=np.uint8)


def test_from_samples_lays_out_csr_columns():
    chunk = SampleChunk.from_samples(
        "web", 2, [5, 7, 9], [[1, 2, 3], [], [4]],
        skipped=[SkippedSample(6, "SampleError: bad")],
    )
    assert len(chunk) == 3
    assert chunk.token_ids.dtype == np.int32 and chunk.token_ids.tolist() == [1, 2, 3, 4]
    assert chunk.token_offsets.tolist() == [0, 3, 3, 4]
    assert chunk.num_tokens.tolist() == [3, 0, 1]
    assert chunk.num_patches.tolist() == [0, 0, 0]
    assert chunk.tokens(1).tolist() == [] and chunk.tokens(2).tolist() == [4]
    assert chunk.image(0) is None
    assert chunk.skipped == (SkippedSample(6, "SampleError: bad"),)


def test_images_and_patches_count_in_num_tokens():
    chunk = SampleChunk.from_samples(
        "img", 0, [0, 1], [[10, 11], [12]], num_patches=[4, 2],
        images=[image(32, 32, 1), image(16, 32, 2)],
    )
    assert chunk.num_tokens.tolist() == [6, 3]
    assert chunk.image_shapes.tolist() == [[32, 32, 3], [16, 32, 3]]
    assert chunk.pixel_offsets.tolist() == [0, 32 * 32 * 3, 32 * 32 * 3 + 16 * 32 * 3]
    assert np.array_equal(chunk.image(1), image(16, 32, 2))


def test_take_selects_and_reorders_samples():
    chunk = SampleChunk.from_samples(
        "img", 1, [3, 4, 5], [[1], [2, 2], [3, 3, 3]], num_patches=[1, 2, 3],
        images=[image(16, 16, 1), image(16, 32, 2), image(32, 16, 3)],
    )
    part = chunk.take([2, 0])
    assert part.rows.tolist() == [5, 3]
    assert part.tokens(0).tolist() == [3, 3, 3] and part.tokens(1).tolist() == [1]
    assert part.num_tokens.tolist() == [6, 2]
    assert np.array_equal(part.image(0), image(32, 16, 3))
    assert np.array_equal(part.image(1), image(16, 16, 1))
    assert part.skipped == ()
    assert len(chunk.take([])) == 0
    with pytest.raises(IndexError, match=r"take\(\[3\]\) out of range for a chunk of 3 samples"):
        chunk.take([3])


@pytest.mark.parametrize("length", [0, 1, 3, 255, 256, 4000])
def test_take_copies_short_and_long_segments_alike(length):
    """take() copies long segments (images) slice by slice and short ones (tokens) through one
    index; both must give every sample's exact data, in the order asked, repeats included."""
    rng = np.random.default_rng(length)
    lengths = rng.integers(0, 2 * length + 1, size=9)
    tokens = [rng.integers(0, 1000, size=n).tolist() for n in lengths]
    chunk = SampleChunk.from_samples("t", 0, np.arange(9), tokens)
    order = [8, 0, 3, 3, 5, 1]
    part = chunk.take(order)
    for i, k in enumerate(order):
        assert part.tokens(i).tolist() == tokens[k]
    assert part.token_ids.dtype == np.int32 and part.token_offsets[-1] == len(part.token_ids)


def test_nbytes_counts_every_buffer_and_sizeof_reports_it():
    chunk = SampleChunk.from_samples("img", 0, [0], [[1, 2]], num_patches=[1], images=[image(16, 16, 0)])
    expected = 8 + 2 * 4 + 2 * 8 + 4 + 4 + 16 * 16 * 3 + 2 * 8 + 3 * 4
    assert chunk.nbytes == expected
    assert sys.getsizeof(chunk) >= expected


def test_pickles_with_its_arrays():
    chunk = SampleChunk.from_samples("web", 0, [1, 2], [[5], [6, 7]])
    back = pickle.loads(pickle.dumps(chunk))
    assert back.rows.tolist() == [1, 2] and back.token_ids.tolist() == [5, 6, 7]


def test_inconsistent_columns_are_rejected():
    with pytest.raises(ValueError, match=r"token_offsets ends at 5, token_ids has 2"):
        SampleChunk(
            source="web", shard=0, rows=np.array([0]), token_ids=np.array([1, 2], np.int32),
            token_offsets=np.array([0, 5]), num_tokens=np.array([5], np.int32),
            num_patches=np.array([0], np.int32),
        )
