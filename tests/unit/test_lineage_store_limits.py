"""The lineage store's bounds on real files: a spill target that fails degrades to "lineage older
than step N unavailable" with memory under the pending cap, storage that comes back is used again,
and retention deletes the oldest spill files (by steps and by bytes)."""

from __future__ import annotations

import threading
from pathlib import Path

from mdata.lineage.limits import PENDING_CAP, RETENTION, WRITE_FAILED, SpillLimits
from mdata.lineage.spill import StoryQuery
from mdata.planner import PlannerState
from planner_driver import Driver
from scheduler_plugins.lineage_store import LineageStore
from test_lineage_spill import _full_story, _meta, _plan, _sample_ids


class Watched:
    """The store's sink, noting the memory it holds after every hand-over and, from a thread,
    in between (the writer builds a range's tables while the Planner goes on)."""

    def __init__(self, store: LineageStore) -> None:
        self.store, self.most, self.spills = store, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.001):
            self.most = max(self.most, self.store.pending_nbytes())

    def __call__(self, segment) -> None:
        self.store.spill(segment)
        self.spills += 1
        self.most = max(self.most, self.store.pending_nbytes())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.most


def _segment_bytes() -> int:
    """What one range holds in memory with this plan (a dry run, nothing written)."""
    meta, segments = _meta(), []
    Driver(PlannerState(_plan(), meta, lineage_steps=8, lineage_sink=segments.append), meta).run(12)
    from mdata.lineage.spill import SpillRange

    return max(SpillRange.of(0, s).nbytes() for s in segments)


def _told(story, lost=range(0)) -> list:
    """A story without its ``loaded`` events (a chunk's loads leave memory with the range of the
    step they were recorded in) and without the occurrences planned in ``lost`` steps."""
    def planned(events):
        return next(e["step"] for e in events if e["event"] == "planned")
    return [(i, [e for e in events if e["event"] != "loaded"]) for i, events in story
            if planned(events) not in lost]


def _parquet(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_failing_spill_target_degrades_to_unavailable_lineage_under_the_cap(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a regular file where the spill folder's parent should be")  # root or not
    cap = 3 * _segment_bytes()
    limits = SpillLimits(pending_bytes=cap, retries=3, retry_initial_s=0.05, retry_max_s=0.1)
    store = LineageStore(f"file://{blocker}/run", limits=limits)
    meta, plan = _meta(), _plan()
    sink = Watched(store)
    kept = PlannerState(plan, meta, lineage_steps=8, lineage_sink=sink)
    full = PlannerState(plan, meta)
    Driver(kept, meta).run(80)
    Driver(full, meta).run(80)
    assert store.flush(timeout=60)  # every range written or let go: the writer is not stuck
    most = sink.stop()
    info = store.info()
    assert sink.spills >= 20 and 0 < most <= cap, (most, cap)
    assert store.pending_nbytes() == 0 and info.pending_ranges == 0 and store.ranges() == ()
    assert info.failures >= 3 and "NotADirectoryError" in info.last_error
    reasons = {g.reason for g in info.unavailable}
    assert WRITE_FAILED in reasons and reasons <= {WRITE_FAILED, PENDING_CAP}
    forgotten = kept.dgraph.forgotten_before
    assert info.note.startswith(f"lineage older than step {forgotten} unavailable (")
    assert "lineage-spill-retries" in info.note and str(blocker) in info.note
    assert blocker.read_text().startswith("a regular file")  # nothing written anywhere
    for key in _sample_ids(full.dgraph, [0]):  # what memory still tells, and nothing else
        got = StoryQuery.of(kept.dgraph, store.ranges(), *key).run()
        assert _told(got) == _told(_full_story(full.dgraph, key), range(forgotten))
    store.close()


def test_storage_that_comes_back_is_used_again_and_only_the_gap_is_unavailable(tmp_path):
    root = tmp_path / "run"
    store = LineageStore(f"file://{root}", limits=SpillLimits(pending_bytes=None, retries=1))
    meta, plan = _meta(), _plan()
    kept = Driver(PlannerState(plan, meta, lineage_steps=8, lineage_sink=store.spill), meta)
    full = Driver(PlannerState(plan, meta), meta).run(60).state.dgraph
    kept.run(20)
    assert store.flush(timeout=30)
    first_gap = kept.state.dgraph.forgotten_before
    root.rename(tmp_path / "run.away")
    root.write_text("not a folder")  # the spill target fails from here...
    kept.run(40)
    assert store.flush(timeout=30)
    stop_gap = kept.state.dgraph.forgotten_before
    root.unlink()
    (tmp_path / "run.away").rename(root)  # ...and comes back
    kept.run(60)
    assert store.flush(timeout=30)
    gaps = store.info().unavailable
    assert [(g.first_step, g.stop_step, g.reason) for g in gaps] == [(first_gap, stop_gap, WRITE_FAILED)]
    assert store.note().startswith(f"lineage of steps {first_gap}-{stop_gap - 1} unavailable")
    assert len(_parquet(root)) == 4 * len(store.ranges()) and all(r.written for r in store.ranges())
    graph = kept.state.dgraph
    for step in (0, stop_gap + 1):  # before and after the gap: told, but what was planned in it
        for key in _sample_ids(full, [step]):
            got = StoryQuery.of(graph, store.ranges(), *key).run()
            assert _told(got) == _told(_full_story(full, key), range(first_gap, stop_gap))
    store.close()


def test_retention_deletes_the_oldest_spill_files(tmp_path):
    root = tmp_path / "run"
    store = LineageStore(f"file://{root}", limits=SpillLimits(keep_steps=10, keep_bytes=None))
    meta, plan = _meta(), _plan()
    kept = Driver(PlannerState(plan, meta, lineage_steps=8, lineage_sink=store.spill), meta).run(60)
    assert store.flush(timeout=30)
    ranges = store.ranges()
    newest = max(r.stop_step for r in ranges)
    assert ranges and all(r.stop_step > newest - 10 for r in ranges)
    assert _parquet(root) == sorted(f"{r.stem}.{t}.parquet" for r in ranges
                                    for t in ("samples", "loads", "ranks", "skips"))
    oldest = min(r.first_step for r in ranges)
    assert oldest > 0 and not any(n.startswith("000000-") for n in _parquet(root))
    info = store.info()
    assert [(g.first_step, g.stop_step, g.reason) for g in info.unavailable] == [(0, oldest, RETENTION)]
    assert info.note.startswith(f"lineage older than step {oldest} unavailable (its files were "
                                "deleted by retention (lineage-spill-keep-steps 10))")
    assert info.file_bytes == sum(p.stat().st_size for p in root.iterdir())
    assert kept.state.dgraph.forgotten_before == newest
    store.close()

    budget_root = tmp_path / "budget"
    probe = sum(p.stat().st_size for p in root.iterdir()) // max(1, len(ranges))  # one range's files
    store = LineageStore(f"file://{budget_root}", limits=SpillLimits(keep_steps=None, keep_bytes=3 * probe))
    Driver(PlannerState(plan, meta, lineage_steps=8, lineage_sink=store.spill), meta).run(60)
    assert store.flush(timeout=30)
    on_disk = sum(p.stat().st_size for p in budget_root.iterdir())
    assert 0 < on_disk <= 3 * probe and store.info().file_bytes == on_disk
    assert 1 <= len(store.ranges()) <= 4 and len(_parquet(budget_root)) == 4 * len(store.ranges())
    assert store.info().unavailable[0].reason == RETENTION
    store.close()
