"""The newest steps' summaries, as the scheduler keeps them for the status and the dashboard.

Each balanced step's :class:`~mdata.planner.instructions.StepSummary` has three figures per
source (samples drawn, tokens, target weight). The runtime used to turn each into its JSON-safe
dict at once and keep ``mdata.planner.history-steps`` (2,000) of them: three dicts with an entry
per source of the plan, per step. At 10,000 sources that cost 11.7 ms of the scheduler's event
loop per step and about 1 MB per step kept (1.9 GB after 2,000 steps), whatever a step drew.

:class:`StepHistory` keeps each step compact instead: the sources it drew (at most one per
sample) with their counts and tokens, and the target weights as one array shared by consecutive
steps whose weights are equal (a static mixture keeps a single one). A step is expanded to the
dict :meth:`StepSummary.to_dict` gives only when someone asks for it, so readers (the status,
the dashboard's pages) see exactly what they saw before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from mdata.planner.instructions import StepSummary

__all__ = ["StepHistory"]


class _Kept(NamedTuple):
    """One step, compact: its summary's per-rank and scalar figures, the sources it drew."""

    scalars: dict[str, Any]  # the summary's dict less its per-source figures
    drawn: np.ndarray  # source indices with samples in the step (ascending)
    counts: np.ndarray  # their samples
    tokens: np.ndarray  # their tokens
    weights: np.ndarray  # every source's target weight (shared with neighbouring steps)


class StepHistory(Mapping[int, dict]):
    """Step -> its summary's JSON-safe dict, for the newest ``keep`` steps added (see the module
    docstring); ``names`` are the plan's sources, in order."""

    def __init__(self, names: Sequence[str], keep: int) -> None:
        self.names = tuple(names)
        self.keep = max(1, int(keep))
        self._steps: dict[int, _Kept] = {}
        self._weights: np.ndarray | None = None  # the last weights kept

    def add(self, summary: StepSummary) -> None:
        """Keep ``summary`` (a step planned again after a rewind replaces its older summary);
        the oldest step added goes once more than ``keep`` are kept."""
        counts = np.asarray(summary.counts)
        drawn = np.flatnonzero(counts)
        weights = np.asarray(summary.target_weights, dtype=np.float64)
        if self._weights is not None and np.array_equal(weights, self._weights):
            weights = self._weights
        else:
            weights = self._weights = weights.copy()
        scalars = {
            "step": summary.step,
            "per_rank_cost": np.array(summary.per_rank_cost, dtype=np.float64),
            "lower_bound": summary.lower_bound,
            "max_over_mean": summary.max_over_mean,
            "max_over_lower_bound": summary.max_over_lower_bound,
            "num_micro_batches": summary.num_micro_batches,
            "truncated": summary.truncated,
            "skipped": summary.skipped,
            "measure": summary.measure,
            "scalar_makespan": summary.scalar_makespan,
        }
        self._steps.pop(summary.step, None)
        self._steps[summary.step] = _Kept(scalars, drawn, counts[drawn].astype(np.int64),
                                          np.asarray(summary.tokens)[drawn].astype(np.int64), weights)
        while len(self._steps) > self.keep:
            del self._steps[next(iter(self._steps))]

    def __getitem__(self, step: int) -> dict:
        kept = self._steps[step]
        counts = dict.fromkeys(self.names, 0)
        tokens = dict.fromkeys(self.names, 0)
        drawn = [self.names[i] for i in kept.drawn.tolist()]
        counts.update(zip(drawn, kept.counts.tolist()))
        tokens.update(zip(drawn, kept.tokens.tolist()))
        sc = kept.scalars
        return {  # the keys in StepSummary.to_dict's order
            "step": sc["step"], "per_rank_cost": sc["per_rank_cost"].tolist(),
            "lower_bound": sc["lower_bound"], "max_over_mean": sc["max_over_mean"],
            "max_over_lower_bound": sc["max_over_lower_bound"],
            "num_micro_batches": sc["num_micro_batches"], "counts": counts, "tokens": tokens,
            "target_weights": dict(zip(self.names, kept.weights.tolist())),
            "truncated": sc["truncated"], "skipped": sc["skipped"], "measure": sc["measure"],
            "scalar_makespan": sc["scalar_makespan"],
        }

    def __iter__(self) -> Iterator[int]:
        return iter(self._steps)

    def __len__(self) -> int:
        return len(self._steps)

    def __contains__(self, step: object) -> bool:
        return step in self._steps

    def newest(self, n: int) -> list[int]:
        """The newest ``n`` steps kept, ascending (``n`` <= 0: none)."""
        return sorted(self._steps)[-n:] if n > 0 else []
