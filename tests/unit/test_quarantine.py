"""on_corrupt="skip" in the pure Planner: a chunk whose load fails with CorruptShardError is
passed over, the next rows of the source's order take its rows' places, steps keep their size,
and a resume from any checkpoint (before or after the quarantine) takes the same samples."""

from __future__ import annotations

from collections import Counter, deque

import numpy as np
import pytest

from mdata.errors import CorruptShardError, StorageUnavailableError
from mdata.mesh import ClientPlaceTree
from mdata.metadata import SourceMetadata
from mdata.plan import Plan
from mdata.planner import (
    BatchConsumed, ChunkFailed, ChunkLoaded, ConstructStep, JobFailed, LoadChunk, PlannerState,
    StepReady, Tick,
)

SHARDS, ROWS, CHUNK, BATCH = 3, 12, 4, 4


class Src:
    """A source as the plan sees it: name, rows per chunk, and the corrupt-shard policy."""

    def __init__(self, name: str, on_corrupt: str) -> None:
        self.name, self.chunk_rows, self.on_corrupt = name, CHUNK, on_corrupt


def plan_of(*sources: Src) -> Plan:
    return (Plan(list(sources)).mix({s.name: 1 for s in sources})
            .balance(micro_batches=1, max_tokens=1000, global_batch=BATCH)
            .distribute(ClientPlaceTree(dp=2)).window(2).shuffle(2).seed(7))


def metadata(name: str) -> SourceMetadata:
    return SourceMetadata.from_arrays(name, [np.full(ROWS, 10 + k, np.int32) for k in range(SHARDS)])


def run(state: PlannerState, meta: dict, corrupt: set, until: int, error=None) -> dict[int, list]:
    """Play loaders (a chunk of a ``corrupt`` (source, shard) fails) and trainers consuming each
    step at once, until ``until`` steps are consumed; the sample ids delivered per step."""
    names = state.names
    queue = deque(state.handle(Tick(stimulus_id="start")))
    delivered: dict[int, list] = {}
    while state.consumed_step < until:
        assert queue, "planner stalled"
        ins = queue.popleft()
        if isinstance(ins, LoadChunk):
            ref = ins.chunk
            if (ref.source, ref.shard) in corrupt:
                exc = error or CorruptShardError("line is not valid JSON", source=ref.source,
                                                 shard=f"part-{ref.shard}.jsonl", row=ref.start)
                queue.extend(state.handle(ChunkFailed(ref, exc, stimulus_id=f"fail-{ref.key}")))
                continue
            rows, tok, pat, bad = meta[ref.source].rows_of(ref.shard, ref.start, ref.stop)
            queue.extend(state.handle(ChunkLoaded(ref, rows, tok, pat, bad.tolist(), "w",
                                                  stimulus_id=f"load-{ref.key}")))
        elif isinstance(ins, ConstructStep):
            delivered.setdefault(ins.step, []).extend(
                sample for group in ins.groups() for sample in group.ids(names))
        elif isinstance(ins, StepReady):
            queue.extend(state.handle(*(BatchConsumed(ins.step, r, stimulus_id=f"c-{ins.step}-{r}")
                                        for r in range(state.mesh.world_size))))
        elif isinstance(ins, JobFailed):
            raise ins.error or AssertionError(ins.reason)
    return {s: sorted(v) for s, v in delivered.items() if s < until}


def test_skip_delivers_every_other_row_once_in_full_steps_and_records_the_shard():
    plan = plan_of(Src("a", "skip"))
    state = PlannerState(plan, {"a": [ROWS] * SHARDS}, job="j")
    steps = (SHARDS - 1) * ROWS // BATCH  # one epoch of the readable shards
    got = run(state, {"a": metadata("a")}, {("a", 1)}, steps)
    assert all(len(v) == BATCH for v in got.values()) and sorted(got) == list(range(steps))
    taken = [x for v in got.values() for x in v]
    assert Counter(taken).most_common(1)[0][1] == 1  # nothing twice
    assert sorted(taken) == [("a", k, r) for k in (0, 2) for r in range(ROWS)]
    quarantined = state.quarantine.by_source()["a"]
    starts = [q["rows"][0] for q in quarantined]  # chunks of shard 1 the walk reached, each once
    assert starts and len(set(starts)) == len(starts) and set(starts) <= set(range(0, ROWS, CHUNK))
    assert all(q["shard"] == 1 and q["path"] == "part-1.jsonl" for q in quarantined)
    assert all(q["reason"].startswith("CorruptShardError (row ") and "not valid JSON" in q["reason"]
               for q in quarantined)
    assert 0 < int(state.skipped[0]) <= ROWS  # its rows were passed over, counted like skips


def test_a_resume_from_any_checkpoint_takes_the_samples_of_the_uninterrupted_run():
    plan = plan_of(Src("a", "skip"), Src("b", "fail"))
    listings = {"a": [ROWS] * SHARDS, "b": [ROWS] * SHARDS}
    meta = {"a": metadata("a"), "b": metadata("b")}
    steps = 12  # past the end of the first epoch of "a": its later epochs skip shard 1 again
    reference = run(PlannerState(plan, listings, job="j"), meta, {("a", 1)}, steps)
    assert not any(shard == 1 for v in reference.values() for name, shard, _ in v if name == "a")
    for k in range(1, steps):
        before = PlannerState(plan, listings, job="j")
        run(before, meta, {("a", 1)}, k)
        resumed = PlannerState.from_checkpoint(plan, listings, before.checkpoint(k), job="j")
        got = run(resumed, meta, {("a", 1)}, steps)
        assert {s: got[s] for s in range(k, steps)} == {s: reference[s] for s in range(k, steps)}, k


@pytest.mark.parametrize("policy, error", [
    ("fail", CorruptShardError("bad footer", source="a", shard="part-1.parquet")),
    ("skip", StorageUnavailableError("gave up after 300 s", source="a", shard="part-1.parquet")),
])
def test_the_job_fails_under_fail_and_on_errors_that_are_not_corruption(policy, error):
    state = PlannerState(plan_of(Src("a", policy)), {"a": [ROWS] * SHARDS}, job="j")
    with pytest.raises(type(error)) as info:
        run(state, {"a": metadata("a")}, {("a", 1)}, 6, error=error)
    assert info.value is error and state.failed and "shard 1" in state.failed
    assert state.quarantine.by_source() == {}


def test_on_corrupt_round_trips_through_the_plan_spec_and_is_checked():
    import json

    from mdata.errors import InvalidSourceError, PlanError
    from mdata.sources import Source
    from mdata.spec import SourceSpec

    skip = Source("web", "/data/web/*.jsonl", format="jsonl", on_corrupt="skip")
    plan = Plan([skip, Source("chat", "/data/chat/*.parquet")]).mix({"web": 1, "chat": 1})
    spec = json.loads(json.dumps(plan.to_spec()))
    assert [s["on_corrupt"] for s in spec["sources"]] == ["skip", "fail"]
    built = Plan.from_spec(spec)
    assert [s.on_corrupt for s in built.sources] == ["skip", "fail"]
    kept = Plan.from_spec(spec, build_sources=False)  # the scheduler's view: SourceSpec values
    assert [s.on_corrupt for s in kept.sources] == ["skip", "fail"]
    assert skipping_sources(kept) == {"web"}
    assert built.fingerprint() == plan.fingerprint()
    # the policy is not part of the data identity: a job that failed on a corrupt shard under
    # "fail" resumes under "skip" (every step it delivered had no corrupt chunk)
    assert Plan([Source("web", "/data/web/*.jsonl", format="jsonl"),
                 Source("chat", "/data/chat/*.parquet")]).mix({"web": 1, "chat": 1}).fingerprint() \
        == plan.fingerprint()
    with pytest.raises(InvalidSourceError, match=r"on_corrupt must be one of 'fail', 'skip', got 'drop'"):
        Source("web", "/data/web/*.jsonl", on_corrupt="drop")
    with pytest.raises(PlanError, match=r"source 'web': on_corrupt must be one of \['fail', 'skip'\]"):
        SourceSpec.from_dict({**spec["sources"][0], "on_corrupt": "drop"})


def skipping_sources(plan: Plan) -> set[str]:
    from mdata.planner.chunk_table import ChunkTable
    from mdata.planner.quarantine import Quarantine

    return set(Quarantine(plan.sources, ChunkTable([], "j", 1)).skipping)


def test_status_carries_the_quarantined_chunks_and_the_dashboard_line_names_them():
    from mdata.planner.quarantine import describe_quarantine
    from mdata.wire import messages as m

    state = PlannerState(plan_of(Src("a", "skip")), {"a": [ROWS] * SHARDS}, job="j")
    run(state, {"a": metadata("a")}, {("a", 1)}, 6)
    quarantined = state.quarantine.by_source()
    reply = m.StatusReply(job="j", failure=None, uptime_s=1.0, steps={}, pool_targets={},
                          chunks_in_memory=0, batches_in_memory=0, trainer_wait_s={},
                          consumed_steps={}, counters=m.StatusCounters(2, 2, 2, 0, 0, {"a": 0}),
                          quarantined=quarantined)
    back = m.StatusReply.from_msg(reply.to_msg())
    assert [dict(q, rows=list(q["rows"])) for q in back.quarantined["a"]] == quarantined["a"]
    line = describe_quarantine(quarantined["a"])
    n = len(quarantined["a"])
    assert line.startswith(f"{n} chunk(s), {n * CHUNK} rows of 1 shard(s) quarantined since step ")
    assert "part-1.jsonl (CorruptShardError (row " in line
    assert describe_quarantine(()) == ""
