"""Cost models: formulas, calibration helper, combination, validation of plugin output."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from mdata.cost import AttentionCost, CombinedCost, CostModel, ImagePatchCost, cost_unit, evaluate_cost
from mdata.errors import PlanError

TOKENS = np.array([0, 1, 1024, 16384], dtype=np.int32)
PATCHES = np.array([0, 4, 0, 256], dtype=np.int32)


def test_attention_cost_formula():
    cost = AttentionCost(a=2.0, b=10.0)
    np.testing.assert_array_equal(
        cost(TOKENS, PATCHES), [0.0, 12.0, 2.0 * 1024**2 + 10 * 1024, 2.0 * 16384**2 + 10 * 16384]
    )
    assert cost(TOKENS, PATCHES).dtype == np.float64


def test_attention_default_is_calibrated_for_hidden_4096():
    default = AttentionCost()
    model = AttentionCost.for_model(hidden=4096, layers=32)
    assert model.b / model.a == default.b / default.a == 12 * 4096
    # one 16k document costs more than sixteen 1k documents with the same tokens
    long_doc = default(np.array([16384]), np.array([0]))[0]
    short_docs = 16 * default(np.array([1024]), np.array([0]))[0]
    assert long_doc / short_docs == pytest.approx((16384 + 49152) / (1024 + 49152))


def test_for_model_coefficients():
    model = AttentionCost.for_model(hidden=1024, layers=2)
    assert (model.a, model.b) == (2.0 * 1024 * 2, 24.0 * 1024 * 1024 * 2)
    full = AttentionCost.for_model(hidden=1024, layers=2, causal=False)
    assert full.a == 2 * model.a and full.b == model.b
    with pytest.raises(PlanError, match="hidden must be an int >= 1, got 0"):
        AttentionCost.for_model(hidden=0, layers=2)


def test_image_patch_cost_and_combination():
    vision = ImagePatchCost(per_patch=3.0, per_patch_sq=0.5)
    np.testing.assert_array_equal(vision(TOKENS, PATCHES), [0.0, 20.0, 0.0, 768.0 + 0.5 * 256**2])
    text = AttentionCost(a=1.0, b=0.0)
    both = CombinedCost(text, vision)
    np.testing.assert_array_equal(both(TOKENS, PATCHES), text(TOKENS, PATCHES) + vision(TOKENS, PATCHES))
    assert both.name == "attention+image_patches"
    assert both.describe() == (
        "attention cost 1*l^2 + 0*l per document (l = tokens) + "
        "image patch cost 3*p + 0.5*p^2 (p = patches)"
    )


def test_models_are_picklable_values():
    for model in (AttentionCost(), ImagePatchCost(), CombinedCost(AttentionCost(), ImagePatchCost())):
        assert isinstance(model, CostModel)
        again = pickle.loads(pickle.dumps(model))
        assert again == model
        np.testing.assert_array_equal(again(TOKENS, PATCHES), model(TOKENS, PATCHES))
    assert AttentionCost(1, 2) == AttentionCost(1.0, 2.0)


def test_plain_functions_plug_in():
    def flat(num_tokens, num_patches):
        return np.ones(len(num_tokens))

    combined = CombinedCost(AttentionCost(a=1.0, b=0.0), flat)
    np.testing.assert_array_equal(combined(TOKENS, PATCHES), TOKENS.astype(float) ** 2 + 1)
    assert combined.name == "attention+flat"
    assert combined.describe() == "attention cost 1*l^2 + 0*l per document (l = tokens) + flat"


def test_evaluate_cost_defaults_patches_to_zero():
    np.testing.assert_array_equal(
        evaluate_cost(ImagePatchCost(per_patch=1.0), TOKENS), np.zeros(4)
    )


def test_evaluate_cost_names_a_faulty_plugin_and_sample():
    def broken(num_tokens, num_patches):
        out = num_tokens.astype(float)
        out[2] = np.nan
        return out

    with pytest.raises(PlanError, match=r"cost model 'broken' returned nan for sample 2 \(num_tokens=1024"):
        evaluate_cost(broken, TOKENS, PATCHES)

    def wrong_length(num_tokens, num_patches):
        return np.ones(2)

    with pytest.raises(PlanError, match="'wrong_length' returned shape \\(2,\\) for 4 samples"):
        evaluate_cost(wrong_length, TOKENS, PATCHES)
    with pytest.raises(PlanError, match="must be 1-d arrays of the same length"):
        evaluate_cost(AttentionCost(), TOKENS, PATCHES[:2])


@pytest.mark.parametrize(
    "factory, message",
    [
        (lambda: AttentionCost(a=-1.0), "AttentionCost: a must be finite and >= 0, got -1.0"),
        (lambda: AttentionCost(b="x"), "AttentionCost: b must be a number"),
        (lambda: ImagePatchCost(per_patch_sq=float("inf")), "per_patch_sq must be finite"),
        (lambda: CombinedCost(), "CombinedCost needs at least one cost model"),
        (lambda: CombinedCost(3), "CombinedCost: 3 is not a cost model"),
    ],
)
def test_invalid_coefficients(factory, message):
    with pytest.raises(PlanError, match=message):
        factory()


def test_cost_unit_is_gpu_ms_only_for_a_model_that_says_it_is_calibrated():
    """The dashboard labels costs with :func:`cost_unit`: the built-in models only fix ratios."""
    assert cost_unit(AttentionCost()) == "relative cost"
    assert cost_unit(CombinedCost(AttentionCost(), ImagePatchCost())) == "relative cost"

    def fitted(num_tokens, num_patches):
        return 1e-6 * np.asarray(num_tokens, dtype=np.float64) ** 2

    fitted.unit = "GPU-ms"  # fitted to measured step times
    assert cost_unit(fitted) == "GPU-ms"
    assert cost_unit(CombinedCost(fitted, fitted)) == "GPU-ms"
    assert cost_unit(CombinedCost(fitted, AttentionCost())) == "relative cost"  # mixed: no unit
