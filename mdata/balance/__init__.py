"""Global balancing of one step: samples -> (DP rank, micro-batch), and CP splitting of sequences.

Why: in synchronous data-parallel training a step lasts as long as its slowest rank. Per-rank
loaders that pack greedily to the context length give every rank the same *tokens* but wildly
different *cost* (attention is quadratic in document length), so the step waits for the rank that
drew the long documents. With the whole global batch's costs known, the Planner can instead
minimise the maximum per-rank cost, subject to every micro-batch holding at most ``max_tokens``.

The algorithm (:func:`balance_step`, in :mod:`mdata.balance.step`):

1. **LPT with token room** (:mod:`mdata.balance.lpt`). Samples in decreasing cost order go to the
   least-loaded rank that has a micro-batch with room for them, into that rank's cheapest
   micro-batch with room (so a rank's micro-batches also come out balanced, which pipeline
   parallelism needs). A heap keeps this ``O(n log dp)``. LPT alone is within ``4/3`` of the
   optimum when tokens do not bind.
2. **Refinement** (:mod:`mdata.balance.refine`). Repeatedly take the most loaded rank and the few
   least loaded ones and apply the single move or pairwise swap (checked with numpy over all pairs)
   that lowers the larger of the two loads most, respecting micro-batch capacity; stop when nothing
   improves or the maximum is within 0.1% of the lower bound ``max(total/dp, largest sample)``.
3. **Micro-batch re-pack** (:mod:`mdata.balance.repack`). Each rank's samples are re-packed
   LPT-style over its micro-batches when that lowers its most expensive micro-batch.
4. **Pipeline stages** (``stages = pp > 1`` only; :mod:`mdata.balance.pipeline`). A rank's step
   is then the 1F1B makespan of its micro-batches, not their sum: a rank that must hold one very
   expensive micro-batch (a full-context document, alone in it by tokens) is the slowest however
   equal the totals, and the order of a rank's micro-batches changes its makespan by up to a
   third. A second LPT pass takes each rank's load as its estimated makespan
   ``(sum + (p - 1) x top micro-batch) / p``, which gives such ranks less other work; each
   rank's micro-batches are ordered by insertion on the exact 1F1B makespan, and the faster of
   the two assignments (slowest rank) is kept. Rank totals may then differ on purpose; every
   token and sample guarantee is unchanged.

Every rank gets the same number of micro-batches (trainers run a fixed schedule); it grows above
the requested count only when the samples' tokens cannot be packed into it, and the assignment
reports the count used. Costs are additive per sample because varlen attention (``cu_seqlens``)
costs the sum over packed documents.

The other modules: :mod:`~mdata.balance.assignment` (the :class:`StepAssignment` result and its
HTML view), :mod:`~mdata.balance.bounds` (lower bounds on the makespan),
:mod:`~mdata.balance.inputs` (input checks), :mod:`~mdata.balance.baseline`
(:func:`greedy_pack_baseline`, what independent per-rank loaders do, for comparison),
:mod:`~mdata.balance.cp` (:func:`cp_zigzag_slices`, which tokens each context-parallel rank gets),
:mod:`~mdata.balance.pipeline` (:func:`one_f_one_b_makespan`, a rank's step under ``pp`` stages)
and :mod:`~mdata.balance.oracle` (:func:`brute_force_min_makespan`, the exact optimum of tiny
instances, for tests).

**Balancing by stage.** When a sample's cost differs from stage to stage (a vision encoder on
the first pipeline stage: :class:`~mdata.module_cost.ModuleCost`), :func:`balance_step_by_stage`
(:mod:`~mdata.balance.stage_balance`) minimises the slowest rank's 1F1B makespan over per-stage
times (:mod:`~mdata.balance.stages`), starting from the scalar balancer's result and a greedy
by stage (:mod:`~mdata.balance.stage_lpt`); the scalar path above is unchanged.
"""

from __future__ import annotations

from mdata.balance.assignment import StepAssignment
from mdata.balance.baseline import greedy_pack_baseline
from mdata.balance.bounds import lower_bound, pigeonhole_lower_bound
from mdata.balance.cp import causal_attention_work, cp_zigzag_slices
from mdata.balance.oracle import brute_force_min_makespan
from mdata.balance.pipeline import one_f_one_b_makespan
from mdata.balance.stage_balance import StageAssignment, balance_step_by_stage
from mdata.balance.stages import stage_lower_bound, stage_makespan
from mdata.balance.step import balance_step

__all__ = [
    "StageAssignment",
    "StepAssignment",
    "balance_step",
    "balance_step_by_stage",
    "brute_force_min_makespan",
    "causal_attention_work",
    "cp_zigzag_slices",
    "greedy_pack_baseline",
    "pigeonhole_lower_bound",
    "lower_bound",
    "one_f_one_b_makespan",
    "stage_lower_bound",
    "stage_makespan",
]
