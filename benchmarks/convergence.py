"""Convergence unchanged: a small model trained on mdata's balanced placement and a per-rank loader's.

Balancing moves samples between DP ranks and micro-batches; it must not change what the model
learns. It does not, provided the loss is normalised *per token over the global batch*: the step's
gradient is then ``sum over every token of the step / tokens in the step``, the same sum whatever
rank or micro-batch holds each sample, up to the order floating-point additions happen in. A loss
averaged per rank first (``mean over ranks of (rank's token loss / rank's tokens)``) weights a
token by ``1 / its rank's tokens``, and balancing changes those counts: it changes the gradient.

What is trained: the same global batches of the example corpus's text sources (chat, scenes,
books, code: real documents, tokenized by the loaders' own transform, ids folded into a small
vocabulary so a CPU model learns them in a few hundred steps), a tiny causal language model
(embedding, one causal convolution, output projection) with AdamW, in one process. Each step's
samples are the Planner's (``simulate``): ``mdata`` places them as it balances them (its DP ranks
and micro-batches); the ``baseline`` places the very same samples as a per-rank loader would, an
equal count per rank in draw order. Each rank's token losses are summed micro-batch by
micro-batch and the ranks' sums added in rank order, as gradient accumulation and an all-reduce
would. Model seeds give the noise.

Figures (``convergence.*``): ``loss_gap_over_noise`` (goal <= 1): the mean over steps and seeds of
``|loss_mdata - loss_baseline|`` (same seed) over the mean over steps of the loss's spread across
seeds; ``loss_gap_over_noise_rank_mean``: the same with losses averaged per rank first (the
mistake the docs warn about), for contrast; ``final_loss`` beside the baseline's.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

try:
    from benchmarks.harness import figure
except ImportError:  # pragma: no cover - run as a script from benchmarks/
    from harness import figure

__all__ = ["run", "train_both"]

VOCAB = 2048
CONTEXT = 128
TEXT_SOURCES = ("chat", "scenes", "books", "code")


def _corpus(corpus: Path):
    """Every text sample's token ids by (source, shard, row), and the sources' metadata."""
    from mdata.data.example import example_sources
    from mdata.metadata import SourceMetadata
    from mdata.sources import list_shards, load_chunk

    sources = [s for s in example_sources(corpus) if s.name in TEXT_SOURCES]
    tokens: dict[tuple[str, int, int], np.ndarray] = {}
    meta = {}
    for src in sources:
        counts = []
        for shard in list_shards(src).shards:
            chunk = load_chunk(src, shard.index, 0, shard.num_rows)
            per_row = np.zeros(shard.num_rows, np.int32)
            for i, row in enumerate(chunk.rows.tolist()):
                ids = chunk.token_ids[chunk.token_offsets[i]:chunk.token_offsets[i + 1]]
                tokens[(src.name, shard.index, row)] = ids
                per_row[row] = ids.size
            counts.append(per_row)
        meta[src.name] = SourceMetadata.from_arrays(src.name, counts)
    return sources, tokens, meta


def _placements(sources, meta, steps: int, dp: int, global_batch: int, seed: int):
    """Per step, per placement, per rank: the samples' ids, in the order the rank holds them."""
    from mdata.cost import AttentionCost
    from mdata.mesh import ClientPlaceTree
    from mdata.plan import Plan
    from mdata.planner import simulate

    plan = (Plan(sources).mix({s.name: 1.0 for s in sources}).cost(AttentionCost(a=1.0, b=512.0))
            .balance(micro_batches=2, max_tokens=CONTEXT, global_batch=global_batch)
            .distribute(ClientPlaceTree(dp=dp)).seed(seed))
    planned = simulate(plan, steps, meta, keep_samples=True).samples
    out = []
    for step in sorted(planned):
        balanced = [list(rank) for rank in planned[step]]
        drawn = sorted(s for rank in balanced for s in rank)  # the step's samples, in id order
        share = len(drawn) // dp
        per_rank = [drawn[r * share:(r + 1) * share] for r in range(dp)]
        per_rank[-1] += drawn[dp * share:]
        out.append({"mdata": balanced, "baseline": per_rank})
    return out


def _model(seed: int):
    import torch

    torch.manual_seed(seed)
    emb = torch.nn.Embedding(VOCAB, 64)
    conv = torch.nn.Conv1d(64, 64, kernel_size=4)
    head = torch.nn.Linear(64, VOCAB)
    return torch.nn.ModuleList([emb, conv, head])


def _token_loss_sum(model, ids: np.ndarray):
    """Summed next-token loss of one sample (causal: each position sees itself and 3 before)."""
    import torch

    x = torch.as_tensor(ids[:CONTEXT].astype(np.int64) % VOCAB)
    if x.numel() < 2:
        return None, 0
    emb, conv, head = model
    h = emb(x[:-1]).T.unsqueeze(0)  # (1, 64, n)
    h = torch.relu(conv(torch.nn.functional.pad(h, (3, 0)))).squeeze(0).T
    loss = torch.nn.functional.cross_entropy(head(h), x[1:], reduction="sum")
    return loss, x.numel() - 1


def _train(placements, tokens, which: str, seed: int, normalise: str) -> list[float]:
    """Loss per step (per token over the global batch, as logged) training on ``which`` placement."""
    import torch

    model = _model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    curve = []
    for step in placements:
        ranks = step[which]
        sums, counts = [], []
        for rank in ranks:  # a rank's micro-batches accumulate into its sum
            total, n = torch.zeros(()), 0
            for sample in rank:
                loss, k = _token_loss_sum(model, tokens[sample])
                if loss is not None:
                    total, n = total + loss, n + k
            sums.append(total)
            counts.append(n)
        tokens_in_step = sum(counts)
        if normalise == "global":
            loss = sum(sums) / tokens_in_step  # what every rank divides by: the step's token count
        else:
            loss = sum(s / max(n, 1) for s, n in zip(sums, counts)) / len(ranks)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            curve.append(float(sum(s.detach() for s in sums) / tokens_in_step))
    return curve


def train_both(corpus: Path, *, steps: int, seeds: int, dp: int = 4, global_batch: int = 32) -> dict:
    """Train on both placements for ``seeds`` model seeds with both normalisations; the curves."""
    sources, tokens, meta = _corpus(corpus)
    placements = _placements(sources, meta, steps, dp, global_batch, seed=7)
    moved = sum(step["mdata"] != step["baseline"] for step in placements)
    curves = {(norm, which, seed): _train(placements, tokens, which, seed, norm)
              for norm in ("global", "rank_mean") for which in ("mdata", "baseline")
              for seed in range(seeds)}
    return {"curves": curves, "steps_with_other_placement": moved, "steps": len(placements)}


def gap_over_noise(curves: dict, norm: str, seeds: int) -> float:
    """Mean |mdata - baseline| (same seed) over the mean spread of the baseline across seeds."""
    gap = statistics.fmean(abs(a - b) for s in range(seeds)
                           for a, b in zip(curves[(norm, "mdata", s)], curves[(norm, "baseline", s)]))
    by_step = list(zip(*(curves[(norm, "baseline", s)] for s in range(seeds))))
    noise = statistics.fmean(statistics.pstdev(values) for values in by_step)
    return gap / noise if noise > 0 else float("inf")


def run(quick: bool = False) -> dict:
    from benchmarks.workload import corpus_dir

    steps, seeds = (60, 2) if quick else (300, 3)
    out = train_both(corpus_dir(), steps=steps, seeds=seeds)
    curves = out["curves"]
    final = lambda which: statistics.fmean(curves[("global", which, s)][-1] for s in range(seeds))  # noqa: E731
    note = (f"{out['steps']} steps x {seeds} seeds, tiny causal LM on the example corpus's text; "
            f"{out['steps_with_other_placement']} of {out['steps']} steps placed differently")
    return {
        "convergence.loss_gap_over_noise": figure(
            gap_over_noise(curves, "global", seeds), goal="<= 1", unit="x",
            note="loss normalised per token over the global batch; " + note),
        "convergence.loss_gap_over_noise_rank_mean": figure(
            gap_over_noise(curves, "rank_mean", seeds), unit="x",
            note="losses averaged per rank first (what not to do); " + note),
        "convergence.final_loss": figure(final("mdata"), final("baseline"), ratio=final("baseline") / final("mdata"),
                                         unit="nats/token", note="mean over seeds of the last step's loss"),
    }


if __name__ == "__main__":  # pragma: no cover
    import json
    import sys

    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
