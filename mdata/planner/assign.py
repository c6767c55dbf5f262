"""Assigning a step's final samples to DP ranks: what each rank's batch holds, and the summary.

Samples are truncated to the plan's ``max_tokens``, priced by the cost model, and
:func:`~mdata.balance.balance_step` places them on DP ranks and micro-batches. Each rank's share
is a view (:class:`StepSamples`) of one :class:`~mdata.planner.instructions.ConstructStep` for
the whole step, whose samples are grouped by chunk (so the constructor slices each loaded chunk
once); the step's figures become a :class:`StepSummary`. When lineage is recorded, every sample gets its DGraph id here.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mdata.balance import balance_step, balance_step_by_stage
from mdata.cost import evaluate_cost
from mdata.lineage.dgraph import DGraph
from mdata.order import ChunkRef
from mdata.plan import Plan
from mdata.planner.instructions import ConstructStep, StepColumns, StepSummary
from mdata.planner.selection import Selection

__all__ = ["StepAssigner"]


class StepAssigner:
    """Prices and balances steps of one plan (its batch shape, mesh, cost model and seed)."""

    def __init__(self, plan: Plan) -> None:
        spec = plan.balance_spec
        mesh = plan.mesh
        self.names = plan.source_names
        self.dp = mesh.dp
        self.micro_batches = spec.micro_batches
        self.max_tokens = spec.max_tokens
        self.cost_model = plan.cost_model
        self.seed = plan.seed_value
        self.pad = 2 * mesh.cp if mesh.cp > 1 else 1  # context parallelism splits in 2*cp pieces
        self.stages = mesh.pp  # each DP rank runs its micro-batches through a pp-stage pipeline
        # a module-aware cost model (mdata.module_cost) with pp > 1: balance every stage; its
        # placement is checked against pp here, so a wrong layer split fails at registration
        self.by_stage = self.stages > 1 and callable(getattr(self.cost_model, "stage_costs", None))
        if self.by_stage:
            self.cost_model.stage_fractions(self.stages)

    def assign(self, step: int, weights: np.ndarray, sel: Selection,
               refs_of: Callable[[list[int]], list[ChunkRef]], lineage: DGraph | None,
               sid: str) -> tuple[ConstructStep, StepSummary]:
        """The step's :class:`ConstructStep` (every DP rank's samples) and its summary.

        ``weights`` are the step's target mixture weights (for the summary); ``refs_of`` maps chunk
        keys to their :class:`~mdata.order.ChunkRef`; ``lineage`` records the step (None: no
        lineage, sample ids are -1).
        """
        src, shard, row, chunk, cursor, keys, index, tokens, patches, _, skipped = sel
        trunc = np.minimum(tokens, self.max_tokens).astype(np.int32)
        n_trunc = int((tokens > self.max_tokens).sum())
        seed = (self.seed * 1_000_003 + step) % 2**32
        staged = None
        if self.by_stage:
            staged = balance_step_by_stage(
                trunc, self.cost_model.stage_costs(trunc, patches, self.stages), dp=self.dp,
                micro_batches=self.micro_batches, max_tokens=self.max_tokens, seed=seed,
                pad_multiple=self.pad)
            a = staged.assignment
        else:
            costs = evaluate_cost(self.cost_model, trunc, patches)
            a = balance_step(trunc, costs, dp=self.dp, micro_batches=self.micro_batches,
                             max_tokens=self.max_tokens, seed=seed, pad_multiple=self.pad,
                             stages=self.stages)
        if lineage is not None:
            ids = lineage.record_step(
                step, source_index=src, shard=shard, row=row, chunk_id=chunk, cursor=cursor,
                dp_rank=a.rank, micro_batch=a.micro_batch, position=a.position, num_tokens=trunc)
        else:
            ids = np.full(src.size, -1, np.int64)
        # every rank's samples grouped by chunk (ascending key), in (micro-batch, position) order
        # within a chunk: one sort for the whole step, then each rank takes its slice of every
        # column (a loop of np.unique per rank cost a tenth of a 16k-GPU step; per-rank numpy
        # arithmetic and index conversions were most of what remained)
        order = np.lexsort((a.position, a.micro_batch, keys, a.rank))
        rank_o, keys_o = a.rank[order], keys[order]
        bounds = np.searchsorted(rank_o, np.arange(self.dp + 1))
        first = np.ones(order.size, bool)  # the first sample of each (rank, chunk) run
        first[1:] = (rank_o[1:] != rank_o[:-1]) | (keys_o[1:] != keys_o[:-1])
        starts = np.zeros(order.size + 1, np.int64)
        np.cumsum(first, out=starts[1:])  # runs that start before each sample
        base = starts[bounds]  # rank d's chunks are runs [base[d], base[d + 1]) of the step
        local = (starts[1:] - 1 - base[rank_o]).astype(np.int32)  # chunk among its rank's
        refs = refs_of(keys_o[first])
        columns = StepColumns(
            refs, local, index.astype(np.int32)[order], a.micro_batch[order], a.position[order],
            trunc[order], ids[order], src.astype(np.int32)[order], shard.astype(np.int32)[order],
            row[order], a.num_micro_batches, bounds.tolist(), base.tolist())
        construct = ConstructStep(step, columns, stimulus_id=sid)
        S = len(self.names)
        figures = _by_stage_figures(staged) if staged is not None else dict(
            per_rank_cost=a.per_rank_cost, lower_bound=float(a.lower_bound),
            max_over_mean=float(a.max_over_mean), max_over_lower_bound=float(a.max_over_lower_bound))
        summary = StepSummary(
            step=step, **figures,
            num_micro_batches=int(a.num_micro_batches),
            counts=np.bincount(src, minlength=S).astype(np.int64),
            tokens=np.bincount(src, weights=trunc, minlength=S).astype(np.int64),
            target_weights=weights, truncated=n_trunc,
            skipped=sum(int(rows.size) for _, _, rows, _ in skipped), names=self.names)
        return construct, summary


def _by_stage_figures(staged) -> dict:
    """A step balanced by stage is summarised by its ranks' 1F1B makespans, not their totals
    (which balancing by stage does not even out, and which would read as imbalance)."""
    spans = staged.per_rank_makespan
    mean = float(spans.mean()) if spans.size else 0.0
    return dict(per_rank_cost=spans, lower_bound=float(staged.lower_bound),
                max_over_mean=staged.makespan / mean if mean > 0 else 1.0,
                max_over_lower_bound=float(staged.makespan_over_lower_bound),
                measure="1F1B makespan", scalar_makespan=float(staged.scalar_makespan))
