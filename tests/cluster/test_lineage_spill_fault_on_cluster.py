"""A lineage spill target that really fails mid-run on a real cluster: the run's spill folder is
replaced by a regular file while trainers train (root or not, nothing can be written under it),
then put back. Training goes on and trainers receive exactly the samples of an uninterrupted run;
the scheduler's pending lineage stays under ``lineage-spill-pending``; the job's status, the
dashboard's lineage page and the story route say which steps' lineage is unavailable; lineage
written before the fault, and after storage came back, is still told."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import dask
import pytest
from distributed.utils import sync

import mdata.config  # noqa: F401 - mdata's defaults loaded before dask.config.set (see test_lineage_spill_on_cluster)
from conftest import run_loaders
from mdata.cost import AttentionCost
from mdata.data.example import example_sources
from mdata.driver import JobHandle, start_cluster
from mdata.lineage.ids import SampleId
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from scheduler_plugins.dashboard.lineage import LineagePanel

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

STEPS = 36
BREAK_AT, RESTORE_AT = 8, 22  # rank 0's steps at which the spill folder fails, then comes back
CAP = 4096  # lineage-spill-pending, bytes: a few steps of this plan's lineage


def _wait(cond, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return value


class SpillFault:
    """Breaks job ``job``'s spill folder at rank 0's step BREAK_AT and restores it at RESTORE_AT,
    from the trainer's own loop (its ``keep``), and watches the store's pending memory."""

    def __init__(self, scheduler, job: str) -> None:
        self.scheduler, self.job = scheduler, job
        self.most_pending = 0
        self.broken_at = self.restored_at = None
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    @property
    def store(self):
        return self.scheduler.extensions["mdata"].jobs[self.job].lineage

    def _watch(self) -> None:
        while not self._stop.wait(0.002):
            self.most_pending = max(self.most_pending, self.store.pending_nbytes())

    def keep(self, rank: int):
        def keep(batch):
            step = int(batch["step"])
            if rank == 0 and step == BREAK_AT:
                self._break()
            if rank == 0 and step == RESTORE_AT:
                self._restore()
            return step, batch["sample_ids"].numpy().tolist()
        return keep

    def _break(self) -> None:
        store = self.store
        self._watcher.start()
        _wait(lambda: any(r.written for r in store.ranges()), "a first range written before the fault")
        root = Path(store.root)
        blocker = root.with_name(root.name + ".blocker")
        blocker.write_text("a regular file where the spill folder was")
        os.rename(root, root.with_name(root.name + ".away"))
        os.rename(blocker, root)
        self.broken_at = store.info().written_ranges

    def _restore(self) -> None:
        store = self.store
        _wait(lambda: any(g.reason == "write-failed" for g in store.info().unavailable),
              "a range given up after its retries while the folder is a file")
        root = Path(store.root)
        away = root.with_name(root.name + ".away")
        root.unlink()
        root.mkdir(exist_ok=True)
        for f in away.iterdir():
            f.rename(root / f.name)
        self.restored_at = store.info().written_ranges

    def stop(self) -> int:
        self._stop.set()
        self._watcher.join()
        return self.most_pending


@pytest.fixture(scope="module")
def runs(example_corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("lineage")
    sources = [s for s in example_sources(example_corpus) if s.name in ("chat", "code")]
    plan = (Plan(sources).mix({"chat": 1.0, "code": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=1, max_tokens=2048, global_batch=8)
            .distribute(ClientPlaceTree(dp=2)).window(2))
    config = {"mdata.planner.lineage-steps": 4, "mdata.planner.lineage-spill": f"file://{folder}",
              "mdata.planner.lineage-spill-pending": CAP, "mdata.planner.lineage-spill-retries": 2}
    with dask.config.set(config), start_cluster(sources, dashboard_address=":0") as cluster, \
            cluster.client(set_as_default=False) as client:
        scheduler = cluster.cluster.scheduler
        faulty = JobHandle.submit(client, plan, job="spill-fault")
        fault = SpillFault(scheduler, "spill-fault")
        received: dict[int, list] = {}
        threads = [threading.Thread(target=lambda r=r: received.update(run_loaders(
            client, job="spill-fault", world_size=2, steps=STEPS, ranks=[r], timeout=120,
            keep=fault.keep(r))))
            for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(200)
        most = fault.stop()
        assert fault.store.flush(timeout=60)
        reference = JobHandle.submit(client, plan, job="spill-reference")
        expected = run_loaders(client, job="spill-reference", world_size=2, steps=STEPS, timeout=120,
                               keep=lambda b: (b["step"], b["sample_ids"].numpy().tolist()))
        yield {"cluster": cluster, "faulty": faulty, "reference": reference, "fault": fault,
               "most_pending": most, "received": received, "expected": expected,
               "names": plan.source_names}
        faulty.close()
        reference.close()


def test_training_goes_on_with_the_samples_of_an_uninterrupted_run(runs):
    received, expected = runs["received"], runs["expected"]
    assert sorted(received) == [0, 1]
    assert [s for s, _ in received[0]] == list(range(STEPS))
    assert received == expected
    assert runs["reference"].status()["lineage"]["unavailable"] == []  # the reference lost nothing


def test_the_status_says_which_lineage_is_unavailable_and_memory_stayed_under_the_cap(runs):
    lineage = runs["faulty"].status()["lineage"]
    fault = runs["fault"]
    assert fault.broken_at >= 1 and fault.restored_at is not None
    assert lineage["pending_limit"] == CAP and lineage["pending_bytes"] == 0
    assert 0 < runs["most_pending"] <= CAP, runs["most_pending"]
    assert lineage["failures"] >= 2 and lineage["last_error"].startswith("FileExistsError")  # a file there
    gaps = lineage["unavailable"]
    assert gaps and {g["reason"] for g in gaps} <= {"write-failed", "pending-cap"}
    assert "write-failed" in {g["reason"] for g in gaps}
    first, stop = min(g["first_step"] for g in gaps), max(g["stop_step"] for g in gaps)
    assert 0 < first < stop < STEPS - 4  # the fault's steps only: before and after were written
    assert lineage["note"].startswith("lineage of steps ") and "unavailable" in lineage["note"]
    assert f"{first}-" in lineage["note"] and "lineage-spill-retries" in lineage["note"]
    assert lineage["written_ranges"] > fault.restored_at >= fault.broken_at  # written again after
    stems: dict[str, int] = {}
    for f in Path(fault.store.root).glob("*.parquet"):
        stems[f.name.split(".")[0]] = stems.get(f.name.split(".")[0], 0) + 1
    assert sorted(s for s, n in stems.items() if n == 4) == sorted(r.stem for r in fault.store.ranges())
    for stem in (s for s, n in stems.items() if n < 4):  # a write cut by the fault: a range let go
        a, b = int(stem.split("-")[2]), int(stem.split("-")[3])
        assert any(g["first_step"] <= a and b <= g["stop_step"] for g in gaps), (stem, gaps)


def test_lineage_before_the_fault_is_told_and_the_gap_is_said_on_the_dashboard(runs):
    cluster, faulty = runs["cluster"], runs["faulty"]
    step, ids = runs["received"][0][0]
    source_index, shard, row = ids[0]
    sid = SampleId(runs["names"][source_index], shard, row)
    story = faulty.story(sid)
    assert [e["event"] for e in story.occurrences[0].events] == ["loaded", "planned", "delivered", "consumed"]
    note = faulty.status()["lineage"]["note"]

    base = cluster.dashboard_link.rsplit("/", 1)[0]
    with urllib.request.urlopen(f"{base}/mdata/api/spill-fault/story/{sid}", timeout=30) as reply:
        assert json.loads(reply.read())["lineage_unavailable"] == note

    async def page():
        panel = LineagePanel(cluster.cluster.scheduler, job="spill-fault", sample_id=str(sid))
        while panel.jobs.current().lock.locked():
            await asyncio.sleep(0.01)
        panel.update()
        return panel.unavailable.text

    assert sync(cluster.cluster.loop, page) == f"<b>{note}</b>"
