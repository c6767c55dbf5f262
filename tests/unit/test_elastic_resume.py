"""Elastic resume: a checkpoint continues under another mesh, batch shape or mixture.

With the same global batch every resumed step holds the same samples as the uninterrupted run
(only which rank gets which differs); with another global batch, or another mixture when it is
allowed, each source's order continues where the checkpoint left it: nothing is repeated or
skipped. The data may not change: the refusal names what changed.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from mdata.cost import AttentionCost
from mdata.errors import CheckpointError
from mdata.mesh import ClientPlaceTree
from mdata.mixing import ExactApportioner, MetricMixturePolicy, StagedMixture
from mdata.plan import Plan
from mdata.planner import PlannerState, ResumeOptions

from planner_driver import Driver, lognormal_metadata

STEPS, K = 16, 6
META = {
    "web": lognormal_metadata("web", 3, 400, 6.0, seed=1, bad_every=37),
    "code": lognormal_metadata("code", 2, 300, 7.0, seed=2),
    "chat": lognormal_metadata("chat", 1, 45, 4.5, seed=3, bad_every=11),  # an epoch every ~4 steps
}
WEIGHTS = {"web": 3, "code": 2, "chat": 1}


def plan(dp=4, global_batch=48, micro_batches=2, mix=None, **mesh) -> Plan:
    return (Plan(["web", "code", "chat"]).mix(mix or WEIGHTS)
            .balance(micro_batches=micro_batches, max_tokens=4096, global_batch=global_batch)
            .distribute(ClientPlaceTree(dp=dp, **mesh)).seed(7).window(3).shuffle(2))


def run_with_checkpoint(p: Plan, meta=META, steps=STEPS, k=K):
    """The uninterrupted run, and the JSON checkpoint a trainer wrote after consuming k-1."""
    saved = {}

    def on_consumed(step):
        if step + 1 == k:
            saved["ckpt"] = json.dumps(driver.state.checkpoint(k, with_listings=True).to_dict())

    driver = Driver(PlannerState(p, meta), meta, on_consumed=on_consumed)
    driver.run(steps)
    return driver, json.loads(saved["ckpt"])


REFERENCE, CKPT = run_with_checkpoint(plan())


def resume(p: Plan, ckpt=CKPT, meta=META, steps=STEPS, **options) -> Driver:
    state = PlannerState.from_checkpoint(p, meta, ckpt, options=ResumeOptions(**options))
    return Driver(state, meta).run(steps)


def per_step_union(driver: Driver, first: int, last: int) -> dict[int, list]:
    """Every sample id of each step, over all DP ranks, sorted: the step's global set."""
    return {s: sorted(i for rank in driver.delivered[s].values() for i in rank)
            for s in range(first, last)}


@pytest.mark.parametrize("new", [
    plan(dp=2), plan(dp=8), plan(dp=2, cp=2), plan(dp=2, tp=2, pp=2),
    plan(dp=8).broadcast_at("tp"), plan(dp=4, micro_batches=5),
    plan(dp=3).cost(AttentionCost(a=1.0, b=0.0)),
    plan(dp=4).balance(micro_batches=1, max_tokens=1024, global_batch=48),
    plan(dp=8, tp=2).broadcast_at("tp").window(7),
], ids=["dp2", "dp8", "dp2-cp2", "dp2-tp2-pp2", "dp8-broadcast", "micro5", "dp3-cost",
        "max-tokens", "window"])
def test_same_global_batch_resumes_with_the_same_samples_per_step_on_another_placement(new):
    again = resume(new)
    assert per_step_union(again, K, STEPS) == per_step_union(REFERENCE, K, STEPS)
    assert len(again.delivered[K]) == new.mesh.dp  # placement did change


def consumed_by_source(driver: Driver, first: int, last: int) -> dict[str, Counter]:
    out: dict[str, Counter] = {n: Counter() for n in META}
    for s in range(first, last):
        for rank in driver.delivered[s].values():
            for src, shard, row in rank:
                out[src][(shard, row)] += 1
    return out


def order_positions(state: PlannerState, name: str, start: int, stop: int) -> Counter:
    """The samples at cursor positions [start, stop) of a source, minus rows loaders skip."""
    i = state.names.index(name)
    taken = state.orders[i].take(start, stop - start)
    bad = META[name].skipped
    return Counter((s, r) for s, r in zip(taken.shards.tolist(), taken.rows.tolist())
                   if bad is None or not bad[s][r])


def assert_orders_continue(again: Driver, ckpt: dict, end: int, first: Driver = REFERENCE) -> None:
    """Each source's samples in the resumed steps are exactly its order from the checkpoint's
    cursor on (``first``: the run that wrote the checkpoint): none repeated, none skipped."""
    final = again.state.checkpoint(end).cursors
    got = consumed_by_source(again, ckpt["step"], end)
    for name in META:
        assert got[name] == order_positions(again.state, name, ckpt["cursors"][name], final[name])
    before = consumed_by_source(first, 0, ckpt["step"])
    for name in ("web", "code"):  # epochs never wrap for these: nothing is seen twice
        assert not set(before[name]) & set(got[name])
        assert max(got[name].values()) == 1


@pytest.mark.parametrize("global_batch, dp", [(32, 4), (96, 8), (20, 2)])
def test_another_global_batch_continues_every_source_without_repeats(global_batch, dp):
    again = resume(plan(dp=dp, global_batch=global_batch))
    assert_orders_continue(again, CKPT, STEPS)
    assert all(sum(len(r) for r in again.delivered[s].values()) == global_batch
               for s in range(K, STEPS))


# -- mixture changes (allowed when asked for) -------------------------------------------------------
NEW_MIX = {"web": 1, "code": 1, "chat": 2}


def test_a_mixture_change_is_refused_unless_allowed():
    with pytest.raises(CheckpointError, match=r"written with the mixture .*\"web\": 3\.0.*"
                                              r"allow_mixture_change=True"):
        resume(plan(mix=NEW_MIX))


@pytest.mark.parametrize("new", [
    plan(mix=NEW_MIX), plan(dp=2, global_batch=40, mix=NEW_MIX),
    plan(mix=StagedMixture([(0, WEIGHTS), (10, {"code": 1})])),
], ids=["weights", "weights-dp2-batch40", "schedule"])
def test_an_allowed_mixture_change_is_exact_from_the_first_step_and_repeats_nothing(new):
    again = resume(new, allow_mixture_change=True)
    assert_orders_continue(again, CKPT, STEPS)
    # the new mixture's apportioner starts afresh at step K: exactly its counts, step by step
    names, batch = new.source_names, new.balance_spec.global_batch
    fresh = ExactApportioner(len(names), batch)
    for s in range(K, STEPS):
        expected = fresh.counts(new.mixture.weights_vector(s, names))
        got = Counter(src for rank in again.delivered[s].values() for src, _, _ in rank)
        assert [got[n] for n in names] == expected.tolist()


class MoreCodeLater(MetricMixturePolicy):
    """A metric policy with state: the step at which the reported tokens crossed a threshold."""

    def __init__(self):
        super().__init__(WEIGHTS)
        self.switched_at = None

    def weights(self, step, metrics_history=(), **kwargs):
        if self.switched_at is None and sum(r.metrics["tokens"] for r in metrics_history) > 5e4:
            self.switched_at = step
        return WEIGHTS if self.switched_at is None else {"web": 1, "code": 4, "chat": 1}

    def state_dict(self):
        return {"switched_at": self.switched_at}

    def load_state_dict(self, state):
        self.switched_at = state["switched_at"]


def test_a_mixture_change_from_a_metric_policy_drops_its_state():
    saved = {}
    driver = Driver(PlannerState(plan(mix=MoreCodeLater()), META), META,
                    metrics=lambda s, summary: {"tokens": float(summary.tokens.sum())},
                    on_consumed=lambda s: saved.setdefault(s, driver.state.checkpoint(s + 1).to_dict()))
    driver.run(10)
    ckpt = saved[7]
    assert ckpt["mixture"]["pinned"] and ckpt["mixture"]["history"]  # the old policy's state
    again = resume(plan(mix=NEW_MIX), ckpt=ckpt, allow_mixture_change=True)
    assert again.state.provisioner.pinned == {} and not again.state.provisioner.history
    assert_orders_continue(again, ckpt, STEPS, first=driver)


# -- the data must not change -------------------------------------------------------------------------
def test_changed_data_is_refused_naming_what_changed():
    with pytest.raises(CheckpointError, match=r"written by plan .* not by this plan .*seed was 7, is now 8"):
        resume(plan().seed(8))
    with pytest.raises(CheckpointError, match=r"shuffle window was 2 chunks, is now 4"):
        resume(plan().shuffle(4))
    shorter = dict(META, code=lognormal_metadata("code", 2, 300, 7.0, seed=2))
    shorter["code"] = type(META["code"]).from_arrays(
        "code", [META["code"].num_tokens[0], META["code"].num_tokens[1][:290]])
    with pytest.raises(CheckpointError, match=r"source 'code': its shards changed .*2 shards and "
                                              r"600 rows, now 2 shards and 590 rows\): shard 1 '#1' "
                                              r"had 300 rows, has 290 now"):
        resume(plan(), meta=shorter)
    unlisted = {k: v for k, v in CKPT.items() if k != "listings"}
    with pytest.raises(CheckpointError, match=r"carries no listing to name the shard"):
        resume(plan(), ckpt=unlisted, meta=shorter)
    reordered = Plan(["code", "web", "chat"]).mix(WEIGHTS).balance(
        micro_batches=2, max_tokens=4096, global_batch=48).distribute(ClientPlaceTree(dp=4)).seed(7).shuffle(2)
    with pytest.raises(CheckpointError, match=r"sources were \['web', 'code', 'chat'\], are now "
                                              r"\['code', 'web', 'chat'\] \(reordered"):
        resume(reordered)


def test_urls_and_chunk_rows_are_part_of_the_data():
    from mdata.sources import Source

    def with_sources(web_url, chunk_rows=128):
        sources = [Source("web", web_url, chunk_rows=chunk_rows), Source("code", "/data/code"),
                   Source("chat", "/data/chat")]
        return (Plan(sources).mix(WEIGHTS).balance(micro_batches=2, max_tokens=4096, global_batch=48)
                .distribute(ClientPlaceTree(dp=4)).seed(7).shuffle(2))

    first, ckpt = run_with_checkpoint(with_sources("/data/web/*.parquet"), steps=K + 1)
    assert ckpt["data"]["sources"]["web"]["url"] == "/data/web/*.parquet"
    with pytest.raises(CheckpointError, match=r"source 'web': URL was '/data/web/\*\.parquet', "
                                              r"is now 's3://bucket/web/\*\.parquet'"):
        resume(with_sources("s3://bucket/web/*.parquet"), ckpt=ckpt, steps=K + 2)
    with pytest.raises(CheckpointError, match=r"source 'web': chunk rows were 128, are now 64"):
        resume(with_sources("/data/web/*.parquet", 64), ckpt=ckpt, steps=K + 2)
    again = resume(with_sources("/data/web/*.parquet").distribute(ClientPlaceTree(dp=2)),
                   ckpt=ckpt, steps=K + 1)
    assert per_step_union(again, K, K + 1) == per_step_union(first, K, K + 1)


# -- appended shards (accepted when asked for) ----------------------------------------------------------
def grown_chat(extra_rows=30):
    """chat with a second shard after its first (its first shard unchanged)."""
    base = META["chat"]
    extra = np.full(extra_rows, 50, np.int32)
    return dict(META, chat=type(base).from_arrays(
        "chat", [base.num_tokens[0], extra], skipped=[base.skipped[0], np.zeros(extra_rows, bool)]))


def test_appended_shards_are_refused_unless_accepted():
    with pytest.raises(CheckpointError, match=r"source 'chat': 1 shards were appended after its 1 "
                                              r"shards \('#1' \(30 rows\), 30 rows\); pass "
                                              r"accept_appended_shards=True"):
        resume(plan(), meta=grown_chat())


def test_accepted_appended_shards_are_read_after_the_known_ones_of_the_current_epoch():
    meta = grown_chat()
    state = PlannerState.from_checkpoint(plan(dp=2), meta, CKPT,
                                         options=ResumeOptions(accept_appended_shards=True))
    chat = state.orders[state.names.index("chat")]
    cursor = CKPT["cursors"]["chat"]
    epoch = CKPT["epochs"]["chat"]
    assert chat.appended == ((epoch, 1),) and chat.epoch_of(cursor) == epoch
    start = chat.epoch_start(epoch)
    # what the uninterrupted run read of this epoch, and what this epoch has left
    old = REFERENCE.state.orders[REFERENCE.state.names.index("chat")]
    before = old.take(start, cursor - start)
    assert all(np.array_equal(a, b) for a, b in zip(before, chat.take(start, cursor - start)))
    assert 0 < cursor - start < 45  # the checkpoint is inside the epoch
    rest = chat.take(cursor, start + 45 - cursor)
    assert set(rest.shards.tolist()) == {0}
    assert not set(before.rows.tolist()) & set(rest.rows.tolist())  # nothing read comes again
    new = chat.take(start + 45, 30)
    assert set(new.shards.tolist()) == {1} and sorted(new.rows.tolist()) == list(range(30))
    assert chat.epoch_of(start + 75) == epoch + 1 and chat.epoch_rows(epoch + 1) == 75
    again = Driver(state, meta).run(STEPS + 8)
    end = STEPS + 8
    final = again.state.checkpoint(end)
    got = consumed_by_source(again, K, end)
    taken = chat.take(cursor, final.cursors["chat"] - cursor)
    bad = meta["chat"].skipped
    assert got["chat"] == Counter((s, r) for s, r in zip(taken.shards.tolist(), taken.rows.tolist())
                                  if not bad[s][r])
    assert final.cursors["chat"] > start + 75  # reached the epoch after the growth


def test_a_checkpoint_after_the_growth_restores_the_grown_order_without_options():
    meta = grown_chat()
    first = Driver(PlannerState.from_checkpoint(plan(), meta, CKPT,
                                                options=ResumeOptions(accept_appended_shards=True)),
                   meta)
    first.run(K + 6)
    later = first.state.checkpoint(K + 6, with_listings=True).to_dict()
    assert later["data"]["sources"]["chat"]["appended"] == [[CKPT["epochs"]["chat"], 1]]
    first.run(STEPS + 4)
    again = resume(plan(dp=8), ckpt=json.loads(json.dumps(later)), meta=meta, steps=STEPS + 4)
    assert per_step_union(again, K + 6, STEPS + 4) == per_step_union(first, K + 6, STEPS + 4)


# -- format version 1 -------------------------------------------------------------------------------
def test_version_1_checkpoints_restore_under_the_identical_plan_only():
    from mdata.planner.resume import legacy_fingerprint

    p = plan()
    v1 = {k: v for k, v in CKPT.items() if k not in ("data", "schedule", "listings", "identity")}
    v1.update(version=1, fingerprint=legacy_fingerprint(p))
    again = resume(p, ckpt=v1)
    assert per_step_union(again, K, STEPS) == per_step_union(REFERENCE, K, STEPS)
    with pytest.raises(CheckpointError, match=r"format version 1 without a data section restores "
                                              r"only under the identical plan"):
        resume(plan(dp=2), ckpt=v1)


def test_simulate_resumes_from_a_checkpoint_and_hands_out_checkpoints():
    from mdata.planner import simulate

    first = simulate(plan(), K, META, checkpoints=[3, K])
    assert sorted(first.checkpoints) == [3, K]
    assert first.checkpoints[K]["cursors"] == CKPT["cursors"] and "listings" in first.checkpoints[K]
    again = simulate(plan(dp=8), STEPS - K, META, keep_samples=True, checkpoint=first.checkpoints[K])
    assert again.steps.tolist() == list(range(K, STEPS))
    union = {s: sorted(i for rank in ranks for i in rank) for s, ranks in again.samples.items()}
    assert union == per_step_union(REFERENCE, K, STEPS)


# -- the light form that travels with batches ----------------------------------------------------------
def test_the_light_form_resumes_on_another_placement_but_accepts_no_other_change():
    from mdata.checkpoint import Checkpoint
    from mdata.trainer.checkpoints import JobData

    light = Checkpoint.from_dict(CKPT).light().to_dict()
    assert light == PlannerState(plan(), META).checkpoint(0, light=True).to_dict() | {
        k: CKPT[k] for k in ("step", "cursors", "epochs", "apportioner", "mixture")}
    assert set(light) >= {"identity", "cursors"} and not {"data", "schedule", "listings"} & set(light)
    assert Checkpoint.from_dict(light).nbytes() < Checkpoint.from_dict(CKPT).nbytes() / 2
    again = resume(plan(dp=8), ckpt=light)
    assert per_step_union(again, K, STEPS) == per_step_union(REFERENCE, K, STEPS)
    for changed, options in ((plan().seed(8), {}), (plan(mix=NEW_MIX), {"allow_mixture_change": True})):
        with pytest.raises(CheckpointError, match=r"written by plan .* not by this plan .* light "
                                                  r"form .* restore the checkpoint Loader\.state_dict\(\)"):
            resume(changed, ckpt=light, **options)
    # what a Loader hands out: the light checkpoint completed with the job's data from attach
    shared = REFERENCE.state.identity.job_data()
    assert JobData(shared).complete(light) == CKPT
    other = dict(light, identity="0" * 16)
    assert JobData(shared).complete(other) == other  # not this job's: left as it is
    assert JobData().complete(light) == light
