"""Write one source's rows as Parquet shards with several row groups each, byte-for-byte repeatable.

Loaders read a chunk of rows through the row groups that hold it, and the Planner spreads a
source's shards over workers, so the example corpus must look like real training data on both
levels: several shards per source, several row groups per shard. Row groups are sized per source
(a few speeches take the bytes of one scene) so that a row group holds roughly 0.1-2 MB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["Layout", "ShardFile", "shard_name", "write_shards"]


@dataclass(frozen=True)
class Layout:
    """How one source is cut: rows per shard (the last may be shorter) and rows per row group."""

    rows_per_shard: int
    rows_per_group: int

    def __post_init__(self) -> None:
        if self.rows_per_group < 1 or self.rows_per_shard < self.rows_per_group:
            raise ValueError(
                f"layout needs 1 <= rows_per_group <= rows_per_shard, got {self.rows_per_group} "
                f"rows per group and {self.rows_per_shard} per shard"
            )


@dataclass(frozen=True)
class ShardFile:
    """One written shard: its path relative to the corpus root, row count and size on disk."""

    path: str
    rows: int
    row_groups: int
    bytes: int


def shard_name(index: int) -> str:
    """``part-00000.parquet``: zero-padded so that a sorted glob lists shards in order."""
    return f"part-{index:05d}.parquet"


def write_shards(
    root: Path,
    name: str,
    table: pa.Table,
    layout: Layout,
    *,
    dictionary_columns: tuple[str, ...] = (),
) -> list[ShardFile]:
    """Write ``table`` under ``root/name/`` as ``part-NNNNN.parquet`` files; returns what was written.

    Rows are split into ``ceil(rows / rows_per_shard)`` shards of (nearly) equal size, in order.
    Dictionary encoding is used only for the named columns (titles, speakers repeat; texts and
    images are unique, where a dictionary only costs). zstd compresses text about 3x; the writer
    puts no timestamps in the file, so equal rows give equal bytes.
    """
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    rows = table.num_rows
    shards = max(1, math.ceil(rows / layout.rows_per_shard))
    files: list[ShardFile] = []
    for index in range(shards):
        start = index * rows // shards
        stop = (index + 1) * rows // shards
        part = table.slice(start, stop - start)
        path = folder / shard_name(index)
        pq.write_table(
            part,
            path,
            row_group_size=layout.rows_per_group,
            compression="zstd",
            use_dictionary=list(dictionary_columns),
            write_statistics=list(dictionary_columns),
        )
        files.append(
            ShardFile(
                path=f"{name}/{path.name}",
                rows=part.num_rows,
                row_groups=pq.ParquetFile(path).metadata.num_row_groups,
                bytes=path.stat().st_size,
            )
        )
    return files
