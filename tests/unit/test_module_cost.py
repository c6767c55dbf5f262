"""Module-aware cost models: VideoCost, ModuleCost's costs and placement, its spec, the Planner."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from mdata.cost import AttentionCost, CombinedCost, ImagePatchCost, VideoCost, evaluate_cost
from mdata.errors import PlanError
from mdata.mesh import ClientPlaceTree
from mdata.metadata import SourceMetadata
from mdata.module_cost import ModuleCost
from mdata.plan import Plan
from mdata.planner import simulate
from mdata.spec import Trust

TOKENS = np.array([10, 100, 1000, 600], dtype=np.int32)
PATCHES = np.array([0, 0, 512, 600], dtype=np.int32)


def test_video_cost_by_hand() -> None:
    video = VideoCost(per_patch=2.0, per_pair=0.5, frame_patches=256)
    # 512 patches = 2 frames: 2*512 + 0.5*512*(256 + 2); 600 = 3 frames: 2*600 + 0.5*600*(256 + 3)
    np.testing.assert_allclose(video(TOKENS, PATCHES),
                               [0.0, 0.0, 1024 + 256 * 258, 1200 + 300 * 259])
    spatial = VideoCost(per_patch=2.0, per_pair=0.5, frame_patches=256, temporal=False)
    np.testing.assert_allclose(spatial(TOKENS, PATCHES)[2:], [1024 + 256 * 256, 1200 + 300 * 256])
    assert video.module == "vision" and "video cost" in video.describe()
    for bad, message in ((dict(frame_patches=0), "frame_patches"), (dict(per_pair=-1.0), "per_pair"),
                         (dict(temporal="yes"), "temporal")):
        with pytest.raises(PlanError, match=message):
            VideoCost(**bad)


def test_built_in_models_name_their_module() -> None:
    assert AttentionCost().module == "llm"
    assert ImagePatchCost().module == "vision"


def test_module_cost_adds_up_and_keeps_modules_apart() -> None:
    llm, vision = AttentionCost(a=1.0, b=10.0), ImagePatchCost(per_patch=3.0)
    cost = ModuleCost({"llm": llm, "vision": vision})
    per_module = cost.module_costs(TOKENS, PATCHES)
    np.testing.assert_array_equal(per_module[:, 0], llm(TOKENS, PATCHES))
    np.testing.assert_array_equal(per_module[:, 1], vision(TOKENS, PATCHES))
    # as a scalar model it is the total, bit for bit what CombinedCost gives
    np.testing.assert_array_equal(evaluate_cost(cost, TOKENS, PATCHES),
                                  CombinedCost(llm, vision)(TOKENS, PATCHES))
    assert cost.names == ("llm", "vision")
    assert cost.name == "modules(llm=attention, vision=image_patches)"
    assert "vision [first]" in cost.describe() and "llm [all]" in cost.describe()


def test_default_placement_and_layer_split() -> None:
    cost = ModuleCost({"llm": AttentionCost(), "vision": ImagePatchCost()})
    np.testing.assert_allclose(cost.stage_fractions(4), [[0.25] * 4, [1, 0, 0, 0]])
    split = ModuleCost({"llm": AttentionCost(), "vision": ImagePatchCost()}, layer_split=[4, 6, 6, 4])
    np.testing.assert_allclose(split.stage_fractions(4)[0], [0.2, 0.3, 0.3, 0.2])
    sc = split.stage_costs(TOKENS, PATCHES, 4)
    mods = split.module_costs(TOKENS, PATCHES)
    np.testing.assert_allclose(sc[:, 0], 0.2 * mods[:, 0] + mods[:, 1])
    np.testing.assert_allclose(sc[:, 3], 0.2 * mods[:, 0])
    np.testing.assert_allclose(sc.sum(axis=1), mods.sum(axis=1))


def test_placements_of_every_kind() -> None:
    models = {"llm": AttentionCost(), "vision": ImagePatchCost(), "audio": VideoCost()}
    cost = ModuleCost(models, placement={"vision": "last", "audio": [1, 1, 0], "llm": 1})
    np.testing.assert_allclose(cost.stage_fractions(3), [[0, 1, 0], [0, 0, 1], [0.5, 0.5, 0]])
    assert ModuleCost(models).placement == {"llm": "all", "vision": "first", "audio": "first"}


@pytest.mark.parametrize("kwargs, message", [
    (dict(placement={"video": "first"}), "unknown modules"),
    (dict(placement={"vision": "middle"}), "use one of"),
    (dict(placement={"vision": -1}), "count from 0"),
    (dict(placement={"vision": [0, 0]}), "all zeros"),
    (dict(layer_split=[1, "x"]), "finite numbers"),
])
def test_bad_placements_are_refused(kwargs, message) -> None:
    with pytest.raises(PlanError, match=message):
        ModuleCost({"llm": AttentionCost(), "vision": ImagePatchCost()}, **kwargs)


def test_placements_are_checked_against_the_stages() -> None:
    cost = ModuleCost({"llm": AttentionCost(), "vision": ImagePatchCost()}, layer_split=[1, 1, 1])
    with pytest.raises(PlanError, match="3 entries but the mesh has pp=4"):
        cost.stage_fractions(4)
    far = ModuleCost({"llm": AttentionCost(), "vision": ImagePatchCost()}, placement={"vision": 5})
    with pytest.raises(PlanError, match="stage 5"):
        far.stage_fractions(4)
    with pytest.raises(PlanError, match="not a cost model"):
        ModuleCost({"llm": 3})
    with pytest.raises(PlanError, match="non-empty dict"):
        ModuleCost({})


def test_of_groups_models_by_module() -> None:
    cost = ModuleCost.of(AttentionCost(), ImagePatchCost(), VideoCost(), placement={"vision": 0})
    assert cost.names == ("llm", "vision")
    assert isinstance(cost.modules["vision"], CombinedCost)
    np.testing.assert_allclose(cost.module_costs(TOKENS, PATCHES)[:, 1],
                               ImagePatchCost()(TOKENS, PATCHES) + VideoCost()(TOKENS, PATCHES))


def _plan(cost, pp: int = 4) -> Plan:
    return (Plan(["text", "images"]).mix({"text": 1.0, "images": 1.0}).cost(cost)
            .balance(micro_batches=4, max_tokens=4096, global_batch=96)
            .distribute(ClientPlaceTree(dp=2, pp=pp)).seed(5))


def test_plan_spec_round_trip_on_the_scheduler() -> None:
    cost = ModuleCost({"llm": AttentionCost(a=2.0), "vision": CombinedCost(ImagePatchCost(),
                                                                             VideoCost(per_pair=0.5))},
                      placement={"vision": [3, 1, 0, 0]}, layer_split=[6, 8, 8, 6])
    spec = _plan(cost).to_spec()
    assert spec["cost"]["type"] == "mdata.module_cost:ModuleCost"
    # the scheduler's trust: only built-ins, and the spec goes through JSON
    back = Plan.from_spec(json.loads(json.dumps(spec)), trust=Trust([]))
    assert back.cost_model == cost
    assert back.to_spec() == spec
    assert pickle.loads(pickle.dumps(cost)) == cost
    assert hash(pickle.loads(pickle.dumps(cost))) == hash(cost)


def _metadata() -> dict[str, SourceMetadata]:
    rng = np.random.default_rng(0)
    text = [np.clip(rng.lognormal(6.5, 1.0, 400), 8, 4096).astype(np.int32) for _ in range(2)]
    patches = [256 * rng.integers(1, 5, 400).astype(np.int32) for _ in range(2)]
    tokens = [np.minimum(p + 64, 4096).astype(np.int32) for p in patches]
    return {"text": SourceMetadata.from_arrays("text", text),
            "images": SourceMetadata.from_arrays("images", tokens, patches)}


def test_planner_balances_by_stage_and_adds_modules_up_without_pipeline() -> None:
    meta = _metadata()
    llm, vision = AttentionCost(a=1.0, b=2048.0), ImagePatchCost(per_patch=1024.0)
    modules = ModuleCost({"llm": llm, "vision": vision})
    combined = CombinedCost(llm, vision)
    # pp 1: the modules add up, so the plan is the scalar one, sample for sample
    flat = [simulate(_plan(c, pp=1), 3, meta, keep_samples=True) for c in (modules, combined)]
    assert flat[0].samples == flat[1].samples
    np.testing.assert_array_equal(flat[0].per_rank_cost, flat[1].per_rank_cost)
    # pp 4: the same samples each step, placed by stage
    staged = [simulate(_plan(c), 3, meta, keep_samples=True) for c in (modules, combined)]
    for step in staged[0].samples:
        assert sorted(sum(staged[0].samples[step], [])) == sorted(sum(staged[1].samples[step], []))
    with pytest.raises(PlanError, match="pp=4"):
        simulate(_plan(ModuleCost({"llm": llm}, layer_split=[1, 1])), 1, meta)


def test_a_step_balanced_by_stage_is_summarised_by_its_makespans() -> None:
    # the dashboard and `mdata plan simulate` read StepSummary: for a plan balanced by stage it
    # must hold each rank's 1F1B makespan against the stage lower bound, not the rank totals
    meta = _metadata()
    llm, vision = AttentionCost(a=1.0, b=2048.0), ImagePatchCost(per_patch=1024.0)
    staged = simulate(_plan(ModuleCost({"llm": llm, "vision": vision})), 4, meta)
    assert staged.measure == "1F1B makespan"
    assert (staged.makespan >= staged.lower_bound * (1 - 1e-9)).all()
    assert staged.scalar_makespan is not None
    assert (staged.scalar_makespan >= staged.makespan * (1 - 1e-9)).all()  # never slower
    assert (staged.scalar_makespan > staged.makespan * (1 + 1e-6)).any()  # and it did gain here
    scalar = simulate(_plan(CombinedCost(llm, vision)), 4, meta)
    assert scalar.measure == "cost" and scalar.scalar_makespan is None
