"""The end-to-end benchmark's at-scale figures: mdata beside four baselines, per regime, seeds.

Why a module of its own: ``benchmarks/e2e.py`` runs the processes; this turns
:func:`benchmarks.e2e_sim.simulate` into the figures ``docs/benchmarks-e2e.md`` reports, all
from one run: for every regime and baseline the ratio of mdata's tokens/s over the baseline's
(the mean over seeds, with its spread), its factors, the tokens per step on both sides (equal
work: within 1%), the micro-batch counts, and mdata's tokens/s over the ideal.

Regimes (``REGIMES``): ``vlm`` (the e2e mix of ``benchmarks/e2e_data.py``, 32k context,
TP 4 x PP 4 x CP 2) and the long-short text matrix ``text4k``, ``text8k``, ``text16k`` and
``text32k`` (its text sources only: whole plays and poems with a tail past 32k tokens, Python
modules, play scenes; TP 4 x PP 4, CP 1 at 4k and 8k, 2 at 16k, 4 at 32k, so no GPU holds more
than 8k tokens of a sequence) and ``video`` (:data:`VIDEO`: the corpus's clips decoded for real,
8 frames of 378 x 378, beside single images, interleaved documents and text, after
LLaVA-OneVision's OneVision stage; TP 4 x PP 4 x CP 2 as ``vlm``) and ``sources306`` (``vlm``'s
job on 306 sources, as the reference design's largest set: the real rows of ``vlm``'s five cut
into disjoint pieces of 4-5 rows, each source's weight split over its pieces by Zipf's law,
:mod:`benchmarks.e2e_many_sources`); all ``llava-ov-7b`` with 2 x PP micro-batches of the context per
DP rank, 90% full on average. A regime's figure is at 1,024 GPUs (quick runs too); full runs
add 4,096 and 8,192 GPUs (``.<gpus>`` suffix) and the interleaved schedule
(``vlm_interleaved``: 2 model chunks per device, at 1,024 GPUs).

Beside the node's loader budget (:class:`~benchmarks.e2e_model.Node`: a DGX H100's 12 loader
cores per GPU) every regime at 1,024 GPUs is swept over loader cores per GPU (``CORES_SWEEP``;
quick runs: 1 core only) on the same draw and plans: ``e2e.cores_sweep.<regime>.<cores>.``
``ratio.<baseline>`` and ``.stall.<side>`` (the share of that side's step seconds spent
waiting for data), so each regime is a curve against the baselines' stalls, not one point;
``e2e.cores_sweep.<regime>.stall_onset.<side>``: the budget below which that side stalls.
A fractional core count is written with ``_`` (``0_5``: half a core per GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from benchmarks.e2e_baselines import BASELINES
from benchmarks.e2e_control import ControlCost
from benchmarks.e2e_data import WEIGHTS, with_videos
from benchmarks.e2e_sim import PARTS, Setup, simulate
from benchmarks.harness import figure
from mdata.metadata import SourceMetadata

__all__ = ["CORES_SWEEP", "REGIMES", "VIDEO", "at_scale_figures", "cores_key", "regime_runs"]

TEXT = {n: (1.0 if n in ("books", "code", "scenes") else 0.0) for n in WEIGHTS}
#: The video regime's mix, by samples: LLaVA-OneVision's OneVision stage (Li et al., 2024) holds
#: 1.6M samples, 0.35M of them video and 0.56M multi-image, the rest (about 0.69M) single
#: images: videos : interleaved : captions = 3.5 : 5.6 : 6.9; plus the ``vlm`` mix's one unit of
#: text-only samples (books, code, scenes, 1/3 each), so the language model keeps seeing text.
VIDEO = {"captions": 6.9, "interleaved": 5.6, "books": 1 / 3, "code": 1 / 3, "scenes": 1 / 3,
         "videos": 3.5}
REGIMES: dict[str, Setup] = {
    "vlm": Setup(weights=WEIGHTS),
    "text4k": Setup(weights=TEXT, cp=1, max_tokens=4096),
    "text8k": Setup(weights=TEXT, cp=1, max_tokens=8192),
    "text16k": Setup(weights=TEXT, cp=2, max_tokens=16384),
    "text32k": Setup(weights=TEXT, cp=4, max_tokens=32768),
    "video": Setup(weights=VIDEO),
    "sources306": Setup(weights=WEIGHTS, pieces=306),
}
HEADLINE_GPUS = 1024
MORE_GPUS = (4096, 8192)
#: Loader cores per GPU swept at the headline size (the node's own, 12, included); below one
#: core stands for loading that costs more per sample than measured here (remote reads, slower cores).
CORES_SWEEP = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 12.0)
QUICK_CORES_SWEEP = (1.0,)
GOALS = {"local_best": ">= 1.0 (what the global view earns)", "megatron": "report what comes out",
         "dataloader": "report what comes out", "bridge": "report what comes out"}


def regime_runs(setup: Setup, meta: Mapping[str, SourceMetadata], cost: Mapping[str, float],
                steps: int, seeds: tuple[int, ...], loader_cores: tuple[float, ...] = ()) -> list[dict]:
    """:func:`simulate` once per seed (``loader_cores``: the budgets per GPU to sweep)."""
    return [simulate(replace(setup, seed=s), meta, cost, steps, loader_cores) for s in seeds]


def cores_key(cores: float) -> str:
    """A loader budget as a figure name part: ``12``, ``0_5`` (no dot: names split on dots)."""
    return f"{cores:g}".replace(".", "_")


def _sweep_figures(key: str, setup: Setup, runs: list[dict]) -> dict[str, object]:
    """One regime's loader-cores sweep: per budget, mdata's ratio over each baseline and each
    side's stall fraction (data-wait seconds over step seconds), means over the seeds."""
    out: dict[str, object] = {}
    for c in sorted(runs[0]["cores_sweep"]):
        at = [r["cores_sweep"][c] for r in runs]
        name = f"e2e.cores_sweep.{key}.{cores_key(c)}"
        stalls = {side: float(np.mean([a[side]["stall"] / a[side]["step"] for a in at]))
                  for side in ("mdata", *BASELINES)}
        for b in BASELINES:
            ratios = np.array([a["ratio"][b]["ratio"] for a in at])
            out[f"{name}.ratio.{b}"] = figure(
                float(ratios.mean()), goal=GOALS[b],
                note=(f"{c:g} loader cores per GPU ({setup.node.name} gives "
                      f"{setup.node.loader_cores_per_gpu:g}); seeds {ratios.min():.3f}-{ratios.max():.3f}; "
                      f"stall share of the step: mdata {stalls['mdata']:.3f}, {b} {stalls[b]:.3f}"))
        for side, v in stalls.items():
            out[f"{name}.stall.{side}"] = v
    for side in ("mdata", *BASELINES):
        out[f"e2e.cores_sweep.{key}.stall_onset.{side}"] = figure(
            max(r[side]["stall_onset_cores"] for r in runs), unit="cores/GPU",
            note=f"{side}: below this many loader cores per GPU some step of some seed waits for "
                 f"its data (its loading over its step; mdata's scheduler aside)")
    return out


def _figures(key: str, setup: Setup, runs: list[dict], steps: int) -> dict[str, object]:
    """One regime's figures from its runs (one per seed)."""
    out: dict[str, object] = {}
    shape = runs[0]["shape"]
    counts = ", ".join(f"{k} {max(r['shape'][f'micro_batches.{k}'] for r in runs)}"
                       for k in ("mdata", *BASELINES))
    base_note = (f"{setup.model.name}, {setup.gpus} GPUs: dp {setup.dp} x tp {setup.tp} x pp "
                 f"{setup.pp} x cp {setup.cp}" + (f", interleaved x{setup.virtual}" if setup.virtual > 1 else "")
                 + f", {shape['sources']} sources, layers {'/'.join(map(str, shape['layers']))}, {setup.max_tokens} context, "
                 f"{np.mean([r['shape']['tokens_per_step'] for r in runs]) / 1e6:.2f}M tokens/step, "
                 f"micro-batches per rank: {counts}; local_best kept the token packing (mdata's "
                 f"balancer needed more micro-batches) on {sum(r['shape'].get('local_best_fallbacks', 0) for r in runs)} "
                 f"of {len(runs) * steps * setup.dp} rank-steps; {steps} steps x {len(runs)} seeds")
    for name in BASELINES:
        ratios = np.array([r["ratio"][name]["ratio"] for r in runs])
        parts = {p: float(np.mean([r["ratio"][name][p] for r in runs])) for p in PARTS}
        tps = float(np.mean([r["ratio"][name]["tokens_per_step"] for r in runs]))
        out[f"e2e.ratio.{name}.{key}"] = figure(
            float(ratios.mean()), goal=GOALS[name],
            note=(f"seeds {ratios.min():.3f}-{ratios.max():.3f}; "
                  + ", ".join(f"{p.replace('_', ' ')} {v:.3f}" for p, v in parts.items())
                  + f"; tokens/step mdata over it {tps:.4f}; " + base_note))
        out[f"e2e.ratio.{name}.{key}.min"] = float(ratios.min())
        out[f"e2e.ratio.{name}.{key}.max"] = float(ratios.max())
        for p, v in parts.items():
            out[f"e2e.breakdown.{name}.{key}.{p}"] = v
        out[f"e2e.tokens_per_step_ratio.{name}.{key}"] = figure(tps, goal="0.99-1.01 (equal work)")
    per_base = {b: float(np.mean([r["ratio"][b]["tokens_per_step"] for r in runs])) for b in BASELINES}
    worst = max(per_base, key=lambda b: abs(per_base[b] - 1.0))
    out[f"e2e.tokens_per_step_ratio.{key}"] = figure(
        per_base[worst], goal="0.99-1.01 (equal work)",
        note=(f"mdata's tokens per step over each baseline's, the one furthest from 1 ({worst}); "
              + ", ".join(f"{b} {v:.4f}" for b, v in per_base.items())
              + "; dataloader's budget is samples, not tokens, so its tokens follow its draw"))
    ideal = np.array([r["vs_ideal"] for r in runs])
    out[f"e2e.vs_ideal.{key}"] = figure(
        float(ideal.mean()), goal=">= 0.97",
        note=f"seeds {ideal.min():.3f}-{ideal.max():.3f}; ideal: mdata's work, perfect balance, "
             f"no stall, same pipeline; " + base_note)
    for side in ("mdata", *BASELINES):
        out[f"e2e.micro_batches.{side}.{key}"] = max(r["shape"][f"micro_batches.{side}"] for r in runs)
    out[f"e2e.tokens_per_step.{key}"] = float(np.mean([r["shape"]["tokens_per_step"] for r in runs]))
    out[f"e2e.fixed_s_per_step.{key}"] = float(shape["fixed_s"])
    mdata = [r["mdata"] for r in runs]
    out[f"e2e.network_s_per_step.{key}"] = figure(
        float(np.mean([m.get("network", 0.0) / m["steps"] for m in mdata])), unit="s",
        note=(f"what mdata's batches need of each node's data NIC per step "
              f"({setup.nic_bytes_per_s * 8 / 1e9:g} Gb/s; loader to constructor and to each "
              f"receiving rank), against a step of "
              f"{np.mean([m['step'] / m['steps'] for m in mdata]):.2f} s"))
    return out


def at_scale_figures(meta: Mapping[str, SourceMetadata], cost: Mapping[str, float],
                     quick: bool, control: ControlCost | None = None,
                     mdata_cpu_factor: float = 1.0) -> dict[str, object]:
    """Every regime at 1,024 GPUs with its loader-cores sweep (full runs: also 4,096 and 8,192,
    and interleaved 1F1B); ``control``: what mdata's scheduler costs a step (charged to mdata;
    None: not charged); ``mdata_cpu_factor``: mdata's loader CPU per sample over the raw cost
    (:attr:`~benchmarks.e2e_sim.Setup.mdata_cpu_factor`, measured in the process run)."""
    steps, seeds = (2, (0, 1)) if quick else (4, (0, 1, 2))
    sweep = QUICK_CORES_SWEEP if quick else CORES_SWEEP
    meta, cost, out = with_videos(meta, cost, quick)  # the video regime's source, when missing
    cases: list[tuple[str, Setup]] = []
    for name, setup in REGIMES.items():
        cases.append((name, replace(setup, gpus=HEADLINE_GPUS)))
        if not quick:
            cases += [(f"{name}.{g}", replace(setup, gpus=g)) for g in MORE_GPUS]
    if not quick:
        cases.append(("vlm_interleaved", replace(REGIMES["vlm"], gpus=HEADLINE_GPUS, virtual=2)))
    for key, setup in cases:
        setup = replace(setup, control=control, mdata_cpu_factor=mdata_cpu_factor)
        headline = key in REGIMES  # a regime at the headline size: its loader-cores sweep too
        runs = regime_runs(setup, meta, cost, steps, seeds, sweep if headline else ())
        out.update(_figures(key, setup, runs, steps))
        if headline:
            out.update(_sweep_figures(key, setup, runs))
        if control is not None:
            stall = float(np.mean([r["mdata"].get("control", 0.0) / r["mdata"]["steps"] for r in runs]))
            step = float(np.mean([r["mdata"]["step"] / r["mdata"]["steps"] for r in runs]))
            out[f"e2e.scheduler_s_per_step.{key}"] = figure(
                control.step_seconds(setup.gpus, setup.dp, setup.tp, setup.node.gpus), unit="s",
                note=f"{setup.gpus} GPUs, {setup.dp} DP groups, TP {setup.tp}; {control.describe()}")
            out[f"e2e.scheduler_stall_s_per_step.{key}"] = figure(
                stall, unit="s", goal="0 (the scheduler keeps up)",
                note=f"what mdata's step waited for its scheduler, of {step:.2f} s per step")
    return out
