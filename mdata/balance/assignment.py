"""The result of balancing one step (:class:`StepAssignment`), its HTML view, and its assembly.

Why its own module: the balancer, the per-rank baseline and their readers (the Planner's step
state, the benchmarks, notebooks) all speak this one value type; keeping it apart from the
algorithms keeps each of them small and lets the baseline report in exactly the balancer's terms.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np

from mdata.balance.bounds import lower_bound
from mdata.errors import PlanError

__all__ = ["StepAssignment", "assemble"]


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False)
class StepAssignment:
    """Where every sample of one global step goes.

    Per sample ``i`` (aligned with the input arrays): ``rank[i]`` (DP rank), ``micro_batch[i]`` and
    ``position[i]`` (order inside the micro-batch; samples keep their input order there). Per rank
    and micro-batch: token and cost totals (tokens count padded slots when balanced with
    ``pad_multiple > 1``). Arrays are read-only.
    """

    rank: np.ndarray  # int32[n]
    micro_batch: np.ndarray  # int32[n]
    position: np.ndarray  # int32[n]
    num_micro_batches: int
    per_rank_cost: np.ndarray  # float64[dp]
    per_rank_tokens: np.ndarray  # int64[dp]
    per_micro_batch_tokens: np.ndarray  # int64[dp, M]
    per_micro_batch_cost: np.ndarray  # float64[dp, M]
    lower_bound: float
    max_tokens: int
    requested_micro_batches: int
    algorithm: str

    @property
    def dp(self) -> int:
        return int(self.per_rank_cost.shape[0])

    @property
    def num_samples(self) -> int:
        return int(self.rank.shape[0])

    @property
    def makespan(self) -> float:
        """The step's cost: the most expensive rank's (every rank waits for it)."""
        return float(self.per_rank_cost.max()) if self.dp else 0.0

    @property
    def mean_cost(self) -> float:
        return float(self.per_rank_cost.mean()) if self.dp else 0.0

    @property
    def max_over_mean(self) -> float:
        mean = self.mean_cost
        return self.makespan / mean if mean > 0 else 1.0

    @property
    def max_over_lower_bound(self) -> float:
        return self.makespan / self.lower_bound if self.lower_bound > 0 else 1.0

    def members(self, rank: int, micro_batch: int) -> np.ndarray:
        """Sample indices in micro-batch ``micro_batch`` of ``rank``, in position order."""
        if not (0 <= rank < self.dp and 0 <= micro_batch < self.num_micro_batches):
            raise PlanError(
                f"no micro-batch ({rank}, {micro_batch}): this step has dp={self.dp} ranks and "
                f"{self.num_micro_batches} micro-batches per rank"
            )
        idx = np.flatnonzero((self.rank == rank) & (self.micro_batch == micro_batch))
        return idx[np.argsort(self.position[idx], kind="stable")]

    def to_html(self, max_rows: int = 16) -> str:
        """A small HTML table (summary plus the first ranks) for Jupyter."""
        e = html.escape
        counts = np.bincount(self.rank, minlength=self.dp) if self.dp else np.zeros(0, int)
        summary = (
            f"<p><b>{e(self.algorithm)}</b>: {self.num_samples} samples, dp={self.dp}, "
            f"{self.num_micro_batches} micro-batches of &le; {self.max_tokens} tokens "
            f"(requested {self.requested_micro_batches}); makespan {self.makespan:.4g}, "
            f"lower bound {self.lower_bound:.4g}, max/LB {self.max_over_lower_bound:.3f}, "
            f"max/mean {self.max_over_mean:.3f}</p>"
        )
        head = (
            "<tr><th>rank</th><th>cost</th><th>cost/LB</th><th>tokens</th><th>samples</th>"
            "<th>tokens per micro-batch</th></tr>"
        )
        rows = []
        lb = self.lower_bound if self.lower_bound > 0 else 1.0
        for r in range(min(self.dp, max_rows)):
            mbs = ", ".join(str(int(t)) for t in self.per_micro_batch_tokens[r])
            rows.append(
                f"<tr><td>{r}</td><td>{self.per_rank_cost[r]:.4g}</td>"
                f"<td>{self.per_rank_cost[r] / lb:.3f}</td><td>{int(self.per_rank_tokens[r])}</td>"
                f"<td>{int(counts[r])}</td><td>{e(mbs)}</td></tr>"
            )
        if self.dp > max_rows:
            rows.append(f"<tr><td colspan=6>... {self.dp - max_rows} more ranks</td></tr>")
        return f"{summary}<table>{head}{''.join(rows)}</table>"

    def _repr_html_(self) -> str:
        return self.to_html()


def assemble(
    rank: np.ndarray,
    micro_batch: np.ndarray,
    tokens: np.ndarray,
    costs: np.ndarray,
    *,
    dp: int,
    num_micro_batches: int,
    max_tokens: int,
    requested: int,
    algorithm: str,
) -> StepAssignment:
    """The read-only :class:`StepAssignment` of a per-sample placement, with its totals.

    ``rank[i]`` and ``micro_batch[i]`` place sample ``i``; ``tokens`` (slots) and ``costs`` give
    the per-micro-batch totals. Shared by :func:`~mdata.balance.balance_step` and the baseline so
    both report in exactly the same terms.
    """
    n = rank.shape[0]
    m = num_micro_batches
    key = rank.astype(np.int64) * m + micro_batch
    # position: rank of each sample inside its (rank, micro-batch) group, in input order.
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    starts = np.ones(n, dtype=bool)
    starts[1:] = sorted_key[1:] != sorted_key[:-1]
    first = np.maximum.accumulate(np.where(starts, np.arange(n), 0)) if n else np.zeros(0, int)
    position = np.empty(n, dtype=np.int32)
    position[order] = np.arange(n) - first
    mb_tokens = np.bincount(key, weights=tokens, minlength=dp * m).reshape(dp, m)
    mb_cost = np.bincount(key, weights=costs, minlength=dp * m).reshape(dp, m)
    mb_tokens = np.rint(mb_tokens).astype(np.int64)
    return StepAssignment(
        rank=_frozen(rank.astype(np.int32)),
        micro_batch=_frozen(micro_batch.astype(np.int32)),
        position=_frozen(position),
        num_micro_batches=m,
        per_rank_cost=_frozen(mb_cost.sum(axis=1)),
        per_rank_tokens=_frozen(mb_tokens.sum(axis=1)),
        per_micro_batch_tokens=_frozen(mb_tokens),
        per_micro_batch_cost=_frozen(mb_cost),
        lower_bound=lower_bound(costs, dp),
        max_tokens=max_tokens,
        requested_micro_batches=requested,
        algorithm=algorithm,
    )
