"""Resumes the live job must refuse, and what the other ranks see meanwhile.

- A rank restarted with a checkpoint the job cannot restore gets ``CheckpointError``; every
  healthy rank keeps training as if nothing happened (the refused rewind changes no generation).
- Ranks that bring checkpoints of different steps with the README's pattern (``Loader(...,
  plan=plan, checkpoint=...)`` on every rank) all get ``ResumeMismatchError`` naming the ranks and
  steps, within a bounded time, instead of bouncing each other between generations; consistent
  checkpoints resume exactly, on a new job and on the live one.

Each test compares what trainers received (sample ids and a hash of their tokens) with an
uninterrupted run of the same plan.
"""

from __future__ import annotations

import threading
import time

import pytest

from conftest import run_loaders
from mdata.driver import submit_job
from mdata.errors import CheckpointError, ResumeMismatchError
from mdata.trainer import Loader
from test_failures import plan_for
from test_recovery import close, received

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

STEPS = 10
MISMATCH_BOUND_S = 30.0  # every rank hears of a mismatch within this (the long-poll is 5 s)


def in_thread(fn) -> tuple[threading.Thread, dict]:
    """Run ``fn`` in a thread; its result or error lands in the returned dict."""
    out: dict = {}

    def body() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            out["error"] = exc
        out["elapsed"] = time.monotonic() - began

    began = time.monotonic()
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


def foreign_states(client, sources, *, job: str) -> dict[int, dict]:
    """Every rank's state after steps 0-1 of a job of another plan (seed 4, not 3)."""
    submit_job(client, plan_for(sources, seed=4), job=job)
    states: dict[int, dict] = {}
    run_loaders(client, job=job, world_size=2, steps=2, states=states)
    return states


@pytest.mark.slow  # the same story with a kill -9 of a real trainer process: test_resume_refusal_kill.py
def test_a_rank_restarted_with_an_incompatible_checkpoint_fails_alone(client, example_sources_small):
    """Rank 1 trains 4 steps and restarts with a checkpoint of another plan (another seed):
    it gets CheckpointError naming the seed (so does a driver rewinding the job with it), while
    rank 0 keeps training; rank 1 restarted without a checkpoint continues where it was. Both
    received exactly the uninterrupted run."""
    sources = example_sources_small[:4]
    plan = plan_for(sources)
    submit_job(client, plan, job="refusal-reference")
    reference = run_loaders(client, job="refusal-reference", world_size=2, steps=STEPS,
                            keep=received)
    foreign = foreign_states(client, sources, job="refusal-foreign")

    submit_job(client, plan, job="refusal-live")

    def healthy() -> list:
        with Loader(client, job="refusal-live", rank=0, world_size=2, steps=STEPS,
                    timeout=90) as loader:
            return [received(batch) for batch in loader]

    thread, rank0 = in_thread(healthy)
    with Loader(client, job="refusal-live", rank=1, world_size=2, steps=4, timeout=60) as first:
        got = [received(batch) for batch in first]
    with pytest.raises(CheckpointError, match=r"seed was 4, is now 3"):  # a driver's rewind too
        submit_job(client, plan, job="refusal-live", checkpoint=foreign[0])
    address = client.scheduler.address  # a restarted trainer is a new process: its own client
    with Loader(address, job="refusal-live", rank=1, world_size=2, checkpoint=foreign[1],
                timeout=60) as bad:
        began = time.monotonic()
        with pytest.raises(CheckpointError, match=r"seed was 4, is now 3"):
            bad.attach()
        refused_s = time.monotonic() - began
    with Loader(address, job="refusal-live", rank=1, world_size=2, steps=STEPS - 4,
                timeout=60) as restarted:
        assert restarted.attach()["start_step"] == 4  # where rank 1 was, same generation
        got += [received(batch) for batch in restarted]
    thread.join(120)
    assert "error" not in rank0, f"the healthy rank failed: {rank0.get('error')!r}"
    assert rank0["result"] == reference[0]
    assert got == reference[1]
    status = client.sync(client.scheduler.mdata_status, job="refusal-live")
    assert status["failure"] is None
    assert refused_s < 30
    print(f"incompatible checkpoint refused in {refused_s:.2f}s")
    close(client, "refusal-reference", "refusal-foreign", "refusal-live")


@pytest.fixture
def checkpoints(client, example_sources_small):
    """The plan, the uninterrupted run, and every rank's state after steps 0-1 and after 0-3 of
    the live job ``resume-source`` (left running at step 4)."""
    plan = plan_for(example_sources_small[:4])
    submit_job(client, plan, job="resume-reference")
    reference = run_loaders(client, job="resume-reference", world_size=2, steps=STEPS,
                            keep=received)
    submit_job(client, plan, job="resume-source")
    early: dict[int, dict] = {}
    late: dict[int, dict] = {}
    run_loaders(client, job="resume-source", world_size=2, steps=2, states=early)
    run_loaders(client, job="resume-source", world_size=2, steps=2, states=late)
    assert [s["next_step"] for s in (early[0], late[0])] == [2, 4]
    yield plan, reference, early, late
    close(client, "resume-reference", "resume-source")


def resume_all(client, *, job: str, plan, states: dict[int, dict], steps: int) -> dict[int, dict]:
    """Every rank at once, as torchrun starts them: ``Loader(plan=plan, checkpoint=...)``."""
    def rank(r: int):
        def run() -> list:
            with Loader(client, job=job, plan=plan, rank=r, world_size=2, steps=steps,
                        timeout=60, checkpoint=states[r]) as loader:
                return [received(batch) for batch in loader]
        return run

    runs = {r: in_thread(rank(r)) for r in sorted(states)}
    for thread, _ in runs.values():
        thread.join(MISMATCH_BOUND_S + 60)
    return {r: out for r, (_, out) in runs.items()}


@pytest.mark.parametrize("job", ["mismatch-new", "resume-source"])
def test_ranks_resuming_with_plan_from_different_steps_all_get_the_mismatch(client, checkpoints, job):
    """Rank 0 brings step 4, rank 1 step 2, both with plan=: on a new job and on the live one,
    each rank gets ResumeMismatchError naming the ranks and both steps, soon."""
    plan, _, early, late = checkpoints
    outs = resume_all(client, job=job, plan=plan, states={0: late[0], 1: early[1]}, steps=STEPS)
    for rank, out in outs.items():
        error = out.get("error")
        assert isinstance(error, ResumeMismatchError), f"rank {rank}: {error!r} {out.get('result')}"
        text = str(error)
        assert "step 2" in text and "step 4" in text and "rank" in text, text
        assert out["elapsed"] < MISMATCH_BOUND_S, f"rank {rank} heard after {out['elapsed']:.1f}s"
    print("mismatch heard after", {r: round(o["elapsed"], 2) for r, o in outs.items()})
    if job != "resume-source":
        close(client, job)


@pytest.mark.parametrize("job", ["consistent-new", "resume-source"])
def test_consistent_checkpoints_with_plan_resume_exactly(client, checkpoints, job):
    """Every rank brings its state after step 1 (the live job ran to step 3 meanwhile): they
    receive steps 2.. exactly as the uninterrupted run did."""
    plan, reference, early, _ = checkpoints
    outs = resume_all(client, job=job, plan=plan, states=early, steps=STEPS - 2)
    for rank, out in outs.items():
        assert "error" not in out, f"rank {rank}: {out['error']!r}"
        assert out["result"] == reference[rank][2:]
    if job != "resume-source":
        close(client, job)


def test_a_rank_joining_a_resume_with_another_plans_checkpoint_of_the_same_step_fails_alone(
        client, checkpoints, example_sources_small):
    """Rank 0 resumed a new job from step 2; rank 1 brings another plan's checkpoint of step 2:
    CheckpointError for rank 1 (a matching step is not enough), and with its own checkpoint
    it joins and both receive exactly the uninterrupted run from step 2."""
    plan, reference, early, _ = checkpoints
    foreign = foreign_states(client, example_sources_small[:4], job="join-foreign")
    assert foreign[1]["next_step"] == early[1]["next_step"] == 2
    with Loader(client, job="join-check", plan=plan, rank=0, world_size=2, steps=STEPS - 2,
                timeout=60, checkpoint=early[0]) as first:
        first.attach()
        thread, rank0 = in_thread(lambda: [received(batch) for batch in first])
        with Loader(client.scheduler.address, job="join-check", plan=plan, rank=1, world_size=2,
                    timeout=60, checkpoint=foreign[1]) as bad:
            with pytest.raises(CheckpointError, match=r"seed was 4, is now 3"):
                bad.attach()
        with Loader(client.scheduler.address, job="join-check", plan=plan, rank=1, world_size=2,
                    steps=STEPS - 2, timeout=60, checkpoint=early[1]) as good:
            got = [received(batch) for batch in good]
        thread.join(120)
    assert "error" not in rank0, f"rank 0 failed: {rank0.get('error')!r}"
    assert rank0["result"] == reference[0][2:]
    assert got == reference[1][2:]
    close(client, "join-foreign", "join-check")
