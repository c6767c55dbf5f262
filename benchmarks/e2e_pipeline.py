"""Pipelines as people run them: a balanced layer split, (interleaved) 1F1B, a step's fixed costs.

Why a module of its own: the at-scale simulation (``benchmarks/e2e_sim.py``) must not flatter
anyone with a pipeline nobody runs. Three things a real Megatron-LM job has that an even split
with free communication does not:

* :func:`layer_split`: language-model layers per stage chosen so that the stages' expected work
  is even *with the vision encoder on the first stage* (Megatron-LM's
  ``--decoder-first-pipeline-num-layers`` does this by hand): the first stage gets fewer layers.
* :func:`pipeline_makespan`: the 1F1B schedule (PipeDream-Flush) or Megatron-LM's interleaved
  1F1B (``--num-layers-per-virtual-pipeline-stage``: ``v`` model chunks per device, bubble
  ``(p - 1) / v`` of a micro-batch), simulated operation by operation over each micro-batch's
  own per-stage times, so unequal micro-batches make the bubbles they make.
* :class:`Fabric` and :func:`fixed_seconds`: the gradient reduce-scatter and parameter
  all-gather of Megatron-LM's distributed optimizer over the DP x CP ranks (ring, not overlapped
  with compute: a conservative choice that dilutes every ratio alike) and the Adam update of the
  local shard (memory-bound). The same for every system: it depends on the model and mesh only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from benchmarks.e2e_model import VLM, PipelineTimes

__all__ = ["Fabric", "fixed_seconds", "interleaved_order", "layer_split", "pipeline_makespan"]


def layer_split(model: VLM, pp: int, vit_per_layer: float) -> tuple[int, ...]:
    """Language-model layers per stage, the vision encoder on stage 0, stages' work as even as
    whole layers allow. ``vit_per_layer``: the vision encoder's expected FLOPs over one language
    model layer's (the mix decides it: :func:`benchmarks.e2e_sim.vit_per_layer`)."""
    if pp < 1:
        raise ValueError(f"pp must be >= 1, got {pp}")
    layers = model.llm_layers
    if pp == 1:
        return (layers,)
    best: tuple[tuple[float, float], tuple[int, ...]] | None = None
    for first in range(layers - pp + 2):  # every later stage keeps at least one layer
        q, r = divmod(layers - first, pp - 1)
        split = (first, *([q + 1] * r), *([q] * (pp - 1 - r)))
        # the least busiest stage; among equals the least idle one (the largest least stage)
        key = (max(first + vit_per_layer, q + (1 if r else 0)), -min(first + vit_per_layer, q))
        if best is None or key < best[0]:
            best = (key, split)
    assert best is not None
    return best[1]


def interleaved_order(m: int, p: int, v: int, device: int) -> list[tuple[bool, int, int]]:
    """Megatron-LM's order of ``(is_forward, micro_batch, chunk)`` on ``device`` of ``p``.

    ``v == 1`` is plain 1F1B (``p - d - 1`` warm-up forwards). With ``v > 1`` micro-batches go in
    groups of ``p`` through chunk 0, then chunk 1, ...; the warm-up is ``2 (p - d - 1) + (v - 1) p``
    forwards; backwards run the chunks in reverse (``schedules.py``'s ``get_model_chunk_id``).
    """
    total = m * v
    if v == 1:
        warm = min(p - device - 1, m)
    else:
        if m % p:
            raise ValueError(f"interleaved 1F1B needs micro-batches ({m}) divisible by pp ({p})")
        warm = min(2 * (p - device - 1) + (v - 1) * p, total)

    def op(k: int, forward: bool) -> tuple[bool, int, int]:
        group, within = divmod(k, p * v)
        chunk = within // p
        return forward, group * p + within % p, chunk if forward else v - 1 - chunk

    ops = [op(k, True) for k in range(warm)]
    for k in range(total - warm):
        ops += [op(warm + k, True), op(k, False)]
    ops += [op(k, False) for k in range(total - warm, total)]
    return ops


def pipeline_makespan(times: PipelineTimes, virtual: int = 1) -> float:
    """Makespan of (interleaved, ``virtual > 1``) 1F1B over ``times`` (micro-batches x devices).

    Device ``d`` holds chunks ``d, p + d, ...`` of the ``p v`` global stages, each a ``1 / v``
    share of its time. A forward waits for the previous global stage's forward of the same
    micro-batch, a backward for the next stage's backward (the last stage: its own forward);
    each operation starts when its device is free and its input has arrived; sends are free.
    """
    fwd, bwd = times.forward, times.backward
    m, p = fwd.shape
    v = int(virtual)
    if v < 1:
        raise ValueError(f"virtual stages must be >= 1, got {virtual}")
    if m == 0:
        return 0.0
    stages = p * v
    orders = [interleaved_order(m, p, v, d) for d in range(p)]
    done_f = np.full((m, stages), np.nan)
    done_b = np.full((m, stages), np.nan)
    free = [0.0] * p
    nxt = [0] * p
    remaining = 2 * m * stages
    while remaining:
        progressed = False
        for d in range(p):
            while nxt[d] < len(orders[d]):
                is_f, i, chunk = orders[d][nxt[d]]
                g = chunk * p + d
                if is_f:
                    ready = 0.0 if g == 0 else done_f[i, g - 1]
                else:
                    ready = done_f[i, g] if g == stages - 1 else done_b[i, g + 1]
                if np.isnan(ready):
                    break
                end = max(free[d], ready) + (fwd[i, d] if is_f else bwd[i, d]) / v
                (done_f if is_f else done_b)[i, g] = end
                free[d] = end
                nxt[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (a bug in the schedule)")
    return float(np.nanmax(done_b[:, 0]))


@dataclass(frozen=True)
class Fabric:
    """What a step's fixed part runs on. Defaults: a DGX H100's NDR InfiniBand (400 Gb/s per GPU)
    at the 40 GB/s bus bandwidth NCCL's ring reaches across nodes, and H100 HBM3 (3.35 TB/s)
    at 60% for the optimizer's streaming update."""

    name: str = "NDR 400 Gb/s per GPU, H100 HBM3"
    bus_bytes_per_s: float = 40e9
    hbm_bytes_per_s: float = 0.6 * 3.35e12
    grad_bytes: int = 4  # Megatron-LM reduces gradients in fp32 by default
    param_bytes: int = 2  # bf16 parameters all-gathered after the update
    optimizer_bytes: int = 30  # Adam per parameter: fp32 master, m, v read and written, grad, bf16 out


def fixed_seconds(model: VLM, layers: Sequence[int], *, tp: int, dp: int, cp: int,
                  fabric: Fabric = Fabric()) -> float:
    """Seconds a step spends outside the pipeline: gradient reduce-scatter + parameter all-gather
    over the ``dp x cp`` ranks holding the same parameters (ring), then Adam on the local shard;
    the slowest stage's (the one with the most parameters) sets it."""
    n = dp * cp
    per_layer = model.llm_params / model.llm_layers
    params = [(k * per_layer + (model.vit_params if s == 0 else 0.0)) / tp for s, k in enumerate(layers)]
    worst = max(params)
    ring = 0.0 if n == 1 else (n - 1) / n * worst * (fabric.grad_bytes + fabric.param_bytes) / fabric.bus_bytes_per_s
    adam = worst / n * fabric.optimizer_bytes / fabric.hbm_bytes_per_s
    return ring + adam
