"""Memory at equal throughput (``benchmarks/memory_iso.py``): the trainers' pace and the search
for each system's smallest feeding configuration, without processes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.fleet import _batch_cost
from benchmarks.memory_iso import primed_samples, seconds_per_cost, smallest_feeding
from mdata.cost import AttentionCost


def test_pace_is_a_7b_model_on_an_h100_split_over_the_cp_group() -> None:
    flops_per_unit = 6 * 4096 * 32  # training = 3 forward passes; a unit is 2 x hidden x layers
    assert seconds_per_cost(1, slowdown=1.0) == pytest.approx(flops_per_unit / (989e12 * 0.4))
    assert seconds_per_cost(4, slowdown=1.0) == pytest.approx(seconds_per_cost(1, slowdown=1.0) / 4)
    assert seconds_per_cost(2, slowdown=3.0) == pytest.approx(3 * seconds_per_cost(2, slowdown=1.0))
    # a 4k-token document: 6 x params x tokens (12 x 4096^2 x 32 = 6.4B weights in the layers)
    # plus the attention term, about 0.43 s of one H100 at 40% MFU
    doc = float(AttentionCost()(np.array([4096.0]), np.zeros(1))[0])
    dense = 6 * 12 * 4096**2 * 32 * 4096 / (989e12 * 0.4)
    assert dense < doc * seconds_per_cost(1, slowdown=1.0) < 1.1 * dense
    with pytest.raises(ValueError):
        seconds_per_cost(0)


def test_smallest_feeding_takes_the_first_size_under_the_goal() -> None:
    stalls = {1: 0.3, 2: 0.02, 3: 0.004, 4: 0.0}
    asked: list[int] = []

    def measure(size: int) -> dict:
        asked.append(size)
        return {"stall": stalls[size], "pss_mb": 100.0 * size}

    found = smallest_feeding((1, 2, 3, 4), measure, goal=0.01)
    assert (found["size"], found["fed"], found["pss_mb"]) == (3, True, 300.0)
    assert found["tried"] == [(1, 0.3), (2, 0.02), (3, 0.004)]
    assert asked == [1, 2, 3]  # no larger configuration is started once one feeds


def test_smallest_feeding_says_when_nothing_tried_feeds() -> None:
    found = smallest_feeding((1, 2), lambda size: {"stall": 0.5 / size}, goal=0.01)
    assert (found["size"], found["fed"], found["plateau"]) == (2, False, False)
    assert [s for s, _ in found["tried"]] == [1, 2]


def test_a_stall_more_workers_do_not_lower_is_a_floor_not_a_reason_to_grow() -> None:
    """A rank that spends 1.3% of its step taking batches from its workers stalls as much with
    2 workers: the smaller configuration is the answer, marked as a plateau."""
    stalls = {1: 0.013, 2: 0.0118, 3: 0.0}
    found = smallest_feeding((1, 2, 3), lambda size: {"stall": stalls[size], "pss_mb": size}, goal=0.01)
    assert (found["size"], found["fed"], found["plateau"], found["pss_mb"]) == (1, False, True, 1)
    assert [s for s, _ in found["tried"]] == [1, 2]
    # a stall that more workers do lower keeps the search going
    falling = {1: 0.2, 2: 0.1, 3: 0.005}
    found = smallest_feeding((1, 2, 3), lambda size: {"stall": falling[size]}, goal=0.01)
    assert (found["size"], found["fed"], found["plateau"]) == (3, True, False)
    # so does a large stall one more worker barely lowers: far from fed, not a floor
    starved = {1: 0.72, 2: 0.68, 3: 0.3, 4: 0.004}
    found = smallest_feeding((1, 2, 3, 4), lambda size: {"stall": starved[size]}, goal=0.01)
    assert (found["size"], found["fed"], found["plateau"]) == (4, True, False)


def test_a_loader_is_primed_once_it_drew_from_every_source_in_expectation() -> None:
    assert primed_samples(1) == 1
    assert primed_samples(64) == 331  # 64 x (ln 64 + 1) = 330.2
    assert primed_samples(306) == int(np.ceil(306 * (np.log(306) + 1)))
    # the coupon collector's expectation: n x H(n) <= n (ln n + 1)
    for n in (5, 64, 306, 1024):
        harmonic = n * sum(1.0 / k for k in range(1, n + 1))
        assert harmonic <= primed_samples(n) <= harmonic + n
    with pytest.raises(ValueError):
        primed_samples(0)


def test_a_cp_rank_is_paced_on_its_whole_documents() -> None:
    """An mdata rank under CP holds pieces of each document (local ``cu_seqlens``); its pace
    comes from the whole documents (``cu_seqlens_global``), as a baseline CP rank loads them."""
    whole = {"cu_seqlens": torch.tensor([0, 1000, 3000, 3000], dtype=torch.int32)}
    piece = {"cu_seqlens": torch.tensor([0, 250, 750, 750], dtype=torch.int32),
             "cu_seqlens_global": whole["cu_seqlens"]}
    assert _batch_cost([piece]) == pytest.approx(_batch_cost([whole]))
    expected = float(AttentionCost()(np.array([1000.0, 2000.0]), np.zeros(2)).sum())
    assert _batch_cost([whole]) == pytest.approx(expected)


def test_the_budget_extrapolates_a_workers_memory_along_its_slope_per_source() -> None:
    from benchmarks.memory_iso import _Budget

    budget = _Budget(10 * 1024)
    assert budget.families(2, 1024, 1) == 2  # nothing measured yet: nothing to go by
    budget.learn({"pss_mb": 237.0, "measured_ranks": 2}, 5, 1)  # 118.5 MB per worker at 5
    assert budget.per_worker_mb(64) == pytest.approx(118.5 * 64 / 5)  # one point: proportional
    budget.learn({"pss_mb": 1446.0, "measured_ranks": 2}, 64, 2)  # 361.5 MB per worker at 64
    slope = (361.5 - 118.5) / 59
    assert budget.per_worker_mb(1024) == pytest.approx(361.5 + slope * 960)  # ~4.3 GB
    assert budget.families(2, 1024, 1) == 2
    assert budget.families(2, 1024, 2) == 1  # two families of two workers would not fit
    assert budget.families(2, 1024, 4) == 0


def test_a_point_that_fails_loses_only_its_own_figures(monkeypatch) -> None:
    """A run of several hours keeps every point it measured when one point fails (an mdata fleet
    that could not prime 1,024 sources in time on a loaded machine once lost the whole sweep)."""
    import benchmarks.memory_iso as iso

    def point(cfg: dict, n: int, budget) -> dict:
        if n == 306:
            raise TimeoutError("priming took over 900 s")
        return {f"memory.iso_ratio_{n}": float(n)}

    monkeypatch.setattr(iso, "_point", point)
    out = iso.iso_figures(quick=False)
    assert [out[f"memory.iso_ratio_{n}"] for n in (5, 64, 1024)] == [5.0, 64.0, 1024.0]
    lost = out["memory.iso_ratio_306"]
    assert "not measured at 306 sources: TimeoutError: priming took over 900 s" in str(lost)
