"""Source: the declarative spec of one dataset, validated at construction.

A Source is a frozen, picklable value: it is shipped with every load task, compared across runs
(checkpoints, plan fingerprints) and named in every error. It holds no open files or tokenizers;
those live in the per-process :class:`~mdata.sources.cache.ReaderCache` and tokenizer cache.
Everything that can be checked without touching storage is checked here, so a typo fails when the
plan is written rather than on a worker an hour into a job. Touching storage is the job of the
layers above, which take a Source: :func:`mdata.sources.listing.list_shards` lists its shards, and a
value type never imports its consumers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from mdata.errors import InvalidSourceError, UnknownFormatError
from mdata.sources.transforms import TokenizeText, Transform

__all__ = ["Format", "ON_CORRUPT", "Source"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

#: A source's policies for a chunk that cannot be parsed: fail the job, or quarantine and read on.
ON_CORRUPT = ("fail", "skip")


class Format(str, Enum):
    """Shard file formats mdata can read. Each has a reader in :mod:`mdata.sources.readers`."""

    PARQUET = "parquet"
    JSONL = "jsonl"
    #: Clip files (mp4, webm, mkv), one shard of one row each, captions in ``.txt`` sidecars.
    VIDEO = "video"
    # WEBDATASET = "webdataset"  -- planned: add the member here and a reader in readers._READERS.

    @property
    def suffixes(self) -> tuple[str, ...]:
        """File name endings taken when the URL is a directory."""
        return {Format.PARQUET: (".parquet",), Format.JSONL: (".jsonl", ".ndjson"),
                Format.VIDEO: (".mp4", ".webm", ".mkv")}[self]


@dataclass(frozen=True)
class Source:
    """One dataset: shards behind an fsspec URL or glob, a format, and a sample transform.

    Args:
        name: lowercase identifier (``[a-z][a-z0-9_]*``); becomes the Dask resource ``pool_<name>``.
        url: a local path, ``file://``, ``memory://`` or ``s3://bucket/prefix/*.parquet`` URL; a
            glob, a single file, or a directory (all files with the format's suffix below it).
        format: ``"parquet"``, ``"jsonl"`` or ``"video"`` (clip files, one row each; or a
            :class:`Format`).
        fields: columns to read; by default exactly the transform's fields. When given it must
            include every field the transform reads.
        transform: the sample transform; :class:`~mdata.sources.transforms.TokenizeText` by default.
        storage_options: passed to fsspec (``{"client_kwargs": {"endpoint_url": ...}}`` for S3).
        chunk_rows: rows per load task (each task should be >= ~100 ms of work).
        skip_tolerance: fraction of a chunk's rows allowed to fail their transform and be skipped
            (counted in ``SampleChunk.skipped``); 0.0 means any failing sample fails the chunk.
        max_tokens: cap on each sample's ``num_tokens`` (text tokens are truncated to fit next to
            the image patches); None for no cap.
        on_corrupt: what a chunk that cannot be parsed (a :class:`~mdata.errors.CorruptShardError`)
            does to the job: ``"fail"`` (the default) fails it; ``"skip"`` quarantines the shard's
            unreadable rows, replaced by the next ones in the source's order (docs/concepts.md).
    """

    name: str
    url: str
    format: Format | str = Format.PARQUET
    fields: tuple[str, ...] = ()
    transform: Transform = field(default_factory=TokenizeText)
    storage_options: Mapping[str, Any] | None = field(default=None, hash=False)
    chunk_rows: int = 256
    skip_tolerance: float = 0.0
    max_tokens: int | None = None
    on_corrupt: str = "fail"

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidSourceError(
                "invalid source name",
                source=str(name),
                hint="use a lowercase identifier such as 'web_text' (it becomes the Dask resource "
                "'pool_<name>'; resources are lowercased by environment variables)",
            )
        try:
            fmt = Format(self.format)
        except ValueError:
            raise UnknownFormatError(
                f"unknown format {self.format!r}",
                source=name,
                hint="supported formats: " + ", ".join(f.value for f in Format),
            ) from None
        object.__setattr__(self, "format", fmt)
        if not isinstance(self.url, str) or not self.url:
            raise InvalidSourceError(
                f"url must be a non-empty string, got {self.url!r}",
                source=name,
                hint="e.g. '/data/web/*.parquet' or 's3://bucket/web/*.parquet'",
            )
        if not isinstance(self.transform, Transform):
            raise InvalidSourceError(
                f"transform {self.transform!r} is not a sample transform",
                source=name,
                hint="use TokenizeText, DecodeImageCaption, DecodeVideoCaption or a SampleTransform subclass",
            )
        required = tuple(self.transform.required_fields())
        fields = tuple(self.fields) if self.fields else required
        if any(not isinstance(f, str) or not f for f in fields) or len(set(fields)) != len(fields):
            raise InvalidSourceError(
                f"fields must be distinct non-empty column names, got {self.fields!r}", source=name
            )
        missing = [f for f in required if f not in fields]
        if missing:
            raise InvalidSourceError(
                f"fields {fields!r} omit {missing!r}, which the transform reads",
                source=name,
                hint="add them to fields, or leave fields empty to read exactly the transform's",
            )
        object.__setattr__(self, "fields", fields)
        if not isinstance(self.chunk_rows, int) or isinstance(self.chunk_rows, bool) or self.chunk_rows < 1:
            raise InvalidSourceError(
                f"chunk_rows must be a positive int, got {self.chunk_rows!r}", source=name
            )
        tol = self.skip_tolerance
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0.0 <= tol < 1.0:
            raise InvalidSourceError(
                f"skip_tolerance must be a fraction in [0, 1), got {tol!r}",
                source=name,
                hint="0.0 fails a chunk on any bad sample; 0.01 tolerates 1% of its rows",
            )
        object.__setattr__(self, "skip_tolerance", float(tol))
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1
        ):
            raise InvalidSourceError(
                f"max_tokens must be a positive int or None, got {self.max_tokens!r}", source=name
            )
        if self.on_corrupt not in ON_CORRUPT:
            raise InvalidSourceError(
                f"on_corrupt must be one of {', '.join(map(repr, ON_CORRUPT))}, got {self.on_corrupt!r}",
                source=name,
                hint="'fail' stops the job at a corrupt shard; 'skip' quarantines it and reads on",
            )
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise InvalidSourceError(
                f"storage_options must be a mapping, got {type(self.storage_options).__name__}",
                source=name,
            )

    @property
    def pool_resource(self) -> str:
        """The Dask worker resource that marks a worker as a loader of this source."""
        return f"pool_{self.name}"

    @property
    def cache_key(self) -> tuple[str, str, str, str]:
        """What identifies this source's files within a process (the reader cache's key).

        Two Source values with the same name but another URL or credentials never share readers.
        """
        options = json.dumps(self.storage_options or {}, sort_keys=True, default=repr)
        return (self.name, self.url, self.format.value, options)

