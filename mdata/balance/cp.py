"""Context-parallel zigzag split: which tokens of one sequence each CP rank gets.

Why: with a causal mask later tokens cost more, so a contiguous split overloads the last CP rank;
the zigzag split (Megatron-Core / Transformer Engine layout) evens causal work out, and the
balancer pads documents to a multiple of ``2 * cp`` so every sequence splits this way.
"""

from __future__ import annotations

import numpy as np

from mdata.balance.inputs import positive_int
from mdata.errors import PlanError

__all__ = ["causal_attention_work", "cp_zigzag_slices"]


def cp_zigzag_slices(length: int, cp: int) -> list[np.ndarray]:
    """Token indices of one sequence that each of ``cp`` context-parallel ranks gets.

    With a causal mask, token ``q`` attends to ``q + 1`` keys, so a contiguous split gives the last
    CP rank ``2*cp - 1`` times the work of the first. The zigzag split cuts the sequence into
    ``2*cp`` equal chunks and gives rank ``i`` chunks ``i`` and ``2*cp - 1 - i``: one cheap and one
    expensive chunk each, so causal work is even (what Megatron-Core / Transformer Engine expect).

    Padding rule: chunks have ``ceil(length / (2*cp))`` slots; the sequence is conceptually padded
    at its end to ``2*cp`` times that, and padding positions are left out of the returned indices.
    So the last ranks' chunks may be short (or empty for very short sequences); the constructor
    pads every document to ``2*cp`` times the chunk, so every rank's slice has
    ``2 * ceil(length / (2*cp))`` tokens; the padding ends its document, so no real token
    attends to it under a causal mask, and it carries no loss.
    """
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
        raise PlanError(f"sequence length must be an int >= 0, got {length!r}")
    cp = positive_int("cp", cp)
    chunk = -(-int(length) // (2 * cp))
    slices = []
    for i in range(cp):
        parts = []
        for c in (i, 2 * cp - 1 - i):
            start, stop = min(c * chunk, length), min((c + 1) * chunk, length)
            parts.append(np.arange(start, stop, dtype=np.int64))
        slices.append(np.concatenate(parts))
    return slices


def causal_attention_work(slices: list[np.ndarray]) -> np.ndarray:
    """Causal attention work of each CP rank: for its query tokens ``q``, the sum of ``q + 1``."""
    return np.array([float(np.sum(np.asarray(s, dtype=np.float64) + 1.0)) for s in slices])
