"""PackedChunk: what a loader holds gives back exactly what the decoded chunk would.

A loader keeps a chunk until its shuffle window is drawn; packed, each sample's token ids and
pixels are compressed on their own. Every take must equal ``SampleChunk.take`` of the decoded
chunk, field by field, dtype and bytes: the samples delivered may not change."""

from __future__ import annotations

import pickle
from functools import partial

import numpy as np
import pytest

from mdata.sources import SampleChunk, SkippedSample, load_chunk
from mdata.errors import SourceError
from mdata.sources.encoded_images import EncodedImages
from mdata.sources.packed import MIN_PACK_BYTES, PackedChunk, PackedRows

FIELDS = ("source", "shard", "rows", "token_ids", "token_offsets", "num_tokens", "num_patches",
          "pixels", "pixel_offsets", "image_shapes")


def assert_same(got: SampleChunk, want: SampleChunk) -> None:
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        if isinstance(b, np.ndarray):
            assert isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, name
            assert np.array_equal(a, b), name
        else:
            assert a == b, name


def photo_like(h: int, w: int, seed: int) -> np.ndarray:
    """Smooth gradients plus noise: compresses like a photo, not like a flat colour."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 3 + y) % 256, (y * 2) % 256, (x + y * 5) % 256], axis=-1)
    return (base + rng.integers(0, 8, (h, w, 3))).astype(np.uint8)


def mixed_chunk() -> SampleChunk:
    rng = np.random.default_rng(1)
    lengths = [0, 3, 40, 900, 5, 2000]  # empty, tiny (kept raw), long (compressed)
    tokens = [rng.integers(0, 100_277, n).astype(np.int32) for n in lengths]
    tokens[3][:] = np.tile(rng.integers(0, 50, 30), 30)  # repetitive: compresses well
    images = [photo_like(16 * (1 + i % 3), 16 * (1 + i % 2), i) for i in range(len(lengths))]
    return SampleChunk.from_samples("img", 3, [2, 4, 6, 8, 10, 12], tokens,
                                    num_patches=[1, 2, 1, 3, 2, 4], images=images,
                                    skipped=[SkippedSample(3, "ImageDecodeError: bad")])


def test_every_take_equals_the_decoded_chunks_take():
    chunk = mixed_chunk()
    packed = PackedChunk.pack(chunk)
    rng = np.random.default_rng(2)
    for indices in ([], [0], [5, 0], [1, 1, 3], [-1, -6], rng.permutation(6), np.arange(6)):
        assert_same(packed.take(indices), chunk.take(indices))
    whole = packed.unpack()
    assert_same(whole, chunk)
    assert whole.skipped == chunk.skipped
    assert packed.skipped == chunk.skipped and packed.rows is chunk.rows
    assert packed.shell.token_ids.size == 0 and packed.shell.pixels.size == 0
    # the shell's empty payloads are arrays of their own: a view would keep the decoded ones alive
    assert packed.shell.token_ids.base is None and packed.shell.pixels.base is None
    with pytest.raises(IndexError):
        packed.take([6])


def test_text_only_and_empty_chunks():
    text = SampleChunk.from_samples("web", 0, [0, 1, 2], [[1, 2, 3], list(range(500)), []])
    packed = PackedChunk.pack(text)
    assert packed.pixels is None and packed.take([2, 1]).pixels is None
    assert_same(packed.take([2, 1, 0]), text.take([2, 1, 0]))
    empty = SampleChunk.from_samples("web", 0, [], [])
    assert_same(PackedChunk.pack(empty).take([]), empty.take([]))
    assert len(PackedChunk.pack(empty)) == 0


def test_it_holds_less_and_keeps_short_segments_raw():
    chunk = mixed_chunk()
    packed = PackedChunk.pack(chunk)
    assert packed.nbytes < chunk.nbytes
    tokens = packed.tokens
    short = tokens.lengths * 4 < MIN_PACK_BYTES
    assert not tokens.packed[short].any() and tokens.packed[3]
    assert packed.pixels.row_bytes.tolist() == (chunk.image_shapes[:, 1] * 3).tolist()


def test_up_filter_round_trips_every_byte_value():
    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (7, 5, 3), dtype=np.uint8)  # noise: wraps around 0 and 255
    flat = image.reshape(-1)
    rows = PackedRows.pack(flat, np.array([0, flat.size]), np.array([15]))
    assert np.array_equal(rows.gather(np.array([0])), flat)


def test_pickles_as_dask_moves_a_held_chunk():
    chunk = mixed_chunk()
    packed = pickle.loads(pickle.dumps(PackedChunk.pack(chunk)))
    assert_same(packed.take([4, 1]), chunk.take([4, 1]))


def test_real_sources_round_trip(example_corpus):
    """Every kind of the example corpus (text, code, image captions), loaded as a loader does."""
    from mdata.data.example import example_sources
    from mdata.sources import list_shards

    for source in example_sources(example_corpus):
        if source.name == "videos":
            continue  # decoding clips costs seconds here; the cluster test delivers them packed
        rows = list_shards(source).shards[0].num_rows
        chunk = load_chunk(source, 0, 0, min(rows, 16))
        packed = PackedChunk.pack(chunk)
        order = np.random.default_rng(4).permutation(len(chunk))
        for part in np.array_split(order, 3):
            assert_same(packed.take(part), chunk.take(part))


def test_load_tasks_hold_packed_chunks_and_serve_the_same_rows(example_corpus):
    """``workers.loader``: a load task's result is packed unless ``mdata.sources.pack-held`` is
    off, and ``mdata_take_rows`` serves a packed chunk's rows as the decoded chunk's."""
    import dask

    from mdata.data.example import example_sources
    from mdata.wire.messages import Status, TakeRowsRequest
    from workers.loader import chunk_summary_task, load_chunk_task, make_take_rows_handler

    source = next(s for s in example_sources(example_corpus) if s.name == "captions")
    packed = load_chunk_task(source, 0, 0, 4)
    with dask.config.set({"mdata.sources.pack-held": False}):
        decoded = load_chunk_task(source, 0, 0, 4)
    assert isinstance(packed, PackedChunk) and isinstance(decoded, SampleChunk)
    assert isinstance(packed.pixels, EncodedImages)  # photos kept as their stored bytes
    assert packed.load_seconds > 0
    a, b = chunk_summary_task(packed), chunk_summary_task(decoded)
    assert a["nbytes"] < b["nbytes"]
    for name in ("rows", "num_tokens", "num_patches"):
        assert np.array_equal(a[name], b[name])
    assert a["skipped"] == b["skipped"]

    class Worker:
        data = {("mdata-load", "j", "captions", 0, 0): packed, ("mdata-load", "j", "captions", 0, 1): decoded}

    take = make_take_rows_handler(Worker())
    got = [take(TakeRowsRequest(key, (3, 1))) for key in Worker.data]
    assert all(r.status is Status.OK for r in got)
    assert_same(got[0].chunk, got[1].chunk)


def test_images_kept_as_stored_bytes_decode_to_the_same_pixels_or_fail():
    """A chunk's images kept as their cells come back as the load decoded them; a decoder that
    gives other pixels on the take fails loudly instead of delivering them."""
    import io

    from PIL import Image

    from mdata.sources.images import decode_image

    photos = [photo_like(40 + 8 * i, 56, i) for i in range(3)]
    cells = []
    for photo in photos:
        buf = io.BytesIO()
        Image.fromarray(photo).save(buf, format="JPEG", quality=90)
        cells.append(buf.getvalue())
    decode = partial(decode_image, patch_size=16, max_patches=64, max_pixels=10**7)  # as a loader's
    images = [decode(c) for c in cells]
    chunk = SampleChunk.from_samples("img", 0, [1, 5, 9], [[7, 8], [9], list(range(300))],
                                     num_patches=[4, 4, 4], images=images)
    packed = PackedChunk.pack(chunk, decode=decode, cells=cells)
    assert isinstance(packed.pixels, EncodedImages) and packed.nbytes < chunk.nbytes
    for indices in ([2, 0], [1], [], [0, 1, 2]):
        assert_same(packed.take(indices), chunk.take(indices))
    assert_same(pickle.loads(pickle.dumps(packed)).take([1, 2]), chunk.take([1, 2]))

    brighter = lambda data: np.minimum(decode(data).astype(np.int16) + 1, 255).astype(np.uint8)  # noqa: E731
    tampered = PackedChunk.pack(chunk, decode=brighter, cells=cells)
    with pytest.raises(SourceError, match="other pixels") as info:
        tampered.take([2])
    assert info.value.row == 9


def test_a_load_task_from_mid_shard_keeps_each_rows_own_stored_photo(example_corpus):
    """The stored cells a packed chunk keeps come from the columns its load read (row ``start
    + i`` at ``i``): from mid-shard on, every row's photo decodes to the decoded chunk's pixels."""
    import dask

    from mdata.data.example import example_sources
    from workers.loader import load_chunk_task

    source = next(s for s in example_sources(example_corpus) if s.name == "captions")
    packed = load_chunk_task(source, 0, 5, 9)
    with dask.config.set({"mdata.sources.pack-held": False}):
        decoded = load_chunk_task(source, 0, 5, 9)
    assert isinstance(packed.pixels, EncodedImages)
    order = tuple(range(len(decoded)))
    assert_same(packed.take(order), decoded.take(order))
