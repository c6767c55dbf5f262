"""The end-to-end benchmark's workload: a vision-language pre-training mix over the example corpus.

Sources (every one real material, see ``mdata.data.example``):

* ``captions``: the corpus's captioned photo crops (one image per sample), decoded at native size
  (no patch budget: a 227 x 227 crop gives 256 patches of 14 px);
* ``interleaved``: interleaved image-text documents built here once into
  ``.cache/mdata/bench-e2e``: each scene or passage of the corpus's ``scenes`` source with ``k``
  whole photographs of the material (the originals, 0.07 to 2 megapixels, re-encoded as JPEG
  quality 90 at native size), ``k`` drawn from a Poisson law of mean 2.5 cut at 6: OBELICS
  (Laurencon et al., 2023) holds 353M images in 141M documents, 2.5 per document;
* ``books`` (long text, whole plays and poems past the context), ``code`` (Python's standard
  library) and ``scenes`` (medium text);
* ``videos`` (the ``video`` regime only, :func:`e2e_video_source`): the corpus's captioned clips
  (H.264 and VP9 pans and zooms over its photographs), decoded for real with PyAV by
  :class:`~mdata.sources.video_transform.DecodeVideoCaption`: 8 frames of a 1 s window, each
  resized to SigLIP-384's 378 x 378 (27 x 27 patches of 14 px, one encoder tile per frame), so
  a clip is 5,832 patches plus its caption's tokens. Its metadata is cached in a file of its own
  (``profile-videos-v<VIDEO_VERSION>.npz``), so adding it leaves the five-source cache valid.

Weights, by samples, follow MM1's pre-training mix (McKinney et al., 2024, section 3.3):
captions : interleaved : text-only = 5 : 5 : 1, the text share split evenly over books, code and
scenes. :class:`DecodeInterleaved` decodes every image of a document at native size and hands
the trainer its patches as one strip (``sum(patches) * 14`` rows of 14 px), the layout a vision
encoder consumes; ``num_patches`` is the document's patch count.
"""

from __future__ import annotations

import io
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.workload import CACHE, TOKENIZER, corpus_dir
from mdata.data.example import example_sources
from mdata.metadata import SourceMetadata
from mdata.sources import ReaderCache, Source, load_chunk
from mdata.sources.fields import FieldKind
from mdata.sources.images import ImageProblem, decode_image
from mdata.sources.transforms import (ChunkContext, SampleOutput, SampleTransform,
                                      _encode_isolating, _finish_tokens, _texts, _Tokenizing)

__all__ = ["DecodeInterleaved", "E2E_DIR", "VIDEO_FRAME", "WEIGHTS", "e2e_metadata", "e2e_sources",
           "e2e_video_source", "loader_cost_per_sample", "with_videos"]

E2E_DIR = CACHE / "bench-e2e"
PATCH = 14
#: Samples by weight: captions : interleaved : text = 5 : 5 : 1 (MM1), text split evenly.
WEIGHTS = {"captions": 5.0, "interleaved": 5.0, "books": 1 / 3, "code": 1 / 3, "scenes": 1 / 3}
NATIVE = 1 << 16  # a patch budget no photo of the corpus reaches: images keep their native size
MEAN_IMAGES, MAX_IMAGES = 2.5, 6
VERSION = 1
#: The video source's frames: SigLIP-384's input (27 x 27 patches of 14 px), as LLaVA-OneVision
#: encodes each video frame; bump VIDEO_VERSION when the clip sampling changes.
VIDEO_FRAME = (27 * PATCH, 27 * PATCH)
VIDEO_VERSION = 1


@dataclass(frozen=True)
class DecodeInterleaved(_Tokenizing, SampleTransform):
    """An interleaved image-text document: tokenize its text, decode each of its images.

    Images are decoded at native size (sides floored to whole patches) and cut into
    ``patch_size`` squares; the sample's image is the strip of all its patches, in order.
    """

    produces_images: ClassVar[bool] = True

    images_field: str = "images"
    text_field: str = "text"
    patch_size: int = PATCH
    max_pixels: int = 64_000_000
    tokenizer: str = TOKENIZER
    append_eos: bool = True
    eos_token: str | None = None
    num_threads: int = 1

    def required_fields(self) -> Mapping[str, FieldKind]:
        return {self.images_field: FieldKind.ANY, self.text_field: FieldKind.TEXT}

    def _strip(self, images: Sequence[bytes]) -> np.ndarray:
        p = self.patch_size
        strips = []
        for data in images:
            rgb = decode_image(data, patch_size=p, max_patches=NATIVE, max_pixels=self.max_pixels)
            h, w = rgb.shape[0] // p, rgb.shape[1] // p
            strips.append(rgb.reshape(h, p, w, p, 3).swapaxes(1, 2).reshape(h * w * p, p, 3))
        return np.concatenate(strips) if strips else np.zeros((0, p, 3), np.uint8)

    def __call__(self, columns: Mapping[str, Sequence[Any]], *, context: ChunkContext,
                 **kwargs: Any) -> list:
        tok = self._tokenizer()
        texts, positions, errors = _texts(columns[self.text_field], self.text_field, context)
        out: list = [None] * len(context.rows)
        for i, err in errors.items():
            out[i] = err
        for i, ids in zip(positions, _encode_isolating(tok, texts, context, positions)):
            if not isinstance(ids, list):
                out[i] = ids
                continue
            try:
                strip = self._strip(columns[self.images_field][i] or ())
            except ImageProblem as exc:
                out[i] = context.sample_error(i, str(exc), hint=exc.hint)
                continue
            tokens = _finish_tokens(ids, tok.eos_id, self.append_eos, None)
            patches = strip.shape[0] // self.patch_size
            out[i] = SampleOutput(tokens, strip, patches)  # an empty strip: no images
        return out


def _photos() -> list[bytes]:
    """The material's photographs, each re-encoded once as a native-size JPEG (quality 90)."""
    from mdata.data.crops import decode_rgb
    from mdata.data.material import locate_material

    out = []
    for photo in locate_material(None).images():
        buf = io.BytesIO()
        decode_rgb(photo.data).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def _build_interleaved(corpus: Path, dest: Path) -> None:
    """Scenes of the corpus with 0..6 native-size photos each, one shard per scenes shard."""
    if (dest / f"complete-v{VERSION}").exists():
        return
    dest.mkdir(parents=True, exist_ok=True)
    photos = _photos()
    rng = np.random.default_rng(2024)
    for k, path in enumerate(sorted((corpus / "scenes").glob("part-*.parquet"))):
        texts = pq.read_table(path, columns=["text"]).column("text").to_pylist()
        counts = np.minimum(rng.poisson(MEAN_IMAGES, size=len(texts)), MAX_IMAGES)
        images = [[photos[j] for j in rng.integers(len(photos), size=int(c))] for c in counts]
        table = pa.table({"text": pa.array(texts, pa.string()),
                          "images": pa.array(images, pa.list_(pa.binary()))})
        pq.write_table(table, dest / f"part-{k:05d}.parquet", row_group_size=32)
    (dest / f"complete-v{VERSION}").write_text("ok\n")


def e2e_sources(corpus: Path | None = None) -> list[Source]:
    """The five sources of the mix, in a fixed order (see the module docstring)."""
    corpus = corpus_dir(corpus)
    _build_interleaved(corpus, E2E_DIR / "interleaved")
    by_name = {s.name: s for s in example_sources(corpus, tokenizer=TOKENIZER)}
    captions = by_name["captions"]
    captions = replace(captions, chunk_rows=64, transform=replace(
        captions.transform, patch_size=PATCH, max_patches=NATIVE))
    interleaved = Source("interleaved", str(E2E_DIR / "interleaved" / "part-*.parquet"),
                         fields=("text", "images"), transform=DecodeInterleaved(), chunk_rows=16)
    text = [replace(by_name[n], chunk_rows=r) for n, r in (("books", 2), ("code", 32), ("scenes", 32))]
    return [captions, interleaved, *text]


def e2e_video_source(corpus: Path | None = None) -> Source:
    """The corpus's ``videos`` source as the ``video`` regime reads it (module docstring): the
    example's frame sampling (8 frames of a 1 s window), frames at :data:`VIDEO_FRAME`."""
    corpus = corpus_dir(corpus)
    by_name = {s.name: s for s in example_sources(corpus, tokenizer=TOKENIZER)}
    if "videos" not in by_name:
        raise RuntimeError(f"the example corpus at {corpus} has no videos source: it is built only "
                           "when PyAV (the `video` extra) is installed; install it and delete the "
                           "corpus folder to rebuild it")
    videos = by_name["videos"]
    return replace(videos, chunk_rows=4, transform=replace(videos.transform, patch_size=PATCH,
                                                            frame_size=VIDEO_FRAME))


def _profile_path(name: str) -> Path:
    """The cache file of one source's metadata: the video source's apart from the five others."""
    if name == "videos":
        return E2E_DIR / f"profile-videos-v{VIDEO_VERSION}.npz"
    return E2E_DIR / f"profile-v{VERSION}.npz"


def e2e_metadata(sources: Sequence[Source]) -> dict[str, SourceMetadata]:
    """Every row's token and patch counts, from the real transforms (cached per build: the
    five-source mix in one file, the video source in its own), in the order of ``sources``."""
    groups: dict[Path, list[Source]] = {}
    for src in sources:
        groups.setdefault(_profile_path(src.name), []).append(src)
    found: dict[str, SourceMetadata] = {}
    for path, group in groups.items():
        found.update(_metadata(group, path))
    return {s.name: found[s.name] for s in sources}


def _metadata(sources: Sequence[Source], path: Path) -> dict[str, SourceMetadata]:
    if path.exists():
        with np.load(path) as z:
            return {s.name: SourceMetadata(s.name, tuple(z[f"{s.name}/tok/{k}"] for k in range(int(z[f"{s.name}/n"]))),
                                           tuple(z[f"{s.name}/pat/{k}"] for k in range(int(z[f"{s.name}/n"]))))
                    for s in sources}
    cache, arrays, out = ReaderCache(), {}, {}
    for src in sources:
        toks, pats = [], []
        for shard in cache.listing(src).shards:
            tok = np.zeros(shard.num_rows, np.int32)
            pat = np.zeros(shard.num_rows, np.int32)
            for start in range(0, shard.num_rows, src.chunk_rows):
                chunk = load_chunk(src, shard.index, start, min(shard.num_rows, start + src.chunk_rows),
                                   cache=cache)
                tok[chunk.rows], pat[chunk.rows] = chunk.num_tokens, chunk.num_patches
            toks.append(tok)
            pats.append(pat)
        arrays[f"{src.name}/n"] = np.array(len(toks))
        for k, (t, p) in enumerate(zip(toks, pats)):
            arrays[f"{src.name}/tok/{k}"], arrays[f"{src.name}/pat/{k}"] = t, p
        out[src.name] = SourceMetadata(src.name, tuple(toks), tuple(pats))
    cache.clear()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)
    return out


def loader_cost_per_sample(sources: Sequence[Source], chunks: int = 2) -> dict[str, float]:
    """CPU seconds one core spends per sample of each source in ``load_chunk`` (read, decode,
    tokenize), measured here on the first ``chunks`` chunks of every shard's start, after a
    warm-up load (tokenizer and reader opened)."""
    cache = ReaderCache()
    out = {}
    for src in sources:
        listing = cache.listing(src)
        load_chunk(src, 0, 0, min(listing.shards[0].num_rows, src.chunk_rows), cache=cache)
        cpu = rows = 0
        for shard in listing.shards[:chunks]:
            stop = min(shard.num_rows, src.chunk_rows)
            began = time.process_time()
            chunk = load_chunk(src, shard.index, 0, stop, cache=cache)
            cpu += time.process_time() - began
            rows += len(chunk.rows)
        out[src.name] = cpu / max(1, rows)
    cache.clear()
    return out


def with_videos(meta: Mapping[str, SourceMetadata], cost: Mapping[str, float],
                quick: bool) -> tuple[dict[str, SourceMetadata], dict[str, float], dict[str, object]]:
    """``meta`` and ``cost`` with the video source added when they lack it (the five sources of
    :func:`e2e_sources` do): its rows' counts from the real decode (cached, :func:`e2e_metadata`)
    and its CPU per clip measured here (:func:`loader_cost_per_sample`, as for the others); the
    third value holds ``e2e.loader_cpu_ms_per_sample.videos`` when it was measured here."""
    from benchmarks.harness import figure

    meta, cost = dict(meta), dict(cost)
    if "videos" in meta and "videos" in cost:
        return meta, cost, {}
    src = e2e_video_source()
    meta.update(e2e_metadata([src]))
    cost.update(loader_cost_per_sample([src], chunks=1 if quick else 3))
    clip, t = np.concatenate(meta["videos"].num_patches), src.transform
    note = (f"CPU per clip on one core in load_chunk: read, PyAV decode of {t.num_frames} frames of "
            f"a {t.clip_seconds:g} s window, resize to {t.frame_size[0]}x{t.frame_size[1]}, caption "
            f"tokenized; {int(clip.min())}-{int(clip.max())} patches per clip; the small corpus's clips "
            "are 160x120 to 320x240, 1.5 s")
    return meta, cost, {"e2e.loader_cpu_ms_per_sample.videos": figure(1e3 * cost["videos"], unit="ms", note=note)}
