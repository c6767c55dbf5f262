"""balance_step, the per-rank greedy baseline, CP zigzag slices and the brute-force optimum."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdata.balance import (
    StepAssignment,
    balance_step,
    brute_force_min_makespan,
    causal_attention_work,
    cp_zigzag_slices,
    greedy_pack_baseline,
    lower_bound,
)
from mdata.balance.lpt import PackState
from mdata.balance.repack import fill_empty_micro_batches
from mdata.cost import AttentionCost
from mdata.errors import PlanError

QUADRATIC = AttentionCost(a=1.0, b=0.0)


def check_valid(result: StepAssignment, tokens: np.ndarray, costs: np.ndarray, *, dp: int,
                micro_batches: int, max_tokens: int) -> None:
    """Every invariant a consumer of a StepAssignment relies on."""
    n = len(tokens)
    m = result.num_micro_batches
    assert result.rank.shape == result.micro_batch.shape == result.position.shape == (n,)
    assert result.rank.dtype == result.micro_batch.dtype == result.position.dtype == np.int32
    assert m >= micro_batches
    assert ((0 <= result.rank) & (result.rank < dp)).all()
    assert ((0 <= result.micro_batch) & (result.micro_batch < m)).all()
    # each sample exactly once: positions in a micro-batch are 0..k-1, in input order
    for r in range(dp):
        for b in range(m):
            members = np.flatnonzero((result.rank == r) & (result.micro_batch == b))
            assert result.position[members].tolist() == list(range(len(members)))
            assert result.members(r, b).tolist() == members.tolist()
    # totals match the assignment, and capacity holds
    expect_tokens = np.zeros((dp, m), dtype=np.int64)
    np.add.at(expect_tokens, (result.rank, result.micro_batch), tokens)
    assert np.array_equal(result.per_micro_batch_tokens, expect_tokens)
    assert (result.per_micro_batch_tokens <= max_tokens).all()
    expect_cost = np.zeros(dp)
    np.add.at(expect_cost, result.rank, costs)
    np.testing.assert_allclose(result.per_rank_cost, expect_cost, rtol=1e-12, atol=1e-9)
    assert result.per_micro_batch_cost.shape == (dp, m)
    assert result.lower_bound == pytest.approx(lower_bound(costs, dp))
    assert result.makespan >= result.lower_bound * (1 - 1e-12)


def heavy_tailed_batch(rng: np.random.Generator, total_tokens: int, cap: int) -> np.ndarray:
    """Lognormal document lengths (median ~1-2k tokens, long tail) truncated at the context."""
    mu, sigma = rng.uniform(6.5, 7.5), rng.uniform(0.9, 1.4)
    lengths = np.clip(rng.lognormal(mu, sigma, size=total_tokens // 200), 16, cap).astype(np.int64)
    return lengths[: int(np.searchsorted(np.cumsum(lengths), total_tokens)) + 1]


# -- exact small cases -------------------------------------------------------------------------


def test_refinement_fixes_the_classic_lpt_worst_case():
    # LPT alone puts 3+2+2 on one rank (7); the optimum is 3+3 / 2+2+2 (6)
    costs = np.array([3.0, 3.0, 2.0, 2.0, 2.0])
    result = balance_step(np.ones(5, np.int64), costs, dp=2, micro_batches=1, max_tokens=100)
    assert brute_force_min_makespan(costs, 2) == 6.0
    assert result.makespan == 6.0
    assert sorted(result.per_rank_cost.tolist()) == [6.0, 6.0]


def test_micro_batches_grow_only_when_tokens_do_not_fit():
    tokens = np.array([6, 6, 6])
    result = balance_step(tokens, tokens.astype(float), dp=2, micro_batches=1, max_tokens=10)
    assert result.num_micro_batches == 2 and result.requested_micro_batches == 1
    check_valid(result, tokens, tokens.astype(float), dp=2, micro_batches=1, max_tokens=10)
    roomy = balance_step(tokens, tokens.astype(float), dp=3, micro_batches=1, max_tokens=10)
    assert roomy.num_micro_batches == 1
    assert sorted(roomy.rank.tolist()) == [0, 1, 2]


def test_micro_batches_of_a_rank_are_cost_balanced_for_pipeline_parallelism():
    tokens = np.full(8, 100)
    costs = np.array([8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0])
    result = balance_step(tokens, costs, dp=1, micro_batches=4, max_tokens=1000)
    assert result.per_micro_batch_cost.tolist() == [[9.0, 9.0, 9.0, 9.0]]
    assert result.per_micro_batch_tokens.tolist() == [[200, 200, 200, 200]]


def test_long_documents_are_spread_over_ranks():
    # two 16k documents and 32 1k documents: same tokens per rank would be easy, same cost is not
    tokens = np.array([16384, 16384] + [1024] * 32)
    costs = QUADRATIC(tokens, None)
    result = balance_step(tokens, costs, dp=2, micro_batches=2, max_tokens=16384)
    assert result.rank[0] != result.rank[1]
    assert result.max_over_lower_bound == 1.0
    baseline = greedy_pack_baseline(tokens, costs, dp=2, micro_batches=2, max_tokens=16384)
    assert baseline.per_rank_cost.tolist() == [2 * 16384**2 + 15 * 1024**2, 17 * 1024**2]
    assert baseline.makespan / result.makespan == pytest.approx(
        (2 * 16384**2 + 15 * 1024**2) / (16384**2 + 16 * 1024**2)
    )


def test_capacity_counts_context_parallel_padding():
    tokens = np.array([5, 5, 5])  # 8 slots each when padded to a multiple of 2*cp = 4
    result = balance_step(tokens, np.array([3.0, 2.0, 1.0]), dp=1, micro_batches=1,
                          max_tokens=16, pad_multiple=4)
    assert result.num_micro_batches == 2
    assert result.micro_batch.tolist() == [0, 1, 1]
    assert result.per_micro_batch_tokens.tolist() == [[8, 16]]
    assert balance_step(tokens, np.ones(3), dp=1, micro_batches=1, max_tokens=16).num_micro_batches == 1
    with pytest.raises(PlanError, match=r"sample 0 has 15 tokens \(16 after padding to a multiple "
                                        r"of 4; make max_tokens a multiple of 4\)"):
        balance_step([15], [1.0], dp=1, micro_batches=1, max_tokens=15, pad_multiple=4)


def test_baseline_splits_in_arrival_order_and_packs_next_fit():
    tokens = np.array([4, 4, 4, 4, 4, 4, 4])
    result = greedy_pack_baseline(tokens, np.ones(7), dp=2, micro_batches=1, max_tokens=8)
    assert result.rank.tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert result.micro_batch.tolist() == [0, 0, 1, 1, 0, 0, 1]
    assert result.position.tolist() == [0, 1, 0, 1, 0, 1, 0]
    assert result.num_micro_batches == 2
    assert result.per_micro_batch_tokens.tolist() == [[8, 8], [8, 4]]
    check_valid(result, tokens, np.ones(7), dp=2, micro_batches=1, max_tokens=8)


def test_empty_step():
    result = balance_step(np.zeros(0, np.int64), np.zeros(0), dp=4, micro_batches=2, max_tokens=8)
    assert result.num_samples == 0 and result.num_micro_batches == 2
    assert result.per_rank_cost.tolist() == [0.0] * 4
    assert (result.lower_bound, result.max_over_lower_bound, result.max_over_mean) == (0.0, 1.0, 1.0)


def test_result_is_read_only_and_renders_html():
    tokens = np.array([10, 20, 30])
    result = balance_step(tokens, tokens * 1.0, dp=2, micro_batches=1, max_tokens=64)
    with pytest.raises(ValueError):
        result.rank[0] = 1
    page = result.to_html()
    assert "3 samples, dp=2, 1 micro-batches of &le; 64 tokens" in page
    assert page.count("<tr>") == 3  # header + 2 ranks
    with pytest.raises(PlanError, match="no micro-batch \\(2, 0\\): this step has dp=2 ranks"):
        result.members(2, 0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_tokens=[5, 20], costs=[1.0, 1.0]), "sample 1 has 20 tokens, outside 0..max_tokens=16"),
        (dict(num_tokens=[5, 5], costs=[1.0, -2.0]), "sample 1 has cost -2.0; costs must be finite"),
        (dict(num_tokens=[5, 5], costs=[1.0]), "must be 1-d arrays of the same length"),
        (dict(num_tokens=[5.5], costs=[1.0]), "num_tokens must be integers"),
        (dict(num_tokens=[5], costs=[1.0], dp=0), "dp must be an int >= 1, got 0"),
        (dict(num_tokens=[5], costs=[1.0], micro_batches=1.5), "micro_batches must be an int >= 1"),
    ],
)
def test_invalid_input_raises_plan_error(kwargs, message):
    args = dict(dp=2, micro_batches=1, max_tokens=16) | kwargs
    with pytest.raises(PlanError, match=message):
        balance_step(**args)
    with pytest.raises(PlanError, match=message):
        greedy_pack_baseline(**args)


# -- properties --------------------------------------------------------------------------------


@given(
    costs=st.lists(st.integers(1, 100), min_size=1, max_size=9),
    dp=st.integers(2, 3),
    seed=st.integers(0, 3),
)
@settings(max_examples=200, deadline=None)
def test_within_four_thirds_of_the_optimum_on_small_instances(costs, dp, seed):
    costs = np.array(costs, dtype=np.float64)
    tokens = np.ones(len(costs), np.int64)
    result = balance_step(tokens, costs, dp=dp, micro_batches=1, max_tokens=len(costs), seed=seed)
    check_valid(result, tokens, costs, dp=dp, micro_batches=1, max_tokens=len(costs))
    assert result.makespan <= 4 / 3 * brute_force_min_makespan(costs, dp) + 1e-9


def _noisy_quadratic(tokens: np.ndarray, seed: int) -> np.ndarray:
    """Quadratic costs plus seeded noise, so that equal lengths do not tie."""
    return QUADRATIC(tokens, None) + np.random.default_rng(seed).uniform(0, 10, len(tokens))


@given(
    tokens=st.lists(st.integers(0, 64), min_size=0, max_size=60),
    dp=st.integers(1, 6),
    micro_batches=st.integers(1, 4),
    max_tokens=st.integers(64, 128),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=150, deadline=None)
def test_capacity_and_exactly_once_on_arbitrary_instances(tokens, dp, micro_batches, max_tokens, seed):
    tokens = np.array(tokens, dtype=np.int64)
    costs = _noisy_quadratic(tokens, seed)
    for fn in (balance_step, greedy_pack_baseline):
        extra = {"seed": seed} if fn is balance_step else {}
        result = fn(tokens, costs, dp=dp, micro_batches=micro_batches, max_tokens=max_tokens, **extra)
        check_valid(result, tokens, costs, dp=dp, micro_batches=micro_batches, max_tokens=max_tokens)
    # samples of at most half a micro-batch filling at most half the capacity always fit as asked
    if tokens.sum() * 2 <= dp * micro_batches * max_tokens:
        assert balance_step(tokens, costs, dp=dp, micro_batches=micro_batches,
                            max_tokens=max_tokens).num_micro_batches == micro_batches


@given(
    tokens=st.lists(st.integers(1, 128), min_size=1, max_size=60),
    dp=st.integers(1, 6),
    micro_batches=st.integers(2, 5),
    stages=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=150, deadline=None)
def test_a_micro_batch_is_empty_only_where_its_rank_has_fewer_samples_than_micro_batches(
        tokens, dp, micro_batches, stages, seed):
    tokens = np.array(tokens, dtype=np.int64)
    costs = _noisy_quadratic(tokens, seed)
    a = balance_step(tokens, costs, dp=dp, micro_batches=micro_batches, max_tokens=128,
                     seed=seed, stages=stages)
    for r in range(dp):
        held = np.bincount(a.micro_batch[a.rank == r], minlength=a.num_micro_batches)
        assert np.count_nonzero(held == 0) == max(0, a.num_micro_batches - int(held.sum())), (r, held)


def test_an_emptied_micro_batch_gets_the_cheapest_sample_of_the_costliest_one():
    """Refinement can take the only sample out of a micro-batch; the fill pass moves one back in
    from the same rank without raising its costliest micro-batch or changing its total."""
    tok, cost = [10, 20, 30, 40, 5], [1.0, 4.0, 9.0, 16.0, 0.5]
    st_ = PackState(5, dp=1, m=3, max_tokens=100)
    st_.rank_of, st_.bin_of = [0] * 5, [0, 0, 1, 1, 1]  # micro-batch 2 is empty
    for i, b in enumerate(st_.bin_of):
        st_.bin_tokens[0][b] += tok[i]
        st_.bin_cost[0][b] += cost[i]
    st_.rank_cost = [sum(cost)]
    fill_empty_micro_batches(st_, tok, cost)
    assert st_.bin_of == [0, 0, 1, 1, 2]  # sample 4 (cheapest) left micro-batch 1 (costliest)
    assert st_.bin_tokens[0] == [30, 70, 5] and st_.bin_cost[0] == [5.0, 25.0, 0.5]
    # free samples (a cost model that prices them at 0) all tie for the cheapest micro-batch
    free = balance_step(np.full(8, 10), np.zeros(8), dp=1, micro_batches=4, max_tokens=100)
    assert np.bincount(free.micro_batch, minlength=4).tolist() == [5, 1, 1, 1]
    one = PackState(1, dp=1, m=2, max_tokens=100)
    fill_empty_micro_batches(one, [10], [1.0])  # one sample, two micro-batches: one stays empty
    assert one.bin_of == [0]


@pytest.mark.parametrize(
    "dp, micro_batches, max_tokens, global_tokens",
    [
        (8, 8, 16384, 1 << 20),
        (64, 4, 16384, 4 << 20),
        (64, 2, 32768, 4 << 20),
        (512, 1, 32768, 4 << 20),
    ],
)
@pytest.mark.parametrize("cost", [QUADRATIC, AttentionCost()], ids=["a*l^2", "default"])
@given(seed=st.integers(0, 2**32 - 1))
@settings(max_examples=8, deadline=None)
def test_near_lower_bound_on_heavy_tailed_global_batches(
    dp, micro_batches, max_tokens, global_tokens, cost, seed
):
    rng = np.random.default_rng(seed)
    tokens = heavy_tailed_batch(rng, global_tokens, max_tokens)
    costs = cost(tokens, None)
    result = balance_step(tokens, costs, dp=dp, micro_batches=micro_batches, max_tokens=max_tokens)
    check_valid(result, tokens, costs, dp=dp, micro_batches=micro_batches, max_tokens=max_tokens)
    assert result.max_over_lower_bound <= 1.03
    baseline = greedy_pack_baseline(tokens, costs, dp=dp, micro_batches=micro_batches,
                                    max_tokens=max_tokens)
    assert result.makespan <= baseline.makespan * 1.03


def test_deterministic_for_a_seed():
    rng = np.random.default_rng(7)
    tokens = heavy_tailed_batch(rng, 1 << 20, 16384)
    tokens[::3] = 512  # many ties, which the seed breaks
    costs = QUADRATIC(tokens, None)
    runs = [balance_step(tokens, costs, dp=16, micro_batches=4, max_tokens=16384, seed=s)
            for s in (1, 1, 2)]
    assert np.array_equal(runs[0].rank, runs[1].rank)
    assert np.array_equal(runs[0].micro_batch, runs[1].micro_batch)
    assert np.array_equal(runs[0].position, runs[1].position)
    assert not np.array_equal(runs[0].rank, runs[2].rank)


# -- context parallelism -----------------------------------------------------------------------


def test_zigzag_exact_small_cases():
    assert [s.tolist() for s in cp_zigzag_slices(8, 2)] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    # 10 tokens, 4 chunks of 3 slots: the last chunk holds 1 token and 2 padding slots
    assert [s.tolist() for s in cp_zigzag_slices(10, 2)] == [[0, 1, 2, 9], [3, 4, 5, 6, 7, 8]]
    assert [s.tolist() for s in cp_zigzag_slices(3, 1)] == [[0, 1, 2]]
    assert [s.tolist() for s in cp_zigzag_slices(0, 2)] == [[], []]


@given(length=st.integers(0, 5000), cp=st.integers(1, 16))
@settings(max_examples=200, deadline=None)
def test_zigzag_covers_every_token_once(length, cp):
    slices = cp_zigzag_slices(length, cp)
    assert len(slices) == cp
    assert np.array_equal(np.sort(np.concatenate(slices)), np.arange(length))
    slots = 2 * -(-length // (2 * cp))
    assert all(len(s) <= slots for s in slices)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_zigzag_evens_causal_work_where_a_contiguous_split_does_not(cp):
    length = 2 * cp * 1024
    zigzag = causal_attention_work(cp_zigzag_slices(length, cp))
    assert zigzag.max() == zigzag.min()
    contiguous = causal_attention_work(np.array_split(np.arange(length), cp))
    assert contiguous.max() / contiguous.min() > 2 * cp - 1 - 0.01
    assert zigzag.sum() == contiguous.sum() == length * (length + 1) / 2


def test_zigzag_validation():
    with pytest.raises(PlanError, match="cp must be an int >= 1, got 0"):
        cp_zigzag_slices(8, 0)
    with pytest.raises(PlanError, match="sequence length must be an int >= 0, got -1"):
        cp_zigzag_slices(-1, 2)


# -- brute force -------------------------------------------------------------------------------


def test_brute_force_exact_values():
    assert brute_force_min_makespan([3, 3, 2, 2, 2], 2) == 6.0
    assert brute_force_min_makespan([5, 4, 3, 3, 3], 2) == 9.0
    assert brute_force_min_makespan([7, 1, 1], 3) == 7.0
    assert brute_force_min_makespan([], 3) == 0.0
    with pytest.raises(PlanError, match="at most 16 samples, got 17"):
        brute_force_min_makespan(np.ones(17), 2)


def test_pigeonhole_bound_is_valid_and_tight_when_large_samples_outnumber_ranks():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from mdata.balance import pigeonhole_lower_bound

    # 5 equal large items on 4 ranks: two share a rank, whatever the small ones do
    costs = np.array([10.0] * 5 + [1.0] * 3)
    assert lower_bound(costs, 4) == 13.25
    assert pigeonhole_lower_bound(costs, 4) == 20.0
    assert brute_force_min_makespan(costs, 4) == 20.0

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.integers(1, 50), min_size=1, max_size=9), st.integers(2, 3))
    def never_above_the_optimum(values, dp):
        c = np.array(values, dtype=np.float64)
        assert lower_bound(c, dp) <= pigeonhole_lower_bound(c, dp) <= brute_force_min_makespan(c, dp) + 1e-9

    never_above_the_optimum()
