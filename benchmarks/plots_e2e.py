"""PNG plots of the end-to-end benchmark (generated, never committed).

    python benchmarks/plots_e2e.py --json figures.json [--out docs/benchmarks]

* ``e2e_throughput.png``: tokens trained against simulated seconds, both systems, from the last
  process run (``benchmarks/e2e.py`` writes the curves to ``.cache/mdata/bench-e2e``);
* ``e2e_breakdown.png``: the factors of the throughput ratio (process run, and each simulated
  regime over ``local_best``): balance, pipeline bubbles, data stalls, flops per token, the
  fixed part (all-reduce and optimizer);
* ``e2e_sim_ratio.png``: the simulated ratio over each baseline against GPU count (``vlm``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.plot_files import OUT, pyplot, save  # noqa: E402

PARTS = ("balance", "bubbles", "data_stalls", "flops_per_token", "fixed")


def plot_throughput(curves: dict, out: Path) -> Path | None:
    if not curves.get("mdata") or not curves.get("baseline"):
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, style in (("baseline", "o-"), ("mdata", "s-")):
        xs, ys = zip(*curves[name])
        ax.plot((0, *xs), (0, *(y / 1e6 for y in ys)), style,
                label="Megatron-style DataLoaders" if name == "baseline" else "mdata")
    ax.set(xlabel="simulated seconds", ylabel="tokens trained (millions)",
           title="Training progress, same data and trainer")
    ax.legend()
    return save(plt, fig, out / "e2e_throughput.png")


def plot_breakdown(figures: dict, out: Path) -> Path | None:
    groups = []
    if figures.get("e2e.breakdown.balance") is not None:
        groups.append(("processes", [figures.get(f"e2e.breakdown.{p}", 1.0) for p in PARTS]))
    for regime in sorted({m.group(1) for k in figures
                          if (m := re.fullmatch(r"e2e\.breakdown\.local_best\.([a-z0-9_]+)\.balance", k))}):
        groups.append((f"{regime} / local_best",
                       [figures[f"e2e.breakdown.local_best.{regime}.{p}"] for p in PARTS]))
    if not groups:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(PARTS)
    for j, part in enumerate(PARTS):
        ax.bar([i + j * width for i in range(len(groups))], [v[j] for _, v in groups], width,
               label=part.replace("_", " "))
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))], [g for g, _ in groups])
    ax.set(ylabel="factor of the throughput ratio (> 1: mdata gains)",
           title="Where the end-to-end ratio comes from")
    ax.legend(fontsize=8)
    return save(plt, fig, out / "e2e_breakdown.png")


def plot_sim_ratio(figures: dict, out: Path) -> Path | None:
    from benchmarks.e2e_baselines import BASELINES
    from benchmarks.e2e_scale import HEADLINE_GPUS

    lines = {}
    for name in BASELINES:
        pts = [(HEADLINE_GPUS, figures.get(f"e2e.ratio.{name}.vlm"))]
        pts += [(int(m.group(1)), v) for k, v in figures.items()
                if (m := re.fullmatch(rf"e2e\.ratio\.{name}\.vlm\.(\d+)", k))]
        lines[name] = sorted((g, v) for g, v in pts if v is not None)
    points = [p for pts in lines.values() for p in pts]
    if not points:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, pts in lines.items():
        ax.plot([g for g, _ in pts], [v for _, v in pts], "s-", label=f"mdata / {name}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="GPUs", ylabel="tokens/s ratio",
           title="Simulated end-to-end ratio against GPU count")
    ax.set_xticks(sorted({g for g, _ in points}), [str(g) for g in sorted({g for g, _ in points})])
    ax.legend()
    return save(plt, fig, out / "e2e_sim_ratio.png")


def plot_all(figures: dict, out: Path, curves: dict | None = None) -> list[Path]:
    """Every e2e plot that ``figures`` (flattened JSON) and ``curves`` have data for."""
    out.mkdir(parents=True, exist_ok=True)
    if curves is None:
        from benchmarks.e2e import CURVES_FILE

        curves = json.loads(CURVES_FILE.read_text()) if CURVES_FILE.exists() else {}
    made = [plot_throughput(curves, out), plot_breakdown(figures, out), plot_sim_ratio(figures, out)]
    return [p for p in made if p is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="figures JSON written by run.py --json")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    for path in plot_all(json.loads(Path(args.json).read_text()), Path(args.out)):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
