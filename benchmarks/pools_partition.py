"""pools.partition_vs_best: steps/s of the pool layout computed from a profile, at equal loader
cores, over the better of the two layouts a user writes without one.

Workload: an image-heavy plan. ``wallpapers`` are native-size JPEG photographs (4.1 to 16 MPix,
made here by upscaling the example corpus's licensed photographs, never downloaded; decoded to
at most 1024 patches, about 17 ms of CPU each), 3/8 of every batch, mixed with the example corpus's short ``chat`` turns, ``code``
and small ``captions`` crops. The trainer (one rank in this process) consumes batches as fast as
they come, so steps/s is what the loader pools can feed.

Three layouts of the same loader cores (4 in quick mode, 6 in full) (workers x threads, constructors and the
Planner alike in each):

* **computed**: :func:`mdata.pools.layout.fit_layout` on a fresh :func:`mdata.pools.profiling.profile_sources`
  of the plan's sources, the fastest layout that fits in those cores;
* **one pool per source**: each source its own pool; the cores beyond one per pool go to the pools
  in proportion to their measured demand (largest remainder). A user without a profile could not
  do that; it favours the baseline;
* **all in one**: one pool serving every source, one one-thread worker per core.

The figure is ``computed / max(one per source, all in one)``, each the median of its runs (one
in quick mode, the computed layout first, on the coldest caches; three in full mode, the order
rotated so each layout runs first once), interleaved so slow phases of a shared machine hit every
layout alike. On a 2-core machine
every process shares the same two cores, so absolute rates are indicative; the ratio is measured
within one run.
"""

from __future__ import annotations

import io
import logging
import statistics
import sys
import time
from pathlib import Path

from benchmarks.baseline import IMAGE_TOKEN_ID
from benchmarks.harness import figure
from benchmarks.workload import CACHE, corpus_dir
from mdata.cost import AttentionCost
from mdata.data.example import example_sources
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.sources import DecodeImageCaption, Source

__all__ = ["run", "wallpaper_source", "image_heavy_plan"]

#: Native wallpaper sizes (4.1, 8.3, 12.6, 14.7 and 16.0 MPix).
SIZES = ((2560, 1600), (3840, 2160), (4096, 3072), (5120, 2880), (4896, 3264))
WEIGHTS = {"wallpapers": 3.0, "captions": 1.0, "chat": 3.0, "code": 1.0}
GLOBAL_BATCH = 32


def wallpaper_source(rows: int = 16, *, dest: Path | None = None, chunk_rows: int = 4) -> Source:
    """An image-caption source of ``rows`` native-size JPEGs in two Parquet shards, written once
    (deterministically) under ``.cache/mdata`` and reused."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from mdata.data.crops import decode_rgb
    from mdata.data.material import locate_material

    dest = Path(dest) if dest is not None else CACHE / f"bench-wallpapers-v1-{rows}"
    if not (dest / "done").exists():
        dest.mkdir(parents=True, exist_ok=True)
        photos = [p for p in locate_material().images() if not p.origin.endswith(".png")] or \
            locate_material().images()
        images, captions = [], []
        for i in range(rows):
            photo = photos[i % len(photos)]
            width, height = SIZES[i % len(SIZES)]
            big = decode_rgb(photo.data).resize((width, height), Image.Resampling.BICUBIC)
            buf = io.BytesIO()
            big.save(buf, format="JPEG", quality=90)
            images.append(buf.getvalue())
            captions.append(f"{photo.subject}, a {width}x{height} wallpaper")
        half = (rows + 1) // 2
        for shard, part in enumerate((slice(0, half), slice(half, rows))):
            table = pa.table({"image": images[part], "caption": captions[part]})
            pq.write_table(table, dest / f"part-{shard}.parquet", row_group_size=chunk_rows)
        (dest / "done").write_text("ok\n")
    # 1024 patches of 16 px (512 x 512): a vision encoder's budget; decoding draws at 1/4 scale
    return Source("wallpapers", str(dest), chunk_rows=chunk_rows,
                  transform=DecodeImageCaption(image_field="image", caption_field="caption",
                                               max_patches=1024))


def image_heavy_plan(sources, *, global_batch: int = GLOBAL_BATCH, weights=None) -> Plan:
    weights = weights or {s.name: WEIGHTS[s.name] for s in sources}
    return (Plan(sources).mix(weights).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=8192, global_batch=global_batch)
            .distribute(ClientPlaceTree(dp=1)).special_tokens(image_token_id=IMAGE_TOKEN_ID).seed(0))


def _sources(rows: int) -> list[Source]:
    corpus = {s.name: s for s in example_sources(corpus_dir())}
    return [wallpaper_source(rows), corpus["captions"], corpus["chat"], corpus["code"]]


def per_source_pools(profile, weights: dict[str, float], cores: int):
    """One pool per source; cores beyond one each go by measured demand (largest remainder)."""
    from mdata.driver import PoolSpec

    names = list(weights)
    total = sum(weights.values())
    demand = {n: weights[n] / total * profile[n].cost() for n in names}
    extra = max(0, cores - len(names))
    share = {n: extra * demand[n] / sum(demand.values()) for n in names}
    workers = {n: 1 + int(share[n]) for n in names}
    for n in sorted(names, key=lambda n: share[n] - int(share[n]), reverse=True)[:cores - sum(workers.values())]:
        workers[n] += 1
    return [PoolSpec(name=n, sources=(n,), workers=workers[n], standbys=0) for n in names]


def steps_per_second(sources, plan: Plan, pools, *, warm: int, steps: int) -> float:
    """Start a cluster with ``pools``, run one rank for ``warm + steps`` steps; steps/s after warm-up."""
    from distributed import Client

    from mdata.driver import start_cluster, submit_job
    from mdata.trainer import Loader

    logging.getLogger("distributed").setLevel(logging.ERROR)
    with start_cluster(sources, pools=pools, constructors=1, constructor_threads=2,
                       dashboard_address=":0") as cluster:
        with Client(cluster.scheduler_address, set_as_default=False) as client:
            submit_job(client, plan, job="partition")
        stamps = []
        with Loader(cluster.scheduler_address, job="partition", rank=0, world_size=1,
                    steps=warm + steps, timeout=120) as loader:
            for _ in loader:
                stamps.append(time.perf_counter())
    return steps / (stamps[-1] - stamps[warm - 1])


def run(quick: bool = True) -> dict:
    from mdata.driver import layout_pools, PoolSpec
    from mdata.pools.layout import fit_layout
    from mdata.pools.profiling import profile_sources

    cores, warm, steps, repeats = (4, 4, 24, 1) if quick else (6, 6, 80, 3)
    sources = _sources(16)
    plan = image_heavy_plan(sources)
    profile = profile_sources(sources, rows=8 if quick else 32, threads=2, progress=False)
    weights = {s.name: WEIGHTS[s.name] for s in sources}
    layout = fit_layout(profile, plan.mixture, samples_per_step=GLOBAL_BATCH, cores=cores)
    layouts = {
        "computed": layout_pools(layout, standbys=0),
        "per_source": per_source_pools(profile, weights, cores),
        "all_in_one": [PoolSpec(name="all", sources=tuple(weights), workers=cores, standbys=0)],
    }
    rates: dict[str, list[float]] = {k: [] for k in layouts}
    order = list(layouts)
    for rep in range(repeats):  # rotated: each layout runs first (coldest) once in three
        for name in order[rep % 3:] + order[:rep % 3]:
            pools = layouts[name]
            assert sum(p.workers * p.threads for p in pools) == cores
            rates[name].append(steps_per_second(sources, plan, pools, warm=warm, steps=steps))
            print(f"[pools_partition] {name}: {rates[name][-1]:.3g} steps/s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in rates.items()}
    best_name = max(("per_source", "all_in_one"), key=lambda k: med[k])
    shape = ", ".join(f"{p.name} {p.workers}x{p.threads}" for p in layout.pools)
    return {
        "pools.partition_vs_best": figure(
            med["computed"], med[best_name], ratio=med["computed"] / med[best_name], unit="steps/s",
            goal=">= 1 at equal cores",
            note=f"{cores} loader cores; computed [{shape}] vs best of one-pool-per-source "
                 f"{med['per_source']:.3g} and all-in-one {med['all_in_one']:.3g} steps/s "
                 f"(best: {best_name}); wallpapers {profile['wallpapers'].cost() * 1e3:.3g} "
                 f"CPU ms/sample, chat {profile['chat'].cost() * 1e3:.3g}"),
        "pools.steps_per_s_per_source": med["per_source"],
        "pools.steps_per_s_all_in_one": med["all_in_one"],
    }


if __name__ == "__main__":
    import json

    began = time.perf_counter()
    print(json.dumps(run(quick="--full" not in sys.argv), indent=1))
    print(f"{time.perf_counter() - began:.1f} s", file=sys.stderr)
