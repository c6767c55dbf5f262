"""Shared benchmark harness: named figures, medians of repetitions, a side-by-side table.

A benchmark module (``benchmarks/<name>.py``) exposes ``run(quick: bool) -> dict``. Each value is
either a number (a figure of mdata alone) or a :func:`figure` dict holding mdata's value, the
baseline's value measured in the same run, their ratio and the goal. These machines are noisy:
modules report medians of >= 3 repetitions and ratios computed within one run.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any


def figure(mdata: float, baseline: float | None = None, *, ratio: float | None = None,
           goal: str = "", unit: str = "", note: str = "") -> dict[str, Any]:
    """One row of the table: mdata's value beside the baseline's, with their ratio and the goal."""
    if ratio is None and baseline is not None and mdata not in (0, None):
        ratio = baseline / mdata if unit in ("ms", "s", "mb", "MB", "cost") else mdata / baseline
    return {"mdata": mdata, "baseline": baseline, "ratio": ratio, "goal": goal, "unit": unit, "note": note}


def median_of(fn: Callable[[], float], repeats: int = 3) -> float:
    """Median of ``repeats`` calls of ``fn`` (each returns one measurement)."""
    return float(statistics.median(fn() for _ in range(max(1, repeats))))


def time_median(fn: Callable[[], Any], repeats: int = 3) -> float:
    """Median wall time of ``fn`` in seconds over ``repeats`` calls."""
    def once() -> float:
        began = time.perf_counter()
        fn()
        return time.perf_counter() - began

    return median_of(once, repeats)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return str(value)
        return f"{value:.4g}"
    return str(value)


def flatten(figures: dict[str, Any]) -> dict[str, Any]:
    """JSON form: figure name -> number; a side-by-side figure adds ``.baseline`` and ``.ratio``."""
    out: dict[str, Any] = {}
    for name, value in figures.items():
        if isinstance(value, dict):
            out[name] = value.get("mdata")
            if value.get("baseline") is not None:
                out[f"{name}.baseline"] = value["baseline"]
            if value.get("ratio") is not None:
                out[f"{name}.ratio"] = value["ratio"]
        else:
            out[name] = value
    return out


def render_table(figures: dict[str, Any]) -> str:
    lines = ["| figure | mdata | baseline | ratio | goal | note |", "|---|---:|---:|---:|---|---|"]
    for name, value in figures.items():
        if isinstance(value, dict):
            unit = f" {value['unit']}" if value.get("unit") else ""
            lines.append(
                f"| {name} | {_fmt(value.get('mdata'))}{unit} | {_fmt(value.get('baseline'))} | "
                f"{_fmt(value.get('ratio'))} | {value.get('goal', '')} | {value.get('note', '')} |"
            )
        else:
            lines.append(f"| {name} | {_fmt(value)} | - | - | | |")
    return "\n".join(lines)
