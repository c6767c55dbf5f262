"""The end-to-end benchmark's trainer model: FLOP formula, 1F1B makespan, budgets."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.e2e_model import (GPU, MODELS, VLM, Node, PipelineTimes, one_f_one_b, planner_cost,
                                  stage_seconds, step_breakdown)


def _times(fwd, bwd) -> PipelineTimes:
    return PipelineTimes(np.asarray(fwd, dtype=float), np.asarray(bwd, dtype=float))


@pytest.mark.parametrize("m,p", [(1, 1), (4, 1), (1, 4), (8, 4), (3, 5), (16, 8)])
def test_equal_micro_batches_take_m_plus_p_minus_one_slots(m: int, p: int) -> None:
    # The textbook 1F1B makespan with forward f and backward b: (m + p - 1) * (f + b).
    t = _times(np.full((m, p), 1.0), np.full((m, p), 2.0))
    assert one_f_one_b(t) == pytest.approx((m + p - 1) * 3.0)


def test_single_stage_is_the_sum_of_its_work() -> None:
    t = _times([[1.0], [5.0], [2.0]], [[2.0], [10.0], [4.0]])
    assert one_f_one_b(t) == pytest.approx(24.0)


def test_two_stages_two_micro_batches_by_hand() -> None:
    # Stage 0: F0 [0,1], F1 [1,4] (F1 costs 3), B0 after stage 1's B0; stage 1: F0 [1,2], B0 [2,4],
    # F1 [4,7], B1 [7,13]; stage 0: B0 [4,6], B1 [13,19].
    t = _times([[1, 1], [3, 3]], [[2, 2], [6, 6]])
    assert one_f_one_b(t) == pytest.approx(19.0)


def test_an_expensive_micro_batch_makes_a_bubble_and_balance_removes_it() -> None:
    skewed = _times([[3, 3], [1, 1], [1, 1], [1, 1]], [[6, 6], [2, 2], [2, 2], [2, 2]])
    even = _times(np.full((4, 2), 1.5), np.full((4, 2), 3.0))
    assert skewed.work == pytest.approx(even.work)
    assert one_f_one_b(skewed) > one_f_one_b(even) == pytest.approx(5 * 4.5)


def test_llm_flops_are_six_n_t_plus_the_attention_term() -> None:
    model = VLM(llm_params=1e9, llm_layers=10, llm_hidden=100)
    assert model.llm_flops(np.array([1000]))[0] == pytest.approx(6e12 + 6 * 10 * 100 * 1000**2)
    # Two documents of 500 cost less attention than one of 1000 (the l^2 term).
    assert model.llm_flops(np.array([500, 500])).sum() < model.llm_flops(np.array([1000]))[0]


def test_vision_attention_is_capped_by_its_window() -> None:
    model = VLM(vit_params=1e8, vit_layers=2, vit_hidden=10, vit_window=100)
    small, large = model.vit_flops(np.array([50, 400]))
    assert small == pytest.approx(6e8 * 50 + 12 * 2 * 10 * 50 * 50)
    assert large == pytest.approx(6e8 * 400 + 12 * 2 * 10 * 400 * 100)
    assert model.vit_flops(np.array([0]))[0] == 0.0


def test_stage_seconds_put_the_vision_encoder_on_the_first_stage() -> None:
    model, gpu = MODELS["llava-ov-7b"], GPU(peak_flops=1e15, mfu=0.5)
    mb = [(np.array([1000, 3000]), np.array([729, 0]))]
    t = stage_seconds(mb, model, gpu, pp=4, tp=2, cp=1)
    llm = model.llm_flops(np.array([1000, 3000])).sum() / 4
    vit = model.vit_flops(np.array([729, 0])).sum()
    assert t.forward.shape == (1, 4)
    assert t.forward[0, 1] == pytest.approx(llm / 3 / (0.5e15 * 2))
    assert t.forward[0, 0] == pytest.approx((llm + vit) / 3 / (0.5e15 * 2))
    np.testing.assert_allclose(t.backward, 2 * t.forward)
    # The Planner's cost (GFLOP) is the same count when every image fills the window.
    total = planner_cost(model)(np.array([1000, 3000]), np.array([729, 0])).sum() * 1e9
    assert (t.forward.sum() + t.backward.sum()) * 0.5e15 * 2 == pytest.approx(total)


def test_step_breakdown_adds_up() -> None:
    a = _times([[3, 3], [1, 1]], [[6, 6], [2, 2]])
    b = _times([[1, 1], [1, 1]], [[2, 2], [2, 2]])
    out = step_breakdown([a, b], stall_s=0.5)
    assert out["work"] == pytest.approx(a.work)
    assert out["makespan"] == pytest.approx(max(one_f_one_b(a), one_f_one_b(b)))
    assert out["work"] + out["bubble"] + out["stall"] == pytest.approx(out["step"])


def test_node_budget_and_dilation() -> None:
    node = Node()
    assert node.loader_cores_per_gpu == pytest.approx(112 / 8 - 2)
    assert node.dilation(8, 2.0) == pytest.approx(8 * 12 / 2)
