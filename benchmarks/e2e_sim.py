"""The end-to-end benchmark at scale, on paper: thousands of GPUs, no processes.

Every system gets the same data (the e2e mix's real per-row token and patch counts,
``benchmarks/e2e_data.py``), the same trainer (``benchmarks/e2e_model.py``), the same pipeline
(``benchmarks/e2e_pipeline.py``: layers split so the stages are even with the vision encoder on
the first, 1F1B or interleaved 1F1B, the gradient all-reduce and optimizer in every step), the
same loader CPU budget per GPU (:class:`~benchmarks.e2e_model.Node`) and **the same work**:

* **mdata**: the real Planner (:class:`~mdata.planner.state.PlannerState`, driven as
  :func:`mdata.planner.simulate` drives it) plans every step's global batch (sized to the step's
  token budget from the mix's mean tokens); each DP rank's micro-batches are exactly the
  ``ConstructStep`` group it would receive. Loading is spread over every node's loader cores, each
  sample loaded once, at the CPU per sample its loaders and constructor spent in the process run
  (``Setup.mdata_cpu_factor`` times the raw cost), and its batches cross each node's data NIC
  (``Setup.nic_bytes_per_s``) from loader to constructor and to every receiving rank.
* **the baselines** (``benchmarks/e2e_baselines.py``: ``dataloader``, ``megatron``,
  ``local_best``, ``bridge``): each step every rank takes ``1 / dp`` of the tokens of mdata's step
  (``dataloader``: of its samples) into the same number of micro-batches per rank.

A step lasts as long as the slowest DP rank's pipeline, plus the loaders' shortfall when they
need longer than that for the step's share (loaders run ahead of compute; what they cannot hide
is a data stall), plus the fixed part (gradient reduce-scatter and all-gather, optimizer). mdata's
step also lasts at least its scheduler's CPU per step at that world size (``Setup.control``,
measured: :mod:`benchmarks.e2e_control`); what that adds counts as a data stall.
Loader cost per sample is CPU seconds per source measured here on one core
(:func:`~benchmarks.e2e_data.loader_cost_per_sample`). **The ideal** is the same work on the
same pipeline with perfect balance and no stall: every micro-batch of every rank the mean of
mdata's, per stage.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from benchmarks.e2e_baselines import BASELINES, baseline_steps
from benchmarks.e2e_control import ControlCost
from benchmarks.e2e_many_sources import many_sources
from benchmarks.e2e_model import GPU, MODELS, VLM, Node, PipelineTimes, planner_cost, stage_seconds
from benchmarks.e2e_pipeline import Fabric, fixed_seconds, layer_split, pipeline_makespan
from mdata.mesh import ClientPlaceTree
from mdata.metadata import SourceMetadata
from mdata.plan import Plan
from mdata.planner.events import BatchConsumed, ChunkLoaded, Tick
from mdata.planner.instructions import ConstructStep, JobFailed, LoadChunk, StepReady
from mdata.planner.state import PlannerState

__all__ = ["PARTS", "Setup", "batch_bytes", "mean_tokens", "ratio_breakdown", "simulate", "vit_per_layer"]

#: Factors of a throughput ratio, in the order their product is taken.
PARTS = ("flops_per_token", "balance", "bubbles", "data_stalls", "fixed")


@dataclass(frozen=True)
class Setup:
    """One simulated job: model, hardware, mesh, batch shape, mix.

    The batch is set per DP rank: ``micro_batches`` (default ``2 x pp``, the least a pipeline is
    run with) of ``max_tokens``, filled to ``fill`` on average (packing needs some room), so a
    step holds ``dp x micro_batches x max_tokens x fill`` tokens. ``virtual``: model chunks per
    device (1: 1F1B; more: Megatron-LM's interleaved 1F1B).
    """

    model: VLM = field(default_factory=lambda: MODELS["llava-ov-7b"])
    gpu: GPU = GPU()
    node: Node = Node()
    fabric: Fabric = Fabric()
    gpus: int = 1024
    tp: int = 4
    pp: int = 4
    cp: int = 2
    max_tokens: int = 32768
    micro_batches: int = 0  # 0: 2 x pp
    fill: float = 0.9
    virtual: int = 1
    weights: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0
    by_stage: bool = False  # the Planner's cost model as modules: it balances every stage
    control: ControlCost | None = None  # mdata's scheduler per step (None: not charged)
    #: mdata's loader and constructor CPU per sample over the raw ``load_chunk`` cost (measured
    #: in the process run, :mod:`benchmarks.e2e`; 1: not charged)
    mdata_cpu_factor: float = 1.0
    #: what each node's data NIC moves per second: mdata's batches cross it from loader to
    #: constructor and from constructor to each receiving rank (a DGX H100's 400 Gb/s in-band
    #: ConnectX-7 port; the compute fabric is left to the collectives)
    nic_bytes_per_s: float = 50e9
    #: 0: the weighted sources of ``meta`` as they are; ``n``: their rows cut into ``n`` sources
    #: of their own, each parent's weight split over its pieces (:mod:`benchmarks.e2e_many_sources`)
    pieces: int = 0

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def m(self) -> int:
        """Micro-batches per DP rank and step."""
        return self.micro_batches or 2 * self.pp

    @property
    def tokens_per_step(self) -> int:
        return int(self.dp * self.m * self.max_tokens * self.fill)


def _mdata_steps(setup: Setup, meta: dict[str, SourceMetadata], steps: int, global_batch: int):
    """Per step, per DP rank: list of (tokens, patches) arrays per micro-batch, from the Planner."""
    names = tuple(meta)
    plan = (Plan(list(names)).mix({n: setup.weights[n] for n in names}).cost(planner_cost(setup.model, by_stage=setup.by_stage))
            .balance(micro_batches=setup.m, max_tokens=setup.max_tokens,
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
        elif isinstance(ins, ConstructStep):
            for dp, s in enumerate(ins.groups()):
                patches = np.array([meta[names[i]].num_patches[sh][r] for i, sh, r in
                                    zip(s.source_index.tolist(), s.shard.tolist(), s.row.tolist())])
                mbs = [(s.num_tokens[s.micro_batch == k], patches[s.micro_batch == k])
                       for k in range(s.num_micro_batches)]
                out.setdefault(ins.step, [None] * setup.dp)[dp] = (mbs, s.source_index)
        elif isinstance(ins, StepReady):
            done += 1
            queue.extend(state.handle(*(BatchConsumed(ins.step, r, stimulus_id=f"c-{ins.step}")
                                        for r in receivers)))
        elif isinstance(ins, JobFailed):
            raise RuntimeError(f"planner failed: {ins.reason}")
    return [out[s] for s in sorted(out)[:steps]]


def mean_tokens(setup: Setup, meta: Mapping[str, SourceMetadata]) -> float:
    """Mean tokens per sample (cut to the context) under the mix: sizes the global batch."""
    w = np.array([setup.weights[n] for n in meta], dtype=np.float64)
    means = np.array([np.minimum(np.concatenate(m.num_tokens), setup.max_tokens).mean() for m in meta.values()])
    return float((w * means).sum() / w.sum())


def vit_per_layer(setup: Setup, meta: Mapping[str, SourceMetadata]) -> float:
    """The vision encoder's expected FLOPs over one language-model layer's, under the mix: what
    the layer split balances the first stage against."""
    w = np.array([setup.weights[n] for n in meta], dtype=np.float64)
    llm, vit = [], []
    for m in meta.values():
        tok = np.minimum(np.concatenate(m.num_tokens), setup.max_tokens)
        llm.append(setup.model.llm_flops(tok).mean() / setup.model.llm_layers)
        vit.append(setup.model.vit_flops(np.minimum(np.concatenate(m.num_patches), tok)).mean())
    return float((w * np.array(vit)).sum() / (w * np.array(llm)).sum())


def _times(setup: Setup, mbs, layers) -> PipelineTimes:
    return stage_seconds(mbs, setup.model, setup.gpu, pp=setup.pp, tp=setup.tp, cp=setup.cp, layers=layers)


def _pipelines(setup: Setup, per_step, loader_cost: np.ndarray, layers) -> list[dict]:
    """Per step of one system: each DP rank's pipeline makespan and mean stage work, the
    core-seconds of loading its samples, the step's tokens and its most micro-batches per rank.
    What the loader budget does not change, computed once for every budget (:func:`_system`)."""
    out = []
    for ranks in per_step:
        times = [_times(setup, mbs, layers) for mbs, _ in ranks]
        out.append({"spans": [pipeline_makespan(t, setup.virtual) for t in times],
                    "works": [t.work for t in times],
                    "load": [float(loader_cost[srcs].sum()) for _, srcs in ranks],
                    "bytes": sum(batch_bytes(t, p) for mbs, _ in ranks for t, p in mbs),
                    "tokens": sum(float(t.sum()) for mbs, _ in ranks for t, _ in mbs),
                    "micro_batches": max(len(mbs) for mbs, _ in ranks)})
    return out


def _system(setup: Setup, pipes: list[dict], fixed: float, kind: str, cores: float | None = None):
    """Sum over steps of one system's step parts (seconds), tokens, and the micro-batch counts,
    its loaders given ``cores`` per GPU (None: the node's loader cores per GPU);
    ``stall_onset_cores``: the loader cores per GPU below which some step would wait for data."""
    cores = setup.node.loader_cores_per_gpu if cores is None else float(cores)
    if cores <= 0:
        raise ValueError(f"loader cores per GPU must be > 0, got {cores}")
    total = dict.fromkeys(("work", "mean_work", "bubble", "stall", "fixed", "step", "tokens"), 0.0)
    counts = []
    onset = 0.0
    for p in pipes:
        spans, works, load = p["spans"], p["works"], p["load"]  # load: core-seconds per DP group
        if kind == "mdata":  # each sample once, over every GPU's loader cores, at the CPU per
            # sample mdata's loaders and constructors spend (the process run's, over the raw path)
            per_core = setup.mdata_cpu_factor * sum(load) / setup.gpus
        elif kind == "dataloader":  # every GPU loads its DP group's samples on its own cores
            per_core = max(load)
        else:  # TP rank 0 of each loading rank, on its TP group's cores
            per_core = max(load) / setup.tp
        need = per_core / cores  # seconds the slowest loading rank needs for the step
        makespan = max(spans)
        if kind == "mdata":  # its batches cross a node's data NIC: loader to constructor, then
            # constructor to the group's receivers, charged as the whole batch to every pipeline
            # stage (an upper bound: CP ranks split theirs, later stages need less than the first)
            network = p["bytes"] * (1 + setup.pp) / max(1, setup.gpus // setup.node.gpus) / setup.nic_bytes_per_s
            total["network"] = total.get("network", 0.0) + network
            need = max(need, network)  # both run ahead of compute, side by side
        stall = max(0.0, need - makespan - fixed)  # loaders keep working through the all-reduce
        # below this many loader cores per GPU, this step would wait for its data
        onset = max(onset, per_core / (makespan + fixed))
        if kind == "mdata" and setup.control is not None:  # the scheduler plans ahead, but a step
            # cannot come faster than its CPU per step: what it needs beyond the step is a stall
            control = max(0.0, setup.control.step_seconds(setup.gpus, setup.dp, setup.tp, setup.node.gpus)
                          - (makespan + stall + fixed))
            total["control"] = total.get("control", 0.0) + control
            stall += control
        for key, value in (("work", max(works)), ("mean_work", float(np.mean(works))),
                           ("bubble", makespan - max(works)), ("stall", stall), ("fixed", fixed),
                           ("step", makespan + stall + fixed)):
            total[key] += value
        total["tokens"] += p["tokens"]
        counts.append(p["micro_batches"])
    total["micro_batches"] = max(counts)
    total["steps"] = len(pipes)
    total["stall_onset_cores"] = onset  # loaders alone (mdata's scheduler aside)
    return total


#: Bytes a batch carries per token (input ids, labels and positions, int32 each) and per image
#: patch (14 x 14 RGB pixels, uint8).
TOKEN_BYTES, PATCH_BYTES = 12, 14 * 14 * 3


def batch_bytes(tokens: np.ndarray, patches: np.ndarray) -> float:
    """What a micro-batch of samples with these token and patch counts weighs on the wire."""
    return float(TOKEN_BYTES * np.sum(tokens) + PATCH_BYTES * np.sum(patches))


def _ideal(setup: Setup, per_step, layers, fixed: float) -> dict[str, float]:
    """mdata's work, perfectly balanced: each step, every micro-batch of every rank the mean of
    mdata's on each stage; the same pipeline and fixed part, no stall."""
    step = tokens = 0.0
    for ranks in per_step:
        fwd = sum(_times(setup, mbs, layers).forward.sum(axis=0) for mbs, _ in ranks)
        rows = setup.dp * setup.m
        mean = np.tile(fwd / rows, (setup.m, 1))
        step += pipeline_makespan(PipelineTimes(mean, 2.0 * mean), setup.virtual) + fixed
        tokens += sum(float(t.sum()) for mbs, _ in ranks for t, _ in mbs)
    return {"step": step, "tokens": tokens}


def ratio_breakdown(ours: Mapping[str, float], base: Mapping[str, float]) -> dict[str, float]:
    """mdata's tokens/s over a baseline's, and factors whose product is that ratio.

    ``flops_per_token``: the baseline's mean work per token over mdata's (what differs in the
    samples each takes); ``balance``: max over mean work across DP ranks; ``bubbles``: makespan
    over max work; ``data_stalls``: makespan plus stall over makespan; ``fixed``: the step over
    that (all-reduce and optimizer, equal seconds on both sides, so it dilutes the others).
    Each factor > 1 is a gain of mdata; a missing ``fixed`` is 0.
    """
    def parts(x):
        pipe = x["work"] + x["bubble"]
        rest = x["step"] - x.get("fixed", 0.0)
        return (x["mean_work"] / x["tokens"], x["work"] / x["mean_work"], pipe / x["work"],
                rest / pipe, x["step"] / rest)

    b, m = parts(base), parts(ours)
    out = dict(zip(PARTS, (bb / mm for bb, mm in zip(b, m))))
    out["ratio"] = (ours["tokens"] / ours["step"]) / (base["tokens"] / base["step"])
    return out


def _ratios(sides: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """mdata over each baseline: :func:`ratio_breakdown` and ``tokens_per_step`` (mdata's
    tokens over its)."""
    out = {}
    for name in BASELINES:
        r = ratio_breakdown(sides["mdata"], sides[name])
        r["tokens_per_step"] = sides["mdata"]["tokens"] / sides[name]["tokens"]
        out[name] = r
    return out


def simulate(setup: Setup, meta: Mapping[str, SourceMetadata], loader_cost: Mapping[str, float],
             steps: int, loader_cores: tuple[float, ...] = ()) -> dict[str, dict]:
    """mdata, the baselines and the ideal over ``steps`` steps of ``setup``.

    Returns per side (``mdata``, each of :data:`~benchmarks.e2e_baselines.BASELINES`) its summed
    step parts and tokens; ``ratio[name]`` (mdata over that baseline, with its factors and
    ``tokens_per_step``: mdata's tokens over its); ``vs_ideal`` (mdata's tokens/s over the
    ideal's); ``shape`` (layer split, fixed seconds per step, micro-batch counts, global batch).
    ``loader_cores``: loader budgets per GPU to sweep besides the node's; for each ``c``,
    ``cores_sweep[c]`` holds every side's step parts and ``ratio`` with ``c`` loader cores per
    GPU on the same draw, plans and pipelines (only the data stalls can differ).
    Sources of weight 0 are left out; with ``setup.pieces``, the others are cut into that many in all.
    """
    if not setup.weights:
        raise ValueError("Setup.weights is empty")
    if setup.pieces:  # both sides then draw from the same pieces, by the pieces' weights
        meta, loader_cost, weights = many_sources(meta, loader_cost, setup.weights, setup.pieces)
        setup = replace(setup, weights=weights, pieces=0)
    meta = {n: m for n, m in meta.items() if setup.weights.get(n, 0.0) > 0}
    cost = np.array([loader_cost[n] for n in meta], dtype=np.float64)
    layers = layer_split(setup.model, setup.pp, vit_per_layer(setup, meta))
    fixed = fixed_seconds(setup.model, layers, tp=setup.tp, dp=setup.dp, cp=setup.cp, fabric=setup.fabric)
    global_batch = max(setup.dp, int(round(setup.tokens_per_step / mean_tokens(setup, meta))))
    planned = _mdata_steps(setup, meta, steps, global_batch)
    step_tokens = [sum(float(t.sum()) for mbs, _ in ranks for t, _ in mbs) for ranks in planned]
    tally: dict = {}
    cost_fn = planner_cost(setup.model)
    others = baseline_steps(meta, setup.weights, dp=setup.dp, micro_batches=setup.m,
                            max_tokens=setup.max_tokens, pp=setup.pp, seed=setup.seed,
                            step_tokens=step_tokens, step_samples=global_batch, cost_fn=cost_fn,
                            tally=tally)
    pipes = {"mdata": _pipelines(setup, planned, cost, layers),
             **{name: _pipelines(setup, others[name], cost, layers) for name in BASELINES}}
    out: dict[str, dict] = {side: _system(setup, p, fixed, side) for side, p in pipes.items()}
    ideal = _ideal(setup, planned, layers, fixed)
    out["ratio"] = _ratios(out)
    out["vs_ideal"] = (out["mdata"]["tokens"] / out["mdata"]["step"]) / (ideal["tokens"] / ideal["step"])
    out["shape"] = {"layers": layers, "fixed_s": fixed, "global_batch": global_batch, "sources": len(meta),
                    "tokens_per_step": float(np.mean(step_tokens)), **tally,
                    **{f"micro_batches.{k}": out[k]["micro_batches"] for k in ("mdata", *BASELINES)}}
    sweep: dict[float, dict] = {}
    for c in loader_cores:
        sides = {side: _system(setup, p, fixed, side, cores=c) for side, p in pipes.items()}
        sweep[float(c)] = {**sides, "ratio": _ratios(sides)}
    out["cores_sweep"] = sweep
    return out
