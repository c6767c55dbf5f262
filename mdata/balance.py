"""Global balancing of one step: samples -> (DP rank, micro-batch), and CP splitting of sequences.

Why: in synchronous data-parallel training a step lasts as long as its slowest rank. Per-rank
loaders that pack greedily to the context length give every rank the same *tokens* but wildly
different *cost* (attention is quadratic in document length), so the step waits for the rank that
drew the long documents. With the whole global batch's costs known, the Planner can instead
minimise the maximum per-rank cost, subject to every micro-batch holding at most ``max_tokens``.

The algorithm (:func:`balance_step`):

1. **LPT with token room.** Samples in decreasing cost order go to the least-loaded rank that has a
   micro-batch with room for them, into that rank's cheapest micro-batch with room (so a rank's
   micro-batches also come out balanced, which pipeline parallelism needs). A heap keeps this
   ``O(n log dp)``. LPT alone is within ``4/3`` of the optimum when tokens do not bind.
2. **Refinement.** Repeatedly take the most loaded rank and the few least loaded ones and apply the
   single move or pairwise swap (checked with numpy over all pairs) that lowers the larger of the
   two loads most, respecting micro-batch capacity; stop when nothing improves or the maximum is
   within 0.1% of the lower bound ``max(total/dp, largest sample)``.
3. **Micro-batch re-pack.** Each rank's samples are re-packed LPT-style over its micro-batches
   when that lowers its most expensive micro-batch.

Every rank gets the same number of micro-batches (trainers run a fixed schedule); it grows above
the requested count only when the samples' tokens cannot be packed into it, and the assignment
reports the count used. Costs are additive per sample because varlen attention (``cu_seqlens``)
costs the sum over packed documents.

Also here: :func:`greedy_pack_baseline` (what independent per-rank loaders do, for comparison),
:func:`cp_zigzag_slices` (which tokens each context-parallel rank gets) and
:func:`brute_force_min_makespan` (the exact optimum of tiny instances, for tests).
"""

from __future__ import annotations

import heapq
import html
from dataclasses import dataclass

import numpy as np

from mdata.errors import PlanError

__all__ = [
    "StepAssignment",
    "balance_step",
    "brute_force_min_makespan",
    "causal_attention_work",
    "cp_zigzag_slices",
    "greedy_pack_baseline",
    "pigeonhole_lower_bound",
    "lower_bound",
]

#: Refinement stops once the makespan is within this fraction of the lower bound: further gains
#: are below the noise of real step times and cost planning time.
_GOOD_ENOUGH = 1e-3

#: How many of the least-loaded ranks the refinement tries against the most loaded one per round.
_REFINE_PARTNERS = 4


# ----------------------------------------------------------------------------------------------
# result
# ----------------------------------------------------------------------------------------------


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


def lower_bound(costs: np.ndarray, dp: int) -> float:
    """``max(total/dp, largest item)``: no assignment of indivisible samples can beat it."""
    costs = np.asarray(costs, dtype=np.float64)
    if costs.size == 0:
        return 0.0
    return float(max(costs.sum() / dp, costs.max()))


def pigeonhole_lower_bound(costs: np.ndarray, dp: int) -> float:
    """A tighter bound than :func:`lower_bound` when many samples are large.

    Among the ``k*dp + 1`` largest samples, some rank holds at least ``k + 1`` of them, so the
    makespan is at least the sum of the ``k + 1`` smallest of those. The bound is the largest of
    these over ``k`` (and of :func:`lower_bound`). It matters when a step holds more
    full-context documents than there are ranks: then two of them must share a rank, however the
    rest is spread.
    """
    costs = np.sort(np.asarray(costs, dtype=np.float64))[::-1]
    best = lower_bound(costs, dp)
    if costs.size <= dp:
        return best
    prefix = np.concatenate([[0.0], np.cumsum(costs)])
    k = np.arange(1, (costs.size - 1) // dp + 1)
    top = k * dp + 1  # the k*dp+1 largest samples...
    sums = prefix[top] - prefix[top - (k + 1)]  # ...of which the k+1 smallest share a rank
    return float(max(best, sums.max()))


def _assemble(
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


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise PlanError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _validate(
    num_tokens, costs, dp, micro_batches, max_tokens, pad_multiple
) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """Checked inputs; the returned token counts are *slots*: rounded up to ``pad_multiple``."""
    dp = _positive_int("dp", dp)
    micro_batches = _positive_int("micro_batches", micro_batches)
    max_tokens = _positive_int("max_tokens", max_tokens)
    pad_multiple = _positive_int("pad_multiple", pad_multiple)
    tokens = np.asarray(num_tokens)
    cost = np.asarray(costs, dtype=np.float64)
    if tokens.ndim != 1 or cost.shape != tokens.shape:
        raise PlanError(
            f"num_tokens and costs must be 1-d arrays of the same length, got shapes "
            f"{tokens.shape} and {cost.shape}"
        )
    if tokens.size and tokens.dtype.kind not in "iu":
        raise PlanError(f"num_tokens must be integers, got dtype {tokens.dtype}")
    tokens = tokens.astype(np.int64)
    if tokens.size:
        slots = -(-tokens // pad_multiple) * pad_multiple
        bad = np.flatnonzero((tokens < 0) | (slots > max_tokens))
        if bad.size:
            i = int(bad[0])
            padded = "" if pad_multiple == 1 else (
                f" ({slots[i]} after padding to a multiple of {pad_multiple}; make max_tokens a "
                f"multiple of {pad_multiple})"
            )
            raise PlanError(
                f"sample {i} has {tokens[i]} tokens{padded}, outside 0..max_tokens={max_tokens}; "
                f"truncate samples to max_tokens before balancing"
            )
        tokens = slots
        bad = np.flatnonzero(~np.isfinite(cost) | (cost < 0))
        if bad.size:
            i = int(bad[0])
            raise PlanError(
                f"sample {i} has cost {float(cost[i])}; costs must be finite and >= 0 "
                f"(check the plan's cost model)"
            )
    return tokens, cost, dp, micro_batches, max_tokens


# ----------------------------------------------------------------------------------------------
# balance_step
# ----------------------------------------------------------------------------------------------


def _min_micro_batches(tokens: np.ndarray, dp: int, requested: int, max_tokens: int) -> int:
    """The fewest micro-batches per rank that could possibly hold the samples' tokens."""
    if tokens.size == 0:
        return requested
    by_volume = -(-int(tokens.sum()) // (dp * max_tokens))
    # samples longer than half a micro-batch can never share one
    halves = int(np.count_nonzero(2 * tokens > max_tokens))
    by_large = -(-halves // dp)
    return max(requested, by_volume, by_large)


class _State:
    """Mutable working state of one balancing run (plain lists: faster than numpy per item)."""

    def __init__(self, n: int, dp: int, m: int, max_tokens: int) -> None:
        self.dp, self.m, self.cap = dp, m, max_tokens
        self.rank_of = [0] * n
        self.bin_of = [0] * n
        self.bin_tokens = [[0] * m for _ in range(dp)]
        self.bin_cost = [[0.0] * m for _ in range(dp)]
        self.rank_cost = [0.0] * dp


def _greedy(order: list[int], tok: list[int], cost: list[float], dp: int, m: int, cap: int):
    """LPT over ranks with micro-batch room; LPT over a rank's micro-batches. None if stuck."""
    st = _State(len(tok), dp, m, cap)
    rank_of, bin_of, bin_tokens, bin_cost, rank_cost = (
        st.rank_of, st.bin_of, st.bin_tokens, st.bin_cost, st.rank_cost
    )
    room = [cap] * dp  # largest free space among each rank's micro-batches
    heap = [(0.0, r) for r in range(dp)]
    # Ranks without room for the current sample wait here, largest room first, until a sample
    # small enough comes; their load and room cannot change meanwhile. This keeps a near-full
    # batch O(n log dp) instead of rescanning full ranks for every sample.
    parked: list[tuple[int, float, int]] = []
    pop, push = heapq.heappop, heapq.heappush
    for i in order:
        t = tok[i]
        while parked and -parked[0][0] >= t:
            _, load, r = pop(parked)
            push(heap, (load, r))
        while True:
            if not heap:
                return None  # no rank has a micro-batch with room for this sample
            load, r = pop(heap)
            if room[r] >= t:
                break
            push(parked, (-room[r], load, r))
        bt = bin_tokens[r]
        if m == 1:
            b = 0
        else:
            bc = bin_cost[r]
            limit = cap - t
            b = -1
            best = float("inf")
            for k in range(m):
                if bt[k] <= limit and bc[k] < best:
                    best = bc[k]
                    b = k
        c = cost[i]
        bt[b] += t
        bin_cost[r][b] += c
        rank_cost[r] += c
        room[r] = cap - min(bt)
        push(heap, (rank_cost[r], r))
        rank_of[i] = r
        bin_of[i] = b
    return st


def _refine(st: _State, tokens: np.ndarray, costs: np.ndarray, target: float) -> None:
    """Moves and swaps between the most loaded rank and the least loaded ones (in place)."""
    dp, cap = st.dp, st.cap
    if dp < 2:
        return
    rank_of = np.asarray(st.rank_of, dtype=np.int64)
    bin_of = np.asarray(st.bin_of, dtype=np.int64)
    bin_tokens = np.asarray(st.bin_tokens, dtype=np.int64)
    bin_cost = np.asarray(st.bin_cost, dtype=np.float64)
    rank_cost = np.asarray(st.rank_cost, dtype=np.float64)
    members: list[list[int]] = [[] for _ in range(dp)]
    for i, r in enumerate(st.rank_of):
        members[r].append(i)
    partners = min(_REFINE_PARTNERS, dp - 1)
    max_rounds = 4 * dp + 64
    for _ in range(max_rounds):
        r1 = int(np.argmax(rank_cost))
        c1 = float(rank_cost[r1])
        if c1 <= target:
            break
        low = np.argpartition(rank_cost, partners)[: partners + 1]
        low = low[low != r1][:partners]
        items1 = np.asarray(members[r1], dtype=np.int64)
        t1, k1, b1 = tokens[items1], costs[items1], bin_of[items1]
        free1 = cap - bin_tokens[r1, b1]  # free space in each item's own micro-batch
        best_value, best = c1 * (1 - 1e-12), None
        for r2 in low.tolist():
            c2 = float(rank_cost[r2])
            if c2 >= c1:
                continue
            # move one item of r1 to r2's micro-batch with the most room
            room2 = cap - int(bin_tokens[r2].min())
            value = np.maximum(c1 - k1, c2 + k1)
            value[t1 > room2] = np.inf
            j = int(np.argmin(value))
            if value[j] < best_value:
                best_value, best = float(value[j]), ("move", r2, int(items1[j]), -1)
            items2 = np.asarray(members[r2], dtype=np.int64)
            if items2.size == 0:
                continue
            t2, k2, b2 = tokens[items2], costs[items2], bin_of[items2]
            free2 = cap - bin_tokens[r2, b2]
            delta = k1[:, None] - k2[None, :]
            value = np.maximum(c1 - delta, c2 + delta)
            grow = t2[None, :] - t1[:, None]  # token change of r1's micro-batch
            ok = (delta > 0) & (grow <= free1[:, None]) & (-grow <= free2[None, :])
            value = np.where(ok, value, np.inf)
            flat = int(np.argmin(value))
            a, b = divmod(flat, items2.size)
            if value[a, b] < best_value:
                best_value, best = float(value[a, b]), ("swap", r2, int(items1[a]), int(items2[b]))
        if best is None:
            break
        kind, r2, x, y = best
        bx = int(bin_of[x])
        if kind == "move":
            fits = np.flatnonzero(bin_tokens[r2] + tokens[x] <= cap)
            by = int(fits[np.argmin(bin_cost[r2, fits])])
            _relocate(x, r1, bx, r2, by, tokens, costs, rank_of, bin_of, bin_tokens, bin_cost,
                      rank_cost, members)
        else:
            by = int(bin_of[y])
            _relocate(x, r1, bx, r2, by, tokens, costs, rank_of, bin_of, bin_tokens, bin_cost,
                      rank_cost, members)
            _relocate(y, r2, by, r1, bx, tokens, costs, rank_of, bin_of, bin_tokens, bin_cost,
                      rank_cost, members)
    st.rank_of = rank_of.tolist()
    st.bin_of = bin_of.tolist()
    st.bin_tokens = bin_tokens.tolist()
    st.bin_cost = bin_cost.tolist()
    st.rank_cost = rank_cost.tolist()


def _relocate(i, r_from, b_from, r_to, b_to, tokens, costs, rank_of, bin_of, bin_tokens,
              bin_cost, rank_cost, members) -> None:
    t, c = int(tokens[i]), float(costs[i])
    bin_tokens[r_from, b_from] -= t
    bin_tokens[r_to, b_to] += t
    bin_cost[r_from, b_from] -= c
    bin_cost[r_to, b_to] += c
    rank_cost[r_from] -= c
    rank_cost[r_to] += c
    rank_of[i] = r_to
    bin_of[i] = b_to
    members[r_from].remove(i)
    members[r_to].append(i)


def _repack_micro_batches(st: _State, order: list[int], tok: list[int], cost: list[float]) -> None:
    """Re-pack each rank's samples LPT-style over its micro-batches where that evens them out."""
    dp, m, cap = st.dp, st.m, st.cap
    if m == 1:
        return
    new_tokens = [[0] * m for _ in range(dp)]
    new_cost = [[0.0] * m for _ in range(dp)]
    new_bin = [0] * len(tok)
    failed = [False] * dp
    rank_of = st.rank_of
    for i in order:
        r = rank_of[i]
        if failed[r]:
            continue
        bt, bc = new_tokens[r], new_cost[r]
        limit = cap - tok[i]
        b, best = -1, float("inf")
        for k in range(m):
            if bt[k] <= limit and bc[k] < best:
                best, b = bc[k], k
        if b < 0:
            failed[r] = True
            continue
        bt[b] += tok[i]
        bc[b] += cost[i]
        new_bin[i] = b
    better = [
        not failed[r] and max(new_cost[r]) < max(st.bin_cost[r]) for r in range(dp)
    ]
    for i, r in enumerate(rank_of):
        if better[r]:
            st.bin_of[i] = new_bin[i]
    for r in range(dp):
        if better[r]:
            st.bin_tokens[r] = new_tokens[r]
            st.bin_cost[r] = new_cost[r]


def balance_step(
    num_tokens: np.ndarray,
    costs: np.ndarray,
    *,
    dp: int,
    micro_batches: int,
    max_tokens: int,
    seed: int = 0,
    pad_multiple: int = 1,
) -> StepAssignment:
    """Assign every sample of a global step to a DP rank and a micro-batch (see module docstring).

    ``num_tokens[i]`` (already truncated to ``<= max_tokens``) and ``costs[i]`` describe sample
    ``i``. Minimises the largest per-rank cost; every micro-batch holds at most ``max_tokens``
    tokens; every rank gets ``num_micro_batches >= micro_batches`` micro-batches (more only when the
    tokens do not fit). ``seed`` breaks ties between equal samples; the result is a pure function of
    the inputs.

    ``pad_multiple``: each sample occupies its length rounded up to this multiple (with context
    parallelism every document is padded to a multiple of ``2 * cp`` for the zigzag split, see
    :func:`cp_zigzag_slices`); capacity and the reported token totals count these padded slots.
    """
    tokens, cost, dp, requested, max_tokens = _validate(
        num_tokens, costs, dp, micro_batches, max_tokens, pad_multiple
    )
    n = tokens.size
    rng = np.random.default_rng(seed)
    order_arr = np.lexsort((rng.permutation(n), -tokens, -cost))
    order = order_arr.tolist()
    tok = tokens.tolist()
    cst = cost.tolist()
    lb = lower_bound(cost, dp)
    m = _min_micro_batches(tokens, dp, requested, max_tokens)
    while True:
        state = _greedy(order, tok, cst, dp, m, max_tokens)
        if state is not None:
            break
        m += 1
    _refine(state, tokens, cost, lb * (1 + _GOOD_ENOUGH))
    _repack_micro_batches(state, order, tok, cst)
    return _assemble(
        np.asarray(state.rank_of, dtype=np.int64),
        np.asarray(state.bin_of, dtype=np.int64),
        tokens,
        cost,
        dp=dp,
        num_micro_batches=m,
        max_tokens=max_tokens,
        requested=requested,
        algorithm="mdata balance (LPT + refinement)",
    )


# ----------------------------------------------------------------------------------------------
# baseline
# ----------------------------------------------------------------------------------------------


def greedy_pack_baseline(
    num_tokens: np.ndarray,
    costs: np.ndarray,
    *,
    dp: int,
    micro_batches: int,
    max_tokens: int,
    pad_multiple: int = 1,
) -> StepAssignment:
    """What independent per-rank data-parallel loaders do, for comparison with :func:`balance_step`.

    Samples, in arrival order, are split into ``dp`` consecutive runs of equal count (the first
    ``n % dp`` runs get one more), and each rank packs its run greedily (next-fit) into sequences
    of ``max_tokens``: no rank sees the others' costs. Ranks that fill fewer than the step's
    micro-batch count leave the rest empty; ``num_micro_batches`` is the largest count any rank
    needed (at least ``micro_batches``). ``pad_multiple`` as in :func:`balance_step`.
    """
    tokens, cost, dp, requested, max_tokens = _validate(
        num_tokens, costs, dp, micro_batches, max_tokens, pad_multiple
    )
    n = tokens.size
    rank = np.repeat(np.arange(dp), [len(run) for run in np.array_split(np.arange(n), dp)])
    micro_batch = np.zeros(n, dtype=np.int64)
    tok = tokens.tolist()
    used = 0
    prev_rank = -1
    b = 0
    for i, r in enumerate(rank.tolist()):
        if r != prev_rank:
            prev_rank, b, used = r, 0, 0
        if used + tok[i] > max_tokens:
            b += 1
            used = 0
        used += tok[i]
        micro_batch[i] = b
    m = max(requested, int(micro_batch.max()) + 1 if n else 0)
    return _assemble(
        rank, micro_batch, tokens, cost, dp=dp, num_micro_batches=m, max_tokens=max_tokens,
        requested=requested, algorithm="per-rank greedy packing (baseline)",
    )


# ----------------------------------------------------------------------------------------------
# context parallelism
# ----------------------------------------------------------------------------------------------


def cp_zigzag_slices(length: int, cp: int) -> list[np.ndarray]:
    """Token indices of one sequence that each of ``cp`` context-parallel ranks gets.

    With a causal mask, token ``q`` attends to ``q + 1`` keys, so a contiguous split gives the last
    CP rank ``2*cp - 1`` times the work of the first. The zigzag split cuts the sequence into
    ``2*cp`` equal chunks and gives rank ``i`` chunks ``i`` and ``2*cp - 1 - i``: one cheap and one
    expensive chunk each, so causal work is even (what Megatron-Core / Transformer Engine expect).

    Padding rule: chunks have ``ceil(length / (2*cp))`` slots; the sequence is conceptually padded
    at its end to ``2*cp`` times that, and padding positions are left out of the returned indices.
    So the last ranks' chunks may be short (or empty for very short sequences); the constructor
    pads every rank's slice to ``2 * ceil(length / (2*cp))`` tokens with padding that attends to
    nothing and carries no loss.
    """
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
        raise PlanError(f"sequence length must be an int >= 0, got {length!r}")
    cp = _positive_int("cp", cp)
    chunk = -(-int(length) // (2 * cp))
    slices = []
    for i in range(cp):
        parts = []
        for c in (i, 2 * cp - 1 - i):
            start, stop = min(c * chunk, length), min((c + 1) * chunk, length)
            parts.append(np.arange(start, stop, dtype=np.int64))
        slices.append(np.concatenate(parts))
    return slices


def causal_attention_work(slices: list[np.ndarray]) -> np.ndarray:
    """Causal attention work of each CP rank: for its query tokens ``q``, the sum of ``q + 1``."""
    return np.array([float(np.sum(np.asarray(s, dtype=np.float64) + 1.0)) for s in slices])


# ----------------------------------------------------------------------------------------------
# exact optimum, for tests
# ----------------------------------------------------------------------------------------------

_BRUTE_FORCE_LIMIT = 16


def brute_force_min_makespan(costs: np.ndarray, dp: int) -> float:
    """The exact minimum over all assignments of the maximum per-rank cost (tiny instances only).

    Ignores token capacity. Branch and bound over samples in decreasing cost order, skipping
    symmetric placements (ranks with equal load); limited to 16 samples.
    """
    dp = _positive_int("dp", dp)
    values = sorted((float(c) for c in np.asarray(costs, dtype=np.float64)), reverse=True)
    if len(values) > _BRUTE_FORCE_LIMIT:
        raise PlanError(
            f"brute_force_min_makespan is exponential; it takes at most {_BRUTE_FORCE_LIMIT} "
            f"samples, got {len(values)}"
        )
    if not values:
        return 0.0
    loads = [0.0] * dp
    best = [sum(values)]
    bound = lower_bound(np.asarray(values), dp)

    def place(k: int, current_max: float) -> None:
        if current_max >= best[0]:
            return
        if k == len(values):
            best[0] = current_max
            return
        seen: set[float] = set()
        for r in range(dp):
            if loads[r] in seen:
                continue
            seen.add(loads[r])
            loads[r] += values[k]
            place(k + 1, max(current_max, loads[r]))
            loads[r] -= values[k]
            if best[0] <= bound:
                return

    place(0, 0.0)
    return best[0]
