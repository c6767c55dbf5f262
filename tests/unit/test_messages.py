"""The typed messages between mdata processes (mdata.wire.messages) and typed errors
(mdata.wire.errors): round trips through to_msg/from_msg, through msgpack as Dask's comms pack it,
through distributed's protocol for the replies that carry batches and chunks, and clear errors on
bad fields."""

from __future__ import annotations

import asyncio
import pickle

import msgpack
import numpy as np
import pytest
from distributed.protocol import dumps, loads

import mdata.wire.frames  # noqa: F401  the batch wire format, as on workers and trainers
from mdata.batch import Batch, build_dp_batch
from mdata.checkpoint import Checkpoint
from mdata.errors import (
    BatchError, CorruptShardError, MdataError, SourceError, TrainerError,
)
from mdata.sources.chunk import SampleChunk
from mdata.wire import messages as m
from mdata.wire.errors import MessageError, error_from_msg, error_to_msg


def through_msgpack(msg):
    """What a handler receives: msgpack as distributed packs it (lists arrive as tuples)."""
    return msgpack.unpackb(msgpack.packb(msg, use_bin_type=True), raw=False, use_list=False)


def checkpoint() -> Checkpoint:
    return Checkpoint(fingerprint="f00d", step=4, sources=("chat", "code"),
                      cursors={"chat": 40, "code": 12}, epochs={"chat": 0, "code": 1},
                      apportioner={"carry": [0.25, -0.25]}, seed=7,
                      mixture={"state": {}, "history": [], "pinned": {"5": [0.5, 0.5]}})


def location() -> m.BatchLocation:
    return m.BatchLocation(key=("mdata-construct", "job", 3, 1), who_has=("tcp://10.0.0.1:4000",),
                           cp_rank=1, receives_tokens=True, receives_labels=False,
                           checkpoint=checkpoint().to_dict(), dp_rank=2)


def corrupt_shard() -> CorruptShardError:
    return CorruptShardError("line is not valid JSON: JSONDecodeError: Expecting value", source="code",
                             shard="/data/code/part-00001.jsonl", row=17,
                             hint="the file is truncated or not valid; re-write it or remove it")


INFO = m.JobInfo(job="pretrain", fingerprint="f00d", start_step=4, broadcast="tp",
                 mesh=m.MeshShape(dp=2, pp=1, cp=2, tp=2, order="tp-cp-dp-pp"), world_size=8)
STATUS = m.StatusReply(
    job="pretrain", failure=None, uptime_s=12.5,
    steps={"0": {"step": 0, "counts": {"chat": 3, "code": 1}, "per_rank_cost": [1.0, 2.0]}},
    pool_targets={"chat": m.PoolDecision(group="chat", workers=2, reason="demand 1.2", demand=1.2,
                                         current=1, threads=2, kind="up", time=1e9,
                                         sources=("chat",))},
    chunks_in_memory=3, batches_in_memory=2, trainer_wait_s={"0": 0.5}, trainer_stall_s={"0": 0.25},
    consumed_steps={"0": 3},
    counters=m.StatusCounters(planned_step=6, balanced_step=5, consumed_step=4, chunks_loaded=3,
                              truncated=0, skipped={"chat": 1, "code": 0}),
)
STORAGE_WAIT = m.WorkerStorageWait(source="web", since=1.7e9, attempts=3,
                                   last_error="EndpointConnectionError: Could not connect",
                                   targets=("s3://b/web/a.parquet",), last_failed=1.7e9 + 2.5)
WAITING_STATUS = m.StatusReply(**{**STATUS.__dict__, "storage_waits": {"web": m.StorageWaitInfo(
    since=1.7e9, waited_s=4.5, attempts=7, last_error="EndpointConnectionError: Could not connect",
    workers=("tcp://10.0.0.2:1", "tcp://10.0.0.3:1"), targets=("s3://b/web/a.parquet",))}})
STORY = m.StoryReply((m.StoryOccurrence(3, ({"event": "planned", "step": 1, "dp_rank": 0},
                                            {"event": "consumed", "step": 1, "ranks": [0, 1]})),))
LINEAGE = m.LineageReply(samples={"0": {"0": [[0, 1, 17], [1, 0, 3]], "1": []}}, forgotten_before=0,
                         exactly_once=m.ExactlyOnce(ok=False, samples=2, skipped=0, problems=("gap",)))

PLAN_SPEC = {"mdata_plan": 1, "sources": ["chat", "code"],
             "mixture": {"type": "static", "weights": {"chat": 1.0, "code": 3.0}},
             "balance": {"micro_batches": 1, "max_tokens": 64, "global_batch": 4}}

MESSAGES = [
    m.OkReply(),
    m.RegisterJobRequest(job="pretrain", plan=PLAN_SPEC, checkpoint=checkpoint().to_dict()),
    m.RegisterJobRequest(job="pretrain", plan=PLAN_SPEC),
    m.RegisterJobRequest(job="pretrain", plan=PLAN_SPEC, client="Client-1"),
    m.RegisterJobRequest(job="pretrain", plan=PLAN_SPEC, checkpoint=checkpoint().to_dict(),
                         accept_appended_shards=True, allow_mixture_change=False),
    m.RegisterJobRequest(job="pretrain", plan=PLAN_SPEC, checkpoint=checkpoint().to_dict(),
                         by_loader=True),
    m.JobInfoRequest("pretrain"),
    INFO,
    m.JobInfo(job="pretrain", fingerprint="f00d", start_step=0, broadcast=None,
              mesh=m.MeshShape(dp=1, pp=1, cp=1, tp=1, order="tp-cp-dp-pp"), world_size=1),
    m.JobsRequest(),
    m.JobsReply(("a", "b")),
    m.CloseJobRequest("pretrain"),
    m.CloseJobRequest("pretrain", client="Client-1"),
    m.CheckpointRequest("pretrain", step=4),
    m.CheckpointReply(checkpoint()),
    m.StatusRequest("pretrain"),
    STATUS,
    m.StoryRequest("pretrain", sample_id="code/1/17"),
    STORY,
    m.LineageRequest("pretrain", steps=2),
    LINEAGE,
    m.BatchLocationRequest(job="pretrain", rank=3, step=5, timeout=2.0),
    m.BatchLocationReply(m.Status.OK, location()),
    m.BatchLocationReply(m.Status.TIMEOUT),
    m.BatchLocationReply(m.Status.FAILED, reason="building step 5 failed: bug"),
    m.HostLocationRequest(job="pretrain", step=5, timeout=2.0, asks=(
        m.LocationAsk(rank=3, token="t0k", generation=1),
        m.LocationAsk(rank=4, token="t1k", generation=1, delivered=4, consumed=(3, 4), stalled_s=0.5),
        m.LocationAsk(rank=5, token="t2k", generation=1, consumed=(3,), stalled_s=0.5, waits=(0.5,)))),
    m.HostLocationReply((m.BatchLocationReply(m.Status.OK, location()), m.BatchLocationReply(m.Status.TIMEOUT),
                         m.BatchLocationReply(m.Status.OK, location()),
                         m.BatchLocationReply(m.Status.FAILED, reason="rank 9 is taken"))),
    m.HostLocationReply(()),
    m.HostLocationRequest(job="pretrain", step=5, timeout=2.0, client="Client-1", asks=(
        m.LocationAsk(rank=3, token="t0k", generation=1),)),
    m.HostLocationReply((m.BatchLocationReply(m.Status.TIMEOUT),), pushing=True),
    m.ConsumedRequest(job="pretrain", tells=(
        m.ConsumedTell(rank=3, steps=(4, 5), token="t0k", generation=1, waited=(0.5, -1.0)),)),
    m.LocationPush(job="pretrain", generation=1, groups=(
        m.PushedGroup(5, 1, ("mdata-construct", "pretrain", 1, 5, 1), ("tcp://10.0.0.1:4000",),
                      ((2, 0, True, True), (3, 1, False, False))),
        m.PushedGroup(6, 0, ("mdata-construct", "pretrain", 1, 6, 0), ("tcp://10.0.0.2:4000",),
                      ((0, 0, True, False),))),
        checkpoints={5: checkpoint().to_dict(), 6: checkpoint().to_dict()}),
    m.LocationPush(job="pretrain", generation=2, reset=True),
    m.ConsumedRequest(job="pretrain", tells=(
        m.ConsumedTell(rank=3, steps=(4, 5), token="t0k", generation=1, stalled_s=0.25),
        m.ConsumedTell(rank=4, steps=(5,), token="t1k", generation=1),
        m.ConsumedTell(rank=5, steps=(5, 6), token="t2k", generation=1, stalled_s=1.0,
                       waits=(0.75, -1.0)))),
    m.ConsumedReply((None, None)),
    m.StreamedTells(job="pretrain", seq=7, tells=(
        m.ConsumedTell(rank=3, steps=(4, 5), token="t0k", generation=1, waited=(0.5, -1.0)),
        m.ConsumedTell(rank=4, steps=(5,), token="t1k", generation=1))),
    m.TellsConfirmed(job="pretrain", seq=7, errors=(None, None)),
    m.HostLocationReply((m.BatchLocationReply(m.Status.TIMEOUT),), pushing=True, tells=True),
    m.AckRequest(job="pretrain", rank=3, step=5),
    m.AckRequest(job="pretrain", rank=3, step=5, consumed=False, token="t0k", generation=2),
    m.BatchLocationRequest(job="pretrain", rank=3, step=5, timeout=2.0, token="t0k", generation=1),
    m.BatchLocationRequest(job="pretrain", rank=3, step=7, timeout=2.0, token="t0k", generation=1,
                           delivered=6, consumed=(4, 5), stalled_s=1.5),
    m.BatchLocationRequest(job="pretrain", rank=3, step=6, timeout=2.0, token="t0k", generation=1,
                           delivered=5),
    m.AttachRequest(job="pretrain", rank=3, client="Client-1", token="t0k", host="node7", pid=42,
                    checkpoint=None),
    m.AttachReply(generation=1, start_step=60),
    m.AttachReply(generation=1, start_step=60, job_data={
        "identity": "d00d", "data": {"seed": 7}, "schedule": {"class": "StaticMixture"},
        "listings": {"chat": [["part-0.parquet", 100], ["part-1.parquet", 7]]}}),
    m.AttachRequest(job="pretrain", rank=3, client="Client-1", token="t0k", host="node7", pid=42,
                    checkpoint=checkpoint().to_dict(), accept_appended_shards=True,
                    allow_mixture_change=True),
    m.DetachRequest(job="pretrain", rank=3, token="t0k"),
    m.ReportMetricsRequest(job="pretrain", rank=0, step=1, metrics={"loss/chat": 2.5}),
    m.ReportMetricsRequest(job="pretrain", rank=0, step=1, metrics={"loss/chat": 2.5}, token="t0k",
                           generation=2),
    m.WhoHasRequest(keys=(("mdata-load", "job", "chat", 0, 256),)),
    m.WhoHasReply(who_has=(("tcp://10.0.0.2:1",), None, ())),
    m.TakeRowsRequest(key=("mdata-load", "job", "chat", 0, 256), indices=(0, 5, 2)),
    m.TakeRowsReply(m.Status.MISSING, key=("mdata-load", "job", "chat", 0, 256)),
    m.TakeRowsManyRequest((m.TakeRowsRequest(("mdata-load", "job", "chat", 0, 256), (0, 5)),
                           m.TakeRowsRequest(("mdata-load", "job", "code", 1, 64), ()))),
    m.TakeRowsManyReply((m.TakeRowsReply(m.Status.MISSING, key=("mdata-load", "job", "chat", 0, 256)),)),
    m.GetBatchRequest(key=("mdata-construct", "job", 3, 1), cp_rank=1, receives_tokens=True,
                      receives_labels=False),
    m.GetBatchRequest(key=("mdata-construct", "job", 1, 3, 4), cp_rank=None, receives_tokens=True,
                      receives_labels=True, dp_rank=5),
    m.GetBatchReply(m.Status.MISSING, key=("mdata-construct", "job", 3, 1)),
    m.StorageWaitsRequest(),
    m.StorageWaitsReply((STORAGE_WAIT,)),
    m.StorageWaitsReply(()),
    WAITING_STATUS,
    m.SetRoleRequest(role="loader", resources={"pool_chat": 2.0}, drop=("standby_chat",)),
    m.SetRoleReply(resources={"pool_chat": 2.0, "standby_chat": 0.0}),
    m.StatusRequest("pretrain", max_steps=0),
    m.JobStorageWaitsRequest("pretrain"),
    m.JobStorageWaitsReply({"web": WAITING_STATUS.storage_waits["web"]}),
    m.JobStorageWaitsReply({}),
    m.ScalerReportRequest(m.ScalerStatus(
        running=True, errors=2, last_error="OSError: scheduler gone", last_run=1e9,
        workers={"text": 1, "images": 3},
        applied=(m.PoolDecision("images", 3, "2.6 busy threads / 1 per worker", 2.6, 1, 1, "up",
                                1e9, ("wallpapers",)),))),
    m.StatusReply(**{**STATUS.__dict__, "autoscaler": m.ScalerStatus(running=True, errors=1)}),
    m.StatusReply(**{**STATUS.__dict__, "recoveries": {"chunks_reloaded": 3, "batches_rebuilt": 1,
                                                       "storage_outages": 0}}),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda x: type(x).__name__)
def test_every_message_survives_to_msg_and_msgpack(message):
    msg = message.to_msg()
    assert type(message).from_msg(msg) == message
    assert type(message).from_msg(through_msgpack(msg)) == message
    # what comes back writes the same message data again
    assert through_msgpack(type(message).from_msg(through_msgpack(msg)).to_msg()) == through_msgpack(msg)


def test_the_catalogue_names_every_handler_once_with_its_reply():
    assert set(m.CATALOGUE) == set(m.Handler)
    assert {h.value for h in m.Handler} == {
        "mdata_register_job", "mdata_batch_location", "mdata_host_location", "mdata_consumed", "mdata_ack", "mdata_report_metrics",
        "mdata_checkpoint", "mdata_story", "mdata_lineage", "mdata_status", "mdata_job_storage_waits", "mdata_jobs",
        "mdata_job_info", "mdata_who_has", "mdata_close_job", "mdata_take_rows",
        "mdata_take_rows_many", "mdata_get_batch",
        "mdata_attach", "mdata_detach", "mdata_storage_waits", "mdata_set_role",
        "mdata_scaler_report",
    }
    for handler, request in m.CATALOGUE.items():
        assert request.handler is handler and issubclass(request.reply, m.Message)
    assert m.BatchLocationRequest.reply is m.BatchLocationReply
    assert m.StatusRequest.reply is m.StatusReply and m.AckRequest.reply is m.OkReply


def test_a_host_reply_carries_the_steps_checkpoint_once():
    """Every rank of a process gets the same checkpoint: it travels once, and each rank's answer
    reads it back whole."""
    ok = m.BatchLocationReply(m.Status.OK, location())
    reply = m.HostLocationReply((ok, m.BatchLocationReply(m.Status.TIMEOUT), ok))
    raw = reply.to_msg()
    assert raw["checkpoint"] == checkpoint().to_dict()
    assert ["checkpoint" in answer for answer in raw["answers"]] == [False, False, False]
    back = m.HostLocationReply.from_msg(through_msgpack(raw))
    assert [a.status for a in back.answers] == [m.Status.OK, m.Status.TIMEOUT, m.Status.OK]
    assert back.answers[2].location.checkpoint == checkpoint().to_dict()


def test_consumption_told_by_a_loader_that_predates_waits_still_reads():
    """Loaders older than the per-step ``waits`` send none: the scheduler reads their tells with
    no waits; a new Loader sends ``waits`` only beside steps, one per step, and a mismatch says so."""
    old_tell = {"rank": 3, "steps": [4, 5], "token": "t0k", "generation": 1, "stalled_s": 0.25}
    assert m.ConsumedTell.from_msg(through_msgpack(old_tell)).waits == ()
    old_ask = {"rank": 4, "token": "t1k", "generation": 1, "delivered": 4, "consumed": [3, 4],
               "stalled_s": 0.5}
    assert m.LocationAsk.from_msg(through_msgpack(old_ask)) == m.LocationAsk(
        rank=4, token="t1k", generation=1, delivered=4, consumed=(3, 4), stalled_s=0.5)
    old_request = {"job": "j", "rank": 3, "step": 7, "timeout": 2.0, "token": "", "generation": 0,
                   "delivered": None, "consumed": [5], "stalled_s": 1.5}
    assert m.BatchLocationRequest.from_msg(old_request).waits == ()
    # a tell without waits writes the message an old scheduler reads (no new field)
    assert "waits" not in m.ConsumedTell(rank=3, steps=(4,), stalled_s=0.1).to_msg()
    assert "waits" not in m.LocationAsk(rank=3, consumed=(4,), stalled_s=0.1).to_msg()
    with pytest.raises(MessageError, match=r"ConsumedTell.*'waits' has 1 values for the 2 steps"):
        m.ConsumedTell.from_msg({**old_tell, "waits": [0.5]})
    with pytest.raises(MessageError, match=r"LocationAsk.*'waits' has 2 values for the 1 steps"):
        m.LocationAsk.from_msg({**old_ask, "consumed": [3], "waits": [0.1, 0.2]})


def test_a_push_gives_each_rank_the_location_a_location_request_would_have():
    """A pushed group carries each subscribed rank's slice; the step's checkpoint travels once
    and every rank's location reads it back whole."""
    key = ("mdata-construct", "pretrain", 1, 5, 1)
    push = m.LocationPush(job="pretrain", generation=1, groups=(
        m.PushedGroup(5, 1, key, ("tcp://10.0.0.1:4000",), ((2, 0, True, True), (3, 1, False, False))),),
        checkpoints={5: checkpoint().to_dict()})
    back = m.LocationPush.from_msg(through_msgpack(push.to_msg()))
    got = list(back.locations())
    assert [(step, rank) for step, rank, _ in got] == [(5, 2), (5, 3)]
    # the group's DP rank within its part (a construct task builds several groups' batches)
    assert got[1][2] == m.BatchLocation(key, ("tcp://10.0.0.1:4000",), 1, False, False,
                                        checkpoint().to_dict(), dp_rank=1)
    assert got[0][2].checkpoint is got[1][2].checkpoint  # read once for the step


@pytest.mark.parametrize("change, field", [
    (lambda msg: {**msg, "checkpoints": []}, "checkpoints"),  # a group's step without one
    (lambda msg: {**msg, "groups": [{**msg["groups"][0], "ranks": [[2, 0, True]]}]}, "ranks"),
    (lambda msg: {**msg, "checkpoints": [[5, {"step": "four"}]]}, "checkpoints"),
    (lambda msg: {**msg, "extra": 1}, "extra"),
])
def test_a_malformed_push_names_its_field(change, field):
    push = m.LocationPush(job="pretrain", generation=1, groups=(
        m.PushedGroup(5, 1, ("mdata-construct", "pretrain", 1, 5, 1), ("tcp://10.0.0.1:4000",),
                      ((2, 0, True, True),)),), checkpoints={5: checkpoint().to_dict()})
    with pytest.raises(MessageError, match=field):
        m.LocationPush.from_msg(change(push.to_msg()))


def test_a_consumed_tell_has_one_wait_per_step_or_none():
    msg = m.ConsumedTell(rank=3, steps=(4, 5), token="t0k", waited=(0.5, -1.0)).to_msg()
    with pytest.raises(MessageError, match="waited"):
        m.ConsumedTell.from_msg({**msg, "waited": [0.5]})


@pytest.mark.parametrize("steps, waits, pattern", [
    ([4, True], [0.1, 0.2], r"'steps\[1\]' must be an integer, got bool"),
    ([4, 5.0], [0.1, 0.2], r"'steps\[1\]' must be an integer, got float"),
    ([4, 5], [0.1, "late"], r"'waits\[1\]' must be a number, got str"),
])
def test_a_list_read_whole_still_names_its_bad_item(steps, waits, pattern):
    # plain int and float lists are taken without a check per item; one odd item falls back to them
    msg = {**m.ConsumedTell(rank=3, steps=(4, 5), token="t0k").to_msg(), "steps": steps, "waits": waits}
    with pytest.raises(MessageError, match=pattern):
        m.ConsumedTell.from_msg(msg)
    ok = m.ConsumedTell.from_msg({**msg, "steps": [4, np.int64(5)], "waits": [0.1, 2]})
    assert ok.steps == (4, 5) and ok.waits == (0.1, 2.0) and type(ok.waits[1]) is float


def test_a_consumed_reply_carries_each_tells_error_typed():
    from mdata.wire.errors import InvalidRequestError

    reply = m.ConsumedReply((None, InvalidRequestError("mdata_consumed: rank 4: step 5 is not balanced yet")))
    back = m.ConsumedReply.from_msg(through_msgpack(reply.to_msg()))
    assert back.errors[0] is None
    assert type(back.errors[1]) is InvalidRequestError and "rank 4: step 5" in str(back.errors[1])


def test_a_tells_confirmation_carries_each_tells_error_or_the_messages_typed():
    from mdata.wire.errors import InvalidRequestError

    confirmed = m.TellsConfirmed("pretrain", 8, (None, InvalidRequestError("mdata_consumed: rank 4: bad lease")))
    back = m.TellsConfirmed.from_msg(through_msgpack(confirmed.to_msg()))
    errors = back.per_tell(2)
    assert back.seq == 8 and errors[0] is None
    assert type(errors[1]) is InvalidRequestError and "bad lease" in str(errors[1])
    refused = m.TellsConfirmed.from_msg(through_msgpack(
        m.TellsConfirmed("gone", 9, error=InvalidRequestError("no mdata job named 'gone'")).to_msg()))
    assert [type(e) for e in refused.per_tell(3)] == [InvalidRequestError] * 3
    with pytest.raises(MessageError, match="seq"):
        m.StreamedTells.from_msg({"job": "pretrain", "seq": "7", "tells": []})


def test_request_messages_are_the_handlers_keyword_arguments():
    """Handlers are still callable by hand with the same keywords (notebooks, tests)."""
    assert m.StatusRequest("j").to_msg() == {"job": "j"}
    assert m.LineageRequest("j", steps=3).to_msg() == {"job": "j", "steps": 3}
    assert m.CheckpointRequest.from_msg({"job": "j", "step": 2}) == m.CheckpointRequest("j", step=2)
    assert m.StatusReply.from_msg(STATUS.to_msg()).counters.consumed_step == 4


def test_replies_keep_the_shapes_the_handlers_always_answered_with():
    status = STATUS.to_msg()
    assert status["counters"]["skipped"] == {"chat": 1, "code": 0}
    assert status["pool_targets"]["chat"]["reason"] == "demand 1.2"
    assert m.JobsReply(("a",)).to_msg() == ["a"]
    story = m.StoryReply.from_msg(through_msgpack(STORY.to_msg()))
    assert story.occurrences[0].events[1]["ranks"] == [0, 1]  # lists again, not msgpack's tuples
    ok = m.BatchLocationReply(m.Status.OK, location()).to_msg()
    assert ok["status"] == "OK" and ok["key"] == ["mdata-construct", "job", 3, 1]
    assert ok["checkpoint"] == checkpoint().to_dict()
    assert m.CheckpointReply(checkpoint()).to_msg() == checkpoint().to_dict()


def test_construct_spec_has_every_field_required_and_survives_the_task_pickle():
    spec = m.ConstructSpec(
        step=3, dp_rank=1,
        chunks=(m.ChunkPull(("mdata-load", "job", "chat", 0, 0), (0, 2), ("tcp://a:1",)),
                m.ChunkPull(("mdata-load", "job", "code", 1, 256), (1,), ())),
        micro_batch=np.array([0, 0, 1], np.int32), position=np.array([0, 1, 0], np.int32),
        lengths=np.array([10, 20, 30], np.int32),
        sample_ids=np.array([[0, 0, 0], [0, 0, 2], [1, 1, 257]], np.int64),
        num_micro_batches=2, max_tokens=64, cp=1, pad_id=0, image_token_id=None, wait_s=120.0,
    )
    assert m.ConstructSpec.from_msg(spec.to_msg()) == spec
    again = m.ConstructSpec.from_msg(pickle.loads(pickle.dumps(spec.to_msg())))
    assert again == spec and again.sample_ids.dtype == np.int64
    assert again != m.ConstructSpec.from_msg({**spec.to_msg(), "wait_s": 5.0})
    for field in ("wait_s", "pad_id", "image_token_id", "cp", "max_tokens"):
        msg = spec.to_msg()
        del msg[field]
        with pytest.raises(MessageError, match=rf"ConstructSpec.*{field!r} is missing"):
            m.ConstructSpec.from_msg(msg)
    with pytest.raises(TypeError):
        m.ConstructSpec(step=3, dp_rank=1, chunks=())  # no defaults to fall back on
    short = {**spec.to_msg(), "lengths": np.array([10, 20], np.int32)}
    with pytest.raises(MessageError, match=r"ConstructSpec.*'lengths' has shape \(2,\), but the chunks hold 3 rows"):
        m.ConstructSpec.from_msg(short)
    floats = {**spec.to_msg(), "position": np.array([0.0, 1.0, 0.0])}
    with pytest.raises(MessageError, match=r"'position' must be a 1-d integer array, got float64"):
        m.ConstructSpec.from_msg(floats)


@pytest.mark.parametrize("cls, msg, pattern", [
    (m.BatchLocationRequest, {"job": "j", "rank": "3", "step": 1, "timeout": 1.0},
     r"malformed BatchLocationRequest message: field 'rank' must be an integer, got str"),
    (m.BatchLocationRequest, {"job": "j", "rank": 3, "step": 1},
     r"BatchLocationRequest message: field 'timeout' is missing"),
    (m.StatusRequest, {"job": "j", "jb": "x"}, r"StatusRequest message: field 'jb' is not a field"),
    (m.AckRequest, {"job": "j", "rank": True, "step": 1}, r"AckRequest.*'rank' must be an integer, got bool"),
    (m.ReportMetricsRequest, {"job": "j", "rank": 0, "step": 1, "metrics": {"loss": "high"}},
     r"ReportMetricsRequest.*'metrics\[loss\]' must be a number"),
    (m.RegisterJobRequest, {"job": "j", "plan": "not a spec", "checkpoint": None},
     r"RegisterJobRequest.*'plan' must be a dict"),
    (m.RegisterJobRequest, {"job": "j", "plan": pickle.dumps({"a": 1}), "checkpoint": None},
     r"RegisterJobRequest.*'plan' is bytes \(a pickled Plan\?\): mdata never unpickles"),
    (m.BatchLocationReply, {"status": "done"}, r"BatchLocationReply.*'status' must be one of \['OK'"),
    (m.BatchLocationReply, {"status": "failed"}, r"BatchLocationReply.*'reason' is missing"),
    (m.BatchLocationReply, {**location().to_msg(), "status": "OK", "checkpoint": {"version": 99}},
     r"BatchLocationReply.*'checkpoint' is not a checkpoint: checkpoint format version 99"),
    (m.WhoHasRequest, {"keys": [[]]}, r"WhoHasRequest.*'keys\[0\]' must be a task key"),
    (m.TakeRowsReply, {"status": "OK", "chunk": b"rows"}, r"TakeRowsReply.*'chunk' must be a SampleChunk"),
    (m.GetBatchReply, {"status": "timeout"}, r"GetBatchReply.*'status' must be OK or missing"),
    (m.JobInfo, {**INFO.to_msg(), "mesh": {"dp": 2}}, r"MeshShape message: field 'pp' is missing"),
    (m.JobsReply, None, r"JobsReply.*'jobs' must be a list, got NoneType"),
    (m.StatusRequest, None, r"malformed StatusRequest message: expected a dict of fields, got NoneType"),
    (m.LineageReply, {"samples": {"0": {"0": [[1, 2]]}}, "forgotten_before": 0,
                      "exactly_once": LINEAGE.exactly_once.to_msg()},
     r"LineageReply.*'samples\[0\]\[0\]' must be a list of \[source_index, shard, row\]"),
])
def test_bad_fields_fail_with_the_message_and_the_field_named(cls, msg, pattern):
    with pytest.raises(MessageError, match=pattern) as info:
        cls.from_msg(msg)
    assert isinstance(info.value, MdataError)
    assert "same mdata version" in str(info.value)


def test_worker_replies_carry_chunks_and_batches_through_distributeds_protocol():
    chunk = SampleChunk.from_samples("chat", 0, [3, 4], [[1, 2, 3], [4, 5]])
    reply = m.TakeRowsReply(m.Status.OK, ("mdata-load", "job", "chat", 0, 0), chunk)
    got = m.TakeRowsReply.from_msg(loads(dumps(reply.to_msg())))
    assert got.status is m.Status.OK and isinstance(got.chunk, SampleChunk)
    assert got.chunk.rows.tolist() == [3, 4] and got.chunk.tokens(1).tolist() == [4, 5]
    many = m.TakeRowsManyReply((reply, m.TakeRowsReply(m.Status.MISSING, ("mdata-load", "j", "x", 1, 0))))
    got_many = m.TakeRowsManyReply.from_msg(loads(dumps(many.to_msg())))
    assert [r.status for r in got_many.replies] == [m.Status.OK, m.Status.MISSING]
    assert got_many.replies[0].chunk.tokens(0).tolist() == [1, 2, 3]

    dp_batch = build_dp_batch(2, 0, [chunk], [0, 0], [0, 1], [3, 2], [[0, 0, 3], [0, 0, 4]], 1,
                              max_tokens=16, cp=1)
    batch = dp_batch.for_rank(0, receives_tokens=True, receives_labels=False)
    got = m.GetBatchReply.from_msg(loads(dumps(m.GetBatchReply(m.Status.OK, (), batch).to_msg())))
    assert isinstance(got.batch, Batch) and got.batch.step == 2 and not got.batch.receives_labels
    assert np.array_equal(got.batch.sample_ids, batch.sample_ids)


def test_source_errors_travel_as_their_class_with_their_fields():
    exc = corrupt_shard()
    exc.add_note("seen on worker tcp://10.0.0.3:1")
    back = error_from_msg(through_msgpack(error_to_msg(exc)))
    assert type(back) is CorruptShardError
    assert (back.source, back.shard, back.row, back.hint) == (exc.source, exc.shard, exc.row, exc.hint)
    assert str(back) == str(exc)
    assert back.__notes__ == ["seen on worker tcp://10.0.0.3:1"]
    plain = error_from_msg(through_msgpack(error_to_msg(BatchError("step 0, dp rank 0: no image_token_id"))))
    assert type(plain) is BatchError and str(plain) == "step 0, dp rank 0: no image_token_id"
    with pytest.raises(TypeError, match="MdataError subclasses, not KeyError"):
        error_to_msg(KeyError("x"))


def test_an_error_class_unknown_here_arrives_as_its_nearest_known_base():
    msg = error_to_msg(corrupt_shard())
    msg.update(type="ParquetPageError", module="some.worker.plugin",
               bases=["ParquetPageError", "CorruptShardError", "SourceError", "MdataError"])
    back = error_from_msg(msg)
    assert type(back) is CorruptShardError and back.row == 17
    assert "raised as some.worker.plugin.ParquetPageError" in back.__notes__
    msg.update(bases=["ParquetPageError", "MdataError"])
    assert type(error_from_msg(msg)) is MdataError
    with pytest.raises(MessageError, match=r"malformed error message: field 'type' must be a str"):
        error_from_msg({"message": "x"})


def test_a_failed_batch_location_raises_the_error_that_failed_the_job():
    reply = m.BatchLocationReply(m.Status.FAILED, reason="loading source 'code', shard 1 failed",
                                 error=corrupt_shard())
    got = m.BatchLocationReply.from_msg(through_msgpack(reply.to_msg()))
    err = got.failure("rank 0, step 3")
    assert isinstance(err, CorruptShardError) and isinstance(err, SourceError)
    assert (err.source, err.shard, err.row) == ("code", "/data/code/part-00001.jsonl", 17)
    assert err.__notes__ == ["rank 0, step 3: loading source 'code', shard 1 failed"]
    untyped = m.BatchLocationReply.from_msg(through_msgpack(
        m.BatchLocationReply(m.Status.FAILED, reason="planner error: KeyError(3)").to_msg()))
    err = untyped.failure("rank 0, step 3")
    assert type(err) is TrainerError and str(err) == "rank 0, step 3: planner error: KeyError(3)"
    with pytest.raises(MessageError, match="'location' is required with status OK"):
        m.BatchLocationReply(m.Status.OK)


def test_serve_and_ask_speak_through_a_real_dask_server():
    """A handler registered with serve() answers ask() over TCP and rejects bad keywords; a peer
    without the handler is a NoHandlerError (the caller asks someone else)."""
    from distributed.core import Server, rpc

    seen = []

    def status(req: m.StatusRequest) -> m.StatusReply:
        seen.append(req)
        return STATUS

    async def wrong(req: m.AckRequest) -> m.StatusReply:
        return STATUS

    async def main():
        server = Server({m.Handler.STATUS.value: m.serve(m.StatusRequest, status),
                         m.Handler.ACK.value: m.serve(m.AckRequest, wrong)})
        await server.listen("tcp://127.0.0.1:0")
        try:
            async with rpc(server.address) as remote:
                reply = await m.ask(remote, m.StatusRequest("pretrain"))
                plain = await remote.mdata_status(job="pretrain")  # a notebook's call by hand
                with pytest.raises(MessageError, match="StatusRequest message: field 'job' must be a string"):
                    await remote.mdata_status(job=3)
                with pytest.raises(TypeError, match="answered StatusReply to AckRequest, not OkReply"):
                    await m.ask(remote, m.AckRequest("pretrain", 0, 0))
                with pytest.raises(m.NoHandlerError, match="has no mdata_jobs handler"):
                    await m.ask(remote, m.JobsRequest())  # as from a worker shutting down
        finally:
            await server.close()
        return reply, plain

    reply, plain = asyncio.run(main())
    assert reply == STATUS and seen == [m.StatusRequest("pretrain")] * 2
    assert plain["counters"]["consumed_step"] == 4


def test_resume_options_are_false_when_a_sender_leaves_them_out():
    register = m.RegisterJobRequest(job="j", plan=PLAN_SPEC).to_msg()
    attach = m.AttachRequest(job="j", rank=0, client="c", token="t", host="h", pid=1).to_msg()
    for msg in (register, attach):
        del msg["accept_appended_shards"], msg["allow_mixture_change"]
    assert m.RegisterJobRequest.from_msg(register) == m.RegisterJobRequest(job="j", plan=PLAN_SPEC)
    assert not m.AttachRequest.from_msg(attach).allow_mixture_change
    with pytest.raises(MessageError, match=r"'allow_mixture_change' must be true or false"):
        m.AttachRequest.from_msg({**attach, "allow_mixture_change": "yes"})


def test_a_packed_checkpoint_travels_as_its_bytes_and_reads_back_as_the_plain_one():
    """The scheduler packs a step's checkpoint once (mdata.wire.packed_checkpoint): a push, a
    host reply and a single location carry the bytes, copied as they are by Dask's encoder,
    and each reads back exactly what the same message with the plain dict gives."""
    from distributed.protocol import dumps, loads

    from mdata.wire.packed_checkpoint import PackedCheckpoint

    plain = checkpoint().to_dict()
    packed = PackedCheckpoint(plain)
    assert packed == plain and isinstance(packed.packed, bytes)

    def both(make):
        """The message read back after Dask's own encoding, with the packed and plain dict."""
        return [type(m).from_msg(loads(dumps(m.to_msg()))) for m in (make(packed), make(plain))]

    push = lambda c: m.LocationPush(job="pretrain", generation=1, groups=(  # noqa: E731
        m.PushedGroup(5, 1, ("mdata-construct", "pretrain", 1, 5, 1), ("tcp://10.0.0.1:4000",),
                      ((2, 0, True, True),)),), checkpoints={5: c})
    got, want = both(push)
    assert got == want and got.checkpoints[5] == plain
    assert push(packed).to_msg()["checkpoints"][0][1] is packed.packed  # packed once, not per message

    located = lambda c: m.BatchLocation(key=("mdata-construct", "job", 3, 1),  # noqa: E731
                                        who_has=("tcp://10.0.0.1:4000",), cp_rank=1,
                                        receives_tokens=True, receives_labels=False,
                                        checkpoint=c, dp_rank=2)
    host = lambda c: m.HostLocationReply((m.BatchLocationReply(m.Status.OK, located(c)),  # noqa: E731
                                          m.BatchLocationReply(m.Status.TIMEOUT)))
    got, want = both(host)
    assert got == want and got.answers[0].location.checkpoint == plain
    single = lambda c: m.BatchLocationReply(m.Status.OK, located(c))  # noqa: E731
    got, want = both(single)
    assert got == want


def test_undecodable_packed_checkpoint_bytes_are_a_message_error_naming_the_field():
    raw = m.LocationPush(job="pretrain", generation=1, groups=(), checkpoints={}).to_msg()
    raw["checkpoints"] = [[5, b"\xc1 not msgpack"]]
    with pytest.raises(MessageError, match="checkpoints"):
        m.LocationPush.from_msg(raw)


@pytest.mark.parametrize("msg", [
    {"rank": 3, "steps": (4, 5), "token": "t", "generation": 1, "stalled_s": 0.5},
    {"rank": 3, "steps": [4], "token": "t", "generation": 1, "stalled_s": 0.5, "waits": [0.1], "waited": [0.2]},
    {"rank": 3, "steps": (4,)},  # defaults
    {"rank": 3, "steps": (4,), "stalled_s": 1},  # an int where a number goes: read as a float
    {"rank": 3, "steps": (4,), "waits": (1,)},
    {"rank": np.int64(3), "steps": (4,)},
], ids=["plain", "lists", "defaults", "int stall", "int wait", "numpy rank"])
def test_a_tell_taken_as_it_is_reads_what_the_checked_reading_reads(msg):
    """Tells of plain types skip the field-by-field checks (thousands a step at scale); the
    result is the checked reading's, and anything else is read by it."""
    assert m.ConsumedTell.from_msg(msg) == m.ConsumedTell._read(msg)


@pytest.mark.parametrize("msg, match", [
    ({"rank": True, "steps": (4,)}, "field 'rank' must be an integer"),
    ({"rank": 3, "steps": (4,), "extra": 1}, "'extra' is not a field"),
    ({"rank": 3, "steps": (4, 5), "waited": (0.1,)}, "'waited' has 1 entries for 2 steps"),
    ({"rank": 3, "steps": ("4",)}, r"steps\[0\]' must be an integer"),
    ({"steps": (4,)}, "'rank' is missing"),
])
def test_a_bad_tell_still_gets_the_checked_readings_error(msg, match):
    with pytest.raises(MessageError, match=match):
        m.ConsumedTell.from_msg(msg)
    with pytest.raises(MessageError, match=match):
        m.ConsumedRequest.from_msg({"job": "j", "tells": [msg]})


def test_a_packed_checkpoint_sends_its_per_source_maps_as_lists_aligned_with_its_sources():
    """The names travel once (in ``sources``), not again as the keys of every per-source map;
    a checkpoint whose maps do not follow ``sources`` is packed as it is."""
    import msgpack as mp

    from mdata.wire.packed_checkpoint import ALIGNED, PackedCheckpoint, unpacked

    names = [f"source-{i:05d}" for i in range(2000)]
    plain = Checkpoint(fingerprint="f00d", step=4, sources=tuple(names),
                       cursors={n: i for i, n in enumerate(names)}, epochs=dict.fromkeys(names, 0),
                       apportioner={"carry": [0.5] * len(names)}, seed=7).to_dict()
    packed = PackedCheckpoint(plain)
    assert mp.unpackb(packed.packed, raw=False)[0] == ALIGNED
    assert len(packed.packed) < 0.7 * len(mp.packb(plain, use_bin_type=True))
    assert unpacked(packed.packed) == through_msgpack(plain)
    assert list(unpacked(packed.packed)["cursors"]) == names  # the maps' order kept

    shuffled = {**plain, "epochs": dict(reversed(list(plain["epochs"].items())))}
    assert isinstance(mp.unpackb(PackedCheckpoint(shuffled).packed, raw=False), dict)
    assert unpacked(PackedCheckpoint(shuffled).packed) == through_msgpack(shuffled)
    short = mp.packb([ALIGNED, {**plain, "cursors": [1, 2]}], use_bin_type=True)
    with pytest.raises(MessageError, match="checkpoint"):
        m.LocationPush.from_msg({"job": "j", "generation": 1, "groups": [], "checkpoints": [[4, short]]})


def test_small_construct_arrays_travel_inline_with_their_dtype_and_large_ones_as_arrays():
    """A construct task carries a spec per DP group: small arrays go inside the message (no
    buffer of their own per array when pickled), read back with the same dtype and shape."""
    from distributed.protocol import deserialize, serialize

    from mdata.wire.codec import INLINE_ITEMS

    def spec(n: int) -> m.ConstructSpec:
        return m.ConstructSpec(
            step=5, dp_rank=3, chunks=(m.ChunkPull(("mdata-load", "job", "chat", 0, 256),
                                                   tuple(range(n)), ("tcp://10.0.0.1:1",)),),
            micro_batch=np.zeros(n, np.int32), position=np.arange(n, dtype=np.int32),
            lengths=np.full(n, 7, np.int64), sample_ids=np.arange(3 * n, dtype=np.int64).reshape(n, 3),
            num_micro_batches=1, max_tokens=64, cp=1, pad_id=0, image_token_id=None, wait_s=1.0)

    for n, inline in ((0, True), (2, True), (INLINE_ITEMS // 3, True), (200, False)):
        sent = spec(n)
        msg = sent.to_msg()
        assert isinstance(msg["lengths"], np.ndarray) != inline, n
        header, frames = serialize([msg], serializers=("pickle",))
        if inline:
            assert len(frames) == 1  # no buffer per array
        back = m.ConstructSpec.from_msg(deserialize(header, frames)[0])
        for name in ("micro_batch", "position", "lengths", "sample_ids"):
            want, got = getattr(sent, name), getattr(back, name)
            assert got.tolist() == want.tolist() and got.shape == want.shape, (n, name)
            assert n == 0 or got.dtype == want.dtype, (n, name)


@pytest.mark.parametrize("value, match", [
    (["f8", [1.5]], "integer dtype"), (["nope", [1]], "not a numpy dtype"), (["i4", 3], "integer dtype")])
def test_a_bad_inline_array_names_its_field(value, match):
    from mdata.wire.codec import Reader, int_array

    with pytest.raises(MessageError, match=f"lengths.*{match}"):
        int_array(value, Reader("ConstructSpec", {}), "lengths", ndim=1)


def _group_specs() -> list:
    settings = dict(num_micro_batches=2, max_tokens=64, cp=1, pad_id=0, image_token_id=None, wait_s=9.0)
    return [
        m.ConstructSpec(
            step=4, dp_rank=6,
            chunks=(m.ChunkPull(("mdata-load", "job", "chat", 0, 0), (0, 2), ("tcp://a:1",)),
                    m.ChunkPull(("mdata-load", "job", "code", 1, 256), (1,), ())),
            micro_batch=np.array([0, 0, 1], np.int32), position=np.array([0, 1, 0], np.int32),
            lengths=np.array([10, 20, 30], np.int32),
            sample_ids=np.array([[0, 0, 0], [0, 0, 2], [1, 1, 257]], np.int64), **settings),
        m.ConstructSpec(  # a group with no sample keeps its place
            step=4, dp_rank=7, chunks=(), micro_batch=np.zeros(0, np.int32),
            position=np.zeros(0, np.int32), lengths=np.zeros(0, np.int32),
            sample_ids=np.zeros((0, 3), np.int64), **settings),
        m.ConstructSpec(
            step=4, dp_rank=8,
            chunks=(m.ChunkPull(("mdata-load", "job", "chat", 0, 0), (5,), ("tcp://a:1", "tcp://b:2")),),
            micro_batch=np.array([1], np.int32), position=np.array([0], np.int32),
            lengths=np.array([7], np.int32), sample_ids=np.array([[0, 0, 5]], np.int64), **settings),
    ]


def test_a_construct_part_carries_its_groups_in_columns_and_reads_back_their_specs():
    """A construct task's argument is a part of a step (several DP groups) in one set of
    columns; read back, it gives every group's spec as a spec of its own would."""
    from distributed.protocol import deserialize, serialize

    specs = _group_specs()
    part = m.ConstructPart.of(specs)
    assert len(part) == 3 and part.dp_ranks == (6, 7, 8) and part.pull_sizes.tolist() == [2, 1, 1]
    header, frames = serialize(part.to_msg(), serializers=("pickle",))
    back = m.ConstructPart.from_msg(deserialize(header, frames))
    assert back == part and back.specs() == specs
    assert m.ConstructPart.from_msg(part.to_msg()).specs()[2].chunks[0].who_has == ("tcp://a:1", "tcp://b:2")
    with pytest.raises(ValueError, match="at least one group"):
        m.ConstructPart.of([])


@pytest.mark.parametrize("change, match", [
    ({"sample_bounds": np.array([0, 3, 2, 4])}, "'sample_bounds' must rise from 0 to 4"),
    ({"pull_bounds": np.array([0, 2, 2])}, "'pull_bounds' must rise from 0 to 3 in 4 steps"),
    ({"pull_sizes": np.array([1, 1, 2])}, "each group's pulls must hold as many rows as it has samples"),
    ({"pull_sizes": np.array([2, 1])}, "'pull_sizes' must give each of 3 pulls its rows"),
    ({"lengths": np.array([1, 2, 3])}, r"'lengths' has shape \(3,\), but the pulls hold 4 rows"),
    ({"dp_ranks": []}, "'dp_ranks' must name at least one group"),
])
def test_a_construct_part_whose_columns_disagree_names_the_field(change, match):
    msg = {**m.ConstructPart.of(_group_specs()).to_msg(), **change}
    with pytest.raises(MessageError, match=f"ConstructPart.*{match}"):
        m.ConstructPart.from_msg(msg)
