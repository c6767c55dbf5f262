"""The at-scale simulation's baselines on small synthetic metadata: equal work, same shape."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.e2e_baselines import BASELINES, baseline_steps, blend_index
from benchmarks.e2e_model import MODELS, planner_cost
from test_e2e_sim import _meta  # the same small synthetic text + image metadata


def test_blend_index_keeps_every_prefix_within_two_samples_of_its_share() -> None:
    weights = np.array([5.0, 5.0, 1 / 3, 1 / 3, 1 / 3])
    index = blend_index(weights, 5000)
    share = weights / weights.sum()
    for k in range(weights.size):
        counts = np.cumsum(index == k)
        ideal = share[k] * np.arange(1, index.size + 1)
        assert np.abs(counts - ideal).max() <= 2.0, k
    assert blend_index(np.array([1.0, 0.0]), 10).tolist() == [0] * 10


@pytest.mark.parametrize("seed", [0, 3])
def test_baselines_do_mdatas_work_in_the_same_micro_batches(seed: int) -> None:
    dp, m, cap = 8, 4, 8192
    rng = np.random.default_rng(seed)
    step_tokens = (dp * m * cap * 0.8 * rng.uniform(0.97, 1.03, 5)).tolist()
    tally: dict = {}
    out = baseline_steps(_meta(), {"text": 1.0, "images": 2.0}, dp=dp, micro_batches=m,
                         max_tokens=cap, pp=2, seed=seed, step_tokens=step_tokens,
                         step_samples=100, cost_fn=planner_cost(MODELS["llava-ov-0.5b"]), tally=tally)
    assert set(out) == set(BASELINES)
    for name in BASELINES:
        for ranks in out[name]:
            assert len(ranks) == dp
            assert all(len(mbs) == m for mbs, _ in ranks), name
    # Token budgets: each step within a sample per rank, the run within 1%.
    for name in ("megatron", "local_best", "bridge"):
        got = [sum(float(t.sum()) for mbs, _ in ranks for t, _ in mbs) for ranks in out[name]]
        assert sum(got) == pytest.approx(sum(step_tokens), rel=0.01)
        assert all(t.sum() <= cap for ranks in out[name] for mbs, _ in ranks for t, _ in mbs)
    # dataloader: a fixed number of samples per rank (100 over 8: 13 or 12), uncapped.
    for ranks in out["dataloader"]:
        assert sorted(len(srcs) for _, srcs in ranks) == [12] * 4 + [13] * 4
    # local_best rearranges megatron's own draw: the same samples on every rank and step.
    for a, b in zip(out["megatron"], out["local_best"]):
        for (ma, _), (mb, _) in zip(a, b):
            assert sorted(np.concatenate([t for t, _ in ma]).tolist()) == \
                sorted(np.concatenate([t for t, _ in mb]).tolist())


def test_local_best_packs_by_cost_better_than_tokens() -> None:
    # Its micro-batches are cost-balanced: the most expensive is no costlier than megatron's.
    cost = planner_cost(MODELS["llava-ov-0.5b"])
    out = baseline_steps(_meta(), {"text": 1.0, "images": 1.0}, dp=4, micro_batches=4,
                         max_tokens=16384, pp=1, seed=1, step_tokens=[4 * 4 * 16384 * 0.7] * 3,
                         step_samples=40, cost_fn=cost)
    for a, b in zip(out["megatron"], out["local_best"]):
        for (ma, _), (mb, _) in zip(a, b):
            worst = [max(float(cost(t, p).sum()) for t, p in mbs) for mbs in (ma, mb)]
            assert worst[1] <= worst[0] * (1 + 1e-9)
