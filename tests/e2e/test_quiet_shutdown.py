"""Runs end quietly: a benchmark that starts an mdata cluster and trainers prints no traceback.

A traceback at shutdown (a client reconnecting to a closed scheduler, a long poll cut by a closing
comm, a plugin thread still polling) reads as a failure to whoever runs the benchmarks, and hides
real ones. The demo and ``mdata cluster up`` are checked the same way in test_demo.py and
test_cluster_up.py, and the control-plane quick run in test_benchmarks_harness.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_cli import quick_benchmarks

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(400)]


@pytest.mark.slow  # the control and mixture quick runs check the same quiet shutdown in the default run
def test_a_quick_throughput_run_shuts_down_without_tracebacks(tmp_path: Path) -> None:
    proc, figures = quick_benchmarks(tmp_path, "throughput", timeout=380)
    assert figures["_not_measured"] == {} and figures["throughput.samples_per_core"] > 0
    assert "Traceback" not in proc.stderr, proc.stderr[-6000:]
    assert "Failed to reconnect" not in proc.stderr, proc.stderr[-6000:]
