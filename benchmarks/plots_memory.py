"""PNG plots of the memory figures (generated into a folder you name; never committed).

    python benchmarks/plots_memory.py --json figures.json --out /tmp/plots

* ``memory_vs_sources.png`` -- peak loader memory each system adds against the number of sources
  (``memory.loader_pss_mb_<n>_sources``), log-log; the baseline's points are projections from
  measured per-rank and per-worker costs (see ``benchmarks/memory.py``) and are drawn dashed.
* ``memory_vs_row_group.png`` -- the same against the Parquet row-group size
  (``memory.loader_pss_mb_rg<mb>``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

__all__ = ["plot_memory_vs_row_group", "plot_memory_vs_sources"]


def _series(figures: dict, pattern: str) -> list[tuple[int, float | None, float | None]]:
    rows = []
    for key in figures:
        m = re.fullmatch(pattern, key)
        if m:
            rows.append((int(m.group(1)), figures.get(key), figures.get(f"{key}.baseline")))
    return sorted(rows)


def _plot(rows, out: Path, *, xlabel: str, title: str, name: str, xlog: bool) -> Path | None:
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    base = [(x, b) for x, _, b in rows if b is not None]
    ours = [(x, m) for x, m, _ in rows if m is not None]
    if base:
        ax.plot(*zip(*base), "o--", label="per-rank DataLoaders (projected)")
    if ours:
        ax.plot(*zip(*ours), "s-", label="mdata (measured)")
    ax.set(xlabel=xlabel, ylabel="peak PSS added (MiB)", yscale="log", title=title)
    if xlog:
        ax.set_xscale("log", base=2)
    ax.legend()
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_memory_vs_sources(figures: dict, out: Path) -> Path | None:
    """Peak memory added against the number of sources; None when the JSON has no sweep."""
    return _plot(_series(figures, r"memory\.loader_pss_mb_(\d+)_sources"), Path(out),
                 xlabel="sources", title="Loader memory vs sources", name="memory_vs_sources.png",
                 xlog=True)


def plot_memory_vs_row_group(figures: dict, out: Path) -> Path | None:
    """Peak memory added against the row-group size (MiB); None when the JSON has no sweep."""
    return _plot(_series(figures, r"memory\.loader_pss_mb_rg(\d+)"), Path(out),
                 xlabel="Parquet row group (MiB decoded)", title="Loader memory vs row-group size",
                 name="memory_vs_row_group.png", xlog=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="figures written by benchmarks/run.py --json")
    parser.add_argument("--out", required=True, help="folder for the PNGs")
    args = parser.parse_args(argv)
    figures = json.loads(Path(args.json).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for path in (plot_memory_vs_sources(figures, out), plot_memory_vs_row_group(figures, out)):
        if path is not None:
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
