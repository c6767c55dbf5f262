"""User story: a validation split, as docs/recipes.md tells it. `mdata cluster up --plan
train.yaml` serves the training job; docs/examples/validate.py, one trainer rank, registers the
validation job from val.yaml (the same source name over held-out files, so the same pool loads
it), trains, and evaluates the validation job every N steps. Real processes, real JSONL
files, the real tokenizer; the jobs' own status says how far each went."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mdata.errors import SampleNotPlannedError
from fixtures_cli import printed_lines

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
VALIDATE = REPO / "docs" / "examples" / "validate.py"


def _notes(folder: Path, shards: int, words: str) -> None:
    folder.mkdir(parents=True)
    for shard in range(shards):
        rows = [json.dumps({"body": f"{words} {shard}-{i}: " + "and so on " * (i % 6 + 1)})
                for i in range(24)]
        (folder / f"part-{shard}.jsonl").write_text("\n".join(rows) + "\n")


def _plan(folder: Path, seed: int):
    from mdata.cost import AttentionCost
    from mdata.mesh import ClientPlaceTree
    from mdata.plan import Plan
    from mdata.sources import Source, TokenizeText

    notes = Source("notes", str(folder), format="jsonl", chunk_rows=12,
                   transform=TokenizeText(field="body"))
    return (Plan([notes]).mix({"notes": 1.0}).cost(AttentionCost(a=1.0, b=2048.0))
            .balance(micro_batches=2, max_tokens=256, global_batch=4)
            .distribute(ClientPlaceTree(dp=1)).seed(seed))


def test_validate_py_evaluates_a_second_job_every_n_steps(tmp_path):
    from test_cluster_up import _free_port, cluster_up, stop

    from distributed import Client

    from mdata.driver import JobHandle

    _notes(tmp_path / "notes" / "train", 2, "a training note")
    _notes(tmp_path / "notes" / "val", 1, "a held-out note")
    train_plan = _plan(tmp_path / "notes" / "train", seed=1).to_file(tmp_path / "train.yaml")
    val_plan = _plan(tmp_path / "notes" / "val", seed=2).to_file(tmp_path / "val.yaml")
    proc = cluster_up("--plan", str(train_plan))
    try:
        address = printed_lines(proc)["scheduler"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(VALIDATE.parent), str(REPO)]),
               "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(_free_port()), "DASK_MDATA__TRAINER__TIMEOUT": "60s"}
        run = subprocess.run(
            [sys.executable, str(VALIDATE), "--scheduler", address, "--val-plan", str(val_plan),
             "--steps", "4", "--every", "2", "--val-batches", "6"],
            capture_output=True, text=True, timeout=180, env=env)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        out = run.stdout
        train = re.findall(r"rank 0 step (\d): train loss (\d+\.\d+)", out)
        assert [int(step) for step, _ in train] == [0, 1, 2, 3], out
        val = re.findall(r"rank 0 step (\d): validation loss (\d+\.\d+) over (\d+) tokens", out)
        assert [int(step) for step, _, _ in val] == [1, 3], out  # after steps 2 and 4
        assert all(float(loss) > 0 for _, loss, _ in val), out
        assert val[0][2] == val[1][2], out  # the same held-out tokens each time: one epoch
        assert "rank 0 resumes at step 4, validation at step 12" in out, out  # 2 x 6 batches
        with Client(address, set_as_default=False) as client:
            validation = JobHandle(client, "validation")
            assert validation.consumed_step() == 12  # every validation batch taken was consumed
            assert JobHandle(client, "default").consumed_step() == 4
            # 6 steps of 4 samples are the held-out file's 24 rows: each evaluation is one epoch,
            # every held-out row consumed once in each (a third epoch may be prefetched already)
            for row in (0, 11, 23):
                story = validation.story(f"notes/0/{row}")
                consumed = [occ for occ in story.occurrences
                            if any(ev["event"] == "consumed" for ev in occ.events)]
                assert len(consumed) == 2, str(story)
            with pytest.raises(SampleNotPlannedError, match="has 1 shard"):  # no such shard
                validation.story("notes/1/0")
            assert "planned for step" in str(JobHandle(client, "default").story("notes/1/0"))
    finally:
        stop(proc)
