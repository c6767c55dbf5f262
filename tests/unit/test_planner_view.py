"""The runtime's reads of Planner state (scheduler_plugins.planner_view) and its instruction table."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from scheduler_plugins.job_runtime import JobRuntime
from scheduler_plugins.job_runtime import ps  # the pure Planner, under the name the runtime uses
from scheduler_plugins.planner_view import PlannerView


class Src:
    """A source spec as the plan sees it: a name and rows per chunk."""

    def __init__(self, name, chunk_rows):
        self.name, self.chunk_rows = name, chunk_rows


def tiny():
    plan = (Plan([Src("a", 3)]).mix({"a": 1}).balance(micro_batches=1, max_tokens=100, global_batch=2)
            .distribute(ClientPlaceTree(dp=2)).window(1).shuffle(1))
    return plan, ps.PlannerState(plan, {"a": [6]}, job="j")


def load(state, ins):
    ref = ins.chunk
    rows = np.arange(ref.start, ref.stop, dtype=np.int64)
    return state.handle(ps.ChunkLoaded(ref, rows, (10 + rows).astype(np.int32), None, [], "w1", 0.0,
                                       stimulus_id=f"loaded-{ref.chunk_id}"))


def test_the_view_holds_the_checkpoint_of_each_built_step_until_it_is_consumed():
    _, state = tiny()
    view = PlannerView.of(state)
    assert (view.planned_step, view.balanced_step, view.consumed_step) == (0, 0, 0)
    assert view.checkpoint(1) is None and view.names == ("a",)

    out = []
    for ins in state.handle(ps.Tick(stimulus_id="t0")):
        out += load(state, ins)
    balanced = [i.step for i in out if isinstance(i, ps.StepReady)]
    assert balanced == [0]
    view = PlannerView.of(state, view, balanced)
    assert view.balanced_step == 1 and view.chunks_loaded == state.chunks_in_memory
    assert view.checkpoint(1) == state.checkpoint(1, light=True).to_dict()  # the form that travels
    with pytest.raises(TypeError):
        view.checkpoints[2] = {}  # read-only for every reader on the loop
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.consumed_step = 5

    state.handle(*(ps.BatchConsumed(0, r, stimulus_id=f"ack-{r}") for r in (0, 1)))
    after = PlannerView.of(state, view)
    assert after.consumed_step == 1
    assert after.checkpoint(1) is None  # every group consumed step 0: nobody asks for it again
    assert view.checkpoint(1) is not None  # the older snapshot is unchanged


def test_every_planner_instruction_has_a_runtime_action_and_another_is_refused():
    plan, state = tiny()
    runtime = JobRuntime(None, None, "j", plan, state)
    instructions = {cls for cls in vars(ps).values()
                    if isinstance(cls, type) and issubclass(cls, ps.Instruction) and cls is not ps.Instruction}
    assert instructions == set(runtime._actions)

    @dataclasses.dataclass(frozen=True)
    class Mystery(ps.Instruction):
        pass

    with pytest.raises(TypeError, match=r"job 'j': the runtime has no action for the Planner's "
                                        r"instruction Mystery"):
        runtime._action(Mystery(stimulus_id="t0"))
    (first,) = state.handle(ps.Tick(stimulus_id="t0"))[:1]
    assert runtime._action(first) == runtime._load_chunk


def test_a_view_shares_the_skipped_counts_until_one_moves():
    """Built after every batch of events: the per-source skip counts are rebuilt only when a
    count changed (at 10,000 sources that mapping was most of the view's cost)."""
    _, state = tiny()
    first = PlannerView.of(state)
    again = PlannerView.of(state, first)
    assert again.skipped is first.skipped and dict(again.skipped) == {"a": 0}
    state.skipped[0] = 3  # a loader skipped rows
    moved = PlannerView.of(state, again)
    assert moved.skipped is not again.skipped and dict(moved.skipped) == {"a": 3}
    assert dict(again.skipped) == {"a": 0}  # the older snapshot is unchanged
