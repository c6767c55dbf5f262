"""The per-rank greedy-packing baseline: what independent data-parallel loaders do.

Why: the balancer's gain is only meaningful against what users run without it; the benchmarks and
tests compare :func:`~mdata.balance.balance_step` with this on the same samples.
"""

from __future__ import annotations

import numpy as np

from mdata.balance.assignment import StepAssignment, assemble
from mdata.balance.inputs import validate_step

__all__ = ["greedy_pack_baseline"]


def greedy_pack_baseline(
    num_tokens: np.ndarray,
    costs: np.ndarray,
    *,
    dp: int,
    micro_batches: int,
    max_tokens: int,
    pad_multiple: int = 1,
) -> StepAssignment:
    """What independent per-rank data-parallel loaders do, for comparison with :func:`balance_step`.

    Samples, in arrival order, are split into ``dp`` consecutive runs of equal count (the first
    ``n % dp`` runs get one more), and each rank packs its run greedily (next-fit) into sequences
    of ``max_tokens``: no rank sees the others' costs. Ranks that fill fewer than the step's
    micro-batch count leave the rest empty; ``num_micro_batches`` is the largest count any rank
    needed (at least ``micro_batches``). ``pad_multiple`` as in :func:`balance_step`.
    """
    tokens, cost, dp, requested, max_tokens = validate_step(
        num_tokens, costs, dp, micro_batches, max_tokens, pad_multiple
    )
    n = tokens.size
    rank = np.repeat(np.arange(dp), [len(run) for run in np.array_split(np.arange(n), dp)])
    micro_batch = np.zeros(n, dtype=np.int64)
    tok = tokens.tolist()
    used = 0
    prev_rank = -1
    b = 0
    for i, r in enumerate(rank.tolist()):
        if r != prev_rank:
            prev_rank, b, used = r, 0, 0
        if used + tok[i] > max_tokens:
            b += 1
            used = 0
        used += tok[i]
        micro_batch[i] = b
    m = max(requested, int(micro_batch.max()) + 1 if n else 0)
    return assemble(
        rank, micro_batch, tokens, cost, dp=dp, num_micro_batches=m, max_tokens=max_tokens,
        requested=requested, algorithm="per-rank greedy packing (baseline)",
    )
