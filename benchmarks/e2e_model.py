"""The simulated trainer of the end-to-end benchmark: FLOPs, a 1F1B pipeline, a node's budget.

Pure functions and values (no processes, no clocks), shared by the process run
(``benchmarks/e2e.py``) and the at-scale simulation (``benchmarks/e2e_sim.py``), so both turn
the same micro-batches into the same seconds.

* :class:`VLM`: a vision-language model as the numbers a FLOP count needs. Training FLOPs of a
  micro-batch are the language model's ``6 x params x tokens`` plus its attention term
  ``6 x layers x hidden x l^2`` per document of ``l`` tokens (forward ``2 l^2 h`` per layer under
  the causal mask, backward twice that), and the vision encoder's ``6 x params x patches`` plus
  ``12 x layers x hidden x p x min(p, window)`` (full, non-causal attention of each patch over at
  most ``window`` patches: the tile or window a native-resolution encoder attends within). A
  sample's images are counted together (one attention block of its patches, capped by the
  window). Defaults are LLaVA-OneVision's published family (Li et al., 2024): a Qwen2 language
  model and the SigLIP so400m/14 encoder, one image patch = one language-model token.
* :class:`GPU`: peak dense BF16 FLOP/s and the model FLOPs utilisation (MFU); defaults are an
  H100 SXM (989 TFLOP/s) at 40% MFU (the Llama 3 report measured 38-43% on H100s).
* :func:`stage_seconds`: a micro-batch's forward and backward seconds on each pipeline stage:
  language-model layers split evenly over the stages, the vision encoder on the first stage (as
  Megatron-LM places it), each stage's work split over its ``tp x cp`` GPUs.
* :func:`one_f_one_b`: the makespan of the 1F1B schedule (PipeDream-Flush, Megatron-LM's
  default) over per-micro-batch, per-stage times: unequal micro-batches make bubbles.
* :class:`Node`: a real node's CPU cores and RAM per GPU, the budget both loaders get.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["GPU", "Node", "PipelineTimes", "VLM", "MODELS", "planner_cost", "one_f_one_b",
           "stage_seconds", "step_breakdown"]


@dataclass(frozen=True)
class VLM:
    """A vision-language model's sizes (see the module docstring for the FLOP formula)."""

    name: str = "llava-ov-0.5b"
    llm_params: float = 0.49e9  # Qwen2-0.5B
    llm_layers: int = 24
    llm_hidden: int = 896
    vit_params: float = 0.40e9  # SigLIP so400m/14
    vit_layers: int = 27
    vit_hidden: int = 1152
    patch: int = 14
    vit_window: int = 729  # patches one patch attends over (a 384 px tile of SigLIP-384)

    def llm_flops(self, tokens: np.ndarray) -> np.ndarray:
        """Training FLOPs of documents of ``tokens`` tokens (image tokens included)."""
        t = np.asarray(tokens, dtype=np.float64)
        return 6.0 * self.llm_params * t + 6.0 * self.llm_layers * self.llm_hidden * t * t

    def vit_flops(self, patches: np.ndarray) -> np.ndarray:
        """Training FLOPs of the vision encoder on samples of ``patches`` image patches."""
        p = np.asarray(patches, dtype=np.float64)
        return (6.0 * self.vit_params * p
                + 12.0 * self.vit_layers * self.vit_hidden * p * np.minimum(p, self.vit_window))


#: The published sizes this benchmark can simulate (LLaVA-OneVision 0.5B / 7B / 72B).
MODELS: dict[str, VLM] = {
    "llava-ov-0.5b": VLM(),
    "llava-ov-7b": VLM("llava-ov-7b", 7.6e9, 28, 3584),  # Qwen2-7B
    "llava-ov-72b": VLM("llava-ov-72b", 72.7e9, 80, 8192),  # Qwen2-72B
}


def planner_cost(model: VLM, *, by_stage: bool = False):
    """The Planner's cost model for ``model``, in GFLOP, from mdata's built-in models.

    The language model's term is exact (``AttentionCost`` with ``a = 6 L h``, ``b = 6 N``). The
    vision encoder's ``ImagePatchCost`` is linear, every patch attending over a full window:
    exact for samples of at least ``vit_window`` patches, an over-estimate below (the captions).
    The scheduler imports only mdata's cost models, so this is what a user would configure.
    ``by_stage``: the same two models as a :class:`~mdata.module_cost.ModuleCost` (the encoder on
    stage 0, the language model over all stages, as :func:`stage_seconds` places them), so the
    Planner balances every pipeline stage; otherwise their sum (:class:`~mdata.cost.CombinedCost`).
    """
    from mdata.cost import AttentionCost, CombinedCost, ImagePatchCost
    from mdata.module_cost import ModuleCost

    llm = AttentionCost(a=6.0 * model.llm_layers * model.llm_hidden / 1e9, b=6.0 * model.llm_params / 1e9)
    vision = ImagePatchCost(per_patch=(6.0 * model.vit_params
                                       + 12.0 * model.vit_layers * model.vit_hidden * model.vit_window) / 1e9)
    return ModuleCost({"llm": llm, "vision": vision}) if by_stage else CombinedCost(llm, vision)


@dataclass(frozen=True)
class GPU:
    """Peak dense BF16 FLOP/s and the model FLOPs utilisation reached on it."""

    name: str = "H100-SXM"
    peak_flops: float = 989e12
    mfu: float = 0.40

    @property
    def flops_per_s(self) -> float:
        return self.peak_flops * self.mfu


@dataclass(frozen=True)
class Node:
    """A real training node: its GPUs, CPU cores and RAM; the loaders' budget per GPU.

    Default: NVIDIA DGX H100 (8 GPUs, 2 x 56-core Xeon Platinum 8480C, 2 TB RAM). Each trainer
    process keeps ``trainer_cores_per_gpu`` for itself; the rest is the data loaders' budget.
    """

    name: str = "DGX H100"
    gpus: int = 8
    cores: int = 112
    ram_gb: float = 2048.0
    trainer_cores_per_gpu: float = 2.0

    @property
    def loader_cores_per_gpu(self) -> float:
        return self.cores / self.gpus - self.trainer_cores_per_gpu

    @property
    def ram_gb_per_gpu(self) -> float:
        return self.ram_gb / self.gpus

    def dilation(self, gpus: int, cores_here: float) -> float:
        """How much slower simulated compute must run here so that ``cores_here`` loader cores
        face the same work per second as ``gpus`` GPUs' loader budget on this node."""
        return gpus * self.loader_cores_per_gpu / cores_here


@dataclass(frozen=True)
class PipelineTimes:
    """Seconds of each micro-batch (rows) on each stage (columns), forward and backward."""

    forward: np.ndarray
    backward: np.ndarray

    @property
    def work(self) -> float:
        """Mean busy time of a stage: the makespan of a perfectly balanced pipeline, no bubble."""
        return float((self.forward.sum() + self.backward.sum()) / self.forward.shape[1])


def stage_seconds(micro_batches: Sequence[tuple[np.ndarray, np.ndarray]], model: VLM, gpu: GPU, *,
                  pp: int, tp: int = 1, cp: int = 1,
                  layers: Sequence[int] | None = None) -> PipelineTimes:
    """Per-stage times of each micro-batch, given per micro-batch ``(tokens, patches)`` per document.

    The language model's layers are split over ``pp`` stages, ``layers[s]`` on stage ``s``
    (default: evenly; ``benchmarks/e2e_pipeline.py``'s ``layer_split`` balances the stages); the
    vision encoder runs on stage 0; a stage's FLOPs are spread over its ``tp * cp`` GPUs.
    Backward costs twice forward (the 6 = 2 forward + 4 backward of the FLOP count).
    """
    if pp < 1 or tp < 1 or cp < 1:
        raise ValueError(f"pp, tp and cp must be >= 1, got {pp}, {tp}, {cp}")
    if layers is None:
        share = np.full(pp, 1.0 / pp)
    else:
        if len(layers) != pp or sum(layers) != model.llm_layers:
            raise ValueError(f"layers {tuple(layers)} must be {pp} counts summing to {model.llm_layers}")
        share = np.asarray(layers, dtype=np.float64) / model.llm_layers
    m = len(micro_batches)
    total = np.zeros((m, pp), dtype=np.float64)
    for i, (tokens, patches) in enumerate(micro_batches):
        total[i, :] = model.llm_flops(tokens).sum() * share
        total[i, 0] += model.vit_flops(patches).sum()
    seconds = total / (gpu.flops_per_s * tp * cp)
    return PipelineTimes(forward=seconds / 3.0, backward=2.0 * seconds / 3.0)


def one_f_one_b(times: PipelineTimes) -> float:
    """Makespan of the 1F1B schedule over ``times`` (``m`` micro-batches x ``p`` stages).

    Stage ``s`` runs ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one
    backward, then drains the remaining backwards. A forward of micro-batch ``i`` on stage ``s``
    waits for its forward on ``s - 1``; a backward waits for the backward on ``s + 1`` (on the
    last stage, for its own forward). Each operation starts when its stage is free and its input
    has arrived; communication is free.
    """
    fwd, bwd = times.forward, times.backward
    m, p = fwd.shape
    if m == 0:
        return 0.0
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        ops = [("F", i) for i in range(warm)]
        for k in range(m - warm):
            ops += [("F", warm + k), ("B", k)]
        ops += [("B", i) for i in range(m - warm, m)]
        orders.append(ops)
    done_f = np.full((m, p), np.nan)
    done_b = np.full((m, p), np.nan)
    free = [0.0] * p
    nxt = [0] * p
    remaining = 2 * m * p
    while remaining:
        progressed = False
        for s in range(p):
            while nxt[s] < len(orders[s]):
                kind, i = orders[s][nxt[s]]
                if kind == "F":
                    ready = 0.0 if s == 0 else done_f[i, s - 1]
                else:
                    ready = done_f[i, s] if s == p - 1 else done_b[i, s + 1]
                if np.isnan(ready):
                    break
                start = max(free[s], ready)
                end = start + (fwd[i, s] if kind == "F" else bwd[i, s])
                (done_f if kind == "F" else done_b)[i, s] = end
                free[s] = end
                nxt[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("1F1B schedule deadlocked (a bug in the schedule)")
    return float(np.nanmax(done_b[:, 0]))


def step_breakdown(per_rank: Sequence[PipelineTimes], stall_s: float = 0.0) -> dict[str, float]:
    """One step of one system: the slowest DP rank's pipeline, split into its parts.

    ``work``: the largest per-rank mean stage busy time (what balance decides); ``bubble``: what
    the pipeline adds on top (step makespan minus ``work``); ``stall``: data wait. ``mean_work``
    is the ranks' average ``work`` (the step's FLOPs per rank, balance aside).
    """
    spans = [one_f_one_b(t) for t in per_rank]
    works = [t.work for t in per_rank]
    makespan = max(spans)
    work = max(works)
    return {"work": work, "mean_work": float(np.mean(works)), "bubble": makespan - work,
            "makespan": makespan, "stall": float(stall_s), "step": makespan + float(stall_s)}
