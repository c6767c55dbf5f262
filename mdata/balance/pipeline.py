"""Pipeline parallelism: a rank's 1F1B makespan, and the order of its micro-batches.

Why: with ``pp > 1`` a DP rank's step is not the sum of its micro-batches' costs but the makespan
of the 1F1B schedule (PipeDream-Flush, Megatron-LM's default) over them. Unequal micro-batches
leave stages idle, and *where* an expensive micro-batch sits in the schedule matters: the same
micro-batches can take a third longer in one order than in another. The balancer knows one cost
per sample, so it models each micro-batch's cost as split evenly over the stages, forward a
third and backward two thirds (``6 = 2 + 4`` of the FLOP count).

* :func:`one_f_one_b_makespan`: the exact makespan of that model, vectorised over many rows of
  micro-batch costs at once (a fixed schedule, evaluated in topological order).
* :func:`pipeline_cost`: a cheap estimate, ``(sum + (p - 1) x max) / p`` (the makespan of ``m``
  equal micro-batches is exactly ``(m + p - 1) c / p``, and the most expensive micro-batch
  crosses every stage); the balancer's pipeline pass of LPT uses it as a rank's load.
* :func:`order_micro_batches`: each rank's micro-batch order by insertion (NEH: the most expensive
  first, each into the position of the least makespan so far), near the optimum order.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from mdata.balance.lpt import PackState

__all__ = [
    "one_f_one_b_makespan", "order_micro_batches", "ordered_makespan", "pipeline_cost",
    "reorder_micro_batches",
]

#: Forward share of a micro-batch's cost on a stage (backward is twice forward).
_FORWARD = 1.0 / 3.0

#: Above this many schedule evaluations (``m^2 p``) only the most expensive micro-batch is
#: inserted, into the others in ascending cost (within a percent or two of the full insertion).
_ORDER_BUDGET = 2048

#: Up to this many stage costs in all (schedules x micro-batches x stages) a makespan is evaluated
#: a wave of operations at a time (:func:`schedule_end`); above it, an operation at a time over
#: views, which moves less memory.
_WAVES_UP_TO = 16384
#: ... and from this many micro-batches x stages on (shorter schedules are a short loop anyway).
_WAVES_FROM = 32


@lru_cache(maxsize=256)
def _schedule(m: int, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """The 1F1B operations of ``m`` micro-batches on ``p`` stages in a topological order.

    Per operation: micro-batch, is-forward, index of the previous operation on its stage and of
    the operation it waits for (``-1``: none); and the index of stage 0's last operation.
    Stage ``s`` runs ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one
    backward, then drains; a forward waits for the same micro-batch's forward on the stage before,
    a backward for its backward on the stage after (the last stage: its own forward).
    """
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        ops = [(True, i) for i in range(warm)]
        for k in range(m - warm):
            ops += [(True, warm + k), (False, k)]
        ops += [(False, i) for i in range(m - warm, m)]
        orders.append(ops)
    index: dict[tuple[bool, int, int], int] = {}
    mb, fwd, prev, dep = [], [], [], []
    nxt, last = [0] * p, [-1] * p
    while len(mb) < 2 * m * p:
        progressed = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                is_f, i = orders[s][nxt[s]]
                need = ((True, i, s - 1) if s > 0 else None) if is_f else (
                    (True, i, s) if s == p - 1 else (False, i, s + 1))
                if need is not None and need not in index:
                    break
                index[(is_f, i, s)] = len(mb)
                mb.append(i)
                fwd.append(is_f)
                prev.append(last[s])
                dep.append(-1 if need is None else index[need])
                last[s] = len(mb) - 1
                nxt[s] += 1
                progressed = True
        if not progressed:  # pragma: no cover - the schedule above never deadlocks
            raise RuntimeError("1F1B schedule deadlocked")
    arrays = [np.asarray(a, dtype=np.int64) for a in (mb, prev, dep)]
    return arrays[0], np.asarray(fwd, dtype=bool), arrays[1], arrays[2], last[0]


def one_f_one_b_makespan(costs: np.ndarray, stages: int) -> np.ndarray:
    """Makespan of the 1F1B schedule over micro-batch costs ``costs[..., m]`` (in order).

    Each micro-batch's cost is split evenly over ``stages`` stages, a third forward and two
    thirds backward; communication is free. The result has the leading shape of ``costs``; for
    one stage it is the sum, for ``m`` equal costs ``c`` it is ``(m + stages - 1) c / stages``.
    """
    costs = np.asarray(costs, dtype=np.float64)
    m, p = costs.shape[-1], int(stages)
    if p < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    if m == 0:
        return np.zeros(costs.shape[:-1])
    mb, fwd, prev, dep, last = _schedule(m, p)
    unit = costs / p
    rows = np.ascontiguousarray(unit.reshape(-1, m).T)  # micro-batch-major
    if m * p >= _WAVES_FROM and unit.size * p <= _WAVES_UP_TO:  # few, long schedules: by waves
        return schedule_end(_shares(m, p)[:, None] * rows[mb], m, p).reshape(costs.shape[:-1])
    # an operation at a time over contiguous rows (strided views cost more at many schedules)
    dur_f, dur_b = _FORWARD * rows, (1.0 - _FORWARD) * rows
    zero = np.zeros(rows.shape[1])
    end: list[np.ndarray] = []
    for k in range(mb.size):
        i, a, b = int(mb[k]), int(prev[k]), int(dep[k])
        start = end[a] if a >= 0 else zero
        if b >= 0:
            start = np.maximum(start, end[b])
        end.append(start + (dur_f[i] if fwd[k] else dur_b[i]))
    return end[last].reshape(costs.shape[:-1])


@lru_cache(maxsize=256)
def _shares(m: int, p: int) -> np.ndarray:
    """Per operation of :func:`_schedule` ``(m, p)``: its share of a stage's cost."""
    return np.where(_schedule(m, p)[1], _FORWARD, 1.0 - _FORWARD)


@lru_cache(maxsize=256)
def _waves(m: int, p: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """The operations of :func:`_schedule` ``(m, p)`` in waves: an operation's wave is one past
    the later of its stage's previous operation and the one it waits for, so a wave depends only
    on earlier ones. Per wave: its operations and those two predecessors (``-1``, none, mapped
    to a row of zeros past the last operation)."""
    mb, _, prev, dep, _ = _schedule(m, p)
    n = mb.size
    level = np.zeros(n, dtype=np.int64)
    for k in range(n):
        a, b = int(prev[k]), int(dep[k])
        level[k] = 1 + max(level[a] if a >= 0 else -1, level[b] if b >= 0 else -1)
    prev_z, dep_z = np.where(prev < 0, n, prev), np.where(dep < 0, n, dep)
    return tuple((ops, prev_z[ops], dep_z[ops])
                 for ops in (np.flatnonzero(level == w) for w in range(int(level.max()) + 1)))


def schedule_end(durations: np.ndarray, m: int, p: int) -> np.ndarray:
    """When the 1F1B schedule of ``m`` micro-batches on ``p`` stages ends, for many schedules at
    once: ``durations[k, j]`` is operation ``k``'s (of :func:`_schedule`) in schedule ``j``.

    An operation starts when its stage's previous operation and the one it waits for have both
    ended. Evaluated a wave at a time (about ``2 (m + p)`` array steps instead of ``2 m p``) with
    the same maxima and additions per operation as one at a time, so the result is the same to
    the last bit. Materialising every operation's durations costs memory traffic, so callers use
    it for few schedules (:data:`_WAVES_UP_TO`).
    """
    last = _schedule(m, p)[4]
    end = np.zeros((durations.shape[0] + 1,) + durations.shape[1:])  # the last row: nothing ran
    for ops, a, b in _waves(m, p):
        end[ops] = np.maximum(end[a], end[b]) + durations[ops]
    return end[last]


def pipeline_cost(bin_cost: np.ndarray, stages: int) -> np.ndarray:
    """The balancer's estimate of each rank's 1F1B makespan: ``(sum + (p - 1) max) / p``.

    ``bin_cost[r, k]``: cost of micro-batch ``k`` of rank ``r``. Exact for equal micro-batches;
    for unequal ones it is close to the makespan of their best order (see
    :func:`order_micro_batches`), which is what the balancer then realises.
    """
    bin_cost = np.asarray(bin_cost, dtype=np.float64)
    if bin_cost.shape[-1] == 0:
        return np.zeros(bin_cost.shape[:-1])
    return (bin_cost.sum(axis=-1) + (stages - 1) * bin_cost.max(axis=-1)) / stages


def _insert(seq: np.ndarray, new: np.ndarray, bin_cost: np.ndarray, stages: int) -> np.ndarray:
    """Per row, ``seq`` with ``new`` inserted where the 1F1B makespan is least (ties: earliest)."""
    dp, n = seq.shape
    pos = np.arange(n + 1)
    src = np.clip(pos[None, :] - (pos[None, :] > pos[:, None]), 0, max(n - 1, 0))
    cand = seq[:, src] if n else np.zeros((dp, 1, 1), dtype=np.int64)  # (dp, j, q)
    cand = np.where((pos[None, :] == pos[:, None])[None], new[:, None, None], cand)
    spans = one_f_one_b_makespan(bin_cost[np.arange(dp)[:, None, None], cand], stages)
    return cand[np.arange(dp), np.argmin(spans, axis=1)]


def order_micro_batches(bin_cost: np.ndarray, stages: int) -> np.ndarray:
    """Per rank, the order of its micro-batches that runs the 1F1B schedule fastest (nearly).

    Returns ``order[r]``: the micro-batch indices of rank ``r`` in the order to run them. NEH
    insertion, all ranks at once: the micro-batches in decreasing cost (ties by index) are
    inserted one by one where the partial sequence's makespan is least (ties: earliest place).
    With many micro-batches (``m^2 p`` schedule evaluations over the budget) only the most
    expensive one is inserted so, into the others in increasing cost. With one stage or one
    micro-batch the order is unchanged.
    """
    bin_cost = np.asarray(bin_cost, dtype=np.float64)
    dp, m = bin_cost.shape
    if stages <= 1 or m <= 1:
        return np.tile(np.arange(m), (dp, 1))
    by_cost = np.argsort(-bin_cost, axis=1, kind="stable")
    if m * m * stages > _ORDER_BUDGET:
        return _insert(by_cost[:, :0:-1], by_cost[:, 0], bin_cost, stages)
    seq = by_cost[:, :1]
    for n in range(1, m):
        seq = _insert(seq, by_cost[:, n], bin_cost, stages)
    return seq


def ordered_makespan(bin_cost: np.ndarray, stages: int) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's micro-batch order (:func:`order_micro_batches`) and its 1F1B makespan."""
    bin_cost = np.asarray(bin_cost, dtype=np.float64)
    order = order_micro_batches(bin_cost, stages)
    return order, one_f_one_b_makespan(np.take_along_axis(bin_cost, order, axis=1), stages)


def reorder_micro_batches(st: PackState, order: np.ndarray) -> None:
    """Renumber each rank's micro-batches in place; ``order[r]``: rank ``r``'s old indices."""
    where = np.argsort(order, axis=1)  # where[r, k]: new index of old micro-batch k
    rank_of = np.asarray(st.rank_of, dtype=np.int64)
    st.bin_of = where[rank_of, np.asarray(st.bin_of, dtype=np.int64)].tolist()
    st.bin_tokens = np.take_along_axis(np.asarray(st.bin_tokens), order, axis=1).tolist()
    st.bin_cost = np.take_along_axis(np.asarray(st.bin_cost), order, axis=1).tolist()
