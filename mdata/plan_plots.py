"""Figures of a simulated plan as PNG files, for ``mdata plan simulate --plots DIR``.

Matplotlib is optional (``pip install 'mdata-orchestrator[plots]'``); only this module imports it, lazily.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mdata.distribution import install_hint
from mdata.errors import PlanError

__all__ = ["write_plots"]


def write_plots(result, folder: str | os.PathLike[str]) -> list[Path]:
    """Write ``mixture.png`` (target against realised fraction per source and step) and
    ``balance.png`` (every DP rank's cost per step against the lower bound) into ``folder``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlanError(f"--plots needs matplotlib: {install_hint('plots')}") from None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    steps = result.steps
    fig, ax = plt.subplots(figsize=(9, 4))
    for j, name in enumerate(result.names):
        line, = ax.plot(steps, result.target_weights[:, j], linestyle="--", linewidth=1.2)
        ax.plot(steps, result.realized_weights[:, j], color=line.get_color(), marker=".",
                linewidth=0.8, label=name)
    ax.set(xlabel="step", ylabel="fraction of the global batch", title="mixture (dashed: target)")
    ax.legend(fontsize=8, ncol=2)
    mixture = folder / "mixture.png"
    fig.tight_layout()
    fig.savefig(mixture, dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 4))
    cost = result.per_rank_cost
    for r in range(cost.shape[1]):
        ax.plot(steps, cost[:, r], linewidth=0.6, alpha=0.6, color="tab:blue",
                label="DP rank cost" if r == 0 else None)
    ax.plot(steps, result.lower_bound, color="k", linestyle=":", label="lower bound")
    ax.plot(steps, np.max(cost, axis=1), color="tab:red", linewidth=1.2, label="makespan")
    ax.set(xlabel="step", ylabel="cost units", title="balance: per-rank cost per step")
    ax.legend(fontsize=8)
    balance = folder / "balance.png"
    fig.tight_layout()
    fig.savefig(balance, dpi=100)
    plt.close(fig)
    return [mixture, balance]
