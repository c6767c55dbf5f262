"""The end-to-end benchmark at scale, on paper: thousands of GPUs, no processes.

Both systems get the same data (the e2e mix's real per-row token and patch counts,
``benchmarks/e2e_data.py``), the same trainer (``benchmarks/e2e_model.py``) and the same loader
CPU budget per GPU (:class:`~benchmarks.e2e_model.Node`):

* **mdata**: the real Planner (:class:`~mdata.planner.state.PlannerState`, driven as
  :func:`mdata.planner.simulate` drives it) plans every step; each DP rank's micro-batches are
  exactly the ``ConstructBatch`` it would receive. Loading is spread over every node's loader
  cores, each sample loaded once.
* **baseline** (Megatron-LM's layout): every DP rank packs its own ``micro_batches`` sequences
  next-fit from its own seeded, weighted stream (samples longer than the context are cut). TP
  rank 0 loads for its TP group and may use the whole group's cores; every CP rank loads the whole
  sequence; the first and the last pipeline stage both load. So each DP group's data is loaded
  ``cp * min(pp, 2)`` times, each time on ``tp`` GPUs' worth of cores.

A step lasts as long as the slowest DP rank's 1F1B pipeline, or as long as the slowest loader
needs for its share of the step when that is longer (loaders run ahead of compute; whatever
they cannot hide is a data stall). Loader cost per sample is CPU seconds per source measured
here on one core (:func:`~benchmarks.e2e_data.loader_cost_per_sample`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from benchmarks.e2e_model import GPU, MODELS, VLM, Node, planner_cost, stage_seconds, step_breakdown
from mdata.mesh import ClientPlaceTree
from mdata.metadata import SourceMetadata
from mdata.plan import Plan
from mdata.planner.events import BatchConsumed, ChunkLoaded, Tick
from mdata.planner.instructions import ConstructBatch, JobFailed, LoadChunk, StepReady
from mdata.planner.state import PlannerState

__all__ = ["Setup", "mean_tokens", "ratio_breakdown", "simulate_both", "stage_aware_seconds"]


@dataclass(frozen=True)
class Setup:
    """One simulated job: model, hardware, mesh, batch shape, mix."""

    model: VLM = field(default_factory=lambda: MODELS["llava-ov-7b"])
    gpu: GPU = GPU()
    node: Node = Node()
    gpus: int = 1024
    tp: int = 4
    pp: int = 4
    cp: int = 2
    max_tokens: int = 32768
    tokens_per_step: int = 16 << 20  # 16M tokens per global step (Llama 3's batch)
    weights: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0
    by_stage: bool = False  # the Planner's cost model as modules: it balances every stage

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def micro_batches(self) -> int:
        return max(1, self.tokens_per_step // (self.dp * self.max_tokens))


def _mdata_steps(setup: Setup, meta: dict[str, SourceMetadata], steps: int):
    """Per step, per DP rank: list of (tokens, patches) arrays per micro-batch, from the Planner."""
    names = tuple(meta)
    per_sample = mean_tokens(setup, meta)
    global_batch = max(setup.dp, int(round(setup.tokens_per_step / per_sample)))
    plan = (Plan(list(names)).mix(dict(setup.weights)).cost(planner_cost(setup.model, by_stage=setup.by_stage))
            .balance(micro_batches=setup.micro_batches, max_tokens=setup.max_tokens,
                     global_batch=global_batch)
            .distribute(ClientPlaceTree(dp=setup.dp, pp=setup.pp, cp=setup.cp, tp=setup.tp))
            .broadcast_at("tp").seed(setup.seed))
    state = PlannerState(plan, meta, job="e2e-sim", record_lineage=False)
    receivers = sorted(r for group in state.receivers for r in group)
    out: dict[int, list] = {}
    done = 0
    queue = deque(state.handle(Tick(stimulus_id="start")))
    while done < steps:
        ins = queue.popleft()
        if isinstance(ins, LoadChunk):
            ref = ins.chunk
            rows, tok, pat, bad = meta[ref.source].rows_of(ref.shard, ref.start, ref.stop)
            queue.extend(state.handle(ChunkLoaded(ref, rows, tok, pat, bad.tolist(), "sim",
                                                  stimulus_id=f"l-{ref.source}-{ref.chunk_id}")))
        elif isinstance(ins, ConstructBatch):
            s = ins.samples
            patches = np.array([meta[names[i]].num_patches[sh][r] for i, sh, r in
                                zip(s.source_index.tolist(), s.shard.tolist(), s.row.tolist())])
            mbs = [(s.num_tokens[s.micro_batch == k], patches[s.micro_batch == k])
                   for k in range(s.num_micro_batches)]
            out.setdefault(ins.step, [None] * setup.dp)[ins.dp_rank] = (mbs, s.source_index)
        elif isinstance(ins, StepReady):
            done += 1
            queue.extend(state.handle(*(BatchConsumed(ins.step, r, stimulus_id=f"c-{ins.step}")
                                        for r in receivers)))
        elif isinstance(ins, JobFailed):
            raise RuntimeError(f"planner failed: {ins.reason}")
    return [out[s] for s in sorted(out)[:steps]]


def mean_tokens(setup: Setup, meta: dict[str, SourceMetadata]) -> float:
    """Mean tokens per sample (cut to the context) under the mix: sizes the global batch."""
    w = np.array([setup.weights[n] for n in meta], dtype=np.float64)
    means = np.array([np.minimum(np.concatenate(m.num_tokens), setup.max_tokens).mean() for m in meta.values()])
    return float((w * means).sum() / w.sum())


def _baseline_steps(setup: Setup, meta: dict[str, SourceMetadata], steps: int):
    """Per step, per DP rank: the micro-batches a per-rank next-fit packing loader fills."""
    names = list(meta)
    w = np.array([setup.weights[n] for n in names], dtype=np.float64)
    rows = [(np.concatenate(meta[n].num_tokens), np.concatenate(meta[n].num_patches)) for n in names]
    out = [[None] * setup.dp for _ in range(steps)]
    for d in range(setup.dp):
        rng = np.random.default_rng((setup.seed, d))
        orders = [rng.permutation(len(t)) for t, _ in rows]
        pos = [0] * len(names)
        carry: list[tuple[int, int, int]] = []

        def draw() -> tuple[int, int, int]:
            k = int(rng.choice(len(names), p=w / w.sum()))
            i = int(orders[k][pos[k] % len(orders[k])])
            pos[k] += 1
            return k, int(rows[k][0][i]), int(rows[k][1][i])

        for s in range(steps):
            mbs, srcs = [], []
            for _ in range(setup.micro_batches):
                toks, pats, used = [], [], 0
                while True:
                    k, t, p = carry.pop() if carry else draw()
                    t = min(t, setup.max_tokens)
                    if toks and used + t > setup.max_tokens:
                        carry.append((k, t, p))
                        break
                    toks.append(t)
                    pats.append(min(p, t))
                    srcs.append(k)
                    used += t
                mbs.append((np.array(toks), np.array(pats)))
            out[s][d] = (mbs, np.array(srcs))
    return out


def _system(setup: Setup, per_step, loader_cost: np.ndarray, *, baseline: bool) -> dict[str, float]:
    """Sum over steps of each system's step parts (seconds) and tokens."""
    loaders_per_group = setup.cp * min(setup.pp, 2)
    cores_per_loader = setup.tp * setup.node.loader_cores_per_gpu
    total = {"work": 0.0, "mean_work": 0.0, "bubble": 0.0, "stall": 0.0, "step": 0.0, "tokens": 0.0}
    for ranks in per_step:
        times = [stage_seconds(mbs, setup.model, setup.gpu, pp=setup.pp, tp=setup.tp, cp=setup.cp)
                 for mbs, _ in ranks]
        load = [float(loader_cost[srcs].sum()) for _, srcs in ranks]  # core-seconds per DP group
        parts = step_breakdown(times)
        if baseline:  # each loading rank loads its whole DP group's step on its TP group's cores
            need = max(load) / cores_per_loader
        else:  # each sample once, over every GPU's loader cores
            need = sum(load) / (setup.gpus * setup.node.loader_cores_per_gpu)
        parts["stall"] = max(0.0, need - parts["makespan"])
        parts["step"] = parts["makespan"] + parts["stall"]
        for key in ("work", "mean_work", "bubble", "stall", "step"):
            total[key] += parts[key]
        total["tokens"] += sum(float(t.sum()) for mbs, _ in ranks for t, _ in mbs)
    total["loaders_per_group"] = loaders_per_group if baseline else 0
    return total


def ratio_breakdown(ours: dict[str, float], base: dict[str, float]) -> dict[str, float]:
    """mdata's tokens/s over the baseline's, and factors whose product is that ratio.

    ``flops_per_token``: the baseline's mean work per token over mdata's (what differs in the
    samples each takes); ``balance``: max over mean work across DP ranks; ``bubbles``: makespan over
    max work; ``data_stalls``: step over makespan. Each factor > 1 is a gain of mdata.
    """
    def parts(x):
        return (x["mean_work"] / x["tokens"], x["work"] / x["mean_work"],
                (x["work"] + x["bubble"]) / x["work"], x["step"] / (x["work"] + x["bubble"]))

    b, m = parts(base), parts(ours)
    out = dict(zip(("flops_per_token", "balance", "bubbles", "data_stalls"),
                   (bb / mm for bb, mm in zip(b, m))))
    out["ratio"] = (ours["tokens"] / ours["step"]) / (base["tokens"] / base["step"])
    return out


def simulate_both(setup: Setup, meta: dict[str, SourceMetadata], loader_cost: Mapping[str, float],
                  steps: int) -> dict[str, dict[str, float]]:
    """Both systems over ``steps`` steps of ``setup``: summed parts and tokens, and the ratio."""
    if not setup.weights:
        raise ValueError("Setup.weights is empty")
    cost = np.array([loader_cost[n] for n in meta], dtype=np.float64)
    ours = _system(setup, _mdata_steps(setup, meta, steps), cost, baseline=False)
    base = _system(setup, _baseline_steps(setup, meta, steps), cost, baseline=True)
    return {"mdata": ours, "baseline": base, "ratio": ratio_breakdown(ours, base)}



def stage_aware_seconds(setup: Setup, meta: dict[str, SourceMetadata],
                        loader_cost: Mapping[str, float], steps: int) -> tuple[float, float]:
    """mdata's summed step seconds with the cost model as modules (balanced by stage) and as
    one summed cost (scalar, pipeline-aware): the same samples, the same trainer."""
    cost = np.array([loader_cost[n] for n in meta], dtype=np.float64)
    return tuple(_system(setup, _mdata_steps(replace(setup, by_stage=by), meta, steps), cost,
                         baseline=False)["step"] for by in (True, False))
