"""Per-stage times: the 1F1B makespan of micro-batches whose cost differs from stage to stage.

Why: :mod:`mdata.balance.pipeline` models a micro-batch's cost as split evenly over the pipeline
stages, which is right for a language model alone. A vision-language model runs its vision
encoder on the first stage only (:class:`~mdata.module_cost.ModuleCost`), so a micro-batch's
time differs per stage, and an image-heavy one makes stage 0 the bottleneck although its total
is no larger than the others'. Here every micro-batch has a row of per-stage costs:

* :func:`stage_times`: those rows for each rank's micro-batches, from per-sample stage costs;
* :func:`stage_makespan`: the exact 1F1B makespan over such rows (the same schedule as
  :func:`~mdata.balance.pipeline.one_f_one_b_makespan`, forward a third of a stage's cost and
  backward two thirds; with even rows the two agree);
* :func:`order_by_stage`: each rank's micro-batch order by insertion on that makespan;
* :func:`stage_lower_bound`: what no assignment can beat: every rank runs all its micro-batches
  through each stage in turn, so some rank's stage ``s`` is busy ``total_s / dp`` at least; and
  the micro-batch holding a sample passes every stage forward and back, so the makespan is at
  least the sample's total.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from mdata.balance.pipeline import _FORWARD, _ORDER_BUDGET, _WAVES_FROM, _schedule, _shares, schedule_end

__all__ = ["order_by_stage", "ordered_by_stage", "stage_lower_bound", "stage_makespan", "stage_times"]


#: Up to this many stage times in all a makespan is evaluated by waves (as
#: :data:`~mdata.balance.pipeline._WAVES_UP_TO`); measured: by waves is as fast or faster up to
#: here once both read contiguous rows, the same result either way.
_WAVES_UP_TO = 65536


@lru_cache(maxsize=256)
def _stages_of(m: int, p: int) -> np.ndarray:
    """The stage of each operation of :func:`~mdata.balance.pipeline._schedule` ``(m, p)``.

    The schedule lists operations in a topological order, each with the one it waits for: a
    forward waits for the forward on the stage before (none on stage 0), a backward for the
    backward on the stage after, or on the last stage for its own forward; one pass recovers it.
    """
    _, fwd, _, dep, _ = _schedule(m, p)
    stage = np.zeros(fwd.size, dtype=np.int64)
    for k in range(fwd.size):
        d = int(dep[k])
        if fwd[k]:
            stage[k] = 0 if d < 0 else stage[d] + 1
        else:
            stage[k] = stage[d] if fwd[d] else stage[d] - 1
    return stage


def stage_makespan(times: np.ndarray) -> np.ndarray:
    """1F1B makespan over ``times[..., m, p]``: micro-batch ``i``'s cost on stage ``s``, in order.

    The result has the leading shape of ``times``. For one stage it is the sum; for rows that
    are all ``c / p`` it equals ``one_f_one_b_makespan(c, p)``.
    """
    times = np.asarray(times, dtype=np.float64)
    if times.ndim < 2:
        raise ValueError(f"times must be [..., micro-batches, stages], got shape {times.shape}")
    m, p = times.shape[-2], times.shape[-1]
    if p < 1:
        raise ValueError("times must have at least one stage")
    if m == 0:
        return np.zeros(times.shape[:-2])
    mb, fwd, prev, dep, last = _schedule(m, p)
    stage = _stages_of(m, p)
    rows = np.ascontiguousarray(times.reshape(-1, m * p).T)  # (micro-batch, stage)-major
    if m * p >= _WAVES_FROM and times.size <= _WAVES_UP_TO:  # few, long schedules: by waves
        durations = _shares(m, p)[:, None] * rows[mb * p + stage]
        return schedule_end(durations, m, p).reshape(times.shape[:-2])
    # an operation at a time, each reading one contiguous row of every schedule's durations
    # (strided views of ``times`` cost several times more at hundreds of schedules)
    dur_f, dur_b = _FORWARD * rows, (1.0 - _FORWARD) * rows
    zero = np.zeros(rows.shape[1])
    end: list[np.ndarray] = []
    for k in range(mb.size):
        i, s, a, b = int(mb[k]), int(stage[k]), int(prev[k]), int(dep[k])
        start = end[a] if a >= 0 else zero
        if b >= 0:
            start = np.maximum(start, end[b])
        end.append(start + (dur_f[i * p + s] if fwd[k] else dur_b[i * p + s]))
    return end[last].reshape(times.shape[:-2])


def stage_times(stage_costs: np.ndarray, rank: np.ndarray, micro_batch: np.ndarray, dp: int,
                m: int) -> np.ndarray:
    """``times[r, k, s]``: the summed stage-``s`` cost of micro-batch ``k`` of rank ``r``."""
    sc = np.asarray(stage_costs, dtype=np.float64)
    p = sc.shape[1]
    key = np.asarray(rank, dtype=np.int64) * m + np.asarray(micro_batch, dtype=np.int64)
    out = np.zeros((dp * m, p))
    np.add.at(out, key, sc)
    return out.reshape(dp, m, p)


def _insert(seq: np.ndarray, new: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, ``seq`` with ``new`` inserted where the makespan is least (ties: earliest), and
    that makespan."""
    dp, n = seq.shape
    pos = np.arange(n + 1)
    src = np.clip(pos[None, :] - (pos[None, :] > pos[:, None]), 0, max(n - 1, 0))
    cand = seq[:, src] if n else np.zeros((dp, 1, 1), dtype=np.int64)  # (dp, j, q)
    cand = np.where((pos[None, :] == pos[:, None])[None], new[:, None, None], cand)
    spans = stage_makespan(times[np.arange(dp)[:, None, None], cand])
    best = np.argmin(spans, axis=1)
    return cand[np.arange(dp), best], spans[np.arange(dp), best]


def order_by_stage(times: np.ndarray) -> np.ndarray:
    """Per rank, an order of its micro-batches (``times[r, k, s]``) that runs 1F1B fast.

    NEH insertion as :func:`~mdata.balance.pipeline.order_micro_batches`, on per-stage times:
    micro-batches by decreasing total, each inserted where the partial makespan is least; over
    the same schedule budget only the most expensive is inserted, into the others by increasing
    total. Returns ``order[r]``: rank ``r``'s micro-batch indices in running order.
    """
    return ordered_by_stage(times)[0]


def ordered_by_stage(times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`order_by_stage` and each rank's makespan in that order (the insertion evaluated
    it already; a makespan is the same to the last bit however many are evaluated at once)."""
    times = np.asarray(times, dtype=np.float64)
    dp, m, p = times.shape
    if p <= 1 or m <= 1:
        return np.tile(np.arange(m), (dp, 1)), stage_makespan(times)
    by_cost = np.argsort(-times.sum(axis=2), axis=1, kind="stable")
    if m * m * p > _ORDER_BUDGET:
        return _insert(by_cost[:, :0:-1], by_cost[:, 0], times)
    seq, span = by_cost[:, :1], None
    for n in range(1, m):
        seq, span = _insert(seq, by_cost[:, n], times)
    return seq, span


def stage_lower_bound(stage_costs: np.ndarray, dp: int) -> float:
    """``max(max_s total_s / dp, largest sample total)``: no assignment's makespan is below it."""
    sc = np.asarray(stage_costs, dtype=np.float64)
    if sc.size == 0:
        return 0.0
    return float(max(sc.sum(axis=0).max() / dp, sc.sum(axis=1).max()))
