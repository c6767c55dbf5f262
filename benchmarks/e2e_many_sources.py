"""The ``sources306`` regime's sources: the ``vlm`` mix's five real sources cut into 306.

Why a module of its own: the reference design reports results on 5 and on 306 sources
(MegaScale-Data); the corpus here has five real sources, and lengths are never invented. So the
306 sources are the real rows of the five, cut into disjoint pieces, each piece a source of its
own with its own rows (:func:`many_sources`, called by :func:`benchmarks.e2e_sim.simulate` when
``Setup.pieces`` is set):

* **Pieces per source** (:func:`allocate`): in proportion to the source's rows (largest
  remainder, at least one piece each, never more pieces than rows), so every piece holds about
  as many real samples as any other. The e2e corpus's 190 caption, 384 interleaved, 18 book, 384
  code and 384 scene rows (1,360) give 43 / 87 / 4 / 86 / 86 pieces of 4 or 5 rows: books in 4
  pieces of 4-5 whole plays or poems, code in 86 runs of 4-5 stdlib modules.
* **Rows of a piece** (:func:`split_source`): contiguous ranges of the source's rows in shard
  order, of near-equal size (``numpy.array_split``); a range that crosses a shard boundary keeps
  one shard per part. Every row of the source lands in exactly one piece, with its real token and
  patch counts.
* **Weights** (:func:`zipf_weights`): each source's weight stays its total, so the mixture by
  kind is the parent regime's; within a source it is split with Zipf's law (exponent
  :data:`ZIPF`): the piece of rank ``r`` gets a share proportional to ``1 / r``, ranks a seeded
  permutation of the pieces (seed :data:`SEED` and the source's name, fixed for the regime, not
  drawn per run), so a few pieces are heavy and most are small, as in real mixes, and the heavy
  ones fall anywhere in the source's rows. The rows a step draws are therefore not the parent's
  uniform draw: the heavy pieces' rows come more often.
* **Loader CPU per sample**: the parent source's measured cost.

Pieces are named ``<source>.<k>`` (``books.002``), ``k`` counted from 0 in row order.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import numpy as np

from mdata.metadata import SourceMetadata

__all__ = ["SEED", "ZIPF", "allocate", "many_sources", "piece_name", "split_source", "zipf_weights"]

#: The seed of the ranks of every source's pieces (with the source's name): the regime's mix.
SEED = 306
#: Zipf's exponent of the weights of a source's pieces: piece of rank ``r`` gets ``r ** -ZIPF``.
ZIPF = 1.0


def piece_name(source: str, k: int) -> str:
    """The name of piece ``k`` of ``source``: ``books.002``."""
    return f"{source}.{k:03d}"


def allocate(rows: Mapping[str, int], n: int) -> dict[str, int]:
    """Pieces per source, ``n`` in all: in proportion to each source's rows (largest remainder,
    ties to the earlier source), at least one each and at most its rows."""
    names = list(rows)
    have = np.array([int(rows[k]) for k in names], dtype=np.int64)
    if not names or have.min() < 1:
        raise ValueError(f"every source needs at least one row, got {dict(rows)}")
    if not len(names) <= n <= int(have.sum()):
        raise ValueError(f"{n} pieces of {len(names)} sources of {int(have.sum())} rows: "
                         f"need one piece per source and one row per piece")
    quota = n * have / have.sum()
    out = np.clip(np.floor(quota).astype(np.int64), 1, have)
    while out.sum() < n:  # the largest remainder among those with rows to spare
        room = np.where(out < have, quota - out, -np.inf)
        out[int(np.argmax(room))] += 1
    while out.sum() > n:  # the minimum of one lifted a source: take back where most over quota
        over = np.where(out > 1, out - quota, -np.inf)
        out[int(np.argmax(over))] -= 1
    return dict(zip(names, out.tolist()))


def split_source(meta: SourceMetadata, pieces: int) -> list[SourceMetadata]:
    """``meta``'s rows cut into ``pieces`` contiguous ranges (shard order, near-equal sizes), each
    a source of its own (:func:`piece_name`); a range crossing a shard boundary keeps a shard per
    part. Skipped rows stay skipped in their piece."""
    bounds = np.concatenate([[0], np.cumsum(meta.shard_rows)])
    total = int(bounds[-1])
    if not 1 <= pieces <= total:
        raise ValueError(f"{meta.name!r} has {total} rows: cannot cut it into {pieces} pieces")
    out = []
    for k, rows in enumerate(np.array_split(np.arange(total), pieces)):
        lo, hi = int(rows[0]), int(rows[-1]) + 1
        toks, pats, bad = [], [], []
        for s in range(len(meta.num_tokens)):
            a, b = max(lo, int(bounds[s])) - int(bounds[s]), min(hi, int(bounds[s + 1])) - int(bounds[s])
            if a < b:
                toks.append(meta.num_tokens[s][a:b])
                pats.append(meta.num_patches[s][a:b])
                skip = None if meta.skipped is None else meta.skipped[s]
                bad.append(None if skip is None else skip[a:b])
        skipped = None if all(x is None for x in bad) else tuple(bad)
        out.append(SourceMetadata(piece_name(meta.name, k), tuple(toks), tuple(pats), skipped))
    return out


def zipf_weights(total: float, pieces: int, source: str, seed: int = SEED) -> np.ndarray:
    """``total`` split over ``pieces`` pieces by Zipf's law: rank ``r`` (1 the heaviest) gets a
    share ``r ** -ZIPF``; ranks are a permutation seeded by ``seed`` and ``source``'s name."""
    share = np.arange(1, pieces + 1, dtype=np.float64) ** -ZIPF
    rank = np.random.default_rng([seed, zlib.crc32(source.encode())]).permutation(pieces)
    return total * share[rank] / share.sum()


def many_sources(meta: Mapping[str, SourceMetadata], cost: Mapping[str, float],
                 weights: Mapping[str, float], n: int, seed: int = SEED
                 ) -> tuple[dict[str, SourceMetadata], dict[str, float], dict[str, float]]:
    """The sources of ``meta`` that ``weights`` names (weight > 0) cut into ``n`` pieces in all
    (module docstring): the pieces' metadata, loader CPU per sample (the parent's) and weights
    (each parent's total, Zipf within), in the parents' order, then each parent's row order."""
    kinds = [k for k in meta if weights.get(k, 0.0) > 0]
    counts = allocate({k: int(meta[k].shard_rows.sum()) for k in kinds}, n)
    out_meta: dict[str, SourceMetadata] = {}
    out_cost: dict[str, float] = {}
    out_w: dict[str, float] = {}
    for k in kinds:
        parts = split_source(meta[k], counts[k])
        for piece, w in zip(parts, zipf_weights(float(weights[k]), len(parts), k, seed)):
            out_meta[piece.name], out_cost[piece.name], out_w[piece.name] = piece, float(cost[k]), float(w)
    return out_meta, out_cost, out_w
