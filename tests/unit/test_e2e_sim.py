"""The end-to-end benchmark's at-scale simulation on small synthetic metadata (pure, fast)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from benchmarks.e2e_baselines import BASELINES
from benchmarks.e2e_model import MODELS, Node
from benchmarks.e2e_sim import PARTS, Setup, ratio_breakdown, simulate
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
                weights={"text": 1.0, "images": 1.0})
    base.update(changes)
    return Setup(**base)


def test_every_breakdown_multiplies_back_to_its_ratio_at_equal_work() -> None:
    out = simulate(_setup(), _meta(), {"text": 1e-4, "images": 1e-3}, steps=2)
    for name in BASELINES:
        r = out["ratio"][name]
        assert np.prod([r[p] for p in PARTS]) == pytest.approx(r["ratio"])
        assert 0.97 < r["tokens_per_step"] < 1.03, name
    for side in ("mdata", *BASELINES):
        x = out[side]
        assert x["tokens"] > 0 and x["micro_batches"] == 4  # 2 x pp on every side
        assert x["step"] >= x["work"] + x["fixed"] > x["fixed"] > 0
        assert x["work"] >= x["mean_work"]
        assert x["stall"] == 0.0  # cheap loading hides behind compute
    assert out["vs_ideal"] > 0
    assert out["shape"]["layers"][0] <= out["shape"]["layers"][1]  # the encoder's stage


def test_identical_samples_leave_nothing_to_gain() -> None:
    # Every sample the same: every packing is the ideal one, and every ratio is 1.
    same = np.full(400, 1000, np.int32)
    meta = {"text": SourceMetadata("text", (same,), (np.zeros(400, np.int32),))}
    # 16 DP ranks x 4 micro-batches x 7 samples of 1,000 tokens: every micro-batch alike.
    setup = _setup(weights={"text": 1.0}, cp=1, max_tokens=8000, fill=0.875)
    out = simulate(setup, meta, {"text": 1e-4}, steps=2)
    assert out["shape"]["global_batch"] == 16 * 4 * 7
    assert out["vs_ideal"] == pytest.approx(1.0)
    for name in ("megatron", "local_best", "bridge"):
        assert out["ratio"][name]["ratio"] == pytest.approx(1.0)


def test_the_baselines_stall_first_when_loading_is_expensive() -> None:
    # Each DP group's data loaded on one TP group's cores (every GPU's own: dataloader), against
    # each sample once over all cores.
    slow = Node(trainer_cores_per_gpu=13.0)  # one loader core per GPU
    out = simulate(_setup(node=slow), _meta(), {"text": 0.05, "images": 0.2}, steps=2)
    for name in BASELINES:
        assert out[name]["stall"] > out["mdata"]["stall"], name
        assert out["ratio"][name]["data_stalls"] > 1.0, name


def test_interleaving_shortens_every_step() -> None:
    plain = simulate(_setup(pp=2), _meta(), {"text": 1e-4, "images": 1e-3}, steps=1)
    inter = simulate(_setup(pp=2, virtual=2), _meta(), {"text": 1e-4, "images": 1e-3}, steps=1)
    for side in ("mdata", *BASELINES):
        assert inter[side]["step"] < plain[side]["step"], side
        assert inter[side]["tokens"] == plain[side]["tokens"]


def test_ratio_breakdown_by_hand() -> None:
    ours = {"tokens": 100.0, "mean_work": 8.0, "work": 8.0, "bubble": 2.0, "step": 11.0, "fixed": 1.0}
    base = {"tokens": 100.0, "mean_work": 8.0, "work": 10.0, "bubble": 2.0, "step": 16.0, "fixed": 1.0}
    r = ratio_breakdown(ours, base)
    assert r["ratio"] == pytest.approx(16 / 11)
    assert r["balance"] == pytest.approx(1.25)
    assert r["bubbles"] == pytest.approx((12 / 10) / (10 / 8))
    assert r["data_stalls"] == pytest.approx((15 / 12) / 1.0)
    assert r["fixed"] == pytest.approx((16 / 15) / (11 / 10))
    assert r["flops_per_token"] == pytest.approx(1.0)
    # Without a fixed part (the process run) its factor is 1.
    assert ratio_breakdown({**ours, "fixed": 0.0}, {**base, "fixed": 0.0})["fixed"] == 1.0


def test_balancing_by_stage_in_the_simulation_is_not_slower_than_one_scalar_cost() -> None:
    """The at-scale figure e2e.stage_aware_gain_pp<k>: the same draw planned with module costs
    (every pipeline stage balanced) and with their sum; the by-stage balancer keeps the scalar
    result as one of its candidates, so mdata's simulated steps never get longer."""
    setup = _setup(pp=4)
    costs = {"text": 1e-4, "images": 1e-3}
    scalar = simulate(setup, _meta(), costs, steps=2)["mdata"]
    by_stage = simulate(replace(setup, by_stage=True), _meta(), costs, steps=2)["mdata"]
    assert by_stage["tokens"] == pytest.approx(scalar["tokens"])
    assert by_stage["step"] <= scalar["step"] * (1 + 1e-9)


def test_mdata_waits_for_its_scheduler_when_it_needs_longer_than_the_step() -> None:
    from benchmarks.e2e_control import ControlCost

    meta, cost = _meta(), {"text": 1e-4, "images": 1e-3}
    free = simulate(_setup(), meta, cost, steps=2)
    cheap = simulate(_setup(control=ControlCost(1.0, 10.0, 100.0, "test")), meta, cost, steps=2)
    assert cheap["mdata"]["step"] == pytest.approx(free["mdata"]["step"])  # hidden behind the step
    assert cheap["mdata"].get("control", 0.0) == 0.0
    per_step = free["mdata"]["step"] / free["mdata"]["steps"]
    slow = ControlCost(2e3 * per_step, 0.0, 0.0, "test")  # twice the step, on its own
    late = simulate(_setup(control=slow), meta, cost, steps=2)
    assert late["mdata"]["step"] == pytest.approx(2 * per_step * late["mdata"]["steps"])
    assert late["mdata"]["control"] == pytest.approx(late["mdata"]["step"] - free["mdata"]["step"])
    for name in BASELINES:  # the baselines have no scheduler: their steps do not move
        assert late[name]["step"] == pytest.approx(free[name]["step"])
        assert late["ratio"][name]["ratio"] < free["ratio"][name]["ratio"]


def test_the_control_cost_is_fitted_from_a_runs_control_figures() -> None:
    from benchmarks.e2e_control import ControlCost, from_figures

    assert from_figures({}) is None  # the control benchmark did not run
    figures = {"control.scheduler_cpu_us_per_rank_step": {"mdata": 400.0},
               "control.scheduler_cpu_us_per_group_step": {"mdata": 2500.0},
               "control.scheduler_cpu_ms_per_step_16": {"mdata": 60.0},
               "control.scheduler_cpu_ms_per_step_64": {"mdata": 80.0},
               "control.scheduler_cpu_ms_per_step_16_poll": {"mdata": 1.0}}
    fit = from_figures(figures)
    assert fit == ControlCost(60.0 - (400 * 16 + 2500 * 16) / 1e3, 400.0, 2500.0,
                              "this run's control-plane figures")
    assert fit.seconds(16384, 2048) == pytest.approx(13.6e-3 + 16384 * 400e-6 + 2048 * 2500e-6)


def test_under_broadcast_the_scheduler_is_charged_per_receiver_node_and_fed_rank() -> None:
    """With the broadcast deployment's figures in the run, a TP-4 job on 8-GPU nodes is charged
    per receiving rank (a quarter of the GPUs), per DP group, per node and per fed rank; without
    them, or at TP 1, every GPU as a receiving rank (more, in the baselines' favour)."""
    from benchmarks.e2e_control import from_figures

    figures = {"control.scheduler_cpu_us_per_rank_step": {"mdata": 100.0},
               "control.scheduler_cpu_us_per_group_step": {"mdata": 200.0},
               "control.scheduler_cpu_ms_per_step_16": {"mdata": 10.0},
               "control.fixed_dp": 16}
    every_rank = from_figures(figures)
    assert not every_rank.broadcast
    assert every_rank.step_seconds(8192, 128, 4, 8) == pytest.approx(every_rank.seconds(8192, 128))
    deployed = from_figures({**figures,
                             "control.scheduler_cpu_us_per_host_step": {"mdata": 500.0},
                             "control.scheduler_cpu_us_per_rank_step_bcast_tp": {"mdata": -3.0}})
    assert deployed.broadcast and deployed.per_fed_us == 0.0  # a negative slope charges nothing
    fixed = deployed.fixed_ms * 1e-3
    assert deployed.step_seconds(8192, 128, 4, 8) == pytest.approx(
        fixed + 2048 * 100e-6 + 128 * 200e-6 + 1024 * 500e-6)
    assert deployed.step_seconds(8192, 128, 4, 8) < every_rank.step_seconds(8192, 128, 4, 8)
    assert deployed.step_seconds(1024, 1024, 1, 8) == pytest.approx(deployed.seconds(1024, 1024))
    assert "us/node" in deployed.describe() and "every GPU" in every_rank.describe()


def test_a_slope_lost_in_noise_is_charged_as_an_upper_bound() -> None:
    from benchmarks.e2e_control import from_figures

    figures = {"control.scheduler_cpu_us_per_rank_step": {"mdata": -50.0},
               "control.scheduler_cpu_us_per_group_step": {"mdata": -10.0},
               "control.scheduler_cpu_ms_per_step_8": {"mdata": 40.0},
               "control.scheduler_cpu_ms_per_step_24": {"mdata": 36.0}}
    fit = from_figures(figures)  # the whole of the 24-rank world's CPU, per rank: 1.5 ms each
    assert (fit.fixed_ms, fit.per_rank_us, fit.per_group_us) == (0.0, 1500.0, 0.0)
    assert fit.seconds(1024, 128) == pytest.approx(1024 * 1.5e-3)


def test_mdata_pays_its_measured_cpu_per_sample_and_its_network() -> None:
    """mdata's loaders are charged the measured CPU per sample over the raw cost (its stall onset
    grows by exactly that factor, the baselines' not at all), and its batches' bytes cross each
    node's NIC: a NIC too slow for them stalls mdata alone."""
    meta, cost = _meta(), {"text": 1e-4, "images": 1e-3}
    raw = simulate(_setup(), meta, cost, steps=2)
    dear = simulate(_setup(mdata_cpu_factor=3.0), meta, cost, steps=2)
    assert dear["mdata"]["stall_onset_cores"] == pytest.approx(3 * raw["mdata"]["stall_onset_cores"])
    for name in BASELINES:
        assert dear[name]["stall_onset_cores"] == raw[name]["stall_onset_cores"]
    step = raw["mdata"]["step"] / raw["mdata"]["steps"]
    assert 0 < raw["mdata"]["network"] / raw["mdata"]["steps"] < step and raw["mdata"]["stall"] == 0.0
    # 64 GPUs on 8 nodes; every sample's bytes cross a NIC 1 + pp times
    slow = simulate(_setup(nic_bytes_per_s=1e6), meta, cost, steps=2)
    assert slow["mdata"]["network"] == pytest.approx(raw["mdata"]["network"] * 50e9 / 1e6)
    assert slow["mdata"]["stall"] > 0 and all(slow[name]["stall"] == 0.0 for name in BASELINES)
    assert slow["ratio"]["megatron"]["data_stalls"] < 1.0  # the stall is mdata's loss


def test_batch_bytes_count_token_columns_and_patch_pixels() -> None:
    from benchmarks.e2e_sim import PATCH_BYTES, TOKEN_BYTES, batch_bytes
    assert batch_bytes(np.array([10, 20]), np.array([0, 4])) == 30 * TOKEN_BYTES + 4 * PATCH_BYTES
    assert PATCH_BYTES == 14 * 14 * 3


def test_the_cpu_factor_is_received_samples_cpu_over_the_mixs_raw_cost() -> None:
    from benchmarks.e2e import mdata_cpu_factor
    from benchmarks.e2e_data import WEIGHTS

    cost = {n: 0.01 for n in WEIGHTS}
    factor, per_sample = mdata_cpu_factor({"worker_cpu_s": 3.0, "samples": 100}, cost)
    assert per_sample == pytest.approx(0.03) and factor == pytest.approx(3.0)
    cost["captions"] = 0.02  # weighted by the mix's samples: captions are 5 of 11 parts
    factor, _ = mdata_cpu_factor({"worker_cpu_s": 3.0, "samples": 100}, cost)
    assert factor == pytest.approx(0.03 / ((5 * 0.02 + 6 * 0.01) / 11))
