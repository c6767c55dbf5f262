"""A text + video plan on a live embedded cluster: batches carry the clips' frames as image
patches, and a video loader killed with SIGKILL mid-run costs no sample and changes no frame
(clip windows come from each sample's seed, so a recomputed chunk decodes the same frames).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av")

from conftest import run_loaders  # noqa: E402
from fault_procs import kill9, loader_holding_chunks, recoveries  # noqa: E402
from mdata.data.example import VIDEO_FRAME_SIZE, VIDEO_FRAMES  # noqa: E402
from mdata.driver import submit_job  # noqa: E402
from mdata.trainer import Loader  # noqa: E402
from test_failures import plan_for  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

STEPS = 6
IMAGE_TOKEN = 100_277
PATCHES = VIDEO_FRAMES * (VIDEO_FRAME_SIZE[0] // 16) * (VIDEO_FRAME_SIZE[1] // 16)


def received(batch) -> tuple:
    """Step, sample ids, and a hash of every token id and every pixel the trainer got."""
    digest = hashlib.sha1()
    for mb in batch["micro_batches"]:
        digest.update(mb["input_ids"].numpy().tobytes())
        if "pixels" in mb:
            digest.update(mb["pixels"].numpy().tobytes())
    return batch["step"], batch["sample_ids"].tolist(), digest.hexdigest()


@pytest.fixture(scope="module")
def video_cluster(example_sources_with_video):
    from mdata.driver import PoolSpec, start_cluster

    by_name = {s.name: s for s in example_sources_with_video}
    # Chunks of 2 clips: several chunks per shard, so a loader holds some when it is killed.
    sources = [by_name["chat"], dataclasses.replace(by_name["videos"], chunk_rows=2)]
    pools = [PoolSpec("text", ("chat",), workers=1, threads=1),
             PoolSpec("video", ("videos",), workers=1, threads=2)]
    with start_cluster(sources, pools=pools, constructors=1, constructor_threads=1,
                       autoscale=False) as cluster:
        with cluster.client() as client:
            yield client, sources


def close(client, job: str) -> None:
    client.sync(client.scheduler.mdata_close_job, job=job, client=client.id)


def uninterrupted(client, plan, job: str) -> dict[int, list]:
    """What each rank of a run of ``plan`` that nothing interrupts receives over STEPS steps."""
    submit_job(client, plan, job=job)
    received_by_rank = run_loaders(client, job=job, world_size=2, steps=STEPS, keep=received)
    close(client, job)
    return received_by_rank


def test_a_text_and_video_plan_delivers_frames_as_image_patches(video_cluster):
    client, sources = video_cluster
    submit_job(client, plan_for(sources), job="video-mix")
    batches = run_loaders(client, job="video-mix", world_size=2, steps=3, keep=lambda b: b)
    videos = 0
    for rank in range(2):
        for batch in batches[rank]:
            assert {int(s) for s in batch["sample_ids"][:, 0]} <= {0, 1}
            for mb in batch["micro_batches"]:
                counts = mb["image_token_counts"].numpy()
                shapes = mb["image_shapes"].numpy()
                assert (counts == PATCHES).all()  # every video sample keeps all its frames' patches
                assert shapes.tolist() == [[VIDEO_FRAMES * VIDEO_FRAME_SIZE[0], VIDEO_FRAME_SIZE[1], 3]] * len(counts)
                assert mb["pixels"].numel() == int(np.prod(shapes, axis=1).sum())
                assert int((mb["input_ids"].numpy() == IMAGE_TOKEN).sum()) == int(counts.sum())
                videos += len(counts)
    assert videos > 0
    close(client, "video-mix")


def test_a_video_loader_killed_mid_run_changes_no_sample_and_no_frame(video_cluster):
    client, sources = video_cluster
    plan = plan_for(sources)
    reference = uninterrupted(client, plan, "video-reference")

    submit_job(client, plan, job="video-crash")
    got: dict[int, list] = {0: [], 1: []}
    with Loader(client, job="video-crash", rank=0, world_size=2, timeout=90) as l0, \
         Loader(client, job="video-crash", rank=1, world_size=2, timeout=90) as l1:
        it0, it1 = iter(l0), iter(l1)
        for step in range(STEPS):
            if step == 2:  # mid-run, while the loader holds decoded clips upcoming steps need
                _, pid, held = loader_holding_chunks(client, "pool_videos", job="video-crash")
                assert held > 0
                kill9(pid)
            got[0].append(received(next(it0)))
            got[1].append(received(next(it1)))
        l0.mark_consumed()
        l1.mark_consumed()
    assert got == {r: reference[r] for r in range(2)}
    assert recoveries(client, "video-crash")["chunks_reloaded"] >= 1
    close(client, "video-crash")


def test_an_undecodable_clip_under_on_corrupt_skip_is_quarantined_and_the_job_goes_on(
        video_cluster, tmp_path):
    """The videos source with shard 1's first clip cut in half (an MP4 without its index): with
    on_corrupt="skip" the chunk holding it is quarantined, status says where and why, and no
    trainer ever receives a row of that chunk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    client, (chat, videos) = video_cluster
    folder = tmp_path / "videos"
    folder.mkdir()
    shards = sorted(Path(videos.url).parent.glob("*.parquet"))
    for i, path in enumerate(shards):
        table = pq.read_table(path)
        if i == 1:
            clips = table.column("video").to_pylist()
            k = table.column("codec").to_pylist().index("h264")
            clips[k] = clips[k][: len(clips[k]) // 2]
            table = table.set_column(table.schema.get_field_index("video"), "video",
                                     pa.array(clips, pa.binary()))
            broken_row = k
        pq.write_table(table, folder / path.name)
    broken = dataclasses.replace(videos, url=str(folder / "*.parquet"), on_corrupt="skip")
    submit_job(client, plan_for([chat, broken]), job="video-skip")
    got = run_loaders(client, job="video-skip", world_size=2, steps=4, keep=received)
    status = client.sync(client.scheduler.mdata_status, job="video-skip")
    assert status["failure"] is None
    (quarantined,) = status["quarantined"]["videos"]
    assert quarantined["shard"] == 1 and Path(quarantined["path"]).name == shards[1].name
    lost = range(*quarantined["rows"])
    assert broken_row in lost
    assert quarantined["reason"].startswith(f"VideoDecodeError (row {broken_row}): cannot open the clip's container")
    delivered = {tuple(s) for rank in got.values() for _, ids, _ in rank for s in ids}
    assert not any((1, 1, r) in delivered for r in lost)
    assert any(s[0] == 1 for s in delivered)  # the other clips still arrive
    close(client, "video-skip")


def test_a_text_and_video_job_resumed_from_its_trainers_checkpoint_gets_the_same_frames(video_cluster):
    """Stop after 3 steps, restore the ranks' state_dict as a new job: every later sample, token
    and pixel equals the uninterrupted run's (clip windows are drawn from the samples' seeds, not
    from any state a restart loses)."""
    client, sources = video_cluster
    plan = plan_for(sources)
    whole = uninterrupted(client, plan, "video-whole")
    submit_job(client, plan, job="video-first")
    states: dict[int, dict] = {}
    first = run_loaders(client, job="video-first", world_size=2, steps=3, keep=received, states=states)
    close(client, "video-first")
    assert first == {r: whole[r][:3] for r in range(2)} and states[0]["next_step"] == 3
    resumed = run_loaders(client, job="video-resumed", plan=plan, world_size=2, steps=STEPS - 3,
                          keep=received, checkpoints=states)
    assert resumed == {r: whole[r][3:] for r in range(2)}
    assert any(any(s == 1 for s, *_ in ids) for r in range(2) for _, ids, _ in resumed[r])  # videos
    close(client, "video-resumed")
