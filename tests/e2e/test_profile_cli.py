"""User story: `mdata profile PLAN` measures the plan's sources, then `mdata cluster up --plan PLAN
--profile FILE --rate R` starts the pools that profile implies (an image source in a pool of its
own, sized for the rate) and serves a trainer; `mdata plan layout` prints the same layout as
dask worker lines."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures_cli import printed_lines
from fixtures_layout import image_heavy_plan, rate_for
from mdata.pools.layout import layout_for_plan
from mdata.pools.profile import Profile

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

MDATA = str(Path(sys.executable).with_name("mdata"))


def test_profile_then_cluster_up_with_the_profile(tmp_path):
    from mdata.trainer import Loader

    plan_file = image_heavy_plan(tmp_path / "data").to_file(tmp_path / "job.yaml")
    elsewhere = tmp_path / "elsewhere"  # the profile goes beside the plan, not into the cwd
    elsewhere.mkdir()
    done = subprocess.run([MDATA, "profile", str(plan_file), "--rows", "8", "--threads", "2"],
                          capture_output=True, text=True, timeout=120, cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert "profiled photos: 8 samples" in done.stderr
    assert f"wrote {tmp_path / 'job.profile.json'}" in done.stdout
    assert not list(elsewhere.iterdir())
    assert any(line.startswith("photos ") for line in done.stdout.splitlines())
    profile = Profile.load(tmp_path / "job.profile.json")

    from mdata.plan import Plan

    plan = Plan.from_file(plan_file, build_sources=False)
    rate = rate_for(profile, plan, 1.5)
    expected = layout_for_plan(plan, profile, rate=rate)
    shown = subprocess.run([MDATA, "plan", "layout", str(plan_file), "--profile", "job.profile.json",
                            "--rate", repr(rate), "--scheduler", "tcp://10.1.2.3:8786"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    photos = expected.pool_of("photos")
    assert (f'dask worker tcp://10.1.2.3:8786 --nworkers {photos.workers} --nthreads {photos.threads} '
            f'--memory-limit 4GiB --resources "pool_photos={photos.threads}" --name photos') in shown.stdout

    proc = subprocess.Popen([MDATA, "cluster", "up", "--plan", str(plan_file), "--job", "profiled",
                             "--profile", str(tmp_path / "job.profile.json"), "--rate", repr(rate),
                             "--port", "0", "--dashboard-address", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = printed_lines(proc)
        text = expected.pool_of("notes")
        assert lines["pools"] == ", ".join(f"{p.name}={list(p.sources)} ({p.workers}x{p.threads})"
                                           for p in expected.pools)
        assert f"photos=['photos'] ({photos.workers}x{photos.threads})" in lines["pools"]
        assert photos.cores == 2 and set(text.sources) == {"notes", "code"}
        with Loader(lines["scheduler"], job="profiled", rank=0, world_size=1, steps=2, timeout=90) as loader:
            assert [b["step"] for b in loader] == [0, 1]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
