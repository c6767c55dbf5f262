"""Sources: what a dataset is (:class:`Source`), how its shards are read, and how rows become samples.

- :class:`Source` — the frozen spec of one dataset (URL or glob, format, fields, transform, chunking,
  skip tolerance), validated at construction; :func:`list_shards` lists its shards.
- :func:`load_chunk` — one load task: read rows ``[start, stop)`` of one shard through the per-process
  :class:`ReaderCache`, transform them, return a columnar :class:`SampleChunk`.
- Transforms — :class:`TokenizeText`, :class:`DecodeImageCaption`, :class:`DecodeVideoCaption`
  and :class:`DecodeVideoDocument` (interleaved text and clips; PyAV, the ``video`` extra), or a
  :class:`SampleTransform` subclass of your own.
- Storage outages are waited out under a :class:`RetryPolicy` (``mdata.storage.*``);
  :func:`storage_waits` tells which sources of this process are waiting on storage right now,
  :func:`merge_storage_waits` merges the reports of several workers per source.

Everything here is numpy/pyarrow/fsspec only: no Dask, no torch.
"""

from typing import TYPE_CHECKING

from mdata.lazy_exports import lazy_exports

#: Where each public name lives. Names are imported on first use (PEP 562): a process that needs
#: one light module (a trainer's storage notices, a constructor's chunk type) does not import
#: pyarrow, Pillow and the tokenizer code with the readers and transforms it never runs.
_HOMES = {
    "SampleChunk": "chunk", "SkippedSample": "chunk",
    "FieldKind": "fields",
    "ReaderCache": "cache", "ReaderCacheStats": "cache", "default_reader_cache": "cache",
    "list_shards": "listing",
    "load_chunk": "load",
    "JsonlShardReader": "readers", "ParquetShardReader": "readers", "ShardReader": "readers",
    "RetryPolicy": "retry",
    "ShardInfo": "shards", "SourceListing": "shards",
    "Format": "spec", "Source": "spec",
    "ChunkContext": "transforms", "DecodeImageCaption": "transforms", "SampleOutput": "transforms",
    "SampleTransform": "transforms", "TokenizeText": "transforms", "Transform": "transforms",
    "DecodeVideoCaption": "video_transform", "VideoFileReader": "readers",
    "DecodeVideoDocument": "video_document",
    "StorageWait": "waits", "storage_waits": "waits", "storage_waits_begun": "waits",
    "SourceStorageWait": "wait_report", "describe_storage_wait": "wait_report",
    "merge_storage_waits": "wait_report",
}

if TYPE_CHECKING:
    from mdata.sources.cache import ReaderCache, ReaderCacheStats, default_reader_cache
    from mdata.sources.chunk import SampleChunk, SkippedSample
    from mdata.sources.fields import FieldKind
    from mdata.sources.listing import list_shards
    from mdata.sources.load import load_chunk
    from mdata.sources.readers import JsonlShardReader, ParquetShardReader, ShardReader
    from mdata.sources.retry import RetryPolicy
    from mdata.sources.shards import ShardInfo, SourceListing
    from mdata.sources.spec import Format, Source
    from mdata.sources.transforms import (ChunkContext, DecodeImageCaption, SampleOutput,
                                          SampleTransform, TokenizeText, Transform)
    from mdata.sources.video_transform import DecodeVideoCaption
    from mdata.sources.video_document import DecodeVideoDocument
    from mdata.sources.readers import VideoFileReader
    from mdata.sources.wait_report import SourceStorageWait, describe_storage_wait, merge_storage_waits
    from mdata.sources.waits import StorageWait, storage_waits, storage_waits_begun


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

__all__ = [
    "ChunkContext",
    "DecodeImageCaption",
    "DecodeVideoCaption",
    "DecodeVideoDocument",
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
    "VideoFileReader",
    "default_reader_cache",
    "describe_storage_wait",
    "list_shards",
    "load_chunk",
    "merge_storage_waits",
    "storage_waits",
    "storage_waits_begun",
]
