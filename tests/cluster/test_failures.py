"""Bad input and lost workers on a real cluster: errors reach trainers, nothing is lost."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import signal
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import run_loaders
from mdata.driver import submit_job
from mdata.trainer import Loader
from mdata.cost import AttentionCost
from mdata.errors import CorruptShardError, MdataError, SourceError, TrainerError
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.sources import Source, TokenizeText

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]


def plan_for(sources, *, dp: int = 2, global_batch: int = 12, seed: int = 3) -> Plan:
    return (
        Plan(sources)
        .mix({s.name: 1.0 for s in sources})
        .cost(AttentionCost(a=1.0, b=2048.0))
        .balance(micro_batches=1, max_tokens=4096, global_batch=global_batch)
        .distribute(ClientPlaceTree(dp=dp))
        .special_tokens(image_token_id=100_277)
        .seed(seed)
        .window(2)
    )


def by_name(sources):
    return {s.name: s for s in sources}


def test_a_missing_column_fails_the_job_and_every_trainer_hears_why(client, example_sources_small):
    """A source declaring a field its shards lack: trainers get an error naming source and field."""
    good = by_name(example_sources_small)["chat"]
    code = by_name(example_sources_small)["code"]
    broken = dataclasses.replace(code, transform=TokenizeText(field="body"), fields=())
    plan = plan_for([good, broken])
    began = time.monotonic()
    with pytest.raises(MdataError, match=r"source 'code'.*body|body.*source 'code'") as info:
        submit_job(client, plan, job="missing-column")
        run_loaders(client, job="missing-column", world_size=2, steps=2, timeout=60)
    assert "part-00000.parquet" in str(info.value) or "shard" in str(info.value)
    assert time.monotonic() - began < 60  # surfaced, not waited out


def test_a_corrupt_shard_reaches_the_trainer_as_its_own_error_class(client, example_sources_small,
                                                                    tmp_path):
    """The 'code' source as JSON Lines whose shard 1 starts with a broken line: the load fails on
    a loader worker, and the trainer's Loader raises that CorruptShardError itself (a SourceError
    naming source, shard and row, caught by type), not a TrainerError wrapping its text."""
    code = by_name(example_sources_small)["code"]
    (field,) = code.fields
    folder = tmp_path / "code"
    folder.mkdir()
    for i, path in enumerate(sorted(glob.glob(str(Path(code.url).parent / "*.parquet")))):
        lines = [json.dumps({field: text}) for text in pq.read_table(path).column(field).to_pylist()]
        if i == 1:
            lines[0] = lines[0][: len(lines[0]) // 2]  # cut in half: not JSON any more
        (folder / f"part-{i:05d}.jsonl").write_text("\n".join(lines) + "\n")
    broken = dataclasses.replace(code, url=str(folder / "*.jsonl"), format="jsonl")
    plan = plan_for([by_name(example_sources_small)["chat"], broken])
    submit_job(client, plan, job="corrupt")
    began = time.monotonic()
    with pytest.raises(CorruptShardError) as info:
        run_loaders(client, job="corrupt", world_size=2, steps=200, timeout=60)
    err = info.value
    assert isinstance(err, SourceError) and not isinstance(err, TrainerError)
    assert err.source == "code"
    assert Path(str(err.shard)).name == "part-00001.jsonl"
    assert err.row == 0
    assert "not valid JSON" in err.message and err.hint
    # the trainer says where it heard it, and the Planner's reason travels with it
    assert any(note.startswith("rank ") and "loading source 'code'" in note for note in err.__notes__)
    assert time.monotonic() - began < 60  # surfaced, not waited out
    status = client.sync(client.scheduler.mdata_status, job="corrupt")
    assert "part-00001.jsonl" in status["failure"]
    client.sync(client.scheduler.mdata_close_job, job="corrupt", client=client.id)


def test_undecodable_images_are_skipped_within_tolerance_and_counted(client, example_sources_small,
                                                                     tmp_path):
    """One corrupt JPEG per shard, skip tolerance 10%: the job runs, skips are counted, and the
    skipped rows never reach a trainer."""
    captions = by_name(example_sources_small)["captions"]
    folder = tmp_path / "captions"
    folder.mkdir()
    broken_rows = set()
    for i, path in enumerate(sorted(glob.glob(str(Path(captions.url).parent / "*.parquet")))):
        table = pq.read_table(path)
        images = table.column("image").to_pylist()
        images[5] = images[5][: len(images[5]) // 3]  # truncated JPEG
        broken_rows.add((i, 5))
        table = table.set_column(table.schema.get_field_index("image"), "image",
                                 pa.array(images, type=pa.binary()))
        pq.write_table(table, folder / Path(path).name, row_group_size=16)
    bad = dataclasses.replace(captions, url=str(folder / "*.parquet"), skip_tolerance=0.1)
    plan = plan_for([by_name(example_sources_small)["chat"], bad], global_batch=16)
    submit_job(client, plan, job="skips")
    got = run_loaders(client, job="skips", world_size=2, steps=12, timeout=90)
    received = {tuple(x) for batches in got.values() for b in batches for x in b["sample_ids"].tolist()}
    caption_index = plan.source_index("captions")
    assert not {(caption_index, shard, row) for shard, row in broken_rows} & received
    status = client.sync(client.scheduler.mdata_status, job="skips")
    assert status["counters"]["skipped"]["captions"] >= 1
    assert status["failure"] is None
    graph = client.sync(client.scheduler.mdata_lineage, job="skips", steps=12)
    assert graph["exactly_once"]["ok"], graph["exactly_once"]["problems"]
    client.sync(client.scheduler.mdata_close_job, job="skips", client=client.id)


@pytest.mark.slow  # resuming from trainers' checkpoints: test_recovery.py (live), test_chaos.py (whole cluster), test_elastic_resume_on_cluster.py
def test_resume_from_a_trainer_checkpoint_reproduces_the_sequence(client, example_sources_small):
    """Stop after 3 steps, restore the rank's state_dict as a new job: steps 3.. are identical."""
    plan = plan_for(example_sources_small[:4])
    ids = lambda batch: (batch["step"], batch["sample_ids"].tolist())  # noqa: E731
    submit_job(client, plan, job="uninterrupted")
    whole = run_loaders(client, job="uninterrupted", world_size=2, steps=6, keep=ids)

    submit_job(client, plan, job="uninterrupted-2")  # same plan, fresh job: same sequence
    states: dict[int, dict] = {}
    first = run_loaders(client, job="uninterrupted-2", world_size=2, steps=3, keep=ids, states=states)
    for rank in range(2):
        assert first[rank] == whole[rank][:3]
    assert states[0]["checkpoint"] == states[1]["checkpoint"]
    assert states[0]["next_step"] == 3

    # a new job restored from the ranks' state (as after a restart on a fresh cluster)
    resumed = run_loaders(client, job="resumed", plan=plan, world_size=2, steps=3, keep=ids,
                          checkpoints=states)
    for rank in range(2):
        assert resumed[rank] == whole[rank][3:]
    for job in ("uninterrupted", "uninterrupted-2", "resumed"):
        client.sync(client.scheduler.mdata_close_job, job=job, client=client.id)


@pytest.fixture
def resilient_cluster(example_sources_small):
    """A cluster whose text pool has two workers, so one can die while the job runs (no
    autoscaler: it would shrink the pool to this small job's demand)."""
    from mdata.driver import PoolSpec, start_cluster

    sources = [s for s in example_sources_small if s.name in ("chat", "scenes", "code")]
    pools = [PoolSpec("text", tuple(s.name for s in sources), workers=2)]
    with start_cluster(sources, pools=pools, constructors=1, constructor_threads=1,
                       autoscale=False) as cluster:
        yield cluster, sources


def test_losing_a_loader_worker_loses_no_sample(resilient_cluster):
    """kill -9 the text loader holding the most chunks of the job at step 3: its chunks are
    loaded again (the status counts them) and the trainers receive exactly what an uninterrupted
    run of the same plan gives them (sample ids and a hash of the tokens)."""
    from distributed import Client

    from benchmarks.lockstep import token_hash

    cluster, sources = resilient_cluster
    plan = plan_for(sources, global_batch=16)
    steps = 8
    keep = lambda batch: (batch["step"], batch["sample_ids"].tolist(), token_hash(batch))  # noqa: E731
    with Client(cluster.scheduler_address, set_as_default=False) as client:
        submit_job(client, plan, job="no-loss")
        reference = run_loaders(client, job="no-loss", world_size=2, steps=steps, keep=keep)
        client.sync(client.scheduler.mdata_close_job, job="no-loss", client=client.id)
        submit_job(client, plan, job="loss")
        results: dict[int, list] = {0: [], 1: []}
        killed: list = []

        def kill_the_busiest_loader() -> None:
            loaders = {addr for addr, w in client.scheduler_info()["workers"].items()
                       if "pool_chat" in w.get("resources", {})}
            held = {addr: [k for k in keys if isinstance(k, tuple) and k[:2] == ("mdata-load", "loss")]
                    for addr, keys in client.has_what().items() if addr in loaders}
            busiest = max(held, key=lambda a: len(held[a]))
            killed.append((busiest, len(held[busiest])))
            pid = client.run(os.getpid, workers=[busiest])[busiest]
            os.kill(pid, signal.SIGKILL)  # a crash, not a graceful retirement

        with Loader(client, job="loss", rank=0, world_size=2, timeout=90) as l0, \
             Loader(client, job="loss", rank=1, world_size=2, timeout=90) as l1:
            it0, it1 = iter(l0), iter(l1)
            for step in range(steps):
                if step == 3:
                    kill_the_busiest_loader()
                for rank, it in ((0, it0), (1, it1)):
                    results[rank].append(keep(next(it)))
            l0.mark_consumed()  # the training loop is done with its last batch
            l1.mark_consumed()
        assert results == reference, f"the run that lost loader {killed} differs from the reference"
        status = client.sync(client.scheduler.mdata_status, job="loss")
        assert status["failure"] is None
        assert status["recoveries"]["chunks_reloaded"] >= 1, (killed, status["recoveries"])
        client.sync(client.scheduler.mdata_close_job, job="loss", client=client.id)


def test_closing_a_job_frees_its_constructors_for_the_next_job(client, example_sources_small):
    """Batches planned ahead of a closed job must not hold constructor threads until their chunk
    wait runs out (120 s by default): the next job is served at once."""
    plan = plan_for(example_sources_small[:4]).window(4)
    submit_job(client, plan, job="closed-early")
    run_loaders(client, job="closed-early", world_size=2, steps=1)
    client.sync(client.scheduler.mdata_close_job, job="closed-early", client=client.id)  # steps 1..4 in flight
    began = time.monotonic()
    submit_job(client, plan, job="next")
    run_loaders(client, job="next", world_size=2, steps=3, timeout=30)
    assert time.monotonic() - began < 30
    client.sync(client.scheduler.mdata_close_job, job="next", client=client.id)


def test_pools_scale_one_by_one_and_follow_the_planners_targets(resilient_cluster):
    """scale_pool changes one pool only; the autoscaler brings the 2-worker text pool to the
    Planner's demand-based target (this small job needs 1 worker) and says why."""
    from distributed import Client

    from mdata.driver import PoolAutoscaler

    cluster, sources = resilient_cluster

    def text_workers(client) -> int:
        return sum("pool_chat" in w["resources"] for w in client.scheduler_info()["workers"].values())

    with Client(cluster.scheduler_address, set_as_default=False) as client:
        client.wait_for_workers(3, timeout=60)
        assert text_workers(client) == 2
        submit_job(client, plan_for(sources, global_batch=16), job="scale")
        run_loaders(client, job="scale", world_size=2, steps=8)
        deadline = time.monotonic() + 30  # the step rate is measured over a second or more
        while True:
            targets = client.sync(client.scheduler.mdata_status, job="scale")["pool_targets"]
            if len(targets) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert set(targets) == {"chat", "scenes", "code"}
        assert all(t["reason"] for t in targets.values())
        # fractional demands add up before rounding: three light sources share one worker
        want = max(1, math.ceil(sum(targets[s]["demand"] for s in ("chat", "scenes", "code")) - 1e-9))

        scaler = PoolAutoscaler(cluster, client, "scale", min_workers=1, max_workers=2)
        for _ in range(scaler.down_after):  # a pool shrinks after agreeing rounds
            applied = scaler.step()
        expected = min(2, want)
        assert cluster.pools["text"].workers == expected
        if expected != 2:  # the usual case here: ~0.2 busy threads of demand
            assert [d.group for d in applied] == ["text"] and "demand" in applied[0].reason
            last = scaler.history[-1]
            assert (last.group, last.current, last.workers, last.kind) == ("text", 2, expected, "down")
        assert scaler.status().workers == {"text": expected}
        deadline = time.monotonic() + 60
        while text_workers(client) != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        assert text_workers(client) == expected
        # the job goes on with the resized pool and still delivers exactly once
        run_loaders(client, job="scale", world_size=2, steps=2)
        graph = client.sync(client.scheduler.mdata_lineage, job="scale", steps=10)
        assert graph["exactly_once"]["ok"], graph["exactly_once"]["problems"]
