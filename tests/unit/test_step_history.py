"""The scheduler's kept step summaries (mdata.planner.step_history): compact, read back whole."""

from __future__ import annotations

import numpy as np

from mdata.planner.instructions import StepSummary
from mdata.planner.step_history import StepHistory

NAMES = ("web", "code", "books", "images")


def summary(step: int, counts, weights=(0.4, 0.3, 0.2, 0.1), measure: str = "cost") -> StepSummary:
    counts = np.array(counts, np.int64)
    return StepSummary(step=step, per_rank_cost=np.array([3.0, 5.0]), lower_bound=4.0,
                       max_over_mean=1.25, max_over_lower_bound=1.25, num_micro_batches=2,
                       counts=counts, tokens=counts * 100 + 7 * (counts > 0),
                       target_weights=np.array(weights), truncated=1, skipped=2, names=NAMES,
                       measure=measure)


def test_a_kept_step_reads_back_as_its_summary_dict_in_the_same_key_order():
    history = StepHistory(NAMES, keep=10)
    for s, counts in enumerate([(3, 0, 1, 0), (0, 0, 0, 0), (1, 2, 3, 4)]):
        history.add(summary(s, counts))
    for s, counts in enumerate([(3, 0, 1, 0), (0, 0, 0, 0), (1, 2, 3, 4)]):
        want = summary(s, counts).to_dict(NAMES)
        got = history[s]
        assert got == want and list(got) == list(want)
    assert list(history) == [0, 1, 2] and len(history) == 3 and 1 in history and 5 not in history
    history[0]["per_rank_cost"].append(9.0)  # a reader's copy: the kept step is unchanged
    assert history[0]["per_rank_cost"] == [3.0, 5.0]


def test_it_keeps_the_newest_steps_and_a_replanned_step_replaces_its_summary():
    history = StepHistory(NAMES, keep=3)
    for s in range(6):
        history.add(summary(s, (s, 1, 0, 0)))
    assert list(history) == [3, 4, 5] and history.newest(2) == [4, 5] and history.newest(0) == []
    history.add(summary(4, (9, 9, 9, 9)))  # planned again after a rewind
    assert history[4]["counts"] == {"web": 9, "code": 9, "books": 9, "images": 9}
    assert sorted(history) == [3, 4, 5]


def test_equal_weights_are_kept_once_and_changed_ones_anew():
    """A static mixture keeps one weights array for every step, not one per step per source."""
    history = StepHistory(NAMES, keep=10)
    for s in range(4):
        history.add(summary(s, (1, 1, 1, 1)))
    history.add(summary(4, (1, 1, 1, 1), weights=(0.1, 0.2, 0.3, 0.4)))
    kept = [history._steps[s].weights for s in range(5)]
    assert all(w is kept[0] for w in kept[:4]) and kept[4] is not kept[0]
    assert history[4]["target_weights"] == {"web": 0.1, "code": 0.2, "books": 0.3, "images": 0.4}
    assert history[3]["target_weights"]["web"] == 0.4


def test_only_the_drawn_sources_are_kept_per_step():
    names = tuple(f"s{i}" for i in range(10_000))
    counts = np.zeros(10_000, np.int64)
    counts[[5, 77, 9_000]] = (2, 1, 4)
    history = StepHistory(names, keep=5)
    history.add(StepSummary(step=0, per_rank_cost=np.ones(4), lower_bound=1.0, max_over_mean=1.0,
                            max_over_lower_bound=1.0, num_micro_batches=1, counts=counts,
                            tokens=counts * 10, target_weights=np.full(10_000, 1e-4), truncated=0,
                            skipped=0, names=names))
    kept = history._steps[0]
    assert kept.drawn.tolist() == [5, 77, 9_000] and kept.tokens.tolist() == [20, 10, 40]
    got = history[0]
    assert sum(got["counts"].values()) == 7 and got["counts"]["s9000"] == 4 and got["tokens"]["s5"] == 20
    assert len(got["target_weights"]) == 10_000
