"""Which reader reads which format: the registry from :class:`Format` to a :class:`ShardReader`.

Reads fetch only what is asked for: for Parquet, only the row groups that overlap ``[start, stop)``
and only the declared columns; for JSONL, only the byte range of those lines. Adding a format means
a reader module next to :mod:`mdata.sources.parquet_reader` and one entry here.
"""

from __future__ import annotations

from mdata.sources.jsonl_reader import JsonlShardReader
from mdata.sources.parquet_reader import ParquetShardReader
from mdata.sources.shard_reader import ShardReader
from mdata.sources.spec import Format
from mdata.sources.video_reader import VideoFileReader

__all__ = ["JsonlShardReader", "ParquetShardReader", "ShardReader", "VideoFileReader", "reader_class"]


_READERS: dict[Format, type[ShardReader]] = {
    Format.PARQUET: ParquetShardReader,
    Format.JSONL: JsonlShardReader,
    Format.VIDEO: VideoFileReader,
}


def reader_class(fmt: Format) -> type[ShardReader]:
    """The reader for a format (every :class:`Format` member has one)."""
    return _READERS[Format(fmt)]
