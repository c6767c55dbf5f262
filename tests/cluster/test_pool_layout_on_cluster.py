"""A layout computed from a fresh profile runs as is: an image-heavy plan's expensive image source
gets a pool of its own with the computed workers and threads, the cheap text sources share one,
and trainers are fed."""

from __future__ import annotations

import math

import pytest

from fixtures_layout import image_heavy_plan, rate_for

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def pool_resources(client) -> list[dict]:
    return [dict(w["resources"]) for w in client.scheduler_info(n_workers=-1)["workers"].values()]


@pytest.mark.slow  # a profiled layout served: tests/e2e/test_profile_cli.py
def test_a_profiled_layout_serves_an_image_heavy_plan(tmp_path):
    from distributed import Client

    from mdata.driver import start_cluster, submit_job
    from mdata.pools.layout import layout_for_plan
    from mdata.pools.profiling import profile_sources
    from mdata.trainer import Loader

    plan = image_heavy_plan(tmp_path)
    profile = profile_sources(plan.sources, rows=8, threads=2, progress=False)
    assert profile["photos"].cost() > 20 * profile["notes"].cost()
    layout = layout_for_plan(plan, profile, rate=rate_for(profile, plan, 2.5))
    photos, text = layout.pool_of("photos"), layout.pool_of("notes")
    assert photos.sources == ("photos",) and text is layout.pool_of("code") and text.sources != photos.sources
    assert photos.cores == 3 and photos.workers == math.ceil(3 / photos.threads)  # ceil(2.5) cores
    assert text.workers == 1

    with start_cluster(plan.sources, layout=layout, constructors=1, constructor_threads=1,
                       dashboard_address=":0") as cluster, \
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
