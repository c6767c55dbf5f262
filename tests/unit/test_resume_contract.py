"""The resume contract: a state restored from checkpoint(k) delivers exactly what the
uninterrupted run delivered from step k on (same samples, same DP ranks, same order)."""

from __future__ import annotations

import json

import pytest

from mdata.mesh import ClientPlaceTree
from mdata.mixing import MetricMixturePolicy, StagedMixture
from mdata.plan import Plan
from mdata.planner import PlannerState

from planner_driver import Driver, lognormal_metadata

STEPS = 24
META = {
    "web": lognormal_metadata("web", 3, 400, 6.0, seed=1, bad_every=37),
    "code": lognormal_metadata("code", 2, 300, 7.0, seed=2),
    "chat": lognormal_metadata("chat", 1, 45, 4.5, seed=3, bad_every=11),  # epochs every ~4 steps
}


class CodeWhenLong(MetricMixturePolicy):
    """Moves weight to 'code' once a reported mean length exceeds a threshold (state: the switch)."""

    history_size = 8

    def __init__(self):
        super().__init__({"web": 1, "code": 1, "chat": 1})
        self.switched_at = None

    def weights(self, step, metrics_history=(), **kwargs):
        if self.switched_at is None and sum(r.metrics["tokens"] for r in metrics_history) > 1e5:
            self.switched_at = step
        if self.switched_at is None:
            return {"web": 2, "code": 1, "chat": 1}
        return {"web": 1, "code": 4, "chat": 1}

    def state_dict(self):
        return {"switched_at": self.switched_at}

    def load_state_dict(self, state):
        self.switched_at = state["switched_at"]


def metrics(step, summary):
    return {"tokens": float(summary.tokens.sum())}


def make_plan(kind: str) -> Plan:
    plan = Plan(["web", "code", "chat"]).balance(micro_batches=2, max_tokens=4096, global_batch=40)
    plan = plan.distribute(ClientPlaceTree(dp=4, cp=2)).seed(7).window(3).shuffle(2)
    if kind == "curriculum":
        return plan.mix(StagedMixture([(0, {"web": 3, "chat": 1}), (9, {"code": 2, "chat": 1}),
                                       (15, {"web": 1, "code": 1, "chat": 2})]))
    return plan.mix(CodeWhenLong())


def run(kind, checkpoint_at=None):
    plan = make_plan(kind)
    saved = {}

    def on_consumed(step):
        if checkpoint_at is not None and step + 1 == checkpoint_at:
            # what a trainer would write after consuming step k-1: JSON on disk
            saved["ckpt"] = json.dumps(driver.state.checkpoint(checkpoint_at).to_dict())

    driver = Driver(PlannerState(plan, META), META, metrics=metrics, on_consumed=on_consumed)
    driver.run(STEPS)
    return plan, driver, saved.get("ckpt")


UNINTERRUPTED = {kind: run(kind)[1] for kind in ("curriculum", "metric")}
SWITCH = UNINTERRUPTED["metric"].state.schedule.switched_at


def test_scenarios_cover_what_the_contract_must_survive():
    # the metric policy switches mid-run, the small source wraps epochs, rows get skipped
    assert SWITCH is not None and 3 < SWITCH < STEPS - 4
    chat_rows = {r for step in UNINTERRUPTED["curriculum"].delivered.values()
                 for rank in step.values() for (src, _, r) in rank if src == "chat"}
    assert len(chat_rows) == 45 - 5  # every good chat row was seen, so epochs wrapped
    assert UNINTERRUPTED["curriculum"].state.skipped.tolist()[2] > 5


@pytest.mark.parametrize(
    "kind, k",
    [
        ("curriculum", 1), ("curriculum", 5), ("curriculum", 9),  # 9: first step of stage 2
        ("curriculum", 12), ("curriculum", 16), ("curriculum", 21),
        ("metric", 2), ("metric", 4), ("metric", 5), ("metric", 6), ("metric", 11), ("metric", 17), ("metric", 22),
    ],
)
def test_restored_state_replays_the_uninterrupted_sequence(kind, k):
    plan, first, ckpt = run(kind, checkpoint_at=k)
    assert first.delivered == UNINTERRUPTED[kind].delivered  # checkpointing changes nothing
    restored = PlannerState.from_checkpoint(plan, META, json.loads(ckpt))
    again = Driver(restored, META, metrics=metrics).run(STEPS)
    expected = {s: v for s, v in UNINTERRUPTED[kind].delivered.items() if k <= s < STEPS}
    got = {s: v for s, v in again.delivered.items() if s < STEPS}
    assert got == expected
    if kind == "metric":
        assert again.state.schedule.switched_at == SWITCH


def test_metric_switch_is_around_the_checkpoints():
    # the parametrized points fall before, at and after the switch; at 4 and 5 the steps planned
    # ahead still used the old weights while the policy had already switched (pinned weights)
    points = [2, 4, 5, 6, 11, 17, 22]
    assert min(points) < SWITCH < max(points)
    assert SWITCH - 3 < 4 < 5 <= SWITCH  # window 3: steps planned before the switch was decided
