"""The at-scale figures' regimes and loader-cores sweep, on small synthetic metadata (pure, fast)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.e2e_baselines import BASELINES
from benchmarks.e2e_model import Node
from benchmarks.e2e_scale import (CORES_SWEEP, HEADLINE_GPUS, REGIMES, _figures, _sweep_figures,
                                  cores_key)
from benchmarks.e2e_sim import simulate
from test_e2e_sim import _meta, _setup  # the same small synthetic text + image metadata

COST = {"text": 0.002, "images": 0.008}  # CPU s per sample: 1/4 core per GPU starves the baselines


def test_text_regimes_are_one_model_at_four_contexts_on_meshes_that_fit() -> None:
    text = {k: REGIMES[k] for k in ("text4k", "text8k", "text16k", "text32k")}
    assert [s.max_tokens for s in text.values()] == [4096, 8192, 16384, 32768]
    for name, s in text.items():
        assert s.model == REGIMES["vlm"].model and s.weights == text["text8k"].weights, name
        assert s.max_tokens // s.cp <= 8192, name  # no GPU holds more than 8k tokens of a sequence
        assert HEADLINE_GPUS % (s.tp * s.pp * s.cp) == 0 and s.dp >= 16, name
        assert {n for n, w in s.weights.items() if w > 0} == {"books", "code", "scenes"}, name
    assert 12.0 in CORES_SWEEP and Node().loader_cores_per_gpu == 12.0  # the node's own point
    assert [cores_key(c) for c in (0.25, 0.5, 1.0, 12.0)] == ["0_25", "0_5", "1", "12"]


def test_the_sweep_changes_only_the_stalls_and_its_node_point_is_the_headline() -> None:
    setup = _setup()
    node = setup.node.loader_cores_per_gpu
    out = simulate(setup, _meta(), COST, steps=2, loader_cores=(0.25, 1.0, node))
    assert set(out["cores_sweep"]) == {0.25, 1.0, node}
    at_node = out["cores_sweep"][node]
    for side in ("mdata", *BASELINES):
        assert at_node[side] == out[side], side  # the sweep's node point is the headline run
        for c, at in out["cores_sweep"].items():
            for part in ("work", "mean_work", "bubble", "fixed", "tokens"):
                assert at[side][part] == pytest.approx(out[side][part]), (side, c, part)
        stalls = [out["cores_sweep"][c][side]["stall"] for c in (0.25, 1.0, node)]
        assert stalls[0] >= stalls[1] >= stalls[2] >= 0.0, side  # fewer cores never stall less
    starved = out["cores_sweep"][0.25]
    assert starved["mdata"]["stall"] == 0.0  # each sample once over every GPU's cores: hidden
    for name in BASELINES:  # each DP group's data on one TP group's (or one GPU's) cores: not
        assert starved[name]["stall"] > 0.0, name
        assert starved["ratio"][name]["ratio"] > out["ratio"][name]["ratio"], name
        assert starved["ratio"][name]["data_stalls"] > 1.0, name
        assert out[name]["stall"] == 0.0, name  # the node's 12 cores hide everyone's loading
    # The onset is where stalls begin: a little above it no step waits, a little below one does.
    for side in ("dataloader", "megatron"):
        onset = out[side]["stall_onset_cores"]
        assert 0.25 < onset < node, side
        near = simulate(setup, _meta(), COST, steps=2, loader_cores=(1.01 * onset, 0.99 * onset))
        assert near["cores_sweep"][1.01 * onset][side]["stall"] == 0.0, side
        assert near["cores_sweep"][0.99 * onset][side]["stall"] > 0.0, side
    assert out["mdata"]["stall_onset_cores"] < 0.25
    assert out["vs_ideal"] > 0 and simulate(setup, _meta(), COST, steps=1)["cores_sweep"] == {}
    with pytest.raises(ValueError):
        simulate(setup, _meta(), COST, steps=1, loader_cores=(0.0,))


def test_regime_figures_name_every_baseline_budget_and_the_worst_equal_work_ratio() -> None:
    setup = _setup()
    runs = [simulate(_setup(seed=s), _meta(), COST, steps=2, loader_cores=(0.25, 12.0)) for s in (0, 1)]
    figs = {**_figures("toy", setup, runs, 2), **_sweep_figures("toy", setup, runs)}
    per_base = {b: figs[f"e2e.tokens_per_step_ratio.{b}.toy"]["mdata"] for b in BASELINES}
    worst = max(per_base.values(), key=lambda v: abs(v - 1.0))
    assert figs["e2e.tokens_per_step_ratio.toy"]["mdata"] == pytest.approx(worst)
    assert figs["e2e.vs_ideal.toy"]["mdata"] > 0
    for c in ("0_25", "12"):
        for b in BASELINES:
            ratio = figs[f"e2e.cores_sweep.toy.{c}.ratio.{b}"]["mdata"]
            assert ratio == pytest.approx(np.mean([r["cores_sweep"][float(c.replace("_", "."))]["ratio"][b]["ratio"]
                                                   for r in runs]))
        for side in ("mdata", *BASELINES):
            assert 0.0 <= figs[f"e2e.cores_sweep.toy.{c}.stall.{side}"] < 1.0
    for side in ("mdata", *BASELINES):
        assert figs[f"e2e.cores_sweep.toy.stall_onset.{side}"]["mdata"] == \
            max(r[side]["stall_onset_cores"] for r in runs)
    # At the node's budget the sweep's ratio is the headline figure; starved, the baselines wait.
    for b in BASELINES:
        assert figs[f"e2e.cores_sweep.toy.12.ratio.{b}"]["mdata"] == pytest.approx(figs[f"e2e.ratio.{b}.toy"]["mdata"])
        assert figs[f"e2e.cores_sweep.toy.0_25.stall.{b}"] > figs["e2e.cores_sweep.toy.0_25.stall.mdata"]
