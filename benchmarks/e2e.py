"""End-to-end training throughput of a vision-language model: mdata beside a Megatron-style loader.

Two parts, same data (``benchmarks/e2e_data.py``: MM1's caption : interleaved : text mix over
the example corpus, photos decoded at native size), same trainer model
(``benchmarks/e2e_model.py``), same seeds:

1. **Processes** (``e2e.tokens_per_s``): one process per DP rank drives its pipeline's loading
   ranks, takes each step's batch, turns the first stage's micro-batches (documents and their
   image tokens, read from the tensors received) into a 1F1B makespan, sleeps for it, and meets
   the other DP ranks at a barrier (the step's gradient all-reduce). The baseline's loading
   ranks are those Megatron-LM loads on (TP rank 0, every CP rank, the first and last pipeline
   stages), each a ``torch`` DataLoader packing its own sequences (``benchmarks/baseline.py``)
   with as many workers as the budget allows; mdata's are ``mdata.trainer.Loader`` receivers
   of a real cluster (Planner, loader pools, a constructor). Both budgets are this machine's
   cores; simulated compute is dilated by the ratio of the real node's loader cores for the
   simulated GPUs to the cores here, so loaders face the work per second they would face there.
2. **At scale, on paper** (``e2e.ratio.<baseline>.<regime>``, ``benchmarks/e2e_scale.py``):
   ``benchmarks/e2e_sim.py`` at 1,024 to 8,192 GPUs with the real Planner beside four
   baselines (``benchmarks/e2e_baselines.py``: ``dataloader``, ``megatron``, ``local_best``,
   ``bridge``) at equal work, several seeds, and mdata over the ideal (``e2e.vs_ideal.<regime>``).

Throughput is tokens per simulated second (image tokens included, padding not); the ratio is
split into factors whose product it is: balance (slowest over mean DP rank work), pipeline
bubbles, data stalls, and flops per token (how costly each system's samples are).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from benchmarks.baseline import IMAGE_TOKEN_ID, MixingPackingDataset, make_loader
from benchmarks.counting import cpu_seconds
from benchmarks.e2e_data import E2E_DIR, WEIGHTS, e2e_metadata, e2e_sources, loader_cost_per_sample
from benchmarks.e2e_model import GPU, MODELS, Node, VLM, planner_cost, one_f_one_b, stage_seconds
from benchmarks.e2e_scale import at_scale_figures
from benchmarks.e2e_sim import Setup, mean_tokens, ratio_breakdown, simulate
from benchmarks.harness import figure

__all__ = ["ProcessRun", "run", "run_processes"]

#: Cumulative (simulated seconds, tokens) of the last process run, for plots_e2e.py.
_CURVES: dict[str, list] = {}
CURVES_FILE = E2E_DIR / "last-run-curves.json"


@dataclass(frozen=True)
class ProcessRun:
    """The process run's shape. One loading rank per stage of the first and last (TP 1, CP 1:
    context parallelism's extra loaders are counted in the simulation, not run here)."""

    model: VLM = MODELS["llava-ov-0.5b"]
    gpu: GPU = GPU()
    node: Node = Node()
    dp: int = 2
    pp: int = 2
    max_tokens: int = 32768
    micro_batches: int = 2
    steps: int = 3
    warm: int = 1
    cores_here: float = 2.0
    time_scale: float = 1.0  # 1.0 = the honest dilation; quick mode compresses it (stated)
    seed: int = 0

    @property
    def gpus(self) -> int:
        return self.dp * self.pp

    @property
    def dilation(self) -> float:
        return self.node.dilation(self.gpus, self.cores_here) * self.time_scale


def _documents(mb: dict) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, image tokens) of every document of a received micro-batch."""
    ids = mb["input_ids"].numpy()
    if "seqlens" in mb:
        lengths = mb["seqlens"].numpy().astype(np.int64)
    else:
        lengths = np.diff(mb["cu_seqlens"].numpy()).astype(np.int64)
    lengths = lengths[lengths > 0]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    images = np.add.reduceat((ids[: bounds[-1]] == IMAGE_TOKEN_ID).astype(np.int64), bounds[:-1]) \
        if lengths.size else np.zeros(0, np.int64)
    return lengths, images


def _drive(iters, cfg: ProcessRun, steps: int, barrier) -> list[dict]:
    """One DP rank: per step, take every loading rank's batch, compute, meet the others."""
    log = []
    for _ in range(steps):
        start = time.perf_counter()
        batches = [next(it) for it in iters]
        wait = time.perf_counter() - start
        mbs = [_documents(mb) for mb in batches[0]["micro_batches"]]
        times = stage_seconds(mbs, cfg.model, cfg.gpu, pp=cfg.pp)
        span = one_f_one_b(times)
        time.sleep(span * cfg.dilation)
        barrier.wait()
        log.append({"start": start, "end": time.perf_counter(), "wait": wait, "span": span,
                    "work": times.work, "tokens": float(sum(t.sum() for t, _ in mbs)),
                    "samples": sum(len(t) for t, _ in mbs)})
    return log


def _baseline_main(cfg: ProcessRun, dp_rank: int, workers: int, conn, barrier) -> None:
    sources = e2e_sources()
    loaders = []
    for _stage in range(min(cfg.pp, 2)):  # the first and the last stage each load
        ds = MixingPackingDataset(sources, WEIGHTS, max_tokens=cfg.max_tokens,
                                  micro_batches=cfg.micro_batches, dp_rank=dp_rank, dp_size=cfg.dp,
                                  seed=cfg.seed)
        loaders.append(make_loader(ds, workers))
    iters = [iter(ld) for ld in loaders]
    conn.send(("ready", os.getpid()))
    _serve(conn, lambda steps: _drive(iters, cfg, steps, barrier))


def _mdata_main(cfg: ProcessRun, dp_rank: int, address: str, job: str, conn, barrier) -> None:
    os.environ["DASK_LOGGING__DISTRIBUTED"] = "error"
    from distributed import Client

    from mdata.mesh import ClientPlaceTree
    from mdata.trainer import Loader

    mesh = ClientPlaceTree(dp=cfg.dp, pp=cfg.pp)
    with Client(address, direct_to_workers=True, set_as_default=False) as client:
        loaders = [Loader(client, job=job, rank=r, world_size=mesh.world_size, timeout=300.0)
                   for r in mesh.receivers(dp_rank, "tp")]
        iters = [iter(ld) for ld in loaders]
        conn.send(("ready", os.getpid()))
        _serve(conn, lambda steps: _drive(iters, cfg, steps, barrier))
        for ld in loaders:
            ld.close()


def _serve(conn, run_steps) -> None:
    while True:
        cmd, *args = conn.recv()
        if cmd == "stop":
            conn.send(("stopped", None))
            return
        try:
            conn.send(("done", run_steps(args[0])))
        except BaseException as exc:  # surface to the driver, never hang it
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            return


def _plan(cfg: ProcessRun, sources, meta):
    from mdata.mesh import ClientPlaceTree
    from mdata.plan import Plan

    setup = Setup(model=cfg.model, gpus=cfg.gpus, tp=1, pp=cfg.pp, cp=1, max_tokens=cfg.max_tokens,
                  micro_batches=cfg.micro_batches, fill=1.0, weights=WEIGHTS)
    global_batch = max(cfg.dp, int(round(setup.tokens_per_step / mean_tokens(setup, meta))))
    return (Plan(sources).mix(WEIGHTS).cost(planner_cost(cfg.model))
            .balance(micro_batches=cfg.micro_batches, max_tokens=cfg.max_tokens,
                     global_batch=global_batch)
            .distribute(ClientPlaceTree(dp=cfg.dp, pp=cfg.pp)).broadcast_at("tp").seed(cfg.seed)
            .special_tokens(image_token_id=IMAGE_TOKEN_ID))


def _run_drivers(cfg: ProcessRun, target, extra: tuple, on_measure=None) -> list[list[dict]]:
    """The DP-rank drivers' logs of the measured steps (after ``cfg.warm``); ``on_measure(i)``
    is called as the warm-up ends (``i = 0``) and as the measured steps end (``i = 1``)."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(cfg.dp)
    procs, conns = [], []
    try:
        for d in range(cfg.dp):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=target, args=(cfg, d, *extra, there, barrier))
            proc.start()
            procs.append(proc)
            conns.append(here)
        for c in conns:
            if not c.poll(300):
                raise TimeoutError("a DP-rank driver did not start within 300 s")
            kind, value = c.recv()
            if kind != "ready":
                raise RuntimeError(f"DP-rank driver failed to start: {value}")
        for i, steps in enumerate((cfg.warm, cfg.steps)):
            if i and on_measure is not None:
                on_measure(0)
            for c in conns:
                c.send(("run", steps))
            logs = []
            for c in conns:
                kind, value = c.recv()
                if kind != "done":
                    raise RuntimeError(f"DP-rank driver: {value}")
                logs.append(value)
        if on_measure is not None:
            on_measure(1)
        return logs
    finally:
        for c in conns:
            try:
                c.send(("stop",))
                c.poll(30) and c.recv()
            except (OSError, EOFError):
                pass
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()


def mdata_cpu_factor(measured: Mapping[str, float], cost: Mapping[str, float]) -> tuple[float, float]:
    """``(factor, cpu_s_per_sample)``: the CPU mdata's loader and constructor processes spent per
    sample the trainers received in the process run (``measured``: ``worker_cpu_s`` and
    ``samples``), over the raw ``load_chunk`` cost per sample of the same mix (``cost``: CPU
    seconds per sample of each source, weighted by the mix's sample weights). It counts what the
    loaders did ahead for later steps too, which can only raise it (it favours the baselines,
    whose loaders are charged the raw cost)."""
    per_sample = measured["worker_cpu_s"] / max(1, measured["samples"])
    raw = sum(WEIGHTS[n] * c for n, c in cost.items() if n in WEIGHTS) / sum(
        WEIGHTS[n] for n in cost if n in WEIGHTS)
    return (per_sample / raw if raw > 0 else 1.0), per_sample


def _summarise(logs: list[list[dict]], cfg: ProcessRun) -> dict:
    """Per step: wall here, the slowest rank's makespan, work, data wait; tokens of all ranks.

    Every rank gets the command to run together after the warm-up's last barrier, so the first
    measured step begins at the earliest rank's start."""
    steps = len(logs[0])
    began = min(log[0]["start"] for log in logs)
    ends = np.array([[log[s]["end"] for log in logs] for s in range(steps)]).max(axis=1)
    walls = np.diff(np.concatenate([[began], ends]))
    span = np.array([max(log[s]["span"] for log in logs) for s in range(steps)])
    work = np.array([max(log[s]["work"] for log in logs) for s in range(steps)])
    mean_work = np.array([np.mean([log[s]["work"] for log in logs]) for s in range(steps)])
    tokens = np.array([sum(log[s]["tokens"] for log in logs) for s in range(steps)])
    sim_step = walls / cfg.dilation  # seconds on the simulated cluster
    stall = np.maximum(0.0, sim_step - span)
    return {"tokens": float(tokens.sum()), "samples": int(sum(l["samples"] for log in logs for l in log)),
            "step": float(sim_step.sum()), "work": float(work.sum()),
            "mean_work": float(mean_work.sum()), "bubble": float((span - work).sum()),
            "stall": float(stall.sum()), "wait_here_s": float(sum(l["wait"] for log in logs for l in log)),
            "curve": [(float(t), float(k)) for t, k in zip(np.cumsum(sim_step), np.cumsum(tokens))]}


def run_processes(cfg: ProcessRun) -> dict[str, dict]:
    """Both systems through ``cfg``: summed step parts (simulated seconds) and tokens."""
    from benchmarks.fleet import _cluster_host_main

    sources = e2e_sources()
    meta = e2e_metadata(sources)
    loading_ranks = cfg.dp * min(cfg.pp, 2)
    workers = max(1, int(cfg.cores_here // loading_ranks))
    out = {}
    logs = _run_drivers(cfg, _baseline_main, (workers,))
    out["baseline"] = _summarise(logs, cfg)
    out["baseline"]["workers"] = workers
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    host = ctx.Process(target=_cluster_host_main,
                       args=(sources, _plan(cfg, sources, meta), "e2e", int(cfg.cores_here), there))
    # the loaders build DecodeInterleaved only from a module they trust; the spawned cluster host
    # reads its configuration from the environment, and its nannies hand it to the workers
    trusted = "DASK_MDATA__WORKERS__TRUSTED_MODULES"
    before = os.environ.get(trusted)
    os.environ[trusted] = "benchmarks.e2e_data"
    try:
        host.start()
    finally:
        if before is None:
            os.environ.pop(trusted)
        else:
            os.environ[trusted] = before
    try:
        if not here.poll(300):
            raise TimeoutError("the mdata cluster did not start within 300 s")
        kind, value = here.recv()
        if kind == "error":
            raise RuntimeError(f"mdata cluster: {value}")
        workers = value[2]  # the loader and constructor processes (the scheduler is charged apart)
        cpu = [0.0, 0.0]

        def on_measure(i: int) -> None:
            cpu[i] = cpu_seconds(workers)

        logs = _run_drivers(cfg, _mdata_main, (value[0], "e2e"), on_measure)
        out["mdata"] = _summarise(logs, cfg)
        out["mdata"]["worker_cpu_s"] = cpu[1] - cpu[0]
    finally:
        try:
            here.send(("stop",))
        except OSError:
            pass
        host.join(timeout=60)
        if host.is_alive():
            host.kill()
            host.join()
    return out


def _stage_aware_figures(meta, cost, quick: bool) -> dict[str, object]:
    """mdata's step seconds with the Planner balancing every pipeline stage (module costs) against
    balancing one scalar cost, same draw, same simulated trainer (1,024 GPUs)."""
    steps, out = (2 if quick else 4), {}
    for pp in ((8,) if quick else (4, 8)):
        s = Setup(weights=WEIGHTS, pp=pp)
        by_stage = simulate(replace(s, by_stage=True), meta, cost, steps)["mdata"]["step"]
        scalar = simulate(s, meta, cost, steps)["mdata"]["step"]
        out[f"e2e.stage_aware_gain_pp{pp}"] = figure(
            by_stage, scalar, unit="s", goal="> 1 (ratio)",
            note=(f"sim at {s.gpus} GPUs, dp {s.dp} x tp {s.tp} x pp {pp} x cp {s.cp}, {steps} steps: "
                  "summed step seconds, ModuleCost (balance by stage) vs CombinedCost (scalar)"))
    return out


def run(quick: bool, figures_so_far: Mapping[str, object] | None = None) -> dict[str, object]:
    """``figures_so_far``: the run's earlier figures; the control plane's, when it ran, say what
    mdata's scheduler costs a simulated step (else a small sweep measures it here)."""
    from benchmarks.e2e_control import from_figures, measure

    control = from_figures(figures_so_far or {}) or measure(quick)
    sources = e2e_sources()
    meta = e2e_metadata(sources)
    cost = loader_cost_per_sample(sources, chunks=1 if quick else 3)
    cores = float(len(os.sched_getaffinity(0)))
    cfg = ProcessRun(cores_here=cores, steps=2 if quick else 4, micro_batches=2 if quick else 4,
                     time_scale=0.1 if quick else 1.0)
    figures: dict[str, object] = {}
    measured = run_processes(cfg)
    ours, base = measured["mdata"], measured["baseline"]
    split = ratio_breakdown(ours, base)
    setup_note = (f"{cfg.model.name} on {cfg.gpus} simulated {cfg.gpu.name} (dp {cfg.dp} x pp {cfg.pp}), "
                  f"{cfg.micro_batches} x {cfg.max_tokens} tokens per DP rank, {cfg.steps} steps; "
                  f"{cores:g} cores here for {cfg.gpus} x {cfg.node.loader_cores_per_gpu:g} on a "
                  f"{cfg.node.name}: compute dilated {cfg.dilation:.3g}x"
                  + ("; quick: dilation x0.1" if quick else "")
                  + f"; baseline {base['workers']} DataLoader workers per loading rank")
    figures["e2e.tokens_per_s"] = figure(ours["tokens"] / ours["step"], base["tokens"] / base["step"],
                                         unit="tokens/s", goal="reference design: up to 4.5x",
                                         note=setup_note)
    for part in ("balance", "bubbles", "data_stalls", "flops_per_token"):
        figures[f"e2e.breakdown.{part}"] = figure(split[part], goal="> 1 is mdata's gain",
                                                  note="factor of e2e.tokens_per_s.ratio (product)")
    for side, x in (("mdata", ours), ("baseline", base)):
        for part in ("work", "bubble", "stall"):
            figures[f"e2e.seconds.{part}.{side}"] = x[part]
    _CURVES.update(mdata=ours["curve"], baseline=base["curve"])
    CURVES_FILE.parent.mkdir(parents=True, exist_ok=True)
    CURVES_FILE.write_text(json.dumps(_CURVES))

    factor, per_sample = mdata_cpu_factor(ours, cost)
    factor = max(1.0, factor)  # never charged below the raw path (a short run can read low)
    figures["e2e.mdata_cpu_per_sample_factor"] = figure(
        factor, unit="x", note=(f"mdata's loader and constructor CPU per received sample in the process "
                                f"run ({1e3 * per_sample:.1f} ms) over the raw load_chunk cost of the mix; "
                                "charged to mdata's loaders in the at-scale simulation"))
    figures.update(at_scale_figures(meta, cost, quick, control, mdata_cpu_factor=factor))
    figures.update(_stage_aware_figures(meta, cost, quick))
    for name, c in cost.items():
        figures[f"e2e.loader_cpu_ms_per_sample.{name}"] = 1e3 * c
    return figures
