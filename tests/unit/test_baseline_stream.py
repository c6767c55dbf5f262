"""The streaming baseline's reader (``benchmarks/baseline_stream.py``): what one DataLoader worker
holds per source, and that it still yields every row once."""

from __future__ import annotations

import pytest
from fixtures_sources import Store, image_rows, stdlib_texts, write_parquet

from benchmarks.baseline_stream import StreamingSourceStream
from mdata.sources import DecodeImageCaption, ReaderCache, Source, TokenizeText


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    store = Store("local", str(tmp_path_factory.mktemp("stream")))
    write_parquet(store, "text/part-0.parquet", {"text": stdlib_texts(9, max_chars=800)})
    images, captions = image_rows(7)
    write_parquet(store, "caps/part-0.parquet", {"image": images, "caption": captions})
    return (Source("text", store.url("text/*.parquet"), transform=TokenizeText(field="text"), chunk_rows=4),
            Source("caps", store.url("caps/*.parquet"), chunk_rows=4,
                   transform=DecodeImageCaption(patch_size=16, max_patches=12)))


def _stream(source: Source, index: int = 0) -> StreamingSourceStream:
    return StreamingSourceStream(source, index, index=0, num_streams=1, seed=3, cache=ReaderCache())


def test_an_image_source_decodes_a_row_only_when_it_is_drawn(sources) -> None:
    """A worker mixing hundreds of sources keeps a stream per source: each holds its batch as
    stored (JPEG bytes), never a batch of decoded pixels."""
    stream = _stream(sources[1], 1)
    first = stream.next()
    assert first.image is not None  # drawn: decoded
    assert stream._buffer == []  # nothing else decoded ahead
    shard, path, rows, columns, left = stream._raw
    assert len(left) == len(rows) - 1 and isinstance(columns["image"][0], bytes)


def test_streams_yield_every_row_once_per_pass(sources) -> None:
    for k, source in enumerate(sources):
        stream = _stream(source, k)
        rows = 9 if source.name == "text" else 7
        drawn = [stream.next().row for _ in range(rows)]
        assert sorted(drawn) == list(range(rows)), source.name
    text = _stream(sources[0])
    text.next()
    assert text._raw is None and len(text._buffer) == 3  # text: a transformed batch at a time
