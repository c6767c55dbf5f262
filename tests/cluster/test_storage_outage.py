"""A storage outage on a live cluster: trainers wait, the job says why, and nothing is lost.

The ``chat`` source of the example corpus lives on a real S3 server (moto, on 127.0.0.1), ``code``
on local disk. Two trainer ranks take four steps, then the server is stopped; the next steps need
chunks not loaded yet (small chunks, a shuffle window of one chunk, a window of two steps), so the
loader worker's reads wait out the outage. Meanwhile the job's status, the sources JSON route and
the dashboard's sources page name ``chat`` as waiting on storage, and ``code`` not. The server
comes back on the same port and the trainers receive exactly what an uninterrupted run of the same
plan received (sample ids and a hash of every token).

The loader workers are separate processes: the short retry intervals reach them through Dask's
configuration, which each Nanny hands to its worker when the cluster starts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import glob
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import dask
import pytest
from distributed.utils import sync

from fixtures_s3 import AWS_TEST_ENV, S3Server
from mdata.driver import JobHandle, PoolSpec, start_cluster, submit_job
from mdata.trainer import Loader
from mdata.trainer.storage_notice import StorageNotice
from test_failures import plan_for
from test_recovery import close, received

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

STEPS = 20
BEFORE_OUTAGE = 4  # steps every rank takes before the server stops
BUCKET = "corpus"
CONFIG = {
    "mdata.storage.retry-deadline": "60s",  # longer than the outage: waited out, never failed
    "mdata.storage.retry-initial": "0.05s",
    "mdata.storage.retry-max-interval": "0.5s",
    "mdata.planner.storage-poll-interval": "0.5s",
}


def upload(server: S3Server, local, corpus: Path):
    """Copy a local source's shards to ``s3://corpus/<name>/`` and return the source reading them."""
    import s3fs

    fs = s3fs.S3FileSystem(**server.options, skip_instance_cache=True)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    for path in sorted(glob.glob(local.url)):
        fs.put_file(path, f"{BUCKET}/{local.name}/{Path(path).name}")
    return dataclasses.replace(local, url=f"s3://{BUCKET}/{local.name}/*.parquet",
                               storage_options=server.options, chunk_rows=16)


@pytest.fixture(scope="module")
def outage_cluster(example_corpus):
    """(the S3 server, the cluster, the plan's sources): ``chat`` on S3 in pool ``remote``,
    ``code`` on disk in pool ``disk``."""
    import s3fs

    from mdata.data.example import example_sources

    with pytest.MonkeyPatch.context() as mp:
        for name, value in AWS_TEST_ENV.items():
            mp.setenv(name, value)  # inherited by the worker processes
        server = S3Server()
        server.start()
        try:
            local = {s.name: s for s in example_sources(example_corpus)}
            sources = [upload(server, local["chat"], example_corpus), local["code"]]
            pools = [PoolSpec("remote", ("chat",), threads=2), PoolSpec("disk", ("code",))]
            with dask.config.set(CONFIG), start_cluster(
                    sources, pools=pools, constructors=1, constructor_threads=1,
                    dashboard_address=":0", autoscale=False) as cluster:
                yield server, cluster, sources
        finally:
            server.stop()
            s3fs.S3FileSystem.clear_instance_cache()


def outage_plan(sources):
    return plan_for(sources, global_batch=12).shuffle(1)


def train(client, job: str, ranks: int = 2, *, arrived: threading.Barrier | None = None,
          go: threading.Event | None = None):
    """Start a thread per rank; returns (threads, received steps per rank, when each arrived,
    errors). With ``arrived``/``go``, each rank meets the others after :data:`BEFORE_OUTAGE`
    steps and waits for ``go`` before taking the next."""
    got: dict[int, list] = {r: [] for r in range(ranks)}
    times: dict[int, list[float]] = {r: [] for r in range(ranks)}
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            with Loader(client, job=job, rank=rank, world_size=ranks, steps=STEPS,
                        timeout=120) as loader:
                for batch in loader:
                    times[rank].append(time.monotonic())
                    got[rank].append(received(batch))
                    if arrived is not None and len(got[rank]) == BEFORE_OUTAGE:
                        arrived.wait(60)
                        go.wait(60)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)
            if arrived is not None:
                arrived.abort()

    threads = [threading.Thread(target=run, args=(r,), name=f"rank-{r}") for r in range(ranks)]
    for t in threads:
        t.start()
    return threads, got, times, errors


def finish(threads, errors) -> None:
    for t in threads:
        t.join(240)
    assert not any(t.is_alive() for t in threads), "a trainer did not finish"
    if errors:
        raise errors[0]


def get_json(cluster, path: str) -> dict:
    base = cluster.dashboard_link.rsplit("/", 1)[0]
    with urllib.request.urlopen(f"{base}/{path}", timeout=10) as reply:
        return json.loads(reply.read())


def dashboard_storage_line(cluster) -> str:
    """The sources page's storage line, built and updated on the scheduler's loop as Bokeh does."""
    from scheduler_plugins.dashboard.sources import SourcesPanel

    scheduler = cluster.cluster.scheduler

    async def build():
        panel = SourcesPanel(scheduler, job="outage")
        panel.update()
        return panel.storage.text, dict(zip(panel.source.data["source"], panel.source.data["storage"]))

    return sync(cluster.cluster.loop, build)


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        time.sleep(0.1)


def test_an_s3_outage_is_shown_while_trainers_wait_and_nothing_is_lost_or_repeated(outage_cluster):
    server, cluster, sources = outage_cluster
    plan = outage_plan(sources)
    with cluster.client() as client:
        submit_job(client, plan, job="reference")
        threads, reference, _, errors = train(client, "reference")
        finish(threads, errors)
        close(client, "reference")
        assert all(len(reference[r]) == STEPS for r in range(2))

        job = JobHandle.submit(client, plan, job="outage")
        arrived, go = threading.Barrier(3), threading.Event()
        threads, got, times, errors = train(client, "outage", arrived=arrived, go=go)
        arrived.wait(120)  # both ranks took steps 0..3
        remote = [a for a, w in client.scheduler_info()["workers"].items()
                  if "pool_chat" in w.get("resources", {})]
        assert job.storage_waits() == {}
        server.stop()
        down = time.time()
        go.set()

        waits = wait_for(job.storage_waits, 20, "the status names no source waiting on storage")
        assert list(waits) == ["chat"]  # code reads local files: not waiting
        chat = waits["chat"]
        assert down - 1 <= chat["since"] <= time.time()
        assert chat["attempts"] >= 1 and chat["workers"] == remote
        assert any(e in chat["last_error"] for e in ("EndpointConnectionError", "ConnectionClosedError"))
        assert chat["targets"] and all(t.startswith(f"s3://{BUCKET}/chat/") for t in chat["targets"])
        # the late Loaders' own question answers what the whole status says
        in_status = job.status(max_steps=0)["storage_waits"]
        assert list(in_status) == ["chat"] and in_status["chat"]["since"] == chat["since"]
        assert in_status["chat"]["workers"] == chat["workers"]
        assert min(len(got[r]) for r in range(2)) < STEPS  # the trainers are waiting for it

        api = get_json(cluster, "mdata/api/outage/sources")
        assert list(api["storage_waits"]) == ["chat"]
        assert api["storage_waits"]["chat"]["since"] == chat["since"]
        line = dict(zip(api["source"], api["storage"]))
        assert line["chat"].startswith("waiting on storage since ") and " attempt" in line["chat"]
        assert line["code"] == ""
        text, rows = dashboard_storage_line(cluster)
        assert "<b>chat</b>: waiting on storage since " in text and "code" not in text
        assert rows["chat"].startswith("waiting on storage since ") and rows["code"] == ""
        # what a Loader long without its batch logs (after 10 s there; at once here)
        notice = StorageNotice(client, "outage", rank=0, after_s=0.0)
        warning = notice.waiting(BEFORE_OUTAGE + 1, 12.0)
        assert warning.startswith(f"rank 0 has waited 12s for step {BEFORE_OUTAGE + 1} of job 'outage': "
                                  "source 'chat' is waiting on storage since ")
        assert notice.waiting(BEFORE_OUTAGE + 1, 13.0) is None  # at most once every 30 s

        # the outage goes on: the attempts grow, the trainers stay where they are
        stalled = {r: len(got[r]) for r in range(2)}
        time.sleep(2.0)
        later = job.storage_waits()["chat"]
        assert later["attempts"] > chat["attempts"] and later["since"] == chat["since"]
        assert later["waited_s"] >= 2.0
        assert {r: len(got[r]) for r in range(2)} == stalled

        server.start()
        up = time.monotonic()
        finish(threads, errors)

        assert got == reference  # the same sample ids and tokens, in order: nothing lost or repeated
        after = [next(t for t in times[r] if t >= up) for r in range(2)]
        assert max(after) - up < 30  # storage back: training goes on
        wait_for(lambda: job.storage_waits() == {}, 10, "the wait did not end in the status")
        assert StorageNotice(client, "outage", rank=0, after_s=0.0).waiting(STEPS, 12.0) is None
        status = job.status()
        assert status["failure"] is None
        lineage = job.lineage(STEPS)
        assert lineage["exactly_once"]["ok"], lineage["exactly_once"]["problems"]
        close(client, "outage")
