"""Reliability under a storage outage: how long training pauses after storage returns, and proof
that nothing was lost or repeated.

* ``reliability.storage_outage_recovery_s``: the S3 server a source lives on (moto, on 127.0.0.1)
  stops mid-run while trainers need new chunks from it, stays down for a few seconds and comes back
  on the same port; the figure is the time from the server being back to every trainer rank
  having received its next step (median of 3 outages). The loader's retry loop waits out the
  outage (``mdata.storage.*``: here pauses of 0.05 s doubling up to 0.5 s, so the first retry after
  the return comes within half a second); the rest is loading, building and delivering the step.
* ``reliability.storage_outage_samples_lost`` / ``..._samples_repeated``: sample ids of an
  uninterrupted run of the same plan that the interrupted runs did not receive, and those they
  received more often; both must be 0. ``..._steps_differing`` counts steps whose sample ids or
  token hash (sha1 of every micro-batch's ``input_ids``) differ from the uninterrupted run: 0.

It has its own S3 server, corpus copy and cluster; :mod:`benchmarks.reliability` runs it with
the other reliability figures.
"""

from __future__ import annotations

__all__ = ["storage_outage_recovery"]


def storage_outage_recovery(*, repeats: int = 3, outage_s: float = 3.0, steps: int = 16,
                            before_outage: int = 4) -> dict[str, float]:
    """Median seconds from S3 coming back to the next step delivered to every rank, over
    ``repeats`` outages of ``outage_s`` seconds, and what the outages lost or repeated.

    The ``chat`` source of the example corpus is copied to a moto S3 server and read from there
    (``chunk_rows=16``, shuffle window of one chunk, a window of two steps, so later steps need
    chunks not loaded before the outage); ``code`` stays on local disk. Two trainer ranks (DP 2)
    take ``before_outage`` steps, the server stops, they go on until they wait, it starts again.
    """
    import dataclasses
    import glob
    import hashlib
    import os
    import socket
    import statistics
    import threading
    import time
    from collections import Counter
    from pathlib import Path

    import dask
    import s3fs
    from moto.server import ThreadedMotoServer

    from benchmarks.workload import corpus_dir
    from mdata.cost import AttentionCost
    from mdata.data.example import example_sources
    from mdata.driver import PoolSpec, start_cluster, submit_job
    from mdata.mesh import ClientPlaceTree
    from mdata.plan import Plan
    from mdata.trainer import Loader

    with socket.socket() as sock:  # a free port the server keeps across its restarts
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"},
               "config_kwargs": {"retries": {"max_attempts": 0}},  # mdata's retries, not botocore's
               "default_cache_type": "none"}  # each row group read goes to the server
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    config = {"mdata.storage.retry-deadline": "120s", "mdata.storage.retry-initial": "0.05s",
              "mdata.storage.retry-max-interval": "0.5s"}
    server: list = []

    def start() -> None:
        server.append(ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False))
        server[-1].start()

    def stop() -> None:
        server.pop().stop()

    def received(batch) -> tuple:
        digest = hashlib.sha1()
        for mb in batch["micro_batches"]:
            digest.update(mb["input_ids"].numpy().tobytes())
        return batch["step"], tuple(map(tuple, batch["sample_ids"].tolist())), digest.hexdigest()

    def train(client, job: str, arrived=None, go=None):
        got = {r: [] for r in range(2)}
        times = {r: [] for r in range(2)}
        errors: list[BaseException] = []

        def rank(r: int) -> None:
            try:
                with Loader(client, job=job, rank=r, world_size=2, steps=steps, timeout=300) as loader:
                    for batch in loader:
                        times[r].append(time.monotonic())
                        got[r].append(received(batch))
                        if arrived is not None and len(got[r]) == before_outage:
                            arrived.wait(120)
                            go.wait(120)
            except BaseException as exc:  # noqa: BLE001 - raised below
                errors.append(exc)
                if arrived is not None:
                    arrived.abort()

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        return threads, got, times, errors

    def join(threads, errors) -> None:
        for t in threads:
            t.join(600)
        if errors:
            raise errors[0]

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the worker processes inherit the test credentials
    start()
    try:
        corpus = corpus_dir()
        local = {s.name: s for s in example_sources(corpus)}
        fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
        fs.mkdir("bench")
        for path in sorted(glob.glob(local["chat"].url)):
            fs.put_file(path, f"bench/chat/{Path(path).name}")
        chat = dataclasses.replace(local["chat"], url="s3://bench/chat/*.parquet",
                                   storage_options=options, chunk_rows=16)
        sources = [chat, local["code"]]
        plan = (Plan(sources).mix({"chat": 1.0, "code": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
                .balance(micro_batches=1, max_tokens=4096, global_batch=12)
                .distribute(ClientPlaceTree(dp=2)).seed(3).window(2).shuffle(1))
        pools = [PoolSpec("remote", ("chat",), threads=2), PoolSpec("disk", ("code",))]
        with dask.config.set(config), start_cluster(sources, pools=pools, constructors=1,
                                                    constructor_threads=1,
                                                    autoscale=False) as cluster:
            with cluster.client() as client:
                submit_job(client, plan, job="reference")
                threads, reference, _, errors = train(client, "reference")
                join(threads, errors)
                client.sync(client.scheduler.mdata_close_job, job="reference", client=client.id)
                recoveries, lost, repeated, differing = [], 0, 0, 0
                for i in range(repeats):
                    job = f"outage-{i}"
                    submit_job(client, plan, job=job)
                    arrived, go = threading.Barrier(3), threading.Event()
                    threads, got, times, errors = train(client, job, arrived, go)
                    arrived.wait(120)
                    stop()
                    go.set()
                    time.sleep(outage_s)
                    start()
                    up = time.monotonic()
                    join(threads, errors)
                    recoveries.append(max(next(t for t in times[r] if t >= up) for r in range(2)) - up)
                    for r in range(2):
                        want = Counter(s for _, ids, _ in reference[r] for s in ids)
                        have = Counter(s for _, ids, _ in got[r] for s in ids)
                        lost += sum((want - have).values())
                        repeated += sum((have - want).values())
                        differing += sum(a != b for a, b in zip(got[r], reference[r]))
                        differing += abs(len(got[r]) - len(reference[r]))
                    client.sync(client.scheduler.mdata_close_job, job=job, client=client.id)
    finally:
        while server:
            stop()
        s3fs.S3FileSystem.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {
        "reliability.storage_outage_recovery_s": float(statistics.median(recoveries)),
        "reliability.storage_outage_samples_lost": lost,
        "reliability.storage_outage_samples_repeated": repeated,
        "reliability.storage_outage_steps_differing": differing,
    }
