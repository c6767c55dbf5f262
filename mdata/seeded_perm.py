"""Seeded permutations, bit for bit those of ``Generator(PCG64(entropy)).permutation(n)``, cheap.

Why: a source's order (:mod:`mdata.order`) permutes each epoch's chunks and each shuffle
window's rows with a generator seeded by ``(seed, crc32(name), epoch, ...)``; the order is part
of exact resume, so those permutations may never change. Building the generator is what costs:
``PCG64([...])`` hashes its entropy through a ``SeedSequence`` and its Python layers (about
30 us), and a source of 4-5 rows starts an epoch every 4-5 samples (about 3,100 epochs a step at
8,192 GPUs over 306 such sources). Here the seeding is done in plain integers and one generator
is reused:

* :func:`seed_words`: ``SeedSequence(entropy).generate_state(4, np.uint64)`` (numpy's hash:
  its constants and its order of mixing, in 32-bit integer arithmetic);
* :func:`pcg64_state`: PCG64's ``(state, inc)`` from those words, as ``pcg64_set_seed`` sets
  them (two steps of the 128-bit LCG);
* :func:`permutation`: numpy's own ``Generator.permutation`` on a generator given that state
  (so the shuffle itself is numpy's), and ``arange(n)`` for ``n <= 1``, where numpy draws
  nothing.

About a third of the cost of building the generator; tests compare all three with numpy's over
many entropies, and :func:`numpy_agrees` checks once per process that the numpy in use seeds as
this code does (else every permutation is numpy's own, seeded as before).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

__all__ = ["EpochPermutations", "entropy_words", "numpy_agrees", "pcg64_state", "permutation",
           "seed_words", "seed_words_many"]

_M32 = 0xFFFFFFFF
_M128 = (1 << 128) - 1
# numpy.random.bit_generator's SeedSequence constants (pool of 4 words)
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715
_POOL = 4
#: PCG64's 128-bit multiplier (PCG_DEFAULT_MULTIPLIER_128)
_PCG_MULT = (2549297995355413924 << 64) | 4865540595714422341
#: Most epochs seeded at once by :class:`EpochPermutations` (a batch's words: 32 bytes each).
_BATCH_MAX = 64
#: From this batch size on the seeds are computed as arrays (which cost about eight seeds).
_VECTOR_FROM = 8


def _constants(init: int, mult: int, n: int) -> list[tuple[int, int]]:
    """The hash constant before and after each of ``n`` hash steps: it never depends on data."""
    out, h = [], init
    for _ in range(n):
        after = (h * mult) & _M32
        out.append((h, after))
        h = after
    return out


#: Most entropy words :func:`seed_words` takes (a source's order uses 3 to 7).
_MAX_WORDS = 20
_A = _constants(_INIT_A, _MULT_A, _POOL * _POOL + _POOL * (_MAX_WORDS - _POOL))
_B = _constants(_INIT_B, _MULT_B, 8)
#: The pool's cross-mixing steps in numpy's order: (source word, destination word, constants).
_CROSS = tuple((src, dst) + _A[_POOL + k] for k, (src, dst) in enumerate(
    (s, d) for s in range(_POOL) for d in range(_POOL) if s != d))


def entropy_words(values: Sequence[int]) -> list[int]:
    """``SeedSequence``'s uint32 words for a sequence of non-negative ints: 0 is one word, larger
    values their little-endian 32-bit words."""
    out: list[int] = []
    for v in values:
        v = int(v)
        if v < 0:
            raise ValueError("entropy values must be >= 0")
        if v == 0:
            out.append(0)
        while v > 0:
            out.append(v & _M32)
            v >>= 32
    return out


def seed_words(words: Sequence[int]) -> tuple[int, int, int, int]:
    """``SeedSequence(entropy).generate_state(4, np.uint64)`` for entropy given as its uint32
    ``words`` (:func:`entropy_words`). Straight-line integer code over precomputed hash
    constants: a closure per hash step doubled its cost."""
    n = len(words)
    if n > _MAX_WORDS:
        raise ValueError(f"at most {_MAX_WORDS} entropy words")
    pool = []
    for i in range(_POOL):  # each pool word hashes one entropy word (or 0)
        before, after = _A[i]
        value = (((words[i] if i < n else 0) ^ before) * after) & _M32
        pool.append(value ^ (value >> 16))
    for src, dst, before, after in _CROSS:  # every word mixed into every other
        value = ((pool[src] ^ before) * after) & _M32
        value = (_MIX_L * pool[dst] - _MIX_R * (value ^ (value >> 16))) & _M32
        pool[dst] = value ^ (value >> 16)
    k = _POOL + len(_CROSS)
    for src in range(_POOL, n):  # entropy past the pool, into every pool word
        for dst in range(_POOL):
            before, after = _A[k]
            k += 1
            value = ((words[src] ^ before) * after) & _M32
            value = (_MIX_L * pool[dst] - _MIX_R * (value ^ (value >> 16))) & _M32
            pool[dst] = value ^ (value >> 16)
    out = []
    for i, (before, after) in enumerate(_B):
        value = ((pool[i % _POOL] ^ before) * after) & _M32
        out.append(value ^ (value >> 16))
    return (out[0] | out[1] << 32, out[2] | out[3] << 32, out[4] | out[5] << 32,
            out[6] | out[7] << 32)


def seed_words_many(words: np.ndarray) -> np.ndarray:
    """:func:`seed_words` for every row of uint32 ``words`` at once (the same arithmetic on
    uint32 arrays, which wrap as numpy's hash does), as uint64 ``[rows, 4]``. Costs about as
    much as eight single calls whatever the rows, so it pays from there on."""
    words = np.asarray(words, dtype=np.uint32)
    rows, n = words.shape
    if n > _MAX_WORDS:
        raise ValueError(f"at most {_MAX_WORDS} entropy words")
    u, shift = np.uint32, np.uint32(16)
    left, right = u(_MIX_L), u(_MIX_R)
    pool = []
    for i in range(_POOL):
        before, after = _A[i]
        value = ((words[:, i] if i < n else np.zeros(rows, np.uint32)) ^ u(before)) * u(after)
        pool.append(value ^ (value >> shift))
    for src, dst, before, after in _CROSS:
        value = (pool[src] ^ u(before)) * u(after)
        value = left * pool[dst] - right * (value ^ (value >> shift))
        pool[dst] = value ^ (value >> shift)
    k = _POOL + len(_CROSS)
    for src in range(_POOL, n):
        for dst in range(_POOL):
            before, after = _A[k]
            k += 1
            value = (words[:, src] ^ u(before)) * u(after)
            value = left * pool[dst] - right * (value ^ (value >> shift))
            pool[dst] = value ^ (value >> shift)
    out = np.empty((rows, 8), np.uint32)
    for i, (before, after) in enumerate(_B):
        value = (pool[i % _POOL] ^ u(before)) * u(after)
        out[:, i] = value ^ (value >> shift)
    low, high = out[:, 0::2].astype(np.uint64), out[:, 1::2].astype(np.uint64)
    return low | (high << np.uint64(32))


def pcg64_state(words: Sequence[int]) -> tuple[int, int]:
    """PCG64's ``(state, inc)`` seeded from ``generate_state(4, np.uint64)``'s words."""
    seed = (int(words[0]) << 64) | int(words[1])
    inc = ((((int(words[2]) << 64) | int(words[3])) << 1) | 1) & _M128
    state = (inc + seed) & _M128  # state 0 stepped (0 * mult + inc), plus the seed
    return (state * _PCG_MULT + inc) & _M128, inc


_local = threading.local()


def _seeded(words: Sequence[int], n: int) -> np.ndarray:
    """numpy's permutation of ``range(n)`` on PCG64 seeded from ``generate_state`` words."""
    gen = getattr(_local, "gen", None)
    if gen is None:  # one generator per thread, its state set for every permutation
        gen = _local.gen = np.random.Generator(np.random.PCG64(0))
    state, inc = pcg64_state(words)
    gen.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc},
                               "has_uint32": 0, "uinteger": 0}
    return gen.permutation(n)


_agrees: bool | None = None


def numpy_agrees() -> bool:
    """Whether this numpy seeds PCG64 as the integer code here does (checked once, on one
    entropy of several words): numpy documents ``SeedSequence`` as stable, but should a release
    change it, every permutation here falls back to numpy's own seeding rather than drift from
    what numpy (and so an order) would give."""
    global _agrees
    if _agrees is None:
        entropy = [20241207, 2**40 + 7, 3, 0, 99, 1 << 33]
        words = seed_words(entropy_words(entropy))
        expected = tuple(int(w) for w in np.random.SeedSequence(entropy).generate_state(4, np.uint64))
        state = np.random.PCG64(entropy).state["state"]
        _agrees = words == expected and pcg64_state(words) == (state["state"], state["inc"])
    return _agrees


def _numpy_permutation(entropy: Sequence[int], n: int) -> np.ndarray:
    return np.random.Generator(np.random.PCG64(list(entropy))).permutation(n)


def permutation(entropy: Sequence[int], n: int) -> np.ndarray:
    """``np.random.Generator(np.random.PCG64(list(entropy))).permutation(n)``, bit for bit."""
    if n <= 1:  # numpy draws nothing
        return np.arange(n)
    if not numpy_agrees():
        return _numpy_permutation(entropy, n)
    return _seeded(seed_words(entropy_words(entropy)), n)


class EpochPermutations:
    """:func:`permutation` for entropies that differ in one word counting up (the epoch).

    While the calls come with the same other words and that word one past the last batch, the
    next batch's seeds are computed at once, twice as many each time (up to
    :data:`_BATCH_MAX`, with :func:`seed_words_many` from :data:`_VECTOR_FROM` on): a tiny
    source that starts hundreds of epochs a step pays a few microseconds of seeding for each.
    A call out of that sequence (another window, a resume) starts over at one.
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._first = 0
        self._words: np.ndarray | list = []

    def __call__(self, entropy: tuple[int, ...], at: int, n: int) -> np.ndarray:
        """The permutation seeded by ``entropy``, whose word ``at`` is the epoch."""
        if n <= 1:
            return np.arange(n)
        if not numpy_agrees():
            return _numpy_permutation(entropy, n)
        value = int(entropy[at])
        key = entropy[:at] + entropy[at + 1:]
        i = value - self._first
        if key != self._key or not 0 <= i < len(self._words):
            sequel = key == self._key and i == len(self._words)
            size = min(2 * len(self._words), _BATCH_MAX) if sequel else 1
            self._key, self._first, i = key, value, 0
            if size < _VECTOR_FROM or value + size > _M32:  # one word for every epoch in a batch
                self._words = [seed_words(entropy_words(entropy[:at] + (v,) + entropy[at + 1:]))
                               for v in range(value, value + max(size, 1))]
            else:
                base = entropy_words(entropy)
                column = len(entropy_words(entropy[:at]))
                rows = np.tile(np.asarray(base, np.uint32), (size, 1))
                rows[:, column] = np.arange(value, value + size, dtype=np.uint32)
                self._words = seed_words_many(rows)
        return _seeded(self._words[i], n)
