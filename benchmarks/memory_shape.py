"""The shape both memory benchmarks measure: the trainers' plan and batch, this machine's budget,
and how a baseline measured with a few rank families is projected to the full shape.

Shared by :mod:`benchmarks.memory` (memory at a chosen worker count) and
:mod:`benchmarks.memory_iso` (memory at equal throughput), so both count the same job.
"""

from __future__ import annotations

from benchmarks.baseline import IMAGE_TOKEN_ID
from mdata.cost import AttentionCost
from mdata.mesh import ClientPlaceTree
from mdata.plan import Plan

__all__ = ["LIMIT_MB", "MAX_TOKENS", "MICRO_BATCHES", "plan_for", "project_baseline", "weights_of"]

LIMIT_MB = 10 * 1024  # no single measured fleet may project above this (the machine is shared)
MAX_TOKENS = 4096
MICRO_BATCHES = 2


def weights_of(sources) -> dict[str, float]:
    """Every source weighed the same."""
    return {s.name: 1.0 for s in sources}


def plan_for(sources, ranks: int, cp: int):
    """mdata's plan for ``ranks`` trainers as dp x cp: 8 samples per DP group per step, in
    :data:`MICRO_BATCHES` micro-batches of at most :data:`MAX_TOKENS` tokens."""
    dp = ranks // cp
    return (Plan(sources).mix(weights_of(sources)).cost(AttentionCost())
            .balance(micro_batches=MICRO_BATCHES, max_tokens=MAX_TOKENS, global_batch=dp * 8)
            .distribute(ClientPlaceTree(dp=dp, cp=cp)).seed(0)
            .special_tokens(image_token_id=IMAGE_TOKEN_ID))


def project_baseline(measured: dict, ranks: int) -> dict[str, float]:
    """The baseline at ``ranks`` from a fleet of ``measured["measured_ranks"]`` rank families of the
    same shape: everything scales with the families except shared-library pages (``.so`` files,
    the interpreter), which every further family would share and which are counted once. The
    upper bound scales everything."""
    scale = ranks / measured["measured_ranks"]
    library = measured["library_mb"]
    return {"pss_mb": scale * (measured["pss_mb"] - library) + library,
            "upper_mb": scale * measured["pss_mb"],
            "per_family_mb": measured["pss_mb"] / measured["measured_ranks"]}
