"""balance_step_by_stage: balancing a step when a sample's cost differs from stage to stage.

Why: with a vision encoder on the first pipeline stage, equal totals do not make equal steps: a
DP rank that drew more images has a slower stage 0, and every rank waits for it. Given each
sample's cost on every stage (:meth:`~mdata.module_cost.ModuleCost.stage_costs`), this balancer
minimises the slowest DP rank's 1F1B makespan (:func:`~mdata.balance.stages.stage_makespan`):

1. **Candidates.** The scalar balancer on the totals (exactly what a plan without module costs
   gets); the scalar balancer on the step's bottleneck stage alone (the stage with the most
   cost over the step: stage 0 for an image-heavy step); and a greedy on each rank's estimated
   per-stage makespan (:func:`~mdata.balance.stage_lpt.lpt_by_stage`). Each rank's
   micro-batches are ordered by insertion on the per-stage makespan (or kept in the scalar
   balancer's order where that is faster), and the candidate with the fastest slowest rank wins.
2. **Refinement.** Against the slowest rank, moves and swaps with the fastest few ranks,
   screened on each rank's busiest stage (the least estimates, found without estimating every
   pair: :mod:`~mdata.balance.stage_screen`) and confirmed on the exact makespan
   of both ranks; one is applied while it lowers the larger of the two.

The scalar candidate is one of the candidates, so the result is never slower under the stage
model than balancing the totals. Token limits, micro-batch counts and the guarantee that no
micro-batch is left empty by a move are those of :func:`~mdata.balance.balance_step`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mdata.balance.assignment import StepAssignment, assemble
from mdata.balance.inputs import validate_step
from mdata.balance.stage_lpt import lpt_by_stage
from mdata.balance.stage_screen import least_swaps
from mdata.balance.stages import ordered_by_stage, stage_lower_bound, stage_makespan, stage_times
from mdata.balance.step import balance_step
from mdata.errors import PlanError

__all__ = ["StageAssignment", "balance_step_by_stage"]

#: How many of the fastest ranks the refinement tries against the slowest one per round.
_PARTNERS = 4
#: How many screened moves and swaps are checked on the exact makespan per round.
_CHECKED = 64


@dataclass(frozen=True, eq=False)
class StageAssignment:
    """A step balanced by stage: the assignment (micro-batches numbered in running order) and
    its figures under the per-stage model, in the cost model's unit."""

    assignment: StepAssignment
    per_rank_makespan: np.ndarray  # float64[dp]: each rank's 1F1B makespan
    lower_bound: float  # stage_lower_bound: no assignment is faster
    scalar_makespan: float  # the scalar balancer's slowest rank, under the same model

    @property
    def makespan(self) -> float:
        return float(self.per_rank_makespan.max()) if self.per_rank_makespan.size else 0.0

    @property
    def makespan_over_lower_bound(self) -> float:
        return self.makespan / self.lower_bound if self.lower_bound > 0 else 1.0

    @property
    def gain_over_scalar(self) -> float:
        """The scalar balancer's makespan over this one's (>= 1)."""
        return self.scalar_makespan / self.makespan if self.makespan > 0 else 1.0


def _ordered(times: np.ndarray, given: np.ndarray,
             span: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per rank the faster of ``given`` and the insertion order, and its makespan. ``span``:
    the makespans in ``given`` order where the caller has them already."""
    if span is None:
        span = stage_makespan(times[np.arange(times.shape[0])[:, None], given])
    neh, neh_span = ordered_by_stage(times)
    better = neh_span < span
    return np.where(better[:, None], neh, given), np.where(better, neh_span, span)


def balance_step_by_stage(num_tokens: np.ndarray, stage_costs: np.ndarray, *, dp: int,
                          micro_batches: int, max_tokens: int, seed: int = 0,
                          pad_multiple: int = 1) -> StageAssignment:
    """Assign a step's samples to DP ranks and micro-batches, balancing every pipeline stage.

    ``stage_costs[i, s]``: sample ``i``'s cost on stage ``s`` (forward and backward); the number
    of columns is the number of stages. Other arguments as for
    :func:`~mdata.balance.balance_step`; the assignment's costs are the samples' totals.
    """
    sc = np.asarray(stage_costs, dtype=np.float64)
    if sc.ndim != 2 or sc.shape[1] < 1 or sc.shape[0] != np.shape(num_tokens)[0]:
        raise PlanError(f"stage_costs must be [samples, stages] with one row per sample, got shape "
                        f"{sc.shape} for {np.shape(num_tokens)[0]} samples")
    totals = sc.sum(axis=1)
    tokens, _, dp, requested, max_tokens = validate_step(
        num_tokens, totals, dp, micro_batches, max_tokens, pad_multiple)  # checks costs too
    if not np.isfinite(sc).all() or (sc < 0).any():
        raise PlanError("stage costs must be finite and >= 0 (check the plan's cost model)")
    p = sc.shape[1]
    common = dict(dp=dp, micro_batches=micro_batches, max_tokens=max_tokens, seed=seed,
                  pad_multiple=pad_multiple)
    scalar = balance_step(num_tokens, totals, stages=p, **common)
    m = scalar.num_micro_batches
    candidates = [scalar]
    if p > 1 and sc.size:
        bottleneck = sc[:, int(np.argmax(sc.sum(axis=0)))]
        candidates.append(balance_step(num_tokens, bottleneck, stages=p, **common))
    placements = [(np.asarray(c.rank, np.int64), np.asarray(c.micro_batch, np.int64))
                  for c in candidates if c.num_micro_batches == m]  # same schedule length
    if p > 1 and sc.size:
        rng = np.random.default_rng(seed)
        greedy = lpt_by_stage(np.lexsort((rng.permutation(tokens.size), -tokens, -totals)).tolist(),
                              tokens, sc, dp, m, max_tokens)
        if greedy is not None:
            placements.append(greedy)
    identity = np.tile(np.arange(m), (dp, 1))
    best = None
    for k, (rank, mb) in enumerate(placements):
        times = stage_times(sc, rank, mb, dp, m)
        order, spans = _ordered(times, identity)
        if k == 0:
            scalar_span = float(spans.max()) if spans.size else 0.0
        if best is None or spans.max() < best[3].max():
            best = (rank, mb, order, spans, times)
    rank, mb, order, spans, times = best
    where = np.argsort(order, axis=1)  # renumber micro-batches into running order
    mb = where[rank, mb]
    if p > 1 and dp > 1 and tokens.size:
        # the same sums in running order (each micro-batch adds the same samples in turn)
        times = np.take_along_axis(times, order[:, :, None], axis=1)
        rank, mb, spans = _refine(sc, tokens, rank, mb, dp, m, max_tokens, times, spans)
    stage = "" if p == 1 else f", by stage over {p} pipeline stages"
    assignment = assemble(rank, mb, tokens, totals, dp=dp, num_micro_batches=m,
                          max_tokens=max_tokens, requested=requested,
                          algorithm=f"mdata balance (LPT + refinement{stage})")
    return StageAssignment(assignment, spans, stage_lower_bound(sc, dp), scalar_span)


def _refine(sc: np.ndarray, tokens: np.ndarray, rank: np.ndarray, mb: np.ndarray, dp: int,
            m: int, cap: int, times: np.ndarray,
            spans: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Moves and swaps against the slowest rank (step 2 of the module docstring); renumbers
    each rank's micro-batches into running order at the end. ``times``/``spans``: each
    micro-batch's stage times and each rank's makespan, micro-batches numbered in running
    order. Returns rank, micro-batch, spans."""
    rank, mb, times, spans = rank.copy(), mb.copy(), times.copy(), spans.copy()
    toks = np.zeros(dp * m, np.int64)
    np.add.at(toks, rank * m + mb, tokens)
    toks = toks.reshape(dp, m)
    count = np.bincount(rank * m + mb, minlength=dp * m).reshape(dp, m)
    order = np.tile(np.arange(m), (dp, 1))
    partners = min(_PARTNERS, dp - 1)
    for _ in range(2 * dp + 32):
        r1 = int(np.argmax(spans))
        low = [int(r) for r in np.argsort(spans, kind="stable")[: partners + 1] if r != r1][:partners]
        x = np.flatnonzero(rank == r1)
        sx, tx, bx = sc[x], tokens[x], mb[x]
        load1 = times[r1].sum(axis=0)
        screened: list[tuple[float, int, int, int]] = []  # (estimate, r2, x, y or -1-bin)
        for r2 in low:
            load2 = times[r2].sum(axis=0)
            # move: x into r2's cheapest micro-batch with room; its own must keep a sample
            fits = toks[r2][None, :] + tx[:, None] <= cap
            if fits.any():
                bin_cost = np.where(fits, times[r2].sum(axis=1)[None, :], np.inf)
                to = np.argmin(bin_cost, axis=1)
                est = np.maximum((load1 - sx).max(axis=1), (load2 + sx).max(axis=1))
                est[~fits.any(axis=1) | (count[r1, bx] < 2)] = np.inf
                top = np.argpartition(est, _CHECKED)[:_CHECKED] if est.size > _CHECKED else np.arange(est.size)
                for j in top[np.argsort(est[top], kind="stable")].tolist():
                    if np.isfinite(est[j]):
                        screened.append((float(est[j]), r2, int(x[j]), -1 - int(to[j])))
            y = np.flatnonzero(rank == r2)
            if y.size == 0:
                continue
            # screened on each rank's busiest stage only (pairs x stages would be n^2 p)
            a, b, est = least_swaps(load1, load2, sx, sc[y], tx, tokens[y], cap - toks[r1, bx],
                                    cap - toks[r2, mb[y]], _CHECKED)
            screened.extend(zip(est.tolist(), [r2] * est.size, x[a].tolist(), y[b].tolist()))
        if not screened:
            break
        screened.sort(key=lambda c: c[0])
        screened = screened[:_CHECKED]
        _, r2s, ii, jj = (np.array(col) for col in zip(*screened))
        span1, span2 = _checked(times, order, sc, mb, r1, r2s, ii, jj)
        value = np.maximum(span1, span2)
        c = int(np.argmin(value))
        if not value[c] < spans[r1] * (1 - 1e-9):
            break
        _, r2, i, j = screened[c]
        moves = [(i, r1, int(mb[i]), r2, -1 - j if j < 0 else int(mb[j]))]
        if j >= 0:
            moves.append((j, r2, int(mb[j]), r1, int(mb[i])))
        for s, ra, ba, rb, bb in moves:
            times[ra, ba] -= sc[s]
            times[rb, bb] += sc[s]
            toks[ra, ba] -= tokens[s]
            toks[rb, bb] += tokens[s]
            count[ra, ba] -= 1
            count[rb, bb] += 1
            rank[s], mb[s] = rb, bb
        pair = np.array([r1, r2])
        # r1's new times are those its exact check evaluated (the same subtraction then
        # addition); a swap's partner adds in another order there, so it is evaluated again
        known = np.array([span1[c], stage_makespan(times[r2, order[r2]])])
        order[pair], spans[pair] = _ordered(times[pair], order[pair], known)
    order, spans = _ordered(times, order, spans)  # ``spans``: each rank's in ``order``
    where = np.argsort(order, axis=1)
    return rank, where[rank, mb], spans


def _checked(times: np.ndarray, order: np.ndarray, sc: np.ndarray, mb: np.ndarray, r1: int,
             r2s: np.ndarray, ii: np.ndarray, jj: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exact makespans of ``r1`` and each partner ``r2s[c]`` after screened change ``c``:
    sample ``ii[c]`` moves from ``r1`` to micro-batch ``-1 - jj[c]`` of ``r2s[c]`` (``jj < 0``) or
    swaps with sample ``jj[c]``. All changes at once, the same additions as one at a time."""
    rows = np.arange(ii.size)
    swap = jj >= 0
    new1 = np.repeat(times[r1][None], ii.size, axis=0)
    new1[rows, mb[ii]] -= sc[ii]
    new1[rows[swap], mb[ii[swap]]] += sc[jj[swap]]
    new2 = times[r2s]
    into = np.where(swap, mb[np.where(swap, jj, 0)], -1 - jj)
    moved = sc[ii]
    moved[swap] = moved[swap] - sc[jj[swap]]
    new2[rows, into] += moved
    return (stage_makespan(new1[:, order[r1]]),
            stage_makespan(new2[rows[:, None], order[r2s]]))
