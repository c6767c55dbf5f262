"""The at-scale simulation's baselines: what per-rank loaders deliver, each at its best.

Why a module of its own: a ratio is only as honest as what it divides by. Each baseline here is
what a competent team gets from a known data path, and every one does the *same work* as mdata:
each step, every baseline rank takes ``1 / dp`` of the tokens mdata's step holds (``dataloader``:
of its samples) and fills exactly the same number of micro-batches per rank.

* ``dataloader`` (PyTorch DataLoader, Ray Data, Mosaic Streaming): every rank its own seeded
  weighted stream and its own workers; a fixed number of samples per rank per step (mdata's
  global batch over ``dp``), split into micro-batches of equal sample counts. Micro-batches are
  not capped at the context (memory is not modelled: this favours it).
* ``megatron`` (Megatron-LM's data path): a deterministic blend index over the sources (each
  source's share of every prefix as close to its weight as whole samples allow, as
  ``BlendedDataset`` builds it), dealt to the ranks in consecutive blocks of a sequence's worth
  of samples (as Megatron-LM's sampler deals each global batch); each rank
  draws whole samples to its token budget and packs them into its micro-batches of the context
  (documents masked, varlen attention), longest first into the emptiest (token-balanced);
  a sample that fits nowhere waits for the next step. Micro-batches run in arrival order.
* ``local_best``: ``megatron``'s draw, then everything one rank can do with it and no global
  view: mdata's own balancer (:func:`mdata.balance.balance_step`, ``dp = 1``: cost-aware
  packing and the micro-batch order for 1F1B) on that rank's samples only. The ratio of mdata
  over ``local_best`` is what the global view earns.

* ``bridge`` (Megatron-Bridge's global-batch packing): ``megatron``'s draws, their lengths
  all-gathered and packed together into the step's ``dp x m`` sequences (token-balanced),
  shuffled and dealt ``m`` to a rank; each rank orders its own for 1F1B by cost. A global view
  of tokens, not of FLOPs: the ratio over it is what planning by cost earns.

Where each loads (stalls, ``benchmarks/e2e_sim.py``): ``dataloader`` on every GPU with its own
cores; the others on TP rank 0 with its TP group's cores, every CP rank and the first pipeline
stage (the last stage needs labels only, cheap and on other cores).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from mdata.balance import balance_step
from mdata.balance.pipeline import order_micro_batches
from mdata.metadata import SourceMetadata

__all__ = ["BASELINES", "Draw", "baseline_steps", "blend_index"]

BASELINES = ("dataloader", "megatron", "local_best", "bridge")

#: One rank's step: per micro-batch (tokens, patches) per sample, and the sources of its samples.
RankStep = tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]


def blend_index(weights: np.ndarray, length: int) -> np.ndarray:
    """Source of each of the first ``length`` positions of a deterministic blend: source ``k``'s
    ``j``-th sample sits at its ideal place ``(j + 1/2) / share_k``, so every prefix holds each
    source within a sample or two of its share (Megatron-LM's ``BlendedDataset`` index, up to ties)."""
    share = np.asarray(weights, dtype=np.float64) / float(np.sum(weights))
    places, sources = [], []
    for k, s in enumerate(share):
        if s <= 0:
            continue
        count = int(np.ceil(length * s)) + 1
        places.append((np.arange(count) + 0.5) / s)
        sources.append(np.full(count, k, dtype=np.int64))
    order = np.argsort(np.concatenate(places), kind="stable")
    return np.concatenate(sources)[order][:length]


@dataclass
class Draw:
    """One rank's sample stream (source, tokens cut to the context, patches), read in order, with
    the samples a step could not place put back in front."""

    src: np.ndarray
    tok: np.ndarray
    pat: np.ndarray
    pos: int = 0

    def __post_init__(self) -> None:
        self.back: list[tuple[int, int, int]] = []

    def _exhausted(self, n: int) -> None:
        if self.pos + n > self.src.size:
            raise RuntimeError("a baseline rank's stream ran out: make it longer (a bug in sizing)")

    def count(self, n: int) -> list[tuple[int, int, int]]:
        """The next ``n`` samples."""
        out = self.back[:n]
        self.back = self.back[n:]
        need = n - len(out)
        self._exhausted(need)
        sl = slice(self.pos, self.pos + need)
        out += list(zip(self.src[sl].tolist(), self.tok[sl].tolist(), self.pat[sl].tolist()))
        self.pos += need
        return out

    def budget(self, tokens: float) -> list[tuple[int, int, int]]:
        """Whole samples to ``tokens`` (at least one): a loader with a token budget. The sample
        that crosses the budget is taken when that lands nearer to it (no bias to either side)."""
        out, used = [], 0
        while True:
            if self.back:
                item = self.back[0]
            else:
                self._exhausted(1)
                item = (int(self.src[self.pos]), int(self.tok[self.pos]), int(self.pat[self.pos]))
            if out and used + item[1] - tokens > tokens - used:
                return out
            if self.back:
                self.back.pop(0)
            else:
                self.pos += 1
            out.append(item)
            used += item[1]

    def put_back(self, items: Sequence[tuple[int, int, int]]) -> None:
        self.back = list(items) + self.back


def _rows(meta: Mapping[str, SourceMetadata], max_tokens: int) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for m in meta.values():
        tok = np.minimum(np.concatenate(m.num_tokens), max_tokens).astype(np.int64)
        out.append((tok, np.minimum(np.concatenate(m.num_patches), tok).astype(np.int64)))
    return out


def _stream(rows, src: np.ndarray, rng: np.random.Generator) -> Draw:
    """Rows for a sequence of sources: source ``k``'s ``j``-th sample is row ``perm_k[j]`` of a
    seeded permutation (cycled: the corpus is small, a source repeats within a few steps)."""
    tok = np.zeros(src.size, np.int64)
    pat = np.zeros(src.size, np.int64)
    for k, (t, p) in enumerate(rows):
        where = np.flatnonzero(src == k)
        if where.size:
            perm = rng.permutation(t.size)
            idx = perm[np.arange(where.size) % t.size]
            tok[where], pat[where] = t[idx], p[idx]
    return Draw(src.astype(np.int64), tok, pat)


def _token_pack(items, m: int, cap: int):
    """Longest first into the micro-batch with the fewest tokens; what fits nowhere is left."""
    bins: list[list[tuple[int, ...]]] = [[] for _ in range(m)]
    heap = [(0, b) for b in range(m)]  # (tokens, bin): the emptiest on top
    left = []
    for item in sorted(items, key=lambda x: -x[1]):
        used, b = heap[0]
        if used + item[1] > cap:
            left.append(item)
            continue
        bins[b].append(item)
        heapq.heapreplace(heap, (used + item[1], b))
    return bins, left


def _as_step(bins) -> RankStep:
    mbs = [(np.array([x[1] for x in b], np.int64), np.array([x[2] for x in b], np.int64)) for b in bins]
    return mbs, np.array([x[0] for b in bins for x in b], np.int64)


def _local_best(bins, cost_fn, m: int, cap: int, pp: int, tally: dict) -> list:
    """mdata's balancer on one rank's samples (``dp = 1``); its order for 1F1B. When its packing
    needs more micro-batches than ``m``, the token packing's bins in that balancer's order."""
    items = [x for b in bins for x in b]
    tok = np.array([x[1] for x in items], np.int64)
    cost = np.asarray(cost_fn(tok, np.array([x[2] for x in items], np.int64)), dtype=np.float64)
    a = balance_step(tok, cost, dp=1, micro_batches=m, max_tokens=cap, stages=pp)
    if a.num_micro_batches == m:
        return [[items[i] for i in a.members(0, k).tolist()] for k in range(m)]
    tally["local_best_fallbacks"] = tally.get("local_best_fallbacks", 0) + 1
    start, k = 0, []
    for b in bins:
        k.append(float(cost[start:start + len(b)].sum()))
        start += len(b)
    order = order_micro_batches(np.array([k]), pp)[0]
    return [bins[i] for i in order.tolist()]


def baseline_steps(meta: Mapping[str, SourceMetadata], weights: Mapping[str, float], *, dp: int,
                   micro_batches: int, max_tokens: int, pp: int, seed: int,
                   step_tokens: Sequence[float], step_samples: int, cost_fn,
                   tally: dict | None = None) -> dict[str, list[list[RankStep]]]:
    """Every baseline's steps: ``out[name][step][rank]``. Step ``s`` gives each rank a budget of
    ``step_tokens[s] / dp`` tokens (``dataloader``: ``step_samples / dp`` samples);
    ``cost_fn(tokens, patches)`` is mdata's cost model (for ``local_best``)."""
    tally = {} if tally is None else tally
    rows = _rows(meta, max_tokens)
    w = np.array([weights[n] for n in meta], dtype=np.float64)
    mean = float(sum(wk * t.mean() for wk, (t, _) in zip(w, rows)) / w.sum())
    steps = len(step_tokens)
    block = max(1, int(max_tokens / mean))  # samples per sequence: Megatron's micro-batch size
    length = block * (int(2.0 * steps * max(max(step_tokens) / dp / mean, step_samples / dp) / block) + 64)
    blend = _stream(rows, blend_index(w, length * dp), np.random.default_rng((seed, 1 << 20)))
    blocks = np.arange(length * dp).reshape(-1, block)  # consecutive blocks, dealt to the ranks
    m, cap = micro_batches, max_tokens
    counts = [len(c) for c in np.array_split(np.arange(step_samples), dp)]
    out = {name: [[None] * dp for _ in range(steps)] for name in BASELINES}
    for r in range(dp):
        rng = np.random.default_rng((seed, r))
        free = _stream(rows, rng.choice(len(rows), size=length, p=w / w.sum()), rng)
        mine = blocks[r::dp].ravel()
        ranked = Draw(blend.src[mine], blend.tok[mine], blend.pat[mine])
        owed = 0.0  # a running budget: what a step took over or under, the next one evens out
        for s in range(steps):
            items = free.count(counts[r])
            out["dataloader"][s][r] = _as_step([items[c[0]:c[-1] + 1] if c.size else []
                                               for c in np.array_split(np.arange(len(items)), m)])
            drawn = ranked.budget(step_tokens[s] / dp + owed)
            bins, left = _token_pack(drawn, m, cap)
            ranked.put_back(left)
            owed += step_tokens[s] / dp - sum(x[1] for b in bins for x in b)
            tally["megatron_left"] = tally.get("megatron_left", 0) + len(left)
            arrival = rng.permutation(m)  # packed sequences leave the buffer in no cost order
            out["megatron"][s][r] = _as_step([bins[i] for i in arrival.tolist()])
            out["local_best"][s][r] = _as_step(_local_best(bins, cost_fn, m, cap, pp, tally))
    _bridge(out["bridge"], blend, blocks, step_tokens, m, cap, pp, seed, cost_fn)
    return out


def _bridge(out: list[list], blend: Draw, blocks: np.ndarray, step_tokens: Sequence[float], m: int,
            cap: int, pp: int, seed: int, cost_fn) -> None:
    """Megatron-Bridge's global-batch packing: every rank draws as ``megatron`` does, the step's
    lengths are all-gathered and packed together (token-balanced) into ``dp x m`` sequences,
    shuffled and dealt ``m`` to a rank; each rank orders its own for 1F1B by cost."""
    dp = len(out[0])
    rng = np.random.default_rng((seed, 1 << 21))
    draws = [Draw(blend.src[b], blend.tok[b], blend.pat[b]) for b in (blocks[r::dp].ravel() for r in range(dp))]
    owed = [0.0] * dp
    for s in range(len(step_tokens)):
        pooled = [(*x, r) for r, d in enumerate(draws) for x in d.budget(step_tokens[s] / dp + owed[r])]
        bins, left = _token_pack(pooled, dp * m, cap)
        for r in range(dp):
            draws[r].put_back([x[:3] for x in left if x[3] == r])
        placed = np.zeros(dp)
        for b in bins:
            for x in b:
                placed[x[3]] += x[1]
        for r in range(dp):
            owed[r] += step_tokens[s] / dp - placed[r]
        dealt = [bins[i] for i in rng.permutation(dp * m).tolist()]
        for r in range(dp):
            mine = dealt[r * m:(r + 1) * m]
            cost = np.array([[float(np.sum(cost_fn(np.array([x[1] for x in b], np.int64),
                                                   np.array([x[2] for x in b], np.int64))))
                              for b in mine]])
            out[s][r] = _as_step([mine[i] for i in order_micro_batches(cost, pp)[0].tolist()])
