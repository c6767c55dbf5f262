"""The end-to-end benchmark's at-scale simulation on small synthetic metadata (pure, fast)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.e2e_model import MODELS, Node
from benchmarks.e2e_sim import Setup, ratio_breakdown, simulate_both
from mdata.metadata import SourceMetadata


def _meta() -> dict[str, SourceMetadata]:
    rng = np.random.default_rng(0)
    text = np.minimum(rng.lognormal(7.0, 1.2, 600), 20000).astype(np.int32) + 1
    patches = rng.integers(100, 900, 300).astype(np.int32)
    caption = (patches + rng.integers(5, 40, 300)).astype(np.int32)
    return {"text": SourceMetadata("text", (text[:300], text[300:]), (np.zeros(300, np.int32),) * 2),
            "images": SourceMetadata("images", (caption,), (patches,))}


def _setup(**changes) -> Setup:
    base = dict(model=MODELS["llava-ov-0.5b"], gpus=64, tp=2, pp=2, cp=2, max_tokens=8192,
                tokens_per_step=8 * 4 * 8192, weights={"text": 1.0, "images": 1.0})
    base.update(changes)
    return Setup(**base)


def test_breakdown_multiplies_back_to_the_ratio() -> None:
    out = simulate_both(_setup(), _meta(), {"text": 1e-4, "images": 1e-3}, steps=2)
    r = out["ratio"]
    product = r["balance"] * r["bubbles"] * r["data_stalls"] * r["flops_per_token"]
    assert product == pytest.approx(r["ratio"])
    for side in ("mdata", "baseline"):
        assert out[side]["tokens"] > 0
        assert out[side]["step"] >= out[side]["work"] > 0
        assert out[side]["work"] >= out[side]["mean_work"]
    # Cheap loading hides behind compute on both sides.
    assert out["mdata"]["stall"] == out["baseline"]["stall"] == 0.0


def test_the_baseline_stalls_first_when_loading_is_expensive() -> None:
    # Loading each group's data cp * 2 times on one TP group's cores, against once over all cores.
    slow = Node(trainer_cores_per_gpu=13.0)  # one loader core per GPU
    out = simulate_both(_setup(node=slow), _meta(), {"text": 0.05, "images": 0.2}, steps=2)
    assert out["baseline"]["stall"] > out["mdata"]["stall"]
    assert out["ratio"]["data_stalls"] > 1.0


def test_ratio_breakdown_by_hand() -> None:
    ours = {"tokens": 100.0, "mean_work": 8.0, "work": 8.0, "bubble": 2.0, "step": 10.0}
    base = {"tokens": 100.0, "mean_work": 8.0, "work": 10.0, "bubble": 2.0, "step": 15.0}
    r = ratio_breakdown(ours, base)
    assert r["ratio"] == pytest.approx(1.5)
    assert r["balance"] == pytest.approx(1.25)
    assert r["bubbles"] == pytest.approx((12 / 10) / (10 / 8))
    assert r["data_stalls"] == pytest.approx((15 / 12) / 1.0)
    assert r["flops_per_token"] == pytest.approx(1.0)
