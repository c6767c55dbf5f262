"""Plan builder: immutability, validation, fingerprint, HTML, and simulate."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from mdata.cost import AttentionCost
from mdata.errors import MeshError, PlanError
from mdata.mesh import ClientPlaceTree
from mdata.metadata import SourceMetadata
from mdata.mixing import StagedMixture
from mdata.plan import Plan
from mdata.planner import simulate

from planner_driver import lognormal_metadata

META = {"web": lognormal_metadata("web", 3, 400, 6.0, seed=1),
        "code": lognormal_metadata("code", 2, 200, 7.5, seed=2),
        "chat": lognormal_metadata("chat", 1, 60, 4.5, seed=3)}


def base():
    return (Plan(["web", "code", "chat"]).mix({"web": 5, "code": 3, "chat": 2})
            .cost(AttentionCost(a=1.0, b=0.0))
            .balance(micro_batches=2, max_tokens=8192, global_batch=60)
            .distribute(ClientPlaceTree(dp=4, tp=2)).seed(11))


def test_plan_is_immutable():
    p = Plan(["web", "code"])
    q = p.mix({"web": 1, "code": 0})
    assert q is not p
    with pytest.raises(PlanError, match="no mixture"):
        p.mixture
    assert q.mixture.weights_vector(0, q.source_names).tolist() == [1.0, 0.0]
    assert p.window(8).window_steps == 8 and p.window_steps == 4


@pytest.mark.parametrize(
    "build, error, message",
    [
        (lambda: Plan([]), PlanError, "at least one source"),
        (lambda: Plan(["web", "web"]), PlanError, "appears twice"),
        (lambda: Plan(["web"]).mix({"books": 1}), PlanError, r"unknown sources \['books'\]"),
        (lambda: Plan(["web"]).mix({"web": 0}), PlanError, "all weights are zero"),
        (lambda: Plan(["web"]).balance(micro_batches=0, max_tokens=8, global_batch=8),
         PlanError, "micro_batches must be an int >= 1, got 0"),
        (lambda: Plan(["web"]).balance(micro_batches=1, max_tokens=8, global_batch=2)
         .distribute(ClientPlaceTree(dp=4)), PlanError, "global_batch=2 samples cannot feed 4 DP ranks"),
        (lambda: Plan(["web"]).distribute(ClientPlaceTree(dp=4))
         .balance(micro_batches=1, max_tokens=8, global_batch=3), PlanError, "cannot feed 4 DP ranks"),
        (lambda: Plan(["web"]).distribute("dp=4"), PlanError, "takes a ClientPlaceTree"),
        (lambda: Plan(["web"]).broadcast_at("dp"), MeshError, "broadcast_at='dp'"),
        (lambda: Plan(["web"]).cost(3), PlanError, "must be callable"),
        (lambda: Plan(["web"]).seed(-1), PlanError, "seed must be an int >= 0"),
        (lambda: Plan(["web"]).validate(), PlanError, r"call \.mix"),
        (lambda: Plan(["web"]).mix({"web": 1}).validate(), PlanError, r"call \.balance"),
    ],
)
def test_plan_validation(build, error, message):
    with pytest.raises(error, match=message):
        build()


def test_fingerprint_is_stable_and_sensitive():
    fp = base().fingerprint()
    assert fp == base().fingerprint() and len(fp) == 16
    assert base().window(9).fingerprint() == fp  # the window never changes what is delivered
    for variant in (base().seed(12), base().mix({"web": 1, "code": 0, "chat": 0}), base().shuffle(8),
                    base().distribute(ClientPlaceTree(dp=2)), base().broadcast_at("tp"),
                    base().cost(AttentionCost()),
                    base().balance(micro_batches=2, max_tokens=4096, global_batch=60)):
        assert variant.fingerprint() != fp
    code = ("from mdata.plan import Plan;"
            "print(Plan(['web','code']).mix({'web':1,'code':1}).seed(3).fingerprint())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "77"}).stdout.strip()
    assert out == Plan(["web", "code"]).mix({"web": 1, "code": 1}).seed(3).fingerprint()


def test_repr_html_lists_sources_and_settings():
    text = base()._repr_html_()
    assert "<td>web</td><td>256</td><td>0.500</td>" in text
    assert "60 samples/step, 2 micro-batches, 8192 tokens each" in text
    assert base().fingerprint() in text


def test_simulate_returns_per_step_tables():
    res = simulate(base(), 12, META)
    assert res.steps.tolist() == list(range(12))
    assert res.per_rank_cost.shape == (12, 4) and res.counts.shape == (12, 3)
    assert res.counts.sum(axis=1).tolist() == [60] * 12
    assert res.counts.sum(axis=0).tolist() == [360, 216, 144]  # exact mixture over 12 steps
    np.testing.assert_allclose(res.target_weights[0], [0.5, 0.3, 0.2])
    assert np.all(res.max_over_lower_bound >= 1.0 - 1e-12)
    rec = res.to_records()[3]
    assert rec["step"] == 3 and rec["count/web"] == int(res.counts[3, 0])
    assert rec["makespan"] == pytest.approx(float(res.per_rank_cost[3].max()))
    assert "simulation: 12 steps" in res._repr_html_()


def test_simulate_matches_between_runs_and_follows_a_curriculum():
    plan = base().mix(StagedMixture([(0, {"web": 1}), (5, {"code": 1, "chat": 1})]))
    a = simulate(plan, 8, META, keep_samples=True)
    b = simulate(plan, 8, list(META.values()), keep_samples=True)
    assert a.samples == b.samples
    assert a.counts[:5].tolist() == [[60, 0, 0]] * 5 and a.counts[5:].tolist() == [[0, 30, 30]] * 3
    ids = [i for step in a.samples.values() for rank in step for i in rank]
    # 90 chat samples over three steps from a 60-row source: the second epoch repeats 30 of them
    assert len(ids) == 8 * 60 and len(set(ids)) == 8 * 60 - 30


def test_simulate_counts_truncation_and_skips():
    meta = dict(META)
    meta["chat"] = SourceMetadata.from_arrays(
        "chat", [np.full(60, 20_000)], skipped=[np.arange(60) % 4 == 0])
    res = simulate(base().mix({"chat": 1, "web": 0, "code": 0}), 3, meta)
    assert res.truncated.tolist() == [60, 60, 60]
    assert res.skipped.sum() > 0
    with pytest.raises(PlanError, match=r"no metadata for sources \['chat'\]"):
        simulate(base(), 2, {k: v for k, v in META.items() if k != "chat"})


def test_a_plan_with_an_image_source_needs_an_image_token_id(tmp_path):
    from mdata.errors import PlanError
    from mdata.sources import DecodeImageCaption, Source, TokenizeText

    text = Source("web", str(tmp_path / "web" / "*.parquet"), transform=TokenizeText())
    images = Source("pics", str(tmp_path / "pics" / "*.parquet"), transform=DecodeImageCaption())
    plan = Plan([text, images]).mix({"web": 1.0, "pics": 1.0}).balance(
        micro_batches=1, max_tokens=1024, global_batch=8)
    plan.validate()  # planning and simulation need no image token
    with pytest.raises(PlanError, match=r"sources \['pics'\] yield images.*special_tokens\(image_token_id=...\)"):
        plan.validate_for_delivery()
    assert plan.special_tokens(image_token_id=100_277).validate_for_delivery().image_token_id == 100_277
    Plan([text]).mix({"web": 1.0}).balance(micro_batches=1, max_tokens=1024, global_batch=8).validate_for_delivery()
