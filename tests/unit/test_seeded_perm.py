"""mdata.seeded_perm draws numpy's permutations without numpy's seeding: compared with numpy."""

from __future__ import annotations

import numpy as np
import pytest

from mdata import seeded_perm
from mdata.seeded_perm import (EpochPermutations, entropy_words, pcg64_state, permutation,
                               seed_words, seed_words_many)


def _numpy(entropy, n: int) -> np.ndarray:
    return np.random.Generator(np.random.PCG64(list(entropy))).permutation(n)


def _entropies(seed: int, count: int):
    """Entropies as a source's order builds them (3 to 5 words) and odder ones: zeros, values
    of two and three 32-bit words, up to 9 words (past SeedSequence's pool of 4)."""
    rng = np.random.default_rng(seed)
    for k in range(count):
        ent = [int(v) for v in rng.integers(0, 2**32, int(rng.integers(1, 8)))]
        if k % 5 == 0:
            ent[0] = 0
        if k % 7 == 0:
            ent.append(int(rng.integers(0, 2**62)) * 5)
        yield tuple(ent)


def test_seed_words_and_state_are_numpys() -> None:
    for ent in _entropies(0, 400):
        words = seed_words(entropy_words(ent))
        assert words == tuple(int(v) for v in
                              np.random.SeedSequence(list(ent)).generate_state(4, np.uint64))
        state = np.random.PCG64(list(ent)).state["state"]
        assert pcg64_state(words) == (state["state"], state["inc"])


def test_seed_words_many_agrees_with_one_at_a_time() -> None:
    rng = np.random.default_rng(1)
    for length in (1, 3, 4, 5, 9):
        rows = rng.integers(0, 2**32, (37, length)).astype(np.uint32)
        rows[0] = 0
        got = seed_words_many(rows)
        assert got.dtype == np.uint64 and got.shape == (37, 4)
        for row, words in zip(rows.tolist(), got.tolist()):
            assert tuple(words) == seed_words(row)


@pytest.mark.parametrize("n", [0, 1, 2, 5, 17, 300])
def test_permutations_are_numpys(n) -> None:
    for ent in _entropies(n, 60):
        got = permutation(ent, n)
        want = _numpy(ent, n)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_epoch_permutations_in_order_at_random_and_across_keys() -> None:
    """Batches grow while epochs follow each other (seeded as arrays from 8 on); jumps, other
    windows and epochs near 2**32 (where a batch would need two words) start over."""
    perms = EpochPermutations()
    calls = [((7, 99, e, 0), 5) for e in range(300)]  # in order: batches of 1, 2, 4, ... 64
    calls += [((7, 99, e, 0), 4) for e in (3, 250, 251, 9, 400)]  # jumps back and ahead
    calls += [((7, 99, e, w), 6) for e in (2, 3) for w in range(3)]  # windows take turns
    calls += [((7, 99, 2**32 - 3 + k, 1), 5) for k in range(20)]  # across two words
    calls += [((2**40, 5, e), 3) for e in range(40)]  # a seed of two words
    for entropy, n in calls:
        at = 2
        np.testing.assert_array_equal(perms(entropy, at, n), _numpy(entropy, n))
    assert perms((1, 2, 3, 4), 2, 1).tolist() == [0]


def test_a_numpy_that_seeds_otherwise_gets_its_own_permutations(monkeypatch) -> None:
    """Should numpy's seeding ever differ from the integer code here, every permutation is
    numpy's own (what the orders gave before the fast path), never a drifted one."""
    assert seeded_perm.numpy_agrees()  # this numpy seeds as the code does
    monkeypatch.setattr(seeded_perm, "seed_words", lambda words: (1, 2, 3, 4))  # a wrong hash
    monkeypatch.setattr(seeded_perm, "_agrees", None)
    assert not seeded_perm.numpy_agrees()
    entropy = (7, 11, 5)
    expected = np.random.Generator(np.random.PCG64(list(entropy))).permutation(9)
    assert np.array_equal(seeded_perm.permutation(entropy, 9), expected)
    assert np.array_equal(seeded_perm.EpochPermutations()(entropy, 2, 9), expected)
