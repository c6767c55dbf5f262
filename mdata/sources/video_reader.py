"""Clip files as shards: one ``.mp4`` / ``.webm`` / ``.mkv`` file is one shard of one row.

Video corpora are often folders of clip files next to their captions rather than Parquet
columns. A ``format="video"`` source lists them by URL or glob through fsspec like any other
format; each file is a shard with exactly one row (listing opens no file, so a million clips
list at the speed of the store's listing). Reading the row gives each ``BYTES`` field the clip's
bytes and each ``TEXT`` field the caption in the sidecar file beside it (same name, ``.txt``;
an empty string when there is none). Other fields read as None.
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any

from mdata.errors import RowTooLargeError
from mdata.sources.faults import is_transient
from mdata.sources.fields import FieldKind
from mdata.sources.shard_reader import ShardReader
from mdata.sources.spec import Format

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

__all__ = ["VideoFileReader", "caption_path"]


def caption_path(path: str) -> str:
    """The sidecar caption of a clip: ``a/b/clip.mp4`` -> ``a/b/clip.txt``."""
    return posixpath.splitext(path)[0] + ".txt"


class VideoFileReader(ShardReader):
    """One clip file, one row: the clip's bytes and its sidecar caption."""

    format = Format.VIDEO

    @classmethod
    def count_rows(cls, fs: "AbstractFileSystem", path: str, *, source: str, url: str) -> int:
        return 1

    def _open(self) -> None:
        self._file = self._open_file()

    def _read(self, start: int, stop: int) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {name: [] for name in self.kinds}
        if stop <= start:
            return out
        try:
            size = self._file.size if hasattr(self._file, "size") else None
            if size is not None and size > self.limits.max_cell_bytes:
                raise RowTooLargeError(
                    f"clip file is {size} bytes, over mdata.sources.max-cell-bytes={self.limits.max_cell_bytes}",
                    source=self.source.name, shard=self.shard.path, row=0,
                    hint="cut the clip, or raise mdata.sources.max-cell-bytes on the loaders")
            self._file.seek(0)
            data = self._file.read()
            self.units_read += 1
            caption = None
            if any(kind is FieldKind.TEXT for kind in self.kinds.values()):
                sidecar = caption_path(self.path)
                caption = (self.fs.cat_file(sidecar).decode("utf-8", "replace")
                           if self.fs.exists(sidecar) else "")
        except RowTooLargeError:
            raise
        except Exception as exc:
            self.close()
            if is_transient(exc):
                raise
            raise self._failure("cannot read the clip file", exc, action="reading the clip file",
                                row=0, parsing=False) from exc
        for name, kind in self.kinds.items():
            value = data if kind is FieldKind.BYTES else caption.strip() if kind is FieldKind.TEXT else None
            out[name].append(value)
        return self._check_cells(out, start)
