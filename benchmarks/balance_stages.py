"""Balancing by stage at PP 4 and 8: module costs against one summed cost, same samples.

A vision-language step (LLaVA-OneVision 7B's sizes, ``benchmarks/e2e_model.py``) of about
``dp x micro_batches`` full micro-batches of a 16k context, drawn from an MM1-like mix by samples
(captions : interleaved : text = 5 : 5 : 1): a caption sample is one image of 256 to 729 patches
and a short caption; an interleaved document holds a Poisson(2.5) number of images (1 to 6, 256
to 1500 patches each) and a lognormal text; text documents are lognormal with a heavy tail. Image
patches are language-model tokens too.

Both sides are the Planner's own balancers on the same samples, with the cost model a user would
configure (:func:`benchmarks.e2e_model.planner_cost`):

* **baseline**: one cost per sample (``CombinedCost`` of the language model and the vision
  encoder) and the pipeline-aware scalar balancer (``balance_step(..., stages=pp)``);
* **mdata**: the same two models as a ``ModuleCost`` (encoder on stage 0, language model over all
  stages) and ``balance_step_by_stage``.

Each is timed by the benchmark's own trainer model, not the balancer's: ``stage_seconds`` (the
vision encoder's real windowed attention on stage 0, the language model split evenly) and the
op-by-op 1F1B simulation ``one_f_one_b``, micro-batches in the order each balancer numbered
them. A step lasts as long as its slowest DP rank; the figure is the ratio of summed step times.
``planner.balance_by_stage_ms_per_step``: what balancing by stage costs the Planner per step.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from benchmarks.e2e_model import GPU, MODELS, one_f_one_b, planner_cost, stage_seconds
from benchmarks.harness import figure
from mdata.balance import balance_step, balance_step_by_stage

__all__ = ["draw_vlm_step", "stage_figures"]

CONTEXT = 16384
MODEL = MODELS["llava-ov-7b"]


def draw_vlm_step(rng: np.random.Generator, tokens_wanted: int,
                  context: int = CONTEXT) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample ``(tokens, patches)`` of one step of about ``tokens_wanted`` tokens."""
    toks: list[int] = []
    pats: list[int] = []
    total = 0
    while total < tokens_wanted:
        kind = rng.choice(3, p=[5 / 11, 5 / 11, 1 / 11])
        if kind == 0:  # a captioned image
            p = int(rng.integers(256, 730))
            t = p + int(rng.integers(20, 81))
        elif kind == 1:  # an interleaved document
            images = int(np.clip(rng.poisson(2.5), 1, 6))
            p = int(rng.integers(256, 1501, images).sum())
            t = p + int(rng.lognormal(6.0, 1.0))
        else:  # text
            p = 0
            t = int(max(16, rng.lognormal(7.0, 1.2)))
        t = min(t, context)
        toks.append(t)
        pats.append(min(p, t))
        total += t
    return np.asarray(toks, np.int64), np.asarray(pats, np.int64)


def _step_seconds(a, tokens: np.ndarray, patches: np.ndarray, pp: int) -> float:
    """The slowest DP rank's 1F1B seconds, micro-batches in their numbered order."""
    spans = []
    for r in range(a.dp):
        mbs = [(tokens[idx], patches[idx]) for idx in
               (a.members(r, k) for k in range(a.num_micro_batches))]
        spans.append(one_f_one_b(stage_seconds(mbs, MODEL, GPU(), pp=pp)))
    return max(spans)


def stage_gain(pp: int, dp: int, steps: int, seed: int) -> dict[str, float]:
    """Summed step seconds of both sides over ``steps`` steps, and the by-stage makespan/LB."""
    rng = np.random.default_rng(seed)
    m = 2 * pp
    scalar_cost, module_cost = planner_cost(MODEL), planner_cost(MODEL, by_stage=True)
    ours = base = over_lb = 0.0
    for step in range(steps):
        tokens, patches = draw_vlm_step(rng, int(0.9 * dp * m * CONTEXT))
        flat = balance_step(tokens, scalar_cost(tokens, patches), dp=dp, micro_batches=m,
                            max_tokens=CONTEXT, seed=step, stages=pp)
        staged = balance_step_by_stage(tokens, module_cost.stage_costs(tokens, patches, pp),
                                       dp=dp, micro_batches=m, max_tokens=CONTEXT, seed=step)
        base += _step_seconds(flat, tokens, patches, pp)
        ours += _step_seconds(staged.assignment, tokens, patches, pp)
        over_lb += staged.makespan_over_lower_bound / steps
    return {"mdata": ours, "baseline": base, "over_lb": over_lb}


def planning_ms(dp: int, pp: int, m: int, context: int, repeats: int) -> tuple[float, float]:
    """Median wall ms of balancing one step by stage, and of the scalar balancer on it."""
    rng = np.random.default_rng(11)
    cost = planner_cost(MODEL, by_stage=True)
    ours, base = [], []
    for step in range(repeats):
        tokens, patches = draw_vlm_step(rng, int(0.9 * dp * m * context), context)
        sc = cost.stage_costs(tokens, patches, pp)
        began = time.perf_counter()
        balance_step(tokens, sc.sum(axis=1), dp=dp, micro_batches=m, max_tokens=context,
                     seed=step, stages=pp)
        middle = time.perf_counter()
        balance_step_by_stage(tokens, sc, dp=dp, micro_batches=m, max_tokens=context, seed=step)
        ours.append(time.perf_counter() - middle)
        base.append(middle - began)
    return 1e3 * statistics.median(ours), 1e3 * statistics.median(base)


def stage_figures(quick: bool) -> dict[str, object]:
    """``balance.stage_aware_gain_pp4`` and ``_pp8``: scalar step time over by-stage step time."""
    steps = 2 if quick else 8
    dp = 8
    figures: dict[str, object] = {}
    for pp in (4, 8):
        got = stage_gain(pp, dp, steps, seed=pp)
        figures[f"balance.stage_aware_gain_pp{pp}"] = figure(
            got["mdata"], got["baseline"], unit="s", goal="> 1 (ratio)",
            note=(f"{MODEL.name}, dp {dp} x pp {pp}, {2 * pp} x 16k micro-batches, MM1-like mix, "
                  f"{steps} steps; summed step seconds by stage vs scalar cost (pipeline-aware); "
                  f"by-stage makespan / its lower bound {got['over_lb']:.3f} (the bound has no "
                  f"pipeline bubble)"))
    repeats = 1 if quick else 3
    ours, base = planning_ms(16, 8, 32, 32768, repeats)
    figures["planner.balance_by_stage_ms_per_step"] = figure(
        ours, base, unit="ms", goal="well under a step's seconds",
        note=(f"dp 16 x pp 8, 32 x 32k micro-batches (~8.5k samples, the e2e sim's shape at "
              f"1,024 GPUs), median of {repeats}; baseline: the scalar balancer on the same step"))
    return figures
