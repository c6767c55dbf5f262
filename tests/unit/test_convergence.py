"""The convergence benchmark's claim, on a few steps: with the loss normalised per token over the
global batch, training on mdata's balanced placement and on a per-rank loader's placement of the
same samples gives the same losses up to floating-point order; averaged per rank first, it does
not. Real corpus text, a real (tiny) torch model; no cluster."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from benchmarks.convergence import gap_over_noise, train_both  # noqa: E402


def test_placement_changes_nothing_under_global_token_normalisation(example_corpus):
    out = train_both(example_corpus, steps=6, seeds=2)
    curves = out["curves"]
    assert out["steps_with_other_placement"] >= 3  # balancing did move samples between ranks
    for seed in range(2):
        same = zip(curves[("global", "mdata", seed)], curves[("global", "baseline", seed)])
        assert all(abs(a - b) <= 1e-4 * abs(b) for a, b in same)
    # per-rank means weight tokens by their rank's count: the placements then train differently
    assert gap_over_noise(curves, "rank_mean", 2) > 10 * gap_over_noise(curves, "global", 2)
