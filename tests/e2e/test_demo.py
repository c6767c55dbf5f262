"""User story: the README's main job, `mdata demo`, runs end to end and reports exactly-once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_mdata_demo_writes_a_summary_with_exactly_once(example_corpus, tmp_path):
    out = tmp_path / "demo.json"
    mdata = Path(sys.executable).with_name("mdata")
    proc = subprocess.run(
        [str(mdata), "demo", "--steps", "6", "--json", str(out), "--data", str(example_corpus)],
        capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["steps"] == 6
    assert summary["exactly_once"] is True and summary["problems"] == []
    assert summary["samples_delivered"] == 6 * 64  # global batch 64, every DP group once
    assert 0 <= summary["mixture_max_abs_deviation"] < 2 / 64  # within two samples of the target
    assert 1.0 <= summary["imbalance_vs_lower_bound"] < 1.5
    assert 0.0 <= summary["trainer_wait_fraction"] < 1.0
    assert summary["wall_seconds"] > 0
    assert set(summary["sources"]) >= {"chat", "scenes", "books", "code", "captions", "videos"}
    assert "| exactly_once | True |" in proc.stdout
    # where the dashboard link is printed, every mdata page follows with its full URL
    from mdata.observe.dashboard_pages import PAGES

    said = next(line for line in proc.stdout.splitlines() if line.startswith("scheduler "))
    base = said.rsplit("dashboard ", 1)[1].removesuffix("/status")
    for page in PAGES:
        assert f"mdata {page.title}: {base}{page.route}  ({page.purpose})" in proc.stdout
    # trainers, client and cluster close in order: nothing is torn down mid-request
    assert "Traceback" not in proc.stderr, proc.stderr[-6000:]
