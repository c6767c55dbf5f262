"""A corrupt shard under on_corrupt="skip" on a live cluster: the job goes on without it.

The 'code' source as JSON Lines whose shard 1 starts with a broken line (one chunk per shard).
Under "skip" the trainers receive, over the steps that read the other shards once, every sample
of those shards exactly once and none of shard 1, in steps of the full global batch; status says
which shard was quarantined and why, and a job resumed from a checkpoint taken after the
quarantine receives the samples of the uninterrupted run. Under "fail" the job fails with the
CorruptShardError naming the shard, as before. What trainers received is compared, never lineage
alone."""

from __future__ import annotations

import dataclasses
import glob
import json
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import run_loaders
from mdata.driver import submit_job
from mdata.errors import CorruptShardError
from test_elastic_resume_on_cluster import ids, per_step, resume_loaders
from test_failures import by_name, plan_for
from test_recovery import close

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

BATCH, BEFORE = 32, 3


@pytest.fixture
def broken_code(example_sources_small, tmp_path):
    """The 'code' source as JSONL with shard 1's first line cut in half; its rows per shard."""
    code = by_name(example_sources_small)["code"]
    (field,) = code.fields
    folder = tmp_path / "code"
    folder.mkdir()
    rows = []
    for i, path in enumerate(sorted(glob.glob(str(Path(code.url).parent / "*.parquet")))):
        lines = [json.dumps({field: text}) for text in pq.read_table(path).column(field).to_pylist()]
        if i == 1:
            lines[0] = lines[0][: len(lines[0]) // 2]  # not JSON any more
        (folder / f"part-{i:05d}.jsonl").write_text("\n".join(lines) + "\n")
        rows.append(len(lines))
    assert max(rows) <= code.chunk_rows  # one chunk per shard: the chunk is the shard
    return dataclasses.replace(code, url=str(folder / "*.jsonl"), format="jsonl"), rows


def test_skip_quarantines_the_shard_delivers_every_other_sample_once_and_resumes_exactly(
        client, broken_code):
    source, rows = broken_code
    plan = plan_for([dataclasses.replace(source, on_corrupt="skip")], dp=2, global_batch=BATCH)
    steps = (sum(rows) - rows[1]) // BATCH  # the readable shards, each row once
    submit_job(client, plan, job="skip-reference")
    reference = per_step(run_loaders(client, job="skip-reference", world_size=2, steps=steps,
                                     keep=ids))
    assert list(reference) == list(range(steps))
    assert all(len(v) == BATCH for v in reference.values())  # the step sizes are unchanged
    taken = [x for v in reference.values() for x in v]
    assert Counter(taken).most_common(1)[0][1] == 1  # nothing twice
    assert sorted(taken) == [(0, shard, r) for shard in (0, 2) for r in range(rows[shard])]
    status = client.sync(client.scheduler.mdata_status, job="skip-reference")
    assert status["failure"] is None
    (quarantined,) = status["quarantined"]["code"]  # the recovery happened, and says where and why
    assert quarantined["shard"] == 1 and Path(quarantined["path"]).name == "part-00001.jsonl"
    assert list(quarantined["rows"]) == [0, rows[1]] and quarantined["step"] == 0
    assert quarantined["reason"].startswith("CorruptShardError (row 0): line is not valid JSON")
    lineage = client.sync(client.scheduler.mdata_lineage, job="skip-reference", steps=steps)
    assert lineage["exactly_once"]["ok"] and 0 < lineage["exactly_once"]["skipped"] <= rows[1]
    assert [q["shard"] for q in lineage["quarantined"]["code"]] == [1]  # which shard, and why

    submit_job(client, plan, job="skip-stopped")
    states: dict[int, dict] = {}
    run_loaders(client, job="skip-stopped", world_size=2, steps=BEFORE, keep=ids, states=states)
    stopped = client.sync(client.scheduler.mdata_status, job="skip-stopped")
    assert stopped["quarantined"]["code"]  # the checkpoint is taken after the quarantine
    resumed = per_step(resume_loaders(client, job="skip-resumed", plan=plan, world_size=2,
                                      steps=steps - BEFORE, states=states))
    assert resumed == {s: reference[s] for s in range(BEFORE, steps)}
    again = client.sync(client.scheduler.mdata_status, job="skip-resumed")
    assert [q["shard"] for q in again["quarantined"]["code"]] == [1]  # met again, same place
    close(client, "skip-reference", "skip-stopped", "skip-resumed")


def test_a_truncated_parquet_shard_under_skip_is_listed_without_rows_and_never_read(
        client, example_sources_small, tmp_path):
    """A Parquet shard cut in half has no footer, so listing cannot count its rows: under "skip"
    it is listed with none, said so in status, and the trainers get every row of the others."""
    import shutil

    code = by_name(example_sources_small)["code"]
    folder = tmp_path / "code"
    folder.mkdir()
    paths = sorted(glob.glob(str(Path(code.url).parent / "*.parquet")))
    rows = [pq.read_metadata(p).num_rows for p in paths]
    for p in paths:
        shutil.copy(p, folder)
    cut = folder / Path(paths[1]).name
    data = cut.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    source = dataclasses.replace(code, url=str(folder / "*.parquet"), on_corrupt="skip")
    plan = plan_for([source], dp=2, global_batch=BATCH)
    steps = (sum(rows) - rows[1]) // BATCH
    submit_job(client, plan, job="skip-footer")
    got = per_step(run_loaders(client, job="skip-footer", world_size=2, steps=steps, keep=ids))
    assert all(len(v) == BATCH for v in got.values()) and len(got) == steps
    taken = sorted(x for v in got.values() for x in v)
    assert taken == [(0, shard, r) for shard in (0, 2) for r in range(rows[shard])]
    status = client.sync(client.scheduler.mdata_status, job="skip-footer")
    (listed,) = status["quarantined"]["code"]
    assert listed["shard"] == 1 and Path(listed["path"]).name == cut.name
    assert listed["reason"].startswith("at listing: CorruptShardError: cannot read the Parquet footer")
    close(client, "skip-footer")


def test_fail_fails_the_job_with_the_corrupt_shard_error_naming_the_shard(client, broken_code):
    source, _ = broken_code
    plan = plan_for([dataclasses.replace(source, on_corrupt="fail")], dp=2, global_batch=BATCH)
    submit_job(client, plan, job="fail-corrupt")
    began = time.monotonic()
    with pytest.raises(CorruptShardError) as info:
        run_loaders(client, job="fail-corrupt", world_size=2, steps=8, timeout=60)
    assert Path(str(info.value.shard)).name == "part-00001.jsonl" and info.value.row == 0
    assert time.monotonic() - began < 60
    status = client.sync(client.scheduler.mdata_status, job="fail-corrupt")
    assert "part-00001.jsonl" in status["failure"] and status["quarantined"] == {}
    close(client, "fail-corrupt")
