"""``simulate(plan, steps, metadata)``: run the Planner's state machine on sample metadata, without
a cluster.

The simulation is not a model of the Planner: it *is* the Planner (:class:`PlannerState`), fed by
an in-memory loader that answers every :class:`LoadChunk` from :class:`SourceMetadata` and by
trainers that consume every step as soon as it is ready. So the per-step tables it returns
(per-rank cost, imbalance against the lower bound, tokens and counts per source, target against
realised weights) are exactly what the cluster would plan for the same data. It can start from a
checkpoint (under another mesh, batch or, when allowed, mixture: what a resume would plan) and
hand out the checkpoints of chosen steps.
"""

from __future__ import annotations

import html
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mdata.checkpoint import Checkpoint
from mdata.errors import PlanError
from mdata.metadata import SourceMetadata
from mdata.plan import Plan
from mdata.planner.events import BatchConsumed, ChunkLoaded, MetricsReported, Tick
from mdata.planner.instructions import ConstructStep, JobFailed, LoadChunk, StepReady, StepSummary
from mdata.planner.resume import ResumeOptions
from mdata.planner.state import PlannerState

__all__ = ["SimulationResult", "simulate"]


@dataclass(frozen=True, eq=False)
class SimulationResult:
    """Per-step tables of a simulation; rows are steps, columns DP ranks or sources."""

    names: tuple[str, ...]
    global_batch: int
    steps: np.ndarray  # int64[n]
    per_rank_cost: np.ndarray  # float64[n, dp]
    lower_bound: np.ndarray  # float64[n]
    num_micro_batches: np.ndarray  # int64[n]
    counts: np.ndarray  # int64[n, S]
    tokens: np.ndarray  # int64[n, S]
    target_weights: np.ndarray  # float64[n, S]
    truncated: np.ndarray  # int64[n]
    skipped: np.ndarray  # int64[n]
    samples: dict[int, list[list[tuple[str, int, int]]]] | None = None
    checkpoints: dict[int, dict[str, Any]] | None = None  # step -> Checkpoint.to_dict()
    #: what per_rank_cost holds: "cost" (each rank's total) or "1F1B makespan" (balanced by
    #: pipeline stage; lower_bound is then the stage lower bound), see StepSummary
    measure: str = "cost"
    scalar_makespan: np.ndarray | None = None  # float64[n], by stage only: the scalar plan's

    @property
    def makespan(self) -> np.ndarray:
        """The step's duration in cost units: the most loaded rank."""
        return self.per_rank_cost.max(axis=1)

    @property
    def max_over_mean(self) -> np.ndarray:
        mean = self.per_rank_cost.mean(axis=1)
        return np.divide(self.makespan, mean, out=np.ones_like(mean), where=mean > 0)

    @property
    def max_over_lower_bound(self) -> np.ndarray:
        lb = self.lower_bound
        return np.divide(self.makespan, lb, out=np.ones_like(lb), where=lb > 0)

    @property
    def realized_weights(self) -> np.ndarray:
        return self.counts / float(self.global_batch)

    def to_records(self) -> list[dict[str, Any]]:
        """One flat dict per step (for pandas, plotting, or JSON)."""
        records = []
        mom, molb = self.max_over_mean, self.max_over_lower_bound
        for k, step in enumerate(self.steps.tolist()):
            rec: dict[str, Any] = {
                "step": step,
                "makespan": float(self.makespan[k]),
                "lower_bound": float(self.lower_bound[k]),
                "max_over_mean": float(mom[k]),
                "max_over_lower_bound": float(molb[k]),
                "num_micro_batches": int(self.num_micro_batches[k]),
                "truncated": int(self.truncated[k]),
                "skipped": int(self.skipped[k]),
            }
            for j, name in enumerate(self.names):
                rec[f"count/{name}"] = int(self.counts[k, j])
                rec[f"tokens/{name}"] = int(self.tokens[k, j])
                rec[f"target/{name}"] = float(self.target_weights[k, j])
                rec[f"realized/{name}"] = float(self.counts[k, j]) / self.global_batch
            records.append(rec)
        return records

    def _repr_html_(self, max_rows: int = 20) -> str:
        head = ("<tr><th>step</th><th>makespan</th><th>lower bound</th><th>max/mean</th>"
                "<th>max/LB</th><th>micro-batches</th>"
                + "".join(f"<th>{html.escape(n)} (count)</th>" for n in self.names) + "</tr>")
        body = []
        for rec in self.to_records()[:max_rows]:
            body.append(
                f"<tr><td>{rec['step']}</td><td>{rec['makespan']:.4g}</td>"
                f"<td>{rec['lower_bound']:.4g}</td><td>{rec['max_over_mean']:.3f}</td>"
                f"<td>{rec['max_over_lower_bound']:.3f}</td><td>{rec['num_micro_batches']}</td>"
                + "".join(f"<td>{rec[f'count/{n}']}</td>" for n in self.names) + "</tr>")
        n = self.steps.size
        more = f"<p>... {n - max_rows} more steps</p>" if n > max_rows else ""
        mean_lb = float(self.max_over_lower_bound.mean()) if n else float("nan")
        return (f"<div><strong>simulation: {n} steps, mean max/LB {mean_lb:.3f}</strong>"
                f"<table>{head}{''.join(body)}</table>{more}</div>")


def _metadata_by_name(plan: Plan, metadata: Any) -> dict[str, SourceMetadata]:
    if isinstance(metadata, Mapping):
        by_name = dict(metadata)
    elif isinstance(metadata, Sequence):
        by_name = {m.name: m for m in metadata}
    else:
        raise PlanError(f"simulate takes {{source: SourceMetadata}} or a list of them, not {metadata!r}")
    missing = [n for n in plan.source_names if n not in by_name]
    if missing:
        raise PlanError(f"simulate: no metadata for sources {missing}; pass SourceMetadata for every source")
    return by_name


def simulate(
    plan: Plan,
    steps: int,
    metadata: Mapping[str, SourceMetadata] | Sequence[SourceMetadata],
    *,
    metrics: Callable[[int, StepSummary], Mapping[str, float] | None] | None = None,
    keep_samples: bool = False,
    checkpoint: Checkpoint | Mapping[str, Any] | None = None,
    resume_options: ResumeOptions | None = None,
    checkpoints: Sequence[int] = (),
) -> SimulationResult:
    """Plan ``steps`` steps of ``plan`` on ``metadata`` with the Planner's own state machine.

    ``metrics(step, summary)`` may return metrics to report for each step (as rank 0 would), to
    exercise a :class:`~mdata.mixing.MetricMixturePolicy`. With ``keep_samples`` the result keeps,
    per step, the ``(source, shard, row)`` ids each DP rank received. ``checkpoint``: start where
    it left off (the steps simulated are the ``steps`` after it), accepting what
    ``resume_options`` allow; ``checkpoints``: steps whose checkpoint (as of having consumed every
    step before it) the result keeps, with listings.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise PlanError(f"simulate: steps must be an int >= 1, got {steps!r}")
    meta = _metadata_by_name(plan, metadata)
    listings = {n: meta[n] for n in plan.source_names}
    if checkpoint is None:
        state = PlannerState(plan, listings, job="simulate", record_lineage=False)
    else:
        state = PlannerState.from_checkpoint(plan, listings, checkpoint, options=resume_options,
                                             job="simulate", record_lineage=False)
    wanted, taken = set(int(s) for s in checkpoints), {}
    receivers = sorted(r for group in state.receivers for r in group)
    names = plan.source_names
    summaries: list[StepSummary] = []
    samples: dict[int, list[list[tuple[str, int, int]]]] | None = {} if keep_samples else None
    queue = deque(state.handle(Tick(stimulus_id="simulate-start")))
    while len(summaries) < steps:
        if not queue:
            raise PlanError("simulate: the planner stalled without finishing a step")
        ins = queue.popleft()
        if isinstance(ins, LoadChunk):
            ref = ins.chunk
            rows, tok, pat, bad = meta[ref.source].rows_of(ref.shard, ref.start, ref.stop)
            queue.extend(state.handle(ChunkLoaded(
                ref, rows, tok, pat, bad.tolist(), "simulated-loader",
                stimulus_id=f"loaded-{ref.source}-{ref.chunk_id}")))
        elif isinstance(ins, ConstructStep) and samples is not None:
            samples[ins.step] = [group.ids(names) for group in ins.groups()]
        elif isinstance(ins, StepReady):
            s = ins.step
            summaries.append(ins.summary)
            if metrics is not None:
                values = metrics(s, ins.summary)
                if values:
                    queue.extend(state.handle(MetricsReported(s, 0, dict(values),
                                                              stimulus_id=f"metrics-{s}")))
            queue.extend(state.handle(*(BatchConsumed(s, r, stimulus_id=f"consumed-{s}")
                                        for r in receivers)))
            if s + 1 in wanted:
                taken[s + 1] = state.checkpoint(s + 1, with_listings=True).to_dict()
        elif isinstance(ins, JobFailed):
            raise PlanError(f"simulate: {ins.reason}") from ins.error
    return SimulationResult(
        names=names,
        global_batch=plan.balance_spec.global_batch,
        steps=np.array([s.step for s in summaries], np.int64),
        per_rank_cost=np.stack([s.per_rank_cost for s in summaries]),
        lower_bound=np.array([s.lower_bound for s in summaries]),
        num_micro_batches=np.array([s.num_micro_batches for s in summaries], np.int64),
        counts=np.stack([s.counts for s in summaries]),
        tokens=np.stack([s.tokens for s in summaries]),
        target_weights=np.stack([s.target_weights for s in summaries]),
        truncated=np.array([s.truncated for s in summaries], np.int64),
        skipped=np.array([s.skipped for s in summaries], np.int64),
        measure=summaries[0].measure if summaries else "cost",
        scalar_makespan=(np.array([s.scalar_makespan for s in summaries])
                         if summaries and summaries[0].scalar_makespan is not None else None),
        samples=samples,
        checkpoints=taken if wanted else None,
    )
