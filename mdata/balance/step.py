"""balance_step: the Planner's balancer for one global step: LPT, refinement, re-pack, pipeline.

Why a module of its own: it only orders the stages (validate, size the micro-batch count, LPT,
refine to the lower bound, re-pack micro-batches, with pipeline stages the pipeline-aware
alternative and the micro-batch order, assemble the result); each stage lives in its own module
so it can be read and tested alone.
"""

from __future__ import annotations

import numpy as np

from mdata.balance.assignment import StepAssignment, assemble
from mdata.balance.bounds import lower_bound
from mdata.balance.inputs import positive_int, validate_step
from mdata.balance.lpt import PackState, lpt_assign, min_micro_batches
from mdata.balance.pipeline import ordered_makespan, reorder_micro_batches
from mdata.balance.refine import refine
from mdata.balance.repack import repack_micro_batches

__all__ = ["balance_step"]

#: Refinement stops once the makespan is within this fraction of the lower bound: further gains
#: are below the noise of real step times and cost planning time.
_GOOD_ENOUGH = 1e-3


def balance_step(
    num_tokens: np.ndarray,
    costs: np.ndarray,
    *,
    dp: int,
    micro_batches: int,
    max_tokens: int,
    seed: int = 0,
    pad_multiple: int = 1,
    stages: int = 1,
) -> StepAssignment:
    """Assign every sample of a global step to a DP rank and a micro-batch.

    ``num_tokens[i]`` (already truncated to ``<= max_tokens``) and ``costs[i]`` describe sample
    ``i``. Minimises the largest per-rank cost (the stages are described in :mod:`mdata.balance`);
    every micro-batch holds at most ``max_tokens`` tokens; every rank gets
    ``num_micro_batches >= micro_batches`` micro-batches (more only when the tokens do not fit).
    ``seed`` breaks ties between equal samples; the result is a pure function of the inputs.

    ``pad_multiple``: each sample occupies its length rounded up to this multiple (with context
    parallelism every document is padded to a multiple of ``2 * cp`` for the zigzag split, see
    :func:`~mdata.balance.cp_zigzag_slices`); capacity and the reported token totals count these
    padded slots.

    ``stages``: pipeline-parallel stages each rank runs its micro-batches through (the mesh's
    ``pp``). Above 1 the result is whichever of the total-balanced assignment and a
    pipeline-aware one has the shorter slowest 1F1B makespan, with each rank's micro-batches
    numbered in the order to run them (stage 4 of :mod:`mdata.balance`); rank totals may then
    be above the lower bound on purpose.
    """
    tokens, cost, dp, requested, max_tokens = validate_step(
        num_tokens, costs, dp, micro_batches, max_tokens, pad_multiple
    )
    stages = positive_int("stages", stages)
    n = tokens.size
    rng = np.random.default_rng(seed)
    order_arr = np.lexsort((rng.permutation(n), -tokens, -cost))
    order = order_arr.tolist()
    tok = tokens.tolist()
    cst = cost.tolist()
    m = min_micro_batches(tokens, dp, requested, max_tokens)
    while True:
        state = lpt_assign(order, tok, cst, dp, m, max_tokens)
        if state is not None:
            break
        m += 1
    refine(state, tokens, cost, lower_bound(cost, dp) * (1 + _GOOD_ENOUGH))
    repack_micro_batches(state, order, tok, cst)
    if stages > 1:
        state = _pipelined(state, order, tok, cst, m, max_tokens, stages)
    return assemble(
        np.asarray(state.rank_of, dtype=np.int64),
        np.asarray(state.bin_of, dtype=np.int64),
        tokens,
        cost,
        dp=dp,
        num_micro_batches=m,
        max_tokens=max_tokens,
        requested=requested,
        algorithm="mdata balance (LPT + refinement"
        + (f", {stages} pipeline stages)" if stages > 1 else ")"),
    )


def _pipelined(state: PackState, order: list[int], tok: list[int], cst: list[float], m: int,
               max_tokens: int, stages: int) -> PackState:
    """The faster, under 1F1B over ``stages`` stages, of ``state`` and a pipeline-aware LPT.

    ``state`` has equal rank totals. The alternative packs LPT-style with each rank's load taken
    as its estimated 1F1B makespan (:func:`~mdata.balance.pipeline.pipeline_cost`), which gives a
    rank holding one very expensive micro-batch less other work. Both are compared on the exact
    makespan of their ranks' micro-batches in the best order found; the winner's micro-batches
    are renumbered into that order. Ties keep ``state``.
    """
    best, (best_order, spans) = state, ordered_makespan(np.asarray(state.bin_cost), stages)
    alt = lpt_assign(order, tok, cst, state.dp, m, max_tokens, float(stages - 1))
    if alt is not None:
        repack_micro_batches(alt, order, tok, cst)
        alt_order, alt_spans = ordered_makespan(np.asarray(alt.bin_cost), stages)
        if alt_spans.max() < spans.max():
            best, best_order = alt, alt_order
    reorder_micro_batches(best, best_order)
    return best
