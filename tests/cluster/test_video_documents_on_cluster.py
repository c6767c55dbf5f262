"""Interleaved video documents on a live embedded cluster: the example corpus's ``video_docs``
(scene openings with 0 to 3 real H.264/VP9 clips in place) mixed with text, decoded by PyAV in
its loader pool. What the trainers receive is checked against the documents themselves: each
clip's placeholders where its marker is, each clip as an image of its own with its frames, and
a job resumed from its trainers' checkpoint receives exactly the uninterrupted run's tokens and
pixels (each clip's window comes from the sample's seed and the clip's index).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

pytest.importorskip("av")

from conftest import run_loaders  # noqa: E402
from mdata.data.example import VIDEO_FRAME_SIZE, VIDEO_FRAMES  # noqa: E402
from mdata.driver import submit_job  # noqa: E402
from mdata.sources import ReaderCache, load_chunk  # noqa: E402
from test_failures import plan_for  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

IMAGE_TOKEN = 100_277
STEPS = 4
CLIP_PATCHES = VIDEO_FRAMES * (VIDEO_FRAME_SIZE[0] // 16) * (VIDEO_FRAME_SIZE[1] // 16)


@pytest.fixture(scope="module")
def docs_cluster(example_corpus):
    from mdata.data.example import example_sources
    from mdata.driver import PoolSpec, start_cluster

    by_name = {s.name: s for s in example_sources(example_corpus, documents=True)}
    sources = [by_name["chat"], by_name["video_docs"]]
    pools = [PoolSpec("text", ("chat",), workers=1, threads=1),
             PoolSpec("docs", ("video_docs",), workers=1, threads=2)]
    with start_cluster(sources, pools=pools, constructors=1, constructor_threads=1,
                       autoscale=False) as cluster:
        with cluster.client() as client:
            yield client, sources


def close(client, job: str) -> None:
    client.sync(client.scheduler.mdata_close_job, job=job, client=client.id)


def numpy_batch(batch) -> dict:
    """What a trainer received, as numpy: per micro-batch its fields and sample ids."""
    return {"step": batch["step"], "micro_batches": [
        {k: v.numpy() for k, v in mb.items() if hasattr(v, "numpy")} for mb in batch["micro_batches"]]}


def digest(batch: dict) -> tuple:
    h = hashlib.sha1()
    for mb in batch["micro_batches"]:
        for name in ("input_ids", "labels", "pixels", "image_token_counts", "sample_ids"):
            if name in mb:
                h.update(mb[name].tobytes())
    return batch["step"], h.hexdigest()


def expected_document(source, shard: int, row: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """A document's tokens with each clip's placeholders at its marker, and each clip's frames,
    from the document's own row read here in the test process (PyAV decodes it again)."""
    chunk = load_chunk(source, shard, row, row + 1, cache=ReaderCache())
    text, spans, image = chunk.tokens(0), chunk.media_spans(0), chunk.image(0)
    tokens, clips, last, first = [], [], 0, 0
    for at, patches, rows in spans.tolist():
        tokens += text[last:at].tolist() + [IMAGE_TOKEN] * patches
        clips.append(image[first:first + rows])
        last, first = at, first + rows
    return np.array(tokens + text[last:].tolist()), clips


def test_trainers_receive_each_clip_in_place_with_its_own_frames_and_a_resume_gets_the_same(docs_cluster):
    client, sources = docs_cluster
    docs = sources[1]
    plan = plan_for(sources, global_batch=8)
    submit_job(client, plan, job="docs-whole")
    whole = run_loaders(client, job="docs-whole", world_size=2, steps=STEPS, keep=numpy_batch, timeout=120)
    close(client, "docs-whole")

    clip_counts = []
    for rank in range(2):
        for batch in whole[rank]:
            for mb in batch["micro_batches"]:
                cu, ids = mb["cu_seqlens"], mb["sample_ids"]
                pixels = mb.get("pixels", np.zeros(0, np.uint8))  # absent: no image sample in the batch
                shapes = mb.get("image_shapes", np.zeros((0, 3), np.int32))
                counts = mb.get("image_token_counts", np.zeros(0, np.int32))
                offsets = np.concatenate([[0], np.cumsum(np.prod(shapes, axis=1))])
                k = 0  # the micro-batch's images, in document order
                for d, (source_index, shard, row) in enumerate(ids.tolist()):
                    got = mb["input_ids"][cu[d]:cu[d + 1]]
                    if source_index == 0:
                        assert not (got == IMAGE_TOKEN).any()
                        continue
                    tokens, clips = expected_document(docs, shard, row)
                    assert got.tolist() == tokens.tolist(), f"video_docs/{shard}/{row}"
                    for clip in clips:
                        assert counts[k] == CLIP_PATCHES and shapes[k].tolist() == list(clip.shape)
                        assert np.array_equal(pixels[offsets[k]:offsets[k + 1]], clip.reshape(-1))
                        k += 1
                    clip_counts.append(len(clips))
                assert k == len(counts)
    assert len(set(clip_counts)) >= 3 and max(clip_counts) >= 2  # documents of several clip counts

    first = {}
    run_loaders(client, job="docs-first", plan=plan, world_size=2, steps=2, keep=numpy_batch, states=first,
                timeout=120)
    close(client, "docs-first")
    resumed = run_loaders(client, job="docs-resumed", plan=plan, world_size=2, steps=STEPS - 2,
                          keep=numpy_batch, checkpoints=first, timeout=120)
    close(client, "docs-resumed")
    assert {r: [digest(b) for b in resumed[r]] for r in range(2)} == \
        {r: [digest(b) for b in whole[r][2:]] for r in range(2)}


def test_a_document_with_an_undecodable_clip_under_on_corrupt_skip_is_quarantined_naming_the_clip(
        docs_cluster, tmp_path):
    """video_docs with the second clip of one document of shard 1 cut short: under
    on_corrupt="skip" its chunk is quarantined, status names the row and the clip, and the job
    goes on without a row of that chunk."""
    import dataclasses
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    client, (chat, docs) = docs_cluster
    folder = tmp_path / "video_docs"
    folder.mkdir()
    shards = sorted(Path(docs.url).parent.glob("*.parquet"))
    for i, path in enumerate(shards):
        table = pq.read_table(path)
        if i == 1:
            videos = table.column("videos").to_pylist()
            broken_row = next(r for r, v in enumerate(videos) if len(v) >= 2)
            videos[broken_row][1] = videos[broken_row][1][:200]  # not even a container header
            table = table.set_column(table.schema.get_field_index("videos"), "videos",
                                     pa.array(videos, pa.list_(pa.binary())))
        pq.write_table(table, folder / path.name)
    broken = dataclasses.replace(docs, url=str(folder / "*.parquet"), on_corrupt="skip")
    submit_job(client, plan_for([chat, broken], global_batch=8), job="docs-skip")
    got = run_loaders(client, job="docs-skip", world_size=2, steps=3, keep=numpy_batch, timeout=120)
    status = client.sync(client.scheduler.mdata_status, job="docs-skip")
    close(client, "docs-skip")
    assert status["failure"] is None
    (quarantined,) = status["quarantined"]["video_docs"]
    assert quarantined["shard"] == 1 and broken_row in range(*quarantined["rows"])
    assert quarantined["reason"].startswith(f"VideoDecodeError (row {broken_row}): clip 1 of ")
    delivered = {tuple(s) for rank in got.values() for b in rank for mb in b["micro_batches"]
                 for s in mb["sample_ids"].tolist()}
    assert not any((1, 1, r) in delivered for r in range(*quarantined["rows"]))
    assert any(s[0] == 1 for s in delivered)
