"""Rows too large or too deep for a reader: a typed error naming source, shard and row.

A JSONL line nesting arrays deeper than the JSON parser's stack used to raise ``RecursionError``
past the reader's error handling (the job failed with an untyped error naming nothing); lines and
cells of any size reached the transform (a loader killed for memory on a runaway line).
"""

from __future__ import annotations

import dask.config
import pytest

from fixtures_sources import Store, stdlib_texts, write_parquet
from mdata.errors import CorruptShardError, RowTooLargeError
from mdata.sources import ReaderCache, Source, load_chunk
from mdata.sources.limits import ReadLimits


def jsonl_source(store: Store) -> Source:
    return Source("chat", store.url("*.jsonl"), format="jsonl")


def test_a_deeply_nested_line_is_a_corrupt_shard_naming_the_row_not_a_recursion_error(tmp_path):
    store = Store("local", str(tmp_path))
    deep = b'{"text": "deep", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    store.write_bytes("a.jsonl", b'{"text": "fine"}\n' + deep + b'\n{"text": "also fine"}\n')
    with pytest.raises(CorruptShardError, match=r"source 'chat', shard '.*a\.jsonl', row 1: line "
                                                r"nests JSON values too deeply to parse"):
        load_chunk(jsonl_source(store), 0, 0, 3, cache=ReaderCache())
    assert load_chunk(jsonl_source(store), 0, 2, 3, cache=ReaderCache()).rows.tolist() == [2]


def test_a_line_over_the_cap_is_refused_before_it_is_read(tmp_path):
    store = Store("local", str(tmp_path))
    store.write_bytes("a.jsonl", b'{"text": "short"}\n{"text": "' + b"y" * 5000 + b'"}\n')
    with dask.config.set({"mdata.sources.max-line-bytes": "4kB"}):
        cache = ReaderCache()
        assert load_chunk(jsonl_source(store), 0, 0, 1, cache=cache).rows.tolist() == [0]
        with pytest.raises(RowTooLargeError, match=r"source 'chat', shard '.*a\.jsonl', row 1: line "
                                                   r"is 5012 bytes, over mdata.sources.max-line-bytes=4000"):
            load_chunk(jsonl_source(store), 0, 0, 2, cache=cache)


def test_a_parquet_cell_over_the_cap_names_field_and_row(tmp_path):
    store = Store("local", str(tmp_path))
    texts = stdlib_texts(6, max_chars=200)
    texts[4] = "é" * 3000  # 3000 characters, 6000 bytes of UTF-8
    write_parquet(store, "a.parquet", {"text": texts}, row_group_size=3)
    source = Source("web", store.url("*.parquet"))
    with dask.config.set({"mdata.sources.max-cell-bytes": 5000}):
        cache = ReaderCache()
        assert load_chunk(source, 0, 0, 3, cache=cache).rows.tolist() == [0, 1, 2]
        with pytest.raises(RowTooLargeError, match=r"shard '.*a\.parquet', row 4: field 'text' holds "
                                                   r"6000 bytes, over mdata.sources.max-cell-bytes=5000"):
            load_chunk(source, 0, 3, 6, cache=cache)
    assert issubclass(RowTooLargeError, CorruptShardError)  # a source's on_corrupt policy applies


def test_limits_must_be_positive_ints():
    assert ReadLimits.from_config() == ReadLimits()  # mdata.yaml's defaults are the class's
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_line_bytes must be a positive int"):
            ReadLimits(max_line_bytes=bad)


def test_a_corrupt_footer_is_listed_with_no_rows_under_skip_and_fails_the_listing_under_fail(tmp_path):
    from mdata.sources import list_shards

    store = Store("local", str(tmp_path))
    write_parquet(store, "a.parquet", {"text": stdlib_texts(5)})
    write_parquet(store, "b.parquet", {"text": stdlib_texts(4)})
    whole = (tmp_path / "b.parquet").read_bytes()
    (tmp_path / "b.parquet").write_bytes(whole[: len(whole) // 2])  # truncated: no footer
    write_parquet(store, "c.parquet", {"text": stdlib_texts(3)})
    with pytest.raises(CorruptShardError, match=r"shard '.*b\.parquet': cannot read the Parquet footer"):
        list_shards(Source("web", store.url("*.parquet")))
    skip = Source("web", store.url("*.parquet"), on_corrupt="skip")
    listing = list_shards(skip)
    assert [s.num_rows for s in listing.shards] == [5, 0, 3]
    ((index, reason),) = listing.quarantined
    assert index == 1 and reason.startswith("CorruptShardError: cannot read the Parquet footer")
    assert load_chunk(skip, 2, 0, 3, cache=ReaderCache()).rows.tolist() == [0, 1, 2]
