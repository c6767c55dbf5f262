"""The scheduler killed while trainers run: every trainer gets a clear error, never a hang.

The cluster runs in a process of its own (:mod:`fault_cluster`); its scheduler, with the Planner,
is that process. Trainer processes (:mod:`fault_trainer`) take a few steps, then the scheduler is
``kill -9``'d, its workers left running. A trainer cannot resume without a scheduler, so the
promise is only this: within its own timeout, each one raises a typed mdata error naming the
scheduler's address (what to check), not a raw comm error, and not silence.
"""

from __future__ import annotations

import json
import time

import pytest

from chaos_scenario import chaos_plan, chaos_pools, local_sources  # noqa: F401  (fixture)
from fault_procs import ClusterProcess, kill9
from fault_trainers import TrainerGroup

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

TIMEOUT = 10.0  # the trainers' timeout: the error must come sooner


def error_record(path) -> dict | None:
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("kind") == "error":
            return rec
    return None


@pytest.mark.parametrize("step_s", [0.05, pytest.param(1.5, marks=pytest.mark.slow)],  # calls in flight by default
                         ids=["waiting-for-batches", "mid-step"])
def test_trainers_get_a_clear_error_naming_the_scheduler_when_it_dies(local_sources, tmp_path, step_s):
    """``step_s``: each step's simulated compute. Short, the trainers' calls are in flight when
    the scheduler dies; long, they start after its death (the acks when the step ends)."""
    cluster = ClusterProcess(tmp_path / "cluster", local_sources, chaos_pools(local_sources)).start()
    group = TrainerGroup(tmp_path, job="scheduler-loss", world_size=2, end_step=10_000,
                         plan=chaos_plan(local_sources), step_sleep=step_s, timeout=TIMEOUT, dist=False)
    try:
        group.start(cluster.address)
        group.wait_for_step(3, timeout=120)
        cluster._drop_client()
        kill9(cluster.proc.pid)  # the scheduler (and Planner) only: its workers live on
        killed = time.time()
        ended = {}
        deadline = time.monotonic() + TIMEOUT + 60  # a hang shows as a failure, not a stuck test
        while len(ended) < 2 and time.monotonic() < deadline:
            for rank in range(2):
                if rank not in ended and group.current(rank).proc.poll() is not None:
                    ended[rank] = time.time()
            time.sleep(0.05)
        assert len(ended) == 2, f"ranks {sorted(set(range(2)) - set(ended))} still run without a scheduler"
        for rank in range(2):
            rec = error_record(group.current(rank).out)
            assert rec is not None, f"rank {rank} exited without an error"
            print(f"rank {rank}: {rec['error'][:300]!r} {rec['time'] - killed:.2f}s after the kill")
            assert rec["type"] == "SchedulerLostError", rec["error"]
            assert cluster.address in rec["error"], rec["error"]
            assert rec["time"] - killed < TIMEOUT  # measured after the Loader closed, as a script sees it
    finally:
        group.kill_all()
        cluster.kill()
