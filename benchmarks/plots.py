"""PNG plots of the benchmark figures, written into ``docs/benchmarks/`` (generated, not committed).

    python benchmarks/plots.py --json figures.json [--out docs/benchmarks]

* the headline plots of ``benchmarks/plots_e2e.py`` (``e2e_throughput.png``, ``e2e_breakdown.png``,
  ``e2e_sim_ratio.png``) and ``benchmarks/plots_memory.py`` (``memory_vs_sources.png``,
  ``memory_vs_row_group.png``), when the JSON has their figures.
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

from benchmarks.plot_files import OUT, pyplot, save  # noqa: E402


def plot_balance(figures: dict, out: Path) -> Path | None:
    rows = sorted((m.group(1), int(m.group(2)), k) for k in figures
                  if (m := re.fullmatch(r"balance\.makespan_vs_lb_(\d+k)_dp(\d+)", k)))
    if not rows:
        return None
    plt = pyplot()
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
    return save(plt, fig, out / "balance_makespan.png")


def plot_mixture(out: Path, steps: int = 200) -> Path:
    from benchmarks.mixture import GLOBAL_BATCH, _deviation, realised_counts

    result = realised_counts(steps)
    target = result.pop("_weights")[0]
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, (counts, _) in result.items():
        ax.plot(_deviation(counts, target), lw=1, label=name)
    ax.axhline(2 / GLOBAL_BATCH, color="grey", lw=0.8, ls=":", label="2 / global batch")
    ax.set(xlabel="step", ylabel="max |realised - weight|", yscale="log",
           title=f"Mixture per step ({GLOBAL_BATCH} samples)")
    ax.legend()
    return save(plt, fig, out / "mixture_deviation.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="figures written by benchmarks/run.py --json")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    figures = json.loads(Path(args.json).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from benchmarks import plots_e2e, plots_memory

    made = [*plots_e2e.plot_all(figures, out), plots_memory.plot_memory_vs_sources(figures, out),
            plots_memory.plot_memory_vs_row_group(figures, out), plot_balance(figures, out),
            plot_mixture(out)]
    for path in made:
        if path is not None:
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
