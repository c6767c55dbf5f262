"""Plain-text views of a plan and of its simulation, for ``mdata plan show`` and ``mdata plan
simulate`` (a terminal has no Jupyter HTML; these say the same as ``Plan._repr_html_`` and
``SimulationResult._repr_html_``, in columns).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mdata.errors import PlanError

__all__ = ["plan_table", "simulation_report", "format_table"]


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned text columns, two spaces apart."""
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def _source_row(i: int, src: Any, weight: str) -> list[str]:
    if isinstance(src, str):
        return [str(i), src, "-", "-", weight, "-", "(name only)"]
    from mdata.spec import source_spec

    spec = source_spec(src)
    transform = spec.transform_type.rpartition(":")[2]
    return [str(i), spec.name, spec.format, str(spec.chunk_rows), weight, transform, spec.url]


def _mixture(plan) -> str:
    from mdata.spec.plan_spec import mixture_to_spec

    if plan._cfg.mixture is None:
        return "(not set)"
    spec = mixture_to_spec(plan._cfg.mixture)
    kind = spec["type"]
    if kind == "static":
        return "static"
    if kind == "staged":
        return f"staged: {len(spec['stages'])} stages from steps {[s['start'] for s in spec['stages']]}"
    if kind == "ramp":
        return f"linear ramp from step {spec['start']} to step {spec['end']}"
    return f"{kind} (metric-driven)" if getattr(plan._cfg.mixture, "stateful", False) else kind


def plan_table(plan) -> str:
    """Every setting of ``plan``: one row per source, then the job-wide settings."""
    cfg = plan._cfg
    try:
        weights = [f"{w:.3f}" for w in plan.mixture.weights_vector(0, cfg.names)]
    except PlanError:
        weights = ["-"] * len(cfg.names)
    sources = format_table(
        ["#", "source", "format", "chunk rows", "weight@0", "transform", "url"],
        [_source_row(i, s, w) for i, (s, w) in enumerate(zip(cfg.sources, weights))],
    )
    b = cfg.balance
    cost = plan.cost_model
    settings = [
        ("mixture", _mixture(plan)),
        ("cost", cost.describe() if hasattr(cost, "describe") else repr(cost)),
        ("balance", (f"{b.global_batch} samples/step, >= {b.micro_batches} micro-batches per DP rank "
                     f"of <= {b.max_tokens} tokens") if b else "(not set)"),
        ("mesh", plan.mesh.describe()),
        ("broadcast", str(cfg.broadcast)),
        ("seed", str(cfg.seed)),
        ("window", f"{cfg.window} steps"),
        ("shuffle", f"{cfg.shuffle_chunks} chunks"),
        ("special tokens", f"pad_id={cfg.pad_id}, image_token_id={cfg.image_token_id}"),
        ("fingerprint", plan.fingerprint()),
    ]
    return sources + "\n\n" + format_table(["setting", "value"], settings)


def _stats(values: np.ndarray) -> list[str]:
    return [f"{float(np.mean(values)):.4g}", f"{float(np.median(values)):.4g}", f"{float(np.max(values)):.4g}"]


def simulation_report(result, *, step_rows: int = 10) -> str:
    """Mixture and balance figures of a :class:`~mdata.planner.SimulationResult`."""
    n = int(result.steps.size)
    gb = result.global_batch
    cum_target = np.cumsum(gb * result.target_weights, axis=0)
    cum_counts = np.cumsum(result.counts, axis=0)
    deviation = np.abs(cum_counts - cum_target).max(axis=0)
    mixture = format_table(
        ["source", "target", "realised", "max cumulative deviation (samples)", "tokens/step"],
        [[name, f"{result.target_weights[:, j].mean():.3f}", f"{result.realized_weights[:, j].mean():.3f}",
          f"{deviation[j]:.2f}", f"{result.tokens[:, j].mean():.0f}"]
         for j, name in enumerate(result.names)],
    )
    dp = result.per_rank_cost.shape[1]
    balance = format_table(
        ["per step", "mean", "median", "max"],
        [["makespan / lower bound", *_stats(result.max_over_lower_bound)],
         ["makespan / mean rank cost", *_stats(result.max_over_mean)],
         ["micro-batches per rank", *_stats(result.num_micro_batches)],
         ["truncated samples", *_stats(result.truncated)],
         ["skipped samples", *_stats(result.skipped)]],
    )
    steps = format_table(
        ["step", "makespan", "lower bound", "max/LB", *result.names],
        [[str(r["step"]), f"{r['makespan']:.4g}", f"{r['lower_bound']:.4g}",
          f"{r['max_over_lower_bound']:.3f}", *(str(r[f"count/{name}"]) for name in result.names)]
         for r in result.to_records()[:step_rows]],
    )
    more = f"\n... {n - step_rows} more steps" if n > step_rows else ""
    return (f"simulated {n} steps: {gb} samples per step over {dp} DP ranks\n\n"
            f"mixture (fraction of each step's samples, averaged over the steps)\n{mixture}\n\n"
            f"balance (cost units; 1.0 is perfect)\n{balance}\n\n"
            f"first steps (samples per source)\n{steps}{more}")
