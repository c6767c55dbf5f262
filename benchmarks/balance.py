"""Balancing figures: planning time at 4096 GPUs, step makespan against the lower bound and the
per-rank greedy-packing baseline.

Every step is one global batch of about 4M tokens of documents drawn from the given length
distributions (truncated to the context). Both systems get the *same* samples; a rank's cost is the
sum of its documents' :class:`~mdata.cost.AttentionCost` (default calibration, a 4096-hidden
model; the ``_attn_only`` figures use pure ``l^2`` attention, the worst case for imbalance). A
step lasts as long as its most expensive rank, so over many steps the throughput ratio is
``sum of baseline makespans / sum of mdata makespans``.

``lengths`` maps a source name to real token lengths (the example corpus, tokenized); each
sample picks a source uniformly, then one of its lengths. Without it a lognormal heavy tail
(median ~1.1k tokens, mean ~2.2k, capped at the context) stands in, and the figure names say
``synthetic``.

Two baselines, both "every rank packs on its own, no global view":

* ``speedup_vs_baseline`` (:func:`mdata.balance.greedy_pack_baseline`): the step's samples split
  into equal-count runs per rank, each packed next-fit. Ranks then differ in tokens as well as in
  cost (and some need more micro-batches than the schedule has), so this is the generous figure.
* ``speedup_vs_token_budget_baseline``: each rank fills exactly its ``micro_batches`` sequences of
  the context length next-fit from its own stream (what a per-rank packing DataLoader does); mdata
  balances the union of those same documents into the same number of micro-batches. Tokens per
  rank are then nearly equal on both sides and only the cost (quadratic attention) differs: the
  conservative figure.

``balance.stage_aware_gain_pp4`` / ``_pp8``: balancing by stage with module costs against one
summed cost, on vision-language steps (``benchmarks/balance_stages.py``).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from benchmarks.balance_stages import stage_figures
from benchmarks.harness import figure
from mdata.balance import balance_step, greedy_pack_baseline, lower_bound, pigeonhole_lower_bound
from mdata.cost import AttentionCost

GLOBAL_TOKENS = 4 << 20
DP_SIZES = (8, 64, 512)
CONTEXTS = {"16k": 16384, "32k": 32768}
HEADLINE_DP = 64


class _Lengths:
    """Draws document lengths: sources uniformly, then a length of that source."""

    def __init__(self, lengths: dict[str, np.ndarray] | None, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        if lengths:
            self.pools = [np.asarray(v, dtype=np.int64) for v in lengths.values() if len(v)]
            self.pools = [p[p > 0] for p in self.pools]
            if not any(len(p) for p in self.pools):
                raise ValueError("lengths holds no positive token lengths")
            self.pools = [p for p in self.pools if len(p)]
        else:
            self.pools = []

    def draw(self, n: int) -> np.ndarray:
        if not self.pools:
            return np.maximum(16, self.rng.lognormal(7.0, 1.2, size=n)).astype(np.int64)
        which = self.rng.integers(len(self.pools), size=n)
        out = np.empty(n, dtype=np.int64)
        for k, pool in enumerate(self.pools):
            mask = which == k
            out[mask] = pool[self.rng.integers(len(pool), size=int(mask.sum()))]
        return out

    def global_batch(self, tokens: int, context: int, capacity: int) -> np.ndarray:
        """Documents (truncated to ``context``) until ``tokens``, at most 97% of ``capacity``."""
        budget = min(tokens, int(0.97 * capacity))
        out: list[np.ndarray] = []
        total = 0
        while total < budget:
            chunk = np.minimum(self.draw(4096), context)
            cum = total + np.cumsum(chunk)
            stop = int(np.searchsorted(cum, budget, side="left")) + 1
            out.append(chunk[:stop])
            total = int(cum[min(stop, len(cum)) - 1])
        return np.concatenate(out)


def _token_budget_step(draw: _Lengths, dp: int, m: int, context: int) -> list[np.ndarray]:
    """Per rank, the documents a packing loader puts into its ``m`` sequences of ``context``."""
    ranks = []
    for _ in range(dp):
        docs: list[int] = []
        used, sequences = 0, 0
        while sequences < m:
            for length in np.minimum(draw.draw(64), context).tolist():
                if used + length > context:
                    sequences, used = sequences + 1, 0
                    if sequences == m:
                        break  # the document waits for the next step
                used += length
                docs.append(length)
        ranks.append(np.asarray(docs, dtype=np.int64))
    return ranks


def _token_budget_makespans(lengths, context: int, dp: int, steps: int, cost,
                            seed: int) -> tuple[float, float]:
    """Sums over ``steps`` of (mdata makespan, token-budget baseline makespan)."""
    draw = _Lengths(lengths, seed)
    m = _micro_batches(dp, context)
    ours = base = 0.0
    for step in range(steps):
        per_rank = _token_budget_step(draw, dp, m, context)
        base += max(float(cost(docs, None).sum()) for docs in per_rank)
        tokens = np.concatenate(per_rank)
        ours += balance_step(tokens, cost(tokens, None), dp=dp, micro_batches=m,
                             max_tokens=context, seed=step).makespan
    return ours, base


def _micro_batches(dp: int, context: int) -> int:
    return max(1, -(-GLOBAL_TOKENS // (dp * context)))


def _makespans(lengths, context: int, dp: int, steps: int, cost, seed: int) -> tuple[float, ...]:
    """Sums over ``steps`` of (mdata makespan, baseline makespan, lower bound, pigeonhole bound)."""
    draw = _Lengths(lengths, seed)
    m = _micro_batches(dp, context)
    ours = base = bound = tight = 0.0
    for step in range(steps):
        tokens = draw.global_batch(GLOBAL_TOKENS, context, dp * m * context)
        costs = cost(tokens, None)
        ours += balance_step(tokens, costs, dp=dp, micro_batches=m, max_tokens=context,
                             seed=step).makespan
        base += greedy_pack_baseline(tokens, costs, dp=dp, micro_batches=m,
                                     max_tokens=context).makespan
        bound += lower_bound(costs, dp)
        tight += pigeonhole_lower_bound(costs, dp)
    return ours, base, bound, tight


def _planning_ms(lengths, repeats: int, global_tokens: int) -> float:
    """Median wall time of balance_step for DP 256 x CP 4 x TP 4 (4096 GPUs), 16k context."""
    dp, cp, context = 256, 4, 16384
    draw = _Lengths(lengths, seed=1234)
    m = max(1, -(-global_tokens // (dp * context)))
    times = []
    cost = AttentionCost()
    for step in range(repeats):
        tokens = draw.global_batch(global_tokens, context, dp * m * context)
        costs = cost(tokens, None)
        began = time.perf_counter()
        balance_step(tokens, costs, dp=dp, micro_batches=m, max_tokens=context, seed=step,
                     pad_multiple=2 * cp)
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times)


def run(quick: bool, lengths: dict[str, np.ndarray] | None = None) -> dict[str, object]:
    suffix = "" if lengths else "_synthetic"
    label = "corpus lengths" if lengths else "synthetic lognormal lengths"
    steps = 4 if quick else 24
    repeats = 5 if quick else 21
    figures: dict[str, object] = {}

    samples_note = f"{label}; DP 256 x CP 4 x TP 4, 16k context, median of {repeats} steps"
    figures["planner.balance_ms_per_step_4096"] = figure(
        _planning_ms(lengths, repeats, GLOBAL_TOKENS), unit="ms", goal="< 20 ms",
        note=f"{samples_note}, 4M tokens",
    )
    figures["planner.balance_ms_per_step_4096_8m_tokens"] = figure(
        _planning_ms(lengths, repeats, 2 * GLOBAL_TOKENS), unit="ms", goal="~2x the 4M figure",
        note=f"{samples_note}, 8M tokens (linear in samples)",
    )

    for cname, context in CONTEXTS.items():
        per_dp = {}
        for dp in DP_SIZES:
            ours, base, bound, tight = _makespans(lengths, context, dp, steps, AttentionCost(), seed=dp)
            per_dp[dp] = (ours, base, bound, tight)
            note = (f"{label}; dp={dp}, {_micro_batches(dp, context)} micro-batches of {cname}, "
                    f"~4M tokens/step, {steps} steps")
            figures[f"balance.makespan_vs_lb_{cname}_dp{dp}{suffix}"] = figure(
                ours / bound, base / bound, unit="cost", goal="<= 1.03", note=note
            )
            figures[f"balance.speedup_vs_baseline_{cname}_dp{dp}{suffix}"] = figure(
                base / ours, goal="> 1", note=f"baseline makespan / mdata makespan; {note}"
            )
        for dp in DP_SIZES:
            ours, base = _token_budget_makespans(lengths, context, dp, max(2, steps // 2),
                                                 AttentionCost(), seed=dp + 1)
            figures[f"balance.speedup_vs_token_budget_baseline_{cname}_dp{dp}{suffix}"] = figure(
                base / ours, goal="> 1",
                note=f"each rank fills {_micro_batches(dp, context)} x {cname} next-fit; {label}",
            )
            if dp == HEADLINE_DP:
                figures[f"balance.speedup_vs_token_budget_baseline_{cname}{suffix}"] = figure(
                    base / ours, goal="> 1", note=f"headline = dp={HEADLINE_DP}; {label}"
                )
        ours, base, bound, tight = per_dp[HEADLINE_DP]
        figures[f"balance.makespan_vs_lb_{cname}{suffix}"] = figure(
            ours / bound, base / bound, unit="cost", goal="<= 1.03",
            note=f"headline = dp={HEADLINE_DP}; {label}",
        )
        figures[f"balance.makespan_vs_pigeonhole_lb_{cname}{suffix}"] = figure(
            ours / tight, base / tight, unit="cost", goal="<= 1.03",
            note=(f"dp={HEADLINE_DP}; bound also counts that k*dp+1 largest samples put k+1 on some "
                  f"rank (more full-context documents than ranks); {label}"),
        )
        figures[f"balance.speedup_vs_baseline_{cname}{suffix}"] = figure(
            base / ours, goal="> 1", note=f"headline = dp={HEADLINE_DP}; {label}"
        )
        ours, base, _, _ = _makespans(lengths, context, HEADLINE_DP, steps,
                                      AttentionCost(a=1.0, b=0.0), seed=7)
        figures[f"balance.speedup_vs_baseline_{cname}_attn_only{suffix}"] = figure(
            base / ours, goal="> 1",
            note=f"cost l^2 only (attention-bound worst case); dp={HEADLINE_DP}; {label}",
        )
    figures.update(stage_figures(quick))  # module costs at PP 4 / 8 (benchmarks/balance_stages.py)
    return figures
