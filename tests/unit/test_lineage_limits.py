"""The bounds of spilled lineage (mdata.lineage.limits): what to drop under the pending cap, when
to give up on a range, what retention deletes, and the sentence that says which lineage is gone."""

from __future__ import annotations

import numpy as np
import pytest
from dask.utils import parse_bytes

from mdata.errors import MdataError
from mdata.lineage.limits import (
    PENDING_CAP, RETENTION, WRITE_FAILED, LineageGap, LineageGaps, SpillLimits, WrittenRange,
)
from mdata.lineage.spill import SpilledLineage, SpillRange
from mdata.planner import PlannerState
from planner_driver import Driver
from test_lineage_spill import _meta, _plan


def test_the_pending_cap_drops_the_oldest_but_never_the_range_being_written():
    limits = SpillLimits(pending_bytes=100)
    assert limits.over_pending([("a", 40), ("b", 40), ("c", 20)]) == []  # 100 fits
    assert limits.over_pending([("a", 40), ("b", 40), ("c", 30)]) == ["a"]
    assert limits.over_pending([("a", 40), ("b", 40), ("c", 90)]) == ["a", "b"]
    # "a" is being written: the next oldest go, the newest too when that is not enough
    assert limits.over_pending([("a", 60), ("b", 30), ("c", 30)], busy="a") == ["b"]
    assert limits.over_pending([("a", 60), ("b", 30), ("c", 50)], busy="a") == ["b", "c"]
    assert SpillLimits(pending_bytes=None).over_pending([("a", 1 << 40)]) == []
    assert SpillLimits(pending_bytes=0).over_pending([("a", 1), ("b", 0)]) == ["a"]


def test_retries_double_up_to_the_longest_pause_then_give_up():
    limits = SpillLimits(retries=4, retry_initial_s=0.5, retry_max_s=1.5)
    assert [limits.retry_delay(n) for n in range(1, 6)] == [0.5, 1.0, 1.5, None, None]
    assert SpillLimits(retries=0).retry_delay(1) is None
    unbounded = SpillLimits(retries=None, retry_max_s=30.0)
    assert unbounded.retry_delay(1000) == 30.0


def _written(*spans):
    return [WrittenRange(i, a, b, n) for i, (a, b, n) in enumerate(spans)]


def test_retention_deletes_the_oldest_files_by_steps_and_by_bytes():
    ranges = _written((0, 10, 100), (10, 20, 100), (20, 30, 100), (30, 40, 100))
    assert SpillLimits(keep_steps=None, keep_bytes=None).expired(ranges) == []
    assert SpillLimits(keep_steps=20, keep_bytes=None).expired(ranges) == [0, 1]  # keeps 20..39
    assert SpillLimits(keep_steps=25, keep_bytes=None).expired(ranges) == [0]  # 10..19 partly inside
    assert SpillLimits(keep_steps=None, keep_bytes=250).expired(ranges) == [0, 1]
    assert SpillLimits(keep_steps=None, keep_bytes=400).expired(ranges) == []
    assert SpillLimits(keep_steps=30, keep_bytes=150).expired(ranges) == [0, 1, 2]
    assert SpillLimits(keep_bytes=0).expired(ranges) == [0, 1, 2, 3]
    # a rewound job spills steps again: the newest written step is what counts, in spill order
    rewound = _written((0, 30, 100), (25, 30, 10), (30, 40, 10))
    assert SpillLimits(keep_steps=10, keep_bytes=None).expired(rewound) == [0, 1]


def test_gaps_merge_and_say_which_lineage_is_unavailable_and_why():
    gaps = LineageGaps()
    assert not gaps and gaps.describe() == "" and gaps.gaps() == ()
    gaps.add(0, 4, WRITE_FAILED, "file:///x: NotADirectoryError: boom")
    gaps.add(4, 8, PENDING_CAP, "2.0 MiB pending")
    gaps.add(8, 12, WRITE_FAILED, "file:///x: NotADirectoryError: again")
    gaps.add(5, 5, RETENTION)  # empty: nothing
    assert gaps.gaps() == (LineageGap(0, 4, WRITE_FAILED, "file:///x: NotADirectoryError: again"),
                           LineageGap(4, 8, PENDING_CAP, "2.0 MiB pending"),
                           LineageGap(8, 12, WRITE_FAILED, "file:///x: NotADirectoryError: again"))
    limits = SpillLimits(pending_bytes=1 << 20, retries=3)
    note = gaps.describe(limits)
    assert note.startswith("lineage older than step 12 unavailable (")
    assert "writing it failed 3 time(s) (mdata.planner.lineage-spill-retries): file:///x" in note
    assert "lineage-spill-pending (1.0 MiB) waited in memory for storage: 2.0 MiB pending" in note
    assert note.endswith("training is unaffected")
    gaps.add(8, 20, WRITE_FAILED)  # overlapping ranges of one reason merge
    assert [(g.first_step, g.stop_step) for g in gaps.gaps()] == [(0, 4), (4, 8), (8, 20)]

    later = LineageGaps()
    later.add(100, 150, WRITE_FAILED, "x")
    later.add(300, 400, RETENTION)
    assert later.describe(SpillLimits(keep_steps=7, keep_bytes=None)).startswith(
        "lineage of steps 100-149, 300-399 unavailable (writing it failed 15 time(s)")
    assert "deleted by retention (lineage-spill-keep-steps 7)" in later.describe(
        SpillLimits(keep_steps=7, keep_bytes=None))
    with pytest.raises(ValueError, match="unknown lineage gap reason"):
        later.add(0, 1, "lost")


def test_limits_come_from_the_configuration_with_errors_naming_the_key():
    conf = {"lineage-spill-pending": "2 MiB", "lineage-spill-retries": 3,
            "lineage-spill-keep-steps": None, "lineage-spill-keep-bytes": "null"}
    limits = SpillLimits.from_config(conf.get, parse_bytes)
    assert (limits.pending_bytes, limits.retries, limits.keep_steps, limits.keep_bytes) == \
           (2 << 20, 3, None, None)
    from mdata import config  # mdata.yaml's defaults are the class's defaults

    assert SpillLimits.from_config(lambda key: config.get(f"planner.{key}"), parse_bytes) == SpillLimits()
    with pytest.raises(MdataError, match="lineage-spill-keep-bytes"):
        SpillLimits.from_config({**conf, "lineage-spill-keep-bytes": "lots"}.get, parse_bytes)
    with pytest.raises(MdataError, match="lineage-spill-retries must be >= 0"):
        SpillLimits.from_config({**conf, "lineage-spill-retries": -1}.get, parse_bytes)


def test_a_discarded_range_frees_its_memory_and_reads_as_empty():
    meta, plan = _meta(), _plan()
    segments = []
    Driver(PlannerState(plan, meta, lineage_steps=8, lineage_sink=segments.append), meta).run(20)
    spilled = SpilledLineage([SpillRange.of(i, s) for i, s in enumerate(segments)])
    first, second = spilled.ranges()[:2]
    rows = first.read("samples", {}).num_rows
    assert rows > 0 and first.nbytes() > 0
    held = second.nbytes()
    second.read("samples", {})  # its tables are built: the segment's arrays go, memory once
    assert 0 < second.nbytes() <= 1.5 * held
    spilled.remove(first)
    assert first.discarded and first.nbytes() == 0 and not first.written
    assert first.read("samples", {}).num_rows == 0 and first not in spilled.ranges()
    assert np.asarray(first.read("loads", {"source_index": 0})["seq"]).size == 0


def test_a_status_carries_the_unavailable_lineage_through_msgpack():
    import msgpack

    from mdata.wire.inspection import StatusReply
    from mdata.wire.lineage_status import LineageSpillInfo
    from test_messages import STATUS

    gaps = LineageGaps()
    gaps.add(0, 12, WRITE_FAILED, "s3://b/l: EndpointConnectionError")
    info = LineageSpillInfo(url="s3://b/l/job-1", written_ranges=3, pending_ranges=1,
                            pending_bytes=4096, pending_limit=1 << 20, file_bytes=9000, failures=10,
                            last_error="EndpointConnectionError", unavailable=gaps.gaps(),
                            note=gaps.describe())
    status = StatusReply(**{**STATUS.__dict__, "lineage": info})
    wire = msgpack.unpackb(msgpack.packb(status.to_msg()), strict_map_key=False)
    assert StatusReply.from_msg(wire) == status and StatusReply.from_msg(wire).lineage == info
    assert wire["lineage"]["note"].startswith("lineage older than step 12 unavailable")
    older = {k: v for k, v in wire.items() if k != "lineage"}  # a scheduler without the field
    assert StatusReply.from_msg(older).lineage == LineageSpillInfo()
    assert LineageSpillInfo.from_msg(LineageSpillInfo(pending_limit=None).to_msg()).pending_limit is None
