"""Where the benchmark plots go and how each is written: shared by ``benchmarks/plots.py`` and
``benchmarks/plots_e2e.py``.

Kept apart from both, so that the figure-wide entry point (:mod:`benchmarks.plots`, which draws
the end-to-end plots too) and the end-to-end plots (which run on their own as a script) each
import these helpers without importing the other.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["OUT", "pyplot", "save"]

#: Default output folder: ``docs/benchmarks/`` (generated, not committed).
OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


def pyplot():
    """matplotlib's ``pyplot`` on the Agg backend (no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(plt, fig, path: Path) -> Path:
    """Write one figure as PNG and free it (every plot ends the same way)."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
