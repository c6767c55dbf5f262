"""Checkpoint: tiny, versioned, JSON-safe; refuses other plans and versions."""

from __future__ import annotations

import json

import pytest

from mdata.checkpoint import FORMAT_VERSION, Checkpoint
from mdata.errors import CheckpointError
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.planner import PlannerState

from planner_driver import Driver, lognormal_metadata

META = {"web": lognormal_metadata("web", 2, 300, 6.0, seed=1),
        "code": lognormal_metadata("code", 1, 80, 7.0, seed=2)}


def plan(seed=3):
    return (Plan(["web", "code"]).mix({"web": 2, "code": 1})
            .balance(micro_batches=1, max_tokens=4096, global_batch=24)
            .distribute(ClientPlaceTree(dp=3)).seed(seed).window(2))


def consumed_state(steps=5):
    state = PlannerState(plan(), META)
    Driver(state, META).run(steps)
    return state


def test_checkpoint_round_trips_through_json_and_is_tiny():
    state = consumed_state()
    ckpt = state.checkpoint(5)
    again = Checkpoint.from_json(json.dumps(ckpt.to_dict()))
    assert again == ckpt
    assert ckpt.version == FORMAT_VERSION and ckpt.step == 5
    assert sum(ckpt.cursors.values()) == 5 * 24 and ckpt.epochs == {"web": 0, "code": 0}
    assert ckpt.nbytes() < 600


def test_checkpoint_reflects_consumed_not_prefetched():
    state = consumed_state()
    assert state.balanced_step > 5  # the planner ran ahead
    assert state.checkpoint(5).cursors != state.checkpoint(state.balanced_step).cursors
    with pytest.raises(CheckpointError, match=r"can checkpoint steps 5\.\.7 .*not step 4"):
        state.checkpoint(4)


def test_checkpoint_of_another_plan_is_refused():
    ckpt = consumed_state().checkpoint(5)
    with pytest.raises(CheckpointError, match="was written by plan .* not by this plan"):
        PlannerState.from_checkpoint(plan(seed=4), META, ckpt)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"version": 99}, "format version 99 is not supported"),
        ({"cursors": {"web": 1}}, r"has cursors for \['web'\]"),
        ({"step": "x"}, "corrupt or incomplete"),
    ],
)
def test_bad_checkpoint_dicts(change, message):
    data = consumed_state().checkpoint(5).to_dict() | change
    with pytest.raises(CheckpointError, match=message):
        Checkpoint.from_dict(data)
    with pytest.raises(CheckpointError, match="not valid JSON"):
        Checkpoint.from_json("{")


@pytest.mark.parametrize("value", [
    {"carry": [0.25, -0.0, 1e300, float("inf"), float("nan"), 3]},
    {"state": {}, "history": [[1, 2.5], (3, "x")], "pinned": {"5": (0.5, 0.5)}, "flag": True, "none": None},
    {"steps": {1: [0.5]}},  # an int key: JSON makes it a string
    [1, (2, [3, {"a": (4,)}])],
    {"x": __import__("numpy").float64(0.5)},  # not a plain type: through JSON (float subclass)
])
def test_the_plain_copy_of_a_checkpoint_value_is_its_json_round_trip(value):
    """Checkpoint values are copied without JSON when they hold only plain JSON types (a float
    per source in every step's checkpoint); the copy is what the round trip gives, in every
    case, and shares nothing with the value."""
    from mdata.checkpoint import _jsonable

    got = _jsonable(value)
    want = json.loads(json.dumps(value))
    assert json.dumps(got) == json.dumps(want) and type(got) is type(want)
    if isinstance(value, dict) and "carry" in value:
        assert got["carry"] is not value["carry"]
