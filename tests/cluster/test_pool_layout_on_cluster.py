"""A layout computed from a fresh profile runs as is: an image-heavy plan's expensive image source
gets a pool of its own with the computed workers and threads, the cheap text sources share one,
and trainers are fed."""

from __future__ import annotations

import math

import pytest

from fixtures_sources import Store, encode_image, grace_hopper, stdlib_texts, write_parquet

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

IMAGE_TOKEN_ID = 100_300


def image_heavy_plan(root):
    """Native-size photographs (4 MPix JPEGs, the matplotlib sample photo upscaled) beside two
    short text sources; half of every batch is photographs."""
    from PIL import Image

    from mdata.cost import AttentionCost
    from mdata.mesh import ClientPlaceTree
    from mdata.plan import Plan
    from mdata.sources import DecodeImageCaption, Source, TokenizeText

    store = Store("local", str(root))
    big = grace_hopper().resize((2048, 2048), Image.Resampling.BICUBIC)
    photo = encode_image(big, "JPEG", quality=90)
    texts = stdlib_texts(48, max_chars=300)
    write_parquet(store, "photos/part-0.parquet", {"image": [photo] * 8, "caption": texts[:8]}, row_group_size=2)
    write_parquet(store, "notes/part-0.parquet", {"text": texts})
    write_parquet(store, "code/part-0.parquet", {"body": texts[::-1]})
    sources = [Source("photos", store.url("photos"), chunk_rows=2, transform=DecodeImageCaption()),
               Source("notes", store.url("notes"), chunk_rows=16, transform=TokenizeText()),
               Source("code", store.url("code"), chunk_rows=16, transform=TokenizeText(field="body"))]
    return (Plan(sources).mix({"photos": 2.0, "notes": 1.0, "code": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=4096, global_batch=8).distribute(ClientPlaceTree(dp=1))
            .special_tokens(image_token_id=IMAGE_TOKEN_ID).seed(1))


def rate_for(profile, plan, busy_threads: float) -> float:
    """The step rate at which the photos need ``busy_threads`` threads, headroom included."""
    weight = 2.0 / 4.0
    return busy_threads / (1.25 * weight * plan.balance_spec.global_batch * profile["photos"].seconds_per_sample)


def pool_resources(client) -> list[dict]:
    return [dict(w["resources"]) for w in client.scheduler_info(n_workers=-1)["workers"].values()]


def test_a_profiled_layout_serves_an_image_heavy_plan(tmp_path):
    from distributed import Client

    from mdata.driver import start_cluster, submit_job
    from mdata.pool_layout import layout_for_plan
    from mdata.profile import profile_sources
    from mdata.trainer import Loader

    plan = image_heavy_plan(tmp_path)
    profile = profile_sources(plan.sources, rows=8, threads=2, progress=False)
    assert profile["photos"].seconds_per_sample > 20 * profile["notes"].seconds_per_sample
    layout = layout_for_plan(plan, profile, rate=rate_for(profile, plan, 2.5))
    photos, text = layout.pool_of("photos"), layout.pool_of("notes")
    assert photos.sources == ("photos",) and text is layout.pool_of("code") and text.sources != photos.sources
    assert photos.cores == 3 and photos.workers == math.ceil(3 / photos.threads)  # ceil(2.5) cores
    assert text.workers == 1

    with start_cluster(plan.sources, layout=layout, constructors=1, constructor_threads=1,
                       dashboard_address=None) as cluster, \
            Client(cluster.scheduler_address, set_as_default=False) as client:
        client.wait_for_workers(photos.workers + text.workers + 1, timeout=60)
        running = pool_resources(client)
        assert sum(r == {"pool_photos": photos.threads} for r in running) == photos.workers
        assert sum(r == {"pool_notes": 1, "pool_code": 1} for r in running) == text.workers
        submit_job(client, plan, job="layout")
        with Loader(cluster.scheduler_address, job="layout", rank=0, world_size=1, steps=3,
                    timeout=90) as loader:
            batches = list(loader)
    assert [b["step"] for b in batches] == [0, 1, 2]
    sources = {int(s) for b in batches for s, _, _ in b["sample_ids"].tolist()}
    assert sources == {0, 1, 2}
