"""Planner time per global step at 4096 GPUs: the whole PlannerState, not just balancing.

What one step costs the Planner, measured inside :meth:`PlannerState.handle` only: apportioning
the mixture over 1,000 sources, taking each source's samples from its deterministic order,
registering and releasing chunks, gathering cost features, pricing and balancing the ~4M-token
global batch over the DP ranks, building every DP rank's samples (one ``ConstructStep``), recording lineage in
the DGraph, and handling every trainer rank's acknowledgement. The runtime applies the
acknowledgements that arrive together as one ``RanksConsumed`` per step, so the headline figure
does too; ``planner.ms_per_step_4096_per_rank_acks`` sends one ``BatchConsumed`` per rank (the
worst case: acknowledgements trickling in one at a time). The loader side is played by
per-row metadata (generated lognormal lengths, capped at the 16k context); its own time is not
counted.

Meshes: DP 256 x CP 4 x TP 4 (every rank of a group consumes) and DP 64 x PP 4 x CP 4 x TP 4.
``planner.ms_per_step_linearity`` is the time per step at twice the samples per step (8M tokens)
divided by the time at 4M tokens on the first mesh: about 2 means linear in the batch.

At scale (issue 20): ``planner.ms_per_step_16384`` is DP 1024 x CP 4 x TP 4 (16,384 GPUs) with
1,000 sources, ``planner.ms_per_step_4096_10k_sources`` the first mesh with 10,000 sources (both
4M tokens, 2,048 samples per step), ``planner.sources_ratio_10k_vs_1k`` the second over
``planner.ms_per_step_4096`` (1 means flat in sources). ``planner.split_*.<phase>`` splits the
median block of each into phases (:mod:`benchmarks.planner_phases`, ms per step). The measured
steps are the 10th to the 60th: at 10k sources most sources are still drawn for the first time
there, so the split shows their first shuffle window and chunk loads (``apportion``, ``chunks``,
``loads``) as well as the steady per-step work. ``planner.ms_per_step_4096_10k_sources_steady``
measures the same shape after 300 steps (40 in the quick run), when the chunk loads have fallen
from hundreds per step to the few a step's samples need; ``..._steady`` over
``planner.ms_per_step_4096`` is ``planner.sources_ratio_10k_vs_1k_steady``.
``planner.ms_per_step_16384_10k_sources_steady`` is both at once (DP 1024 x CP 4 x TP 4 drawing
from 10,000 sources, after the same warm-up), the shape the scale goal names.

The Planner keeps the scheduler's default log (:mod:`mdata.planner.event_log`): this benchmark
used a log a tenth as long, which hid that the log then kept whole steps of instructions alive.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections import deque

import numpy as np

from benchmarks.order_epochs import order_figures
from mdata.cost import AttentionCost
from mdata.mesh import ClientPlaceTree
from mdata.metadata import SourceMetadata
from mdata.plan import Plan
from mdata.planner import (
    BatchConsumed, ChunkLoaded, LoadChunk, PlannerState, RanksConsumed, StepReady, Tick,
)

try:  # run as a script (python benchmarks/planner.py) or as benchmarks.planner
    from benchmarks.planner_phases import PhaseTimer, split
except ImportError:  # pragma: no cover
    from planner_phases import PhaseTimer, split

CONTEXT = 16384
MEAN_TOKENS = 2048  # lognormal(7.0, 1.2) capped at 16k has a mean of about 2.05k tokens
GLOBAL_TOKENS = 4 << 20


class _Src:
    def __init__(self, name: str, chunk_rows: int) -> None:
        self.name, self.chunk_rows = name, chunk_rows


def _metadata(num_sources: int, rows: int, seed: int) -> dict[str, SourceMetadata]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(num_sources):
        tokens = np.minimum(rng.lognormal(7.0, 1.2, size=rows), CONTEXT).astype(np.int32) + 1
        out[f"s{i:04d}"] = SourceMetadata.from_arrays(f"s{i:04d}", [tokens[: rows // 2], tokens[rows // 2:]])
    return out


def _plan(names: list[str], mesh: ClientPlaceTree, global_batch: int, seed: int) -> Plan:
    rng = np.random.default_rng(seed)
    weights = {n: float(w) for n, w in zip(names, rng.pareto(1.5, len(names)) + 0.05)}
    micro_batches = max(1, -(-global_batch * MEAN_TOKENS // (mesh.dp * CONTEXT)))
    return (Plan([_Src(n, 256) for n in names]).mix(weights).cost(AttentionCost())
            .balance(micro_batches=micro_batches, max_tokens=CONTEXT, global_batch=global_batch)
            .distribute(mesh).window(2))


def _ms_per_step(mesh: ClientPlaceTree, global_batch: int, num_sources: int, warmup: int,
                 blocks: int, block_steps: int, seed: int = 0, bulk: bool = True,
                 phases: dict[str, float] | None = None) -> float:
    """Median over ``blocks`` of the Planner's handle() time per step (ms); ``phases``, when
    given, receives the per-phase split (ms per step) of the median block."""
    meta = _metadata(num_sources, 4096, seed)
    names = sorted(meta)
    plan = _plan(names, mesh, global_batch, seed)
    state = PlannerState(plan, meta, job="bench")  # the scheduler's own log size (event_log)
    # the loader side's metadata and the job's setup are long-lived: out of the collector's way,
    # as a scheduler that freezes after startup has them (what is left is the Planner's own)
    gc.collect()
    gc.freeze()
    timer = PhaseTimer(state) if phases is not None else None
    ranks = sorted(r for d in range(mesh.dp) for r in mesh.receivers(d, None))
    spent = 0.0

    def handle(*events):
        nonlocal spent
        began = time.perf_counter()
        out = state.handle(*events)
        spent += time.perf_counter() - began
        return out

    queue = deque(handle(Tick(stimulus_id="start")))
    per_block: list[float] = []
    splits: list[dict[str, float]] = []
    consumed = 0
    block_start = None
    mark: dict[str, float] = {}
    total = warmup + blocks * block_steps
    while consumed < total:
        ins = queue.popleft()
        if isinstance(ins, LoadChunk):
            ref = ins.chunk
            rows, tok, pat, bad = meta[ref.source].rows_of(ref.shard, ref.start, ref.stop)
            queue.extend(handle(ChunkLoaded(ref, rows, tok, pat, (), "w", 0.01,
                                            stimulus_id=f"l{ref.chunk_id}")))
        elif isinstance(ins, StepReady):
            s = ins.step
            if bulk:
                queue.extend(handle(RanksConsumed(s, tuple(ranks), stimulus_id=f"c{s}")))
            else:
                queue.extend(handle(*(BatchConsumed(s, r, stimulus_id=f"c{s}") for r in ranks)))
            consumed += 1
            if consumed == warmup:
                block_start = spent
                mark = timer.snapshot() if timer else {}
            elif consumed > warmup and (consumed - warmup) % block_steps == 0:
                per_block.append((spent - block_start) / block_steps * 1e3)
                if timer:
                    now = timer.snapshot()
                    splits.append(split(mark, now, spent - block_start, block_steps))
                    mark = now
                block_start = spent
    gc.unfreeze()
    median = float(statistics.median(per_block))
    if timer:
        timer.close()
        phases.update(splits[per_block.index(statistics.median_high(per_block))])
    return median


def run(quick: bool) -> dict[str, object]:
    blocks = 3 if quick else 5
    block_steps = 4 if quick else 10
    warmup = 4 if quick else 10
    batch = GLOBAL_TOKENS // MEAN_TOKENS  # 2048 samples, ~4M tokens
    flat = ClientPlaceTree(dp=256, cp=4, tp=4)
    piped = ClientPlaceTree(dp=64, pp=4, cp=4, tp=4)
    one = _ms_per_step(flat, batch, 1000, warmup, blocks, block_steps)
    two = _ms_per_step(flat, 2 * batch, 1000, warmup, blocks, block_steps)
    pp = _ms_per_step(piped, batch, 1000, warmup, blocks, block_steps)
    trickle = _ms_per_step(flat, batch, 1000, warmup, blocks, block_steps, bulk=False)
    # issue 20's shapes: 16,384 GPUs with 1k sources, 4,096 GPUs with 10k sources
    split_16k: dict[str, float] = {}
    split_10k: dict[str, float] = {}
    big = _ms_per_step(ClientPlaceTree(dp=1024, cp=4, tp=4), batch, 1000, warmup, blocks,
                       block_steps, phases=split_16k)
    many = _ms_per_step(flat, batch, 10_000, warmup, blocks, block_steps, phases=split_10k)
    # past the first shuffle windows of most sources (10k sources draw ~1.5k of them per step)
    split_steady: dict[str, float] = {}
    steady = _ms_per_step(flat, batch, 10_000, 40 if quick else 300, blocks, block_steps,
                          phases=split_steady)
    # both at once: 16,384 GPUs drawing from 10,000 sources, past their first windows
    split_both: dict[str, float] = {}
    both = _ms_per_step(ClientPlaceTree(dp=1024, cp=4, tp=4), batch, 10_000,
                        40 if quick else 300, blocks, block_steps, phases=split_both)
    figures = {
        "planner.ms_per_step_4096": one,
        "planner.ms_per_step_4096_per_rank_acks": trickle,
        "planner.ms_per_step_4096_pp": pp,
        "planner.ms_per_step_4096_8m_tokens": two,
        "planner.ms_per_step_linearity": two / one,
        "planner.ms_per_step_16384": big,
        "planner.ms_per_step_4096_10k_sources": many,
        "planner.sources_ratio_10k_vs_1k": many / one,
        "planner.ms_per_step_4096_10k_sources_steady": steady,
        "planner.sources_ratio_10k_vs_1k_steady": steady / one,
        "planner.ms_per_step_16384_10k_sources_steady": both,
    }
    figures.update({f"planner.split_16384.{k}": v for k, v in split_16k.items()})
    figures.update({f"planner.split_4096_10k_sources.{k}": v for k, v in split_10k.items()})
    figures.update({f"planner.split_4096_10k_sources_steady.{k}": v for k, v in split_steady.items()})
    figures.update({f"planner.split_16384_10k_sources_steady.{k}": v for k, v in split_both.items()})
    figures.update(order_figures(quick))  # tiny sources' epochs (benchmarks/order_epochs.py)
    return figures


if __name__ == "__main__":  # pragma: no cover
    import sys

    for name, value in run(quick="--quick" in sys.argv).items():
        print(f"{name:40s} {value['mdata'] if isinstance(value, dict) else value:10.3f}")
