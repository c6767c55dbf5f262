"""User story: serve the shipped text + video plan (docs/examples/video.yaml) with `mdata cluster up`
and train on it with torchrun, as docs/concepts.md shows: two trainer ranks get their steps, the
clips are mixed in at their weight (the dashboard's JSON route says so), and each rank ends with
a checkpoint to resume from. Real processes; what they print is what is checked."""

from __future__ import annotations

import json
import urllib.request

import pytest
from fixtures_plans import examples_copy  # noqa: F401
from test_cluster_up import cluster_up, stop
from test_first_hour import _train_process

from fixtures_cli import printed_lines

pytest.importorskip("av")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_the_shipped_video_plan_trains_with_torchrun(examples_copy):
    proc = cluster_up("--plan", str(examples_copy / "video.yaml"))
    try:
        lines = printed_lines(proc)
        assert "videos" in lines["pools"], lines
        trained, _ = _train_process("--scheduler", lines["scheduler"], "--steps", "3",
                                    world_size=2, timeout=240)
        assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
        for rank in range(2):
            assert [f"rank {rank} step {s}:" in trained.stdout for s in range(3)] == [True] * 3
            assert f"rank {rank} resumes at step 3" in trained.stdout
        base = lines["dashboard"].removesuffix("/status")
        with urllib.request.urlopen(f"{base}/mdata/api/default/mixture", timeout=30) as reply:
            mixture = json.loads(reply.read())
        videos = sum(mixture["counts"]["videos"][:3])
        assert videos == pytest.approx(3 * 16 * 0.5, abs=3)  # weight 2 of 4, 16 samples per step
    finally:
        stop(proc)
