"""PNG plots of the benchmark figures, written into ``docs/benchmarks/`` (generated, not committed).

    python benchmarks/plots.py --json figures.json [--out docs/benchmarks]

* ``memory_sweep.png`` — loader-side PSS against the number of sources, baseline beside mdata
  (from the ``memory.loader_pss_mb_<n>_sources`` figures of the JSON).
* ``balance_makespan.png`` — step makespan over the lower bound per DP size and context, mdata
  beside the per-rank greedy packer (``balance.makespan_vs_lb_<ctx>_dp<n>``).
* ``mixture_deviation.png`` — per-step max |realised fraction - weight| for mdata, the
  DataLoader baseline and torchdata (recomputed: :func:`benchmarks.mixture.realised_counts`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

OUT = HERE.parent / "docs" / "benchmarks"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    """Write one figure as PNG and free it (every plot ends the same way)."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_memory(figures: dict, out: Path) -> Path | None:
    points = sorted((int(m.group(1)), k) for k in figures
                    if (m := re.fullmatch(r"memory\.loader_pss_mb_(\d+)_sources", k)))
    points = [(n, k) for n, k in points if figures.get(f"{k}.baseline") is not None]
    if not points:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [n for n, _ in points]
    ax.plot(xs, [figures[f"{k}.baseline"] for _, k in points], "o-", label="per-rank DataLoaders")
    mdata = [(n, figures[k]) for n, k in points if figures.get(k) is not None]
    if mdata:
        ax.plot([n for n, _ in mdata], [v for _, v in mdata], "s-", label="mdata")
    ax.set(xscale="log", xlabel="sources", ylabel="loader-side PSS (MiB)",
           title="Loader memory vs number of sources")
    ax.legend()
    return _save(plt, fig, out / "memory_sweep.png")


def plot_balance(figures: dict, out: Path) -> Path | None:
    rows = sorted((m.group(1), int(m.group(2)), k) for k in figures
                  if (m := re.fullmatch(r"balance\.makespan_vs_lb_(\d+k)_dp(\d+)", k)))
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for ctx in sorted({r[0] for r in rows}):
        sel = [(dp, k) for c, dp, k in rows if c == ctx]
        ax.plot([d for d, _ in sel], [figures[k] for _, k in sel], "s-", label=f"mdata {ctx}")
        ax.plot([d for d, _ in sel], [figures[f"{k}.baseline"] for _, k in sel], "o--",
                label=f"greedy per rank {ctx}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xscale="log", xlabel="DP ranks", ylabel="step makespan / lower bound",
           title="Balancing on the corpus's token lengths")
    ax.legend()
    return _save(plt, fig, out / "balance_makespan.png")


def plot_mixture(out: Path, steps: int = 200) -> Path:
    from benchmarks.mixture import GLOBAL_BATCH, _deviation, realised_counts

    result = realised_counts(steps)
    target = result.pop("_weights")[0]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (counts, _) in result.items():
        ax.plot(_deviation(counts, target), lw=1, label=name)
    ax.axhline(2 / GLOBAL_BATCH, color="grey", lw=0.8, ls=":", label="2 / global batch")
    ax.set(xlabel="step", ylabel="max |realised - weight|", yscale="log",
           title=f"Mixture per step ({GLOBAL_BATCH} samples)")
    ax.legend()
    return _save(plt, fig, out / "mixture_deviation.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="figures written by benchmarks/run.py --json")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    figures = json.loads(Path(args.json).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for path in (plot_memory(figures, out), plot_balance(figures, out), plot_mixture(out)):
        if path is not None:
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
