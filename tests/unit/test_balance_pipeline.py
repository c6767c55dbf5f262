"""Pipeline-aware balancing (pp > 1): the 1F1B makespan helper, micro-batch order, rank loads."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mdata.balance import balance_step
from mdata.balance.pipeline import (
    _schedule, one_f_one_b_makespan, order_micro_batches, ordered_makespan, pipeline_cost,
)
from mdata.balance.stages import _stages_of, stage_makespan


def _spans(a, stages: int) -> np.ndarray:
    """Each rank's 1F1B makespan with its micro-batches in the assignment's order."""
    return one_f_one_b_makespan(a.per_micro_batch_cost, stages)


def test_one_f_one_b_textbook_and_by_hand() -> None:
    # m equal micro-batches of cost c on p stages: (m + p - 1) c / p.
    for m, p in ((1, 1), (4, 1), (2, 4), (8, 4), (3, 8)):
        assert one_f_one_b_makespan(np.full(m, 6.0), p) == pytest.approx((m + p - 1) * 6.0 / p)
    # By hand, 2 stages, costs 6 and 3 (stage times: forward c/6, backward c/3).
    # Stage 0: F0 [0,1], F1 [1,1.5]; stage 1: F0 [1,2], B0 [2,4], F1 [4,4.5], B1 [4.5,5.5];
    # stage 0: B0 [4,6], B1 [6,7].
    assert one_f_one_b_makespan(np.array([6.0, 3.0]), 2) == pytest.approx(7.0)
    # Vectorised over leading axes, and the order of micro-batches matters.
    spans = one_f_one_b_makespan(np.array([[6.0, 1.0, 1.0], [1.0, 1.0, 6.0]]), 4)
    assert spans.shape == (2,) and spans[1] < spans[0]


def test_one_f_one_b_matches_the_benchmarks_schedule_simulation() -> None:
    # The e2e benchmark's trainer simulates 1F1B op by op; with equal stage splits both agree.
    from benchmarks.e2e_model import PipelineTimes, one_f_one_b

    rng = np.random.default_rng(2)
    for p, m in ((2, 1), (4, 2), (4, 3), (4, 9), (8, 5), (3, 12)):
        costs = rng.lognormal(0.0, 1.0, m)
        per_stage = np.repeat(costs[:, None] / p, p, axis=1)
        expected = one_f_one_b(PipelineTimes(per_stage / 3.0, 2.0 * per_stage / 3.0))
        assert float(one_f_one_b_makespan(costs, p)) == pytest.approx(expected)


def test_insertion_order_is_near_the_best_permutation() -> None:
    rng = np.random.default_rng(3)
    costs = rng.lognormal(0.0, 0.8, size=(40, 5))
    order = order_micro_batches(costs, 4)
    assert all(sorted(r) == list(range(5)) for r in order.tolist())
    got = one_f_one_b_makespan(np.take_along_axis(costs, order, axis=1), 4)
    best = np.array([min(one_f_one_b_makespan(np.array(q), 4) for q in itertools.permutations(r))
                     for r in costs])
    given = one_f_one_b_makespan(costs, 4)
    assert np.all(got <= given + 1e-12)
    assert np.all(got <= best * 1.05) and got.mean() <= best.mean() * 1.01
    # the estimate the balancer uses is never below the best order
    assert np.all(pipeline_cost(costs, 4) >= best * (1 - 1e-12))


def _book_step(seed: int = 0):
    """Half the ranks must take a full-context 'book' (one micro-batch alone), the rest is small."""
    rng = np.random.default_rng(seed)
    dp, cap = 16, 4096
    small = rng.integers(100, 1500, size=220)
    tokens = np.concatenate([np.full(8, cap), small]).astype(np.int64)
    costs = tokens.astype(float) + tokens.astype(float) ** 2 / 2000.0
    return tokens, costs, dp, cap


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pipeline_mode_shortens_the_slowest_rank(seed: int) -> None:
    tokens, costs, dp, cap = _book_step(seed)
    flat = balance_step(tokens, costs, dp=dp, micro_batches=3, max_tokens=cap, seed=seed)
    piped = balance_step(tokens, costs, dp=dp, micro_batches=3, max_tokens=cap, seed=seed,
                         stages=4)
    # the old behaviour: totals at the lower bound, but the book ranks' pipelines are slow
    assert flat.max_over_lower_bound <= 1.01
    assert _spans(piped, 4).max() < 0.95 * _spans(flat, 4).max()
    # every guarantee still holds: exactly the samples, token budget, same micro-batch count
    assert piped.num_micro_batches == flat.num_micro_batches
    assert int((piped.per_micro_batch_tokens > cap).sum()) == 0
    assert piped.per_rank_cost.sum() == pytest.approx(costs.sum())
    counts = np.bincount(piped.rank * piped.num_micro_batches + piped.micro_batch,
                         minlength=dp * piped.num_micro_batches)
    assert counts.sum() == tokens.size
    np.testing.assert_array_equal(
        np.bincount(piped.rank * piped.num_micro_batches + piped.micro_batch, weights=tokens,
                    minlength=dp * piped.num_micro_batches).reshape(dp, -1),
        piped.per_micro_batch_tokens)


def test_micro_batches_run_in_a_good_order() -> None:
    # One rank: a costly micro-batch first is the slow order; pp > 1 puts it where it costs least.
    tokens = np.array([4096, 1000, 1000, 1000, 1000], np.int64)
    costs = np.array([50.0, 5.0, 5.0, 5.0, 5.0])
    flat = balance_step(tokens, costs, dp=1, micro_batches=3, max_tokens=4096)
    piped = balance_step(tokens, costs, dp=1, micro_batches=3, max_tokens=4096, stages=4)
    assert flat.per_micro_batch_cost[0, 0] == 50.0  # LPT opens micro-batch 0 with the largest
    assert _spans(piped, 4)[0] < _spans(flat, 4)[0]
    same = sorted(flat.per_micro_batch_cost[0].tolist())
    assert sorted(piped.per_micro_batch_cost[0].tolist()) == same


def test_pipeline_mode_is_deterministic_and_validates_stages() -> None:
    tokens, costs, dp, cap = _book_step(5)
    runs = [balance_step(tokens, costs, dp=dp, micro_batches=3, max_tokens=cap, seed=7, stages=4)
            for _ in range(2)]
    np.testing.assert_array_equal(runs[0].rank, runs[1].rank)
    np.testing.assert_array_equal(runs[0].micro_batch, runs[1].micro_batch)
    with pytest.raises(Exception, match="stages"):
        balance_step(tokens, costs, dp=dp, micro_batches=3, max_tokens=cap, stages=0)


@pytest.mark.parametrize("seed", [0, 1])
def test_pipeline_mode_is_never_slower_than_the_flat_balance_reordered(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tokens = np.minimum(rng.lognormal(7.0, 1.2, 600).astype(np.int64) + 1, 8192)
    costs = tokens + tokens.astype(float) ** 2 / 4096.0
    flat = balance_step(tokens, costs, dp=12, micro_batches=4, max_tokens=8192, seed=seed)
    piped = balance_step(tokens, costs, dp=12, micro_batches=4, max_tokens=8192, seed=seed,
                         stages=4)
    _, reordered = ordered_makespan(flat.per_micro_batch_cost, 4)
    assert _spans(piped, 4).max() <= reordered.max() * (1 + 1e-12)
    assert _spans(piped, 4).max() <= _spans(flat, 4).max() * (1 + 1e-12)


def test_many_micro_batches_insert_only_the_most_expensive() -> None:
    # 24 micro-batches on 4 stages is over the insertion budget: one insertion into ascending.
    rng = np.random.default_rng(4)
    costs = rng.lognormal(0.0, 1.0, size=(6, 24))
    order = order_micro_batches(costs, 4)
    assert all(sorted(r) == list(range(24)) for r in order.tolist())
    ascending = np.sort(costs, axis=1)
    got = one_f_one_b_makespan(np.take_along_axis(costs, order, axis=1), 4)
    assert np.all(got <= one_f_one_b_makespan(ascending, 4) * (1 + 1e-12))


def _makespan_one_at_a_time(durations: np.ndarray, m: int, p: int) -> np.ndarray:
    """The schedule evaluated an operation at a time, as the definition reads."""
    _, _, prev, dep, last = _schedule(m, p)
    end = []
    for k in range(prev.size):
        start = end[prev[k]] if prev[k] >= 0 else np.zeros(durations.shape[1:])
        if dep[k] >= 0:
            start = np.maximum(start, end[dep[k]])
        end.append(start + durations[k])
    return end[last]


@pytest.mark.parametrize("lead, m, p", [((16,), 32, 8), ((3, 5), 9, 4), ((64,), 65, 8), ((2,), 2, 2),
                                        ((4096,), 16, 4), ((0,), 8, 4)])
def test_makespans_by_waves_are_the_same_to_the_bit_as_one_operation_at_a_time(lead, m, p) -> None:
    """Waves (few schedules) and the operation-at-a-time path (many, or short) give exactly what
    the schedule's definition gives, for per-stage times and for even splits."""
    rng = np.random.default_rng(m * p)
    times = rng.random(lead + (m, p)) * rng.integers(1, 100, lead + (m, 1))
    mb, fwd, _, _, _ = _schedule(m, p)
    stage = _stages_of(m, p)
    share = np.where(fwd, 1 / 3, 1 - 1 / 3)  # forward a third, backward the rest
    durations = np.moveaxis(times[..., mb, stage], -1, 0) * share.reshape((-1,) + (1,) * len(lead))
    assert np.array_equal(stage_makespan(times), _makespan_one_at_a_time(durations, m, p))
    costs = times.sum(axis=-1)
    even = np.moveaxis((costs / p)[..., mb], -1, 0) * share.reshape((-1,) + (1,) * len(lead))
    assert np.array_equal(one_f_one_b_makespan(costs, p), _makespan_one_at_a_time(even, m, p))
    assert stage_makespan(times).shape == lead


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lpt_passes_pick_the_same_micro_batches_with_heaps_as_with_scans(seed, monkeypatch) -> None:
    """Ranks with many micro-batches pick the cheapest one with room from a heap; the choices
    (ties to the lowest index) are the scan's, in every LPT pass and the re-pack."""
    import mdata.balance.lpt as lpt
    import mdata.balance.repack as repack
    import mdata.balance.stage_lpt as stage_lpt
    rng = np.random.default_rng(seed)
    n, dp, m, cap = 400, 6, 16, 4096
    tokens = np.minimum(rng.lognormal(6, 1.0, n).astype(np.int64) + 1, cap)
    tokens[::7] = 64  # equal samples: ties between micro-batches
    sc = rng.random((n, 4)) * tokens[:, None]
    sc[::7] = 1.0
    order = np.lexsort((np.arange(n), -tokens, -sc.sum(axis=1))).tolist()
    tok, cost = tokens.tolist(), sc.sum(axis=1).tolist()

    def run():
        st = lpt.lpt_assign(order, tok, cost, dp, m, cap, spread=3.0)
        assert st is not None
        repack._repack(st, order, tok, cost)
        by_stage = stage_lpt.lpt_by_stage(order, tokens, sc, dp, m, cap)
        return st.rank_of, st.bin_of, st.bin_cost, by_stage[0].tolist(), by_stage[1].tolist()

    with_heaps = run()
    for module in (lpt, repack, stage_lpt):
        monkeypatch.setattr(module, "_SCAN_UP_TO", m)
    assert run() == with_heaps
