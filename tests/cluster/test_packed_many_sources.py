"""Loaders hold chunks packed; trainers still receive exactly the samples the plan says, byte for byte.

Loaders keep each chunk with every sample's token ids and pixels compressed on their own
(``mdata.sources.pack-held``, :mod:`mdata.sources.packed`) until a constructor takes the sample.
Images of mdata's ``DecodeImageCaption`` are kept as their stored bytes and decoded again when
taken (:mod:`mdata.sources.encoded_images`). This runs a many-source plan (30 sources over the example corpus' text and image shards, shuffle
windows of 2 chunks of 2 rows, so windows open, drain and roll over many times in the run) on one
loader, and checks every delivered step against the plan and the data:

* the samples ``(source, shard, row)`` of each step and DP group are the ones the Planner's own
  offline run (:func:`mdata.planner.simulate`) puts there;
* every delivered document's tokens (image placeholders, then the text) and every image's pixels
  hash the same as a fresh, unpacked :func:`mdata.sources.load_chunk` of its row.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mdata.cost import AttentionCost
from mdata.mesh import ClientPlaceTree
from mdata.metadata import SourceMetadata
from mdata.plan import Plan
from mdata.planner import simulate
from mdata.sources import list_shards, load_chunk

from conftest import run_loaders

IMAGE_TOKEN = 100_277
MAX_TOKENS = 1 << 20  # no document is cut: each arrives whole, so its hash is the whole row's
STEPS = 16
DP = 2


def many_sources(corpus: Path, copies: int = 2) -> list:
    """``copies`` sources per shard file of the corpus' text and image sources (no video: its
    decoding costs seconds here), each named apart, so each has an order of its own."""
    from mdata.data.example import example_sources

    out = []
    for base in example_sources(corpus):
        if base.name == "videos":
            continue
        for path in sorted(Path(base.url).parent.glob(Path(base.url).name)):
            for c in range(copies):
                out.append(replace(base, name=f"{base.name}_{path.stem[-1]}{c}", url=str(path),
                                   chunk_rows=2))
    return out


def digest(array: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


def expected_documents(sources, needed: set[tuple[int, int, int]]) -> dict:
    """``(source_index, shard, row) -> (tokens digest, pixels digest or None)``, from unpacked
    loads of the chunks that hold the needed rows."""
    out, loaded = {}, {}
    for si, shard, row in sorted(needed):
        src = sources[si]
        start = row - row % src.chunk_rows
        key = (si, shard, start)
        if key not in loaded:
            rows = list_shards(src).shards[shard].num_rows
            loaded[key] = load_chunk(src, shard, start, min(start + src.chunk_rows, rows))
        chunk = loaded[key]
        i = int(np.flatnonzero(chunk.rows == row)[0])
        tokens = np.concatenate([np.full(int(chunk.num_patches[i]), IMAGE_TOKEN, np.int32), chunk.tokens(i)])
        image = chunk.image(i)
        out[(si, shard, row)] = (digest(tokens), None if image is None else digest(image))
    return out


def delivered_documents(mb: dict) -> list[tuple[tuple[int, int, int], str, str | None]]:
    """Each document of a micro-batch (cp 1): its id, its tokens' digest and its image's."""
    ids, cu, lens = mb["sample_ids"], mb["cu_seqlens_global"], mb["seqlens"]
    pixels, shapes = mb.get("pixels"), mb.get("image_shapes")
    counts = mb.get("image_token_counts")
    out, image, at = [], 0, 0
    for d in range(len(ids)):
        tokens = mb["input_ids"][cu[d]: cu[d] + lens[d]]
        pix = None
        if counts is not None and image < len(counts) and tokens.size and tokens[0] == IMAGE_TOKEN:
            size = int(np.prod(shapes[image]))
            pix = digest(pixels[at: at + size])
            image, at = image + 1, at + size
        out.append((tuple(int(v) for v in ids[d]), digest(tokens), pix))
    return out


@pytest.fixture(scope="module")
def sources(example_corpus):
    return many_sources(example_corpus)


@pytest.fixture(scope="module")
def cluster(sources):
    from mdata.driver import PoolSpec, start_cluster

    logging.getLogger("distributed").setLevel(logging.WARNING)
    pools = [PoolSpec(name="all", sources=tuple(s.name for s in sources))]
    with start_cluster(sources, pools=pools, constructors=1, constructor_threads=1,
                       autoscale=False, dashboard_address=":0") as c:
        yield c


def test_many_sources_deliver_the_plans_samples_byte_for_byte(cluster, sources):
    from distributed import Client

    from mdata.driver import submit_job

    plan = (Plan(sources).mix({s.name: 1.0 for s in sources}).cost(AttentionCost())
            .balance(micro_batches=2, max_tokens=MAX_TOKENS, global_batch=8 * DP)
            .distribute(ClientPlaceTree(dp=DP)).shuffle(2).seed(7)
            .special_tokens(pad_id=0, image_token_id=IMAGE_TOKEN))
    fields = ("sample_ids", "cu_seqlens_global", "seqlens", "input_ids", "pixels", "image_shapes",
              "image_token_counts")

    def keep(batch):
        return batch["step"], batch["dp_rank"], [
            {k: np.asarray(mb[k]) for k in fields if k in mb} for mb in batch["micro_batches"]]

    with Client(cluster.scheduler_address, set_as_default=False) as client:
        submit_job(client, plan, job="packed")
        got = run_loaders(client, job="packed", world_size=DP, steps=STEPS, keep=keep, timeout=120)
        held = client.run(_held_types)
    kinds = {k for ks in held.values() for k in ks}
    # the packed paths ran: text compressed, photos kept as their stored bytes
    assert {"PackedChunk/NoneType", "PackedChunk/EncodedImages"} <= kinds, held

    # the plan's samples: the Planner's own offline run over every row's real cost features
    metadata, by_url = {}, {}
    for src in sources:  # the copies of one file have the same rows: load each file once
        if src.url not in by_url:
            by_url[src.url] = [load_chunk(src, sh.index, a, min(a + src.chunk_rows, sh.num_rows))
                               for sh in list_shards(src).shards
                               for a in range(0, sh.num_rows, src.chunk_rows)]
        metadata[src.name] = SourceMetadata.from_chunks(by_url[src.url])
    planned = simulate(plan, STEPS, metadata, keep_samples=True).samples
    index = {s.name: i for i, s in enumerate(sources)}

    docs = {rank: [(step, dp, doc) for step, dp, mbs in got[rank] for mb in mbs
                   for doc in delivered_documents(mb)] for rank in got}
    needed = {doc[0] for rank in docs for _, _, doc in docs[rank]}
    expected = expected_documents(sources, needed)
    for rank in range(DP):
        assert [step for step, _, _ in got[rank]] == list(range(STEPS))
        for step, dp, mbs in got[rank]:
            ids = sorted(doc[0] for mb in mbs for doc in delivered_documents(mb))
            want = sorted((index[name], shard, row) for name, shard, row in planned[step][dp])
            assert ids == want, f"step {step} dp {dp}"
        for step, dp, (sid, tokens, pixels) in docs[rank]:
            assert (tokens, pixels) == expected[sid], f"step {step} dp {dp} sample {sid}"
    per_source = np.bincount([sid[0] for _, _, (sid, _, _) in docs[0] + docs[1]], minlength=len(sources))
    assert (per_source > 4).sum() >= len(sources) // 2, per_source  # past their first window (4 rows)
    assert any(p is not None for _, _, (_, _, p) in docs[0] + docs[1])  # images went through


def _held_types(dask_worker) -> list[str]:
    """``<held type>/<type of its pixels>`` of every chunk this worker holds."""
    return sorted({f"{type(v).__name__}/{type(getattr(v, 'pixels', None)).__name__}"
                   for k, v in dask_worker.data.items()
                   if isinstance(k, tuple) and k and k[0] == "mdata-load"})
