"""What `mdata cluster up` prints, without a cluster: its address lines, the live line of a job
(the figures `mdata cluster status` and the demo read too), rewritten in place on a terminal and
printed on change elsewhere, and which Dask log level a command line asks for."""

from __future__ import annotations

import argparse
import io

from mdata.driver.cluster_up import _log_level, dashboard_lines
from mdata.driver.progress import JobProgress, StatusBoard, StepRate, live_line

STATUS = {
    "job": "pretrain", "failure": None, "uptime_s": 95.2,
    "counters": {"planned_step": 14, "balanced_step": 12, "consumed_step": 9, "chunks_loaded": 30,
                 "truncated": 0, "skipped": {}},
    "trainer_wait_s": {"0": 0.5, "1": 2.25},
    "trainer_stall_s": {"0": 0.25, "1": 1.5},
    "storage_waits": {"scenes": {"since": 1000.0, "attempts": 7, "last_error": "ConnectionRefused"}},
}


def test_a_jobs_progress_is_read_once_from_its_status():
    progress = JobProgress.of(STATUS)
    assert (progress.step, progress.balanced, progress.planned) == (9, 12, 14)
    assert progress.ranks == 2 and JobProgress.worst(progress.stalls) == (1, 1.5)
    assert JobProgress.worst({}) is None and JobProgress.worst({3: 1.0, 1: 1.0}) == (1, 1.0)
    assert progress.storage == {"scenes": 1000.0}


def test_the_live_line_says_step_rate_stall_ranks_and_sources_waiting():
    progress = JobProgress.of(STATUS)
    assert live_line(progress, 2.5, now=1030.0) == (
        "job 'pretrain': step 9, 2.50 steps/s, stall 1.5s (most: rank 1), 2 ranks, "
        "sources waiting: scenes (storage, 30s)")
    idle = JobProgress.of({**STATUS, "trainer_wait_s": {}, "trainer_stall_s": {}, "storage_waits": {}})
    assert live_line(idle, None, now=0.0) == ("job 'pretrain': step 9, - steps/s, no trainer attached "
                                              "yet, sources waiting: none")
    failed = JobProgress.of({**STATUS, "failure": "source 'chat', shard 3: corrupt"})
    assert live_line(failed, 1.0, now=0.0) == "job 'pretrain': step 9, FAILED: source 'chat', shard 3: corrupt"


def test_steps_per_second_follow_the_last_readings():
    rate = StepRate(window_s=10.0)
    assert rate.add(0.0, 0) is None
    assert rate.add(2.0, 4) == 2.0
    assert rate.add(4.0, 8) == 2.0
    for t in range(5, 30):  # the job stops at step 8: the rate falls to 0 within the window
        last = rate.add(float(t), 8)
    assert last == 0.0


def test_a_terminal_gets_its_lines_rewritten_and_a_log_only_what_changed():
    out = io.StringIO()
    board = StatusBoard(out, tty=True)
    board.show({"a": "job a 1", "b": "job b 1"})
    board.show({"a": "job a 2", "b": "job b 1"})
    board.show({"a": "job a 3"})  # job b closed: its line is blanked
    assert out.getvalue() == ("\x1b[2Kjob a 1\n\x1b[2Kjob b 1\n"
                              "\x1b[2F\x1b[2Kjob a 2\n\x1b[2Kjob b 1\n"
                              "\x1b[2F\x1b[2Kjob a 3\n\x1b[2K\n\x1b[1F")
    log = io.StringIO()
    board = StatusBoard(log, tty=False)
    for lines in ({"a": "job a 1"}, {"a": "job a 1"}, {"a": "job a 2", "b": "job b 1"}):
        board.show(lines)
    assert log.getvalue() == "job a 1\njob a 2\njob b 1\n"


def test_cluster_up_prints_where_to_attach_and_where_to_look_first():
    lines = dashboard_lines("tcp://10.0.0.1:8786", "http://10.0.0.1:8787/status")
    assert lines[:2] == ["scheduler: tcp://10.0.0.1:8786", "dashboard: http://10.0.0.1:8787/status"]
    # then every mdata page by its full URL, one line each (tests/unit/test_dashboard_pages.py)
    assert [line.split(": ", 1)[0] for line in lines[2:]] == [
        "mdata sources", "mdata mixture", "mdata balance", "mdata trainers", "mdata waiting",
        "mdata lineage"]
    assert lines[6] == ("mdata waiting: http://10.0.0.1:8787/individual-mdata-waiting  "
                        "(is training waiting on data, on which rank, on which source?)")
    assert dashboard_lines("tcp://h:1", None) == ["scheduler: tcp://h:1"]


def test_dask_stays_at_warning_unless_the_command_line_asks():
    def level(**kw):
        return _log_level(argparse.Namespace(**{"verbose": 0, "log_level": None, **kw}))

    assert level() == ("warning", False)  # DASK_LOGGING__DISTRIBUTED may still say otherwise
    assert level(verbose=1) == ("info", True) and level(verbose=2) == ("debug", True)
    assert level(verbose=2, log_level="error") == ("error", True)
