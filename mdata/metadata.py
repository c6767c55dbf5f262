"""Per-sample cost features of a source without its payload, for ``mdata.planner.simulate``.

Balancing needs only each sample's token and patch counts, so a source can be explored in a
notebook from its metadata alone: a few bytes per sample instead of the text and images. Metadata
comes from real loaded chunks (:meth:`SourceMetadata.from_chunks`) or from arrays (a profile of
the corpus, or generated length distributions for what-if studies).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from mdata.errors import PlanError

__all__ = ["SourceMetadata", "read_metadata"]


@dataclass(frozen=True, eq=False)
class SourceMetadata:
    """Token and patch counts of every row of one source, per shard.

    ``num_tokens[k]`` and ``num_patches[k]`` are int32 arrays with one entry per row of shard
    ``k``; rows a loader would skip can be marked in ``skipped[k]`` (a bool array, or None).
    """

    name: str
    num_tokens: tuple[np.ndarray, ...]
    num_patches: tuple[np.ndarray, ...]
    skipped: tuple[np.ndarray | None, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.num_tokens) != len(self.num_patches):
            raise PlanError(
                f"metadata of source {self.name!r}: {len(self.num_tokens)} shards of token counts "
                f"but {len(self.num_patches)} of patch counts"
            )
        for k, (tok, pat) in enumerate(zip(self.num_tokens, self.num_patches)):
            if tok.shape != pat.shape:
                raise PlanError(
                    f"metadata of source {self.name!r}, shard {k}: {tok.size} token counts but "
                    f"{pat.size} patch counts"
                )
            if tok.size and (tok.min() < 0 or pat.min() < 0):
                raise PlanError(
                    f"metadata of source {self.name!r}, shard {k}: negative token or patch counts"
                )

    @property
    def shard_rows(self) -> np.ndarray:
        """Rows per shard (int64): the listing the order is built from."""
        return np.array([t.size for t in self.num_tokens], dtype=np.int64)

    def rows_of(self, shard: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """What loading rows ``[start, stop)`` of ``shard`` reports: kept rows, tokens, patches, skipped rows."""
        rows = np.arange(start, stop, dtype=np.int64)
        tokens = self.num_tokens[shard][start:stop]
        patches = self.num_patches[shard][start:stop]
        bad = None if self.skipped is None else self.skipped[shard]
        if bad is None or not bad[start:stop].any():
            return rows, tokens, patches, np.zeros(0, dtype=np.int64)
        keep = ~bad[start:stop]
        return rows[keep], tokens[keep], patches[keep], rows[~keep]

    @classmethod
    def from_arrays(
        cls,
        name: str,
        num_tokens: Sequence[Sequence[int] | np.ndarray],
        num_patches: Sequence[Sequence[int] | np.ndarray] | None = None,
        skipped: Sequence[Sequence[bool] | np.ndarray | None] | None = None,
    ) -> "SourceMetadata":
        """Build from per-shard arrays of token (and optionally patch) counts."""
        tokens = tuple(np.asarray(t, dtype=np.int32).reshape(-1) for t in num_tokens)
        if num_patches is None:
            patches = tuple(np.zeros_like(t) for t in tokens)
        else:
            patches = tuple(np.asarray(p, dtype=np.int32).reshape(-1) for p in num_patches)
        bad = None
        if skipped is not None:
            bad = tuple(None if s is None else np.asarray(s, dtype=bool).reshape(-1) for s in skipped)
        return cls(name, tokens, patches, bad)

    @classmethod
    def from_chunks(cls, chunks: Iterable, shard_rows: Sequence[int] | None = None) -> "SourceMetadata":
        """Build from loaded :class:`~mdata.sources.chunk.SampleChunk` objects of one source.

        Rows the chunks do not cover count as skipped (so a simulation passes over them like the
        Planner would). ``shard_rows`` gives the row count of each shard when the chunks do not
        reach the end of every shard.
        """
        chunks = list(chunks)
        if not chunks:
            raise PlanError("SourceMetadata.from_chunks needs at least one chunk")
        names = {c.source for c in chunks}
        if len(names) != 1:
            raise PlanError(f"SourceMetadata.from_chunks: chunks of several sources {sorted(names)}")
        n_shards = max(c.shard for c in chunks) + 1
        rows_per_shard = [0] * n_shards
        for c in chunks:
            top = max([int(c.rows.max()) + 1 if len(c.rows) else 0]
                      + [s.row + 1 for s in c.skipped])
            rows_per_shard[c.shard] = max(rows_per_shard[c.shard], top)
        if shard_rows is not None:
            if len(shard_rows) < n_shards:
                raise PlanError(
                    f"SourceMetadata.from_chunks: chunks reach shard {n_shards - 1} but shard_rows "
                    f"lists {len(shard_rows)} shards"
                )
            rows_per_shard = [int(r) for r in shard_rows]
        tokens = [np.zeros(r, dtype=np.int32) for r in rows_per_shard]
        patches = [np.zeros(r, dtype=np.int32) for r in rows_per_shard]
        covered = [np.zeros(r, dtype=bool) for r in rows_per_shard]
        for c in chunks:
            tokens[c.shard][c.rows] = c.num_tokens
            patches[c.shard][c.rows] = c.num_patches
            covered[c.shard][c.rows] = True
        skipped = [None if cov.all() else ~cov for cov in covered]
        return cls(names.pop(), tuple(tokens), tuple(patches),
                   None if all(s is None for s in skipped) else tuple(skipped))


def read_metadata(sources: Iterable, *, max_rows_per_shard: int | None = None) -> dict[str, "SourceMetadata"]:
    """Per-sample cost features of real sources, read the way a loader does: every chunk of every
    shard goes through :func:`~mdata.sources.load_chunk` (read, transform), and only the token and
    patch counts are kept. A transform with ``cost_features`` (video: frames from the container's
    header) gives its counts without decoding pixels. ``max_rows_per_shard`` reads only the first
    rows of each shard (a quicker, approximate profile: the simulation then sees shards of that
    size)."""
    from mdata.sources import list_shards, load_chunk

    if max_rows_per_shard is not None and max_rows_per_shard < 1:
        raise PlanError(f"max_rows_per_shard must be >= 1 or None, got {max_rows_per_shard!r}")
    out: dict[str, SourceMetadata] = {}
    for src in sources:
        listing = list_shards(src)
        rows = [shard.num_rows if max_rows_per_shard is None else min(shard.num_rows, max_rows_per_shard)
                for shard in listing.shards]
        load = _features_only if hasattr(src.transform, "cost_features") else load_chunk
        chunks = [
            load(src, shard.index, start, min(start + src.chunk_rows, n))
            for shard, n in zip(listing.shards, rows)
            for start in range(0, n, src.chunk_rows)
        ]
        if not chunks:
            raise PlanError(f"source {src.name!r} has no rows to profile")
        out[src.name] = SourceMetadata.from_chunks(chunks, shard_rows=rows)
    return out


def _features_only(source, shard: int, start: int, stop: int):
    """A pixel-less :class:`~mdata.sources.SampleChunk` with the rows' token and patch counts,
    from :func:`~mdata.sources.video_meta.load_cost_features` (skips as a load would report)."""
    from mdata.sources import default_reader_cache
    from mdata.sources.chunk import SampleChunk, SkippedSample
    from mdata.sources.load import _enforce_tolerance
    from mdata.sources.video_meta import load_cost_features

    rows, tokens, patches, errors = load_cost_features(source, shard, start, stop)
    _enforce_tolerance(source, default_reader_cache().listing(source).shard(shard).path, stop - start, errors)
    text = [np.zeros(int(t - p), np.int32) for t, p in zip(tokens, patches)]
    return SampleChunk.from_samples(
        source.name, shard, rows, text, num_patches=patches,
        skipped=[SkippedSample(int(e.row), f"{type(e).__name__}: {e.message}") for e in errors])
