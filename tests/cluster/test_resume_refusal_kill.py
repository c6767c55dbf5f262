"""A trainer process killed with kill -9 and restarted with a checkpoint the job cannot restore.

Rank 0 and rank 1 are real trainer processes (:mod:`fault_trainer`). Rank 1 is SIGKILLed mid-run
and restarted, as a new process, from another plan's checkpoint: that process ends with
``CheckpointError`` and rank 0 trains on untouched. Rank 1 then comes back without a checkpoint
and continues at the first step it had not consumed. What each rank received (sample ids and
token hashes) is compared with an uninterrupted run of the same plan.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import run_loaders
from fault_procs import HERE, subprocess_env
from fault_sequences import Received, read_log
from fault_trainer import token_hash
from fault_trainers import TrainerGroup
from mdata.driver import submit_job
from mdata.trainer import Loader
from test_failures import plan_for
from test_recovery import close
from test_resume_refusals import foreign_states

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

END = 12


def as_received(batch) -> Received:
    """What fault_trainer logs of a batch, for a batch received in this process."""
    return Received(int(batch["step"]), tuple(tuple(int(x) for x in s) for s in batch["sample_ids"].tolist()),
                    token_hash(batch))


def test_a_killed_trainer_restarted_with_an_incompatible_checkpoint_fails_alone(
        client, example_sources_small, tmp_path):
    sources = example_sources_small[:4]
    plan = plan_for(sources)
    submit_job(client, plan, job="kill-reference")
    reference = run_loaders(client, job="kill-reference", world_size=2, steps=END, keep=as_received)
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps(foreign_states(client, sources, job="kill-foreign")[1]))

    address = client.scheduler.address
    submit_job(client, plan, job="kill-live")
    group = TrainerGroup(tmp_path, job="kill-live", world_size=2, end_step=END, dist=False,
                         step_sleep=0.1, timeout=90)
    try:
        group.start(address)
        group.wait_for_step(3, ranks=[1])
        group.kill9(1)
        killed = group.current(1).log()

        out = tmp_path / "bad.jsonl"
        bad = subprocess.run(
            [sys.executable, str(HERE / "fault_trainer.py"), "--address", address, "--job",
             "kill-live", "--rank", "1", "--world-size", "2", "--end-step", str(END), "--out",
             str(out), "--checkpoint-dir", str(tmp_path / "bad-checkpoints"), "--resume",
             str(foreign), "--timeout", "60"],
            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        error = read_log(out).error or ""
        assert bad.returncode == 1 and "CheckpointError" in error, bad.stdout.decode()[-2000:]
        assert "seed was 4, is now 3" in error

        with Loader(address, job="kill-live", rank=1, world_size=2, timeout=90) as again:
            start = again.attach()["start_step"]
            again.steps = END - start
            resumed = [as_received(batch) for batch in again]
        healthy = group.current(0)
        assert healthy.proc.wait(timeout=120) == 0  # (rank 1's current process is the killed one)
        rank0 = healthy.log()
    finally:
        group.kill_all()
    assert rank0.done and rank0.error is None
    assert rank0.batches == reference[0], "the healthy rank's samples changed"
    assert killed.batches == reference[1][:len(killed.batches)]
    assert start <= len(killed.batches), "steps rank 1 never received were skipped"
    assert resumed == reference[1][start:]
    close(client, "kill-reference", "kill-foreign", "kill-live")
