"""Mixture figures: how far each step's realised source fractions stray from the target weights,
and how unevenly each system's step is spread over the DP ranks, on the same global batch.

Three systems draw the same global batch (``GLOBAL_BATCH`` samples per step over ``DP`` ranks)
from the example corpus's five sources with the same weights and seed:

* **mdata** — ``mdata.planner.simulate``: the Planner's own state machine (exact per-step apportionment
  with carry, global balancing) on the real per-row token counts of the corpus
  (``benchmarks/workload.py``).
* **baseline** — the per-rank DataLoader of ``benchmarks/baseline.py``: each rank's step comes
  from one of its ``W`` workers (round-robin, as a DataLoader delivers), whose seeded
  :class:`~benchmarks.baseline_source.WeightedChooser` picks each sample's source; rows come from the
  same :class:`~benchmarks.baseline_source.SourceStream` chunk order. Each rank takes an equal share of
  the samples.
* **torchdata** — ``torchdata.nodes.MultiNodeWeightedSampler`` per rank (``rank=``,
  ``world_size=``, ``StopCriteria.CYCLE_FOREVER``) over the same source streams.

Ray Data is not measured: it is not installed here, and its 2.60 release has no built-in
weighted mixing to compare.

The streams here read each chunk's token counts from the cached corpus profile (the transforms'
real output) instead of re-running the tokenizer: the mixing and balancing decisions depend on
nothing else, and this keeps the figure cheap enough for ``--quick``. The step's makespan is the
most expensive rank under :class:`~mdata.cost.AttentionCost` (samples cut to the context), against
the lower bound ``max(total / dp, largest sample)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from benchmarks.baseline_source import Sample, SourceStream, WeightedChooser
from benchmarks.harness import figure
from benchmarks.workload import CorpusProfile, corpus_dir, corpus_profile
from mdata.cost import AttentionCost
from mdata.data.example import example_sources
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan
from mdata.planner import simulate
from mdata.sources import ReaderCache, SampleChunk, Source

__all__ = ["WEIGHTS", "run", "realised_counts"]

WEIGHTS = {"chat": 3.0, "scenes": 2.0, "books": 1.0, "code": 2.0, "captions": 1.5, "docs": 1.0}
DP = 8
WORKERS = 4
GLOBAL_BATCH = 256
MICRO_BATCHES = 4
MAX_TOKENS = 16384
SEED = 0


def _profile_loader(profile: CorpusProfile) -> Callable[..., SampleChunk]:
    """A ``load_chunk`` stand-in answering from the corpus profile (token counts, no payload)."""
    def load(source: Source, shard: int, start: int, stop: int, *, cache=None) -> SampleChunk:
        base = source.name.rsplit("_", 1)[0] if source.name not in profile.num_tokens else source.name
        tok = profile.num_tokens[base][shard][start:stop]
        pat = profile.num_patches[base][shard][start:stop]
        n = stop - start
        return SampleChunk(source=source.name, shard=shard, rows=np.arange(start, stop, dtype=np.int64),
                           token_ids=np.zeros(0, np.int32), token_offsets=np.zeros(n + 1, np.int64),
                           num_tokens=tok.astype(np.int32), num_patches=pat.astype(np.int32))
    return load


def _streams(sources: Sequence[Source], index: int, num_streams: int, profile: CorpusProfile,
             cache: ReaderCache) -> list[SourceStream]:
    load = _profile_loader(profile)
    return [SourceStream(s, i, index=index, num_streams=num_streams, seed=SEED, cache=cache, load=load)
            for i, s in enumerate(sources)]


def _costs(samples: Sequence[Sample], cost: AttentionCost) -> np.ndarray:
    tokens = np.minimum([s.num_tokens for s in samples], MAX_TOKENS).astype(np.float64)
    return cost(tokens, np.zeros_like(tokens))


def _step_stats(per_rank: list[list[Sample]], num_sources: int, cost: AttentionCost):
    counts = np.bincount([s.source_index for rank in per_rank for s in rank], minlength=num_sources)
    rank_costs = [_costs(rank, cost) for rank in per_rank]
    every = np.concatenate(rank_costs)
    bound = max(every.sum() / len(per_rank), every.max())
    return counts, max(float(c.sum()) for c in rank_costs) / bound


def _baseline(sources, weights, steps, profile, cache, cost):
    per_rank = GLOBAL_BATCH // DP
    workers = [[(_streams(sources, r * WORKERS + w, DP * WORKERS, profile, cache),
                 WeightedChooser(weights, (SEED, r, w))) for w in range(WORKERS)] for r in range(DP)]
    counts, ratios = [], []
    for step in range(steps):
        ranks = []
        for r in range(DP):
            streams, chooser = workers[r][step % WORKERS]
            ranks.append([streams[k].next() for k in chooser.choose(per_rank).tolist()])
        c, ratio = _step_stats(ranks, len(sources), cost)
        counts.append(c)
        ratios.append(ratio)
    return np.array(counts), np.array(ratios)


def _torchdata(sources, weights, steps, profile, cache, cost):
    import torchdata.nodes as tn

    per_rank = GLOBAL_BATCH // DP
    samplers = []
    for r in range(DP):
        nodes = {s.name: tn.IterableWrapper(iter(stream))
                 for s, stream in zip(sources, _streams(sources, r, DP, profile, cache))}
        sampler = tn.MultiNodeWeightedSampler(
            nodes, {s.name: float(w) for s, w in zip(sources, weights)},
            stop_criteria=tn.StopCriteria.CYCLE_FOREVER, rank=r, world_size=DP, seed=SEED)
        sampler.reset()
        samplers.append(sampler)
    counts, ratios = [], []
    for _ in range(steps):
        ranks = [[next(sampler) for _ in range(per_rank)] for sampler in samplers]
        c, ratio = _step_stats(ranks, len(sources), cost)
        counts.append(c)
        ratios.append(ratio)
    return np.array(counts), np.array(ratios)


def _mdata(sources, weights, steps, profile, cost):
    plan = (Plan(list(sources)).mix(dict(zip([s.name for s in sources], weights)))
            .cost(cost)
            .balance(micro_batches=MICRO_BATCHES, max_tokens=MAX_TOKENS, global_batch=GLOBAL_BATCH)
            .distribute(ClientPlaceTree(dp=DP)).seed(SEED))
    sim = simulate(plan, steps, profile.metadata())
    return sim.counts, sim.max_over_lower_bound


def realised_counts(steps: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per system: (per-step counts per source int64[steps, S], per-step makespan / lower bound)."""
    profile = corpus_profile()
    sources = [s for s in example_sources(corpus_dir()) if s.name in profile.names]
    weights = [WEIGHTS.get(s.name, 1.0) for s in sources]
    cost = AttentionCost()
    cache = ReaderCache(max_readers=256)
    return {
        "mdata": _mdata(sources, weights, steps, profile, cost),
        "baseline": _baseline(sources, weights, steps, profile, cache, cost),
        "torchdata": _torchdata(sources, weights, steps, profile, cache, cost),
        "_weights": (np.asarray(weights) / sum(weights), np.zeros(0)),
    }


def _deviation(counts: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per step: the largest |realised fraction - target weight| over sources."""
    return np.abs(counts / counts.sum(axis=1, keepdims=True) - target).max(axis=1)


def run(quick: bool) -> dict[str, object]:
    steps = 40 if quick else 400
    result = realised_counts(steps)
    target = result.pop("_weights")[0]
    dev = {name: _deviation(counts, target) for name, (counts, _) in result.items()}
    cum = {name: float(_deviation(counts.sum(axis=0, keepdims=True), target)[0])
           for name, (counts, _) in result.items()}
    span = {name: ratios for name, (_, ratios) in result.items()}
    setup = (f"{len(target)} corpus sources, dp={DP}, {GLOBAL_BATCH} samples/step, {steps} steps; "
             f"baseline: per-rank DataLoader, {WORKERS} workers, random choice by weight")
    td = "torchdata 0.11 MultiNodeWeightedSampler per rank, CYCLE_FOREVER; Ray not installed"

    def ratio(ours: float, theirs: float) -> float | None:
        return theirs / ours if ours > 0 else None

    figures: dict[str, object] = {
        "mixture.max_abs_deviation": figure(
            float(dev["mdata"].max()), float(dev["baseline"].max()),
            ratio=ratio(float(dev["mdata"].max()), float(dev["baseline"].max())),
            goal=f"< 2/global batch = {2 / GLOBAL_BATCH:.4f}",
            note=f"max over steps and sources; {setup}"),
        "mixture.cumulative_abs_deviation": figure(
            float(cum["mdata"]), float(cum["baseline"]),
            ratio=ratio(float(cum["mdata"]), float(cum["baseline"])),
            goal=f"< 1/(steps x batch) = {1 / (steps * GLOBAL_BATCH):.2g}",
            note="all steps together: max over sources of |realised fraction - weight|"),
        "mixture.mean_abs_deviation": figure(
            float(dev["mdata"].mean()), float(dev["baseline"].mean()),
            ratio=ratio(float(dev["mdata"].mean()), float(dev["baseline"].mean())),
            goal="lower is better", note="mean over steps of the per-step max over sources"),
        "mixture.max_abs_deviation_vs_torchdata": figure(
            float(dev["mdata"].max()), float(dev["torchdata"].max()),
            ratio=ratio(float(dev["mdata"].max()), float(dev["torchdata"].max())),
            goal=f"< {2 / GLOBAL_BATCH:.4f}", note=f"baseline column = {td}"),
        "mixture.makespan_vs_lb": figure(
            float(span["mdata"].mean()), float(span["baseline"].mean()),
            ratio=float(span["baseline"].mean() / span["mdata"].mean()), unit="cost",
            goal="<= 1.03", note=f"mean over steps of step makespan / lower bound; {setup}"),
        "mixture.makespan_vs_lb_vs_torchdata": figure(
            float(span["mdata"].mean()), float(span["torchdata"].mean()),
            ratio=float(span["torchdata"].mean() / span["mdata"].mean()), unit="cost",
            goal="<= 1.03", note=f"baseline column = {td}, equal samples per rank"),
    }
    return figures
