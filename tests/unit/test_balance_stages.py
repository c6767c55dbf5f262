"""Balancing by stage: the per-stage 1F1B makespan, its lower bound, and the stage-aware balancer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdata.balance import (
    balance_step, balance_step_by_stage, one_f_one_b_makespan, stage_lower_bound, stage_makespan,
)
from mdata.balance.stages import order_by_stage, stage_times
from mdata.cost import AttentionCost, ImagePatchCost
from mdata.errors import PlanError
from mdata.module_cost import ModuleCost


def test_stage_makespan_by_hand() -> None:
    # One micro-batch crosses every stage forward and back: the sum of its row.
    assert stage_makespan(np.array([[3.0, 6.0, 9.0]])) == pytest.approx(18.0)
    # One stage: the sum of the micro-batches.
    assert stage_makespan(np.array([[3.0], [6.0]])) == pytest.approx(9.0)
    # Two stages, rows (3, 6) then (6, 3); forward a third, backward two thirds of a stage time.
    # Stage 0: F0 [0,1], F1 [1,3]; stage 1: F0 [1,3], B0 [3,7], F1 [7,8], B1 [8,10];
    # stage 0: B0 [7,9], B1 [10,14].
    assert stage_makespan(np.array([[3.0, 6.0], [6.0, 3.0]])) == pytest.approx(14.0)
    # The other order: stage 0: F0 [0,2], F1 [2,3]; stage 1: F0 [2,3], B0 [3,5], F1 [5,7],
    # B1 [7,11]; stage 0: B0 [5,9], B1 [11,13].
    assert stage_makespan(np.array([[6.0, 3.0], [3.0, 6.0]])) == pytest.approx(13.0)
    # vectorised over leading axes
    spans = stage_makespan(np.array([[[3.0, 6.0], [6.0, 3.0]], [[6.0, 3.0], [3.0, 6.0]]]))
    np.testing.assert_allclose(spans, [14.0, 13.0])


def test_even_rows_agree_with_the_scalar_model_and_the_benchmark_simulation() -> None:
    from benchmarks.e2e_model import PipelineTimes, one_f_one_b

    rng = np.random.default_rng(5)
    for m, p in ((1, 1), (3, 2), (4, 4), (9, 4), (5, 8), (12, 3)):
        costs = rng.lognormal(0.0, 1.0, m)
        even = np.repeat(costs[:, None] / p, p, axis=1)
        assert stage_makespan(even) == pytest.approx(one_f_one_b_makespan(costs, p))
        uneven = rng.lognormal(0.0, 1.0, (m, p))
        assert stage_makespan(uneven) == pytest.approx(
            one_f_one_b(PipelineTimes(uneven / 3.0, 2.0 * uneven / 3.0)))


def test_order_by_stage_is_a_permutation_never_slower_than_the_given_order() -> None:
    rng = np.random.default_rng(6)
    for m, p in ((5, 4), (24, 4)):  # under and over the insertion budget
        times = rng.lognormal(0.0, 1.0, (6, m, p))
        order = order_by_stage(times)
        assert all(sorted(r) == list(range(m)) for r in order.tolist())
        got = stage_makespan(times[np.arange(6)[:, None], order])
        if m == 5:
            assert np.all(got <= stage_makespan(times) * (1 + 1e-12))


def test_stage_lower_bound_by_hand() -> None:
    sc = np.array([[4.0, 1.0], [4.0, 1.0], [0.0, 3.0]])
    # stage 0 holds 8 over 2 ranks (4); the largest sample's chain is 5
    assert stage_lower_bound(sc, 2) == pytest.approx(5.0)
    assert stage_lower_bound(sc, 1) == pytest.approx(8.0)
    assert stage_lower_bound(np.zeros((0, 3)), 4) == 0.0


def _vlm_step(seed: int, n: int, max_tokens: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Half image samples (256-patch images), half text; tokens include the image tokens."""
    rng = np.random.default_rng(seed)
    image = rng.random(n) < 0.5
    patches = np.where(image, 256 * rng.integers(1, 5, n), 0)
    text = np.maximum(16, rng.lognormal(6.0, 1.0, n)).astype(np.int64)
    tokens = np.minimum(text + patches, max_tokens)
    return tokens, np.minimum(patches, tokens)


_VLM = ModuleCost({"llm": AttentionCost(a=1.0, b=2048.0), "vision": ImagePatchCost(per_patch=1024.0)})


def _scalar_span(tokens, sc, dp, m, seed) -> tuple[float, object]:
    """The scalar balancer (totals, pipeline-aware) under the per-stage model, in its own order."""
    a = balance_step(tokens, sc.sum(axis=1), dp=dp, micro_batches=m, max_tokens=4096, seed=seed,
                     stages=sc.shape[1])
    return float(stage_makespan(stage_times(sc, a.rank, a.micro_batch, dp,
                                            a.num_micro_batches)).max()), a


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), dp=st.integers(2, 5), p=st.sampled_from([2, 4, 8]),
       n=st.integers(8, 90), vision=st.sampled_from([0.0, 64.0, 1024.0]))
def test_stage_aware_is_never_slower_than_scalar_nor_below_the_bound(seed, dp, p, n, vision):
    tokens, patches = _vlm_step(seed, n)
    cost = ModuleCost({"llm": AttentionCost(a=1.0, b=2048.0),
                       "vision": ImagePatchCost(per_patch=vision)})
    sc = cost.stage_costs(tokens, patches, p)
    got = balance_step_by_stage(tokens, sc, dp=dp, micro_batches=p, max_tokens=4096, seed=seed)
    scalar, flat = _scalar_span(tokens, sc, dp, p, seed)
    a = got.assignment
    # the reported makespans are those of the assignment, micro-batches in their numbered order
    spans = stage_makespan(stage_times(sc, a.rank, a.micro_batch, dp, a.num_micro_batches))
    np.testing.assert_allclose(spans, got.per_rank_makespan, rtol=1e-9)
    assert got.makespan <= scalar * (1 + 1e-9)
    assert got.makespan >= got.lower_bound * (1 - 1e-9)
    assert got.lower_bound == pytest.approx(stage_lower_bound(sc, dp))
    # every sample placed once, within the token limit, on the scalar schedule's length
    assert a.num_micro_batches == flat.num_micro_batches
    assert a.per_micro_batch_tokens.max() <= 4096
    assert np.bincount(a.rank, minlength=dp).sum() == n
    np.testing.assert_allclose(a.per_rank_cost.sum(), sc.sum())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_image_heavy_steps_lose_under_scalar_balancing_at_pp8_and_stage_aware_wins(seed) -> None:
    # Equal totals hide that a rank with more images has a slower stage 0 (the vision encoder);
    # balancing every stage takes that back.
    tokens, patches = _vlm_step(seed, 128)
    sc = _VLM.stage_costs(tokens, patches, 8)
    got = balance_step_by_stage(tokens, sc, dp=4, micro_batches=8, max_tokens=4096, seed=seed)
    scalar, flat = _scalar_span(tokens, sc, 4, 8, seed)
    assert scalar >= 1.03 * got.makespan
    assert got.scalar_makespan <= scalar * (1 + 1e-12)  # its own reordering of the scalar result
    assert got.gain_over_scalar >= 1.0
    # the scalar result's stage-0 loads are further apart than the stage-aware ones
    stage0 = lambda a: stage_times(sc, a.rank, a.micro_batch, 4, a.num_micro_batches)[:, :, 0].sum(1)
    assert np.ptp(stage0(got.assignment)) < np.ptp(stage0(flat))


def test_text_only_steps_are_balanced_as_the_scalar_balancer_does() -> None:
    # One module over all stages evenly: the per-stage model is the scalar one, and the scalar
    # result is the first candidate, so nothing slower comes out.
    rng = np.random.default_rng(3)
    tokens = np.minimum(rng.lognormal(7.0, 1.0, 200).astype(np.int64) + 1, 4096)
    cost = ModuleCost({"llm": AttentionCost()})
    sc = cost.stage_costs(tokens, np.zeros_like(tokens), 4)
    got = balance_step_by_stage(tokens, sc, dp=6, micro_batches=4, max_tokens=4096, seed=1)
    flat = balance_step(tokens, sc.sum(1), dp=6, micro_batches=4, max_tokens=4096, seed=1,
                        stages=4)
    assert got.makespan <= one_f_one_b_makespan(flat.per_micro_batch_cost, 4).max() * (1 + 1e-9)


def test_one_stage_and_bad_input() -> None:
    tokens, patches = _vlm_step(4, 40)
    sc = _VLM.stage_costs(tokens, patches, 1)
    got = balance_step_by_stage(tokens, sc, dp=3, micro_batches=2, max_tokens=4096, seed=2)
    flat = balance_step(tokens, sc[:, 0], dp=3, micro_batches=2, max_tokens=4096, seed=2)
    np.testing.assert_array_equal(got.assignment.rank, flat.rank)
    np.testing.assert_array_equal(got.assignment.micro_batch, flat.micro_batch)
    np.testing.assert_allclose(got.per_rank_makespan, flat.per_rank_cost)
    with pytest.raises(PlanError, match="stage_costs must be"):
        balance_step_by_stage(tokens, sc[:, 0], dp=3, micro_batches=2, max_tokens=4096)
    bad = sc.copy()
    bad[0, 0] = np.nan
    with pytest.raises(PlanError, match="finite"):
        balance_step_by_stage(tokens, np.repeat(bad, 2, axis=1), dp=3, micro_batches=2,
                              max_tokens=4096)


def test_balancing_by_stage_is_deterministic() -> None:
    tokens, patches = _vlm_step(9, 100)
    sc = _VLM.stage_costs(tokens, patches, 4)
    runs = [balance_step_by_stage(tokens, sc, dp=4, micro_batches=4, max_tokens=4096, seed=3)
            for _ in range(2)]
    np.testing.assert_array_equal(runs[0].assignment.rank, runs[1].assignment.rank)
    np.testing.assert_array_equal(runs[0].assignment.micro_batch, runs[1].assignment.micro_batch)


@pytest.mark.parametrize("seed", range(8))
def test_the_swap_screen_keeps_what_the_whole_grid_keeps(seed, monkeypatch) -> None:
    """``least_swaps`` estimates only a band of pairs when both ranks' busiest stage is the
    same; it returns the pairs the whole grid's screen returns, in its order, ties included
    (odd seeds: costs rounded to a tenth, so many estimates are equal), never an infeasible
    swap; tight token room (seeds 4-7) leaves few feasible swaps."""
    from mdata.balance import stage_screen

    whole = stage_screen._whole_grid
    used = []
    monkeypatch.setattr(stage_screen, "_whole_grid", lambda *a: used.append(1) or whole(*a))
    rng = np.random.default_rng(seed)
    nx, ny, p, k = 500, 480, 4, 64
    sx, sy = rng.lognormal(0.0, 1.0, (nx, p)), rng.lognormal(0.0, 1.0, (ny, p))
    if seed % 2:
        sx, sy = np.round(sx, 1), np.round(sy, 1)
    tx, ty = rng.integers(1, 500, nx), rng.integers(1, 500, ny)
    room = 300 if seed < 4 else 40
    free1, free2 = rng.integers(0, room, nx), rng.integers(0, room, ny)
    load1 = np.full(p, 1000.0)
    load1[1] = 1e4  # both ranks' busiest stage: 1, their loads a few costs apart
    load2 = load1 - rng.random(p) * 3
    a, b, got = stage_screen.least_swaps(load1, load2, sx, sy, tx, ty, free1, free2, k)
    assert not used  # the band, not the grid
    wa, wb, want = whole(load1, load2, 1, 1, sx, sy, tx, ty, free1, free2, k)
    np.testing.assert_array_equal(a, wa)
    np.testing.assert_array_equal(b, wb)
    np.testing.assert_array_equal(got, want)
    grow = ty[b] - tx[a]
    assert np.all((grow <= free1[a]) & (-grow <= free2[b])) and np.all(np.diff(got) >= 0)
    # different busiest stages, or a rank without samples: the grid, or nothing
    load2[2] = 2e4
    np.testing.assert_array_equal(
        stage_screen.least_swaps(load1, load2, sx, sy, tx, ty, free1, free2, k)[2],
        whole(load1, load2, 1, 2, sx, sy, tx, ty, free1, free2, k)[2])
    assert stage_screen.least_swaps(load1, load2, sx[:0], sy, tx[:0], ty, free1[:0], free2,
                                    k)[2].size == 0
    assert stage_screen.least_swaps(load1, load2, sx, sy[:0], tx, ty[:0], free1, free2[:0],
                                    k)[2].size == 0


@pytest.mark.parametrize("shape, k", [((530, 530), 64), ((40, 900), 64), ((3, 5), 64), ((200, 1), 64),
                                      ((100, 100), 1)])
def test_the_least_swaps_are_those_a_whole_partition_finds(shape, k) -> None:
    """The whole grid's screen keeps the ``k`` least estimates of a rank pair's swaps; bounding
    them by the ``k``-th least row minimum first finds the same ones (here no two are equal),
    infeasible pairs (inf) included."""
    from mdata.balance.stage_screen import _least

    rng = np.random.default_rng(shape[0] * shape[1] + k)
    grid = rng.random(shape) * 1e6
    grid[rng.random(shape) < 0.2] = np.inf
    grid[: shape[0] // 3] = np.inf  # whole rows without a feasible swap
    got = _least(grid, k)
    flat = grid.ravel()
    whole = np.argpartition(flat, k)[:k] if flat.size > k else np.arange(flat.size)
    assert sorted(got.tolist()) == sorted(whole.tolist()) or (
        np.sort(flat[got]).tolist() == np.sort(flat[whole]).tolist())  # ties among the infs
    assert got.size == min(k, flat.size) and len(set(got.tolist())) == got.size


def test_ordered_by_stage_returns_the_makespan_of_its_order_to_the_last_bit() -> None:
    """The insertion's own evaluation of the chosen order is the makespan a fresh evaluation
    gives (by waves or an operation at a time, few or many schedules at once)."""
    from mdata.balance.stages import ordered_by_stage

    rng = np.random.default_rng(8)
    for dp, m, p in ((1, 1, 4), (3, 2, 1), (16, 32, 8), (2, 32, 8), (5, 7, 4), (16, 16, 8),
                     (4, 40, 2)):
        times = rng.lognormal(0.0, 1.0, (dp, m, p))
        order, span = ordered_by_stage(times)
        np.testing.assert_array_equal(order, order_by_stage(times))
        fresh = stage_makespan(times[np.arange(dp)[:, None], order])
        assert np.array_equal(span, fresh)
