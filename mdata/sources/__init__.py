"""Sources: what a dataset is (:class:`Source`), how its shards are read, and how rows become samples.

- :class:`Source` — the frozen spec of one dataset (URL or glob, format, fields, transform, chunking,
  skip tolerance), validated at construction; :func:`list_shards` lists its shards.
- :func:`load_chunk` — one load task: read rows ``[start, stop)`` of one shard through the per-process
  :class:`ReaderCache`, transform them, return a columnar :class:`SampleChunk`.
- Transforms — :class:`TokenizeText`, :class:`DecodeImageCaption`, or a :class:`SampleTransform`
  subclass of your own.
- Storage outages are waited out under a :class:`RetryPolicy` (``mdata.storage.*``);
  :func:`storage_waits` tells which sources of this process are waiting on storage right now,
  :func:`merge_storage_waits` merges the reports of several workers per source.

Everything here is numpy/pyarrow/fsspec only: no Dask, no torch.
"""

from mdata.sources.chunk import SampleChunk, SkippedSample
from mdata.sources.fields import FieldKind
from mdata.sources.cache import ReaderCache, ReaderCacheStats, default_reader_cache
from mdata.sources.listing import list_shards
from mdata.sources.load import load_chunk
from mdata.sources.readers import JsonlShardReader, ParquetShardReader, ShardReader
from mdata.sources.retry import RetryPolicy
from mdata.sources.shards import ShardInfo, SourceListing
from mdata.sources.spec import Format, Source
from mdata.sources.transforms import (
    ChunkContext,
    DecodeImageCaption,
    SampleOutput,
    SampleTransform,
    TokenizeText,
    Transform,
)
from mdata.sources.waits import StorageWait, storage_waits
from mdata.sources.wait_report import SourceStorageWait, describe_storage_wait, merge_storage_waits

__all__ = [
    "ChunkContext",
    "DecodeImageCaption",
    "FieldKind",
    "Format",
    "JsonlShardReader",
    "ParquetShardReader",
    "ReaderCache",
    "ReaderCacheStats",
    "RetryPolicy",
    "SampleChunk",
    "SampleOutput",
    "SampleTransform",
    "ShardInfo",
    "ShardReader",
    "SkippedSample",
    "Source",
    "SourceListing",
    "SourceStorageWait",
    "StorageWait",
    "TokenizeText",
    "Transform",
    "default_reader_cache",
    "describe_storage_wait",
    "list_shards",
    "load_chunk",
    "merge_storage_waits",
    "storage_waits",
]
